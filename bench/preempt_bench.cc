// preempt_bench: the scheduler (preempt/scheduler.cc) on the cpu device, or on the GPU
// (--device cuda|hip, in builds with -Dcuda=enabled / -Dhip=enabled).
//
// 1. Preemption latency, honestly: RT arrival (submit) -> first RT block running, under BE
//    load that holds every compute unit, with the stages of each preemption:
//      submit   the RT task's submit() returned (on levels: the BE level raised)
//      notice   the first running BE block stopped at a check point (spin loads)
//      launch   the scheduler launched the RT task
//      first    the RT kernel's first block running: the preemption latency
//      drain    the RT kernel's last block running: its blocks need every unit (one per unit,
//               and on a GPU as much shared memory as a block may have), so this is when the
//               last BE block left the last unit
//      done     the RT task ended
//    Device times come from the kernels' own clocks (the cpu device: steady_clock; a GPU: its
//    global timer, mapped onto the host's clock by ping launches, +-half a ping's round trip).
//    BE loads: `spin` (short blocks that leave room beside them: on a GPU, 32-thread blocks
//    without shared memory, which RT blocks fit beside, so that no BE block has to leave: the
//    old, flattering measurement), `full` (blocks that hold a whole unit: on a GPU the most
//    shared memory a block may have; their length is the check interval's reach) and, with
//    --model FILE, `model` (the model at batch 8 as BE tasks: real convolution blocks; the RT
//    task is then also measured as the model's first kernel and as the whole model at batch 1).
//    Reset-based (reef: the BE level raised, or each BE queue's flag with --flags) against
//    wait-based (REEF-N: launches in flight run to their end). p50, p99, p99.9.
// 2. RT end-to-end latency with closed-loop BE clients, and overall throughput (tasks/s), for
//    reef, seq, streams, prema against rt_only.
// 3. Restore overhead: re-executed kernels per preemption, exact vs approximate restore.
//
// --quick: only what the last line needs (the `full` load, reset and wait, rt_only and reef).
// Last line:
//   reset_p50_us=A reset_p99_us=B reset_p999_us=C drain_p99_us=D wait_p99_us=E rt_overhead_pct=F
//   throughput_vs_rt_only=G
//
// Every measurement prints a progress line on stderr. --csv FILE: the preemption latencies and
// stages, one row per mode, load and configuration (bench/plot.py preemption plots them);
// --csv-policies FILE: the policy table, one row per policy and number of BE clients.
#include "preempt/backend_registry.h"
#include "preempt/scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>

#include "bench/bench_report.h"

#if defined(REEFLINE_GPU_BACKEND)
#include "libml/kernels/gpu/launcher.h"
#include "preempt/gpu_device.h"
#endif
#if defined(REEFLINE_BENCH_MODELS)
#include "libml/libml.h"
#include "libml/runtime/synthetic_inputs.h"
#endif

