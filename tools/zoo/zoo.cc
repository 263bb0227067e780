#include "tools/zoo/zoo.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

namespace reefline::zoo {

const std::vector<zoo_entry>& registry() {
    static const std::vector<zoo_entry> r{
        {"vgg19", build_vgg19, "VGG-19: 16 conv3x3 + 3 fully connected, 224x224, 1000 classes",
         "VGG-19 tiny: 16 conv3x3 (widths / 8) + 3 fully connected (256), 32x32, 10 classes"},
        {"resnet152", build_resnet152,
         "ResNet-152 v1.5: bottleneck blocks [3, 8, 36, 3], 224x224, 1000 classes",
         "ResNet-152 tiny: bottleneck blocks [3, 8, 36, 3], widths / 8, 64x64, 10 classes"},
        {"densenet201", build_densenet201,
         "DenseNet-201: dense blocks [6, 12, 48, 32], growth 32, 224x224, 1000 classes",
         "DenseNet-201 tiny: dense blocks [6, 12, 48, 32], growth 4, 64x64, 10 classes"},
        {"inception_v3", build_inception_v3,
         "Inception-v3: modules A/B/C/D/E, 299x299, 1000 classes (no auxiliary classifier)",
         "Inception-v3 tiny: modules A/B/C/D/E, widths / 8, 139x139, 10 classes"},
        {"distilbert", build_distilbert,
         "DistilBERT sequence classifier: 6 layers, hidden 768, 12 heads, FFN 3072, vocabulary "
         "30522, sequence L <= 512 with attention mask, 8 labels",
         "DistilBERT sequence classifier tiny: 6 layers, hidden 64, 4 heads, FFN 256, vocabulary "
         "1024, sequence L <= 64 with attention mask, 8 labels"},
        {"bert", build_bert,
         "BERT-base sequence classifier: 12 layers, hidden 768, 12 heads, FFN 3072, vocabulary "
         "30522, sequence L <= 512 with attention mask and token types, pooler, 8 labels",
         "BERT sequence classifier tiny: 12 layers, hidden 64, 4 heads, FFN 256, vocabulary 1024, "
         "sequence L <= 64 with attention mask and token types, pooler, 8 labels"},
        {"resnet50", build_resnet50,
         "ResNet-50 v1.5: bottleneck blocks [3, 4, 6, 3], 224x224, 1000 classes",
         "ResNet-50 tiny: bottleneck blocks [3, 4, 6, 3], widths / 8, 64x64, 10 classes"},
        {"alexnet", build_alexnet, "AlexNet (torchvision widths) with LRN, 224x224, 1000 classes",
         "AlexNet tiny: widths / 8, fully connected 256, with LRN, 64x64, 10 classes"},
        {"mobilenet_v2", build_mobilenet_v2,
         "MobileNet-v2: inverted residuals, depthwise convs, ReLU6 as Clip, 224x224, 1000 classes",
         "MobileNet-v2 tiny: widths / 4 (last conv 320), 64x64, 10 classes"},
        {"densenet121", build_densenet121,
         "DenseNet-121: dense blocks [6, 12, 24, 16], growth 32, 224x224, 1000 classes",
         "DenseNet-121 tiny: dense blocks [6, 12, 24, 16], growth 4, 64x64, 10 classes"},
        {"sensor_tcn", build_sensor_tcn,
         "Sensor TCN: 6 residual blocks of dilated causal 1-D convs (64 channels, dilations 1 .. "
         "32), windows of 256 steps x 12 features, 8 classes",
         "Sensor TCN tiny: 4 residual blocks of dilated causal 1-D convs (16 channels, dilations "
         "1 .. 8), windows of 64 steps x 6 features, 8 classes"},
    };
    return r;
}

const zoo_entry* find(const std::string& name) {
    for (const zoo_entry& e : registry())
        if (name == e.name) return &e;
    return nullptr;
}

std::string image_input(graph_builder& g, model_meta& m, int64_t size) {
    const std::vector<shape_dim> shape{shape_dim{"N"}, shape_dim{3}, shape_dim{size},
                                       shape_dim{size}};
    const std::string x = g.input("input", onnx::TensorProto::FLOAT, shape);
    m.inputs.push_back({x, onnx::TensorProto::FLOAT, shape});
    m.mean = {0.485f, 0.456f, 0.406f};  // ImageNet, as torchvision's models expect
    m.std = {0.229f, 0.224f, 0.225f};
    return x;
}

void image_output(graph_builder& g, model_meta& m, const std::string& logits, int64_t classes) {
    const std::string out = g.rename(logits, "logits");
    const std::vector<shape_dim> shape{shape_dim{"N"}, shape_dim{classes}};
    g.output(out, onnx::TensorProto::FLOAT, shape);
    m.outputs.push_back({out, onnx::TensorProto::FLOAT, shape});
}

std::string sequence_input(graph_builder& g, model_meta& m, const std::string& name,
                           int64_t range_hi) {
    const std::vector<shape_dim> shape{shape_dim{"N"}, shape_dim{"L"}};
    const std::string x = g.input(name, onnx::TensorProto::INT64, shape);
    io_desc d{x, onnx::TensorProto::INT64, shape};
    d.range_hi = range_hi;
    m.inputs.push_back(d);
    return x;
}

std::string position_embeddings(graph_builder& g, const std::string& ids, const std::string& table,
                                int64_t max_pos) {
    std::vector<int64_t> pos(static_cast<size_t>(max_pos));
    for (int64_t i = 0; i < max_pos; ++i) pos[static_cast<size_t>(i)] = i;
    const std::string all = g.const_i64("embeddings.position_ids", {1, max_pos}, pos);
    // L as a 1-element tensor: Shape -> Gather(scalar 1) -> Unsqueeze, as torch traces
    // input_ids.size(1) used as a slice bound.
    std::string len = g.op("Shape", {ids}, "embeddings.shape");
    len = g.op("Gather", {len, g.const_i64("const.index_1", {}, {1})}, "embeddings.seq_len",
               {attr("axis", int64_t{0})});
    len = g.op("Unsqueeze", {len, g.const_i64("const.axes_0", {1}, {0})},
               "embeddings.seq_len.unsqueeze");
    const std::string ids_l =
        g.op("Slice",
             {all, g.const_i64("const.starts_0", {1}, {0}), len,
              g.const_i64("const.axes_1", {1}, {1})},
             "embeddings.position_ids.slice");  // [1, L]
    return g.op("Gather", {table, ids_l}, "embeddings.position", {attr("axis", int64_t{0})});
}

std::string gelu(graph_builder& g, const std::string& x, const std::string& name) {
    const std::string sqrt2 = g.scalar("const.sqrt2", std::sqrt(2.0f));
    std::string e = g.op("Erf", {g.op("Div", {x, sqrt2}, name + ".div")}, name + ".erf");
    e = g.op("Add", {e, g.scalar("const.one", 1.0f)}, name + ".add");
    return g.op("Mul", {g.op("Mul", {x, e}, name + ".mul"), g.scalar("const.half", 0.5f)}, name);
}

std::string file_stem(const std::string& name, bool tiny) { return tiny ? name + "_tiny" : name; }

namespace {

std::string dtype_name(int32_t t) {
    switch (t) {
    case onnx::TensorProto::FLOAT: return "float32";
    case onnx::TensorProto::INT64: return "int64";
    case onnx::TensorProto::INT32: return "int32";
    default: return "unknown";
    }
}

std::string quote(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o + "\"";
}

std::string num(float f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(f));
    return buf;
}

std::string io_json(const std::vector<io_desc>& v) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < v.size(); ++i) {
        o << (i ? ", " : "") << "{\"name\": " << quote(v[i].name)
          << ", \"dtype\": " << quote(dtype_name(v[i].dtype)) << ", \"shape\": [";
        for (size_t d = 0; d < v[i].shape.size(); ++d) {
            o << (d ? ", " : "");
            if (const int64_t* n = std::get_if<int64_t>(&v[i].shape[d]))
                o << *n;
            else
                o << quote(std::get<std::string>(v[i].shape[d]));
        }
        o << "]";
        if (v[i].range_hi > 0)
            o << ", \"range\": [" << v[i].range_lo << ", " << v[i].range_hi << "]";
        o << "}";
    }
    o << "]";
    return o.str();
}

