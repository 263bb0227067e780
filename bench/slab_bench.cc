// slab_bench: SLAB vs Clipper's AIMD vs a fixed batch size (ifmanager/batching.h) on the same
// load, serving a real model on the cpu device backend.
//
// A generator thread replays one open-loop arrival schedule (Poisson at --rate, or uniform
// with --uniform; the same seed for every policy) into a queue; the serving loop asks the
// controller whether to launch and how many, assembles the batch input from the requests'
// images, runs infer_batch on the instance configured for that batch size, and tells the
// controller the service time and the worst latency. A request's latency runs from its
// scheduled arrival (open loop: a late generator thread counts against the server, as a slow
// rx path would) to the end of its batch.
//
// Per policy: convergence time (from the start until the target batch size stays within
// +-max(1, 10%) of its final value, the median over the last quarter of the run), the time it
// first reaches that band and the share of batches in it afterwards, throughput within the SLO
// (requests answered within the SLO per second of load), SLO violations, mean batch, latency
// percentiles, and the generator's lateness (host stalls show there first). Rounds run the policies in rotated order so that host noise
// (other builds, steal) falls on all of them alike; the table gives medians and ranges.
//
// The rate comes from calibration (the service time at every batch size, in passes over all
// sizes, each run after a pause as in serving): 60% of what the best batch whose two service
// times fit the SLO with 20% to spare can serve. On the cpu backend batching gains only
// 1.2-1.6x over batch 1, less than a shared host's noise, so a rate that batch 1 cannot keep
// up with but a moderate batch can overloads every policy as soon as other tenants run;
// --rate sets one (the bench says when batch 1 would keep up).
//
// Last line: slab_converge_ms=A aimd_converge_ms=B slab_throughput_vs_aimd=C (medians over the
// rounds; the ratio is the median of the per-round ratios).
//
// --scenario steps (GSLICE Fig. 15's situations): seven phases of --phase-ms at 35% of the best
// batch's capacity; each of phases 1-6 starts with a step: the rate doubles, comes back, the
// SLO is tightened to 0.6x (configure(), as an operator's `set`), restored, a second IF starts
// on the same device (its own instance at batch 4, back to back) and stops; with two or more
// compute units an eighth phase starts with the IF's share halved (its instances bound to the
// lower half of the units, as an operator's `set --share 0.5`). Policies: slab,
// aimd and fixed at 4, 8 and 16, on the same arrivals. Per step: how long until the target
// settles again (convergence() within the phase; SLAB's drain-mode batches left out, and
// counted in a second column; an excursion that returns within --blip-ms, 50 by default, is
// noise answered, not a failure to settle; the `strict` column counts every one); over the scenario: throughput within the SLO (each request held
// to the SLO in force when it arrived) and violations. Last line: slab_reconverge_ms=A (the
// worst step, median over the rounds) slab_goodput_vs_best_fixed=B aimd_reconverge_ms=C.
//
// Every step (calibration, each policy's run) prints a progress line on stderr. --csv FILE: the
// per-round table, one row per round and policy; --csv-series FILE (also --trace): one row per
// batch (time, batch size, service time, worst latency, the controller's target), every round
// or with --series-round R only round R. bench/plot.py batching plots the two.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "preempt/backend_option.h"
#include "bench/bench_report.h"
#include "ifmanager/batching.h"
#include "libml/libml.h"

namespace fs = std::filesystem;
namespace gpu = reefline::gpu;
namespace ml = reefline::ml;
namespace ifm = reefline::ifm;
namespace report = reefline::bench;
using clk = std::chrono::steady_clock;

