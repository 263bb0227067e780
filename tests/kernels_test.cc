// Kernel library on the CPU: every block decomposition against a naive reference, block
// slices, and preemption at check points.
#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "libml/kernels/cpu_onednn.h"
#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_winograd.h"
#include "libml/kernels/cpu_window3x3.h"
#include "libml/kernels/cpu_planes16.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/kernels.h"

namespace k = reefline::ml::kernels;
namespace gpu = reefline::gpu;

namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// Runs blocks [first, first + count) of a kernel on this thread, as one compute unit would.
bool run_blocks(const gpu::kernel_info& ki, const void* args, int64_t grid, int64_t first = 0,
                int64_t count = -1, gpu::task_words* task = nullptr, size_t scratch = 64 << 20) {
    static std::vector<float> buf;
    buf.resize(scratch / sizeof(float) + 1);
    if (count < 0) count = grid - first;
    bool ok = true;
    for (int64_t b = first; b < first + count; ++b) {
        gpu::block_context ctx{uint32_t(b), uint32_t(grid), 0, task, buf.data(), scratch};
        ok &= ki.cpu(args, ctx);
    }
    return ok;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol = 1e-4f) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "at " << i;
}

// Chooses the GEMM library for a scope (cpu_onednn.h), back to the default after.
struct library_choice {
    explicit library_choice(bool openblas) { k::use_openblas_only(openblas); }
    ~library_choice() { k::use_openblas_only(false); }
};

// Chooses how convolutions run for a scope (cpu_direct_conv.h), back to the default after.
struct conv_method_choice {
    explicit conv_method_choice(k::conv_method m) { k::use_conv_method(m); }
    ~conv_method_choice() { k::use_conv_method(k::conv_method::automatic); }
};

struct conv_case {
    int64_t n, ci, h, w, co, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, g;
};

std::vector<float> conv_reference(const conv_case& c, const std::vector<float>& x,
                                  const std::vector<float>& w, const std::vector<float>& b,
                                  int64_t ho, int64_t wo) {
    std::vector<float> y(size_t(c.n * c.co * ho * wo));
    const int64_t cig = c.ci / c.g, cog = c.co / c.g;
    for (int64_t n = 0; n < c.n; ++n)
        for (int64_t o = 0; o < c.co; ++o)
            for (int64_t oy = 0; oy < ho; ++oy)
                for (int64_t ox = 0; ox < wo; ++ox) {
                    double s = b[size_t(o)];
                    const int64_t g = o / cog;
                    for (int64_t ic = 0; ic < cig; ++ic)
                        for (int64_t r = 0; r < c.kh; ++r)
                            for (int64_t q = 0; q < c.kw; ++q) {
                                const int64_t iy = oy * c.sh - c.pt + r * c.dh, ix = ox * c.sw - c.pl + q * c.dw;
                                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                                s += double(x[size_t(((n * c.ci + g * cig + ic) * c.h + iy) * c.w + ix)]) *
                                     w[size_t(((o * cig + ic) * c.kh + r) * c.kw + q)];
                            }
                    y[size_t(((n * c.co + o) * ho + oy) * wo + ox)] = float(s > 0 ? s : 0);
                }
    return y;
}

// A layer of case c's shapes with its output planes ho x wo, ReLU after; pointers and tiles
// are the caller's.
k::conv2d_args conv_args_of(const conv_case& c, int64_t ho, int64_t wo) {
    k::conv2d_args a{};
    a.n = c.n; a.c_in = c.ci; a.h = c.h; a.w_in = c.w; a.c_out = c.co; a.kh = c.kh; a.kw = c.kw;
    a.stride_h = c.sh; a.stride_w = c.sw; a.pad_top = c.pt; a.pad_left = c.pl;
    a.dil_h = c.dh; a.dil_w = c.dw; a.groups = c.g; a.h_out = ho; a.w_out = wo;
    a.ep.act = k::activation::relu;
    return a;
}

class conv : public ::testing::TestWithParam<conv_case> {};

TEST_P(conv, matches_reference_with_relu) {
    const conv_case c = GetParam();
    const int64_t ho = (c.h + c.pt + c.pb - c.dh * (c.kh - 1) - 1) / c.sh + 1;
    const int64_t wo = (c.w + c.pl + c.pr - c.dw * (c.kw - 1) - 1) / c.sw + 1;
    auto x = random_vector(size_t(c.n * c.ci * c.h * c.w), 1);
    auto w = random_vector(size_t(c.co * (c.ci / c.g) * c.kh * c.kw), 2);
    auto b = random_vector(size_t(c.co), 3);
    std::vector<float> y(size_t(c.n * c.co * ho * wo), NAN);
    k::conv2d_args a = conv_args_of(c, ho, wo);
    a.x = x.data(); a.w = w.data(); a.bias = b.data(); a.y = y.data();
    a.tile_co = 8; a.tile_pix = 17; a.tile_k = 7;  // odd tiles exercise every edge
    const auto want = conv_reference(c, x, w, b, ho, wo);
    // Both GEMM libraries; odd tiles, then whole planes (depthwise: one run per tap), then
    // whole planes 1, 2 or 3 groups to a block (the last block of 3 may hold fewer).
    // K chunks of 7 (direct convolution: one input channel per chunk) and of all of K; direct
    // convolution (where the CPU and the shape allow) and im2col with either GEMM library.
    // Then blocks of 2 images' whole planes (one GEMM for both, outside depthwise layers;
    // batches of 3 leave a block of one), and of 3 images in odd tiles (image by image).
    for (int method = 0; method < 3; ++method)
        for (int64_t tiling = 0; tiling < 7; ++tiling) {
            const bool openblas = method == 2;
            const int64_t tile_pix = tiling == 0 || tiling == 6 ? 17 : ho * wo;
            a.tile_groups = int32_t(tiling < 2 || tiling >= 4 ? 0 : tiling);
            a.tile_k = tiling == 4 ? 4096 : 7;
            a.tile_images = int32_t(tiling == 5 ? 2 : tiling == 6 ? 3 : 0);
            SCOPED_TRACE(std::string(method == 0 ? "direct" : openblas ? "im2col, OpenBLAS" : "im2col, oneDNN") +
                         ", tile " + std::to_string(tile_pix) + ", groups per block " + std::to_string(a.tile_groups) +
                         ", K chunk " + std::to_string(a.tile_k) + ", images per block " +
                         std::to_string(a.tile_images));
            const library_choice choice(openblas);
            const conv_method_choice conv_choice(method == 0 ? k::conv_method::direct : k::conv_method::im2col);
            a.tile_pix = int32_t(tile_pix);
            std::fill(y.begin(), y.end(), NAN);
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr,
                                   k::conv2d_scratch_bytes(a)));
            expect_close(y, want);
        }
}

