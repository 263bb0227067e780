// CPU implementations of the element-wise, copy, row, pooling, LRN and axis-gather blocks.
// Blocks are small (a few thousand elements or rows), so the preemption flag is checked at
// block start; row kernels also check between rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "libml/kernels/elem_access.h"
#include "libml/kernels/cpu_planes16.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/cpu_window3x3.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

// The odometer's start: the index of element e0 and each view's offset there.
template <int Views>
void nd_start(const nd_shape& shape, const int64_t* const* strides, const int64_t* base, int64_t e0, int64_t* idx,
              int64_t* off) {
    int64_t rem = e0;
    for (int d = shape.rank - 1; d >= 0; --d) {
        idx[d] = rem % shape.dims[d];
        rem /= shape.dims[d];
    }
    for (int v = 0; v < Views; ++v) {
        off[v] = base[v];
        for (int d = 0; d < shape.rank; ++d) off[v] += idx[d] * strides[v][d];
    }
}

// Walks output elements [e0, e1) of `shape`, keeping the offsets of up to three strided views
// incrementally (an odometer), so the inner loop has no divisions.
template <int Views, typename F>
void for_each_nd(const nd_shape& shape, const int64_t* const* strides, const int64_t* base,
                 int64_t e0, int64_t e1, F&& f) {
    if (e0 >= e1) return;
    int64_t idx[max_dims] = {};
    int64_t off[Views];
    nd_start<Views>(shape, strides, base, e0, idx, off);
    const int last = shape.rank - 1;
    for (int64_t e = e0; e < e1; ++e) {
        f(off);
        if (last < 0) continue;
        // Advance the odometer by one element.
        int d = last;
        for (; d >= 0; --d) {
            for (int v = 0; v < Views; ++v) off[v] += strides[v][d];
            if (++idx[d] < shape.dims[d]) break;
            for (int v = 0; v < Views; ++v) off[v] -= strides[v][d] * shape.dims[d];
            idx[d] = 0;
        }
    }
}

// The same walk a row at a time: f(offsets, n) for runs of n consecutive elements along the
// last dim (offsets of each view at the run's first element; the run steps by each view's
// last-dim stride), so that the inner loop is a plain strided loop the compiler vectorises.
template <int Views, typename F>
void for_each_row(const nd_shape& shape, const int64_t* const* strides, const int64_t* base, int64_t e0, int64_t e1,
                  F&& f) {
    if (e0 >= e1) return;
    if (shape.rank == 0) {
        int64_t off[Views];
        for (int v = 0; v < Views; ++v) off[v] = base[v];
        f(off, e1 - e0);
        return;
    }
    int64_t idx[max_dims] = {};
    int64_t off[Views];
    nd_start<Views>(shape, strides, base, e0, idx, off);
    const int last = shape.rank - 1;
    for (int64_t e = e0; e < e1;) {
        const int64_t n = std::min(shape.dims[last] - idx[last], e1 - e);
        f(off, n);
        e += n;
        for (int v = 0; v < Views; ++v) off[v] += n * strides[v][last];
        idx[last] += n;
        // Carry into the outer dims.
        for (int d = last; d > 0 && idx[d] == shape.dims[d]; --d) {
            for (int v = 0; v < Views; ++v) off[v] += strides[v][d - 1] - strides[v][d] * shape.dims[d];
            idx[d] = 0;
            ++idx[d - 1];
        }
    }
}

// ---- typed element access (the slow, general path; f32 has its own loops): elem_access.h --

int64_t binary_i(binary_op op, int64_t x, int64_t y) {
    switch (op) {
    case binary_op::add: return int64_t(uint64_t(x) + uint64_t(y));
    case binary_op::sub: return int64_t(uint64_t(x) - uint64_t(y));
    case binary_op::mul: return int64_t(uint64_t(x) * uint64_t(y));
    case binary_op::div: return y == 0 ? 0 : (x == INT64_MIN && y == -1 ? x : x / y);  // truncates
    case binary_op::pow: {
        if (y < 0) return x == 1 ? 1 : (x == -1 ? (y & 1 ? -1 : 1) : 0);
        int64_t r = 1;
        for (int64_t e = 0; e < y && e < 64; ++e) r = int64_t(uint64_t(r) * uint64_t(x));
        return r;
    }
    case binary_op::max: return x > y ? x : y;
    case binary_op::min: return x < y ? x : y;
    case binary_op::equal: return x == y;
    case binary_op::greater: return x > y;
    case binary_op::less: return x < y;
    }
    return 0;
}

