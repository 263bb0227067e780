// What every GPU kernel of the library shares: the launch context (block slice, task words,
// counters), the preemption checks, the completion accounting, the fused activations and the
// element-type helpers. Compiled by nvcc and by hipcc (vendor.h maps the names).
//
// The semantics are the cpu backend's (preempt/cpu_device.cc), block for block:
// - a block checks the task's flag (and its launch's preemption level) at its start; a raised
//   flag, or a level raised since the launch was made, makes it exit at once;
// - GEMM/conv blocks check again at every K step (gemm_conv.cu, k_checks);
// - the launch's last block to finish advances task->completed to kernel_index + 1 unless a
//   block of the launch exited on the flag.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "libml/kernels/decomp.h"
#include "libml/kernels/gpu/launcher.h"
#include "preempt/gpu_vendor.h"
// After vendor.h: its device functions need the CUDA/HIP runtime headers.
#include "libml/kernels/elem_access.h"

namespace reefline::ml::kernels::gpu_impl {

// Threads per block of every kernel: 8 groups of 32 lanes (AMD's 64-wide wavefronts hold two
// such groups; the code never assumes more than 32 lanes act together).
constexpr unsigned kThreads = 256;
constexpr unsigned kLanes = 32;
constexpr unsigned kGroups = kThreads / kLanes;

struct launch_ctx {
    uint32_t offset;        // block_offset: GPU block i runs decomp block offset + i
    uint32_t count;         // GPU blocks of this launch (>= 1)
    uint32_t kernel_index;
    uint32_t sequence;
    const uint32_t* preempt;  // the task's preemption flag (device memory), or null
    const uint32_t* level = nullptr;  // the launch's preemption level's epoch (device memory), or null
    uint32_t epoch = 0;               // the level's epoch when the launch was made
    uint32_t* completed;
    uint32_t* counter;        // [0] blocks finished, [1] some block exited on the flag
    uint32_t* stream_done;    // host-mapped: sequence of the last finished launch on the stream
};

inline launch_ctx make_ctx(const gpu_launch_params& p) {
    launch_ctx c;
    c.offset = p.block_offset;
    c.count = p.block_count ? p.block_count : 1;
    c.kernel_index = p.kernel_index;
    c.sequence = p.sequence;
    c.preempt = p.flag;
    c.level = p.level;
    c.epoch = p.epoch;
    c.completed = p.task ? p.task + 1 : nullptr;
    c.counter = p.counter;
    c.stream_done = p.stream_done;
    return c;
}

// The argument struct from the launch's bytes. The struct may have grown trailing fields
// since the bytes were made (never the reverse in one build): missing bytes read as zero.
template <typename Args>
inline Args args_from(const gpu_launch_params& p) {
    Args a;
    memset(static_cast<void*>(&a), 0, sizeof a);
    if (p.args) memcpy(static_cast<void*>(&a), p.args, p.args_size < sizeof a ? p.args_size : sizeof a);
    return a;
}

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(RL_GPU_EMU)

// A load that always goes to memory: the host's copy engine writes the flag behind the
// kernel's back.
__device__ __forceinline__ uint32_t load_flag(const uint32_t* p) {
    return p ? *reinterpret_cast<const volatile uint32_t*>(p) : 0u;
}

// Whether the launch must stop: its task's flag is raised, or its level's epoch has passed
// the launch's (device.h, epoch_passed: a copy of the epoch still on its way reads older and
// lets the launch run). Thread 0's view; callers share it with the block.
__device__ __forceinline__ bool stop_requested(const uint32_t* flag, const uint32_t* level, uint32_t epoch) {
    if (flag && load_flag(flag) != 0) return true;
    return level && int32_t(load_flag(level) - epoch) > 0;
}
__device__ __forceinline__ bool stop_requested(const launch_ctx& c) { return stop_requested(c.preempt, c.level, c.epoch); }

// At block start. Thread 0 reads the flag; every thread learns the answer. True: run.
__device__ __forceinline__ bool block_begin(const launch_ctx& c) {
    return __syncthreads_or(threadIdx.x == 0 ? int(stop_requested(c)) : 0) == 0;
}

// At block end, by every thread (ok: the block finished its work). The last block of the
// launch advances the task's counter and the stream's finished word and resets the launch
// counter, which the next launch on the stream (it starts after this one has ended) reuses.
// Returns, in thread 0 only: 1 when this was the launch's last block and every block finished,
// 2 when it was the last and some block exited on the flag, 0 otherwise.
__device__ __forceinline__ int block_end(const launch_ctx& c, bool ok) {
    __threadfence();  // this thread's output writes before the block is counted
    __syncthreads();
    if (threadIdx.x != 0) return 0;
    if (!ok) atomicOr(&c.counter[1], 1u);
    __threadfence();
    const uint32_t before = atomicAdd(&c.counter[0], 1u);
    if (before + 1 != c.count) return 0;
    __threadfence();
    const uint32_t failed = atomicOr(&c.counter[1], 0u);
    atomicExch(&c.counter[0], 0u);
    atomicExch(&c.counter[1], 0u);
    __threadfence_system();
    if (c.completed && failed == 0) *reinterpret_cast<volatile uint32_t*>(c.completed) = c.kernel_index + 1;
    *reinterpret_cast<volatile uint32_t*>(c.stream_done) = c.sequence;
    __threadfence_system();
    return failed == 0 ? 1 : 2;
}

// The compute unit (SM / CU) the calling block runs on.
__device__ __forceinline__ uint32_t unit_id() {
#if defined(RL_GPU_EMU)
    return rl_emu::smid();
#elif defined(RL_GPU_HIP)
#if defined(__HIP_DEVICE_COMPILE__)
    return __smid();
#else
    return 0;  // the host pass of hipcc: never runs
#endif
#else
    uint32_t id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
#endif
}

// 32-lane groups (a CUDA warp; half an AMD wavefront of 64).
__device__ __forceinline__ double group_sum(double v) {
    for (int m = kLanes / 2; m > 0; m >>= 1) {
#if defined(RL_GPU_HIP)
        v += __shfl_xor(v, m, kLanes);
#else
        v += __shfl_xor_sync(0xffffffffu, v, m, kLanes);
#endif
    }
    return v;
}

// max as the cpu kernels compute it (std::max(m, v): keeps m unless m < v, so NaNs are passed over).
__device__ __forceinline__ float max_keep(float m, float v) { return m < v ? v : m; }

__device__ __forceinline__ float group_max(float v) {
    for (int m = kLanes / 2; m > 0; m >>= 1) {
#if defined(RL_GPU_HIP)
        v = max_keep(v, __shfl_xor(v, m, kLanes));
#else
        v = max_keep(v, __shfl_xor_sync(0xffffffffu, v, m, kLanes));
#endif
    }
    return v;
}

// The fused activation, formula for formula as the cpu kernels (cpu_rows.cc: act()).
__device__ __forceinline__ float act(float x, const epilogue& ep) {
    switch (ep.act) {
    case activation::none: return x;
    case activation::relu: return x > 0 ? x : 0;
    case activation::leaky_relu: return x >= 0 ? x : ep.alpha * x;
    case activation::sigmoid: return 1.0f / (1.0f + expf(-x));
    case activation::tanh: return tanhf(x);
    case activation::clip: { const float v = x < ep.alpha ? ep.alpha : x; return v > ep.beta ? ep.beta : v; }
    case activation::hard_sigmoid: {
        const float v = ep.alpha * x + ep.beta;
        return v < 0 ? 0 : (v > 1 ? 1 : v);
    }
    case activation::hard_swish: {
        const float v = x / 6.0f + 0.5f;
        return x * (v < 0 ? 0 : (v > 1 ? 1 : v));
    }
    case activation::gelu_erf: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case activation::gelu_tanh:
        return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    }
    return x;
}

// nd_offset (decomp.h) with 32-bit index arithmetic when every index fits: a 64-bit division
// costs tens of instructions on a GPU. Same result.
__device__ __forceinline__ int64_t nd_offset_fast(const nd_shape& s, const int64_t* strides, int64_t e, bool narrow) {
    if (!narrow) return nd_offset(s, strides, e);
    int64_t off = 0;
    uint32_t r = uint32_t(e);
    for (int i = s.rank - 1; i >= 0; --i) {
        const uint32_t d = uint32_t(s.dims[i]);
        const uint32_t q = r / d;
        off += int64_t(r - q * d) * strides[i];
        r = q;
    }
    return off;
}

__device__ __forceinline__ bool shape_is_narrow(const nd_shape& s) {
    const int64_t n = nd_count(s);
    return n >= 0 && n <= int64_t(0xffffffffu);
}

// Four floats stored as one 16-byte store: the address must be 16-byte aligned. The runtimes'
// own float4 (nvcc splits a store of a plain aligned struct of four floats into four); the
// SIMT emulation has none.
#if defined(RL_GPU_EMU)
struct alignas(16) float_x4 {
    float x, y, z, w;
};
#else
using float_x4 = float4;
#endif

// ---- typed element access: libml/kernels/elem_access.h, shared with the cpu kernels --------
__device__ __forceinline__ int elem_bytes(elem t) {
    return t == elem::f64 || t == elem::i64 ? 8 : t == elem::f32 || t == elem::i32 ? 4 : t == elem::f16 ? 2 : 1;
}

#endif  // device code

// Launches a kernel of the library: `kernel` takes (Args, launch_ctx). An empty slice runs the
// accounting block alone (launch_account_only, registry.cu).
int launch_account_only(const gpu_launch_params& p);

// The runtime's attributes of a compiled kernel run with `threads` per block and
// `dynamic_shared` bytes (registry.cu), and a kernel's resources_<name> entry point from them.
bool kernel_resources(const void* kernel, uint32_t threads, uint32_t dynamic_shared, gpu::gpu_kernel_resources& out);
#define RL_KERNEL_RESOURCES(name, kernel, shared)                                      \
    bool resources_##name(uint32_t, gpu::gpu_kernel_resources& out) {                \
        return kernel_resources(reinterpret_cast<const void*>(kernel), kThreads, (shared), out); \
    }

