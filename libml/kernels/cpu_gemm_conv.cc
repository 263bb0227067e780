// CPU implementations of the GEMM and convolution blocks: each block hands its output tile
// to a single-threaded sgemm (oneDNN's, or OpenBLAS's: cpu_onednn.h) in K chunks, checking the
// preemption flag between chunks, then applies the fused epilogue (bias, residual,
// activation) to the tile.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_onednn.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

inline float act(float x, const epilogue& ep) {
    switch (ep.act) {
    case activation::none: return x;
    case activation::relu: return x > 0 ? x : 0;
    case activation::leaky_relu: return x >= 0 ? x : ep.alpha * x;
    case activation::sigmoid: return 1.0f / (1.0f + std::exp(-x));
    case activation::tanh: return std::tanh(x);
    // ONNX: min(max(x, lo), hi), so lo > hi yields hi everywhere.
    case activation::clip: { const float v = x < ep.alpha ? ep.alpha : x; return v > ep.beta ? ep.beta : v; }
    case activation::hard_sigmoid: {
        const float v = ep.alpha * x + ep.beta;
        return v < 0 ? 0 : (v > 1 ? 1 : v);
    }
    case activation::hard_swish: {
        const float v = x / 6.0f + 0.5f;
        return x * (v < 0 ? 0 : (v > 1 ? 1 : v));
    }
    case activation::gelu_erf: return 0.5f * x * (1.0f + erf_fast(x * 0.70710678118654752f));
    case activation::gelu_tanh:
        return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    }
    return x;
}

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
        sgemm(g.trans_a, g.trans_b, mt, nt, kc, g.alpha, ap, g.lda, bp, g.ldb, k0 == 0 ? 0.0f : 1.0f, c, g.ldc);
    }
    if (g.k == 0)
        for (int64_t i = 0; i < mt; ++i) std::memset(c + i * g.ldc, 0, size_t(nt) * sizeof(float));
    const float* bias = g.bias ? g.bias + t.batch * g.stride_bias : nullptr;
    for (int64_t i = 0; i < mt; ++i) {
        float* row = c + i * g.ldc;
        const int64_t m = t.m0 + i;
        switch (g.bias_mode) {
        case bias_kind::none: break;
        case bias_kind::scalar:
            for (int64_t j = 0; j < nt; ++j) row[j] += g.beta * bias[0];
            break;
        case bias_kind::per_col:
            for (int64_t j = 0; j < nt; ++j) row[j] += g.beta * bias[t.n0 + j];
            break;
        case bias_kind::per_row:
            for (int64_t j = 0; j < nt; ++j) row[j] += g.beta * bias[m];
            break;
        case bias_kind::full:
            for (int64_t j = 0; j < nt; ++j) row[j] += g.beta * bias[m * g.ldbias + t.n0 + j];
            break;
        }
        if (g.ep.act != activation::none) apply_epilogue(row, nt, g.ep);
    }
    return true;
}

#if defined(__x86_64__) && defined(__GNUC__)
// o[i] = in[2 * i]: two loads and one permute per 16 outputs. The second load is masked to the
// 15 elements that are used, so it never reads past in[2 * (n - 1)].
__attribute__((target("avx512f"))) void copy_stride2_avx512(float* o, const float* in, int64_t n) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 lo = _mm512_loadu_ps(in + 2 * i);
        const __m512 hi = _mm512_maskz_loadu_ps(__mmask16(0x7fff), in + 2 * i + 16);
        _mm512_storeu_ps(o + i, _mm512_permutex2var_ps(lo, even, hi));
    }
    for (; i < n; ++i) o[i] = in[2 * i];
}
// A static initialiser may run before libgcc's own CPU detection, hence the explicit init.
const bool have_avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
}();
#else
const bool have_avx512 = false;
#endif

void copy_stride2(float* o, const float* in, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx512) return copy_stride2_avx512(o, in, n);
#endif
    for (int64_t i = 0; i < n; ++i) o[i] = in[2 * i];
}

