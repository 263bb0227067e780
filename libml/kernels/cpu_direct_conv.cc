// Direct convolution for the cpu blocks: a tile's output rows summed straight from the input's
// zero-padded planes (plane_phases), without im2col. im2col writes every input value kh * kw
// times and the GEMM packs the copy again, which costs as much as the sums where a layer has
// few output channels (DenseNet's 3x3 layers: 32) or small planes (14x14, 7x7): there those
// layers ran at 18-77 GMAC/s against the sgemm's 105. Here the padded planes are built once per
// block (the input rows it reads, split by stride into phases), and a register tile of 8 output
// channels x 48 outputs takes, per input channel and tap, three loads of shifted input and 24
// fused multiply-adds; outputs are summed over whole padded rows (wp wide) and the tile's
// pixels copied out. AVX-512 only (conv2d_direct_possible); elsewhere im2col and the GEMM.
#include "libml/kernels/cpu_direct_conv.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/cpu_winograd.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

// Output rows a tile of at most tile_pix pixels can touch (it may start mid-row).
int64_t direct_rows_max(const conv2d_args& c) {
    return std::min<int64_t>(c.h_out, (int64_t(c.tile_pix) + c.w_out - 1) / c.w_out + 1);
}

// Input channels summed between two loads of the accumulators: their planes' rows for one
// register tile stay in L1 while the taps go over them.
constexpr int64_t channels_per_pass = 16;

std::atomic<conv_method> method_in_use{conv_method::automatic};

#if defined(__x86_64__) && defined(__GNUC__)
// out[m][n] (+)= sum over k < kk, in order, of w[m * ldw + k] * x[off[k] + n], for m < MR and
// n < n_left (at most 16 * NV): k runs over a pass's input channels and, within each, the taps
// (the weights' own order), one loop however few taps a window has. Accumulators start from out when `accumulate`, else from 0. (Packing a pass's
// weights so that the broadcasts come from one run was measured no faster on DenseNet's
// 56x56 layers and slower on its 7x7 ones, where the packing costs as much as the sums.)
template <int MR, int NV, bool masked>
__attribute__((target("avx512f"), always_inline)) inline void direct_tile(const float* x, const int32_t* off,
                                                                         int64_t kk, const float* w, int64_t ldw,
                                                                         float* out, int64_t ldo, int64_t n_left,
                                                                         bool accumulate, const direct_finish* fin,
                                                                         int64_t m0) {
    __mmask16 mask[NV];
    for (int v = 0; v < NV; ++v) mask[v] = first_lanes(n_left - 16 * v);
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            acc[m][v] = !accumulate ? _mm512_setzero_ps()
                        : masked   ? _mm512_maskz_loadu_ps(mask[v], out + m * ldo + 16 * v)
                                   : _mm512_loadu_ps(out + m * ldo + 16 * v);
    for (int64_t k = 0; k < kk; ++k) {
        const float* s = x + off[k];
        __m512 xv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            xv[v] = masked ? _mm512_maskz_loadu_ps(mask[v], s + 16 * v) : _mm512_loadu_ps(s + 16 * v);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
            const __m512 wb = _mm512_set1_ps(w[m * ldw + k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(wb, xv[v], acc[m][v]);
        }
    }
    if (fin) {
        const __m512 lo = _mm512_set1_ps(fin->lo), hi = _mm512_set1_ps(fin->hi);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
            const float b = fin->bias ? fin->bias[m0 + m] : 0.0f;
            const __m512 vb = _mm512_set1_ps(b);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v)
                acc[m][v] = bias_activation(acc[m][v], vb, b != 0.0f ? __mmask16(0xffff) : __mmask16(0), lo, hi,
                                            fin->relu, fin->clip);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            if (masked) _mm512_mask_storeu_ps(out + m * ldo + 16 * v, mask[v], acc[m][v]);
            else _mm512_storeu_ps(out + m * ldo + 16 * v, acc[m][v]);
        }
}

