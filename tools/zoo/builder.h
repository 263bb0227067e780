// A small graph builder over onnx::ModelProto for the model zoo: typed helpers for the layers
// the zoo's architectures are made of (conv, batch norm, pooling, dense, layer norm, ...), each
// adding its nodes and its initializers, with weights drawn from a per-tensor PRNG stream.
//
// Determinism: a tensor's values depend only on the seed and the tensor's name (the stream is
// splitmix64 seeded from seed and the FNV-1a hash of the name), so reordering or adding layers
// elsewhere never changes an existing tensor's weights.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "tools/zoo/reference.h"

namespace reefline::zoo {

// splitmix64: tiny, fast, well-mixed; good enough for weights.
class prng {
public:
    explicit prng(uint64_t seed) : state_(seed) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    // Standard normal (Box-Muller, both values used).
    double normal();

private:
    uint64_t state_;
    bool have_spare_ = false;
    double spare_ = 0.0;
};

uint64_t fnv1a(const std::string& s);

// A dimension of a graph input or output: a size, or a symbolic name such as "N".
using shape_dim = std::variant<int64_t, std::string>;

struct node_attr {
    std::string name;
    onnx::AttributeProto proto;
};
node_attr attr(const std::string& name, int64_t v);
node_attr attr(const std::string& name, float v);
node_attr attr(const std::string& name, const std::string& v);
node_attr attr(const std::string& name, std::vector<int64_t> v);
inline node_attr attr(const std::string& name, int v) {
    return attr(name, static_cast<int64_t>(v));
}
inline node_attr attr(const std::string& name, double v) {
    return attr(name, static_cast<float>(v));
}
inline node_attr attr(const std::string& name, const char* v) { return attr(name, std::string(v)); }
inline node_attr attr(const std::string& name, std::initializer_list<int64_t> v) {
    return attr(name, std::vector<int64_t>(v));
}

struct bn_init {
    float eps = 1e-5f;
    // gamma ~ gamma_scale * (1 + N(0, 0.05)): < 1 on the last BN of a residual branch keeps the
    // residual sum's variance from doubling per block over 50 blocks.
    float gamma_scale = 1.0f;
};

// Builds a model and, when calibrating, runs it as it goes (ref:: kernels) on a seeded
// calibration batch of N(0, 1) images:
//  - conv and gemm weights are Kaiming-normal (std = gain / sqrt(fan_in)), then rescaled by
//    one factor per layer so that the layer's output has root-mean-square `gain` on the batch
//    (LSUV); this undoes the drift Kaiming's assumptions leave (max pooling raises the scale,
//    zero padding on small grids lowers it, ...);
//  - batch norms get running_mean / running_var from the statistics of their input on the
//    batch (running_var blended half-and-half with the layer's mean variance so that a channel
//    that happened to be near-constant on the batch is not blown up), gamma ~ 1, beta ~ 0.
// Ops without a reference kernel (Gather, MatMul, LayerNormalization: the transformer) and
// integer inputs stop the calibration downstream; there the weights stay plain Kaiming.
class graph_builder {
public:
    // calib_batch 0: no calibration run (weights and BN statistics purely from the PRNG).
    graph_builder(const std::string& graph_name, uint64_t seed, int64_t opset = 17,
                  int64_t calib_batch = 0);

    onnx::ModelProto& model() { return model_; }
    const onnx::ModelProto& model() const { return model_; }
    onnx::GraphProto& graph() { return *model_.mutable_graph(); }
    // Weights and biases (as torchvision counts parameters), and BN running statistics.
    int64_t param_count() const { return params_; }
    int64_t buffer_count() const { return buffers_; }
    uint64_t seed() const { return seed_; }

    // Graph inputs and outputs (dtype is an onnx::TensorProto::DataType).
    std::string input(const std::string& name, int32_t dtype, const std::vector<shape_dim>& dims);
    void output(const std::string& tensor, int32_t dtype, const std::vector<shape_dim>& dims);

