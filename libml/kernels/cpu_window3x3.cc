// 3x3 windows straight from the NCHW planes: depthwise convolutions, max and average pools.
//
// MobileNet-v2's depthwise layers over 112x112 to 28x28 planes ran at a third of ONNX Runtime's
// speed through window_sum_plane: every plane was first copied into a zero-padded plane (split
// into its column phases at stride 2), and each output row's taps were one chain of nine
// fused multiply-adds per vector, most of the time waiting out the chain's latency; the pools
// of ResNet-50, DenseNet and Inception-v3 likewise copied each padded plane and reduced it in
// passes through memory. Here the padding is never written: a tap's vector is a masked load
// from the input row itself (lanes on padding read as the padding value without touching
// memory, so the results are the padded plane's), a row above or below the plane is a load
// with no lanes, and a band of output rows (six at stride 1, three at stride 2) is computed
// at once, sharing its input rows' loads and giving as many independent chains. At stride 2
// the even and odd columns of two loads are picked out by permutes in the register. Loads
// wholly inside the plane are plain ones: masked loads that miss the cache ran 1.6x slower
// (MobileNet-v2's stride-2 layer at batch 8) and 1.25x (Inception-v3's 35x35 average pools at
// batch 8), the planes coming from memory.
//
// Each output is computed by the same operations in the same order as the per-plane paths
// (window_sum_plane and the blocks' epilogue passes; pool_plane_separable and divide_row), so
// the results are the same bit for bit.
#include "libml/kernels/cpu_window3x3.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <limits>
#include <utility>

#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

#if defined(__x86_64__) && defined(__GNUC__)
namespace {
// A KxK window (K = 2 or 3; depthwise convolutions 3 only) at strides 1 and 2.
bool window_fits(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                 int64_t h_out, int64_t w_out) {
    return cpu_has_avx512() && kh == kw && (kh == 2 || kh == 3) && dh == 1 && dw == 1 && sh >= 1 && sh <= 2 &&
           sw >= 1 && sw <= 2 && pt >= 0 && pl >= 0 && h_out >= 1 && w_out >= 1;
}
}  // namespace
#endif

bool depthwise3x3_possible(const conv2d_args& c) {
#if defined(__x86_64__) && defined(__GNUC__)
    return conv2d_ci_per_group(c) == 1 && conv2d_co_per_group(c) == 1 && !c.residual && bias_activation_applies(c.ep) &&
           c.kh == 3 &&
           window_fits(c.kh, c.kw, c.stride_h, c.stride_w, c.dil_h, c.dil_w, c.pad_top, c.pad_left, c.h_out,
                          c.w_out);
#else
    (void)c;
    return false;
#endif
}

