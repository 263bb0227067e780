// preempt_bench: the scheduler (preempt/scheduler.cc) on the cpu device, with synthetic kernels
// (busy loops with a check point every ~10 us), or on the GPU (--device cuda|hip, in builds
// with -Dcuda=enabled / -Dhip=enabled) with the kernel library's gpu_spin kernel (the same
// loops on the GPU clock; BE kernels fill every SM, 4 blocks each).
//
// On the GPU the RT kernel's first block marks a host-mapped word and the host timestamps the
// moment it sees it: the latency includes that PCIe round trip (~1-2 us).
//
// 1. Preemption latency (RT arrival = submit -> first RT block running), p50/p99: reset-based
//    (reef: vHQ reset, flag, kill at a check point) vs wait-based (REEF-N style: vHQ reset but
//    no flag, no kill: the RT task is launched once the BE launches in flight have drained).
//    One BE task of Q queued kernels of L us; RT tasks arrive at random times.
// 2. RT end-to-end latency with closed-loop BE clients, and overall throughput (tasks/s),
//    for reef, seq, streams, prema against rt_only.
// 3. Restore overhead: re-executed kernels per preemption, exact vs approximate restore.
//
// --quick: only what the last line needs. --device cpu|cuda|hip (default cpu). Last line:
//   reset_p99_us=A wait_p99_us=B rt_overhead_pct=C throughput_vs_rt_only=D
//
// Every measurement prints a progress line on stderr. --csv FILE: the preemption latencies, one
// row per mode and configuration (bench/plot.py preemption plots them); --csv-policies FILE:
// the policy table, one row per policy and number of BE clients.
#include "preempt/scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_report.h"

#if defined(REEFLINE_GPU_BACKEND)
#include "libml/kernels/gpu/launcher.h"
#include "preempt/gpu_device.h"
#endif

namespace {

using namespace reefline::gpu;
using clk = std::chrono::steady_clock;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

struct busy_args {
    uint32_t us;                   // block length
    std::atomic<int64_t>* first;   // time the first block started (null: not recorded)
};

bool busy_block(const void* a, const block_context& ctx) {
    const auto& p = *static_cast<const busy_args*>(a);
    const int64_t t0 = now_ns();
    if (p.first) {
        int64_t z = 0;
        p.first->compare_exchange_strong(z, t0);
    }
    const int64_t end = t0 + int64_t(p.us) * 1000;
    int64_t next_check = t0 + 10'000;
    for (;;) {
        const int64_t t = now_ns();
        if (t >= end) return true;
        if (t >= next_check) {
            if (ctx.preempted()) return false;
            next_check = t + 10'000;
        }
    }
}
const kernel_info k_busy{"busy", busy_block, nullptr, 128, 32, 0, 0};

// --device: the cpu backend, or the build's GPU backend.
bool g_gpu = false;
uint32_t g_gpu_units = 1;  // the GPU's compute units

#if defined(REEFLINE_GPU_BACKEND)
const kernel_info k_gpu_spin{"gpu_spin", nullptr, nullptr, 32, 0, 0, 0};
#endif

// How the RT task's first block reports its start: a steady_clock time (cpu), or a host-mapped
// word the GPU kernel sets (the host timestamps when it sees it).
struct start_probe {
    std::atomic<int64_t> first{0};
    uint32_t* mapped = nullptr;
};

task busy_task(task_class cls, uint32_t kernels, uint32_t us, start_probe* probe = nullptr) {
    task t;
    t.cls = cls;
    for (uint32_t i = 0; i < kernels; ++i) {
#if defined(REEFLINE_GPU_BACKEND)
        if (g_gpu) {
            // BE kernels occupy the whole GPU; an RT kernel a quarter of it.
            const uint32_t grid = cls == task_class::be ? 4 * g_gpu_units : std::max<uint32_t>(1, g_gpu_units / 4);
            const reefline::ml::kernels::gpu_spin_args a{uint64_t(us) * 1000, 10'000,
                                                         i == 0 && probe ? probe->mapped : nullptr};
            t.launches.push_back(task_launch::make(&k_gpu_spin, a, grid));
            continue;
        }
#endif
        t.launches.push_back(task_launch::make(&k_busy, busy_args{us, i == 0 && probe ? &probe->first : nullptr}, 1));
    }
    return t;
}

double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, size_t(p / 100.0 * double(v.size() - 1) + 0.5));
    return v[i];
}

