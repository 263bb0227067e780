// Spatial shares on the cuda/hip backend (device_ops::stream_set_units), against the contract
// the cpu device keeps (tests/cpu_device_test.cc, StreamsBoundToUnitsRunOnlyThere):
// - a bound stream's launches run their blocks only on its units (the spin kernel records the
//   unit of every block), and streams bound to disjoint sets run side by side;
// - a stream's units change between launches without breaking their order (a chain of GEMMs,
//   each reading the one before, stays bit-identical to an unbound run), its counters, its
//   queue or the events recorded on it;
// - a preempted bound launch stops, and the task restores exactly, also under the scheduler
//   with RT tasks arriving while a bound BE task runs;
// - a set of every unit (or none of the device's) is unbound; a stream keeps at most 8
//   vendor streams for unit sets; a padded launch on a bound stream is a plain one.
// Units are exact on HIP (CU masks) and under the SIMT emulation, which gets 4 units here
// (REEFLINE_EMU_UNITS); on CUDA green contexts bind a stream to a number of SMs, not to the
// SMs of the mask, so the placement checks there are only that fewer SMs ran its blocks. On a
// device of more than 64 units (an H100's 132 SMs) a set's bit names a group of units
// (gpu::unit_group): the tests build their sets of those bits.
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "libml/kernels/gpu/launcher.h"
#include "preempt/scheduler.h"
#include "tests/gpu/gpu_util.h"

using namespace gpu_test;
using clk = std::chrono::steady_clock;

namespace {

// The backend binds streams to the very units of a mask (else: to a number of SMs).
bool exact_units() { return emulated() || std::string(gpu::gpu_backend_name()) == "hip"; }


// The bits of a unit set of the device, and the units one bit names.
uint32_t units_of(const gpu::device& d) { return gpu::unit_set_bits(d.caps().compute_units); }
uint32_t group_of(const gpu::device& d) { return gpu::unit_group(d.caps().compute_units); }
// A grid of `per_unit` blocks for each of the device's units.
uint32_t grid_of(const gpu::device& d, uint32_t per_unit) { return d.caps().compute_units * per_unit; }
uint64_t every_unit(uint32_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }
// Units [from, to) as a set.
uint64_t unit_range(uint32_t from, uint32_t to) { return every_unit(to) & ~every_unit(from); }

gpu::gpu_device_stats stats(const gpu::device& d) {
    gpu::gpu_device_stats s{};
    REQUIRE(gpu::gpu_device_stats_of(d, s));
    return s;
}

void needs_units(const gpu::device& d, uint32_t n) {
    REQUIRE(d.has_unit_sets());
    if (units_of(d) < n) SKIP_TEST("needs " + std::to_string(n) + " compute units (REEFLINE_EMU_UNITS)");
}

void set_units(gpu::device& d, gpu::stream* s, uint64_t units) { d.stream_set_units(s, units); }

// Whether a launch bound to `units` ran where the backend puts it: exactly there on exact
// backends; on fewer SMs than the device has on CUDA, unless the device ran it unbound (no green
// contexts: counted as a fallback).
void expect_placed(const gpu::device& d, const spin_kernel& k, uint64_t units, const char* what,
                   const gpu::gpu_device_stats& before) {
    const uint32_t group = group_of(d);
    if (exact_units()) {
        EXPECT(k.outside(units, group) == 0u) << k.outside(units, group) << " blocks of " << what
                                              << " ran outside units 0x" << std::hex << units << " (on 0x"
                                              << k.used(group) << ")";
        return;
    }
    if (stats(d).units_fallbacks > before.units_fallbacks) {
        std::printf("  %s ran unbound: the device has no green contexts\n", what);
        return;
    }
    const uint32_t sms = k.units_used();
    std::printf("  %s (a set of %d units of %u SMs) ran on %u SMs\n", what, std::popcount(units) * int(group),
                d.caps().compute_units, sms);
    EXPECT(sms < d.caps().compute_units) << what << " ran on every SM";
}

GPU_TEST(a_bound_stream_runs_its_blocks_only_on_its_units) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    const uint32_t n = units_of(d);
    const uint64_t mask = n >= 4 ? 0b0110 : 0b10;  // units 1 and 2 (unit 1 on two units)
    gpu_runner r(d, d.caps().lowest_priority);
    const auto before = stats(d);
    set_units(d, r.s, mask);
    const uint32_t grid = grid_of(d, 4);
    std::vector<std::unique_ptr<spin_kernel>> ks;
    for (uint32_t i = 0; i < 3; ++i) {
        ks.push_back(std::make_unique<spin_kernel>(d, grid, 2000));
        d.launch(r.s, ks.back()->at(r.w, i));
    }
    d.synchronize(r.s);
    EXPECT(r.w->completed.load() == 3u) << "counter " << r.w->completed.load();
    EXPECT(d.queued(r.s) == 0u);
    for (const auto& k : ks) {
        EXPECT(k->finished() == grid) << k->finished() << " of " << grid << " blocks ran to their end";
        expect_placed(d, *k, mask, "a bound launch", before);
    }
    std::printf("  units used: 0x%llx (bound to 0x%llx of %u)\n", (unsigned long long)ks[0]->used(group_of(d)),
                (unsigned long long)mask, n);
    const auto after = stats(d);
    EXPECT(after.units_binds == before.units_binds + 1);
    if (after.units_fallbacks == before.units_fallbacks) {
        EXPECT(after.unit_streams_made == before.unit_streams_made + 1);
        EXPECT(after.unit_switches == before.unit_switches + 1);
    }
}

