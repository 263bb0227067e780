// The cpu device backend (preempt/cpu_device.cc) against the device interface's contract:
// block slices, in-order streams, priorities, completion counters, preemption flags with
// exact restore, bounded queues, events, teardown. Orderings are asserted with generous
// margins so that the tests hold on a loaded 2-core machine; latencies are printed, not
// asserted tightly.
#include "preempt/device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <sched.h>

namespace {

using namespace reefline::gpu;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

std::unique_ptr<device> make(uint32_t units, uint32_t depth = 64, size_t scratch = 1u << 20) {
    cpu_device_options o;
    o.compute_units = units;
    o.queue_depth = depth;
    o.scratch_per_unit = scratch;
    return make_cpu_device(o);
}

template <typename A>
launch make_launch(const kernel_info& k, const A& args, uint32_t grid, task_words* task = nullptr,
                   uint32_t kernel_index = 0) {
    return launch{&k, &args, static_cast<uint32_t>(sizeof(A)), grid, 0, grid, task, kernel_index};
}

// Waits for `pred` up to `limit`; true if it held.
template <typename P>
bool eventually(P pred, std::chrono::milliseconds limit = 10s) {
    const auto end = clk::now() + limit;
    while (!pred()) {
        if (clk::now() > end) return false;
        std::this_thread::sleep_for(100us);
    }
    return true;
}

kernel_info kernel(const char* name, cpu_block_fn fn, size_t scratch = 0) {
    return kernel_info{name, fn, 128, 32, 0, scratch};
}

// ---- kernels ----------------------------------------------------------------------------------

// out[b] = in[b] * 2, counting writes per element.
struct double_args {
    const float* in;
    float* out;
    std::atomic<uint32_t>* writes;
    uint32_t expect_grid;
    std::atomic<uint32_t>* bad_ctx;
};
bool double_block(const void* a, const block_context& ctx) {
    auto& p = *static_cast<const double_args*>(a);
    if (ctx.grid != p.expect_grid) p.bad_ctx->fetch_add(1);
    p.out[ctx.block] = p.in[ctx.block] * 2.0f;
    p.writes[ctx.block].fetch_add(1);
    return true;
}
const kernel_info k_double = kernel("double", double_block);

// Records a global sequence number at block entry and exit, sleeping in between.
struct record_args {
    std::atomic<uint64_t>* seq;
    uint64_t* enter;  // per block
    uint64_t* exit;
    uint32_t sleep_us;
};
bool record_block(const void* a, const block_context& ctx) {
    auto& p = *static_cast<const record_args*>(a);
    p.enter[ctx.block] = p.seq->fetch_add(1) + 1;
    if (p.sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(p.sleep_us));
    p.exit[ctx.block] = p.seq->fetch_add(1) + 1;
    return true;
}
const kernel_info k_record = kernel("record", record_block);

// Waits until *gate > index (or 20 s), counting entries and runs.
struct gate_args {
    std::atomic<uint32_t>* gate;
    uint32_t index;
    std::atomic<uint32_t>* entered;
    std::atomic<uint32_t>* ran;
};
bool gate_block(const void* a, const block_context&) {
    auto& p = *static_cast<const gate_args*>(a);
    p.entered->fetch_add(1);
    const auto end = clk::now() + 20s;
    while (p.gate->load() <= p.index) {
        if (clk::now() > end) return false;
        std::this_thread::sleep_for(50us);
    }
    p.ran->fetch_add(1);
    return true;
}
const kernel_info k_gate = kernel("gate", gate_block);

// All `n` blocks (of any launches sharing `arrived`) must be running at once to pass.
struct meet_args {
    std::atomic<uint32_t>* arrived;
    uint32_t n;
    std::atomic<uint32_t>* met;
};
bool meet_block(const void* a, const block_context&) {
    auto& p = *static_cast<const meet_args*>(a);
    p.arrived->fetch_add(1);
    const auto end = clk::now() + 5s;
    while (p.arrived->load() < p.n && clk::now() < end) std::this_thread::sleep_for(20us);
    if (p.arrived->load() >= p.n) p.met->fetch_add(1);
    return true;
}
const kernel_info k_meet = kernel("meet", meet_block);

// Checks that the task's counter equals the kernel's index when a block starts.
struct order_args {
    std::atomic<uint32_t>* violations;
    std::atomic<uint32_t>* blocks;
    uint32_t index;
};
bool order_block(const void* a, const block_context& ctx) {
    auto& p = *static_cast<const order_args*>(a);
    if (ctx.task->completed.load(std::memory_order_acquire) != p.index) p.violations->fetch_add(1);
    p.blocks->fetch_add(1);
    return true;
}
const kernel_info k_order = kernel("order", order_block);

// Long, deterministic, preemptible compute: every block owns kElems elements of `in` and
// writes them to `out` after `chunks` chunks of iterations, checking the flag between chunks.
// Idempotent: reads `in`, writes only `out`.
constexpr uint32_t kElems = 8;
struct long_args {
    const float* in;
    float* out;
    uint32_t chunks;
    float k;
    std::atomic<uint32_t>* entered;      // blocks entered
    std::atomic<uint32_t>* interrupted;  // blocks that stopped at a check point
    std::atomic<uint32_t>* chunks_done;  // per block
};
inline void long_chunk(float* x, float k) {
    for (int it = 0; it < 48; ++it)
        for (uint32_t e = 0; e < kElems; ++e) x[e] = x[e] * 0.75f + 1.0f / (1.0f + x[e] * x[e]) + k;
}
bool long_block(const void* a, const block_context& ctx) {
    auto& p = *static_cast<const long_args*>(a);
    if (p.entered) p.entered->fetch_add(1);
    float x[kElems];
    for (uint32_t e = 0; e < kElems; ++e) x[e] = p.in[ctx.block * kElems + e];
    for (uint32_t c = 0; c < p.chunks; ++c) {
        if (ctx.preempted()) {
            if (p.interrupted) p.interrupted->fetch_add(1);
            return false;
        }
        long_chunk(x, p.k);
        if (p.chunks_done) p.chunks_done[ctx.block].store(c + 1, std::memory_order_relaxed);
    }
    for (uint32_t e = 0; e < kElems; ++e) p.out[ctx.block * kElems + e] = x[e];
    return true;
}
const kernel_info k_long = kernel("long", long_block);

// Stores the time its block started.
struct stamp_args {
    std::atomic<int64_t>* t;
};
bool stamp_block(const void* a, const block_context&) {
    static_cast<const stamp_args*>(a)->t->store(now_ns(), std::memory_order_release);
    return true;
}
const kernel_info k_stamp = kernel("stamp", stamp_block);

// ---- basics -----------------------------------------------------------------------------------

TEST(CpuDevice, CapsAndDefaults) {
    auto d = make_cpu_device();
    const auto hc = std::thread::hardware_concurrency();
    const device_caps c = d->caps();
    EXPECT_EQ(c.compute_units, hc > 1 ? hc - 1 : 1u);
    EXPECT_EQ(c.max_queue_depth, 64u);
    EXPECT_LT(c.highest_priority, c.lowest_priority);  // lower number = higher priority
    EXPECT_NE(c.name.find("cpu"), std::string::npos);
    auto d3 = make(3, 16);
    EXPECT_EQ(d3->caps().compute_units, 3u);
    EXPECT_EQ(d3->caps().max_queue_depth, 16u);
}

TEST(CpuDevice, MemoryAndTaskWords) {
    auto d = make(1);
    const auto& ops = d->ops();
    for (auto kind : {memory_kind::device, memory_kind::pinned, memory_kind::host_mapped}) {
        for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{1} << 20}) {
            void* p = d->alloc(n, kind);
            ASSERT_NE(p, nullptr);
            EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
            std::vector<uint8_t> src(n), back(n);
            for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
            ops.copy_to_device(d.get(), p, src.data(), n);
            ops.copy_to_host(d.get(), back.data(), p, n);
            EXPECT_EQ(src, back);
            d->free(p);
        }
    }
    std::vector<uint8_t> host(8192);
    EXPECT_TRUE(ops.register_host(d.get(), host.data(), host.size()));
    ops.unregister_host(d.get(), host.data());

    task_words* w = ops.task_words_create(d.get());
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w) % 64, 0u);
    EXPECT_EQ(w->preempt.load(), 0u);
    EXPECT_EQ(w->completed.load(), 0u);
    ops.task_words_destroy(d.get(), w);
}