INSTANTIATE_TEST_SUITE_P(shapes, conv, ::testing::Values(
    conv_case{2, 3, 9, 11, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},   // 3x3 same
    conv_case{1, 8, 10, 10, 12, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},  // pointwise
    conv_case{1, 4, 13, 13, 6, 5, 3, 2, 3, 2, 0, 1, 2, 1, 1, 2},   // asymmetric, grouped
    conv_case{1, 6, 12, 12, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 6},   // depthwise, dilated
    conv_case{2, 24, 37, 35, 24, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 24},// depthwise, stride 2 (MobileNet)
    conv_case{1, 5, 20, 41, 5, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 5},   // depthwise 5x5, rows past 16
    conv_case{1, 4, 17, 19, 4, 3, 3, 3, 3, 0, 1, 2, 1, 1, 1, 4},   // depthwise, stride 3, asymmetric
    conv_case{2, 3, 15, 15, 10, 11, 11, 4, 4, 2, 2, 2, 2, 1, 1, 1},// alexnet-like stem
    // Direct convolution (AVX-512): input channels past one pass of 16; output channels in
    // tiles of 8 and a tail of 3 (2 + 1); stride 2; 1x7 (Inception); a 7x7 stride-2 stem;
    // grouped with strides (1, 2).
    conv_case{1, 20, 14, 14, 19, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    conv_case{2, 18, 17, 23, 12, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    conv_case{1, 6, 9, 17, 8, 1, 7, 1, 1, 0, 3, 0, 3, 1, 1, 1},
    conv_case{1, 3, 30, 30, 8, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1},
    conv_case{1, 8, 8, 9, 12, 3, 3, 1, 2, 0, 1, 2, 0, 1, 1, 2},
    // Planes wide enough for direct convolution to take a whole-plane tile in bands of rows.
    conv_case{1, 64, 30, 96, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    conv_case{1, 48, 31, 130, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    // A 7x7 plane with few output channels runs direct despite its padding (DenseNet-121).
    conv_case{2, 40, 7, 7, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    // Batches of small planes, several images a block: pointwise, 1x1 stride 2 (ResNet's
    // downsampling), 3x3 grouped.
    conv_case{3, 24, 7, 7, 40, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    conv_case{3, 16, 14, 13, 24, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1},
    conv_case{4, 12, 9, 9, 18, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 3}
));

// Direct convolution applies bias and ReLU, Clip or the bias alone in the register at its
// last pass: the bits of the sums followed by the blocks' pass (epilogue_row, clip_row), in
// tiles of several K chunks or of several passes, with a zero bias and a residual (left to the
// pass). Grouped layers: the conv test above (their bias offsets).
TEST(conv_direct, finishes_with_the_epilogue_passes_bits) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "direct convolution needs AVX-512";
    const conv_method_choice choice(k::conv_method::direct);
    const int64_t n = 2, ci = 48, h = 13, w = 15, co = 21;
    auto x = random_vector(size_t(n * ci * h * w), 31);
    auto wt = random_vector(size_t(co * ci * 9), 32);
    auto bias = random_vector(size_t(co), 33);
    auto res = random_vector(size_t(n * co * h * w), 34);
    bias[3] = 0.0f;
    k::conv2d_args a{};
    a.x = x.data(); a.w = wt.data();
    a.n = n; a.c_in = ci; a.h = h; a.w_in = w; a.c_out = co; a.kh = 3; a.kw = 3;
    a.stride_h = a.stride_w = 1; a.pad_top = a.pad_left = 1; a.dil_h = a.dil_w = 1; a.groups = 1;
    a.h_out = h; a.w_out = w;
    a.tile_co = 13; a.tile_pix = 50;  // odd tiles
    ASSERT_TRUE(k::conv2d_direct_chosen(a));
    const int64_t hw = h * w;
    // K chunks of 16 channels (one pass each); one chunk of three passes.
    for (const int32_t tile_k : {9 * 20, 9 * 48})
    for (const k::activation act : {k::activation::relu, k::activation::clip, k::activation::none})
        for (const bool with_res : {false, true}) {
            a.tile_k = tile_k;
            std::vector<float> sums(size_t(n * co * h * w));
            a.y = sums.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            k::conv2d_args f = a;
            f.bias = bias.data();
            f.residual = with_res ? res.data() : nullptr;
            f.ep.act = act;
            f.ep.alpha = -0.5f;
            f.ep.beta = 0.75f;
            EXPECT_EQ(k::conv2d_direct_finishes(f), !with_res);
            std::vector<float> got(sums.size(), NAN), want(sums.size());
            f.y = got.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &f, k::conv2d_grid(f), 0, -1, nullptr, k::conv2d_scratch_bytes(f)));
            for (int64_t i = 0; i < int64_t(sums.size()); ++i) {
                const float b = bias[size_t(i / hw % co)], r = with_res ? res[size_t(i)] : 0.0f;
                float v = sums[size_t(i)];
                if (act == k::activation::clip && !with_res) {
                    const float t = v + b, lo = t < f.ep.alpha ? f.ep.alpha : t;
                    v = lo > f.ep.beta ? f.ep.beta : lo;
                } else if (act == k::activation::relu) {
                    const float t = with_res ? v + b + r : v + b;
                    v = t > 0 ? t : 0;
                } else if (with_res) {
                    v += b + r;
                    if (act == k::activation::clip) v = std::min(std::max(v, f.ep.alpha), f.ep.beta);
                } else if (b != 0.0f) {
                    v += b;
                }
                want[size_t(i)] = v;
            }
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                << "activation " << int(act) << (with_res ? " with a residual" : "") << ", K chunk " << tile_k;
        }
}

// Layers of short K (64 or less) run the GEMM path's rows 32 at a time: tiles of more rows
// than that (72 output channels, one tile), pointwise and through im2col (3x3 of 7 input
// channels: K = 63), K chunks inside and across the row calls, both GEMM libraries.
TEST(conv, short_k_tiles_in_row_calls_match_the_reference) {
    const conv_method_choice choice(k::conv_method::im2col);
    for (const conv_case& c : {conv_case{2, 24, 12, 13, 72, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
                              conv_case{1, 7, 11, 10, 72, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                              conv_case{1, 64, 9, 9, 40, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1}}) {
        const int64_t ho = c.h + c.pt + c.pb - c.kh + 1, wo = c.w + c.pl + c.pr - c.kw + 1;
        auto x = random_vector(size_t(c.n * c.ci * c.h * c.w), 61);
        auto w = random_vector(size_t(c.co * c.ci * c.kh * c.kw), 62);
        auto b = random_vector(size_t(c.co), 63);
        const auto want = conv_reference(c, x, w, b, ho, wo);
        std::vector<float> y(want.size());
        k::conv2d_args a = conv_args_of(c, ho, wo);
        a.x = x.data(); a.w = w.data(); a.bias = b.data(); a.y = y.data();
        a.tile_co = int32_t(c.co);
        for (const int32_t tile_pix : {29, int32_t(ho * wo)})
            for (const int32_t tile_k : {10, 4096})
                for (const bool openblas : {false, true}) {
                    SCOPED_TRACE("K " + std::to_string(c.ci * c.kh * c.kw) + ", tile " + std::to_string(tile_pix) +
                                 ", K chunk " + std::to_string(tile_k) + (openblas ? ", OpenBLAS" : ", oneDNN"));
                    const library_choice library(openblas);
                    a.tile_pix = tile_pix; a.tile_k = tile_k;
                    std::fill(y.begin(), y.end(), NAN);
                    ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr,
                                           k::conv2d_scratch_bytes(a)));
                    expect_close(y, want);
                }
    }
}

// Winograd F(2x2, 3x3) against the direct reference (conv_reference: bias, then ReLU): odd
// and even planes, pads 0, 1 and 2 (outputs past the input's end read zeros), input channels
// past one K chunk, grouped layers, two images; tiles that start and end mid-row (odd pixel
// counts), odd output-channel tiles, whole planes; both GEMM libraries.
TEST(conv_winograd, matches_the_reference_on_every_tile) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "Winograd convolution needs AVX-512";
    const conv_method_choice choice(k::conv_method::winograd);
    for (const conv_case& c : {conv_case{2, 20, 13, 15, 19, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                              conv_case{1, 16, 12, 40, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                              conv_case{1, 18, 9, 7, 17, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1},
                              conv_case{1, 12, 8, 11, 20, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1, 1},
                              conv_case{2, 32, 10, 10, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2},
                              conv_case{1, 8, 35, 35, 64, 3, 3, 1, 1, 1, 0, 1, 2, 1, 1, 1}}) {
        const int64_t ho = c.h + c.pt + c.pb - 2, wo = c.w + c.pl + c.pr - 2, ci_g = c.ci / c.g;
        auto x = random_vector(size_t(c.n * c.ci * c.h * c.w), 41);
        auto w = random_vector(size_t(c.co * ci_g * 9), 42);
        auto b = random_vector(size_t(c.co), 43);
        std::vector<float> u(size_t(k::winograd_filter_floats(c.co, ci_g)), NAN);
        k::winograd_filters(w.data(), c.co, ci_g, c.co / c.g, u.data());
        const auto want = conv_reference(c, x, w, b, ho, wo);
        std::vector<float> y(want.size());
        k::conv2d_args a = conv_args_of(c, ho, wo);
        a.x = x.data(); a.w = w.data(); a.bias = b.data(); a.y = y.data(); a.w_winograd = u.data();
        ASSERT_TRUE(k::conv2d_winograd_chosen(a));
        for (const int32_t tile_pix : {17, 50, int32_t(ho * wo)})
            for (const int32_t tile_co : {7, 64})
                for (const int32_t tile_k : {9 * 5, 4096})
                    for (const bool openblas : {false, true}) {
                        SCOPED_TRACE("shape " + std::to_string(c.ci) + "x" + std::to_string(c.h) + "x" +
                                     std::to_string(c.w) + " -> " + std::to_string(c.co) + ", tile " +
                                     std::to_string(tile_pix) + " x " + std::to_string(tile_co) + ", K chunk " +
                                     std::to_string(tile_k) + (openblas ? ", OpenBLAS" : ", oneDNN"));
                        const library_choice library(openblas);
                        a.tile_pix = tile_pix; a.tile_co = tile_co; a.tile_k = tile_k;
                        std::fill(y.begin(), y.end(), NAN);
                        ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr,
                                               k::conv2d_scratch_bytes(a)));
                        expect_close(y, want);
                    }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The probe of 512-bit FMA rate on a CPU whose answer is known: AMD's family 19h cores with
// AVX-512 (Zen 4) run each 512-bit FMA as two 256-bit halves. The probe is measured once and
// its answer kept: asking again gives the same.
TEST(cpu_features, fma512_half_rate_on_known_cores) {
    if (!k::cpu_has_avx512()) {
        EXPECT_FALSE(k::cpu_fma512_half_rate());
        return;
    }
    const bool first = k::cpu_fma512_half_rate();
    EXPECT_EQ(k::cpu_fma512_half_rate(), first);
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    ASSERT_TRUE(__get_cpuid(0, &eax, &ebx, &ecx, &edx));
    const bool amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163;  // "AuthenticAMD"
    ASSERT_TRUE(__get_cpuid(1, &eax, &ebx, &ecx, &edx));
    const unsigned base_family = (eax >> 8) & 0xf;
    const unsigned family = base_family + (base_family == 0xf ? (eax >> 20) & 0xff : 0);
    if (!(amd && family == 0x19)) GTEST_SKIP() << "no known answer for this CPU (the probe said " << first << ")";
    EXPECT_TRUE(first) << "a Zen 4 core's 512-bit FMAs were timed at the rate of its 256-bit ones";
}
#endif

// Winograd applies bias and ReLU or Clip in the register, and leaves a residual to the blocks'
// pass: against im2col's sums with the same epilogues, within rounding; without filters
// (w_winograd null) the layer runs another way; preempted at a check point, a block
// restarted from its start gives the same bits.
TEST(conv_winograd, epilogues_fallback_and_restart) {
    if (!k::cpu_has_avx512()) GTEST_SKIP() << "Winograd convolution needs AVX-512";
    const int64_t n = 1, ci = 24, h = 14, w = 14, co = 64;
    auto x = random_vector(size_t(n * ci * h * w), 51);
    auto wt = random_vector(size_t(co * ci * 9), 52);
    auto bias = random_vector(size_t(co), 53);
    auto res = random_vector(size_t(n * co * h * w), 54);
    std::vector<float> u(size_t(k::winograd_filter_floats(co, ci)));
    k::winograd_filters(wt.data(), co, ci, co, u.data());
    k::conv2d_args a{};
    a.x = x.data(); a.w = wt.data(); a.bias = bias.data();
    a.n = n; a.c_in = ci; a.h = h; a.w_in = w; a.c_out = co; a.kh = 3; a.kw = 3;
    a.stride_h = a.stride_w = 1; a.pad_top = a.pad_left = 1; a.dil_h = a.dil_w = 1; a.groups = 1;
    a.h_out = h; a.w_out = w; a.tile_co = 32; a.tile_pix = 98; a.tile_k = 9 * 8;
    EXPECT_TRUE(k::winograd_filters_wanted(co, ci, h, w));
    EXPECT_FALSE(k::winograd_filters_wanted(16, ci, h, w));  // thin GEMMs: direct wins
    // 32 channels: where 512-bit FMAs issue at half rate and the direct sums cost twice as much
    EXPECT_EQ(k::winograd_filters_wanted(32, ci, h, w), k::cpu_fma512_half_rate());
    EXPECT_FALSE(k::winograd_filters_wanted(co, ci, 7, 7));  // 16 tiles: im2col wins
    EXPECT_FALSE(k::conv2d_winograd_chosen(a));              // no filters
    a.w_winograd = u.data();
    EXPECT_TRUE(k::conv2d_winograd_chosen(a));
    for (const k::activation act : {k::activation::relu, k::activation::clip, k::activation::none})
        for (const bool with_res : {false, true}) {
            SCOPED_TRACE("activation " + std::to_string(int(act)) + (with_res ? " with a residual" : ""));
            a.ep.act = act;
            a.ep.alpha = -0.5f;
            a.ep.beta = 0.75f;
            a.residual = with_res ? res.data() : nullptr;
            std::vector<float> want(size_t(n * co * h * w)), got(want.size(), NAN);
            {
                const conv_method_choice choice(k::conv_method::im2col);
                a.y = want.data();
                ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            }
            a.y = got.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            expect_close(got, want);
        }
    a.residual = nullptr;
    a.ep.act = k::activation::relu;
    std::vector<float> y1(size_t(n * co * h * w)), y2(y1.size(), 12345.f);
    a.y = y1.data();
    ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
    gpu::task_words task{};
    task.preempt = 1;
    a.y = y2.data();
    EXPECT_FALSE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, &task, k::conv2d_scratch_bytes(a)));
    task.preempt = 0;
    EXPECT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, &task, k::conv2d_scratch_bytes(a)));
    EXPECT_EQ(y1, y2);
}

