// shadow_bench: what an operator's `set` costs the traffic of the IF it changes.
//
// An in-process model IF (the zoo's tiny ResNet-50 on the cpu device, behind a net_ring port
// and the real data plane) serves an open-loop Poisson stream of image requests while a
// control thread changes its settings the way `reefctl set` does:
//   plan: max_batch 1 -> 16, so batch sizes 2, 4, 8 and 16 are planned and warmed up. They
//         are built on the side (model_if::prepare) while the IF goes on serving with the
//         instances it has; commit() then switches over between two batches.
//   tune: an SLO or batching policy change, no new instance: only the switch-over.
//   replace (--replace): the plan change also swaps the model for a new version (the zoo's
//         resnet50_tiny with other weights, or --replace FILE), as `set --onnx` does: every
//         batch size planned on the new weights on the side, the old instances retired after
//         the switch-over.
// Every trial starts a fresh IF at max_batch 1 and runs one plan change, then --tunes tune
// changes 50 ms apart.
//
// Measured: the switch-over gap of every change (how long commit() holds the IF: its ring is
// unserved no longer than that plus the batch it waits behind); each request's latency, from
// its frames entering the rx ring to its answer leaving the tx ring; the longest latency of a
// request that was waiting while a change ran (the stall a `set` causes) against the longest
// of the others; and each plan change's total time, which is how long the IF was held, and
// nothing answered, when `set` planned under the IF's lock.
//
// Last line: switch_gap_us_p99=A set_stall_ms_max=B
#include <CLI/CLI.hpp>
#include <rte_cycles.h>
#include <rte_eth_ring.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "preempt/backend_option.h"
#include "bench/bench_report.h"
#include "dataplane/eal.h"
#include "dataplane/engine.h"
#include "ifmanager/model_if.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace fs = std::filesystem;
namespace dp = reefline::dp;
namespace ml = reefline::ml;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
namespace ifm = reefline::ifm;
namespace report = reefline::bench;