TEST(CpuDevice, GridWritesEveryElementOnce) {
    auto d = make(3);
    stream* s = d->create_stream(0);
    constexpr uint32_t n = 1000;
    auto* in = static_cast<float*>(d->alloc(n * sizeof(float)));
    auto* out = static_cast<float*>(d->alloc(n * sizeof(float)));
    for (uint32_t i = 0; i < n; ++i) {
        in[i] = static_cast<float>(i) + 0.5f;
        out[i] = -1.0f;
    }
    std::vector<std::atomic<uint32_t>> writes(n);
    std::atomic<uint32_t> bad{0};
    double_args a{in, out, writes.data(), n, &bad};
    d->launch(s, make_launch(k_double, a, n));
    d->synchronize(s);
    for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(writes[i].load(), 1u) << i;
        ASSERT_EQ(out[i], in[i] * 2.0f) << i;
    }
    EXPECT_EQ(bad.load(), 0u);

    // Slices run exactly their blocks, with the whole grid in the context.
    for (auto& w : writes) w = 0;
    const uint32_t slices[][2] = {{100, 50}, {0, 1}, {999, 1}, {500, 0}, {150, 350}};
    for (auto [off, cnt] : slices) d->launch(s, launch{&k_double, &a, sizeof a, n, off, cnt, nullptr, 0});
    d->synchronize(s);
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t expect = 0;
        for (auto [off, cnt] : slices) expect += (i >= off && i < off + cnt);
        ASSERT_EQ(writes[i].load(), expect) << i;
    }
    EXPECT_EQ(bad.load(), 0u);
    d->free(in);
    d->free(out);
}

TEST(CpuDevice, ArgsAreCopiedAtLaunch) {
    struct big_args {
        uint32_t words[300];  // over the inline size: heap-copied
        std::atomic<uint32_t>* ok;
    };
    struct small_args {
        uint32_t v;
        std::atomic<uint32_t>* ok;
    };
    static const kernel_info k_big = kernel("big", [](const void* a, const block_context&) {
        auto& p = *static_cast<const big_args*>(a);
        bool good = true;
        for (uint32_t i = 0; i < 300; ++i) good &= p.words[i] == i * 3 + p.words[0];
        if (good) p.ok->fetch_add(1);
        return true;
    });
    static const kernel_info k_small = kernel("small", [](const void* a, const block_context&) {
        auto& p = *static_cast<const small_args*>(a);
        if (p.v == 42) p.ok->fetch_add(1);
        return true;
    });
    auto d = make(2, 8);
    stream* s = d->create_stream(0);
    std::atomic<uint32_t> gate{0}, entered{0}, ran{0}, ok{0};
    gate_args g{&gate, 0, &entered, &ran};
    d->launch(s, make_launch(k_gate, g, 1));  // holds the stream until the args are gone
    for (uint32_t r = 0; r < 20; ++r) {
        auto big = std::make_unique<big_args>();
        for (uint32_t i = 0; i < 300; ++i) big->words[i] = i * 3 + r;
        big->ok = &ok;
        d->launch(s, make_launch(k_big, *big, 2));
        std::memset(big.get(), 0xff, sizeof(big_args) - sizeof(void*));
        small_args sm{42, &ok};
        d->launch(s, make_launch(k_small, sm, 1));
        sm.v = 7;
        if (r == 2) gate = 1;
    }
    d->synchronize(s);
    EXPECT_EQ(ok.load(), 20u * 3);
}

TEST(CpuDevice, ScratchPerComputeUnit) {
    struct scratch_args {
        std::atomic<uint32_t>* bad;
        std::atomic<uintptr_t>* by_worker;
        uint32_t units;
        size_t size;
    };
    static const kernel_info k_scratch = kernel("scratch", [](const void* a, const block_context& ctx) {
        auto& p = *static_cast<const scratch_args*>(a);
        if (ctx.worker >= p.units || !ctx.scratch || ctx.scratch_size != p.size ||
            reinterpret_cast<uintptr_t>(ctx.scratch) % 64 != 0) {
            p.bad->fetch_add(1);
            return true;
        }
        uintptr_t expect = 0;
        if (!p.by_worker[ctx.worker].compare_exchange_strong(expect, reinterpret_cast<uintptr_t>(ctx.scratch)) &&
            expect != reinterpret_cast<uintptr_t>(ctx.scratch))
            p.bad->fetch_add(1);  // a unit's scratch must stay the same
        auto* b = static_cast<uint32_t*>(ctx.scratch);
        const size_t n = p.size / sizeof(uint32_t);
        for (size_t i = 0; i < n; i += 997) b[i] = ctx.block ^ static_cast<uint32_t>(i);
        std::this_thread::sleep_for(50us);
        for (size_t i = 0; i < n; i += 997)
            if (b[i] != (ctx.block ^ static_cast<uint32_t>(i))) p.bad->fetch_add(1);  // shared!
        return true;
    }, 4096);
    constexpr uint32_t units = 3;
    auto d = make(units, 64, 256 << 10);
    stream* s = d->create_stream(0);
    std::atomic<uint32_t> bad{0};
    std::atomic<uintptr_t> by_worker[units] = {};
    scratch_args a{&bad, by_worker, units, 256 << 10};
    d->launch(s, make_launch(k_scratch, a, 300));
    d->synchronize(s);
    EXPECT_EQ(bad.load(), 0u);
    // A kernel needing more scratch than a unit has is refused.
    static const kernel_info k_huge = kernel("huge", k_scratch.cpu, size_t{1} << 30);
    EXPECT_THROW(d->launch(s, make_launch(k_huge, a, 1)), std::invalid_argument);
    // So is a slice outside the grid.
    EXPECT_THROW(d->launch(s, launch{&k_scratch, &a, sizeof a, 10, 5, 6, nullptr, 0}), std::invalid_argument);
}

