// CPU implementations of the GEMM and convolution blocks: each block hands its output tile
// to a single-threaded sgemm (oneDNN's, or OpenBLAS's: cpu_onednn.h) in K chunks, checking the
// preemption flag between chunks, then applies the fused epilogue (bias, residual,
// activation) to the tile.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_window3x3.h"
#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_onednn.h"
#include "libml/kernels/cpu_planes16.h"
#include "libml/kernels/cpu_pointwise_depthwise.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/cpu_winograd.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

// One-time: OpenBLAS must not spawn its own threads; parallelism is the device's blocks.
struct blas_single_threaded {
    blas_single_threaded() { openblas_set_num_threads(1); }
} const blas_init;

bool gemm_block_cpu(const void* p, const gpu::block_context& ctx) {
    const auto& g = *static_cast<const gemm_args*>(p);
    const gemm_tile t = gemm_block(g, ctx.block);
    const float* a = g.a + t.batch * g.stride_a;
    const float* b = g.b + t.batch * g.stride_b;
    float* c = g.c + t.batch * g.stride_c + t.m0 * g.ldc + t.n0;
    const int64_t mt = t.m1 - t.m0, nt = t.n1 - t.n0;
    for (int64_t k0 = 0; k0 < g.k; k0 += g.tile_k) {
        if (ctx.preempted()) return false;
        const int64_t kc = k0 + g.tile_k < g.k ? g.tile_k : g.k - k0;
        const float* ap = g.trans_a ? a + k0 * g.lda + t.m0 : a + t.m0 * g.lda + k0;
        const float* bp = g.trans_b ? b + t.n0 * g.ldb + k0 : b + k0 * g.ldb + t.n0;
        if (mt == 1 && !g.trans_a && g.trans_b && dot_rows(nt, kc, g.alpha, ap, bp, g.ldb, k0 != 0, c)) continue;
        sgemm(g.trans_a, g.trans_b, mt, nt, kc, g.alpha, ap, g.lda, bp, g.ldb, k0 == 0 ? 0.0f : 1.0f, c, g.ldc);
    }
    if (g.k == 0)
        for (int64_t i = 0; i < mt; ++i) std::memset(c + i * g.ldc, 0, size_t(nt) * sizeof(float));
    const float* bias = g.bias ? g.bias + t.batch * g.stride_bias : nullptr;
    if (g.bias_mode == bias_kind::none && g.ep.act == activation::none) return true;
    for (int64_t i = 0; i < mt; ++i) {
        const int64_t m = t.m0 + i;
        // The bias row this output row adds, and whether it is one value (stride 0) or a row.
        const float* b_row = nullptr;
        int64_t b_stride = 0;
        switch (g.bias_mode) {
        case bias_kind::none: break;
        case bias_kind::scalar: b_row = bias; break;
        case bias_kind::per_col: b_row = bias + t.n0; b_stride = 1; break;
        case bias_kind::per_row: b_row = bias + m; break;
        case bias_kind::full: b_row = bias + m * g.ldbias + t.n0; b_stride = 1; break;
        }
        bias_epilogue_row(c + i * g.ldc, nt, b_row, b_stride, g.beta, g.ep);
    }
    return true;
}

#if defined(__x86_64__) && defined(__GNUC__)
// One output row's span of a plane at most 16 outputs wide at stride 1: one masked load from
// the input row (lanes on padding load nothing and read as 0; row is null on a padding row)
// and one masked store, where the general path makes two memsets and a memcpy of a few floats
// per row (ResNet-50's 7x7 3x3 layers copy 4608 rows of 7 outputs per image). ResNet-50 at
// batch 8: 0.982x (min of 3 alternated runs), Inception-v3 at batch 1 0.987x (mean).
// `inside` has lane ox set where 0 <= ox + xoff < w_in.
__attribute__((target("avx512f"))) inline void im2col_row_narrow(float* o, const float* row, int64_t ox0,
                                                                 int64_t ox1, int64_t xoff, __mmask16 inside) {
    const __mmask16 store = first_lanes(ox1 - ox0);
    const __mmask16 load = row ? __mmask16((inside >> ox0) & store) : __mmask16(0);
    _mm512_mask_storeu_ps(o, store, _mm512_maskz_loadu_ps(load, load ? row + ox0 + xoff : row));
}
#endif

