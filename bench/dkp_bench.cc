// dkp_bench: dynamic kernel padding under REEF's high-contention workload (REEF §7.4): RT
// clients submitting RT tasks back to back (each a new one as soon as its last is answered;
// two by default, so that an RT task always waits) and one BE client keeping a BE task
// outstanding, on the cpu device (or, in a GPU build, --backend cuda|hip), for pairs of zoo models (tiny
// variants), under rt_only, streams, reef without DKP and reef with DKP; every policy on the
// same device, the same models and the same profiles, one after the other.
//
// Per pair and policy: RT tasks per second, RT latency mean/p50/p99 (submit to end), BE tasks
// per second, BE kernels per second (BE progress between whole tasks), and with DKP the padded
// launches, pads completed / cut / skipped, BE blocks run as padding and the selection time.
// The DKP overhead on RT is reef with DKP's mean RT latency over reef without DKP's; the BE
// gain is reef with DKP's BE kernel throughput over reef without DKP's (kernels rather than
// whole tasks: without DKP a BE task may never finish within a run), "inf" when reef without
// DKP ran no BE kernel at all (the last line then says be_throughput_gain=inf).
//
// Last line: rt_overhead_pct=A be_throughput_gain=B select_us_p99=C (A and B: the median over
// the pairs; C: the bucket bound of the 99th percentile of every selection of the runs).
//
// Every step (the zoo, each pair's profiles, each run) prints a progress line on stderr;
// --csv FILE writes the table, one row per pair and policy.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_report.h"
#include "dkp/selector.h"
#include "libml/libml.h"
#include "libml/runtime/synthetic_inputs.h"
#include "preempt/backend_option.h"
#include "preempt/scheduler.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;
namespace gpu = reefline::gpu;
namespace report = reefline::bench;
using clk = std::chrono::steady_clock;