// A whole plane as one run per tap over the padded plane (its stride phases) gives
// window_sum's sums exactly (same taps, same order), for the depthwise shapes MobileNets have
// (stride 1 and 2) and odd ones: even and odd sizes, asymmetric strides, padding wider than
// the plane, rows narrow (one flat run) and wide (row by row), windows past 64 taps; 3x3
// windows (shifted in registers) whose rows end in a partial vector.
TEST(window_sum, whole_plane_runs_equal_the_row_passes) {
    struct plane_case { int64_t h, w, k, pad, sh = 1, sw = 1; };
    for (const plane_case pc : {plane_case{14, 14, 3, 1}, plane_case{7, 7, 3, 1}, plane_case{112, 112, 3, 1},
                                plane_case{20, 41, 5, 2}, plane_case{9, 5, 3, 0}, plane_case{6, 6, 7, 3},
                                plane_case{1, 30, 3, 1}, plane_case{112, 112, 3, 1, 2, 2}, plane_case{14, 14, 3, 1, 2, 2},
                                plane_case{15, 15, 3, 1, 2, 2}, plane_case{33, 35, 5, 2, 2, 2}, plane_case{9, 11, 3, 0, 2, 2},
                                plane_case{10, 13, 3, 1, 1, 2}, plane_case{13, 10, 3, 1, 2, 1}, plane_case{4, 4, 7, 3, 2, 2},
                                plane_case{1, 40, 3, 1, 2, 2}, plane_case{12, 12, 9, 4}, plane_case{40, 70, 9, 4, 2, 1},
                                plane_case{56, 56, 3, 1}, plane_case{28, 28, 3, 1}, plane_case{9, 50, 3, 0},
                                plane_case{9, 101, 3, 1, 2, 2}, plane_case{56, 56, 3, 1, 2, 2}}) {
        const int64_t h_out = (pc.h + 2 * pc.pad - pc.k) / pc.sh + 1, w_out = (pc.w + 2 * pc.pad - pc.k) / pc.sw + 1;
        const k::plane_window g{pc.h, pc.w, w_out, pc.k, pc.k, pc.sh, pc.sw, pc.pad, pc.pad, 1, 1};
        ASSERT_TRUE(k::plane_phases_fit(g));
        const auto x = random_vector(size_t(pc.h * pc.w), 31), w = random_vector(size_t(pc.k * pc.k), 32);
        std::vector<float> rows(size_t(h_out * w_out), NAN), plane(rows.size(), NAN), strided(static_cast<size_t>(w_out));
        std::vector<float> scratch(k::window_sum_plane_scratch_bytes(g, h_out) / sizeof(float), NAN);
        k::window_sum(g, x.data(), w.data(), 0, h_out * w_out, rows.data(), strided.data());
        k::window_sum_plane(g, h_out, x.data(), w.data(), plane.data(), scratch.data());
        EXPECT_EQ(plane, rows) << pc.h << "x" << pc.w << " k" << pc.k << " pad " << pc.pad << " stride " << pc.sh << "x"
                               << pc.sw;
    }
}

// Depthwise layers of small planes, 16 channels at a time (channels interleaved in one padded
// plane, bias and activation in the register), give the per-plane path's results bit for bit:
// the same taps in the same order, then the same epilogue operations. Channel counts leave a
// remainder that takes the per-plane path; biases include zeros (the epilogue skips adding
// those when there is no activation); the input holds a NaN and values past Clip's bounds.
// (3x3 windows go to depthwise3x3 instead, tested below.)
TEST(depthwise16, equals_the_per_plane_path_bit_for_bit) {
    struct dw_case { int64_t ch, h, w, k, pad, s; };
    for (const dw_case dc : {dw_case{37, 7, 7, 5, 2, 1}, dw_case{33, 14, 13, 5, 2, 2}, dw_case{32, 9, 8, 5, 2, 1},
                             dw_case{16, 10, 10, 5, 0, 1}, dw_case{16, 10, 10, 7, 3, 2}, dw_case{48, 16, 16, 7, 3, 1},
                             dw_case{20, 3, 3, 5, 2, 1}})
        for (const k::activation act : {k::activation::none, k::activation::relu, k::activation::clip}) {
            const int64_t ho = (dc.h + 2 * dc.pad - dc.k) / dc.s + 1, wo = (dc.w + 2 * dc.pad - dc.k) / dc.s + 1;
            auto x = random_vector(size_t(2 * dc.ch * dc.h * dc.w), 41);
            for (size_t i = 0; i < x.size(); i += 7) x[i] *= 40.0f;
            x[5] = NAN;
            const auto w = random_vector(size_t(dc.ch * dc.k * dc.k), 42);
            auto b = random_vector(size_t(dc.ch), 43);
            for (size_t i = 0; i < b.size(); i += 3) b[i] = 0.0f;
            k::conv2d_args a{};
            a.x = x.data(); a.w = w.data(); a.bias = b.data();
            a.n = 2; a.c_in = dc.ch; a.h = dc.h; a.w_in = dc.w; a.c_out = dc.ch; a.kh = dc.k; a.kw = dc.k;
            a.stride_h = dc.s; a.stride_w = dc.s; a.pad_top = dc.pad; a.pad_left = dc.pad; a.dil_h = 1; a.dil_w = 1;
            a.groups = dc.ch; a.h_out = ho; a.w_out = wo;
            a.ep.act = act; a.ep.alpha = 0.0f; a.ep.beta = 6.0f;
            a.tile_co = 1; a.tile_pix = int32_t(ho * wo); a.tile_k = int32_t(dc.k * dc.k);
            ASSERT_TRUE(k::depthwise16_possible(a) || !k::cpu_has_avx512());
            std::vector<float> per_plane(size_t(2 * dc.ch * ho * wo), -1.0f), by_16(per_plane.size(), -2.0f);
            a.tile_groups = 1;
            a.y = per_plane.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            a.tile_groups = int32_t(dc.ch);
            a.y = by_16.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            ASSERT_EQ(0, std::memcmp(per_plane.data(), by_16.data(), per_plane.size() * sizeof(float)))
                << dc.ch << " channels " << dc.h << "x" << dc.w << " k" << dc.k << " pad " << dc.pad << " stride " << dc.s
                << " activation " << int(act);
        }
}

// 3x3 depthwise planes read straight from the input (masked loads for the padding, several
// output rows at once, bias and activation in the register) give the row passes' results bit
// for bit (a tile of one output row each goes through window_sum and the epilogue passes):
// strides 1 and 2 in both directions, padding 0 to 2 (rows wholly padding), planes of 1 to 7
// rows (the bands' remainders), rows ending in partial vectors, rows wider than 16 vectors,
// narrow planes run flat across rows (up to 4096 outputs, and one past it), zero biases, a
// NaN, and values past Clip's bounds; at stride 2, rows whose last vector's third tap reads
// the column just past the row's end (63 and 32 wide) or the row's last column (64 wide).
TEST(depthwise3x3, equals_the_row_passes_bit_for_bit) {
    struct dw_case { int64_t ch, h, w, pad, sh, sw; };
    for (const dw_case dc : {dw_case{3, 112, 112, 1, 1, 1}, dw_case{3, 112, 112, 1, 2, 2}, dw_case{2, 56, 56, 1, 2, 2},
                             dw_case{2, 7, 7, 1, 1, 1}, dw_case{2, 14, 14, 1, 2, 2}, dw_case{2, 15, 33, 1, 2, 2},
                             dw_case{2, 9, 35, 0, 1, 1}, dw_case{2, 10, 17, 2, 1, 1}, dw_case{2, 13, 40, 2, 2, 2},
                             dw_case{2, 1, 20, 1, 1, 1}, dw_case{2, 3, 5, 0, 1, 1}, dw_case{2, 3, 3, 1, 1, 1},
                             dw_case{2, 6, 64, 1, 1, 2}, dw_case{2, 11, 9, 1, 2, 1}, dw_case{2, 5, 600, 1, 1, 1},
                             dw_case{2, 4, 700, 1, 2, 2}, dw_case{2, 8, 33, 0, 2, 2}, dw_case{2, 9, 34, 1, 2, 2},
                             dw_case{3, 14, 14, 1, 1, 1}, dw_case{2, 17, 17, 1, 1, 1}, dw_case{2, 400, 9, 1, 1, 1},
                             dw_case{2, 500, 9, 1, 1, 1}, dw_case{2, 2, 1, 1, 1, 1}, dw_case{2, 7, 63, 1, 2, 2},
                             dw_case{2, 5, 32, 0, 2, 2}, dw_case{2, 5, 64, 1, 2, 2}})
        for (const k::activation act : {k::activation::none, k::activation::relu, k::activation::clip}) {
            const int64_t ho = (dc.h + 2 * dc.pad - 3) / dc.sh + 1, wo = (dc.w + 2 * dc.pad - 3) / dc.sw + 1;
            auto x = random_vector(size_t(2 * dc.ch * dc.h * dc.w), 51);
            for (size_t i = 0; i < x.size(); i += 7) x[i] *= 40.0f;
            x[x.size() / 3] = NAN;
            const auto w = random_vector(size_t(dc.ch * 9), 52);
            auto b = random_vector(size_t(dc.ch), 53);
            b[0] = 0.0f;
            k::conv2d_args a{};
            a.x = x.data(); a.w = w.data(); a.bias = b.data();
            a.n = 2; a.c_in = dc.ch; a.h = dc.h; a.w_in = dc.w; a.c_out = dc.ch; a.kh = 3; a.kw = 3;
            a.stride_h = dc.sh; a.stride_w = dc.sw; a.pad_top = dc.pad; a.pad_left = dc.pad; a.dil_h = 1; a.dil_w = 1;
            a.groups = dc.ch; a.h_out = ho; a.w_out = wo;
            a.ep.act = act; a.ep.alpha = 0.0f; a.ep.beta = 6.0f;
            a.tile_co = 1; a.tile_k = 9; a.tile_groups = 1;
            ASSERT_TRUE(k::depthwise3x3_possible(a) || !k::cpu_has_avx512());
            std::vector<float> by_rows(size_t(2 * dc.ch * ho * wo), -1.0f), by_planes(by_rows.size(), -2.0f);
            a.tile_pix = int32_t(wo);
            a.y = by_rows.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            a.tile_pix = int32_t(ho * wo);
            a.y = by_planes.data();
            ASSERT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a)));
            ASSERT_EQ(0, std::memcmp(by_rows.data(), by_planes.data(), by_rows.size() * sizeof(float)))
                << dc.h << "x" << dc.w << " pad " << dc.pad << " stride " << dc.sh << "x" << dc.sw << " activation "
                << int(act);
        }
}