GPU_TEST(streams_bound_to_disjoint_units_run_side_by_side) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    const uint32_t n = units_of(d);
    const uint64_t lo = unit_range(0, n / 2), hi = unit_range(n / 2, n);
    gpu_runner a(d, d.caps().lowest_priority), b(d, d.caps().lowest_priority);
    const auto before = stats(d);
    set_units(d, a.s, lo);
    set_units(d, b.s, hi);
    // A long block on a's units; b's launch must run beside it, not after it.
    spin_kernel longk(d, 1, 30e6), shortk(d, uint32_t(std::popcount(hi)) * group_of(d) * 2, 1000);
    d.launch(a.s, longk.at(a.w, 0));
    REQUIRE(eventually([&] { return longk.started() == 1u; }, 10000)) << "the long block never started";
    const auto t0 = clk::now();
    d.launch(b.s, shortk.at(b.w, 0));
    d.synchronize(b.s);
    const double ms = ms_since(t0);
    std::printf("  stream b (units 0x%llx) ran %u blocks in %.1f ms beside a's block (units 0x%llx)\n",
                (unsigned long long)hi, shortk.grid, ms, (unsigned long long)lo);
    EXPECT(longk.finished() == 0u) << "b's launch waited for a's";
    EXPECT(b.w->completed.load() == 1u);
    EXPECT(shortk.finished() == shortk.grid);
    expect_placed(d, longk, lo, "stream a's launch", before);
    expect_placed(d, shortk, hi, "stream b's launch", before);
    // The long block stops on its flag; its task restores on the same bound stream.
    d.set_task_flag(a.w, 1);
    d.synchronize(a.s);
    EXPECT(a.w->completed.load() == 0u) << "a preempted bound launch advanced its counter";
    EXPECT(longk.finished() == 0u);
    d.set_task_flag(a.w, 0);
    spin_kernel again(d, grid_of(d, 2), 500);
    d.launch(a.s, again.at(a.w, 0));
    d.synchronize(a.s);
    EXPECT(a.w->completed.load() == 1u) << "the restored launch did not complete";
    EXPECT(again.finished() == again.grid);
    expect_placed(d, again, lo, "the restored launch", before);
}

