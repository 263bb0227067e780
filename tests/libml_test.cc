// The IF API on the cpu backend: batching, weight sharing between instances, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstring>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/planner/c16_layout.h"
#include "libml/kernels/cpu_c16.h"
#include "libml/kernels/kernels.h"
#include "libml/libml.h"
#include "tests/onnx_builder.h"

namespace ml = reefline::ml;
namespace fs = std::filesystem;

namespace {

fs::path conformance() {
    const char* d = std::getenv("REEFLINE_CONFORMANCE_DIR");
    return d ? fs::path(d) : fs::path();
}

ml::tensor stack(const std::vector<ml::tensor>& xs) {
    ml::shape_t s = xs[0].shape;
    s[0] = int64_t(xs.size());
    ml::bytes_t b;
    for (const auto& x : xs) b.insert(b.end(), x.data->begin(), x.data->end());
    return ml::tensor::make(xs[0].type, s, std::move(b));
}

ml::tensor random_like(const ml::tensor& t, unsigned seed) {
    ml::bytes_t b(t.data->size());
    auto* f = reinterpret_cast<float*>(b.data());
    srand(seed);
    for (size_t i = 0; i < b.size() / 4; ++i) f[i] = float(rand() % 1000) / 250.0f - 2.0f;
    return ml::tensor::make(t.type, t.shape, std::move(b));
}

class libml_api : public ::testing::Test {
protected:
    void SetUp() override {
        if (conformance().empty() || !fs::exists(conformance() / "zoo/test_squeezenet/model.onnx"))
            GTEST_SKIP() << "REEFLINE_CONFORMANCE_DIR not set or missing";
        _device = reefline::gpu::make_cpu_device();
        _rt = std::make_unique<ml::runtime>(*_device);
        _path = conformance() / "zoo/test_squeezenet";
    }
    std::unique_ptr<reefline::gpu::device> _device;
    std::unique_ptr<ml::runtime> _rt;
    fs::path _path;
};

TEST_F(libml_api, batch_n_equals_n_single_runs) {
    auto m = _rt->load_model(_path / "model.onnx");
    auto single = _rt->link_model(m);
    const ml::tensor x0 = ml::read_tensor_file(_path / "test_data_set_0/input_0.pb");
    std::vector<ml::tensor> xs = {x0, random_like(x0, 1), random_like(x0, 2)};
    std::vector<std::vector<ml::tensor>> singles;
    for (const auto& x : xs) {
        std::vector<ml::tensor> y;
        _rt->infer_batch(*single, std::vector<ml::tensor>{x}, y);
        singles.push_back(y);
    }
    auto batched = _rt->link_model(m);
    _rt->configure_batch(*batched, 3);
    EXPECT_TRUE(batched->current_plan().check_idempotence().empty());
    std::vector<ml::tensor> y;
    _rt->infer_batch(*batched, std::vector<ml::tensor>{stack(xs)}, y);
    ASSERT_EQ(y.size(), singles[0].size());
    for (size_t o = 0; o < y.size(); ++o) {
        const int64_t per = singles[0][o].elements();
        for (size_t b = 0; b < xs.size(); ++b)
            for (int64_t i = 0; i < per; ++i)
                ASSERT_NEAR(y[o].as_f64(int64_t(b) * per + i), singles[b][o].as_f64(i), 1e-5)
                    << "output " << o << " batch item " << b;
    }
}

// A batch run image by image through runs of kernels (plan_options::image_run) gives the
// bits of the same batch run kernel by kernel, and its plan keeps the idempotence invariant
// with several images' launches interleaved.
TEST_F(libml_api, image_by_image_runs_give_the_kernel_by_kernel_bits) {
    ml::plan_options by_image, by_kernel;
    by_image.compute_units = by_kernel.compute_units = 1;
    by_image.image_run_min_bytes = 0;  // every per-image kernel, however small
    by_kernel.image_run = 0;
    ml::runtime rt_image(*_device, by_image), rt_kernel(*_device, by_kernel);
    const ml::tensor x0 = ml::read_tensor_file(_path / "test_data_set_0/input_0.pb");
    const ml::tensor x = stack({x0, random_like(x0, 5), random_like(x0, 6)});
    std::vector<std::vector<ml::tensor>> ys;
    std::vector<size_t> launches;
    for (ml::runtime* rt : {&rt_image, &rt_kernel}) {
        auto in = rt->link_model(rt->load_model(_path / "model.onnx"));
        rt->configure_batch(*in, 3);
        EXPECT_EQ(in->current_plan().check_idempotence(), "");
        launches.push_back(in->current_plan().launches().size());
        ys.emplace_back();
        rt->infer_batch(*in, std::vector<ml::tensor>{x}, ys.back());
    }
    EXPECT_GT(launches[0], launches[1] + 10) << "the plan did not run images one by one";
    ASSERT_EQ(ys[0].size(), ys[1].size());
    for (size_t o = 0; o < ys[0].size(); ++o) EXPECT_TRUE(ys[0][o] == ys[1][o]) << "output " << o;
}

// With several compute units the runs take as many images a launch as there are units (a
// launch of one image leaves units idle), where the batch is a multiple of them (batch 5 on
// two units: one launch a kernel, as before). The bits are the kernel-by-kernel plan's, and
// each grouped launch writes only its images.
TEST_F(libml_api, image_runs_on_several_units_take_that_many_images_a_launch) {
    const ml::tensor x0 = ml::read_tensor_file(_path / "test_data_set_0/input_0.pb");
    for (const int64_t batch : {4, 5}) {
        ml::plan_options by_group, by_kernel;
        by_group.compute_units = by_kernel.compute_units = 2;
        by_group.image_run_min_bytes = 0;
        by_kernel.image_run = 0;
        ml::runtime rt_group(*_device, by_group), rt_kernel(*_device, by_kernel);
        std::vector<ml::tensor> images{x0};
        for (int64_t b = 1; b < batch; ++b) images.push_back(random_like(x0, 10 + int(b)));
        const ml::tensor x = stack(images);
        std::vector<std::vector<ml::tensor>> ys;
        std::vector<size_t> launches;
        std::vector<std::vector<int64_t>> first_conv_writes;  // per plan: each launch's output bytes
        for (ml::runtime* rt : {&rt_group, &rt_kernel}) {
            auto in = rt->link_model(rt->load_model(_path / "model.onnx"));
            rt->configure_batch(*in, batch);
            EXPECT_EQ(in->current_plan().check_idempotence(), "");
            const auto& ls = in->current_plan().launches();
            launches.push_back(ls.size());
            const auto first = std::find_if(ls.begin(), ls.end(), [](const ml::planned_launch& l) {
                return l.kernel == &reefline::ml::kernels::conv2d_kernel || l.kernel == &reefline::ml::kernels::conv2d_c16_kernel;
            });
            ASSERT_NE(first, ls.end());
            first_conv_writes.emplace_back();
            for (const auto& l : ls)
                if (l.node == first->node) first_conv_writes.back().push_back(l.writes.at(0).bytes);
            ys.emplace_back();
            rt->infer_batch(*in, std::vector<ml::tensor>{x}, ys.back());
        }
        ASSERT_EQ(first_conv_writes[1].size(), 1u);
        if (batch == 4) {
            EXPECT_GT(launches[0], launches[1] + 5) << "the plan did not run images two by two";
            const int64_t half = first_conv_writes[1][0] / 2;
            EXPECT_EQ(first_conv_writes[0], (std::vector<int64_t>{half, half})) << "the first conv: two launches of two images";
        } else {
            EXPECT_EQ(launches[0], launches[1]) << "batch 5 on two units: one launch per kernel";
        }
        ASSERT_EQ(ys[0].size(), ys[1].size());
        for (size_t o = 0; o < ys[0].size(); ++o) EXPECT_TRUE(ys[0][o] == ys[1][o]) << "batch " << batch << " output " << o;
    }
}

// A launch that writes less than image_run_min_bytes still runs image by image where it reads
// that much from the launch before it (the first conv's batch of 3 writes ~13 MB, the max pool
// after it ~3 MB, the squeeze layer after that reads only the pool's): the pool's input then
// comes from the caches. The bits are the kernel-by-kernel plan's.
TEST_F(libml_api, a_launch_reading_a_large_output_joins_the_image_run) {
    ml::plan_options by_image, by_kernel;
    by_image.compute_units = by_kernel.compute_units = 1;
    by_image.image_run_min_bytes = int64_t(8) << 20;
    by_kernel.image_run = 0;
    ml::runtime rt_image(*_device, by_image), rt_kernel(*_device, by_kernel);
    const ml::tensor x0 = ml::read_tensor_file(_path / "test_data_set_0/input_0.pb");
    const ml::tensor x = stack({x0, random_like(x0, 7), random_like(x0, 8)});
    std::vector<std::vector<ml::tensor>> ys;
    for (ml::runtime* rt : {&rt_image, &rt_kernel}) {
        auto in = rt->link_model(rt->load_model(_path / "model.onnx"));
        rt->configure_batch(*in, 3);
        EXPECT_EQ(in->current_plan().check_idempotence(), "");
        const auto& launches = in->current_plan().launches();
        const auto launches_of = [&](const reefline::gpu::kernel_info& k, const reefline::gpu::kernel_info& k16,
                                     int64_t* bytes) {
            // The first launch of kernel k (or its c16 form): how many launches its node has,
            // what it writes.
            const auto first = std::find_if(launches.begin(), launches.end(), [&](const ml::planned_launch& l) {
                return l.kernel == &k || l.kernel == &k16;
            });
            EXPECT_NE(first, launches.end());
            if (first == launches.end()) return int64_t(0);
            *bytes = 0;
            for (const auto& l : launches)
                if (l.node == first->node)
                    for (const auto& w : l.writes) *bytes += w.bytes;
            return int64_t(std::count_if(launches.begin(), launches.end(),
                                         [&](const ml::planned_launch& l) { return l.node == first->node; }));
        };
        int64_t conv_bytes = 0, pool_bytes = 0;
        const int64_t convs = launches_of(reefline::ml::kernels::conv2d_kernel, reefline::ml::kernels::conv2d_c16_kernel,
                                          &conv_bytes),
                      pools = launches_of(reefline::ml::kernels::pool2d_kernel, reefline::ml::kernels::pool2d_c16_kernel,
                                          &pool_bytes);
        EXPECT_GE(conv_bytes, by_image.image_run_min_bytes);
        EXPECT_LT(pool_bytes, by_image.image_run_min_bytes);
        EXPECT_EQ(convs, rt == &rt_image ? 3 : 1);
        EXPECT_EQ(pools, rt == &rt_image ? 3 : 1) << "the pool did not join the first conv's image run";
        ys.emplace_back();
        rt->infer_batch(*in, std::vector<ml::tensor>{x}, ys.back());
    }
    ASSERT_EQ(ys[0].size(), ys[1].size());
    for (size_t o = 0; o < ys[0].size(); ++o) EXPECT_TRUE(ys[0][o] == ys[1][o]) << "output " << o;
}

// Counts the bytes a device allocates: the same backend behind a copy of its function table.
struct counting_device {
    static inline std::atomic<int64_t> bytes{0};
    explicit counting_device(reefline::gpu::device& real) : ops(real.ops()) {
        ops.destroy = [](reefline::gpu::device*) {};
        ops.alloc = [](reefline::gpu::device* d, size_t n, reefline::gpu::memory_kind k) {
            bytes += int64_t(n);
            return real_alloc(d, n, k);
        };
        real_alloc = real.ops().alloc;
        dev = std::make_unique<reefline::gpu::device>(&ops, real.state());
    }
    reefline::gpu::device_ops ops;
    static inline void* (*real_alloc)(reefline::gpu::device*, size_t, reefline::gpu::memory_kind) = nullptr;
    std::unique_ptr<reefline::gpu::device> dev;
};

TEST_F(libml_api, link_model_shares_weights) {
    counting_device counted(*_device);
    ml::runtime rt(*counted.dev);
    const int64_t before_load = counting_device::bytes;
    auto m = rt.load_model(_path / "model.onnx");
    const int64_t load = counting_device::bytes - before_load;
    EXPECT_GE(load, m->weight_bytes());
    const void* weights = m->weights();
    auto a = rt.link_model(m);
    const int64_t before_b = counting_device::bytes;
    auto b = rt.link_model(m);
    const int64_t link = counting_device::bytes - before_b;
    EXPECT_EQ(m->instances(), 2);
    EXPECT_EQ(m->weights(), weights);  // no second upload
    // A second instance costs its arena and inputs (plus small task words), never the weights.
    EXPECT_LT(link, b->arena_bytes() + b->current_plan().input_bytes() + 4096);
    EXPECT_GE(link, b->arena_bytes());
    std::printf("weights %lld bytes loaded once; second instance allocated %lld bytes (arena %lld)\n",
                static_cast<long long>(load), static_cast<long long>(link),
                static_cast<long long>(b->arena_bytes()));
    const ml::tensor x = ml::read_tensor_file(_path / "test_data_set_0/input_0.pb");
    std::vector<ml::tensor> ya, yb;
    rt.infer_batch(*a, std::vector<ml::tensor>{x}, ya);
    rt.infer_batch(*b, std::vector<ml::tensor>{x}, yb);
    ASSERT_EQ(ya.size(), yb.size());
    for (size_t o = 0; o < ya.size(); ++o) EXPECT_TRUE(ya[o] == yb[o]);
    b.reset();
    EXPECT_EQ(m->instances(), 1);
}

// An IF lane's instances (one per batch size, run one at a time) share one arena: it is as
// large as the largest plan's, grows when a larger plan joins (the instances already in it are
// bound to the new memory), is what the footprint said, and changes no result.
TEST_F(libml_api, instances_that_share_an_arena_give_the_results_of_their_own) {
    counting_device counted(*_device);
    ml::runtime rt(*counted.dev);
    auto m = rt.load_model(_path / "model.onnx");
    const ml::tensor x0 = ml::read_tensor_file(_path / "test_data_set_0/input_0.pb");
    const std::vector<ml::tensor> xs = {x0, random_like(x0, 1), random_like(x0, 2), random_like(x0, 3)};
    // References: instances with arenas of their own.
    auto own1 = rt.link_model(m), own4 = rt.link_model(m);
    rt.configure_batch(*own4, 4);
    std::vector<ml::tensor> want1, want4;
    rt.infer_batch(*own1, std::vector<ml::tensor>{x0}, want1);
    rt.infer_batch(*own4, std::vector<ml::tensor>{stack(xs)}, want4);

    auto arena = rt.make_shared_arena();
    auto a1 = rt.link_model(m);
    rt.configure_batch(*a1, 1, {}, arena);
    EXPECT_EQ(arena->bytes(), own1->arena_bytes());
    EXPECT_EQ(a1->memory_bytes(), own1->memory_bytes() - own1->arena_bytes());  // its own arena is freed
    std::vector<ml::tensor> y;
    rt.infer_batch(*a1, std::vector<ml::tensor>{x0}, y);
    for (size_t o = 0; o < y.size(); ++o) EXPECT_TRUE(y[o] == want1[o]) << "output " << o;

    // Batch 4 joins: the arena grows to its plan's, a1 is bound to the new memory.
    const int64_t before = counting_device::bytes;
    auto a4 = rt.link_model(m);
    rt.configure_batch(*a4, 4, {}, arena);
    EXPECT_EQ(arena->bytes(), own4->arena_bytes());
    EXPECT_EQ(arena->users(), 2u);
    EXPECT_EQ(a4->shared(), arena);
    std::printf("shared arena %lld bytes for batch 1 and 4 (own arenas: %lld + %lld); batch 4 joined for %lld bytes\n",
                static_cast<long long>(arena->bytes()), static_cast<long long>(own1->arena_bytes()),
                static_cast<long long>(own4->arena_bytes()), static_cast<long long>(counting_device::bytes - before));
    for (int round = 0; round < 2; ++round) {  // in turn, as a lane runs them
        rt.infer_batch(*a4, std::vector<ml::tensor>{stack(xs)}, y);
        for (size_t o = 0; o < y.size(); ++o) EXPECT_TRUE(y[o] == want4[o]) << "batch 4, output " << o;
        rt.infer_batch(*a1, std::vector<ml::tensor>{x0}, y);
        for (size_t o = 0; o < y.size(); ++o) EXPECT_TRUE(y[o] == want1[o]) << "batch 1, output " << o;
    }

    // The footprint of the group: each instance's own bytes, and the arena once.
    const std::vector<std::vector<int64_t>> groups{{1, 4}};
    const ml::memory_footprint f = rt.footprint(*m, groups, 0);
    ASSERT_EQ(f.arenas.size(), 1u);
    EXPECT_EQ(f.arenas[0], arena->bytes());
    ASSERT_EQ(f.instances.size(), 2u);
    EXPECT_EQ(f.instances[0].second, a1->memory_bytes());
    EXPECT_EQ(f.instances[1].second, a4->memory_bytes());
    EXPECT_EQ(f.instance_bytes(), a1->memory_bytes() + a4->memory_bytes() + arena->bytes());

    // Leaving: an instance configured on its own again, or destroyed, is no longer a user.
    rt.configure_batch(*a1, 1);
    EXPECT_EQ(a1->shared(), nullptr);
    EXPECT_EQ(arena->users(), 1u);
    rt.infer_batch(*a1, std::vector<ml::tensor>{x0}, y);
    for (size_t o = 0; o < y.size(); ++o) EXPECT_TRUE(y[o] == want1[o]) << "own again, output " << o;
    a4.reset();
    EXPECT_EQ(arena->users(), 0u);
}

TEST_F(libml_api, wrong_inputs_are_refused) {
    auto m = _rt->load_model(_path / "model.onnx");
    auto a = _rt->link_model(m);
    std::vector<ml::tensor> y;
    EXPECT_THROW(_rt->infer_batch(*a, std::vector<ml::tensor>{}, y), std::invalid_argument);
    const ml::tensor bad = ml::tensor::from_f64({1, 2, 3}, {3});
    EXPECT_THROW(_rt->infer_batch(*a, std::vector<ml::tensor>{bad}, y), std::invalid_argument);
}

// A cpu block uses its unit's scratch without bounds checks: a plan that needs more scratch than
// the device lends is refused when the model is linked, naming the node, not overrun at run time.
TEST_F(libml_api, a_plan_needing_more_scratch_than_the_device_lends_is_refused) {
    reefline::gpu::cpu_device_options small;
    small.compute_units = 1;
    small.scratch_per_unit = 1u << 12;
    auto device = reefline::gpu::make_cpu_device(small);
    ml::runtime rt(*device);
    auto m = rt.load_model(_path / "model.onnx");
    try {
        auto a = rt.link_model(m);
        ADD_FAILURE() << "linked with 4 KiB of scratch per compute unit";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("bytes of scratch per compute unit"), std::string::npos) << e.what();
    }
    // The same model links and runs on the default scratch (the fixture's device).
    auto a = _rt->link_model(_rt->load_model(_path / "model.onnx"));
    EXPECT_NE(a, nullptr);
}

