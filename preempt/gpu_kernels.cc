// The registry of GPU kernels (gpu_kernels.h). Entries are only added, never removed, so a
// pointer handed out stays valid; lookups take the lock (the device caches them per
// kernel_info, so a launch does not).
#include "preempt/gpu_kernels.h"

#include <deque>
#include <mutex>
#include <string>
#include <utility>

namespace reefline::gpu {
namespace {

struct registry {
    std::mutex mu;
    std::deque<std::pair<std::string, gpu_kernel_entry>> kernels;  // deque: entries never move
    gpu_padded_library padded;
    bool has_padded = false;
    gpu_level_relay_launch relay = nullptr;
};

// Function-local: libraries register from static initialisers, in any order.
registry& the_registry() {
    static registry r;
    return r;
}

}  // namespace

bool register_gpu_kernel(const char* name, const gpu_kernel_entry& entry) {
    if (!name || !*name || !entry.launch) return false;
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    for (const auto& [n, e] : r.kernels)
        if (n == name) return false;
    r.kernels.emplace_back(name, entry);
    return true;
}

const gpu_kernel_entry* find_gpu_kernel(const char* name) {
    if (!name) return nullptr;
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    for (const auto& [n, e] : r.kernels)
        if (n == name) return &e;
    return nullptr;
}

bool register_gpu_padded_library(const gpu_padded_library& lib) {
    if (!lib.launch || !lib.levels || lib.n_levels == 0 || !lib.shared_bytes) return false;
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    if (r.has_padded) return false;
    r.padded = lib;
    r.has_padded = true;
    return true;
}

const gpu_padded_library* find_gpu_padded_library() {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    return r.has_padded ? &r.padded : nullptr;
}

bool register_gpu_level_relay(gpu_level_relay_launch launch) {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    if (r.relay || !launch) return false;
    r.relay = launch;
    return true;
}

gpu_level_relay_launch find_gpu_level_relay() {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    return r.relay;
}

}  // namespace reefline::gpu