// cols[k][p] for output pixels [p0, p1) of one image and group; K = ci*kh*kw rows. Works a
// row of output pixels at a time: the padded edges are zero-filled and the valid span is one
// memcpy (stride 1) or one strided loop, instead of a bounds check per element.
void im2col(const conv2d_args& c, const float* x, int64_t p0, int64_t p1, float* cols) {
    const int64_t np = p1 - p0, ci = conv2d_ci_per_group(c);
    for (int64_t ch = 0; ch < ci; ++ch) {
        const float* xc = x + ch * c.h * c.w_in;
        for (int64_t r = 0; r < c.kh; ++r) {
            for (int64_t s = 0; s < c.kw; ++s) {
                float* out = cols + ((ch * c.kh + r) * c.kw + s) * np;
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
                    if (iy < 0 || iy >= c.h) {
                        std::memset(o, 0, size_t(ox1 - ox0) * sizeof(float));
                    } else {
                        const float* row = xc + iy * c.w_in;
                        const int64_t a = std::clamp(ox_lo, ox0, ox1), b = std::clamp(ox_hi, a, ox1);
                        if (a > ox0) std::memset(o, 0, size_t(a - ox0) * sizeof(float));
                        if (c.stride_w == 1) {
                            if (b > a) std::memcpy(o + (a - ox0), row + a + xoff, size_t(b - a) * sizeof(float));
                        } else if (c.stride_w == 2) {
                            copy_stride2(o + (a - ox0), row + a * 2 + xoff, b - a);
                        } else {
                            for (int64_t ox = a; ox < b; ++ox) o[ox - ox0] = row[ox * c.stride_w + xoff];
                        }
                        if (ox1 > b) std::memset(o + (b - ox0), 0, size_t(ox1 - b) * sizeof(float));
                    }
                    q += ox1 - ox0;
                }
            }
        }
    }
}

// acc[j] += w * x[j]: one tap of a depthwise convolution over a run of output pixels. Vectorised
// at run time like the epilogue; the scalar loop is the fallback elsewhere.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void axpy_row_avx512(float* acc, const float* x, float w, int64_t n) {
    const __m512 vw = _mm512_set1_ps(w);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(acc + j, _mm512_fmadd_ps(vw, _mm512_loadu_ps(x + j), _mm512_loadu_ps(acc + j)));
    if (j < n) {
        const __mmask16 m = __mmask16((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(acc + j, m, _mm512_fmadd_ps(vw, _mm512_maskz_loadu_ps(m, x + j), _mm512_maskz_loadu_ps(m, acc + j)));
    }
}
#endif

void axpy_row(float* __restrict acc, const float* __restrict x, float w, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx512) return axpy_row_avx512(acc, x, w, n);
#endif
    for (int64_t j = 0; j < n; ++j) acc[j] += w * x[j];
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
    if (have_avx512) return clip_row_avx512(y, b, lo, hi, n);
#endif
    for (int64_t j = 0; j < n; ++j) {
        const float x = y[j] + b, v = x < lo ? lo : x;
        y[j] = v > hi ? hi : v;
    }
}

void epilogue_row(float* y, const float* r, float b, int64_t n, row_epi op) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx512) return epilogue_row_avx512(y, r, b, n, op);
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

bool conv2d_block_cpu(const void* p, const gpu::block_context& ctx) {
    const auto& c = *static_cast<const conv2d_args*>(p);
    const conv2d_tile t = conv2d_block(c, ctx.block);
    if (ctx.preempted()) return false;
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), K = conv2d_k(c);
    const int64_t hw_out = c.h_out * c.w_out, np = t.p1 - t.p0, nco = t.co1 - t.co0;
    const float* x = c.x + (t.image * c.c_in + t.group * ci) * c.h * c.w_in;
    const int64_t co_abs = t.group * co_g + t.co0;
    const float* w = c.w + co_abs * K;
    float* y = c.y + (t.image * c.c_out + co_abs) * hw_out + t.p0;
    if (conv2d_is_depthwise(c)) {
        // Direct, without im2col and without a GEMM of one row.
        const plane_window g{c.h, c.w_in, c.w_out, c.kh, c.kw, c.stride_h, c.stride_w, c.pad_top, c.pad_left, c.dil_h, c.dil_w};
        window_sum(g, x, w, t.p0, t.p1, y, static_cast<float*>(ctx.scratch));
    } else {
        const float* cols;
        int64_t ldb;
        if (conv2d_is_pointwise(c)) {
            cols = x + t.p0;
            ldb = c.h * c.w_in;
        } else {
            auto* scratch = static_cast<float*>(ctx.scratch);
            im2col(c, x, t.p0, t.p1, scratch);
            cols = scratch;
            ldb = np;
        }
        for (int64_t k0 = 0; k0 < K; k0 += c.tile_k) {
            if (ctx.preempted()) return false;
            const int64_t kc = k0 + c.tile_k < K ? c.tile_k : K - k0;
            sgemm(false, false, nco, np, kc, 1.0f, w + k0, K, cols + k0 * ldb, ldb, k0 == 0 ? 0.0f : 1.0f, y, hw_out);
        }
    }
    const float* res = c.residual ? c.residual + (t.image * c.c_out + co_abs) * hw_out + t.p0 : nullptr;
    // One pass over the tile: bias, residual and ReLU together (vectorised), any other
    // activation through apply_epilogue on the row while it is still in cache.
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
    return true;
}

}  // namespace