bool copy_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const copy_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t e0 = int64_t(ctx.block) * a.per_block;
    const int64_t e1 = std::min(nd_count(a.shape), e0 + a.per_block);
    const int64_t* strides[2] = {a.x_strides, a.y_strides};
    const int64_t base[2] = {a.x_offset, a.y_offset};
    const auto* x = static_cast<const uint8_t*>(a.x);
    auto* y = static_cast<uint8_t*>(a.y);
    const int64_t eb = a.element_bytes;
    const int last = a.shape.rank - 1;
    const int64_t sx = last >= 0 ? a.x_strides[last] : 1, sy = last >= 0 ? a.y_strides[last] : 1;
    for_each_row<2>(a.shape, strides, base, e0, e1, [&](const int64_t* o, int64_t n) {
        uint8_t* dst = y + o[1] * eb;
        const uint8_t* src = x + o[0] * eb;
        if (sx == 1 && sy == 1) {
            std::memcpy(dst, src, size_t(n * eb));
        } else if (eb == 4) {
            const auto* s4 = reinterpret_cast<const uint32_t*>(src);
            auto* d4 = reinterpret_cast<uint32_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d4[i * sy] = s4[i * sx];
        } else {
            for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * sy * eb, src + i * sx * eb, size_t(eb));
        }
    });
    return true;
}

inline float binary(binary_op op, float x, float y) {
    switch (op) {
    case binary_op::add: return x + y;
    case binary_op::sub: return x - y;
    case binary_op::mul: return x * y;
    case binary_op::div: return x / y;
    case binary_op::pow: return std::pow(x, y);
    case binary_op::max: return x > y || std::isnan(x) ? x : y;
    case binary_op::min: return x < y || std::isnan(x) ? x : y;
    case binary_op::equal: return x == y ? 1.0f : 0.0f;
    case binary_op::greater: return x > y ? 1.0f : 0.0f;
    case binary_op::less: return x < y ? 1.0f : 0.0f;
    }
    return 0;
}

// y[i] = f(a[i * sa], b[i * sb]) for a run: the broadcast patterns of transformers and CNNs
// (same shape, a row against a scalar or a vector) as unit-stride loops.
template <typename F>
inline void binary_run(float* y, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n, F f) {
    if (sa == 1 && sb == 1) {
        for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
    } else if (sa == 1 && sb == 0) {
        const float c = *b;
        for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], c);
    } else if (sa == 0 && sb == 1) {
        const float c = *a;
        for (int64_t i = 0; i < n; ++i) y[i] = f(c, b[i]);
    } else {
        for (int64_t i = 0; i < n; ++i) y[i] = f(a[i * sa], b[i * sb]);
    }
}

bool binary_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const binary_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t e0 = int64_t(ctx.block) * a.per_block;
    const int64_t e1 = std::min(nd_count(a.shape), e0 + a.per_block);
    const int64_t* strides[2] = {a.a_strides, a.b_strides};
    const int64_t base[2] = {0, 0};
    const binary_op op = a.op;
    if (a.a_type != elem::f32 || a.b_type != elem::f32 || a.y_type != elem::f32) {
        const bool compare = op == binary_op::equal || op == binary_op::greater || op == binary_op::less;
        // Integers (and comparisons of integers) exactly in int64; everything else in double.
        const bool ints = is_integral(a.a_type) && is_integral(a.b_type) && (compare || is_integral(a.y_type));
        int64_t e = e0;
        for_each_nd<2>(a.shape, strides, base, e0, e1, [&](const int64_t* o) {
            if (ints) {
                store_i(a.y, a.y_type, e++, binary_i(op, load_i(a.a, a.a_type, o[0]), load_i(a.b, a.b_type, o[1])));
            } else {
                const double x = load_f(a.a, a.a_type, o[0]), z = load_f(a.b, a.b_type, o[1]);
                double v;
                switch (op) {
                case binary_op::pow: v = std::pow(x, z); break;
                case binary_op::max: v = x > z || std::isnan(x) ? x : z; break;
                case binary_op::min: v = x < z || std::isnan(x) ? x : z; break;
                default: v = double(binary(op, float(x), float(z)));
                    if (op == binary_op::add) v = x + z;
                    if (op == binary_op::sub) v = x - z;
                    if (op == binary_op::mul) v = x * z;
                    if (op == binary_op::div) v = x / z;
                }
                store_f(a.y, a.y_type, e++, v);
            }
        });
        return true;
    }
    float* y = a.y + e0;
    const int last = a.shape.rank - 1;
    const int64_t sa = last >= 0 ? a.a_strides[last] : 0, sb = last >= 0 ? a.b_strides[last] : 0;
    for_each_row<2>(a.shape, strides, base, e0, e1, [&](const int64_t* o, int64_t n) {
        const float* pa = a.a + o[0];
        const float* pb = a.b + o[1];
        switch (op) {
        case binary_op::add: binary_run(y, pa, sa, pb, sb, n, [](float u, float v) { return u + v; }); break;
        case binary_op::sub: binary_run(y, pa, sa, pb, sb, n, [](float u, float v) { return u - v; }); break;
        case binary_op::mul: binary_run(y, pa, sa, pb, sb, n, [](float u, float v) { return u * v; }); break;
        case binary_op::div: binary_run(y, pa, sa, pb, sb, n, [](float u, float v) { return u / v; }); break;
        default: binary_run(y, pa, sa, pb, sb, n, [op](float u, float v) { return binary(op, u, v); }); break;
        }
        y += n;
    });
    if (a.ep.act != activation::none) apply_epilogue(a.y + e0, e1 - e0, a.ep);
    return true;
}

