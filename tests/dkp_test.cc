// Dynamic kernel padding (DKP) on the cpu device, in the selector and in the scheduler:
// - the device: a padded launch runs its pads only on units the RT kernel leaves idle (no pad
//   block starts while an RT block is still to be handed out), a pad runs only when its task
//   is at its kernel, a pad whose RT kernel ends is cut (its running blocks stop at their next
//   check point, its task's counter stays), pads of one task run in order and none after a
//   cut one, and the task's `pads` word says when none can still run a block;
// - the selector: rules 1 (BE time on the units it gets <= RT time) and 2 (BE occupancy >=
//   RT occupancy), units never given twice, unprofiled kernels never picked;
// - the scheduler: with padding, BE tasks progress while RT tasks hold the device, and every
//   output is bit-identical to an undisturbed run (RT x BE pairs in which every zoo model is RT
//   and BE at least once).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "dkp/profile.h"
#include "dkp/selector.h"
#include "libml/libml.h"
#include "libml/runtime/synthetic_inputs.h"
#include "preempt/device.h"
#include "preempt/scheduler.h"
#include "tests/tiny_zoo.h"

namespace gpu = reefline::gpu;
namespace ml = reefline::ml;
namespace dkp = reefline::dkp;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count(); }

std::unique_ptr<gpu::device> make(uint32_t units) {
    gpu::cpu_device_options o;
    o.compute_units = units;
    o.scratch_per_unit = 1 << 20;
    return gpu::make_cpu_device(o);
}

// Waits until no pad of the task can run a block any more.
bool pads_end(const gpu::task_words* w, std::chrono::milliseconds limit = 5s) {
    const auto end = clk::now() + limit;
    while (w->pads.load() != 0)
        if (clk::now() > end) return false;
        else std::this_thread::sleep_for(50us);
    return true;
}

// Each block spins for `us` (checking the flag every 20 us), recording its start time.
struct spin_args {
    int64_t us;
    std::atomic<int64_t>* start;  // per block
    std::atomic<uint32_t>* ran;   // blocks that ran to their end
};
bool spin_block(const void* a, const gpu::block_context& ctx) {
    const auto& p = *static_cast<const spin_args*>(a);
    p.start[ctx.block].store(now_ns());
    const int64_t until = now_ns() + p.us * 1000;
    while (now_ns() < until) {
        if (ctx.preempted()) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(20, p.us)));
    }
    p.ran->fetch_add(1);
    return true;
}
const gpu::kernel_info k_spin = {"spin", spin_block, 256, 32, 0, 0};

struct spin_kernel {
    std::vector<std::atomic<int64_t>> start;
    std::atomic<uint32_t> ran{0};
    spin_args args;
    uint32_t grid;
    spin_kernel(uint32_t g, int64_t us) : start(g), grid(g) {
        for (auto& s : start) s.store(0);
        args = {us, start.data(), &ran};
    }
    gpu::launch at(gpu::task_words* w, uint32_t index) const {
        return gpu::launch{&k_spin, &args, sizeof args, grid, 0, grid, w, index};
    }
    int64_t last_start() const {
        int64_t t = 0;
        for (auto& s : start) t = std::max(t, s.load());
        return t;
    }
    uint32_t started() const {
        uint32_t n = 0;
        for (auto& s : start) n += s.load() != 0;
        return n;
    }
};

struct device_fixture : ::testing::Test {
    void SetUp() override {
        d = make(4);
        ASSERT_TRUE(d->pads_launches());
        rt = d->create_stream(0);
        rt_w = d->task_words_create();
        be_w = d->task_words_create();
    }
    void TearDown() override {
        d->synchronize(rt);
        EXPECT_TRUE(pads_end(be_w));
        d->task_words_destroy(rt_w);
        d->task_words_destroy(be_w);
        d->stream_destroy(rt);
    }
    std::unique_ptr<gpu::device> d;
    gpu::stream* rt = nullptr;
    gpu::task_words *rt_w = nullptr, *be_w = nullptr;
};

