// The kernel library: every kernel's description (for the device) and its argument struct
// (decomp.h). Backend implementations: cpu_*.cc here; CUDA/HIP from the same decompositions in gpu/.
#pragma once

#include <string>

#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml::kernels {

extern const gpu::kernel_info gemm_kernel;    // args: gemm_args, grid: gemm_grid()
extern const gpu::kernel_info conv2d_kernel;  // args: conv2d_args, grid: conv2d_grid()
extern const gpu::kernel_info gather_kernel;  // args: gather_args, grid: gather_grid()
extern const gpu::kernel_info token_gather_kernel;   // token_gather_args, token_gather_grid()
extern const gpu::kernel_info tensor_gather_kernel;  // tensor_gather_args, tensor_gather_grid()
extern const gpu::kernel_info copy_kernel;         // copy_args, copy_grid()
extern const gpu::kernel_info binary_kernel;       // binary_args, binary_grid()
extern const gpu::kernel_info unary_kernel;        // unary_args, unary_grid()
extern const gpu::kernel_info where_kernel;        // where_args, where_grid()
extern const gpu::kernel_info row_kernel;          // row_args, row_grid()
extern const gpu::kernel_info pool2d_kernel;       // pool2d_args, pool2d_grid()
extern const gpu::kernel_info lrn_kernel;          // lrn_args, lrn_grid()
extern const gpu::kernel_info batchnorm_kernel;    // batchnorm_args, batchnorm_grid()
extern const gpu::kernel_info gather_axis_kernel;  // gather_axis_args, gather_axis_grid()
// Blocks of a known length with check points (gpu_spin_args, gpu/launcher.h), on every
// backend: the device contract's and the preemption benchmark's kernel.
extern const gpu::kernel_info spin_kernel;

// Scratch (bytes) a conv2d block needs on the cpu backend for its im2col tile.
size_t conv2d_scratch_bytes(const conv2d_args& c);
// Of which a block of tile_images > 1 images needs, for their columns and the GEMM's output.
size_t conv2d_images_scratch_bytes(const conv2d_args& c);
// The planner gives im2col convolutions on planes of up to this many outputs, at batch > 1,
// blocks of several images (one GEMM over their columns reads the weights once for them all).
inline constexpr int64_t conv2d_images_max_pixels = 64;
bool conv2d_is_pointwise(const conv2d_args& c);
// The geometry of a window over one plane: a depthwise convolution's or a 2-D pooling's.
struct plane_window {
    int64_t h, w, w_out, kh, kw, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w;
};
// A convolution's window over each input plane.
inline plane_window conv2d_window(const conv2d_args& c) {
    return {c.h, c.w_in, c.w_out, c.kh, c.kw, c.stride_h, c.stride_w, c.pad_top, c.pad_left, c.dil_h, c.dil_w};
}
// y[p - p0] = the sum over the window's taps inside the plane of w[tap] * x[tap] (w null: 1),
// for output pixels [p0, p1) of one plane (row major, w_out wide). `strided` holds at least
// min(p1 - p0, w_out) floats when stride_w != 1.
void window_sum(const plane_window& g, const float* x, const float* w, int64_t p0, int64_t p1, float* y,
                float* strided);
