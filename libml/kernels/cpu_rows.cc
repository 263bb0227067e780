// The cpu blocks' row passes that need no BLAS: fused activations, the batch-norm affine map,
// window sums (depthwise convolution, average pooling), separable pooling and their vector
// helpers, AVX-512 where the CPU has it (chosen at run time) and plain loops elsewhere. Built
// into every configuration of the kernel library, with or without OpenBLAS.
#include "libml/kernels/cpu_rows.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_planes16.h"
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

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__)
// o[i] = in[2 * i]: two loads and one permute per 16 outputs. The second load is masked to the
// 15 elements that are used, so it never reads past in[2 * (n - 1)].
__attribute__((target("avx512f"))) static void copy_stride2_avx512(float* o, const float* in, int64_t n) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 lo = _mm512_loadu_ps(in + 2 * i);
        const __m512 hi = _mm512_maskz_loadu_ps(__mmask16(0x7fff), in + 2 * i + 16);
        _mm512_storeu_ps(o + i, _mm512_permutex2var_ps(lo, even, hi));
    }
    if (i < n) {  // the last n - i < 16: reads in[2i .. 2(n - 1)], no further
        const int64_t need = 2 * (n - i) - 1;  // floats from in + 2i
        const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(need), in + 2 * i);
        const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(need - 16), in + 2 * i + 16);
        _mm512_mask_storeu_ps(o + i, first_lanes(n - i), _mm512_permutex2var_ps(lo, even, hi));
    }
}
#endif

// A static initialiser may run before libgcc's own CPU detection, hence the explicit init.
bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool has = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") != 0;
    }();
    return has;
#else
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// n rounds of 12 independent FMA chains (more than latency x units on any core) in one width,
// V: __m512 or __m256 (whose FMAs AVX-512 cores also run, so one target serves both).
#define RL_FMA_TARGET __attribute__((target("avx512f,fma"), always_inline)) inline
RL_FMA_TARGET __m512 fma_of(__m512 a, __m512 m, __m512 b) { return _mm512_fmadd_ps(a, m, b); }
RL_FMA_TARGET __m256 fma_of(__m256 a, __m256 m, __m256 b) { return _mm256_fmadd_ps(a, m, b); }
RL_FMA_TARGET void splat(__m512& v, float f) { v = _mm512_set1_ps(f); }
RL_FMA_TARGET void splat(__m256& v, float f) { v = _mm256_set1_ps(f); }
#undef RL_FMA_TARGET
constexpr int fma_chains = 12;
template <class V>
__attribute__((target("avx512f,fma"), noinline)) float fma_chains_of(int64_t n) {
    V a[fma_chains], m, b;
    for (int c = 0; c < fma_chains; ++c) splat(a[c], float(c));
    splat(m, 0.999f);
    splat(b, 0.001f);
    for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 12
        for (int c = 0; c < fma_chains; ++c) a[c] = fma_of(a[c], m, b);
    float sum = 0, f[sizeof(V) / sizeof(float)];
    for (int c = 0; c < fma_chains; ++c) {
        std::memcpy(f, &a[c], sizeof f);
        sum += f[0];
    }
    return sum;
}

}  // namespace
#endif

bool cpu_fma512_half_rate() {
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool half = [] {
        if (!cpu_has_avx512()) return false;
        const auto seconds = [](float (*chains)(int64_t)) {
            const auto t0 = std::chrono::steady_clock::now();
            volatile float sink = chains(20000);
            (void)sink;
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };
        double t512 = std::numeric_limits<double>::infinity(), t256 = t512;
        for (int round = 0; round < 7; ++round) {
            t512 = std::min(t512, seconds(fma_chains_of<__m512>));
            t256 = std::min(t256, seconds(fma_chains_of<__m256>));
        }
        // 2.0 where the units are 256 bits wide, 1.0-1.2 where they take 512 bits at once.
        return t512 > 1.5 * t256;
    }();
    return half;
#else
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static void reduce_lines16_avx512(const float* x, int64_t n, bool max, bool mean,
                                                                      float* y) {
    if (max) {
        __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t i = 0; i < n; ++i) {
            const __m512 v = _mm512_loadu_ps(x + 16 * i);
            m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, v, _CMP_LT_OQ), v);  // std::max(m, v)
        }
        _mm512_storeu_ps(y, m);
        return;
    }
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; ++i) {
        const __m512 v = _mm512_loadu_ps(x + 16 * i);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    if (mean) {
        const __m512d d = _mm512_set1_pd(double(n));
        lo = _mm512_div_pd(lo, d);
        hi = _mm512_div_pd(hi, d);
    }
    _mm256_storeu_ps(y, _mm512_cvtpd_ps(lo));
    _mm256_storeu_ps(y + 8, _mm512_cvtpd_ps(hi));
}
#endif

bool reduce_lines16(const float* x, int64_t n, bool max, bool mean, float* y) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!cpu_has_avx512()) return false;
    reduce_lines16_avx512(x, n, max, mean, y);
    return true;
#else
    (void)x, (void)n, (void)max, (void)mean, (void)y;
    return false;
#endif
}

