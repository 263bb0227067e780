// Depthwise 3x3 convolutions straight from the NCHW planes (cpu_depthwise3x3.cc): AVX-512 only,
// for the cpu blocks.
#pragma once

#include <cstdint>

#include "libml/kernels/decomp.h"

namespace reefline::ml::kernels {

// 3x3 windows at strides 1 and 2 without dilation, any padding, bias and none, ReLU or Clip,
// no residual.
bool depthwise3x3_possible(const conv2d_args& c);
// One whole output plane (channel `group` of `image`), bias and activation included: the same
// operations in the same order as window_sum_plane and the blocks' epilogue passes (and
// depthwise16), so the same results bit for bit. Needs no scratch.
void depthwise3x3(const conv2d_args& c, int64_t image, int64_t group);

}  // namespace reefline::ml::kernels