double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
}

uint32_t g_units = 1;

std::unique_ptr<device> make_dev() {
#if defined(REEFLINE_GPU_BACKEND)
    if (g_gpu) return make_gpu_device();
#endif
    cpu_device_options o;
    o.compute_units = g_units;
    o.scratch_per_unit = 1u << 16;
    return make_cpu_device(o);
}

// Keeps BE tasks running on `s` from `clients` closed-loop clients until stopped.
struct be_clients {
    scheduler& s;
    uint32_t kernels, us;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> done{0};
    std::vector<std::thread> th;
    be_clients(scheduler& sc, uint32_t n, uint32_t k, uint32_t u) : s(sc), kernels(k), us(u) {
        for (uint32_t i = 0; i < n; ++i)
            th.emplace_back([this, i] {
                while (!stop.load()) {
                    task t = busy_task(task_class::be, kernels, us);
                    t.be_queue = int(i);
                    const task_result r = s.wait(s.submit(std::move(t)));
                    if (r.status == task_status::completed) done.fetch_add(1);
                    else if (r.status == task_status::rejected) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                }
            });
    }
    void join() {
        stop = true;
        for (auto& t : th) t.join();
    }
};

// Preemption latency with one BE task of `queued` kernels of `us` each kept running.
struct lat_result {
    double p50, p99;
    double start_p50;  // arrival -> the scheduler launched the RT task
    size_t measured;   // samples whose RT task completed and was seen starting
};
lat_result preemption_latency(preempt_mode mode, uint32_t queued, uint32_t us, int samples, uint32_t seed) {
    auto dev = make_dev();
    scheduler_options o;
    o.pol = policy::reef;
    o.preempt = mode;
    scheduler s(*dev, o);
    std::mt19937 rng(seed);
    be_clients be(s, 1, queued, us);
    std::vector<double> lat, st;
    start_probe probe;
    if (g_gpu) {
        probe.mapped = static_cast<uint32_t*>(dev->alloc(64, memory_kind::host_mapped));
        if (!probe.mapped) throw std::bad_alloc();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (int i = 0; i < samples; ++i) {
        // Arrive at a random point of a BE kernel (and after the previous restore).
        std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 1500));
        probe.first.store(0);
        if (probe.mapped) *reinterpret_cast<volatile uint32_t*>(probe.mapped) = 0;
        const task_id id = s.submit(busy_task(task_class::rt, 1, 20, &probe));
        if (probe.mapped) {
            // Poll the word the RT kernel's first block sets (bounded: a failed task never sets it).
            const int64_t give_up = now_ns() + 1'000'000'000;
            while (*reinterpret_cast<volatile uint32_t*>(probe.mapped) == 0 && now_ns() < give_up) {
            }
            if (*reinterpret_cast<volatile uint32_t*>(probe.mapped) != 0) probe.first.store(now_ns());
        }
        const task_result r = s.wait(id);
        if (r.status == task_status::completed && probe.first.load()) {
            lat.push_back(double(probe.first.load() - r.submit_ns) / 1000.0);
            st.push_back(double(r.start_ns - r.submit_ns) / 1000.0);
        }
    }
    be.join();
    s.shutdown();
    if (probe.mapped) dev->free(probe.mapped);
    return {pct(lat, 50), pct(lat, 99), pct(st, 50), lat.size()};
}

