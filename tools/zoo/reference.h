// Plain CPU reference kernels (float, NCHW) for the ops the zoo's CNNs use. The builder runs
// them on a calibration batch while it builds a model, to set each batch norm's running mean
// and variance to the statistics it actually sees and to rescale each conv / gemm to a target
// output scale (LSUV-style), so that activations neither explode nor vanish over 150+ layers.
// Simple loops, not fast: a full-size model at batch 1 takes seconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace reefline::zoo {

// Kernel geometry of a 2-D conv or pool. pads are ONNX order: top, left, bottom, right.
struct window2d {
    int64_t kh, kw;
    int64_t sh = 1, sw = 1;
    int64_t pt = 0, pl = 0, pb = 0, pr = 0;
    static window2d square(int64_t k, int64_t stride = 1, int64_t pad = 0) {
        return {k, k, stride, stride, pad, pad, pad, pad};
    }
    // kh x kw, stride 1, padded to keep the size ("same" for odd kernels): 1x7, 7x1, 3x3, ...
    static window2d same(int64_t kh, int64_t kw) {
        return {kh, kw, 1, 1, kh / 2, kw / 2, kh / 2, kw / 2};
    }
};

}  // namespace reefline::zoo

namespace reefline::zoo::ref {

struct tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
    int64_t dim(size_t i) const { return shape[i]; }
};

// w: [cout, cin/groups, kh, kw]; bias may be null.
tensor conv2d(const tensor& x, const float* w, const float* bias, int64_t cout, int64_t groups,
              const window2d& k);
tensor batchnorm(const tensor& x, const float* gamma, const float* beta, const float* mean,
                 const float* var, float eps);
tensor relu(const tensor& x);
tensor clip(const tensor& x, float lo, float hi);
tensor maxpool(const tensor& x, const window2d& k);
tensor avgpool(const tensor& x, const window2d& k, bool count_include_pad);
tensor global_avgpool(const tensor& x);
tensor lrn(const tensor& x, int64_t size, float alpha, float beta, float bias);
tensor flatten(const tensor& x);
// x [n, in], w [out, in] (Gemm with transB = 1).
tensor gemm(const tensor& x, const float* w, const float* bias, int64_t out);
tensor concat(const std::vector<const tensor*>& xs, int64_t axis);
tensor add(const tensor& a, const tensor& b);

// Per-channel (axis 1) mean and variance over all other axes.
void channel_stats(const tensor& x, std::vector<double>& mean, std::vector<double>& var);
double rms(const tensor& x);

}  // namespace reefline::zoo::ref