GPU_TEST(units_changed_between_launches_keep_their_order_results_counters_and_events) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    const uint32_t n = units_of(d);
    const auto& ops = d.ops();
    // Each GEMM reads the previous one's output: out of order, the chain's result differs.
    gemm_chain chain(d, 12, emulated() ? 128 : 1024, 21, 128);
    const auto run = [&](gpu_runner& r, const std::vector<uint64_t>& masks) {
        for (uint32_t i = 0; i < chain.args.size(); ++i) {
            if (!masks.empty()) set_units(d, r.s, masks[i % masks.size()]);
            const k::gemm_args& g = chain.args[i];
            const uint32_t grid = uint32_t(k::gemm_grid(g));
            d.launch(r.s, gpu::launch{&gemm_info, &g, uint32_t(sizeof g), grid, 0, grid, r.w, i});
        }
    };
    std::vector<float> want;
    {
        gpu_runner plain(d);
        run(plain, {});
        d.synchronize(plain.s);
        REQUIRE(plain.w->completed.load() == chain.args.size());
        want = chain.output();
    }
    chain.clear_outputs();
    const std::vector<uint64_t> masks = {0b1, every_unit(n) & ~uint64_t{1}, ~uint64_t{0},
                                         uint64_t{1} << (std::min<uint32_t>(n, 64) - 1),
                                         0, every_unit(n), 0b11 & every_unit(n)};
    const auto before = stats(d);
    gpu_runner r(d);
    gpu::event* e = ops.event_create(&d);
    run(r, masks);  // no wait between launches: each change hands the stream over in flight
    ops.event_record(&d, e, r.s);
    ops.event_synchronize(&d, e);
    EXPECT(r.w->completed.load() == chain.args.size())
        << "an event recorded after the launches passed with the counter at " << r.w->completed.load();
    EXPECT(ops.queued(&d, r.s) == 0u);
    d.synchronize(r.s);
    const auto got = chain.output();
    EXPECT(std::memcmp(got.data(), want.data(), got.size() * 4) == 0)
        << "a GEMM chain whose units changed between launches differs from the unbound run";
    const auto after = stats(d);
    std::printf("  12 launches, units changed %llu times\n",
                (unsigned long long)(after.unit_switches - before.unit_switches));
    if (after.units_fallbacks == before.units_fallbacks) {
        EXPECT(after.unit_switches - before.unit_switches >= 6u) << after.unit_switches - before.unit_switches;
    }
    // The stream, now unbound, runs spin blocks on every unit again.
    spin_kernel k(d, grid_of(d, 4), 20000);
    d.launch(r.s, k.at(r.w, uint32_t(chain.args.size())));
    d.synchronize(r.s);
    EXPECT(k.finished() == k.grid);
    EXPECT(k.used(group_of(d)) == every_unit(n)) << "used 0x" << std::hex << k.used(group_of(d));
    ops.event_destroy(&d, e);
}

GPU_TEST(every_unit_or_none_of_the_device_is_unbound) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    const uint32_t n = units_of(d);
    gpu_runner r(d);
    const auto before = stats(d);
    set_units(d, r.s, every_unit(n));
    set_units(d, r.s, ~uint64_t{0});
    set_units(d, r.s, 0);
    if (n < 63) set_units(d, r.s, uint64_t{1} << 63);  // no unit of this device
    auto mid = stats(d);
    EXPECT(mid.units_binds == before.units_binds && mid.unit_switches == before.unit_switches &&
           mid.unit_streams_made == before.unit_streams_made)
        << "a set of every unit bound the stream";
    // Bound to unit 0, then to every unit again.
    set_units(d, r.s, 0b1);
    spin_kernel one(d, grid_of(d, 2), 500);
    d.launch(r.s, one.at(r.w, 0));
    set_units(d, r.s, every_unit(n) | (uint64_t{1} << 63));
    spin_kernel all(d, grid_of(d, 4), 20000);
    d.launch(r.s, all.at(r.w, 1));
    d.synchronize(r.s);
    EXPECT(r.w->completed.load() == 2u);
    expect_placed(d, one, 0b1, "a launch bound to unit 0", before);
    EXPECT(all.used(group_of(d)) == every_unit(n)) << "an unbound launch used 0x" << std::hex << all.used(group_of(d));
    const auto after = stats(d);
    EXPECT(after.units_binds == before.units_binds + 1);
    if (after.units_fallbacks == before.units_fallbacks) {
        EXPECT(after.unit_switches == before.unit_switches + 2) << after.unit_switches - before.unit_switches;
    }
}

