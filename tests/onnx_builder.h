// Builds small ONNX models in tests with the protobuf API: inputs, outputs, nodes with
// attributes, initializers; import() runs libml's importer on the bytes.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "libml/frontend/onnx_import.h"

namespace reefline::ml::test_models {

struct builder {
    onnx::ModelProto m;
    onnx::GraphProto* g;

    explicit builder(int opset = 13) {
        m.set_ir_version(8);
        auto* o = m.add_opset_import();
        o->set_domain("");
        o->set_version(opset);
        g = m.mutable_graph();
        g->set_name("test");
    }
    static void set_type(onnx::ValueInfoProto* vi, int elem, const std::vector<int64_t>* dims) {
        auto* tt = vi->mutable_type()->mutable_tensor_type();
        tt->set_elem_type(elem);
        if (!dims) return;
        auto* sh = tt->mutable_shape();
        for (int64_t d : *dims) {
            auto* dim = sh->add_dim();
            if (d >= 0) dim->set_dim_value(d);
            else dim->set_dim_param("N");
        }
    }
    builder& input(const std::string& n, std::vector<int64_t> dims, int elem = onnx::TensorProto::FLOAT) {
        auto* vi = g->add_input();
        vi->set_name(n);
        set_type(vi, elem, &dims);
        return *this;
    }
    builder& output(const std::string& n, int elem = onnx::TensorProto::FLOAT) {
        auto* vi = g->add_output();
        vi->set_name(n);
        set_type(vi, elem, nullptr);
        return *this;
    }
    builder& output(const std::string& n, std::vector<int64_t> dims, int elem = onnx::TensorProto::FLOAT) {
        auto* vi = g->add_output();
        vi->set_name(n);
        set_type(vi, elem, &dims);
        return *this;
    }
    onnx::NodeProto* node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
                          const std::string& name = "") {
        auto* n = g->add_node();
        n->set_op_type(op);
        n->set_name(name);
        for (auto& s : in) n->add_input(s);
        for (auto& s : out) n->add_output(s);
        return n;
    }
    builder& init_f32(const std::string& n, std::vector<int64_t> dims, const std::vector<float>& v) {
        auto* t = g->add_initializer();
        t->set_name(n);
        t->set_data_type(onnx::TensorProto::FLOAT);
        for (int64_t d : dims) t->add_dims(d);
        for (float x : v) t->add_float_data(x);
        return *this;
    }
    builder& init_i64(const std::string& n, std::vector<int64_t> dims, const std::vector<int64_t>& v) {
        auto* t = g->add_initializer();
        t->set_name(n);
        t->set_data_type(onnx::TensorProto::INT64);
        for (int64_t d : dims) t->add_dims(d);
        for (int64_t x : v) t->add_int64_data(x);
        return *this;
    }
    std::string bytes() const { return m.SerializeAsString(); }
    graph import(const import_options& o = {}) const {
        std::string s = bytes();
        return import_onnx_buffer(s.data(), s.size(), o, "test-model");
    }
};

inline void attr_i(onnx::NodeProto* n, const std::string& k, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
}
inline void attr_f(onnx::NodeProto* n, const std::string& k, float v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
}
inline void attr_s(onnx::NodeProto* n, const std::string& k, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
}
inline void attr_ints(onnx::NodeProto* n, const std::string& k, std::vector<int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
}

}  // namespace reefline::ml::test_models