namespace {

using namespace reefline::gpu;
using clk = std::chrono::steady_clock;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

// ---- the kernels -------------------------------------------------------------------------------

// A block of known length that checks every `check_us`; with `starts` it records when it
// started, with `stops` when it stopped at a check point (steady_clock ns, per block).
struct busy_args {
    uint32_t us;
    uint32_t check_us;
    int64_t* starts;
    int64_t* stops;
};

bool busy_block(const void* a, const block_context& ctx) {
    const auto& p = *static_cast<const busy_args*>(a);
    const int64_t t0 = now_ns();
    if (p.starts) reinterpret_cast<std::atomic<int64_t>*>(p.starts + ctx.block)->store(t0, std::memory_order_relaxed);
    const int64_t end = t0 + int64_t(p.us) * 1000, every = int64_t(p.check_us) * 1000;
    int64_t next_check = t0 + every;
    for (;;) {
        const int64_t t = now_ns();
        if (t >= end) return true;
        if (t >= next_check) {
            if (ctx.preempted()) {
                if (p.stops) reinterpret_cast<std::atomic<int64_t>*>(p.stops + ctx.block)->store(t, std::memory_order_relaxed);
                return false;
            }
            next_check = t + every;
        }
    }
}
const kernel_info k_busy{"busy", busy_block, 128, 32, 0, 0};

#if defined(REEFLINE_GPU_BACKEND)
const kernel_info k_gpu_spin{"gpu_spin", nullptr, 32, 0, 0, 0};
#endif

// --backend: the cpu backend, or the build's GPU backend.
bool g_gpu = false;
uint32_t g_units = 1;        // compute units of the cpu device (--units)
uint32_t g_gpu_units = 1;    // the GPU's compute units
uint32_t g_check_us = 10;    // BE blocks' check interval (--check-us)
bool g_use_levels = true;    // --flags: per-queue flags instead of the BE level
std::string g_model_path;    // --model

int g_dispatcher_cpu = -1;  // --pin: the scheduler thread's CPU (the last one); units on the others

std::string g_backend = "cpu";  // --backend

std::unique_ptr<device> make_dev() {
    backend_options o;
    o.compute_units = g_units;
    // The spin kernels need no scratch; a model's convolutions need the default.
    if (g_model_path.empty()) o.scratch_per_unit = 1u << 16;
    if (g_gpu || g_dispatcher_cpu < 0) return make_backend(g_backend, o);
    // The device pins its units where they are as many as the CPUs its creator may run on:
    // created from a thread allowed every CPU but the dispatcher's.
    std::unique_ptr<device> d;
    std::thread([&] {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c = 0; c < g_dispatcher_cpu; ++c) CPU_SET(c, &set);
        (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        d = make_backend(g_backend, o);
    }).join();
    return d;
}

uint32_t units_of_device() { return g_gpu ? g_gpu_units : g_units; }

// Per-block time words the kernels write (host-mapped on a GPU), and the map from the device's
// clock to the host's.
struct probe_words {
    device* dev = nullptr;
    uint32_t n = 0;
    int64_t* words = nullptr;
    probe_words(device& d, uint32_t count) : dev(&d), n(count) {
        words = static_cast<int64_t*>(d.alloc(size_t(count) * 8, g_gpu ? memory_kind::host_mapped : memory_kind::device));
        if (!words) throw std::bad_alloc();
        clear();
    }
    ~probe_words() { dev->free(words); }
    probe_words(const probe_words&) = delete;
    probe_words& operator=(const probe_words&) = delete;
    void clear() {
        for (uint32_t i = 0; i < n; ++i) reinterpret_cast<std::atomic<int64_t>*>(words + i)->store(0);
    }
    int64_t at(uint32_t i) const { return reinterpret_cast<std::atomic<int64_t>*>(words + i)->load(); }
    // Least and greatest non-zero word (0, 0 when none).
    std::pair<int64_t, int64_t> range() const {
        int64_t lo = 0, hi = 0;
        for (uint32_t i = 0; i < n; ++i)
            if (const int64_t v = at(i)) {
                lo = lo ? std::min(lo, v) : v;
                hi = std::max(hi, v);
            }
        return {lo, hi};
    }
};

// host ns = device ns + offset. The cpu device's kernels read the host's clock (offset 0); a
// GPU's global timer is mapped by ping launches: a one-block kernel records its start, the host
// its launch and the moment it sees the record; the ping with the shortest round trip wins.
struct clock_map {
    int64_t offset = 0;
    double error_us = 0;  // half the best ping's round trip
};

clock_map calibrate_clock(device& d) {
    clock_map m;
#if defined(REEFLINE_GPU_BACKEND)
    // The SIMT emulation's GPU clock is the host's steady clock (its launches take far longer
    // than a ping could measure).
    if (!g_gpu || std::strcmp(reefline::ml::kernels::gpu_runtime_name(), "SIMT emulation") == 0) return m;
    stream* s = d.create_stream(d.caps().highest_priority);
    probe_words start(d, 1);
    int64_t best = INT64_MAX;
    for (int i = 0; i < 32; ++i) {
        start.clear();
        reefline::ml::kernels::gpu_spin_args a{0, 1'000'000, nullptr};
        a.block_start_ns = reinterpret_cast<uint64_t*>(start.words);
        const int64_t before = now_ns();
        d.launch(s, launch{&k_gpu_spin, &a, uint32_t(sizeof a), 1, 0, 1, nullptr, 0});
        while (start.at(0) == 0 && now_ns() - before < 1'000'000'000) {
        }
        const int64_t after = now_ns(), dev_t = start.at(0);
        d.synchronize(s);
        if (dev_t && after - before < best) {
            best = after - before;
            m.offset = (before + after) / 2 - dev_t;
            m.error_us = double(best) / 2000.0;
        }
    }
    d.stream_destroy(s);
#else
    (void)d;
#endif
    return m;
}

// ---- loads -------------------------------------------------------------------------------------

enum class be_load { spin, full, model };
const char* load_name(be_load l) { return l == be_load::spin ? "spin" : l == be_load::full ? "full" : "model"; }

enum class rt_kind { spin, first_kernel, model };
const char* rt_name(rt_kind k) { return k == rt_kind::spin ? "spin" : k == rt_kind::first_kernel ? "first_kernel" : "model"; }

// A spin task: `kernels` launches of `grid` blocks of `us` each.
task spin_task(task_class cls, uint32_t kernels, uint32_t grid, uint32_t us, bool fill_units, int64_t* starts,
               int64_t* stops) {
    task t;
    t.cls = cls;
    for (uint32_t i = 0; i < kernels; ++i) {
#if defined(REEFLINE_GPU_BACKEND)
        if (g_gpu) {
            reefline::ml::kernels::gpu_spin_args a{uint64_t(us) * 1000, uint64_t(g_check_us) * 1000, nullptr};
            a.shared_bytes = fill_units ? UINT32_MAX : 0;
            a.block_start_ns = reinterpret_cast<uint64_t*>(starts);
            a.block_stop_ns = reinterpret_cast<uint64_t*>(stops);
            t.launches.push_back(task_launch::make(&k_gpu_spin, a, grid));
            continue;
        }
#endif
        (void)fill_units;
        t.launches.push_back(task_launch::make(&k_busy, busy_args{us, g_check_us, starts, stops}, grid));
    }
    return t;
}

// Keeps BE tasks running on `s` from `clients` closed-loop clients until stopped. Each task is
// made by `make` (called on the client's thread).
struct be_clients {
    scheduler& s;
    std::function<task()> make;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> done{0};
    std::vector<std::thread> th;
    be_clients(scheduler& sc, uint32_t n, std::function<task()> m) : s(sc), make(std::move(m)) {
        for (uint32_t i = 0; i < n; ++i)
            th.emplace_back([this, i] {
                while (!stop.load()) {
                    task t = make();
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

#if defined(REEFLINE_BENCH_MODELS)
// The model as BE tasks at batch 8 and as RT tasks at batch 1, on the measurement's device.
struct model_tasks {
    std::unique_ptr<reefline::ml::runtime> rt;
    std::unique_ptr<reefline::ml::instance> be, rt1;
    std::vector<task_launch> be_launches, rt_launches;
    model_tasks(device& d, const std::string& path) : rt(std::make_unique<reefline::ml::runtime>(d)) {
        auto m = rt->load_model(path);
        be = rt->link_model(m);
        rt->configure_batch(*be, 8);
        rt1 = rt->link_model(m, -1);
        rt->configure_batch(*rt1, 1);
        rt->write_inputs(*be, reefline::ml::synthetic_inputs(be->inputs(), 2));
        rt->write_inputs(*rt1, reefline::ml::synthetic_inputs(rt1->inputs(), 1));
        be_launches = rt->task_launches(*be);
        rt_launches = rt->task_launches(*rt1);
    }
};
#endif

// ---- preemption latency --------------------------------------------------------------------------

struct stage_samples {
    std::vector<double> submit, notice, launch, first, drain, done;
};

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

struct lat_result {
    double p50 = 0, p99 = 0, p999 = 0;  // arrival -> first RT block running (rt_kind::spin), or done
    double drain_p50 = 0, drain_p99 = 0;
    double submit_p50 = 0, notice_p50 = 0, launch_p50 = 0, done_p50 = 0;
    size_t measured = 0;
    double clock_error_us = 0;
};

lat_result preemption_latency(preempt_mode mode, be_load load, rt_kind rk, uint32_t queued, uint32_t us, int samples,
                              uint32_t seed) {
    auto dev = make_dev();
    const clock_map clock = calibrate_clock(*dev);
    scheduler_options o;
    o.pol = policy::reef;
    o.preempt = mode;
    o.use_levels = g_use_levels;
    o.dispatcher_cpu = g_dispatcher_cpu;
    scheduler s(*dev, o);
    std::mt19937 rng(seed);
    const uint32_t units = units_of_device();
    // BE: blocks on every unit, twice over (a GPU: spin 4 small blocks per unit, full 2 that
    // each hold a unit's shared memory); RT: one block per unit.
    const uint32_t be_grid = g_gpu ? (load == be_load::spin ? 4 * units : 2 * units) : std::max<uint32_t>(1, units);
    probe_words be_stops(*dev, be_grid), rt_starts(*dev, units);
    std::function<task()> make_be;
    std::function<task()> make_rt;
#if defined(REEFLINE_BENCH_MODELS)
    std::unique_ptr<model_tasks> model;
    if (load == be_load::model || rk != rt_kind::spin) model = std::make_unique<model_tasks>(*dev, g_model_path);
#endif
    if (load == be_load::model) {
#if defined(REEFLINE_BENCH_MODELS)
        make_be = [&] {
            task t;
            t.cls = task_class::be;
            t.launches = model->be_launches;
            return t;
        };
#endif
    } else {
        make_be = [&, fill = load == be_load::full] {
            return spin_task(task_class::be, queued, be_grid, us, fill, nullptr, be_stops.words);
        };
    }
    if (rk == rt_kind::spin) {
        make_rt = [&] { return spin_task(task_class::rt, 1, units, 20, true, rt_starts.words, nullptr); };
    } else {
#if defined(REEFLINE_BENCH_MODELS)
        make_rt = [&] {
            task t;
            t.cls = task_class::rt;
            t.launches = model->rt_launches;
            if (rk == rt_kind::first_kernel) t.launches.resize(1);
            return t;
        };
#endif
    }
    be_clients be(s, 1, make_be);
    stage_samples st;
    std::vector<double> lat;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int i = 0; i < samples; ++i) {
        // Arrive at a random point of a BE kernel (and after the previous restore).
        std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 1500));
        be_stops.clear();
        rt_starts.clear();
        task rt = make_rt();
        const task_id id = s.submit(std::move(rt));
        const int64_t submitted = now_ns();
        const task_result r = s.wait(id);
        if (r.status != task_status::completed) continue;
        const double arrival = double(r.submit_ns);
        auto us_since = [&](double t) { return (t - arrival) / 1000.0; };
        st.submit.push_back(us_since(double(submitted)));
        st.launch.push_back(us_since(double(r.start_ns)));
        st.done.push_back(us_since(double(r.end_ns)));
        if (const auto [lo, hi] = be_stops.range(); lo) st.notice.push_back(us_since(double(lo + clock.offset)));
        if (rk == rt_kind::spin) {
            const auto [lo, hi] = rt_starts.range();
            if (!lo) continue;
            lat.push_back(us_since(double(lo + clock.offset)));
            st.first.push_back(lat.back());
            st.drain.push_back(us_since(double(hi + clock.offset)));
        } else {
            lat.push_back(st.done.back());
        }
    }
    be.join();
    s.shutdown();
    lat_result res;
    res.p50 = pct(lat, 50);
    res.p99 = pct(lat, 99);
    res.p999 = pct(lat, 99.9);
    res.drain_p50 = pct(st.drain, 50);
    res.drain_p99 = pct(st.drain, 99);
    res.submit_p50 = pct(st.submit, 50);
    res.notice_p50 = st.notice.empty() ? -1 : pct(st.notice, 50);
    res.launch_p50 = pct(st.launch, 50);
    res.done_p50 = pct(st.done, 50);
    res.measured = lat.size();
    res.clock_error_us = clock.error_us;
    return res;
}

// ---- RT latency and throughput under BE load ----------------------------------------------------

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
    o.use_levels = g_use_levels;
    o.dispatcher_cpu = g_dispatcher_cpu;
    scheduler s(*dev, o);
    std::mt19937 rng(seed);
    const uint32_t units = units_of_device();
    const uint32_t be_grid = g_gpu ? 4 * units : 1, rt_grid = g_gpu ? std::max<uint32_t>(1, units / 4) : 1;
    be_clients be(s, be_n, [&] { return spin_task(task_class::be, 10, be_grid, 200, false, nullptr, nullptr); });
    std::vector<double> lat;
    const int64_t t0 = now_ns();
    const int64_t end = t0 + int64_t(seconds * 1e9);
    while (now_ns() < end) {
        const task_result r = s.wait(s.submit(spin_task(task_class::rt, 4, rt_grid, 100, false, nullptr, nullptr)));
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

// ---- the command line, outputs and tables -------------------------------------------------------

namespace report = reefline::bench;

const char* const usage =
    "usage: preempt_bench [--quick] [--units N] [--backend cpu|cuda|hip] [--check-us N] [--flags] [--model FILE]\n"
    "                     [--samples N] [--csv FILE] [--csv-policies FILE]\n"
    "  --quick              only what the last line needs\n"
    "  --units N            compute units of the cpu device (default 1)\n"
    "  --backend B          a backend of this build (cpu, or its GPU backend); --device is the same\n"
    "  --check-us N         BE blocks' check interval, us (default 10)\n"
    "  --flags              stop BE work by per-queue task flags, not by the BE preemption level\n"
    "  --pin                the scheduler thread spinning on the last CPU, the cpu device's units on the others\n"
    "  --model FILE         also the model as BE load (batch 8) and as RT task (first kernel, whole at batch 1)\n"
    "  --samples N          preemptions per measurement (default 200, quick 150)\n"
    "  --csv FILE           preemption latencies and stages as CSV, one row per mode, load and configuration\n"
    "  --csv-policies FILE  the policy table as CSV, one row per policy and number of BE clients\n"
    "progress (one line per measurement) goes to stderr; stdout has the tables and the last line\n";

// The options that are not globals (those the device and task makers read are g_*).
struct bench_options {
    bool quick = false;
    int samples = 0;
    std::string csv_path, csv_policies_path;
};

// Parses the command line into `o` and the g_* globals. Returns an exit code when main should
// return now (0 after --help, 2 after a bad option), nothing when the run goes on.
std::optional<int> parse_args(int argc, char** argv, bench_options& o) {
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick")) o.quick = true;
        else if (!std::strcmp(argv[i], "--units") && i + 1 < argc) g_units = uint32_t(std::atoi(argv[++i]));
        else if ((!std::strcmp(argv[i], "--backend") || !std::strcmp(argv[i], "--device")) && i + 1 < argc)
            g_backend = argv[++i];
        else if (!std::strcmp(argv[i], "--check-us") && i + 1 < argc) g_check_us = uint32_t(std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--flags")) g_use_levels = false;
        else if (!std::strcmp(argv[i], "--pin")) g_dispatcher_cpu = int(std::thread::hardware_concurrency()) - 1;
        else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) g_model_path = argv[++i];
        else if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) o.samples = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) o.csv_path = argv[++i];
        else if (!std::strcmp(argv[i], "--csv-policies") && i + 1 < argc) o.csv_policies_path = argv[++i];
        else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::fputs(usage, stdout);
            return 0;
        } else {
            std::fputs(usage, stderr);
            return 2;
        }
    }
    if (g_units == 0) g_units = 1;
    if (g_check_us == 0) g_check_us = 1;
    if (o.samples <= 0) o.samples = o.quick ? 150 : 200;
#if !defined(REEFLINE_BENCH_MODELS)
    if (!g_model_path.empty()) {
        std::fprintf(stderr, "preempt_bench: --model needs the full build (libml); this is the GPU core build\n");
        return 2;
    }
#endif
    return std::nullopt;
}

