#include "libml/frontend/onnx_import.h"

#include <google/protobuf/io/coded_stream.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <unordered_map>

#include "libml/frontend/passes.h"
#include "libml/regular_file.h"

static_assert(std::endian::native == std::endian::little, "tensor data is stored little-endian");

namespace reefline::ml {

namespace {

using K = model_error::kind;
using detail::fail;

const char* const onnx_type_names[] = {
    "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
    "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16", "FLOAT8E4M3FN",
    "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1", "FLOAT8E8M0",
    "UINT2", "INT2"};

dtype from_onnx_type(int t) {
    switch (t) {
    case onnx::TensorProto::FLOAT: return dtype::f32;
    case onnx::TensorProto::UINT8: return dtype::u8;
    case onnx::TensorProto::INT8: return dtype::i8;
    case onnx::TensorProto::INT32: return dtype::i32;
    case onnx::TensorProto::INT64: return dtype::i64;
    case onnx::TensorProto::BOOL: return dtype::boolean;
    case onnx::TensorProto::FLOAT16: return dtype::f16;
    case onnx::TensorProto::DOUBLE: return dtype::f64;
    default: return dtype::undefined;
    }
}

std::string onnx_type_str(int t) {
    std::string n = onnx_dtype_name(t);
    return n == "UNKNOWN" ? n + "(" + std::to_string(t) + ")" : n;
}

dtype supported_type(int t, const std::string& what) {
    dtype d = from_onnx_type(t);
    if (d == dtype::undefined)
        fail(K::unsupported_dtype, what + " has unsupported data type " + onnx_type_str(t), onnx_type_str(t));
    return d;
}

template <class Rep, class T>
void put_all(bytes_t& out, const Rep& rep) {
    out.resize(size_t(rep.size()) * sizeof(T));
    for (int i = 0; i < rep.size(); ++i) {
        T v = T(rep.Get(i));
        std::memcpy(out.data() + size_t(i) * sizeof(T), &v, sizeof(T));
    }
}

tensor convert_tensor(const onnx::TensorProto& t, const std::string& what) {
    if (t.data_location() == onnx::TensorProto::EXTERNAL || t.external_data_size() > 0)
        fail(K::external_data, what + " stores its data in an external file (external data is unsupported; "
                                      "save the model with all tensors inside the .onnx file)");
    if (t.has_segment()) fail(K::unsupported_feature, what + " is a segmented tensor");
    dtype d = supported_type(t.data_type(), what);
    shape_t s(t.dims().begin(), t.dims().end());
    detail::check_size(d, s, what);
    int64_t n = element_count(s);
    size_t es = dtype_size(d);
    bytes_t b;
    if (t.has_raw_data()) {
        const std::string& raw = t.raw_data();
        if (int64_t(raw.size()) != n * int64_t(es))
            fail(K::invalid_graph, what + " has " + std::to_string(raw.size()) + " bytes of data for " +
                                       std::to_string(n) + " " + dtype_name(d) + " elements " + shape_str(s));
        b.assign(reinterpret_cast<const std::byte*>(raw.data()), reinterpret_cast<const std::byte*>(raw.data()) + raw.size());
    } else {
        int64_t have = 0;
        switch (d) {
        case dtype::f32: have = t.float_data_size(); put_all<decltype(t.float_data()), float>(b, t.float_data()); break;
        case dtype::f64: have = t.double_data_size(); put_all<decltype(t.double_data()), double>(b, t.double_data()); break;
        case dtype::i64: have = t.int64_data_size(); put_all<decltype(t.int64_data()), int64_t>(b, t.int64_data()); break;
        case dtype::i32: have = t.int32_data_size(); put_all<decltype(t.int32_data()), int32_t>(b, t.int32_data()); break;
        case dtype::f16: have = t.int32_data_size(); put_all<decltype(t.int32_data()), uint16_t>(b, t.int32_data()); break;
        case dtype::i8: have = t.int32_data_size(); put_all<decltype(t.int32_data()), int8_t>(b, t.int32_data()); break;
        case dtype::u8:
        case dtype::boolean: have = t.int32_data_size(); put_all<decltype(t.int32_data()), uint8_t>(b, t.int32_data()); break;
        case dtype::undefined: break;
        }
        if (have != n)
            fail(K::invalid_graph, what + " has " + std::to_string(have) + " values for " + std::to_string(n) +
                                       " elements " + shape_str(s));
    }
    if (d == dtype::boolean)
        for (std::byte& x : b) x = std::byte(x != std::byte{0});
    return tensor::make(d, std::move(s), std::move(b));
}

struct importer {
    const onnx::ModelProto& m;
    const import_options& opts;
    graph g;
    std::unordered_map<std::string, int> ids;  // value name -> id

