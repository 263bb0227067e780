// The channel-blocked kernels (libml/kernels/cpu_c16.h) against references on NCHW: every
// tile shape and remainder, c16 and NCHW inputs and outputs, padding, strides, residuals and
// activations; the same bits whatever the tiles and chunks, and after a preempted block reruns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "libml/kernels/cpu_c16.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/kernels.h"

namespace k = reefline::ml::kernels;
namespace gpu = reefline::gpu;

namespace {

// 64-byte aligned floats (the kernels' vector loads of c16 pixels are aligned).
struct aligned_floats {
    explicit aligned_floats(size_t n, float fill = NAN) : n(n) {
        p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
        for (size_t i = 0; i < n; ++i) p[i] = fill;
    }
    ~aligned_floats() { std::free(p); }
    aligned_floats(const aligned_floats&) = delete;
    float* p;
    size_t n;
};

std::vector<float> random_vector(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// NCHW [n, c, hw] <-> c16 [n, c / 16, hw, 16].
void to_c16(const std::vector<float>& x, int64_t n, int64_t c, int64_t hw, float* out) {
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t p = 0; p < hw; ++p)
                out[((b * (c / 16) + ch / 16) * hw + p) * 16 + ch % 16] = x[size_t((b * c + ch) * hw + p)];
}
std::vector<float> from_c16(const float* x, int64_t n, int64_t c, int64_t hw) {
    std::vector<float> out(size_t(n * c * hw));
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t p = 0; p < hw; ++p)
                out[size_t((b * c + ch) * hw + p)] = x[((b * (c / 16) + ch / 16) * hw + p) * 16 + ch % 16];
    return out;
}

bool run_blocks(const gpu::kernel_info& ki, const void* args, int64_t grid, size_t scratch,
                gpu::task_words* task = nullptr) {
    static std::vector<float> buf;
    buf.assign(scratch / sizeof(float) + 16, NAN);  // scratch holds garbage: the kernel must not read it unwritten
    bool ok = true;
    for (int64_t b = 0; b < grid; ++b) {
        gpu::block_context ctx{uint32_t(b), uint32_t(grid), 0, task, buf.data(), scratch};
        ok &= ki.cpu(args, ctx);
    }
    return ok;
}

struct conv_case {
    int64_t n, ci, h, w, co, kh, kw, sh, sw, pt, pl, pb, pr;
    bool x_c16, y_c16, residual;
    k::activation act;
};

std::string name_of(const conv_case& c) {
    return std::to_string(c.n) + "x" + std::to_string(c.ci) + "x" + std::to_string(c.h) + "x" + std::to_string(c.w) +
           " -> " + std::to_string(c.co) + " k" + std::to_string(c.kh) + "x" + std::to_string(c.kw) + " s" +
           std::to_string(c.sh) + std::to_string(c.sw) + " p" + std::to_string(c.pt) + std::to_string(c.pl) +
           std::to_string(c.pb) + std::to_string(c.pr) + (c.x_c16 ? " x16" : " xNCHW") + (c.y_c16 ? " y16" : " yNCHW") +
           (c.residual ? " +res" : "") + " act" + std::to_string(int(c.act));
}

class conv_c16 : public ::testing::TestWithParam<conv_case> {};

