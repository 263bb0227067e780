// The channel-blocked layout of the cpu device ("c16"): a 4-D f32 activation [n, c, h, w]
// stored as [n][c / 16][h][w][16], the 16 channels of a pixel in one 64-byte vector. Where
// every channel count is a multiple of 16 it holds the same bytes as NCHW, only in another
// order, so the memory plan, concatenations along channels (each input's channels one range
// of an image's bytes) and element-wise kernels on equal shapes treat both alike.
//
// Why: a convolution on NCHW is an im2col and a GEMM (or the direct tiles of
// cpu_direct_conv.h), which on an Intel Xeon ran ResNet-50's, DenseNet-121's and
// Inception-v3's layers 1.2-1.5x slower than ONNX Runtime's NCHWc kernels (its NCHW path took
// 82 ms for ResNet-50 where its NCHWc one took 57). On the blocked layout a register tile of
// 4 x 16 output channels by 6 pixels takes, for each input channel and tap, 4 aligned vector
// loads of the packed filters and 6 broadcasts of input values, with no im2col, no packing at
// run time and no output pass: bias, residual and activation are applied in the register.
//
// Kernels here run on the cpu device with AVX-512 only; GPU plans never use the layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

inline constexpr int64_t c16 = 16;  // channels to a block

// A convolution with c16 output (or NCHW output, y_c16 false) from a c16 or NCHW input.
struct conv2d_c16_args {
    const float* x;         // [n, c_in / 16, h, w_in, 16] where x_c16, else [n, c_in, h, w_in]
    const float* w;         // the filters in conv2d_c16_filters' layout
    const float* bias;      // [c_out] or null
    const float* residual;  // laid out as y, added after the bias, or null
    float* y;               // [n, c_out / 16, h_out, w_out, 16] where y_c16, else [n, c_out, h_out, w_out]
    int64_t n, c_in, h, w_in, c_out, kh, kw;
    int64_t stride_h, stride_w, pad_top, pad_left, h_out, w_out;
    epilogue ep;            // none, ReLU or Clip
    bool x_c16, y_c16;
    int32_t tile_co;        // output channels a block: a multiple of 64, or c_out
    int32_t tile_rows;      // output rows a block (even where w_winograd is set)
    int32_t chunk;          // input channels between check points (a multiple of 16 where x_c16)
    // The Winograd filters of a 3x3 layer at stride 1 (conv2d_c16_winograd_filters), or null:
    // the blocks then run F(2x2, 3x3) instead of the direct sums (c16 input and output only).
    const float* w_winograd;
    // A depthwise convolution (groups = c_in = c_out; c16 input and output): each channel's
    // window over its own plane, 16 channels to a vector, filters [c / 16][kh][kw][16].
    bool depthwise;
};
RL_HD inline int64_t conv2d_c16_grid(const conv2d_c16_args& a) {
    return a.n * ceil_div(a.c_out, a.tile_co) * ceil_div(a.h_out, a.tile_rows);
}

// Whether conv2d_c16 can run this convolution (groups 1, or depthwise from a c16 input; no
// dilation, strides 1 or 2, windows up to 11 x 11, c_out a multiple of 16, c_in too for a c16
// input) on this CPU.
bool conv2d_c16_possible(const conv2d_args& geometry, bool x_c16);
inline bool conv2d_c16_depthwise(const conv2d_args& g) { return g.groups > 1 && g.groups == g.c_in && g.groups == g.c_out; }
// The filters [c_out, c_in, kh, kw] packed for conv2d_c16: output channels in groups of four
// blocks of 16 (the last group the rest), each group [c_in / cb][kh][kw][cb][blocks][16] with
// cb = 16 for a c16 input and 1 for an NCHW one; group g starts at 64 g c_in kh kw floats.
int64_t conv2d_c16_filter_floats(int64_t c_out, int64_t c_in, int64_t kh, int64_t kw);
void conv2d_c16_filters(const float* w, int64_t c_out, int64_t c_in, int64_t kh, int64_t kw, bool x_c16, float* out);
// A depthwise layer's weights [c, 1, kh, kw] as [c / 16][kh][kw][16] (c * kh * kw floats).
void conv2d_c16_depthwise_filters(const float* w, int64_t c, int64_t kh, int64_t kw, float* out);
// Scratch one block needs: its input rows, zero-padded, where the window reaches past the
// input; an NCHW output's partial sums; Winograd's transformed inputs and products.
size_t conv2d_c16_scratch_bytes(const conv2d_c16_args& a);

// Winograd F(2x2, 3x3) on the c16 layout: 3x3 layers at stride 1 between c16 tensors, where
// c16_winograd_wanted says it pays. A block goes over chunks of its 2x2 output tiles: the
// chunk's input tiles d (4 x 4 pixels of 16 channels, one vector each) become V = B^T d B by
// vector additions, the 16 products M[xi] = V[xi] U[xi] over the input channels are
// pointwise c16 convolutions over the chunk's tiles (the direct kernel's register tiles, the
// filters U = G g G^T packed as 1x1 c16 filters), and Y = A^T M A gives the outputs with bias,
// residual and activation. 2.25x fewer multiply-adds than the direct sums.
bool c16_winograd_possible(const conv2d_args& geometry);
bool c16_winograd_wanted(int64_t c_out, int64_t c_in, int64_t h_out, int64_t w_out);
inline int64_t conv2d_c16_winograd_floats(int64_t c_out, int64_t c_in) { return 16 * c_out * c_in; }
// U for w [c_out, c_in, 3, 3]: per position xi, the 1x1 c16 filters (conv2d_c16_filters) of
// U[xi] [c_out, c_in], xi-major.
void conv2d_c16_winograd_filters(const float* w, int64_t c_out, int64_t c_in, float* out);

extern const gpu::kernel_info conv2d_c16_kernel;     // conv2d_c16_args, conv2d_c16_grid()
// Pooling and batch norm of c16 tensors: the same argument structs as pool2d_kernel and
// batchnorm_kernel (x and y c16), planes_per_block counting channel blocks of images.
extern const gpu::kernel_info pool2d_c16_kernel;     // pool2d_args (2-D, no indices), pool2d_c16_grid()
extern const gpu::kernel_info batchnorm_c16_kernel;  // batchnorm_args, batchnorm_c16_grid()
RL_HD inline int64_t pool2d_c16_grid(const pool2d_args& a) { return ceil_div(a.n * (a.c / c16), a.planes_per_block); }
RL_HD inline int64_t batchnorm_c16_grid(const batchnorm_args& a) {
    return ceil_div(a.n * (a.c / c16), a.planes_per_block);
}
// Whether pool2d_c16_kernel runs this pooling: 2-D max or average without dilation or
// indices, c a multiple of 16.
bool pool2d_c16_possible(const pool2d_args& a);

}  // namespace reefline::ml::kernels