    int define(const std::string& name, value v) {
        if (ids.count(name)) fail(K::invalid_graph, "value '" + name + "' is defined more than once");
        v.name = name;
        int id = g.add_value(std::move(v));
        ids[name] = id;
        return id;
    }

    void read_opset() {
        int opset = -1;
        for (const auto& o : m.opset_import())
            if (o.domain().empty() || o.domain() == "ai.onnx") opset = int(std::clamp<int64_t>(o.version(), -1, INT_MAX));
        if (opset < 0) fail(K::unsupported_opset, "the model imports no ai.onnx opset");
        if (opset < 9 || opset > 25)
            fail(K::unsupported_opset, "opset " + std::to_string(opset) + " is unsupported (supported: 9 to 25)",
                 "opset " + std::to_string(opset));
        g.opset = opset;
    }

    graph::declared_type declared(const onnx::ValueInfoProto& vi, const std::string& what, bool required) {
        graph::declared_type d;
        if (!vi.has_type()) {
            if (required) fail(K::invalid_graph, what + " has no type");
            return d;
        }
        const auto& tp = vi.type();
        if (!tp.has_tensor_type()) {
            const char* kind = tp.has_sequence_type() ? "a sequence" : tp.has_optional_type() ? "an optional"
                               : tp.has_map_type() ? "a map" : tp.has_sparse_tensor_type() ? "a sparse tensor" : "not a tensor";
            fail(K::unsupported_dtype, what + " is " + kind + " (only dense tensors are supported)", kind);
        }
        const auto& tt = tp.tensor_type();
        if (!tt.has_elem_type()) {
            if (required) fail(K::invalid_graph, what + " has no element type");
        } else {
            d.type = supported_type(tt.elem_type(), what);
        }
        if (tt.has_shape()) {
            shape_t s;
            for (const auto& dim : tt.shape().dim()) {
                if (dim.has_dim_value()) {
                    if (dim.dim_value() < 0)
                        fail(K::limits, what + " declares a negative dim " + std::to_string(dim.dim_value()));
                    s.push_back(dim.dim_value());
                } else {
                    s.push_back(-1);
                }
            }
            if (s.size() > 64) fail(K::limits, what + " has rank " + std::to_string(s.size()));
            d.shape = s;
        }
        return d;
    }

    attribute convert_attr(const onnx::AttributeProto& a, const std::string& where) {
        auto t = a.type();
        if (t == onnx::AttributeProto::UNDEFINED) {  // old files: infer from the field set
            if (a.has_f()) t = onnx::AttributeProto::FLOAT;
            else if (a.has_i()) t = onnx::AttributeProto::INT;
            else if (a.has_s()) t = onnx::AttributeProto::STRING;
            else if (a.has_t()) t = onnx::AttributeProto::TENSOR;
            else if (a.floats_size()) t = onnx::AttributeProto::FLOATS;
            else if (a.ints_size()) t = onnx::AttributeProto::INTS;
            else if (a.has_g()) t = onnx::AttributeProto::GRAPH;
            else if (a.has_sparse_tensor()) t = onnx::AttributeProto::SPARSE_TENSOR;
        }
        switch (t) {
        case onnx::AttributeProto::FLOAT: return a.f();
        case onnx::AttributeProto::INT: return int64_t(a.i());
        case onnx::AttributeProto::STRING: return a.s();
        case onnx::AttributeProto::TENSOR: return convert_tensor(a.t(), where + " attribute '" + a.name() + "'");
        case onnx::AttributeProto::FLOATS: return floats(a.floats().begin(), a.floats().end());
        case onnx::AttributeProto::INTS:
            if (a.ints_size() > 4096) fail(K::limits, where + " attribute '" + a.name() + "' is too long");
            return ints(a.ints().begin(), a.ints().end());
        case onnx::AttributeProto::SPARSE_TENSOR:
            fail(K::unsupported_feature, where + " attribute '" + a.name() + "' is a sparse tensor");
        default:
            fail(K::unsupported_feature, where + " attribute '" + a.name() + "' has an unsupported attribute type " +
                                             std::to_string(int(t)));
        }
    }

