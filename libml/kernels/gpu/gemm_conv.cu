// GEMM and convolution on the GPU: each block computes the output tile decomp.h assigns to
// it (gemm_block / conv2d_block), in sub-tiles of 64 x 64 with 256 threads, whatever tile the
// plan chose: the plan picks 64 x 64 tiles when it plans for a GPU (plan_options::tiles), and
// a block given a larger (cpu) tile loops over its sub-tiles.
//
// Convolution is an implicit GEMM: W[co, K] x cols[K, pixels] with K = c_in/groups * kh * kw,
// the im2col column gathered from the input while the tile is loaded (no scratch memory).
//
// Two inner products:
// - fp32: shared-memory tiles of K = 16, each thread a 4 x 4 register tile (the default; the
//   results differ from the cpu backend's by summation order only);
// - tensor cores (nvcc builds, WMMA): A and B rounded to fp16 or bf16 as they are staged in
//   shared memory, products accumulated in fp32; chosen per launch by the device option
//   (gpu_device_options::math). hipcc 5.2 has no WMMA: the HIP build runs fp32 for both.
//
// Preemption: the block checks the flag (and its level) at its start and then at every K step,
// in the barrier the step already has (k_checks); args.tile_k is the cpu kernels' interval.
// Fused epilogue, as on the cpu: GEMM alpha, bias (any bias_kind, times beta) and activation;
// conv bias, residual and activation, in the cpu kernels' order of additions.
#include "libml/kernels/gpu/common.cuh"

#if defined(RL_GPU_WMMA) && !defined(RL_GPU_EMU)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

