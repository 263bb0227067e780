// Which activations of a graph the cpu device keeps channel-blocked (kernels/cpu_c16.h), and
// which convolutions run on that layout.
//
// Values that must share a layout form classes: an element-wise op on equal shapes, a batch
// norm, a pooling and a concatenation along channels read and write one layout. A class is
// blocked when every member is a runtime f32 [n, c, h, w] tensor with c a multiple of 16 (not
// a graph input or output), every member is written by a convolution conv2d_c16 can run or
// by one of those ops, and some member is read by a convolution that takes a c16 input or by
// a global pooling (which reads it as rows of 16 channels): then the layout pays. A reader
// that takes only NCHW (a Flatten, a depthwise convolution, a Gemm) gets the value reordered
// by the planner; none of the zoo's CNNs has one inside a blocked class.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "libml/frontend/graph.h"
#include "libml/kernels/decomp.h"

namespace reefline::ml {

struct c16_layout {
    std::vector<char> value;  // by value id: stored c16
    std::vector<char> conv;   // by node id: a Conv that conv2d_c16 runs (its input or output is c16)
    bool any() const;
};

// A Conv node's geometry (shapes, strides, padding, groups; no tiles, pointers or
// activation), or nullopt for what is not a 2-D convolution of f32 tensors with constant
// weights.
std::optional<kernels::conv2d_args> conv2d_geometry(const graph& g, const node& n);
// The same from the node's input, weights and output values.
std::optional<kernels::conv2d_args> conv2d_geometry(const node& n, const value& x, const value& w, const value& y);

// conv_ok(node index, x_c16): whether conv2d_c16 may run that Conv with a c16 (or NCHW) input.
c16_layout choose_c16_layout(const graph& g, const std::function<bool(int, bool)>& conv_ok);
// The choice for a graph whose filters are not laid out yet: every convolution conv2d_c16 can
// run, except pointwise layers the planner folds into the depthwise layer after them
// (kernels::pointwise_depthwise_possible), which read NCHW.
c16_layout choose_c16_layout(const graph& g);

// The cpu device runs the c16 layout where it has AVX-512, unless turned off for the process
// (reefrun --layout nchw, libml_vs_ort --layout nchw: side-by-side measurements).
void use_c16_layout(bool on);
bool c16_layout_in_use();

}  // namespace reefline::ml