    // Cycle / order diagnostics for a node input that is not yet defined.
    [[noreturn]] void undefined_input(int ni, const std::string& input) {
        const auto& nodes = m.graph().node();
        std::unordered_map<std::string, int> producer;
        for (int i = 0; i < nodes.size(); ++i)
            for (const auto& o : nodes[i].output())
                if (!o.empty()) producer.emplace(o, i);
        auto label = [&](int i) {
            const auto& n = nodes[i];
            return n.op_type() + " (node '" + (n.name().empty() ? n.op_type() + "#" + std::to_string(i) : n.name()) + "')";
        };
        if (!producer.count(input))
            fail(K::invalid_graph, label(ni) + " reads undefined value '" + input + "'");
        // Look for a cycle (DFS over "node -> producers of its inputs").
        std::vector<int> state(size_t(nodes.size()), 0), stack;
        std::function<bool(int)> dfs = [&](int i) -> bool {
            state[size_t(i)] = 1;
            stack.push_back(i);
            for (const auto& in : nodes[i].input()) {
                auto it = producer.find(in);
                if (it == producer.end()) continue;
                int p = it->second;
                if (state[size_t(p)] == 1) {
                    stack.push_back(p);
                    return true;
                }
                if (state[size_t(p)] == 0 && dfs(p)) return true;
            }
            stack.pop_back();
            state[size_t(i)] = 2;
            return false;
        };
        for (int i = 0; i < nodes.size(); ++i) {
            if (state[size_t(i)] || !dfs(i)) continue;
            int start = stack.back();
            auto it = std::find(stack.begin(), stack.end(), start);
            std::string path;
            for (; it != stack.end(); ++it) path += (path.empty() ? "" : " <- ") + label(*it);
            fail(K::invalid_graph, "the graph has a cycle: " + path);
        }
        fail(K::invalid_graph, "the graph is not topologically sorted: " + label(ni) + " reads '" + input +
                                   "' before " + label(producer[input]) + " produces it");
    }

