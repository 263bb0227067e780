// Sensor TCN: a temporal convolution network (Bai et al. 2018) classifying windows of sensor
// readings. input f32 [N, T, F] (time-major, as a window of F-channel samples arrives; only N
// symbolic) -> Transpose to [N, F, T] -> residual blocks of dilated causal 1-D convolutions ->
// GlobalAveragePool over time -> Flatten -> Gemm -> logits [N, classes]. Block b (dilation
// d = 2^b): y = ReLU(conv_d(ReLU(conv_d(x))) + res(x)), res a 1x1 conv where the channel count
// changes (the first block) and the identity after. The convs are ONNX Conv on 3-D tensors with
// kernel 3, dilation d and pads [2d, 0]: left padding only, so output step t sees inputs
// t - 2d .. t, never the future. The receptive field is 1 + 4 (2^blocks - 1) steps.
//
// Weights: Kaiming-normal, std sqrt(2 / fan_in) before a ReLU; the second conv of a block,
// whose output is added to the residual, has gain 1 / sqrt(blocks) so that the sum's scale grows
// little over the blocks (activations stay at rms ~0.7 .. 1). The input is expected
// standardised per feature (zero mean, unit variance).
//
// Calibration (unless --no-calibration): after the ReLUs every channel has a positive mean that
// does not depend on the input, and averaging over T leaves little else, so plain Kaiming
// weights give every window nearly the same logits (the same argmax for all). The builder's
// reference kernels are 2-D, so this file runs the network itself on a seeded batch of N(0, 1)
// windows and sets the Gemm's bias to cancel the batch's mean logits and its weight's scale to
// logits of rms kLogitRms about that mean.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {

namespace {

constexpr int64_t kCalibBatch = 16;

// Activations [batch, channels, steps] of the calibration run; empty when not calibrating.
struct activation {
    int64_t c = 0, t = 0;
    std::vector<float> v;
};

float* initializer_data(graph_builder& g, const std::string& name) {
    for (auto& t : *g.graph().mutable_initializer())
        if (t.name() == name && t.data_type() == onnx::TensorProto::FLOAT)
            return reinterpret_cast<float*>(t.mutable_raw_data()->data());
    throw std::logic_error("no float initializer " + name);
}

// Conv over [N, cin, T] with weight [cout, cin, k], bias ~ N(0, 0.01); causal for k > 1. On the
// calibration activations x (if any) it also computes y.
std::string conv1d(graph_builder& g, const std::string& x, const activation& xv,
                   activation& yv, const std::string& name, int64_t cin, int64_t cout, int64_t k,
                   int64_t dilation, double gain) {
    const std::string w = g.normal(name + ".weight", {cout, cin, k},
                                   gain / std::sqrt(static_cast<double>(cin * k)));
    const std::string b = g.normal(name + ".bias", {cout}, 0.01);
    const std::string y =
        g.op("Conv", {x, w, b}, name,
             {attr("kernel_shape", {k}), attr("dilations", {dilation}), attr("strides", {1}),
              attr("pads", {(k - 1) * dilation, 0})});
    yv = {};
    if (xv.v.empty()) return y;
    const float* pw = initializer_data(g, w);
    const float* pb = initializer_data(g, b);
    const int64_t n = static_cast<int64_t>(xv.v.size()) / (cin * xv.t), t = xv.t;
    yv = {cout, t, std::vector<float>(static_cast<size_t>(n * cout * t))};
    for (int64_t i = 0; i < n; ++i)
        for (int64_t co = 0; co < cout; ++co) {
            float* out = &yv.v[static_cast<size_t>((i * cout + co) * t)];
            for (int64_t s = 0; s < t; ++s) out[s] = pb[co];
            for (int64_t ci = 0; ci < cin; ++ci) {
                const float* in = &xv.v[static_cast<size_t>((i * cin + ci) * t)];
                for (int64_t j = 0; j < k; ++j) {
                    // Tap j reads step s - (k - 1 - j) d: the left padding is zeros.
                    const int64_t off = (k - 1 - j) * dilation;
                    const float wj = pw[(co * cin + ci) * k + j];
                    for (int64_t s = off; s < t; ++s) out[s] += wj * in[s - off];
                }
            }
        }
    return y;
}

void relu_inplace(activation& a) {
    for (float& x : a.v) x = x > 0.0f ? x : 0.0f;
}

}  // namespace