namespace reefline::ml::kernels::gpu_impl {

namespace {

constexpr int BM = 64;  // sub-tile rows (GEMM m, conv output channels)
constexpr int BN = 64;  // sub-tile columns (GEMM n, conv output pixels)

enum math_mode : int { math_fp32 = 0, math_f16 = 1, math_bf16 = 2 };

// Shared memory of a block (its tiles, from the launch's dynamic shared memory).
constexpr int BK_FP32 = 16, BK_WMMA = 32;
constexpr int LDA_WMMA = BK_WMMA + 8, LDB_WMMA = BN + 8, LDC_WMMA = BN + 4;  // WMMA: multiples of 8 (16-bit), 4 (fp32)
constexpr uint32_t fp32_tile_bytes = 2u * BK_FP32 * (BM + 4) * 4u;
static_assert(BM == BN, "fp32 tiles: As and Bs have one shape");
// WMMA tiles of T inputs (2 bytes on GPUs; the SIMT emulation's stand-ins are wider).
template <typename T>
constexpr uint32_t wmma_a_bytes = uint32_t(BM * LDA_WMMA * sizeof(T));
template <typename T>
constexpr uint32_t wmma_b_bytes = uint32_t(BK_WMMA * LDB_WMMA * sizeof(T));
template <typename T>
constexpr uint32_t wmma_tile_bytes = wmma_a_bytes<T> + wmma_b_bytes<T> + uint32_t(BM * LDC_WMMA * 4);

// One block's GEMM operands: A is [M x K], B is [K x N], either transposed in memory.
struct gemm_view {
    const float* a;
    const float* b;
    int64_t lda, ldb;
    bool ta, tb;
    __device__ bool a_k_fast() const { return !ta; }  // consecutive k adjacent in memory
    __device__ bool b_n_fast() const { return !tb; }  // consecutive n adjacent in memory
    __device__ float a_at(int64_t m, int64_t k) const { return ta ? a[k * lda + m] : a[m * lda + k]; }
    __device__ void prepare_b(int64_t, int64_t) {}
    __device__ float b_at(int64_t k, int64_t n) const { return tb ? b[n * ldb + k] : b[k * ldb + n]; }
};

// One block's convolution operands for one image and group: A = weights [co_g x K], B = the
// im2col matrix [K x pixels], read from the input on the fly. B is loaded with consecutive
// threads on consecutive pixels, and each thread always loads the same pixel column of a
// sub-tile (prepare_b), so its output coordinates are computed once per sub-tile.
struct conv_view {
    const float* x;  // the image's input channels of the group: [c_in/groups, h, w]
    const float* w;  // the group's weights: [c_out/groups, K]
    int32_t K, khw, kw, h, w_in, w_out, sh, sw, pt, pl, dh, dw;
    int32_t iy0 = 0, ix0 = 0;
    bool valid = false;
    __device__ bool a_k_fast() const { return true; }
    __device__ bool b_n_fast() const { return true; }
    __device__ float a_at(int64_t m, int64_t k) const { return w[m * K + k]; }
    __device__ void prepare_b(int64_t p, int64_t p_end) {
        valid = p < p_end;
        const int32_t q = int32_t(p), oy = q / w_out, ox = q - oy * w_out;
        iy0 = oy * sh - pt;
        ix0 = ox * sw - pl;
    }
    __device__ float b_at(int64_t k, int64_t) const {
        if (!valid) return 0.0f;
        const int32_t kk = int32_t(k), ch = kk / khw, rs = kk - ch * khw, r = rs / kw, s = rs - r * kw;
        const int32_t iy = iy0 + r * dh, ix = ix0 + s * dw;
        if (iy < 0 || iy >= h || ix < 0 || ix >= w_in) return 0.0f;
        return x[(int64_t(ch) * h + iy) * w_in + ix];
    }
};

// Preemption checks inside the K loop: at every K step (16 or 32 of K, well under a
// microsecond of a block's time), folded into the barrier the step has anyway: thread 0 reads
// the task's flag and the launch's level before the step's tile loads, so the read overlaps
// them, and the step's first barrier (__syncthreads_or instead of __syncthreads) tells every
// thread. No barrier is added; a raise stops the block within one step.
struct k_checks {
    const uint32_t* flag;
    const uint32_t* level;
    uint32_t epoch;
    __device__ explicit k_checks(const launch_ctx& c) : flag(c.preempt), level(c.level), epoch(c.epoch) {}
    // Thread 0's view (the others' is 0): 1 when the block must stop.
    __device__ __forceinline__ int read() const {
        return threadIdx.x == 0 && (flag || level) && stop_requested(flag, level, epoch) ? 1 : 0;
    }
};

// fp32 product of a sub-tile: acc[i][j] is output (m0 + ty + 16 i, n0 + tx + 16 j).
template <typename V>
__device__ bool tile_fp32(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, k_checks& checks,
                          float (&acc)[4][4], unsigned char* smem) {
    constexpr int BK = BK_FP32;
    using a_tile = float[BK][BM + 4];
    a_tile& As = *reinterpret_cast<a_tile*>(smem);
    a_tile& Bs = *reinterpret_cast<a_tile*>(smem + sizeof(a_tile));
    const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    v.prepare_b(n0 + tid % BN, n1);
    const bool a_fast = v.a_k_fast(), b_fast = v.b_n_fast();
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        const int stop = checks.read();
#pragma unroll
        for (int r = 0; r < (BM * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int mm = a_fast ? i / BK : i % BM, kk = a_fast ? i % BK : i / BM;
            const int64_t m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < m1 && k < K) ? v.a_at(m, k) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < (BN * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int nn = b_fast ? i % BN : i / BK, kk = b_fast ? i / BN : i % BK;
            const int64_t n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < n1 && k < K) ? v.b_at(k, n) : 0.0f;
        }
        if (__syncthreads_or(stop)) return false;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    return true;
}

#if defined(RL_GPU_WMMA)
template <typename T>
__device__ __forceinline__ T to_input(float x);
template <>
__device__ __forceinline__ __half to_input<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 to_input<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Tensor-core product of a sub-tile (WMMA 16x16x16): 8 warps, each a 16 x 32 strip of the
// 64 x 64 sub-tile; the fp32 results go through shared memory into the same acc layout as
// tile_fp32, so both share the epilogue.
template <typename T, typename V>
__device__ bool tile_wmma(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, k_checks& checks,
                          float (&acc)[4][4], unsigned char* smem) {
    namespace wmma = nvcuda::wmma;
    constexpr int BK = BK_WMMA, LDA = LDA_WMMA, LDB = LDB_WMMA, LDC = LDC_WMMA;
    static_assert(wmma_a_bytes<T> % 32 == 0 && wmma_b_bytes<T> % 32 == 0, "WMMA tiles are 32-byte aligned");
    using a_tile = T[BM][LDA];
    using b_tile = T[BK][LDB];
    using c_tile = float[BM][LDC];
    a_tile& As = *reinterpret_cast<a_tile*>(smem);
    b_tile& Bs = *reinterpret_cast<b_tile*>(smem + wmma_a_bytes<T>);
    c_tile& Cs = *reinterpret_cast<c_tile*>(smem + wmma_a_bytes<T> + wmma_b_bytes<T>);
    const int tid = int(threadIdx.x), warp = tid / 32, wm = warp / 2, wn = warp % 2;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2];
    wmma::fill_fragment(c[0], 0.0f);
    wmma::fill_fragment(c[1], 0.0f);
    v.prepare_b(n0 + tid % BN, n1);
    const bool a_fast = v.a_k_fast(), b_fast = v.b_n_fast();
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        const int stop = checks.read();
#pragma unroll
        for (int r = 0; r < (BM * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int mm = a_fast ? i / BK : i % BM, kk = a_fast ? i % BK : i / BM;
            const int64_t m = m0 + mm, k = k0 + kk;
            As[mm][kk] = to_input<T>((m < m1 && k < K) ? v.a_at(m, k) : 0.0f);
        }
#pragma unroll
        for (int r = 0; r < (BN * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int nn = b_fast ? i % BN : i / BK, kk = b_fast ? i / BN : i % BK;
            const int64_t n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = to_input<T>((n < n1 && k < K) ? v.b_at(k, n) : 0.0f);
        }
        if (__syncthreads_or(stop)) return false;
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af;
            wmma::load_matrix_sync(af, &As[wm * 16][ks], LDA);
#pragma unroll
            for (int f = 0; f < 2; ++f) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf;
                wmma::load_matrix_sync(bf, &Bs[ks][wn * 32 + f * 16], LDB);
                wmma::mma_sync(c[f], af, bf, c[f]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int f = 0; f < 2; ++f)
        wmma::store_matrix_sync(&Cs[wm * 16][wn * 32 + f * 16], c[f], LDC, wmma::mem_row_major);
    __syncthreads();
    const int tx = tid % 16, ty = tid / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = Cs[ty + 16 * i][tx + 16 * j];
    __syncthreads();  // Cs is written again by the next sub-tile
    return true;
}
#endif

template <int Mode, typename V>
__device__ __forceinline__ bool tile_product(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K,
                                             k_checks& checks, float (&acc)[4][4], unsigned char* smem) {
#if defined(RL_GPU_WMMA)
    if constexpr (Mode == math_f16)
        return tile_wmma<__half>(v, m0, m1, n0, n1, K, checks, acc, smem);
    else if constexpr (Mode == math_bf16)
        return tile_wmma<__nv_bfloat16>(v, m0, m1, n0, n1, K, checks, acc, smem);
    else
#endif
        return tile_fp32(v, m0, m1, n0, n1, K, checks, acc, smem);
}

// Shared memory of a GEMM/conv block in a math mode.
constexpr uint32_t gemm_shared_bytes(int mode) {
#if defined(RL_GPU_WMMA)
    if (mode == math_f16) return wmma_tile_bytes<__half>;
    if (mode == math_bf16) return wmma_tile_bytes<__nv_bfloat16>;
#else
    (void)mode;
#endif
    return fp32_tile_bytes;
}

// ---- GEMM -----------------------------------------------------------------------------------
template <int Mode>
__device__ bool gemm_block_gpu(const gemm_args& g, const launch_ctx& ctx, int64_t block, unsigned char* smem) {
    const gemm_tile t = gemm_block(g, block);
    gemm_view v{g.a + t.batch * g.stride_a, g.b + t.batch * g.stride_b, g.lda, g.ldb, g.trans_a, g.trans_b};
    float* c = g.c + t.batch * g.stride_c;
    const float* bias = g.bias ? g.bias + t.batch * g.stride_bias : nullptr;
    k_checks checks(ctx);
    const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
    for (int64_t ms = t.m0; ms < t.m1; ms += BM) {
        const int64_t me = ms + BM < t.m1 ? ms + BM : t.m1;
        for (int64_t ns = t.n0; ns < t.n1; ns += BN) {
            const int64_t ne = ns + BN < t.n1 ? ns + BN : t.n1;
            float acc[4][4];
            if (!tile_product<Mode>(v, ms, me, ns, ne, g.k, checks, acc, smem)) return false;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t m = ms + ty + 16 * i;
                if (m >= me) continue;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int64_t n = ns + tx + 16 * j;
                    if (n >= ne) continue;
                    float x = g.alpha * acc[i][j];
                    switch (g.bias_mode) {
                    case bias_kind::none: break;
                    case bias_kind::scalar: x += g.beta * bias[0]; break;
                    case bias_kind::per_col: x += g.beta * bias[n]; break;
                    case bias_kind::per_row: x += g.beta * bias[m]; break;
                    case bias_kind::full: x += g.beta * bias[m * g.ldbias + n]; break;
                    }
                    if (g.ep.act != activation::none) x = act(x, g.ep);
                    c[m * g.ldc + n] = x;
                }
            }
        }
    }
    return true;
}

template <int Mode>
__global__ void __launch_bounds__(kThreads) gemm_kernel(gemm_args g, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    RL_DYNAMIC_SHARED(smem);
    if (ok) ok = gemm_block_gpu<Mode>(g, ctx, int64_t(blockIdx.x) + ctx.offset, smem);
    block_end(ctx, ok);
}

// ---- convolution ------------------------------------------------------------------------------
template <int Mode>
__device__ bool conv2d_group_gpu(const conv2d_args& c, const launch_ctx& ctx, const conv2d_tile& t, int64_t group,
                                 unsigned char* smem);

// A block's groups one after the other (GPU tiles take one group per block; the loop is for
// tiles that take several).
template <int Mode>
__device__ bool conv2d_block_gpu(const conv2d_args& c, const launch_ctx& ctx, int64_t block, unsigned char* smem) {
    const conv2d_tile t = conv2d_block(c, block);
    for (int64_t group = t.group; group < t.group1; ++group)
        if (!conv2d_group_gpu<Mode>(c, ctx, t, group, smem)) return false;
    return true;
}

template <int Mode>
__device__ bool conv2d_group_gpu(const conv2d_args& c, const launch_ctx& ctx, const conv2d_tile& t, int64_t group,
                                 unsigned char* smem) {
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), K = conv2d_k(c);
    const int64_t hw_out = c.h_out * c.w_out;
    const int64_t co_base = group * co_g;  // the group's first output channel
    conv_view v;
    v.x = c.x + (t.image * c.c_in + group * ci) * c.h * c.w_in;
    v.w = c.w + co_base * K;
    v.K = int32_t(K);
    v.khw = int32_t(c.kh * c.kw);
    v.kw = int32_t(c.kw);
    v.h = int32_t(c.h);
    v.w_in = int32_t(c.w_in);
    v.w_out = int32_t(c.w_out);
    v.sh = int32_t(c.stride_h);
    v.sw = int32_t(c.stride_w);
    v.pt = int32_t(c.pad_top);
    v.pl = int32_t(c.pad_left);
    v.dh = int32_t(c.dil_h);
    v.dw = int32_t(c.dil_w);
    float* y = c.y + (t.image * c.c_out + co_base) * hw_out;
    const float* res = c.residual ? c.residual + (t.image * c.c_out + co_base) * hw_out : nullptr;
    const bool relu = c.ep.act == activation::relu;
    k_checks checks(ctx);
    const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
    for (int64_t cs = t.co0; cs < t.co1; cs += BM) {
        const int64_t ce = cs + BM < t.co1 ? cs + BM : t.co1;
        for (int64_t ps = t.p0; ps < t.p1; ps += BN) {
            const int64_t pe = ps + BN < t.p1 ? ps + BN : t.p1;
            float acc[4][4];
            if (!tile_product<Mode>(v, cs, ce, ps, pe, K, checks, acc, smem)) return false;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t co = cs + ty + 16 * i;
                if (co >= ce) continue;
                const float b = c.bias ? c.bias[co_base + co] : 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int64_t p = ps + tx + 16 * j;
                    if (p >= pe) continue;
                    const int64_t o = co * hw_out + p;
                    float x = acc[i][j];
                    // The cpu kernel's order of additions (cpu_gemm_conv.cc).
                    if (res && relu) {
                        x = x + b + res[o];
                        x = x > 0 ? x : 0;
                    } else if (res) {
                        x += b + res[o];
                    } else if (relu) {
                        x = x + b;
                        x = x > 0 ? x : 0;
                    } else if (b != 0.0f) {
                        x += b;
                    }
                    if (!relu && c.ep.act != activation::none) x = act(x, c.ep);
                    y[o] = x;
                }
            }
        }
    }
    return true;
}