// Each unit on a CPU of its own where the units are as many as the creating thread's CPUs, as
// the scheduler is not trusted to spread units woken together; unpinned when asked to be, and
// when the units are fewer (free to leave a busy CPU) or more than the CPUs.
struct affinity_args {
    std::atomic<int>* cpu_of;        // per worker: the only CPU it may run on, or -(CPUs it may)
    std::atomic<uint32_t>* blocks;   // per worker
};
bool affinity_block(const void* a, const block_context& ctx) {
    auto& p = *static_cast<const affinity_args*>(a);
    cpu_set_t set;
    CPU_ZERO(&set);
    int first = -1;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
            if (CPU_ISSET(c, &set)) first = c;
    p.cpu_of[ctx.worker].store(CPU_COUNT(&set) == 1 ? first : -CPU_COUNT(&set));
    p.blocks[ctx.worker].fetch_add(1);
    std::this_thread::sleep_for(100us);
    return true;
}
const kernel_info k_affinity = kernel("affinity", affinity_block);

std::vector<int> thread_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

// Where each of the device's units ran a block of a launch spread over all of them.
std::vector<int> unit_cpus(const cpu_device_options& o) {
    auto d = make_cpu_device(o);
    stream* s = d->create_stream(0);
    std::vector<std::atomic<int>> cpu_of(o.compute_units);
    std::vector<std::atomic<uint32_t>> blocks(o.compute_units);
    for (auto& c : cpu_of) c = INT32_MIN;
    affinity_args a{cpu_of.data(), blocks.data()};
    d->launch(s, make_launch(k_affinity, a, 40 * o.compute_units));
    d->synchronize(s);
    std::vector<int> out;
    for (uint32_t u = 0; u < o.compute_units; ++u) {
        EXPECT_GT(blocks[u].load(), 0u) << "unit " << u << " ran no block";
        out.push_back(cpu_of[u].load());
    }
    return out;
}

TEST(CpuDevice, ComputeUnitsPinnedToCpusOfTheirOwn) {
    const std::vector<int> cpus = thread_cpus();
    ASSERT_FALSE(cpus.empty());
    const int n = int(cpus.size());
    const int unpinned = n == 1 ? cpus[0] : -n;  // what a unit reads where nothing pinned it
    cpu_device_options o;
    o.scratch_per_unit = 0;
    o.compute_units = uint32_t(n);
    EXPECT_EQ(unit_cpus(o), cpus);

    o.pin_units = false;
    for (int c : unit_cpus(o)) EXPECT_EQ(c, unpinned) << "pinned though asked not to be";

    o.pin_units = true;
    for (const uint32_t units : {uint32_t(n + 1), uint32_t(n - 1)}) {
        if (units == 0) continue;
        o.compute_units = units;
        for (int c : unit_cpus(o)) EXPECT_EQ(c, unpinned) << units << " units on " << n << " CPUs";
    }

    // A creating thread confined to one CPU (the main lcore's after DPDK's EAL init): there.
    cpu_set_t one, all;
    CPU_ZERO(&one);
    CPU_ZERO(&all);
    CPU_SET(cpus.back(), &one);
    for (int c : cpus) CPU_SET(c, &all);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    o.compute_units = 1;
    const std::vector<int> confined = unit_cpus(o);
    ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
    EXPECT_EQ(confined[0], cpus.back());
}

// ---- ordering and concurrency -----------------------------------------------------------------

TEST(CpuDevice, StreamIsInOrder) {
    auto d = make(3);
    stream* s = d->create_stream(2);
    std::atomic<uint64_t> seq{0};
    constexpr uint32_t launches = 6, blocks = 6;
    std::vector<std::vector<uint64_t>> enter(launches, std::vector<uint64_t>(blocks)),
        exit(launches, std::vector<uint64_t>(blocks));
    std::vector<record_args> args(launches);
    for (uint32_t i = 0; i < launches; ++i) {
        args[i] = record_args{&seq, enter[i].data(), exit[i].data(), i % 2 ? 0u : 2000u};
        d->launch(s, make_launch(k_record, args[i], blocks));
    }
    d->synchronize(s);
    for (uint32_t i = 1; i < launches; ++i) {
        const uint64_t prev_end = *std::max_element(exit[i - 1].begin(), exit[i - 1].end());
        const uint64_t start = *std::min_element(enter[i].begin(), enter[i].end());
        EXPECT_GT(start, prev_end) << "launch " << i << " started before launch " << i - 1 << " finished";
    }
}

TEST(CpuDevice, CompletionCounterAdvancesInOrder) {
    auto d = make(3);
    const auto& ops = d->ops();
    stream* s = d->create_stream(0);
    task_words* w = ops.task_words_create(d.get());
    std::atomic<uint32_t> violations{0}, blocks{0};
    std::vector<order_args> args(40);
    for (uint32_t i = 0; i < 3; ++i) {
        args[i] = order_args{&violations, &blocks, i};
        d->launch(s, make_launch(k_order, args[i], 5, w, i));
        d->synchronize(s);
        EXPECT_EQ(w->completed.load(), i + 1);
    }
    for (uint32_t i = 3; i < 40; ++i) {
        args[i] = order_args{&violations, &blocks, i};
        d->launch(s, make_launch(k_order, args[i], 1 + i % 7, w, i));
    }
    d->synchronize(s);
    EXPECT_EQ(w->completed.load(), 40u);
    EXPECT_EQ(violations.load(), 0u);
    // A zero-block launch completes too.
    d->launch(s, launch{&k_order, &args[0], sizeof(order_args), 4, 0, 0, w, 40});
    d->synchronize(s);
    EXPECT_EQ(w->completed.load(), 41u);
    ops.task_words_destroy(d.get(), w);
}

TEST(CpuDevice, StreamsRunConcurrently) {
    auto d = make(2);
    for (auto [p0, p1] : {std::pair{3, 3}, std::pair{0, 7}}) {
        stream* a = d->create_stream(p0);
        stream* b = d->create_stream(p1);
        std::atomic<uint32_t> arrived{0}, met{0};
        meet_args m{&arrived, 2, &met};
        d->launch(a, make_launch(k_meet, m, 1));
        d->launch(b, make_launch(k_meet, m, 1));
        d->synchronize(a);
        d->synchronize(b);
        EXPECT_EQ(met.load(), 2u) << "priorities " << p0 << ", " << p1;
        d->stream_destroy(a);
        d->stream_destroy(b);
    }
    // Blocks of one launch run in parallel across units.
    auto d3 = make(3);
    stream* s = d3->create_stream(0);
    std::atomic<uint32_t> arrived{0}, met{0};
    meet_args m{&arrived, 3, &met};
    d3->launch(s, make_launch(k_meet, m, 3));
    d3->synchronize(s);
    EXPECT_EQ(met.load(), 3u);
}