// Softmax, log-softmax and layer norm rows (AVX-512 in float with a vector exp where the CPU
// has it) against double-precision definitions, for lengths around the vector width and the
// ones transformers use, with a masked (-inf) score and large values.
TEST(rows, softmax_and_layer_norm_match_double_precision) {
    for (int64_t n : {1, 7, 15, 16, 17, 33, 128, 384, 512, 768}) {
        auto x = random_vector(size_t(n), uint32_t(40 + n));
        for (auto& v : x) v = 80.0f + 12.0f * v;  // scores spread over tens, far from 0
        if (n > 2) x[1] = -std::numeric_limits<float>::infinity();  // a masked position
        std::vector<float> y(static_cast<size_t>(n)), ly(static_cast<size_t>(n));
        k::softmax_row(x.data(), y.data(), n, 1, false);
        k::softmax_row(x.data(), ly.data(), n, 1, true);
        double mx = -INFINITY, sum = 0;
        for (float v : x) mx = std::max(mx, double(v));
        for (float v : x) sum += std::exp(double(v) - mx);
        for (int64_t i = 0; i < n; ++i) {
            const double p = std::exp(double(x[size_t(i)]) - mx) / sum;
            ASSERT_NEAR(y[size_t(i)], p, 2e-6 * p + 1e-38) << "softmax n=" << n << " at " << i;
            if (std::isfinite(x[size_t(i)])) {
                ASSERT_NEAR(ly[size_t(i)], double(x[size_t(i)]) - mx - std::log(sum), 1e-5) << "log-softmax n=" << n;
            }
        }
        const auto scale = random_vector(size_t(n), 50), bias = random_vector(size_t(n), 51);
        auto z = random_vector(size_t(n), 52);
        for (auto& v : z) v = 3.0f + 2.0f * v;  // an offset mean
        std::vector<float> ln(static_cast<size_t>(n));
        float mean = 0, inv_std = 0;
        k::layer_norm_row(z.data(), ln.data(), n, scale.data(), bias.data(), 1e-5f, &mean, &inv_std);
        double m = 0, var = 0;
        for (float v : z) m += v;
        m /= double(n);
        for (float v : z) var += (v - m) * (v - m);
        var /= double(n);
        const double inv = 1.0 / std::sqrt(var + 1e-5);
        EXPECT_NEAR(mean, m, 1e-5);
        EXPECT_NEAR(inv_std, inv, 1e-4 * inv);
        for (int64_t i = 0; i < n; ++i)
            ASSERT_NEAR(ln[size_t(i)], (z[size_t(i)] - m) * inv * scale[size_t(i)] + bias[size_t(i)], 2e-5)
                << "layer norm n=" << n << " at " << i;
    }
}

// Equal bits, or both NaN (a NaN's payload is not part of the contract).
bool same_value(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// The fused epilogues' vector path (bias + activation in one pass) against the scalar loops,
// bit for bit: every activation, a row of biases, one bias value and none, tails of every
// length, and the values where vector min/max differ from the scalar ternaries (NaN, signed
// zeros, infinities, the activations' bounds). The batch-norm affine map the same way.
TEST(epilogue, vector_path_equals_the_scalar_loops_bit_for_bit) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> special{0.0f, -0.0f, nan, inf, -inf, 1.0f, -1.0f, 4.0f, -4.0f, 6.0f, -3.0f, 3.0f,
                                     1e-30f, -1e-30f, 5.5f, -5.5f, 0.25f, 0.75f, 2.0f, -2.0f};
    auto x = random_vector(200, 91);
    for (auto& v : x) v *= 7.0f;
    for (size_t i = 0; i < special.size(); ++i) x[3 * i] = special[i];
    auto bias = random_vector(200, 92);
    for (size_t i = 0; i < 8; ++i) bias[20 * i + 1] = i % 2 ? -0.0f : 0.0f;
    const std::vector<k::epilogue> eps{
        {k::activation::none, 0, 0},          {k::activation::relu, 0, 0},
        {k::activation::leaky_relu, 0.1f, 0}, {k::activation::sigmoid, 0, 0},
        {k::activation::tanh, 0, 0},          {k::activation::clip, 0.0f, 6.0f},
        {k::activation::clip, -1.5f, 0.5f},   {k::activation::hard_sigmoid, 0.2f, 0.5f},
        {k::activation::hard_swish, 0, 0},    {k::activation::gelu_erf, 0, 0},
        {k::activation::gelu_tanh, 0, 0}};
    for (const auto& ep : eps) {
        for (int64_t n : {1, 15, 16, 17, 33, 64, 200}) {
            for (int bias_form = 0; bias_form < 3; ++bias_form) {  // none, one value, a row
                for (float beta : {1.0f, 0.5f}) {
                    const float* b = bias_form == 0 ? nullptr : bias_form == 1 ? &bias[7] : bias.data();
                    const int64_t stride = bias_form == 2 ? 1 : 0;
                    std::vector<float> got(x.begin(), x.begin() + n), want = got;
                    k::bias_epilogue_row(got.data(), n, b, stride, beta, ep);
                    if (b)
                        for (int64_t j = 0; j < n; ++j) want[size_t(j)] += beta * b[j * stride];
                    k::apply_epilogue_scalar(want.data(), n, ep);
                    for (int64_t j = 0; j < n; ++j)
                        ASSERT_TRUE(same_value(got[size_t(j)], want[size_t(j)]))
                            << "activation " << int(ep.act) << " n=" << n << " bias form " << bias_form << " beta "
                            << beta << " at " << j << " (x = " << x[size_t(j)] << "): " << got[size_t(j)]
                            << " vs " << want[size_t(j)];
                }
            }
            std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
            k::affine_row(got.data(), x.data(), -1.25f, 0.375f, n, ep);
            for (int64_t j = 0; j < n; ++j) want[size_t(j)] = x[size_t(j)] * -1.25f + 0.375f;
            k::apply_epilogue_scalar(want.data(), n, ep);
            for (int64_t j = 0; j < n; ++j)
                ASSERT_TRUE(same_value(got[size_t(j)], want[size_t(j)]))
                    << "affine, activation " << int(ep.act) << " n=" << n << " at " << j;
        }
    }
}

// The per-channel affine map with each activation it fuses, over planes whose length is not a
// multiple of the vector width.
TEST(batchnorm, matches_reference_with_each_fused_activation) {
    const int64_t n = 2, c = 3, hw = 37;
    auto x = random_vector(size_t(n * c * hw), 7);
    const std::vector<float> scale{0.5f, -1.5f, 2.0f}, bias{0.1f, 0.2f, -0.3f}, mean{0.0f, 0.25f, -0.5f},
        var{1.0f, 0.5f, 2.0f};
    for (auto act : {k::activation::none, k::activation::relu, k::activation::clip, k::activation::sigmoid}) {
        std::vector<float> y(x.size(), NAN), want(x.size());
        k::batchnorm_args a{};
        a.x = x.data(); a.scale = scale.data(); a.bias = bias.data(); a.mean = mean.data(); a.var = var.data();
        a.y = y.data(); a.n = n; a.c = c; a.hw = hw; a.epsilon = 1e-5f; a.planes_per_block = 2;
        a.ep.act = act; a.ep.alpha = -0.2f; a.ep.beta = 0.3f;
        ASSERT_TRUE(run_blocks(k::batchnorm_kernel, &a, k::batchnorm_grid(a)));
        for (size_t i = 0; i < x.size(); ++i) {
            const size_t ch = (i / size_t(hw)) % size_t(c);
            const double v = (x[i] - mean[ch]) / std::sqrt(double(var[ch]) + 1e-5) * scale[ch] + bias[ch];
            want[i] = float(act == k::activation::relu      ? std::max(v, 0.0)
                            : act == k::activation::clip    ? std::min(std::max(v, -0.2), 0.3)
                            : act == k::activation::sigmoid ? 1 / (1 + std::exp(-v))
                                                            : v);
        }
        expect_close(y, want);
    }
}

// A 2-D pool over n x c planes of h x w, padding pad before and pad_end after (both axes),
// with `extra` windows past the last whole one (ceil mode).
k::pool2d_args pool_args(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel, int64_t sh, int64_t sw,
                         int64_t pad, int64_t pad_end, int64_t extra, k::pool_op op, bool include_pad) {
    k::pool2d_args a{};
    a.n = n; a.c = c; a.h = h; a.w = w; a.kh = a.kw = kernel;
    a.stride_h = sh; a.stride_w = sw; a.pad_top = a.pad_left = pad; a.pad_bottom = a.pad_right = pad_end;
    a.dil_h = a.dil_w = 1; a.op = op; a.count_include_pad = include_pad;
    a.h_out = (h + pad + pad_end - kernel) / sh + 1 + extra;
    a.w_out = (w + pad + pad_end - kernel) / sw + 1 + extra;
    return a;
}