std::string meta_json(const model_meta& m, const std::string& stem, const variant_options& v,
                      uint64_t seed, const graph_builder& g) {
    std::map<std::string, int> ops;
    for (const auto& n : g.model().graph().node()) ++ops[n.op_type()];
    std::ostringstream o;
    o << "{\n";
    o << "  \"name\": " << quote(stem) << ",\n";
    o << "  \"arch\": " << quote(m.arch) << ",\n";
    o << "  \"tiny\": " << (v.tiny ? "true" : "false") << ",\n";
    o << "  \"file\": " << quote(stem + ".onnx") << ",\n";
    o << "  \"description\": " << quote(m.description) << ",\n";
    o << "  \"seed\": " << seed << ",\n";
    o << "  \"opset\": " << v.opset << ",\n";
    o << "  \"params\": " << g.param_count() << ",\n";
    o << "  \"bn_running_stats\": " << g.buffer_count() << ",\n";
    o << "  \"nodes\": " << g.model().graph().node_size() << ",\n";
    o << "  \"op_types\": {";
    bool first = true;
    for (const auto& [op, count] : ops) {
        o << (first ? "" : ", ") << quote(op) << ": " << count;
        first = false;
    }
    o << "},\n";
    o << "  \"inputs\": " << io_json(m.inputs) << ",\n";
    o << "  \"outputs\": " << io_json(m.outputs) << ",\n";
    if (m.max_sequence_length > 0)
        o << "  \"max_sequence_length\": " << m.max_sequence_length << ",\n";
    if (m.mean.empty()) {
        o << "  \"normalization\": null\n";
    } else {
        o << "  \"normalization\": {\"layout\": \"NCHW\", \"pixel_scale\": " << num(1.0f / 255.0f)
          << ", \"mean\": [";
        for (size_t i = 0; i < m.mean.size(); ++i) o << (i ? ", " : "") << num(m.mean[i]);
        o << "], \"std\": [";
        for (size_t i = 0; i < m.std.size(); ++i) o << (i ? ", " : "") << num(m.std[i]);
        o << "], \"formula\": \"(pixel * pixel_scale - mean[c]) / std[c]\"}\n";
    }
    o << "}\n";
    return o.str();
}