// Spatial shares: a stream bound to units runs its blocks there only, other streams are not
// held back by it, and unbinding gives it every unit again.
struct where_args {
    std::atomic<uint32_t>* worker_of;  // per block: 1 + the unit that ran it
};
bool where_block(const void* a, const block_context& ctx) {
    auto& p = *static_cast<const where_args*>(a);
    p.worker_of[ctx.block].store(ctx.worker + 1);
    std::this_thread::sleep_for(100us);
    return true;
}
const kernel_info k_where = kernel("where", where_block);

// What a set gets is what it names (workers bind exactly); the whole device is no bind.
TEST(CpuDevice, AUnitSetIsGrantedItsVeryUnitsAndBindsAreCounted) {
    auto d = make(4);
    ASSERT_TRUE(d->has_unit_sets());
    const unit_grant g = d->unit_grant_of(0b0110);
    EXPECT_TRUE(g.bound && g.exact);
    EXPECT_EQ(g.count, 2u);
    EXPECT_EQ(g.units, (std::vector<uint32_t>{1, 2}));
    EXPECT_FALSE(d->unit_grant_of(0b1111).bound);
    EXPECT_FALSE(d->unit_grant_of(0b110000).bound);  // no unit of this device
    stream* s = d->create_stream(3);
    d->stream_set_units(s, 0b0110);
    d->stream_set_units(s, 0b1111);  // every unit: not a bind
    const unit_shares_info i = d->unit_shares();
    EXPECT_EQ(i.mechanism, "workers");
    EXPECT_TRUE(i.usable);
    EXPECT_EQ(i.binds, 1u);
    EXPECT_EQ(i.fallbacks, 0u);
    d->stream_destroy(s);
    auto one = make(1);
    EXPECT_FALSE(one->unit_shares().usable);
}

TEST(CpuDevice, StreamsBoundToUnitsRunOnlyThere) {
    auto d = make(4);
    ASSERT_TRUE(d->has_unit_sets());
    stream* a = d->create_stream(3);
    stream* b = d->create_stream(3);
    stream* c = d->create_stream(3);
    d->stream_set_units(a, 0b0110);  // units 1 and 2
    d->stream_set_units(b, 0b1000);  // unit 3
    constexpr uint32_t launches = 4, blocks = 24;
    std::vector<std::atomic<uint32_t>> wa(launches * blocks), wb(launches * blocks), wc(launches * blocks);
    std::vector<where_args> aa, ab, ac;
    for (uint32_t i = 0; i < launches; ++i) {
        aa.push_back({wa.data() + i * blocks});
        ab.push_back({wb.data() + i * blocks});
        ac.push_back({wc.data() + i * blocks});
    }
    for (uint32_t i = 0; i < launches; ++i) {
        d->launch(a, make_launch(k_where, aa[i], blocks));
        d->launch(b, make_launch(k_where, ab[i], blocks));
        d->launch(c, make_launch(k_where, ac[i], blocks));
    }
    d->synchronize(a);
    d->synchronize(b);
    d->synchronize(c);
    std::vector<uint32_t> used_a(4), used_c(4);
    for (uint32_t i = 0; i < launches * blocks; ++i) {
        ASSERT_NE(wa[i].load(), 0u) << "block " << i << " of stream a never ran";
        ASSERT_NE(wb[i].load(), 0u);
        ASSERT_NE(wc[i].load(), 0u);
        const uint32_t ua = wa[i].load() - 1, ub = wb[i].load() - 1;
        EXPECT_TRUE(ua == 1 || ua == 2) << "a block of stream a ran on unit " << ua;
        EXPECT_EQ(ub, 3u) << "a block of stream b ran on unit " << ub;
        ++used_a[ua];
        ++used_c[wc[i].load() - 1];
    }
    std::printf("[ shares ] stream a (units 1,2): %u/%u blocks; unbound stream c: %u/%u/%u/%u\n", used_a[1],
                used_a[2], used_c[0], used_c[1], used_c[2], used_c[3]);
    // Unbound again (every unit), and a set naming no unit of this device means every unit:
    // four blocks that wait for each other meet only if all four units take one.
    for (const uint64_t every : {~uint64_t{0}, uint64_t{1} << 40}) {
        d->stream_set_units(a, 0b0001);
        d->stream_set_units(a, every);
        std::atomic<uint32_t> arrived{0}, met{0};
        meet_args m{&arrived, 4, &met};
        d->launch(a, make_launch(k_meet, m, 4));
        d->synchronize(a);
        EXPECT_EQ(met.load(), 4u);
    }
    // A stream bound to two units: two blocks meet, and the other units stay free for others.
    d->stream_set_units(b, 0b0011);
    std::atomic<uint32_t> arrived{0}, met{0};
    meet_args m2{&arrived, 2, &met};
    d->launch(b, make_launch(k_meet, m2, 2));
    std::atomic<uint32_t> arrived_c{0}, met_c{0};
    meet_args mc{&arrived_c, 2, &met_c};
    d->launch(c, make_launch(k_meet, mc, 2));
    d->synchronize(b);
    d->synchronize(c);
    EXPECT_EQ(met.load(), 2u);
    EXPECT_EQ(met_c.load(), 2u);
    for (stream* s : {a, b, c}) d->stream_destroy(s);
}

// Past 64 units a set's bit names a group of them (unit_group): on 130 units, groups of 3, so
// bit 0 is units 0-2 and bit 43 the last unit alone; a set of all 44 bits is every unit.
TEST(CpuDevice, UnitSetsNameGroupsPastSixtyFourUnits) {
    static_assert(unit_group(64) == 1 && unit_set_bits(64) == 64 && unit_group(132) == 3 &&
                  unit_set_bits(132) == 44 && unit_group(304) == 5 && unit_set_bits(304) == 61);
    auto d = make(130, 64, 4096);
    ASSERT_EQ(unit_set_bits(130), 44u);
    stream* a = d->create_stream(3);
    stream* b = d->create_stream(3);
    d->stream_set_units(a, 0b1);                // units 0, 1, 2
    d->stream_set_units(b, uint64_t{1} << 43);  // unit 129
    constexpr uint32_t blocks = 60;
    std::vector<std::atomic<uint32_t>> wa(blocks), wb(blocks);
    where_args aa{wa.data()}, ab{wb.data()};
    d->launch(a, make_launch(k_where, aa, blocks));
    d->launch(b, make_launch(k_where, ab, blocks));
    d->synchronize(a);
    d->synchronize(b);
    for (uint32_t i = 0; i < blocks; ++i) {
        ASSERT_NE(wa[i].load(), 0u);
        ASSERT_NE(wb[i].load(), 0u);
        EXPECT_LT(wa[i].load() - 1, 3u) << "a block of stream a (bit 0: units 0-2) ran on unit " << wa[i].load() - 1;
        EXPECT_EQ(wb[i].load() - 1, 129u) << "a block of stream b (bit 43: unit 129) ran on unit " << wb[i].load() - 1;
    }
    // Every one of the 44 bits is the whole device: 130 blocks that wait for each other meet.
    d->stream_set_units(a, every_unit_set(130));
    std::atomic<uint32_t> arrived{0}, met{0};
    meet_args m{&arrived, 130, &met};
    d->launch(a, make_launch(k_meet, m, 130));
    d->synchronize(a);
    EXPECT_EQ(met.load(), 130u);
    for (stream* s : {a, b}) d->stream_destroy(s);
}