TEST_F(device_fixture, pads_take_only_units_the_rt_kernel_leaves_idle) {
    be_w->completed.store(7);  // the BE task is at its kernel 7
    // RT: 6 blocks of 20 ms on 4 units (a second wave of 2 leaves 2 units idle); pad: 6 of 1 ms.
    spin_kernel r(6, 20000), b(6, 1000);
    const gpu::launch pad = b.at(be_w, 7);
    d->launch_padded(rt, r.at(rt_w, 0), &pad, 1);
    d->synchronize(rt);
    EXPECT_EQ(rt_w->completed.load(), 1u);
    EXPECT_EQ(r.ran.load(), 6u);
    ASSERT_GT(b.started(), 0u) << "two units idled through the RT kernel's second wave: padding should use them";
    // The RT kernel's blocks were all handed out before any pad block started (200 us for
    // the RT block to record its start after its claim).
    for (auto& s : b.start) {
        if (s.load()) {
            EXPECT_GE(s.load(), r.last_start() - 200'000) << "a pad block started while an RT block waited";
        }
    }
    ASSERT_TRUE(pads_end(be_w));
    // 6 pad blocks of 1 ms on 2 units fit the 20 ms second wave: the pad completed.
    EXPECT_EQ(b.ran.load(), 6u);
    EXPECT_EQ(be_w->completed.load(), 8u);
    const auto c = d->padding_stats();
    EXPECT_EQ(c.padded_launches, 1u);
    EXPECT_EQ(c.pads_completed, 1u);
    EXPECT_EQ(c.pad_blocks, 6u);
}

TEST_F(device_fixture, a_pad_runs_only_when_its_task_is_at_its_kernel) {
    be_w->completed.store(5);  // kernel 5 next: a pad of kernel 7 must not run
    spin_kernel r(1, 3000), b(2, 100);
    const gpu::launch pad = b.at(be_w, 7);
    d->launch_padded(rt, r.at(rt_w, 0), &pad, 1);
    d->synchronize(rt);
    ASSERT_TRUE(pads_end(be_w));
    EXPECT_EQ(b.started(), 0u);
    EXPECT_EQ(be_w->completed.load(), 5u);
    EXPECT_EQ(d->padding_stats().pads_skipped, 1u);
}

TEST_F(device_fixture, a_pad_ends_with_its_rt_kernel_and_the_next_pad_of_its_task_does_not_run) {
    be_w->completed.store(3);
    // RT kernel 0 runs 5 ms; the pad's blocks would run 300 ms: cut at the RT kernel's end.
    spin_kernel r0(1, 5000), r1(1, 5000), long_pad(2, 300'000), next_pad(2, 100);
    const gpu::launch p0 = long_pad.at(be_w, 3), p1 = next_pad.at(be_w, 4);
    const int64_t t0 = now_ns();
    d->launch_padded(rt, r0.at(rt_w, 0), &p0, 1);
    d->launch_padded(rt, r1.at(rt_w, 1), &p1, 1);
    d->synchronize(rt);
    const double rt_ms = double(now_ns() - t0) / 1e6;
    ASSERT_TRUE(pads_end(be_w, 1s)) << "cut pad blocks must stop at their next check point";
    EXPECT_LT(rt_ms, 150.0) << "the RT kernels waited for a pad";
    EXPECT_GT(long_pad.started(), 0u);
    EXPECT_EQ(long_pad.ran.load(), 0u);
    EXPECT_EQ(next_pad.started(), 0u) << "a pad ran after its task's previous pad was cut";
    EXPECT_EQ(be_w->completed.load(), 3u);
    const auto c = d->padding_stats();
    EXPECT_EQ(c.pads_cut, 1u);
    EXPECT_EQ(c.pads_skipped, 1u);
    EXPECT_EQ(rt_w->completed.load(), 2u);
}

TEST_F(device_fixture, pads_of_one_task_run_in_order_across_rt_kernels) {
    be_w->completed.store(0);
    std::vector<std::unique_ptr<spin_kernel>> rts, pads;
    for (uint32_t k = 0; k < 4; ++k) {
        rts.push_back(std::make_unique<spin_kernel>(1, 4000));
        pads.push_back(std::make_unique<spin_kernel>(2, 300));
        const gpu::launch p = pads.back()->at(be_w, k);
        d->launch_padded(rt, rts.back()->at(rt_w, k), &p, 1);
    }
    d->synchronize(rt);
    ASSERT_TRUE(pads_end(be_w));
    EXPECT_EQ(be_w->completed.load(), 4u) << "four pads, each after the one before";
    for (uint32_t k = 1; k < 4; ++k) EXPECT_GT(pads[k]->last_start(), pads[k - 1]->last_start());
}

// ---- the selector -------------------------------------------------------------------------

gpu::task_launch kernel_of(uint32_t grid, float est_us, uint32_t occupancy = 1) {
    gpu::task_launch t;
    t.kernel = &k_spin;
    t.grid = grid;
    t.est_us = est_us;
    t.occupancy = occupancy;
    return t;
}

TEST(dkp_selector, rules_one_and_two_and_the_units_left) {
    dkp::rules_selector s;
    const gpu::task_launch rt = kernel_of(1, 100);  // leaves 3 of 4 units
    const std::vector<gpu::task_launch> be = {
        kernel_of(2, 150),      // rule 1: longer than the RT kernel
        kernel_of(8, 80),       // rule 1 on the units it would get: 8 blocks on 3 units = 3 waves vs 2: 120 us
        kernel_of(2, 50, 0),    // rule 2: occupancy 0 < 1... (unprofiled occupancy counts as lower)
        kernel_of(2, 0),        // unprofiled
        kernel_of(2, 60),       // fits: takes 2 units
        kernel_of(1, 90),       // fits the last unit
        kernel_of(1, 10),       // no unit left
    };
    std::vector<gpu::pad_candidate> c;
    for (uint32_t i = 0; i < be.size(); ++i) c.push_back({&be[i], i});
    uint32_t out[4];
    const uint32_t n = s.select(rt, 4, c.data(), uint32_t(c.size()), out, 4);
    ASSERT_EQ(n, 2u);
    EXPECT_EQ(out[0], 4u);
    EXPECT_EQ(out[1], 5u);
    // An RT kernel that takes every unit, or has no profile, gets nothing.
    EXPECT_EQ(s.select(kernel_of(4, 100), 4, c.data(), uint32_t(c.size()), out, 4), 0u);
    EXPECT_EQ(s.select(kernel_of(1, 0), 4, c.data(), uint32_t(c.size()), out, 4), 0u);
    // Rule 2 against an RT kernel of occupancy 2 (two blocks per unit: 1 block takes 1 unit).
    const gpu::task_launch rt2 = kernel_of(1, 100, 2);
    const gpu::task_launch low = kernel_of(1, 10, 1), high = kernel_of(1, 10, 2);
    const gpu::pad_candidate c2[2] = {{&low, 0}, {&high, 1}};
    ASSERT_EQ(s.select(rt2, 4, c2, 2, out, 4), 1u);
    EXPECT_EQ(out[0], 1u);
    // Every pick satisfies both rules, over random offers.
    std::mt19937 rng(3);
    for (int trial = 0; trial < 2000; ++trial) {
        const uint32_t units = 1 + rng() % 8;
        const gpu::task_launch r = kernel_of(1 + rng() % 6, float(1 + rng() % 200), 1 + rng() % 3);
        std::vector<gpu::task_launch> offers;
        for (int i = 0; i < 6; ++i) offers.push_back(kernel_of(1 + rng() % 10, float(rng() % 200), rng() % 4));
        std::vector<gpu::pad_candidate> oc;
        for (uint32_t i = 0; i < offers.size(); ++i) oc.push_back({&offers[i], i});
        const uint32_t m = s.select(r, units, oc.data(), uint32_t(oc.size()), out, 4);
        uint32_t used = dkp::rules_selector::units_of(r, units);
        for (uint32_t k = 0; k < m; ++k) {
            const gpu::task_launch& b = offers[out[k]];
            const uint32_t given = std::min(units - used, dkp::rules_selector::units_of(b, units));
            ASSERT_GT(given, 0u) << "a pad got no unit";
            EXPECT_LE(dkp::rules_selector::time_on(b, given, units), double(r.est_us) + 1e-9) << "rule 1";
            EXPECT_GE(b.occupancy, r.occupancy) << "rule 2";
            EXPECT_GT(b.est_us, 0.0f);
            used += given;
        }
        EXPECT_LE(used, units);
    }
}

TEST(dkp_profile, json_round_trip_and_bad_files_named) {
    dkp::model_profile p;
    p.device = "cpu (3 compute units)";
    p.put({"b1", "00ff", {{"gemm", "fc", 41.5, 12, 256, 128, 32768, 1}, {"copy", "t", 3.25, 1, 256, 32, 0, 1}}});
    p.put({"b2", "0aff", {{"gemm", "fc", 80, 24, 256, 128, 32768, 1}}});
    const dkp::model_profile q = dkp::model_profile::parse(p.to_json());
    ASSERT_EQ(q.plans.size(), 2u);
    ASSERT_NE(q.find("b1", "00ff"), nullptr);
    EXPECT_EQ(q.find("b1", "00ff")->launches[1].time_us, 3.25);
    EXPECT_EQ(q.find("b1", "other"), nullptr) << "a profile of another plan is not this plan's";
    dkp::model_profile one;
    one.device = "x";
    one.put(q.plans[0]);
    const auto j = nlohmann::json::parse(one.to_json());
    EXPECT_TRUE(j.contains("launches")) << "a one-plan profile lists its launches at the top";
    EXPECT_EQ(dkp::model_profile::parse(one.to_json()).plans.size(), 1u);
    for (const char* bad : {"[]", "{\"device\": 1}", "{\"device\": \"x\", \"plan\": \"b1\", \"key\": \"k\"}",
                            "{\"device\": \"x\", \"plan\": \"b1\", \"key\": \"k\", \"launches\": [{\"kernel\": \"g\"}]}",
                            "{\"device\": \"x\", \"plan\": \"b1\", \"key\": \"k\", \"launches\": [{\"kernel\": \"g\", "
                            "\"time_us\": -1, \"blocks\": 1, \"occupancy\": 1}]}",
                            "not json"})
        EXPECT_THROW(dkp::model_profile::parse(bad), std::invalid_argument) << bad;
}

// ---- the scheduler, on zoo models ------------------------------------------------------------

class dkp_scheduler : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (zoo)
            _dir = reefline::testing::write_tiny_zoo(zoo, "dkp_test",
                                                     "resnet50,distilbert,sensor_tcn,mobilenet_v2,bert,vgg19,resnet152,"
                                                     "densenet201,inception_v3,alexnet");
    }
    static void TearDownTestSuite() {
        if (!_dir.empty()) fs::remove_all(_dir);
    }
    void SetUp() override {
        if (!std::getenv("REEFLINE_ZOO")) GTEST_SKIP() << "REEFLINE_ZOO not set";
        ASSERT_FALSE(_dir.empty());
    }
    static fs::path _dir;
};
fs::path dkp_scheduler::_dir;

