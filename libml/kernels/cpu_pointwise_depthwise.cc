// A pointwise convolution and the 3x3 depthwise convolution of its output as one launch: each
// block computes a pass of its channels' pointwise planes into its scratch, where they stay in
// L2, and the depthwise windows read them from there. Apart, MobileNet-v2's first expansion
// (16 -> 96 on 112x112) writes 4.8 MB an image, 38 MB at batch 8, that the depthwise layer
// then reads back from memory.
#include "libml/kernels/cpu_pointwise_depthwise.h"

#include <algorithm>

#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/cpu_window3x3.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

// A pass's planes within half of a 1 MB L2 (8 planes of 112x112: 392 KB), beside the input
// rows the sums stream through.
constexpr int64_t max_pass_bytes = int64_t(512) << 10;
// Planes of at least 28x28: on smaller ones oneDNN's sgemm ran the pointwise sums faster than
// the direct tile (MobileNet-v2's 7x7 960 -> 160 layers: the pair 1.2x slower as one launch,
// where 49 pixels take four 16-lane vectors; 14x14 0.98-1.02x), and their planes stay in L2
// between the two launches anyway. 28x28 to 112x112: 0.63-0.88x the time of the two launches.
constexpr int64_t min_pixels = 28 * 28;

}  // namespace

bool pointwise_depthwise_possible(const conv2d_args& pw, const conv2d_args& dw) {
    if (!cpu_has_avx512() || !conv2d_is_pointwise(pw) || pw.groups != 1 || pw.residual || !bias_activation_applies(pw.ep))
        return false;
    if (dw.groups != dw.c_in || dw.c_out != dw.c_in || dw.c_in != pw.c_out || dw.n != pw.n || dw.h != pw.h_out ||
        dw.w_in != pw.w_out || !depthwise3x3_possible(dw))
        return false;
    const int64_t pixels = pw.h_out * pw.w_out;
    return pixels >= min_pixels && pointwise_depthwise_pass * pixels * int64_t(sizeof(float)) <= max_pass_bytes;
}

conv2d_args pointwise_depthwise_args(const conv2d_args& pw, const conv2d_args& dw) {
    conv2d_args a = dw;
    a.pre_c_in = pw.c_in;
    a.pre_ep = pw.ep;
    a.pre_w = nullptr;
    a.pre_bias = nullptr;
    return a;
}

size_t pointwise_depthwise_scratch_bytes(const conv2d_args& c) {
    return size_t(pointwise_depthwise_pass * c.h * c.w_in) * sizeof(float);
}

bool pointwise_depthwise(const conv2d_args& c, int64_t image, int64_t g0, int64_t g1, float* scratch,
                         const gpu::block_context& ctx) {
    const int64_t hw = c.h * c.w_in, k = c.pre_c_in;
    const float* x = c.x + image * k * hw;
    for (int64_t c0 = g0; c0 < g1; c0 += pointwise_depthwise_pass) {
        if (c0 > g0 && ctx.preempted()) return false;
        const int64_t c1 = std::min(g1, c0 + pointwise_depthwise_pass);
        const direct_finish fin = direct_finish_of(c.pre_ep, c.pre_bias ? c.pre_bias + c0 : nullptr);
        pointwise_direct(x, hw, k, c.pre_w + c0 * k, k, c1 - c0, scratch, fin);
        if (!depthwise3x3_planes(c, scratch, image, c0, c1, ctx)) return false;
    }
    return true;
}

}  // namespace reefline::ml::kernels