TEST(libml_errors, bad_files_name_the_problem) {
    auto device = reefline::gpu::make_cpu_device();
    ml::runtime rt(*device);
    try {
        rt.load_model("/nonexistent/model.onnx");
        FAIL() << "no error";
    } catch (const ml::model_error& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/model.onnx"), std::string::npos) << e.what();
    }
    const char junk[] = "this is not an onnx file at all";
    EXPECT_THROW(rt.load_model_buffer(junk, sizeof junk, "junk"), ml::model_error);
}

// Concatenations along channels of one image run in place: DenseNet's pattern (each layer
// concatenates all the block's earlier maps) becomes one buffer its producers write into, with
// no copy; inputs that cannot take their slot (the same value twice, a value already placed
// elsewhere in that buffer, a graph input) are copied. The batch of two (copies everywhere: its
// slots are not contiguous) gives the same numbers, and no launch overwrites what an earlier
// one in its restore window reads.
TEST(libml_plan, concatenations_in_place_give_the_copies_results) {
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {-1, 2, 5, 5}).output("y").output("twice").output("apart").output("after_input");
    std::vector<float> w1(3 * 2 * 9), w2(2 * 5 * 9);
    for (size_t i = 0; i < w1.size(); ++i) w1[i] = float(int(i % 7) - 3) / 8.0f;
    for (size_t i = 0; i < w2.size(); ++i) w2[i] = float(int(i % 5) - 2) / 4.0f;
    b.init_f32("w1", {3, 2, 3, 3}, w1).init_f32("w2", {2, 5, 3, 3}, w2);
    b.node("Relu", {"x"}, {"a"});
    const auto conv = [&](const std::string& in, const std::string& w, const std::string& out) {
        tm::attr_ints(b.node("Conv", {in, w}, {out}), "pads", {1, 1, 1, 1});
    };
    conv("a", "w1", "c1");
    tm::attr_i(b.node("Concat", {"a", "c1"}, {"cat1"}), "axis", 1);
    b.node("Relu", {"cat1"}, {"r1"});
    conv("r1", "w2", "c2");
    tm::attr_i(b.node("Concat", {"a", "c1", "c2"}, {"cat2"}), "axis", 1);
    b.node("Relu", {"cat2"}, {"y"});
    tm::attr_i(b.node("Concat", {"c2", "c2"}, {"twice"}), "axis", 1);
    tm::attr_i(b.node("Concat", {"a", "c2"}, {"apart"}), "axis", 1);
    tm::attr_i(b.node("Concat", {"x", "c1"}, {"after_input"}), "axis", 1);
    const std::string bytes = b.bytes();

    auto device = reefline::gpu::make_cpu_device();
    ml::runtime rt(*device);
    auto m = rt.load_model_buffer(bytes.data(), bytes.size(), "dense");
    auto one = rt.link_model(m), two = rt.link_model(m);
    rt.configure_batch(*one, 1);
    rt.configure_batch(*two, 2);
    const auto copies = [](const ml::plan& p) {
        return std::count_if(p.launches().begin(), p.launches().end(),
                             [](const auto& l) { return std::string(l.kernel->name) == "copy"; });
    };
    // cat1 and cat2 copy nothing; twice copies both inputs, apart both (a's next slot holds
    // c1), after_input both (x is the graph's input).
    EXPECT_EQ(copies(one->current_plan()), 6);
    EXPECT_EQ(copies(two->current_plan()), 11);
    EXPECT_EQ(one->current_plan().check_idempotence(), "");
    EXPECT_EQ(two->current_plan().check_idempotence(), "");

    std::vector<float> xv(2 * 2 * 5 * 5);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 37 % 23) - 11) / 5.0f;
    ml::bytes_t xb(xv.size() * 4);
    std::memcpy(xb.data(), xv.data(), xb.size());
    const ml::tensor x2 = ml::tensor::make(ml::dtype::f32, {2, 2, 5, 5}, xb);
    std::vector<ml::tensor> y2;
    rt.infer_batch(*two, std::vector<ml::tensor>{x2}, y2);
    for (int64_t item = 0; item < 2; ++item) {
        ml::bytes_t ib(xb.begin() + item * 200, xb.begin() + (item + 1) * 200);
        std::vector<ml::tensor> y1;
        rt.infer_batch(*one, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {1, 2, 5, 5}, ib)}, y1);
        ASSERT_EQ(y1.size(), y2.size());
        for (size_t o = 0; o < y1.size(); ++o) {
            const int64_t per = y1[o].elements();
            ASSERT_EQ(y2[o].elements(), 2 * per);
            for (int64_t i = 0; i < per; ++i)
                ASSERT_EQ(y1[o].as_f64(i), y2[o].as_f64(item * per + i)) << "output " << o << " item " << item << " at " << i;
        }
    }
    // The values themselves: y = relu(a, c1, c2) by channel, so its first two channels are a.
    std::vector<ml::tensor> y1;
    rt.infer_batch(*one, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {1, 2, 5, 5},
                                                                  ml::bytes_t(xb.begin(), xb.begin() + 200))}, y1);
    for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(y1[0].as_f64(i), std::max(0.0f, xv[size_t(i)]));
}

