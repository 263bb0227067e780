// Kernels of the channel-blocked layout (cpu_c16.h): convolution, pooling and batch norm.
//
// Convolution. A block is one image's tile of output rows and output channels. Where the
// window reaches past the input (padding), the block first copies the input rows it reads into
// its scratch with zero borders, so that every tap of every output is a plain load. Then, for
// each group of up to four output-channel blocks (64 channels), in chunks of input channels
// with a check point before each, each output row (or, for 1x1 layers at stride 1, the
// block's pixels as one run) is covered by register tiles of FB blocks x PX pixels (4 x 6,
// 3 x 8, 2 x 12, 1 x 16: 24 accumulators or fewer): for each input channel of the chunk and
// each tap, FB vector loads of the packed filters and PX broadcasts of input values feed FB x
// PX fused multiply-adds. The group's filters for one chunk (64 channels x 16 inputs x 9 taps,
// or x 128 inputs at 1x1: 36 or 32 KB) stay in L1 while the rows go by, as in ONNX Runtime's
// NCHWc kernels (MLAS). A chunk after the first adds to the partial sums the block left in
// its output; the last applies bias, residual and activation before its store. Each output
// is the sum over input channels in order, then taps, from 0, whatever the tiles, so a
// restarted block gives the same bits.
//
// NCHW output (y_c16 false: a layer whose reader takes NCHW) transposes each tile's 16 x PX
// accumulators in the register and stores rows of PX pixels; it runs its input channels as
// one chunk.
#include "libml/kernels/cpu_c16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/cpu_winograd.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

constexpr int64_t max_window = 11;

// Where a tile's outputs go, and what its last chunk applies.
struct c16_out {
    float* y;              // the tile's first output: block 0, pixel 0 (c16) or channel 0, pixel 0 (NCHW)
    const float* res;      // the same position in the residual, or null
    const float* bias;     // the group's first channel's, or null
    int64_t block_stride;  // floats between output blocks (c16: h_out w_out 16) or channels (NCHW: h_out w_out)
    // The partial sums a chunk after the first starts from (c16 pixels, part_stride floats
    // between blocks): the output itself, or for NCHW output the block's scratch.
    const float* part;
    int64_t part_stride;
    bool first, last;      // the block's first chunk (sums start from 0) and its last (the epilogue)
    bool relu, clip;
    float lo, hi;
};

#if defined(__x86_64__) && defined(__GNUC__)
#define RL_C16 __attribute__((target("avx512f"), always_inline)) inline

RL_C16 __m512 c16_activate(__m512 v, const c16_out& o) {
    const __mmask16 all = 0xffff;
    if (o.relu) return _mm512_maskz_max_ps(all, v, _mm512_setzero_ps());
    if (o.clip) {
        // Clip's bounds broadcast where they are used: hoisted out of the tiles' loop (GCC
        // does), they held two of the 32 registers through the sums, and the tile of 4 x 6
        // spilled two filter vectors to the stack (ResNet-50's layers at 51 GMAC/s).
        float lo = o.lo, hi = o.hi;
        asm volatile("" : "+m"(lo), "+m"(hi));
        return _mm512_maskz_min_ps(all, _mm512_set1_ps(hi), _mm512_maskz_max_ps(all, _mm512_set1_ps(lo), v));
    }
    return v;
}