TEST_P(conv_c16, matches_the_reference_and_its_bits_hold_across_tiles) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "the c16 kernels need AVX-512";
    const conv_case c = GetParam();
    SCOPED_TRACE(name_of(c));
    const int64_t ho = (c.h + c.pt + c.pb - c.kh) / c.sh + 1, wo = (c.w + c.pl + c.pr - c.kw) / c.sw + 1;
    const int64_t hw = c.h * c.w, hwo = ho * wo;
    const auto x = random_vector(size_t(c.n * c.ci * hw), 1);
    const auto w = random_vector(size_t(c.co * c.ci * c.kh * c.kw), 2);
    const auto bias = random_vector(size_t(c.co), 3);
    const auto res = random_vector(size_t(c.n * c.co * hwo), 4);
    // Reference in double.
    std::vector<float> want(size_t(c.n * c.co * hwo));
    for (int64_t b = 0; b < c.n; ++b)
        for (int64_t o = 0; o < c.co; ++o)
            for (int64_t oy = 0; oy < ho; ++oy)
                for (int64_t ox = 0; ox < wo; ++ox) {
                    double s = bias[size_t(o)];
                    for (int64_t i = 0; i < c.ci; ++i)
                        for (int64_t r = 0; r < c.kh; ++r)
                            for (int64_t q = 0; q < c.kw; ++q) {
                                const int64_t iy = oy * c.sh - c.pt + r, ix = ox * c.sw - c.pl + q;
                                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                                s += double(x[size_t((b * c.ci + i) * hw + iy * c.w + ix)]) *
                                     w[size_t(((o * c.ci + i) * c.kh + r) * c.kw + q)];
                            }
                    const size_t at = size_t((b * c.co + o) * hwo + oy * wo + ox);
                    if (c.residual) s += res[at];
                    if (c.act == k::activation::relu) s = s > 0 ? s : 0;
                    if (c.act == k::activation::clip) s = std::min(std::max(s, -0.5), 0.75);
                    want[at] = float(s);
                }
    aligned_floats xin(x.size()), filt(size_t(k::conv2d_c16_filter_floats(c.co, c.ci, c.kh, c.kw))),
        resin(res.size());
    if (c.x_c16) to_c16(x, c.n, c.ci, hw, xin.p);
    else std::memcpy(xin.p, x.data(), x.size() * sizeof(float));
    if (c.y_c16) to_c16(res, c.n, c.co, hwo, resin.p);
    else std::memcpy(resin.p, res.data(), res.size() * sizeof(float));
    k::conv2d_c16_filters(w.data(), c.co, c.ci, c.kh, c.kw, c.x_c16, filt.p);
    // 3x3 layers at stride 1 between c16 tensors run by Winograd too (tolerance: its
    // transforms round on the way, as the NCHW Winograd's do).
    const bool winograd = c.kh == 3 && c.kw == 3 && c.sh == 1 && c.sw == 1 && c.x_c16 && c.y_c16;
    aligned_floats wino(size_t(winograd ? k::conv2d_c16_winograd_floats(c.co, c.ci) : 1));
    if (winograd) k::conv2d_c16_winograd_filters(w.data(), c.co, c.ci, wino.p);

    k::conv2d_c16_args a{};
    a.x = xin.p; a.w = filt.p; a.bias = bias.data(); a.residual = c.residual ? resin.p : nullptr;
    a.n = c.n; a.c_in = c.ci; a.h = c.h; a.w_in = c.w; a.c_out = c.co; a.kh = c.kh; a.kw = c.kw;
    a.stride_h = c.sh; a.stride_w = c.sw; a.pad_top = c.pt; a.pad_left = c.pl; a.h_out = ho; a.w_out = wo;
    a.ep.act = c.act;
    a.ep.alpha = -0.5f;
    a.ep.beta = 0.75f;
    a.x_c16 = c.x_c16;
    a.y_c16 = c.y_c16;
    k::conv2d_args geometry{};
    geometry.n = c.n; geometry.c_in = c.ci; geometry.h = c.h; geometry.w_in = c.w; geometry.c_out = c.co;
    geometry.kh = c.kh; geometry.kw = c.kw; geometry.stride_h = c.sh; geometry.stride_w = c.sw;
    geometry.pad_top = c.pt; geometry.pad_left = c.pl; geometry.dil_h = geometry.dil_w = 1; geometry.groups = 1;
    geometry.h_out = ho; geometry.w_out = wo;
    ASSERT_TRUE(k::conv2d_c16_possible(geometry, c.x_c16));
    // Tilings: whole layer in one block, one chunk; rows 1 and 3 at a time with chunks of one
    // block of 16 inputs; 64 output channels a block (several blocks side by side).
    std::vector<float> first;
    const int32_t co_tiles[] = {int32_t(c.co), 64, int32_t(c.co)};
    const int32_t row_tiles[] = {int32_t(ho), 1, 3};
    const int32_t chunks[] = {int32_t(c.ci), 16, 32};
    for (int t = 0; t < (winograd ? 6 : 3); ++t) {
        a.tile_co = co_tiles[t % 3];
        a.tile_rows = row_tiles[t % 3];
        a.chunk = chunks[t % 3];
        a.w_winograd = t >= 3 ? wino.p : nullptr;
        if (t == 3) first.clear();  // Winograd: its own bits, the same across its tilings
        if (a.w_winograd) a.tile_rows = std::max(2, (a.tile_rows + 1) / 2 * 2);
        SCOPED_TRACE("tile_co " + std::to_string(a.tile_co) + " tile_rows " + std::to_string(a.tile_rows) + " chunk " +
                     std::to_string(a.chunk) + (a.w_winograd ? " Winograd" : ""));
        aligned_floats y(want.size());
        a.y = y.p;
        ASSERT_TRUE(run_blocks(k::conv2d_c16_kernel, &a, k::conv2d_c16_grid(a), k::conv2d_c16_scratch_bytes(a)));
        const std::vector<float> got =
            c.y_c16 ? from_c16(y.p, c.n, c.co, hwo) : std::vector<float>(y.p, y.p + want.size());
        const double tol = (a.w_winograd ? 1e-4 : 2e-5) * (1 + std::sqrt(double(c.ci * c.kh * c.kw)));
        for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "at " << i;
        if (first.empty()) first = got;
        else ASSERT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0) << "bits differ by tiling";
    }
    // Preempted at its first check point every block stops; run again, the same bits.
    gpu::task_words task{};
    task.preempt.store(1);
    aligned_floats y(want.size(), 7.0f);
    a.y = y.p;
    EXPECT_FALSE(run_blocks(k::conv2d_c16_kernel, &a, k::conv2d_c16_grid(a), k::conv2d_c16_scratch_bytes(a), &task));
    task.preempt.store(0);
    ASSERT_TRUE(run_blocks(k::conv2d_c16_kernel, &a, k::conv2d_c16_grid(a), k::conv2d_c16_scratch_bytes(a), &task));
    const std::vector<float> again = c.y_c16 ? from_c16(y.p, c.n, c.co, hwo) : std::vector<float>(y.p, y.p + want.size());
    EXPECT_EQ(std::memcmp(first.data(), again.data(), again.size() * sizeof(float)), 0);
}

