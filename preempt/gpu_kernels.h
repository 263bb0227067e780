// The GPU kernels the cuda/hip device backend (gpu_device.cc) can launch, as a registry that
// the device layer owns and a kernel library fills: each kernel under its name
// (kernel_info::name) with its launcher, its resource needs, and its index in the library's
// DKP dispatch table; plus the library's padded launcher (DKP), one for all kernels.
//
// The kernel library (libml/kernels/gpu) registers its kernels when it is loaded; benchmarks
// and tests register kernels of their own the same way. The device never names a library.
//
// Plain C++ (no CUDA or HIP types): host code compiled by the ordinary compiler includes it.
//
// Contract of every launcher:
// - GPU block i of the launch runs the work of block block_offset + i of the kernel's grid.
// - With a task: each block reads the task's preemption flag (`flag`, device memory that the
//   backend writes) at its start, and long blocks again at check points (GEMM/conv: per K chunk
//   of args.tile_k); a block that sees it raised exits without finishing its work. With a
//   level (`level`: device memory, the level's epoch, which device_ops::raise_levels advances)
//   the same holds when that word has passed the launch's `epoch` (epoch_passed).
//   The last block of the launch to finish (counted in `counter`, device memory the backend
//   owns per stream, zero between launches) advances the task's completed word to
//   kernel_index + 1 unless some block of the launch exited on the flag, and resets the counter.
// - Every launch, with or without a task, stores its `sequence` into *stream_done (host-
//   mapped) when its last block finishes: the backend's count of finished launches per
//   stream (queued(), the bounded device queue).
// - block_count 0 launches one block that only does the accounting (as the cpu backend
//   counts an empty launch as one unit).
#pragma once

#include <cstdint>

#include "preempt/device.h"