// r[i] <- lane i of each r[j] (a 16 x 16 transpose in registers).
RL_C16 void transpose16(__m512 r[16]) {
    const __mmask16 all = 0xffff;  // the maskz forms: the plain ones trip GCC 12's -Wmaybe-uninitialized
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_maskz_unpacklo_ps(all, r[i], r[i + 1]);
        t[i + 1] = _mm512_maskz_unpackhi_ps(all, r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_maskz_shuffle_ps(all, t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_maskz_shuffle_ps(all, t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_maskz_shuffle_ps(all, t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_maskz_shuffle_ps(all, t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_maskz_shuffle_f32x4(all, r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_maskz_shuffle_f32x4(all, r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_maskz_shuffle_f32x4(all, r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_maskz_shuffle_f32x4(all, r[i + 8], r[i + 12], 0xdd);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_maskz_shuffle_f32x4(all, t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_maskz_shuffle_f32x4(all, t[i], t[i + 8], 0xdd);
    }
}

// v = *p on 16 lanes, a load the compiler cannot see into: with the NCHW input of a stem at
// stride 2 it kept the broadcasts of one tap for the next taps' pixels (the same floats),
// rotating them through the stack, and the stem ran at 53 GMAC/s in the model.
RL_C16 __m512 c16_broadcast(const float* p) {
    __m512 v;
    asm("vbroadcastss %1, %0" : "=v"(v) : "m"(*p));
    return v;
}

// One register tile: FB output blocks x PX pixels, summed over `blocks` input-channel blocks of
// CB channels (chan_stride floats apart), kh x kw taps (rows row_stride apart, columns CB
// floats apart) from x, the tile's first pixel's tap (0, 0); output pixels S input columns
// apart. w: the group's packed filters from the chunk's first block on.
template <int FB, int PX, int S, int CB, bool Y16>
RL_C16 void c16_tile(const float* x, int64_t blocks, int64_t chan_stride, int64_t row_stride, int64_t kh, int64_t kw,
                     const float* w, const c16_out& o) {
    __m512 acc[FB][PX];
#pragma GCC unroll 4
    for (int f = 0; f < FB; ++f)
#pragma GCC unroll 16
        for (int p = 0; p < PX; ++p)
            acc[f][p] = o.first ? _mm512_setzero_ps() : _mm512_loadu_ps(o.part + f * o.part_stride + p * c16);
    const float* wp = w;
    for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = x + b * chan_stride;
        for (int64_t i = 0; i < kh; ++i) {
            const float* xr = xb + i * row_stride;
            for (int64_t j = 0; j < kw; ++j) {
                const float* xc = xr + j * CB;
#pragma GCC unroll 1
                for (int c = 0; c < CB; ++c, wp += FB * c16, ++xc) {
                    __m512 wv[FB];
#pragma GCC unroll 4
                    for (int f = 0; f < FB; ++f) wv[f] = _mm512_load_ps(wp + f * c16);
#pragma GCC unroll 16
                    for (int p = 0; p < PX; ++p) {
                        const __m512 v = c16_broadcast(xc + p * S * CB);
#pragma GCC unroll 4
                        for (int f = 0; f < FB; ++f) acc[f][p] = _mm512_fmadd_ps(wv[f], v, acc[f][p]);
                    }
                }
            }
        }
    }
    if constexpr (Y16) {
#pragma GCC unroll 4
        for (int f = 0; f < FB; ++f) {
            const __m512 vb = o.last && o.bias ? _mm512_loadu_ps(o.bias + f * c16) : _mm512_setzero_ps();
#pragma GCC unroll 16
            for (int p = 0; p < PX; ++p) {
                float* out = o.y + f * o.block_stride + p * c16;
                __m512 v = acc[f][p];
                if (o.last) {
                    if (o.bias) v = _mm512_add_ps(v, vb);
                    if (o.res) v = _mm512_add_ps(v, _mm512_loadu_ps(o.res + (out - o.y)));
                    v = c16_activate(v, o);
                }
                _mm512_storeu_ps(out, v);
            }
        }
    } else {
        const __mmask16 lanes = first_lanes(PX);
#pragma GCC unroll 4
        for (int f = 0; f < FB; ++f) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int p = 0; p < 16; ++p) r[p] = p < PX ? acc[f][p] : _mm512_setzero_ps();
            transpose16(r);
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i) {
                const int64_t at = (f * c16 + i) * o.block_stride;
                __m512 v = r[i];
                if (o.bias) v = _mm512_add_ps(v, _mm512_set1_ps(o.bias[f * c16 + i]));
                if (o.res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, o.res + at));
                _mm512_mask_storeu_ps(o.y + at, lanes, c16_activate(v, o));
            }
        }
    }
}

// The next chunk's filters, fetched into L2 a few lines a tile while this chunk's rows go by:
// in the model the filters come from memory (ResNet-50's 100 MB do not stay in the caches),
// and the first row of a chunk waited for them (a 7x7 layer's 9.4 MB took 2.18 ms cold
// against 1.64 warm).
struct c16_prefetch {
    const char* at = nullptr;
    const char* end = nullptr;
    int64_t lines_per_tile = 0;
};

RL_C16 void c16_fetch(c16_prefetch& f) {
    for (int64_t i = 0; i < f.lines_per_tile && f.at < f.end; ++i, f.at += 64) _mm_prefetch(f.at, _MM_HINT_T1);
}

// The widest tile of FB blocks within 24 accumulators (16 for one block).
template <int FB>
constexpr int c16_pixels = FB == 4 ? 6 : FB == 3 ? 8 : FB == 2 ? 12 : 16;

// n output pixels in a row (or a run): tiles of the widest width, the rest by 4, 2 and 1.
template <int FB, int S, int CB, bool Y16>
__attribute__((target("avx512f"))) void c16_run(const float* x, int64_t n, int64_t blocks, int64_t chan_stride,
                                                int64_t row_stride, int64_t kh, int64_t kw, const float* w, c16_out o,
                                                c16_prefetch& f) {
    constexpr int PX = c16_pixels<FB>;
    const int64_t y_step = Y16 ? c16 : 1;  // floats between output pixels
    const float* res = o.res;
    float* y = o.y;
    const auto at = [&](int64_t p) {
        c16_out t = o;
        t.y = y + p * y_step;
        t.res = res ? res + p * y_step : nullptr;
        t.part = o.part + p * c16;
        return t;
    };
    int64_t p = 0;
    for (; p + PX <= n; p += PX) {
        c16_fetch(f);
        c16_tile<FB, PX, S, CB, Y16>(x + p * S * CB, blocks, chan_stride, row_stride, kh, kw, w, at(p));
    }
    for (; p + 4 <= n; p += 4) c16_tile<FB, 4, S, CB, Y16>(x + p * S * CB, blocks, chan_stride, row_stride, kh, kw, w, at(p));
    for (; p + 2 <= n; p += 2) c16_tile<FB, 2, S, CB, Y16>(x + p * S * CB, blocks, chan_stride, row_stride, kh, kw, w, at(p));
    if (p < n) c16_tile<FB, 1, S, CB, Y16>(x + p * S * CB, blocks, chan_stride, row_stride, kh, kw, w, at(p));
    c16_fetch(f);
}

using c16_run_fn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, c16_out,
                            c16_prefetch&);

template <int S, int CB, bool Y16>
c16_run_fn c16_run_for(int64_t fb) {
    switch (fb) {
    case 4: return c16_run<4, S, CB, Y16>;
    case 3: return c16_run<3, S, CB, Y16>;
    case 2: return c16_run<2, S, CB, Y16>;
    default: return c16_run<1, S, CB, Y16>;
    }
}

c16_run_fn c16_run_of(int64_t fb, int64_t stride, bool x_c16, bool y_c16) {
    if (stride == 1) {
        if (x_c16) return y_c16 ? c16_run_for<1, 16, true>(fb) : c16_run_for<1, 16, false>(fb);
        return y_c16 ? c16_run_for<1, 1, true>(fb) : c16_run_for<1, 1, false>(fb);
    }
    if (x_c16) return y_c16 ? c16_run_for<2, 16, true>(fb) : c16_run_for<2, 16, false>(fb);
    return y_c16 ? c16_run_for<2, 1, true>(fb) : c16_run_for<2, 1, false>(fb);
}
#endif

// The input rows a block of output rows [oy0, oy1) reads, and whether they reach past the
// input (then the block copies them, zero-padded, into its scratch).
struct c16_rows {
    int64_t iy0, count, wp;
    bool padded;
};
c16_rows c16_rows_of(const conv2d_c16_args& a, int64_t oy0, int64_t oy1) {
    c16_rows r;
    r.iy0 = oy0 * a.stride_h - a.pad_top;
    r.count = (oy1 - oy0 - 1) * a.stride_h + a.kh;
    const int64_t reach = (a.w_out - 1) * a.stride_w + a.kw;  // columns of the padded row read
    r.padded = r.iy0 < 0 || r.iy0 + r.count > a.h || a.pad_left > 0 || reach > a.w_in;
    r.wp = std::max(a.w_in + a.pad_left, reach);
    return r;
}

// ---- Winograd F(2x2, 3x3) ---------------------------------------------------------------

// A block's chunks: tiles of 2x2 outputs, tw to a row; chunks of `rows` tile rows (`tiles`
// tiles), their input rows (2 rows + 2 a tile row, wq columns) copied zero-padded.
struct c16_winograd_shape {
    int64_t tw, rows, tiles, wq;
    static c16_winograd_shape of(const conv2d_c16_args& a, int64_t tile_rows_max) {
        c16_winograd_shape s;
        s.tw = (a.w_out + 1) / 2;
        s.wq = 2 * s.tw + 2;
        // The chunk's transformed inputs and products (16 x (c_in + tile_co) x tiles floats):
        // every tile of the block at once where they stay within 1.75 MB of L2, since each
        // chunk reads all the filters U (16 c_in c_out floats: 4 MB for 256 -> 256) again;
        // else chunks of 512 KB. Alone (ms; 2^17, 2^18, 2^19, 2^20 bytes a chunk): ResNet-50's
        // 56x56 x 64 1.09, 0.93, 0.97, 1.13; 14x14 x 256 1.30, 1.28, 1.05, 0.94 (one chunk
        // best); Inception-v3's 35x35 64 -> 96 0.63, 0.63, 0.59, 0.62.
        const int64_t per_tile = 16 * (a.c_in + std::min<int64_t>(a.tile_co, a.c_out)) * int64_t(sizeof(float));
        const int64_t all = s.tw * std::max<int64_t>(1, tile_rows_max);
        const int64_t tiles = all * per_tile <= (int64_t(7) << 18) ? all : std::max<int64_t>(6, (int64_t(1) << 19) / per_tile);
        s.rows = std::clamp<int64_t>(tiles / s.tw, 1, std::max<int64_t>(1, tile_rows_max));
        s.tiles = s.rows * s.tw;
        return s;
    }
};

int64_t c16_winograd_scratch_floats(const conv2d_c16_args& a) {
    const c16_winograd_shape s = c16_winograd_shape::of(a, ceil_div(a.tile_rows, 2));
    const int64_t nco = std::min<int64_t>(a.tile_co, a.c_out);
    return a.c_in * (2 * s.rows + 2) * s.wq + 16 * (a.c_in + nco) * s.tiles;
}

#if defined(__x86_64__) && defined(__GNUC__)
// Output rows [oy0, oy1) (oy0 even) and channels [co0, co1) of one image by F(2x2, 3x3).
__attribute__((target("avx512f"))) bool c16_winograd_block(const conv2d_c16_args& a, const gpu::block_context& ctx,
                                                           const float* x, float* y, const float* res, int64_t oy0,
                                                           int64_t oy1, int64_t co0, int64_t co1) {
    const int64_t t_first = oy0 / 2, t_end = (oy1 + 1) / 2;
    const c16_winograd_shape s = c16_winograd_shape::of(a, t_end - t_first);
    const int64_t ci = a.c_in, cib_n = ci / c16, nco = co1 - co0, hw_in = a.h * a.w_in, hw_out = a.h_out * a.w_out;
    float* rows = static_cast<float*>(ctx.scratch);               // [cib][2 s.rows + 2][wq][16]
    float* v = rows + ci * (2 * s.rows + 2) * s.wq;                 // [16][cib][tiles][16]
    float* m = v + 16 * ci * s.tiles;                               // [16][nco / 16][tiles][16]
    const int64_t chunk = std::max<int64_t>(c16, a.chunk / c16 * c16);
    for (int64_t t0 = t_first; t0 < t_end; t0 += s.rows) {
        if (ctx.preempted()) return false;
        const int64_t t1 = std::min(t_end, t0 + s.rows), tiles = (t1 - t0) * s.tw, count = 2 * (t1 - t0) + 2;
        const int64_t iy0 = 2 * t0 - a.pad_top;
        // The chunk's input rows, zero-padded: column q is input column q - pad_left.
        for (int64_t k = 0; k < cib_n; ++k)
            for (int64_t i = 0; i < count; ++i) {
                float* d = rows + (k * count + i) * s.wq * c16;
                const int64_t iy = iy0 + i;
                const int64_t c0 = std::min(s.wq, a.pad_left), c1 = std::min(s.wq, a.pad_left + a.w_in);
                if (iy < 0 || iy >= a.h || c1 <= c0) {
                    std::memset(d, 0, size_t(s.wq * c16) * sizeof(float));
                    continue;
                }
                std::memset(d, 0, size_t(c0 * c16) * sizeof(float));
                std::memcpy(d + c0 * c16, x + (k * hw_in + iy * a.w_in + (c0 - a.pad_left)) * c16,
                            size_t((c1 - c0) * c16) * sizeof(float));
                std::memset(d + c1 * c16, 0, size_t((s.wq - c1) * c16) * sizeof(float));
            }
        // V = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
        for (int64_t k = 0; k < cib_n; ++k)
            for (int64_t ty = t0; ty < t1; ++ty)
                for (int64_t tx = 0; tx < s.tw; ++tx) {
                    const float* base = rows + ((k * count + 2 * (ty - t0)) * s.wq + 2 * tx) * c16;
                    __m512 t[4][4];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; ++j) {
                        const __m512 d0 = _mm512_loadu_ps(base + j * c16), d1 = _mm512_loadu_ps(base + (s.wq + j) * c16);
                        const __m512 d2 = _mm512_loadu_ps(base + (2 * s.wq + j) * c16);
                        const __m512 d3 = _mm512_loadu_ps(base + (3 * s.wq + j) * c16);
                        t[0][j] = _mm512_sub_ps(d0, d2);
                        t[1][j] = _mm512_add_ps(d1, d2);
                        t[2][j] = _mm512_sub_ps(d2, d1);
                        t[3][j] = _mm512_sub_ps(d1, d3);
                    }
                    float* out = v + (k * s.tiles + (ty - t0) * s.tw + tx) * c16;
                    const int64_t plane = ci * s.tiles;  // floats between positions
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i) {
                        _mm512_storeu_ps(out + (4 * i + 0) * plane, _mm512_sub_ps(t[i][0], t[i][2]));
                        _mm512_storeu_ps(out + (4 * i + 1) * plane, _mm512_add_ps(t[i][1], t[i][2]));
                        _mm512_storeu_ps(out + (4 * i + 2) * plane, _mm512_sub_ps(t[i][2], t[i][1]));
                        _mm512_storeu_ps(out + (4 * i + 3) * plane, _mm512_sub_ps(t[i][1], t[i][3]));
                    }
                }
        // M[xi] = V[xi] U[xi]: pointwise over the chunk's tiles.
        for (int64_t xi = 0; xi < 16; ++xi) {
            if (xi > 0 && ctx.preempted()) return false;
            const float* u = a.w_winograd + xi * a.c_out * ci;
            for (int64_t g0 = co0; g0 < co1; g0 += 4 * c16) {
                const int64_t fb = std::min<int64_t>(4, (co1 - g0) / c16);
                const c16_run_fn run = c16_run_of(fb, 1, true, true);
                for (int64_t k0 = 0; k0 < ci; k0 += chunk) {
                    const int64_t k1 = std::min(ci, k0 + chunk);
                    c16_out o{};
                    o.y = m + (xi * nco + (g0 - co0)) * s.tiles;
                    o.part = o.y;
                    o.block_stride = o.part_stride = s.tiles * c16;
                    o.first = k0 == 0;
                    o.last = k1 == ci;
                    c16_prefetch none;
                    run(v + (xi * ci + k0) * s.tiles, tiles, (k1 - k0) / c16, s.tiles * c16, 0, 1, 1,
                        u + g0 * ci + k0 * fb * c16, o, none);
                }
            }
        }
        // Y = A^T M A, A^T = [1 1 1 0; 0 1 -1 -1], then bias, residual and activation.
        c16_out act{};
        act.relu = a.ep.act == activation::relu;
        act.clip = a.ep.act == activation::clip;
        act.lo = a.ep.alpha;
        act.hi = a.ep.beta;
        const int64_t plane = nco * s.tiles;
        for (int64_t b = 0; b < nco / c16; ++b) {
            const __m512 vb = a.bias ? _mm512_loadu_ps(a.bias + co0 + b * c16) : _mm512_setzero_ps();
            const int64_t block = co0 / c16 + b;
            for (int64_t ty = t0; ty < t1; ++ty)
                for (int64_t tx = 0; tx < s.tw; ++tx) {
                    const float* src = m + (b * s.tiles + (ty - t0) * s.tw + tx) * c16;
                    __m512 r[2][4];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; ++j) {
                        const __m512 m0 = _mm512_loadu_ps(src + j * plane), m1 = _mm512_loadu_ps(src + (4 + j) * plane);
                        const __m512 m2 = _mm512_loadu_ps(src + (8 + j) * plane);
                        const __m512 m3 = _mm512_loadu_ps(src + (12 + j) * plane);
                        r[0][j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                        r[1][j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
                    }
#pragma GCC unroll 4
                    for (int i = 0; i < 2; ++i) {
                        const int64_t oy = 2 * ty + i;
                        if (oy >= oy1) break;
                        if (oy < oy0) continue;  // a block of odd rows: the row above is the previous block's
                        const __m512 out[2] = {_mm512_add_ps(_mm512_add_ps(r[i][0], r[i][1]), r[i][2]),
                                               _mm512_sub_ps(_mm512_sub_ps(r[i][1], r[i][2]), r[i][3])};
#pragma GCC unroll 4
                        for (int j = 0; j < 2; ++j) {
                            const int64_t ox = 2 * tx + j;
                            if (ox >= a.w_out) break;
                            const int64_t at = (block * hw_out + oy * a.w_out + ox) * c16;
                            __m512 val = out[j];
                            if (a.bias) val = _mm512_add_ps(val, vb);
                            if (res) val = _mm512_add_ps(val, _mm512_loadu_ps(res + at));
                            _mm512_storeu_ps(y + at, c16_activate(val, act));
                        }
                    }
                }
        }
    }
    return true;
}
#endif

// ---- depthwise ----------------------------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
RL_C16 __m512 c16_finish(__m512 v, const conv2d_c16_args& a, const c16_out& act, __m512 vb, const float* res) {
    if (a.bias) v = _mm512_add_ps(v, vb);
    if (res) v = _mm512_add_ps(v, _mm512_loadu_ps(res));
    return c16_activate(v, act);
}

// PX output pixels of one row whose windows lie inside the input, from x (the first pixel's
// tap (0, 0)): KH x KW taps a pixel from the filters held in registers, the pixels
// independent chains.
template <int KH, int KW, int S, int PX>
RL_C16 void c16_depthwise_tile(const float* x, int64_t row, const __m512 (&w)[KH * KW], const conv2d_c16_args& a,
                               const c16_out& act, __m512 vb, float* y, const float* res) {
    __m512 acc[PX];
#pragma GCC unroll 8
    for (int p = 0; p < PX; ++p) acc[p] = _mm512_setzero_ps();
#pragma GCC unroll 11
    for (int i = 0; i < KH; ++i)
#pragma GCC unroll 11
        for (int j = 0; j < KW; ++j)
#pragma GCC unroll 8
            for (int p = 0; p < PX; ++p)
                acc[p] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * row + (p * S + j) * c16), w[i * KW + j], acc[p]);
