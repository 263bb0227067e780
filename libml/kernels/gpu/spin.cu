// "gpu_spin": blocks of a known length (launcher.h, gpu_spin_args), with preemption checks
// every check_ns. Thread 0 of each block spins on the GPU's clock and reads the host-mapped
// flag at each check (a plain load: the block has nothing else to do meanwhile); the other
// threads wait at the block's end.
#include "libml/kernels/gpu/common.cuh"

#if defined(RL_GPU_EMU)
#include <chrono>
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

__global__ void __launch_bounds__(kLanes) spin_kernel(gpu_spin_args a, launch_ctx c) {
    bool ok = block_begin(c);
    if (ok && threadIdx.x == 0) {
        if (a.started && *reinterpret_cast<volatile uint32_t*>(a.started) == 0) {
            *reinterpret_cast<volatile uint32_t*>(a.started) = 1;
            __threadfence_system();
        }
        const uint64_t t0 = gpu_now_ns();
        uint64_t next = t0 + a.check_ns;
        for (;;) {
            const uint64_t t = gpu_now_ns();
            if (t - t0 >= a.ns) break;
            if (t >= next) {
                if (load_flag(c.preempt)) {
                    ok = false;
                    break;
                }
                next = t + a.check_ns;
            }
        }
    }
    block_end(c, ok);  // thread 0's ok is the block's
}

}  // namespace

int launch_spin(const gpu_launch_params& p) {
    if (p.block_count == 0) return launch_account_only(p);
    const gpu_spin_args a = args_from<gpu_spin_args>(p);
    const launch_ctx c = make_ctx(p);
    RL_LAUNCH(spin_kernel, dim3(p.block_count), dim3(kLanes), 0, static_cast<cudaStream_t>(p.stream), a, c);
    return int(cudaGetLastError());
}

}  // namespace reefline::ml::kernels::gpu_impl