using A = k::activation;
INSTANTIATE_TEST_SUITE_P(
    shapes, conv_c16,
    ::testing::Values(
        // 1x1 at stride 1 (one run of pixels), every group width: 64 + 16 outputs (4 + 1 blocks)
        conv_case{1, 32, 7, 9, 80, 1, 1, 1, 1, 0, 0, 0, 0, true, true, false, A::relu},
        conv_case{2, 48, 5, 5, 64, 1, 1, 1, 1, 0, 0, 0, 0, true, true, true, A::relu},
        conv_case{1, 16, 6, 6, 48, 1, 1, 1, 1, 0, 0, 0, 0, true, true, false, A::none},
        conv_case{1, 32, 4, 13, 32, 1, 1, 1, 1, 0, 0, 0, 0, true, true, true, A::clip},
        // 1x1 at stride 2 (ResNet's downsampling)
        conv_case{1, 32, 9, 9, 128, 1, 1, 2, 2, 0, 0, 0, 0, true, true, false, A::none},
        // 3x3 padded at strides 1 and 2, odd planes
        conv_case{1, 32, 7, 9, 48, 3, 3, 1, 1, 1, 1, 1, 1, true, true, true, A::relu},
        conv_case{2, 16, 13, 5, 32, 3, 3, 1, 1, 1, 1, 1, 1, true, true, false, A::relu},
        conv_case{1, 32, 11, 11, 64, 3, 3, 2, 2, 1, 1, 1, 1, true, true, false, A::relu},
        conv_case{1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, true, true, true, A::relu},
        conv_case{2, 16, 9, 7, 80, 3, 3, 1, 1, 0, 0, 0, 0, true, true, false, A::clip},
        conv_case{1, 16, 8, 8, 16, 3, 3, 2, 2, 0, 0, 0, 0, true, true, false, A::none},
        conv_case{1, 16, 8, 10, 32, 3, 3, 2, 2, 0, 0, 1, 1, true, true, false, A::relu},  // reaches past the end
        // Inception's 1x7 / 7x1 and 5x5
        conv_case{1, 32, 9, 9, 32, 1, 7, 1, 1, 0, 3, 0, 3, true, true, false, A::relu},
        conv_case{1, 32, 9, 9, 48, 7, 1, 1, 1, 3, 0, 3, 0, true, true, false, A::relu},
        conv_case{1, 16, 10, 10, 64, 5, 5, 1, 1, 2, 2, 2, 2, true, true, false, A::relu},
        // NCHW inputs: a stem of 3 channels (7x7 at stride 2), and of 20
        conv_case{1, 3, 23, 23, 64, 7, 7, 2, 2, 3, 3, 3, 3, false, true, false, A::relu},
        conv_case{1, 3, 15, 15, 32, 3, 3, 2, 2, 0, 0, 0, 0, false, true, false, A::relu},
        conv_case{2, 20, 6, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1, false, true, true, A::none},
        // NCHW outputs (a layer whose reader takes NCHW), with a residual
        conv_case{1, 32, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, true, false, true, A::relu},
        conv_case{1, 32, 5, 9, 48, 1, 1, 1, 1, 0, 0, 0, 0, true, false, false, A::clip},
        conv_case{1, 5, 6, 6, 32, 3, 3, 1, 1, 1, 1, 1, 1, false, false, false, A::relu}));