#pragma GCC unroll 8
    for (int p = 0; p < PX; ++p)
        _mm512_storeu_ps(y + p * c16, c16_finish(acc[p], a, act, vb, res ? res + p * c16 : nullptr));
}

// Output rows [oy0, oy1) of one channel block: windows clipped to the input at the borders
// (a pixel at a time), the inside in tiles of 4 pixels. Taps in order i, then j, from 0.
template <int KH, int KW, int S>
__attribute__((target("avx512f"))) void c16_depthwise_rows(const conv2d_c16_args& a, const float* x, const float* wt,
                                                           const float* bias, float* y, const float* res, int64_t oy0,
                                                           int64_t oy1) {
    __m512 w[KH * KW];
#pragma GCC unroll 11
    for (int t = 0; t < KH * KW; ++t) w[t] = _mm512_loadu_ps(wt + t * c16);
    c16_out act{};
    act.relu = a.ep.act == activation::relu;
    act.clip = a.ep.act == activation::clip;
    act.lo = a.ep.alpha;
    act.hi = a.ep.beta;
    const __m512 vb = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    const int64_t row = a.w_in * c16;
    // Output columns whose windows lie inside the input: [ox_lo, ox_hi).
    const int64_t ox_lo = std::min(a.w_out, ceil_div(a.pad_left, S));
    const int64_t ox_hi = std::max(ox_lo, std::min(a.w_out, (a.w_in + a.pad_left - KW) / S + 1));
    for (int64_t oy = oy0; oy < oy1; ++oy) {
        const int64_t iy = oy * S - a.pad_top;
        const int64_t i0 = std::max<int64_t>(0, -iy), i1 = std::min<int64_t>(KH, a.h - iy);
        float* yr = y + oy * a.w_out * c16;
        const float* rr = res ? res + oy * a.w_out * c16 : nullptr;
        // One pixel, its taps clipped to the input.
        const auto edge = [&](int64_t ox) __attribute__((target("avx512f"))) {
            const int64_t ix = ox * S - a.pad_left;
            const int64_t j0 = std::max<int64_t>(0, -ix), j1 = std::min<int64_t>(KW, a.w_in - ix);
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = i0; i < i1; ++i)
                for (int64_t j = j0; j < j1; ++j)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + (iy + i) * row + (ix + j) * c16), w[i * KW + j], acc);
            _mm512_storeu_ps(yr + ox * c16, c16_finish(acc, a, act, vb, rr ? rr + ox * c16 : nullptr));
        };
        if (i0 > 0 || i1 < KH) {  // a row whose window reaches past the top or bottom
            for (int64_t ox = 0; ox < a.w_out; ++ox) edge(ox);
            continue;
        }
        int64_t ox = 0;
        for (; ox < ox_lo; ++ox) edge(ox);
        const float* xr = x + iy * row - a.pad_left * c16;
        for (; ox + 4 <= ox_hi; ox += 4)
            c16_depthwise_tile<KH, KW, S, 4>(xr + ox * S * c16, row, w, a, act, vb, yr + ox * c16, rr ? rr + ox * c16 : nullptr);
        for (; ox < ox_hi; ++ox)
            c16_depthwise_tile<KH, KW, S, 1>(xr + ox * S * c16, row, w, a, act, vb, yr + ox * c16, rr ? rr + ox * c16 : nullptr);
        for (; ox < a.w_out; ++ox) edge(ox);
    }
}