void copy_stride2(float* o, const float* in, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return copy_stride2_avx512(o, in, n);
#endif
    for (int64_t i = 0; i < n; ++i) o[i] = in[2 * i];
}

// acc[j] += w * x[j]: one tap of a depthwise convolution over a run of output pixels. Vectorised
// at run time like the epilogue; the scalar loop is the fallback elsewhere.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static void axpy_row_avx512(float* acc, const float* x, float w, int64_t n) {
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

#if defined(__x86_64__) && defined(__GNUC__)
// R rows of B at a time, each streamed once with plain loads (masked loads that miss the
// cache are slower on this core) into 16-lane accumulators, summed pairwise in a fixed order
// at the end (GCC 12's _mm512_reduce_add_ps warns). Eight rows kept more loads in flight:
// VGG-19's 25088 -> 4096 layer in blocks of 256 x 2048 took 11.5 ms against 14.2 with four
// and 12.0 with sixteen.
template <int R>
__attribute__((target("avx512f"))) static void dot_rows_avx512(int64_t k, float alpha, const float* a, const float* b,
                                                               int64_t ldb, bool accumulate, float* c) {
    __m512 acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const int64_t whole = k / 16 * 16;
    for (int64_t q = 0; q < whole; q += 16) {
        const __m512 x = _mm512_loadu_ps(a + q);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(b + r * ldb + q), x, acc[r]);
    }
    if (const __mmask16 tail = first_lanes(k - whole)) {
        const __m512 x = _mm512_maskz_loadu_ps(tail, a + whole);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
            acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, b + r * ldb + whole), x, acc[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        alignas(64) float t[16];
        _mm512_store_ps(t, acc[r]);
        for (int w = 8; w >= 1; w /= 2)
            for (int l = 0; l < w; ++l) t[l] += t[l + w];
        const float v = alpha * t[0];
        c[r] = accumulate ? c[r] + v : v;
    }
}
#endif

bool dot_rows(int64_t n, int64_t k, float alpha, const float* a, const float* b, int64_t ldb, bool accumulate,
              float* c) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!cpu_has_avx512()) return false;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) dot_rows_avx512<8>(k, alpha, a, b + j * ldb, ldb, accumulate, c + j);
    for (; j < n; ++j) dot_rows_avx512<1>(k, alpha, a, b + j * ldb, ldb, accumulate, c + j);
    return true;
#else
    (void)n, (void)k, (void)alpha, (void)a, (void)b, (void)ldb, (void)accumulate, (void)c;
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// Eight lanes of doubles, two chains (row_sum_lanes).
__attribute__((target("avx512f"))) static double row_sum_avx512(const float* x, int64_t n) {
    // (maskz conversions and no _mm512_reduce_add_pd: GCC 12 warns of their undefined operands.)
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm512_add_pd(s0, _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i)));
        s1 = _mm512_add_pd(s1, _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i + 8)));
    }
    if (i + 8 <= n) {
        s0 = _mm512_add_pd(s0, _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + i)));
        i += 8;
    }
    alignas(64) double lane[8];
    _mm512_store_pd(lane, _mm512_add_pd(s0, s1));
    double sum = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (; i < n; ++i) sum += x[i];
    return sum;
}
#endif

bool row_sum_lanes(const float* x, int64_t n, double& sum) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!cpu_has_avx512()) return false;
    sum = row_sum_avx512(x, n);
    return true;
#else
    (void)x, (void)n, (void)sum;
    return false;
#endif
}

void axpy_row(float* __restrict acc, const float* __restrict x, float w, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return axpy_row_avx512(acc, x, w, n);
#endif
    for (int64_t j = 0; j < n; ++j) acc[j] += w * x[j];
}