void apply_epilogue(float* v, int64_t n, const epilogue& ep) {
    // The common cases, kept vectorisable.
    if (ep.act == activation::relu) {
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] > 0 ? v[i] : 0;
        return;
    }
    if (ep.act == activation::gelu_erf) {
        for (int64_t i = 0; i < n; ++i) v[i] = 0.5f * v[i] * (1.0f + erf_fast(v[i] * 0.70710678118654752f));
        return;
    }
    for (int64_t i = 0; i < n; ++i) v[i] = act(v[i], ep);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static void affine_row_avx512(float* y, const float* x, float s, float b, int64_t n,
                                                                 const epilogue& ep) {
    const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b), vlo = _mm512_set1_ps(ep.alpha),
                 vhi = _mm512_set1_ps(ep.beta), zero = _mm512_setzero_ps();
    const __mmask16 all = 0xffff;
    // Multiply then add, as the scalar loop does (no FMA), so both paths give the same bits.
    const auto one = [&](__m512 v) __attribute__((target("avx512f"))) {
        v = _mm512_add_ps(_mm512_mul_ps(v, vs), vb);
        if (ep.act == activation::relu) return _mm512_maskz_max_ps(all, v, zero);
        if (ep.act == activation::clip) return _mm512_maskz_min_ps(all, vhi, _mm512_maskz_max_ps(all, vlo, v));
        return v;
    };
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, one(_mm512_loadu_ps(x + j)));
    if (j < n) {
        const __mmask16 m = __mmask16((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(y + j, m, one(_mm512_maskz_loadu_ps(m, x + j)));
    }
}
#endif

void affine_row(float* y, const float* x, float s, float b, int64_t n, const epilogue& ep) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx512 && (ep.act == activation::none || ep.act == activation::relu || ep.act == activation::clip))
        return affine_row_avx512(y, x, s, b, n, ep);
#endif
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s + b;
    if (ep.act != activation::none) apply_epilogue(y, n, ep);
}

// Worked a row of output pixels at a time: each of the kh x kw taps adds w * x over the columns
// where it lands inside the plane, so the padded edges cost nothing and there is no bounds
// check per element. Strided rows are first copied to unit stride in `strided`. The taps are
// summed in the same order for every pixel, so the result does not depend on [p0, p1).
void window_sum(const plane_window& g, const float* x, const float* w, int64_t p0, int64_t p1, float* y,
                float* strided) {
    std::memset(y, 0, size_t(p1 - p0) * sizeof(float));
    for (int64_t p = p0; p < p1;) {
        const int64_t oy = p / g.w_out, ox0 = p % g.w_out, ox1 = std::min(g.w_out, ox0 + (p1 - p));
        float* acc = y + (p - p0);
        for (int64_t i = 0; i < g.kh; ++i) {
            const int64_t iy = oy * g.stride_h - g.pad_top + i * g.dil_h;
            if (iy < 0 || iy >= g.h) continue;
            const float* row = x + iy * g.w;
            for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t off = j * g.dil_w - g.pad_left;  // ix = ox * stride + off
                // The output columns whose input column is inside the row: [a, b).
                const int64_t a = std::max(ox0, off >= 0 ? 0 : (-off + g.stride_w - 1) / g.stride_w);
                const int64_t b = std::min(ox1, g.w - off <= 0 ? 0 : (g.w - 1 - off) / g.stride_w + 1);
                if (a >= b) continue;
                const float* src = row + a * g.stride_w + off;
                if (g.stride_w != 1) {
                    if (g.stride_w == 2) {
                        copy_stride2(strided, src, b - a);
                    } else {
                        for (int64_t q = 0; q < b - a; ++q) strided[q] = src[q * g.stride_w];
                    }
                    src = strided;
                }
                axpy_row(acc + (a - ox0), src, w ? w[i * g.kw + j] : 1.0f, b - a);
            }
        }
        p += ox1 - ox0;
    }
}

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
    // Depthwise: one output row's strided input columns copied to unit stride.
    if (conv2d_is_depthwise(c))
        return c.stride_w == 1 ? 0 : size_t(std::min<int64_t>(c.tile_pix, c.w_out)) * sizeof(float);
    return conv2d_is_pointwise(c) ? 0 : size_t(conv2d_k(c)) * size_t(c.tile_pix) * sizeof(float);
}

const gpu::kernel_info gemm_kernel = {"gemm", gemm_block_cpu, nullptr, 256, 128, 32768, 0};
const gpu::kernel_info conv2d_kernel = {"conv2d", conv2d_block_cpu, nullptr, 256, 128, 32768, 0};

}  // namespace reefline::ml::kernels