// --csv (preemption latencies) and --csv-policies (the policy table); null where not asked for.
struct csv_outputs {
    std::unique_ptr<report::csv_writer> latency, policies;
};

csv_outputs open_csv_outputs(const bench_options& o) {
    csv_outputs out;
    if (!o.csv_path.empty())
        out.latency = std::make_unique<report::csv_writer>(
            o.csv_path, std::vector<std::string>{"device", "sweep", "mode", "preempt_by", "be_load", "rt",
                                                 "queued_kernels", "kernel_us", "check_us", "samples", "measured",
                                                 "p50_us", "p99_us", "p999_us", "drain_p50_us", "drain_p99_us",
                                                 "submit_p50_us", "notice_p50_us", "launch_p50_us", "done_p50_us",
                                                 "clock_error_us"});
    if (!o.csv_policies_path.empty())
        out.policies = std::make_unique<report::csv_writer>(
            o.csv_policies_path,
            std::vector<std::string>{"device", "policy", "restore", "be_clients", "seconds", "rt_mean_us",
                                     "rt_p99_us", "tasks_per_s", "rt_done", "be_done", "preemptions", "restores",
                                     "reexecuted_kernels"});
    return out;
}

// Finds the --backend, sets g_gpu and g_gpu_units for a GPU, and prints the device's lines. Returns
// an exit code when main should return now (2: no such backend; 77: no GPU), nothing when the run goes on.
std::optional<int> select_device(const std::string& device_name, bool quick) {
    const backend_entry* backend = find_backend(device_name);
    if (!backend) {
        std::fprintf(stderr,
                     "preempt_bench: --backend %s: this build has %s (GPU backends: -Dcuda=enabled or "
                     "-Dhip=enabled)\n",
                     device_name.c_str(), backend_names().c_str());
        return 2;
    }
    if (backend->gpu) {
#if defined(REEFLINE_GPU_BACKEND)
        try {
            const auto d = make_backend(device_name);
            const device_caps c = d->caps();
            gpu_device_stats gs{};
            gpu_device_stats_of(*d, gs);
            g_gpu = true;
            g_gpu_units = std::max<uint32_t>(1, c.compute_units);
            std::printf("preempt_bench: %s device %s, %u compute units, %u B shared memory per full block, "
                        "levels by %s%s\n",
                        device_name.c_str(), c.name.c_str(), c.compute_units,
                        reefline::ml::kernels::gpu_spin_full_shared_bytes(), gs.level_path, quick ? ", quick" : "");
        } catch (const no_device_error& e) {
            std::fprintf(stderr, "preempt_bench: %s\n", e.what());
            return 77;
        }
#endif
    } else {
        std::printf("preempt_bench: cpu device, %u compute unit(s)%s\n", g_units, quick ? ", quick" : "");
    }
    std::printf("BE blocks check every %u us; BE work stopped by %s\n", g_check_us,
                g_use_levels ? "its preemption level (one write)" : "each BE queue's task flag");
    std::fflush(stdout);
    return std::nullopt;
}