// y[j] = y[j] / (rows * columns[j]), 0 where that count is 0: an average pool's division.
// Counts are small integers, exact in float, so the product is the count the scalar loop
// divides by and the quotient is the same.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static void divide_row_avx512(float* y, float rows, const float* columns, int64_t n) {
    const __m512 vr = _mm512_set1_ps(rows);
    const auto one = [&](__m512 v, __m512 c)
                         __attribute__((target("avx512f"))) { return divide_by_count(v, _mm512_mul_ps(vr, c)); };
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, one(_mm512_loadu_ps(y + j), _mm512_loadu_ps(columns + j)));
    if (j < n) {
        const __mmask16 m = __mmask16((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(y + j, m, one(_mm512_maskz_loadu_ps(m, y + j), _mm512_maskz_loadu_ps(m, columns + j)));
    }
}
#endif


#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"), always_inline)) inline __m512 max_ps(__m512 a, __m512 b) {
    return _mm512_maskz_max_ps(0xffff, a, b);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 min_ps(__m512 a, __m512 b) {
    return _mm512_maskz_min_ps(0xffff, a, b);
}

// The activations whose vector form below gives act()'s bits: the same operations in the same
// order, separately rounded, and the same NaN and signed-zero results (vmaxps/vminps return
// their second operand when either is NaN or both are zeros, so the input goes second).
static bool has_vector_activation(activation a) {
    switch (a) {
    case activation::none: case activation::relu: case activation::leaky_relu: case activation::clip:
    case activation::hard_sigmoid: case activation::hard_swish: case activation::gelu_erf: return true;
    default: return false;
    }
}

// erf_fast on 16 lanes.
__attribute__((target("avx512f"), always_inline)) inline __m512 erf_fast_avx512(__m512 x) {
    x = min_ps(_mm512_set1_ps(4.0f), max_ps(_mm512_set1_ps(-4.0f), x));
    const __m512 x2 = mul_exact(x, x);
    __m512 p = add_exact(mul_exact(x2, _mm512_set1_ps(-2.72614225801306e-10f)), _mm512_set1_ps(2.77068142495902e-08f));
    p = add_exact(mul_exact(x2, p), _mm512_set1_ps(-2.10102402082508e-06f));
    p = add_exact(mul_exact(x2, p), _mm512_set1_ps(-5.69250639462346e-05f));
    p = add_exact(mul_exact(x2, p), _mm512_set1_ps(-7.34990630326855e-04f));
    p = add_exact(mul_exact(x2, p), _mm512_set1_ps(-2.95459980854025e-03f));
    p = add_exact(mul_exact(x2, p), _mm512_set1_ps(-1.60960333262415e-02f));
    p = mul_exact(p, x);
    __m512 q = add_exact(mul_exact(x2, _mm512_set1_ps(-1.45660718464996e-05f)), _mm512_set1_ps(-2.13374055278905e-04f));
    q = add_exact(mul_exact(x2, q), _mm512_set1_ps(-1.68282697438203e-03f));
    q = add_exact(mul_exact(x2, q), _mm512_set1_ps(-7.37332916720468e-03f));
    q = add_exact(mul_exact(x2, q), _mm512_set1_ps(-1.42647390514189e-02f));
    return _mm512_div_ps(p, q);
}

// act() on 16 lanes, for the activations has_vector_activation names.
__attribute__((target("avx512f"), always_inline)) inline __m512 activation_avx512(__m512 x, const epilogue& ep) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    switch (ep.act) {
    case activation::relu: return max_ps(x, zero);
    case activation::leaky_relu:
        return _mm512_mask_mov_ps(mul_exact(_mm512_set1_ps(ep.alpha), x), _mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ), x);
    case activation::clip: return min_ps(_mm512_set1_ps(ep.beta), max_ps(_mm512_set1_ps(ep.alpha), x));
    case activation::hard_sigmoid:
        return min_ps(one, max_ps(zero, add_exact(mul_exact(_mm512_set1_ps(ep.alpha), x), _mm512_set1_ps(ep.beta))));
    case activation::hard_swish: {
        const __m512 v = add_exact(_mm512_div_ps(x, _mm512_set1_ps(6.0f)), _mm512_set1_ps(0.5f));
        return mul_exact(x, min_ps(one, max_ps(zero, v)));
    }
    case activation::gelu_erf:
        return mul_exact(mul_exact(_mm512_set1_ps(0.5f), x),
                         add_exact(one, erf_fast_avx512(mul_exact(x, _mm512_set1_ps(0.70710678118654752f)))));
    default: return x;
    }
}

__attribute__((target("avx512f"))) static void bias_epilogue_row_avx512(float* y, int64_t n, const float* bias,
                                                                        int64_t bias_stride, float beta,
                                                                        const epilogue& ep) {
    const __m512 vbeta = _mm512_set1_ps(beta);
    const auto one = [&](__m512 v, __m512 b) __attribute__((target("avx512f"), always_inline)) {
        if (bias) v = add_exact(v, mul_exact(vbeta, b));
        return activation_avx512(v, ep);
    };
    const __m512 same = _mm512_set1_ps(bias && bias_stride == 0 ? bias[0] : 0.0f);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(y + j, one(_mm512_loadu_ps(y + j), bias && bias_stride ? _mm512_loadu_ps(bias + j) : same));
    if (j < n) {
        const __mmask16 m = first_lanes(n - j);
        _mm512_mask_storeu_ps(y + j, m,
                              one(_mm512_maskz_loadu_ps(m, y + j), bias && bias_stride ? _mm512_maskz_loadu_ps(m, bias + j) : same));
    }
}
#endif

void bias_epilogue_row(float* y, int64_t n, const float* bias, int64_t bias_stride, float beta, const epilogue& ep) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) {
        if (has_vector_activation(ep.act)) return bias_epilogue_row_avx512(y, n, bias, bias_stride, beta, ep);
        if (bias) bias_epilogue_row_avx512(y, n, bias, bias_stride, beta, epilogue{});
        return apply_epilogue_scalar(y, n, ep);
    }
#endif
    if (bias)
        for (int64_t j = 0; j < n; ++j) y[j] += beta * bias[j * bias_stride];
    if (ep.act != activation::none) apply_epilogue_scalar(y, n, ep);
}

void apply_epilogue(float* v, int64_t n, const epilogue& ep) { bias_epilogue_row(v, n, nullptr, 0, 0.0f, ep); }