// Shared memory. Kernels take it from the launch's dynamic shared memory (RL_DYNAMIC_SHARED),
// never as static __shared__ arrays: the DKP kernel (dkp.cu) runs every kernel's blocks and
// gives each the one arena, and the SIMT emulation runs blocks of several units at once.
// The image gather (gather.cu): a block's descriptor, its segments in chunks of
// gather_chunk_segments, their runs in the tile, and a tile of gather_tile_bytes payload bytes.
constexpr uint32_t gather_tile_bytes = 4096;
constexpr uint32_t gather_chunk_segments = 32;
constexpr uint32_t gather_shared_bytes = 16 + gather_chunk_segments * 32 + gather_tile_bytes;
constexpr uint32_t token_gather_shared_bytes = 16;  // a word

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(RL_GPU_EMU)
template <typename Args>
int launch_kernel(const gpu_launch_params& p, void (*kernel)(Args, launch_ctx), size_t shared_bytes = 0) {
    if (p.block_count == 0) return launch_account_only(p);
    if (p.block_count > 0x7fffffffu) return int(cudaErrorInvalidValue);
    const Args a = args_from<Args>(p);
    const launch_ctx c = make_ctx(p);
    RL_LAUNCH(kernel, dim3(p.block_count), dim3(kThreads), shared_bytes, static_cast<cudaStream_t>(p.stream), a, c);
    return int(cudaGetLastError());
}
#endif