GPU_TEST(a_stream_keeps_at_most_eight_unit_streams) {
    gpu::device& d = *the_device();
    needs_units(d, 4);
    const auto before = stats(d);
    {
        gpu_runner r(d);
        std::vector<uint64_t> masks;  // ten distinct proper subsets of units 0..3
        for (uint64_t m = 1; m < 15 && masks.size() < 10; ++m) masks.push_back(m);
        for (uint32_t i = 0; i < 12; ++i) {  // the last two bind evicted sets again
            const uint64_t m = masks[i % masks.size()];
            set_units(d, r.s, m);
            spin_kernel k(d, grid_of(d, 1), 200);
            d.launch(r.s, k.at(r.w, i));
            d.synchronize(r.s);
            EXPECT(k.finished() == k.grid);
            expect_placed(d, k, m, "a launch", before);
            const auto now = stats(d);
            EXPECT(now.unit_streams_live - before.unit_streams_live <= 8u)
                << now.unit_streams_live - before.unit_streams_live << " unit streams alive after " << i + 1
                << " sets";
        }
        EXPECT(r.w->completed.load() == 12u);
        const auto after = stats(d);
        std::printf("  12 binds to 10 sets: %llu unit streams made, %u alive\n",
                    (unsigned long long)(after.unit_streams_made - before.unit_streams_made),
                    after.unit_streams_live - before.unit_streams_live);
        if (after.units_fallbacks == before.units_fallbacks) {
            EXPECT(after.unit_streams_made - before.unit_streams_made == 12u)
                << "sets evicted and bound again are made again";
        }
    }
    EXPECT(stats(d).unit_streams_live == before.unit_streams_live) << "stream_destroy left unit streams";
}

GPU_TEST(a_padded_launch_on_a_bound_stream_is_a_plain_one) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    REQUIRE(d.pads_launches());
    gpu_runner r(d, d.caps().highest_priority);
    gpu::task_words* be_w = d.task_words_create();
    const uint64_t mask = 0b10;
    const auto before = stats(d);
    set_units(d, r.s, mask);
    const auto pads_before = d.padding_stats();
    spin_kernel rt(d, 2, 3000), pad(d, grid_of(d, 2), 100);
    const gpu::launch p = pad.at(be_w, 0);
    d.launch_padded(r.s, rt.at(r.w, 0), &p, 1);
    EXPECT(be_w->pads.load() == 0u) << "a pad dropped from a plain launch holds its task";
    d.synchronize(r.s);
    EXPECT(r.w->completed.load() == 1u);
    EXPECT(rt.finished() == 2u);
    EXPECT(pad.started() == 0u) << "a pad ran beside a bound launch";
    EXPECT(be_w->completed.load() == 0u);
    EXPECT(d.padding_stats().padded_launches == pads_before.padded_launches);
    expect_placed(d, rt, mask, "the RT part", before);
    d.task_words_destroy(be_w);
}

// The units a kernel's started blocks ran on.
std::vector<bool> unit_ids(const spin_kernel& k, uint32_t compute_units) {
    std::vector<bool> on(compute_units + 1, false);
    for (uint32_t b = 0; b < k.grid; ++b)
        if (k.word(b) != 0) on[std::min((k.word(b) & 0x7fffffffu) - 1, compute_units)] = true;
    return on;
}