void apply_epilogue_scalar(float* v, int64_t n, const epilogue& ep) {
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
// Multiply then add, as the scalar loop does (no FMA), so both paths give the same bits.
__attribute__((target("avx512f"))) static void affine_row_avx512(float* y, const float* x, float s, float b, int64_t n,
                                                                 const epilogue& ep) {
    const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
    const auto one = [&](__m512 v) __attribute__((target("avx512f"), always_inline)) {
        return activation_avx512(add_exact(mul_exact(v, vs), vb), ep);
    };
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, one(_mm512_loadu_ps(x + j)));
    if (j < n) {
        const __mmask16 m = first_lanes(n - j);
        _mm512_mask_storeu_ps(y + j, m, one(_mm512_maskz_loadu_ps(m, x + j)));
    }
}
#endif

void affine_row(float* y, const float* x, float s, float b, int64_t n, const epilogue& ep) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512() && has_vector_activation(ep.act)) return affine_row_avx512(y, x, s, b, n, ep);
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

void divide_row(float* y, float rows, const float* columns, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return divide_row_avx512(y, rows, columns, n);
#endif
    for (int64_t j = 0; j < n; ++j) {
        const float d = rows * columns[j];
        y[j] = d != 0 ? y[j] / d : 0.0f;
    }
}

// The extents a separable pool walks: padded input columns Wn and rows Hn that the windows
// cover (ceil_mode's last windows may reach past the padding; those cells hold the identity).
namespace {
struct pool_extent {
    int64_t wn, hn, phase;  // phase: floats of each stride-2 column phase
};
pool_extent pool_extent_of(const pool2d_args& a) {
    const int64_t wn = (a.w_out - 1) * a.stride_w + a.kw, hn = (a.h_out - 1) * a.stride_h + a.kh;
    return {wn, hn, (wn + 1) / 2};
}
}  // namespace

namespace {
// pool_plane_separable's scratch.
size_t separable_scratch_bytes(const pool2d_args& a) {
    if (a.h_out < 1 || a.w_out < 1) return 0;
    const pool_extent e = pool_extent_of(a);
    const int64_t by_rows = e.wn + 2 * e.phase + e.hn * a.w_out, flat = 2 * e.hn * e.wn;
    return size_t(a.stride_w == 1 && a.stride_h == 1 ? std::max(by_rows, flat) : by_rows) * sizeof(float);
}
}  // namespace

bool pool2d_is_separable(const pool2d_args& a) {
    return !a.indices && a.d <= 1 && a.d_out <= 1 && a.kd <= 1 && a.dil_h == 1 && a.dil_w == 1 && a.kh >= 1 &&
           a.kw >= 1 && a.stride_h >= 1 && a.stride_w >= 1 && a.h_out >= 1 && a.w_out >= 1 &&
           a.w_out <= pool_max_columns &&
           int64_t(separable_scratch_bytes(a)) <= (int64_t(16) << 20);
}

size_t pool2d_scratch_bytes(const pool2d_args& a) {
    const size_t separable = separable_scratch_bytes(a);
    return pool16_possible(a) ? std::max(separable, pool16_scratch_bytes(a)) : separable;
}