// The loop nest of im2col: channel, tap row, tap column, then each output row of [p0, p1);
// `narrow` copies each row by im2col_row_narrow (only where that holds: see im2col).
template <bool narrow>
[[gnu::always_inline]] inline void im2col_taps(const conv2d_args& c, const float* x, int64_t p0, int64_t p1,
                                               float* cols, int64_t ld) {
    const int64_t ci = conv2d_ci_per_group(c);
    for (int64_t ch = 0; ch < ci; ++ch) {
        const float* xc = x + ch * c.h * c.w_in;
        for (int64_t r = 0; r < c.kh; ++r) {
            for (int64_t s = 0; s < c.kw; ++s) {
                float* out = cols + ((ch * c.kh + r) * c.kw + s) * ld;
                const int64_t xoff = s * c.dil_w - c.pad_left;
                // Output columns ox with 0 <= ox*stride + xoff < w_in.
                const int64_t ox_lo = xoff >= 0 ? 0 : (-xoff + c.stride_w - 1) / c.stride_w;
                const int64_t ox_hi = c.w_in - xoff <= 0 ? 0
                                      : std::min<int64_t>(c.w_out, (c.w_in - xoff + c.stride_w - 1) / c.stride_w);
                for (int64_t q = p0; q < p1;) {
                    const int64_t oy = q / c.w_out, ox0 = q % c.w_out;
                    const int64_t ox1 = std::min<int64_t>(c.w_out, ox0 + (p1 - q));
                    float* o = out + (q - p0);
                    const int64_t iy = oy * c.stride_h - c.pad_top + r * c.dil_h;
                    const bool padding_row = iy < 0 || iy >= c.h;
                    const float* row = padding_row ? nullptr : xc + iy * c.w_in;
                    q += ox1 - ox0;
#if defined(__x86_64__) && defined(__GNUC__)
                    if constexpr (narrow) {
                        im2col_row_narrow(o, row, ox0, ox1, xoff,
                                          __mmask16(first_lanes(ox_hi) & ~first_lanes(ox_lo)));
                        continue;
                    }
#endif
                    if (padding_row) {
                        std::memset(o, 0, size_t(ox1 - ox0) * sizeof(float));
                        continue;
                    }
                    const int64_t a = std::clamp(ox_lo, ox0, ox1), b = std::clamp(ox_hi, a, ox1);
                    if (a > ox0) std::memset(o, 0, size_t(a - ox0) * sizeof(float));
                    if (c.stride_w == 1) {
                        if (b > a) std::memcpy(o + (a - ox0), row + a + xoff, size_t(b - a) * sizeof(float));
                    } else if (c.stride_w == 2) {
                        // The next output row's input row, fetched while this one is copied:
                        // at batch > 1 the input comes from memory, and every other row's
                        // 224 bytes (ResNet-50's 1x1 stride-2 layers) defeat the prefetchers
                        // (alone at batch 8: 56x56 -> 28x28 256 -> 512 8.7-9.5 -> 8.3-8.5 ms,
                        // 28x28 -> 14x14 512 -> 1024 9.0-9.9 -> 8.5-8.6; two and four rows on
                        // gained less).
                        const int64_t ahead = iy + c.stride_h;
                        if (ahead < c.h)
                            for (int64_t j = a * 2 + xoff; j < b * 2 + xoff; j += 16)
                                __builtin_prefetch(xc + ahead * c.w_in + j);
                        copy_stride2(o + (a - ox0), row + a * 2 + xoff, b - a);
                    } else {
                        for (int64_t ox = a; ox < b; ++ox) o[ox - ox0] = row[ox * c.stride_w + xoff];
                    }
                    if (ox1 > b) std::memset(o + (b - ox0), 0, size_t(ox1 - b) * sizeof(float));
                }
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void im2col_narrow_avx512(const conv2d_args& c, const float* x, int64_t p0,
                                                            int64_t p1, float* cols, int64_t ld) {
    im2col_taps<true>(c, x, p0, p1, cols, ld);
}
#endif

// cols[k * ld + p - p0] for output pixels [p0, p1) of one image and group; K = ci*kh*kw
// rows. Works a row of output pixels at a time: the padded edges are zero-filled and the
// valid span is one memcpy (stride 1) or one strided loop, instead of a bounds check per
// element; planes at most 16 wide at stride 1 one masked load and store per row.
void im2col(const conv2d_args& c, const float* x, int64_t p0, int64_t p1, float* cols, int64_t ld) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (c.stride_w == 1 && c.w_out <= 16 && cpu_has_avx512()) return im2col_narrow_avx512(c, x, p0, p1, cols, ld);
#endif
    im2col_taps<false>(c, x, p0, p1, cols, ld);
}

bool conv2d_is_depthwise(const conv2d_args& c) { return conv2d_ci_per_group(c) == 1 && conv2d_co_per_group(c) == 1; }

// y[j] = max(y[j] + b + r[j], 0) and its variants over one output row. GCC at -O2 does not
// vectorise these (that would need a run-time check that y and r do not overlap), and the
// scalar loops took a third of ResNet-50's time, more than sgemm on its 1x1 convs, so the
// AVX-512 version is chosen at run time where the CPU has it.
enum class row_epi : uint8_t { add_res_relu, add_res, relu, bias };

#if defined(__x86_64__) && defined(__GNUC__)
// The same association as the scalar loops below, so both give identical results.
__attribute__((target("avx512f"), always_inline)) inline __m512 epilogue_16(__m512 yv, __m512 rv, __m512 vb,
                                                                           row_epi op) {
    const __m512 zero = _mm512_setzero_ps();
    switch (op) {
    case row_epi::add_res_relu: return _mm512_maskz_max_ps(__mmask16(0xffff), _mm512_add_ps(_mm512_add_ps(yv, vb), rv), zero);
    case row_epi::add_res: return _mm512_add_ps(yv, _mm512_add_ps(vb, rv));
    case row_epi::relu: return _mm512_maskz_max_ps(__mmask16(0xffff), _mm512_add_ps(yv, vb), zero);
    case row_epi::bias: break;
    }
    return _mm512_add_ps(yv, vb);
}

__attribute__((target("avx512f"))) void epilogue_row_avx512(float* y, const float* r, float b, int64_t n,
                                                            row_epi op) {
    const __m512 vb = _mm512_set1_ps(b), zero = _mm512_setzero_ps();
    const bool with_res = op == row_epi::add_res_relu || op == row_epi::add_res;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(y + j, epilogue_16(_mm512_loadu_ps(y + j), with_res ? _mm512_loadu_ps(r + j) : zero, vb, op));
    if (j < n) {
        const __mmask16 m = __mmask16((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(y + j, m, epilogue_16(_mm512_maskz_loadu_ps(m, y + j),
                                                     with_res ? _mm512_maskz_loadu_ps(m, r + j) : zero, vb, op));
    }
}
#endif

// y[j] = min(max(y[j] + b, lo), hi): Clip after the bias (ReLU6 in MobileNets), one pass. The
// operand order keeps a NaN as the scalar loop does.
#if defined(__x86_64__) && defined(__GNUC__)
// The maskz forms with a full mask: the plain ones trip GCC 12's -Wmaybe-uninitialized.
__attribute__((target("avx512f"), always_inline)) inline __m512 clip_16(__m512 v, __m512 vb, __m512 vlo, __m512 vhi) {
    const __mmask16 all = 0xffff;
    return _mm512_maskz_min_ps(all, vhi, _mm512_maskz_max_ps(all, vlo, _mm512_add_ps(v, vb)));
}

__attribute__((target("avx512f"))) void clip_row_avx512(float* y, float b, float lo, float hi, int64_t n) {
    const __m512 vb = _mm512_set1_ps(b), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, clip_16(_mm512_loadu_ps(y + j), vb, vlo, vhi));
    if (j < n) {
        const __mmask16 m = __mmask16((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(y + j, m, clip_16(_mm512_maskz_loadu_ps(m, y + j), vb, vlo, vhi));
    }
}
#endif

void clip_row(float* y, float b, float lo, float hi, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return clip_row_avx512(y, b, lo, hi, n);
#endif
    for (int64_t j = 0; j < n; ++j) {
        const float x = y[j] + b, v = x < lo ? lo : x;
        y[j] = v > hi ? hi : v;
    }
}

void epilogue_row(float* y, const float* r, float b, int64_t n, row_epi op) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return epilogue_row_avx512(y, r, b, n, op);
#endif
    switch (op) {
    case row_epi::add_res_relu:
        for (int64_t j = 0; j < n; ++j) { const float v = y[j] + b + r[j]; y[j] = v > 0 ? v : 0; }
        break;
    case row_epi::add_res:
        for (int64_t j = 0; j < n; ++j) y[j] += b + r[j];
        break;
    case row_epi::relu:
        for (int64_t j = 0; j < n; ++j) { const float v = y[j] + b; y[j] = v > 0 ? v : 0; }
        break;
    case row_epi::bias:
        for (int64_t j = 0; j < n; ++j) y[j] += b;
        break;
    }
}

bool conv2d_group_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group, const gpu::block_context& ctx);
bool conv2d_images_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group, const gpu::block_context& ctx);
void conv2d_epilogue(const conv2d_args& c, float* y, const float* res, int64_t co_abs, int64_t nco, int64_t np,
                     int64_t hw_out);
bool conv2d_tile_cpu(const conv2d_args& c, const conv2d_tile& t, const gpu::block_context& ctx);
bool conv2d_parts_cpu(const conv2d_args& c, const conv2d_tile& t, const gpu::block_context& ctx);

// Whether a tile of several images runs as one GEMM (conv2d_images_cpu): whole planes, outside
// depthwise layers, with the scratch for it.
bool conv2d_images_batched(const conv2d_args& c, const conv2d_tile& t, size_t scratch_size) {
    return t.image1 - t.image > 1 && t.p0 == 0 && t.p1 == c.h_out * c.w_out && !conv2d_is_depthwise(c) &&
           scratch_size >= conv2d_images_scratch_bytes(c);
}

// A block: one image's tile, or several images' whole planes as one GEMM per group (any
// other tile of several images image by image).
bool conv2d_block_cpu(const void* p, const gpu::block_context& ctx) {
    const auto& c = *static_cast<const conv2d_args*>(p);
    const conv2d_tile t = conv2d_block(c, ctx.block);
    if (ctx.preempted()) return false;
    if (c.span_images || conv2d_split(c)) return conv2d_parts_cpu(c, t, ctx);
    if (t.image1 - t.image == 1) return conv2d_tile_cpu(c, t, ctx);
    if (conv2d_images_batched(c, t, ctx.scratch_size)) {
        for (int64_t group = t.group; group < t.group1; ++group)
            if (!conv2d_images_cpu(c, t, group, ctx)) return false;
        return true;
    }
    for (int64_t image = t.image; image < t.image1; ++image) {
        conv2d_tile one = t;
        one.image = image;
        one.image1 = image + 1;
        if (!conv2d_tile_cpu(c, one, ctx)) return false;
    }
    return true;
}

// One image's tile: its groups (several only for depthwise tiles): a depthwise layer with its
// pointwise layer folded in by pointwise_depthwise (cpu_pointwise_depthwise.h), 3x3 depthwise
// planes by depthwise3x3 (cpu_window3x3.h), other small depthwise planes 16 at a time where
// depthwise16 takes them (cpu_planes16.h), the rest one after the other.
bool conv2d_tile_cpu(const conv2d_args& c, const conv2d_tile& t, const gpu::block_context& ctx) {
    int64_t group = t.group;
    if (c.pre_c_in > 0)
        return pointwise_depthwise(c, t.image, t.group, t.group1, static_cast<float*>(ctx.scratch), ctx);
    const bool whole_planes = t.p0 == 0 && t.p1 == c.h_out * c.w_out;
    if (whole_planes && depthwise3x3_possible(c)) return depthwise3x3(c, t.image, t.group, t.group1, ctx);
    if (whole_planes && t.group1 - t.group >= 16 && depthwise16_possible(c) &&
        ctx.scratch_size >= depthwise16_scratch_bytes(c))
        for (; group + 16 <= t.group1; group += 16) {
            if (group > t.group && ctx.preempted()) return false;
            depthwise16(c, t.image, group, static_cast<float*>(ctx.scratch));
        }
    for (; group < t.group1; ++group)
        if (!conv2d_group_cpu(c, t, group, ctx)) return false;
    return true;
}

// GEMM path: layers of K up to short_k run their tile's rows short_k_rows at a time (below).
constexpr int64_t short_k = 64, short_k_rows = 32;

bool conv2d_group_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group, const gpu::block_context& ctx) {
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), K = conv2d_k(c);
    const int64_t hw_out = c.h_out * c.w_out, np = t.p1 - t.p0, nco = t.co1 - t.co0;
    const float* x = c.x + (t.image * c.c_in + group * ci) * c.h * c.w_in;
    const int64_t co_abs = group * co_g + t.co0;
    const float* w = c.w + co_abs * K;
    float* y = c.y + (t.image * c.c_out + co_abs) * hw_out + t.p0;
    if (conv2d_is_depthwise(c)) {
        // Direct, without im2col and without a GEMM of one row.
        const plane_window g = conv2d_window(c);
        if (t.p0 == 0 && t.p1 == hw_out && plane_phases_fit(g) &&
            ctx.scratch_size >= window_sum_plane_scratch_bytes(g, c.h_out))
            window_sum_plane(g, c.h_out, x, w, y, static_cast<float*>(ctx.scratch));
        else
            window_sum(g, x, w, t.p0, t.p1, y, static_cast<float*>(ctx.scratch));
    } else if (conv2d_winograd_chosen(c) && ctx.scratch_size >= conv2d_winograd_scratch_bytes(c)) {
        const float* u = c.w_winograd + group * winograd_filter_floats(co_g, ci);
        if (!conv2d_winograd(c, t, x, u, c.bias ? c.bias + co_abs : nullptr, y, static_cast<float*>(ctx.scratch), ctx))
            return false;
        if (conv2d_direct_finishes(c)) return true;
    } else if (conv2d_direct_chosen(c) && ctx.scratch_size >= conv2d_direct_scratch_bytes(c)) {
        if (!conv2d_direct(c, t, x, w, c.bias ? c.bias + co_abs : nullptr, y, static_cast<float*>(ctx.scratch), ctx))
            return false;
        if (conv2d_direct_finishes(c)) return true;
    } else {
        const float* cols;
        int64_t ldb;
        if (conv2d_is_pointwise(c)) {
            cols = x + t.p0;
            ldb = c.h * c.w_in;
        } else {
            auto* scratch = static_cast<float*>(ctx.scratch);
            im2col(c, x, t.p0, t.p1, scratch, np);
            cols = scratch;
            ldb = np;
        }
        // Where K is short, a call of all nco rows writes that many output rows at once, each
        // a stream into memory the caches no longer hold (MobileNet-v2's 16 -> 96 expansion on
        // 112x112 at batch 8: 1.5 ms an image in the model against 0.79 alone, and ONNX
        // Runtime's 0.84); calls of short_k_rows rows keep fewer streams open (0.9-1.1 ms),
        // for one more packing of the short B per call.
        const int64_t rows = K <= short_k ? std::min(nco, short_k_rows) : nco;
        for (int64_t m0 = 0; m0 < nco; m0 += rows)
            for (int64_t k0 = 0; k0 < K; k0 += c.tile_k) {
                if (ctx.preempted()) return false;
                const int64_t kc = k0 + c.tile_k < K ? c.tile_k : K - k0;
                sgemm(false, false, std::min(rows, nco - m0), np, kc, 1.0f, w + m0 * K + k0, K, cols + k0 * ldb, ldb,
                      k0 == 0 ? 0.0f : 1.0f, y + m0 * hw_out, hw_out);
            }
    }
    const float* res = c.residual ? c.residual + (t.image * c.c_out + co_abs) * hw_out + t.p0 : nullptr;
    conv2d_epilogue(c, y, res, co_abs, nco, np, hw_out);
    return true;
}

// Images [t.image, t.image1) of one group, whole planes: their columns side by side
// ([K][images * hw_out]: im2col, or each channel's plane copied for pointwise layers), one
// GEMM per K chunk into scratch ([nco][images * hw_out]), then each image's rows copied out
// and the epilogue applied as for one image. On small planes (ResNet-50's 7x7) one image's
// GEMM is 49 columns wide and reads the layer's weights (up to 9.4 MB) again for every image;
// alone, ResNet-50's 7x7 1x1 stride-2 layer at batch 8 ran at 99 GMAC/s image by image and
// 107 as one 392-column GEMM of eight images.
bool conv2d_images_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group, const gpu::block_context& ctx) {
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), K = conv2d_k(c);
    const int64_t hw_out = c.h_out * c.w_out, hw_in = c.h * c.w_in, nco = t.co1 - t.co0;
    const int64_t images = t.image1 - t.image, n = images * hw_out;
    const int64_t co_abs = group * co_g + t.co0;
    const float* w = c.w + co_abs * K;
    auto* cols = static_cast<float*>(ctx.scratch);
    float* out = cols + K * n;
    for (int64_t b = 0; b < images; ++b) {
        const float* x = c.x + ((t.image + b) * c.c_in + group * ci) * hw_in;
        if (conv2d_is_pointwise(c))
            for (int64_t k = 0; k < K; ++k)
                std::memcpy(cols + k * n + b * hw_out, x + k * hw_in, size_t(hw_out) * sizeof(float));
        else
            im2col(c, x, 0, hw_out, cols + b * hw_out, n);
    }
    for (int64_t k0 = 0; k0 < K; k0 += c.tile_k) {
        if (ctx.preempted()) return false;
        const int64_t kc = k0 + c.tile_k < K ? c.tile_k : K - k0;
        sgemm(false, false, nco, n, kc, 1.0f, w + k0, K, cols + k0 * n, n, k0 == 0 ? 0.0f : 1.0f, out, n);
    }
    for (int64_t b = 0; b < images; ++b) {
        const int64_t at = ((t.image + b) * c.c_out + co_abs) * hw_out;
        float* y = c.y + at;
        for (int64_t m = 0; m < nco; ++m)
            std::memcpy(y + m * hw_out, out + m * n + b * hw_out, size_t(hw_out) * sizeof(float));
        conv2d_epilogue(c, y, c.residual ? c.residual + at : nullptr, co_abs, nco, hw_out, hw_out);
    }
    return true;
}