template <int Mode>
__global__ void __launch_bounds__(kThreads) conv2d_kernel(conv2d_args c, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    RL_DYNAMIC_SHARED(smem);
    if (ok) ok = conv2d_block_gpu<Mode>(c, ctx, int64_t(blockIdx.x) + ctx.offset, smem);
    block_end(ctx, ok);
}

int math_of(uint32_t flags) {
#if defined(RL_GPU_WMMA)
    if (flags & gpu_tensor_f16) return math_f16;
    if (flags & gpu_tensor_bf16) return math_bf16;
#else
    (void)flags;
#endif
    return math_fp32;
}

}  // namespace

namespace {

// The kernel a launch with these flags runs, and its shared memory.
template <typename Args>
struct mode_kernel {
    void (*kernel)(Args, launch_ctx);
    uint32_t shared;
};

mode_kernel<gemm_args> gemm_for(uint32_t flags) {
    switch (math_of(flags)) {
#if defined(RL_GPU_WMMA)
    case math_f16: return {gemm_kernel<math_f16>, gemm_shared_bytes(math_f16)};
    case math_bf16: return {gemm_kernel<math_bf16>, gemm_shared_bytes(math_bf16)};
#endif
    default: return {gemm_kernel<math_fp32>, gemm_shared_bytes(math_fp32)};
    }
}

mode_kernel<conv2d_args> conv2d_for(uint32_t flags) {
    switch (math_of(flags)) {
#if defined(RL_GPU_WMMA)
    case math_f16: return {conv2d_kernel<math_f16>, gemm_shared_bytes(math_f16)};
    case math_bf16: return {conv2d_kernel<math_bf16>, gemm_shared_bytes(math_bf16)};
#endif
    default: return {conv2d_kernel<math_fp32>, gemm_shared_bytes(math_fp32)};
    }
}

}  // namespace

int launch_gemm(const gpu_launch_params& p) {
    const auto k = gemm_for(p.flags);
    return launch_kernel<gemm_args>(p, k.kernel, k.shared);
}

int launch_conv2d(const gpu_launch_params& p) {
    const auto k = conv2d_for(p.flags);
    return launch_kernel<conv2d_args>(p, k.kernel, k.shared);
}

bool resources_gemm(uint32_t flags, gpu::gpu_kernel_resources& out) {
    const auto k = gemm_for(flags);
    return kernel_resources(reinterpret_cast<const void*>(k.kernel), kThreads, k.shared, out);
}

bool resources_conv2d(uint32_t flags, gpu::gpu_kernel_resources& out) {
    const auto k = conv2d_for(flags);
    return kernel_resources(reinterpret_cast<const void*>(k.kernel), kThreads, k.shared, out);
}

}  // namespace reefline::ml::kernels::gpu_impl