namespace {

// The runs a separable pool is made of, once with AVX-512 (masked tails) and once as plain
// loops; pool_plane_body is written once against either, and each instance is flattened
// into one function: a small plane is ~100 runs of 8-35 floats, where a call apiece would
// cost more than the work.
#if defined(__x86_64__) && defined(__GNUC__)
struct avx512_runs {
    __attribute__((target("avx512f"))) static __mmask16 tail(int64_t n) { return __mmask16((1u << n) - 1); }
    __attribute__((target("avx512f"))) static void copy(float* d, const float* s, int64_t n) {
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(d + j, _mm512_loadu_ps(s + j));
        if (j < n) _mm512_mask_storeu_ps(d + j, tail(n - j), _mm512_maskz_loadu_ps(tail(n - j), s + j));
    }
    __attribute__((target("avx512f"))) static void fill(float* d, float v, int64_t n) {
        const __m512 vv = _mm512_set1_ps(v);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(d + j, vv);
        if (j < n) _mm512_mask_storeu_ps(d + j, tail(n - j), vv);
    }
    __attribute__((target("avx512f"))) static void reduce(bool is_max, float* m, const float* v, int64_t n) {
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            const __m512 mv = _mm512_loadu_ps(m + j), vv = _mm512_loadu_ps(v + j);
            _mm512_storeu_ps(m + j, is_max ? max_first(mv, vv) : _mm512_add_ps(mv, vv));
        }
        if (j < n) {
            const __mmask16 t = tail(n - j);
            const __m512 mv = _mm512_maskz_loadu_ps(t, m + j), vv = _mm512_maskz_loadu_ps(t, v + j);
            _mm512_mask_storeu_ps(m + j, t, is_max ? max_first(mv, vv) : _mm512_add_ps(mv, vv));
        }
    }
    __attribute__((target("avx512f"))) static void even(float* d, const float* s, int64_t n) { copy_stride2_avx512(d, s, n); }
    __attribute__((target("avx512f"))) static void axpy(float* acc, const float* x, float w, int64_t n) {
        axpy_row_avx512(acc, x, w, n);
    }
    // y[j] = sum over taps t in order of w[t] * src[t][j], from 0: the axpy runs' sums, with the
    // running sum held in a register across the taps instead of stored after each. NV vectors
    // at a time: independent chains of fused multiply-adds, or each tap waits out the latency
    // of the one before. Only a run's last vector may be partial, and only it is masked (a
    // mask per vector cost a mask move per load in the inner loop).
    template <int NV, bool last_partial>
    __attribute__((target("avx512f"), always_inline)) static void taps_run(float* y, const float* const* src,
                                                                           const float* w, int64_t taps, int64_t j,
                                                                           __mmask16 last) {
        __m512 v[NV];
#pragma GCC unroll 4
        for (int i = 0; i < NV; ++i) v[i] = _mm512_setzero_ps();
        for (int64_t t = 0; t < taps; ++t) {
            const __m512 wt = _mm512_set1_ps(w[t]);
            const float* s = src[t] + j;
#pragma GCC unroll 4
            for (int i = 0; i < NV; ++i) {
                const __m512 xv = last_partial && i == NV - 1 ? _mm512_maskz_loadu_ps(last, s + 16 * i)
                                                              : _mm512_loadu_ps(s + 16 * i);
                v[i] = _mm512_fmadd_ps(wt, xv, v[i]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NV; ++i) {
            if (last_partial && i == NV - 1) _mm512_mask_storeu_ps(y + j + 16 * i, last, v[i]);
            else _mm512_storeu_ps(y + j + 16 * i, v[i]);
        }
    }
    __attribute__((target("avx512f"))) static void taps(float* y, const float* const* src, const float* w, int64_t taps,
                                                        int64_t n) {
        int64_t j = 0;
        for (; j + 64 <= n; j += 64) taps_run<4, false>(y, src, w, taps, j, 0);
        const int64_t left = n - j;
        if (left <= 0) return;
        const int64_t nv = (left + 15) / 16;
        const __mmask16 last = first_lanes(left - 16 * (nv - 1));
        switch (nv * 2 + (left % 16 != 0)) {
        case 2: return taps_run<1, false>(y, src, w, taps, j, last);
        case 3: return taps_run<1, true>(y, src, w, taps, j, last);
        case 4: return taps_run<2, false>(y, src, w, taps, j, last);
        case 5: return taps_run<2, true>(y, src, w, taps, j, last);
        case 6: return taps_run<3, false>(y, src, w, taps, j, last);
        case 7: return taps_run<3, true>(y, src, w, taps, j, last);
        default: return taps_run<4, true>(y, src, w, taps, j, last);  // 49..63 left
        }
    }
};
#endif

struct plain_runs {
    static void copy(float* d, const float* s, int64_t n) { std::memcpy(d, s, size_t(n) * sizeof(float)); }
    static void fill(float* d, float v, int64_t n) { std::fill(d, d + n, v); }
    static void reduce(bool is_max, float* m, const float* v, int64_t n) {
        for (int64_t j = 0; j < n; ++j) m[j] = is_max ? (v[j] > m[j] ? v[j] : m[j]) : m[j] + v[j];
    }
    static void even(float* d, const float* s, int64_t n) {
        for (int64_t i = 0; i < n; ++i) d[i] = s[2 * i];
    }
    static void axpy(float* acc, const float* x, float w, int64_t n) {
        for (int64_t j = 0; j < n; ++j) acc[j] += w * x[j];
    }
    static void taps(float* y, const float* const* src, const float* w, int64_t taps, int64_t n) {
        fill(y, 0.0f, n);
        for (int64_t t = 0; t < taps; ++t) axpy(y, src[t], w[t], n);
    }
};

template <class R>
inline void pool_plane_body(const pool2d_args& a, const float* x, float* y, float* scratch) {
    const bool is_max = a.op == pool_op::max;
    const float identity = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
    const pool_extent e = pool_extent_of(a);
    const int64_t wo = a.w_out;
    // Input columns [c0, c1) of a padded row are the input's; the rest hold the identity.
    const int64_t c0 = std::clamp<int64_t>(a.pad_left, 0, e.wn), c1 = std::clamp<int64_t>(a.pad_left + a.w, c0, e.wn);
    const auto padded_row = [&](float* pr, int64_t r) {
        const int64_t iy = r - a.pad_top;
        if (iy < 0 || iy >= a.h) return R::fill(pr, identity, e.wn);
        R::fill(pr, identity, c0);
        R::copy(pr + c0, x + iy * a.w + (c0 - a.pad_left), c1 - c0);
        R::fill(pr + c1, identity, e.wn - c1);
    };
    if (a.stride_w == 1 && a.stride_h == 1) {
        // Stride 1 both ways (Inception's 3x3 average pools on 35x35 .. 8x8 planes): the padded
        // plane as one flat run per tap, rows wn apart; a value past a row's last window wraps
        // into the next row and is never read back into an output.
        float* p = scratch;             // [hn][wn]: the padded plane
        float* hz = p + e.hn * e.wn;    // [hn][wn]: reduced across the window's columns
        for (int64_t r = 0; r < e.hn; ++r) padded_row(p + r * e.wn, r);
        const int64_t across = e.hn * e.wn - (a.kw - 1);
        R::copy(hz, p, across);
        for (int64_t j = 1; j < a.kw; ++j) R::reduce(is_max, hz, p + j, across);
        R::fill(hz + across, identity, a.kw - 1);
        const int64_t down = a.h_out * e.wn;  // into p, which is no longer needed
        R::copy(p, hz, down);
        for (int64_t i = 1; i < a.kh; ++i) R::reduce(is_max, p, hz + i * e.wn, down);
        for (int64_t oy = 0; oy < a.h_out; ++oy) R::copy(y + oy * wo, p + oy * e.wn, wo);
        return;
    }
    float* row = scratch;             // one padded input row, [0, wn)
    float* even = row + e.wn;         // its even and odd columns (stride 2)
    float* odd = even + e.phase;
    float* h = odd + e.phase;         // [hn][w_out]: each padded row reduced across the window's columns
    // Across columns, one padded row at a time.
    for (int64_t r = 0; r < e.hn; ++r) {
        float* hr = h + r * wo;
        padded_row(row, r);
        if (a.stride_w == 1) {
            R::copy(hr, row, wo);
            for (int64_t j = 1; j < a.kw; ++j) R::reduce(is_max, hr, row + j, wo);
        } else if (a.stride_w == 2) {
            R::even(even, row, (e.wn + 1) / 2);
            R::even(odd, row + 1, e.wn / 2);
            R::copy(hr, even, wo);
            for (int64_t j = 1; j < a.kw; ++j) R::reduce(is_max, hr, (j & 1 ? odd : even) + j / 2, wo);
        } else {
            for (int64_t ox = 0; ox < wo; ++ox) {
                const float* w0 = row + ox * a.stride_w;
                float v = w0[0];
                for (int64_t j = 1; j < a.kw; ++j) v = is_max ? (w0[j] > v ? w0[j] : v) : v + w0[j];
                hr[ox] = v;
            }
        }
    }
    // Across rows: with stride 1, output row oy's taps are rows oy..oy+kh-1 of h, which is
    // exactly w_out wide, so the whole plane reduces as one run per tap.
    if (a.stride_h == 1) {
        const int64_t n = a.h_out * wo;
        R::copy(y, h, n);
        for (int64_t i = 1; i < a.kh; ++i) R::reduce(is_max, y, h + i * wo, n);
        return;
    }
    for (int64_t oy = 0; oy < a.h_out; ++oy) {
        float* yr = y + oy * wo;
        const float* first = h + oy * a.stride_h * wo;
        R::copy(yr, first, wo);
        for (int64_t i = 1; i < a.kh; ++i) R::reduce(is_max, yr, first + i * wo, wo);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"), flatten)) void pool_plane_avx512(const pool2d_args& a, const float* x, float* y,
                                                                   float* scratch) {
    pool_plane_body<avx512_runs>(a, x, y, scratch);
}
#endif

}  // namespace

void pool_plane_separable(const pool2d_args& a, const float* x, float* y, float* scratch) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return pool_plane_avx512(a, x, y, scratch);
#endif
    pool_plane_body<plain_runs>(a, x, y, scratch);
}

namespace {

int64_t ceil_div_nonneg(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

// Phase rows [row0, row0 + f.hp) of one channel's zero-padded plane into dst (plane_phases).
template <class R>
inline void fill_phases_body(const plane_window& g, const plane_phases& f, int64_t row0, const float* x, float* dst) {
    const int64_t sh = g.stride_h, sw = g.stride_w;
    for (int64_t a = 0; a < sh; ++a)
        for (int64_t b = 0; b < sw; ++b) {
            float* p = dst + (a * sw + b) * f.phase_floats();
            // Phase columns [k0, k1) are input columns (sw * k + b - pad_left); the rest padding.
            const int64_t k0 = std::min(f.wp, ceil_div_nonneg(g.pad_left - b, sw));
            const int64_t k1 = std::clamp(ceil_div_nonneg(g.pad_left + g.w - b, sw), k0, f.wp);
            for (int64_t r = 0; r < f.hp; ++r) {
                float* pr = p + r * f.wp;
                const int64_t iy = (row0 + r) * sh + a - g.pad_top;
                if (iy < 0 || iy >= g.h || k0 == k1) {
                    R::fill(pr, 0.0f, f.wp);
                    continue;
                }
                R::fill(pr, 0.0f, k0);
                const float* src = x + iy * g.w + (k0 * sw + b - g.pad_left);
                if (sw == 1) R::copy(pr + k0, src, k1 - k0);
                else R::even(pr + k0, src, k1 - k0);  // plane_phases_fit: sw <= 2
                R::fill(pr + k1, 0.0f, f.wp - k1);
            }
            R::fill(p + f.hp * f.wp, 0.0f, f.slack);
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"), flatten)) void fill_phases_avx512(const plane_window& g, const plane_phases& f,
                                                                    int64_t row0, const float* x, float* dst) {
    fill_phases_body<avx512_runs>(g, f, row0, x, dst);
}
#endif

template <class R>
inline void window_sum_plane_body(const plane_window& g, int64_t h_out, const float* x, const float* w, float* y,
                                  float* scratch) {
    const plane_phases f = plane_phases_of(g, h_out);
    float* acc = scratch + f.plane_floats();  // [h_out][wp]
    fill_phases_body<R>(g, f, 0, x, scratch);
    // The taps in window_sum's order (a tap on padding adds w * 0), in chunks of up to 16 (a
    // 3x3 or 5x5 window in one or two), over a run of n outputs whose first reads phase row
    // `row`. Narrow planes run as one flat run over every row into acc (the columns past w_out
    // wasted), then copied out; wide rows (a few vectors each) go straight into y, row by row.
    const int64_t taps = g.kh * g.kw;
    constexpr int64_t chunk = 16;
    const int64_t chunks = (taps + chunk - 1) / chunk;
    // Each tap's first read in the phases (for row 0) and weight, worked out once per plane.
    constexpr int64_t max_chunks = 4;  // windows up to 8x8 as register sums; larger ones by axpy
    const float* first[max_chunks * chunk];
    float tw[max_chunks * chunk];
    const auto tap_at = [&](int64_t i, int64_t j) { return scratch + f.tap_offset(i, j); };
    for (int64_t i = 0, t = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw && t < max_chunks * chunk; ++j, ++t) {
            first[t] = tap_at(i, j);
            tw[t] = w ? w[t] : 1.0f;
        }
    const auto run = [&](float* out, int64_t row, int64_t n) {
        const float* src[chunk];
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t t0 = c * chunk, nt = std::min(chunk, taps - t0);
            if (c >= max_chunks) {  // past 64 taps: one axpy run per tap
                for (int64_t t = t0; t < t0 + nt; ++t)
                    R::axpy(out, tap_at(t / g.kw, t % g.kw) + row * f.wp, w ? w[t] : 1.0f, n);
                continue;
            }
            for (int64_t t = 0; t < nt; ++t) src[t] = first[t0 + t] + row * f.wp;
            if (c == 0) {
                R::taps(out, src, tw, nt, n);
            } else {
                for (int64_t t = 0; t < nt; ++t) R::axpy(out, src[t], tw[t0 + t], n);
            }
        }
    };
    if (g.w_out >= 32) {
        for (int64_t oy = 0; oy < h_out; ++oy) run(y + oy * g.w_out, oy, g.w_out);
        return;
    }
    run(acc, 0, h_out * f.wp);
    for (int64_t oy = 0; oy < h_out; ++oy) R::copy(y + oy * g.w_out, acc + oy * f.wp, g.w_out);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"), flatten)) void window_sum_plane_avx512(const plane_window& g, int64_t h_out,
                                                                         const float* x, const float* w, float* y,
                                                                         float* scratch) {
    window_sum_plane_body<avx512_runs>(g, h_out, x, w, y, scratch);
}
#endif

}  // namespace

bool plane_phases_fit(const plane_window& g) {
    return g.stride_h >= 1 && g.stride_h <= 2 && g.stride_w >= 1 && g.stride_w <= 2 && g.dil_h == 1 && g.dil_w == 1 &&
           g.kh >= 1 && g.kw >= 1;
}

void fill_plane_phases(const plane_window& g, const plane_phases& f, int64_t row0, const float* x, float* dst) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return fill_phases_avx512(g, f, row0, x, dst);
#endif
    fill_phases_body<plain_runs>(g, f, row0, x, dst);
}

size_t window_sum_plane_scratch_bytes(const plane_window& g, int64_t h_out) {
    const plane_phases f = plane_phases_of(g, h_out);
    return size_t(f.plane_floats() + h_out * f.wp) * sizeof(float);
}

void window_sum_plane(const plane_window& g, int64_t h_out, const float* x, const float* w, float* y, float* scratch) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512()) return window_sum_plane_avx512(g, h_out, x, w, y, scratch);
#endif
    window_sum_plane_body<plain_runs>(g, h_out, x, w, y, scratch);
}