// Average pooling's row-pass path against the per-output definition (pool_output, the one the
// GPU kernel runs): pads, strides 1-3, windows past the padded input (ceil mode), both counts.
// The separable path (flat runs at stride 1, even/odd columns at stride 2, a plain loop at
// other strides; ceil-mode windows past the padding) against the per-output definition: max
// exactly, averages within rounding.
// Max pools of small planes, 16 at a time (planes interleaved in one padded plane), give the
// separable path's results bit for bit: the same comparisons in the same order. Plane counts
// leave a remainder for the per-plane path; ceil-mode windows reach past the padded input; the
// input holds NaNs and equal values of either sign of zero.
TEST(pool16, max_equals_the_separable_path_bit_for_bit) {
    struct pool_case { int64_t planes, h, w, k, s, pad, pad_end, extra; };
    // (2x2 and 3x3 windows at strides 1 and 2 go to pool_window instead, tested below.)
    for (const pool_case pc : {pool_case{37, 17, 17, 3, 3, 0, 0, 0}, pool_case{40, 35, 35, 5, 1, 2, 2, 0},
                               pool_case{16, 8, 8, 4, 1, 1, 2, 0}, pool_case{33, 17, 23, 5, 2, 1, 0, 1},
                               pool_case{20, 7, 7, 7, 1, 0, 0, 0}, pool_case{18, 9, 30, 4, 2, 1, 1, 1},
                               pool_case{32, 14, 14, 2, 3, 0, 0, 1}})
        for (bool include_pad : {false, true}) {
                k::pool2d_args a = pool_args(1, pc.planes, pc.h, pc.w, pc.k, pc.s, pc.s, pc.pad, pc.pad_end, pc.extra,
                                             k::pool_op::max, include_pad);
                auto x = random_vector(size_t(a.c * a.h * a.w), 9);
                for (size_t i = 0; i < x.size(); i += 11) x[i] = (i / 11) % 2 ? 0.0f : -0.0f;
                x[3] = NAN;
                x[x.size() / 2] = NAN;
                ASSERT_TRUE(k::pool16_possible(a) || !k::cpu_has_avx512());
                std::vector<float> by_plane(size_t(a.c * a.h_out * a.w_out), -1.0f), by_16(by_plane.size(), -2.0f);
                a.x = x.data();
                a.planes_per_block = 1;
                a.y = by_plane.data();
                ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a), 0, -1, nullptr, k::pool2d_scratch_bytes(a)));
                a.planes_per_block = a.c;
                a.y = by_16.data();
                ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a), 0, -1, nullptr, k::pool2d_scratch_bytes(a)));
                ASSERT_EQ(0, std::memcmp(by_plane.data(), by_16.data(), by_plane.size() * sizeof(float)))
                    << pc.planes << " planes " << pc.h << "x" << pc.w << " k" << pc.k << " s" << pc.s << " pad " << pc.pad
                    << "/" << pc.pad_end << (include_pad ? " counting padding" : "");
            }
}

// 3x3 and 2x2 max and average pools read straight from the planes (masked loads for the
// padding, bands of output rows, the division in the register) give pool_plane_separable's
// and divide_row's results bit for bit: strides 1 and 2 each way, padding 0 to 2, ceil mode's
// extra windows, narrow planes run flat across rows, counting the padding or not, NaNs and
// signed zeros (which max keeps depends on the order).
TEST(pool_window, equals_the_separable_path_bit_for_bit) {
    struct pool_case { int64_t k, h, w, sh, sw, pad, pad_end, extra; };
    std::vector<pool_case> cases;
    for (const pool_case pc : {pool_case{3, 112, 112, 2, 2, 1, 1, 0}, pool_case{3, 147, 147, 2, 2, 0, 0, 0},
                               pool_case{3, 35, 35, 1, 1, 1, 1, 0}, pool_case{3, 17, 17, 2, 2, 0, 0, 0},
                               pool_case{3, 8, 8, 1, 1, 1, 1, 0}, pool_case{3, 9, 30, 2, 2, 1, 1, 1},
                               pool_case{3, 17, 23, 2, 1, 1, 0, 1}, pool_case{3, 11, 40, 1, 2, 2, 2, 0},
                               pool_case{3, 3, 3, 1, 1, 0, 0, 0}, pool_case{3, 1, 300, 1, 1, 1, 1, 0},
                               pool_case{3, 6, 530, 2, 2, 1, 1, 1}, pool_case{3, 13, 13, 2, 2, 0, 1, 1},
                               pool_case{3, 17, 17, 1, 1, 1, 1, 0}, pool_case{3, 400, 9, 1, 1, 1, 1, 0},
                               pool_case{3, 12, 12, 1, 1, 1, 0, 1}, pool_case{3, 7, 5, 1, 1, 1, 1, 0}})
        cases.push_back(pc);
    // 2x2: VGG's max pools (224 .. 14 wide), DenseNet's average pools (56 .. 14), odd sizes
    // whose last window reaches past the plane (ceil mode), padding, stride 1.
    for (const pool_case pc : {pool_case{2, 224, 224, 2, 2, 0, 0, 0}, pool_case{2, 56, 56, 2, 2, 0, 0, 0},
                               pool_case{2, 14, 14, 2, 2, 0, 0, 0}, pool_case{2, 13, 13, 2, 2, 0, 0, 1},
                               pool_case{2, 9, 30, 2, 2, 1, 1, 0}, pool_case{2, 17, 23, 2, 1, 0, 1, 1},
                               pool_case{2, 8, 8, 1, 1, 0, 0, 0}, pool_case{2, 11, 40, 1, 2, 1, 0, 0},
                               pool_case{2, 1, 300, 2, 2, 0, 0, 1}, pool_case{2, 6, 530, 2, 2, 1, 1, 0}})
        cases.push_back(pc);
    for (const pool_case pc : cases)
        for (auto op : {k::pool_op::average, k::pool_op::max})
            for (bool include_pad : {false, true}) {
                k::pool2d_args a =
                    pool_args(1, 3, pc.h, pc.w, pc.k, pc.sh, pc.sw, pc.pad, pc.pad_end, pc.extra, op, include_pad);
                auto x = random_vector(size_t(a.c * a.h * a.w), 19);
                for (size_t i = 0; i < x.size(); i += 11) x[i] = (i / 11) % 2 ? 0.0f : -0.0f;
                x[3] = NAN;
                x[x.size() / 2] = NAN;
                a.x = x.data();
                if (!k::pool_window_possible(a)) {
                    ASSERT_FALSE(k::cpu_has_avx512()) << pc.h << "x" << pc.w;
                    continue;
                }
                const int64_t in = a.h * a.w, out = a.h_out * a.w_out;
                std::vector<float> columns(size_t(a.w_out));
                for (int64_t ox = 0; ox < a.w_out; ++ox)
                    columns[size_t(ox)] = float(k::pool_window_count(a, ox, a.stride_w, a.pad_left, a.pad_right, pc.k, a.w));
                std::vector<float> separable(size_t(a.c * out), -1.0f), direct(separable.size(), -2.0f);
                std::vector<float> scratch(k::pool2d_scratch_bytes(a) / sizeof(float) + 1);
                for (int64_t p = 0; p < a.c; ++p) {
                    float* y = separable.data() + p * out;
                    k::pool_plane_separable(a, x.data() + p * in, y, scratch.data());
                    if (op == k::pool_op::average)
                        for (int64_t oy = 0; oy < a.h_out; ++oy)
                            k::divide_row(y + oy * a.w_out,
                                          float(k::pool_window_count(a, oy, a.stride_h, a.pad_top, a.pad_bottom, pc.k, a.h)),
                                          columns.data(), a.w_out);
                }
                a.y = direct.data();
                const gpu::block_context ctx{0, 1, 0, nullptr, nullptr, 0};
                ASSERT_TRUE(k::pool_window(a, 0, a.c, columns.data(), ctx));
                ASSERT_EQ(0, std::memcmp(separable.data(), direct.data(), separable.size() * sizeof(float)))
                    << (op == k::pool_op::max ? "max " : "average ") << pc.k << "x" << pc.k << " on " << pc.h << "x" << pc.w << " stride " << pc.sh
                    << "x" << pc.sw << " pad " << pc.pad << "/" << pc.pad_end << " extra " << pc.extra
                    << (include_pad ? " counting padding" : "");
            }
}

TEST(pool2d, separable_matches_the_per_output_definition) {
    struct pool_case { int64_t h, w, k, s, pad, pad_end, extra; };
    for (const pool_case pc : {pool_case{35, 35, 3, 1, 1, 1, 0}, pool_case{56, 56, 2, 2, 0, 0, 0},
                               pool_case{17, 23, 3, 2, 1, 0, 1}, pool_case{20, 41, 5, 3, 2, 2, 1},
                               pool_case{7, 7, 7, 1, 0, 0, 0}, pool_case{147, 147, 3, 2, 0, 0, 0},
                               pool_case{17, 17, 3, 1, 1, 1, 0}, pool_case{9, 30, 3, 2, 1, 1, 1}})
        for (auto op : {k::pool_op::average, k::pool_op::max})
        for (bool include_pad : {false, true}) {
            k::pool2d_args a = pool_args(2, 3, pc.h, pc.w, pc.k, pc.s, pc.s, pc.pad, pc.pad_end, pc.extra, op, include_pad);
            a.planes_per_block = 4;
            auto x = random_vector(size_t(a.n * a.c * a.h * a.w), 8);
            std::vector<float> y(size_t(a.n * a.c * a.h_out * a.w_out), NAN), want(y.size());
            a.x = x.data(); a.y = y.data();
            // With the planned scratch: the blocks' own choice of path (pool_window, pool16, per plane).
            ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a), 0, -1, nullptr, k::pool2d_scratch_bytes(a)));
            k::pool2d_args r = a;
            r.y = want.data();
            for (int64_t plane = 0; plane < a.n * a.c; ++plane)
                for (int64_t oy = 0; oy < a.h_out; ++oy)
                    for (int64_t ox = 0; ox < a.w_out; ++ox) k::pool_output(r, plane, 0, oy, ox);
            ASSERT_TRUE(k::pool2d_is_separable(a));
            if (op == k::pool_op::max)
                EXPECT_EQ(y, want) << pc.h << "x" << pc.w << " k" << pc.k << " s" << pc.s;
            else
                expect_close(y, want, 1e-5f);
        }
}