// Depthwise convolutions of c16 tensors: the 3x3 and 5x5 paths (filters in registers, the
// inside in tiles of 4 pixels, borders clipped) and the general one, against a double
// reference; the same bits whatever the channel and row tiles.
TEST(depthwise_c16, matches_the_reference_at_every_border) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "the c16 kernels need AVX-512";
    struct dw_case {
        int64_t n, c, h, w, kh, kw, s, pt, pl, pb, pr;
        bool residual;
        k::activation act;
    };
    const dw_case cases[] = {
        {1, 32, 13, 11, 3, 3, 1, 1, 1, 1, 1, false, k::activation::clip},  // MobileNet's, ReLU6
        {2, 16, 14, 14, 3, 3, 2, 1, 1, 1, 1, true, k::activation::relu},
        {1, 48, 9, 7, 3, 3, 2, 0, 0, 1, 1, false, k::activation::none},     // reaches past the end
        {1, 16, 10, 12, 5, 5, 1, 2, 2, 2, 2, false, k::activation::relu},
        {1, 32, 4, 5, 5, 5, 2, 2, 2, 2, 2, false, k::activation::none},     // windows wider than the plane
        {1, 16, 9, 9, 7, 7, 1, 3, 3, 3, 3, false, k::activation::relu},     // the general path
        {1, 16, 6, 8, 3, 1, 1, 1, 0, 1, 0, true, k::activation::none},
    };
    for (const dw_case& c : cases) {
        const int64_t ho = (c.h + c.pt + c.pb - c.kh) / c.s + 1, wo = (c.w + c.pl + c.pr - c.kw) / c.s + 1;
        const int64_t hw = c.h * c.w, hwo = ho * wo, taps = c.kh * c.kw;
        SCOPED_TRACE(std::to_string(c.h) + "x" + std::to_string(c.w) + " k" + std::to_string(c.kh) + "x" +
                     std::to_string(c.kw) + " s" + std::to_string(c.s));
        const auto x = random_vector(size_t(c.n * c.c * hw), 12), w = random_vector(size_t(c.c * taps), 13);
        const auto bias = random_vector(size_t(c.c), 14), res = random_vector(size_t(c.n * c.c * hwo), 15);
        std::vector<float> want(size_t(c.n * c.c * hwo));
        for (int64_t b = 0; b < c.n; ++b)
            for (int64_t ch = 0; ch < c.c; ++ch)
                for (int64_t oy = 0; oy < ho; ++oy)
                    for (int64_t ox = 0; ox < wo; ++ox) {
                        double sum = bias[size_t(ch)];
                        for (int64_t i = 0; i < c.kh; ++i)
                            for (int64_t j = 0; j < c.kw; ++j) {
                                const int64_t iy = oy * c.s - c.pt + i, ix = ox * c.s - c.pl + j;
                                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                                sum += double(x[size_t((b * c.c + ch) * hw + iy * c.w + ix)]) * w[size_t(ch * taps + i * c.kw + j)];
                            }
                        const size_t at = size_t((b * c.c + ch) * hwo + oy * wo + ox);
                        if (c.residual) sum += res[at];
                        if (c.act == k::activation::relu) sum = std::max(sum, 0.0);
                        if (c.act == k::activation::clip) sum = std::min(std::max(sum, 0.0), 6.0);
                        want[at] = float(sum);
                    }
        aligned_floats xin(x.size()), filt(size_t(c.c * taps)), resin(res.size());
        to_c16(x, c.n, c.c, hw, xin.p);
        to_c16(res, c.n, c.c, hwo, resin.p);
        k::conv2d_c16_depthwise_filters(w.data(), c.c, c.kh, c.kw, filt.p);
        k::conv2d_c16_args a{};
        a.x = xin.p; a.w = filt.p; a.bias = bias.data(); a.residual = c.residual ? resin.p : nullptr;
        a.n = c.n; a.c_in = a.c_out = c.c; a.h = c.h; a.w_in = c.w; a.kh = c.kh; a.kw = c.kw;
        a.stride_h = a.stride_w = c.s; a.pad_top = c.pt; a.pad_left = c.pl; a.h_out = ho; a.w_out = wo;
        a.ep.act = c.act;
        a.ep.alpha = 0.0f;
        a.ep.beta = 6.0f;
        a.x_c16 = a.y_c16 = a.depthwise = true;
        std::vector<float> first;
        for (const auto& [tile_co, tile_rows] : {std::pair<int64_t, int64_t>{c.c, ho}, {16, 1}, {16, 3}}) {
            a.tile_co = int32_t(tile_co);
            a.tile_rows = int32_t(tile_rows);
            aligned_floats y(want.size());
            a.y = y.p;
            ASSERT_TRUE(run_blocks(k::conv2d_c16_kernel, &a, k::conv2d_c16_grid(a), k::conv2d_c16_scratch_bytes(a)));
            const std::vector<float> got = from_c16(y.p, c.n, c.c, hwo);
            for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << "at " << i;
            if (first.empty()) first = got;
            else ASSERT_EQ(first, got) << "bits differ by tiling";
        }
    }
}