// RT closed-loop client (4 kernels of 100 us, 300 us think time) with `be_n` BE clients.
struct load_result {
    double rt_mean_us = 0, rt_p99_us = 0, tasks_per_s = 0;
    uint64_t rt_done = 0, be_done = 0, preemptions = 0, restores = 0, reexecuted = 0;
};
load_result load_run(policy pol, restore_mode rm, uint32_t be_n, double seconds, uint32_t seed) {
    auto dev = make_dev();
    scheduler_options o;
    o.pol = pol;
    o.restore = rm;
    scheduler s(*dev, o);
    std::mt19937 rng(seed);
    be_clients be(s, be_n, 10, 200);
    std::vector<double> lat;
    const int64_t t0 = now_ns();
    const int64_t end = t0 + int64_t(seconds * 1e9);
    while (now_ns() < end) {
        const task_result r = s.wait(s.submit(busy_task(task_class::rt, 4, 100)));
        if (r.status == task_status::completed) lat.push_back(double(r.end_ns - r.submit_ns) / 1000.0);
        std::this_thread::sleep_for(std::chrono::microseconds(200 + rng() % 200));
    }
    const double el = double(now_ns() - t0) / 1e9;
    be.join();
    load_result res;
    res.rt_mean_us = mean(lat);
    res.rt_p99_us = pct(lat, 99);
    res.rt_done = lat.size();
    res.be_done = be.done.load();
    res.tasks_per_s = double(res.rt_done + res.be_done) / el;
    s.shutdown();
    const scheduler_stats st = s.stats();
    res.preemptions = st.preemptions;
    res.restores = st.restores;
    res.reexecuted = st.reexecuted_kernels;
    return res;
}

}  // namespace