// On the cpu device with AVX-512 a 3x3 layer Winograd takes gets its filters laid out after
// the weights when the model loads (16/9 of its weights, and no more: a thin layer gets none),
// the plan binds them, and the results are im2col's within rounding; a GPU-tiled layout (the
// footprint of another device) holds none.
TEST(libml_plan, winograd_filters_are_laid_out_at_load_and_used) {
    if (!ml::kernels::cpu_has_avx512()) GTEST_SKIP() << "Winograd convolution needs AVX-512";
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {-1, 16, 12, 12}).output("y");
    std::vector<float> w1(64 * 16 * 9), w2(8 * 64 * 9), b1(64);
    for (size_t i = 0; i < w1.size(); ++i) w1[i] = float(int(i * 7 % 13) - 6) / 16.0f;
    for (size_t i = 0; i < w2.size(); ++i) w2[i] = float(int(i * 5 % 11) - 5) / 32.0f;
    for (size_t i = 0; i < b1.size(); ++i) b1[i] = float(int(i % 5) - 2) / 4.0f;
    b.init_f32("w1", {64, 16, 3, 3}, w1).init_f32("b1", {64}, b1).init_f32("w2", {8, 64, 3, 3}, w2);
    tm::attr_ints(b.node("Conv", {"x", "w1", "b1"}, {"c1"}), "pads", {1, 1, 1, 1});  // 16 -> 64: Winograd
    b.node("Relu", {"c1"}, {"r1"});
    tm::attr_ints(b.node("Conv", {"r1", "w2"}, {"y"}), "pads", {1, 1, 1, 1});  // 64 -> 8: too thin
    const std::string bytes = b.bytes();
    const ml::graph g = ml::import_onnx_buffer(bytes.data(), bytes.size());
    const ml::plan::weight_layout plain = ml::plan::layout_weights(g), cpu = ml::plan::layout_weights(g, true);
    ASSERT_EQ(cpu.winograd.size(), 1u);
    EXPECT_TRUE(plain.winograd.empty());
    EXPECT_GE(cpu.bytes - plain.bytes, int64_t(16 * 64 * 16 * sizeof(float)));
    EXPECT_LT(cpu.bytes - plain.bytes, int64_t(16 * 64 * 16 * sizeof(float)) + 4096);

    auto device = reefline::gpu::make_cpu_device();
    ml::runtime rt(*device);
    auto m = rt.load_model_buffer(bytes.data(), bytes.size(), "winograd");
    EXPECT_EQ(m->weight_bytes(), cpu.bytes);
    auto in = rt.link_model(m);
    rt.configure_batch(*in, 2);
    std::vector<float> xv(2 * 16 * 12 * 12);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 37 % 23) - 11) / 5.0f;
    ml::bytes_t xb(xv.size() * 4);
    std::memcpy(xb.data(), xv.data(), xb.size());
    const ml::tensor x = ml::tensor::make(ml::dtype::f32, {2, 16, 12, 12}, xb);
    std::vector<ml::tensor> by_winograd, by_im2col;
    rt.infer_batch(*in, std::vector<ml::tensor>{x}, by_winograd);
    ml::kernels::use_conv_method(ml::kernels::conv_method::im2col);
    rt.infer_batch(*in, std::vector<ml::tensor>{x}, by_im2col);
    ml::kernels::use_conv_method(ml::kernels::conv_method::automatic);
    ASSERT_EQ(by_winograd[0].elements(), by_im2col[0].elements());
    double differ = 0;
    for (int64_t i = 0; i < by_im2col[0].elements(); ++i) {
        const double want = by_im2col[0].as_f64(i), got = by_winograd[0].as_f64(i);
        ASSERT_NEAR(got, want, 1e-4 * (1 + std::fabs(want))) << "at " << i;
        differ = std::max(differ, std::fabs(got - want));
    }
    EXPECT_GT(differ, 0.0);  // another way of summing: Winograd really ran
}

