// Direct convolution for the cpu blocks (cpu_direct_conv.cc), beside im2col and the GEMM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

// Windows up to 7x7 (49 taps) and 1x7 / 7x1 are summed directly.
inline constexpr int64_t max_direct_taps = 64;

// How the cpu blocks compute convolutions that are neither pointwise nor depthwise: direct
// where it is measured faster (the default), or always where it can, or always by im2col and
// the GEMM: for side-by-side measurements (reefrun --conv, libml_vs_ort --conv) and tests.
enum class conv_method : uint8_t { automatic, direct, winograd, im2col };
void use_conv_method(conv_method m);
conv_method conv_method_in_use();
// "auto", "direct", "winograd", "im2col" (the tools' --conv): anything else reads as automatic.
conv_method conv_method_named(std::string_view name);

// Whether conv2d_direct can serve this layer: AVX-512, a window of 2..64 taps at strides 1 or
// 2 without dilation, not depthwise.
bool conv2d_direct_possible(const conv2d_args& c);
// Whether the blocks run this layer by conv2d_direct, under the method in use.
bool conv2d_direct_chosen(const conv2d_args& c);
// Scratch one block needs: its input channels' padded planes for the rows it reads, and its
// outputs at the planes' row width.
size_t conv2d_direct_scratch_bytes(const conv2d_args& c);
// Whether conv2d_direct applies the layer's epilogue itself: bias and ReLU, Clip or no
// activation, without a residual (the blocks' pass over the output does the rest).
bool conv2d_direct_finishes(const conv2d_args& c);
// The epilogue a tile's last pass applies in the register before its store, as the blocks'
// pass over the output would (bias_activation): bias then ReLU or Clip, or the bias alone
// where it is not 0 (direct and Winograd tiles alike). On ResNet-50's 7x7 stem at batch 8 that
// pass read back 3.2 MB an image from beyond L2 (alone: 9.0 ms for the sums, 9.8-10.2 with
// the pass after them).
struct direct_finish {
    const float* bias;  // the tile's output channels' (from its first), or null
    bool relu, clip;
    float lo, hi;
};
direct_finish direct_finish_of(const epilogue& ep, const float* bias);
inline direct_finish direct_finish_of(const conv2d_args& c, const float* bias) { return direct_finish_of(c.ep, bias); }
// A pointwise convolution's sums by the direct tiles: out[m * hw + p] = fin(the sum over
// k < nci, in order, from 0, of w[m * ldw + k] * x[k * hw + p]) for m < nco, p < hw, with
// fin.bias from the first of the nco channels. For pointwise_depthwise (cpu_pointwise_depthwise.h),
// whose planes of the sums stay in the caches. AVX-512 only.
void pointwise_direct(const float* x, int64_t hw, int64_t nci, const float* w, int64_t ldw, int64_t nco, float* out,
                      const direct_finish& fin);
// One group's tile into y (the tile's first output, rows of output channels h_out * w_out
// apart) from x (the group's first input channel), w (the tile's first output channel's
// weights) and bias (its first output channel's, or null): the sums, and where
// conv2d_direct_finishes the epilogue too, with the bits of the
// blocks' pass. Each output is the sum over input channels, then taps, in order, from 0,
// whatever the tile. False when preempted between channel chunks.
bool conv2d_direct(const conv2d_args& c, const conv2d_tile& t, const float* x, const float* w, const float* bias,
                   float* y, float* scratch, const gpu::block_context& ctx);

}  // namespace reefline::ml::kernels
