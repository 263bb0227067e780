// GEMM and convolution on the GPU: each block computes the output tile decomp.h assigns to
// it (gemm_block / conv2d_block), in sub-tiles computed by 256 threads, whatever tile the plan
// chose (a block given a larger, cpu-sized tile loops over its sub-tiles). GPU plans
// (plan.cc, use_gpu_tiles) pick the tile per layer:
// - 128 x 128 (wide tiles, fp32): each thread an 8 x 8 register tile of two 4 x 4 quadrants
//   read from shared memory as float4s, K steps of 8 double-buffered (the next step's loads in
//   registers while this step multiplies, one barrier a step), vectorised weight loads where
//   aligned; for layers with enough output tiles to fill the device;
// - 64 x 64: each thread a 4 x 4 register tile, K steps of 16; the other layers, and every
//   tensor-core launch.
// Convolution tiles may span images (span_images: GEMM N = batch x pixels) and a layer with
// too few tiles runs split-K (two launches, decomp.h: partial sums of K chunks, then their sum
// in split order and the epilogue; deterministic, and each launch idempotent).
//
// Convolution is an implicit GEMM: W[co, K] x cols[K, pixels] with K = c_in/groups * kh * kw,
// the im2col column gathered from the input while the tile is loaded (no scratch memory).
//
// Inner products:
// - fp32 (the default; the results differ from the cpu backend's by summation order only);
// - tensor cores (nvcc builds, WMMA, 64 x 64 tiles): A and B rounded to fp16 or bf16 as they
//   are staged in shared memory, products accumulated in fp32; chosen per launch by the device
//   option (gpu_device_options::math). hipcc 5.2 has no WMMA: the HIP build runs fp32 for both.
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
// Wide sub-tiles (fp32): 128 x 128, K steps of 8 in two shared-memory buffers, rows padded to
// keep float4 reads aligned and the transposed stores free of bank conflicts.
constexpr int BW = 128, BK_WIDE = 8, LD_WIDE = BW + 4;
constexpr uint32_t wide_tile_bytes = 2u * 2u * BK_WIDE * LD_WIDE * 4u;

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
    // Four consecutive k of row m (a_k_fast), as one 16-byte load where aligned.
    __device__ bool a_vec4() const { return !ta && lda % 4 == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0; }
    __device__ void a_at4(int64_t m, int64_t k, float (&out)[4]) const {
        const float_x4 v = *reinterpret_cast<const float_x4*>(a + m * lda + k);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
    __device__ void b_at4(int64_t k, int64_t k_end, int64_t n, float (&out)[4]) const {
#pragma unroll
        for (int r = 0; r < 4; ++r) out[r] = k + r < k_end ? b_at(k + r, n) : 0.0f;
    }
};

