#include "libml/frontend/graph.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#include "libml/frontend/passes.h"

namespace reefline::ml {

const char* to_string(model_error::kind k) {
    switch (k) {
    case model_error::kind::io: return "io";
    case model_error::kind::parse: return "parse";
    case model_error::kind::unsupported_opset: return "unsupported opset";
    case model_error::kind::unsupported_operator: return "unsupported operator";
    case model_error::kind::unsupported_dtype: return "unsupported data type";
    case model_error::kind::unsupported_feature: return "unsupported feature";
    case model_error::kind::external_data: return "external data";
    case model_error::kind::invalid_graph: return "invalid graph";
    case model_error::kind::shape: return "shape";
    case model_error::kind::limits: return "limits";
    case model_error::kind::dynamic: return "dynamic shape";
    }
    return "?";
}

namespace detail {

void fail(model_error::kind k, const std::string& msg, std::string subject) {
    throw model_error(k, msg, std::move(subject));
}

void fail_node(model_error::kind k, const node& n, const std::string& msg, std::string subject) {
    throw model_error(k, n.label() + ": " + msg, std::move(subject));
}

int64_t checked_mul(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) fail(model_error::kind::limits, "dimension product overflows");
    return r;
}

void check_size(dtype t, const shape_t& s, const std::string& what) {
    for (int64_t d : s)
        if (d < 0) fail(model_error::kind::limits, what + ": negative dimension in " + shape_str(s));
    int64_t n = 1;
    for (int64_t d : s) {
        if (__builtin_mul_overflow(n, d, &n) || n > max_elements)
            fail(model_error::kind::limits,
                 what + ": " + shape_str(s) + " has more than 2^31 elements");
    }
    if (n * int64_t(dtype_size(t)) > max_tensor_bytes)
        fail(model_error::kind::limits, what + ": " + shape_str(s) + " " + dtype_name(t) +
                                            " is larger than 4 GiB");
}

}  // namespace detail

// ---- dtypes ---------------------------------------------------------------------------------

size_t dtype_size(dtype t) {
    switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::f64: return 8;
    case dtype::i8: return 1;
    case dtype::u8: return 1;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
    case dtype::boolean: return 1;
    case dtype::undefined: return 0;
    }
    return 0;
}

const char* dtype_name(dtype t) {
    switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::f64: return "f64";
    case dtype::i8: return "i8";
    case dtype::u8: return "u8";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::boolean: return "bool";
    case dtype::undefined: return "undefined";
    }
    return "?";
}

bool is_float(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::f64; }
bool is_integer(dtype t) {
    return t == dtype::i8 || t == dtype::u8 || t == dtype::i32 || t == dtype::i64;
}

int64_t element_count(const shape_t& s) {
    int64_t n = 1;
    for (int64_t d : s) {
        if (d < 0) return -1;
        n = detail::checked_mul(n, d);
    }
    return n;
}

std::string shape_str(const shape_t& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i) r += 'x';
        r += s[i] < 0 ? std::string("?") : std::to_string(s[i]);
    }
    return r + "]";
}