// The tiles of GPU plans (span_images, split-K; decomp.h) on the cpu device, image by image:
// a tile spanning images is its part in each, and a split layer's phases are a partial GEMM
// over the block's K chunk into `partial`, then the chunks' sum in split order and the
// epilogue. The cpu plans never make these tiles; the cpu device runs them for the GPU plans
// the backend contract and DKP hand it.
bool conv2d_partial_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group, const gpu::block_context& ctx);
void conv2d_reduce_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group);

bool conv2d_parts_cpu(const conv2d_args& c, const conv2d_tile& t, const gpu::block_context& ctx) {
    for (int64_t image = t.image; image < t.image1; ++image) {
        conv2d_tile part = c.span_images ? conv2d_image_part(c, t, image) : t;
        part.image = image;
        part.image1 = image + 1;
        if (part.p1 == part.p0) continue;
        if (!conv2d_split(c)) {
            if (!conv2d_tile_cpu(c, part, ctx)) return false;
            continue;
        }
        for (int64_t group = t.group; group < t.group1; ++group) {
            if (ctx.preempted()) return false;
            if (c.split_phase == 1) {
                if (!conv2d_partial_cpu(c, part, group, ctx)) return false;
            } else {
                conv2d_reduce_cpu(c, part, group);
            }
        }
    }
    return true;
}