// ---- softmax and layer norm over contiguous rows -------------------------------------------
// A transformer spends a quarter of its time here when each element costs a double-precision
// exp (BERT-base at L=128: 12 softmaxes over 12 x 128 x 128 scores, 25 layer norms over 768
// features). The AVX-512 forms run in float with a vector exp (Cephes' expf: range reduction
// by ln 2 in two parts, a degree-6 polynomial, scalef by 2^n; within 2 ulp) and reduce their
// lanes in double; elsewhere the double-precision loops stay.
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) inline __m512 exp_ps(__m512 x) {
    const __mmask16 all = 0xffff;
    // exp underflows below -87.3 and overflows above 88.7; NaN becomes the lower bound.
    x = _mm512_maskz_min_ps(all, _mm512_maskz_max_ps(all, x, _mm512_set1_ps(-87.3365448f)), _mm512_set1_ps(88.7228390f));
    const __m512 n = _mm512_maskz_roundscale_ps(all, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(all, p, n);
}

// The sum of a vector's lanes in double, and their maximum (GCC 12's reduce intrinsics trip
// its -Wuninitialized; a row's one reduction through memory costs nothing).
__attribute__((target("avx512f"))) inline double lanes_sum(__m512 v) {
    alignas(64) float l[16];
    _mm512_store_ps(l, v);
    double s = 0;
    for (float x : l) s += x;
    return s;
}
__attribute__((target("avx512f"))) inline float lanes_max(__m512 v) {
    alignas(64) float l[16];
    _mm512_store_ps(l, v);
    float m = l[0];
    for (float x : l) m = x > m ? x : m;
    return m;
}

__attribute__((target("avx512f"))) inline __mmask16 tail_mask(int64_t n) { return __mmask16((1u << n) - 1); }

__attribute__((target("avx512f"))) void softmax_row_avx512(const float* x, float* y, int64_t n, bool log) {
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 mv = ninf;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) mv = _mm512_maskz_max_ps(0xffff, mv, _mm512_loadu_ps(x + i));
    if (i < n) mv = _mm512_maskz_max_ps(0xffff, mv, _mm512_mask_loadu_ps(ninf, tail_mask(n - i), x + i));
    const __m512 mx = _mm512_set1_ps(lanes_max(mv));
    __m512 sv = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mx));
        if (!log) _mm512_storeu_ps(y + i, e);
        sv = _mm512_add_ps(sv, e);
    }
    if (i < n) {
        const __mmask16 t = tail_mask(n - i);
        const __m512 e = _mm512_maskz_mov_ps(t, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), mx)));
        if (!log) _mm512_mask_storeu_ps(y + i, t, e);
        sv = _mm512_add_ps(sv, e);
    }
    const double sum = lanes_sum(sv);
    if (log) {
        const __m512 shift = _mm512_set1_ps(float(std::log(sum)));
        for (i = 0; i + 16 <= n; i += 16)
            _mm512_storeu_ps(y + i, _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mx), shift));
        if (i < n)
            _mm512_mask_storeu_ps(y + i, tail_mask(n - i),
                                  _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i), mx), shift));
        return;
    }
    const __m512 inv = _mm512_set1_ps(float(1.0 / sum));
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), inv));
    if (i < n)
        _mm512_mask_storeu_ps(y + i, tail_mask(n - i), _mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), y + i), inv));
}

