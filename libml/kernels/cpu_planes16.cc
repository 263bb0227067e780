// Depthwise convolution and pooling of small planes, 16 channels at a time.
//
// A 7x7 or 14x14 plane is too small for per-plane vector runs: each plane's padding, a few
// short chains of vector operations and the epilogue cost ~300 cycles for 49 outputs, where
// the arithmetic is ~20 (MobileNet-v2's 14x14 and 7x7 depthwise layers ran at 5-12 GMAC/s;
// Inception-v3's stride-2 max pools over 35x35 and 17x17 planes took 15-25x ONNX Runtime's
// time, which works on 16 channels at once).
// Here 16 planes are transposed into one padded plane of 16-float pixels (16x16 blocks, 64
// shuffles each; a gather per pixel cost 60% of the time), every output pixel of all 16
// channels is a few whole-vector operations with the epilogue in the register, and the
// results are transposed back. Each output is computed by the same operations in the same
// order as the per-plane paths, so the results are the same bit for bit.
#include "libml/kernels/cpu_planes16.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_rows.h"

namespace reefline::ml::kernels {

namespace {

// The padded plane of 16-float pixels that outputs [0, h_out) x [0, w_out) read.
struct plane16 {
    int64_t hp, wp;
    int64_t floats() const { return hp * wp * 16; }
};
plane16 plane16_of(int64_t h_out, int64_t w_out, int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
    return {(h_out - 1) * sh + kh, (w_out - 1) * sw + kw};
}

}  // namespace

bool depthwise16_possible(const conv2d_args& c) {
    return cpu_has_avx512() && conv2d_ci_per_group(c) == 1 && conv2d_co_per_group(c) == 1 && c.groups >= 16 &&
           c.dil_h == 1 && c.dil_w == 1 && c.h_out * c.w_out <= depthwise16_max_pixels && !c.residual && bias_activation_applies(c.ep) &&
           c.kh * c.kw <= 64 && c.h_out >= 1 && c.w_out >= 1;
}

size_t depthwise16_scratch_bytes(const conv2d_args& c) {
    const plane16 f = plane16_of(c.h_out, c.w_out, c.kh, c.kw, c.stride_h, c.stride_w);
    return size_t(f.floats() + 16 * (c.h_out * c.w_out + (c.kh * c.kw + 15) / 16 * 16)) * sizeof(float);
}

bool pool16_possible(const pool2d_args& a) {
    return cpu_has_avx512() && a.op == pool_op::max && pool2d_is_separable(a) && a.n * a.c >= 16 &&
           a.h_out * a.w_out <= pool16_max_pixels && a.h_out >= 1 && a.w_out >= 1;
}

size_t pool16_scratch_bytes(const pool2d_args& a) {
    const plane16 f = plane16_of(a.h_out, a.w_out, a.kh, a.kw, a.stride_h, a.stride_w);
    return size_t(f.floats() + 16 * a.h_out * a.w_out) * sizeof(float);
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// r[i][j] = r[j][i]: 16 vectors of 16 floats (unpacks of floats, of pairs, then 128-bit lanes
// twice). The maskz forms with full masks: the plain ones trip GCC 12's -Wmaybe-uninitialized.
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512* r) {
    const __mmask16 all = 0xffff;
    const __mmask8 all8 = 0xff;
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        const __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d a2 = _mm512_castps_pd(t[4 * i + 2]), a3 = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, a0, a2));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, a0, a2));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, a1, a3));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, a1, a3));
    }
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) {
            t[8 * h + i] = _mm512_maskz_shuffle_f32x4(all, r[8 * h + i], r[8 * h + 4 + i], 0x88);
            t[8 * h + 4 + i] = _mm512_maskz_shuffle_f32x4(all, r[8 * h + i], r[8 * h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_maskz_shuffle_f32x4(all, t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_maskz_shuffle_f32x4(all, t[i], t[8 + i], 0xdd);
    }
}

// Planes x + ch * hw (h x w, ch < 16) into the padded plane P: input (iy, ix) at pixel
// (iy + pad_top, ix + pad_left), `fill` everywhere else. Input rows or columns past the
// plane's extent are read by no output and skipped.
__attribute__((target("avx512f"))) void interleave16(const float* x, int64_t h, int64_t w, int64_t pad_top,
                                                     int64_t pad_left, const plane16& f, float fill, float* P) {
    const __m512 vf = _mm512_set1_ps(fill);
    for (int64_t r = 0; r < f.hp; ++r) {
        const int64_t iy = r - pad_top;
        const bool row_inside = iy >= 0 && iy < h;
        for (int64_t q = 0; q < f.wp; ++q)
            if (!row_inside || q < pad_left || q >= pad_left + w) _mm512_storeu_ps(P + (r * f.wp + q) * 16, vf);
    }
    // 16 pixels of the 16 planes at a time (a 7x7 plane in 4 transposes, where row by row
    // takes 7).
    const int64_t hw = h * w;
    for (int64_t p = 0, iy = 0, ix = 0; p < hw; p += 16) {
        const int64_t n = std::min<int64_t>(16, hw - p);
        __m512 v[16];
        for (int ch = 0; ch < 16; ++ch) v[ch] = _mm512_maskz_loadu_ps(first_lanes(n), x + ch * hw + p);
        transpose16(v);
        for (int64_t q = 0; q < n; ++q) {
            const int64_t py = iy + pad_top, px = ix + pad_left;
            if (py < f.hp && px < f.wp) _mm512_storeu_ps(P + (py * f.wp + px) * 16, v[q]);
            if (++ix == w) ix = 0, ++iy;
        }
    }
}

// O's n pixels of 16 channels back into the planes y + ch * n.
__attribute__((target("avx512f"))) void deinterleave16(const float* O, int64_t n, float* y) {
    for (int64_t p = 0; p < n; p += 16) {
        const int64_t m = std::min<int64_t>(16, n - p);
        __m512 v[16];
        for (int64_t q = 0; q < 16; ++q) v[q] = q < m ? _mm512_loadu_ps(O + (p + q) * 16) : _mm512_setzero_ps();
        transpose16(v);
        for (int ch = 0; ch < 16; ++ch) _mm512_mask_storeu_ps(y + ch * n + p, first_lanes(m), v[ch]);
    }
}

// Output pixels [ox, ox + NP) of row oy, all 16 channels: NP independent chains of fused
// multiply-adds over the taps in window order.
template <int NP, int KH, int KW>
__attribute__((target("avx512f"), always_inline)) inline void depthwise16_pixels(
    const conv2d_args& c, const float* P, int64_t wp, const float* W, int64_t oy, int64_t ox, __m512 vb,
    __mmask16 has_bias, __m512 lo, __m512 hi, float* O) {
    const int64_t th = KH ? KH : c.kh, tw = KW ? KW : c.kw;
    __m512 acc[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t i = 0; i < th; ++i) {
        const float* row = P + ((oy * c.stride_h + i) * wp + ox * c.stride_w) * 16;
#pragma GCC unroll 7
        for (int64_t j = 0; j < tw; ++j) {
            const __m512 wv = _mm512_loadu_ps(W + (i * tw + j) * 16);
#pragma GCC unroll 4
            for (int p = 0; p < NP; ++p)
                acc[p] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(row + (p * c.stride_w + j) * 16), acc[p]);
        }
    }
    const bool relu = c.ep.act == activation::relu, clip = c.ep.act == activation::clip;
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p)
        _mm512_storeu_ps(O + (oy * c.w_out + ox + p) * 16, bias_activation(acc[p], vb, has_bias, lo, hi, relu, clip));
}

