// The model zoo: ONNX files of well-known architectures with deterministic weights, written by
// build/tools/zoo. Each architecture has a full-size variant (the paper's / torchvision's
// shapes) and a tiny one (same topology and op kinds, small widths and inputs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/zoo/builder.h"

namespace reefline::zoo {

struct io_desc {
    std::string name;
    int32_t dtype;  // onnx::TensorProto::DataType
    std::vector<shape_dim> shape;
    // Integer inputs: valid values are [range_lo, range_hi) (token ids [0, vocab), an attention
    // mask or token type ids [0, 2)); range_hi 0 says nothing.
    int64_t range_lo = 0, range_hi = 0;
};

// What the .json beside each .onnx says about the model.
struct model_meta {
    std::string arch;         // registry name, e.g. "resnet50"
    std::string description;  // one line
    std::vector<io_desc> inputs, outputs;
    // Images: NCHW float, pixel values scaled to [0, 1] then (x - mean[c]) / std[c].
    std::vector<float> mean, std;
    // Sequence models (symbolic length "L"): the longest L the model takes, the size of its
    // position embedding table; past it the word and position embeddings cannot broadcast, so
    // the run fails (and shape inference, where it folds Shape -> Slice for a fixed L). 0: none.
    int64_t max_sequence_length = 0;
};

struct variant_options {
    bool tiny = false;
    int64_t opset = 17;
    bool calibrate = true;  // see graph_builder: LSUV scales and BN statistics from a batch
    // Also write the calibration batch and the builder's own output for it (ref:: kernels) as
    // DIR/<stem>.calib_input.pb and .calib_output.pb (ONNX TensorProto): an expected output
    // computed independently of any runtime.
    bool write_calibration = false;
};

// The classifiers' last Gemm is scaled to logits of this root-mean-square on the calibration
// batch: softmax over 1000 classes is then neither flat nor one-hot.
constexpr double kLogitRms = 2.0;

using build_fn = void (*)(graph_builder&, const variant_options&, model_meta&);

struct zoo_entry {
    const char* name;
    build_fn build;
    const char* description;       // full size
    const char* tiny_description;  // what the tiny variant changes
};

const std::vector<zoo_entry>& registry();
const zoo_entry* find(const std::string& name);

// Architectures (one file per family).
void build_vgg19(graph_builder&, const variant_options&, model_meta&);
void build_alexnet(graph_builder&, const variant_options&, model_meta&);
void build_resnet50(graph_builder&, const variant_options&, model_meta&);
void build_resnet152(graph_builder&, const variant_options&, model_meta&);
void build_mobilenet_v2(graph_builder&, const variant_options&, model_meta&);
void build_densenet121(graph_builder&, const variant_options&, model_meta&);
void build_densenet201(graph_builder&, const variant_options&, model_meta&);
void build_inception_v3(graph_builder&, const variant_options&, model_meta&);
void build_distilbert(graph_builder&, const variant_options&, model_meta&);
void build_bert(graph_builder&, const variant_options&, model_meta&);
void build_sensor_tcn(graph_builder&, const variant_options&, model_meta&);

// Declares the image classifier's graph input "input" [N, 3, size, size] (float, ImageNet
// normalisation) and returns its name; image_output declares "logits" [N, classes] (any
// classifier's output, not only an image model's).
std::string image_input(graph_builder& g, model_meta& m, int64_t size);
void image_output(graph_builder& g, model_meta& m, const std::string& logits, int64_t classes);

// ---- sequence classifiers (distilbert.cc, bert.cc), exported as torch.onnx exports
// HuggingFace's models ----
// Declares the int64 graph input NAME [N, "L"] with values in [0, range_hi) and returns it.
std::string sequence_input(graph_builder& g, model_meta& m, const std::string& name,
                           int64_t range_hi);
// HF's position embeddings for input_ids [N, L]: the constant buffer embeddings.position_ids
// [1, max_pos] (0 .. max_pos - 1) sliced to [1, L] with L = Shape(ids)[1], then gathered from
// table [max_pos, hidden]: [1, L, hidden]. L > max_pos cannot broadcast against the word
// embeddings [N, L, hidden], so the model itself refuses lengths past its table.
std::string position_embeddings(graph_builder& g, const std::string& ids, const std::string& table,
                                int64_t max_pos);
// GELU in its exact Erf form x * 0.5 * (1 + erf(x / sqrt 2)), as torch.onnx exports nn.GELU()
// (opset 17 has no Gelu op).
std::string gelu(graph_builder& g, const std::string& x, const std::string& name);

// File stem of a variant: "resnet50" or "resnet50_tiny".
std::string file_stem(const std::string& name, bool tiny);

struct write_result {
    int64_t params = 0;
    uint64_t onnx_bytes = 0;
    int64_t nodes = 0;
    double build_s = 0, write_s = 0;
};

// Builds one model and writes DIR/<stem>.onnx and DIR/<stem>.json. Throws on error.
write_result write_model(const zoo_entry& e, const std::string& dir, const variant_options& v,
                         uint64_t seed);

}  // namespace reefline::zoo