namespace {

double g_margin = 1.0;  // rule 1's margin (--margin)

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

struct run_result {
    std::string policy;
    double rt_per_s = 0, rt_mean_ms = 0, rt_p50_ms = 0, rt_p99_ms = 0, be_per_s = 0, be_kernels_per_s = 0;
    gpu::scheduler_stats sched;
    gpu::device_ops::padding_counters pads;
};

run_result run(gpu::device& dev, ml::runtime& rt, ml::instance& rt_in, ml::instance& be_in, gpu::policy pol, bool dkp,
               double seconds, uint32_t rt_clients) {
    gpu::scheduler_options so;
    so.pol = pol;
    if (dkp) so.padding = std::make_shared<reefline::dkp::rules_selector>(g_margin);
    const auto pads0 = dev.padding_stats();
    gpu::scheduler sched(dev, so);
    run_result r;
    r.policy = dkp ? "reef+dkp" : gpu::policy_name(pol);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> be_tasks{0}, be_kernels{0};
    const auto be_launches = rt.task_launches(be_in);
    const uint32_t be_per_task = uint32_t(be_launches.size());
    // The BE client: one task outstanding, the next submitted when it ends.
    std::thread be([&] {
        if (pol == gpu::policy::rt_only) return;
        while (!stop.load()) {
            gpu::task t;
            t.cls = gpu::task_class::be;
            t.launches = be_launches;
            const gpu::task_result res = sched.wait(sched.submit(std::move(t)));
            if (res.status == gpu::task_status::completed) {
                ++be_tasks;
                be_kernels += be_per_task;
            } else {
                be_kernels += res.completed_kernels;
            }
        }
    });
    const auto rt_launches = rt.task_launches(rt_in);
    const auto t0 = clk::now();
    // RT clients, each with one task outstanding: with two or more an RT task is always
    // waiting, so the device never leaves real-time mode (REEF's high contention): without
    // DKP, BE work makes no progress at all.
    std::vector<std::vector<double>> lats(rt_clients);
    std::vector<std::thread> clients;
    for (uint32_t c = 0; c < rt_clients; ++c)
        clients.emplace_back([&, c] {
            while (std::chrono::duration<double>(clk::now() - t0).count() < seconds) {
                gpu::task t;
                t.cls = gpu::task_class::rt;
                t.launches = rt_launches;
                const gpu::task_result res = sched.wait(sched.submit(std::move(t)));
                if (res.status == gpu::task_status::completed) lats[c].push_back(double(res.end_ns - res.submit_ns) / 1e6);
            }
        });
    for (auto& t : clients) t.join();
    std::vector<double> lat;
    for (const auto& l : lats) lat.insert(lat.end(), l.begin(), l.end());
    const double wall = std::chrono::duration<double>(clk::now() - t0).count();
    stop = true;
    sched.shutdown();  // cancels the BE task in flight; its kernels done (padding included) count
    be.join();
    const uint64_t tasks_done = be_tasks.load(), kernels_done = be_kernels.load();
    r.rt_per_s = double(lat.size()) / wall;
    double sum = 0;
    for (double v : lat) sum += v;
    r.rt_mean_ms = lat.empty() ? 0 : sum / double(lat.size());
    r.rt_p50_ms = percentile(lat, 0.5);
    r.rt_p99_ms = percentile(lat, 0.99);
    r.be_per_s = double(tasks_done) / wall;
    r.be_kernels_per_s = double(kernels_done) / wall;
    r.sched = sched.stats();
    if (dev.pads_launches()) {
        const auto p = dev.padding_stats();
        r.pads = {p.padded_launches - pads0.padded_launches, p.pads - pads0.pads, p.pads_completed - pads0.pads_completed,
                  p.pads_cut - pads0.pads_cut, p.pads_skipped - pads0.pads_skipped, p.pad_blocks - pads0.pad_blocks};
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"dkp_bench: dynamic kernel padding under high RT contention, policy by policy"};
    // MODEL[@BATCH[xLENGTH]]: RT kernels that leave units idle (grid 1) and BE kernels short
    // enough to fit beside them (the tiny transformers' kernels are 2-6 us each).
    std::string pairs_text =
        "distilbert_tiny@1x64:bert_tiny@2x16,mobilenet_v2_tiny@1:bert_tiny@1x16,resnet50_tiny@1:mobilenet_v2_tiny@4";
    std::string models, csv_path;
    unsigned units = 0;
    double seconds = 4;
    int64_t be_batch = 4;
    bool quick = false;
    uint32_t rt_clients = 2;
    std::string device_name = "cpu";
    app.add_option("--margin", g_margin, "rule 1: BE time <= margin x RT time")->capture_default_str();
    app.add_option("--pairs", pairs_text, "RT:BE model pairs, each MODEL[@BATCH[xLENGTH]] (zoo names)")->capture_default_str();
    app.add_option("--rt-clients", rt_clients, "RT clients, each with a task outstanding (2+: an RT task always waits)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 16u));
    app.add_option("--models", models, "directory of the zoo's models (default: written by build/tools/zoo)");
    app.add_option("--compute-units", units, "compute units of the cpu device (default: every core)");
    app.add_option("--seconds", seconds, "length of each run")->capture_default_str();
    app.add_option("--be-batch", be_batch, "batch of a BE model given without @BATCH")->capture_default_str();
    app.add_flag("--quick", quick, "one pair, 2 s per run");
    app.add_option("--csv", csv_path, "write the table as CSV: one row per pair and policy");
    app.footer("Progress (one line per step) goes to stderr; stdout has the table and the last line.");
    gpu::add_backend_option(app, device_name);
    CLI11_PARSE(app, argc, argv);
    if (!units) units = std::max(1u, std::thread::hardware_concurrency());
    if (quick) {
        seconds = 2;
        pairs_text = pairs_text.substr(0, pairs_text.find(','));
    }
    const fs::path build_dir = fs::canonical(fs::path(argv[0])).parent_path().parent_path();
    report::progress progress("dkp_bench");
    try {
        // Opened before any measuring: an unwritable path fails now, naming the file.
        std::unique_ptr<report::csv_writer> csv;
        if (!csv_path.empty())
            csv = std::make_unique<report::csv_writer>(
                csv_path, std::vector<std::string>{"device", "rt_model", "be_model", "policy", "seconds", "rt_per_s",
                                                   "rt_mean_ms", "rt_p50_ms", "rt_p99_ms", "be_per_s",
                                                   "be_kernels_per_s", "padded_launches", "pads_completed", "pads_cut",
                                                   "pads_skipped", "pad_blocks", "select_mean_us"});
        fs::path dir = models;
        fs::path work;
        // The number of steps is known once the pairs are: one per pair for its profiles and
        // four runs, and one for the zoo when it writes the models.
        size_t pair_count = 1;
        for (char c : pairs_text) pair_count += c == ',';
        progress.set_total(unsigned(pair_count * 5 + (dir.empty() ? 1 : 0)));
        if (dir.empty()) {
            auto step = progress.begin("tiny zoo written by " + (build_dir / "tools/zoo").string());
            work = fs::temp_directory_path() / ("dkp_bench." + std::to_string(getpid()));
            fs::create_directories(work);
            dir = work;
            // The zoo tool of this bench's own build directory (build/, build-cuda/, ...).
            const std::string cmd = (build_dir / "tools/zoo").string() + " --out " + dir.string() + " --tiny -q";
            if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the zoo tool failed: " + cmd);
        }
        std::vector<std::pair<std::string, std::string>> pairs;
        for (size_t at = 0; at < pairs_text.size();) {
            const size_t comma = std::min(pairs_text.find(',', at), pairs_text.size());
            const std::string p = pairs_text.substr(at, comma - at);
            const size_t colon = p.find(':');
            if (colon == std::string::npos) throw std::invalid_argument("--pairs: expected RT:BE, got '" + p + "'");
            pairs.emplace_back(p.substr(0, colon), p.substr(colon + 1));
            at = comma + 1;
        }
        gpu::backend_options bopt;
        bopt.compute_units = units;
        std::unique_ptr<gpu::device> device = gpu::make_backend(device_name, bopt);
        std::printf("dkp_bench: %s (%u hardware threads), %.1f s per run, %u RT clients back to back, 1 BE client (batch %lld), "
                    "tiny zoo models\n",
                    device->caps().name.c_str(), std::thread::hardware_concurrency(), seconds, rt_clients, (long long)be_batch);
        std::printf("%-40s %-9s %8s %9s %9s %9s %8s %9s %8s %7s %6s %7s %8s %7s\n", "pair (RT x BE)", "policy", "RT/s",
                    "RT mean", "RT p50", "RT p99", "BE/s", "BEkern/s", "padded", "pads ok", "cut", "skipped", "padblk",
                    "sel us");
        std::vector<double> overheads, gains;
        uint64_t hist[std::size(gpu::select_ns_buckets) + 1] = {};
        // MODEL[@BATCH[xLENGTH]] -> an instance of that plan.
        struct spec {
            std::string name;
            int64_t batch, length;
        };
        const auto parse_spec = [&](const std::string& t, int64_t batch) {
            spec sp{t, batch, 0};
            if (const size_t at = t.find('@'); at != std::string::npos) {
                sp.name = t.substr(0, at);
                const std::string bl = t.substr(at + 1);
                const size_t x = bl.find('x');
                sp.batch = std::stoll(bl.substr(0, x));
                if (x != std::string::npos) sp.length = std::stoll(bl.substr(x + 1));
            }
            return sp;
        };
        for (const auto& [rt_text, be_text] : pairs) {
            const spec rs = parse_spec(rt_text, 1), bs = parse_spec(be_text, be_batch);
            const std::string& rt_name = rt_text;
            const std::string& be_name = be_text;
            std::fflush(stdout);
            auto profiles = progress.begin("models and kernel profiles, " + rt_name + " x " + be_name);
            ml::runtime rt(*device);
            const auto instance_of = [&](const spec& sp) {
                ml::import_options io;
                io.unbound_dim = sp.length ? sp.length : 16;
                auto m = rt.load_model((dir / (sp.name + ".onnx")).string(), io);
                auto in = rt.link_model(m);
                rt.configure_batch(*in, sp.batch);
                return in;
            };
            auto ri = instance_of(rs), bi = instance_of(bs);
            rt.profile(*ri, 5);
            rt.profile(*bi, 5);
            rt.write_inputs(*ri, ml::synthetic_inputs(ri->inputs(), 1));
            rt.write_inputs(*bi, ml::synthetic_inputs(bi->inputs(), 2));
            profiles.end();
            const std::string label = rt_name + " x " + be_name;
            run_result reef, with;
            for (const auto& [pol, dkp] : {std::pair{gpu::policy::rt_only, false}, std::pair{gpu::policy::streams, false},
                                           std::pair{gpu::policy::reef, false}, std::pair{gpu::policy::reef, true}}) {
                auto step = progress.begin(label + ", " + (dkp ? "reef+dkp" : gpu::policy_name(pol)));
                const run_result r = run(*device, rt, *ri, *bi, pol, dkp, seconds, rt_clients);
                char result[96];
                std::snprintf(result, sizeof result, "RT mean %.2f ms, %.0f BE kernels/s", r.rt_mean_ms, r.be_kernels_per_s);
                step.result(result);
                step.end();
                const double sel = r.sched.select_count ? double(r.sched.select_ns_sum) / double(r.sched.select_count) / 1e3 : 0;
                if (csv) {
                    using report::csv_cell;
                    csv->row({device->caps().name, rt_name, be_name, r.policy, seconds, csv_cell::fixed(r.rt_per_s, 1),
                              csv_cell::fixed(r.rt_mean_ms, 3), csv_cell::fixed(r.rt_p50_ms, 3),
                              csv_cell::fixed(r.rt_p99_ms, 3), csv_cell::fixed(r.be_per_s, 2),
                              csv_cell::fixed(r.be_kernels_per_s, 0), r.pads.padded_launches, r.pads.pads_completed,
                              r.pads.pads_cut, r.pads.pads_skipped, r.pads.pad_blocks, csv_cell::fixed(sel, 2)});
                }
                std::printf("%-40s %-9s %8.1f %7.2fms %7.2fms %7.2fms %8.2f %9.0f %8llu %7llu %6llu %7llu %8llu %7.2f\n",
                            label.c_str(), r.policy.c_str(), r.rt_per_s, r.rt_mean_ms, r.rt_p50_ms, r.rt_p99_ms, r.be_per_s,
                            r.be_kernels_per_s, (unsigned long long)r.pads.padded_launches,
                            (unsigned long long)r.pads.pads_completed, (unsigned long long)r.pads.pads_cut,
                            (unsigned long long)r.pads.pads_skipped, (unsigned long long)r.pads.pad_blocks, sel);
                std::fflush(stdout);
                if (pol == gpu::policy::reef) (dkp ? with : reef) = r;
                if (dkp)
                    for (size_t b = 0; b < std::size(hist); ++b) hist[b] += r.sched.select_ns_hist[b];
            }
            if (reef.rt_mean_ms > 0) overheads.push_back(100.0 * (with.rt_mean_ms / reef.rt_mean_ms - 1.0));
            gains.push_back(reef.be_kernels_per_s > 0 ? with.be_kernels_per_s / reef.be_kernels_per_s
                                                      : with.be_kernels_per_s > 0 ? INFINITY : 0);
        }
        uint64_t total = 0;
        for (uint64_t h : hist) total += h;
        double p99_us = 0;
        for (size_t b = 0, seen = 0; b < std::size(hist) && total; ++b) {
            seen += hist[b];
            if (double(seen) >= 0.99 * double(total)) {
                p99_us = b < std::size(gpu::select_ns_buckets) ? gpu::select_ns_buckets[b] / 1e3 : 1e9;
                break;
            }
        }
        if (!work.empty()) fs::remove_all(work);
        if (csv) csv->commit();
        std::printf("selections: %llu; p99 bound %.2f us\n", (unsigned long long)total, p99_us);
        std::printf("rt_overhead_pct=%.2f be_throughput_gain=%.3f select_us_p99=%.2f\n",
                    percentile(overheads, 0.5), percentile(gains, 0.5), p99_us);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dkp_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
