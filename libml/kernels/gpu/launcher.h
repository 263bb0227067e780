// The GPU kernel library's entry points, as the cuda/hip device backend
// (preempt/gpu_device.cc) calls them: a launcher per kernel, found by the kernel's name
// (gpu::kernel_info::name), that launches blocks [block_offset, block_offset + block_count)
// of the kernel's grid with its argument bytes on a stream.
//
// Plain C++ (no CUDA or HIP types), so that host code compiled by the ordinary compiler can
// use it. The kernels themselves are in *.cu beside this header, compiled by nvcc or hipcc.
//
// Contract of every launcher (the same as the cpu backend's, preempt/device.h):
// - GPU block i of the launch runs the work decomp.h assigns to block block_offset + i.
// - With a task: each block reads the task's preemption flag (host-mapped memory, written by
//   the host without any launch) at its start, and GEMM/conv blocks again per K chunk of
//   their tile (args.tile_k); a block that sees it raised exits without finishing its tile.
//   The last block of the launch to finish (counted in `counter`, device memory the backend
//   owns per stream, zero between launches) advances task->completed to kernel_index + 1
//   unless some block of the launch exited on the flag, and resets the counter.
// - Every launch, with or without a task, stores its `sequence` into *stream_done (host-
//   mapped) when its last block finishes: the backend's count of finished launches per
//   stream (queued(), the bounded device queue).
// - block_count 0 launches one block that only does the accounting (as the cpu backend
//   counts an empty launch as one unit).
#pragma once

#include <cstdint>

namespace reefline::ml::kernels {

// Launch options (gpu_launch_params::flags).
enum gpu_launch_flag : uint32_t {
    gpu_tensor_f16 = 1u << 0,   // GEMM/conv on tensor cores, fp16 inputs, fp32 accumulate
    gpu_tensor_bf16 = 1u << 1,  // GEMM/conv on tensor cores, bf16 inputs, fp32 accumulate
};

struct gpu_launch_params {
    const void* args;        // the kernel's argument struct (decomp.h), copied at launch
    uint32_t args_size;
    uint32_t grid;           // total blocks of the kernel
    uint32_t block_offset;   // the slice this launch runs
    uint32_t block_count;
    uint32_t kernel_index;   // completion sets task completed to kernel_index + 1
    uint32_t sequence;       // stored into *stream_done when the launch finishes
    uint32_t flags;          // gpu_launch_flag
    uint32_t* task;          // device address of the task words {preempt, completed}, or null
    const uint32_t* flag;    // device memory: the task's preemption flag that kernels check, or null
    uint32_t* counter;       // device memory: {blocks finished, some block exited on the flag}
    uint32_t* stream_done;   // device address of the stream's host-mapped finished word
    void* stream;            // cudaStream_t / hipStream_t
};

// Arguments of the library's "gpu_spin" kernel (spin.cu): every block runs for `ns`
// nanoseconds of GPU time, checking the task's flag every `check_ns`, and the first block to
// start stores 1 into *started (host-mapped, may be null). It has no cpu counterpart: the
// preemption benchmark (bench/preempt_bench.cc) and the GPU device tests use it as a kernel
// of known length.
struct gpu_spin_args {
    uint64_t ns;
    uint64_t check_ns;
    uint32_t* started;
};

// Launches; returns 0 or the runtime's error code (cudaError_t / hipError_t).
using gpu_launcher = int (*)(const gpu_launch_params& p);

// The launcher of the library's kernel named `name` (gemm, conv2d, gather, copy, binary,
// unary, where, row, pool2d, lrn, batchnorm, gather_axis; and gpu_spin), of a kernel
// registered with register_gpu_launcher, or null.
gpu_launcher gpu_launcher_for(const char* name);

// Adds a kernel that is not part of the library (benchmarks' and tests' own kernels) under
// `name`; false when the name is taken. Call it before a device resolves the name.
bool register_gpu_launcher(const char* name, gpu_launcher fn);

// The runtime's message for a launcher's error code.
const char* gpu_error_string(int code);

// "CUDA" or "HIP": the runtime the library was compiled for.
const char* gpu_runtime_name();

// True when the library was compiled with tensor-core (WMMA) kernels (nvcc builds).
bool gpu_has_tensor_cores();

}  // namespace reefline::ml::kernels