bool pool_window_possible(const pool2d_args& a) {
#if defined(__x86_64__) && defined(__GNUC__)
    return pool2d_is_separable(a) && window_fits(a.kh, a.kw, a.stride_h, a.stride_w, a.dil_h, a.dil_w, a.pad_top,
                                                    a.pad_left, a.h_out, a.w_out);
#else
    (void)a;
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// Everything below runs only where the *_possible checks found AVX-512 (the lambdas that
// unroll the rows need the target too, which GCC's function attributes do not give them).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
namespace {

// The lanes l of a load from column `first` + l that fall inside [0, w).
inline __mmask16 inside_lanes(int64_t first, int64_t w) {
    return __mmask16(first_lanes(w - first) & ~first_lanes(-first));
}

// One vector column's loads: their masks (for a row inside the plane) and first column.
struct column_loads {
    int64_t first;      // the column of lane 0 of the first load
    __mmask16 mask[3];  // stride 1: taps 0..2; stride 2: columns first + {0, 16, 17} (of the last, lane 15 is read)
    __mmask16 store;    // the output lanes inside w_out
    bool full;          // every load's every lane inside the row
};

struct plane_args {
    const float* x;  // the input plane, h x w
    float* y;        // the output plane, h_out x w_out
    int64_t h, w, w_out, pad_top;
};

// Calls f(std::integral_constant<int, i>) for i in [0, N), unrolled at compile time (GCC at
// -O2 left the row loop rolled, with the taps and weights in memory).
template <int N, class F>
__attribute__((always_inline)) inline void unrolled(F&& f) {
    [&]<int... i>(std::integer_sequence<int, i...>) { (f(std::integral_constant<int, i>{}), ...); }(
        std::make_integer_sequence<int, N>{});
}

// A row's K tap vectors for one vector column (`pad` on lanes outside the plane).
template <int SW, int K, bool FULL>
__attribute__((always_inline)) inline void row_taps(const column_loads& cl, const float* row, __mmask16 valid,
                                                    __m512 pad, __m512& t0, __m512& t1, __m512& t2) {
    const float* p = row + cl.first;
    const auto load = [&](int q, const float* at) {
        if constexpr (FULL) return _mm512_loadu_ps(at);
        else return _mm512_mask_loadu_ps(pad, cl.mask[q] & valid, at);
    };
    if constexpr (SW == 1) {
        t0 = load(0, p);
        t1 = load(1, p + 1);
        if constexpr (K == 3) t2 = load(2, p + 2);
    } else {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        const __m512 lo = load(0, p), hi = load(1, p + 16);
        t0 = _mm512_permutex2var_ps(lo, even, hi);
        t1 = _mm512_permutex2var_ps(lo, odd, hi);
        if constexpr (K == 3) {
            // The third tap's lanes 0..14 are the even columns 2..30 of the same two loads; only
            // lane 15 (column 32) is new, one float, where two more vector loads fetched it (the
            // loads bound these rows on an AMD EPYC core: MobileNet-v2's stride-2 layers alone,
            // hot, the two ways alternated in one process, 1.08x faster on 112x112 planes and
            // 1.16-1.18x on 56x56 to 14x14, the same bits).
            const __m512i next_even = _mm512_setr_epi32(2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 0);
            const __m512 t = _mm512_permutex2var_ps(lo, next_even, hi);
            if constexpr (FULL) t2 = _mm512_mask_broadcastss_ps(t, __mmask16(0x8000), _mm_load_ss(p + 32));
            else
                t2 = _mm512_mask_broadcastss_ps(t, __mmask16(0x8000),
                                                _mm_mask_load_ss(_mm512_castps512_ps128(pad),
                                                                 __mmask8((cl.mask[2] & valid) >> 15), p + 32));
        }
    }
}

// ---- what a window computes: the reductions ----------------------------------------------
// pad: the padding's value. row<K>(t0, t1, t2): what an input row contributes (t2 unused by a
// 2x2 window) (computed once,
// shared by the band's outputs). add<i>(acc, row): the row as the window's row i, in order
// (acc starts from start()). finish(acc, oy, ox0, lanes): the output vector (its lanes inside
// w_out).

// Depthwise: taps in window order (row i, then column j), fused multiply-adds from 0, then
// the epilogue as the blocks' passes apply it (epilogue_16, clip_16).
struct depthwise_sum {
    __m512 wt[9];
    __m512 bias, lo, hi;
    __mmask16 has_bias;
    bool relu, clip;
    struct taps {
        __m512 t[3];
    };
    __attribute__((always_inline)) __m512 pad() const { return _mm512_setzero_ps(); }
    __attribute__((always_inline)) __m512 start() const { return _mm512_setzero_ps(); }
    template <int K>
    __attribute__((always_inline)) taps row(__m512 t0, __m512 t1, __m512 t2) const {
        static_assert(K == 3);
        return {{t0, t1, t2}};
    }
    template <int i>
    __attribute__((always_inline)) void add(__m512& acc, const taps& r) const {
        acc = _mm512_fmadd_ps(wt[i * 3 + 0], r.t[0], acc);
        acc = _mm512_fmadd_ps(wt[i * 3 + 1], r.t[1], acc);
        acc = _mm512_fmadd_ps(wt[i * 3 + 2], r.t[2], acc);
    }
    __attribute__((always_inline)) __m512 finish_flat(__m512 v, int64_t) const { return finish(v, 0, 0, 0); }
    __attribute__((always_inline)) __m512 finish(__m512 v, int64_t, int64_t, __mmask16) const {
        return bias_activation(v, bias, has_bias, lo, hi, relu, clip);
    }
};

// Max pool, as pool_plane_separable reduces: across a row's window columns from the first,
// then across the window's rows from the first; of equal values (and a NaN already held) the
// first is kept. Padding is -inf.
struct max_pool {
    __attribute__((always_inline)) __m512 pad() const {
        return _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    }
    __attribute__((always_inline)) __m512 start() const { return _mm512_setzero_ps(); }  // row 0 replaces it
    template <int K>
    __attribute__((always_inline)) __m512 row(__m512 t0, __m512 t1, __m512 t2) const {
        return K == 2 ? max_first(t0, t1) : max_first(max_first(t0, t1), t2);
    }
    template <int i>
    __attribute__((always_inline)) void add(__m512& acc, __m512 r) const {
        acc = i == 0 ? r : max_first(acc, r);
    }
    __attribute__((always_inline)) __m512 finish(__m512 v, int64_t, int64_t, __mmask16) const { return v; }
    __attribute__((always_inline)) __m512 finish_flat(__m512 v, int64_t) const { return v; }
};

// Average pool: sums across the columns, then the rows, in order, divided as divide_row does
// (by the rows counted times the columns counted; 0 where a window counts nothing).
struct average_pool {
    const pool2d_args* a;
    const float* columns;  // each output column's count
    const float* divisors;  // flat planes: each output's rows counted times columns counted
    __attribute__((always_inline)) __m512 pad() const { return _mm512_setzero_ps(); }
    __attribute__((always_inline)) __m512 start() const { return _mm512_setzero_ps(); }
    template <int K>
    __attribute__((always_inline)) __m512 row(__m512 t0, __m512 t1, __m512 t2) const {
        return K == 2 ? _mm512_add_ps(t0, t1) : _mm512_add_ps(_mm512_add_ps(t0, t1), t2);
    }
    template <int i>
    __attribute__((always_inline)) void add(__m512& acc, __m512 r) const {
        acc = i == 0 ? r : _mm512_add_ps(acc, r);
    }
    __attribute__((always_inline)) __m512 finish(__m512 v, int64_t oy, int64_t ox0, __mmask16 lanes) const {
        const __m512 rows = _mm512_set1_ps(float(pool_window_count(*a, oy, a->stride_h, a->pad_top, a->pad_bottom,
                                                                   a->kh, a->h)));
        return divide_by_count(v, _mm512_mul_ps(rows, _mm512_maskz_loadu_ps(lanes, columns + ox0)));
    }
    __attribute__((always_inline)) __m512 finish_flat(__m512 v, int64_t p0) const {
        return divide_by_count(v, _mm512_loadu_ps(divisors + p0));
    }
};

// R output rows from oy0, one vector column of a KxK window: input rows oy0 * SH - pad_top + r
// for r in [0, (R - 1) * SH + K), each loaded once and added into every output row whose window
// holds it, as the window's row r - k * SH of output row oy0 + k.
template <int K, int SH, int SW, int R, bool FULL, class W>
__attribute__((always_inline)) inline void rows_column(const plane_args& a, const W& op, const column_loads& cl,
                                                       int64_t oy0, int64_t ox0) {
    __m512 acc[R];
    unrolled<R>([&](auto k) { acc[k] = op.start(); });
    const __m512 pad = op.pad();
    unrolled<(R - 1) * SH + K>([&](auto r) {
        const int64_t iy = oy0 * SH - a.pad_top + r;
        const bool inside = iy >= 0 && iy < a.h;
        __m512 t0, t1, t2 = pad;  // t2: a 2x2 window's row has two taps
        row_taps<SW, K, FULL>(cl, a.x + (inside ? iy : 0) * a.w, inside ? __mmask16(0xffff) : __mmask16(0), pad, t0, t1,
                              t2);
        const auto row = op.template row<K>(t0, t1, t2);
        unrolled<R>([&](auto k) {
            constexpr int i = int(r) - int(k) * SH;
            if constexpr (i >= 0 && i < K) op.template add<i>(acc[k], row);
        });
    });
    unrolled<R>([&](auto k) {
        float* out = a.y + (oy0 + k) * a.w_out + ox0;
        const __m512 v = op.finish(acc[k], oy0 + k, ox0, cl.store);
        if (cl.store == 0xffff) _mm512_storeu_ps(out, v);
        else _mm512_mask_storeu_ps(out, cl.store, v);
    });
}

template <int K, int SH, int SW, class W>
__attribute__((noinline)) void plane_window(const plane_args& a, const W& op_in, int64_t h_out, int64_t pad_left) {
    const W op = op_in;  // a local copy the compiler keeps in registers (stores to y may alias op_in)
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
            // The loads row_taps makes: stride 1, one per tap; stride 2, two (and, for the
            // third tap, lane 15 of a load from column 17).
            constexpr int loads = SW == 1 ? K : K == 3 ? 3 : 2;
            const int64_t off[3] = {0, SW == 1 ? 1 : 16, SW == 1 ? 2 : 17};
            // (At stride 2 the third mask's lanes 0..14 are columns the second load covers, so
            // `full` asks only that column first + 32 be inside too.)
            __mmask16 all = 0xffff;
            for (int q = 0; q < 3; ++q) {
                cl.mask[q] = q < loads ? inside_lanes(cl.first + off[q], a.w) : __mmask16(0);
                if (q < loads) all &= cl.mask[q];
            }
            cl.store = first_lanes(a.w_out - ox0);
            cl.full = all == 0xffff;
        }
        // Six output rows at a time at stride 1 (eight rows of loads), three at stride 2
        // (seven): measured against 2, 4 and 8 on MobileNet-v2's layers, 112x112 to 7x7.
        constexpr int band = SH == 1 ? 6 : 3;
        int64_t oy = 0;
        for (; oy + band <= h_out; oy += band) {
            const bool inside = oy * SH - a.pad_top >= 0 && (oy + band - 1) * SH - a.pad_top + K - 1 < a.h;
            for (int64_t v = 0; v < nv; ++v) {
                const int64_t ox0 = (v0 + v) * 16;
                if (inside && cols[v].full) rows_column<K, SH, SW, band, true>(a, op, cols[v], oy, ox0);
                else rows_column<K, SH, SW, band, false>(a, op, cols[v], oy, ox0);
            }
        }
        for (; oy + 2 <= h_out; oy += 2)
            for (int64_t v = 0; v < nv; ++v) rows_column<K, SH, SW, 2, false>(a, op, cols[v], oy, (v0 + v) * 16);
        if (oy < h_out)
            for (int64_t v = 0; v < nv; ++v) rows_column<K, SH, SW, 1, false>(a, op, cols[v], oy, (v0 + v) * 16);
    }
}

