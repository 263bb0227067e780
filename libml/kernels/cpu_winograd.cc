// Winograd convolution F(2x2, 3x3) for the cpu blocks. A 3x3 convolution at stride 1 sums
// 9 products per input channel and output; Winograd's minimal filtering computes a 2x2 tile
// of outputs from a 4x4 tile of inputs with 16 products per input channel instead of 36, so
// the multiply-adds shrink 2.25x and the rest are additions of transforms:
//   V = B^T d B (each input tile d, per input channel), U = G g G^T (each 3x3 filter g),
//   M[xi] = U[xi] x V[xi] for the 16 positions xi (16 GEMMs over input channels),
//   Y = A^T M A (each output tile), with
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// The transforms' coefficients are 0, +-1 and 1/2, so the rounding stays close to the direct
// sums' (a kernel test bounds it against im2col). A block transforms its output channels'
// filters once, then goes over its rows in chunks of row pairs: the chunk's input rows split
// into even and odd columns (so that 16 tiles' inputs are one vector load each), the inputs
// transformed, the 16 GEMMs (the sgemm of cpu_onednn.h), and the outputs transformed back
// with the bias and activation applied in the register. Check points: at each chunk and
// between the GEMMs.
#include "libml/kernels/cpu_winograd.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_onednn.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

constexpr int64_t positions = 16;  // the 4x4 transformed tile

// A block's geometry: tiles of 2x2 outputs, tw to a row of tiles; chunks of `pairs` row pairs
// (tiles = pairs * tw columns of each GEMM); the even/odd input rows pw floats wide.
struct winograd_shape {
    int64_t tw, pairs, tiles, pw, rows;

    static winograd_shape of(const conv2d_args& c) {
        winograd_shape s;
        s.tw = (c.w_out + 1) / 2;
        // Chunks of about 192 tiles: GEMMs wide enough for the sgemm's kernels, while a chunk's
        // transformed inputs and products (16 x (ci + co) x tiles floats) stay near L2's size.
        const int64_t pairs_max = (std::min<int64_t>(c.tile_pix, c.h_out * c.w_out) + c.w_out - 1) / c.w_out / 2 + 1;
        s.pairs = std::clamp<int64_t>(192 / s.tw, 1, pairs_max);
        s.tiles = s.pairs * s.tw;
        s.pw = (s.tw + 1 + 15) / 16 * 16 + 16;
        s.rows = 2 * s.pairs + 2;
        return s;
    }
};

// Floats between the 16 planes of V and of M beyond their data: a tile group's 16 stores (and
// the output transform's 16 loads) are one vector per plane, and planes whose distance is a
// multiple of 2 KB (ResNet-50's 64 x 168 tiles: 43008 bytes, all in two L1 sets) evict each
// other. Three cache lines spread them over the sets (alternated runs: ResNet-50 1.006-1.028x,
// VGG-19 1.012-1.090x, Inception-v3 1.037x).
constexpr int64_t plane_pad_floats = 48;

int64_t tile_co_max(const conv2d_args& c) { return std::min<int64_t>(c.tile_co, conv2d_co_per_group(c)); }