const uint32_t queued_sweep[] = {10, 50, 200, 1000};   // kernels of 200 us
const uint32_t length_sweep[] = {10, 100, 200, 1000};  // us, 200 queued

// The number of progress lines: every measurement the options ask for.
unsigned measurement_count(bool quick, bool models) {
    constexpr unsigned policy_runs_full = 12, policy_runs_quick = 2;
    const unsigned latency_runs = quick ? 2 : unsigned(2 * (std::size(queued_sweep) + std::size(length_sweep))) + 4 +
                                                  (models ? 6 : 0);
    return latency_runs + (quick ? policy_runs_quick : policy_runs_full);
}

// Runs one measurement at a time, each with its progress line and CSV row; the tables are the callers'.
struct measurements {
    report::progress& progress;
    const std::string& device_name;
    int samples;
    report::csv_writer* latency_csv;
    report::csv_writer* policies_csv;
    double policy_seconds;  // of each policy run

    lat_result latency(const char* sweep, preempt_mode mode, be_load load, rt_kind rk, uint32_t queued, uint32_t us,
                       uint32_t seed) {
        const char* mode_name = mode == preempt_mode::reset ? "reset" : "wait";
        auto step = progress.begin(std::string("preemption latency, ") + mode_name + ", " + load_name(load) +
                                   " BE load, " + rt_name(rk) + " RT, " + std::to_string(queued) +
                                   " queued BE kernels of " + std::to_string(us) + " us");
        const lat_result r = preemption_latency(mode, load, rk, queued, us, samples, seed);
        char result[96];
        std::snprintf(result, sizeof result, "p99 %.1f us, drain p99 %.1f us", r.p99, r.drain_p99);
        step.result(result);
        if (latency_csv)
            latency_csv->row({device_name, sweep, mode_name, g_use_levels ? "level" : "flags", load_name(load),
                              rt_name(rk), queued, us, g_check_us, samples, r.measured,
                              report::csv_cell::fixed(r.p50, 1), report::csv_cell::fixed(r.p99, 1),
                              report::csv_cell::fixed(r.p999, 1), report::csv_cell::fixed(r.drain_p50, 1),
                              report::csv_cell::fixed(r.drain_p99, 1), report::csv_cell::fixed(r.submit_p50, 1),
                              report::csv_cell::fixed(r.notice_p50, 1), report::csv_cell::fixed(r.launch_p50, 1),
                              report::csv_cell::fixed(r.done_p50, 1), report::csv_cell::fixed(r.clock_error_us, 2)});
        return r;
    }