namespace {

double ms_between(clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

// The model at every batch size, with a pool of distinct input images.
struct served_model {
    ml::runtime& rt;
    std::shared_ptr<ml::model> model;
    std::vector<std::unique_ptr<ml::instance>> by_batch;  // index = batch size
    ml::dtype type = ml::dtype::f32;
    ml::shape_t one_shape;          // the input shape at batch 1
    size_t image_bytes = 0;
    std::vector<ml::bytes_t> images;

    served_model(ml::runtime& r, const fs::path& file, uint32_t max_batch) : rt(r) {
        model = rt.load_model(file.string());
        by_batch.resize(max_batch + 1);
        for (uint32_t b = 1; b <= max_batch; ++b) {
            auto in = rt.link_model(model);
            if (in->batch() != b) rt.configure_batch(*in, b);
            by_batch[b] = std::move(in);
        }
        const auto ins = by_batch[1]->inputs();
        if (ins.size() != 1) throw std::runtime_error("the bench serves models with one input; this one has " + std::to_string(ins.size()));
        type = ins[0].type;
        one_shape = ins[0].shape;
        image_bytes = size_t(ml::element_count(one_shape)) * ml::dtype_size(type);
        std::mt19937 rng(1);
        std::normal_distribution<float> d;
        for (int i = 0; i < 64; ++i) {
            ml::bytes_t img(image_bytes);
            if (type == ml::dtype::f32) {
                auto* f = reinterpret_cast<float*>(img.data());
                for (size_t k = 0; k < image_bytes / 4; ++k) f[k] = d(rng);
            } else {
                for (auto& x : img) x = std::byte(rng() & 0x7f);
            }
            images.push_back(std::move(img));
        }
    }

    // Runs the batch made of these requests' images; returns the service time in ms.
    double run(const std::vector<uint64_t>& ids) {
        const auto t0 = clk::now();
        const uint32_t b = uint32_t(ids.size());
        ml::bytes_t batch(image_bytes * b);
        for (uint32_t i = 0; i < b; ++i)
            std::memcpy(batch.data() + i * image_bytes, images[ids[i] % images.size()].data(), image_bytes);
        ml::shape_t shape = one_shape;
        shape[0] = b;
        std::vector<ml::tensor> in{ml::tensor::make(type, shape, std::move(batch))};
        std::vector<ml::tensor> out;
        rt.infer_batch(*by_batch[b], in, out);
        return ms_between(t0, clk::now());
    }

    // The IF's spatial share: every instance bound to these units (~0: all). False without shares.
    bool set_units(uint64_t units) {
        bool ok = true;
        for (auto& in : by_batch)
            if (in) ok = rt.set_units(*in, units) && ok;
        return ok;
    }

    // A second IF on the same device (the steps scenario): its own instance at batch 4, run
    // back to back while `on` holds.
    void compete(const std::atomic<bool>& on, const std::atomic<bool>& quit) {
        auto in = rt.link_model(model);
        if (in->batch() != 4) rt.configure_batch(*in, 4);
        ml::shape_t shape = one_shape;
        shape[0] = 4;
        std::vector<ml::tensor> x{ml::tensor::make(type, shape, ml::bytes_t(image_bytes * 4))};
        std::vector<ml::tensor> y;
        while (!quit.load()) {
            if (on.load()) rt.infer_batch(*in, x, y);
            else std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
    }

    double median_service(uint32_t b, int reps) {
        std::vector<uint64_t> ids(b);
        for (uint32_t i = 0; i < b; ++i) ids[i] = i;
        std::vector<double> t;
        for (int r = 0; r < reps; ++r) {
            // As served: a batch follows a pause (waiting for requests), in which the device's
            // workers go to sleep and the caches cool; back-to-back runs would hide that.
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            t.push_back(run(ids));
        }
        return median(t);
    }
};

// The steps scenario (--scenario steps, GSLICE Fig. 15's situations): what changes when.
// Arrival-rate steps are in the schedule itself; these are the others.
struct scenario_event {
    double at_ms;
    enum kind_t { slo, competitor_on, competitor_off, share } kind;
    double slo_ms = 0;   // kind slo: the operator's new SLO
    uint64_t units = 0;  // kind share: the IF's new units
};

struct policy_result {
    ifm::batching_policy policy;
    uint32_t fixed_batch = 0;  // fixed: its size
    std::vector<std::pair<double, uint32_t>> trace;  // (ms since the start, target after each batch)
    // The same without the batches after which SLAB was draining a backlog (draining()): the
    // SLO-sized target it returns to once the burst is served.
    std::vector<std::pair<double, uint32_t>> steady_trace;
    double converge_ms = 0;   // until the target stays in the band for good
    double reach_ms = 0;      // until it first enters the band
    double in_band_pct = 0;   // of the batches after reach_ms
    double goodput = 0;       // requests answered within the SLO per second of load
    uint64_t arrivals = 0, answered = 0, late = 0, shed = 0;
    double mean_batch = 0;
    uint32_t final_target = 0;
    double p50 = 0, p99 = 0;
    double generator_lag_p99 = 0;
    double drain_pct = 0;  // slab: share of batches after which it was draining a backlog
    double violation_pct() const { return arrivals ? 100.0 * double(late + shed) / double(arrivals) : 0; }
};

// The time from the start until the target stayed within +-max(1, 10%) of its final value
// (the median over the last quarter of the batches) for the rest of the run; also when it
// first entered that band and how much of the time after it stayed there (one dip late in a
// run, a margin answering a burst of host noise, sets the first figure to the dip's time).
// `blip_ms` > 0: an excursion out of the band that returns within blip_ms (a batch or two
// answering one outlier, as SLAB's margin does on a noisy host, and as happens with no step at
// all) does not restart the settled stretch; one still out at the end counts once it has
// lasted blip_ms. 0: every excursion counts.
void convergence(const std::vector<std::pair<double, uint32_t>>& trace, policy_result& r, double blip_ms = 0) {
    if (trace.empty()) return;
    std::vector<double> tail;
    for (size_t i = trace.size() * 3 / 4; i < trace.size(); ++i) tail.push_back(trace[i].second);
    r.final_target = uint32_t(median(tail));
    const double tol = std::max(1.0, 0.1 * r.final_target);
    const auto in_band = [&](uint32_t target) { return std::abs(double(target) - double(r.final_target)) <= tol; };
    double since = -1, out_since = -1;  // since: start of the settled stretch (-1: none yet)
    r.reach_ms = -1;
    size_t after = 0, in = 0;
    for (const auto& [t, target] : trace) {
        if (!in_band(target)) {
            if (out_since < 0) out_since = t;
            if (blip_ms <= 0) since = -1;
        } else {
            if (since < 0 || (out_since >= 0 && t - out_since >= blip_ms)) since = t;
            out_since = -1;
        }
        if (r.reach_ms < 0 && in_band(target)) r.reach_ms = t;
        if (r.reach_ms >= 0) {
            ++after;
            in += in_band(target);
        }
    }
    if (out_since >= 0 && trace.back().first - out_since >= blip_ms) since = -1;
    // `since` < 0: it never settled (the last value is off its own tail's median).
    r.converge_ms = since < 0 ? trace.back().first : since;
    r.in_band_pct = after ? 100.0 * double(in) / double(after) : 0;
}

struct request {
    uint64_t id;
    clk::time_point arrival;  // scheduled
};

// One per batch for --csv-series: ms since the start, size, service time, worst latency,
// and the controller's state after it (target, its predicted service time, SLAB's margin).
struct batch_record {
    double time_ms;
    uint32_t batch;
    double service_ms, worst_ms;
    uint32_t target;
    double predicted_ms, margin_ms;
};

void write_batch_log(report::csv_writer& series, int round, ifm::batching_policy policy,
                     const std::vector<batch_record>& batch_log) {
    // Rounded to what the host's timing noise leaves meaningful (tens of microseconds),
    // which keeps a round's series small enough to keep beside its plot.
    using report::csv_cell;
    for (const batch_record& b : batch_log)
        series.row({round, ifm::batching_policy_name(policy), csv_cell::fixed(b.time_ms, 2), b.batch,
                    csv_cell::fixed(b.service_ms, 3), csv_cell::fixed(b.worst_ms, 3), b.target,
                    csv_cell::fixed(b.predicted_ms, 3), csv_cell::fixed(b.margin_ms, 3)});
}

// `series`: where each batch goes as a CSV row (null: nowhere).
policy_result run_policy(served_model& sm, ifm::batching_options opts, const std::vector<double>& schedule_ms,
                         double seconds, bool shed, report::csv_writer* series, int round,
                         const std::vector<scenario_event>& events = {}) {
    ifm::batch_controller bc(opts);
    // The SLO a request arriving at `ms` is held to: the last SLO event before it.
    const double first_slo = opts.slo_ms;
    const auto slo_at = [&](double ms) {
        double slo = first_slo;
        for (const auto& e : events)
            if (e.kind == scenario_event::slo && e.at_ms <= ms) slo = e.slo_ms;
        return slo;
    };
    size_t next_event = 0;
    std::atomic<bool> competing{false}, quit_competitor{false};
    std::thread competitor;
    if (std::any_of(events.begin(), events.end(), [](const auto& e) { return e.kind == scenario_event::competitor_on; }))
        competitor = std::thread([&] { sm.compete(competing, quit_competitor); });
    std::mutex mu;
    std::condition_variable cv;
    std::deque<request> queue;
    bool done = false;
    std::vector<double> lag;
    lag.reserve(schedule_ms.size());

    policy_result r;
    r.policy = opts.policy;
    r.arrivals = schedule_ms.size();
    const auto start = clk::now() + std::chrono::milliseconds(20);
    std::thread generator([&] {
        for (size_t i = 0; i < schedule_ms.size(); ++i) {
            const auto at = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double, std::milli>(schedule_ms[i]));
            std::this_thread::sleep_until(at);
            const auto now = clk::now();
            {
                std::lock_guard<std::mutex> g(mu);
                queue.push_back({i, at});
            }
            lag.push_back(ms_between(at, now));
            cv.notify_one();
        }
        std::lock_guard<std::mutex> g(mu);
        done = true;
        cv.notify_one();
    });

    std::vector<std::pair<double, uint32_t>> trace{{0.0, bc.target()}};
    std::vector<batch_record> batch_log;
    if (series) batch_log.reserve(schedule_ms.size());
    std::vector<double> latency;
    latency.reserve(schedule_ms.size());
    uint64_t batches = 0, draining = 0;
    std::vector<uint64_t> ids;
    std::vector<clk::time_point> arrived;
    for (;;) {
        // Scenario events due now: an operator's SLO change reaches the controller as `set`
        // does (configure), a second IF starts or stops.
        for (const double now_ms = ms_between(start, clk::now()); next_event < events.size() && events[next_event].at_ms <= now_ms;
             ++next_event) {
            const scenario_event& e = events[next_event];
            if (e.kind == scenario_event::slo) {
                opts.slo_ms = e.slo_ms;
                bc.configure(opts);
            } else if (e.kind == scenario_event::share) {
                sm.set_units(e.units);  // between batches, as the scheduler binds a task's stream
            } else {
                competing = e.kind == scenario_event::competitor_on;
            }
        }
        {
            std::unique_lock<std::mutex> lk(mu);
            if (queue.empty()) {
                if (done) break;
                cv.wait_for(lk, std::chrono::milliseconds(5));
                continue;
            }
            const auto now = clk::now();
            // Shedding (the IF's option): requests that can no longer make the SLO are
            // answered with a status instead of being served late.
            while (shed && !queue.empty() && bc.batches() > 0 &&
                   ms_between(queue.front().arrival, now) +
                           bc.predict_ms(std::min<uint32_t>(uint32_t(queue.size()), bc.target())) >
                       opts.slo_ms) {
                queue.pop_front();
                ++r.shed;
            }
            if (queue.empty()) continue;
            if (!bc.dispatch_now(uint32_t(queue.size()), ms_between(queue.front().arrival, now))) {
                // Until the next arrival, or a short while (a deadline may pass meanwhile).
                cv.wait_for(lk, std::chrono::microseconds(200));
                continue;
            }
            const uint32_t b = std::min<uint32_t>(uint32_t(queue.size()), bc.target());
            ids.clear();
            arrived.clear();
            for (uint32_t i = 0; i < b; ++i) {
                ids.push_back(queue.front().id);
                arrived.push_back(queue.front().arrival);
                queue.pop_front();
            }
        }
        const double service = sm.run(ids);
        const auto end = clk::now();
        double worst = 0;
        for (const auto& a : arrived) {
            const double l = ms_between(a, end);
            worst = std::max(worst, l);
            latency.push_back(l);
            ++r.answered;
            if (l > (events.empty() ? opts.slo_ms : slo_at(ms_between(start, a)))) ++r.late;
        }
        bc.observe(uint32_t(ids.size()), service, worst);
        ++batches;
        draining += bc.draining();
        trace.emplace_back(ms_between(start, end), bc.target());
        if (!bc.draining()) r.steady_trace.push_back(trace.back());
        // Kept in memory and written after the run: file I/O in this loop would add to the
        // very latencies it records.
        if (series)
            batch_log.push_back({trace.back().first, uint32_t(ids.size()), service, worst, bc.target(),
                                 bc.predict_ms(bc.target()), bc.margin_ms()});
    }
    generator.join();
    if (std::any_of(events.begin(), events.end(), [](const auto& e) { return e.kind == scenario_event::share; }))
        sm.set_units(~uint64_t{0});  // the next run starts with the whole device
    quit_competitor = true;
    if (competitor.joinable()) competitor.join();
    if (series) write_batch_log(*series, round, opts.policy, batch_log);
    convergence(trace, r);
    r.fixed_batch = opts.policy == ifm::batching_policy::fixed ? (opts.fixed_batch ? opts.fixed_batch : opts.max_batch) : 0;
    r.trace = std::move(trace);
    r.goodput = double(r.answered - r.late) / seconds;
    r.mean_batch = batches ? double(r.answered) / double(batches) : 0;
    r.p50 = percentile(latency, 0.5);
    r.p99 = percentile(latency, 0.99);
    r.generator_lag_p99 = percentile(lag, 0.99);
    r.drain_pct = batches ? 100.0 * double(draining) / double(batches) : 0;
    return r;
}

std::string run_cmd(const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run: " + cmd);
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    if (pclose(p) != 0) throw std::runtime_error("failed: " + cmd + "\n" + out);
    return out;
}

// --scenario steps: seven phases of `phase_ms` (eight with a share step); each but the first
// starts with a step:
const char* const step_names[] = {"", "rate x2", "rate back", "SLO x0.6", "SLO back", "2nd IF on", "2nd IF off",
                                  "share x0.5"};

// How long after step k (phase k's start) the target settled: the convergence of the trace
// within the phase, measured from its start.
double reconverge_ms(const std::vector<std::pair<double, uint32_t>>& trace, int k, double phase_ms, double blip_ms) {
    const double from = k * phase_ms, to = (k + 1) * phase_ms;
    std::vector<std::pair<double, uint32_t>> slice;
    uint32_t before = trace.empty() ? 1 : trace.front().second;
    for (const auto& [t, target] : trace) {
        if (t < from) before = target;
        else if (t < to) slice.emplace_back(t - from, target);
    }
    slice.insert(slice.begin(), {0.0, before});
    policy_result r;
    convergence(slice, r, blip_ms);
    return r.converge_ms;
}

void run_steps(served_model& sm, uint32_t units, double rate, double slo_ms, uint32_t max_batch, double phase_ms,
               double blip_ms, int rounds, bool shed, report::csv_writer* csv, report::csv_writer* series,
               report::progress& progress) {
    const int phases = units >= 2 ? 8 : 7;
    // Arrivals: Poisson at `rate`, twice that in phase 1; one schedule for every policy.
    std::vector<double> schedule;
    std::mt19937_64 rng(2025);
    for (int k = 0; k < phases; ++k) {
        std::exponential_distribution<double> gap((k == 1 ? 2 * rate : rate) / 1000.0);
        for (double t = k * phase_ms + gap(rng); t < (k + 1) * phase_ms; t += gap(rng)) schedule.push_back(t);
    }
    std::vector<scenario_event> events = {{3 * phase_ms, scenario_event::slo, 0.6 * slo_ms},
                                                {4 * phase_ms, scenario_event::slo, slo_ms},
                                                {5 * phase_ms, scenario_event::competitor_on},
                                                {6 * phase_ms, scenario_event::competitor_off}};
    if (phases == 8) {
        scenario_event half{7 * phase_ms, scenario_event::share};
        half.units = gpu::every_unit_set(units) >> (gpu::unit_set_bits(units) - gpu::unit_set_bits(units) / 2);
        events.push_back(half);
    }
    // SLAB, AIMD and fixed at several sizes (each starts from a fresh controller).
    std::vector<ifm::batching_options> policies;
    for (const auto p : {ifm::batching_policy::slab, ifm::batching_policy::aimd}) {
        ifm::batching_options o;
        o.policy = p;
        policies.push_back(o);
    }
    for (const uint32_t b : {4u, 8u, 16u})
        if (b <= max_batch) {
            ifm::batching_options o;
            o.policy = ifm::batching_policy::fixed;
            o.fixed_batch = b;
            policies.push_back(o);
        }
    for (auto& o : policies) {
        o.slo_ms = slo_ms;
        o.max_batch = max_batch;
    }
    const double seconds = phases * phase_ms / 1000.0;
    std::printf("steps scenario: %d phases of %.0f ms; rate %.0f req/s Poisson (x2 in phase 1), SLO %.1f ms (x0.6 in "
                "phase 3), a second IF running batch 4 back to back in phase 5%s\n",
                phases, phase_ms, rate, slo_ms,
                phases == 8 ? ", the IF's share halved in phase 7"
                            : " (no share step: one compute unit; --compute-units 2 or more adds it)");
    std::printf("\nre-convergence after each step (ms): until the SLO-sized target stays within +-max(1, 10%%) of where "
                "it settles in that phase, excursions that return within %.0f ms aside (batches SLAB ran to drain a "
                "backlog left out; max+drain counts them; strict: the worst step when every excursion counts), and "
                "throughput within the SLO over the whole scenario\n", blip_ms);
    std::printf("%-6s %-9s", "round", "policy");
    for (int k = 1; k < phases; ++k) std::printf(" %10s", step_names[k]);
    std::printf(" %8s %9s %8s %9s %7s %6s\n", "max", "max+drain", "strict", "within/s", "viol%", "meanb");
    const auto name_of = [](const policy_result& r) {
        return r.fixed_batch ? "fixed " + std::to_string(r.fixed_batch) : std::string(ifm::batching_policy_name(r.policy));
    };
    std::vector<std::vector<double>> worst(policies.size()), good(policies.size());
    std::vector<double> slab_vs_fixed;
    for (int round = 0; round < rounds; ++round) {
        std::vector<double> round_good(policies.size());
        for (size_t j = 0; j < policies.size(); ++j) {
            const size_t p = (size_t(round) + j) % policies.size();
            std::fflush(stdout);
            auto step = progress.begin("round " + std::to_string(round + 1) + "/" + std::to_string(rounds) + ", steps, " +
                                       (policies[p].policy == ifm::batching_policy::fixed
                                            ? "fixed " + std::to_string(policies[p].fixed_batch)
                                            : std::string(ifm::batching_policy_name(policies[p].policy))));
            const policy_result r = run_policy(sm, policies[p], schedule, seconds, shed, series, round + 1, events);
            double w = 0, w_all = 0, w_strict = 0;
            std::printf("%-6d %-9s", round + 1, name_of(r).c_str());
            for (int k = 1; k < phases; ++k) {
                const double ms = r.fixed_batch ? 0.0 : reconverge_ms(r.steady_trace, k, phase_ms, blip_ms);
                const double all = r.fixed_batch ? 0.0 : reconverge_ms(r.trace, k, phase_ms, blip_ms);
                const double strict = r.fixed_batch ? 0.0 : reconverge_ms(r.steady_trace, k, phase_ms, 0);
                w = std::max(w, ms);
                w_all = std::max(w_all, all);
                w_strict = std::max(w_strict, strict);
                std::printf(" %10.0f", ms);
                if (csv)
                    csv->row({round + 1, ifm::batching_policy_name(r.policy), r.fixed_batch, step_names[k],
                              report::csv_cell::fixed(k * phase_ms, 0), report::csv_cell::fixed(ms, 1),
                              report::csv_cell::fixed(all, 1), report::csv_cell::fixed(strict, 1),
                              report::csv_cell::fixed(r.goodput, 1),
                              report::csv_cell::fixed(r.violation_pct(), 2), report::csv_cell::fixed(r.mean_batch, 2)});
            }
            std::printf(" %8.0f %9.0f %8.0f %9.1f %7.2f %6.2f\n", w, w_all, w_strict, r.goodput, r.violation_pct(),
                        r.mean_batch);
            std::fflush(stdout);
            char result[96];
            std::snprintf(result, sizeof result, "worst re-convergence %.0f ms, %.1f within SLO req/s", w, r.goodput);
            step.result(result);
            worst[p].push_back(w);
            good[p].push_back(r.goodput);
            round_good[p] = r.goodput;
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        double best_fixed = 0;
        for (size_t p = 2; p < policies.size(); ++p) best_fixed = std::max(best_fixed, round_good[p]);
        slab_vs_fixed.push_back(best_fixed > 0 ? round_good[0] / best_fixed : 0);
    }
    std::printf("\nover %d round(s), medians: worst re-convergence ms / within SLO req/s\n", rounds);
    for (size_t p = 0; p < policies.size(); ++p)
        std::printf("  %-9s %8.0f %9.1f\n",
                    policies[p].policy == ifm::batching_policy::fixed ? ("fixed " + std::to_string(policies[p].fixed_batch)).c_str()
                                                                     : ifm::batching_policy_name(policies[p].policy),
                    median(worst[p]), median(good[p]));
    std::printf("slab_reconverge_ms=%.0f slab_goodput_vs_best_fixed=%.3f aimd_reconverge_ms=%.0f\n", median(worst[0]),
                median(slab_vs_fixed), median(worst[1]));
}

// The command line (see add_options for what each means).
struct bench_options {
    std::string model, trace_path, csv_path;
    int series_round = 0;
    double seconds = 4, slo_ms = 25, rate = 0;
    uint32_t max_batch = 16, fixed_batch = 0, units = 0;
    int rounds = 3;
    bool quick = false, uniform = false, shed = false, calibrate_only = false;
    std::string scenario = "constant";
    double blip_ms = 50;
    double phase_ms = 2000;
    std::string backend = "cpu";

    bool steps() const { return scenario == "steps"; }
};

void add_options(CLI::App& app, bench_options& o) {
    app.add_option("--model", o.model,
                   "ONNX model with one image input (default: the zoo's resnet50_tiny, written to a temp dir)");
    app.add_option("--seconds", o.seconds, "seconds of load per policy and round")->capture_default_str();
    app.add_option("--slo-ms", o.slo_ms, "per-request latency objective")->capture_default_str();
    app.add_option("--rate", o.rate,
                   "arrivals per second (default: from calibration, 60% of what the best batch within the SLO can "
                   "serve)");
    app.add_option("--max-batch", o.max_batch, "largest batch (instances are configured for 1..max)")
        ->capture_default_str();
    app.add_option("--fixed-batch", o.fixed_batch, "the fixed policy's batch size (default: max-batch)");
    app.add_option("--rounds", o.rounds, "rounds; each runs every policy once, in rotated order")
        ->capture_default_str();
    app.add_option("--compute-units", o.units, "cpu device compute units (default: cores - 1, at least 1)");
    app.add_flag("--uniform", o.uniform, "evenly spaced arrivals instead of Poisson");
    app.add_flag("--shed", o.shed,
                 "answer requests that can no longer make the SLO with a status instead of serving them late");
    app.add_flag("--quick", o.quick, "one short round (1.5 s per policy)");
    app.add_flag("--calibrate", o.calibrate_only, "print the service times per batch size and exit");
    app.add_option("--scenario", o.scenario,
                   "constant: one Poisson load; steps: the rate doubles and halves, the SLO is tightened and "
                   "restored, a second IF starts and stops (one phase each)")
        ->check(CLI::IsMember({"constant", "steps"}))
        ->capture_default_str();
    app.add_option("--phase-ms", o.phase_ms, "steps: the length of each phase")->capture_default_str();
    app.add_option("--blip-ms", o.blip_ms,
                   "steps: an excursion of the target out of its band that returns within this long does not "
                   "count against re-convergence (0: every excursion counts)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--csv", o.csv_path, "write the per-round table as CSV: one row per round and policy");
    app.add_option("--csv-series,--trace", o.trace_path,
                   "write every batch as CSV: round, policy, time_ms, batch_size, service_ms, worst_latency_ms, "
                   "target_batch, predicted_ms, margin_ms");
    app.add_option("--series-round", o.series_round, "--csv-series: only this round (default: every round)")
        ->check(CLI::NonNegativeNumber);
    app.footer("Progress (one line per step) goes to stderr; stdout has the tables and the last line.");
    reefline::gpu::add_backend_option(app, o.backend);
}

// False (after saying why on stderr) when the options do not make a run.
bool options_valid(const bench_options& o) {
    if (o.steps() && !(o.phase_ms >= 200)) {
        std::fprintf(stderr, "slab_bench: --phase-ms must be at least 200\n");
        return false;
    }
    if (o.max_batch < 2 || o.max_batch > 256 || o.rounds < 1 || o.seconds <= 0 || o.fixed_batch > o.max_batch ||
        !(o.slo_ms > 0)) {
        std::fprintf(stderr, "slab_bench: need 2 <= --max-batch <= 256, --rounds >= 1, --seconds > 0, --slo-ms > 0, "
                             "--fixed-batch <= --max-batch\n");
        return false;
    }
    if (o.series_round > o.rounds) {
        std::fprintf(stderr, "slab_bench: --series-round %d, but only %d round(s) run\n", o.series_round, o.rounds);
        return false;
    }
    return true;
}

// --csv (the per-round table; its columns depend on the scenario) and --csv-series; null where not asked for.
struct csv_outputs {
    std::unique_ptr<report::csv_writer> table, series;

    void commit() {
        if (series) series->commit();
        if (table) table->commit();
    }
};

csv_outputs open_csv_outputs(const bench_options& o) {
    csv_outputs out;
    if (!o.csv_path.empty() && !o.calibrate_only && o.steps())
        out.table = std::make_unique<report::csv_writer>(
            o.csv_path, std::vector<std::string>{"round", "policy", "fixed_batch", "step", "step_at_ms",
                                                 "reconverge_ms", "reconverge_with_drain_ms", "reconverge_strict_ms",
                                                 "within_slo_req_s", "violation_pct", "mean_batch"});
    else if (!o.csv_path.empty() && !o.calibrate_only)
        out.table = std::make_unique<report::csv_writer>(
            o.csv_path, std::vector<std::string>{"round", "policy", "order_in_round", "rate_req_s", "slo_ms",
                                                 "seconds", "converge_ms", "reach_ms", "in_band_pct",
                                                 "within_slo_req_s", "arrivals", "answered", "late", "shed",
                                                 "violation_pct", "mean_batch", "final_target", "drain_pct", "p50_ms",
                                                 "p99_ms", "generator_lag_p99_ms"});
    if (!o.trace_path.empty() && !o.calibrate_only)
        out.series = std::make_unique<report::csv_writer>(
            o.trace_path, std::vector<std::string>{"round", "policy", "time_ms", "batch_size", "service_ms",
                                                   "worst_latency_ms", "target_batch", "predicted_ms", "margin_ms"});
    return out;
}

// The zoo's resnet50_tiny, written to a fresh temp dir (`work`, set before it is created so that the
// caller removes it whatever happens); returns the model's path.
std::string write_zoo_model(report::progress& progress, fs::path& work) {
    // The zoo binary of the same build: <build>/bench/slab_bench -> <build>/tools/zoo.
    const char* env = std::getenv("REEFLINE_ZOO");
    const fs::path zoo =
        env ? fs::path(env) : fs::canonical("/proc/self/exe").parent_path().parent_path() / "tools" / "zoo";
    if (!fs::exists(zoo))
        throw std::runtime_error("no zoo binary at " + zoo.string() + " (build tools/zoo, or pass --model)");
    auto step = progress.begin("resnet50_tiny written by the zoo");
    work = fs::temp_directory_path() / ("slab_bench." + std::to_string(getpid()));
    fs::create_directories(work);
    run_cmd(zoo.string() + " --out " + work.string() + " --tiny --only resnet50_tiny -q");
    return (work / "resnet50_tiny.onnx").string();
}

// What calibration found: requests per second at batch 1 and at the best batch within the SLO.
struct capacity {
    double batch1 = 0, best = 0;
};

// Calibration: the median service time at every size. On the cpu backend batching
// pays only up to a point (per-request time falls, then rises once a batch's working
// set leaves the caches), so the defaults come from the measured curve, not a line.
// Passes go over all sizes in turn, so that a burst of host load hits them alike.
capacity calibrate(served_model& sm, uint32_t max_batch, double slo_ms, report::progress& progress) {
    auto calibration = progress.begin("calibration, 9 passes over batch 1.." + std::to_string(max_batch));
    std::vector<std::vector<double>> runs(max_batch + 1);
    for (uint32_t b = 1; b <= max_batch; ++b) sm.median_service(b, 1);  // warm-up
    for (int pass = 0; pass < 9; ++pass)
        for (uint32_t b = 1; b <= max_batch; ++b) runs[b].push_back(sm.median_service(b, 1));
    calibration.end();
    std::vector<double> t(max_batch + 1, 0.0);
    std::printf("calibration, median of 9 passes (ms):");
    for (uint32_t b = 1; b <= max_batch; ++b) {
        t[b] = median(runs[b]);
        std::printf("%s t(%u)=%.2f", (b - 1) % 8 ? "" : "\n ", b, t[b]);
    }
    // The best throughput among the sizes whose two service times fit the SLO with 20% to
    // spare (how SLAB sizes batches).
    uint32_t b_best = 1;
    for (uint32_t b = 2; b <= max_batch; ++b)
        if (2 * t[b] <= 0.8 * slo_ms && b / t[b] > b_best / t[b_best]) b_best = b;
    const double cap1 = 1000.0 / t[1], cap_best = 1000.0 * b_best / t[b_best];
    std::printf("\n  batch 1 serves %.0f req/s; batch %u, the best within the SLO, %.0f req/s (%.2fx); "
                "batch %u %.0f req/s\n",
                cap1, b_best, cap_best, cap_best / cap1, max_batch, 1000.0 * max_batch / t[max_batch]);
    return {cap1, cap_best};
}

// The constant scenario's arrivals: one schedule for every policy and round.
std::vector<double> constant_schedule(double rate, double seconds, bool uniform) {
    std::vector<double> schedule;
    std::mt19937_64 rng(2024);
    std::exponential_distribution<double> gap(rate / 1000.0);
    for (double t = uniform ? 0 : gap(rng); t < seconds * 1000.0; t += uniform ? 1000.0 / rate : gap(rng))
        schedule.push_back(t);
    return schedule;
}

// The constant scenario's policies, in the order of the summary table and of round 1.
constexpr ifm::batching_policy constant_policies[3] = {ifm::batching_policy::slab, ifm::batching_policy::aimd,
                                                        ifm::batching_policy::fixed};

// One policy's run in the constant scenario: a progress line, a CSV row and a row of the per-round table.
policy_result run_constant_policy(served_model& sm, const bench_options& o, ifm::batching_policy policy,
                                  const std::vector<double>& schedule, int round, int order_in_round,
                                  csv_outputs& out, report::progress& progress) {
    ifm::batching_options opts;
    opts.policy = policy;
    opts.slo_ms = o.slo_ms;
    opts.max_batch = o.max_batch;
    opts.fixed_batch = o.fixed_batch;
    std::fflush(stdout);
    auto step = progress.begin("round " + std::to_string(round + 1) + "/" + std::to_string(o.rounds) + ", " +
                               ifm::batching_policy_name(opts.policy) + ", " + std::to_string(int(o.rate)) +
                               " req/s for " + report::csv_cell(o.seconds).text() + " s");
    const bool record = out.series && (o.series_round == 0 || o.series_round == round + 1);
    const policy_result r =
        run_policy(sm, opts, schedule, o.seconds, o.shed, record ? out.series.get() : nullptr, round + 1);
    char result[96];
    std::snprintf(result, sizeof result, "mean batch %.2f, %.1f within SLO req/s", r.mean_batch, r.goodput);
    step.result(result);
    step.end();
    if (out.table) {
        using report::csv_cell;
        out.table->row({round + 1, ifm::batching_policy_name(r.policy), order_in_round, csv_cell::fixed(o.rate, 1),
                        o.slo_ms, o.seconds, csv_cell::fixed(r.converge_ms, 1), csv_cell::fixed(r.reach_ms, 1),
                        csv_cell::fixed(r.in_band_pct, 1), csv_cell::fixed(r.goodput, 1), r.arrivals, r.answered,
                        r.late, r.shed, csv_cell::fixed(r.violation_pct(), 2), csv_cell::fixed(r.mean_batch, 2),
                        r.final_target, csv_cell::fixed(r.drain_pct, 1), csv_cell::fixed(r.p50, 2),
                        csv_cell::fixed(r.p99, 2), csv_cell::fixed(r.generator_lag_p99, 2)});
    }
    std::printf("%-6d %5s %7.0fms %6.0fms %6.1f %9.1f %7llu %7llu %7.2f %6.2f %6u %7.1f %7.1f %7.1f %7.1f\n",
                round + 1, ifm::batching_policy_name(r.policy), r.converge_ms, r.reach_ms, r.in_band_pct,
                r.goodput, static_cast<unsigned long long>(r.late), static_cast<unsigned long long>(r.shed),
                r.violation_pct(), r.mean_batch, r.final_target, r.drain_pct, r.p50, r.p99,
                r.generator_lag_p99);
    std::fflush(stdout);
    return r;
}

// "median [min .. max]" of `v`, each number printed by `format`'s conversions.
std::string median_range(const std::vector<double>& v, const char* format) {
    char buf[96];
    std::snprintf(buf, sizeof buf, format, median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(buf);
}

using constant_results = std::array<std::vector<policy_result>, 3>;  // by constant_policies' index

// The table over the rounds; returns each policy's median convergence time.
std::array<double, 3> print_constant_summary(const constant_results& results, int rounds) {
    std::printf("\nover %d round(s): median [min .. max]\n", rounds);
    std::printf("%-6s %22s %18s %26s %22s %20s\n", "policy", "converge ms", "reach ms", "within SLO req/s",
                "violations %", "mean batch");
    std::array<double, 3> conv_med{};
    for (int p = 0; p < 3; ++p) {
        std::vector<double> cv_, rc, gp, vp, mb;
        for (const auto& r : results[p]) {
            cv_.push_back(r.converge_ms);
            rc.push_back(r.reach_ms);
            gp.push_back(r.goodput);
            vp.push_back(r.violation_pct());
            mb.push_back(r.mean_batch);
        }
        conv_med[p] = median(cv_);
        std::printf("%-6s %22s %18s %26s %22s %20s\n", ifm::batching_policy_name(constant_policies[p]),
                    median_range(cv_, "%.0f [%.0f .. %.0f]").c_str(), median_range(rc, "%.0f [%.0f .. %.0f]").c_str(),
                    median_range(gp, "%.1f [%.1f .. %.1f]").c_str(), median_range(vp, "%.2f [%.2f .. %.2f]").c_str(),
                    median_range(mb, "%.2f [%.2f .. %.2f]").c_str());
    }
    return conv_med;
}

// The constant scenario's last line: median convergence times and the median per-round throughput ratio.
struct constant_summary {
    double slab_converge_ms, aimd_converge_ms, slab_vs_aimd;
};

// The constant scenario: every policy on the same arrivals, `o.rounds` times in rotated order
// (host noise falls on all of them alike); prints the per-round table and the summary table.
constant_summary run_constant(served_model& sm, const bench_options& o, csv_outputs& out, report::progress& progress) {
    const std::vector<double> schedule = constant_schedule(o.rate, o.seconds, o.uniform);
    constant_results results;
    std::vector<double> ratios;
    std::printf("\n%-6s %5s %9s %8s %6s %9s %7s %7s %7s %6s %6s %7s %7s %7s %7s\n", "round", "policy", "converge",
                "reach", "band%", "within/s", "late", "shed", "viol%", "meanb", "final", "drain%", "p50ms", "p99ms",
                "lag99");
    for (int round = 0; round < o.rounds; ++round) {
        double good[3] = {0, 0, 0};
        for (int k = 0; k < 3; ++k) {
            const int p = (round + k) % 3;
            const policy_result r =
                run_constant_policy(sm, o, constant_policies[p], schedule, round, k + 1, out, progress);
            good[p] = r.goodput;
            results[p].push_back(r);
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        ratios.push_back(good[1] > 0 ? good[0] / good[1] : 0);
    }
    const std::array<double, 3> conv_med = print_constant_summary(results, o.rounds);
    return {conv_med[0], conv_med[1], median(ratios)};
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"slab_bench: SLAB vs AIMD vs fixed batching on the same load, real model, cpu backend"};
    bench_options o;
    add_options(app, o);
    CLI11_PARSE(app, argc, argv);
    if (o.quick) {
        o.rounds = 1;
        o.seconds = std::min(o.seconds, 1.5);
        o.phase_ms = std::min(o.phase_ms, 1000.0);
    }
    if (!options_valid(o)) return 2;
    const bool steps = o.steps();
    fs::path work;
    // Steps: the model (unless given), the instances, calibration, then every policy of every round.
    report::progress progress("slab_bench", (o.model.empty() ? 1u : 0u) + 2u +
                                                (o.calibrate_only ? 0u : unsigned((steps ? 5 : 3) * o.rounds)));
    try {
        // Opened before minutes of measuring: an unwritable path fails now, naming the file.
        csv_outputs out = open_csv_outputs(o);
        if (o.model.empty()) o.model = write_zoo_model(progress, work);
        reefline::gpu::backend_options dopt;
        dopt.compute_units = o.units;
        auto device = reefline::gpu::make_backend(o.backend, dopt);
        ml::runtime rt(*device);
        std::printf("model %s, batch sizes 1..%u, cpu device with %u compute unit(s), %u hardware threads\n",
                    fs::path(o.model).filename().c_str(), o.max_batch, device->caps().compute_units,
                    std::thread::hardware_concurrency());
        std::fflush(stdout);
        auto instances = progress.begin("instances for batch 1.." + std::to_string(o.max_batch));
        served_model sm(rt, o.model, o.max_batch);
        instances.end();

        const capacity cap = calibrate(sm, o.max_batch, o.slo_ms, progress);
        if (o.calibrate_only) {
            if (!work.empty()) fs::remove_all(work);
            return 0;
        }
        if (steps) {
            // Half of what the constant scenario offers, so that the doubled rate is the
            // constant scenario's load and a tightened SLO or a second IF still leaves room.
            if (o.rate <= 0) o.rate = std::round(0.35 * cap.best);
            run_steps(sm, device->caps().compute_units, o.rate, o.slo_ms, o.max_batch, o.phase_ms, o.blip_ms, o.rounds,
                      o.shed, out.table.get(), out.series.get(), progress);
            out.commit();
            if (!work.empty()) fs::remove_all(work);
            return 0;
        }
        // 60% of what the best batch can serve. The band where batch 1 cannot keep up and a
        // moderate batch can (cap1 .. cap_best) is 1.2-1.6x wide on the cpu backend, narrower
        // than what other tenants of a shared host take away during a run; a rate inside it
        // overloads every policy alike and measures only the host. --rate sets it.
        if (o.rate <= 0) o.rate = std::round(0.6 * cap.best);
        std::printf("SLO %.1f ms, rate %.0f req/s %s, %.1f s per policy, %d round(s)%s\n", o.slo_ms, o.rate,
                    o.uniform ? "uniform" : "Poisson", o.seconds, o.rounds, o.shed ? ", shedding late requests" : "");
        if (o.rate <= cap.batch1) std::printf("note: batch 1 keeps up with this rate; batching matters little here\n");
        if (o.rate >= cap.best) std::printf("note: no batch size keeps up with this rate: an overload run\n");

        const constant_summary summary = run_constant(sm, o, out, progress);
        out.commit();
        if (!work.empty()) fs::remove_all(work);
        std::printf("slab_converge_ms=%.0f aimd_converge_ms=%.0f slab_throughput_vs_aimd=%.3f\n",
                    summary.slab_converge_ms, summary.aimd_converge_ms, summary.slab_vs_aimd);
    } catch (const std::exception& e) {
        if (!work.empty()) fs::remove_all(work);
        std::fprintf(stderr, "slab_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