// Offset of output (image, absolute channel co, pixel p) in y, residual and each split's
// partial sums.
inline int64_t conv2d_out_offset(const conv2d_args& c, int64_t image, int64_t co, int64_t p) {
    return (image * c.c_out + co) * c.h_out * c.w_out + p;
}

bool conv2d_partial_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group, const gpu::block_context& ctx) {
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), K = conv2d_k(c);
    const int64_t np = t.p1 - t.p0, nco = t.co1 - t.co0, co_abs = group * co_g + t.co0;
    const float* x = c.x + (t.image * c.c_in + group * ci) * c.h * c.w_in;
    const float* cols = x + t.p0;
    int64_t ldb = c.h * c.w_in;
    if (!conv2d_is_pointwise(c)) {
        if (ctx.scratch_size < size_t(K * np) * sizeof(float)) return false;
        auto* scratch = static_cast<float*>(ctx.scratch);
        im2col(c, x, t.p0, t.p1, scratch, np);
        cols = scratch;
        ldb = np;
    }
    float* out = c.partial + t.split * conv2d_split_stride(c) + conv2d_out_offset(c, t.image, co_abs, t.p0);
    sgemm(false, false, nco, np, t.k1 - t.k0, 1.0f, c.w + co_abs * K + t.k0, K, cols + t.k0 * ldb, ldb, 0.0f, out,
          c.h_out * c.w_out);
    return true;
}