    load_result load(const char* name, policy pol, restore_mode rm, uint32_t be_n) {
        auto step = progress.begin(std::string("RT latency under BE load, ") + name + " (" + std::to_string(be_n) +
                                   " BE client" + (be_n == 1 ? "" : "s") + ")");
        const load_result r = load_run(pol, rm, be_n, policy_seconds, 7);
        char result[64];
        std::snprintf(result, sizeof result, "RT mean %.1f us", r.rt_mean_us);
        step.result(result);
        if (policies_csv)
            policies_csv->row({device_name, policy_name(pol), rm == restore_mode::exact ? "exact" : "approximate", be_n,
                               policy_seconds, report::csv_cell::fixed(r.rt_mean_us, 1),
                               report::csv_cell::fixed(r.rt_p99_us, 1), report::csv_cell::fixed(r.tasks_per_s, 1),
                               r.rt_done, r.be_done, r.preemptions, r.restores, r.reexecuted});
        return r;
    }
};

// The sweeps over queued BE kernels and over their length (not in --quick).
void print_sweeps(measurements& m) {
    std::printf("\npreemption latency (us, arrival -> first RT block) vs queued BE kernels "
                "(full load, kernels of 200 us)\n");
    std::printf("%8s %12s %12s %12s %12s %12s\n", "queued", "reset_p50", "reset_p99", "reset_p999", "drain_p99",
                "wait_p99");
    std::fflush(stdout);
    for (uint32_t q : queued_sweep) {
        const lat_result r = m.latency("queued", preempt_mode::reset, be_load::full, rt_kind::spin, q, 200, q);
        const lat_result w = m.latency("queued", preempt_mode::wait, be_load::full, rt_kind::spin, q, 200, q);
        std::printf("%8u %12.1f %12.1f %12.1f %12.1f %12.1f\n", q, r.p50, r.p99, r.p999, r.drain_p99, w.p99);
        std::fflush(stdout);
    }
    std::printf("\npreemption latency (us) vs BE kernel length (full load, 200 queued)\n");
    std::printf("%8s %12s %12s %12s %12s %12s\n", "len_us", "reset_p50", "reset_p99", "reset_p999", "drain_p99",
                "wait_p99");
    std::fflush(stdout);
    for (uint32_t us : length_sweep) {
        const lat_result r = m.latency("length", preempt_mode::reset, be_load::full, rt_kind::spin, 200, us, us);
        const lat_result w = m.latency("length", preempt_mode::wait, be_load::full, rt_kind::spin, 200, us, us);
        std::printf("%8u %12.1f %12.1f %12.1f %12.1f %12.1f\n", us, r.p50, r.p99, r.p999, r.drain_p99, w.p99);
        std::fflush(stdout);
    }
}