// Other windows: every pixel's taps clipped to the input, the filters from L1.
__attribute__((target("avx512f"))) void c16_depthwise_any(const conv2d_c16_args& a, const float* x, const float* wt,
                                                          const float* bias, float* y, const float* res, int64_t oy0,
                                                          int64_t oy1) {
    c16_out act{};
    act.relu = a.ep.act == activation::relu;
    act.clip = a.ep.act == activation::clip;
    act.lo = a.ep.alpha;
    act.hi = a.ep.beta;
    const __m512 vb = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int64_t oy = oy0; oy < oy1; ++oy) {
        const int64_t iy = oy * a.stride_h - a.pad_top;
        const int64_t i0 = std::max<int64_t>(0, -iy), i1 = std::min<int64_t>(a.kh, a.h - iy);
        for (int64_t ox = 0; ox < a.w_out; ++ox) {
            const int64_t ix = ox * a.stride_w - a.pad_left;
            const int64_t j0 = std::max<int64_t>(0, -ix), j1 = std::min<int64_t>(a.kw, a.w_in - ix);
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = i0; i < i1; ++i)
                for (int64_t j = j0; j < j1; ++j)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + ((iy + i) * a.w_in + ix + j) * c16),
                                          _mm512_loadu_ps(wt + (i * a.kw + j) * c16), acc);
            const int64_t at = (oy * a.w_out + ox) * c16;
            _mm512_storeu_ps(y + at, c16_finish(acc, a, act, vb, res ? res + at : nullptr));
        }
    }
}