    void build() {
        const onnx::GraphProto& gp = m.graph();
        g.name = gp.name();
        if (gp.sparse_initializer_size() > 0)
            fail(K::unsupported_feature, "sparse initializers are unsupported");
        for (const auto& t : gp.initializer()) {
            if (t.name().empty()) fail(K::invalid_graph, "an initializer has no name");
            value v;
            v.set_constant(convert_tensor(t, "initializer '" + t.name() + "'"));
            define(t.name(), std::move(v));
        }
        std::vector<int> batch_candidates;
        bool symbolic_batch = false;
        for (const auto& vi : gp.input()) {
            if (ids.count(vi.name())) continue;  // an initializer listed as input (IR < 4): a constant
            if (vi.name().empty()) fail(K::invalid_graph, "a graph input has no name");
            std::string what = "graph input '" + vi.name() + "'";
            auto d = declared(vi, what, true);
            g.declared[vi.name()] = d;
            value v;
            v.type = d.type;
            if (auto it = opts.constant_inputs.find(vi.name()); it != opts.constant_inputs.end()) {
                const tensor& t = it->second;
                if (t.type != d.type)
                    fail(K::shape, what + " is " + dtype_name(d.type) + " but is bound to a " + dtype_name(t.type) + " constant");
                bool ok = !d.shape || d.shape->size() == t.shape.size();
                for (size_t i = 0; ok && d.shape && i < t.shape.size(); ++i)
                    if ((*d.shape)[i] >= 0 && (*d.shape)[i] != t.shape[i]) ok = false;
                if (!ok || !t.data || int64_t(t.data->size()) != t.elements() * int64_t(dtype_size(t.type)))
                    fail(K::shape, what + " declared " + shape_str(d.shape.value_or(shape_t{})) +
                                       " is bound to a constant of shape " + shape_str(t.shape));
                v.set_constant(t);
                define(vi.name(), std::move(v));
                continue;
            }
            if (d.shape) {
                v.shape = *d.shape;
            } else if (auto it = opts.input_shapes.find(vi.name()); it != opts.input_shapes.end()) {
                v.shape = it->second;
            } else {
                fail(K::dynamic, what + " declares no shape; give it with import_options::input_shapes", vi.name());
            }
            int id = define(vi.name(), std::move(v));
            g.inputs.push_back(id);
            const shape_t& s = g.values[size_t(id)].shape;
            if (!s.empty() && s[0] < 0) {
                g.values[size_t(id)].batched = true;
                symbolic_batch = true;
            } else if (s.size() >= 2 && s[0] == 1) {
                batch_candidates.push_back(id);
            }
        }
        if (!symbolic_batch)
            for (int id : batch_candidates) g.values[size_t(id)].batched = true;
        for (const auto& vi : gp.value_info())
            if (vi.has_type() && vi.type().has_tensor_type())
                g.declared[vi.name()] = declared(vi, "value '" + vi.name() + "'", false);

        // Nodes: check support first so that the error names every unsupported operator.
        std::vector<std::string> unsupported;
        std::string unsupported_op;
        const auto& nodes = gp.node();
        for (int i = 0; i < nodes.size(); ++i) {
            const auto& np = nodes[i];
            std::string nm = np.name().empty() ? np.op_type() + "#" + std::to_string(i) : np.name();
            bool onnx_domain = np.domain().empty() || np.domain() == "ai.onnx";
            auto op = onnx_domain ? op_from_name(np.op_type()) : std::nullopt;
            if (!op) {
                unsupported.push_back((onnx_domain ? "" : np.domain() + ".") + np.op_type() + " (node '" + nm + "')");
                if (unsupported_op.empty()) unsupported_op = (onnx_domain ? "" : np.domain() + ".") + np.op_type();
            } else if (g.opset < op_since_opset(*op)) {
                if (unsupported_op.empty()) unsupported_op = np.op_type();
                unsupported.push_back(np.op_type() + " (node '" + nm + "'; needs opset " +
                                      std::to_string(op_since_opset(*op)) + ", the model has " + std::to_string(g.opset) + ")");
            }
        }
        if (!unsupported.empty()) {
            std::string msg = "unsupported operator " + unsupported[0];
            if (unsupported.size() > 1) {
                msg += " and " + std::to_string(unsupported.size() - 1) + " more:";
                for (size_t k = 1; k < unsupported.size() && k < 6; ++k) msg += " " + unsupported[k];
                if (unsupported.size() > 6) msg += " ...";
            }
            fail(K::unsupported_operator, msg, unsupported_op);
        }

        for (int i = 0; i < nodes.size(); ++i) {
            const auto& np = nodes[i];
            node n;
            n.op = *op_from_name(np.op_type());
            n.name = np.name().empty() ? np.op_type() + "#" + std::to_string(i) : np.name();
            n.opset = g.opset;
            std::string where = n.label();
            for (const auto& a : np.attribute()) {
                if (a.name().empty()) fail(K::invalid_graph, where + ": an attribute has no name");
                if (!a.ref_attr_name().empty())
                    fail(K::unsupported_feature, where + ": attribute references (functions) are unsupported");
                n.attrs[a.name()] = convert_attr(a, where);
            }
            for (const auto& in : np.input()) {
                if (in.empty()) {
                    n.inputs.push_back(-1);
                    continue;
                }
                auto it = ids.find(in);
                if (it == ids.end()) undefined_input(i, in);
                n.inputs.push_back(it->second);
            }
            while (!n.inputs.empty() && n.inputs.back() < 0) n.inputs.pop_back();
            if (int(n.inputs.size()) > detail::onnx_max_inputs(n.op))
                fail(K::invalid_graph, where + " has " + std::to_string(n.inputs.size()) + " inputs (at most " +
                                           std::to_string(detail::onnx_max_inputs(n.op)) + ")");
            if (n.op == op_type::Constant) {
                constant_node(n, np);
                continue;
            }
            normalize(n);
            int index = int(g.nodes.size());
            for (const auto& out : np.output()) {
                if (out.empty()) {
                    n.outputs.push_back(-1);
                    continue;
                }
                value v;
                v.producer = index;
                n.outputs.push_back(define(out, std::move(v)));
            }
            if (n.outputs.empty() || n.outputs[0] < 0) fail(K::invalid_graph, where + " has no output");
            g.nodes.push_back(std::move(n));
        }
        for (const auto& vi : gp.output()) {
            auto it = ids.find(vi.name());
            if (it == ids.end()) fail(K::invalid_graph, "graph output '" + vi.name() + "' is never produced");
            g.declared[vi.name()] = declared(vi, "graph output '" + vi.name() + "'", false);
            g.outputs.push_back(it->second);
        }
        if (g.outputs.empty()) fail(K::invalid_graph, "the graph has no outputs");
        // Optional outputs nobody reads become omitted (-1), so that later checks only see
        // the outputs that matter (e.g. BatchNormalization's training statistics).
        std::vector<int> uses(g.values.size(), 0);
        for (const node& n : g.nodes)
            for (int v : n.inputs)
                if (v >= 0) ++uses[size_t(v)];
        for (int v : g.outputs) ++uses[size_t(v)];
        for (node& n : g.nodes) {
            bool optional_outs = n.op == op_type::LayerNormalization || n.op == op_type::Dropout ||
                                 n.op == op_type::MaxPool || n.op == op_type::BatchNormalization;
            for (size_t k = 1; optional_outs && k < n.outputs.size(); ++k)
                if (n.outputs[k] >= 0 && uses[size_t(n.outputs[k])] == 0) n.outputs[k] = -1;
            while (n.outputs.size() > 1 && n.outputs.back() < 0) n.outputs.pop_back();
        }
    }