float half_to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while (!(mant & 0x400));
            bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {  // round to nearest even
    uint32_t x = std::bit_cast<uint32_t>(f);
    uint16_t sign = uint16_t((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7fffffff;
    if (absx > 0x7f800000) return sign | 0x7e00;         // NaN
    if (absx >= 0x477ff000) return sign | 0x7c00;        // overflow -> inf (>= 65520)
    if (absx < 0x38800000) {                             // subnormal or zero in half
        if (absx < 0x33000000) return sign;              // < 2^-25 rounds to 0
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;                        // 14 + (113 - e)
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) ++r;
        return sign | uint16_t(r);
    }
    uint32_t r = absx - 0x38000000;  // rebias exponent (127 - 15) << 23
    uint32_t rem = r & 0x1fff;
    r >>= 13;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
    return sign | uint16_t(r);
}

// ---- tensors --------------------------------------------------------------------------------

double tensor::as_f64(int64_t i) const {
    const std::byte* p = data->data() + i * dtype_size(type);
    switch (type) {
    case dtype::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case dtype::f16: { uint16_t v; std::memcpy(&v, p, 2); return half_to_float(v); }
    case dtype::f64: { double v; std::memcpy(&v, p, 8); return v; }
    case dtype::i8: return double(int8_t(p[0]));
    case dtype::u8: return double(uint8_t(p[0]));
    case dtype::boolean: return p[0] != std::byte{0} ? 1.0 : 0.0;
    case dtype::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case dtype::i64: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
    case dtype::undefined: break;
    }
    return 0;
}

int64_t tensor::as_i64(int64_t i) const {
    const std::byte* p = data->data() + i * dtype_size(type);
    switch (type) {
    case dtype::i64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    case dtype::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case dtype::i8: return int8_t(p[0]);
    case dtype::u8: return uint8_t(p[0]);
    case dtype::boolean: return p[0] != std::byte{0};
    default: {
        double d = as_f64(i);
        if (!(d >= -9.2e18 && d <= 9.2e18)) return d < 0 ? INT64_MIN : INT64_MAX;
        return int64_t(d);
    }
    }
}

std::vector<int64_t> tensor::to_i64() const {
    std::vector<int64_t> r(size_t(std::max<int64_t>(elements(), 0)));
    for (size_t i = 0; i < r.size(); ++i) r[i] = as_i64(int64_t(i));
    return r;
}

std::vector<double> tensor::to_f64() const {
    std::vector<double> r(size_t(std::max<int64_t>(elements(), 0)));
    for (size_t i = 0; i < r.size(); ++i) r[i] = as_f64(int64_t(i));
    return r;
}

tensor tensor::make(dtype t, shape_t shape, bytes_t bytes) {
    return {t, std::move(shape), std::make_shared<const bytes_t>(std::move(bytes))};
}

tensor tensor::from_i64(const std::vector<int64_t>& v, shape_t shape, dtype t) {
    bytes_t b(v.size() * dtype_size(t));
    for (size_t i = 0; i < v.size(); ++i) {
        std::byte* p = b.data() + i * dtype_size(t);
        switch (t) {
        case dtype::i64: std::memcpy(p, &v[i], 8); break;
        case dtype::i32: { int32_t x = int32_t(v[i]); std::memcpy(p, &x, 4); break; }
        case dtype::i8: case dtype::u8: p[0] = std::byte(uint8_t(v[i])); break;
        case dtype::boolean: p[0] = std::byte(v[i] != 0); break;
        case dtype::f32: { float x = float(v[i]); std::memcpy(p, &x, 4); break; }
        case dtype::f64: { double x = double(v[i]); std::memcpy(p, &x, 8); break; }
        case dtype::f16: { uint16_t x = float_to_half(float(v[i])); std::memcpy(p, &x, 2); break; }
        case dtype::undefined: break;
        }
    }
    return make(t, std::move(shape), std::move(b));
}

tensor tensor::from_f64(const std::vector<double>& v, shape_t shape, dtype t) {
    if (!is_float(t)) {
        std::vector<int64_t> iv(v.size());
        for (size_t i = 0; i < v.size(); ++i) iv[i] = int64_t(v[i]);
        return from_i64(iv, std::move(shape), t);
    }
    bytes_t b(v.size() * dtype_size(t));
    for (size_t i = 0; i < v.size(); ++i) {
        std::byte* p = b.data() + i * dtype_size(t);
        if (t == dtype::f32) { float x = float(v[i]); std::memcpy(p, &x, 4); }
        else if (t == dtype::f64) std::memcpy(p, &v[i], 8);
        else { uint16_t x = float_to_half(float(v[i])); std::memcpy(p, &x, 2); }
    }
    return make(t, std::move(shape), std::move(b));
}

tensor tensor::scalar_f32(float v) {
    bytes_t b(4);
    std::memcpy(b.data(), &v, 4);
    return make(dtype::f32, {}, std::move(b));
}

// ---- operators ------------------------------------------------------------------------------

namespace {
struct op_info {
    const char* name;
    int since;
};
constexpr op_info op_table[] = {
    {"Conv", 1}, {"BatchNormalization", 1}, {"Relu", 1}, {"LeakyRelu", 1}, {"Sigmoid", 1},
    {"Tanh", 1}, {"Clip", 1}, {"HardSigmoid", 1}, {"HardSwish", 14}, {"Erf", 9},
    {"Gelu", 20}, {"MaxPool", 1}, {"AveragePool", 1}, {"GlobalAveragePool", 1},
    {"GlobalMaxPool", 1}, {"LRN", 1}, {"Gemm", 1}, {"MatMul", 1}, {"Add", 1}, {"Sub", 1},
    {"Mul", 1}, {"Div", 1}, {"Pow", 1}, {"Sqrt", 1}, {"Exp", 1}, {"Neg", 1}, {"Abs", 1},
    {"Sum", 1}, {"Mean", 1}, {"Max", 1}, {"Min", 1}, {"Concat", 1}, {"Split", 1},
    {"Slice", 1}, {"Flatten", 1}, {"Reshape", 1}, {"Transpose", 1}, {"Squeeze", 1},
    {"Unsqueeze", 1}, {"Gather", 1}, {"Shape", 1}, {"Constant", 1}, {"ConstantOfShape", 9},
    {"Range", 11}, {"Sin", 7}, {"Cos", 7}, {"Cast", 1}, {"Where", 9}, {"Equal", 1},
    {"Expand", 8}, {"Softmax", 1}, {"LogSoftmax", 1}, {"LayerNormalization", 17},
    {"ReduceMean", 1}, {"Dropout", 1}, {"Identity", 1}, {"Pad", 1},
};
static_assert(std::size(op_table) == size_t(op_type::count_));
}  // namespace

const char* op_name(op_type op) {
    size_t i = size_t(op);
    return i < std::size(op_table) ? op_table[i].name : "?";
}

std::optional<op_type> op_from_name(std::string_view n) {
    for (size_t i = 0; i < std::size(op_table); ++i)
        if (n == op_table[i].name) return op_type(i);
    return std::nullopt;
}

int op_since_opset(op_type op) {
    size_t i = size_t(op);
    return i < std::size(op_table) ? op_table[i].since : 1;
}

// ---- nodes ----------------------------------------------------------------------------------

int64_t node::i(std::string_view key, int64_t def) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) return def;
    if (auto p = std::get_if<int64_t>(&it->second)) return *p;
    // A float where an integer is meant is taken when it is one that int64 holds (converting
    // anything else is undefined behaviour, and the file is wrong anyway).
    if (auto p = std::get_if<float>(&it->second); p && std::isfinite(*p) && *p >= -9.2e18f && *p <= 9.2e18f)
        return int64_t(*p);
    detail::fail_node(model_error::kind::invalid_graph, *this,
                      "attribute '" + std::string(key) + "' is not an integer");
}