template <int KH, int KW>
__attribute__((target("avx512f"), always_inline)) inline void depthwise16_all(const conv2d_args& c, const float* P,
                                                                             int64_t wp, const float* W, __m512 vb,
                                                                             __mmask16 has_bias, __m512 lo, __m512 hi,
                                                                             float* O) {
    for (int64_t oy = 0; oy < c.h_out; ++oy) {
        int64_t ox = 0;
        for (; ox + 4 <= c.w_out; ox += 4)
            depthwise16_pixels<4, KH, KW>(c, P, wp, W, oy, ox, vb, has_bias, lo, hi, O);
        for (; ox < c.w_out; ++ox) depthwise16_pixels<1, KH, KW>(c, P, wp, W, oy, ox, vb, has_bias, lo, hi, O);
    }
}

}  // namespace

__attribute__((target("avx512f"))) void depthwise16(const conv2d_args& c, int64_t image, int64_t g0, float* scratch) {
    const plane16 f = plane16_of(c.h_out, c.w_out, c.kh, c.kw, c.stride_h, c.stride_w);
    const int64_t hw_out = c.h_out * c.w_out, taps = c.kh * c.kw;
    float* P = scratch;             // [hp][wp][16]: the padded planes, channels innermost
    float* O = P + f.floats();      // [hw_out][16]
    float* W = O + hw_out * 16;     // [taps][16]
    interleave16(c.x + (image * c.c_in + g0) * c.h * c.w_in, c.h, c.w_in, c.pad_top, c.pad_left, f, 0.0f, P);
    // The 16 channels' weights, taps in rows: transposed 16 taps at a time.
    for (int64_t t0 = 0; t0 < taps; t0 += 16) {
        const int64_t n = std::min<int64_t>(16, taps - t0);
        __m512 v[16];
        for (int ch = 0; ch < 16; ++ch) v[ch] = _mm512_maskz_loadu_ps(first_lanes(n), c.w + (g0 + ch) * taps + t0);
        transpose16(v);
        for (int64_t t = 0; t < n; ++t) _mm512_storeu_ps(W + (t0 + t) * 16, v[t]);
    }
    const __m512 zero = _mm512_setzero_ps();
    const __m512 vb = c.bias ? _mm512_loadu_ps(c.bias + g0) : zero;
    const __mmask16 has_bias = _mm512_cmp_ps_mask(vb, zero, _CMP_NEQ_UQ);
    const __m512 lo = _mm512_set1_ps(c.ep.alpha), hi = _mm512_set1_ps(c.ep.beta);
    depthwise16_all<0, 0>(c, P, f.wp, W, vb, has_bias, lo, hi, O);  // 3x3 windows go to depthwise3x3
    deinterleave16(O, hw_out, c.y + (image * c.c_out + g0) * hw_out);
}