namespace {

constexpr uint16_t if_port = 9200;

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

// One request's frames, as a camera would send them (1024-byte fragments), for the rx ring.
std::vector<std::vector<uint8_t>> request_frames(const gen::request_payload& payload, uint64_t id) {
    gen::frame_addresses a;
    a.src_mac = {0x02, 0, 0, 0, 0, 0x01};
    a.dst_mac = {0x02, 0, 0, 0, 0, 0x02};
    a.src_ip = 0xc6120001;  // 198.18.0.1 -> 198.18.0.2
    a.dst_ip = 0xc6120002;
    a.src_port = 40000;
    a.dst_port = if_port;
    return gen::request_frames(a, payload, id, 1024);
}

struct change_record {
    bool plan;
    double start_ms, end_ms;  // since the trial's start
    double gap_us;            // commit()'s hold of the IF
};

struct trial_result {
    std::vector<change_record> changes;
    std::vector<double> stalled_ms, other_ms;  // latencies of requests waiting during a change, and the rest
    uint64_t sent = 0, answered = 0, errors = 0;
};

struct options {
    double rate = 150;
    int trials = 5;
    int tunes = 20;
    std::string model;
    std::shared_ptr<ml::model> replacement;  // --replace: the new version the plan change switches to
};

trial_result run_trial(dp::dataplane& plane, rte_ring* rx, rte_ring* tx, ml::runtime& runtime,
                       reefline::gpu::scheduler& scheduler, const options& o, uint32_t seed) {
    using clock = std::chrono::steady_clock;
    ifm::model_if_config mc;
    mc.name = "shadow";
    mc.onnx = o.model;
    mc.udp_port = if_port;
    mc.settings.batching.max_batch = 1;
    mc.settings.batching.slo_ms = 50;
    auto mif = std::make_unique<ifm::model_if>(plane, runtime, scheduler, mc);
    plane.ifs().publish({mif->binding()});
    plane.rx_online(0);

    gen::request_payload payload;
    payload.format = wire::format::image_u8_hwc;
    payload.dims[0] = uint16_t(mif->input().height);
    payload.dims[1] = uint16_t(mif->input().width);
    payload.dims[2] = uint16_t(mif->input().channels);
    payload.bytes.resize(size_t(payload.dims[0]) * payload.dims[1] * payload.dims[2]);
    std::mt19937 rng(seed);
    for (auto& b : payload.bytes) b = uint8_t(rng());

    // Arrivals: Poisson at o.rate for the whole trial.
    const double trial_ms = 300 + 50.0 * (o.tunes + 2) + 1500;  // the plan change takes up to ~1 s here
    std::vector<double> arrival_ms;
    std::exponential_distribution<double> gap(o.rate / 1e3);
    for (double t = gap(rng); t < trial_ms; t += gap(rng)) arrival_ms.push_back(t);
    std::vector<std::atomic<int64_t>> sent_ns(arrival_ms.size()), answered_ns(arrival_ms.size());
    for (auto& v : sent_ns) v = -1;
    for (auto& v : answered_ns) v = -1;

    const auto t0 = clock::now();
    const auto since = [&](clock::time_point t) { return std::chrono::duration<double, std::milli>(t - t0).count(); };
    std::atomic<bool> stop{false};
    trial_result r;

    std::thread sender([&] {
        for (size_t i = 0; i < arrival_ms.size() && !stop; ++i) {
            std::this_thread::sleep_until(t0 + std::chrono::microseconds(int64_t(arrival_ms[i] * 1e3)));
            const auto frames = request_frames(payload, i);
            sent_ns[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count();
            for (const auto& f : frames) {
                rte_mbuf* m = rte_pktmbuf_alloc(plane.eth().rx_pool());
                if (!m) break;  // counted as unanswered below
                std::memcpy(rte_pktmbuf_append(m, uint16_t(f.size())), f.data(), f.size());
                if (rte_ring_enqueue(rx, m) != 0) rte_pktmbuf_free(m);
            }
        }
    });
    std::thread control([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        for (int k = 0; k <= o.tunes && !stop; ++k) {
            ifm::model_settings s = mif->settings();
            if (k == 0) s.batching.max_batch = 16;
            else if (k % 2) s.batching.slo_ms = 40;
            else s.batching.slo_ms = 50;
            const auto a = clock::now();
            if (k == 0 && o.replacement) mif->commit(mif->prepare(s, o.replacement));
            else mif->update(s);
            const auto b = clock::now();
            r.changes.push_back({k == 0, since(a), since(b), mif->stats()["switch_us_last"].get<double>()});
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    });

    // This thread serves: the EAL lcore that owns the rx queue.
    const auto serve_once = [&] {
        plane.poll_rx(0);
        uint32_t work = mif->poll();
        plane.poll_tx();
        void* obj;
        while (rte_ring_dequeue(tx, &obj) == 0) {
            ++work;
            auto* m = static_cast<rte_mbuf*>(obj);
            const gen::parsed_frame p = gen::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), m->data_len});
            if (p.error == gen::frame_error::none) {
                const wire::fields h = wire::decode(&p.header);
                if (h.kind == uint8_t(wire::kind::error)) ++r.errors;
                if (h.request_id < answered_ns.size() && answered_ns[h.request_id] < 0)
                    answered_ns[h.request_id] =
                        std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count();
            }
            rte_pktmbuf_free(m);
        }
        if (!work) std::this_thread::sleep_for(std::chrono::microseconds(20));
    };
    const auto end = t0 + std::chrono::microseconds(int64_t(trial_ms * 1e3));
    while (clock::now() < end) serve_once();
    stop = true;
    sender.join();
    control.join();
    // Answers still on their way (frames in the rx ring, batches in flight), for up to 2 s.
    const auto all_answered = [&] {
        for (size_t i = 0; i < arrival_ms.size(); ++i)
            if (sent_ns[i] >= 0 && answered_ns[i] < 0) return false;
        return true;
    };
    for (const auto drain_end = clock::now() + std::chrono::seconds(2); clock::now() < drain_end && !all_answered();)
        serve_once();
    for (const auto idle_end = clock::now() + std::chrono::seconds(5); clock::now() < idle_end && !mif->idle();)
        serve_once();
    plane.flush(0);
    plane.rx_offline(0);
    plane.ifs().publish({});
    mif.reset();
    void* obj;
    while (rte_ring_dequeue(tx, &obj) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(obj));