void build_sensor_tcn(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t steps = v.tiny ? 64 : 256, features = v.tiny ? 6 : 12;
    const int64_t channels = v.tiny ? 16 : 64, blocks = v.tiny ? 4 : 6, classes = 8;
    const double relu_gain = std::sqrt(2.0), branch_gain = 1.0 / std::sqrt(double(blocks));

    const std::vector<shape_dim> shape{shape_dim{"N"}, shape_dim{steps}, shape_dim{features}};
    std::string x = g.input("input", onnx::TensorProto::FLOAT, shape);
    m.inputs.push_back({x, onnx::TensorProto::FLOAT, shape});
    x = g.op("Transpose", {x}, "input.transpose", {attr("perm", {0, 2, 1})});  // [N, F, T]

    // The calibration batch, already transposed to [batch, F, T] (N(0, 1) in either layout).
    activation xv;
    if (v.calibrate) {
        xv = {features, steps,
              std::vector<float>(static_cast<size_t>(kCalibBatch * features * steps))};
        prng rng(g.seed() * 0x9e3779b97f4a7c15ull ^ fnv1a("calibration.sensor_tcn"));
        for (float& f : xv.v) f = static_cast<float>(rng.normal());
    }

    int64_t cin = features;
    for (int64_t b = 0; b < blocks; ++b) {
        const std::string p = "tcn." + std::to_string(b);
        const int64_t d = int64_t{1} << b;
        activation h, y, r;
        std::string t = conv1d(g, x, xv, h, p + ".conv1", cin, channels, 3, d, relu_gain);
        t = g.relu(t, p + ".relu1");
        relu_inplace(h);
        t = conv1d(g, t, h, y, p + ".conv2", channels, channels, 3, d, branch_gain);
        std::string res = x;
        if (cin != channels) {
            res = conv1d(g, x, xv, r, p + ".downsample", cin, channels, 1, 1, 1.0);
            xv = std::move(r);
        }
        x = g.relu(g.add(t, res, p + ".residual"), p + ".relu");
        for (size_t i = 0; i < y.v.size(); ++i) y.v[i] += xv.v[i];
        relu_inplace(y);
        xv = std::move(y);
        cin = channels;
    }
    x = g.flatten(g.global_avgpool(x, "pool"), "flatten");  // [N, channels]
    const std::string logits = g.gemm(x, "fc", channels, classes, kLogitRms);
    if (!xv.v.empty()) {
        // Pooled features [batch, channels], their batch mean, and the logits about it.
        std::vector<double> pooled(static_cast<size_t>(kCalibBatch * channels)), mean(channels);
        for (int64_t i = 0; i < kCalibBatch * channels; ++i) {
            double s = 0;
            for (int64_t k = 0; k < steps; ++k) s += xv.v[static_cast<size_t>(i * steps + k)];
            pooled[i] = s / static_cast<double>(steps);
            mean[i % channels] += pooled[i] / kCalibBatch;
        }
        float* w = initializer_data(g, "fc.weight");  // [classes, channels]
        float* bias = initializer_data(g, "fc.bias");
        double ss = 0;
        for (int64_t i = 0; i < kCalibBatch; ++i)
            for (int64_t c = 0; c < classes; ++c) {
                double z = 0;
                for (int64_t k = 0; k < channels; ++k)
                    z += w[c * channels + k] * (pooled[i * channels + k] - mean[k]);
                ss += z * z;
            }
        const double rms = std::sqrt(ss / static_cast<double>(kCalibBatch * classes));
        if (!(rms > 1e-12) || !std::isfinite(rms))
            throw std::runtime_error("calibration: the pooled features do not depend on the input");
        const double scale = kLogitRms / rms;
        for (int64_t c = 0; c < classes; ++c) {
            double centre = 0;
            for (int64_t k = 0; k < channels; ++k) {
                w[c * channels + k] = static_cast<float>(w[c * channels + k] * scale);
                centre += w[c * channels + k] * mean[k];
            }
            bias[c] = static_cast<float>(bias[c] - centre);
        }
    }
    image_output(g, m, logits, classes);
}

}  // namespace reefline::zoo
