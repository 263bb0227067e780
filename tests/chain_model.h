// A small ONNX image model for tests and fuzzers: one f32 input "x" of any shape, then a chain
// of single-input operators (the last one's output is "y"). Without weights, a chain such as
// Relu, GlobalAveragePool, Flatten is a file of a few hundred bytes whose arenas grow with
// the input's shape and the batch size.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace reefline::testing {

inline std::string chain_model(const std::vector<int64_t>& input_shape, std::initializer_list<const char*> ops) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    auto* opset = m.add_opset_import();
    opset->set_domain("");
    opset->set_version(13);
    auto* g = m.mutable_graph();
    g->set_name("chain");
    auto* in = g->add_input();
    in->set_name("x");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    for (const int64_t d : input_shape) in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
    auto* out = g->add_output();
    out->set_name("y");
    out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    std::string from = "x";
    size_t i = 0;
    for (const char* op : ops) {
        auto* n = g->add_node();
        n->set_op_type(op);
        n->add_input(from);
        from = ++i == ops.size() ? "y" : "v" + std::to_string(i);
        n->add_output(from);
    }
    return m.SerializeAsString();
}

}  // namespace reefline::testing