// Channels [co0, co1) (whole blocks) and output rows [oy0, oy1) of one image, a block of 16
// channels at a time with a check point before each.
bool c16_depthwise_block(const conv2d_c16_args& a, const gpu::block_context& ctx, const float* x, float* y,
                         const float* res, int64_t oy0, int64_t oy1, int64_t co0, int64_t co1) {
    const int64_t hw_in = a.h * a.w_in, hw_out = a.h_out * a.w_out, taps = a.kh * a.kw;
    using rows_fn = void (*)(const conv2d_c16_args&, const float*, const float*, const float*, float*, const float*,
                             int64_t, int64_t);
    rows_fn rows = c16_depthwise_any;
    if (a.kh == 3 && a.kw == 3 && a.stride_h == a.stride_w)
        rows = a.stride_w == 1 ? c16_depthwise_rows<3, 3, 1> : c16_depthwise_rows<3, 3, 2>;
    else if (a.kh == 5 && a.kw == 5 && a.stride_h == a.stride_w)
        rows = a.stride_w == 1 ? c16_depthwise_rows<5, 5, 1> : c16_depthwise_rows<5, 5, 2>;
    for (int64_t c0 = co0; c0 < co1; c0 += c16) {
        if (ctx.preempted()) return false;
        const int64_t b = c0 / c16;
        rows(a, x + b * hw_in * c16, a.w + b * taps * c16, a.bias ? a.bias + c0 : nullptr, y + b * hw_out * c16,
             res ? res + b * hw_out * c16 : nullptr, oy0, oy1);
    }
    return true;
}
#endif

