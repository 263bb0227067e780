// Depthwise 3x3 convolutions straight from the NCHW planes.
//
// MobileNet-v2's depthwise layers over 112x112 to 28x28 planes ran at a third of ONNX Runtime's
// speed through window_sum_plane: every plane was first copied into a zero-padded plane (split
// into its column phases at stride 2), and each output row's taps were one chain of nine
// fused multiply-adds per vector, most of the time waiting out the chain's latency. Here the
// padding is never written: a tap's vector is a masked load from the input row itself (lanes
// on padding read as 0 without touching memory, so the sums are the padded plane's), a row
// above or below the plane is a load with no lanes, and a band of output rows (six at stride
// 1, three at stride 2) is summed at once, sharing its input rows' loads and giving as many
// independent chains. At stride 2 the even and odd columns of two loads are picked out by
// permutes in the register, and loads wholly inside the plane are plain ones (masked loads
// that miss the cache ran 1.6x slower at batch 8, the planes coming from memory; at stride 1
// plain loads measured no faster). Bias and ReLU or Clip are applied before the store.
#include "libml/kernels/cpu_depthwise3x3.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <utility>

#include "libml/kernels/cpu_rows.h"

namespace reefline::ml::kernels {

bool depthwise3x3_possible(const conv2d_args& c) {
#if defined(__x86_64__) && defined(__GNUC__)
    const bool act = c.ep.act == activation::none || c.ep.act == activation::relu || c.ep.act == activation::clip;
    return cpu_has_avx512() && conv2d_ci_per_group(c) == 1 && conv2d_co_per_group(c) == 1 && c.kh == 3 &&
           c.kw == 3 && c.dil_h == 1 && c.dil_w == 1 && c.stride_h >= 1 && c.stride_h <= 2 && c.stride_w >= 1 &&
           c.stride_w <= 2 && c.pad_top >= 0 && c.pad_left >= 0 && !c.residual && act && c.h_out >= 1 &&
           c.w_out >= 1;
#else
    (void)c;
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// Everything below runs only where depthwise3x3_possible found AVX-512 (the lambdas that unroll
// the rows need the target too, which attributes do not give them).
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace {

// The lanes l of a load from column `first` + l that fall inside [0, w).
inline __mmask16 inside_lanes(int64_t first, int64_t w) {
    return __mmask16(first_lanes(w - first) & ~first_lanes(-first));
}

// One vector column's loads: their masks (for a row inside the plane) and first column.
struct column_loads {
    int64_t first;      // the column of lane 0 of the first load
    __mmask16 mask[4];  // stride 1: taps 0..2; stride 2: columns first + {0, 16, 2, 18}
    __mmask16 store;    // the output lanes inside w_out
    bool full;          // every load's every lane inside the row
};

struct plane_args {
    const float* x;  // the input plane, h x w
    float* y;        // the output plane, h_out x w_out
    int64_t h, w, w_out, pad_top;
};

// The epilogue as the blocks' passes apply it (epilogue_16, clip_16), in the register.
struct plane_epilogue {
    __m512 bias, lo, hi;
    __mmask16 has_bias;
    activation act;
    __attribute__((always_inline)) __m512 operator()(__m512 v) const {
        const __mmask16 all = 0xffff;
        switch (act) {
        case activation::relu: return _mm512_maskz_max_ps(all, _mm512_add_ps(v, bias), _mm512_setzero_ps());
        case activation::clip: return _mm512_maskz_min_ps(all, hi, _mm512_maskz_max_ps(all, lo, _mm512_add_ps(v, bias)));
        default: return _mm512_mask_add_ps(v, has_bias, v, bias);  // the epilogue adds only a bias that is not 0
        }
    }
};

// A row's three tap vectors for one vector column (zeros for a row outside the plane).
template <int SW, bool FULL>
__attribute__((always_inline)) inline void row_taps(const column_loads& cl, const float* row, __mmask16 valid,
                                                    __m512& t0, __m512& t1, __m512& t2) {
    const float* p = row + cl.first;
    const auto load = [&](int q, const float* at) {
        if constexpr (FULL) return _mm512_loadu_ps(at);
        else return _mm512_maskz_loadu_ps(cl.mask[q] & valid, at);
    };
    if constexpr (SW == 1) {
        t0 = load(0, p);
        t1 = load(1, p + 1);
        t2 = load(2, p + 2);
    } else {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        const __m512 lo = load(0, p), hi = load(1, p + 16), lo2 = load(2, p + 2), hi2 = load(3, p + 18);
        t0 = _mm512_permutex2var_ps(lo, even, hi);
        t1 = _mm512_permutex2var_ps(lo, odd, hi);
        t2 = _mm512_permutex2var_ps(lo2, even, hi2);
    }
}

// Calls f(std::integral_constant<int, i>) for i in [0, N), unrolled at compile time (GCC at
// -O2 left the row loop rolled, with the taps and weights in memory).
template <int N, class F>
__attribute__((always_inline)) inline void unrolled(F&& f) {
    [&]<int... i>(std::integer_sequence<int, i...>) { (f(std::integral_constant<int, i>{}), ...); }(
        std::make_integer_sequence<int, N>{});
}

// R output rows from oy0, one vector column: input rows oy0 * SH - pad_top + r for r in
// [0, (R - 1) * SH + 3), each loaded once and added into every output row whose window holds
// it, taps in window order (row i, then column j) for each output, from 0.
template <int SH, int SW, int R, bool FULL = false>
__attribute__((always_inline)) inline void rows_column(const plane_args& a, const __m512 (&wt)[9],
                                                       const plane_epilogue& ep, const column_loads& cl, int64_t oy0,
                                                       int64_t ox0) {
    __m512 acc[R];
    unrolled<R>([&](auto k) { acc[k] = _mm512_setzero_ps(); });
    unrolled<(R - 1) * SH + 3>([&](auto r) {
        const int64_t iy = oy0 * SH - a.pad_top + r;
        const bool inside = iy >= 0 && iy < a.h;
        __m512 t[3];
        row_taps<SW, FULL>(cl, a.x + (inside ? iy : 0) * a.w, inside ? __mmask16(0xffff) : __mmask16(0), t[0], t[1], t[2]);
        unrolled<R>([&](auto k) {
            constexpr int i = int(r) - int(k) * SH;
            if constexpr (i >= 0 && i <= 2)
                unrolled<3>([&](auto j) { acc[k] = _mm512_fmadd_ps(wt[i * 3 + j], t[j], acc[k]); });
        });
    });
    unrolled<R>([&](auto k) {
        float* out = a.y + (oy0 + k) * a.w_out + ox0;
        if (cl.store == 0xffff) _mm512_storeu_ps(out, ep(acc[k]));
        else _mm512_mask_storeu_ps(out, cl.store, ep(acc[k]));
    });
}

template <int SH, int SW>
void plane_3x3(const plane_args& a, const float* w, const plane_epilogue& ep, int64_t h_out, int64_t pad_left) {
    __m512 wt[9];
    for (int t = 0; t < 9; ++t) wt[t] = _mm512_set1_ps(w[t]);
    // Rows outermost, so that the input is read in order, each row once per band (a vector
    // column at a time down the plane ran 2.2x slower at batch 8, the planes coming from memory).
    constexpr int64_t max_columns = 16;  // rows up to 256 outputs wide at a time
    column_loads cols[max_columns];
    const int64_t ncols = (a.w_out + 15) / 16;
    for (int64_t v0 = 0; v0 < ncols; v0 += max_columns) {
        const int64_t nv = ncols - v0 < max_columns ? ncols - v0 : max_columns;
        for (int64_t v = 0; v < nv; ++v) {
            const int64_t ox0 = (v0 + v) * 16;
            column_loads& cl = cols[v];
            cl.first = ox0 * SW - pad_left;
            if constexpr (SW == 1) {
                for (int j = 0; j < 3; ++j) cl.mask[j] = inside_lanes(cl.first + j, a.w);
            } else {
                const int64_t off[4] = {0, 16, 2, 18};
                for (int q = 0; q < 4; ++q) cl.mask[q] = inside_lanes(cl.first + off[q], a.w);
            }
            cl.store = first_lanes(a.w_out - ox0);
            cl.full = (cl.mask[0] & cl.mask[1] & cl.mask[2] & cl.mask[SW == 1 ? 2 : 3]) == 0xffff;
        }
        // Six output rows at a time at stride 1 (eight rows of loads), three at stride 2
        // (seven): measured against 2, 4 and 8 on MobileNet-v2's layers, 112x112 to 7x7.
        constexpr int band = SH == 1 ? 6 : 3;
        int64_t oy = 0;
        for (; oy + band <= h_out; oy += band) {
            const bool inside = oy * SH - a.pad_top >= 0 && (oy + band - 1) * SH - a.pad_top + 2 < a.h;
            for (int64_t v = 0; v < nv; ++v) {
                const int64_t ox0 = (v0 + v) * 16;
                if (SW == 2 && inside && cols[v].full) rows_column<SH, SW, band, true>(a, wt, ep, cols[v], oy, ox0);
                else rows_column<SH, SW, band>(a, wt, ep, cols[v], oy, ox0);
            }
        }
        for (; oy + 2 <= h_out; oy += 2)
            for (int64_t v = 0; v < nv; ++v) rows_column<SH, SW, 2>(a, wt, ep, cols[v], oy, (v0 + v) * 16);
        if (oy < h_out)
            for (int64_t v = 0; v < nv; ++v) rows_column<SH, SW, 1>(a, wt, ep, cols[v], oy, (v0 + v) * 16);
    }
}

}  // namespace

void depthwise3x3(const conv2d_args& c, int64_t image, int64_t group) {
    plane_args a;
    a.x = c.x + (image * c.c_in + group) * c.h * c.w_in;
    a.y = c.y + (image * c.c_out + group) * c.h_out * c.w_out;
    a.h = c.h;
    a.w = c.w_in;
    a.w_out = c.w_out;
    a.pad_top = c.pad_top;
    plane_epilogue ep;
    const float b = c.bias ? c.bias[group] : 0.0f;
    ep.bias = _mm512_set1_ps(b);
    ep.has_bias = b != 0.0f ? __mmask16(0xffff) : __mmask16(0);
    ep.lo = _mm512_set1_ps(c.ep.alpha);
    ep.hi = _mm512_set1_ps(c.ep.beta);
    ep.act = c.ep.act;
    const float* w = c.w + group * 9;
    switch (c.stride_h * 2 + c.stride_w) {
    case 3: return plane_3x3<1, 1>(a, w, ep, c.h_out, c.pad_left);
    case 4: return plane_3x3<1, 2>(a, w, ep, c.h_out, c.pad_left);
    case 5: return plane_3x3<2, 1>(a, w, ep, c.h_out, c.pad_left);
    default: return plane_3x3<2, 2>(a, w, ep, c.h_out, c.pad_left);
    }
}
#pragma GCC pop_options
#else
void depthwise3x3(const conv2d_args&, int64_t, int64_t) {}  // never called: depthwise3x3_possible is false
#endif

}  // namespace reefline::ml::kernels
