// Dynamic kernel padding on the cuda/hip backend (device_ops::launch_padded, the kernel
// library's DKP kernel), against the same contract the cpu device keeps (tests/dkp_test.cc):
// - pads run beside the RT kernel, never on the units kept for it (the spin kernel records the
//   unit each block ran on), and a pad whose every block ran advances its task's counter;
// - a pad runs only when its task is at its kernel; a pad is cut when its RT kernel ends (its
//   blocks stop at their next check point, its task's counter stays) and the task's next pad
//   does not run after a cut one; pads of one task run in order across RT kernels;
// - a padded GEMM's output is bit-identical to a plain launch's, whole or restored after a cut;
// - an RT kernel that fills every unit is launched plainly;
// - the scheduler with REEF's selector pads RT kernels with a preempted BE task's GEMMs, which
//   then progress under back-to-back RT tasks, and every output stays bit-identical;
// - the device reports the compiled kernels' resources (registers, shared memory, occupancy).
// Under the SIMT emulation the machine gets 4 units (REEFLINE_EMU_UNITS), so that blocks of the
// DKP kernel run side by side as they do on a GPU.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dkp/selector.h"
#include "libml/kernels/gpu/launcher.h"
#include "preempt/scheduler.h"
#include "tests/gpu/gpu_util.h"

using namespace gpu_test;
using clk = std::chrono::steady_clock;