// The channel-blocked layout through one small CNN: a stem from the NCHW input, a c16 max pool,
// a Winograd layer, a residual, a batch norm, a depthwise layer whose reader (a Flatten) takes
// NCHW, a concatenation, a global pool, and a c16 value that a Transpose reads reordered. The
// plan keeps its invariant at batches 1 and 3 (images one by one), runs the c16 kernels, and
// gives the NCHW plan's outputs.
TEST(libml_plan, the_channel_blocked_layout_gives_the_nchw_plans_results) {
    if (!ml::kernels::cpu_has_avx512()) GTEST_SKIP() << "the c16 kernels need AVX-512";
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {-1, 3, 20, 20}).output("flat").output("pool").output("nhwc");
    const auto weights = [](size_t n, int seed) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = float(int((i * 7 + size_t(seed) * 13) % 17) - 8) / 24.0f;
        return v;
    };
    b.init_f32("w0", {32, 3, 3, 3}, weights(32 * 27, 1)).init_f32("b0", {32}, weights(32, 2));
    b.init_f32("w1", {64, 32, 3, 3}, weights(64 * 32 * 9, 3)).init_f32("w2", {64, 64, 3, 3}, weights(64 * 64 * 9, 4));
    b.init_f32("wd", {64, 1, 3, 3}, weights(64 * 9, 5)).init_f32("w3", {32, 64, 1, 1}, weights(32 * 64, 6));
    std::vector<float> var = weights(64, 9);
    for (float& v : var) v = std::fabs(v) + 0.5f;
    b.init_f32("s", {64}, weights(64, 7)).init_f32("bb", {64}, weights(64, 8)).init_f32("m", {64}, weights(64, 10));
    b.init_f32("v", {64}, var);
    tm::attr_ints(b.node("Conv", {"x", "w0", "b0"}, {"c0"}), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c0"}, {"r0"});
    auto* pool = b.node("MaxPool", {"r0"}, {"p0"});
    tm::attr_ints(pool, "kernel_shape", {3, 3});
    tm::attr_ints(pool, "strides", {2, 2});
    tm::attr_ints(pool, "pads", {1, 1, 1, 1});
    tm::attr_ints(b.node("Conv", {"p0", "w1"}, {"c1"}), "pads", {1, 1, 1, 1});  // 64 channels, 25 tiles: Winograd
    b.node("Relu", {"c1"}, {"r1"});
    tm::attr_ints(b.node("Conv", {"r1", "w2"}, {"c2"}), "pads", {1, 1, 1, 1});
    b.node("Add", {"c2", "r1"}, {"a2"});
    b.node("Relu", {"a2"}, {"r2"});
    b.node("BatchNormalization", {"r2", "s", "bb", "m", "v"}, {"bn"});
    b.node("Relu", {"bn"}, {"rb"});
    auto* dw = b.node("Conv", {"rb", "wd"}, {"d1"});
    tm::attr_ints(dw, "pads", {1, 1, 1, 1});
    tm::attr_i(dw, "group", 64);
    b.node("Flatten", {"d1"}, {"flat"});
    b.node("Conv", {"rb", "w3"}, {"c3"});
    tm::attr_i(b.node("Concat", {"c3", "rb"}, {"cat"}), "axis", 1);
    b.node("GlobalAveragePool", {"cat"}, {"pool"});
    tm::attr_ints(b.node("Transpose", {"r2"}, {"nhwc"}), "perm", {0, 2, 3, 1});
    const std::string bytes = b.bytes();

    auto device = reefline::gpu::make_cpu_device();
    std::vector<std::vector<ml::tensor>> results;  // c16, NCHW
    for (const bool c16 : {true, false}) {
        ml::use_c16_layout(c16);
        ml::plan_options o;
        o.compute_units = 1;
        o.image_run_min_bytes = 0;  // batch 3: images one by one through the runs
        ml::runtime rt(*device, o);
        auto in = rt.link_model(rt.load_model_buffer(bytes.data(), bytes.size(), "c16"));
        for (const int64_t batch : {1, 3}) {
            rt.configure_batch(*in, batch);
            EXPECT_EQ(in->current_plan().check_idempotence(), "");
            std::map<std::string, int> kernels;
            for (const auto& l : in->current_plan().launches()) ++kernels[l.kernel->name];
            if (c16) {
                EXPECT_GE(kernels["conv2d_c16"], 5);  // every convolution, the depthwise one too
                EXPECT_GE(kernels["pool2d_c16"], 1);
                EXPECT_GE(kernels["batchnorm_c16"], 1);
                EXPECT_EQ(kernels["conv2d"], 0);
            } else {
                EXPECT_EQ(kernels["conv2d_c16"], 0);
            }
            std::vector<float> xv(size_t(batch * 3 * 20 * 20));
            for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 37 % 23) - 11) / 7.0f;
            ml::bytes_t xb(xv.size() * 4);
            std::memcpy(xb.data(), xv.data(), xb.size());
            results.emplace_back();
            rt.infer_batch(*in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {batch, 3, 20, 20}, xb)},
                           results.back());
        }
    }
    ml::use_c16_layout(true);
    for (size_t r = 0; r < 2; ++r)  // batch 1, then 3: c16 (results r) against NCHW (r + 2)
        for (size_t o = 0; o < 3; ++o) {
            const ml::tensor& got = results[r][o];
            const ml::tensor& want = results[r + 2][o];
            ASSERT_EQ(got.shape, want.shape) << "output " << o;
            for (int64_t i = 0; i < want.elements(); ++i)
                ASSERT_NEAR(got.as_f64(i), want.as_f64(i), 2e-4 * (1 + std::fabs(want.as_f64(i)))) << "output " << o << " at " << i;
        }
}