TEST(CpuDevice, HigherPriorityStreamGoesFirst) {
    auto d = make(1);
    stream* low = d->create_stream(7);
    stream* high = d->create_stream(0);
    std::atomic<uint64_t> seq{0};
    // Many queued low-priority launches of several blocks each.
    constexpr uint32_t launches = 20, blocks = 3;
    std::vector<uint64_t> lenter(launches * blocks), lexit(launches * blocks);
    std::vector<record_args> largs(launches);
    for (uint32_t i = 0; i < launches; ++i) {
        largs[i] = record_args{&seq, lenter.data() + i * blocks, lexit.data() + i * blocks, 1500};
        d->launch(low, make_launch(k_record, largs[i], blocks));
    }
    ASSERT_TRUE(eventually([&] { return seq.load() > 0; }));  // the unit is busy with low work
    uint64_t henter[1] = {}, hexit[1] = {};
    record_args ha{&seq, henter, hexit, 0};
    d->launch(high, make_launch(k_record, ha, 1));
    d->synchronize(high);
    d->synchronize(low);
    uint32_t before = 0;
    for (uint64_t e : lenter) before += e < henter[0];
    std::printf("[ priority ] low-priority blocks started before the high-priority one: %u of %u\n",
                before, launches * blocks);
    EXPECT_LE(before, 6u);
}

TEST(CpuDevice, EqualPrioritiesShareUnits) {
    auto d = make(1);
    stream* hold = d->create_stream(0);
    stream* a = d->create_stream(4);
    stream* b = d->create_stream(4);
    std::atomic<uint32_t> gate{0}, entered{0}, ran{0};
    gate_args g{&gate, 0, &entered, &ran};
    d->launch(hold, make_launch(k_gate, g, 1));
    ASSERT_TRUE(eventually([&] { return entered.load() == 1; }));
    std::atomic<uint64_t> seq{0};
    std::vector<uint64_t> ae(20), ax(20), be(20), bx(20);
    record_args ra{&seq, ae.data(), ax.data(), 100}, rb{&seq, be.data(), bx.data(), 100};
    d->launch(a, make_launch(k_record, ra, 20));
    d->launch(b, make_launch(k_record, rb, 20));
    gate = 1;
    d->synchronize(a);
    d->synchronize(b);
    // Among the first 20 blocks to start, both streams have a fair share.
    uint32_t a_first = 0, b_first = 0;
    for (uint64_t e : ae) a_first += e <= 40;  // enter/exit both take a sequence number
    for (uint64_t e : be) b_first += e <= 40;
    EXPECT_GE(a_first, 5u);
    EXPECT_GE(b_first, 5u);
}

// ---- preemption -------------------------------------------------------------------------------

TEST(CpuDevice, FlagStopsDispatchAtOnce) {
    // One unit runs blocks in order: block 10 raises the flag, no later block may run and the
    // counter must not advance.
    struct raise_args {
        task_words* w;
        std::atomic<uint32_t>* entered;
    };
    static const kernel_info k_raise = kernel("raise", [](const void* a, const block_context& ctx) {
        auto& p = *static_cast<const raise_args*>(a);
        p.entered->fetch_add(1);
        if (ctx.block == 10) p.w->preempt.store(1);
        return true;
    });
    auto d = make(1);
    const auto& ops = d->ops();
    stream* s = d->create_stream(3);
    task_words* w = ops.task_words_create(d.get());
    std::atomic<uint32_t> entered{0};
    raise_args a{w, &entered};
    d->launch(s, make_launch(k_raise, a, 100, w, 0));
    // Queued launches of the flagged task run nothing.
    for (uint32_t i = 1; i < 10; ++i) d->launch(s, make_launch(k_raise, a, 100, w, i));
    d->synchronize(s);
    EXPECT_EQ(entered.load(), 11u);
    EXPECT_EQ(w->completed.load(), 0u);
    // Cleared: the same task runs normally again.
    w->preempt = 0;
    raise_args b{nullptr, &entered};
    static const kernel_info k_count = kernel("count", [](const void* a, const block_context&) {
        static_cast<const raise_args*>(a)->entered->fetch_add(1);
        return true;
    });
    d->launch(s, make_launch(k_count, b, 100, w, 0));
    d->synchronize(s);
    EXPECT_EQ(entered.load(), 111u);
    EXPECT_EQ(w->completed.load(), 1u);
}

TEST(CpuDevice, QueuedLaunchesOfFlaggedTaskExitWhileUnitsAreBusy) {
    // One unit. Task A runs a preemptible kernel with more of its launches queued behind it;
    // a higher-priority stream holds a non-preemptible block ready to take the unit. When A
    // is flagged its queued launches must exit at once, not after the unit frees up again.
    auto d = make(1);
    const auto& ops = d->ops();
    stream* sa = d->create_stream(5);
    stream* hi = d->create_stream(0);
    task_words* w = ops.task_words_create(d.get());
    std::vector<float> in(kElems, 0.5f), out(kElems);
    std::atomic<uint32_t> entered{0}, interrupted{0};
    long_args la{in.data(), out.data(), 1u << 30, 0.02f, &entered, &interrupted, nullptr};
    for (uint32_t i = 0; i < 6; ++i) d->launch(sa, make_launch(k_long, la, 1, w, i));
    event* e = ops.event_create(d.get());
    ops.event_record(d.get(), e, sa);
    ASSERT_TRUE(eventually([&] { return entered.load() == 1; }));
    std::atomic<uint32_t> gate{0}, gentered{0}, gran{0};
    gate_args g{&gate, 0, &gentered, &gran};
    d->launch(hi, make_launch(k_gate, g, 1));
    w->preempt.store(1);
    EXPECT_TRUE(eventually([&] { return ops.event_query(d.get(), e); }, 5s));
    EXPECT_EQ(gran.load(), 0u);  // the unit went to the gated block, which is still waiting
    EXPECT_EQ(entered.load(), 1u);
    EXPECT_EQ(interrupted.load(), 1u);
    EXPECT_EQ(w->completed.load(), 0u);
    gate = 1;
    d->synchronize(hi);
    d->synchronize(sa);
    EXPECT_EQ(gran.load(), 1u);
    ops.event_destroy(d.get(), e);
}

struct chain {
    static constexpr uint32_t kernels = 4, grid = 6, n = grid * kElems;
    std::vector<std::vector<float>> buf;  // buf[k] -> kernel k -> buf[k + 1]
    std::atomic<uint32_t> entered[kernels] = {}, interrupted[kernels] = {};
    std::atomic<uint32_t> chunks_done[kernels][grid] = {};
    std::vector<long_args> args;
    task_words* w = nullptr;