// MR output channels' rows: runs of 48 outputs, the last one narrower and masked.
template <int MR>
__attribute__((target("avx512f"), always_inline)) inline void direct_rows(const float* x, const int32_t* off,
                                                                         int64_t kk, const float* w, int64_t ldw,
                                                                         float* out, int64_t ldo, int64_t n,
                                                                         bool accumulate, const direct_finish* fin,
                                                                         int64_t m0) {
    int64_t j = 0;
    for (; j + 48 <= n; j += 48)
        direct_tile<MR, 3, false>(x + j, off, kk, w, ldw, out + j, ldo, n - j, accumulate, fin, m0);
    const int64_t left = n - j;
    if (left > 32) direct_tile<MR, 3, true>(x + j, off, kk, w, ldw, out + j, ldo, left, accumulate, fin, m0);
    else if (left > 16) direct_tile<MR, 2, true>(x + j, off, kk, w, ldw, out + j, ldo, left, accumulate, fin, m0);
    else if (left > 0) direct_tile<MR, 1, true>(x + j, off, kk, w, ldw, out + j, ldo, left, accumulate, fin, m0);
}

// MR output channels over a K chunk's nci input channels, in passes of `pass` channels (off
// holds a pass's reads); the last pass applies fin (the K chunk's caller passes it for the
// last chunk only).
template <int MR>
__attribute__((target("avx512f"), always_inline)) inline void direct_slice(const float* x, int64_t chan,
                                                                          const int32_t* off, int64_t taps,
                                                                          int64_t nci, int64_t pass, const float* w,
                                                                          int64_t ldw, float* out, int64_t ldo,
                                                                          int64_t n, bool accumulate,
                                                                          const direct_finish* fin, int64_t m0) {
    for (int64_t p = 0; p < nci; p += pass)
        direct_rows<MR>(x + p * chan, off, std::min(pass, nci - p) * taps, w + p * taps, ldw, out, ldo, n,
                        accumulate || p > 0, p + pass >= nci ? fin : nullptr, m0);
}

// A K chunk over every output of a tile: 8 output channels at a time (8 x 3 vectors: 24
// accumulators, measured against 6 x 4, 4 x 6 and 12 x 2), the rest by 4, 2, 1. Output
// channels outermost: each slice reads its weights as 8 sequential runs, which the hardware
// prefetches (the layer's weights are rarely in cache: Inception's 8x8 layers have 1.7 MB),
// while the input planes, read once per slice, stay in L2.
__attribute__((target("avx512f"))) void direct_chunk(const float* x, int64_t chan, const int32_t* off, int64_t taps,
                                                     int64_t nci, int64_t pass, const float* w, int64_t ldw,
                                                     int64_t nco, float* out, int64_t ldo, int64_t n, bool accumulate,
                                                     const direct_finish* fin) {
    int64_t m = 0;
    for (; m + 8 <= nco; m += 8)
        direct_slice<8>(x, chan, off, taps, nci, pass, w + m * ldw, ldw, out + m * ldo, ldo, n, accumulate, fin, m);
    if (nco - m >= 4) {
        direct_slice<4>(x, chan, off, taps, nci, pass, w + m * ldw, ldw, out + m * ldo, ldo, n, accumulate, fin, m);
        m += 4;
    }
    if (nco - m >= 2) {
        direct_slice<2>(x, chan, off, taps, nci, pass, w + m * ldw, ldw, out + m * ldo, ldo, n, accumulate, fin, m);
        m += 2;
    }
    if (nco - m >= 1)
        direct_slice<1>(x, chan, off, taps, nci, pass, w + m * ldw, ldw, out + m * ldo, ldo, n, accumulate, fin, m);
}
#endif

}  // namespace

void use_conv_method(conv_method m) { method_in_use = m; }
conv_method conv_method_in_use() { return method_in_use.load(std::memory_order_relaxed); }
conv_method conv_method_named(std::string_view name) {
    return name == "direct"     ? conv_method::direct
           : name == "winograd" ? conv_method::winograd
           : name == "im2col"   ? conv_method::im2col
                                : conv_method::automatic;
}

