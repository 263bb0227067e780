// Every kernel of the library on the GPU against its cpu implementation (and GEMM/conv against
// a double-precision reference): the same block decomposition gives the same results, within
// fp32 rounding (the GPU kernels use FMA and their own summation order), or within the
// rounding of fp16/bf16 inputs on the tensor-core path. Also: block slices compose, the
// completion counter, empty launches and launches of a preempted task.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "libml/kernels/gpu/launcher.h"
#include "tests/gpu/gpu_util.h"

using namespace gpu_test;


namespace {

double act_ref(double x, const k::epilogue& ep) {
    switch (ep.act) {
    case k::activation::none: return x;
    case k::activation::relu: return x > 0 ? x : 0;
    case k::activation::leaky_relu: return x >= 0 ? x : ep.alpha * x;
    case k::activation::sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case k::activation::tanh: return std::tanh(x);
    case k::activation::clip: return std::min<double>(std::max<double>(x, ep.alpha), ep.beta);
    case k::activation::hard_sigmoid: return std::clamp(ep.alpha * x + ep.beta, 0.0, 1.0);
    case k::activation::hard_swish: return x * std::clamp(x / 6.0 + 0.5, 0.0, 1.0);
    case k::activation::gelu_erf: return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752));
    case k::activation::gelu_tanh: return 0.5 * x * (1.0 + std::tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
    }
    return x;
}

// Compares f32 outputs: |got - want| <= atol + rtol * scale[i] (scale: the magnitude of the
// terms that made want[i]; |want[i]| when empty).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                  const std::string& what, const std::vector<double>& scale = {}) {
    REQUIRE(got.size() == want.size()) << what << ": " << got.size() << " vs " << want.size() << " elements";
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double s = scale.empty() ? std::fabs(double(want[i])) : scale[i];
        if (!close(got[i], want[i], rtol, atol, s)) {
            if (!bad++) first = i;
        } else if (!std::isnan(want[i]) && !std::isinf(want[i])) {
            worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
        }
    }
    EXPECT(bad == 0) << what << ": " << bad << " of " << got.size() << " differ; first at " << first << ": got "
                     << got[first] << ", want " << want[first];
}

template <typename T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    REQUIRE(got.size() == want.size()) << what;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && !bad++) first = i;
    EXPECT(bad == 0) << what << ": " << bad << " of " << got.size() << " differ; first at " << first;
}

k::nd_shape shape_of(std::initializer_list<int64_t> d) {
    k::nd_shape s{};
    s.rank = int32_t(d.size());
    int i = 0;
    for (auto v : d) s.dims[i++] = v;
    return s;
}

// The devices whose math the GEMM/conv tests cover, with the tolerance (relative to the sum of
// the products' magnitudes) each warrants.
struct math_case {
    const char* name;
    gpu::gpu_math math;
    double rtol;
};
const math_case maths[] = {
    {"fp32", gpu::gpu_math::fp32, 2e-5},
    {"tensor_f16", gpu::gpu_math::tensor_f16, 4e-3},
    {"tensor_bf16", gpu::gpu_math::tensor_bf16, 2e-2},
};

gpu::device& device_for(const math_case& m) {
    static std::unique_ptr<gpu::device> devs[3];
    if (m.math == gpu::gpu_math::fp32) return *the_device();
    auto& d = devs[int(m.math)];
    if (!d) {
        gpu::gpu_device_options o;
        o.math = m.math;
        d = gpu::make_gpu_device(o);
        at_end().push_back([&d] { d.reset(); });
    }
    return *d;
}

// ---- GEMM -----------------------------------------------------------------------------------

struct gemm_problem {
    int64_t batch, m, n, k;
    bool ta, tb;
    k::bias_kind bias;
    k::activation act;
    int32_t tm, tn, tk;
};

void check_gemm(const gemm_problem& p, uint32_t seed) {
    const int64_t B = p.batch, M = p.m, N = p.n, K = p.k;
    auto a = random_floats(size_t(std::max<int64_t>(1, B * M * K)), seed);
    auto b = random_floats(size_t(std::max<int64_t>(1, B * K * N)), seed + 1);
    auto bias = random_floats(size_t(B * M * N), seed + 2);
    k::gemm_args g{};
    g.batch = B; g.m = M; g.n = N; g.k = K;
    g.lda = p.ta ? M : K; g.ldb = p.tb ? K : N; g.ldc = N; g.ldbias = N;
    g.stride_a = M * K; g.stride_b = K * N; g.stride_c = M * N;
    g.stride_bias = p.bias == k::bias_kind::full ? M * N : 0;
    g.trans_a = p.ta; g.trans_b = p.tb; g.bias_mode = p.bias; g.alpha = 0.75f; g.beta = 1.5f;
    g.ep.act = p.act; g.ep.alpha = 0.1f; g.ep.beta = 0.6f;
    g.tile_m = p.tm; g.tile_n = p.tn; g.tile_k = p.tk;
    const int64_t grid = k::gemm_grid(g);
    // Reference in double, and the scale of each output's terms.
    std::vector<float> want(size_t(B * M * N));
    std::vector<double> scale(want.size());
    for (int64_t bt = 0; bt < B; ++bt)
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                double s = 0, mag = 0;
                for (int64_t q = 0; q < K; ++q) {
                    const double av = a[size_t(bt * M * K + (p.ta ? q * M + i : i * K + q))];
                    const double bv = b[size_t(bt * K * N + (p.tb ? j * K + q : q * N + j))];
                    s += av * bv;
                    mag += std::fabs(av * bv);
                }
                s *= 0.75;
                mag *= 0.75;
                const float* bb = bias.data() + (p.bias == k::bias_kind::full ? bt * M * N : 0);
                double bv = 0;
                switch (p.bias) {
                case k::bias_kind::none: break;
                case k::bias_kind::scalar: bv = bb[0]; break;
                case k::bias_kind::per_col: bv = bb[j]; break;
                case k::bias_kind::per_row: bv = bb[i]; break;
                case k::bias_kind::full: bv = bb[i * N + j]; break;
                }
                s += 1.5 * bv;
                const size_t o = size_t(bt * M * N + i * N + j);
                want[o] = float(act_ref(s, g.ep));
                scale[o] = 2 * (mag + std::fabs(1.5 * bv)) + 1e-3;
            }
    char what[160];
    std::snprintf(what, sizeof what, "gemm %lldx%lldx%lld batch %lld ta=%d tb=%d bias=%d act=%d tiles %d/%d/%d",
                  (long long)M, (long long)N, (long long)K, (long long)B, p.ta, p.tb, int(p.bias), int(p.act), p.tm,
                  p.tn, p.tk);
#if !defined(REEFLINE_NO_CPU_GEMM)
    {  // the cpu kernel agrees with the reference (sanity of the reference itself)
        std::vector<float> c(want.size(), NAN);
        k::gemm_args h = g;
        h.a = a.data(); h.b = b.data(); h.bias = bias.data(); h.c = c.data();
        REQUIRE(run_cpu(k::gemm_kernel, &h, grid));
        expect_close(c, want, 2e-5, 1e-6, std::string("cpu ") + what, scale);
    }