void conv2d_reduce_cpu(const conv2d_args& c, const conv2d_tile& t, int64_t group) {
    const int64_t hw_out = c.h_out * c.w_out, np = t.p1 - t.p0, nco = t.co1 - t.co0;
    const int64_t co_abs = group * conv2d_co_per_group(c) + t.co0, stride = conv2d_split_stride(c);
    const int64_t at = conv2d_out_offset(c, t.image, co_abs, t.p0);
    for (int64_t i = 0; i < nco; ++i)
        for (int64_t p = 0; p < np; ++p) {
            const float* part = c.partial + at + i * hw_out + p;
            float s = 0.0f;
            for (int32_t k = 0; k < c.k_splits; ++k) s += part[k * stride];
            c.y[at + i * hw_out + p] = s;
        }
    conv2d_epilogue(c, c.y + at, c.residual ? c.residual + at : nullptr, co_abs, nco, np, hw_out);
}

// Bias, residual and activation over a tile's nco output rows of np pixels (rows hw_out
// apart), in one pass: bias, residual and ReLU together (vectorised), any other activation
// through apply_epilogue on the row while it is still in cache.
void conv2d_epilogue(const conv2d_args& c, float* y, const float* res, int64_t co_abs, int64_t nco, int64_t np,
                     int64_t hw_out) {
    const bool relu = c.ep.act == activation::relu;
    const row_epi op = res ? (relu ? row_epi::add_res_relu : row_epi::add_res) : (relu ? row_epi::relu : row_epi::bias);
    for (int64_t i = 0; i < nco; ++i) {
        float* row = y + i * hw_out;
        const float b = c.bias ? c.bias[co_abs + i] : 0.0f;
        if (!res && c.ep.act == activation::clip) {
            clip_row(row, b, c.ep.alpha, c.ep.beta, np);
            continue;
        }
        if (res || relu || b != 0.0f) epilogue_row(row, res ? res + i * hw_out : nullptr, b, np, op);
        if (!relu && c.ep.act != activation::none) apply_epilogue(row, np, c.ep);
    }
}

}  // namespace