TEST(gemm, transposes_bias_kinds_and_batches) {
    for (bool openblas : {false, true})
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (auto bk : {k::bias_kind::none, k::bias_kind::scalar, k::bias_kind::per_col,
                            k::bias_kind::per_row, k::bias_kind::full})
            // Tiles of 4 rows leave a block of one row (the dot-product path with B transposed);
            // K = 53 in chunks of 40 gives whole vectors and tails.
            for (const auto& [K, tile_m, tile_k] : {std::tuple<int64_t, int32_t, int32_t>{19, 5, 6}, {53, 4, 40}}) {
                const int64_t B = 2, M = 13, N = 21;
                auto a = random_vector(size_t(B * M * K), 4), b = random_vector(size_t(B * K * N), 5);
                auto bias = random_vector(size_t(B * M * N), 6);
                std::vector<float> c(size_t(B * M * N), NAN);
                k::gemm_args g{};
                g.a = a.data(); g.b = b.data(); g.bias = bias.data(); g.c = c.data();
                g.batch = B; g.m = M; g.n = N; g.k = K;
                g.lda = ta ? M : K; g.ldb = tb ? K : N; g.ldc = N; g.ldbias = N;
                g.stride_a = M * K; g.stride_b = K * N; g.stride_c = M * N;
                g.stride_bias = bk == k::bias_kind::full ? M * N : 0;
                g.trans_a = ta; g.trans_b = tb; g.bias_mode = bk; g.alpha = 0.5f; g.beta = 2.0f;
                g.tile_m = tile_m; g.tile_n = 8; g.tile_k = tile_k;
                SCOPED_TRACE(openblas ? "OpenBLAS" : "oneDNN");
                SCOPED_TRACE("K " + std::to_string(K) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
                const library_choice choice(openblas);
                ASSERT_TRUE(run_blocks(k::gemm_kernel, &g, k::gemm_grid(g)));
                std::vector<float> want(c.size());
                for (int64_t bt = 0; bt < B; ++bt)
                    for (int64_t i = 0; i < M; ++i)
                        for (int64_t j = 0; j < N; ++j) {
                            double s = 0;
                            for (int64_t q = 0; q < K; ++q) {
                                const float av = a[size_t(bt * M * K + (ta ? q * M + i : i * K + q))];
                                const float bv = b[size_t(bt * K * N + (tb ? j * K + q : q * N + j))];
                                s += double(av) * bv;
                            }
                            s *= 0.5;
                            const float* bb = bias.data() + (bk == k::bias_kind::full ? bt * M * N : 0);
                            switch (bk) {
                            case k::bias_kind::none: break;
                            case k::bias_kind::scalar: s += 2.0 * bb[0]; break;
                            case k::bias_kind::per_col: s += 2.0 * bb[j]; break;
                            case k::bias_kind::per_row: s += 2.0 * bb[i]; break;
                            case k::bias_kind::full: s += 2.0 * bb[i * N + j]; break;
                            }
                            want[size_t(bt * M * N + i * N + j)] = float(s);
                        }
                expect_close(c, want);
            }
}

TEST(gemm, block_slices_compose) {
    const int64_t M = 40, N = 40, K = 30;
    auto a = random_vector(size_t(M * K), 7), b = random_vector(size_t(K * N), 8);
    std::vector<float> whole(size_t(M * N)), sliced(size_t(M * N));
    k::gemm_args g{};
    g.a = a.data(); g.b = b.data(); g.batch = 1; g.m = M; g.n = N; g.k = K;
    g.lda = K; g.ldb = N; g.ldc = N; g.alpha = 1; g.tile_m = 8; g.tile_n = 8; g.tile_k = K;
    g.c = whole.data();
    const int64_t grid = k::gemm_grid(g);
    run_blocks(k::gemm_kernel, &g, grid);
    g.c = sliced.data();
    run_blocks(k::gemm_kernel, &g, grid, 0, 7);          // an RT kernel's share ...
    run_blocks(k::gemm_kernel, &g, grid, 7, grid - 7);   // ... and the rest, later
    EXPECT_EQ(whole, sliced);  // bit-identical: the same blocks compute the same tiles
}

// The two libraries agree on shapes of the size models have (K = 1152 in 2 chunks, 196
// pixels), and oneDNN, on a compute unit's thread, starts no threads of its own: its OpenMP
// team would otherwise take every core from every unit.
TEST(gemm, onednn_agrees_with_openblas_and_stays_on_its_thread) {
    const int64_t M = 128, N = 196, K = 1152;
    auto a = random_vector(size_t(M * K), 21), b = random_vector(size_t(K * N), 22);
    std::vector<float> c_dnnl(size_t(M * N)), c_blas(size_t(M * N));
    k::gemm_args g{};
    g.a = a.data(); g.b = b.data(); g.batch = 1; g.m = M; g.n = N; g.k = K;
    g.lda = K; g.ldb = N; g.ldc = N; g.alpha = 1; g.tile_m = 64; g.tile_n = 196; g.tile_k = 576;
    const auto threads = [] {
        size_t n = 0;
        for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
        return n;
    };
    size_t before = 0, during = 0;
    std::thread unit([&] {
        before = threads();
        g.c = c_dnnl.data();
        run_blocks(k::gemm_kernel, &g, k::gemm_grid(g));
        during = threads();
    });
    unit.join();
    EXPECT_EQ(during, before) << "threads started by " << k::cpu_gemm_library();
    {
        const library_choice choice(true);
        g.c = c_blas.data();
        run_blocks(k::gemm_kernel, &g, k::gemm_grid(g));
    }
    expect_close(c_dnnl, c_blas, 1e-4f);
    // Column counts of 16j + 1 (oneDNN's path splits off the last column), each transpose of
    // B, accumulating over K chunks (beta 1 after the first).
    for (int64_t n : {17, 49, 289}) {
        for (bool trans_b : {false, true}) {
            const int64_t m = 40, kk = 300, chunk = 128;
            auto aa = random_vector(size_t(m * kk), 23), bb = random_vector(size_t(kk * n), 24);
            std::vector<float> got(size_t(m * n)), want(size_t(m * n));
            for (int64_t k0 = 0; k0 < kk; k0 += chunk) {
                const int64_t kc = std::min(chunk, kk - k0);
                const float* bp = trans_b ? bb.data() + k0 : bb.data() + k0 * n;
                const int64_t ldb = trans_b ? kk : n;
                k::sgemm(false, trans_b, m, n, kc, 1.0f, aa.data() + k0, kk, bp, ldb, k0 ? 1.0f : 0.0f, got.data(), n);
            }
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double acc = 0;
                    for (int64_t q = 0; q < kk; ++q)
                        acc += double(aa[size_t(i * kk + q)]) * bb[size_t(trans_b ? j * kk + q : q * n + j)];
                    want[size_t(i * n + j)] = float(acc);
                }
            expect_close(got, want, 1e-4f);
        }
    }
}

TEST(kernels, stop_at_check_points_and_restart_identically) {
    auto x = random_vector(1 * 16 * 32 * 32, 9), w = random_vector(32 * 16 * 9, 10);
    std::vector<float> y1(32 * 32 * 32), y2(32 * 32 * 32, 12345.f);
    k::conv2d_args a{};
    a.x = x.data(); a.w = w.data(); a.n = 1; a.c_in = 16; a.h = 32; a.w_in = 32; a.c_out = 32;
    a.kh = 3; a.kw = 3; a.stride_h = a.stride_w = 1; a.pad_top = a.pad_left = 1;
    a.dil_h = a.dil_w = 1; a.groups = 1; a.h_out = 32; a.w_out = 32;
    a.tile_co = 16; a.tile_pix = 256; a.tile_k = 16;
    a.y = y1.data();
    run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, nullptr, k::conv2d_scratch_bytes(a));
    gpu::task_words task{};
    task.preempt = 1;
    a.y = y2.data();
    EXPECT_FALSE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, &task, k::conv2d_scratch_bytes(a)));
    task.preempt = 0;  // restore: re-run the killed kernel from its start
    EXPECT_TRUE(run_blocks(k::conv2d_kernel, &a, k::conv2d_grid(a), 0, -1, &task, k::conv2d_scratch_bytes(a)));
    EXPECT_EQ(y1, y2);
}