bool conv2d_c16_block(const void* p, const gpu::block_context& ctx) {
#if defined(__x86_64__) && defined(__GNUC__)
    const auto& a = *static_cast<const conv2d_c16_args*>(p);
    const int64_t row_tiles = ceil_div(a.h_out, a.tile_rows), co_tiles = ceil_div(a.c_out, a.tile_co);
    int64_t block = ctx.block;
    const int64_t rt = block % row_tiles;
    block /= row_tiles;
    const int64_t ct = block % co_tiles, image = block / co_tiles;
    const int64_t oy0 = rt * a.tile_rows, oy1 = std::min(a.h_out, oy0 + a.tile_rows);
    const int64_t co0 = ct * a.tile_co, co1 = std::min(a.c_out, co0 + a.tile_co);
    const int64_t cb = a.x_c16 ? c16 : 1, hw_in = a.h * a.w_in, hw_out = a.h_out * a.w_out;
    const float* x = a.x + image * a.c_in * hw_in;
    if (a.w_winograd)
        return c16_winograd_block(a, ctx, x, a.y + image * a.c_out * hw_out,
                                  a.residual ? a.residual + image * a.c_out * hw_out : nullptr, oy0, oy1, co0, co1);
    if (a.depthwise)
        return c16_depthwise_block(a, ctx, x, a.y + image * a.c_out * hw_out,
                                   a.residual ? a.residual + image * a.c_out * hw_out : nullptr, oy0, oy1, co0, co1);
    const c16_rows r = c16_rows_of(a, oy0, oy1);
    // The input as (base, stride between channel blocks, stride between rows), base at the
    // block's first input row and the padded row's column 0.
    const float* base;
    int64_t chan_stride, row_stride;
    if (r.padded) {
        if (ctx.preempted()) return false;
        auto* s = static_cast<float*>(ctx.scratch);
        row_stride = r.wp * cb;
        chan_stride = r.count * row_stride;
        for (int64_t k = 0; k < a.c_in / cb; ++k)
            for (int64_t i = 0; i < r.count; ++i) {
                float* d = s + k * chan_stride + i * row_stride;
                const int64_t iy = r.iy0 + i;
                if (iy < 0 || iy >= a.h) {
                    std::memset(d, 0, size_t(row_stride) * sizeof(float));
                    continue;
                }
                std::memset(d, 0, size_t(a.pad_left * cb) * sizeof(float));
                std::memcpy(d + a.pad_left * cb, x + k * hw_in * cb + iy * a.w_in * cb, size_t(a.w_in * cb) * sizeof(float));
                std::memset(d + (a.pad_left + a.w_in) * cb, 0, size_t((r.wp - a.pad_left - a.w_in) * cb) * sizeof(float));
            }
        base = s;
    } else {
        row_stride = a.w_in * cb;
        chan_stride = hw_in * cb;
        base = x + r.iy0 * row_stride;
    }
    // 1x1 at stride 1 over unpadded rows as wide as the output's: the block's pixels are one run.
    const bool flat = a.kh == 1 && a.kw == 1 && a.stride_h == 1 && a.stride_w == 1 && !r.padded && a.w_in == a.w_out;
    float* y = a.y + image * a.c_out * hw_out;
    const float* res = a.residual ? a.residual + image * a.c_out * hw_out : nullptr;
    const int64_t taps = a.kh * a.kw;
    const int64_t chunk = std::max<int64_t>(cb, a.chunk / cb * cb);
    // NCHW output: the chunks before the last add up in the scratch (after the padded rows), as
    // c16 pixels of the group's blocks, and the last one stores them transposed.
    float* part = static_cast<float*>(ctx.scratch) + (r.padded ? (a.c_in * r.count * r.wp + 15) / 16 * 16 : 0);
    const int64_t part_stride = (oy1 - oy0) * a.w_out * c16;
    // A group's filters for input channels [k0, k1): where they start, and their bytes.
    const auto filters = [&](int64_t g0, int64_t k0, int64_t k1) {
        const int64_t fb = std::min<int64_t>(4, (co1 - g0) / c16);
        const float* at = a.w + g0 * a.c_in * taps + k0 / cb * taps * cb * fb * c16;
        return std::make_pair(reinterpret_cast<const char*>(at), (k1 - k0) * taps * fb * c16 * int64_t(sizeof(float)));
    };
    const int64_t rows = flat ? 1 : oy1 - oy0;
    const int64_t tiles = rows * ceil_div(flat ? (oy1 - oy0) * a.w_out : a.w_out, 6);
    for (int64_t g0 = co0; g0 < co1; g0 += 4 * c16) {
        const int64_t fb = std::min<int64_t>(4, (co1 - g0) / c16);
        const c16_run_fn run = c16_run_of(fb, a.stride_w, a.x_c16, a.y_c16);
        const c16_run_fn run_part = a.y_c16 ? run : c16_run_of(fb, a.stride_w, a.x_c16, true);
        const float* wg = a.w + g0 * a.c_in * taps;
        for (int64_t k0 = 0; k0 < a.c_in; k0 += chunk) {
            if (ctx.preempted()) return false;
            const int64_t k1 = std::min(a.c_in, k0 + chunk), kb0 = k0 / cb, blocks = (k1 - k0) / cb;
            // The next chunk's filters (or the next group's first) into L2 as the rows go by.
            c16_prefetch pf;
            if (k1 < a.c_in || g0 + 4 * c16 < co1) {
                const auto [at, bytes] = k1 < a.c_in ? filters(g0, k1, std::min(a.c_in, k1 + chunk))
                                                     : filters(g0 + 4 * c16, 0, std::min(a.c_in, chunk));
                pf = {at, at + bytes, ceil_div(bytes / 64, tiles)};
            }
            c16_out o{};
            o.bias = a.bias ? a.bias + g0 : nullptr;
            o.first = k0 == 0;
            o.last = k1 == a.c_in;
            o.relu = a.ep.act == activation::relu;
            o.clip = a.ep.act == activation::clip;
            o.lo = a.ep.alpha;
            o.hi = a.ep.beta;
            o.block_stride = a.y_c16 ? hw_out * c16 : hw_out;
            const float* wk = wg + kb0 * taps * cb * fb * c16;
            const float* xk = base + kb0 * chan_stride;
            const bool to_part = !a.y_c16 && !o.last;
            const c16_run_fn go = to_part ? run_part : run;
            o.block_stride = to_part ? part_stride : o.block_stride;
            o.part_stride = a.y_c16 ? hw_out * c16 : part_stride;
            // Output (oy, 0) of the group: c16 block g0 / 16 at pixel oy w_out, or channel g0,
            // or (NCHW output's chunks before the last) the block's partial sums.
            const auto out_at = [&](int64_t pixel) {
                const int64_t off = a.y_c16 ? g0 * hw_out + pixel * c16 : g0 * hw_out + pixel;
                float* partial = part + (pixel - oy0 * a.w_out) * c16;
                o.y = to_part ? partial : y + off;
                o.res = res && !to_part ? res + off : nullptr;
                o.part = a.y_c16 ? y + off : partial;
            };
            if (flat) {
                out_at(oy0 * a.w_out);
                go(xk, (oy1 - oy0) * a.w_out, blocks, chan_stride, row_stride, 1, 1, wk, o, pf);
                continue;
            }
            for (int64_t oy = oy0; oy < oy1; ++oy) {
                out_at(oy * a.w_out);
                go(xk + (oy - oy0) * a.stride_h * row_stride, a.w_out, blocks, chan_stride, row_stride, a.kh, a.kw, wk, o,
                   pf);
            }
        }
    }
    return true;
#else
    (void)p, (void)ctx;
    return false;  // never planned: conv2d_c16_possible is false without AVX-512
#endif
}