float node::f(std::string_view key, float def) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) return def;
    if (auto p = std::get_if<float>(&it->second)) return *p;
    if (auto p = std::get_if<int64_t>(&it->second)) return float(*p);
    detail::fail_node(model_error::kind::invalid_graph, *this,
                      "attribute '" + std::string(key) + "' is not a float");
}

std::string node::s(std::string_view key, const std::string& def) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) return def;
    if (auto p = std::get_if<std::string>(&it->second)) return *p;
    detail::fail_node(model_error::kind::invalid_graph, *this,
                      "attribute '" + std::string(key) + "' is not a string");
}

ints node::is(std::string_view key, const ints& def) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) return def;
    if (auto p = std::get_if<ints>(&it->second)) return *p;
    if (auto p = std::get_if<int64_t>(&it->second)) return {*p};
    detail::fail_node(model_error::kind::invalid_graph, *this,
                      "attribute '" + std::string(key) + "' is not a list of integers");
}

floats node::fs(std::string_view key, const floats& def) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) return def;
    if (auto p = std::get_if<floats>(&it->second)) return *p;
    if (auto p = std::get_if<float>(&it->second)) return {*p};
    detail::fail_node(model_error::kind::invalid_graph, *this,
                      "attribute '" + std::string(key) + "' is not a list of floats");
}