    chain(const std::vector<float>& input, uint32_t chunks) : buf(kernels + 1, std::vector<float>(n, 0.0f)) {
        buf[0] = input;
        for (uint32_t k = 0; k < kernels; ++k)
            args.push_back(long_args{buf[k].data(), buf[k + 1].data(), chunks, 0.01f * (k + 1), &entered[k],
                                     &interrupted[k], chunks_done[k]});
    }
    // At preemption level `level` (0: none) with `epoch` (device_ops::level_epoch).
    void launch_from(device& d, stream* s, uint32_t first, uint32_t level = 0, uint32_t epoch = 0) {
        for (uint32_t k = first; k < kernels; ++k) {
            launch l = make_launch(k_long, args[k], grid, w, k);
            l.level = level;
            l.epoch = epoch;
            d.launch(s, l);
        }
    }
};

TEST(CpuDevice, PreemptionStopsRunningAndQueuedAndRestoresExactly) {
    std::vector<float> input(chain::n);
    for (uint32_t i = 0; i < chain::n; ++i) input[i] = 0.1f * static_cast<float>(i) - 1.3f;

    // How long one block takes undisturbed, on this thread.
    uint32_t chunks = 2000;
    {
        std::vector<float> out(chain::n);
        long_args a{input.data(), out.data(), chunks, 0.01f, nullptr, nullptr, nullptr};
        block_context ctx{0, chain::grid, 0, nullptr, nullptr, 0};
        const auto t0 = clk::now();
        long_block(&a, ctx);
        const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
        // Aim for blocks of about 60 ms (check points every ~60000/chunks us).
        chunks = static_cast<uint32_t>(std::clamp(chunks * 60000.0 / us, 2000.0, 200000.0));
    }
    // Host reference: the same kernels, block by block, undisturbed.
    chain ref(input, chunks);
    for (uint32_t k = 0; k < chain::kernels; ++k)
        for (uint32_t b = 0; b < chain::grid; ++b) {
            block_context ctx{b, chain::grid, 0, nullptr, nullptr, 0};
            ASSERT_TRUE(long_block(&ref.args[k], ctx));
        }
    const auto t_block0 = clk::now();
    {
        block_context ctx{0, chain::grid, 0, nullptr, nullptr, 0};
        long_block(&ref.args[0], ctx);
    }
    const double block_ms = std::chrono::duration<double, std::milli>(clk::now() - t_block0).count();

    auto d = make(2);
    const auto& ops = d->ops();
    stream* sa = d->create_stream(3);
    stream* sb = d->create_stream(3);
    chain a(input, chunks), b(input, chunks);
    a.w = ops.task_words_create(d.get());
    b.w = ops.task_words_create(d.get());
    a.launch_from(*d, sa, 0);
    b.launch_from(*d, sb, 0);  // an undisturbed task beside it

    // Preempt task a while its kernel 1 runs.
    ASSERT_TRUE(eventually([&] {
        for (auto& c : a.chunks_done[1])
            if (c.load() > 0) return true;
        return false;
    }, 60s));
    const auto t_flag = clk::now();
    a.w->preempt.store(1);
    d->synchronize(sa);
    const double stop_ms = std::chrono::duration<double, std::milli>(clk::now() - t_flag).count();
    std::printf("[ preempt  ] stream of the flagged task empty %.3f ms after the flag (a block takes %.1f ms)\n",
                stop_ms, block_ms);
    EXPECT_LT(stop_ms, block_ms / 2);
    EXPECT_EQ(a.w->completed.load(), 1u);          // kernel 0 done, kernel 1 not
    EXPECT_EQ(a.entered[0].load(), chain::grid);
    EXPECT_GE(a.interrupted[1].load(), 1u);
    EXPECT_LE(a.entered[1].load(), 3u);            // no block dispatched after the flag
    for (uint32_t blk = 0; blk < chain::grid; ++blk)
        EXPECT_LT(a.chunks_done[1][blk].load(), chunks / 2) << "block " << blk << " ran on";
    EXPECT_EQ(a.entered[2].load(), 0u);            // queued launches ran no block
    EXPECT_EQ(a.entered[3].load(), 0u);

    // Restore from the first kernel whose counter value was not reached.
    a.w->preempt.store(0);
    const uint32_t first = a.w->completed.load();
    a.launch_from(*d, sa, first);
    d->synchronize(sa);
    d->synchronize(sb);
    EXPECT_EQ(a.w->completed.load(), chain::kernels);
    EXPECT_EQ(b.w->completed.load(), chain::kernels);
    for (uint32_t k = 0; k < chain::kernels; ++k) {
        EXPECT_EQ(b.entered[k].load(), chain::grid);
        EXPECT_EQ(b.interrupted[k].load(), 0u);
    }
    for (uint32_t k = 1; k <= chain::kernels; ++k) {
        EXPECT_EQ(std::memcmp(a.buf[k].data(), ref.buf[k].data(), chain::n * sizeof(float)), 0) << k;
        EXPECT_EQ(std::memcmp(b.buf[k].data(), ref.buf[k].data(), chain::n * sizeof(float)), 0) << k;
    }
}

TEST(CpuDevice, ARaisedLevelStopsItsOlderLaunchesOnlyAndTheyRestoreExactly) {
    std::vector<float> input(chain::n);
    for (uint32_t i = 0; i < chain::n; ++i) input[i] = 0.07f * static_cast<float>(i) - 0.9f;
    const uint32_t chunks = 20000;
    chain ref(input, chunks);
    for (uint32_t k = 0; k < chain::kernels; ++k)
        for (uint32_t b = 0; b < chain::grid; ++b) {
            block_context ctx{b, chain::grid, 0, nullptr, nullptr, 0};
            ASSERT_TRUE(long_block(&ref.args[k], ctx));
        }
    auto d = make(2);
    const auto& ops = d->ops();
    ASSERT_NE(ops.raise_levels, nullptr);
    stream* sa = d->create_stream(3);
    stream* sb = d->create_stream(3);
    stream* sc = d->create_stream(3);
    // a at level 1, b at level 2, c at level 0 (none): only a's launches are older than the raise.
    chain a(input, chunks), b(input, chunks), c(input, chunks);
    for (chain* x : {&a, &b, &c}) x->w = ops.task_words_create(d.get());
    const uint32_t e1 = ops.level_epoch(d.get(), 1), e2 = ops.level_epoch(d.get(), 2);
    a.launch_from(*d, sa, 0, 1, e1);
    b.launch_from(*d, sb, 0, 2, e2);
    c.launch_from(*d, sc, 0);
    ASSERT_TRUE(eventually([&] {
        for (auto& x : a.chunks_done[1])
            if (x.load() > 0) return true;
        return false;
    }, 60s));
    ops.raise_levels(d.get(), 1u << 1);
    EXPECT_EQ(ops.level_epoch(d.get(), 1), e1 + 1);
    EXPECT_EQ(ops.level_epoch(d.get(), 2), e2);
    d->synchronize(sa);
    EXPECT_EQ(a.w->preempt.load(), 0u) << "a level raise writes no task flag";
    EXPECT_EQ(a.w->completed.load(), 1u);  // kernel 0 done, kernel 1 stopped
    EXPECT_GE(a.interrupted[1].load(), 1u);
    EXPECT_EQ(a.entered[2].load(), 0u);    // queued launches ran no block
    EXPECT_EQ(a.entered[3].load(), 0u);
    // Restored at the new epoch: it runs to its end, bit-identical. A launch whose epoch is
    // ahead of the level (made right after a raise whose write is still on its way) runs too.
    a.launch_from(*d, sa, a.w->completed.load(), 1, ops.level_epoch(d.get(), 1) + 1);
    for (stream* s : {sa, sb, sc}) d->synchronize(s);
    for (chain* x : {&a, &b, &c}) {
        EXPECT_EQ(x->w->completed.load(), chain::kernels);
        for (uint32_t k = 1; k <= chain::kernels; ++k)
            EXPECT_EQ(std::memcmp(x->buf[k].data(), ref.buf[k].data(), chain::n * sizeof(float)), 0) << k;
    }
    for (uint32_t k = 0; k < chain::kernels; ++k) {
        EXPECT_EQ(b.interrupted[k].load(), 0u) << "level 2 was not raised";
        EXPECT_EQ(c.interrupted[k].load(), 0u) << "level 0 is never raised";
    }
    // Out-of-range levels are refused.
    launch bad = make_launch(k_long, a.args[0], chain::grid, a.w, 0);
    bad.level = preempt_levels;
    EXPECT_THROW(d->launch(sa, bad), std::invalid_argument);
}