#endif
    for (const math_case& m : maths) {
        gpu::device& d = device_for(m);
        dev_buffer da(d, a), db(d, b), dbias(d, bias), dc(d, want.size() * sizeof(float));
        k::gemm_args h = g;
        h.a = da.get(); h.b = db.get(); h.bias = dbias.get(); h.c = dc.get();
        gpu_runner r(d);
        EXPECT(r.run(gemm_info, h, grid)) << what << " did not complete";
        expect_close(dc.read<float>(), want, m.rtol, 1e-6, std::string(m.name) + " " + what, scale);
    }
}

GPU_TEST(gemm_transposes_bias_kinds_activations_tiles) {
    uint32_t seed = 1;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (auto bk : {k::bias_kind::none, k::bias_kind::scalar, k::bias_kind::per_col, k::bias_kind::per_row,
                            k::bias_kind::full}) {
                check_gemm({2, 13, 21, 19, ta, tb, bk, k::activation::none, 5, 8, 6}, seed += 3);
                check_gemm({1, 70, 130, 45, ta, tb, bk, k::activation::relu, 64, 64, 128}, seed += 3);
                // Wide (128 x 128) sub-tiles: both staging layouts of A and B, partial edges.
                check_gemm({1, 150, 260, 45, ta, tb, bk, k::activation::relu, 128, 128, 128}, seed += 3);
            }
    // Wide sub-tiles with 16-byte weight loads (K % 4 == 0), and a block of several of them.
    check_gemm({1, 129, 131, 64, false, false, k::bias_kind::per_col, k::activation::none, 128, 128, 128}, 90);
    check_gemm({2, 130, 270, 300, false, true, k::bias_kind::per_row, k::activation::gelu_tanh, 128, 256, 2048}, 91);
    // cpu-sized tiles (a block loops over 64 x 64 sub-tiles), GEMV-like and K-heavy shapes.
    check_gemm({1, 100, 300, 200, false, true, k::bias_kind::per_col, k::activation::gelu_tanh, 64, 256, 2048}, 101);
    check_gemm({1, 1, 1000, 512, false, true, k::bias_kind::per_col, k::activation::none, 1, 256, 2048}, 102);
    check_gemm({3, 8, 8, 1100, true, false, k::bias_kind::none, k::activation::sigmoid, 8, 8, 100}, 103);
    check_gemm({1, 33, 17, 0, false, false, k::bias_kind::per_row, k::activation::clip, 64, 64, 1}, 104);
    for (auto act : {k::activation::leaky_relu, k::activation::tanh, k::activation::hard_sigmoid,
                     k::activation::hard_swish, k::activation::gelu_erf})
        check_gemm({1, 20, 30, 40, false, false, k::bias_kind::per_col, act, 64, 64, 128}, 110 + uint32_t(act));
}

// ---- convolution ------------------------------------------------------------------------------

struct conv_problem {
    int64_t n, ci, h, w, co, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, g;
};

// How a GPU plan may cut a layer besides its tiles: pixel tiles spanning images, split-K into
// chunks of k_chunk (two launches).
struct conv_cut {
    int32_t span_images = 0, k_chunk = 0;
};

// Runs a (possibly split) convolution: one launch, or the split's two phases through a
// partial buffer of the device's memory from `partial`. False: a launch did not complete.
template <class Run, class Alloc>
bool run_conv(k::conv2d_args a, Run run, Alloc partial) {
    if (!k::conv2d_split(a)) return run(a);
    a.partial = partial(size_t(a.k_splits) * size_t(a.n * a.c_out * a.h_out * a.w_out));
    a.split_phase = 1;
    if (!run(a)) return false;
    a.split_phase = 2;
    return run(a);
}

void check_conv(const conv_problem& c, k::activation act, bool residual, int32_t tco, int32_t tpix, int32_t tk,
                uint32_t seed, int32_t tgroups = 0, conv_cut cut = {}) {
    const int64_t ho = (c.h + c.pt + c.pb - c.dh * (c.kh - 1) - 1) / c.sh + 1;
    const int64_t wo = (c.w + c.pl + c.pr - c.dw * (c.kw - 1) - 1) / c.sw + 1;
    auto x = random_floats(size_t(c.n * c.ci * c.h * c.w), seed);
    auto w = random_floats(size_t(c.co * (c.ci / c.g) * c.kh * c.kw), seed + 1);
    auto b = random_floats(size_t(c.co), seed + 2);
    auto res = random_floats(size_t(c.n * c.co * ho * wo), seed + 3);
    k::conv2d_args a{};
    a.n = c.n; a.c_in = c.ci; a.h = c.h; a.w_in = c.w; a.c_out = c.co; a.kh = c.kh; a.kw = c.kw;
    a.stride_h = c.sh; a.stride_w = c.sw; a.pad_top = c.pt; a.pad_left = c.pl;
    a.dil_h = c.dh; a.dil_w = c.dw; a.groups = c.g; a.h_out = ho; a.w_out = wo;
    a.ep.act = act; a.ep.alpha = 0.1f; a.ep.beta = 0.5f;
    a.tile_co = tco; a.tile_pix = tpix; a.tile_k = tk; a.tile_groups = tgroups;
    a.span_images = cut.span_images;
    if (cut.k_chunk > 0) {
        a.k_chunk = cut.k_chunk;
        a.k_splits = int32_t(k::ceil_div(k::conv2d_k(a), cut.k_chunk));
    }
    std::vector<float> want(size_t(c.n * c.co * ho * wo));
    std::vector<double> scale(want.size());
    const int64_t cig = c.ci / c.g, cog = c.co / c.g;
    for (int64_t n = 0; n < c.n; ++n)
        for (int64_t o = 0; o < c.co; ++o)
            for (int64_t oy = 0; oy < ho; ++oy)
                for (int64_t ox = 0; ox < wo; ++ox) {
                    double s = 0, mag = 0;
                    const int64_t g = o / cog;
                    for (int64_t ic = 0; ic < cig; ++ic)
                        for (int64_t r = 0; r < c.kh; ++r)
                            for (int64_t q = 0; q < c.kw; ++q) {
                                const int64_t iy = oy * c.sh - c.pt + r * c.dh, ix = ox * c.sw - c.pl + q * c.dw;
                                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                                const double t = double(x[size_t(((n * c.ci + g * cig + ic) * c.h + iy) * c.w + ix)]) *
                                                 w[size_t(((o * cig + ic) * c.kh + r) * c.kw + q)];
                                s += t;
                                mag += std::fabs(t);
                            }
                    const size_t oi = size_t(((n * c.co + o) * ho + oy) * wo + ox);
                    s += b[size_t(o)];
                    if (residual) s += res[oi];
                    want[oi] = float(act_ref(s, a.ep));
                    scale[oi] = 2 * (mag + std::fabs(b[size_t(o)]) + (residual ? std::fabs(res[oi]) : 0)) + 1e-3;
                }
    char what[200];
    std::snprintf(what, sizeof what, "conv n%lld ci%lld %lldx%lld co%lld k%lldx%lld s%lld,%lld d%lld,%lld g%lld act=%d res=%d tiles %d/%d/%d/%d span %d chunk %d",
                  (long long)c.n, (long long)c.ci, (long long)c.h, (long long)c.w, (long long)c.co, (long long)c.kh,
                  (long long)c.kw, (long long)c.sh, (long long)c.sw, (long long)c.dh, (long long)c.dw, (long long)c.g,
                  int(act), int(residual), tco, tpix, tk, tgroups, cut.span_images, cut.k_chunk);
#if !defined(REEFLINE_NO_CPU_GEMM)
    {
        std::vector<float> y(want.size(), NAN);
        k::conv2d_args h = a;
        h.x = x.data(); h.w = w.data(); h.bias = b.data(); h.residual = residual ? res.data() : nullptr; h.y = y.data();
        std::vector<float> part;
        REQUIRE(run_conv(
            h,
            [](const k::conv2d_args& l) {
                return run_cpu(k::conv2d_kernel, &l, k::conv2d_grid(l), std::max<size_t>(k::conv2d_scratch_bytes(l), 64));
            },
            [&part](size_t n) { part.assign(n, NAN); return part.data(); }));
        expect_close(y, want, 2e-5, 1e-6, std::string("cpu ") + what, scale);
    }
#endif
    const bool fp32_only = tco >= 128 || cut.span_images || cut.k_chunk;
    for (const math_case& m : maths) {
        if (fp32_only && m.math != gpu::gpu_math::fp32) continue;
        gpu::device& d = device_for(m);
        dev_buffer dx(d, x), dw(d, w), db(d, b), dr(d, res), dy(d, want.size() * sizeof(float));
        k::conv2d_args h = a;
        h.x = dx.get(); h.w = dw.get(); h.bias = db.get(); h.residual = residual ? dr.get() : nullptr; h.y = dy.get();
        gpu_runner r(d);
        std::unique_ptr<dev_buffer> part;
        EXPECT(run_conv(
            h, [&](const k::conv2d_args& l) { return r.run(conv2d_info, l, k::conv2d_grid(l)); },
            [&](size_t n) {
                part = std::make_unique<dev_buffer>(d, n * sizeof(float));
                return part->get();
            }))
            << what << " did not complete";
        expect_close(dy.read<float>(), want, m.rtol, 1e-6, std::string(m.name) + " " + what, scale);
    }
}