// The zero-padded plane split by stride into phases: phase (a, b) holds the padded plane's rows
// a, a + sh, .. and columns b, b + sw, .. (at stride 1 the one phase is the padded plane).
// Output (oy, ox) takes tap (i, j) from phase (i % sh, j % sw) at row oy + i / sh, column
// ox + j / sw: at every stride, one unit-stride run per tap over the whole plane, with output
// rows wp apart (the columns past w_out are wasted). A phase is hp x wp, with (kw - 1) / sw
// floats of slack after it (the last taps of the last row's wrapped columns read them; those
// sums land in columns >= w_out, never kept). For strides 1 and 2 without dilation.
struct plane_phases {
    int64_t hp, wp, slack, sh, sw;
    int64_t phase_floats() const { return hp * wp + slack; }
    int64_t plane_floats() const { return sh * sw * phase_floats(); }
    // Tap (i, j)'s read for output (0, 0), from the phases' start. (Strides are 1 or 2: masks
    // and shifts, no divisions, which would cost as much as a 7x7 plane's sums.)
    int64_t tap_offset(int64_t i, int64_t j) const {
        const int64_t hs = sh - 1, ws = sw - 1;
        return ((i & hs) * sw + (j & ws)) * phase_floats() + (i >> hs) * wp + (j >> ws);
    }
};
// The phases for `rows` output rows.
inline plane_phases plane_phases_of(const plane_window& g, int64_t rows) {
    return {rows + (g.kh - 1) / g.stride_h, g.w_out + (g.kw - 1) / g.stride_w, (g.kw - 1) / g.stride_w, g.stride_h,
            g.stride_w};
}
bool plane_phases_fit(const plane_window& g);
// Phase rows [row0, row0 + f.hp) of one plane x (h x w) into dst (f.plane_floats()).
void fill_plane_phases(const plane_window& g, const plane_phases& f, int64_t row0, const float* x, float* dst);
// window_sum over a whole plane of h_out output rows at strides 1 and 2 without dilation (where
// plane_phases_fit), as one run per tap over the zero-padded plane (split into its
// stride phases): the same sums in the same order, without a call per tap and row (14x14 and
// 7x7 planes are most of MobileNet's depthwise work, its stride-2 layers the slowest per sum).
// `scratch` holds window_sum_plane_scratch_bytes.
size_t window_sum_plane_scratch_bytes(const plane_window& g, int64_t h_out);
void window_sum_plane(const plane_window& g, int64_t h_out, const float* x, const float* w, float* y, float* scratch);
// Depthwise convolutions and max pools of planes of up to this many outputs run 16 channels
// at a time on AVX-512 CPUs (cpu_planes16.h): the planner gives their blocks a multiple of 16.
inline constexpr int64_t depthwise16_max_pixels = 256;
inline constexpr int64_t pool16_max_pixels = 1600;
// 2-D pooling of whole planes, separably: each padded input row reduced across the window's
// columns (strides 1 and 2 as unit-stride vector runs), then those rows across the window's
// rows (stride 1: the whole plane as one run per tap). Max keeps the first of equal values as
// the general loop does; a window whose first tap inside the input is NaN gives the maximum
// of the others where the general loop gives NaN. Averages are the window sums (the caller
// divides). For pools without dilation, depth or indices, at most pool_max_columns outputs wide,
// whose scratch stays within 16 MB.
inline constexpr int64_t pool_max_columns = 4096;
bool pool2d_is_separable(const pool2d_args& a);
// How many of an average pool's window positions along one axis output o counts: those inside
// [0, n), or inside the padded [-pad, n + pad_end) with count_include_pad (never beyond it, as
// ceil_mode's last windows reach). Rows counted times columns counted divide the sum.
inline int64_t pool_window_count(const pool2d_args& a, int64_t o, int64_t stride, int64_t pad, int64_t pad_end,
                                 int64_t k, int64_t n) {
    const int64_t lo = o * stride - pad, hi = lo + k;
    const int64_t end = a.count_include_pad ? n + pad_end : n, begin = a.count_include_pad ? -pad : 0;
    const int64_t in = (hi < end ? hi : end) - (lo > begin ? lo : begin);
    return in > 0 ? in : 0;
}
size_t pool2d_scratch_bytes(const pool2d_args& a);  // cpu: per block, for pool_plane_separable
void pool_plane_separable(const pool2d_args& a, const float* x, float* y, float* scratch);
// Softmax (log: log-softmax) of one line of n elements `stride` apart, and layer norm of one
// contiguous row of n (y = (x - mean) / sqrt(var + epsilon) * scale + bias; mean and 1/std
// stored where asked): AVX-512 in float with a vector exp where the CPU has it and the row is
// contiguous, double-precision loops otherwise.
void softmax_row(const float* x, float* y, int64_t n, int64_t stride, bool log);
void layer_norm_row(const float* x, float* y, int64_t n, const float* scale, const float* bias, float epsilon,
                    float* mean_out, float* inv_std_out);
// y[j] = y[j] / (rows * columns[j]), 0 where that count is 0 (an average pool's counts).
void divide_row(float* y, float rows, const float* columns, int64_t n);
// The kernel set the cpu GEMM/conv blocks run, for logs: OpenBLAS's core name, and where
// OPENBLAS_CORETYPE chose it ("Cooperlake (OpenBLAS's choice for this CPU)", "Haswell (as
// OPENBLAS_CORETYPE=Haswell)"). Worth ~1.6x on convolution models, hence printed.
std::string cpu_blas_kernels();

// erf for the cpu blocks: Eigen's rational approximation (generic_fast_erf_float), a few ulp on
// [-4, 4] and +-1 beyond. Branch-free, so loops over it vectorise; std::erf is ~10x slower,
// and GELU evaluates it once per element of a transformer's widest tensors.
inline float erf_fast(float x) {
    x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    const float x2 = x * x;
    float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = x2 * p + -2.10102402082508e-06f;
    p = x2 * p + -5.69250639462346e-05f;
    p = x2 * p + -7.34990630326855e-04f;
    p = x2 * p + -2.95459980854025e-03f;
    p = x2 * p + -1.60960333262415e-02f;
    p *= x;
    float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
    q = x2 * q + -1.68282697438203e-03f;
    q = x2 * q + -7.37332916720468e-03f;
    q = x2 * q + -1.42647390514189e-02f;
    return p / q;
}

// Applies the fused epilogue to n values in place (AVX-512 where the activation has a vector
// form with the same bits, apply_epilogue_scalar's loops otherwise).
void apply_epilogue(float* v, int64_t n, const epilogue& ep);
void apply_epilogue_scalar(float* v, int64_t n, const epilogue& ep);
// y[j] = ep(y[j] + beta * bias[j * bias_stride]) for j < n, in one pass: bias_stride 1 adds a
// row of biases, 0 one value; no bias (null) adds nothing, so a -0 stays -0.
void bias_epilogue_row(float* y, int64_t n, const float* bias, int64_t bias_stride, float beta, const epilogue& ep);
// y[i] = ep(x[i] * s + b): a per-channel affine map (inference batch norm) with its activation.
void affine_row(float* y, const float* x, float s, float b, int64_t n, const epilogue& ep);

}  // namespace reefline::ml::kernels
