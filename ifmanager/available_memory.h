// How much memory the daemon may still take: the host's MemAvailable, or less where the
// daemon runs in a memory cgroup (a Kubernetes pod, a systemd slice with MemoryMax, a
// container): the kernel kills a process at its cgroup's limit whatever the host has free, so
// a budget taken from the host alone admits models that then get the daemon OOM-killed.
//
// Both cgroup versions, every level from the daemon's cgroup up to its hierarchy's mount
// (a parent's limit binds its children): v2 memory.max - memory.current, v1
// memory.limit_in_bytes - memory.usage_in_bytes (and memory.stat's hierarchical_memory_limit,
// which covers ancestors a container cannot see). Reclaimable page cache (inactive_file)
// counts as available, as the kernel reclaims it before it kills.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace reefline::ifm {

struct available_memory {
    uint64_t host_bytes = 0;                 // MemAvailable (0: unreadable)
    std::optional<uint64_t> cgroup_bytes;    // the tightest cgroup's limit less its usage
    std::optional<uint64_t> cgroup_limit;    // that cgroup's limit
    std::string cgroup;                      // which: "v2 /sys/fs/cgroup/kubepods/pod1"

    // The smaller of the two (0 when neither could be read).
    uint64_t bytes() const;
    // "cgroup" when the cgroup's is the smaller, else "host".
    const char* source() const;
    // One line for operators: "2.1 GiB available in cgroup v1 /sys/fs/cgroup/memory/x
    // (limit 3.0 GiB); the host has 20.1 GiB".
    std::string describe() const;
};

// Reads /proc/meminfo, /proc/self/cgroup and /proc/self/mountinfo under `proc` and the
// cgroup files they name (their mount points as mountinfo says; tests give a tree of their
// own with its own mountinfo).
available_memory read_available_memory(const std::string& proc = "/proc");

}  // namespace reefline::ifm