    for (size_t i = 0; i < arrival_ms.size(); ++i) {
        if (sent_ns[i] < 0) continue;
        ++r.sent;
        if (answered_ns[i] < 0) continue;
        ++r.answered;
        const double s = double(sent_ns[i]) / 1e6, a = double(answered_ns[i]) / 1e6;
        bool during = false;
        for (const auto& c : r.changes) during |= s < c.end_ms && a > c.start_ms;
        (during ? r.stalled_ms : r.other_ms).push_back(a - s);
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"shadow_bench: the stall an operator's `set` causes on the IF it changes (cpu device, in memory)"};
    options o;
    bool quick = false;
    app.add_option("--rate", o.rate, "requests per second (Poisson)")->capture_default_str();
    app.add_option("--trials", o.trials, "fresh IFs, each with one plan change and the tune changes")->capture_default_str();
    app.add_option("--tunes", o.tunes, "tune changes (SLO only) per trial")->capture_default_str();
    app.add_option("--model", o.model, "ONNX model (default: the zoo's tiny ResNet-50, written by build/tools/zoo)");
    app.add_flag("--quick", quick, "2 trials of 5 tune changes");
    std::string replace;
    auto* replace_opt = app.add_option("--replace", replace,
                                       "the plan change also replaces the model by this new version (without a "
                                       "FILE: the zoo's resnet50_tiny with seed 2)")
                            ->expected(0, 1);
    std::string backend = "cpu";
    reefline::gpu::add_backend_option(app, backend);
    CLI11_PARSE(app, argc, argv);
    if (quick) {
        o.trials = 2;
        o.tunes = 5;
    }
    if (o.trials < 1 || o.tunes < 0 || !(o.rate > 0) || o.rate > 5000) {
        std::fprintf(stderr, "shadow_bench: need --trials >= 1, --tunes >= 0, 0 < --rate <= 5000\n");
        return 2;
    }
    report::progress progress("shadow_bench", unsigned(o.trials) + (o.model.empty() ? 1u : 0u));
    fs::path work;
    try {
        dp::eal_init("shadow_bench", {"-l", "0", "--no-pci", "--no-shconf", "--no-telemetry", "--no-huge", "-m", "512",
                                      "--log-level", "lib.eal:error"});
        if (o.model.empty()) {
            // The zoo tool of this bench's own build directory.
            const fs::path zoo = fs::canonical("/proc/self/exe").parent_path().parent_path() / "tools" / "zoo";
            auto step = progress.begin("resnet50_tiny written by " + zoo.string());
            work = fs::temp_directory_path() / ("shadow_bench." + std::to_string(getpid()));
            fs::create_directories(work);
            const std::string cmd = zoo.string() + " --out " + work.string() + " --tiny --only resnet50_tiny -q";
            if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the zoo tool failed: " + cmd);
            o.model = (work / "resnet50_tiny.onnx").string();
        }
        if (replace_opt->count() && replace.empty()) {
            const fs::path zoo = fs::canonical("/proc/self/exe").parent_path().parent_path() / "tools" / "zoo";
            if (work.empty()) {
                work = fs::temp_directory_path() / ("shadow_bench." + std::to_string(getpid()));
                fs::create_directories(work);
            }
            auto step = progress.begin("the new version: resnet50_tiny with seed 2");
            const std::string cmd = zoo.string() + " --out " + (work / "v2").string() + " --tiny --only resnet50_tiny --seed 2 -q";
            if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the zoo tool failed: " + cmd);
            replace = (work / "v2" / "resnet50_tiny.onnx").string();
        }
        rte_ring* rx = rte_ring_create("shadow_rx", 16384, 0, RING_F_SC_DEQ);
        rte_ring* tx = rte_ring_create("shadow_tx", 16384, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        if (!rx || !tx) throw std::runtime_error("rings");
        const int port = rte_eth_from_rings("shadow_ring", &rx, 1, &tx, 1, 0);
        if (port < 0) throw std::runtime_error("net_ring port");
        dp::dataplane_config c;
        c.port.port_id = uint16_t(port);
        c.port.rx_mbufs = 8191;
        c.port.tx_mbufs = 2047;
        c.port.rx_descriptors = c.port.tx_descriptors = 512;
        auto plane = std::make_unique<dp::dataplane>(c);
        auto device = reefline::gpu::make_backend(backend);
        auto runtime = std::make_unique<ml::runtime>(*device);
        auto scheduler = std::make_unique<reefline::gpu::scheduler>(*device);
        if (!replace.empty()) o.replacement = runtime->load_model(replace, ifm::model_if::import_options());

        std::printf("model %s%s, cpu device with %u compute unit(s), %.0f req/s Poisson, %d trial(s) of 1 plan + %d tune changes\n",
                    fs::path(o.model).filename().c_str(), o.replacement ? " (each plan change replaces it by a new version)" : "",
                    device->caps().compute_units, o.rate, o.trials, o.tunes);
        std::printf("%-6s %8s %8s %10s %12s %12s %14s %14s\n", "trial", "sent", "answered", "plan ms", "plan gap us",
                    "tune gap p99", "stall max ms", "others max ms");
        std::vector<double> gaps, plan_ms, stalled, others;
        uint64_t sent = 0, answered = 0;
        for (int t = 0; t < o.trials; ++t) {
            auto step = progress.begin("trial " + std::to_string(t + 1) + "/" + std::to_string(o.trials));
            const trial_result r = run_trial(*plane, rx, tx, *runtime, *scheduler, o, uint32_t(7 + t));
            std::vector<double> tune_gaps;
            double plan = 0, plan_gap = 0;
            for (const auto& ch : r.changes) {
                gaps.push_back(ch.gap_us);
                if (ch.plan) {
                    plan = ch.end_ms - ch.start_ms;
                    plan_gap = ch.gap_us;
                    plan_ms.push_back(plan);
                } else {
                    tune_gaps.push_back(ch.gap_us);
                }
            }
            const double smax = r.stalled_ms.empty() ? 0 : *std::max_element(r.stalled_ms.begin(), r.stalled_ms.end());
            const double omax = r.other_ms.empty() ? 0 : *std::max_element(r.other_ms.begin(), r.other_ms.end());
            stalled.insert(stalled.end(), r.stalled_ms.begin(), r.stalled_ms.end());
            others.insert(others.end(), r.other_ms.begin(), r.other_ms.end());
            sent += r.sent;
            answered += r.answered;
            std::printf("%-6d %8llu %8llu %10.1f %12.1f %12.1f %14.2f %14.2f\n", t + 1, (unsigned long long)r.sent,
                        (unsigned long long)r.answered, plan, plan_gap, percentile(tune_gaps, 0.99), smax, omax);
            std::fflush(stdout);
            char result[96];
            std::snprintf(result, sizeof result, "plan %.0f ms, stall max %.2f ms", plan, smax);
            step.result(result);
        }
        const double stall_max = stalled.empty() ? 0 : *std::max_element(stalled.begin(), stalled.end());
        const double others_max = others.empty() ? 0 : *std::max_element(others.begin(), others.end());
        std::printf("changes %zu, switch-over gap p50 %.1f us p99 %.1f us max %.1f us\n", gaps.size(),
                    percentile(gaps, 0.5), percentile(gaps, 0.99), gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end()));
        std::printf("requests waiting during a change: %zu, latency p50 %.2f ms p99 %.2f ms max %.2f ms\n", stalled.size(),
                    percentile(stalled, 0.5), percentile(stalled, 0.99), stall_max);
        std::printf("the other requests: %zu, latency p50 %.2f ms p99 %.2f ms max %.2f ms\n", others.size(),
                    percentile(others, 0.5), percentile(others, 0.99), others_max);
        std::printf("plan changes took %.1f ms median (%.1f..%.1f): the stall when `set` planned holding the IF\n",
                    percentile(plan_ms, 0.5), plan_ms.empty() ? 0 : *std::min_element(plan_ms.begin(), plan_ms.end()),
                    plan_ms.empty() ? 0 : *std::max_element(plan_ms.begin(), plan_ms.end()));
        std::printf("answered %llu of %llu\n", (unsigned long long)answered, (unsigned long long)sent);
        scheduler.reset();
        o.replacement.reset();
        runtime.reset();
        plane->eth().close();
        plane.reset();
        if (!work.empty()) fs::remove_all(work);
        std::printf("switch_gap_us_p99=%.1f set_stall_ms_max=%.2f\n", percentile(gaps, 0.99), stall_max);
        if (answered != sent) {
            std::fprintf(stderr, "shadow_bench: %llu request(s) unanswered\n", (unsigned long long)(sent - answered));
            return 1;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "shadow_bench: %s\n", e.what());
        if (!work.empty()) fs::remove_all(work);
        return 1;
    }
    return 0;
}