void print_stage_header() {
    std::printf("%-30s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "stages (us from RT arrival)", "submit", "notice",
                "launch", "first50", "first99", "first999", "drain50", "drain99", "done50");
}

void print_stage_row(const char* what, const lat_result& r) {
    std::printf("%-30s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", what, r.submit_p50,
                r.notice_p50, r.launch_p50, r.p50, r.p99, r.p999, r.drain_p50, r.drain_p99, r.done_p50);
    std::fflush(stdout);
}

// The last line's preemption latencies: full BE load, 200 queued kernels of 200 us.
struct contract_latencies {
    lat_result reset, wait;
};

// The stages table: the contract's configuration, then (not in --quick) the other loads.
contract_latencies print_stages(measurements& m, bool quick, bool models) {
    std::printf("\n");
    print_stage_header();
    const lat_result reset = m.latency("contract", preempt_mode::reset, be_load::full, rt_kind::spin, 200, 200, 1);
    print_stage_row("reset, full BE load", reset);
    const lat_result wait = m.latency("contract", preempt_mode::wait, be_load::full, rt_kind::spin, 200, 200, 1);
    print_stage_row("wait, full BE load", wait);
    if (!quick) {
        print_stage_row("reset, spin BE load",
                        m.latency("loads", preempt_mode::reset, be_load::spin, rt_kind::spin, 200, 200, 2));
        print_stage_row("wait, spin BE load",
                        m.latency("loads", preempt_mode::wait, be_load::spin, rt_kind::spin, 200, 200, 2));
        if (models) {
            print_stage_row("reset, model BE load",
                            m.latency("models", preempt_mode::reset, be_load::model, rt_kind::spin, 0, 0, 3));
            print_stage_row("wait, model BE load",
                            m.latency("models", preempt_mode::wait, be_load::model, rt_kind::spin, 0, 0, 3));
            print_stage_row("reset, model BE, RT kernel 0",
                            m.latency("models", preempt_mode::reset, be_load::model, rt_kind::first_kernel, 0, 0, 4));
            print_stage_row("wait, model BE, RT kernel 0",
                            m.latency("models", preempt_mode::wait, be_load::model, rt_kind::first_kernel, 0, 0, 4));
            print_stage_row("reset, model BE, RT model",
                            m.latency("models", preempt_mode::reset, be_load::model, rt_kind::model, 0, 0, 5));
            print_stage_row("wait, model BE, RT model",
                            m.latency("models", preempt_mode::wait, be_load::model, rt_kind::model, 0, 0, 5));
        }
    }
    std::printf("(notice: -1 where no BE block was caught running; first/drain for model RT tasks: their end)\n");
    return {reset, wait};
}

