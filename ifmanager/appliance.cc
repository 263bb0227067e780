#include "ifmanager/appliance.h"

#include <rte_cycles.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "dataplane/crc32_if.h"
#include "dkp/selector.h"
#include "ifmanager/available_memory.h"
#include "ifmanager/byte_size.h"
#include "ifmanager/manager.h"
#include "ifmanager/metrics.h"
#include "libml/kernels/cpu_onednn.h"
#include "libml/libml.h"
#include "libml/regular_file.h"

namespace reefline::ifm {

struct appliance::rx_worker {
    appliance* owner = nullptr;
    std::vector<uint16_t> queues;

    static int run(void* arg) {
        auto& w = *static_cast<rx_worker*>(arg);
        dp::dataplane& plane = *w.owner->_plane;
        for (uint16_t q : w.queues) plane.rx_online(q);
        while (!w.owner->_rx_stop.load(std::memory_order_relaxed))
            for (uint16_t q : w.queues) plane.poll_rx(q);
        for (uint16_t q : w.queues) plane.rx_offline(q);
        return 0;
    }
};

std::string appliance_report::summary() const {
    char line[256];
    std::snprintf(line, sizeof line,
                  "rx %lu pkts | requests %lu started, %lu completed, %lu timed out | responses %lu sent | drops %lu",
                  counters.rx_packets, counters.requests_started, counters.requests_completed,
                  counters.requests_timed_out, counters.responses_sent, counters.drops_total());
    return line;
}

std::string appliance_report::json() const {
    std::string j = counters.to_json();
    j.pop_back();
    j += ",\"port_ipackets\":" + std::to_string(port.ipackets) + ",\"port_opackets\":" + std::to_string(port.opackets) +
         ",\"port_imissed\":" + std::to_string(port.imissed) + ",\"port_ierrors\":" + std::to_string(port.ierrors) +
         ",\"port_oerrors\":" + std::to_string(port.oerrors) + ",\"port_rx_nombuf\":" + std::to_string(port.rx_nombuf) +
         ",\"mbufs_in_use_at_exit\":" + std::to_string(mbufs_in_use) + "}";
    return j;
}

appliance::appliance(appliance_config config) : _c(std::move(config)) {}

appliance::~appliance() {
    if (_stopped) return;
    stop_rx();
    tear_down();
    _plane.reset();
}

void appliance::make_device() {
    _device = gpu::make_backend(_c.backend, _c.backend_options);
    if (!gpu::find_backend(_c.backend)->gpu) {
        std::fprintf(stderr, "reefline: cpu device GEMM by %s\n", ml::kernels::cpu_gemm_library().c_str());
        return;
    }
    // The gather kernel reads request payloads where the NIC wrote them: the rx mempool's
    // pages are registered (pinned, mapped) with the GPU.
    for (const auto& r : _plane->eth().memory_ranges()) {
        if (!_device->register_host(r.address, r.length))
            throw std::runtime_error("cannot register the packet memory (" + std::to_string(r.length >> 20) + " MiB at " +
                                     std::to_string(reinterpret_cast<uintptr_t>(r.address)) + ") with the " +
                                     _c.backend + " device");
        _registered.push_back(r.address);
    }
}

// The policy, DKP's padding where it applies, and abacus's predictor: the one given, or the
// repository's; a bad file given is an error, a bad one in the repository is reported and the
// kernel profiles predict instead. `abacus_info` says which, for health and describe.
gpu::scheduler_options appliance::scheduler_options(nlohmann::json& abacus_info) const {
    gpu::scheduler_options sopt;
    sopt.pol = _c.policy;
    if (_c.dkp != "off" && _c.policy == gpu::policy::reef) {
        if (_device->pads_launches())
            sopt.padding = std::make_shared<dkp::rules_selector>();
        else if (_c.dkp == "on")
            throw std::runtime_error("--dkp on: the " + _c.backend + " backend does not pad launches (yet)");
    }
    if (_c.policy != gpu::policy::abacus) return sopt;
    const bool given = !_c.abacus_predictor.empty();
    const std::string file = given ? _c.abacus_predictor : (std::filesystem::path(_c.repo_dir) / "abacus.json").string();
    std::error_code ec;
    if (std::filesystem::exists(file, ec) || std::filesystem::is_symlink(file, ec)) {
        try {
            // Not a regular file (a FIFO would block the start for ever), or over 64 MiB:
            // refused before it is read.
            const std::string text = ml::read_regular_file(file, 64u << 20);
            auto p = std::make_shared<gpu::abacus::predictor>(gpu::abacus::predictor::parse(text, file));
            nlohmann::json names = nlohmann::json::array();
            for (const auto& m : p->models()) names.push_back(m.name);
            abacus_info = {{"predictor", file},
                           {"models", names},
                           {"trained_on", p->device},
                           {"held_out_err_pct", p->held_out_mlp.mean_pct}};
            sopt.predictor = std::move(p);
        } catch (const std::exception& e) {
            if (given) throw std::runtime_error(std::string("--abacus-predictor: ") + e.what());
            std::fprintf(stderr, "reefline: %s; abacus predicts from the kernel profiles\n", e.what());
            abacus_info = {{"predictor", nullptr}, {"problem", e.what()}};
        }
    } else if (given) {
        throw std::runtime_error("--abacus-predictor: no such file: " + file);
    } else {
        abacus_info = {{"predictor", nullptr}};
    }
    abacus_info["predicts_from"] = abacus_info["predictor"].is_null()
                                       ? "kernel profiles (build/tools/abacus_train --repo " + _c.repo_dir + " trains a predictor)"
                                       : "predictor, and kernel profiles for other models";
    return sopt;
}

void appliance::make_manager(const nlohmann::json& abacus_info) {
    if (!_c.offline) _repo = std::make_unique<model_repository>(_c.repo_dir);
    manager_info info{"0.1.0", _device->caps().name, gpu::policy_name(_c.policy)};
    info.memory_budget_bytes = _c.memory_budget;
    info.memory_budget_source = "--memory-budget";
    if (info.memory_budget_bytes == 0) {
        // Measured after the data plane took its memory, in the tighter of the host and the
        // daemon's memory cgroup (a pod's or a slice's limit kills the daemon whatever the host
        // has free). A quarter stays out of the budget: what it does not count (an import's
        // protobuf copy of the file, kernel scratch, the control plane, other processes) and
        // the estimate being optimistic.
        const available_memory available = read_available_memory();
        if (available.bytes() == 0) throw std::runtime_error("cannot read MemAvailable from /proc/meminfo: give --memory-budget");
        info.memory_budget_bytes = available.bytes() / 4 * 3;
        info.memory_budget_source = available.source();
        info.memory_available = available.describe();
        std::fprintf(stderr, "reefline: memory budget %s (3/4 of %s; --memory-budget to change)\n",
                     format_byte_size(double(info.memory_budget_bytes)).c_str(), info.memory_available.c_str());
    }
    // A GPU's own memory is a budget of its own: weights and arenas live there.
    if (const gpu::device_caps caps = _device->caps(); caps.gpu && caps.memory_free_bytes) {
        info.device_memory_free_at_start = caps.memory_free_bytes;
        info.device_memory_budget_bytes = caps.memory_free_bytes / 4 * 3;
        std::fprintf(stderr, "reefline: device memory budget %s (3/4 of the %s free on %s)\n",
                     format_byte_size(double(info.device_memory_budget_bytes)).c_str(),
                     format_byte_size(double(caps.memory_free_bytes)).c_str(), caps.name.c_str());
    }
    info.dkp = _scheduler->stats().padding;
    info.abacus = abacus_info;
    // Profiles feed DKP's rules and prema's estimates; with one compute unit nothing is ever
    // padded (an RT kernel holds the unit), so nothing is profiled for it.
    if ((info.dkp && _device->caps().compute_units > 1) || _c.policy == gpu::policy::prema ||
        _c.policy == gpu::policy::abacus)
        info.profile_budget_ms = _c.profile_budget_ms;
    if (_c.max_model_file) info.max_model_file_bytes = _c.max_model_file;
    _manager = std::make_unique<if_manager>(*_plane, *_runtime, *_scheduler, _repo.get(), info);
    uint16_t slot = 0;
    for (const auto& b : _c.builtins)
        _manager->add_service(std::make_shared<dp::crc32_if>(*_plane, b.kind + ":" + std::to_string(b.port), b.port, slot++));
    for (const auto& f : _c.models) {
        const auto d = _manager->add_model(f, false);
        std::fprintf(stderr, "reefline: model %s (%s): input %s, weights %.1f MB\n", d["name"].get<std::string>().c_str(),
                     d["onnx"].get<std::string>().c_str(), d["input"]["shape"].dump().c_str(),
                     d["weight_bytes"].get<double>() / 1e6);
    }
    for (const auto& p : _manager->load_repository()) std::fprintf(stderr, "reefline: repository: %s\n", p.c_str());
}

void appliance::start_control_and_metrics() {
    if (_c.offline) return;
    _control = std::make_unique<control_server>(*_manager, _c.control);
    std::fprintf(stderr, "reefline: control on %s (events on %s), repository %s\n", _control->endpoint().c_str(),
                 _control->events_endpoint().c_str(), _c.repo_dir.c_str());
    if (_c.metrics == "off") return;
    const auto [host, port] = metrics::parse_listen_address(_c.metrics);
    auto* m = _manager.get();
    _metrics = std::make_unique<metrics::metrics_server>(host, port, [m] { return metrics::prometheus_text(m->stats()); });
    std::fprintf(stderr, "reefline: metrics on http://%s:%u/metrics\n", host.c_str(), _metrics->port());
}

void appliance::start() {
    try {
        _plane = std::make_unique<dp::dataplane>(_c.dataplane);
        make_device();
        _runtime = std::make_unique<ml::runtime>(*_device);
        nlohmann::json abacus_info;
        _scheduler = std::make_unique<gpu::scheduler>(*_device, scheduler_options(abacus_info));
        make_manager(abacus_info);
        start_control_and_metrics();
    } catch (...) {
        tear_down();
        _plane.reset();
        _stopped = true;
        throw;
    }
    std::fprintf(stderr, "reefline: port %u (%s), %u rx queue(s), backend %s, policy %s%s%s\n", _plane->eth().id(),
                 _plane->eth().driver().c_str(), _plane->rx_queues(), _device->caps().name.c_str(),
                 gpu::policy_name(_c.policy), _scheduler->stats().padding ? " with DKP" : "", _c.offline ? ", offline" : "");
    if (const nlohmann::json& a = _manager->health().value("abacus", nlohmann::json()); a.is_object())
        std::fprintf(stderr, "reefline: abacus predicts from %s\n",
                     a["predictor"].is_string() ? ("the predictor " + a["predictor"].get<std::string>()).c_str()
                                                : "the kernel profiles");
    const nlohmann::json stats = _manager->stats();
    for (const auto& f : stats["ifs"])
        std::fprintf(stderr, "reefline: IF %s on UDP port %u\n", f["name"].get<std::string>().c_str(),
                     f["udp_port"].get<unsigned>());
    start_rx();
    _manager->set_serving(true);
    std::fprintf(stderr, "reefline: serving\n");
}

// Rx queues go to worker lcores when there are any; the lcore that calls serve() answers
// requests and transmits. On one lcore (and always offline) it does everything.
void appliance::start_rx() {
    std::vector<unsigned> lcores;
    unsigned lc;
    RTE_LCORE_FOREACH_WORKER(lc) lcores.push_back(lc);
    const uint16_t queues = _plane->rx_queues();
    _inline_rx = lcores.empty() || _c.offline;
    _workers.resize(_inline_rx ? 0 : std::min<size_t>(lcores.size(), queues));
    for (uint16_t q = 0; !_inline_rx && q < queues; ++q) _workers[q % _workers.size()].queues.push_back(q);
    _rx_stop.store(false);
    for (size_t w = 0; w < _workers.size(); ++w) {
        _workers[w].owner = this;
        rte_eal_remote_launch(rx_worker::run, &_workers[w], lcores[w]);
    }
    if (_inline_rx)
        for (uint16_t q = 0; q < queues; ++q) _plane->rx_online(q);
    _rx_running = true;
}

void appliance::stop_rx() {
    if (!_rx_running) return;
    _rx_stop.store(true);
    rte_eal_mp_wait_lcore();
    if (_inline_rx)
        for (uint16_t q = 0; q < _plane->rx_queues(); ++q) _plane->rx_offline(q);
    _rx_running = false;
}

uint32_t appliance::poll_inline_rx() {
    uint32_t rx = 0;
    if (_inline_rx)
        for (uint16_t q = 0; q < _plane->rx_queues(); ++q) rx += _plane->poll_rx(q);
    return rx;
}

dp::counter_snapshot appliance::snapshot() {
    auto s = _plane->counters();
    _manager->add_if_counters(s);
    return s;
}

void appliance::serve(const std::atomic<bool>& stop_flag) {
    const uint64_t hz = rte_get_tsc_hz();
    const uint64_t start = rte_rdtsc();
    uint64_t next_stats = start + uint64_t(_c.stats_interval_s * double(hz));
    uint64_t idle_polls = 0;
    while (!stop_flag.load(std::memory_order_relaxed) && !_manager->shutdown_requested()) {
        const uint32_t rx = poll_inline_rx();
        const uint32_t work = _manager->serve();
        const uint64_t now = rte_rdtsc();
        if (_c.stats_interval_s > 0 && now >= next_stats) {
            std::fprintf(stderr, "%s\n", appliance_report{snapshot()}.summary().c_str());
            next_stats = now + uint64_t(_c.stats_interval_s * double(hz));
        }
        if (_c.duration_s > 0 && now - start >= uint64_t(_c.duration_s * double(hz))) break;
        idle_polls = (rx || work) ? 0 : idle_polls + 1;
        // net_pcap returns nothing once the capture is exhausted.
        if (_c.offline && idle_polls > 10000 && _manager->quiet()) break;
        // Idle: give the core to the device's compute units and the scheduler (they share the
        // machine's cores on the embedded default) instead of spinning.
        if (!_c.busy_poll && !_c.offline && idle_polls > 256) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

appliance_report appliance::stop() {
    if (_stopped) throw std::logic_error("appliance::stop: already stopped");
    _stopped = true;
    stop_rx();
    // Ingest has stopped. Requests still under reassembly are freed (counted as timeouts);
    // complete ones are answered, batches in flight finish (up to 10 s), then whatever still
    // waits is answered with status shutting_down; every queued response is transmitted
    // before the port closes.
    for (uint16_t q = 0; q < _plane->rx_queues(); ++q) _plane->flush(q);
    const uint64_t hz = rte_get_tsc_hz();
    const auto drain = [&](uint64_t until) {
        for (int quiet = 0; quiet < 1000 && rte_rdtsc() < until;)
            quiet = _manager->serve() == 0 && _manager->quiet() ? quiet + 1 : 0;
    };
    drain(rte_rdtsc() + 10 * hz);
    _manager->fail_pending();
    // Answers that wait for transmit buffers are given up after a second without progress
    // (counted as send failures); a port that takes nothing at all is left after 10 s.
    drain(rte_rdtsc() + 10 * hz);
    _manager->set_serving(false);
    appliance_report report;
    report.port = _plane->eth().stats();
    report.counters = snapshot();
    tear_down();
    rte_mempool* rx_pool = _plane->eth().rx_pool();
    rte_mempool* tx_pool = _plane->eth().tx_pool();
    _plane->eth().close();
    report.mbufs_in_use =
        (rx_pool->size - rte_mempool_avail_count(rx_pool)) + (tx_pool->size - rte_mempool_avail_count(tx_pool));
    _plane.reset();
    return report;
}

void appliance::tear_down() {
    _metrics.reset();
    _control.reset();
    if (_scheduler) _scheduler->shutdown();
    _manager.reset();
    _repo.reset();
    _scheduler.reset();
    _runtime.reset();
    for (void* p : _registered) _device->unregister_host(p);
    _registered.clear();
    _device.reset();
}

}  // namespace reefline::ifm