inline float unary(unary_op op, float x) {
    switch (op) {
    case unary_op::identity: return x;
    case unary_op::neg: return -x;
    case unary_op::abs: return std::fabs(x);
    case unary_op::sqrt: return std::sqrt(x);
    case unary_op::exp: return std::exp(x);
    case unary_op::log: return std::log(x);
    case unary_op::erf: return erf_fast(x);
    case unary_op::sin: return std::sin(x);
    case unary_op::cos: return std::cos(x);
    case unary_op::reciprocal: return 1.0f / x;
    case unary_op::floor: return std::floor(x);
    case unary_op::ceil: return std::ceil(x);
    case unary_op::scale:
    case unary_op::fill:
    case unary_op::clip: return x;  // handled by the block loop
    }
    return x;
}

bool unary_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const unary_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t e0 = int64_t(ctx.block) * a.per_block;
    const int64_t e1 = std::min(a.count, e0 + a.per_block);
    if (a.x_type != elem::f32 || a.y_type != elem::f32) {  // casts and typed clips
        const bool ints = is_integral(a.x_type) && is_integral(a.y_type);
        for (int64_t e = e0; e < e1; ++e) {
            if (ints) {
                int64_t v = load_i(a.x, a.x_type, e);
                if (a.op == unary_op::clip) v = std::min<int64_t>(std::max<int64_t>(v, int64_t(a.alpha)), int64_t(a.beta));
                store_i(a.y, a.y_type, e, v);
            } else {
                double v = load_f(a.x, a.x_type, e);
                if (a.op == unary_op::clip) v = std::min<double>(std::max<double>(v, a.alpha), a.beta);
                store_f(a.y, a.y_type, e, v);
            }
        }
        return true;
    }
    if (a.op == unary_op::clip) {
        for (int64_t e = e0; e < e1; ++e) a.y[e] = std::min(std::max(a.x[e], a.alpha), a.beta);
        return true;
    }
    if (a.op == unary_op::identity) {
        std::memcpy(a.y + e0, a.x + e0, size_t(e1 - e0) * sizeof(float));
    } else if (a.op == unary_op::fill) {
        std::fill(a.y + e0, a.y + e1, a.alpha);
    } else if (a.op == unary_op::scale) {
        for (int64_t e = e0; e < e1; ++e) a.y[e] = a.x[e] * a.alpha;
    } else {
        for (int64_t e = e0; e < e1; ++e) a.y[e] = unary(a.op, a.x[e]);
    }
    if (a.ep.act != activation::none) apply_epilogue(a.y + e0, e1 - e0, a.ep);
    return true;
}