void print_policy_row(const char* name, const load_result& r) {
    std::printf("%-22s %10.1f %10.1f %10.1f %8llu %8llu %8llu %8llu %8llu\n", name, r.rt_mean_us, r.rt_p99_us,
                r.tasks_per_s, (unsigned long long)r.rt_done, (unsigned long long)r.be_done,
                (unsigned long long)r.preemptions, (unsigned long long)r.restores, (unsigned long long)r.reexecuted);
    std::fflush(stdout);
}

// The last line's policy runs: rt_only and reef, one BE client each.
struct reference_loads {
    load_result rt_only, reef;
};

// The policy table: rt_only and reef with one BE client (both measured before the table's
// header), then (not in --quick) the other policies and four BE clients.
reference_loads print_policies(measurements& m, bool quick) {
    const load_result ref = m.load("rt_only", policy::rt_only, restore_mode::exact, 1);
    const load_result reef1 = m.load("reef", policy::reef, restore_mode::exact, 1);
    std::printf("\n%-22s %10s %10s %10s %8s %8s %8s %8s %8s\n", "policy (BE clients)", "rt_mean", "rt_p99",
                "tasks/s", "rt", "be", "preempt", "restore", "reexec");
    print_policy_row("rt_only (1)", ref);
    print_policy_row("reef (1)", reef1);
    if (!quick) {
        print_policy_row("reef approx (1)", m.load("reef approx", policy::reef, restore_mode::approximate, 1));
        print_policy_row("seq (1)", m.load("seq", policy::seq, restore_mode::exact, 1));
        print_policy_row("streams (1)", m.load("streams", policy::streams, restore_mode::exact, 1));
        print_policy_row("prema (1)", m.load("prema", policy::prema, restore_mode::exact, 1));
        print_policy_row("rt_only (4)", m.load("rt_only", policy::rt_only, restore_mode::exact, 4));
        print_policy_row("reef (4)", m.load("reef", policy::reef, restore_mode::exact, 4));
        print_policy_row("reef approx (4)", m.load("reef approx", policy::reef, restore_mode::approximate, 4));
        print_policy_row("seq (4)", m.load("seq", policy::seq, restore_mode::exact, 4));
        print_policy_row("streams (4)", m.load("streams", policy::streams, restore_mode::exact, 4));
        print_policy_row("prema (4)", m.load("prema", policy::prema, restore_mode::exact, 4));
    }
    return {ref, reef1};
}

}  // namespace