// On several units a layer's output channels are split into tiles of one size: a stride-2
// 3x3 layer of 384 channels (direct where AVX-512 is, in tiles of up to 256 channels) was
// split 256 + 128, one unit doing two thirds of it. The two-unit plan's numbers are the
// one-unit plan's.
TEST(libml_plan, channel_tiles_on_several_units_are_of_one_size) {
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {1, 16, 35, 35}).output("y");
    std::vector<float> w(384 * 16 * 9);
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i * 13 % 17) - 8) / 64.0f;
    b.init_f32("w", {384, 16, 3, 3}, w);
    tm::attr_ints(b.node("Conv", {"x", "w"}, {"y"}), "strides", {2, 2});
    const std::string bytes = b.bytes();
    std::vector<float> xv(16 * 35 * 35);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 29 % 31) - 15) / 8.0f;
    ml::bytes_t xb(xv.size() * 4);
    std::memcpy(xb.data(), xv.data(), xb.size());
    std::vector<ml::tensor> ys[2];
    for (const unsigned units : {1u, 2u}) {
        auto device = reefline::gpu::make_cpu_device();
        ml::plan_options o;
        o.compute_units = units;
        ml::runtime rt(*device, o);
        auto in = rt.link_model(rt.load_model_buffer(bytes.data(), bytes.size(), "channel-tiles"));
        for (const auto& l : in->current_plan().launches())
            if (l.kernel == &reefline::ml::kernels::conv2d_kernel && units == 2) {
                reefline::ml::kernels::conv2d_args a;
                std::memcpy(&a, l.args.data(), sizeof a);
                const int64_t tiles = reefline::ml::kernels::ceil_div(384, a.tile_co);
                EXPECT_GE(tiles, 2) << "one tile of channels for two units";
                EXPECT_GE(384 - (tiles - 1) * a.tile_co, a.tile_co - 16) << "tiles of " << a.tile_co << " channels";
            }
        rt.infer_batch(*in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {1, 16, 35, 35}, xb)}, ys[units - 1]);
    }
    ASSERT_EQ(ys[0][0].elements(), ys[1][0].elements());
    for (int64_t i = 0; i < ys[0][0].elements(); ++i) ASSERT_EQ(ys[0][0].as_f64(i), ys[1][0].as_f64(i)) << "at " << i;
}

