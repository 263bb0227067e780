// "gpu_spin": blocks of a known length (launcher.h, gpu_spin_args), with preemption checks
// every check_ns. Thread 0 of each block spins on the GPU's clock and reads the host-mapped
// flag at each check (a plain load: the block has nothing else to do meanwhile); the other
// threads wait at the block's end.
#include "libml/kernels/gpu/common.cuh"

#if defined(RL_GPU_EMU)
#include <chrono>
#include <thread>
#endif

namespace reefline::ml::kernels::gpu_impl {

namespace {

// Nanoseconds of a constant-rate GPU clock: %globaltimer on NVIDIA; on AMD the
// s_memrealtime counter, which counts at 100 MHz on the gfx9 targets the build names.
__device__ __forceinline__ uint64_t gpu_now_ns() {
#if defined(RL_GPU_EMU)
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count());
#elif defined(RL_GPU_HIP)
#if defined(__HIP_DEVICE_COMPILE__)
    return uint64_t(__builtin_amdgcn_s_memrealtime()) * 10u;
#else
    return 0;  // the host pass of hipcc: never runs
#endif
#else
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

// Thread 0 spins; the block's result is thread 0's (block_end reads only its).
__device__ bool spin_block_gpu(const gpu_spin_args& a, const launch_ctx& c, int64_t block) {
    if (threadIdx.x != 0) return true;
    if (a.started && *reinterpret_cast<volatile uint32_t*>(a.started) == 0) {
        *reinterpret_cast<volatile uint32_t*>(a.started) = 1;
        __threadfence_system();
    }
    const uint32_t unit = 1 + unit_id();
    volatile uint32_t* unit_word = a.units ? reinterpret_cast<volatile uint32_t*>(a.units + block) : nullptr;
    if (unit_word) *unit_word = unit;
    const uint64_t t0 = gpu_now_ns();
    if (a.block_start_ns) {
        *reinterpret_cast<volatile uint64_t*>(a.block_start_ns + block) = t0;
        __threadfence_system();
    }
    uint64_t next = t0 + a.check_ns;
    for (;;) {
#if defined(RL_GPU_EMU)
        // The emulation's threads share a few cores: a spinning block must not starve the
        // blocks beside it.
        std::this_thread::sleep_for(std::chrono::microseconds(20));
#endif
        const uint64_t t = gpu_now_ns();
        if (t - t0 >= a.ns) break;
        if (a.hold_until && *reinterpret_cast<const volatile uint32_t*>(a.hold_until) >= a.hold_count) break;
        if (t >= next) {
            if (stop_requested(c)) {
                if (a.block_stop_ns) {
                    *reinterpret_cast<volatile uint64_t*>(a.block_stop_ns + block) = gpu_now_ns();
                    __threadfence_system();
                }
                return false;
            }
            next = t + a.check_ns;
        }
    }
    if (unit_word) *unit_word = 0x80000000u | unit;
    if (a.finished) atomicAdd(a.finished, 1u);
    if (unit_word || a.finished) __threadfence_system();
    return true;
}

__global__ void __launch_bounds__(kLanes) spin_kernel(gpu_spin_args a, launch_ctx c) {
    bool ok = block_begin(c);
    if (ok) ok = spin_block_gpu(a, c, int64_t(blockIdx.x) + c.offset);
    block_end(c, ok);
}

}  // namespace

}  // namespace reefline::ml::kernels::gpu_impl

namespace reefline::ml::kernels {

// The most dynamic shared memory one block may hold on the current device (the opt-in limit on
// NVIDIA, which spin_kernel is allowed once).
uint32_t gpu_spin_full_shared_bytes() {
    static const uint32_t bytes = [] {
#if defined(RL_GPU_EMU)
        return uint32_t(48u << 10);
#elif defined(RL_GPU_HIP)
        int dev = 0, v = 0;
        if (hipGetDevice(&dev) != hipSuccess || hipDeviceGetAttribute(&v, hipDeviceAttributeMaxSharedMemoryPerBlock, dev) != hipSuccess)
            return 0u;
        return uint32_t(v);
#else
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            return 0u;
        if (v > (48 << 10) &&
            cudaFuncSetAttribute(gpu_impl::spin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v) != cudaSuccess)
            v = 48 << 10;
        (void)cudaGetLastError();
        return uint32_t(v);
#endif
    }();
    return bytes;
}

}  // namespace reefline::ml::kernels

namespace reefline::ml::kernels::gpu_impl {

int launch_spin(const gpu_launch_params& p) {
    if (p.block_count == 0) return launch_account_only(p);
    const gpu_spin_args a = args_from<gpu_spin_args>(p);
    const launch_ctx c = make_ctx(p);
    const size_t shared = a.shared_bytes == UINT32_MAX ? gpu_spin_full_shared_bytes() : a.shared_bytes;
    RL_LAUNCH(spin_kernel, dim3(p.block_count), dim3(kLanes), shared, static_cast<cudaStream_t>(p.stream), a, c);
    return int(cudaGetLastError());
}

bool resources_spin(uint32_t, gpu::gpu_kernel_resources& out) {
    return kernel_resources(reinterpret_cast<const void*>(spin_kernel), kLanes, 0, out);
}

}  // namespace reefline::ml::kernels::gpu_impl