// ---- queues, events, teardown ----------------------------------------------------------------

TEST(CpuDevice, BoundedQueueBlocksLaunch) {
    constexpr uint32_t depth = 4, total = 10;
    auto d = make(1, depth);
    stream* s = d->create_stream(0);
    std::atomic<uint32_t> gate{0}, entered{0}, ran{0}, returned{0};
    std::vector<gate_args> args(total);
    for (uint32_t i = 0; i < total; ++i) args[i] = gate_args{&gate, i, &entered, &ran};
    std::thread producer([&] {
        for (uint32_t i = 0; i < total; ++i) {
            d->launch(s, make_launch(k_gate, args[i], 1));
            returned.store(i + 1);
        }
    });
    ASSERT_TRUE(eventually([&] { return returned.load() == depth && entered.load() == 1; }));
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(returned.load(), depth);  // the queue (head included) is full
    EXPECT_EQ(d->queued(s), depth - 1);
    for (uint32_t i = 1; i <= total - depth; ++i) {
        gate.store(i);  // launch i-1 finishes: exactly one more launch() returns
        ASSERT_TRUE(eventually([&] { return returned.load() == depth + i; }));
        std::this_thread::sleep_for(10ms);
        EXPECT_EQ(returned.load(), depth + i);
    }
    gate.store(total);
    producer.join();
    d->synchronize(s);
    EXPECT_EQ(ran.load(), total);
    EXPECT_EQ(d->queued(s), 0u);
}

TEST(CpuDevice, EventsAndSynchronize) {
    auto d = make(1);
    const auto& ops = d->ops();
    stream* s = d->create_stream(0);
    event* e = ops.event_create(d.get());
    event* e2 = ops.event_create(d.get());
    EXPECT_TRUE(ops.event_query(d.get(), e));  // never recorded
    ops.event_record(d.get(), e, s);           // on an empty stream
    EXPECT_TRUE(ops.event_query(d.get(), e));
    ops.event_synchronize(d.get(), e);

    std::atomic<uint32_t> gate{0}, entered{0}, ran{0};
    gate_args g0{&gate, 0, &entered, &ran}, g1{&gate, 1, &entered, &ran};
    d->launch(s, make_launch(k_gate, g0, 1));
    ops.event_record(d.get(), e, s);
    d->launch(s, make_launch(k_gate, g1, 1));
    ops.event_record(d.get(), e2, s);
    std::this_thread::sleep_for(5ms);
    EXPECT_FALSE(ops.event_query(d.get(), e));
    EXPECT_FALSE(ops.event_query(d.get(), e2));
    gate = 1;
    ops.event_synchronize(d.get(), e);
    EXPECT_TRUE(ops.event_query(d.get(), e));
    EXPECT_EQ(ran.load(), 1u);
    std::this_thread::sleep_for(5ms);
    EXPECT_FALSE(ops.event_query(d.get(), e2));  // the second launch still waits
    gate = 2;
    ops.event_synchronize(d.get(), e2);
    EXPECT_EQ(ran.load(), 2u);

    // synchronize waits for everything queued before it.
    std::atomic<uint64_t> seq{0};
    std::vector<uint64_t> en(10), ex(10);
    record_args r{&seq, en.data(), ex.data(), 1000};
    for (uint32_t i = 0; i < 10; ++i) d->launch(s, launch{&k_record, &r, sizeof r, 10, i, 1, nullptr, 0});
    d->synchronize(s);
    EXPECT_EQ(seq.load(), 20u);
    EXPECT_EQ(ops.queued(d.get(), s), 0u);
    ops.event_destroy(d.get(), e);
    ops.event_destroy(d.get(), e2);
}

// Sleeping waiters on one stream, each for its own launch (events), registered in no
// particular order, plus a synchronize on everything: as the launches finish one by one, each
// waiter returns once its launch is done and not before, however the others come and go.
TEST(CpuDevice, SleepingWaitersWakeAtTheirOwnLaunch) {
    constexpr uint32_t n = 6;
    auto d = make(1);
    const auto& ops = d->ops();
    stream* s = d->create_stream(0);
    std::atomic<uint32_t> gate{0}, entered{0}, ran{0};
    std::vector<gate_args> args(n);
    std::vector<event*> ev(n);
    for (uint32_t i = 0; i < n; ++i) {
        args[i] = gate_args{&gate, i, &entered, &ran};
        d->launch(s, make_launch(k_gate, args[i], 1));
        ev[i] = ops.event_create(d.get());
        ops.event_record(d.get(), ev[i], s);
    }
    std::vector<std::atomic<uint32_t>> back(n + 1);
    std::vector<std::thread> waiters;
    for (const uint32_t i : {3u, 5u, 0u, 4u, 1u, 2u})
        waiters.emplace_back([&, i] {
            ops.event_synchronize(d.get(), ev[i]);
            back[i].store(ran.load() > i ? 1 : 2);  // 2: returned before its launch ran
        });
    waiters.emplace_back([&] {
        d->synchronize(s);
        back[n].store(ran.load() == n ? 1 : 2);
    });
    std::this_thread::sleep_for(20ms);  // past the waiters' spin: they sleep
    for (uint32_t i = 0; i < n; ++i) {
        gate.store(i + 1);  // launch i finishes
        ASSERT_TRUE(eventually([&] { return back[i].load() != 0; })) << "the waiter for launch " << i << " never woke";
        EXPECT_EQ(back[i].load(), 1u) << "launch " << i;
        std::this_thread::sleep_for(5ms);
        for (uint32_t j = i + 1; j < n; ++j) EXPECT_EQ(back[j].load(), 0u) << "waiter " << j << " after launch " << i;
        if (i + 1 < n) {
            EXPECT_EQ(back[n].load(), 0u) << "synchronize returned after launch " << i;
        }
    }
    for (auto& t : waiters) t.join();
    EXPECT_EQ(back[n].load(), 1u);
    for (event* e : ev) ops.event_destroy(d.get(), e);
}