namespace {

// How much longer RT kernels run under the emulation, whose blocks cost milliseconds of
// barriers among hundreds of threads on a few cores, so that pads get the time they would get
// on a GPU.
double rt_scale() { return emulated() ? 20 : 1; }

bool pads_end(const gpu::task_words* w, double ms = 5000) {
    const auto t0 = clk::now();
    while (w->pads.load() != 0) {
        if (ms_since(t0) > ms) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
}

// An RT stream and task, a BE task, on the test device.
struct fixture {
    gpu::device& d = *the_device();
    gpu::stream* rt = d.create_stream(d.caps().highest_priority);
    gpu::task_words* rt_w = d.task_words_create();
    gpu::task_words* be_w = d.task_words_create();
    gpu::device_ops::padding_counters before = d.padding_stats();
    fixture() { REQUIRE(d.pads_launches()); }
    ~fixture() {
        d.synchronize(rt);
        (void)pads_end(be_w);
        d.task_words_destroy(rt_w);
        d.task_words_destroy(be_w);
        d.stream_destroy(rt);
    }
    gpu::device_ops::padding_counters delta() const {
        const auto now = d.padding_stats();
        gpu::device_ops::padding_counters c;
        c.padded_launches = now.padded_launches - before.padded_launches;
        c.pads = now.pads - before.pads;
        c.pads_completed = now.pads_completed - before.pads_completed;
        c.pads_cut = now.pads_cut - before.pads_cut;
        c.pads_skipped = now.pads_skipped - before.pads_skipped;
        c.pad_blocks = now.pad_blocks - before.pad_blocks;
        return c;
    }
};

GPU_TEST(pads_run_beside_the_rt_kernel_never_on_its_units) {
    fixture f;
    f.be_w->completed.store(7);  // the BE task is at its kernel 7
    // RT: one block keeps one unit until the pad's 12 blocks of 1 ms have run on the others
    // (at most 20 s: held, not timed, so that a slow host cannot cut the pad).
    spin_kernel r(f.d, 1, 20'000'000), b(f.d, 12, 1000);
    r.hold_until_finished(b, 12);
    const gpu::launch pad = b.at(f.be_w, 7);
    f.d.launch_padded(f.rt, r.at(f.rt_w, 0), &pad, 1);
    EXPECT(f.be_w->pads.load() == 1u) << "the pad's task counts it until the launch ends";
    f.d.synchronize(f.rt);
    EXPECT(f.rt_w->completed.load() == 1u);
    EXPECT(r.finished() == 1u);
    REQUIRE(pads_end(f.be_w)) << "the pad's task was never released";
    EXPECT(b.finished() == 12u) << b.finished() << " of 12 pad blocks ran";
    EXPECT(f.be_w->completed.load() == 8u) << "a pad whose every block ran advances its task's counter";
    // One RT block with the proxy's >= 1 blocks per unit keeps unit 0 for the RT kernel.
    EXPECT(b.on_unit(0) == 0u) << b.on_unit(0) << " pad blocks ran on the unit kept for the RT kernel";
    const auto c = f.delta();
    EXPECT(c.padded_launches == 1u && c.pads == 1u) << c.padded_launches << " padded, " << c.pads << " pads";
    EXPECT(c.pads_completed == 1u && c.pad_blocks == 12u) << c.pads_completed << " completed, " << c.pad_blocks
                                                           << " blocks";
}

GPU_TEST(a_pad_runs_only_when_its_task_is_at_its_kernel) {
    fixture f;
    f.be_w->completed.store(5);  // kernel 5 next: a pad of kernel 7 must not run
    // The RT kernel long enough that a unit comes to the pad while it runs (and skips it).
    spin_kernel r(f.d, 1, 3000 * rt_scale()), b(f.d, 2, 100);
    const gpu::launch pad = b.at(f.be_w, 7);
    f.d.launch_padded(f.rt, r.at(f.rt_w, 0), &pad, 1);
    f.d.synchronize(f.rt);
    REQUIRE(pads_end(f.be_w));
    EXPECT(b.started() == 0u);
    EXPECT(f.be_w->completed.load() == 5u);
    EXPECT(f.delta().pads_skipped == 1u);
}

GPU_TEST(a_pad_ends_with_its_rt_kernel_and_the_next_pad_of_its_task_does_not_run) {
    fixture f;
    f.be_w->completed.store(3);
    // RT kernel 0 runs until the pad has started (at most 20 s: a pad that never starts fails
    // the test below, it does not hang it), the pad's blocks would run a minute: cut at the RT
    // kernel's end. Held rather than timed: under the emulation on a busy 2-core machine a
    // pad may take longer to start than any fixed RT kernel length.
    spin_kernel r0(f.d, 1, 20'000'000), r1(f.d, 1, 5000), long_pad(f.d, 2, 60'000'000), next_pad(f.d, 2, 100);
    r0.hold_until_started(long_pad);
    const gpu::launch p0 = long_pad.at(f.be_w, 3), p1 = next_pad.at(f.be_w, 4);
    const auto t0 = clk::now();
    f.d.launch_padded(f.rt, r0.at(f.rt_w, 0), &p0, 1);
    f.d.launch_padded(f.rt, r1.at(f.rt_w, 1), &p1, 1);
    f.d.synchronize(f.rt);
    const double rt_ms = ms_since(t0);
    REQUIRE(pads_end(f.be_w, 5000)) << "cut pad blocks must stop at their next check point";
    EXPECT(rt_ms < 19'000.0) << "the RT kernels took " << rt_ms << " ms: the pad never started";
    EXPECT(long_pad.started() > 0u);
    EXPECT(long_pad.finished() == 0u);
    EXPECT(next_pad.started() == 0u) << "a pad ran after its task's previous pad was cut";
    EXPECT(f.be_w->completed.load() == 3u);
    const auto c = f.delta();
    EXPECT(c.pads_cut == 1u) << c.pads_cut;
    EXPECT(c.pads_skipped == 1u) << c.pads_skipped;
    EXPECT(f.rt_w->completed.load() == 2u);
}

GPU_TEST(pads_of_one_task_run_in_order_across_rt_kernels) {
    fixture f;
    std::vector<std::unique_ptr<spin_kernel>> rts, pads;
    for (uint32_t i = 0; i < 4; ++i) {
        rts.push_back(std::make_unique<spin_kernel>(f.d, 1, 4000 * rt_scale()));
        pads.push_back(std::make_unique<spin_kernel>(f.d, 2, 300));
        const gpu::launch p = pads.back()->at(f.be_w, i);
        f.d.launch_padded(f.rt, rts.back()->at(f.rt_w, i), &p, 1);
    }
    f.d.synchronize(f.rt);
    REQUIRE(pads_end(f.be_w));
    EXPECT(f.be_w->completed.load() == 4u) << "four pads, each after the one before: counter "
                                            << f.be_w->completed.load();
    EXPECT(f.rt_w->completed.load() == 4u);
}

GPU_TEST(an_rt_kernel_that_fills_every_unit_is_launched_plainly) {
    fixture f;
    f.be_w->completed.store(0);
    const uint32_t grid = f.d.caps().compute_units * 64;  // more than any proxy holds at once
    spin_kernel r(f.d, grid, 20), b(f.d, 2, 100);
    const gpu::launch pad = b.at(f.be_w, 0);
    f.d.launch_padded(f.rt, r.at(f.rt_w, 0), &pad, 1);
    EXPECT(f.be_w->pads.load() == 0u) << "a pad that cannot run must not hold its task";
    f.d.synchronize(f.rt);
    EXPECT(f.rt_w->completed.load() == 1u);
    EXPECT(r.finished() == grid);
    EXPECT(b.started() == 0u);
    EXPECT(f.delta().padded_launches == 0u);
}

// C = A x W (n x n): a BE kernel with K-chunk check points every 16 elements.
struct gemm_case {
    gpu::device& d;
    int64_t n;
    dev_buffer a, w, c;
    k::gemm_args g{};
    gemm_case(gpu::device& dev, int64_t size)
        : d(dev), n(size), a(dev, random_floats(size_t(size * size), 5)), w(dev, random_floats(size_t(size * size), 6)),
          c(dev, size_t(size * size) * 4) {
        g.a = a.get(); g.b = w.get(); g.c = c.get();
        g.batch = 1; g.m = n; g.n = n; g.k = n; g.lda = n; g.ldb = n; g.ldc = n;
        g.alpha = 1; g.beta = 1;
        g.tile_m = 64; g.tile_n = 64; g.tile_k = 16;
    }
    uint32_t grid() const { return uint32_t(k::gemm_grid(g)); }
    gpu::launch at(gpu::task_words* tw, uint32_t index) const {
        return gpu::launch{&gemm_info, &g, uint32_t(sizeof g), grid(), 0, grid(), tw, index};
    }
    void clear() {
        const std::vector<float> junk(size_t(n * n), -7.0f);
        d.copy_to_device(c.get(), junk.data(), junk.size() * 4);
    }
};

GPU_TEST(a_padded_gemm_is_bit_identical_to_a_plain_launch_whole_or_restored_after_a_cut) {
    fixture f;
    gemm_case gm(f.d, emulated() ? 256 : 1024);
    // The reference: a plain launch.
    gpu_runner plain(f.d);
    REQUIRE(plain.run(gemm_info, gm.g, gm.grid()));
    const auto want = gm.c.read<float>();
    // Padded beside a long RT kernel: every block runs.
    gm.clear();
    {
        spin_kernel r(f.d, 1, emulated() ? 60'000'000 : 200'000);  // ends when the GEMM is done
        f.be_w->completed.store(0);
        const gpu::launch pad = gm.at(f.be_w, 0);
        const auto t0 = clk::now();
        f.d.launch_padded(f.rt, r.at(f.rt_w, 0), &pad, 1);
        // The RT kernel is cut short by its own flag once the pad completed (a 60 s spin only
        // bounds the emulation's slowness).
        while (f.be_w->completed.load() == 0 && ms_since(t0) < 120'000)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        f.d.set_task_flag(f.rt_w, 1);
        f.d.synchronize(f.rt);
        f.d.set_task_flag(f.rt_w, 0);
        REQUIRE(pads_end(f.be_w));
        REQUIRE(f.be_w->completed.load() == 1u) << "the padded GEMM did not complete beside a long RT kernel";
        std::printf("  padded GEMM %lld^3 completed beside the RT kernel in %.1f ms\n", (long long)gm.n, ms_since(t0));
        const auto got = gm.c.read<float>();
        EXPECT(std::memcmp(got.data(), want.data(), got.size() * 4) == 0) << "padded GEMM output differs";
    }
    // Padded beside a short RT kernel: cut part-way, then restored by a plain launch of the same
    // kernel (what the scheduler does), with the same result.
    gm.clear();
    {
        spin_kernel r(f.d, 1, emulated() ? 2000 : 5);
        f.be_w->completed.store(0);
        const gpu::launch pad = gm.at(f.be_w, 0);
        f.d.launch_padded(f.rt, r.at(f.rt_w, 0), &pad, 1);
        f.d.synchronize(f.rt);
        REQUIRE(pads_end(f.be_w));
        const bool cut = f.be_w->completed.load() == 0;
        std::printf("  padded GEMM beside a short RT kernel: %s\n", cut ? "cut, restored" : "completed");
        if (emulated()) {
            EXPECT(cut) << "a 2 ms RT kernel cannot hold the emulated GEMM to its end";
        }
        if (cut) {
            gpu_runner restore(f.d);
            REQUIRE(restore.run(gemm_info, gm.g, gm.grid()));
        }
        const auto got = gm.c.read<float>();
        EXPECT(std::memcmp(got.data(), want.data(), got.size() * 4) == 0) << "GEMM output after a cut pad differs";
    }
}

GPU_TEST(the_scheduler_pads_rt_kernels_with_be_gemms_and_results_stay_bit_identical) {
    gpu::device& d = *the_device();
    gemm_chain be(d, 8, emulated() ? 64 : 1024, 11, 32);
    gpu::scheduler_options so;
    so.padding = std::make_shared<reefline::dkp::rules_selector>();
    gpu::scheduler sched(d, so);
    REQUIRE(sched.stats().padding);
    // Profiled figures as kprof gives them: short kernels, two blocks per unit.
    const auto be_task = [&] { return be.task(gpu::task_class::be, 500, 2); };
    REQUIRE(sched.wait(sched.submit(be_task())).status == gpu::task_status::completed);
    const auto want = be.output();
    const auto before = d.padding_stats();
    // RT tasks of one 1-block kernel back to back: the BE task progresses as padding beside them.
    be.clear_outputs();
    const gpu::task_id b = sched.submit(be_task());
    std::atomic<bool> be_done{false};
    gpu::task_result br;
    std::thread waiter([&] {
        br = sched.wait(b);
        be_done = true;
    });
    // An RT task is 4 kernels: its first preempts the BE task, the next ones can carry its GEMMs.
    const auto rt_args = k::gpu_spin_args{uint64_t(2'000'000 * rt_scale()), 50'000, nullptr};
    int rts = 0;
    const auto t0 = clk::now();
    while (!be_done && ms_since(t0) < 120'000) {
        gpu::task t;
        t.cls = gpu::task_class::rt;
        for (int i = 0; i < 4; ++i) {
            t.launches.push_back(gpu::task_launch::make(&spin_info, rt_args, 1));
            t.launches.back().est_us = float(2000 * rt_scale());
            t.launches.back().occupancy = 2;
        }
        REQUIRE(sched.wait(sched.submit(std::move(t))).status == gpu::task_status::completed);
        ++rts;
    }
    waiter.join();
    REQUIRE(br.status == gpu::task_status::completed);
    const auto got = be.output();
    EXPECT(std::memcmp(got.data(), want.data(), got.size() * 4) == 0)
        << "BE output differs after " << br.preemptions << " preemptions";
    const auto after = d.padding_stats();
    const auto s = sched.stats();
    std::printf("  %d RT tasks; BE preempted %u times; padded launches %llu, pads completed %llu cut %llu skipped %llu, "
                "%llu BE blocks as padding\n",
                rts, br.preemptions, (unsigned long long)(after.padded_launches - before.padded_launches),
                (unsigned long long)(after.pads_completed - before.pads_completed),
                (unsigned long long)(after.pads_cut - before.pads_cut),
                (unsigned long long)(after.pads_skipped - before.pads_skipped),
                (unsigned long long)(after.pad_blocks - before.pad_blocks));
    EXPECT(s.padded_launches > 0) << "no RT launch was padded: the test proves nothing";
    EXPECT(after.pads_completed > before.pads_completed) << "no pad completed";
    sched.shutdown();
}

GPU_TEST(the_device_reports_compiled_kernels_resources) {
    gpu::device& d = *the_device();
    gpu::kernel_resources r;
    REQUIRE(d.kernel_resources_of(&gemm_info, r));
    std::printf("  gemm: %u threads, %u registers, %u B shared, %u blocks per unit\n", r.threads_per_block, r.registers,
                r.shared_bytes, r.blocks_per_unit);
    EXPECT(r.threads_per_block == 256u);
    EXPECT(r.registers > 0u);
    EXPECT(r.shared_bytes >= 8192u) << "the GEMM's tiles are in shared memory";
    EXPECT(r.blocks_per_unit >= 1u);
    static const gpu::kernel_info nowhere = {"no_such_kernel", nullptr, 256, 0, 0, 0};
    EXPECT(!d.kernel_resources_of(&nowhere, r));
}

}  // namespace

int main(int argc, char** argv) {
    // The emulation's machine: 4 units, so that the DKP kernel's blocks run side by side.
    setenv("REEFLINE_EMU_UNITS", "4", 0);
    return gpu_test::main(argc, argv, make_the_device);
}