    // ---- initializers (all counted as parameters except int64 constants) ----
    std::string normal(const std::string& name, const std::vector<int64_t>& shape, double std,
                       double mean = 0.0);
    std::string uniform(const std::string& name, const std::vector<int64_t>& shape, double lo,
                        double hi);
    std::string const_f32(const std::string& name, const std::vector<int64_t>& shape,
                          const std::vector<float>& values);
    std::string const_i64(const std::string& name, const std::vector<int64_t>& shape,
                          const std::vector<int64_t>& values);
    // A float scalar (shape []) shared by name: made once, reused after.
    std::string scalar(const std::string& name, float v);

    // ---- generic nodes (not calibrated) ----
    // Adds one node; outputs are named after the node (name, name:1, ...).
    std::vector<std::string> node(const std::string& op, const std::vector<std::string>& inputs,
                                  const std::string& name, int n_outputs = 1,
                                  const std::vector<node_attr>& attrs = {});
    std::string op(const std::string& op, const std::vector<std::string>& inputs,
                   const std::string& name, const std::vector<node_attr>& attrs = {}) {
        return node(op, inputs, name, 1, attrs)[0];
    }

    // ---- layers (NCHW) ----
    // Conv, weight [cout, cin/groups, kh, kw], optional bias ~ N(0, 0.01); gain: sqrt(2) before
    // a ReLU, 1 before a linear use (see the class comment).
    std::string conv(const std::string& x, const std::string& name, int64_t cin, int64_t cout,
                     window2d k, int64_t groups = 1, bool bias = false, double gain = 1.41421356);
    std::string bn(const std::string& x, const std::string& name, int64_t c, bn_init init = {});
    std::string relu(const std::string& x, const std::string& name);
    std::string relu6(const std::string& x, const std::string& name);  // Clip(x, 0, 6)
    std::string maxpool(const std::string& x, const std::string& name, window2d k);
    std::string avgpool(const std::string& x, const std::string& name, window2d k,
                        bool count_include_pad);
    std::string global_avgpool(const std::string& x, const std::string& name);
    std::string lrn(const std::string& x, const std::string& name, int64_t size, float alpha,
                    float beta, float bias);
    std::string flatten(const std::string& x, const std::string& name);
    std::string dropout(const std::string& x, const std::string& name);  // identity at inference
    std::string concat(const std::vector<std::string>& xs, const std::string& name,
                       int64_t axis = 1);
    std::string add(const std::string& a, const std::string& b, const std::string& name);
    // Gemm(x, W^T) + b with W [out, in] (as torch exports nn.Linear after Flatten).
    std::string gemm(const std::string& x, const std::string& name, int64_t in, int64_t out,
                     double gain);
    // MatMul(x, W) + b with W [in, out] (as torch exports nn.Linear on 3-D input).
    std::string linear(const std::string& x, const std::string& name, int64_t in, int64_t out,
                       double gain);
    std::string layernorm(const std::string& x, const std::string& name, int64_t dim, float eps);

    // Renames a tensor produced by a node (and its uses), e.g. a final node's output to the
    // graph output name "logits". Returns new_name.
    std::string rename(const std::string& old_name, const std::string& new_name);

    // The calibration value of a tensor, or null (not calibrating, or not computable).
    const ref::tensor* value(const std::string& tensor) const;

    // Unique node/tensor name: base if unused, else base_2, base_3, ...
    std::string unique(const std::string& base);

private:
    onnx::TensorProto* new_tensor(const std::string& name, int32_t dtype,
                                  const std::vector<int64_t>& shape, int64_t* count);
    float* floats(const std::string& initializer);
    void set_value(const std::string& tensor, ref::tensor v);
    // Scales weight (and bias) and the calibration output y so that rms(y) == target.
    void lsuv(ref::tensor& y, const std::string& weight, const std::string& bias, double target);

    onnx::ModelProto model_;
    uint64_t seed_;
    int64_t calib_batch_;
    int64_t params_ = 0, buffers_ = 0;
    std::unordered_set<std::string> used_;  // node and tensor names, for unique()
    std::unordered_map<std::string, onnx::TensorProto*> initializers_;
    std::unordered_map<std::string, ref::tensor> values_;
};

// Conv + BN + ReLU, the block most CNNs are made of (conv without bias, as torchvision).
std::string conv_bn_relu(graph_builder& g, const std::string& x, const std::string& name,
                         int64_t cin, int64_t cout, window2d k, int64_t groups = 1,
                         bn_init bn = {});

}  // namespace reefline::zoo