TEST(CpuDevice, StreamsAreDestroyedAndReused) {
    auto d = make(2);
    const auto& ops = d->ops();
    event* e = ops.event_create(d.get());
    std::atomic<uint32_t> writes[4] = {};
    std::atomic<uint32_t> bad{0};
    float in[4] = {1, 2, 3, 4}, out[4];
    double_args a{in, out, writes, 4, &bad};
    for (int round = 0; round < 50; ++round) {
        stream* s1 = d->create_stream(round % 8);
        stream* s2 = d->create_stream(7 - round % 8);
        d->launch(s1, make_launch(k_double, a, 4));
        d->launch(s2, make_launch(k_double, a, 4));
        ops.event_record(d.get(), e, s1);
        ops.stream_destroy(d.get(), s1);  // drains it
        EXPECT_TRUE(ops.event_query(d.get(), e));
        d->synchronize(s2);
        ops.stream_destroy(d.get(), s2);
    }
    for (auto& w : writes) EXPECT_EQ(w.load(), 100u);
    ops.event_destroy(d.get(), e);
}

TEST(CpuDevice, ManyProducersManyStreams) {
    struct count_args {
        std::atomic<uint32_t>* blocks;  // per launch
    };
    static const kernel_info k_count = kernel("count", [](const void* a, const block_context&) {
        static_cast<const count_args*>(a)->blocks->fetch_add(1);
        return true;
    });
    auto d = make(3, 8);
    constexpr uint32_t producers = 4, per = 400, nstreams = 5;
    stream* s[nstreams];
    for (uint32_t i = 0; i < nstreams; ++i) s[i] = d->create_stream(static_cast<int>(i % 3));
    std::vector<std::atomic<uint32_t>> blocks(producers * per);
    std::vector<uint32_t> expect(producers * per);
    std::vector<std::thread> th;
    for (uint32_t p = 0; p < producers; ++p)
        th.emplace_back([&, p] {
            std::mt19937 rng(p);
            for (uint32_t i = 0; i < per; ++i) {
                const uint32_t id = p * per + i, grid = 1 + rng() % 17;
                expect[id] = grid;
                count_args a{&blocks[id]};
                d->launch(s[rng() % nstreams], make_launch(k_count, a, grid));
            }
        });
    for (auto& t : th) t.join();
    for (auto* x : s) d->synchronize(x);
    for (uint32_t id = 0; id < producers * per; ++id) ASSERT_EQ(blocks[id].load(), expect[id]) << id;
}

TEST(CpuDevice, DestroyWithQueuedLaunches) {
    std::atomic<uint64_t> seq{0};
    std::vector<uint64_t> en(2), ex(2);
    record_args r{&seq, en.data(), ex.data(), 5000};
    const auto t0 = clk::now();
    {
        auto d = make(1, 128);
        const auto& ops = d->ops();
        stream* s1 = d->create_stream(0);
        stream* s2 = d->create_stream(5);
        for (uint32_t i = 0; i < 100; ++i) {
            d->launch(s1, launch{&k_record, &r, sizeof r, 2, 0, 1, nullptr, 0});
            d->launch(s2, launch{&k_record, &r, sizeof r, 2, 1, 1, nullptr, 0});
        }
        // Left for destroy to free: memory, registrations, events, task words, streams.
        d->alloc(1000);
        d->alloc(64, memory_kind::pinned);
        static char host[256];
        ops.register_host(d.get(), host, sizeof host);
        ops.event_record(d.get(), ops.event_create(d.get()), s1);
        ops.task_words_create(d.get());
        std::this_thread::sleep_for(2ms);
    }
    const double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    EXPECT_LT(ms, 500.0);             // 200 launches of 5 ms were not all run
    EXPECT_LT(seq.load(), 100u);     // most were dropped (2 per block)
    { auto idle = make(2); }          // and an idle device goes away at once
}

// ---- measurements (printed; bounds are loose sanity checks) -----------------------------------

double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

TEST(CpuDevice, LaunchLatency) {
    auto d = make(1);
    stream* s = d->create_stream(0);
    std::atomic<int64_t> t{0};
    stamp_args a{&t};
    auto measure = [&](uint32_t runs, std::chrono::microseconds gap) {
        std::vector<double> us;
        for (uint32_t i = 0; i < runs; ++i) {
            if (gap.count()) std::this_thread::sleep_for(gap);
            t.store(0);
            const int64_t t0 = now_ns();
            d->launch(s, make_launch(k_stamp, a, 1));
            d->synchronize(s);
            us.push_back((t.load(std::memory_order_acquire) - t0) / 1000.0);
        }
        return us;
    };
    measure(100, 0us);  // warm up
    const auto spin = measure(1000, 0us);
    const auto sleep = measure(100, 2000us);
    std::printf("[ latency  ] launch -> block start, idle device, unit spinning: p50 %.2f us, p99 %.2f us\n",
                pct(spin, 0.5), pct(spin, 0.99));
    std::printf("[ latency  ] launch -> block start, idle device, unit asleep:   p50 %.2f us, p99 %.2f us\n",
                pct(sleep, 0.5), pct(sleep, 0.99));
    EXPECT_LT(pct(spin, 0.5), 5000.0);
}

TEST(CpuDevice, PreemptionLatencyIndependentOfQueuedWork) {
    // One unit busy with a best-effort task that has many launches queued. Raising the BE
    // flag and queueing an RT launch must get the RT block running within a check point.
    auto d = make(1, 64);
    const auto& ops = d->ops();
    stream* rt = d->create_stream(0);
    stream* be = d->create_stream(7);
    task_words* w = ops.task_words_create(d.get());
    std::vector<float> in(64 * kElems, 0.5f), out(64 * kElems);
    std::atomic<uint32_t> entered{0};
    long_args la{in.data(), out.data(), 1u << 30, 0.02f, &entered, nullptr, nullptr};  // ~forever
    std::atomic<int64_t> t{0};
    stamp_args sa{&t};
    std::vector<double> us;
    for (int run = 0; run < 100; ++run) {
        w->preempt = 0;
        entered = 0;
        for (uint32_t i = 0; i < 60; ++i) d->launch(be, make_launch(k_long, la, 64, w, i));
        ASSERT_TRUE(eventually([&] { return entered.load() > 0; }));
        t.store(0);
        const int64_t t0 = now_ns();
        w->preempt.store(1);
        d->launch(rt, make_launch(k_stamp, sa, 1));
        d->synchronize(rt);
        us.push_back((t.load(std::memory_order_acquire) - t0) / 1000.0);
        d->synchronize(be);
        ASSERT_EQ(entered.load(), 1u);  // only the block that was running
        ASSERT_EQ(w->completed.load(), 0u);
    }
    std::printf("[ latency  ] BE flag + RT launch -> RT block start, 60 BE launches queued: "
                "p50 %.2f us, p99 %.2f us\n", pct(us, 0.5), pct(us, 0.99));
    EXPECT_LT(pct(us, 0.5), 20000.0);
}

}  // namespace
