// The device a benchmark or tool names with --device: "cpu" (a cpu device of `units` worker
// threads), or the GPU backend this binary was built with. Header-only on purpose: whether a
// GPU backend is linked is the including target's REEFLINE_GPU_BACKEND, not the library's.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "preempt/device.h"
#if defined(REEFLINE_GPU_BACKEND)
#include "preempt/gpu_device.h"
#endif

namespace reefline::gpu {

inline std::unique_ptr<device> make_device_named(const std::string& name, uint32_t units) {
#if defined(REEFLINE_GPU_BACKEND)
    if (name != "cpu") return make_gpu_device();
#endif
    if (name != "cpu") throw std::invalid_argument("--device " + name + ": this build has the cpu device only");
    cpu_device_options o;
    o.compute_units = units;
    return make_cpu_device(o);
}

}  // namespace reefline::gpu