bool conv2d_direct_possible(const conv2d_args& c) {
    if (!cpu_has_avx512() || c.kh * c.kw < 2 || c.h_out < 1 || c.w_out < 1) return false;
    if (conv2d_ci_per_group(c) == 1 && conv2d_co_per_group(c) == 1) return false;  // depthwise: window_sum_plane
    const plane_window g = conv2d_window(c);
    if (!plane_phases_fit(g) || c.kh * c.kw > max_direct_taps) return false;
    // A pass's offsets are int32.
    return double(channels_per_pass) * double(plane_phases_of(g, direct_rows_max(c)).plane_floats()) < 2e9;
}

bool conv2d_direct_chosen(const conv2d_args& c) {
    const conv_method m = conv_method_in_use();
    if (m == conv_method::im2col || !conv2d_direct_possible(c) || conv2d_winograd_chosen(c)) return false;
    if (m == conv_method::direct) return true;
    // Where it wins (layer by layer on ResNet-50, VGG-19, Inception-v3 and DenseNet-121, A/B
    // against im2col and oneDNN's sgemm): few output channels, small planes or large windows,
    // and not where the rows' padding wastes more than 15% of the sums (1x7 on 17x17: 26%).
    // On large planes with 64 or more output channels the sgemm is 4-10% faster, unless the
    // layer has 64 input channels or fewer (K <= 576 at 3x3): in tiles of whole rows,
    // ResNet-50's 56x56 64 -> 64 layers ran direct in 0.99 ms against 1.10 (in the model
    // 1.03-1.06 against 1.14-1.21), VGG-19's 224x224 64 -> 64 16.9 against 18.0, Inception-v3's
    // 147x147 32 -> 64 3.37 against 3.64; with 128 input channels and more the sgemm still
    // wins where the planes are large (alternated runs, batch 1: ResNet-50 0.984x, VGG-19
    // 0.989x, Inception-v3 within noise).
    // Planes of 64 outputs or fewer with 64 output channels or fewer take it whatever their
    // padding costs: im2col's GEMM is too small there (DenseNet-121's 7x7 3x3 128 -> 32
    // layers: 25 GMAC/s by im2col, 51 direct). With more channels the GEMM wins back (in the
    // model: ResNet-50's 7x7 x 512 and Inception-v3's 8x8 x 384 layers 5-20% slower direct).
    // At batch > 1 on planes small enough for the planner's blocks of several images, layers of
    // 256 output channels or more go to the GEMM, which reads their weights once for all the
    // block's images: ResNet-50's stride-2 14 -> 7 x 512 layer at batch 8 took 21.2-22.9 ms
    // direct and 15.4-15.5 so (in the model, one unit), Inception-v3's 17 -> 8 192 -> 320 6.3
    // and 5.7; with 192 channels (Inception-v3's 17 -> 8 192 -> 192) direct stayed ahead (3.6
    // against 3.9).
    if (c.n > 1 && c.h_out * c.w_out <= conv2d_images_max_pixels && conv2d_co_per_group(c) >= 256) return false;
    const int64_t wp = plane_phases_of(conv2d_window(c), c.h_out).wp;
    const bool wins = conv2d_co_per_group(c) <= 32 || c.h_out * c.w_out <= 35 * 35 || c.kh * c.kw >= 25 ||
                      conv2d_ci_per_group(c) <= 64;
    const bool small = c.h_out * c.w_out <= 64 && conv2d_co_per_group(c) <= 64;
    return wins && (double(c.w_out) >= 0.85 * double(wp) || small);
}

direct_finish direct_finish_of(const epilogue& ep, const float* bias) {
    return {bias, ep.act == activation::relu, ep.act == activation::clip, ep.alpha, ep.beta};
}

bool conv2d_direct_finishes(const conv2d_args& c) {
    return !c.residual && bias_activation_applies(c.ep);
}

size_t conv2d_direct_scratch_bytes(const conv2d_args& c) {
    const int64_t rows = direct_rows_max(c);
    const plane_phases f = plane_phases_of(conv2d_window(c), rows);
    const int64_t nco = std::min<int64_t>(c.tile_co, conv2d_co_per_group(c));
    return size_t(conv2d_ci_per_group(c) * f.plane_floats() + nco * rows * f.wp) * sizeof(float);
}

