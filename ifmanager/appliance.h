// The appliance: everything the reefline daemon runs, from the port to the control plane, as
// one object with start / serve / stop, so the daemon's main only turns its command line into an
// appliance_config and tests can run the whole appliance in-process (on a net_ring port).
//
// Owned in dependency order and torn down from the top: metrics and control plane first, then
// the scheduler (shut down so no launch is in flight), the IF manager, runtime and device, and
// the data plane last, after every answer was transmitted and every mbuf came back.
// EAL is the caller's: it is process-wide and outlives any appliance.
#pragma once

#include <rte_ethdev.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataplane/engine.h"
#include "ifmanager/control.h"
#include "preempt/backend_registry.h"
#include "preempt/scheduler.h"

namespace reefline::ml {
class runtime;
}
namespace reefline::metrics {
class metrics_server;
}

namespace reefline::ifm {

class if_manager;
class model_repository;

// A built-in IF (no model): its kind (crc32) and UDP port.
struct builtin_if {
    std::string kind;
    uint16_t port = 0;
};

struct appliance_config {
    dp::dataplane_config dataplane;  // port, rx queues, reassembly, the appliance's address
    std::string backend = "cpu";
    gpu::backend_options backend_options;
    gpu::policy policy = gpu::policy::reef;
    std::string dkp = "auto";        // on, off, auto (on with policy reef on a device that pads)
    std::string abacus_predictor;    // policy abacus: this file; empty: <repo>/abacus.json if present
    double profile_budget_ms = 10000;
    std::string repo_dir;            // the model repository (unused offline)
    uint64_t memory_budget = 0;      // bytes for the models; 0: 3/4 of what is available at start
    uint64_t max_model_file = 0;     // 0: the IF manager's default
    std::vector<builtin_if> builtins;
    std::vector<nlohmann::json> models;  // add_model fields of IFs that are not persisted
    control_options control;
    std::string metrics = "off";     // Prometheus HOST:PORT on loopback, or off
    // Offline: a capture replayed through net_pcap; no repository, control plane or metrics,
    // serve() returns once the capture is exhausted and every answer was written.
    bool offline = false;
    double duration_s = 0;           // serve() returns after this long (0: not before asked)
    double stats_interval_s = 0;     // serve() prints a counter line this often (0: never)
    bool busy_poll = false;          // never sleep when idle
};

// What stop() found: the data plane's counters (IF counters included), the port's, and the mbufs
// that did not come back to their pools (0 unless something leaked).
struct appliance_report {
    dp::counter_snapshot counters;
    rte_eth_stats port{};
    uint64_t mbufs_in_use = 0;
    std::string summary() const;  // one line for people
    std::string json() const;     // one JSON object: the counters, the port's, mbufs_in_use_at_exit
};

class appliance {
public:
    explicit appliance(appliance_config config);
    ~appliance();
    appliance(const appliance&) = delete;
    appliance& operator=(const appliance&) = delete;

    // Builds the data plane, device, scheduler, IF manager (its IFs and repository), control
    // plane and metrics endpoint, starts the rx lcores and begins serving. Throws (with what
    // was made released) when any part cannot start.
    void start();
    // Serves on the calling lcore until `stop_flag` is raised, a shutdown request, the configured
    // duration, or (offline) the end of the capture.
    void serve(const std::atomic<bool>& stop_flag);
    // Stops ingest, answers what is complete, fails what cannot be (status shutting_down),
    // transmits every queued answer, tears everything down and closes the port. Once.
    appliance_report stop();

    dp::dataplane& plane() { return *_plane; }
    if_manager& manager() { return *_manager; }

private:
    void make_device();
    gpu::scheduler_options scheduler_options(nlohmann::json& abacus_info) const;
    void make_manager(const nlohmann::json& abacus_info);
    void start_control_and_metrics();
    void start_rx();
    void stop_rx();
    uint32_t poll_inline_rx();
    dp::counter_snapshot snapshot();
    void tear_down();

    struct rx_worker;
    appliance_config _c;
    // Owned in dependency order: destroyed from the bottom up (tear_down).
    std::unique_ptr<dp::dataplane> _plane;
    std::unique_ptr<gpu::device> _device;
    std::unique_ptr<ml::runtime> _runtime;
    std::unique_ptr<gpu::scheduler> _scheduler;
    std::unique_ptr<model_repository> _repo;
    std::unique_ptr<if_manager> _manager;
    std::unique_ptr<control_server> _control;
    std::unique_ptr<metrics::metrics_server> _metrics;
    std::vector<void*> _registered;  // packet memory registered with a GPU device
    std::vector<rx_worker> _workers;
    std::atomic<bool> _rx_stop{false};
    bool _inline_rx = true;
    bool _rx_running = false;
    bool _stopped = false;
};

}  // namespace reefline::ifm