GPU_TEST(conv_shapes_groups_dilations_epilogues_tiles) {
    const conv_problem cases[] = {
        {2, 3, 9, 11, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},    // 3x3 same
        {1, 8, 10, 10, 12, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},   // pointwise
        {1, 4, 13, 13, 6, 5, 3, 2, 3, 2, 0, 1, 2, 1, 1, 2},    // asymmetric, grouped
        {1, 6, 12, 12, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 6},    // depthwise, dilated
        {2, 3, 15, 15, 10, 11, 11, 4, 4, 2, 2, 2, 2, 1, 1, 1}, // alexnet-like stem
        {1, 64, 14, 14, 80, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},  // several K chunks, co > 64
    };
    uint32_t seed = 200;
    for (const conv_problem& c : cases) {
        check_conv(c, k::activation::relu, false, 8, 17, 7, seed += 5);           // odd tiles: every edge
        check_conv(c, k::activation::none, true, 64, 64, 128, seed += 5);         // GPU tiles, residual
        check_conv(c, k::activation::relu, true, 256, 4096, 1024, seed += 5);     // cpu-like tiles
        check_conv(c, k::activation::hard_swish, false, 64, 64, 128, seed += 5);  // other activation
        check_conv(c, k::activation::relu, false, 256, 4096, 1024, seed += 5, 4); // 4 groups a block
    }
    // What GPU plans add (fp32: the tensor-core paths share the cut but not the wide tiles):
    // wide sub-tiles, tiles spanning images, split-K (chunks aligned, odd, and with wide
    // tiles), each on its own and together.
    for (const conv_problem& c : {cases[0], cases[2], cases[4], cases[5]}) {
        check_conv(c, k::activation::relu, true, 128, 128, 128, seed += 5);
        check_conv(c, k::activation::relu, true, 128, 128, 128, seed += 5, 0, {1, 0});
        check_conv(c, k::activation::none, false, 64, 64, 128, seed += 5, 0, {1, 24});
        check_conv(c, k::activation::relu, true, 128, 128, 128, seed += 5, 0, {1, 32});
        check_conv(c, k::activation::hard_swish, true, 128, 128, 128, seed += 5, 0, {0, 10});
        check_conv(c, k::activation::relu, false, 64, 64, 128, seed += 5, 0, {1, 13});
    }
}

GPU_TEST(block_slices_compose_bit_identically) {
    gpu::device& d = *the_device();
    const int64_t M = 150, N = 140, K = 90;
    auto a = random_floats(size_t(M * K), 7), b = random_floats(size_t(K * N), 8);
    dev_buffer da(d, a), db(d, b), whole(d, size_t(M * N) * 4), sliced(d, size_t(M * N) * 4);
    k::gemm_args g{};
    g.a = da.get(); g.b = db.get(); g.batch = 1; g.m = M; g.n = N; g.k = K;
    g.lda = K; g.ldb = N; g.ldc = N; g.alpha = 1; g.tile_m = 64; g.tile_n = 64; g.tile_k = 32;
    const int64_t grid = k::gemm_grid(g);
    gpu_runner r(d);
    g.c = whole.get();
    EXPECT(r.run(gemm_info, g, grid));
    g.c = sliced.get();
    EXPECT(r.run(gemm_info, g, grid, 0, 2));         // an RT kernel's share ...
    EXPECT(r.run(gemm_info, g, grid, 2, 3));
    EXPECT(r.run(gemm_info, g, grid, 5, grid - 5));  // ... and the rest, later
    expect_equal(sliced.read<float>(), whole.read<float>(), "gemm in slices");
}

GPU_TEST(completion_counter_empty_launches_and_flags) {
    gpu::device& d = *the_device();
    gpu_runner r(d);
    auto x = random_floats(1000, 9);
    dev_buffer dx(d, x), dy(d, x.size() * 4);
    k::unary_args u{};
    u.x = dx.get(); u.y = dy.get(); u.count = 1000; u.op = k::unary_op::neg; u.per_block = 100;
    const int64_t grid = k::unary_grid(u);
    EXPECT(r.run(k::unary_kernel, u, grid));
    EXPECT(r.w->completed.load() == 1u);
    EXPECT(r.run(k::unary_kernel, u, grid, 3, 0)) << "an empty slice completes like the cpu backend's";
    EXPECT(r.w->completed.load() == 2u);
    // A flagged task: launches exit without advancing the counter and write nothing.
    dev_buffer dz(d, x.size() * 4);
    const auto before = dz.read<uint32_t>();
    u.y = dz.get();
    d.set_task_flag(r.w, 1);
    EXPECT(!r.run(k::unary_kernel, u, grid));
    EXPECT(!r.run(k::unary_kernel, u, grid, 0, 0));
    EXPECT(r.w->completed.load() == 2u) << "got " << r.w->completed.load();
    expect_equal(dz.read<uint32_t>(), before, "output of a flagged launch");
    // The task restores: same launch, flag down.
    d.set_task_flag(r.w, 0);
    EXPECT(r.run(k::unary_kernel, u, grid));
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = -x[i];
    expect_equal(dz.read<float>(), want, "unary neg after restore");
    // A launch without task words still runs (and advances nothing).
    dev_buffer dw(d, x.size() * 4);
    u.y = dw.get();
    d.launch(r.s, gpu::launch{&k::unary_kernel, &u, sizeof u, uint32_t(grid), 0, uint32_t(grid), nullptr, 0});
    d.synchronize(r.s);
    expect_equal(dw.read<float>(), want, "unary neg without task words");
}