// ---- pooling and batch norm ------------------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
// One channel block of one image: every output pixel's window over the input's 16-channel
// pixels (taps clipped to the input), max or sum then division by the window's count.
__attribute__((target("avx512f"))) void pool_c16_plane(const pool2d_args& a, const float* x, float* y) {
    const bool max = a.op == pool_op::max;
    for (int64_t oy = 0; oy < a.h_out; ++oy) {
        const int64_t y0 = oy * a.stride_h - a.pad_top;
        const int64_t i0 = std::max<int64_t>(0, -y0), i1 = std::min<int64_t>(a.kh, a.h - y0);
        const int64_t rows = pool_window_count(a, oy, a.stride_h, a.pad_top, a.pad_bottom, a.kh, a.h);
        for (int64_t ox = 0; ox < a.w_out; ++ox) {
            const int64_t x0 = ox * a.stride_w - a.pad_left;
            const int64_t j0 = std::max<int64_t>(0, -x0), j1 = std::min<int64_t>(a.kw, a.w - x0);
            __m512 v = max ? _mm512_set1_ps(-INFINITY) : _mm512_setzero_ps();
            for (int64_t i = i0; i < i1; ++i) {
                const float* row = x + ((y0 + i) * a.w + x0) * c16;
                for (int64_t j = j0; j < j1; ++j) {
                    const __m512 t = _mm512_load_ps(row + j * c16);
                    v = max ? max_first(v, t) : _mm512_add_ps(v, t);
                }
            }
            if (!max) {
                const int64_t cols = pool_window_count(a, ox, a.stride_w, a.pad_left, a.pad_right, a.kw, a.w);
                v = divide_by_count(v, _mm512_set1_ps(float(rows * cols)));
            }
            _mm512_store_ps(y + (oy * a.w_out + ox) * c16, v);
        }
    }
}

// y = ep(x * s + b) over hw pixels of one channel block (s, b: its 16 channels' scale and
// shift), as affine_row computes each channel's row: separately rounded, then ReLU or Clip.
__attribute__((target("avx512f"))) void c16_affine(const float* x, float* y, int64_t hw, const float* s, const float* b,
                                                   const epilogue& ep) {
    const __m512 vs = _mm512_loadu_ps(s), vb = _mm512_loadu_ps(b);
    c16_out o{};
    o.relu = ep.act == activation::relu;
    o.clip = ep.act == activation::clip;
    o.lo = ep.alpha;
    o.hi = ep.beta;
    for (int64_t q = 0; q < hw; ++q)
        _mm512_store_ps(y + q * c16, c16_activate(add_exact(mul_exact(_mm512_load_ps(x + q * c16), vs), vb), o));
}
#endif

bool pool2d_c16_block(const void* p, const gpu::block_context& ctx) {
#if defined(__x86_64__) && defined(__GNUC__)
    const auto& a = *static_cast<const pool2d_args*>(p);
    const int64_t planes = a.n * (a.c / c16), hw_in = a.h * a.w * c16, hw_out = a.h_out * a.w_out * c16;
    const int64_t p0 = int64_t(ctx.block) * a.planes_per_block, p1 = std::min(planes, p0 + a.planes_per_block);
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        pool_c16_plane(a, a.x + plane * hw_in, a.y + plane * hw_out);
    }
    return true;
#else
    (void)p, (void)ctx;
    return false;
#endif
}

bool batchnorm_c16_block(const void* p, const gpu::block_context& ctx) {
#if defined(__x86_64__) && defined(__GNUC__)
    const auto& a = *static_cast<const batchnorm_args*>(p);
    const int64_t blocks = a.c / c16, planes = a.n * blocks;
    const int64_t p0 = int64_t(ctx.block) * a.planes_per_block, p1 = std::min(planes, p0 + a.planes_per_block);
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        const int64_t c0 = plane % blocks * c16;
        // The batchnorm kernel's per-channel scale and shift, then its rows of one value each.
        float s[c16], b[c16];
        for (int64_t i = 0; i < c16; ++i) {
            s[i] = a.scale[c0 + i] / std::sqrt(a.var[c0 + i] + a.epsilon);
            b[i] = a.bias[c0 + i] - a.mean[c0 + i] * s[i];
        }
        const float* x = a.x + plane * a.hw * c16;
        float* y = a.y + plane * a.hw * c16;
        if (a.ep.act == activation::none || a.ep.act == activation::relu || a.ep.act == activation::clip) {
            c16_affine(x, y, a.hw, s, b, a.ep);
            continue;
        }
        for (int64_t q = 0; q < a.hw; ++q) {
            for (int64_t i = 0; i < c16; ++i) y[q * c16 + i] = x[q * c16 + i] * s[i] + b[i];
            apply_epilogue(y + q * c16, c16, a.ep);
        }
    }
    return true;
#else
    (void)p, (void)ctx;
    return false;
#endif
}

}  // namespace

bool conv2d_c16_possible(const conv2d_args& g, bool x_c16) {
    if (!cpu_has_avx512() || g.dil_h != 1 || g.dil_w != 1) return false;
    if (g.groups != 1 && !(conv2d_c16_depthwise(g) && x_c16)) return false;
    if (g.stride_w < 1 || g.stride_w > 2 || g.stride_h < 1 || g.stride_h > 2) return false;
    if (g.kh < 1 || g.kw < 1 || g.kh > max_window || g.kw > max_window || g.pad_top < 0 || g.pad_left < 0) return false;
    if (g.c_out % c16 != 0 || g.c_out < c16 || (x_c16 && g.c_in % c16 != 0) || g.c_in < 1) return false;
    return g.h_out >= 1 && g.w_out >= 1 && g.h >= 1 && g.w_in >= 1;
}