// A model of one input [-1, 16, h, w] linked on one unit at batches 1 and 4: some block of
// the batch-4 plan takes all four images (`each` sees every convolution's arguments), and
// the batch's numbers are those of its images run one at a time.
void expect_batch_of_four_one_by_one(const std::string& bytes, int64_t h, int64_t w,
                                     const std::function<void(const reefline::ml::kernels::conv2d_args&)>& each) {
    auto device = reefline::gpu::make_cpu_device();
    ml::plan_options o;
    o.compute_units = 1;
    ml::runtime rt(*device, o);
    auto m = rt.load_model_buffer(bytes.data(), bytes.size(), "small-planes");
    auto one = rt.link_model(m), four = rt.link_model(m);
    rt.configure_batch(*four, 4);
    EXPECT_EQ(four->current_plan().check_idempotence(), "");
    int64_t most_images = 0;
    for (const auto& l : four->current_plan().launches())
        if (l.kernel == &reefline::ml::kernels::conv2d_kernel) {
            reefline::ml::kernels::conv2d_args a;
            std::memcpy(&a, l.args.data(), sizeof a);
            each(a);
            most_images = std::max<int64_t>(most_images, reefline::ml::kernels::conv2d_image_tile(a));
        }
    EXPECT_EQ(most_images, 4) << "no block took the batch's four images";

    std::vector<float> xv(size_t(4 * 16 * h * w));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 29 % 31) - 15) / 8.0f;
    ml::bytes_t xb(xv.size() * 4);
    std::memcpy(xb.data(), xv.data(), xb.size());
    std::vector<ml::tensor> y4;
    rt.infer_batch(*four, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {4, 16, h, w}, xb)}, y4);
    const size_t per_in = size_t(16 * h * w * 4);
    for (int64_t item = 0; item < 4; ++item) {
        std::vector<ml::tensor> y1;
        rt.infer_batch(*one, std::vector<ml::tensor>{ml::tensor::make(
                                 ml::dtype::f32, {1, 16, h, w},
                                 ml::bytes_t(xb.begin() + item * per_in, xb.begin() + (item + 1) * per_in))},
                       y1);
        const int64_t per = y1[0].elements();
        ASSERT_EQ(y4[0].elements(), 4 * per);
        for (int64_t i = 0; i < per; ++i)
            ASSERT_NEAR(y1[0].as_f64(i), y4[0].as_f64(item * per + i), 1e-4) << "item " << item << " at " << i;
    }
}