// Writes to path + ".tmp" and renames, so that a reader never sees a half-written file.
void write_atomically(const std::filesystem::path& path,
                      const std::function<bool(std::ostream&)>& write) {
    const std::filesystem::path tmp = path.string() + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw std::runtime_error("cannot open " + tmp.string());
        if (!write(out)) throw std::runtime_error("cannot serialize " + path.string());
        out.close();
        if (!out) throw std::runtime_error("cannot write " + tmp.string());
    }
    std::filesystem::rename(tmp, path);
}

void write_tensor(const std::filesystem::path& path, const std::string& name,
                  const ref::tensor& t) {
    onnx::TensorProto p;
    p.set_name(name);
    p.set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : t.shape) p.add_dims(d);
    p.set_raw_data(t.data.data(), t.data.size() * sizeof(float));
    write_atomically(path, [&](std::ostream& out) { return p.SerializeToOstream(&out); });
}

}  // namespace

write_result write_model(const zoo_entry& e, const std::string& dir, const variant_options& v,
                         uint64_t seed) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const std::string stem = file_stem(e.name, v.tiny);
    // Calibration batch: 8 small images for a tiny model (its last grids are 1x1 or 2x2, so a
    // batch norm's statistics need several images), 1 image at full size.
    graph_builder g(stem, seed, v.opset, v.calibrate ? (v.tiny ? 32 : 1) : 0);
    model_meta m;
    m.arch = e.name;
    m.description = v.tiny ? e.tiny_description : e.description;
    e.build(g, v, m);
    auto& model = g.model();
    model.set_doc_string(m.description + "; reefline zoo, seed " + std::to_string(seed) +
                         ", deterministic Kaiming-scaled weights, not trained");
    const auto add_meta = [&](const std::string& k, const std::string& val) {
        auto* p = model.add_metadata_props();
        p->set_key(k);
        p->set_value(val);
    };
    add_meta("zoo.arch", e.name);
    add_meta("zoo.tiny", v.tiny ? "1" : "0");
    add_meta("zoo.seed", std::to_string(seed));

    write_result r;
    r.params = g.param_count();
    r.nodes = model.graph().node_size();
    const auto t1 = clock::now();
    const size_t bytes = model.ByteSizeLong();
    if (bytes > static_cast<size_t>(std::numeric_limits<int>::max()))
        throw std::runtime_error(stem + ": " + std::to_string(bytes) +
                                 " bytes is over protobuf's 2 GiB limit");
    const std::filesystem::path base = std::filesystem::path(dir) / stem;
    write_atomically(base.string() + ".onnx",
                     [&](std::ostream& out) { return model.SerializeToOstream(&out); });
    const std::string json = meta_json(m, stem, v, seed, g);
    write_atomically(base.string() + ".json", [&](std::ostream& out) {
        out << json;
        return static_cast<bool>(out);
    });
    if (v.write_calibration) {
        const ref::tensor* in = g.value(m.inputs.at(0).name);
        const ref::tensor* out = g.value(m.outputs.at(0).name);
        if (in && out) {
            write_tensor(base.string() + ".calib_input.pb", m.inputs[0].name, *in);
            write_tensor(base.string() + ".calib_output.pb", m.outputs[0].name, *out);
        }
    }
    r.onnx_bytes = bytes;
    r.build_s = std::chrono::duration<double>(t1 - t0).count();
    r.write_s = std::chrono::duration<double>(clock::now() - t1).count();
    return r;
}

}  // namespace reefline::zoo