// Max and average pools of c16 tensors give the NCHW kernel's results (max: its bits).
TEST(pool_c16, matches_the_nchw_kernel) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "the c16 kernels need AVX-512";
    struct pool_case {
        int64_t n, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr;
        k::pool_op op;
        bool include_pad;
    };
    const pool_case cases[] = {
        {1, 32, 14, 14, 3, 3, 2, 2, 1, 1, 1, 1, k::pool_op::max, false},   // ResNet's stem pool
        {2, 16, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1, k::pool_op::average, false}, // Inception's pool branch
        {1, 48, 8, 8, 2, 2, 2, 2, 0, 0, 0, 0, k::pool_op::average, false},  // DenseNet's transitions
        {1, 16, 7, 9, 3, 3, 2, 2, 0, 0, 1, 1, k::pool_op::max, false},      // ceil mode's last window
        {1, 16, 10, 10, 5, 5, 3, 3, 2, 2, 2, 2, k::pool_op::average, true},
    };
    for (const pool_case& c : cases) {
        const int64_t ho = (c.h + c.pt + c.pb - c.kh) / c.sh + 1, wo = (c.w + c.pl + c.pr - c.kw) / c.sw + 1;
        SCOPED_TRACE(std::to_string(c.h) + "x" + std::to_string(c.w) + " k" + std::to_string(c.kh) + " s" +
                     std::to_string(c.sh) + (c.op == k::pool_op::max ? " max" : " average"));
        const auto x = random_vector(size_t(c.n * c.c * c.h * c.w), 5);
        k::pool2d_args a{};
        a.n = c.n; a.c = c.c; a.h = c.h; a.w = c.w; a.h_out = ho; a.w_out = wo;
        a.kh = c.kh; a.kw = c.kw; a.stride_h = c.sh; a.stride_w = c.sw; a.pad_top = c.pt; a.pad_left = c.pl;
        a.pad_bottom = c.pb; a.pad_right = c.pr; a.dil_h = a.dil_w = 1; a.op = c.op; a.count_include_pad = c.include_pad;
        a.d = a.d_out = a.kd = a.stride_d = a.dil_d = 1;
        std::vector<float> want(size_t(c.n * c.c * ho * wo));
        a.x = x.data();
        a.y = want.data();
        a.planes_per_block = 3;
        ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a), k::pool2d_scratch_bytes(a) + 64));
        aligned_floats xin(x.size()), y(want.size());
        to_c16(x, c.n, c.c, c.h * c.w, xin.p);
        a.x = xin.p;
        a.y = y.p;
        a.planes_per_block = 1;
        ASSERT_TRUE(k::pool2d_c16_possible(a));
        ASSERT_TRUE(run_blocks(k::pool2d_c16_kernel, &a, k::pool2d_c16_grid(a), 0));
        const std::vector<float> got = from_c16(y.p, c.n, c.c, ho * wo);
        for (size_t i = 0; i < want.size(); ++i) {
            if (c.op == k::pool_op::max) ASSERT_EQ(got[i], want[i]) << "at " << i;
            else ASSERT_NEAR(got[i], want[i], 1e-6f) << "at " << i;
        }
    }
}