// Shares that hold: two streams bound to disjoint halves of the device run their blocks on
// disjoint units (on CUDA, disjoint SM slices whatever order the driver hands SMs out in), on
// no more units than unit_grant_of says they got, and an RT launch on the whole device runs
// once both are preempted; both restore on their own units.
GPU_TEST(two_bound_be_tasks_run_on_disjoint_units_and_an_rt_launch_preempts_both) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    REQUIRE(d.has_unit_sets());
    const uint32_t n = units_of(d), cu = d.caps().compute_units;
    const uint64_t lo = unit_range(0, n / 2), hi = unit_range(n / 2, n);
    const gpu::unit_grant ga = d.unit_grant_of(lo), gb = d.unit_grant_of(hi);
    std::printf("  granted: 0x%llx -> %s (%u units), 0x%llx -> %s (%u units)\n", (unsigned long long)lo,
                ga.note.c_str(), ga.count, (unsigned long long)hi, gb.note.c_str(), gb.count);
    const gpu::unit_shares_info info = d.unit_shares();
    if (!info.usable) {
        std::printf("  shares unusable here (%s): both run unbound\n", info.why.c_str());
        EXPECT(!ga.bound && !gb.bound) << "a grant on a device whose shares are unusable";
        return;
    }
    REQUIRE(ga.bound && gb.bound) << ga.note << " / " << gb.note;
    EXPECT(ga.count + gb.count <= cu) << "disjoint halves granted " << ga.count << " + " << gb.count << " of " << cu;
    if (ga.exact) EXPECT(ga.units == gpu::units_in_set(lo, cu) && gb.units == gpu::units_in_set(hi, cu));

    gpu_runner a(d, d.caps().lowest_priority), b(d, d.caps().lowest_priority), rt(d, d.caps().highest_priority);
    const auto before = stats(d);
    set_units(d, a.s, lo);
    set_units(d, b.s, hi);
    // Blocks that run until preempted, several per unit: each launch spreads over every unit
    // its share has.
    spin_kernel ka(d, grid_of(d, 4), 30e6), kb(d, grid_of(d, 4), 30e6), krt(d, grid_of(d, 2), 100);
    d.launch(a.s, ka.at(a.w, 0));
    d.launch(b.s, kb.at(b.w, 0));
    const bool spread = eventually([&] { return ka.units_used() >= ga.count && kb.units_used() >= gb.count; }, 5000);
    std::printf("  a's blocks on %u units, b's on %u units%s\n", ka.units_used(), kb.units_used(),
                spread ? "" : " (not yet on every unit granted)");
    REQUIRE(ka.started() > 0 && kb.started() > 0) << "a bound launch never started";
    if (stats(d).units_fallbacks == before.units_fallbacks) {
        const std::vector<bool> ua = unit_ids(ka, cu), ub = unit_ids(kb, cu);
        uint32_t both = 0;
        for (uint32_t u = 0; u < cu; ++u) both += ua[u] && ub[u];
        EXPECT(both == 0u) << both << " units ran blocks of both shares";
        EXPECT(ka.units_used() <= ga.count && kb.units_used() <= gb.count)
            << "a share ran on more units than it was granted";
    } else {
        std::printf("  a bind fell back to the whole device: no placement to check\n");
    }
    // RT work arrives: both BE tasks are preempted, the RT launch runs on the whole device.
    d.set_task_flag(a.w, 1);
    d.set_task_flag(b.w, 1);
    d.launch(rt.s, krt.at(rt.w, 0));
    d.synchronize(rt.s);
    EXPECT(rt.w->completed.load() == 1u && krt.finished() == krt.grid) << "the RT launch did not complete";
    d.synchronize(a.s);
    d.synchronize(b.s);
    EXPECT(a.w->completed.load() == 0u && b.w->completed.load() == 0u) << "a preempted bound launch advanced its counter";
    // Both restore, each on its own units.
    d.set_task_flag(a.w, 0);
    d.set_task_flag(b.w, 0);
    spin_kernel ra(d, grid_of(d, 2), 200), rb(d, grid_of(d, 2), 200);
    d.launch(a.s, ra.at(a.w, 0));
    d.launch(b.s, rb.at(b.w, 0));
    d.synchronize(a.s);
    d.synchronize(b.s);
    EXPECT(a.w->completed.load() == 1u && b.w->completed.load() == 1u) << "a restored launch did not complete";
    expect_placed(d, ra, lo, "a's restored launch", before);
    expect_placed(d, rb, hi, "b's restored launch", before);
    const gpu::unit_shares_info after = d.unit_shares();
    EXPECT(after.binds >= info.binds + 2) << "binds not counted";
}