// ---- narrow planes of the same size out as in, at stride 1 ----------------------------------
// A 7x7 plane (MobileNet's last depthwise layers), 17x17 or 8x8 (Inception's average pools)
// fills half a vector per row, or 17 lanes of two: row by row, most lanes idle. Here the
// output runs flat over the plane, 16 outputs per vector across rows, each tap a masked load at
// a fixed offset (input and output share the layout: tap (i, j) of output p is input
// p + (i - 1) * w + j - 1), with per-vector masks for the lanes whose tap falls off the plane's
// edges, worked out once per block of planes.
struct flat_geometry {
    static constexpr int64_t max_vectors = 256;  // planes up to 4096 outputs
    int64_t w, vectors;
    __mmask16 tap[max_vectors][9];  // lanes whose tap (i, j) lies inside the plane
    __mmask16 tail;                  // the last vector's lanes inside the plane
};

bool flat_fits(int64_t h, int64_t w, int64_t h_out, int64_t w_out, int64_t sh, int64_t sw, int64_t pt, int64_t pl) {
    // Where the bands would leave 40% of the lanes idle (7, 8 or 17 wide): elsewhere the bands,
    // loading each input row once for several outputs, are faster (14x14: 0.039 ms flat 0.050
    // for 576 planes; 28x28: 0.044 flat 0.066 for 192; 7x7: 0.043 flat 0.029 for 960).
    const bool idle_lanes = w * 10 < 6 * 16 * ((w + 15) / 16);
    return sh == 1 && sw == 1 && pt == 1 && pl == 1 && h_out == h && w_out == w && idle_lanes &&
           h * w <= flat_geometry::max_vectors * 16;
}