const tensor* node::t(std::string_view key) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) return nullptr;
    if (auto p = std::get_if<tensor>(&it->second)) return p;
    detail::fail_node(model_error::kind::invalid_graph, *this,
                      "attribute '" + std::string(key) + "' is not a tensor");
}

void node::erase(std::string_view key) {
    auto it = attrs.find(key);
    if (it != attrs.end()) attrs.erase(it);
}

std::string node::label() const { return std::string(op_name(op)) + " (node '" + name + "')"; }

// ---- graph ----------------------------------------------------------------------------------

int graph::find(std::string_view n) const {
    for (size_t i = 0; i < values.size(); ++i)
        if (values[i].name == n) return int(i);
    return -1;
}

int graph::add_value(value v) {
    values.push_back(std::move(v));
    return int(values.size() - 1);
}

std::vector<std::vector<std::pair<int, int>>> graph::consumers() const {
    std::vector<std::vector<std::pair<int, int>>> c(values.size());
    for (size_t n = 0; n < nodes.size(); ++n)
        for (size_t k = 0; k < nodes[n].inputs.size(); ++k)
            if (int v = nodes[n].inputs[k]; v >= 0) c[size_t(v)].push_back({int(n), int(k)});
    return c;
}

bool graph::is_output(int v) const {
    return std::find(outputs.begin(), outputs.end(), v) != outputs.end();
}

size_t graph::constant_bytes() const {
    size_t total = 0;
    for (const value& v : values)
        if (v.data) total += v.data->size();
    return total;
}

void graph::specialize(const std::map<std::string, shape_t>& input_shapes) {
    if (!generic_)
        detail::fail(model_error::kind::invalid_graph, "graph has no generic form to specialize");
    std::map<int, shape_t> shapes;
    for (int gi : generic_->inputs) {
        const std::string& n = generic_->values[size_t(gi)].name;
        if (auto it = input_shapes.find(n); it != input_shapes.end()) {
            shapes[gi] = it->second;
        } else if (int cur = find(n); cur >= 0) {
            shapes[gi] = values[size_t(cur)].shape;
        } else {
            shapes[gi] = generic_->values[size_t(gi)].shape;
        }
    }
    for (const auto& kv : input_shapes) {
        const std::string& n = kv.first;
        if (std::none_of(generic_->inputs.begin(), generic_->inputs.end(),
                         [&](int gi) { return generic_->values[size_t(gi)].name == n; }))
            detail::fail(model_error::kind::invalid_graph, "no graph input named '" + n + "'");
    }
    graph g = detail::specialize_graph(*generic_, shapes);
    g.generic_ = generic_;
    *this = std::move(g);
}

void graph::set_batch(int64_t n) {
    if (n < 1 || n > (int64_t{1} << 24))
        detail::fail(model_error::kind::limits, "batch size " + std::to_string(n) + " out of range");
    if (!generic_)
        detail::fail(model_error::kind::invalid_graph, "graph has no generic form to re-batch");
    std::map<std::string, shape_t> shapes;
    bool any = false;
    for (int gi : generic_->inputs) {
        const value& gv = generic_->values[size_t(gi)];
        if (!gv.batched) continue;
        any = true;
        int cur = find(gv.name);
        shape_t s = cur >= 0 ? values[size_t(cur)].shape : gv.shape;
        if (s.empty()) continue;
        s[0] = n;
        shapes[gv.name] = s;
    }
    if (!any)
        detail::fail(model_error::kind::unsupported_feature,
                     "the model has no batch dimension (no graph input with a batch dim 0)");
    specialize(shapes);
}

