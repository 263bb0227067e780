// The device contract (preempt/device.h), run over every backend this build has
// (preempt/backend_registry.h: cpu, and cuda, hip or the SIMT emulation of cuda), the same
// cases on each, in the manner of ggml's test-backend-ops: a backend that breaks the contract
// the scheduler relies on fails here, whichever it is. A GPU backend on a machine without a
// GPU is reported as skipped; the test fails only on a broken contract.
//
// The cases use kernels by name from the kernel library (spin_kernel, copy_kernel), which every
// backend has. Backend-specific behaviour (timings, vendor stats) stays in cpu_device_test and
// tests/gpu.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "libml/kernels/kernels.h"
#include "preempt/backend_registry.h"
#include "tests/gpu/gpu_util.h"

namespace {

namespace gpu = reefline::gpu;
namespace k = reefline::ml::kernels;
using clk = std::chrono::steady_clock;

// The backend under test (main() runs every case once per backend).
const gpu::backend_entry* g_backend = nullptr;
gpu::device* g_device = nullptr;

gpu::device& dev() { return *g_device; }

using gpu_test::ms_since;

using gpu_test::eventually;

// A spin launch that records where each block ran (tests/gpu/gpu_util.h), at a level.
using gpu_test::spin_kernel;
gpu::launch at_level(const spin_kernel& k, gpu::task_words* w, uint32_t index, uint32_t level, uint32_t epoch) {
    gpu::launch l = k.at(w, index);
    l.level = level;
    l.epoch = epoch;
    return l;
}

// A stream and a task of its own.
struct queue {
    gpu::device& d;
    gpu::stream* s;
    gpu::task_words* w;
    explicit queue(gpu::device& dv, int priority) : d(dv), s(dv.create_stream(priority)), w(dv.task_words_create()) {
        REQUIRE(s != nullptr && w != nullptr);
    }
    ~queue() {
        d.synchronize(s);
        d.task_words_destroy(w);
        d.stream_destroy(s);
    }
};

// Blocks per launch: enough to cover a few units, few enough for the emulation.
uint32_t small_grid() { return std::clamp<uint32_t>(dev().caps().compute_units, 1, 4); }

GPU_TEST(caps_describe_the_device) {
    const gpu::device_caps c = dev().caps();
    EXPECT(!c.name.empty());
    EXPECT(c.compute_units >= 1u);
    EXPECT(c.max_queue_depth >= 1u);
    EXPECT(c.highest_priority <= c.lowest_priority) << "higher priority is the lower number";
    EXPECT(c.gpu == g_backend->gpu) << "the registry and the device disagree on whether it is a GPU";
    if (c.gpu) EXPECT(c.memory_total_bytes >= c.memory_free_bytes && c.memory_total_bytes > 0);
}

GPU_TEST(memory_of_every_kind_round_trips) {
    const size_t n = (1u << 20) + 13;
    std::vector<uint8_t> in(n), out(n, 0);
    for (size_t i = 0; i < n; ++i) in[i] = uint8_t(i * 131 + 7);
    for (auto kind : {gpu::memory_kind::device, gpu::memory_kind::pinned, gpu::memory_kind::host_mapped}) {
        void* p = dev().alloc(n, kind);
        REQUIRE(p != nullptr) << "kind " << int(kind);
        EXPECT(reinterpret_cast<uintptr_t>(p) % 64 == 0) << "allocations are 64-byte aligned";
        dev().copy_to_device(p, in.data(), n);
        std::fill(out.begin(), out.end(), 0);
        dev().copy_to_host(out.data(), p, n);
        EXPECT(out == in) << "kind " << int(kind);
        if (kind != gpu::memory_kind::device) EXPECT(std::memcmp(p, in.data(), n) == 0) << "host memory reads in place";
        dev().free(p);
    }
    EXPECT(dev().alloc(size_t(1) << 50) == nullptr) << "an impossible allocation returns null";
}

// Registered host memory (how the gather reads packet payloads) is what kernels read, in place.
GPU_TEST(kernels_read_registered_host_memory) {
    const int64_t n = 4096 + 5;
    const size_t bytes = (size_t(n) * 4 + 4095) / 4096 * 4096;  // whole pages, as the packet memory
    float* x = static_cast<float*>(std::aligned_alloc(4096, bytes));
    REQUIRE(x != nullptr);
    for (int64_t i = 0; i < n; ++i) x[i] = float(i) * 0.5f - 3;
    REQUIRE(dev().register_host(x, bytes));
    float* y = static_cast<float*>(dev().alloc(size_t(n) * 4));
    REQUIRE(y != nullptr);
    k::copy_args a{};
    a.x = x;
    a.y = y;
    a.shape.rank = 1;
    a.shape.dims[0] = n;
    a.x_strides[0] = a.y_strides[0] = 1;
    a.element_bytes = 4;
    a.per_block = 1000;
    queue q(dev(), dev().caps().lowest_priority);
    const uint32_t grid = uint32_t(k::copy_grid(a));
    dev().launch(q.s, gpu::launch{&k::copy_kernel, &a, uint32_t(sizeof a), grid, 0, grid, q.w, 0});
    dev().synchronize(q.s);
    EXPECT(q.w->completed.load() == 1u);
    std::vector<float> got(static_cast<size_t>(n));
    dev().copy_to_host(got.data(), y, size_t(n) * 4);
    EXPECT(std::equal(got.begin(), got.end(), x)) << "the copy kernel read registered memory wrong";
    dev().free(y);
    dev().unregister_host(x);
    std::free(x);
}

// Launches on a stream run in order; the task's counter says how many completed; events and
// queued() see the same order.
GPU_TEST(a_stream_runs_its_launches_in_order) {
    queue q(dev(), dev().caps().lowest_priority);
    spin_kernel a(dev(), 1, 20000), b(dev(), 1, 1000), c(dev(), 1, 1000);
    gpu::event* e1 = dev().event_create();
    gpu::event* e2 = dev().event_create();
    EXPECT(dev().event_query(e1)) << "an event never recorded has passed";
    dev().launch(q.s, a.at(q.w, 0));
    dev().event_record(e1, q.s);
    dev().launch(q.s, b.at(q.w, 1));
    dev().launch(q.s, c.at(q.w, 2));
    dev().event_record(e2, q.s);
    EXPECT(dev().queued(q.s) <= dev().caps().max_queue_depth);
    dev().event_synchronize(e1);
    EXPECT(dev().event_query(e1));
    EXPECT(a.finished() == 1u);
    EXPECT(q.w->completed.load() >= 1u);
    dev().synchronize(q.s);
    EXPECT(dev().event_query(e2));
    EXPECT(dev().queued(q.s) == 0u);
    EXPECT(q.w->completed.load() == 3u) << q.w->completed.load();
    EXPECT(b.finished() == 1u && c.finished() == 1u);
    dev().event_destroy(e1);
    dev().event_destroy(e2);
}

// A raised task flag stops the task's running and queued launches without advancing its
// counter; lowered, the task runs again (restore).
GPU_TEST(a_raised_flag_stops_running_and_queued_launches) {
    queue q(dev(), dev().caps().lowest_priority);
    const uint32_t grid = small_grid();
    spin_kernel longk(dev(), grid, 2e6);  // 2 s blocks, unless stopped
    for (uint32_t i = 0; i < 4; ++i) dev().launch(q.s, longk.at(q.w, i));
    REQUIRE(eventually([&] { return longk.started() > 0; }, 10000)) << "the launch never started";
    const auto t0 = clk::now();
    dev().set_task_flag(q.w, 1);
    dev().synchronize(q.s);
    const double ms = ms_since(t0);
    std::printf("  flag raised -> running and queued launches gone: %.2f ms\n", ms);
    EXPECT(ms < 1500) << "a flagged launch ran on: " << ms << " ms";
    EXPECT(longk.finished() == 0u);
    EXPECT(q.w->completed.load() == 0u) << "a preempted launch advanced the counter";
    dev().set_task_flag(q.w, 0);
    spin_kernel quick(dev(), grid, 100);
    dev().launch(q.s, quick.at(q.w, 0));
    dev().synchronize(q.s);
    EXPECT(q.w->completed.load() == 1u) << "the restored task did not run";
    EXPECT(quick.finished() == grid);
}

// Preemption levels: a raise stops the level's launches made before it, and only those.
GPU_TEST(a_raised_level_stops_its_older_launches_only) {
    if (!dev().has_levels()) SKIP_TEST("this backend has no preemption levels");
    queue a(dev(), dev().caps().lowest_priority), b(dev(), dev().caps().lowest_priority);
    const uint32_t grid = small_grid();
    spin_kernel longk(dev(), grid, 2e6), other(dev(), 1, 3000), quick(dev(), grid, 100);
    const uint32_t e1 = dev().level_epoch(1), e2 = dev().level_epoch(2);
    for (uint32_t i = 0; i < 4; ++i) dev().launch(a.s, at_level(longk, a.w, i, 1, e1));
    dev().launch(b.s, at_level(other, b.w, 0, 2, e2));
    REQUIRE(eventually([&] { return longk.started() > 0; }, 10000));
    const auto t0 = clk::now();
    dev().raise_levels(1u << 1);
    dev().synchronize(a.s);
    const double ms = ms_since(t0);
    std::printf("  level raised -> its launches gone: %.2f ms\n", ms);
    EXPECT(ms < 1500) << ms << " ms";
    EXPECT(dev().level_epoch(1) == e1 + 1 && dev().level_epoch(2) == e2);
    EXPECT(a.w->completed.load() == 0u);
    EXPECT(a.w->preempt.load() == 0u) << "a level raise writes no task flag";
    dev().synchronize(b.s);
    EXPECT(b.w->completed.load() == 1u) << "level 2 was not raised: its launch runs to its end";
    dev().launch(a.s, at_level(quick, a.w, 0, 1, dev().level_epoch(1)));
    dev().synchronize(a.s);
    EXPECT(a.w->completed.load() == 1u) << "a launch made after the raise must run";
}

// DKP: every pad is accounted once (completed, cut or skipped), and a task's pads word is 0
// once none can run.
GPU_TEST(padded_launches_account_for_every_pad) {
    if (!dev().pads_launches()) SKIP_TEST("this backend does not pad launches");
    queue rt(dev(), dev().caps().highest_priority), be(dev(), dev().caps().lowest_priority);
    const uint32_t grid = small_grid();
    spin_kernel rtk(dev(), grid, 3000), pad(dev(), 4 * grid, 500);
    const auto before = dev().padding_stats();
    const gpu::launch pads[1] = {pad.at(be.w, 0)};
    dev().launch_padded(rt.s, rtk.at(rt.w, 0), pads, 1);
    dev().synchronize(rt.s);
    EXPECT(rt.w->completed.load() == 1u) << "the padded launch itself must complete";
    EXPECT(eventually([&] { return be.w->pads.load() == 0u; }, 10000)) << "a pad still counted after its launch ended";
    const auto after = dev().padding_stats();
    const uint64_t accepted = after.pads - before.pads;
    const uint64_t accounted = (after.pads_completed - before.pads_completed) + (after.pads_cut - before.pads_cut) +
                               (after.pads_skipped - before.pads_skipped);
    EXPECT(accepted == accounted) << accepted << " pads accepted, " << accounted << " accounted";
    EXPECT(after.padded_launches >= before.padded_launches + (accepted ? 1 : 0));
    // The BE task's counter moved only if its pad ran whole.
    EXPECT(be.w->completed.load() == uint32_t(after.pads_completed - before.pads_completed));
    EXPECT(be.w->completed.load() == 0u || pad.finished() == pad.grid);
}

// Spatial shares: what unit_grant_of says a set gets is where its launches run.
GPU_TEST(a_bound_stream_runs_where_its_grant_says) {
    if (!dev().has_unit_sets()) SKIP_TEST("this backend has no unit sets");
    const uint32_t units = dev().caps().compute_units;
    const gpu::unit_shares_info shares = dev().unit_shares();
    EXPECT(!shares.mechanism.empty());
    if (!shares.usable) SKIP_TEST("unit sets unusable here: " + shares.why);
    const gpu::unit_grant all = dev().unit_grant_of(gpu::every_unit_set(units));
    EXPECT(!all.bound || all.count == units) << "every unit: bound to " << all.count << " of " << units;
    if (units < 2) SKIP_TEST("one compute unit: no proper subset");
    const uint64_t first = 1;  // the first unit (group)
    const gpu::unit_grant g = dev().unit_grant_of(first);
    std::printf("  set {0}: %s %u unit(s)%s (%s)\n", g.bound ? "bound to" : "unbound,", g.count, g.exact ? ", exact" : "",
                g.note.c_str());
    if (!g.bound) SKIP_TEST("the backend could not bind {0}: " + g.note);
    EXPECT(g.count >= 1u && g.count <= units);
    if (g.exact) EXPECT(g.units.size() == g.count);
    queue q(dev(), dev().caps().lowest_priority);
    dev().stream_set_units(q.s, first);
    spin_kernel s(dev(), 2 * small_grid(), 1000);
    dev().launch(q.s, s.at(q.w, 0));
    dev().synchronize(q.s);
    EXPECT(q.w->completed.load() == 1u);
    EXPECT(s.finished() == s.grid);
    if (g.exact)
        EXPECT(s.outside(first, gpu::unit_group(units)) == 0u) << "blocks ran outside the granted units";
    else
        EXPECT(s.units_used() <= g.count) << s.units_used() << " units used, " << g.count << " granted";
    dev().stream_set_units(q.s, 0);  // back to every unit
}

GPU_TEST(kernel_resources_are_sane_where_known) {
    gpu::kernel_resources r;
    if (!dev().kernel_resources_of(&gpu_test::gemm_info, r))
        SKIP_TEST("this backend knows only kernel_info's nominal figures");
    EXPECT(r.threads_per_block > 0u);
    EXPECT(r.blocks_per_unit > 0u);
}

}  // namespace