// The scheduler binds a BE task's stream to its units (task::units): RT tasks arriving at random
// moments preempt it, restore runs on the bound stream, and every output stays bit-identical.
GPU_TEST(the_scheduler_restores_a_bound_be_task_exactly) {
    gpu::device& d = *the_device();
    needs_units(d, 2);
    const uint32_t n = units_of(d);
    const int64_t size = emulated() ? 128 : 1024;
    gemm_chain be(d, 20, size, 51, 128), rt(d, 3, size, 52, 128);
    gpu::scheduler_options so;
    so.restore = gpu::restore_mode::exact;
    so.vhq_capacity = 4;
    gpu::scheduler sched(d, so);
    REQUIRE(sched.wait(sched.submit(be.task(gpu::task_class::be))).status == gpu::task_status::completed);
    REQUIRE(sched.wait(sched.submit(rt.task(gpu::task_class::rt))).status == gpu::task_status::completed);
    const auto want_be = be.output(), want_rt = rt.output();
    const auto bound_task = [&] {
        gpu::task t = be.task(gpu::task_class::be);
        t.units = unit_range(0, std::max<uint32_t>(1, n / 2));
        return t;
    };
    const auto before = stats(d);
    be.clear_outputs();
    auto t0 = clk::now();
    REQUIRE(sched.wait(sched.submit(bound_task())).status == gpu::task_status::completed);
    const double be_us = ms_since(t0) * 1000;
    EXPECT(std::memcmp(be.output().data(), want_be.data(), want_be.size() * 4) == 0) << "bound BE output differs";
    std::printf("  bound BE task alone: %.0f us (20 GEMMs %lld^3 on %u of %u units)\n", be_us, (long long)size,
                std::max<uint32_t>(1, n / 2), n);
    std::mt19937 rng(7);
    uint32_t preempted = 0;
    for (int trial = 0; trial < 5; ++trial) {
        be.clear_outputs();
        const gpu::task_id b = sched.submit(bound_task());
        for (int i = 0; i < 3; ++i) {
            std::this_thread::sleep_for(std::chrono::microseconds(
                std::uniform_int_distribution<int>(int(be_us * 0.02), int(std::max(be_us * 0.25, 100.0)))(rng)));
            rt.clear_outputs();
            REQUIRE(sched.wait(sched.submit(rt.task(gpu::task_class::rt))).status == gpu::task_status::completed);
            EXPECT(rt.output() == want_rt) << "RT output differs (trial " << trial << ")";
        }
        const gpu::task_result br = sched.wait(b);
        REQUIRE(br.status == gpu::task_status::completed);
        preempted += br.preemptions > 0;
        const auto got = be.output();
        EXPECT(std::memcmp(got.data(), want_be.data(), got.size() * 4) == 0)
            << "bound BE output differs after " << br.preemptions << " preemptions";
    }
    sched.shutdown();
    std::printf("  %u of 5 bound BE runs preempted\n", preempted);
    EXPECT(preempted > 0) << "no bound BE run was ever preempted: the test proves nothing";
    EXPECT(stats(d).units_binds > before.units_binds) << "the scheduler never bound the BE stream";
}

}  // namespace

int main(int argc, char** argv) {
    // The emulation's machine: 4 units, so that streams can be bound to some of them.
    setenv("REEFLINE_EMU_UNITS", "4", 0);
    return gpu_test::main(argc, argv, make_the_device);
}
