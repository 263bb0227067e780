// The device backends a program can run on, by name: the one list that the daemon's and every
// tool's --backend option, their help text, the docs and the backend_contract test read.
// Shaped like ggml's backend registry: an entry is a name, a line of help, what the backend can
// do, and a factory.
//
// Header-only on purpose: whether a GPU backend is linked is the including target's
// REEFLINE_GPU_BACKEND (gpu_dep's compile argument), not the library's. A build has the cpu
// backend and at most one GPU backend: cuda (-Dcuda=enabled), hip (-Dhip=enabled) or the
// software SIMT emulation of the cuda backend (-Dgpu_emu=true, named "cuda" too, so that
// scripts run unchanged on it).
//
// Adding a backend touches three files: its source (preempt/<name>_device.cc, the device_ops
// of preempt/device.h), its meson line (preempt/meson.build, or a dependency like gpu_dep that
// defines a macro here) and its entry in backends() below. Everything that takes --backend,
// and the backend_contract test, then has it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "preempt/device.h"
#if defined(REEFLINE_GPU_BACKEND)
#include "preempt/gpu_device.h"
#endif

namespace reefline::gpu {

// What a program may ask of any backend; each backend reads the fields that concern it.
struct backend_options {
    uint32_t compute_units = 0;          // cpu: worker threads (0: cores - 1, at least 1)
    bool pin_units = true;               // cpu: each worker on a CPU of its own (cpu_device_options)
    size_t scratch_per_unit = 64u << 20; // cpu: per-worker scratch for kernels
    uint32_t queue_depth = 64;           // launches outstanding per stream before launch() blocks
    int ordinal = 0;                     // GPU: which device
    std::string math = "fp32";           // GPU: GEMM/conv math: fp32, f16 or bf16 (tensor cores)
};

struct backend_entry {
    const char* name;   // what --backend takes
    const char* help;   // one line for --help and the docs
    bool gpu;           // kernels from the GPU kernel library; plans pick GPU tile sizes
    bool emulated;      // the SIMT emulation: a GPU's semantics at a software pace (timings meaningless)
    // Throws no_device_error (preempt/gpu_device.h) when the machine lacks the hardware,
    // std::invalid_argument on a bad option.
    std::unique_ptr<device> (*make)(const backend_options& options);
};

namespace backend_detail {

inline std::unique_ptr<device> make_cpu(const backend_options& o) {
    cpu_device_options c;
    c.compute_units = o.compute_units;
    c.pin_units = o.pin_units;
    c.scratch_per_unit = o.scratch_per_unit;
    c.queue_depth = o.queue_depth;
    return make_cpu_device(c);
}

#if defined(REEFLINE_GPU_BACKEND)
inline std::unique_ptr<device> make_gpu(const backend_options& o) {
    gpu_device_options g;
    g.ordinal = o.ordinal;
    g.queue_depth = o.queue_depth;
    if (o.math == "fp32")
        g.math = gpu_math::fp32;
    else if (o.math == "f16")
        g.math = gpu_math::tensor_f16;
    else if (o.math == "bf16")
        g.math = gpu_math::tensor_bf16;
    else
        throw std::invalid_argument("GPU math '" + o.math + "': expected fp32, f16 or bf16");
    return make_gpu_device(g);
}
#endif

}  // namespace backend_detail

// Every backend of this build, the cpu backend first (the embedded default).
inline const std::vector<backend_entry>& backends() {
    static const std::vector<backend_entry> list = {
        {.name = "cpu",
         .help = "software device: worker threads run the kernels' blocks (the embedded default)",
         .gpu = false,
         .emulated = false,
         .make = backend_detail::make_cpu},
#if defined(REEFLINE_GPU_BACKEND) && defined(REEFLINE_SIMT_EMU)
        {.name = REEFLINE_GPU_BACKEND,
         .help = "the " REEFLINE_GPU_BACKEND " backend on the software SIMT emulation (-Dgpu_emu=true): GPU semantics, "
                 "no GPU",
         .gpu = true,
         .emulated = true,
         .make = backend_detail::make_gpu},
#elif defined(REEFLINE_GPU_BACKEND)
        {.name = REEFLINE_GPU_BACKEND,
         .help = "a GPU through the " REEFLINE_GPU_BACKEND " runtime (--gpu picks which, --gpu-math its GEMM math)",
         .gpu = true,
         .emulated = false,
         .make = backend_detail::make_gpu},
#endif
    };
    return list;
}

// "cpu, cuda": the names, for help text and errors.
inline std::string backend_names() {
    std::string out;
    for (const auto& b : backends()) out += (out.empty() ? "" : ", ") + std::string(b.name);
    return out;
}

inline std::vector<std::string> backend_name_list() {
    std::vector<std::string> out;
    for (const auto& b : backends()) out.emplace_back(b.name);
    return out;
}

// The entry named `name`, or null.
inline const backend_entry* find_backend(std::string_view name) {
    for (const auto& b : backends())
        if (name == b.name) return &b;
    return nullptr;
}

// The device of the backend named `name`; std::invalid_argument naming what this build has
// when there is no such backend.
inline std::unique_ptr<device> make_backend(std::string_view name, const backend_options& options = {}) {
    const backend_entry* b = find_backend(name);
    if (!b) {
        std::string why = "backend '" + std::string(name) + "' is not in this build (it has: " + backend_names();
        if (name == "cuda" || name == "hip") why += "; build with -D" + std::string(name) + "=enabled";
        throw std::invalid_argument(why + ")");
    }
    return b->make(options);
}

}  // namespace reefline::gpu