int main(int argc, char** argv) {
    namespace report = reefline::bench;
    bool quick = false;
    std::string device_name = "cpu", csv_path, csv_policies_path;
    const char* usage =
        "usage: preempt_bench [--quick] [--units N] [--device cpu|cuda|hip] [--csv FILE] [--csv-policies FILE]\n"
        "  --quick              only what the last line needs\n"
        "  --units N            compute units of the cpu device (default 1)\n"
        "  --device D           cpu, or this build's GPU backend\n"
        "  --csv FILE           preemption latencies as CSV, one row per mode and configuration\n"
        "  --csv-policies FILE  the policy table as CSV, one row per policy and number of BE clients\n"
        "progress (one line per measurement) goes to stderr; stdout has the tables and the last line\n";
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick")) quick = true;
        else if (!std::strcmp(argv[i], "--units") && i + 1 < argc) g_units = uint32_t(std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device_name = argv[++i];
        else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
        else if (!std::strcmp(argv[i], "--csv-policies") && i + 1 < argc) csv_policies_path = argv[++i];
        else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::fputs(usage, stdout);
            return 0;
        } else {
            std::fputs(usage, stderr);
            return 2;
        }
    }
    if (g_units == 0) g_units = 1;
    // Opened before any measurement: an unwritable path fails now, naming the file.
    std::unique_ptr<report::csv_writer> csv, csv_policies;
    try {
        if (!csv_path.empty())
            csv = std::make_unique<report::csv_writer>(
                csv_path, std::vector<std::string>{"device", "sweep", "mode", "queued_kernels", "kernel_us", "samples",
                                                   "measured", "p50_us", "p99_us", "launch_p50_us"});
        if (!csv_policies_path.empty())
            csv_policies = std::make_unique<report::csv_writer>(
                csv_policies_path,
                std::vector<std::string>{"device", "policy", "restore", "be_clients", "seconds", "rt_mean_us",
                                         "rt_p99_us", "tasks_per_s", "rt_done", "be_done", "preemptions", "restores",
                                         "reexecuted_kernels"});
    } catch (const std::exception& e) {
        std::fprintf(stderr, "preempt_bench: %s\n", e.what());
        return 1;
    }
    if (device_name != "cpu") {
#if defined(REEFLINE_GPU_BACKEND)
        if (device_name != gpu_backend_name()) {
            std::fprintf(stderr, "preempt_bench: this build's GPU backend is %s, not %s\n", gpu_backend_name(),
                         device_name.c_str());
            return 2;
        }
        try {
            const device_caps c = make_gpu_device()->caps();
            g_gpu = true;
            g_gpu_units = std::max<uint32_t>(1, c.compute_units);
            std::printf("preempt_bench: %s device %s, %u compute units%s\n", device_name.c_str(), c.name.c_str(),
                        c.compute_units, quick ? ", quick" : "");
        } catch (const no_device_error& e) {
            std::fprintf(stderr, "preempt_bench: %s\n", e.what());
            return 77;
        }
#else
        std::fprintf(stderr, "preempt_bench: --device %s needs a build with -D%s=enabled\n", device_name.c_str(),
                     device_name.c_str());
        return 2;
#endif
    } else {
        std::printf("preempt_bench: cpu device, %u compute unit(s)%s\n", g_units, quick ? ", quick" : "");
    }
    std::fflush(stdout);

    const uint32_t queued_sweep[] = {10, 50, 200, 1000};   // kernels of 200 us
    const uint32_t length_sweep[] = {10, 100, 200, 1000};  // us, 200 queued
    constexpr unsigned policy_runs_full = 12, policy_runs_quick = 2;
    report::progress progress("preempt_bench", quick ? 2 + policy_runs_quick
                                                     : unsigned(2 * (std::size(queued_sweep) + std::size(length_sweep))) +
                                                           2 + policy_runs_full);
    const int samples = quick ? 100 : 200;
    // One preemption-latency measurement: a progress line and a CSV row.
    const auto latency = [&](const char* sweep, preempt_mode mode, uint32_t queued, uint32_t us, uint32_t seed) {
        const char* mode_name = mode == preempt_mode::reset ? "reset" : "wait";
        auto step = progress.begin(std::string("preemption latency, ") + mode_name + ", " + std::to_string(queued) +
                                   " queued BE kernels of " + std::to_string(us) + " us");
        const lat_result r = preemption_latency(mode, queued, us, samples, seed);
        char result[64];
        std::snprintf(result, sizeof result, "p99 %.1f us", r.p99);
        step.result(result);
        if (csv)
            csv->row({device_name, sweep, mode_name, queued, us, samples, r.measured, report::csv_cell::fixed(r.p50, 1),
                      report::csv_cell::fixed(r.p99, 1), report::csv_cell::fixed(r.start_p50, 1)});
        return r;
    };
    try {
        if (!quick) {
            std::printf("\npreemption latency (us) vs queued BE kernels (kernel 200 us)\n");
            std::printf("%8s %12s %12s %12s %12s\n", "queued", "reset_p50", "reset_p99", "wait_p50", "wait_p99");
            std::fflush(stdout);
            for (uint32_t q : queued_sweep) {
                const lat_result r = latency("queued", preempt_mode::reset, q, 200, q);
                const lat_result w = latency("queued", preempt_mode::wait, q, 200, q);
                std::printf("%8u %12.1f %12.1f %12.1f %12.1f\n", q, r.p50, r.p99, w.p50, w.p99);
                std::fflush(stdout);
            }
            std::printf("\npreemption latency (us) vs BE kernel length (200 queued)\n");
            std::printf("%8s %12s %12s %12s %12s\n", "len_us", "reset_p50", "reset_p99", "wait_p50", "wait_p99");
            std::fflush(stdout);
            for (uint32_t us : length_sweep) {
                const lat_result r = latency("length", preempt_mode::reset, 200, us, us);
                const lat_result w = latency("length", preempt_mode::wait, 200, us, us);
                std::printf("%8u %12.1f %12.1f %12.1f %12.1f\n", us, r.p50, r.p99, w.p50, w.p99);
                std::fflush(stdout);
            }
        }
        const lat_result reset = latency("contract", preempt_mode::reset, 200, 200, 1);
        const lat_result wait = latency("contract", preempt_mode::wait, 200, 200, 1);
        std::printf("\npreemption latency, 200 queued BE kernels of 200 us: reset p50 %.1f p99 %.1f us, "
                    "wait p50 %.1f p99 %.1f us (arrival -> RT launched p50: reset %.1f, wait %.1f us)\n", reset.p50, reset.p99,
                    wait.p50, wait.p99, reset.start_p50, wait.start_p50);

        const double secs = quick ? 4.0 : 6.0;
        // One policy run: a progress line and a CSV row; the table row is printed by the caller.
        const auto load = [&](const char* name, policy pol, restore_mode rm, uint32_t be_n) {
            auto step = progress.begin(std::string("RT latency under BE load, ") + name + " (" + std::to_string(be_n) +
                                       " BE client" + (be_n == 1 ? "" : "s") + ")");
            const load_result r = load_run(pol, rm, be_n, secs, 7);
            char result[64];
            std::snprintf(result, sizeof result, "RT mean %.1f us", r.rt_mean_us);
            step.result(result);
            if (csv_policies)
                csv_policies->row({device_name, policy_name(pol),
                                   rm == restore_mode::exact ? "exact" : "approximate", be_n, secs,
                                   report::csv_cell::fixed(r.rt_mean_us, 1), report::csv_cell::fixed(r.rt_p99_us, 1),
                                   report::csv_cell::fixed(r.tasks_per_s, 1), r.rt_done, r.be_done, r.preemptions,
                                   r.restores, r.reexecuted});
            return r;
        };
        const load_result ref = load("rt_only", policy::rt_only, restore_mode::exact, 1);
        const load_result reef1 = load("reef", policy::reef, restore_mode::exact, 1);
        std::printf("\n%-22s %10s %10s %10s %8s %8s %8s %8s %8s\n", "policy (BE clients)", "rt_mean", "rt_p99",
                    "tasks/s", "rt", "be", "preempt", "restore", "reexec");
        auto row = [](const char* name, const load_result& r) {
            std::printf("%-22s %10.1f %10.1f %10.1f %8llu %8llu %8llu %8llu %8llu\n", name, r.rt_mean_us, r.rt_p99_us,
                        r.tasks_per_s, (unsigned long long)r.rt_done, (unsigned long long)r.be_done,
                        (unsigned long long)r.preemptions, (unsigned long long)r.restores,
                        (unsigned long long)r.reexecuted);
            std::fflush(stdout);
        };
        row("rt_only (1)", ref);
        row("reef (1)", reef1);
        if (!quick) {
            row("reef approx (1)", load("reef approx", policy::reef, restore_mode::approximate, 1));
            row("seq (1)", load("seq", policy::seq, restore_mode::exact, 1));
            row("streams (1)", load("streams", policy::streams, restore_mode::exact, 1));
            row("prema (1)", load("prema", policy::prema, restore_mode::exact, 1));
            row("rt_only (4)", load("rt_only", policy::rt_only, restore_mode::exact, 4));
            row("reef (4)", load("reef", policy::reef, restore_mode::exact, 4));
            row("reef approx (4)", load("reef approx", policy::reef, restore_mode::approximate, 4));
            row("seq (4)", load("seq", policy::seq, restore_mode::exact, 4));
            row("streams (4)", load("streams", policy::streams, restore_mode::exact, 4));
            row("prema (4)", load("prema", policy::prema, restore_mode::exact, 4));
        }
        if (csv) csv->commit();
        if (csv_policies) csv_policies->commit();
        const double overhead = ref.rt_mean_us > 0 ? (reef1.rt_mean_us / ref.rt_mean_us - 1.0) * 100.0 : 0;
        const double tput = ref.tasks_per_s > 0 ? reef1.tasks_per_s / ref.tasks_per_s : 0;
        std::printf("reset_p99_us=%.1f wait_p99_us=%.1f rt_overhead_pct=%.1f throughput_vs_rt_only=%.2f\n", reset.p99,
                    wait.p99, overhead, tput);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "preempt_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