__attribute__((target("avx512f"))) void layer_norm_row_avx512(const float* x, float* y, int64_t n, const float* scale,
                                                              const float* bias, float epsilon, float* mean_out,
                                                              float* inv_std_out) {
    __m512 sv = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) sv = _mm512_add_ps(sv, _mm512_loadu_ps(x + i));
    if (i < n) sv = _mm512_add_ps(sv, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
    const float mean = float(lanes_sum(sv) / double(n));
    const __m512 vm = _mm512_set1_ps(mean);
    __m512 qv = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
        qv = _mm512_fmadd_ps(d, d, qv);
    }
    if (i < n) {
        const __m512 d = _mm512_maskz_sub_ps(tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), vm);
        qv = _mm512_fmadd_ps(d, d, qv);
    }
    const float inv = float(1.0 / std::sqrt(lanes_sum(qv) / double(n) + epsilon));
    if (mean_out) *mean_out = mean;
    if (inv_std_out) *inv_std_out = inv;
    const __m512 vi = _mm512_set1_ps(inv);
    const auto one = [&](__m512 xv, __m512 sc, __m512 b) __attribute__((target("avx512f"))) {
        return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(xv, vm), vi), sc, b);
    };
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, one(_mm512_loadu_ps(x + i), _mm512_loadu_ps(scale + i),
                                    bias ? _mm512_loadu_ps(bias + i) : _mm512_setzero_ps()));
    if (i < n) {
        const __mmask16 t = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, t, one(_mm512_maskz_loadu_ps(t, x + i), _mm512_maskz_loadu_ps(t, scale + i),
                                            bias ? _mm512_maskz_loadu_ps(t, bias + i) : _mm512_setzero_ps()));
    }
}
#endif

}  // namespace

