// The cuda and hip device backends (one source for both): the device
// interface of preempt/device.h on the CUDA or HIP runtime, one source for both
// (preempt/gpu_device.cc through preempt/gpu_vendor.h).
//
// A build has at most one of them: -Dcuda=enabled defines make_cuda_device, -Dhip=enabled
// make_hip_device (the same kernels compiled by nvcc or hipcc), and make_gpu_device is the
// one the build has. Kernels are the GPU kernel library's (libml/kernels/gpu), found by
// kernel_info::name; a launch of a kernel that has no GPU implementation throws, which the
// scheduler reports as task_status::failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "preempt/device.h"

namespace reefline::gpu {

// Thrown by the factories when the machine has no usable GPU (no device, no driver): tests
// and tools skip on it. Other failures throw std::runtime_error.
struct no_device_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// How GEMM and convolution multiply: fp32 (the default), or on tensor cores with fp16 or
// bf16 inputs and fp32 accumulation (nvcc builds; the HIP build runs fp32 for all three).
enum class gpu_math : uint8_t { fp32, tensor_f16, tensor_bf16 };

// How a raise of preemption levels (device_ops::raise_levels) reaches the device's epoch line:
// a stream memory write on the flag stream (cuStreamWriteValue32 / hipStreamWriteValue32: the
// stream's front end writes it, no copy engine, no SM; where the driver has it), a copy of the
// line from pinned memory on that stream, or a relay: one resident block (32 threads on one
// unit, for the device's life) polls a host-mapped copy of the line and writes each change into
// the device line, so a raise is a host store and no runtime call at all. Relay is opt-in: it
// holds a unit's slot and a PCIe read stream while the device lives. REEFLINE_LEVEL_PATH=
// copy|write_value|relay overrides.
enum class gpu_level_path : uint8_t { write_value, copy, relay };

struct gpu_device_options {
    int ordinal = 0;
    uint32_t queue_depth = 64;  // launches outstanding per stream before launch() blocks
    gpu_math math = gpu_math::fp32;
    // Device memory cached by the pool (freed blocks kept for reuse) before it gives memory
    // back to the runtime.
    size_t pool_cache_bytes = size_t(1) << 30;
    gpu_level_path level_path = gpu_level_path::write_value;  // falls back to copy where unavailable
};

// Throws no_device_error("no CUDA device: <reason>") when there is none.
std::unique_ptr<device> make_cuda_device(int ordinal = 0);
std::unique_ptr<device> make_cuda_device(const gpu_device_options& options);
// Throws no_device_error("no HIP device: <reason>") when there is none.
std::unique_ptr<device> make_hip_device(int ordinal = 0);
std::unique_ptr<device> make_hip_device(const gpu_device_options& options);

// The backend this build has ("cuda" or "hip"), and its factory.
const char* gpu_backend_name();
std::unique_ptr<device> make_gpu_device(const gpu_device_options& options = {});

// Counters of a GPU device, for tests and benchmarks.
struct gpu_device_stats {
    uint64_t launches = 0;
    uint64_t pool_hits = 0, pool_misses = 0;
    size_t pool_cached_bytes = 0, device_bytes_in_use = 0;
    uint32_t registered_ranges = 0;
    // Spatial shares (device_ops::stream_set_units): binds to a proper subset of the units;
    // those served unbound because the runtime could not make a stream for the set (CUDA
    // without green contexts); changes of a stream's vendor stream; vendor streams made for
    // unit sets, and those alive now (at most 8 per stream once idle).
    uint64_t units_binds = 0, units_fallbacks = 0, unit_switches = 0, unit_streams_made = 0;
    uint32_t unit_streams_live = 0;
    // Preemption levels: the path raises take ("write_value", "copy" or "relay") and how many
    // there were.
    const char* level_path = "";
    uint64_t level_raises = 0;
    // Hardware work queues the runtime spreads streams over (0: the emulation, which has none).
    uint32_t hardware_queues = 0;
};
// False when `d` is not a GPU device.
bool gpu_device_stats_of(const device& d, gpu_device_stats& out);

}  // namespace reefline::gpu