GPU_TEST(preempted_conv_restarts_identically) {
    gpu::device& d = *the_device();
    auto x = random_floats(2 * 32 * 40 * 40, 9), w = random_floats(64 * 32 * 9, 10);
    dev_buffer dx(d, x), dw(d, w), y1(d, size_t(2 * 64 * 40 * 40) * 4), y2(d, size_t(2 * 64 * 40 * 40) * 4);
    k::conv2d_args a{};
    a.x = dx.get(); a.w = dw.get(); a.n = 2; a.c_in = 32; a.h = 40; a.w_in = 40; a.c_out = 64;
    a.kh = 3; a.kw = 3; a.stride_h = a.stride_w = 1; a.pad_top = a.pad_left = 1;
    a.dil_h = a.dil_w = 1; a.groups = 1; a.h_out = 40; a.w_out = 40;
    a.tile_co = 64; a.tile_pix = 64; a.tile_k = 32;
    const int64_t grid = k::conv2d_grid(a);
    gpu_runner r(d);
    a.y = y1.get();
    EXPECT(r.run(conv2d_info, a, grid));
    a.y = y2.get();
    d.set_task_flag(r.w, 1);
    EXPECT(!r.run(conv2d_info, a, grid));
    d.set_task_flag(r.w, 0);
    EXPECT(r.run(conv2d_info, a, grid));
    expect_equal(y2.read<float>(), y1.read<float>(), "conv re-run after preemption");
}

// ---- element-wise and friends: GPU against the cpu kernel --------------------------------------

// Runs `args` (host pointers) on the cpu and `dargs` (device pointers) on the GPU; compares the
// output buffers.
template <typename A>
void both(const gpu::kernel_info& ki, const A& host_args, const A& dev_args, int64_t grid, const char* what) {
    REQUIRE(run_cpu(ki, &host_args, grid)) << what << " on the cpu";
    gpu_runner r(*the_device());
    EXPECT(r.run(ki, dev_args, grid)) << what << " on the GPU did not complete";
}