TEST(gather, fragments_to_normalised_nchw) {
    for (const uint32_t frag : {13u, 1u, 2u, 5u}) {
        SCOPED_TRACE(std::to_string(frag) + "-byte fragments");
        const int64_t B = 3, H = 7, W = 5, C = 3, bytes = H * W * C;
        std::vector<std::vector<uint8_t>> images(B);
        std::vector<k::gather_segment> segs;
        std::vector<uint32_t> first{0};
        std::mt19937 rng(11);
        for (int64_t i = 0; i < B; ++i) {
            images[size_t(i)].resize(size_t(bytes));
            for (auto& v : images[size_t(i)]) v = uint8_t(rng());
            // Uneven fragments, as packets arrive: frag, frag, ..., rest.
            for (uint32_t off = 0; off < bytes; off += frag)
                segs.push_back({images[size_t(i)].data() + off, uint32_t(std::min<int64_t>(frag, bytes - off)), off});
            first.push_back(uint32_t(segs.size()));
        }
        std::vector<float> y(size_t(B * C * H * W), NAN);
        k::gather_args g{};
        g.segments = segs.data(); g.first = first.data(); g.y = y.data();
        g.batch = B; g.h = H; g.w = W; g.c = C; g.bytes_per_block = 12;
        const float mean[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
        for (int i = 0; i < 3; ++i) { g.mean[i] = mean[i]; g.inv_std[i] = 1.0f / sd[i]; }
        ASSERT_TRUE(run_blocks(k::gather_kernel, &g, k::gather_grid(g)));
        for (int64_t i = 0; i < B; ++i)
            for (int64_t p = 0; p < H * W; ++p)
                for (int64_t ch = 0; ch < C; ++ch)
                    ASSERT_FLOAT_EQ(y[size_t((i * C + ch) * H * W + p)],
                                    (float(images[size_t(i)][size_t(p * C + ch)]) - mean[ch]) / sd[ch] )
                        << i << " " << p << " " << ch;
    }
}


// The image gather's block descriptors (GPU blocks read them; the cpu's run the same
// decomposition without): a block's segments cut to its range, in order, tiling it; past
// gather_block_slices segments, their range in the list. Empty segments are left out.
TEST(gather, block_descriptors) {
    const int64_t B = 2, H = 7, W = 5, C = 3, bytes = H * W * C;
    std::vector<uint8_t> pixels(size_t(B * bytes));
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i);
    for (const uint32_t frag : {13u, 1u, 40u, 105u}) {
        std::vector<k::gather_segment> segs;
        std::vector<uint32_t> first{0};
        for (int64_t i = 0; i < B; ++i) {
            const uint8_t* image = pixels.data() + i * bytes;
            for (uint32_t off = 0; off < bytes; off += frag) {
                segs.push_back({image + off, uint32_t(std::min<int64_t>(frag, bytes - off)), off});
                if (off == 26) segs.push_back({image + off, 0, off});  // an empty one, as a zero-length fragment
            }
            first.push_back(uint32_t(segs.size()));
        }
        for (const int64_t per_block : {int64_t(12), int64_t(30), int64_t(105)}) {
            k::gather_args g{};
            g.batch = B; g.h = H; g.w = W; g.c = C; g.bytes_per_block = per_block;
            std::vector<k::gather_block_desc> blocks(size_t(k::gather_grid(g)));
            k::gather_describe_blocks(g, segs.data(), first.data(), blocks.data());
            const int64_t per_image = k::gather_blocks_per_image(g);
            for (int64_t b = 0; b < k::gather_grid(g); ++b) {
                const k::gather_block_desc& d = blocks[size_t(b)];
                const int64_t image = b / per_image, q0 = (b % per_image) * per_block;
                const int64_t q1 = std::min(bytes, q0 + per_block);
                const std::string what = std::to_string(frag) + "-byte fragments, " + std::to_string(per_block) +
                                         " bytes per block, block " + std::to_string(b);
                uint32_t want = 0, lo = ~0u, hi = 0;
                for (uint32_t s = first[size_t(image)]; s < first[size_t(image) + 1]; ++s)
                    if (segs[s].length > 0 && segs[s].offset < q1 && segs[s].offset + segs[s].length > q0) {
                        ++want;
                        lo = std::min(lo, s);
                        hi = s + 1;
                    }
                ASSERT_EQ(d.count, want) << what;
                ASSERT_LE(d.segment_begin, lo) << what;
                ASSERT_GE(d.segment_end, hi) << what;
                for (uint32_t s = d.segment_begin; s < d.segment_end; ++s)  // nothing else with bytes in the range
                    ASSERT_TRUE(segs[s].length == 0 || (segs[s].offset < q1 && segs[s].offset + segs[s].length > q0))
                        << what;
                if (d.count > k::gather_block_slices) continue;
                int64_t at = q0;
                for (uint32_t j = 0; j < d.count; ++j) {
                    const k::gather_segment& sl = d.slices[j];
                    ASSERT_EQ(int64_t(sl.offset), at) << what << " slice " << j;
                    ASSERT_GT(sl.length, 0u) << what << " slice " << j;
                    ASSERT_EQ(sl.data, pixels.data() + image * bytes + sl.offset) << what << " slice " << j;
                    at += sl.length;
                }
                ASSERT_EQ(at, q1) << what;
            }
        }
    }
}

// Requests cut into fragments of `frag` bytes (not a multiple of 4: elements straddle packets).
void fragment(const std::vector<std::vector<uint8_t>>& payloads, uint32_t frag, std::vector<k::gather_segment>& segs,
              std::vector<uint32_t>& first) {
    first.assign(1, 0);
    for (const auto& p : payloads) {
        for (uint32_t off = 0; off < p.size(); off += frag)
            segs.push_back({p.data() + off, uint32_t(std::min<size_t>(frag, p.size() - off)), off});
        first.push_back(uint32_t(segs.size()));
    }
}

std::vector<uint8_t> le32_bytes(const std::vector<int32_t>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i)
        for (int k = 0; k < 4; ++k) b[i * 4 + size_t(k)] = uint8_t(uint32_t(v[i]) >> (8 * k));
    return b;
}

TEST(token_gather, ids_mask_types_padded_and_bad_tokens_reported) {
    // Three requests of 5, 11 and 1 tokens at length 12, 4 positions per block; request 1 has
    // out-of-vocabulary tokens at positions 6 (-3) and 9 (100), in its second and third block.
    const int64_t L = 12, V = 50;
    const std::vector<std::vector<int32_t>> tokens = {{1, 2, 3, 4, 49}, {0, 7, 7, 7, 7, 7, -3, 8, 8, 100, 9}, {42}};
    std::vector<std::vector<uint8_t>> payloads;
    for (const auto& t : tokens) payloads.push_back(le32_bytes(t));
    std::vector<k::gather_segment> segs;
    std::vector<uint32_t> first;
    fragment(payloads, 7, segs, first);
    for (const k::elem et : {k::elem::i64, k::elem::i32}) {
        std::vector<int64_t> ids64(size_t(3 * L), -1), mask64(size_t(3 * L), -1);
        std::vector<int32_t> ids32(size_t(3 * L), -1), types32(size_t(3 * L), -1);
        std::vector<float> maskf(size_t(3 * L), NAN);
        k::token_gather_args a{};
        a.segments = segs.data(); a.first = first.data();
        a.batch = 3; a.length = L; a.vocab = V; a.tokens_per_block = 4;
        std::vector<k::token_error> errors(size_t(k::token_gather_grid(a)), k::token_error{-2, -2});
        a.errors = errors.data();
        a.ids_type = et;
        a.ids = et == k::elem::i64 ? static_cast<void*>(ids64.data()) : static_cast<void*>(ids32.data());
        a.mask = et == k::elem::i64 ? static_cast<void*>(mask64.data()) : static_cast<void*>(maskf.data());
        a.mask_type = et == k::elem::i64 ? k::elem::i64 : k::elem::f32;
        a.types = types32.data(); a.types_type = k::elem::i32;
        ASSERT_EQ(k::token_gather_grid(a), 9);
        ASSERT_TRUE(run_blocks(k::token_gather_kernel, &a, k::token_gather_grid(a)));
        for (int64_t r = 0; r < 3; ++r)
            for (int64_t i = 0; i < L; ++i) {
                const size_t at = size_t(r * L + i);
                const bool in = i < int64_t(tokens[size_t(r)].size());
                const int32_t t = in ? tokens[size_t(r)][size_t(i)] : 0;
                const int64_t want = t >= 0 && t < V ? t : 0;  // a bad token is never an index
                EXPECT_EQ(et == k::elem::i64 ? ids64[at] : int64_t(ids32[at]), want) << r << "," << i;
                EXPECT_EQ(et == k::elem::i64 ? float(mask64[at]) : maskf[at], in ? 1.0f : 0.0f) << r << "," << i;
                EXPECT_EQ(types32[at], 0);
            }
        // Every block writes its slot: the first bad token in its range, or position -1.
        for (size_t b = 0; b < errors.size(); ++b) {
            const int32_t want_pos = b == 4 ? 6 : b == 5 ? 9 : -1;
            EXPECT_EQ(errors[b].position, want_pos) << "block " << b;
            if (want_pos >= 0) {
                EXPECT_EQ(errors[b].token, b == 4 ? -3 : 100);
            }
        }
    }
}

TEST(tensor_gather, f32_little_endian_across_fragments) {
    const int64_t B = 2, E = 37;
    std::vector<std::vector<uint8_t>> payloads(B);
    std::vector<float> want;
    std::mt19937 rng(5);
    std::normal_distribution<float> n;
    for (auto& p : payloads)
        for (int64_t e = 0; e < E; ++e) {
            const float v = n(rng);
            want.push_back(v);
            uint32_t bits;
            std::memcpy(&bits, &v, 4);
            for (int k = 0; k < 4; ++k) p.push_back(uint8_t(bits >> (8 * k)));
        }
    std::vector<k::gather_segment> segs;
    std::vector<uint32_t> first;
    fragment(payloads, 9, segs, first);
    std::vector<float> y(size_t(B * E), NAN);
    k::tensor_gather_args a{};
    a.segments = segs.data(); a.first = first.data(); a.y = y.data();
    a.batch = B; a.elements = E; a.elements_per_block = 8;
    ASSERT_TRUE(run_blocks(k::tensor_gather_kernel, &a, k::tensor_gather_grid(a)));
    EXPECT_EQ(y, want);
}

k::nd_shape shape_of(std::initializer_list<int64_t> d) {
    k::nd_shape s{};
    s.rank = int32_t(d.size());
    int i = 0;
    for (auto v : d) s.dims[i++] = v;
    return s;
}

TEST(copy, transpose_and_negative_step_slice) {
    // x [2,3,4] -> transpose(2,0,1) -> y [4,2,3]
    std::vector<float> x(24);
    for (int i = 0; i < 24; ++i) x[size_t(i)] = float(i);
    std::vector<float> y(24, -1);
    k::copy_args a{};
    a.x = x.data(); a.y = y.data(); a.element_bytes = 4; a.per_block = 5;
    a.shape = shape_of({4, 2, 3});
    const int64_t xs[3] = {1, 12, 4}, ys[3] = {6, 3, 1};
    std::copy(xs, xs + 3, a.x_strides);
    std::copy(ys, ys + 3, a.y_strides);
    ASSERT_TRUE(run_blocks(k::copy_kernel, &a, k::copy_grid(a)));
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j)
            for (int l = 0; l < 3; ++l) EXPECT_EQ(y[size_t(i * 6 + j * 3 + l)], x[size_t(j * 12 + l * 4 + i)]);
    // Slice x[:, ::-1, 1:4:2] -> [2,3,2]
    std::vector<float> z(12, -1);
    a.y = z.data();
    a.shape = shape_of({2, 3, 2});
    a.x_offset = 2 * 4 + 1;
    const int64_t xs2[3] = {12, -4, 2}, ys2[3] = {6, 2, 1};
    std::copy(xs2, xs2 + 3, a.x_strides);
    std::copy(ys2, ys2 + 3, a.y_strides);
    ASSERT_TRUE(run_blocks(k::copy_kernel, &a, k::copy_grid(a)));
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int l = 0; l < 2; ++l)
                EXPECT_EQ(z[size_t(i * 6 + j * 2 + l)], x[size_t(i * 12 + (2 - j) * 4 + 1 + 2 * l)]);
}

