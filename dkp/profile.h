// Kernel profiles (kprof): for every launch of a model's plan, its time alone on a device and
// its resource needs. The scheduler's estimates (DKP's rule 1, PREMA's job lengths) come from
// them. A model's profile lives next to it in the repository (`<repo>/<name>/profile.json`),
// keyed by device and plan, so that a restart or a second IF of the same model reuses it and a
// profile of another device or another plan is recomputed.
//
// JSON, one plan:
//   {"device": "cpu (2 compute units)", "plan": "b4_l32", "key": "9f1c...",
//    "launches": [{"kernel": "gemm", "node": "fc1", "time_us": 41.5, "blocks": 12,
//                  "threads": 256, "registers": 128, "shared_bytes": 32768, "occupancy": 1}, ...]}
// several plans: {"device": "...", "plans": [<one plan, as above, without "device">, ...]}.
// Either may carry the knee curve: "knee": {"plan": "b16", "key": "...", "batch": 16,
//   "device_units": 4, "points": [{"units": 1, "ms": 80.2}, ..., {"units": 4, "ms": 23.9}]}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "preempt/device.h"

namespace reefline::dkp {

struct kernel_profile {
    std::string kernel;        // kernel_info::name
    std::string node;          // the graph node it comes from
    double time_us = 0;        // median time of the whole grid, alone on the device
    uint32_t blocks = 0;       // grid
    uint32_t threads = 0;      // per block (GPU)
    uint32_t registers = 0;    // per thread (GPU)
    uint32_t shared_bytes = 0;
    uint32_t occupancy = 0;    // blocks one compute unit holds at once
};

struct plan_profile {
    std::string plan;  // "b<batch>" or "b<batch>_l<length>"
    std::string key;   // plan_key() of the launches it was measured on
    std::vector<kernel_profile> launches;
};

// GSLICE's knee curve: how long one batch of a plan takes on k of the device's compute units,
// for shares sampled from one unit to all of them. Past the knee, a larger share buys little
// throughput (the knee point itself is the IF manager's reading of the curve).
struct share_point {
    uint32_t units = 0;
    double ms = 0;  // median time of the batch on `units` units, alone on the device
};

struct knee_curve {
    std::string plan;  // the plan measured ("b16", "b8_l32")
    std::string key;   // its plan_key()
    uint32_t batch = 0;
    uint32_t device_units = 0;
    std::vector<share_point> points;  // ascending units
};

struct model_profile {
    std::string device;  // device_caps::name
    std::vector<plan_profile> plans;
    knee_curve knee;     // no points: not measured

    // The plan with this name and key, or null (never profiled, or the plan changed).
    const plan_profile* find(const std::string& plan, const std::string& key) const;
    // Adds or replaces the plan of that name.
    void put(plan_profile p);

    std::string to_json() const;
    // Reads either form above. Throws std::invalid_argument naming what is wrong.
    static model_profile parse(const std::string& json);
};

// The identity of a plan for profiles: a hash of its launches' kernels, grids and argument
// sizes (hex). A profile measured on other launches does not describe this plan.
std::string plan_key(const std::vector<std::pair<std::string, uint32_t>>& kernels_and_grids,
                     const std::vector<size_t>& args_sizes);

// Blocks of kernel `k` one compute unit of `caps` holds at once: 1 on the cpu device (a
// worker runs one block); on a GPU from threads, registers and shared memory against an SM's
// limits (those of the data-centre GPUs reefline targets: 64K registers, 2048 threads,
// 228 KB shared memory, 32 blocks per SM).
uint32_t occupancy(const gpu::kernel_info& k, const gpu::device_caps& caps);

}  // namespace reefline::dkp