namespace reefline::gpu {

// Launch options (gpu_launch_params::flags).
enum gpu_launch_flag : uint32_t {
    gpu_tensor_f16 = 1u << 0,   // GEMM/conv on tensor cores, fp16 inputs, fp32 accumulate
    gpu_tensor_bf16 = 1u << 1,  // GEMM/conv on tensor cores, bf16 inputs, fp32 accumulate
};

struct gpu_launch_params {
    const void* args;        // the kernel's argument struct, copied at launch
    uint32_t args_size;
    uint32_t grid;           // total blocks of the kernel
    uint32_t block_offset;   // the slice this launch runs
    uint32_t block_count;
    uint32_t kernel_index;   // completion sets task completed to kernel_index + 1
    uint32_t sequence;       // stored into *stream_done when the launch finishes
    uint32_t flags;          // gpu_launch_flag
    uint32_t* task;          // device address of the task words {preempt, completed}, or null
    const uint32_t* flag;    // device memory: the task's preemption flag that kernels check, or null
    const uint32_t* level;   // device memory: the launch's preemption level's epoch, or null
    uint32_t epoch;          // the level's epoch when the launch was made
    uint32_t* counter;       // device memory: {blocks finished, some block exited on the flag}
    uint32_t* stream_done;   // device address of the stream's host-mapped finished word
    void* stream;            // cudaStream_t / hipStream_t
};

// Launches; returns 0 or the runtime's error code (cudaError_t / hipError_t).
using gpu_launcher = int (*)(const gpu_launch_params& p);

// What a compiled kernel asks of a compute unit (SM / CU), from the runtime's attributes of
// the code that runs (cudaFuncGetAttributes, the occupancy calculator).
using gpu_kernel_resources = kernel_resources;

struct gpu_kernel_entry {
    gpu_launcher launch = nullptr;
    // The kernel's case in the padded launcher's dispatch table; -1: it is never padded and
    // its launches carry no pads.
    int32_t pad_kind = -1;
    // The resources of the code a launch with these flags runs; false when unknown.
    bool (*resources)(uint32_t flags, gpu_kernel_resources& out) = nullptr;
};

// Adds a kernel under `name` (copied); false when the name is taken or the entry has no
// launcher. Thread-safe; call it before a device resolves the name.
bool register_gpu_kernel(const char* name, const gpu_kernel_entry& entry);

// The kernel registered under `name`, or null. The entry stays valid for the process.
const gpu_kernel_entry* find_gpu_kernel(const char* name);

// ---- dynamic kernel padding (DKP) -------------------------------------------------------------
//
// A padded launch is one launch of the library's "dkp" kernel: persistent blocks, `level` per
// compute unit, each of which reads the id of the unit it runs on. Every block takes the RT
// kernel's blocks first, from one counter, while any is left; blocks on units numbered
// rt_units and above then take blocks of the pads, in order, from their counters, until the
// RT kernel's last block ends (its end raises `cut`, which padded blocks check as their
// preemption flag: a running pad block stops at its next check point, and no pad block starts
// after it). So the RT kernel starts on every block at once, and its units (0 .. rt_units-1)
// never run a BE block.
//
// A pad runs at all only if, when its first block is claimed, its task's completed word equals
// its kernel_index and no other pad of the task is running (`owner_running`, a device word per
// task, taken with an atomic add); a pad whose every block ran advances its task's counter like
// a launch of its own, a cut or skipped one leaves it (the task restores from there).
constexpr uint32_t kMaxGpuPads = 4;
constexpr uint32_t kGpuPadArgsBytes = 320;  // the largest argument struct a part may carry (checked)

struct gpu_pad_part {
    int32_t kind = -1;           // gpu_kernel_entry::pad_kind
    uint32_t args_size = 0;
    uint32_t grid = 0;
    uint32_t block_offset = 0;
    uint32_t block_count = 0;
    uint32_t kernel_index = 0;
    uint32_t* task = nullptr;           // device address of the task words, or null (RT only)
    const uint32_t* flag = nullptr;     // the task's flag (RT part; pads check `cut` instead)
    uint32_t* owner_running = nullptr;  // pads: device word, pads of the task able to run
    alignas(16) unsigned char args[kGpuPadArgsBytes] = {};
};

// Device-memory words of one padded launch, zero before it; its last block zeroes them again
// (one area per stream: the stream's next launch starts after this one ended).
struct gpu_pad_work {
    uint32_t rt_next;                   // next RT block to claim
    uint32_t rt_counter[2];             // the RT part's launch counter
    uint32_t cut;                       // raised when the RT part's last block ended
    uint32_t exited;                    // persistent blocks that left
    uint32_t dummy_done;                // where the parts' own "stream finished" stores go
    uint32_t pad_next[kMaxGpuPads];     // next block of each pad to claim
    uint32_t pad_state[kMaxGpuPads];    // 0 undecided, 1 runs, 2 skipped, 3 runs and released
    uint32_t pad_counter[kMaxGpuPads][2];
    uint32_t pad_blocks[kMaxGpuPads];   // blocks that ran to their end
};

// Device-memory totals of every padded launch (the device's padding_stats).
struct gpu_pad_totals {
    unsigned long long pads_completed;
    unsigned long long pads_cut;
    unsigned long long pads_skipped;
    unsigned long long pad_blocks;
};

struct gpu_padded_params {
    gpu_pad_part rt;
    gpu_pad_part pads[kMaxGpuPads];
    uint32_t n_pads = 0;
    uint32_t units = 0;      // compute units of the device
    uint32_t rt_units = 0;   // units kept for the RT kernel (0 .. rt_units-1)
    uint32_t level = 0;      // blocks per unit: the proxy kernel (padded_levels)
    uint32_t flags = 0;      // gpu_launch_flag
    uint32_t sequence = 0;   // stored into *stream_done when the whole launch ended
    uint32_t* stream_done = nullptr;
    gpu_pad_work* work = nullptr;
    gpu_pad_totals* totals = nullptr;
    void* stream = nullptr;
};

struct gpu_padded_library {
    // Launches the DKP kernel on p.stream with the parts at `device_copy` (a copy of `p` in
    // device memory that the caller made, in stream order, before this launch); returns 0 or
    // the runtime's error code.
    int (*launch)(const gpu_padded_params& p, const gpu_padded_params* device_copy) = nullptr;
    // The proxy kernels' occupancy levels (blocks per unit), ascending; a padded launch uses
    // the highest one that every part's occupancy reaches (REEF's proxy with the fewest
    // registers that still fits each kernel).
    const uint32_t* levels = nullptr;
    uint32_t n_levels = 0;
    // Dynamic shared memory a part of this kind needs per block, for the launch's flags.
    uint32_t (*shared_bytes)(int32_t kind, uint32_t flags) = nullptr;
};

// Registers the library's padded launcher (one per process; false when one is there).
bool register_gpu_padded_library(const gpu_padded_library& lib);
const gpu_padded_library* find_gpu_padded_library();

// The relay of preemption levels (gpu_level_path::relay): one block that copies each change of a
// host-mapped line into the device line BE kernels read, until its stop word is non-zero.
struct gpu_level_relay_params {
    const uint32_t* mapped = nullptr;  // device address of the host-mapped line
    uint32_t* line = nullptr;          // the device line
    uint32_t words = 0;                // at most 16
    const uint32_t* stop = nullptr;    // device address of a host-mapped word
    void* stream = nullptr;
};
using gpu_level_relay_launch = int (*)(const gpu_level_relay_params& p);  // 0 or the runtime's error
bool register_gpu_level_relay(gpu_level_relay_launch launch);
gpu_level_relay_launch find_gpu_level_relay();

}  // namespace reefline::gpu