bool where_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const where_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t e0 = int64_t(ctx.block) * a.per_block;
    const int64_t e1 = std::min(nd_count(a.shape), e0 + a.per_block);
    const int64_t* strides[3] = {a.c_strides, a.a_strides, a.b_strides};
    const int64_t base[3] = {0, 0, 0};
    if (a.c_type != elem::f32 || a.type != elem::f32) {
        int64_t e = e0;
        const size_t bytes = a.type == elem::f64 || a.type == elem::i64 ? 8
                             : a.type == elem::f32 || a.type == elem::i32 ? 4
                             : a.type == elem::f16 ? 2 : 1;
        for_each_nd<3>(a.shape, strides, base, e0, e1, [&](const int64_t* o) {
            const bool c = load_f(a.cond, a.c_type, o[0]) != 0;
            const auto* src = c ? reinterpret_cast<const uint8_t*>(a.a) + o[1] * int64_t(bytes)
                                : reinterpret_cast<const uint8_t*>(a.b) + o[2] * int64_t(bytes);
            std::memcpy(reinterpret_cast<uint8_t*>(a.y) + e++ * int64_t(bytes), src, bytes);
        });
        return true;
    }
    float* y = a.y + e0;
    const int last = a.shape.rank - 1;
    const int64_t sc = last >= 0 ? a.c_strides[last] : 0, sa = last >= 0 ? a.a_strides[last] : 0,
                  sb = last >= 0 ? a.b_strides[last] : 0;
    for_each_row<3>(a.shape, strides, base, e0, e1, [&](const int64_t* o, int64_t n) {
        const float *c = a.cond + o[0], *pa = a.a + o[1], *pb = a.b + o[2];
        for (int64_t i = 0; i < n; ++i) y[i] = c[i * sc] != 0 ? pa[i * sa] : pb[i * sb];
        y += n;
    });
    return true;
}

bool row_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const row_args*>(p);
    const int64_t u0 = int64_t(ctx.block) * a.rows_per_block;
    const int64_t u1 = std::min(row_units(a), u0 + a.rows_per_block);
    int64_t u = u0;
    // Rows of 16 values or more: row_sum_lanes (global average pools of 49-64 values a row).
    if ((a.op == row_op::reduce_mean || a.op == row_op::reduce_sum) && a.inner == 1 && a.axis >= 16 &&
        cpu_has_avx512()) {
        for (; u < u1; ++u) {
            if ((u - u0) % 64 == 0 && ctx.preempted()) return false;
            double sum = 0;
            row_sum_lanes(a.x + u * a.axis, a.axis, sum);
            a.y[u] = float(a.op == row_op::reduce_mean ? sum / double(a.axis) : sum);
        }
        return true;
    }
    // Lines 16 apart (global pools of c16 tensors: each pixel's 16 channels), a block of 16 at
    // a time where the block's units hold whole ones.
    if ((a.op == row_op::reduce_mean || a.op == row_op::reduce_sum || a.op == row_op::reduce_max) && a.inner == 16) {
        for (; u + 16 <= u1 && u % 16 == 0; u += 16) {
            if (ctx.preempted()) return false;
            if (!reduce_lines16(a.x + u * a.axis, a.axis, a.op == row_op::reduce_max, a.op == row_op::reduce_mean, a.y + u))
                break;
        }
    }
    if ((a.op == row_op::reduce_mean || a.op == row_op::reduce_sum) && a.inner == 1) {
        // Contiguous rows (global average pools: 49 values a channel) eight at a time: each
        // row's sum runs in its own order as below, and the eight chains of dependent double
        // adds overlap (MobileNet-v2's pool at batch 8 took 0.21 ms, 20 ns a row).
        constexpr int64_t lanes = 8;
        for (; u + lanes <= u1; u += lanes) {
            if (ctx.preempted()) return false;
            const float* x = a.x + u * a.axis;
            double sum[lanes] = {};
            for (int64_t i = 0; i < a.axis; ++i)
                for (int64_t r = 0; r < lanes; ++r) sum[r] += x[r * a.axis + i];
            for (int64_t r = 0; r < lanes; ++r)
                a.y[u + r] = float(a.op == row_op::reduce_mean ? sum[r] / double(a.axis) : sum[r]);
        }
    }
    for (; u < u1; ++u) {
        if (ctx.preempted()) return false;
        if (a.op == row_op::layer_norm) {
            const int64_t n = a.axis * a.inner;
            layer_norm_row(a.x + u * n, a.y + u * n, n, a.scale, a.bias, a.epsilon, a.mean_out ? a.mean_out + u : nullptr,
                           a.inv_std_out ? a.inv_std_out + u : nullptr);
            continue;
        }
        // softmax-like and reductions: one (outer, inner) line along the axis.
        const int64_t o = u / a.inner, in = u % a.inner;
        const float* x = a.x + o * a.axis * a.inner + in;
        const int64_t st = a.inner;
        switch (a.op) {
        case row_op::softmax:
        case row_op::log_softmax:
            softmax_row(x, a.y + o * a.axis * a.inner + in, a.axis, st, a.op == row_op::log_softmax);
            break;
        case row_op::reduce_mean:
        case row_op::reduce_sum: {
            double s = 0;
            for (int64_t i = 0; i < a.axis; ++i) s += x[i * st];
            a.y[o * a.inner + in] = float(a.op == row_op::reduce_mean ? s / double(a.axis) : s);
            break;
        }
        case row_op::reduce_max: {
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t i = 0; i < a.axis; ++i) m = std::max(m, x[i * st]);
            a.y[o * a.inner + in] = m;
            break;
        }
        case row_op::layer_norm: break;
        }
    }
    return true;
}