// Once per block: each lane's row and column followed as p advances (no division per lane
// and tap), the taps' masks as row mask AND column mask.
void flat_geometry_of(int64_t h, int64_t w, flat_geometry& g) {
    g.w = w;
    g.vectors = (h * w + 15) / 16;
    g.tail = first_lanes(h * w - (g.vectors - 1) * 16);
    int64_t oy = 0, ox = 0;  // of output p
    for (int64_t v = 0; v < g.vectors; ++v) {
        uint32_t row[3] = {0, 0, 0}, col[3] = {0, 0, 0};  // lanes whose tap row i / column j is inside
        for (int l = 0; l < 16 && oy < h; ++l) {
            for (int k = 0; k < 3; ++k) {
                if (oy + k - 1 >= 0 && oy + k - 1 < h) row[k] |= 1u << l;
                if (ox + k - 1 >= 0 && ox + k - 1 < w) col[k] |= 1u << l;
            }
            if (++ox == w) ox = 0, ++oy;
        }
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j) g.tap[v][i * 3 + j] = __mmask16(row[i] & col[j]);
    }
}

// Rows, then columns within a row: the same taps in the same order as the bands.
template <class W>
__attribute__((noinline)) void flat_plane_3x3(const float* x, float* y, const flat_geometry& g, const W& op_in) {
    const W op = op_in;  // a local copy the compiler keeps in registers (stores to y may alias op_in)
    const __m512 pad = op.pad();
    for (int64_t v = 0; v < g.vectors; ++v) {
        const int64_t p0 = v * 16;
        const __mmask16* m = g.tap[v];
        __m512 acc = op.start();
        unrolled<3>([&](auto i) {
            const float* r = x + p0 + (int64_t(i) - 1) * g.w;
            const auto row = op.template row<3>(_mm512_mask_loadu_ps(pad, m[i * 3 + 0], r - 1),
                                                _mm512_mask_loadu_ps(pad, m[i * 3 + 1], r),
                                                _mm512_mask_loadu_ps(pad, m[i * 3 + 2], r + 1));
            op.template add<i>(acc, row);
        });
        const __m512 out = op.finish_flat(acc, p0);
        if (v + 1 < g.vectors) _mm512_storeu_ps(y + p0, out);
        else _mm512_mask_storeu_ps(y + p0, g.tail, out);
    }
}