std::string cpu_blas_kernels() {
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    return std::string(openblas_get_corename()) +
           (coretype ? std::string(" (as OPENBLAS_CORETYPE=") + coretype + ")" : " (OpenBLAS's choice for this CPU)");
}

bool conv2d_is_pointwise(const conv2d_args& c) {
    return c.kh == 1 && c.kw == 1 && c.stride_h == 1 && c.stride_w == 1 && c.pad_top == 0 &&
           c.pad_left == 0 && c.h_out == c.h && c.w_out == c.w_in;
}

size_t conv2d_scratch_bytes(const conv2d_args& c) {
    if (c.pre_c_in > 0) return pointwise_depthwise_scratch_bytes(c);
    // A split layer's partial GEMM: the tile's im2col columns (conv2d_partial_cpu).
    if (conv2d_split(c))
        return conv2d_is_pointwise(c) ? 0 : size_t(conv2d_k(c)) * size_t(c.tile_pix) * sizeof(float);
    // Depthwise: one output row's strided input columns copied to unit stride, or the padded
    // plane of a whole-plane block at stride 1.
    if (conv2d_is_depthwise(c)) {
        const plane_window g = conv2d_window(c);
        if (c.tile_pix >= c.h_out * c.w_out && depthwise3x3_possible(c)) return 0;
        if (plane_phases_fit(g) && c.tile_pix >= c.h_out * c.w_out)
            return std::max(window_sum_plane_scratch_bytes(g, c.h_out),
                            depthwise16_possible(c) ? depthwise16_scratch_bytes(c) : size_t(0));
        return c.stride_w == 1 ? 0 : size_t(std::min<int64_t>(c.tile_pix, c.w_out)) * sizeof(float);
    }
    const size_t images = !c.span_images && conv2d_image_tile(c) > 1 ? conv2d_images_scratch_bytes(c) : 0;
    if (conv2d_is_pointwise(c)) return images;
    const size_t im2col_bytes = size_t(conv2d_k(c)) * size_t(c.tile_pix) * sizeof(float);
    // Room for either way, so that the method can change after planning (reefrun --conv).
    const size_t direct_bytes = conv2d_direct_possible(c) ? conv2d_direct_scratch_bytes(c) : 0;
    const bool winograd = conv2d_winograd_possible(c) &&
                          winograd_filters_wanted(conv2d_co_per_group(c), conv2d_ci_per_group(c), c.h_out, c.w_out);
    const size_t winograd_bytes = winograd ? conv2d_winograd_scratch_bytes(c) : 0;
    return std::max({images, im2col_bytes, direct_bytes, winograd_bytes});
}

size_t conv2d_images_scratch_bytes(const conv2d_args& c) {
    const int64_t n = std::min<int64_t>(conv2d_image_tile(c), c.n) * c.h_out * c.w_out;
    const int64_t nco = std::min<int64_t>(c.tile_co, conv2d_co_per_group(c));
    return size_t(conv2d_k(c) + nco) * size_t(n) * sizeof(float);
}

const gpu::kernel_info gemm_kernel = {"gemm", gemm_block_cpu, 256, 128, 32768, 0};
const gpu::kernel_info conv2d_kernel = {"conv2d", conv2d_block_cpu, 256, 128, 32768, 0};

}  // namespace reefline::ml::kernels
