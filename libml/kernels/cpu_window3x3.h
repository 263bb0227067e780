// 3x3 windows straight from the NCHW planes (cpu_window3x3.cc): depthwise convolutions, max and
// average pools. AVX-512 only, for the cpu blocks.
#pragma once

#include <cstdint>

#include "libml/kernels/decomp.h"

namespace reefline::ml::kernels {

// 3x3 depthwise windows at strides 1 and 2 without dilation, any padding, bias and none, ReLU
// or Clip, no residual.
bool depthwise3x3_possible(const conv2d_args& c);
// One whole output plane (channel `group` of `image`), bias and activation included: the same
// operations in the same order as window_sum_plane and the blocks' epilogue passes (and
// depthwise16), so the same results bit for bit. Needs no scratch.
void depthwise3x3(const conv2d_args& c, int64_t image, int64_t group);

// 3x3 max and average pools that pool_plane_separable takes, at strides 1 and 2.
bool pool3x3_possible(const pool2d_args& a);
// One whole output plane (plane of n * c), averages divided: pool_plane_separable's and
// divide_row's results bit for bit. `columns` holds each output column's count
// (pool_window_count; averages only). Needs no scratch.
void pool3x3(const pool2d_args& a, int64_t plane, const float* columns);

}  // namespace reefline::ml::kernels
