// EAL start-up shared by the daemon, the tests and the benchmarks.
#pragma once

#include <string>
#include <vector>

namespace reefline::dp {

// Memory arguments for this machine: hugepages when enough are free on a mounted hugetlbfs,
// else "--no-huge -m <mb>" (what scripts/setup records when it cannot reserve hugepages).
std::vector<std::string> eal_memory_args(unsigned no_huge_mb = 1024);

// Arguments for a self-contained process: one lcore unless given, no PCI scan, in-memory
// (no shared files, so concurrent tests do not collide), no telemetry socket.
std::vector<std::string> eal_default_args(const std::string& lcores = "0");

// Splits a user's EAL string on whitespace.
std::vector<std::string> eal_split(const std::string& args);

// rte_eal_init with argv[0] = program; throws std::runtime_error with EAL's reason.
// EAL pins the calling thread (the main lcore) to its lcore's CPU, and every thread it starts
// afterwards would inherit that one CPU: the device's compute units, the scheduler, ZeroMQ's
// threads. So the calling thread gets back the CPUs it had before, less those of the worker
// lcores (which poll their queues): threads started from it spread over the machine. It keeps
// its lcore identity (rte_lcore_id()); only its CPU set changes.
void eal_init(const std::string& program, const std::vector<std::string>& args);
void eal_cleanup();

}  // namespace reefline::dp