TEST_F(dkp_scheduler, padded_be_kernels_progress_under_rt_load_and_results_stay_bit_identical) {
    // Every zoo model as RT and as BE at least once: CNNs, transformers (tokens) and the sensor
    // TCN (tensors) against each other.
    const std::pair<const char*, const char*> pairs[] = {
        {"resnet50_tiny", "mobilenet_v2_tiny"},   {"resnet50_tiny", "bert_tiny"},
        {"distilbert_tiny", "mobilenet_v2_tiny"}, {"sensor_tcn_tiny", "bert_tiny"},
        {"distilbert_tiny", "resnet50_tiny"},     {"mobilenet_v2_tiny", "sensor_tcn_tiny"},
        {"bert_tiny", "distilbert_tiny"},         {"vgg19_tiny", "resnet152_tiny"},
        {"resnet152_tiny", "densenet201_tiny"},   {"densenet201_tiny", "inception_v3_tiny"},
        {"inception_v3_tiny", "alexnet_tiny"},    {"alexnet_tiny", "vgg19_tiny"}};
    uint64_t padded_total = 0, completed_pads = 0;
    for (const auto& [rt_name, be_name] : pairs) {
        SCOPED_TRACE(std::string(rt_name) + " (RT) x " + be_name + " (BE)");
        auto device = make(3);
        ml::runtime rt(*device);
        ml::import_options io;
        io.unbound_dim = 16;
        auto rm = rt.load_model((_dir / (std::string(rt_name) + ".onnx")).string(), io);
        auto bm = rt.load_model((_dir / (std::string(be_name) + ".onnx")).string(), io);
        auto ri = rt.link_model(rm, -1);
        auto bi = rt.link_model(bm);
        rt.configure_batch(*bi, 4);
        // Profiles on this device: the selector's rules need them.
        rt.profile(*ri, 3);
        rt.profile(*bi, 3);
        const auto xr = ml::synthetic_inputs(ri->inputs(), 1), xb = ml::synthetic_inputs(bi->inputs(), 2);
        std::vector<ml::tensor> want_r, want_b;
        rt.infer_batch(*ri, xr, want_r);
        rt.infer_batch(*bi, xb, want_b);

        gpu::scheduler_options so;
        so.padding = std::make_shared<dkp::rules_selector>();
        gpu::scheduler sched(*device, so);
        ASSERT_TRUE(sched.stats().padding);
        rt.write_inputs(*bi, xb);
        gpu::task bt;
        bt.cls = gpu::task_class::be;
        bt.launches = rt.task_launches(*bi);
        const gpu::task_id b = sched.submit(std::move(bt));
        // RT tasks back to back until the BE task is done or 400 RT tasks have run: it
        // progresses only as padding and in the short gaps between RT tasks (RT first: a BE
        // launch is never made while an RT task waits), then alone.
        rt.write_inputs(*ri, xr);
        std::atomic<bool> be_done{false};
        gpu::task_result br;
        std::thread waiter([&] {
            br = sched.wait(b);
            be_done = true;
        });
        int rts = 0;
        const auto deadline = clk::now() + 60s;
        while (!be_done && rts < 400 && clk::now() < deadline) {
            gpu::task t;
            t.cls = gpu::task_class::rt;
            t.launches = rt.task_launches(*ri);
            const gpu::task_result rr = sched.wait(sched.submit(std::move(t)));
            ASSERT_EQ(rr.status, gpu::task_status::completed);
            ASSERT_TRUE(rt.read_outputs(*ri)[0] == want_r[0]) << "RT output after " << rts << " RT tasks";
            ++rts;
        }
        waiter.join();
        ASSERT_EQ(br.status, gpu::task_status::completed);
        const auto got = rt.read_outputs(*bi);
        for (size_t o = 0; o < got.size(); ++o) ASSERT_TRUE(got[o] == want_b[o]) << "BE output " << o;
        const auto s = sched.stats();
        const auto c = device->padding_stats();
        std::printf("  %s x %s: %d RT tasks, BE preempted %u times; padded launches %llu, pads completed %llu cut %llu skipped "
                    "%llu, %llu BE blocks as padding, selection mean %.0f ns\n",
                    rt_name, be_name, rts, br.preemptions, (unsigned long long)s.padded_launches,
                    (unsigned long long)c.pads_completed, (unsigned long long)c.pads_cut, (unsigned long long)c.pads_skipped,
                    (unsigned long long)c.pad_blocks, s.select_count ? double(s.select_ns_sum) / double(s.select_count) : 0.0);
        padded_total += s.padded_launches;
        completed_pads += c.pads_completed;
    }
    EXPECT_GT(padded_total, 0u) << "no RT launch was ever padded: the test proves nothing";
    EXPECT_GT(completed_pads, 0u) << "no pad ever completed";
}

}  // namespace