// At batch > 1 an im2col convolution on 7x7 planes takes several images a block, one GEMM for
// them all (conv2d_args::tile_images), with the bias and the residual of each image: the
// numbers of running the images one at a time.
TEST(libml_plan, small_planes_take_several_images_a_block) {
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {-1, 16, 7, 7}).output("y");
    std::vector<float> w(80 * 16 * 9), bias(80), w2(80 * 16);
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i * 13 % 17) - 8) / 64.0f;
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = float(int(i % 9) - 4) / 8.0f;
    for (size_t i = 0; i < w2.size(); ++i) w2[i] = float(int(i * 7 % 11) - 5) / 32.0f;
    b.init_f32("w", {80, 16, 3, 3}, w).init_f32("b", {80}, bias).init_f32("w2", {80, 16, 1, 1}, w2);
    b.node("Conv", {"x", "w2"}, {"side"});  // the residual of the next, which runs after it
    tm::attr_ints(b.node("Conv", {"x", "w", "b"}, {"c"}), "pads", {1, 1, 1, 1});  // 80 channels: im2col
    b.node("Add", {"c", "side"}, {"sum"});
    b.node("Relu", {"sum"}, {"y"});
    const std::string bytes = b.bytes();

    expect_batch_of_four_one_by_one(bytes, 7, 7, [](const reefline::ml::kernels::conv2d_args&) {});
}

// At batch > 1 a layer of 256 output channels into a 7x7 plane goes to the GEMM with several
// images a block even where the direct kernel would take it alone (stride 2: ResNet-50's
// layer4 entry, 1.4x faster so at batch 8): the batch-1 plan's numbers.
TEST(libml_plan, wide_layers_on_small_planes_take_several_images_a_block) {
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {-1, 16, 14, 14}).output("y");
    std::vector<float> w(256 * 16 * 9);
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i * 13 % 17) - 8) / 64.0f;
    b.init_f32("w", {256, 16, 3, 3}, w);
    auto* conv = b.node("Conv", {"x", "w"}, {"y"});
    tm::attr_ints(conv, "strides", {2, 2});
    tm::attr_ints(conv, "pads", {1, 1, 1, 1});
    const std::string bytes = b.bytes();
    expect_batch_of_four_one_by_one(bytes, 14, 14, [](const reefline::ml::kernels::conv2d_args& a) {
        EXPECT_FALSE(reefline::ml::kernels::conv2d_direct_chosen(a));
    });
}


// GPU plans (plan_options::tiles_for::gpu) cut layers the cpu plans never do: 128 x 128 tiles,
// pixel tiles spanning the batch's images, and split-K where a layer has fewer output tiles
// than the device has units (two launches through a temporary). The cpu device runs any plan:
// a GPU plan's numbers there are the cpu plan's, for one unit (wide tiles, no split) and for
// 132 (an H100's SMs: split-K, the late layer's residual and ReLU applied after the sum of
// the chunks).
TEST(libml_plan, gpu_tiles_spanning_images_and_split_k_give_the_cpu_plans_results) {
    namespace tm = reefline::ml::test_models;
    tm::builder b;
    b.input("x", {-1, 32, 16, 16}).output("y").output("z");
    const auto weights = [](size_t n, int seed) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = float(int((i * 7 + size_t(seed) * 13) % 17) - 8) / 96.0f;
        return v;
    };
    b.init_f32("w0", {160, 32, 3, 3}, weights(160 * 32 * 9, 1)).init_f32("b0", {160}, weights(160, 2));
    b.init_f32("w1", {160, 160, 3, 3}, weights(160 * 160 * 9, 3)).init_f32("b1", {160}, weights(160, 4));
    b.init_f32("wl", {160, 130}, weights(160 * 130, 5));
    tm::attr_ints(b.node("Conv", {"x", "w0", "b0"}, {"c0"}), "pads", {1, 1, 1, 1});  // 160 x 256 pixels
    b.node("Relu", {"c0"}, {"r0"});
    auto* pool = b.node("MaxPool", {"r0"}, {"p0"});
    tm::attr_ints(pool, "kernel_shape", {4, 4});
    tm::attr_ints(pool, "strides", {4, 4});
    tm::attr_ints(b.node("Conv", {"p0", "w1", "b1"}, {"c1"}), "pads", {1, 1, 1, 1});  // 4x4 planes, K = 1440
    b.node("Add", {"c1", "p0"}, {"a1"});
    b.node("Relu", {"a1"}, {"y"});
    tm::attr_ints(b.node("Transpose", {"r0"}, {"t0"}), "perm", {0, 2, 3, 1});        // [n, 16, 16, 160]
    b.init_i64("rows", {3}, {0, 256, 160});
    b.node("Reshape", {"t0", "rows"}, {"m0"});                                         // [n, 256, 160]
    b.node("MatMul", {"m0", "wl"}, {"z"});                                             // 256 x 130 per image
    const std::string bytes = b.bytes();

    auto device = reefline::gpu::make_cpu_device();
    const int64_t batch = 3;
    std::vector<float> xv(size_t(batch * 32 * 16 * 16));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 37 % 23) - 11) / 7.0f;
    ml::bytes_t xb(xv.size() * 4);
    std::memcpy(xb.data(), xv.data(), xb.size());
    const auto run = [&](ml::plan_options::tiles_for tiles, uint32_t units, std::map<std::string, int>* seen) {
        ml::plan_options o;
        o.tiles = tiles;
        o.compute_units = units;
        ml::runtime rt(*device, o);
        auto in = rt.link_model(rt.load_model_buffer(bytes.data(), bytes.size(), "gpu-tiles"));
        rt.configure_batch(*in, batch);
        EXPECT_EQ(in->current_plan().check_idempotence(), "");
        for (const auto& l : in->current_plan().launches()) {
            if (!seen) break;
            if (l.kernel == &reefline::ml::kernels::conv2d_kernel) {
                reefline::ml::kernels::conv2d_args a;
                std::memcpy(&a, l.args.data(), sizeof a);
                if (a.span_images) ++(*seen)["span"];
                if (a.tile_co == 128 && a.tile_pix == 128) ++(*seen)["wide"];
                if (a.k_splits > 1) ++(*seen)[a.split_phase == 1 ? "split_partial" : "split_sum"];
            } else if (l.kernel == &reefline::ml::kernels::gemm_kernel) {
                reefline::ml::kernels::gemm_args g;
                std::memcpy(&g, l.args.data(), sizeof g);
                if (g.tile_m == 128 && g.tile_n == 128) ++(*seen)["wide_gemm"];
            }
        }
        std::vector<ml::tensor> out;
        rt.infer_batch(*in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {batch, 32, 16, 16}, xb)}, out);
        return out;
    };
    const auto want = run(ml::plan_options::tiles_for::cpu, 1, nullptr);
    std::map<std::string, int> one, many;
    for (auto [units, seen] : {std::pair{1u, &one}, std::pair{132u, &many}}) {
        const auto got = run(ml::plan_options::tiles_for::gpu, units, seen);
        ASSERT_EQ(got.size(), want.size());
        for (size_t o = 0; o < want.size(); ++o) {
            ASSERT_EQ(got[o].shape, want[o].shape);
            for (int64_t i = 0; i < want[o].elements(); ++i)
                ASSERT_NEAR(got[o].as_f64(i), want[o].as_f64(i), 1e-4 * (1 + std::fabs(want[o].as_f64(i))))
                    << units << " units, output " << o << " at " << i;
        }
    }
    EXPECT_EQ(one["span"], 2);
    EXPECT_GE(one["wide"], 1);   // the first layer: 160 channels x 768 pixels
    EXPECT_GE(one["wide_gemm"], 1);
    EXPECT_EQ(one["split_partial"], 0);
    // For 132 units both layers split K: 36 tiles (K = 288) and 3 tiles (K = 1440).
    EXPECT_EQ(many["span"], 4);
    EXPECT_EQ(many["split_partial"], 2);
    EXPECT_EQ(many["split_sum"], 2);
}

