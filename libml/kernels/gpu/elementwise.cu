// Element-wise, copy, row, pooling, LRN, batch-norm and axis-gather kernels on the GPU. Each
// block does the elements (rows, planes) decomp.h gives block b, with its 256 threads
// striding over them; every output element is computed by one thread in the cpu kernels'
// arithmetic (cpu_elementwise.cc), so the results match the cpu backend's to the rounding of
// the math library, and are deterministic. Blocks are short (plan_options::elements_per_block
// elements), so the flag is checked at block start only.
#include "libml/kernels/gpu/common.cuh"

namespace reefline::ml::kernels::gpu_impl {

namespace {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// ---- copy -----------------------------------------------------------------------------------
__device__ bool copy_block_gpu(const copy_args& a, int64_t block) {
    const int64_t e0 = block * a.per_block;
    const int64_t e1 = min64(nd_count(a.shape), e0 + a.per_block);
    const bool narrow = shape_is_narrow(a.shape);
    const auto* x = static_cast<const uint8_t*>(a.x);
    auto* y = static_cast<uint8_t*>(a.y);
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
        const int64_t xo = a.x_offset + nd_offset_fast(a.shape, a.x_strides, e, narrow);
        const int64_t yo = a.y_offset + nd_offset_fast(a.shape, a.y_strides, e, narrow);
        switch (a.element_bytes) {
        case 1: y[yo] = x[xo]; break;
        case 2: reinterpret_cast<uint16_t*>(y)[yo] = reinterpret_cast<const uint16_t*>(x)[xo]; break;
        case 4: reinterpret_cast<uint32_t*>(y)[yo] = reinterpret_cast<const uint32_t*>(x)[xo]; break;
        case 8: reinterpret_cast<uint64_t*>(y)[yo] = reinterpret_cast<const uint64_t*>(x)[xo]; break;
        default:
            for (int64_t i = 0; i < a.element_bytes; ++i) y[yo * a.element_bytes + i] = x[xo * a.element_bytes + i];
        }
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) copy_kernel(copy_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = copy_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- binary ---------------------------------------------------------------------------------
__device__ __forceinline__ float binary_f(binary_op op, float x, float y) {
    switch (op) {
    case binary_op::add: return x + y;
    case binary_op::sub: return x - y;
    case binary_op::mul: return x * y;
    case binary_op::div: return x / y;
    case binary_op::pow: return powf(x, y);
    case binary_op::max: return x > y || isnan(x) ? x : y;
    case binary_op::min: return x < y || isnan(x) ? x : y;
    case binary_op::equal: return x == y ? 1.0f : 0.0f;
    case binary_op::greater: return x > y ? 1.0f : 0.0f;
    case binary_op::less: return x < y ? 1.0f : 0.0f;
    }
    return 0;
}

__device__ int64_t binary_i(binary_op op, int64_t x, int64_t y) {
    switch (op) {
    case binary_op::add: return int64_t(uint64_t(x) + uint64_t(y));
    case binary_op::sub: return int64_t(uint64_t(x) - uint64_t(y));
    case binary_op::mul: return int64_t(uint64_t(x) * uint64_t(y));
    case binary_op::div: return y == 0 ? 0 : (x == INT64_MIN && y == -1 ? x : x / y);
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

__device__ bool binary_block_gpu(const binary_args& a, int64_t block) {
    const int64_t e0 = block * a.per_block;
    const int64_t e1 = min64(nd_count(a.shape), e0 + a.per_block);
    const bool narrow = shape_is_narrow(a.shape);
    const binary_op op = a.op;
    if (a.a_type != elem::f32 || a.b_type != elem::f32 || a.y_type != elem::f32) {
        const bool compare = op == binary_op::equal || op == binary_op::greater || op == binary_op::less;
        const bool ints = is_integral(a.a_type) && is_integral(a.b_type) && (compare || is_integral(a.y_type));
        for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
            const int64_t oa = nd_offset_fast(a.shape, a.a_strides, e, narrow);
            const int64_t ob = nd_offset_fast(a.shape, a.b_strides, e, narrow);
            if (ints) {
                store_i(a.y, a.y_type, e, binary_i(op, load_i(a.a, a.a_type, oa), load_i(a.b, a.b_type, ob)));
            } else {
                const double x = load_f(a.a, a.a_type, oa), z = load_f(a.b, a.b_type, ob);
                double v;
                switch (op) {
                case binary_op::pow: v = pow(x, z); break;
                case binary_op::max: v = x > z || isnan(x) ? x : z; break;
                case binary_op::min: v = x < z || isnan(x) ? x : z; break;
                case binary_op::add: v = x + z; break;
                case binary_op::sub: v = x - z; break;
                case binary_op::mul: v = x * z; break;
                case binary_op::div: v = x / z; break;
                default: v = double(binary_f(op, float(x), float(z)));
                }
                store_f(a.y, a.y_type, e, v);
            }
        }
        return true;
    }
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
        float v = binary_f(op, a.a[nd_offset_fast(a.shape, a.a_strides, e, narrow)],
                           a.b[nd_offset_fast(a.shape, a.b_strides, e, narrow)]);
        if (a.ep.act != activation::none) v = act(v, a.ep);
        a.y[e] = v;
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) binary_kernel(binary_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = binary_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- unary ----------------------------------------------------------------------------------
__device__ __forceinline__ float unary_f(unary_op op, float x) {
    switch (op) {
    case unary_op::identity: return x;
    case unary_op::neg: return -x;
    case unary_op::abs: return fabsf(x);
    case unary_op::sqrt: return sqrtf(x);
    case unary_op::exp: return expf(x);
    case unary_op::log: return logf(x);
    case unary_op::erf: return erff(x);
    case unary_op::sin: return sinf(x);
    case unary_op::cos: return cosf(x);
    case unary_op::reciprocal: return 1.0f / x;
    case unary_op::floor: return floorf(x);
    case unary_op::ceil: return ceilf(x);
    case unary_op::scale:
    case unary_op::fill:
    case unary_op::clip: return x;
    }
    return x;
}

__device__ bool unary_block_gpu(const unary_args& a, int64_t block) {
    const int64_t e0 = block * a.per_block;
    const int64_t e1 = min64(a.count, e0 + a.per_block);
    if (a.x_type != elem::f32 || a.y_type != elem::f32) {
        const bool ints = is_integral(a.x_type) && is_integral(a.y_type);
        for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
            if (ints) {
                int64_t v = load_i(a.x, a.x_type, e);
                if (a.op == unary_op::clip) v = min64(max64(v, int64_t(a.alpha)), int64_t(a.beta));
                store_i(a.y, a.y_type, e, v);
            } else {
                double v = load_f(a.x, a.x_type, e);
                if (a.op == unary_op::clip) {
                    const double lo = a.alpha, hi = a.beta;
                    v = v < lo ? lo : v;  // std::max(v, lo) keeps v unless v < lo
                    v = hi < v ? hi : v;  // std::min(v, hi) keeps v unless hi < v
                }
                store_f(a.y, a.y_type, e, v);
            }
        }
        return true;
    }
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
        float v;
        switch (a.op) {
        case unary_op::clip: {
            // std::min(std::max(x, alpha), beta), no epilogue (as on the cpu).
            float m = a.x[e] < a.alpha ? a.alpha : a.x[e];
            a.y[e] = a.beta < m ? a.beta : m;
            continue;
        }
        case unary_op::identity: v = a.x[e]; break;
        case unary_op::fill: v = a.alpha; break;
        case unary_op::scale: v = a.x[e] * a.alpha; break;
        default: v = unary_f(a.op, a.x[e]);
        }
        if (a.ep.act != activation::none) v = act(v, a.ep);
        a.y[e] = v;
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) unary_kernel(unary_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = unary_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- where ----------------------------------------------------------------------------------
__device__ bool where_block_gpu(const where_args& a, int64_t block) {
    const int64_t e0 = block * a.per_block;
    const int64_t e1 = min64(nd_count(a.shape), e0 + a.per_block);
    const bool narrow = shape_is_narrow(a.shape);
    if (a.c_type != elem::f32 || a.type != elem::f32) {
        const int bytes = elem_bytes(a.type);
        for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
            const bool c = load_f(a.cond, a.c_type, nd_offset_fast(a.shape, a.c_strides, e, narrow)) != 0;
            const int64_t o = c ? nd_offset_fast(a.shape, a.a_strides, e, narrow)
                                : nd_offset_fast(a.shape, a.b_strides, e, narrow);
            const auto* src = reinterpret_cast<const uint8_t*>(c ? static_cast<const void*>(a.a)
                                                                 : static_cast<const void*>(a.b)) + o * bytes;
            auto* dst = reinterpret_cast<uint8_t*>(a.y) + e * bytes;
            for (int i = 0; i < bytes; ++i) dst[i] = src[i];
        }
        return true;
    }
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
        a.y[e] = a.cond[nd_offset_fast(a.shape, a.c_strides, e, narrow)] != 0
                     ? a.a[nd_offset_fast(a.shape, a.a_strides, e, narrow)]
                     : a.b[nd_offset_fast(a.shape, a.b_strides, e, narrow)];
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) where_kernel(where_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = where_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- row kernels: one 32-lane group per unit (row), sums in double as on the cpu ---------------
__device__ void row_unit(const row_args& a, int64_t u, unsigned lane) {
    if (a.op == row_op::layer_norm) {
        const int64_t n = a.axis * a.inner;
        const float* x = a.x + u * n;
        float* y = a.y + u * n;
        double s = 0;
        for (int64_t i = lane; i < n; i += kLanes) s += x[i];
        const double mean = group_sum(s) / double(n);
        double q = 0;
        for (int64_t i = lane; i < n; i += kLanes) q += (x[i] - mean) * (x[i] - mean);
        const double var = group_sum(q) / double(n);
        const float inv = float(1.0 / sqrt(var + a.epsilon));
        if (lane == 0) {
            if (a.mean_out) a.mean_out[u] = float(mean);
            if (a.inv_std_out) a.inv_std_out[u] = inv;
        }
        for (int64_t i = lane; i < n; i += kLanes)
            y[i] = float(x[i] - mean) * inv * a.scale[i] + (a.bias ? a.bias[i] : 0.0f);
        return;
    }
    const int64_t o = u / a.inner, in = u % a.inner, st = a.inner;
    const float* x = a.x + o * a.axis * a.inner + in;
    switch (a.op) {
    case row_op::softmax:
    case row_op::log_softmax: {
        float* y = a.y + o * a.axis * a.inner + in;
        float mx = -INFINITY;
        for (int64_t i = lane; i < a.axis; i += kLanes) mx = max_keep(mx, x[i * st]);
        mx = group_max(mx);
        double sum = 0;
        for (int64_t i = lane; i < a.axis; i += kLanes) sum += exp(double(x[i * st] - mx));
        sum = group_sum(sum);
        if (a.op == row_op::softmax) {
            const double inv = 1.0 / sum;
            for (int64_t i = lane; i < a.axis; i += kLanes) y[i * st] = float(exp(double(x[i * st] - mx)) * inv);
        } else {
            const double l = log(sum);
            for (int64_t i = lane; i < a.axis; i += kLanes) y[i * st] = float(double(x[i * st] - mx) - l);
        }
        break;
    }
    case row_op::reduce_mean:
    case row_op::reduce_sum: {
        double s = 0;
        for (int64_t i = lane; i < a.axis; i += kLanes) s += x[i * st];
        s = group_sum(s);
        if (lane == 0) a.y[o * a.inner + in] = float(a.op == row_op::reduce_mean ? s / double(a.axis) : s);
        break;
    }
    case row_op::reduce_max: {
        float m = -INFINITY;
        for (int64_t i = lane; i < a.axis; i += kLanes) m = max_keep(m, x[i * st]);
        m = group_max(m);
        if (lane == 0) a.y[o * a.inner + in] = m;
        break;
    }
    case row_op::layer_norm: break;
    }
}

__device__ bool row_block_gpu(const row_args& a, int64_t block) {
    const int64_t u0 = block * a.rows_per_block;
    const int64_t u1 = min64(row_units(a), u0 + a.rows_per_block);
    const unsigned group = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
    // Every lane of a group takes the same units, so the group's shuffles are uniform.
    for (int64_t u = u0 + group; u < u1; u += kGroups) row_unit(a, u, lane);
    return true;
}

__global__ void __launch_bounds__(kThreads) row_kernel(row_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = row_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- pooling: one thread per output element -----------------------------------------------
__device__ bool pool2d_block_gpu(const pool2d_args& a, int64_t block) {
    const int64_t Do = max64(1, a.d_out);
    const int64_t p0 = block * a.planes_per_block;
    const int64_t p1 = min64(a.n * a.c, p0 + a.planes_per_block);
    const int64_t out_plane = Do * a.h_out * a.w_out;
    const int64_t total = (p1 - p0) * out_plane;
    for (int64_t e = threadIdx.x; e < total; e += kThreads) {
        const int64_t plane = p0 + e / out_plane, o = e % out_plane;
        const int64_t od = o / (a.h_out * a.w_out), oy = (o / a.w_out) % a.h_out, ox = o % a.w_out;
        pool_output(a, plane, od, oy, ox);
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) pool2d_kernel(pool2d_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = pool2d_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- LRN across channels --------------------------------------------------------------------
__device__ bool lrn_block_gpu(const lrn_args& a, int64_t block) {
    const int64_t p0 = block * a.planes_per_block;
    const int64_t p1 = min64(a.n * a.c, p0 + a.planes_per_block);
    const int64_t lo = (a.size - 1) / 2, hi = a.size - 1 - lo;
    const int64_t total = (p1 - p0) * a.hw;
    for (int64_t e = threadIdx.x; e < total; e += kThreads) {
        const int64_t plane = p0 + e / a.hw, i = e % a.hw;
        const int64_t n = plane / a.c, c = plane % a.c;
        const int64_t c0 = max64(0, c - lo), c1 = min64(a.c - 1, c + hi);
        const float* xs = a.x + n * a.c * a.hw;
        double sq = 0;
        for (int64_t k = c0; k <= c1; ++k) sq += double(xs[k * a.hw + i]) * xs[k * a.hw + i];
        a.y[plane * a.hw + i] = float(xs[c * a.hw + i] / pow(a.bias + a.alpha / double(a.size) * sq, double(a.beta)));
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) lrn_kernel(lrn_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = lrn_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- batch normalisation (inference) --------------------------------------------------------
__device__ bool batchnorm_block_gpu(const batchnorm_args& a, int64_t block) {
    const int64_t p0 = block * a.planes_per_block;
    const int64_t p1 = min64(a.n * a.c, p0 + a.planes_per_block);
    const int64_t total = (p1 - p0) * a.hw;
    for (int64_t e = threadIdx.x; e < total; e += kThreads) {
        const int64_t plane = p0 + e / a.hw, i = e % a.hw;
        const int64_t c = plane % a.c;
        const float s = a.scale[c] / sqrtf(a.var[c] + a.epsilon);
        const float b = a.bias[c] - a.mean[c] * s;
        float v = a.x[plane * a.hw + i] * s + b;
        if (a.ep.act != activation::none) v = act(v, a.ep);
        a.y[plane * a.hw + i] = v;
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) batchnorm_kernel(batchnorm_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = batchnorm_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

// ---- gather along an axis -------------------------------------------------------------------
__device__ bool gather_axis_block_gpu(const gather_axis_args& a, int64_t block) {
    const int64_t r0 = block * a.rows_per_block;
    const int64_t r1 = min64(a.outer * a.count, r0 + a.rows_per_block);
    const int64_t eb = a.element_bytes, total = (r1 - r0) * a.inner;
    const auto* x = static_cast<const uint8_t*>(a.x);
    auto* y = static_cast<uint8_t*>(a.y);
    for (int64_t e = threadIdx.x; e < total; e += kThreads) {
        const int64_t r = r0 + e / a.inner, i = e % a.inner;
        const int64_t o = r / a.count, j = r % a.count;
        int64_t idx = gather_axis_index(a, j);
        if (idx < 0) idx += a.axis;
        uint8_t* dst = y + (r * a.inner + i) * eb;
        if (idx < 0 || idx >= a.axis) {  // out of range: zeros, never a wild read
            for (int64_t b = 0; b < eb; ++b) dst[b] = 0;
            continue;
        }
        const uint8_t* src = x + ((o * a.axis + idx) * a.inner + i) * eb;
        switch (eb) {
        case 1: *dst = *src; break;
        case 2: *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src); break;
        case 4: *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src); break;
        case 8: *reinterpret_cast<uint64_t*>(dst) = *reinterpret_cast<const uint64_t*>(src); break;
        default:
            for (int64_t b = 0; b < eb; ++b) dst[b] = src[b];
        }
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) gather_axis_kernel(gather_axis_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = gather_axis_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

}  // namespace

int launch_copy(const gpu_launch_params& p) { return launch_kernel<copy_args>(p, copy_kernel); }
int launch_binary(const gpu_launch_params& p) { return launch_kernel<binary_args>(p, binary_kernel); }
int launch_unary(const gpu_launch_params& p) { return launch_kernel<unary_args>(p, unary_kernel); }
int launch_where(const gpu_launch_params& p) { return launch_kernel<where_args>(p, where_kernel); }
int launch_row(const gpu_launch_params& p) { return launch_kernel<row_args>(p, row_kernel); }
int launch_pool2d(const gpu_launch_params& p) { return launch_kernel<pool2d_args>(p, pool2d_kernel); }
int launch_lrn(const gpu_launch_params& p) { return launch_kernel<lrn_args>(p, lrn_kernel); }
int launch_batchnorm(const gpu_launch_params& p) { return launch_kernel<batchnorm_args>(p, batchnorm_kernel); }
int launch_gather_axis(const gpu_launch_params& p) { return launch_kernel<gather_axis_args>(p, gather_axis_kernel); }
RL_KERNEL_RESOURCES(copy, copy_kernel, 0)
RL_KERNEL_RESOURCES(binary, binary_kernel, 0)
RL_KERNEL_RESOURCES(unary, unary_kernel, 0)
RL_KERNEL_RESOURCES(where, where_kernel, 0)
RL_KERNEL_RESOURCES(row, row_kernel, 0)
RL_KERNEL_RESOURCES(pool2d, pool2d_kernel, 0)
RL_KERNEL_RESOURCES(lrn, lrn_kernel, 0)
RL_KERNEL_RESOURCES(batchnorm, batchnorm_kernel, 0)
RL_KERNEL_RESOURCES(gather_axis, gather_axis_kernel, 0)

}  // namespace reefline::ml::kernels::gpu_impl