template <int K, class W>
void plane_window_strided(const plane_args& a, const W& op, int64_t h_out, int64_t stride_h, int64_t stride_w,
                          int64_t pad_left) {
    switch (stride_h * 2 + stride_w) {
    case 3: return plane_window<K, 1, 1>(a, op, h_out, pad_left);
    case 4: return plane_window<K, 1, 2>(a, op, h_out, pad_left);
    case 5: return plane_window<K, 2, 1>(a, op, h_out, pad_left);
    default: return plane_window<K, 2, 2>(a, op, h_out, pad_left);
    }
}

}  // namespace

bool depthwise3x3(const conv2d_args& c, int64_t image, int64_t g0, int64_t g1, const gpu::block_context& ctx) {
    return depthwise3x3_planes(c, c.x + (image * c.c_in + g0) * c.h * c.w_in, image, g0, g1, ctx);
}

bool depthwise3x3_planes(const conv2d_args& c, const float* x, int64_t image, int64_t g0, int64_t g1,
                         const gpu::block_context& ctx) {
    const bool flat = flat_fits(c.h, c.w_in, c.h_out, c.w_out, c.stride_h, c.stride_w, c.pad_top, c.pad_left);
    flat_geometry fg;
    if (flat) flat_geometry_of(c.h, c.w_in, fg);
    for (int64_t group = g0; group < g1; ++group) {
        if (group > g0 && ctx.preempted()) return false;
        const plane_args a{x + (group - g0) * c.h * c.w_in, c.y + (image * c.c_out + group) * c.h_out * c.w_out, c.h,
                           c.w_in, c.w_out, c.pad_top};
        depthwise_sum op;
        const float* w = c.w + group * 9;
        for (int t = 0; t < 9; ++t) op.wt[t] = _mm512_set1_ps(w[t]);
        const float b = c.bias ? c.bias[group] : 0.0f;
        op.bias = _mm512_set1_ps(b);
        op.has_bias = b != 0.0f ? __mmask16(0xffff) : __mmask16(0);
        op.lo = _mm512_set1_ps(c.ep.alpha);
        op.hi = _mm512_set1_ps(c.ep.beta);
        op.relu = c.ep.act == activation::relu;
        op.clip = c.ep.act == activation::clip;
        if (flat) flat_plane_3x3(a.x, a.y, fg, op);
        else plane_window_strided<3>(a, op, c.h_out, c.stride_h, c.stride_w, c.pad_left);
    }
    return true;
}