// A pointwise layer whose output only a 3x3 depthwise layer reads runs inside that layer's
// launch on CPUs with AVX-512 (kernels::pointwise_depthwise): one launch fewer, the pointwise
// output never in the arena, and the numbers of the two layers run apart (sums in another
// order: within 1e-5). Shapes off the kernels' tiles: 5, 20 and 300 input channels (the last
// in two passes of the sums), 12 and 24 channels (passes of 8 and of 4), 31x29 planes (18
// tiles of 48 pixels and one of 35), strides 1 and 2, each activation the blocks apply, with
// and without biases; batch 3 on one and two units.
TEST(libml_plan, a_pointwise_layer_runs_inside_the_depthwise_layer_after_it) {
    namespace tm = reefline::ml::test_models;
    namespace k = reefline::ml::kernels;
    struct variant {
        int64_t k, c, stride;
        const char* pre_act;  // "Clip", "Relu" or "" after the pointwise layer
        bool bias;
    };
    const int64_t h = 31, w = 29;
    for (const variant v : {variant{5, 12, 1, "Clip", true}, variant{20, 12, 2, "Relu", true}, variant{300, 16, 1, "", false},
                            variant{5, 24, 2, "Clip", false}}) {
        tm::builder b;
        b.input("x", {-1, v.k, h, w}).output("y");
        std::vector<float> pw(size_t(v.c * v.k)), pb(size_t(v.c)), dw(size_t(v.c * 9)), db(size_t(v.c));
        for (size_t i = 0; i < pw.size(); ++i) pw[i] = float(int(i * 13 % 17) - 8) / 16.0f;
        for (size_t i = 0; i < pb.size(); ++i) pb[i] = float(int(i % 7) - 3) / 4.0f;
        for (size_t i = 0; i < dw.size(); ++i) dw[i] = float(int(i * 7 % 11) - 5) / 8.0f;
        for (size_t i = 0; i < db.size(); ++i) db[i] = float(int(i % 5) - 2) / 8.0f;
        b.init_f32("pw", {v.c, v.k, 1, 1}, pw).init_f32("pb", {v.c}, pb).init_f32("dw", {v.c, 1, 3, 3}, dw);
        b.init_f32("db", {v.c}, db).init_f32("lo", {}, {0.0f}).init_f32("hi", {}, {6.0f});
        const std::string pre_act = v.pre_act;
        b.node("Conv", v.bias ? std::vector<std::string>{"x", "pw", "pb"} : std::vector<std::string>{"x", "pw"},
               {pre_act.empty() ? "e" : "e0"});
        if (pre_act == "Clip") b.node("Clip", {"e0", "lo", "hi"}, {"e"});
        if (pre_act == "Relu") b.node("Relu", {"e0"}, {"e"});
        auto* conv = b.node("Conv", {"e", "dw", "db"}, {"d"});
        tm::attr_i(conv, "group", v.c);
        tm::attr_ints(conv, "strides", {v.stride, v.stride});
        tm::attr_ints(conv, "pads", {1, 1, 1, 1});
        b.node("Clip", {"d", "lo", "hi"}, {"y"});
        const std::string bytes = b.bytes();
        std::vector<float> xv(size_t(3 * v.k * h * w));
        for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 29 % 31) - 15) / 8.0f;
        ml::bytes_t xb(xv.size() * 4);
        std::memcpy(xb.data(), xv.data(), xb.size());
        const ml::tensor x = ml::tensor::make(ml::dtype::f32, {3, v.k, h, w}, xb);
        for (const unsigned units : {1u, 2u}) {
            auto device = reefline::gpu::make_cpu_device();
            std::vector<ml::tensor> ys[2];
            size_t convs[2] = {}, folded[2] = {};
            int64_t arena[2] = {};
            for (const bool fold : {true, false}) {
                ml::plan_options o;
                o.compute_units = units;
                o.fold_pointwise = fold;
                ml::runtime rt(*device, o);
                auto in = rt.link_model(rt.load_model_buffer(bytes.data(), bytes.size(), "pointwise-depthwise"));
                rt.configure_batch(*in, 3);
                EXPECT_EQ(in->current_plan().check_idempotence(), "");
                for (const auto& l : in->current_plan().launches())
                    if (l.kernel == &k::conv2d_kernel) {
                        k::conv2d_args a;
                        std::memcpy(&a, l.args.data(), sizeof a);
                        ++convs[fold];
                        folded[fold] += a.pre_c_in > 0;
                    }
                arena[fold] = in->current_plan().arena_bytes();
                rt.infer_batch(*in, std::vector<ml::tensor>{x}, ys[fold]);
            }
            const std::string what = "k " + std::to_string(v.k) + " c " + std::to_string(v.c) + " stride " +
                                     std::to_string(v.stride) + " '" + pre_act + "' units " + std::to_string(units);
            EXPECT_EQ(folded[false], 0u) << what;
            if (k::cpu_has_avx512()) {
                EXPECT_GE(folded[true], 1u) << what;
                EXPECT_EQ(convs[true] * 2, convs[false]) << what << ": one launch for the two layers";
                EXPECT_LT(arena[true], arena[false]) << what << ": the pointwise output has no place in the arena";
            }
            ASSERT_EQ(ys[0][0].elements(), ys[1][0].elements());
            for (int64_t i = 0; i < ys[0][0].elements(); ++i) {
                const double ref = ys[false][0].as_f64(i);
                ASSERT_NEAR(ys[true][0].as_f64(i), ref, 1e-5 * std::max(1.0, std::abs(ref))) << what << " at " << i;
            }
        }
    }
}

}  // namespace