// Launchers of the library's kernels (one per kernel; gemm_conv.cu, gather.cu, elementwise.cu),
// and their resources (gpu_kernel_entry::resources).
#define RL_KERNEL_ENTRY_POINTS(name)                     \
    int launch_##name(const gpu_launch_params& p);      \
    bool resources_##name(uint32_t flags, gpu::gpu_kernel_resources& out);
RL_KERNEL_ENTRY_POINTS(gemm)
RL_KERNEL_ENTRY_POINTS(conv2d)
RL_KERNEL_ENTRY_POINTS(gather)
RL_KERNEL_ENTRY_POINTS(token_gather)
RL_KERNEL_ENTRY_POINTS(tensor_gather)
RL_KERNEL_ENTRY_POINTS(copy)
RL_KERNEL_ENTRY_POINTS(binary)
RL_KERNEL_ENTRY_POINTS(unary)
RL_KERNEL_ENTRY_POINTS(where)
RL_KERNEL_ENTRY_POINTS(row)
RL_KERNEL_ENTRY_POINTS(pool2d)
RL_KERNEL_ENTRY_POINTS(lrn)
RL_KERNEL_ENTRY_POINTS(batchnorm)
RL_KERNEL_ENTRY_POINTS(gather_axis)
RL_KERNEL_ENTRY_POINTS(spin)
#undef RL_KERNEL_ENTRY_POINTS

// The DKP kernel's dispatch cases (gpu_kernel_entry::pad_kind), and its padded launcher
// (dkp.cu).
enum pad_kind : int32_t {
    pad_gemm, pad_conv2d, pad_gather, pad_token_gather, pad_tensor_gather, pad_copy, pad_binary, pad_unary,
    pad_where, pad_row, pad_pool2d, pad_lrn, pad_batchnorm, pad_gather_axis, pad_spin, pad_kinds
};
gpu::gpu_padded_library padded_library();

}  // namespace reefline::ml::kernels::gpu_impl