int main(int argc, char** argv) {
    const char* filter = argc > 1 ? argv[1] : "";
    int failed = 0, ran = 0;
    gpu_test::run_counts total;
    std::string summary;
    for (const gpu::backend_entry& b : gpu::backends()) {
        std::unique_ptr<gpu::device> d;
        try {
            gpu::backend_options o;
            o.compute_units = 2;  // the cpu backend: a proper subset exists even on a 2-core machine
            o.pin_units = false;
            d = b.make(o);
        } catch (const gpu::no_device_error& e) {
            std::printf("backend %s: skipped (%s)\n", b.name, e.what());
            summary += std::string(" ") + b.name + ": skipped;";
            continue;
        }
        g_backend = &b;
        g_device = d.get();
        std::printf("backend %s: %s, %u compute units%s\n", b.name, d->caps().name.c_str(), d->caps().compute_units,
                    b.emulated ? " (emulated)" : "");
        const gpu_test::run_counts n = gpu_test::run_registered(filter, std::string(b.name) + ": ");
        failed += n.failed;
        total.passed += n.passed;
        total.failed += n.failed;
        total.skipped += n.skipped;
        ++ran;
        summary += " " + std::string(b.name) + ": " + std::to_string(n.passed) + " passed, " + std::to_string(n.failed) +
                   " failed, " + std::to_string(n.skipped) + " skipped;";
        g_device = nullptr;
        d.reset();
    }
    gpu_test::run_at_end();
    std::printf("backend_contract:%s\n", summary.c_str());
    std::printf("gpu tests: %d passed, %d failed, %d skipped\n", total.passed, total.failed, total.skipped);
    return failed ? 1 : ran ? 0 : 77;
}
