// The kernel library: every kernel's description (for the device) and its argument struct
// (decomp.h). Backend implementations: cpu_*.cc here; CUDA/HIP from the same decompositions in gpu/.
#pragma once

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

extern const gpu::kernel_info gemm_kernel;    // args: gemm_args, grid: gemm_grid()
extern const gpu::kernel_info conv2d_kernel;  // args: conv2d_args, grid: conv2d_grid()
extern const gpu::kernel_info gather_kernel;  // args: gather_args, grid: gather_grid()
extern const gpu::kernel_info copy_kernel;         // copy_args, copy_grid()
extern const gpu::kernel_info binary_kernel;       // binary_args, binary_grid()
extern const gpu::kernel_info unary_kernel;        // unary_args, unary_grid()
extern const gpu::kernel_info where_kernel;        // where_args, where_grid()
extern const gpu::kernel_info row_kernel;          // row_args, row_grid()
extern const gpu::kernel_info pool2d_kernel;       // pool2d_args, pool2d_grid()
extern const gpu::kernel_info lrn_kernel;          // lrn_args, lrn_grid()
extern const gpu::kernel_info batchnorm_kernel;    // batchnorm_args, batchnorm_grid()
extern const gpu::kernel_info gather_axis_kernel;  // gather_axis_args, gather_axis_grid()

// Scratch (bytes) a conv2d block needs on the cpu backend for its im2col tile.
size_t conv2d_scratch_bytes(const conv2d_args& c);
bool conv2d_is_pointwise(const conv2d_args& c);

// Applies the fused epilogue to n values in place.
void apply_epilogue(float* v, int64_t n, const epilogue& ep);

}  // namespace reefline::ml::kernels
