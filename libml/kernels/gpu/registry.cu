// The GPU kernel library's registration with the device layer (preempt/gpu_kernels.h): every
// kernel under its name with its launcher, resources and DKP case; the accounting block of
// empty launches. Compiled last in library.cu: it names every kernel file's entry points.
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

bool gpu_impl::kernel_resources(const void* kernel, uint32_t threads, uint32_t dynamic_shared,
                                gpu::gpu_kernel_resources& out) {
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, int(threads), dynamic_shared) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    out.threads_per_block = threads;
    out.registers = uint32_t(a.numRegs);
    out.shared_bytes = uint32_t(a.sharedSizeBytes) + dynamic_shared;
    out.blocks_per_unit = uint32_t(blocks > 0 ? blocks : 0);
    return true;
}

namespace {

// The library's kernels, named as their kernel_info (kernels.h), with their case in the DKP
// kernel's dispatch (dkp.cu), registered with the device layer when the library is loaded.
struct builtin {
    const char* name;
    gpu::gpu_kernel_entry entry;
};

#define RL_BUILTIN(name, kind) {#name, {gpu_impl::launch_##name, int32_t(kind), gpu_impl::resources_##name}}
const builtin builtins[] = {
    RL_BUILTIN(gemm, gpu_impl::pad_gemm),
    RL_BUILTIN(conv2d, gpu_impl::pad_conv2d),
    RL_BUILTIN(gather, gpu_impl::pad_gather),
    RL_BUILTIN(token_gather, gpu_impl::pad_token_gather),
    RL_BUILTIN(tensor_gather, gpu_impl::pad_tensor_gather),
    RL_BUILTIN(copy, gpu_impl::pad_copy),
    RL_BUILTIN(binary, gpu_impl::pad_binary),
    RL_BUILTIN(unary, gpu_impl::pad_unary),
    RL_BUILTIN(where, gpu_impl::pad_where),
    RL_BUILTIN(row, gpu_impl::pad_row),
    RL_BUILTIN(pool2d, gpu_impl::pad_pool2d),
    RL_BUILTIN(lrn, gpu_impl::pad_lrn),
    RL_BUILTIN(batchnorm, gpu_impl::pad_batchnorm),
    RL_BUILTIN(gather_axis, gpu_impl::pad_gather_axis),
    {"gpu_spin", {gpu_impl::launch_spin, int32_t(gpu_impl::pad_spin), gpu_impl::resources_spin}},
};
#undef RL_BUILTIN

struct registration {
    registration() {
        for (const builtin& b : builtins) gpu::register_gpu_kernel(b.name, b.entry);
        gpu::register_gpu_padded_library(gpu_impl::padded_library());
    }
};
const registration registered;

}  // namespace

const char* gpu_runtime_name() { return RL_GPU_RUNTIME_NAME; }

bool gpu_has_tensor_cores() {
#if defined(RL_GPU_WMMA)
    return true;
#else
    return false;
#endif
}

}  // namespace reefline::ml::kernels