int64_t conv2d_c16_filter_floats(int64_t c_out, int64_t c_in, int64_t kh, int64_t kw) { return c_out * c_in * kh * kw; }

void conv2d_c16_depthwise_filters(const float* w, int64_t c, int64_t kh, int64_t kw, float* out) {
    const int64_t taps = kh * kw;
    for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t t = 0; t < taps; ++t) out[(ch / c16 * taps + t) * c16 + ch % c16] = w[ch * taps + t];
}

void conv2d_c16_filters(const float* w, int64_t c_out, int64_t c_in, int64_t kh, int64_t kw, bool x_c16, float* out) {
    const int64_t cb = x_c16 ? c16 : 1, taps = kh * kw;
    for (int64_t g0 = 0; g0 < c_out; g0 += 4 * c16) {
        const int64_t fb = std::min<int64_t>(4, (c_out - g0) / c16);
        float* d = out + g0 * c_in * taps;
        // [c_in / cb][kh][kw][cb][fb][16]
        for (int64_t kb = 0; kb < c_in / cb; ++kb)
            for (int64_t t = 0; t < taps; ++t)
                for (int64_t c = 0; c < cb; ++c)
                    for (int64_t f = 0; f < fb; ++f)
                        for (int64_t l = 0; l < c16; ++l) {
                            const int64_t co = g0 + f * c16 + l, ci = kb * cb + c;
                            d[(((kb * taps + t) * cb + c) * fb + f) * c16 + l] = w[(co * c_in + ci) * taps + t];
                        }
    }
}

size_t conv2d_c16_scratch_bytes(const conv2d_c16_args& a) {
    if (a.w_winograd) return size_t(c16_winograd_scratch_floats(a)) * sizeof(float);
    if (a.depthwise) return 0;
    size_t most = 0;
    for (int64_t oy0 = 0; oy0 < a.h_out; oy0 += a.tile_rows) {
        const int64_t oy1 = std::min(a.h_out, oy0 + a.tile_rows);
        const c16_rows r = c16_rows_of(a, oy0, oy1);
        const int64_t padded = r.padded ? (a.c_in * r.count * r.wp + 15) / 16 * 16 : 0;
        const int64_t partial = a.y_c16 ? 0 : 4 * c16 * (oy1 - oy0) * a.w_out;  // a group's partial sums
        most = std::max(most, size_t(padded + partial) * sizeof(float));
    }
    return most;
}

bool c16_winograd_possible(const conv2d_args& g) {
    return g.groups == 1 && conv2d_c16_possible(g, true) && g.kh == 3 && g.kw == 3 && g.stride_h == 1 &&
           g.stride_w == 1 && g.c_in % c16 == 0;
}

bool c16_winograd_wanted(int64_t c_out, int64_t c_in, int64_t h_out, int64_t w_out) {
    // Each layer alone, the direct sums against Winograd (ms, caches warm / the caches flushed
    // before each run): ResNet-50's 56x56 x 64 1.41 / 1.07 and 1.53 / 1.26, 14x14 x 256 1.48 /
    // 0.90 and 1.63 / 1.27, 7x7 x 512 1.74 / 1.23 and 2.48 / 2.44 (U, 16 MB, from memory);
    // Inception-v3's 8x8 x 384 1.37 / 0.73 and 1.80 / 1.48; DenseNet-121's 128 -> 32 on 56x56
    // 1.50 / 1.25 and 1.74 / 1.47, on 14x14 0.101 / 0.077 and 0.127 / 0.150, on 7x7 0.036 /
    // 0.030 and 0.056 / 0.074 (a thin layer's transforms and scratch cost more than it saves).
    // In the model, ResNet-50's 7x7 x 512 layers took 2.8 ms by Winograd against 2.2-2.6
    // direct: 16 tiles a plane do not amortise the filters from memory, hence the 12 MB.
    const conv_method m = conv_method_in_use();  // reefrun --conv direct|winograd: one way for all
    if (m == conv_method::direct || m == conv_method::im2col) return false;
    if (m == conv_method::winograd) return true;
    const int64_t tiles = ((h_out + 1) / 2) * ((w_out + 1) / 2);
    const int64_t filter_bytes = conv2d_c16_winograd_floats(c_out, c_in) * int64_t(sizeof(float));
    return (c_out >= 64 && tiles >= 25) || tiles >= 100 || (c_out >= 64 && tiles >= 16 && filter_bytes <= (int64_t(12) << 20));
}

void conv2d_c16_winograd_filters(const float* w, int64_t c_out, int64_t c_in, float* out) {
    std::vector<float> u(size_t(winograd_filter_floats(c_out, c_in)));
    winograd_filters(w, c_out, c_in, c_out, u.data());  // [16][c_out][c_in]
    for (int64_t xi = 0; xi < 16; ++xi)
        conv2d_c16_filters(u.data() + xi * c_out * c_in, c_out, c_in, 1, 1, true, out + xi * c_out * c_in);
}

bool pool2d_c16_possible(const pool2d_args& a) {
    return cpu_has_avx512() && a.c % c16 == 0 && a.c >= c16 && !a.indices && a.d <= 1 && a.d_out <= 1 && a.kd <= 1 &&
           a.dil_h == 1 && a.dil_w == 1 && (a.op == pool_op::max || a.op == pool_op::average) && a.h_out >= 1 &&
           a.w_out >= 1;
}

const gpu::kernel_info conv2d_c16_kernel = {"conv2d_c16", conv2d_c16_block, 256, 128, 32768, 0};
const gpu::kernel_info pool2d_c16_kernel = {"pool2d_c16", pool2d_c16_block, 256, 32, 0, 0};
const gpu::kernel_info batchnorm_c16_kernel = {"batchnorm_c16", batchnorm_c16_block, 256, 32, 0, 0};

}  // namespace reefline::ml::kernels