    void constant_node(const node& n, const onnx::NodeProto& np) {
        if (np.output_size() != 1 || np.output(0).empty()) fail(K::invalid_graph, n.label() + " needs one output");
        if (n.attrs.size() != 1) fail(K::invalid_graph, n.label() + " needs exactly one value attribute");
        const auto& [key, a] = *n.attrs.begin();
        tensor t;
        if (key == "value") {
            if (!std::holds_alternative<tensor>(a)) fail(K::invalid_graph, n.label() + ": 'value' is not a tensor");
            t = std::get<tensor>(a);
        } else if (key == "value_float") {
            t = tensor::from_f64({double(n.f(key, 0))}, {}, dtype::f32);
        } else if (key == "value_floats") {
            floats f = n.fs(key);
            t = tensor::from_f64(std::vector<double>(f.begin(), f.end()), {int64_t(f.size())}, dtype::f32);
        } else if (key == "value_int") {
            t = tensor::from_i64({n.i(key, 0)}, {}, dtype::i64);
        } else if (key == "value_ints") {
            ints v = n.is(key);
            t = tensor::from_i64(v, {int64_t(v.size())}, dtype::i64);
        } else if (key == "value_string" || key == "value_strings") {
            fail(K::unsupported_dtype, n.label() + " has unsupported data type STRING", "STRING");
        } else {
            fail(K::unsupported_feature, n.label() + ": attribute '" + key + "' is unsupported");
        }
        value v;
        v.set_constant(t);
        define(np.output(0), std::move(v));
    }

