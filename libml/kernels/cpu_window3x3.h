// 3x3 windows straight from the NCHW planes (cpu_window3x3.cc): depthwise convolutions, max and
// average pools (2x2 pools too). AVX-512 only, for the cpu blocks.
#pragma once

#include <cstdint>

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

// 3x3 depthwise windows at strides 1 and 2 without dilation, any padding, bias and none, ReLU
// or Clip, no residual.
bool depthwise3x3_possible(const conv2d_args& c);
// Whole output planes (channels [g0, g1) of `image`), bias and activation included: the same
// operations in the same order as window_sum_plane and the blocks' epilogue passes (and
// depthwise16), so the same results bit for bit. Needs no scratch. Checks for preemption
// between planes: false if preempted.
bool depthwise3x3(const conv2d_args& c, int64_t image, int64_t g0, int64_t g1, const gpu::block_context& ctx);
// The same with the input planes of channels [g0, g1) at x, one after the other (h x w_in
// each), instead of in c.x: the planes a block has just computed (pointwise_depthwise).
bool depthwise3x3_planes(const conv2d_args& c, const float* x, int64_t image, int64_t g0, int64_t g1,
                         const gpu::block_context& ctx);

// 3x3 and 2x2 max and average pools that pool_plane_separable takes, at strides 1 and 2.
bool pool_window_possible(const pool2d_args& a);
// Whole output planes [p0, p1) of n * c, averages divided: pool_plane_separable's and
// divide_row's results bit for bit. `columns` holds each output column's count
// (pool_window_count; averages only). Needs no scratch. Checks for preemption between
// planes: false if preempted.
bool pool_window(const pool2d_args& a, int64_t p0, int64_t p1, const float* columns, const gpu::block_context& ctx);

}  // namespace reefline::ml::kernels
