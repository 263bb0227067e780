// The GPU kernel library's table of launchers by kernel name (launcher.h), the accounting
// block of empty launches, and the runtime's error strings.
#include <mutex>
#include <string>
#include <vector>

#include "libml/kernels/gpu/common.cuh"

namespace reefline::ml::kernels {

namespace gpu_impl {

namespace {

// An empty slice: one block that does what the cpu backend does for a launch of zero blocks
// (counts as one unit: the counter advances unless the task is flagged).
__global__ void __launch_bounds__(kLanes) account_only_kernel(launch_ctx c) {
    const bool ok = block_begin(c);
    block_end(c, ok);
}

}  // namespace

int launch_account_only(const gpu_launch_params& p) {
    const launch_ctx c = make_ctx(p);
    RL_LAUNCH(account_only_kernel, dim3(1), dim3(kLanes), 0, static_cast<cudaStream_t>(p.stream), c);
    return int(cudaGetLastError());
}

}  // namespace gpu_impl

namespace {

struct entry {
    const char* name;
    gpu_launcher fn;
};

// The library's kernels, named as their kernel_info (kernels.h).
constexpr entry builtin[] = {
    {"gemm", gpu_impl::launch_gemm},
    {"conv2d", gpu_impl::launch_conv2d},
    {"gather", gpu_impl::launch_gather},
    {"token_gather", gpu_impl::launch_token_gather},
    {"tensor_gather", gpu_impl::launch_tensor_gather},
    {"copy", gpu_impl::launch_copy},
    {"binary", gpu_impl::launch_binary},
    {"unary", gpu_impl::launch_unary},
    {"where", gpu_impl::launch_where},
    {"row", gpu_impl::launch_row},
    {"pool2d", gpu_impl::launch_pool2d},
    {"lrn", gpu_impl::launch_lrn},
    {"batchnorm", gpu_impl::launch_batchnorm},
    {"gather_axis", gpu_impl::launch_gather_axis},
    {"gpu_spin", gpu_impl::launch_spin},
};

struct extra_table {
    std::mutex mu;
    std::vector<std::pair<std::string, gpu_launcher>> entries;
};

extra_table& extras() {
    static extra_table t;
    return t;
}

}  // namespace

gpu_launcher gpu_launcher_for(const char* name) {
    if (!name) return nullptr;
    const std::string n(name);
    for (const entry& e : builtin)
        if (n == e.name) return e.fn;
    extra_table& t = extras();
    std::lock_guard lk(t.mu);
    for (const auto& [k, fn] : t.entries)
        if (k == n) return fn;
    return nullptr;
}

bool register_gpu_launcher(const char* name, gpu_launcher fn) {
    if (!name || !fn || gpu_launcher_for(name)) return false;
    extra_table& t = extras();
    std::lock_guard lk(t.mu);
    for (const auto& [k, f] : t.entries)
        if (k == name) return false;
    t.entries.emplace_back(name, fn);
    return true;
}

const char* gpu_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

const char* gpu_runtime_name() { return RL_GPU_RUNTIME_NAME; }

bool gpu_has_tensor_cores() {
#if defined(RL_GPU_WMMA)
    return true;
#else
    return false;
#endif
}

}  // namespace reefline::ml::kernels
