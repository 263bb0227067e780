// Winograd convolution F(2x2, 3x3) for the cpu blocks (cpu_winograd.cc), beside the direct
// convolution and im2col with the GEMM.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

// Whether conv2d_winograd can serve this layer: AVX-512, a 3x3 window at stride 1 without
// dilation, not depthwise. (Its filters come from winograd_filters.)
bool conv2d_winograd_possible(const conv2d_args& c);
// Whether the blocks run this layer by conv2d_winograd, under the method in use (conv_method,
// cpu_direct_conv.h): where it is possible, c.w_winograd is set, and it is measured faster.
bool conv2d_winograd_chosen(const conv2d_args& c);
// Whether a layer of these channels, output plane and batch gets Winograd filters when its
// model loads on the cpu device (the planner's rule): where winograd runs faster than the
// direct sums and im2col, and its filters (16/9 of the weights) are worth their memory.
bool winograd_filters_wanted(int64_t co_per_group, int64_t ci_per_group, int64_t h_out, int64_t w_out);
// The floats winograd_filters writes for weights [c_out, ci_per_group, 3, 3].
inline int64_t winograd_filter_floats(int64_t c_out, int64_t ci_per_group) { return 16 * c_out * ci_per_group; }
// U = G g G^T for every 3x3 filter g of w ([c_out, ci_per_group, 3, 3], groups of co_per_group
// output channels), into u: per group [16][co_per_group][ci_per_group] (position-major, so that
// each of the 16 GEMMs reads its filters as one matrix).
void winograd_filters(const float* w, int64_t c_out, int64_t ci_per_group, int64_t co_per_group, float* u);
// Scratch one block needs: a chunk's input rows split into even and odd columns, the chunk's
// transformed inputs and its 16 products.
size_t conv2d_winograd_scratch_bytes(const conv2d_args& c);
// One group's tile into y (the tile's first output, rows of output channels h_out * w_out
// apart) from x (the group's first input channel), u (the group's filters from
// winograd_filters) and bias (the tile's first output channel's, or null), as conv2d_direct
// takes them: the sums, and where conv2d_direct_finishes the epilogue too. Each output comes
// from its 2x2 tile's 16 products, each summed over the input channels in order from 0. False
// when preempted between chunks.
bool conv2d_winograd(const conv2d_args& c, const conv2d_tile& t, const float* x, const float* u, const float* bias,
                     float* y, float* scratch, const gpu::block_context& ctx);

}  // namespace reefline::ml::kernels