// U[xi][m][k] = (G g G^T)[xi] for the filters g of output channels m < nco (rows ldw apart)
// and input channels k < ci.
void transform_filters(const float* w, int64_t ldw, int64_t nco, int64_t ci, float* u) {
    const int64_t plane = nco * ci;
    for (int64_t m = 0; m < nco; ++m)
        for (int64_t k = 0; k < ci; ++k) {
            const float* g = w + m * ldw + k * 9;
            float r[4][3];  // G g
            for (int j = 0; j < 3; ++j) {
                r[0][j] = g[j];
                r[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
                r[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
                r[3][j] = g[6 + j];
            }
            float* o = u + m * ci + k;
            for (int i = 0; i < 4; ++i) {
                o[(4 * i + 0) * plane] = r[i][0];
                o[(4 * i + 1) * plane] = 0.5f * (r[i][0] + r[i][1] + r[i][2]);
                o[(4 * i + 2) * plane] = 0.5f * (r[i][0] - r[i][1] + r[i][2]);
                o[(4 * i + 3) * plane] = r[i][2];
            }
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
// One input channel's rows [iy0, iy0 + s.rows) split by column parity: even[q] = x[iy][2q -
// pad], odd[q] = x[iy][2q + 1 - pad], zero outside the plane; even and odd rows pw apart.
__attribute__((target("avx512f"))) void split_rows(const conv2d_args& c, const winograd_shape& s, const float* x,
                                                   int64_t iy0, float* out) {
    const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    for (int64_t r = 0; r < s.rows; ++r) {
        float* even = out + 2 * r * s.pw;
        float* odd = even + s.pw;
        const int64_t iy = iy0 + r;
        if (iy < 0 || iy >= c.h) {
            std::memset(even, 0, size_t(2 * s.pw) * sizeof(float));
            continue;
        }
        const float* row = x + iy * c.w_in;
        for (int64_t q = 0; q < s.pw; q += 16) {
            const int64_t ix = 2 * q - c.pad_left;  // the first of the 32 columns
            const __mmask16 lo = first_lanes(c.w_in - ix) & ~first_lanes(-ix);
            const __mmask16 hi = first_lanes(c.w_in - ix - 16) & ~first_lanes(-ix - 16);
            const __m512 a = _mm512_maskz_loadu_ps(lo, row + ix), b = _mm512_maskz_loadu_ps(hi, row + ix + 16);
            _mm512_storeu_ps(even + q, _mm512_permutex2var_ps(a, evens, b));
            _mm512_storeu_ps(odd + q, _mm512_permutex2var_ps(a, odds, b));
        }
    }
}

// V[xi][k][p * tw + j] = (B^T d B)[xi] for the input tiles d of row pairs p < pairs and tile
// columns j < tw, from the split rows of input channel k (`rows`).
__attribute__((target("avx512f"))) void transform_inputs(const winograd_shape& s, int64_t pairs, const float* rows,
                                                         int64_t k, int64_t plane, float* v) {
    for (int64_t p = 0; p < pairs; ++p)
        for (int64_t j = 0; j < s.tw; j += 16) {
            const __mmask16 lanes = first_lanes(s.tw - j);
            __m512 t[4][4];
            for (int a = 0; a < 4; ++a) {
                const float* even = rows + 2 * (2 * p + a) * s.pw + j;
                const float* odd = even + s.pw;
                const __m512 d0 = _mm512_loadu_ps(even), d1 = _mm512_loadu_ps(odd);
                const __m512 d2 = _mm512_loadu_ps(even + 1), d3 = _mm512_loadu_ps(odd + 1);
                // d B, row a: columns as B's.
                t[a][0] = _mm512_sub_ps(d0, d2);
                t[a][1] = _mm512_add_ps(d1, d2);
                t[a][2] = _mm512_sub_ps(d2, d1);
                t[a][3] = _mm512_sub_ps(d1, d3);
            }
            float* o = v + k * s.tiles + p * s.tw + j;
            for (int b = 0; b < 4; ++b) {
                _mm512_mask_storeu_ps(o + (0 + b) * plane, lanes, _mm512_sub_ps(t[0][b], t[2][b]));
                _mm512_mask_storeu_ps(o + (4 + b) * plane, lanes, _mm512_add_ps(t[1][b], t[2][b]));
                _mm512_mask_storeu_ps(o + (8 + b) * plane, lanes, _mm512_sub_ps(t[2][b], t[1][b]));
                _mm512_mask_storeu_ps(o + (12 + b) * plane, lanes, _mm512_sub_ps(t[1][b], t[3][b]));
            }
        }
}

// The outputs of row pairs [0, pairs) of output channel m from its 16 products (M[xi][m],
// planes nco * tiles apart), into the tile's pixels [p0, p1) of y (y at p0): Y = A^T M A, two
// output rows of 16 tiles' 32 columns at a time, with fin's bias and activation.
__attribute__((target("avx512f"))) void transform_outputs(const conv2d_args& c, const winograd_shape& s,
                                                          int64_t pairs, int64_t oy0, const float* mm, int64_t plane,
                                                          int64_t p0, int64_t p1, float* y, float bias,
                                                          const direct_finish* fin) {
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const __m512 vb = _mm512_set1_ps(bias);
    const __mmask16 has_bias = bias != 0.0f ? __mmask16(0xffff) : __mmask16(0);
    const __m512 lo = _mm512_set1_ps(fin ? fin->lo : 0.0f), hi = _mm512_set1_ps(fin ? fin->hi : 0.0f);
    for (int64_t p = 0; p < pairs; ++p)
        for (int64_t j = 0; j < s.tw; j += 16) {
            const __mmask16 lanes = first_lanes(s.tw - j);
            __m512 r[2][4];  // A^T M, per column b
            for (int b = 0; b < 4; ++b) {
                const float* src = mm + p * s.tw + j + b * plane;
                const __m512 m0 = _mm512_maskz_loadu_ps(lanes, src), m1 = _mm512_maskz_loadu_ps(lanes, src + 4 * plane);
                const __m512 m2 = _mm512_maskz_loadu_ps(lanes, src + 8 * plane);
                const __m512 m3 = _mm512_maskz_loadu_ps(lanes, src + 12 * plane);
                r[0][b] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                r[1][b] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
            }
            for (int i = 0; i < 2; ++i) {
                const int64_t oy = oy0 + 2 * p + i;
                if (oy >= c.h_out) break;
                __m512 e = _mm512_add_ps(_mm512_add_ps(r[i][0], r[i][1]), r[i][2]);  // even columns
                __m512 o = _mm512_sub_ps(_mm512_sub_ps(r[i][1], r[i][2]), r[i][3]);  // odd columns
                if (fin) {
                    e = bias_activation(e, vb, has_bias, lo, hi, fin->relu, fin->clip);
                    o = bias_activation(o, vb, has_bias, lo, hi, fin->relu, fin->clip);
                }
                // Columns [a, b) of this row are the tile's.
                const int64_t row0 = oy * c.w_out;
                const int64_t a = std::max(p0, row0) - row0, b = std::min(p1, row0 + c.w_out) - row0;
                if (a >= b) continue;
                float* out = y + (row0 - p0);
                const int64_t x0 = 2 * j;
                const __mmask16 m_lo = first_lanes(b - x0) & ~first_lanes(a - x0);
                const __mmask16 m_hi = first_lanes(b - x0 - 16) & ~first_lanes(a - x0 - 16);
                _mm512_mask_storeu_ps(out + x0, m_lo, _mm512_permutex2var_ps(e, lo_idx, o));
                _mm512_mask_storeu_ps(out + x0 + 16, m_hi, _mm512_permutex2var_ps(e, hi_idx, o));
            }
        }
}
#endif

}  // namespace

bool conv2d_winograd_possible(const conv2d_args& c) {
    return cpu_has_avx512() && c.kh == 3 && c.kw == 3 && c.stride_h == 1 && c.stride_w == 1 && c.dil_h == 1 &&
           c.dil_w == 1 && !(conv2d_ci_per_group(c) == 1 && conv2d_co_per_group(c) == 1) && c.h_out >= 1 &&
           c.w_out >= 1;
}

bool conv2d_winograd_chosen(const conv2d_args& c) {
    const conv_method m = conv_method_in_use();
    if (m == conv_method::im2col || m == conv_method::direct || !c.w_winograd || !conv2d_winograd_possible(c))
        return false;
    return m == conv_method::winograd ||
           winograd_filters_wanted(conv2d_co_per_group(c), conv2d_ci_per_group(c), c.h_out, c.w_out);
}

bool winograd_filters_wanted(int64_t co_per_group, int64_t ci_per_group, int64_t h_out, int64_t w_out) {
    // Layers of 32 output channels (DenseNet's 128 -> 32 3x3 layers) make GEMMs of 32 rows that
    // cost more than the direct sums Winograd saves where 512-bit FMAs issue at full rate
    // (an Intel Xeon: 0.55-0.90x), and less where they issue at half rate and the sums are
    // what bounds the direct kernel (an AMD EPYC with AVX-512, batch 8 one layer alone: 56x56
    // 1.37x faster, 28x28 1.2x, 14x14 1.02x; DenseNet-121 in the model 1.09-1.12x).
    // The probe runs (once, ~0.7 ms) only when a layer of 32-63 channels asks.
    return ci_per_group >= 16 && h_out * w_out >= 144 &&
           (co_per_group >= 64 || (co_per_group >= 32 && cpu_fma512_half_rate()));
}

void winograd_filters(const float* w, int64_t c_out, int64_t ci_per_group, int64_t co_per_group, float* u) {
    for (int64_t g = 0; g * co_per_group < c_out; ++g)
        transform_filters(w + g * co_per_group * ci_per_group * 9, ci_per_group * 9, co_per_group, ci_per_group,
                          u + g * 16 * co_per_group * ci_per_group);
}

size_t conv2d_winograd_scratch_bytes(const conv2d_args& c) {
    const winograd_shape s = winograd_shape::of(c);
    const int64_t ci = conv2d_ci_per_group(c), nco = tile_co_max(c);
    return size_t(ci * s.rows * 2 * s.pw + positions * ((ci + nco) * s.tiles + 2 * plane_pad_floats)) * sizeof(float);
}

bool conv2d_winograd(const conv2d_args& c, const conv2d_tile& t, const float* x, const float* u, const float* bias,
                     float* y, float* scratch, const gpu::block_context& ctx) {
#if defined(__x86_64__) && defined(__GNUC__)
    const winograd_shape s = winograd_shape::of(c);
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), nco = t.co1 - t.co0;
    const int64_t hw_out = c.h_out * c.w_out;
    const int64_t oy0 = t.p0 / c.w_out, oy1 = (t.p1 + c.w_out - 1) / c.w_out;
    float* rows = scratch;                     // [ci][s.rows][even, odd][pw]
    const int64_t vp = ci * s.tiles + plane_pad_floats, mp = nco * s.tiles + plane_pad_floats;
    float* v = rows + ci * s.rows * 2 * s.pw;  // [16][ci][tiles], planes vp apart
    float* mm = v + positions * vp;            // [16][nco][tiles], planes mp apart
    const bool finishes = conv2d_direct_finishes(c);
    const direct_finish fin = direct_finish_of(c, bias);
    // Check points between chunks of input channels as in the GEMM path (tile_k of K = 9 x ci).
    const int64_t chunk = std::max<int64_t>(1, c.tile_k / 9);
    for (int64_t py = oy0; py < oy1; py += 2 * s.pairs) {
        if (ctx.preempted()) return false;
        const int64_t pairs = std::min(s.pairs, (oy1 - py + 1) / 2);
        for (int64_t k = 0; k < ci; ++k) {
            float* krows = rows + k * s.rows * 2 * s.pw;
            split_rows(c, s, x + k * c.h * c.w_in, py - c.pad_top, krows);
            transform_inputs(s, pairs, krows, k, vp, v);
        }
        const int64_t n = pairs * s.tw;
        for (int64_t xi = 0; xi < positions; ++xi)
            for (int64_t k0 = 0; k0 < ci; k0 += chunk) {
                if (ctx.preempted()) return false;
                const int64_t kc = std::min(chunk, ci - k0);
                sgemm(false, false, nco, n, kc, 1.0f, u + (xi * co_g + t.co0) * ci + k0, ci,
                      v + xi * vp + k0 * s.tiles, s.tiles, k0 == 0 ? 0.0f : 1.0f, mm + xi * mp, s.tiles);
            }
        for (int64_t m = 0; m < nco; ++m)
            transform_outputs(c, s, pairs, py, mm + m * s.tiles, mp, t.p0, t.p1, y + m * hw_out,
                              finishes && bias ? bias[m] : 0.0f, finishes ? &fin : nullptr);
    }
    return true;
#else
    (void)c, (void)t, (void)x, (void)u, (void)bias, (void)y, (void)scratch, (void)ctx;
    return false;  // never called: conv2d_winograd_possible is false without AVX-512
#endif
}

}  // namespace reefline::ml::kernels