// First and one-past-last window tap t (position o + t * dil) inside [0, n).
inline void clip_window(int64_t o, int64_t dil, int64_t taps, int64_t n, int64_t& t0, int64_t& t1) {
    t0 = o >= 0 ? 0 : (-o + dil - 1) / dil;
    t1 = o >= n ? 0 : std::min(taps, (n - 1 - o) / dil + 1);
}

// 2-D max pooling without indices (the common case: every CNN's max pools): the window is
// clipped to the input once per output row and column instead of testing every tap, which
// made ResNet-50's 3x3/2 stem pool ~9% of its run time. Same results as the general loop: the
// first tap inside the input seeds the maximum and only a strictly greater value replaces it.
bool max_pool2d_planes(const pool2d_args& a, int64_t p0, int64_t p1, const gpu::block_context& ctx) {
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        const float* x = a.x + plane * a.h * a.w;
        float* y = a.y + plane * a.h_out * a.w_out;
        for (int64_t oy = 0; oy < a.h_out; ++oy) {
            const int64_t y0 = oy * a.stride_h - a.pad_top;
            int64_t r0, r1;
            clip_window(y0, a.dil_h, a.kh, a.h, r0, r1);
            for (int64_t ox = 0; ox < a.w_out; ++ox) {
                const int64_t x0 = ox * a.stride_w - a.pad_left;
                int64_t q0, q1;
                clip_window(x0, a.dil_w, a.kw, a.w, q0, q1);
                float m = -std::numeric_limits<float>::infinity();
                if (r0 < r1 && q0 < q1) {
                    m = x[(y0 + r0 * a.dil_h) * a.w + x0 + q0 * a.dil_w];
                    for (int64_t r = r0; r < r1; ++r) {
                        const float* row = x + (y0 + r * a.dil_h) * a.w + x0;
                        for (int64_t q = q0; q < q1; ++q) {
                            const float v = row[q * a.dil_w];
                            if (v > m) m = v;
                        }
                    }
                }
                y[oy * a.w_out + ox] = m;
            }
        }
    }
    return true;
}

// 2-D pooling without dilation, a plane at a time by pool_plane_separable; averages then
// divided by their counts, which are separable: rows of the window counted times columns
// counted (inside the input, or inside the padded input when count_include_pad; never beyond
// it, as ceil_mode's last windows reach).
bool separable_pool2d_planes(const pool2d_args& a, int64_t p0, int64_t p1, const gpu::block_context& ctx) {
    const int64_t in_plane = a.h * a.w, out_plane = a.h_out * a.w_out;
    // The columns each output counts are the same in every row and plane: once per block.
    float columns[pool_max_columns];
    const bool average = a.op == pool_op::average;
    if (average)
        for (int64_t ox = 0; ox < a.w_out; ++ox)
            columns[ox] = float(pool_window_count(a, ox, a.stride_w, a.pad_left, a.pad_right, a.kw, a.w));
    auto* scratch = static_cast<float*>(ctx.scratch);
    int64_t plane = p0;
    if (pool_window_possible(a)) return !ctx.preempted() && pool_window(a, p0, p1, columns, ctx);
    if (p1 - p0 >= 16 && pool16_possible(a) && ctx.scratch_size >= pool16_scratch_bytes(a))
        for (; plane + 16 <= p1; plane += 16) {
            if (ctx.preempted()) return false;
            pool16(a, plane, scratch);
        }
    for (; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        float* y = a.y + plane * out_plane;
        pool_plane_separable(a, a.x + plane * in_plane, y, scratch);
        if (!average) continue;
        for (int64_t oy = 0; oy < a.h_out; ++oy)
            divide_row(y + oy * a.w_out,
                       float(pool_window_count(a, oy, a.stride_h, a.pad_top, a.pad_bottom, a.kh, a.h)), columns,
                       a.w_out);
    }
    return true;
}