// One block's convolution operands for one group: A = weights [co_g x K], B = the im2col
// matrix [K x columns], read from the input on the fly. Column q is pixel q % hw_out of image
// q / hw_out counted from x (a tile spanning images has columns of several). B is loaded with
// consecutive threads on consecutive columns, and each thread always loads the same column of
// a sub-tile (prepare_b), so its image and output coordinates are computed once per sub-tile.
struct conv_view {
    // The layer's geometry is read from the args where they are (kernel parameters: constant
    // memory, operands of the instructions that use them) rather than copied into registers,
    // which the wide sub-tile's accumulators need.
    const conv2d_args& c;
    const float* x;  // the first image's input channels of the group: [c_in/groups, h, w]
    const float* w;  // the group's weights: [c_out/groups, K]
    int32_t K, khw, hw_out;
    const float* xc = nullptr;  // this thread's column's image
    int32_t iy0 = 0, ix0 = 0;
    bool valid = false;
    __device__ conv_view(const conv2d_args& args, const float* x_, const float* w_, int64_t K_)
        : c(args), x(x_), w(w_), K(int32_t(K_)), khw(int32_t(args.kh * args.kw)), hw_out(int32_t(args.h_out * args.w_out)) {}
    __device__ bool a_k_fast() const { return true; }
    __device__ bool b_n_fast() const { return true; }
    __device__ float a_at(int64_t m, int64_t k) const { return w[m * K + k]; }
    __device__ bool a_vec4() const { return K % 4 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0; }
    __device__ void a_at4(int64_t m, int64_t k, float (&out)[4]) const {
        const float_x4 v = *reinterpret_cast<const float_x4*>(w + m * K + k);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
    __device__ void prepare_b(int64_t p, int64_t p_end) {
        valid = p < p_end;
        const int32_t w_out = int32_t(c.w_out);
        const int32_t q = valid ? int32_t(p) : 0, image = q / hw_out, pix = q - image * hw_out;
        const int32_t oy = pix / w_out, ox = pix - oy * w_out;
        xc = x + image * (c.c_in * c.h * c.w_in);
        iy0 = oy * int32_t(c.stride_h) - int32_t(c.pad_top);
        ix0 = ox * int32_t(c.stride_w) - int32_t(c.pad_left);
    }
    __device__ float tap(int32_t ch, int32_t r, int32_t s) const {
        const int32_t h = int32_t(c.h), w_in = int32_t(c.w_in);
        const int32_t iy = iy0 + r * int32_t(c.dil_h), ix = ix0 + s * int32_t(c.dil_w);
        if (iy < 0 || iy >= h || ix < 0 || ix >= w_in) return 0.0f;
        return xc[(ch * h + iy) * w_in + ix];
    }
    __device__ float b_at(int64_t k, int64_t) const {
        if (!valid) return 0.0f;
        const int32_t kw = int32_t(c.kw);
        const int32_t kk = int32_t(k), ch = kk / khw, rs = kk - ch * khw, r = rs / kw, s = rs - r * kw;
        return tap(ch, r, s);
    }
    // Four consecutive k of this thread's column: one division chain, then the taps stepped.
    __device__ void b_at4(int64_t k, int64_t k_end, int64_t, float (&out)[4]) const {
        const int32_t kw = int32_t(c.kw), kh = int32_t(c.kh);
        int32_t kk = int32_t(k), ch = kk / khw, rs = kk - ch * khw, r = rs / kw, s = rs - r * kw;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[i] = valid && kk + i < k_end ? tap(ch, r, s) : 0.0f;
            if (++s == kw) {
                s = 0;
                if (++r == kh) {
                    r = 0;
                    ++ch;
                }
            }
        }
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

// fp32 product of a 64 x 64 sub-tile over K range [kb, ke): acc[i][j] is output
// (m0 + ty + 16 i, n0 + tx + 16 j).
template <typename V>
__device__ bool tile_fp32(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t kb, int64_t ke, k_checks& checks,
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
    for (int64_t k0 = kb; k0 < ke; k0 += BK) {
        const int stop = checks.read();
#pragma unroll
        for (int r = 0; r < (BM * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int mm = a_fast ? i / BK : i % BM, kk = a_fast ? i % BK : i / BM;
            const int64_t m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < m1 && k < ke) ? v.a_at(m, k) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < (BN * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int nn = b_fast ? i % BN : i / BK, kk = b_fast ? i / BN : i % BK;
            const int64_t n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < n1 && k < ke) ? v.b_at(k, n) : 0.0f;
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
__device__ bool tile_wmma(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t kb, int64_t ke, k_checks& checks,
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
    for (int64_t k0 = kb; k0 < ke; k0 += BK) {
        const int stop = checks.read();
#pragma unroll
        for (int r = 0; r < (BM * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int mm = a_fast ? i / BK : i % BM, kk = a_fast ? i % BK : i / BM;
            const int64_t m = m0 + mm, k = k0 + kk;
            As[mm][kk] = to_input<T>((m < m1 && k < ke) ? v.a_at(m, k) : 0.0f);
        }
#pragma unroll
        for (int r = 0; r < (BN * BK) / int(kThreads); ++r) {
            const int i = tid + r * int(kThreads);
            const int nn = b_fast ? i % BN : i / BK, kk = b_fast ? i / BN : i % BK;
            const int64_t n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = to_input<T>((n < n1 && k < ke) ? v.b_at(k, n) : 0.0f);
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


// fp32 product of a 128 x 128 sub-tile over K range [kb, ke): acc[i][j] is output
// (m0 + wide_row(i), n0 + wide_col(j)), two 4 x 4 quadrants 64 apart in each direction, so a
// thread reads its 8 A and 8 B values of a k as four float4s. Double-buffered: the loads of
// step k0 + 8 are issued into registers before step k0's products and stored into the other
// buffer after them, and the step's one barrier (which also carries the preemption check)
// publishes them.
__device__ __forceinline__ int wide_row(int i, int ty) { return (i >> 2) * 64 + ty * 4 + (i & 3); }

template <typename V>
__device__ bool tile_wide(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t kb, int64_t ke,
                          k_checks& checks, float (&acc)[8][8], unsigned char* smem) {
    using tile = float[2][BK_WIDE][LD_WIDE];
    tile& As = *reinterpret_cast<tile*>(smem);
    tile& Bs = *reinterpret_cast<tile*>(smem + sizeof(tile));
    const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    // Which A and B elements this thread stages: 4 consecutive k of one row (k-fast operands)
    // or the same k-quad of one of 128 columns (m- or n-fast ones), consecutive threads on
    // consecutive addresses either way.
    const bool a_fast = v.a_k_fast(), b_fast = v.b_n_fast(), a_vec = a_fast && kb % 4 == 0 && v.a_vec4();
    const int am = a_fast ? tid >> 1 : tid & (BW - 1), ak = a_fast ? (tid & 1) * 4 : (tid >> 7) * 4;
    const int bn = b_fast ? tid & (BW - 1) : tid >> 1, bk = b_fast ? (tid >> 7) * 4 : (tid & 1) * 4;
    v.prepare_b(n0 + bn, n1);
    float ra[4], rb[4];
    auto load = [&](int64_t k0) {
        const int64_t m = m0 + am, k = k0 + ak;
        if (a_vec && m < m1 && k + 3 < ke) {
            v.a_at4(m, k, ra);
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) ra[r] = m < m1 && k + r < ke ? v.a_at(m, k + r) : 0.0f;
        }
        const int64_t n = n0 + bn;
        if (n < n1) {
            v.b_at4(k0 + bk, ke, n, rb);
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) rb[r] = 0.0f;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            As[buf][ak + r][am] = ra[r];
            Bs[buf][bk + r][bn] = rb[r];
        }
    };
    load(kb);
    store(0);
    if (__syncthreads_or(checks.read())) return false;
    int buf = 0;
    for (int64_t k0 = kb; k0 < ke; k0 += BK_WIDE) {
        const bool more = k0 + BK_WIDE < ke;
        const int stop = checks.read();
        if (more) load(k0 + BK_WIDE);
#pragma unroll
        for (int kk = 0; kk < BK_WIDE; ++kk) {
            float a[8], b[8];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float_x4 av = *reinterpret_cast<const float_x4*>(&As[buf][kk][h * 64 + ty * 4]);
                const float_x4 bv = *reinterpret_cast<const float_x4*>(&Bs[buf][kk][h * 64 + tx * 4]);
                a[h * 4 + 0] = av.x; a[h * 4 + 1] = av.y; a[h * 4 + 2] = av.z; a[h * 4 + 3] = av.w;
                b[h * 4 + 0] = bv.x; b[h * 4 + 1] = bv.y; b[h * 4 + 2] = bv.z; b[h * 4 + 3] = bv.w;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) store(buf ^ 1);
        if (__syncthreads_or(stop)) return false;
        buf ^= 1;
    }
    return true;
}

// A sub-tile's shape and where a thread's accumulators sit in it: Tile 64 (4 x 4 per thread,
// rows ty + 16 i) or 128 (8 x 8, wide_row).
template <int Tile>
struct sub_tile {
    static constexpr int regs = Tile / 16;
    __device__ static int row(int i, int ty) { return Tile == BW ? wide_row(i, ty) : ty + 16 * i; }
};

template <int Mode, int Tile, typename V>
__device__ __forceinline__ bool tile_product(V& v, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t kb,
                                             int64_t ke, k_checks& checks,
                                             float (&acc)[sub_tile<Tile>::regs][sub_tile<Tile>::regs],
                                             unsigned char* smem) {
    if constexpr (Tile == BW) {
        static_assert(Mode == math_fp32, "wide tiles are fp32");
        return tile_wide(v, m0, m1, n0, n1, kb, ke, checks, acc, smem);
    } else {
#if defined(RL_GPU_WMMA)
        if constexpr (Mode == math_f16)
            return tile_wmma<__half>(v, m0, m1, n0, n1, kb, ke, checks, acc, smem);
        else if constexpr (Mode == math_bf16)
            return tile_wmma<__nv_bfloat16>(v, m0, m1, n0, n1, kb, ke, checks, acc, smem);
        else
#endif
            return tile_fp32(v, m0, m1, n0, n1, kb, ke, checks, acc, smem);
    }
}

// Shared memory of a GEMM/conv block in a math mode (fp32: room for either sub-tile, so that
// DKP's arena fits whichever a part runs).
constexpr uint32_t gemm_shared_bytes(int mode) {
#if defined(RL_GPU_WMMA)
    if (mode == math_f16) return wmma_tile_bytes<__half>;
    if (mode == math_bf16) return wmma_tile_bytes<__nv_bfloat16>;
#else
    (void)mode;
#endif
    return fp32_tile_bytes > wide_tile_bytes ? fp32_tile_bytes : wide_tile_bytes;
}

// Whether the build has the wide sub-tiles: not the HIP build, where hipcc 5.2 takes over 20
// minutes to compile them for two architectures (the library's whole build was a few); its
// blocks compute a plan's 128 x 128 tiles as four 64 x 64 sub-tiles.
#if defined(RL_GPU_HIP)
constexpr bool kWideTiles = false;
#else
constexpr bool kWideTiles = true;
#endif

// Whether a launch's blocks compute wide (128 x 128) sub-tiles: fp32 launches whose plan gave
// them tiles of at least that size (the host picks the kernel by it, DKP's parts per block).
RL_HD inline bool wide_tiles(const gemm_args& g, int mode) {
    return kWideTiles && mode == math_fp32 && g.tile_m >= BW && g.tile_n >= BW;
}
RL_HD inline bool wide_tiles(const conv2d_args& c, int mode) {
    return kWideTiles && mode == math_fp32 && c.tile_co >= BW && c.tile_pix >= BW;
}

// ---- GEMM -----------------------------------------------------------------------------------
template <int Mode, int Tile>
__device__ bool gemm_tiles_gpu(const gemm_args& g, const launch_ctx& ctx, int64_t block, unsigned char* smem) {
    using st = sub_tile<Tile>;
    const gemm_tile t = gemm_block(g, block);
    gemm_view v{g.a + t.batch * g.stride_a, g.b + t.batch * g.stride_b, g.lda, g.ldb, g.trans_a, g.trans_b};
    float* c = g.c + t.batch * g.stride_c;
    const float* bias = g.bias ? g.bias + t.batch * g.stride_bias : nullptr;
    k_checks checks(ctx);
    const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
    for (int64_t ms = t.m0; ms < t.m1; ms += Tile) {
        const int64_t me = ms + Tile < t.m1 ? ms + Tile : t.m1;
        for (int64_t ns = t.n0; ns < t.n1; ns += Tile) {
            const int64_t ne = ns + Tile < t.n1 ? ns + Tile : t.n1;
            float acc[st::regs][st::regs];
            if (!tile_product<Mode, Tile>(v, ms, me, ns, ne, 0, g.k, checks, acc, smem)) return false;
#pragma unroll
            for (int i = 0; i < st::regs; ++i) {
                const int64_t m = ms + st::row(i, ty);
                if (m >= me) continue;
#pragma unroll
                for (int j = 0; j < st::regs; ++j) {
                    const int64_t n = ns + st::row(j, tx);
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

// A GEMM block with the sub-tile its args call for (the DKP kernel's entry: one kernel for
// every part).
template <int Mode>
__device__ bool gemm_block_gpu(const gemm_args& g, const launch_ctx& ctx, int64_t block, unsigned char* smem) {
    if constexpr (Mode == math_fp32 && kWideTiles)
        if (wide_tiles(g, Mode)) return gemm_tiles_gpu<Mode, BW>(g, ctx, block, smem);
    return gemm_tiles_gpu<Mode, BM>(g, ctx, block, smem);
}

template <int Mode, int Tile>
__global__ void __launch_bounds__(kThreads, Mode == math_fp32 && Tile == BM ? 2 : 1) gemm_kernel(gemm_args g, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    RL_DYNAMIC_SHARED(smem);
    if (ok) ok = gemm_tiles_gpu<Mode, Tile>(g, ctx, int64_t(blockIdx.x) + ctx.offset, smem);
    block_end(ctx, ok);
}

// ---- convolution ------------------------------------------------------------------------------
// The output of a convolution from its sum x, as the cpu kernel computes it (cpu_gemm_conv.cc:
// the same order of additions): bias b, residual r (or none), activation.
__device__ __forceinline__ float conv_output(const conv2d_args& c, float x, float b, const float* r) {
    const bool relu = c.ep.act == activation::relu;
    if (r && relu) {
        x = x + b + *r;
        x = x > 0 ? x : 0;
    } else if (r) {
        x += b + *r;
    } else if (relu) {
        x = x + b;
        x = x > 0 ? x : 0;
    } else if (b != 0.0f) {
        x += b;
    }
    if (!relu && c.ep.act != activation::none) x = act(x, c.ep);
    return x;
}

// Where output (row co of the group, column q of the tile's images) is, from the tile's first
// image's first output of the group: columns beyond an image's planes are the next image's.
// 32-bit division: columns number fewer than 2^31 (plan.cc keeps spanning tiles within it).
__device__ __forceinline__ int64_t conv_out_at(const conv2d_args& c, int64_t co, int64_t q, int32_t hw_out) {
    const int32_t image = int32_t(q) / hw_out;
    return (int64_t(image) * c.c_out + co) * hw_out + (int32_t(q) - image * hw_out);
}

template <int Mode, int Tile>
__device__ bool conv2d_group_gpu(const conv2d_args& c, const launch_ctx& ctx, const conv2d_tile& t, int64_t group,
                                 unsigned char* smem) {
    using st = sub_tile<Tile>;
    const int64_t ci = conv2d_ci_per_group(c), co_g = conv2d_co_per_group(c), K = conv2d_k(c);
    const int64_t hw_out = c.h_out * c.w_out;
    const int64_t co_base = group * co_g;  // the group's first output channel
    conv_view v(c, c.x + (t.image * c.c_in + group * ci) * c.h * c.w_in, c.w + co_base * K, K);
    // Outputs from the tile's first image's first channel of the group; the first phase of a
    // split layer writes its chunk's raw sums to the chunk's partial tensor instead.
    const int64_t first = (t.image * c.c_out + co_base) * hw_out;
    const bool partial = conv2d_split(c);
    float* y = partial ? c.partial + t.split * conv2d_split_stride(c) + first : c.y + first;
    const float* res = c.residual && !partial ? c.residual + first : nullptr;
    k_checks checks(ctx);
    const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
    for (int64_t cs = t.co0; cs < t.co1; cs += Tile) {
        const int64_t ce = cs + Tile < t.co1 ? cs + Tile : t.co1;
        for (int64_t ps = t.p0; ps < t.p1; ps += Tile) {
            const int64_t pe = ps + Tile < t.p1 ? ps + Tile : t.p1;
            float acc[st::regs][st::regs];
            if (!tile_product<Mode, Tile>(v, cs, ce, ps, pe, t.k0, t.k1, checks, acc, smem)) return false;
#pragma unroll
            for (int i = 0; i < st::regs; ++i) {
                const int64_t co = cs + st::row(i, ty);
                if (co >= ce) continue;
                const float b = c.bias ? c.bias[co_base + co] : 0.0f;
#pragma unroll
                for (int j = 0; j < st::regs; ++j) {
                    const int64_t p = ps + st::row(j, tx);
                    if (p >= pe) continue;
                    const int64_t o = conv_out_at(c, co, p, v.hw_out);
                    y[o] = partial ? acc[i][j] : conv_output(c, acc[i][j], b, res ? res + o : nullptr);
                }
            }
        }
    }
    return true;
}

// A split layer's second phase: the tile's outputs summed over the chunks in split order, then
// the epilogue. Element-wise, consecutive threads on consecutive columns.
__device__ void conv2d_reduce_gpu(const conv2d_args& c, const conv2d_tile& t, int64_t group) {
    const int64_t hw_out = c.h_out * c.w_out, co_base = group * conv2d_co_per_group(c);
    const int64_t first = (t.image * c.c_out + co_base) * hw_out, stride = conv2d_split_stride(c);
    const int32_t rows = int32_t(t.co1 - t.co0), cols = int32_t(t.p1 - t.p0);
    for (int32_t e = int32_t(threadIdx.x); e < rows * cols; e += int32_t(kThreads)) {
        const int32_t r = e / cols;
        const int64_t co = t.co0 + r, o = first + conv_out_at(c, co, t.p0 + (e - r * cols), int32_t(hw_out));
        float s = 0.0f;
        for (int32_t k = 0; k < c.k_splits; ++k) s += c.partial[k * stride + o];
        c.y[o] = conv_output(c, s, c.bias ? c.bias[co_base + co] : 0.0f, c.residual ? c.residual + o : nullptr);
    }
}

// A block's groups one after the other (GPU tiles take one group per block; the loop is for
// tiles that take several).
template <int Mode, int Tile>
__device__ bool conv2d_tiles_gpu(const conv2d_args& c, const launch_ctx& ctx, int64_t block, unsigned char* smem) {
    conv2d_tile t = conv2d_block(c, block);
    // Whole planes of several images (the cpu plans' tile_images): one run of columns.
    if (!c.span_images && t.image1 - t.image > 1) {
        t.p0 = 0;
        t.p1 = (t.image1 - t.image) * c.h_out * c.w_out;
    }
    const bool reduce = conv2d_split(c) && c.split_phase == 2;
    for (int64_t group = t.group; group < t.group1; ++group) {
        if (reduce)
            conv2d_reduce_gpu(c, t, group);
        else if (!conv2d_group_gpu<Mode, Tile>(c, ctx, t, group, smem))
            return false;
    }
    return true;
}

template <int Mode>
__device__ bool conv2d_block_gpu(const conv2d_args& c, const launch_ctx& ctx, int64_t block, unsigned char* smem) {
    if constexpr (Mode == math_fp32 && kWideTiles)
        if (wide_tiles(c, Mode)) return conv2d_tiles_gpu<Mode, BW>(c, ctx, block, smem);
    return conv2d_tiles_gpu<Mode, BM>(c, ctx, block, smem);
}

template <int Mode, int Tile>
__global__ void __launch_bounds__(kThreads, 1) conv2d_kernel(conv2d_args c, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    RL_DYNAMIC_SHARED(smem);
    if (ok) ok = conv2d_tiles_gpu<Mode, Tile>(c, ctx, int64_t(blockIdx.x) + ctx.offset, smem);
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

// The kernel a launch with these flags and args runs, and its shared memory.
template <typename Args>
struct mode_kernel {
    void (*kernel)(Args, launch_ctx);
    uint32_t shared;
};

// Without args (resources): the wide kernel where fp32, the one with the most registers, which
// is what a plan's occupancy must allow for.
mode_kernel<gemm_args> gemm_for(uint32_t flags, const gemm_args* a = nullptr) {
    switch (math_of(flags)) {
#if defined(RL_GPU_WMMA)
    case math_f16: return {gemm_kernel<math_f16, BM>, gemm_shared_bytes(math_f16)};
    case math_bf16: return {gemm_kernel<math_bf16, BM>, gemm_shared_bytes(math_bf16)};
#endif
    default:
#if !defined(RL_GPU_HIP)  // kWideTiles
        if (!a || wide_tiles(*a, math_fp32)) return {gemm_kernel<math_fp32, BW>, wide_tile_bytes};
#endif
        return {gemm_kernel<math_fp32, BM>, fp32_tile_bytes};
    }
}

mode_kernel<conv2d_args> conv2d_for(uint32_t flags, const conv2d_args* a = nullptr) {
    switch (math_of(flags)) {
#if defined(RL_GPU_WMMA)
    case math_f16: return {conv2d_kernel<math_f16, BM>, gemm_shared_bytes(math_f16)};
    case math_bf16: return {conv2d_kernel<math_bf16, BM>, gemm_shared_bytes(math_bf16)};
#endif
    default:
#if !defined(RL_GPU_HIP)  // kWideTiles
        if (!a || wide_tiles(*a, math_fp32)) return {conv2d_kernel<math_fp32, BW>, wide_tile_bytes};
#endif
        return {conv2d_kernel<math_fp32, BM>, fp32_tile_bytes};
    }
}

}  // namespace

int launch_gemm(const gpu_launch_params& p) {
    const gemm_args a = args_from<gemm_args>(p);
    const auto k = gemm_for(p.flags, &a);
    return launch_kernel<gemm_args>(p, k.kernel, k.shared);
}

int launch_conv2d(const gpu_launch_params& p) {
    const conv2d_args a = args_from<conv2d_args>(p);
    const auto k = conv2d_for(p.flags, &a);
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
