// A pointwise convolution and the 3x3 depthwise convolution that reads its output, as one
// launch (cpu_pointwise_depthwise.cc): MobileNet's expansion and depthwise pairs. AVX-512 only,
// for the cpu blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

// Planes computed a pass: the pointwise sums' register tile is this many channels.
inline constexpr int64_t pointwise_depthwise_pass = 8;

// Whether `pw` (a pointwise convolution: 1x1, stride 1, no padding, one group, no residual,
// none, ReLU or Clip) and `dw` (a depthwise convolution of its output that depthwise3x3 takes)
// can run as one launch on this CPU, its planes small enough that a pass's stay in the L2
// cache (pointwise_depthwise_scratch_bytes).
bool pointwise_depthwise_possible(const conv2d_args& pw, const conv2d_args& dw);
// The depthwise layer's args with the pointwise layer folded in (conv2d_args::pre_*); x, pre_w
// and pre_bias are bound by the caller.
conv2d_args pointwise_depthwise_args(const conv2d_args& pw, const conv2d_args& dw);
// One block's scratch: a pass's planes of the pointwise output.
size_t pointwise_depthwise_scratch_bytes(const conv2d_args& c);
// Channels [g0, g1) of one image (c.pre_c_in > 0), a pass of pointwise_depthwise_pass at a
// time: that many planes of the pointwise layer's output into `scratch` (its bias and
// activation applied in the register), then depthwise3x3_planes from them. Each block reads
// the image's input and writes its own output planes, nothing else. Checks for preemption
// between planes: false if preempted.
bool pointwise_depthwise(const conv2d_args& c, int64_t image, int64_t g0, int64_t g1, float* scratch,
                         const gpu::block_context& ctx);

}  // namespace reefline::ml::kernels