GPU_TEST(copy_transpose_slice_element_sizes) {
    gpu::device& d = *the_device();
    for (int eb : {1, 2, 4, 8}) {
        std::vector<uint8_t> x(size_t(2 * 3 * 40) * size_t(eb));
        for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t(i * 7 + 3);
        // Transpose [2,3,40] -> [40,2,3], then a negative-step slice.
        for (int variant = 0; variant < 2; ++variant) {
            k::copy_args a{};
            a.element_bytes = eb;
            a.per_block = 37;
            if (variant == 0) {
                a.shape = shape_of({40, 2, 3});
                const int64_t xs[3] = {1, 120, 40}, ys[3] = {6, 3, 1};
                std::copy(xs, xs + 3, a.x_strides);
                std::copy(ys, ys + 3, a.y_strides);
            } else {
                a.shape = shape_of({2, 3, 19});
                a.x_offset = 2 * 40 + 1;
                const int64_t xs[3] = {120, -40, 2}, ys[3] = {57, 19, 1};
                std::copy(xs, xs + 3, a.x_strides);
                std::copy(ys, ys + 3, a.y_strides);
            }
            const size_t out = size_t(k::nd_count(a.shape)) * size_t(eb);
            std::vector<uint8_t> y(out, 0);
            dev_buffer dx(d, x), dy(d, out);
            k::copy_args h = a, g = a;
            h.x = x.data(); h.y = y.data();
            g.x = dx.get(); g.y = dy.get();
            both(k::copy_kernel, h, g, k::copy_grid(a), "copy");
            expect_equal(dy.read<uint8_t>(), y, "copy element_bytes " + std::to_string(eb) + " variant " + std::to_string(variant));
        }
    }
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

GPU_TEST(binary_ops_broadcast_and_types) {
    gpu::device& d = *the_device();
    const k::binary_op ops[] = {k::binary_op::add, k::binary_op::sub, k::binary_op::mul, k::binary_op::div,
                                k::binary_op::pow, k::binary_op::max, k::binary_op::min, k::binary_op::equal,
                                k::binary_op::greater, k::binary_op::less};
    auto a = random_floats(2 * 3 * 50, 12, 0.1f, 2.0f), b = random_floats(3, 13, 0.1f, 2.0f);
    a[5] = NAN;
    b[1] = a[3 * 50 + 1];  // some equal pairs
    for (auto op : ops) {
        k::binary_args g{};
        g.shape = shape_of({2, 3, 50});
        const int64_t as[3] = {150, 50, 1}, bs[3] = {0, 1, 0};
        std::copy(as, as + 3, g.a_strides);
        std::copy(bs, bs + 3, g.b_strides);
        g.op = op; g.per_block = 64;
        g.ep.act = op == k::binary_op::add ? k::activation::sigmoid : k::activation::none;
        std::vector<float> y(300, -1);
        dev_buffer da(d, a), db(d, b), dy(d, y.size() * 4);
        k::binary_args h = g, gg = g;
        h.a = a.data(); h.b = b.data(); h.y = y.data();
        gg.a = da.get(); gg.b = db.get(); gg.y = dy.get();
        both(k::binary_kernel, h, gg, k::binary_grid(g), "binary");
        expect_close(dy.read<float>(), y, 2e-6, 1e-7, "binary op " + std::to_string(int(op)));
    }
    // Typed paths: i64 with i32 -> i64 (integer arithmetic), f16 with f64 -> f32 (double), u8 compare.
    struct typed {
        k::elem at, bt, yt;
        k::binary_op op;
    };
    const typed cases[] = {
        {k::elem::i64, k::elem::i32, k::elem::i64, k::binary_op::mul},
        {k::elem::i64, k::elem::i64, k::elem::i64, k::binary_op::div},
        {k::elem::i32, k::elem::i32, k::elem::i32, k::binary_op::pow},
        {k::elem::f16, k::elem::f64, k::elem::f32, k::binary_op::add},
        {k::elem::f64, k::elem::f64, k::elem::f64, k::binary_op::pow},
        {k::elem::u8, k::elem::u8, k::elem::boolean, k::binary_op::greater},
        {k::elem::i8, k::elem::f32, k::elem::f16, k::binary_op::sub},
    };
    auto size_of = [](k::elem t) { return t == k::elem::f64 || t == k::elem::i64 ? 8 : t == k::elem::f32 || t == k::elem::i32 ? 4 : t == k::elem::f16 ? 2 : 1; };
    std::mt19937 rng(14);
    for (const typed& t : cases) {
        const int64_t n = 200;
        std::vector<uint8_t> av(size_t(n * size_of(t.at))), bv(size_t(n * size_of(t.bt)));
        auto fill = [&](std::vector<uint8_t>& v, k::elem e) {
            for (size_t i = 0; i < v.size(); i += size_t(size_of(e))) {
                const int r = int(rng() % 9) - 3;
                switch (e) {
                case k::elem::i64: { int64_t q = r; std::memcpy(&v[i], &q, 8); break; }
                case k::elem::i32: { int32_t q = r; std::memcpy(&v[i], &q, 4); break; }
                case k::elem::f64: { double q = r * 0.75 + 0.1; std::memcpy(&v[i], &q, 8); break; }
                case k::elem::f32: { float q = float(r) * 0.5f; std::memcpy(&v[i], &q, 4); break; }
                case k::elem::f16: { uint16_t q = uint16_t(0x3c00 + (rng() % 512)); std::memcpy(&v[i], &q, 2); break; }
                case k::elem::i8: v[i] = uint8_t(int8_t(r)); break;
                default: v[i] = uint8_t(rng() % 4); break;
                }
            }
        };
        fill(av, t.at);
        fill(bv, t.bt);
        k::binary_args g{};
        g.shape = shape_of({n});
        g.a_strides[0] = 1; g.b_strides[0] = 1;
        g.op = t.op; g.per_block = 64; g.a_type = t.at; g.b_type = t.bt; g.y_type = t.yt;
        std::vector<uint8_t> y(size_t(n * size_of(t.yt)), 0);
        dev_buffer da(d, av), db(d, bv), dy(d, y.size());
        k::binary_args h = g, gg = g;
        h.a = reinterpret_cast<const float*>(av.data()); h.b = reinterpret_cast<const float*>(bv.data());
        h.y = reinterpret_cast<float*>(y.data());
        gg.a = da.get(); gg.b = db.get(); gg.y = dy.get();
        both(k::binary_kernel, h, gg, k::binary_grid(g), "typed binary");
        if (t.at == k::elem::f64 && t.op == k::binary_op::pow) {
            std::vector<double> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
            std::memcpy(got.data(), dy.read<uint8_t>().data(), y.size());
            std::memcpy(want.data(), y.data(), y.size());
            size_t bad = 0;
            for (int64_t i = 0; i < n; ++i) bad += !close(got[size_t(i)], want[size_t(i)], 1e-14, 0, std::fabs(want[size_t(i)]));
            EXPECT(bad == 0) << "f64 pow: " << bad << " differ";
        } else {
            expect_equal(dy.read<uint8_t>(), y, "typed binary " + std::to_string(int(t.at)) + "," + std::to_string(int(t.bt)) +
                                                    "->" + std::to_string(int(t.yt)) + " op " + std::to_string(int(t.op)));
        }
    }
}

GPU_TEST(unary_ops_casts_and_clip) {
    gpu::device& d = *the_device();
    const k::unary_op ops[] = {k::unary_op::identity, k::unary_op::neg, k::unary_op::abs, k::unary_op::sqrt,
                               k::unary_op::exp, k::unary_op::log, k::unary_op::erf, k::unary_op::sin,
                               k::unary_op::cos, k::unary_op::reciprocal, k::unary_op::floor, k::unary_op::ceil,
                               k::unary_op::scale, k::unary_op::fill, k::unary_op::clip};
    auto x = random_floats(1000, 15, -3, 3);
    for (auto op : ops) {
        for (bool with_ep : {false, true}) {
            k::unary_args u{};
            u.count = 1000; u.op = op; u.alpha = -0.5f; u.beta = 1.25f; u.per_block = 300;
            if (with_ep) { u.ep.act = k::activation::gelu_erf; }
            std::vector<float> y(1000, -7);
            dev_buffer dx(d, x), dy(d, y.size() * 4);
            k::unary_args h = u, g = u;
            h.x = x.data(); h.y = y.data();
            g.x = dx.get(); g.y = dy.get();
            both(k::unary_kernel, h, g, k::unary_grid(u), "unary");
            expect_close(dy.read<float>(), y, 4e-6, 1e-6, "unary op " + std::to_string(int(op)) + (with_ep ? " + gelu" : ""));
        }
    }
    // Casts: f32 -> i64, i64 -> f16, f16 -> f32, and an integer clip.
    std::vector<float> xf = random_floats(300, 16, -100, 100);
    std::vector<int64_t> xi(300);
    for (size_t i = 0; i < xi.size(); ++i) xi[i] = int64_t(i) - 150;
    struct cast_case { k::elem xt, yt; k::unary_op op; const void* host; size_t bytes; };
    std::vector<uint8_t> f16(600);
    for (size_t i = 0; i < 300; ++i) { const uint16_t h = uint16_t(0x3000 + i * 37); std::memcpy(&f16[i * 2], &h, 2); }
    const cast_case casts[] = {
        {k::elem::f32, k::elem::i64, k::unary_op::identity, xf.data(), 1200},
        {k::elem::i64, k::elem::f16, k::unary_op::identity, xi.data(), 2400},
        {k::elem::f16, k::elem::f32, k::unary_op::identity, f16.data(), 600},
        {k::elem::i64, k::elem::i32, k::unary_op::clip, xi.data(), 2400},
        {k::elem::f32, k::elem::f64, k::unary_op::clip, xf.data(), 1200},
    };
    auto size_of = [](k::elem t) { return t == k::elem::f64 || t == k::elem::i64 ? 8 : t == k::elem::f32 || t == k::elem::i32 ? 4 : t == k::elem::f16 ? 2 : 1; };
    for (const cast_case& c : casts) {
        std::vector<uint8_t> xv(static_cast<const uint8_t*>(c.host), static_cast<const uint8_t*>(c.host) + c.bytes);
        k::unary_args u{};
        u.count = 300; u.op = c.op; u.alpha = -20; u.beta = 30; u.per_block = 128; u.x_type = c.xt; u.y_type = c.yt;
        std::vector<uint8_t> y(size_t(300 * size_of(c.yt)), 0);
        dev_buffer dx(d, xv), dy(d, y.size());
        k::unary_args h = u, g = u;
        h.x = reinterpret_cast<const float*>(xv.data()); h.y = reinterpret_cast<float*>(y.data());
        g.x = dx.get(); g.y = dy.get();
        both(k::unary_kernel, h, g, k::unary_grid(u), "cast");
        expect_equal(dy.read<uint8_t>(), y, "cast " + std::to_string(int(c.xt)) + "->" + std::to_string(int(c.yt)));
    }
}

GPU_TEST(where_f32_and_typed) {
    gpu::device& d = *the_device();
    auto cond = random_floats(4 * 5, 17);
    for (auto& c : cond) c = c > 0 ? 1.0f : 0.0f;
    auto a = random_floats(3 * 4 * 5, 18), b = random_floats(5, 19);
    k::where_args w{};
    w.shape = shape_of({3, 4, 5});
    const int64_t cs[3] = {0, 5, 1}, as[3] = {20, 5, 1}, bs[3] = {0, 0, 1};
    std::copy(cs, cs + 3, w.c_strides);
    std::copy(as, as + 3, w.a_strides);
    std::copy(bs, bs + 3, w.b_strides);
    w.per_block = 16;
    std::vector<float> y(60, -1);
    dev_buffer dc(d, cond), da(d, a), db(d, b), dy(d, 240);
    k::where_args h = w, g = w;
    h.cond = cond.data(); h.a = a.data(); h.b = b.data(); h.y = y.data();
    g.cond = dc.get(); g.a = da.get(); g.b = db.get(); g.y = dy.get();
    both(k::where_kernel, h, g, k::where_grid(w), "where");
    expect_equal(dy.read<float>(), y, "where f32");
    // boolean condition, i64 values
    std::vector<uint8_t> cb(20);
    for (size_t i = 0; i < cb.size(); ++i) cb[i] = uint8_t(i % 3 == 0);
    std::vector<int64_t> ai(60), bi(5);
    for (size_t i = 0; i < ai.size(); ++i) ai[i] = int64_t(i) * 1000003;
    for (size_t i = 0; i < bi.size(); ++i) bi[i] = -int64_t(i) - 1;
    w.c_type = k::elem::boolean; w.type = k::elem::i64;
    std::vector<int64_t> yi(60, 0);
    dev_buffer dcb(d, cb), dai(d, ai), dbi(d, bi), dyi(d, 480);
    h = w; g = w;
    h.cond = reinterpret_cast<const float*>(cb.data()); h.a = reinterpret_cast<const float*>(ai.data());
    h.b = reinterpret_cast<const float*>(bi.data()); h.y = reinterpret_cast<float*>(yi.data());
    g.cond = dcb.get(); g.a = dai.get(); g.b = dbi.get(); g.y = dyi.get();
    both(k::where_kernel, h, g, k::where_grid(w), "where typed");
    expect_equal(dyi.read<int64_t>(), yi, "where boolean/i64");
}

GPU_TEST(row_softmax_layer_norm_reductions) {
    gpu::device& d = *the_device();
    const k::row_op ops[] = {k::row_op::softmax, k::row_op::log_softmax, k::row_op::layer_norm,
                             k::row_op::reduce_mean, k::row_op::reduce_sum, k::row_op::reduce_max};
    for (auto op : ops)
        for (int64_t inner : {int64_t(1), int64_t(7)}) {
            const int64_t outer = 5, axis = 1000;
            auto x = random_floats(size_t(outer * axis * inner), 20, -5, 5);
            auto scale = random_floats(size_t(axis * inner), 21), bias = random_floats(size_t(axis * inner), 22);
            k::row_args r{};
            r.outer = outer; r.axis = axis; r.inner = inner; r.epsilon = 1e-5f; r.op = op; r.rows_per_block = 3;
            const bool reduce = op == k::row_op::reduce_mean || op == k::row_op::reduce_sum || op == k::row_op::reduce_max;
            const size_t ny = reduce ? size_t(outer * inner) : x.size();
            std::vector<float> y(ny, -1), mean(size_t(outer), -1), inv(size_t(outer), -1);
            dev_buffer dx(d, x), ds(d, scale), db(d, bias), dy(d, ny * 4), dm(d, mean), di(d, inv);
            k::row_args h = r, g = r;
            h.x = x.data(); h.scale = scale.data(); h.bias = bias.data(); h.y = y.data();
            g.x = dx.get(); g.scale = ds.get(); g.bias = db.get(); g.y = dy.get();
            if (op == k::row_op::layer_norm) {
                h.mean_out = mean.data(); h.inv_std_out = inv.data();
                g.mean_out = dm.get(); g.inv_std_out = di.get();
            }
            both(k::row_kernel, h, g, k::row_grid(r), "row");
            const std::string what = "row op " + std::to_string(int(op)) + " inner " + std::to_string(inner);
            // A layer norm's output is (x - mean) * inv_std * scale + bias: where those terms
            // cancel, float arithmetic (the cpu's vector path) is exact only to an ulp of the
            // terms, so they set the scale of the tolerance.
            std::vector<double> terms;
            if (op == k::row_op::layer_norm) {
                const int64_t n = axis * inner;
                terms.resize(x.size());
                for (size_t e = 0; e < x.size(); ++e) {
                    const size_t u = e / size_t(n), i = e % size_t(n);
                    terms[e] = std::fabs((double(x[e]) - mean[u]) * inv[u] * scale[i]) + std::fabs(double(bias[i]));
                }
            }
            expect_close(dy.read<float>(), y, 2e-6, 1e-7, what, terms);
            if (op == k::row_op::layer_norm) {
                expect_close(dm.read<float>(), mean, 1e-6, 1e-7, what + " mean");
                expect_close(di.read<float>(), inv, 1e-6, 1e-7, what + " inv_std");
            }
        }
}

GPU_TEST(pool_max_average_indices_3d) {
    gpu::device& d = *the_device();
    for (int variant = 0; variant < 4; ++variant) {
        k::pool2d_args p{};
        p.n = 2; p.c = 3; p.h = 11; p.w = 13; p.kh = 3; p.kw = 2; p.stride_h = 2; p.stride_w = 2;
        p.pad_top = 1; p.pad_left = 1; p.pad_bottom = 1; p.pad_right = 0; p.dil_h = 1; p.dil_w = 2;
        p.d = 1; p.d_out = 1; p.kd = 1; p.stride_d = 1; p.dil_d = 1;
        p.op = variant % 2 ? k::pool_op::average : k::pool_op::max;
        p.count_include_pad = variant == 3;
        p.column_major = variant == 2;
        if (variant == 2) {  // 3-D
            p.d = 4; p.kd = 2; p.stride_d = 2; p.d_out = 2;
        }
        p.h_out = (p.h + p.pad_top + p.pad_bottom - p.dil_h * (p.kh - 1) - 1) / p.stride_h + 1;
        p.w_out = (p.w + p.pad_left + p.pad_right - p.dil_w * (p.kw - 1) - 1) / p.stride_w + 1;
        p.planes_per_block = 2;
        const int64_t D = std::max<int64_t>(1, p.d), Do = std::max<int64_t>(1, p.d_out);
        auto x = random_floats(size_t(p.n * p.c * D * p.h * p.w), 23 + uint32_t(variant));
        const size_t ny = size_t(p.n * p.c * Do * p.h_out * p.w_out);
        std::vector<float> y(ny, -1);
        std::vector<int64_t> idx(ny, -1);
        dev_buffer dx(d, x), dy(d, ny * 4), di(d, idx);
        k::pool2d_args h = p, g = p;
        h.x = x.data(); h.y = y.data();
        g.x = dx.get(); g.y = dy.get();
        if (p.op == k::pool_op::max) {
            h.indices = idx.data();
            g.indices = di.get<int64_t>();
        }
        both(k::pool2d_kernel, h, g, k::pool2d_grid(p), "pool");
        expect_close(dy.read<float>(), y, 1e-6, 0, "pool variant " + std::to_string(variant));
        if (p.op == k::pool_op::max) expect_equal(di.read<int64_t>(), idx, "pool indices variant " + std::to_string(variant));
    }
}

GPU_TEST(lrn_batchnorm_gather_axis) {
    gpu::device& d = *the_device();
    {
        k::lrn_args l{};
        l.n = 2; l.c = 7; l.hw = 30; l.size = 5; l.alpha = 1e-3f; l.beta = 0.75f; l.bias = 2; l.planes_per_block = 3;
        auto x = random_floats(size_t(2 * 7 * 30), 24, -3, 3);
        std::vector<float> y(x.size(), -1);
        dev_buffer dx(d, x), dy(d, x.size() * 4);
        k::lrn_args h = l, g = l;
        h.x = x.data(); h.y = y.data();
        g.x = dx.get(); g.y = dy.get();
        both(k::lrn_kernel, h, g, k::lrn_grid(l), "lrn");
        expect_close(dy.read<float>(), y, 1e-6, 1e-6, "lrn");
    }
    {
        k::batchnorm_args b{};
        b.n = 2; b.c = 5; b.hw = 77; b.epsilon = 1e-5f; b.ep.act = k::activation::relu; b.planes_per_block = 2;
        auto x = random_floats(size_t(2 * 5 * 77), 25), sc = random_floats(5, 26), bi = random_floats(5, 27);
        auto mean = random_floats(5, 28), var = random_floats(5, 29, 0.1f, 2.0f);
        std::vector<float> y(x.size(), -1);
        dev_buffer dx(d, x), ds(d, sc), db(d, bi), dm(d, mean), dv(d, var), dy(d, x.size() * 4);
        k::batchnorm_args h = b, g = b;
        h.x = x.data(); h.scale = sc.data(); h.bias = bi.data(); h.mean = mean.data(); h.var = var.data(); h.y = y.data();
        g.x = dx.get(); g.scale = ds.get(); g.bias = db.get(); g.mean = dm.get(); g.var = dv.get(); g.y = dy.get();
        both(k::batchnorm_kernel, h, g, k::batchnorm_grid(b), "batchnorm");
        expect_close(dy.read<float>(), y, 1e-6, 1e-6, "batchnorm");
    }
    for (int eb : {1, 4, 8}) {
        k::gather_axis_args a{};
        a.outer = 3; a.axis = 10; a.inner = 6; a.count = 5; a.element_bytes = eb; a.rows_per_block = 4;
        std::vector<uint8_t> x(size_t(3 * 10 * 6 * eb));
        for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t(i * 13 + 1);
        const std::vector<int64_t> ind = {0, 9, -1, 42, -11};  // last two out of range: zeros
        std::vector<uint8_t> y(size_t(3 * 5 * 6 * eb), 0xaa);
        dev_buffer dx(d, x), di(d, ind), dy(d, y.size());
        k::gather_axis_args h = a, g = a;
        h.x = x.data(); h.indices = ind.data(); h.y = y.data();
        g.x = dx.get(); g.indices = di.get<int64_t>(); g.y = dy.get();
        both(k::gather_axis_kernel, h, g, k::gather_axis_grid(a), "gather_axis");
        expect_equal(dy.read<uint8_t>(), y, "gather_axis element_bytes " + std::to_string(eb));
    }
}

// The image gather's GPU blocks against the cpu blocks, bit for bit: with the runtime's block
// descriptors (segments given in the descriptor, or, past gather_block_slices of them, read from
// the list), without descriptors (the list scanned), and the first version (gather_bench's);
// fragments from a full payload down to single bytes, at every alignment, in shuffled order;
// blocks of a few pixels, of a tile and of several tiles; channel planes of any length.
GPU_TEST(image_gather_versions) {
    gpu::device& d = *the_device();
    struct image_case {
        int64_t h, w, c;
        std::vector<int64_t> per_block;
        std::vector<uint32_t> fragments;
    };
    const std::vector<image_case> cases = {
        {5, 4, 3, {12, 60}, {13, 3, 1}},
        {13, 11, 3, {96, 4095}, {1432, 500, 61, 13, 1}},
        {9, 7, 4, {32, 4092}, {61, 5, 2}},
        {41, 37, 1, {300, 4096}, {1432, 100, 7}},
        {50, 45, 3, {4095, 9000}, {1432, 512, 61}},
    };
    std::mt19937 rng(23);
    for (const image_case& ic : cases) {
        const int64_t B = 3, bytes = ic.h * ic.w * ic.c;
        for (const uint32_t fragment : ic.fragments) {
            // Every fragment at its own place in one buffer, in shuffled order, after a gap of
            // 0..5 bytes, so that the payloads start at every alignment.
            std::vector<std::vector<uint8_t>> images(static_cast<size_t>(B));
            for (auto& im : images) {
                im.resize(size_t(bytes));
                for (auto& v : im) v = uint8_t(rng());
            }
            struct piece {
                int64_t image;
                uint32_t offset, length;
                size_t at = 0;
            };
            std::vector<piece> pieces;
            for (int64_t i = 0; i < B; ++i)
                for (uint32_t off = 0; off < bytes; off += fragment)
                    pieces.push_back({i, off, uint32_t(std::min<int64_t>(fragment, bytes - off))});
            std::vector<size_t> order(pieces.size());
            for (size_t i = 0; i < order.size(); ++i) order[i] = i;
            std::shuffle(order.begin(), order.end(), rng);
            std::vector<uint8_t> all;
            for (const size_t i : order) {
                all.resize(all.size() + rng() % 6, 0x5a);
                pieces[i].at = all.size();
                const auto& src = images[size_t(pieces[i].image)];
                const auto from = src.begin() + pieces[i].offset;
                all.insert(all.end(), from, from + pieces[i].length);
            }
            all.resize(all.size() + 8, 0x5a);
            dev_buffer dall(d, all);
            std::vector<k::gather_segment> hs, gs;
            std::vector<uint32_t> first{0};
            for (const piece& p : pieces) {  // in image and offset order
                hs.push_back({all.data() + p.at, p.length, p.offset});
                gs.push_back({dall.get<uint8_t>() + p.at, p.length, p.offset});
                if (p.offset + p.length == bytes) first.push_back(uint32_t(hs.size()));
            }
            dev_buffer dsegs(d, gs), dfirst(d, first);
            for (const int64_t per_block : ic.per_block) {
                const std::string what = std::to_string(ic.h) + "x" + std::to_string(ic.w) + "x" +
                                         std::to_string(ic.c) + ", " + std::to_string(fragment) +
                                         "-byte fragments, " + std::to_string(per_block) + " bytes per block";
                k::gather_args a{};
                a.batch = B; a.h = ic.h; a.w = ic.w; a.c = ic.c; a.bytes_per_block = per_block;
                const float mean[4] = {123.675f, 116.28f, 103.53f, 99.5f}, sd[4] = {58.395f, 57.12f, 57.375f, 41.0f};
                for (int i = 0; i < 4; ++i) { a.mean[i] = mean[i]; a.inv_std[i] = 1.0f / sd[i]; }
                const int64_t grid = k::gather_grid(a);
                std::vector<float> want(size_t(B * bytes), NAN);
                k::gather_args h = a;
                h.segments = hs.data(); h.first = first.data(); h.y = want.data();
                REQUIRE(run_cpu(k::gather_kernel, &h, grid));
                for (int64_t i = 0; i < B; ++i)
                    for (int64_t q = 0; q < bytes; ++q) {
                        const int64_t ch = q % ic.c;
                        const float v = (float(images[size_t(i)][size_t(q)]) - mean[ch]) * (1.0f / sd[ch]);
                        REQUIRE(std::memcmp(&want[size_t((i * ic.c + ch) * ic.h * ic.w + q / ic.c)], &v, 4) == 0)
                            << what << ": cpu image " << i << " byte " << q;
                    }
                std::vector<k::gather_block_desc> blocks(static_cast<size_t>(grid));
                k::gather_describe_blocks(a, gs.data(), first.data(), blocks.data());
                dev_buffer dblocks(d, blocks);
                for (int version = 0; version < 3; ++version) {
                    dev_buffer dy(d, want.size() * 4);
                    k::gather_args g = a;
                    g.segments = dsegs.get<k::gather_segment>(); g.first = dfirst.get<uint32_t>(); g.y = dy.get();
                    if (version == 0) g.blocks = dblocks.get<k::gather_block_desc>();
                    if (version == 2) g.bench_version_1 = 1;
                    gpu_runner r(d);
                    EXPECT(r.run(k::gather_kernel, g, grid)) << what;
                    static const char* const names[] = {"descriptors", "list scan", "version 1"};
                    expect_equal(dy.read<float>(), want, "image gather (" + std::string(names[version]) + "), " + what);
                }
            }
        }
    }
}

// Token sequences and f32 tensors from fragmented payloads (elements straddle fragments): the
// GPU's thread-per-element gathers against the cpu blocks, and the token errors they report.
GPU_TEST(token_and_tensor_gathers) {
    gpu::device& d = *the_device();
    // Payloads of every request back to back in one buffer; fragments of 7 bytes.
    const auto gather_lists = [](const std::vector<std::vector<uint8_t>>& payloads, const uint8_t* base,
                                 std::vector<k::gather_segment>& segs, std::vector<uint32_t>& first) {
        segs.clear();
        first.assign(1, 0);
        size_t at = 0;
        for (const auto& p : payloads) {
            for (uint32_t off = 0; off < p.size(); off += 7)
                segs.push_back({base + at + off, uint32_t(std::min<size_t>(7, p.size() - off)), off});
            at += p.size();
            first.push_back(uint32_t(segs.size()));
        }
    };
    {
        const std::vector<std::vector<int32_t>> tokens = {{5, 1, 999, 3}, {}, {2, 2, -7, 4, 4, 4, 4, 4, 4, 2000}};
        std::vector<std::vector<uint8_t>> payloads;
        std::vector<uint8_t> all;
        for (const auto& t : tokens) {
            std::vector<uint8_t> b;
            for (int32_t v : t)
                for (int k = 0; k < 4; ++k) b.push_back(uint8_t(uint32_t(v) >> (8 * k)));
            all.insert(all.end(), b.begin(), b.end());
            payloads.push_back(std::move(b));
        }
        payloads[1] = {0, 0, 0, 0};  // a one-token request (token 0)
        all.insert(all.begin() + 16, payloads[1].begin(), payloads[1].end());
        dev_buffer dall(d, all);
        std::vector<k::gather_segment> hs, gs;
        std::vector<uint32_t> first;
        gather_lists(payloads, all.data(), hs, first);
        gather_lists(payloads, dall.get<uint8_t>(), gs, first);
        k::token_gather_args a{};
        a.batch = 3; a.length = 12; a.vocab = 1000; a.tokens_per_block = 5;
        a.ids_type = k::elem::i64; a.mask_type = k::elem::f32; a.types_type = k::elem::i32;
        const size_t n = size_t(a.batch * a.length), blocks = size_t(k::token_gather_grid(a));
        std::vector<int64_t> ids(n, -1);
        std::vector<float> mask(n, -1);
        std::vector<int32_t> types(n, -1);
        std::vector<k::token_error> errors(blocks, k::token_error{-2, -2});
        dev_buffer dsegs(d, gs), dfirst(d, first), dids(d, n * 8), dmask(d, n * 4), dtypes(d, n * 4),
            derr(d, blocks * sizeof(k::token_error));
        k::token_gather_args h = a, g = a;
        h.segments = hs.data(); h.first = first.data(); h.ids = ids.data(); h.mask = mask.data(); h.types = types.data();
        h.errors = errors.data();
        g.segments = dsegs.get<k::gather_segment>(); g.first = dfirst.get<uint32_t>(); g.ids = dids.get();
        g.mask = dmask.get(); g.types = dtypes.get(); g.errors = derr.get<k::token_error>();
        both(k::token_gather_kernel, h, g, k::token_gather_grid(a), "token_gather");
        expect_equal(dids.read<int64_t>(), ids, "token_gather ids");
        expect_equal(dmask.read<float>(), mask, "token_gather mask");
        expect_equal(dtypes.read<int32_t>(), types, "token_gather types");
        const auto ge = derr.read<k::token_error>();
        for (size_t b = 0; b < blocks; ++b)
            EXPECT(ge[b].position == errors[b].position && ge[b].token == errors[b].token)
                << "token error of block " << b << ": gpu (" << ge[b].position << ", " << ge[b].token << "), cpu ("
                << errors[b].position << ", " << errors[b].token << ")";
        EXPECT(errors[6].position == 2 && errors[6].token == -7) << "request 2's first bad token";
        EXPECT(ids[size_t(2 * 12 + 2)] == 0 && ids[size_t(2 * 12 + 9)] == 0 && ids[2] == 999) << "a bad token is written as 0";
    }
    {
        const int64_t B = 3, E = 301;
        std::vector<std::vector<uint8_t>> payloads(B);
        std::vector<uint8_t> all;
        auto f = random_floats(size_t(B * E), 31);
        for (int64_t r = 0; r < B; ++r) {
            payloads[size_t(r)].resize(size_t(E) * 4);
            std::memcpy(payloads[size_t(r)].data(), f.data() + r * E, size_t(E) * 4);
            all.insert(all.end(), payloads[size_t(r)].begin(), payloads[size_t(r)].end());
        }
        dev_buffer dall(d, all);
        std::vector<k::gather_segment> hs, gs;
        std::vector<uint32_t> first;
        gather_lists(payloads, all.data(), hs, first);
        gather_lists(payloads, dall.get<uint8_t>(), gs, first);
        k::tensor_gather_args a{};
        a.batch = B; a.elements = E; a.elements_per_block = 64;
        std::vector<float> y(size_t(B * E), -1);
        dev_buffer dsegs(d, gs), dfirst(d, first), dy(d, y.size() * 4);
        k::tensor_gather_args h = a, g = a;
        h.segments = hs.data(); h.first = first.data(); h.y = y.data();
        g.segments = dsegs.get<k::gather_segment>(); g.first = dfirst.get<uint32_t>(); g.y = dy.get();
        both(k::tensor_gather_kernel, h, g, k::tensor_gather_grid(a), "tensor_gather");
        expect_equal(y, f, "tensor_gather cpu");
        expect_equal(dy.read<float>(), f, "tensor_gather gpu");
    }
}

GPU_TEST(unknown_kernel_is_refused) {
    gpu::device& d = *the_device();
    static const gpu::kernel_info nowhere = {"no_such_kernel", nullptr, 256, 0, 0, 0};
    gpu_runner r(d);
    int x = 0;
    bool threw = false;
    try {
        d.launch(r.s, gpu::launch{&nowhere, &x, sizeof x, 1, 0, 1, r.w, 0});
    } catch (const std::runtime_error& e) {
        threw = std::string(e.what()).find("no_such_kernel") != std::string::npos;
    }
    EXPECT(threw) << "a kernel without a GPU implementation must make launch() throw, naming it";
}

}  // namespace

int main(int argc, char** argv) {
    return gpu_test::main(argc, argv, [] {
        if (!make_the_device()) return false;
        std::printf("kernel library: %s, tensor cores %s\n", k::gpu_runtime_name(),
                    k::gpu_has_tensor_cores() ? "compiled" : "not compiled (fp32 for every math option)");
        return true;
    });
}