__attribute__((target("avx512f"))) void pool16(const pool2d_args& a, int64_t p0, float* scratch) {
    const plane16 f = plane16_of(a.h_out, a.w_out, a.kh, a.kw, a.stride_h, a.stride_w);
    const int64_t hw_out = a.h_out * a.w_out;
    float* P = scratch;         // [hp][wp][16]
    float* O = P + f.floats();  // [hw_out][16]
    interleave16(a.x + p0 * a.h * a.w, a.h, a.w, a.pad_top, a.pad_left, f, -std::numeric_limits<float>::infinity(), P);
    for (int64_t oy = 0; oy < a.h_out; ++oy)
        for (int64_t ox = 0; ox < a.w_out; ++ox) {
            const float* base = P + (oy * a.stride_h * f.wp + ox * a.stride_w) * 16;
            __m512 m = _mm512_setzero_ps();
            for (int64_t i = 0; i < a.kh; ++i) {
                const float* row = base + i * f.wp * 16;
                __m512 r = _mm512_loadu_ps(row);
                for (int64_t j = 1; j < a.kw; ++j) r = max_first(r, _mm512_loadu_ps(row + j * 16));
                m = i == 0 ? r : max_first(m, r);
            }
            _mm512_storeu_ps(O + (oy * a.w_out + ox) * 16, m);
        }
    deinterleave16(O, hw_out, a.y + p0 * hw_out);
}
#else
void depthwise16(const conv2d_args&, int64_t, int64_t, float*) {}  // never called: depthwise16_possible is false
void pool16(const pool2d_args&, int64_t, float*) {}                 // never called: pool16_possible is false
#endif

}  // namespace reefline::ml::kernels