// Batch norm with ReLU, Clip and another activation: the NCHW kernel's bits.
TEST(batchnorm_c16, matches_the_nchw_kernel_bit_for_bit) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "the c16 kernels need AVX-512";
    const int64_t n = 2, c = 48, hw = 29;
    const auto x = random_vector(size_t(n * c * hw), 6);
    const auto scale = random_vector(size_t(c), 7), bias = random_vector(size_t(c), 8), mean = random_vector(size_t(c), 9);
    std::vector<float> var = random_vector(size_t(c), 10);
    for (float& v : var) v = std::fabs(v) + 0.1f;
    for (const k::activation act : {k::activation::relu, k::activation::clip, k::activation::none, k::activation::sigmoid}) {
        k::batchnorm_args a{};
        a.scale = scale.data(); a.bias = bias.data(); a.mean = mean.data(); a.var = var.data();
        a.n = n; a.c = c; a.hw = hw; a.epsilon = 1e-5f;
        a.ep.act = act;
        a.ep.alpha = -0.25f;
        a.ep.beta = 0.5f;
        std::vector<float> want(x.size());
        a.x = x.data();
        a.y = want.data();
        a.planes_per_block = 5;
        ASSERT_TRUE(run_blocks(k::batchnorm_kernel, &a, k::batchnorm_grid(a), 0));
        aligned_floats xin(x.size()), y(x.size());
        to_c16(x, n, c, hw, xin.p);
        a.x = xin.p;
        a.y = y.p;
        a.planes_per_block = 2;
        ASSERT_TRUE(run_blocks(k::batchnorm_c16_kernel, &a, k::batchnorm_c16_grid(a), 0));
        EXPECT_EQ(from_c16(y.p, n, c, hw), want) << "activation " << int(act);
    }
}

// Global pools of c16 tensors (rows of 16 channels per pixel): each channel's sum in double in
// pixel order, its mean or its maximum, as the one-line loop computes it; blocks that start
// mid-pixel (rows_per_block not a multiple of 16) take that loop and give the same bits.
TEST(global_pool_c16, reduces_sixteen_lines_at_once_with_the_loops_bits) {
    const int64_t n = 2, c = 48, hw = 49;
    const auto x = random_vector(size_t(n * c * hw), 11);
    for (const k::row_op op : {k::row_op::reduce_mean, k::row_op::reduce_sum, k::row_op::reduce_max}) {
        std::vector<float> want(size_t(n * c));
        for (int64_t o = 0; o < n * c / 16; ++o)
            for (int64_t l = 0; l < 16; ++l) {
                double s = 0;
                float m = -INFINITY;
                for (int64_t i = 0; i < hw; ++i) {
                    const float v = x[size_t((o * hw + i) * 16 + l)];
                    s += v;
                    m = std::max(m, v);
                }
                want[size_t(o * 16 + l)] = op == k::row_op::reduce_max ? m : float(op == k::row_op::reduce_mean ? s / double(hw) : s);
            }
        for (const int64_t per_block : {16, 32, 7}) {
            k::row_args a{};
            a.x = x.data();
            std::vector<float> y(want.size(), NAN);
            a.y = y.data();
            a.outer = n * c / 16;
            a.axis = hw;
            a.inner = 16;
            a.op = op;
            a.rows_per_block = per_block;
            ASSERT_TRUE(run_blocks(k::row_kernel, &a, k::row_grid(a), 0));
            EXPECT_EQ(y, want) << "op " << int(op) << ", " << per_block << " lines a block";
        }
    }
}

}  // namespace
