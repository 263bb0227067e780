// The GPU kernel library's interface to the host: its kernels are registered, under their
// kernel_info names, in the device layer's registry (preempt/gpu_kernels.h, which also states
// the contract every launcher keeps) when the library is loaded; the cuda/hip device backend
// (preempt/gpu_device.cc) finds them there. This header adds what host code of the library's
// users (tests, benchmarks) needs beyond that.
//
// Plain C++ (no CUDA or HIP types). The kernels themselves are in *.cu beside this header,
// compiled by nvcc or hipcc.
#pragma once

#include <cstdint>

#include "preempt/gpu_kernels.h"

namespace reefline::ml::kernels {

using gpu::gpu_launch_flag;
using gpu::gpu_launch_params;
using gpu::gpu_launcher;
using gpu::gpu_tensor_bf16;
using gpu::gpu_tensor_f16;

// Arguments of the library's "gpu_spin" kernel (spin.cu): every block runs for `ns`
// nanoseconds of GPU time, checking the task's flag every `check_ns`, and the first block to
// start stores 1 into *started (host-mapped, may be null); with `units` (host-mapped, one word
// per block of the grid, may be null) block b stores 1 + the number of the compute unit it ran
// on into units[b] and 0x80000000 | that when it ran to its end; with `finished` (host-mapped,
// may be null) each block that ran to its end adds 1 to it. With `hold_until` (host-mapped, may
// be null) a block ends as soon as that word reaches `hold_count`, `ns` being then only the
// longest it waits: tests hold a kernel until another has started or finished instead of
// guessing how long that takes. For the preemption benchmark's stages, `block_start_ns` and
// `block_stop_ns` (host-mapped, one word per block of the grid, may be null) get the GPU clock
// (gpu_clock_ns: %globaltimer, s_memrealtime) when block b started and when it stopped at a
// check point; `shared_bytes` is the dynamic shared memory each block holds (UINT32_MAX: the
// most a block may have, so that one block fills a compute unit, as a large convolution
// block does; the cpu backend ignores it). kernels.h's spin_kernel is its description, with
// the cpu backend's implementation (cpu_spin.cc): the device contract, the preemption
// benchmark and the GPU device tests use it as a kernel of known length.
struct gpu_spin_args {
    uint64_t ns;
    uint64_t check_ns;
    uint32_t* started;
    uint32_t* units = nullptr;
    uint32_t* finished = nullptr;
    const uint32_t* hold_until = nullptr;
    uint32_t hold_count = 1;
    uint32_t shared_bytes = 0;
    uint64_t* block_start_ns = nullptr;
    uint64_t* block_stop_ns = nullptr;
};

// The dynamic shared memory a gpu_spin block gets for shared_bytes = UINT32_MAX on the current
// device (the most one block may hold), 0 where unknown.
uint32_t gpu_spin_full_shared_bytes();

// "CUDA", "HIP" or "SIMT emulation": the runtime the library was compiled for.
const char* gpu_runtime_name();

// True when the library was compiled with tensor-core (WMMA) kernels (nvcc builds).
bool gpu_has_tensor_cores();

}  // namespace reefline::ml::kernels