bool conv2d_direct(const conv2d_args& c, const conv2d_tile& t, const float* x, const float* w, const float* bias,
                   float* y, float* scratch, const gpu::block_context& ctx) {
#if defined(__x86_64__) && defined(__GNUC__)
    const plane_window g = conv2d_window(c);
    const int64_t oy0 = t.p0 / c.w_out, oy1 = (t.p1 + c.w_out - 1) / c.w_out, rows = oy1 - oy0;
    const plane_phases f = plane_phases_of(g, rows);
    const int64_t ci = conv2d_ci_per_group(c), nco = t.co1 - t.co0, K = conv2d_k(c), taps = c.kh * c.kw;
    const int64_t chan = f.plane_floats(), n = rows * f.wp, hw_out = c.h_out * c.w_out;
    float* wide = scratch + ci * chan;  // [nco][rows * wp]: the outputs, wp to a row
    int32_t off[channels_per_pass * max_direct_taps];  // a pass's reads, from its first channel
    for (int64_t ch = 0, k = 0; ch < channels_per_pass; ++ch)
        for (int64_t i = 0; i < c.kh; ++i)
            for (int64_t j = 0; j < c.kw; ++j) off[k++] = int32_t(ch * chan + f.tap_offset(i, j));
    for (int64_t ch = 0; ch < ci; ++ch) fill_plane_phases(g, f, oy0, x + ch * c.h * c.w_in, scratch + ch * chan);
    const bool finishes = conv2d_direct_finishes(c);
    const direct_finish fin = direct_finish_of(c, bias);
    // Check points between K chunks as in the GEMM path, each a whole number of channels, and
    // of whole passes where a chunk holds one: 1024 of K at 3x3 left chunks of 113 channels,
    // whose last pass of one channel loaded and stored the accumulators for nine taps.
    const int64_t chunk_channels = std::max<int64_t>(1, c.tile_k / taps);
    const int64_t chunk = chunk_channels >= channels_per_pass ? chunk_channels / channels_per_pass * channels_per_pass
                                                              : chunk_channels;
    for (int64_t c0 = 0; c0 < ci; c0 += chunk) {
        if (ctx.preempted()) return false;
        const int64_t c1 = std::min(ci, c0 + chunk);
        direct_chunk(scratch + c0 * chan, chan, off, taps, c1 - c0, channels_per_pass, w + c0 * taps, K, nco, wide, n,
                     n, c0 > 0, c1 == ci && finishes ? &fin : nullptr);
    }
    // The tile's pixels [p0, p1) out of the wide rows.
    for (int64_t m = 0; m < nco; ++m)
        for (int64_t oy = oy0; oy < oy1; ++oy) {
            const int64_t a = std::max(t.p0, oy * c.w_out), b = std::min(t.p1, (oy + 1) * c.w_out);
            std::memcpy(y + m * hw_out + (a - t.p0), wide + m * n + (oy - oy0) * f.wp + (a - oy * c.w_out),
                        size_t(b - a) * sizeof(float));
        }
    return true;
#else
    (void)c, (void)t, (void)x, (void)w, (void)y, (void)scratch, (void)ctx;
    return false;  // never called: conv2d_direct_possible is false without AVX-512
#endif
}

void pointwise_direct(const float* x, int64_t hw, int64_t nci, const float* w, int64_t ldw, int64_t nco, float* out,
                      const direct_finish& fin) {
#if defined(__x86_64__) && defined(__GNUC__)
    // One pass of every input channel (up to 256): with one tap per channel a register tile's
    // input is K x 48 floats, which L1 holds, and passes of 16 stored and reloaded the
    // accumulators K / 16 times.
    constexpr int64_t pass = 256;
    int32_t off[pass];  // a pass's channels, from its first: one plane each
    for (int64_t k = 0; k < std::min(nci, pass); ++k) off[k] = int32_t(k * hw);
    direct_chunk(x, hw, off, 1, nci, pass, w, ldw, nco, out, hw, hw, false, &fin);
#else
    (void)x, (void)hw, (void)nci, (void)w, (void)ldw, (void)nco, (void)out, (void)fin;
#endif
}

}  // namespace reefline::ml::kernels