TEST(binary, broadcast_with_relu) {
    // a [2,3,4] + b [3,1] -> [2,3,4]
    auto a = random_vector(24, 12), b = random_vector(3, 13);
    std::vector<float> y(24);
    k::binary_args g{};
    g.a = a.data(); g.b = b.data(); g.y = y.data(); g.shape = shape_of({2, 3, 4});
    const int64_t as[3] = {12, 4, 1}, bs[3] = {0, 1, 0};
    std::copy(as, as + 3, g.a_strides);
    std::copy(bs, bs + 3, g.b_strides);
    g.op = k::binary_op::add; g.ep.act = k::activation::relu; g.per_block = 7;
    ASSERT_TRUE(run_blocks(k::binary_kernel, &g, k::binary_grid(g)));
    for (int i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(y[size_t(i)], std::max(0.0f, a[size_t(i)] + b[size_t((i / 4) % 3)]));
}

TEST(row, softmax_layernorm_reduce) {
    auto x = random_vector(2 * 5 * 3, 14);
    std::vector<float> y(x.size());
    k::row_args r{};
    r.x = x.data(); r.y = y.data(); r.outer = 2; r.axis = 5; r.inner = 3; r.rows_per_block = 2;
    r.op = k::row_op::softmax;
    ASSERT_TRUE(run_blocks(k::row_kernel, &r, k::row_grid(r)));
    for (int o = 0; o < 2; ++o)
        for (int in = 0; in < 3; ++in) {
            double s = 0;
            for (int i = 0; i < 5; ++i) s += std::exp(x[size_t(o * 15 + i * 3 + in)]);
            for (int i = 0; i < 5; ++i)
                EXPECT_NEAR(y[size_t(o * 15 + i * 3 + in)], std::exp(x[size_t(o * 15 + i * 3 + in)]) / s, 1e-6);
        }
    std::vector<float> scale(15, 2.0f), bias(15, 0.5f);
    r.op = k::row_op::layer_norm; r.scale = scale.data(); r.bias = bias.data(); r.epsilon = 1e-5f;
    r.rows_per_block = 1;
    ASSERT_TRUE(run_blocks(k::row_kernel, &r, k::row_grid(r)));
    for (int o = 0; o < 2; ++o) {
        double m = 0, v = 0;
        for (int i = 0; i < 15; ++i) m += x[size_t(o * 15 + i)];
        m /= 15;
        for (int i = 0; i < 15; ++i) v += (x[size_t(o * 15 + i)] - m) * (x[size_t(o * 15 + i)] - m);
        v /= 15;
        for (int i = 0; i < 15; ++i)
            EXPECT_NEAR(y[size_t(o * 15 + i)], (x[size_t(o * 15 + i)] - m) / std::sqrt(v + 1e-5) * 2 + 0.5, 1e-5);
    }
    std::vector<float> mean(6);
    r.op = k::row_op::reduce_mean; r.y = mean.data(); r.rows_per_block = 4;
    ASSERT_TRUE(run_blocks(k::row_kernel, &r, k::row_grid(r)));
    for (int o = 0; o < 2; ++o)
        for (int in = 0; in < 3; ++in) {
            double s = 0;
            for (int i = 0; i < 5; ++i) s += x[size_t(o * 15 + i * 3 + in)];
            EXPECT_NEAR(mean[size_t(o * 3 + in)], s / 5, 1e-6);
        }
}

// Means and sums of contiguous rows (a global average pool's: inner 1), several rows at a
// time: each row's double sum (in order, or in AVX-512 lanes, exact for such values), for row
// counts and blocks that leave remainders, and rows of 16 floats a step, 8, and the last few
// (or too short for the lanes).
TEST(row, contiguous_means_and_sums_row_by_row) {
    const int64_t rows = 27;
    for (const int64_t axis : {int64_t(49), int64_t(64), int64_t(63), int64_t(20), int64_t(9)}) {
        auto x = random_vector(size_t(rows * axis), 41);
        for (const auto op : {k::row_op::reduce_mean, k::row_op::reduce_sum})
            for (const int64_t per_block : {int64_t(5), int64_t(8), int64_t(27)}) {
                std::vector<float> y(size_t(rows), NAN);
                k::row_args r{};
                r.x = x.data(); r.y = y.data(); r.op = op;
                r.outer = rows; r.axis = axis; r.inner = 1; r.rows_per_block = per_block;
                ASSERT_TRUE(run_blocks(k::row_kernel, &r, k::row_grid(r)));
                for (int64_t o = 0; o < rows; ++o) {
                    double sum = 0;
                    for (int64_t i = 0; i < axis; ++i) sum += x[size_t(o * axis + i)];
                    const float want = float(op == k::row_op::reduce_mean ? sum / double(axis) : sum);
                    ASSERT_EQ(y[size_t(o)], want) << "row " << o << ", " << per_block << " rows a block, " << axis << " a row";
                }
            }
    }
}

TEST(pool2d, max_and_average_with_padding_and_ceil) {
    // 1x1x5x5, kernel 3, stride 2, pads 1 (top/left), output 3x3 (ceil mode adds nothing here).
    std::vector<float> x(25);
    for (int i = 0; i < 25; ++i) x[size_t(i)] = float(i);
    std::vector<float> y(9);
    k::pool2d_args a{};
    a.x = x.data(); a.y = y.data(); a.n = 1; a.c = 1; a.h = 5; a.w = 5; a.h_out = 3; a.w_out = 3;
    a.kh = a.kw = 3; a.stride_h = a.stride_w = 2; a.pad_top = a.pad_left = 1;
    a.pad_bottom = a.pad_right = 1; a.dil_h = a.dil_w = 1; a.planes_per_block = 1;
    a.op = k::pool_op::max;
    ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a)));
    EXPECT_EQ(y, (std::vector<float>{6, 8, 9, 16, 18, 19, 21, 23, 24}));
    a.op = k::pool_op::average; a.count_include_pad = false;
    ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a)));
    EXPECT_FLOAT_EQ(y[0], (0 + 1 + 5 + 6) / 4.0f);
    EXPECT_FLOAT_EQ(y[4], (6 + 7 + 8 + 11 + 12 + 13 + 16 + 17 + 18) / 9.0f);
    a.count_include_pad = true;
    ASSERT_TRUE(run_blocks(k::pool2d_kernel, &a, k::pool2d_grid(a)));
    EXPECT_FLOAT_EQ(y[0], (0 + 1 + 5 + 6) / 9.0f);
}

TEST(lrn, matches_definition) {
    auto x = random_vector(1 * 7 * 4, 15);
    std::vector<float> y(x.size());
    k::lrn_args a{};
    a.x = x.data(); a.y = y.data(); a.n = 1; a.c = 7; a.hw = 4; a.size = 4;
    a.alpha = 1e-2f; a.beta = 0.75f; a.bias = 1.0f; a.planes_per_block = 3;
    ASSERT_TRUE(run_blocks(k::lrn_kernel, &a, k::lrn_grid(a)));
    for (int c = 0; c < 7; ++c)
        for (int i = 0; i < 4; ++i) {
            double sq = 0;
            for (int q = std::max(0, c - 1); q <= std::min(6, c + 2); ++q) sq += x[size_t(q * 4 + i)] * x[size_t(q * 4 + i)];
            EXPECT_NEAR(y[size_t(c * 4 + i)], x[size_t(c * 4 + i)] / std::pow(1.0 + 1e-2 / 4 * sq, 0.75), 1e-6);
        }
}

TEST(gather_axis, embedding_rows_and_negative_indices) {
    auto table = random_vector(10 * 4, 16);
    const int64_t idx[3] = {3, -1, 0};
    std::vector<float> y(12);
    k::gather_axis_args a{};
    a.x = table.data(); a.indices = idx; a.y = y.data(); a.outer = 1; a.axis = 10; a.inner = 4;
    a.count = 3; a.element_bytes = 4; a.rows_per_block = 2;
    ASSERT_TRUE(run_blocks(k::gather_axis_kernel, &a, k::gather_axis_grid(a)));
    for (int j = 0; j < 4; ++j) {
        EXPECT_EQ(y[size_t(j)], table[size_t(3 * 4 + j)]);
        EXPECT_EQ(y[size_t(4 + j)], table[size_t(9 * 4 + j)]);
        EXPECT_EQ(y[size_t(8 + j)], table[size_t(j)]);
    }
}

TEST(gather_axis, int32_indices_and_out_of_range_rows_are_zero) {
    std::vector<float> table(10 * 4);
    for (size_t i = 0; i < table.size(); ++i) table[i] = float(i);
    const int32_t idx[4] = {3, -1, 10, -11};  // 10 and -11 are out of range: zeros, no wild read
    std::vector<float> y(16, NAN);
    k::gather_axis_args a{};
    a.x = table.data(); a.indices = idx; a.index_bytes = 4; a.y = y.data();
    a.outer = 1; a.axis = 10; a.inner = 4; a.count = 4; a.element_bytes = 4; a.rows_per_block = 1;
    ASSERT_TRUE(run_blocks(k::gather_axis_kernel, &a, k::gather_axis_grid(a)));
    for (int c = 0; c < 4; ++c) {
        EXPECT_EQ(y[size_t(c)], float(3 * 4 + c));
        EXPECT_EQ(y[size_t(4 + c)], float(9 * 4 + c));
        EXPECT_EQ(y[size_t(8 + c)], 0.0f);
        EXPECT_EQ(y[size_t(12 + c)], 0.0f);
    }
}

}  // namespace