bool pool_window(const pool2d_args& p, int64_t p0, int64_t p1, const float* columns, const gpu::block_context& ctx) {
    const bool flat = p.kh == 3 && flat_fits(p.h, p.w, p.h_out, p.w_out, p.stride_h, p.stride_w, p.pad_top, p.pad_left);
    flat_geometry fg;
    float divisors[flat_geometry::max_vectors * 16];
    if (flat) flat_geometry_of(p.h, p.w, fg);
    if (flat && p.op == pool_op::average) {
        for (int64_t oy = 0, q = 0; oy < p.h_out; ++oy) {
            const float rows = float(pool_window_count(p, oy, p.stride_h, p.pad_top, p.pad_bottom, p.kh, p.h));
            for (int64_t ox = 0; ox < p.w_out; ++ox, ++q) divisors[q] = rows * columns[ox];
        }
        for (int64_t q = p.h_out * p.w_out; q < fg.vectors * 16; ++q) divisors[q] = 0.0f;
    }
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (plane > p0 && ctx.preempted()) return false;
        const plane_args a{p.x + plane * p.h * p.w, p.y + plane * p.h_out * p.w_out, p.h, p.w, p.w_out, p.pad_top};
        const auto run = [&](const auto& op) {
            if (flat) flat_plane_3x3(a.x, a.y, fg, op);
            else if (p.kh == 2) plane_window_strided<2>(a, op, p.h_out, p.stride_h, p.stride_w, p.pad_left);
            else plane_window_strided<3>(a, op, p.h_out, p.stride_h, p.stride_w, p.pad_left);
        };
        if (p.op == pool_op::max) run(max_pool{});
        else run(average_pool{&p, columns, divisors});
    }
    return true;
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
// Never called: the *_possible checks are false.
bool depthwise3x3(const conv2d_args&, int64_t, int64_t, int64_t, const gpu::block_context&) { return false; }
bool depthwise3x3_planes(const conv2d_args&, const float*, int64_t, int64_t, int64_t, const gpu::block_context&) {
    return false;
}
bool pool_window(const pool2d_args&, int64_t, int64_t, const float*, const gpu::block_context&) { return false; }
#endif

}  // namespace reefline::ml::kernels