bool pool2d_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const pool2d_args*>(p);
    const int64_t Do = std::max<int64_t>(1, a.d_out);
    const int64_t p0 = int64_t(ctx.block) * a.planes_per_block;
    const int64_t p1 = std::min(a.n * a.c, p0 + a.planes_per_block);
    // The planned scratch (pool2d_scratch_bytes) holds a plane's rows reduced across columns.
    if (pool2d_is_separable(a) && ctx.scratch &&
        ctx.scratch_size >= pool2d_scratch_bytes(a))
        return separable_pool2d_planes(a, p0, p1, ctx);
    if (a.op == pool_op::max && !a.indices && a.d <= 1 && Do == 1 && a.kd <= 1) return max_pool2d_planes(a, p0, p1, ctx);
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        for (int64_t od = 0; od < Do; ++od)
            for (int64_t oy = 0; oy < a.h_out; ++oy)
                for (int64_t ox = 0; ox < a.w_out; ++ox) pool_output(a, plane, od, oy, ox);
    }
    return true;
}

bool lrn_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const lrn_args*>(p);
    const int64_t p0 = int64_t(ctx.block) * a.planes_per_block;
    const int64_t p1 = std::min(a.n * a.c, p0 + a.planes_per_block);
    const int64_t lo = (a.size - 1) / 2, hi = a.size - 1 - lo;  // ONNX: floor / ceil halves
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        const int64_t n = plane / a.c, c = plane % a.c;
        const int64_t c0 = std::max<int64_t>(0, c - lo), c1 = std::min(a.c - 1, c + hi);
        const float* xs = a.x + n * a.c * a.hw;
        for (int64_t i = 0; i < a.hw; ++i) {
            double sq = 0;
            for (int64_t k = c0; k <= c1; ++k) sq += double(xs[k * a.hw + i]) * xs[k * a.hw + i];
            a.y[plane * a.hw + i] =
                float(xs[c * a.hw + i] / std::pow(a.bias + a.alpha / double(a.size) * sq, double(a.beta)));
        }
    }
    return true;
}

bool batchnorm_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const batchnorm_args*>(p);
    const int64_t p0 = int64_t(ctx.block) * a.planes_per_block;
    const int64_t p1 = std::min(a.n * a.c, p0 + a.planes_per_block);
    for (int64_t plane = p0; plane < p1; ++plane) {
        if (ctx.preempted()) return false;
        const int64_t c = plane % a.c;
        const float s = a.scale[c] / std::sqrt(a.var[c] + a.epsilon);
        const float b = a.bias[c] - a.mean[c] * s;
        const float* x = a.x + plane * a.hw;
        float* y = a.y + plane * a.hw;
        affine_row(y, x, s, b, a.hw, a.ep);
    }
    return true;
}

bool gather_axis_block(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const gather_axis_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t r0 = int64_t(ctx.block) * a.rows_per_block;
    const int64_t r1 = std::min(a.outer * a.count, r0 + a.rows_per_block);
    const size_t row = size_t(a.inner) * size_t(a.element_bytes);
    const auto* x = static_cast<const uint8_t*>(a.x);
    auto* y = static_cast<uint8_t*>(a.y);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r / a.count, j = r % a.count;
        int64_t idx = gather_axis_index(a, j);
        if (idx < 0) idx += a.axis;
        if (idx < 0 || idx >= a.axis) {  // out of range: zeros, never a wild read
            std::memset(y + size_t(r) * row, 0, row);
            continue;
        }
        std::memcpy(y + size_t(r) * row, x + (size_t(o * a.axis + idx)) * row, row);
    }
    return true;
}

}  // namespace

const gpu::kernel_info copy_kernel = {"copy", copy_block, 256, 32, 0, 0};
const gpu::kernel_info binary_kernel = {"binary", binary_block, 256, 32, 0, 0};
const gpu::kernel_info unary_kernel = {"unary", unary_block, 256, 32, 0, 0};
const gpu::kernel_info where_kernel = {"where", where_block, 256, 32, 0, 0};
const gpu::kernel_info row_kernel = {"row", row_block, 256, 40, 0, 0};
const gpu::kernel_info pool2d_kernel = {"pool2d", pool2d_block, 256, 32, 0, 0};
const gpu::kernel_info batchnorm_kernel = {"batchnorm", batchnorm_block, 256, 32, 0, 0};
const gpu::kernel_info lrn_kernel = {"lrn", lrn_block, 256, 32, 0, 0};
const gpu::kernel_info gather_axis_kernel = {"gather_axis", gather_axis_block, 256, 32, 0, 0};

}  // namespace reefline::ml::kernels
