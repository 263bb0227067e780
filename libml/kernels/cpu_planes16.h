// Depthwise convolution and pooling of small planes, 16 channels at a time (cpu_planes16.cc):
// AVX-512 only, for the cpu blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libml/kernels/decomp.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

// Depthwise convolutions of planes up to depthwise16_max_pixels outputs (kernels.h), whole
// planes, with bias and none, ReLU or Clip, no residual. The blocks give 3x3 windows at strides
// 1 and 2 to depthwise3x3 instead (cpu_window3x3.h), which reads no copy of the planes.
bool depthwise16_possible(const conv2d_args& c);
size_t depthwise16_scratch_bytes(const conv2d_args& c);
// Channels [g0, g0 + 16) of one image, bias and activation included: the same operations in
// the same order as window_sum_plane and the blocks' epilogue passes, so the same results.
void depthwise16(const conv2d_args& c, int64_t image, int64_t g0, float* scratch);

// Max pooling of planes up to pool16_max_pixels outputs (kernels.h) where pool2d_is_separable:
// planes [p0, p0 + 16) of n * c, with the separable path's results (the same comparisons in the
// same order: across a window's columns, then its rows). Average pools stay per plane: 16 at a
// time measured slower in Inception-v3 (the transposes cost more than the sums they save).
// 2x2 and 3x3 pools at strides 1 and 2 go to pool_window instead (cpu_window3x3.h), faster on every plane
// size measured.
bool pool16_possible(const pool2d_args& a);
size_t pool16_scratch_bytes(const pool2d_args& a);
void pool16(const pool2d_args& a, int64_t p0, float* scratch);

}  // namespace reefline::ml::kernels