void softmax_row(const float* x, float* y, int64_t n, int64_t stride, bool log) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512() && n > 0 && stride == 1) return softmax_row_avx512(x, y, n, log);
#endif
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i * stride]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i * stride] - mx));
    if (!log) {
        const double inv = 1.0 / sum;
        for (int64_t i = 0; i < n; ++i) y[i * stride] = float(std::exp(double(x[i * stride] - mx)) * inv);
    } else {
        const double l = std::log(sum);
        for (int64_t i = 0; i < n; ++i) y[i * stride] = float(double(x[i * stride] - mx) - l);
    }
}

void layer_norm_row(const float* x, float* y, int64_t n, const float* scale, const float* bias, float epsilon,
                    float* mean_out, float* inv_std_out) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu_has_avx512() && n > 0) return layer_norm_row_avx512(x, y, n, scale, bias, epsilon, mean_out, inv_std_out);
#endif
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= double(n);
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= double(n);
    const float inv = float(1.0 / std::sqrt(var + epsilon));
    if (mean_out) *mean_out = float(mean);
    if (inv_std_out) *inv_std_out = inv;
    for (int64_t i = 0; i < n; ++i) y[i] = float(x[i] - mean) * inv * scale[i] + (bias ? bias[i] : 0.0f);
}

}  // namespace reefline::ml::kernels