    // Opset differences that attributes carry; input-borne parameters are moved into
    // attributes by detail::canonicalize_params once they are constant.
    void normalize(node& n) {
        switch (n.op) {
        case op_type::Softmax:
        case op_type::LogSoftmax:
            if (n.opset < 13) {
                n.set("axis", n.i("axis", 1));
                n.set("coerce_2d", int64_t(1));
            } else {
                n.set("axis", n.i("axis", -1));
                n.set("coerce_2d", int64_t(0));
            }
            break;
        case op_type::Cast: {
            int64_t to = n.i("to", 0);
            dtype d = from_onnx_type(int(std::clamp<int64_t>(to, 0, 1000)));
            if (d == dtype::undefined)
                fail(K::unsupported_dtype, n.label() + ": cast to unsupported data type " + onnx_type_str(int(to)),
                     onnx_type_str(int(to)));
            n.set("to", int64_t(d));
            n.erase("saturate");
            n.erase("round_mode");
            break;
        }
        case op_type::ConstantOfShape:
            if (const tensor* t = n.t("value"); t && t->elements() != 1)
                fail(K::invalid_graph, n.label() + ": 'value' must have one element");
            break;
        case op_type::Dropout:
            n.erase("ratio");
            n.erase("seed");
            n.erase("is_test");
            break;
        case op_type::BatchNormalization:
            if (n.i("training_mode", 0) != 0)
                fail(K::unsupported_feature, n.label() + ": training_mode is unsupported (inference only)",
                     "BatchNormalization training_mode");
            break;
        case op_type::Pad:
            if (n.opset < 11 && n.has("paddings")) {
                n.set("pads", n.is("paddings"));
                n.erase("paddings");
            }
            break;
        default:
            break;
        }
    }
};

graph import_model(const onnx::ModelProto& m, const import_options& opts) {
    if (!m.has_graph()) fail(K::parse, "not an ONNX model: no graph");
    if (m.ir_version() <= 0) fail(K::parse, "not an ONNX model: no ir_version");
    importer im{m, opts, {}, {}};
    im.read_opset();
    im.build();
    for (const auto& [name, t] : opts.constant_inputs)
        if (!im.ids.count(name)) fail(K::invalid_graph, "import_options binds '" + name + "', which is not a graph input");
    for (const auto& kv : opts.input_shapes) {
        const std::string& name = kv.first;
        if (std::none_of(im.g.inputs.begin(), im.g.inputs.end(), [&](int v) { return im.g.values[size_t(v)].name == name; }))
            fail(K::invalid_graph, "import_options gives a shape for '" + name + "', which is not a graph input");
    }

    detail::fold_limits limits{opts.max_fold_bytes, opts.max_total_fold_bytes};
    graph generic = std::move(im.g);
    detail::fold_generic(generic, limits);

    std::map<int, shape_t> shapes;
    for (int in : generic.inputs) {
        const value& v = generic.values[size_t(in)];
        shape_t s = v.shape;
        if (auto it = opts.input_shapes.find(v.name); it != opts.input_shapes.end()) {
            s = it->second;
        } else if (v.batched && !s.empty() && s[0] < 0) {
            s[0] = 1;
        }
        for (int64_t& d : s)
            if (d < 0 && opts.unbound_dim > 0) d = opts.unbound_dim;
        shapes[in] = s;
    }
    std::vector<int> fixups;
    graph g = detail::specialize_graph(generic, shapes, limits, &fixups);
    for (int i : fixups) {
        node& n = generic.nodes[size_t(i)];
        ints s = n.is("shape");
        s[0] = 0;
        n.set("shape", s);
    }
    g.set_generic(std::make_shared<const graph>(std::move(generic)));
    // The first specialization ran at the declared batch (so that Reshape targets that
    // spell out the batch could be made batch-agnostic); now the requested one.
    if (opts.batch > 0 && opts.batch != g.batch) g.set_batch(opts.batch);
    return g;
}

}  // namespace

const char* onnx_dtype_name(int t) {
    if (t >= 0 && size_t(t) < std::size(onnx_type_names)) return onnx_type_names[t];
    return "UNKNOWN";
}

graph import_onnx_buffer(const void* data, size_t size, const import_options& opts, const std::string& label) {
    try {
        if (size == 0) fail(K::parse, "not an ONNX model: the file is empty");
        if (size > size_t(INT_MAX)) fail(K::io, "the model is larger than 2 GiB (the protobuf limit)");
        onnx::ModelProto m;
        google::protobuf::io::CodedInputStream cis(static_cast<const uint8_t*>(data), int(size));
        cis.SetTotalBytesLimit(INT_MAX);
        if (!m.ParseFromCodedStream(&cis) || !cis.ConsumedEntireMessage())
            fail(K::parse, "not an ONNX model: protobuf parse failed (truncated or corrupt file?)");
        return import_model(m, opts);
    } catch (const model_error& e) {
        throw model_error(e.code(), label + ": " + e.what(), e.subject());
    } catch (const std::bad_alloc&) {
        throw model_error(K::limits, label + ": out of memory while importing");
    } catch (const std::exception& e) {  // never let a malformed model escape as another type
        throw model_error(K::invalid_graph, label + ": " + e.what());
    }
}

graph import_onnx(const std::string& path, const import_options& opts) {
    std::string buf;
    try {
        // Not a regular file (a FIFO would block), or past protobuf's 2 GiB: refused unread.
        buf = read_regular_file(path, INT_MAX);
    } catch (const file_too_large&) {
        throw model_error(K::io, path + ": the model is larger than 2 GiB (the protobuf limit)");
    } catch (const file_refused& e) {
        throw model_error(K::io, e.what());
    }
    return import_onnx_buffer(buf.data(), buf.size(), opts, path);
}

tensor parse_tensor(const void* data, size_t size, std::string* name) {
    if (size > size_t(INT_MAX)) fail(K::io, "tensor file larger than 2 GiB");
    onnx::TensorProto t;
    if (!t.ParseFromArray(data, int(size))) fail(K::parse, "not a serialized onnx.TensorProto");
    if (name) *name = t.name();
    return convert_tensor(t, "tensor '" + t.name() + "'");
}

tensor read_tensor_file(const std::string& path, std::string* name) {
    std::string buf;
    try {
        buf = read_regular_file(path, INT_MAX);
    } catch (const file_refused& e) {
        throw model_error(K::io, e.what());
    }
    try {
        return parse_tensor(buf.data(), buf.size(), name);
    } catch (const model_error& e) {
        throw model_error(e.code(), path + ": " + e.what(), e.subject());
    }
}

}  // namespace reefline::ml