void graph::validate() const {
    using detail::fail;
    const auto bad = model_error::kind::invalid_graph;
    std::vector<char> defined(values.size(), 0);
    for (size_t v = 0; v < values.size(); ++v) {
        const value& x = values[v];
        if (x.type == dtype::undefined) fail(bad, "value '" + x.name + "' has no dtype");
        for (int64_t d : x.shape)
            if (d < 0) fail(bad, "value '" + x.name + "' has an unknown dim " + shape_str(x.shape));
        if (x.data) {
            if (x.producer >= 0) fail(bad, "constant '" + x.name + "' has a producer");
            if (int64_t(x.data->size()) != element_count(x.shape) * int64_t(dtype_size(x.type)))
                fail(bad, "constant '" + x.name + "' has the wrong data size");
            defined[v] = 1;
        }
    }
    for (int v : inputs) {
        if (v < 0 || size_t(v) >= values.size()) fail(bad, "graph input id out of range");
        if (values[size_t(v)].data) fail(bad, "graph input '" + values[size_t(v)].name + "' is constant");
        defined[size_t(v)] = 1;
    }
    for (size_t n = 0; n < nodes.size(); ++n) {
        const node& nd = nodes[n];
        for (int v : nd.inputs) {
            if (v < -1 || v >= int(values.size())) fail(bad, nd.label() + ": input id out of range");
            if (v >= 0 && !defined[size_t(v)])
                fail(bad, nd.label() + ": input '" + values[size_t(v)].name + "' not defined before use");
        }
        for (int v : nd.outputs) {
            if (v < -1 || v >= int(values.size())) fail(bad, nd.label() + ": output id out of range");
            if (v < 0) continue;
            if (defined[size_t(v)]) fail(bad, nd.label() + ": output '" + values[size_t(v)].name + "' defined twice");
            if (values[size_t(v)].producer != int(n))
                fail(bad, nd.label() + ": output '" + values[size_t(v)].name + "' has the wrong producer");
            defined[size_t(v)] = 1;
        }
    }
    for (int v : outputs) {
        if (v < 0 || size_t(v) >= values.size()) fail(bad, "graph output id out of range");
        if (!defined[size_t(v)]) fail(bad, "graph output '" + values[size_t(v)].name + "' is never defined");
    }
}

namespace {
std::string attr_str(const attribute& a) {
    std::ostringstream o;
    std::visit(
        [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, float>) {
                o << x;
            } else if constexpr (std::is_same_v<T, std::string>) {
                o << '"' << x << '"';
            } else if constexpr (std::is_same_v<T, tensor>) {
                o << "tensor " << dtype_name(x.type) << shape_str(x.shape);
            } else {
                o << '[';
                for (size_t i = 0; i < x.size(); ++i) o << (i ? "," : "") << x[i];
                o << ']';
            }
        },
        a);
    return o.str();
}
}  // namespace

std::string graph::dump() const {
    std::ostringstream o;
    auto vstr = [&](int v) {
        if (v < 0) return std::string("-");
        const value& x = values[size_t(v)];
        return "%" + x.name + ":" + dtype_name(x.type) + shape_str(x.shape) + (x.batched ? "b" : "");
    };
    o << "graph '" << name << "' opset " << opset << " batch " << batch << "\n";
    for (int v : inputs) o << "  input " << vstr(v) << "\n";
    size_t nconst = 0;
    for (const value& v : values) nconst += v.data != nullptr;
    o << "  " << nconst << " constants, " << constant_bytes() << " bytes\n";
    for (const node& n : nodes) {
        o << "  ";
        for (size_t k = 0; k < n.outputs.size(); ++k) o << (k ? ", " : "") << vstr(n.outputs[k]);
        o << " = " << op_name(n.op) << "(";
        for (size_t k = 0; k < n.inputs.size(); ++k) {
            o << (k ? ", " : "");
            int v = n.inputs[k];
            o << (v < 0 ? std::string("-")
                        : (values[size_t(v)].data ? "const " : "") + ("%" + values[size_t(v)].name));
        }
        o << ")";
        if (!n.attrs.empty()) {
            o << " {";
            bool first = true;
            for (const auto& [k, a] : n.attrs) {
                o << (first ? "" : ", ") << k << "=" << attr_str(a);
                first = false;
            }
            o << "}";
        }
        o << "  # " << n.name << "\n";
    }
    for (int v : outputs) o << "  output " << vstr(v) << (values[size_t(v)].data ? " (constant)" : "") << "\n";
    return o.str();
}

}  // namespace reefline::ml