int main(int argc, char** argv) {
    bench_options o;
    if (const std::optional<int> rc = parse_args(argc, argv, o)) return *rc;
    const std::string& device_name = g_backend;
    // Opened before any measurement: an unwritable path fails now, naming the file.
    csv_outputs csv;
    try {
        csv = open_csv_outputs(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "preempt_bench: %s\n", e.what());
        return 1;
    }
    if (const std::optional<int> rc = select_device(device_name, o.quick)) return *rc;

    report::progress progress("preempt_bench", measurement_count(o.quick, !g_model_path.empty()));
    measurements m{progress, device_name, o.samples, csv.latency.get(), csv.policies.get(), o.quick ? 4.0 : 6.0};
    try {
        if (!o.quick) print_sweeps(m);
        const contract_latencies lat = print_stages(m, o.quick, !g_model_path.empty());
        const reference_loads ref = print_policies(m, o.quick);
        if (csv.latency) csv.latency->commit();
        if (csv.policies) csv.policies->commit();
        const double overhead =
            ref.rt_only.rt_mean_us > 0 ? (ref.reef.rt_mean_us / ref.rt_only.rt_mean_us - 1.0) * 100.0 : 0;
        const double tput = ref.rt_only.tasks_per_s > 0 ? ref.reef.tasks_per_s / ref.rt_only.tasks_per_s : 0;
        std::printf("reset_p50_us=%.1f reset_p99_us=%.1f reset_p999_us=%.1f drain_p99_us=%.1f wait_p99_us=%.1f "
                    "rt_overhead_pct=%.1f throughput_vs_rt_only=%.2f\n",
                    lat.reset.p50, lat.reset.p99, lat.reset.p999, lat.reset.drain_p99, lat.wait.p99, overhead, tput);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "preempt_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
