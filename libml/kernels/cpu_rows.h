// Row passes of the cpu kernel library shared between its files (cpu_rows.cc).
#pragma once

#include <cstdint>

#include "libml/kernels/decomp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace reefline::ml::kernels {

// Whether bias_activation (below) applies this activation in the register: none, ReLU or Clip.
// The vector paths that finish their outputs themselves take only those.
inline bool bias_activation_applies(const epilogue& ep) {
    return ep.act == activation::none || ep.act == activation::relu || ep.act == activation::clip;
}

// Whether this CPU runs AVX-512F: the row passes' vector paths are chosen by it at run time.
bool cpu_has_avx512();
// Whether this CPU's 512-bit fused multiply-adds issue at half the rate of its 256-bit ones
// (AMD's Zen 4 runs each as two 256-bit halves; Intel's server cores with two 512-bit FMA
// units issue both widths at one rate). Measured once, the first time it is asked, in about a
// millisecond: the same count of independent FMAs timed in each width, alternated, the fastest
// of several rounds each, so that the clock speed cancels. False without AVX-512.
bool cpu_fma512_half_rate();
#if defined(__x86_64__) && defined(__GNUC__)
// The first k of a vector's 16 lanes (none below 0, all from 16): the mask of a partial vector.
inline __mmask16 first_lanes(int64_t k) { return __mmask16(k >= 16 ? 0xffff : (1u << (k > 0 ? k : 0)) - 1); }
// max(m, v) as the pools' vector paths take it: the first of equal values (and a NaN m already
// holds) is kept, so every path that reduces in the same order gives the same bits.
__attribute__((target("avx512f"), always_inline)) inline __m512 max_first(__m512 m, __m512 v) {
    return _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), v);
}
// v / d, 0 where d is 0: an average pool's division by its count (divide_row).
__attribute__((target("avx512f"), always_inline)) inline __m512 divide_by_count(__m512 v, __m512 d) {
    return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), v, d);
}
// a * b and a + b on 16 lanes as separate roundings. GCC contracts _mm512_mul_ps followed by
// _mm512_add_ps into one FMA (they are plain vector operators, and C++ contracts by default),
// which the scalar loops, built for baseline x86-64, never do. The masked builtins are left
// alone; all lanes are selected, and maskz_ keeps GCC 12's "may be used uninitialized" quiet.
__attribute__((target("avx512f"), always_inline)) inline __m512 mul_exact(__m512 a, __m512 b) {
    return _mm512_maskz_mul_round_ps(0xffff, a, b, _MM_FROUND_CUR_DIRECTION);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 add_exact(__m512 a, __m512 b) {
    return _mm512_maskz_add_round_ps(0xffff, a, b, _MM_FROUND_CUR_DIRECTION);
}
// A depthwise output's epilogue as the blocks' passes apply it (epilogue_row, clip_row): bias
// then ReLU, bias then Clip [lo, hi], or else the bias only where it is not 0 (has_bias).
__attribute__((target("avx512f"), always_inline)) inline __m512 bias_activation(__m512 v, __m512 bias,
                                                                                __mmask16 has_bias, __m512 lo,
                                                                                __m512 hi, bool relu, bool clip) {
    const __mmask16 all = 0xffff;
    if (relu) return _mm512_maskz_max_ps(all, _mm512_add_ps(v, bias), _mm512_setzero_ps());
    if (clip) return _mm512_maskz_min_ps(all, hi, _mm512_maskz_max_ps(all, lo, _mm512_add_ps(v, bias)));
    return _mm512_mask_add_ps(v, has_bias, v, bias);
}
#endif
// c[j] = alpha * <a, b_j> (+ c[j] where accumulate) for the n rows b_j of B (ldb apart), k
// values each: a layer's product at batch 1 (one row of A against transposed weights), where
// the sgemm's packing of weights it reads once is pure cost: VGG-19's 25088 -> 4096 layer,
// 411 MB of weights, in blocks of 256 x 2048 took 11.5 ms against oneDNN's sgemm's 19. Returns
// false (and writes nothing) without AVX-512.
bool dot_rows(int64_t n, int64_t k, float alpha, const float* a, const float* b, int64_t ldb, bool accumulate,
              float* c);
// sum = the n floats of x added in double: 8 at a time widened into eight lanes (two chains),
// the lanes added, then the last few values. Exact wherever the values lie within 2^29 of each
// other in magnitude, as the sequential double sum is; otherwise within an ulp of a double
// before any rounding to float. Global average pools summed row by row in scalar doubles took
// 40 ns a row of 64 (Inception-v3's 2048 rows alone: 0.088 ms, so 0.019; ONNX Runtime 0.017).
// Returns false (and writes nothing) without AVX-512.
bool row_sum_lanes(const float* x, int64_t n, double& sum);
// y[l] = the sum (in double, in order; divided by n where mean) or the maximum (as std::max
// keeps it) over i < n of x[16 i + l], for the 16 interleaved lines l of a c16 tensor's pixels
// (a global pooling of one channel block): the bits of the one-line loop for each. Returns
// false (and writes nothing) without AVX-512.
bool reduce_lines16(const float* x, int64_t n, bool max, bool mean, float* y);
// o[i] = in[2 * i] for i < n.
void copy_stride2(float* o, const float* in, int64_t n);
// acc[j] += w * x[j] for j < n.
void axpy_row(float* __restrict acc, const float* __restrict x, float w, int64_t n);

}  // namespace reefline::ml::kernels
