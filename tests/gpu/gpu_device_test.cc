// The cuda/hip device backend against the device interface's contract (preempt/device.h):
// memory kinds and the pool, streams, events, queued() and the bounded queue, task words in
// host-mapped memory (a flag raised by a plain store stops running and queued launches), the
// gather kernel reading packet payloads in place from registered host memory, and the
// scheduler (unchanged) running real kernels on the GPU: RT tasks preempting BE tasks never
// change their results.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "libml/kernels/gpu/launcher.h"
#include "preempt/scheduler.h"
#include "tests/gpu/gpu_util.h"
#include "tests/gpu/mbuf_layout.h"

using namespace gpu_test;
using clk = std::chrono::steady_clock;

namespace {

k::gpu_spin_args spin(double us, double check_us = 5, uint32_t* started = nullptr) {
    return k::gpu_spin_args{uint64_t(us * 1000), uint64_t(check_us * 1000), started};
}

template <typename A>
gpu::launch launch_of(const gpu::kernel_info& ki, const A& a, uint32_t grid, gpu::task_words* w, uint32_t index) {
    return gpu::launch{&ki, &a, uint32_t(sizeof a), grid, 0, grid, w, index};
}



// A kernel's first launch in the process runs beside a block already spinning on another
// stream. With CUDA's lazy loading a first launch loads its kernel, which may wait for the
// running kernels (an H200 showed such a wait before the device asked for eager loading). First in this file, so that the accounting kernel of an empty
// slice has not run yet in this process.
GPU_TEST(a_kernels_first_launch_runs_beside_a_spinning_block) {
    if (emulated()) SKIP_TEST("the SIMT emulation runs one launch at a time on its one unit");
    gpu::device& d = *the_device();
    gpu_runner a(d), b(d);
    spin_kernel longk(d, 1, 10e6);  // 10 s, or until its task is flagged
    d.launch(a.s, longk.at(a.w, 0));
    REQUIRE(eventually([&] { return longk.started() == 1u; })) << "the spinning block never started";
    const auto t0 = clk::now();
    // An empty slice: the accounting kernel alone, its first launch in this process.
    d.launch(b.s, gpu::launch{&spin_info, &longk.args, uint32_t(sizeof longk.args), 1, 0, 0, b.w, 0});
    d.synchronize(b.s);
    const double ms = ms_since(t0);
    d.set_task_flag(a.w, 1);
    d.synchronize(a.s);
    std::printf("  first launch of the accounting kernel beside a spinning block: %.2f ms\n", ms);
    EXPECT(b.w->completed.load() == 1u);
    EXPECT(longk.finished() == 0u) << "the spinning block ran to its end";
    EXPECT(ms < 1000) << "the first launch waited " << ms << " ms for the other stream's block";
}

GPU_TEST(caps_memory_kinds_and_pool) {
    gpu::device& d = *the_device();
    const gpu::device_caps c = d.caps();
    EXPECT(!c.name.empty());
    EXPECT(c.gpu);
    EXPECT(c.compute_units > 0);
    EXPECT(c.highest_priority <= c.lowest_priority) << c.highest_priority << " vs " << c.lowest_priority;
    // Enough hardware queues that an RT stream need not share one with a BE stream: the device
    // asks the runtime for the most it gives (the emulation has none).
    gpu::gpu_device_stats hw{};
    REQUIRE(gpu::gpu_device_stats_of(d, hw));
    std::printf("  hardware queues: %u\n", hw.hardware_queues);
    if (emulated()) EXPECT(hw.hardware_queues == 0u) << hw.hardware_queues;
    else EXPECT(hw.hardware_queues >= 8u) << hw.hardware_queues;
    // Host-mapped memory: written by the host, read by a kernel through the same pointer.
    const size_t n = 10000;
    auto* hm = static_cast<float*>(d.alloc(n * 4, gpu::memory_kind::host_mapped));
    REQUIRE(hm != nullptr);
    for (size_t i = 0; i < n; ++i) hm[i] = float(i) * 0.5f;
    dev_buffer out(d, n * 4);
    k::unary_args u{};
    u.x = hm; u.y = out.get(); u.count = int64_t(n); u.op = k::unary_op::scale; u.alpha = 2; u.per_block = 4096;
    gpu_runner r(d);
    EXPECT(r.run(k::unary_kernel, u, k::unary_grid(u)));
    const auto y = out.read<float>();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += y[i] != float(i);
    EXPECT(bad == 0) << bad << " wrong values read from host-mapped memory";
    // ... and written by a kernel, read by the host directly.
    u.x = out.get(); u.y = hm; u.alpha = 0.25f;
    EXPECT(r.run(k::unary_kernel, u, k::unary_grid(u)));
    bad = 0;
    for (size_t i = 0; i < n; ++i) bad += hm[i] != float(i) * 0.25f;
    EXPECT(bad == 0) << bad << " wrong values written to host-mapped memory";
    d.free(hm);
    // Pinned memory copies.
    auto* pin = static_cast<float*>(d.alloc(n * 4, gpu::memory_kind::pinned));
    REQUIRE(pin != nullptr);
    d.copy_to_host(pin, out.get(), n * 4);
    EXPECT(pin[7] == 7.0f);
    d.free(pin);
    // The pool hands a freed block back out.
    gpu::gpu_device_stats before{}, after{};
    REQUIRE(gpu::gpu_device_stats_of(d, before));
    void* p = d.alloc(3 << 20);
    d.free(p);
    void* q = d.alloc(3 << 20);
    REQUIRE(gpu::gpu_device_stats_of(d, after));
    EXPECT(q == p);
    EXPECT(after.pool_hits > before.pool_hits);
    d.free(q);
    EXPECT(d.alloc(size_t(1) << 50) == nullptr) << "an impossible allocation returns null";
}

GPU_TEST(streams_events_and_queued) {
    gpu::device& d = *the_device();
    const auto& ops = d.ops();
    gpu::stream* s = d.create_stream(d.caps().lowest_priority);
    gpu::task_words* w = ops.task_words_create(&d);
    gpu::event* e1 = ops.event_create(&d);
    gpu::event* e2 = ops.event_create(&d);
    EXPECT(ops.event_query(&d, e1)) << "an event never recorded has passed";
    const auto a = spin(30000), b = spin(30000), c = spin(30000);
    d.launch(s, launch_of(spin_info, a, 1, w, 0));
    ops.event_record(&d, e1, s);
    d.launch(s, launch_of(spin_info, b, 1, w, 1));
    d.launch(s, launch_of(spin_info, c, 1, w, 2));
    ops.event_record(&d, e2, s);
    EXPECT(ops.queued(&d, s) == 2u) << "queued " << ops.queued(&d, s);
    EXPECT(!ops.event_query(&d, e1));
    ops.event_synchronize(&d, e1);
    EXPECT(ops.event_query(&d, e1));
    EXPECT(w->completed.load() == 1u);
    EXPECT(!ops.event_query(&d, e2));
    EXPECT(eventually([&] { return ops.queued(&d, s) <= 1u; }));
    d.synchronize(s);
    EXPECT(ops.queued(&d, s) == 0u);
    EXPECT(w->completed.load() == 3u);
    EXPECT(ops.event_query(&d, e2));
    ops.event_destroy(&d, e1);
    ops.event_destroy(&d, e2);
    ops.task_words_destroy(&d, w);
    ops.stream_destroy(&d, s);
}

GPU_TEST(bounded_queue_blocks_launch) {
    gpu::gpu_device_options o;
    o.queue_depth = 3;
    auto dev = gpu::make_gpu_device(o);
    gpu::device& d = *dev;
    EXPECT(d.caps().max_queue_depth == 3u);
    gpu::stream* s = d.create_stream(0);
    const auto a = spin(20000);  // 20 ms each
    std::atomic<uint32_t> returned{0};
    const auto t0 = clk::now();
    std::thread producer([&] {
        for (uint32_t i = 0; i < 6; ++i) {
            d.launch(s, launch_of(spin_info, a, 1, nullptr, i));
            returned.store(i + 1);
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT(returned.load() == 3u) << "after 10 ms, " << returned.load() << " launches returned (depth 3)";
    producer.join();
    EXPECT(ms_since(t0) >= 50) << "the 4th launch returned before the 1st finished";
    d.synchronize(s);
    d.stream_destroy(s);
}

GPU_TEST(flag_stops_running_and_queued_launches) {
    gpu::device& d = *the_device();
    gpu_runner r(d, d.caps().lowest_priority);
    const uint32_t grid = d.caps().compute_units * 4;
    // A launch of 2 s blocks, and 20 more queued behind it.
    const auto long_spin = spin(2e6, 5);
    d.launch(r.s, launch_of(spin_info, long_spin, grid, r.w, 0));
    for (uint32_t i = 1; i <= 20; ++i) d.launch(r.s, launch_of(spin_info, long_spin, grid, r.w, i));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t0 = clk::now();
    d.set_task_flag(r.w, 1);  // a 4-byte copy on the flag stream: no kernel launch
    d.synchronize(r.s);
    const double ms = ms_since(t0);
    std::printf("  flag raised -> running launch and 20 queued ones gone: %.3f ms\n", ms);
    EXPECT(ms < 100 || emulated()) << "took " << ms << " ms";
    EXPECT(r.w->completed.load() == 0u) << "a preempted launch advanced the counter to " << r.w->completed.load();
    EXPECT(d.queued(r.s) == 0u);
    // After the flag is cleared, the stream runs launches again.
    d.set_task_flag(r.w, 0);
    r.next_index = 0;
    const auto short_spin = spin(100);
    EXPECT(r.run(spin_info, short_spin, grid));
}

void check_level_raise(gpu::device& d);

GPU_TEST(a_raised_level_stops_its_older_launches_only) { check_level_raise(*the_device()); }

// The relay path (a resident block carries raises from mapped memory to the device line): the
// same contract, on a device of its own.
GPU_TEST(a_level_raised_through_the_relay_stops_its_older_launches_only) {
    gpu::gpu_device_options o;
    o.level_path = gpu::gpu_level_path::relay;
    auto d = gpu::make_gpu_device(o);
    gpu::gpu_device_stats st{};
    REQUIRE(gpu::gpu_device_stats_of(*d, st));
    REQUIRE(std::string(st.level_path) == "relay") << "the device took " << st.level_path;
    check_level_raise(*d);
}

void check_level_raise(gpu::device& d) {
    const auto& ops = d.ops();
    REQUIRE(ops.raise_levels != nullptr && ops.level_epoch != nullptr);
    gpu_runner a(d, d.caps().lowest_priority), b(d, d.caps().lowest_priority);
    const uint32_t grid = d.caps().compute_units * 2;
    const auto long_spin = spin(2e6, 5);
    // a: a running launch of 2 s blocks and 20 queued, at level 1; b: one at level 2.
    const uint32_t e1 = ops.level_epoch(&d, 1), e2 = ops.level_epoch(&d, 2);
    auto at = [&](gpu_runner& r, uint32_t level, uint32_t epoch, uint32_t index) {
        gpu::launch l = launch_of(spin_info, long_spin, grid, r.w, index);
        l.level = level;
        l.epoch = epoch;
        return l;
    };
    for (uint32_t i = 0; i <= 20; ++i) d.launch(a.s, at(a, 1, e1, i));
    const auto short_spin = spin(2000);
    gpu::launch lb = launch_of(spin_info, short_spin, 1, b.w, 0);
    lb.level = 2;
    lb.epoch = e2;
    d.launch(b.s, lb);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t0 = clk::now();
    ops.raise_levels(&d, 1u << 1);  // one write on the flag stream: no task flag, no kernel
    d.synchronize(a.s);
    const double ms = ms_since(t0);
    gpu::gpu_device_stats st{};
    REQUIRE(gpu::gpu_device_stats_of(d, st));
    std::printf("  level raised (%s) -> running launch and 20 queued ones gone: %.3f ms\n", st.level_path, ms);
    EXPECT(ms < 100 || emulated()) << "took " << ms << " ms";
    EXPECT(ops.level_epoch(&d, 1) == e1 + 1 && ops.level_epoch(&d, 2) == e2);
    EXPECT(a.w->completed.load() == 0u) << "a stopped launch advanced the counter to " << a.w->completed.load();
    EXPECT(a.w->preempt.load() == 0u) << "a level raise writes no task flag";
    d.synchronize(b.s);
    EXPECT(b.w->completed.load() == 1u) << "level 2 was not raised: its launch runs to its end";
    // At the new epoch (and at one ahead of it: a raise still on its way) the task runs again.
    a.next_index = 0;
    gpu::launch again = at(a, 1, ops.level_epoch(&d, 1), 0);
    const auto quick = spin(100);
    again.args = &quick;
    d.launch(a.s, again);
    gpu::launch ahead = at(a, 1, ops.level_epoch(&d, 1) + 1, 1);
    ahead.args = &quick;
    d.launch(a.s, ahead);
    d.synchronize(a.s);
    EXPECT(a.w->completed.load() == 2u) << a.w->completed.load();
}

GPU_TEST(rt_stream_runs_while_be_stream_is_full) {
    if (emulated()) SKIP_TEST("the SIMT emulation runs one launch at a time and has no stream priorities");
    gpu::device& d = *the_device();
    const gpu::device_caps c = d.caps();
    gpu_runner be(d, c.lowest_priority), rt(d, c.highest_priority);
    // BE: 8 launches filling every compute unit for 20 ms each.
    const auto be_spin = spin(20000);
    const uint32_t grid = c.compute_units * 16;
    for (uint32_t i = 0; i < 8; ++i) d.launch(be.s, launch_of(spin_info, be_spin, grid, be.w, i));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // RT arrives: flag the BE task (as the scheduler does) and launch the RT kernel.
    auto* started = static_cast<uint32_t*>(d.alloc(64, gpu::memory_kind::host_mapped));
    REQUIRE(started != nullptr);
    *reinterpret_cast<volatile uint32_t*>(started) = 0;
    const auto rt_spin = spin(10, 5, started);
    const auto t0 = clk::now();
    d.set_task_flag(be.w, 1);
    d.launch(rt.s, launch_of(spin_info, rt_spin, 1, rt.w, 0));
    while (*reinterpret_cast<volatile uint32_t*>(started) == 0 && ms_since(t0) < 1000) {
    }
    const double us = ms_since(t0) * 1000;
    std::printf("  RT kernel running %.1f us after the flag (BE launches of 20 ms in flight)\n", us);
    EXPECT(us < 5000) << us << " us";
    d.synchronize(rt.s);
    d.synchronize(be.s);
    EXPECT(rt.w->completed.load() == 1u);
    d.free(started);
}

GPU_TEST(gather_reads_registered_mbuf_memory_in_place) {
    gpu::device& d = *the_device();
    const int64_t B = 4, H = 61, W = 47, C = 3, bytes = H * W * C;
    mbuf_arena arena(size_t(B * (bytes / 500 + 2)));
    std::printf("  mbuf arena: %zu bytes, %s\n", arena.bytes(), arena.hugepages() ? "2 MiB hugepages" : "4 KiB pages");
    REQUIRE(d.register_host(arena.base(), arena.bytes()));
    std::vector<std::vector<uint8_t>> images(static_cast<size_t>(B));
    std::mt19937 rng(31);
    for (auto& im : images) {
        im.resize(size_t(bytes));
        for (auto& v : im) v = uint8_t(rng());
    }
    for (size_t fragment : {size_t(500), size_t(1432), size_t(61)}) {
        if (B * ((bytes + int64_t(fragment) - 1) / int64_t(fragment)) > int64_t(arena.count())) continue;
        const gather_list gl = scatter_images(arena, images, fragment, uint32_t(fragment));
        // The gather list itself in host-mapped memory (as libml's runtime keeps it), and the
        // block descriptors after it, 128-byte aligned.
        const size_t seg_bytes = gl.segments.size() * sizeof(k::gather_segment), first_bytes = gl.first.size() * 4;
        const size_t blocks_at = (seg_bytes + first_bytes + 127) / 128 * 128;
        const int64_t most_blocks = B * ((bytes + 11) / 12);
        auto* list = static_cast<std::byte*>(
            d.alloc(blocks_at + size_t(most_blocks) * sizeof(k::gather_block_desc), gpu::memory_kind::host_mapped));
        REQUIRE(list != nullptr);
        std::memcpy(list, gl.segments.data(), seg_bytes);
        std::memcpy(list + seg_bytes, gl.first.data(), first_bytes);
        for (int64_t per_block : {int64_t(4095), int64_t(12), int64_t(65535)}) {
            k::gather_args g{};
            g.batch = B; g.h = H; g.w = W; g.c = C; g.bytes_per_block = per_block;
            const float mean[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
            for (int i = 0; i < 3; ++i) { g.mean[i] = mean[i]; g.inv_std[i] = 1.0f / sd[i]; }
            std::vector<float> want(size_t(B * C * H * W), NAN);
            k::gather_args h = g;
            h.segments = gl.segments.data(); h.first = gl.first.data(); h.y = want.data();
            REQUIRE(run_cpu(k::gather_kernel, &h, k::gather_grid(g)));
            g.segments = reinterpret_cast<const k::gather_segment*>(list);
            g.first = reinterpret_cast<const uint32_t*>(list + seg_bytes);
            auto* blocks = reinterpret_cast<k::gather_block_desc*>(list + blocks_at);
            k::gather_describe_blocks(g, g.segments, g.first, blocks);
            // Without descriptors (the blocks scan the list) at the runtime's block size only:
            // gpu_kernels_test covers that path's other cases.
            for (const bool described : {true, false}) {
                if (!described && per_block != 4095) continue;
                dev_buffer y(d, want.size() * 4);
                g.y = y.get();
                g.blocks = described ? blocks : nullptr;
                gpu_runner r(d);
                EXPECT(r.run(k::gather_kernel, g, k::gather_grid(g)));
                const auto got = y.read<float>();
                EXPECT(std::memcmp(got.data(), want.data(), want.size() * 4) == 0)
                    << "gather of " << fragment << "-byte fragments, " << per_block << " bytes per block, "
                    << (described ? "with" : "without") << " descriptors";
            }
        }
        d.free(list);
    }
    d.unregister_host(arena.base());
    gpu::gpu_device_stats st{};
    REQUIRE(gpu::gpu_device_stats_of(d, st));
    EXPECT(st.registered_ranges == 0u);
}

void preemption_property(gpu::restore_mode mode) {
    gpu::device& d = *the_device();
    // A BE task and an RT task as chains of GEMMs.
    // The emulation runs a 128^3 GEMM in ~0.15 s: a shorter chain and fewer trials there keep
    // the test to seconds while every trial still lands RT tasks inside a running BE task.
    const int64_t n = emulated() ? 128 : 1024;
    const int chain = emulated() ? 12 : 40, trials = emulated() ? 4 : 10;
    gemm_chain be(d, chain, n, 41, 128), rt(d, 4, n, 42, 128);
    gpu::scheduler_options so;
    so.restore = mode;
    so.vhq_capacity = 4;
    gpu::scheduler sched(d, so);
    // Undisturbed references, through the scheduler too.
    REQUIRE(sched.wait(sched.submit(be.task(gpu::task_class::be))).status == gpu::task_status::completed);
    REQUIRE(sched.wait(sched.submit(rt.task(gpu::task_class::rt))).status == gpu::task_status::completed);
    const auto want_be = be.output(), want_rt = rt.output();
    // How long the BE task runs alone: RT tasks arrive at random moments inside it.
    be.clear_outputs();
    const auto t0 = clk::now();
    REQUIRE(sched.wait(sched.submit(be.task(gpu::task_class::be))).status == gpu::task_status::completed);
    const double be_us = ms_since(t0) * 1000;
    std::printf("  BE task alone: %.0f us (%d GEMMs %lld^3)\n", be_us, chain, (long long)be.n);
    std::mt19937 rng(3);
    uint32_t preempted = 0;
    uint64_t reexecuted = 0;
    for (int trial = 0; trial < trials; ++trial) {
        be.clear_outputs();
        const gpu::task_id b = sched.submit(be.task(gpu::task_class::be));
        for (int k = 0; k < 3; ++k) {
            std::this_thread::sleep_for(std::chrono::microseconds(
                std::uniform_int_distribution<int>(int(be_us * 0.02), int(std::max(be_us * 0.3, 100.0)))(rng)));
            rt.clear_outputs();
            const gpu::task_result rr = sched.wait(sched.submit(rt.task(gpu::task_class::rt)));
            REQUIRE(rr.status == gpu::task_status::completed);
            EXPECT(rt.output() == want_rt) << "RT output differs (trial " << trial << ")";
        }
        const gpu::task_result br = sched.wait(b);
        REQUIRE(br.status == gpu::task_status::completed);
        preempted += br.preemptions > 0;
        reexecuted += br.reexecuted_kernels;
        const auto got = be.output();
        EXPECT(std::memcmp(got.data(), want_be.data(), got.size() * 4) == 0)
            << "BE output differs after " << br.preemptions << " preemptions, " << br.reexecuted_kernels
            << " re-executed kernels";
    }
    std::printf("  %u of %d BE runs preempted, %llu kernels re-executed\n", preempted, trials,
                (unsigned long long)reexecuted);
    EXPECT(preempted > 0) << "no BE run was ever preempted: the test proves nothing";
    sched.shutdown();
}

GPU_TEST(scheduler_preemption_keeps_results_exact_restore) { preemption_property(gpu::restore_mode::exact); }
GPU_TEST(scheduler_preemption_keeps_results_approximate_restore) {
    preemption_property(gpu::restore_mode::approximate);
}

GPU_TEST(scheduler_fails_task_with_kernel_the_gpu_lacks) {
    gpu::device& d = *the_device();
    static const gpu::kernel_info nowhere = {"no_such_kernel", nullptr, 256, 0, 0, 0};
    gpu::scheduler sched(d);
    gpu::task t;
    t.cls = gpu::task_class::be;
    t.launches.push_back(gpu::task_launch::make(&nowhere, int(0), 1));
    const gpu::task_result r = sched.wait(sched.submit(std::move(t)));
    EXPECT(r.status == gpu::task_status::failed) << "status " << int(r.status);
    // The scheduler goes on serving.
    const auto s = spin(50);
    gpu::task ok;
    ok.cls = gpu::task_class::rt;
    ok.launches.push_back(gpu::task_launch::make(&spin_info, s, 1));
    EXPECT(sched.wait(sched.submit(std::move(ok))).status == gpu::task_status::completed);
}

}  // namespace

int main(int argc, char** argv) { return gpu_test::main(argc, argv, make_the_device); }
