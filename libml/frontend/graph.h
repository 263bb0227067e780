// The model runtime's graph IR: what the ONNX front end produces and the planner lowers.
//
// A graph is a list of values (tensors: graph inputs, constants, node outputs) and a list
// of nodes in topological order. Values are referred to by index ("value id"); -1 marks an
// omitted optional input or output. After import every value has a dtype and a concrete
// shape, every constant has its data, and every node is in its op's canonical form (below),
// whatever opset the ONNX file used. Constant subgraphs are folded away, Shape of a known
// shape is a constant, Identity/Dropout are gone (but see Identity below), BatchNormalization
// after a Conv is folded into the Conv's weights, and dead nodes and values are removed.
//
// Canonical node forms (inputs in brackets; attributes always present unless marked opt):
//   Conv [X, W, B?]            kernel_shape, strides, dilations, pads (2*n: begins, ends;
//                              auto_pad resolved), group
//   MaxPool [X]                kernel_shape, strides, dilations, pads (resolved), ceil_mode
//   AveragePool [X]            as MaxPool, plus count_include_pad
//   GlobalAveragePool/GlobalMaxPool [X]
//   BatchNormalization [X, scale, B, mean, var]   epsilon (inference form only)
//   LRN [X]                    alpha, beta, bias, size
//   Gemm [A, B, C?]            alpha, beta, transA, transB
//   MatMul [A, B]              numpy semantics (1-D promotion, batch broadcast)
//   Add Sub Mul Div Pow Equal [A, B]   multidirectional broadcast (Pow: B may differ in dtype)
//   Sum Mean Max Min [X...]    multidirectional broadcast
//   Where [cond, X, Y]
//   Relu Sigmoid Tanh HardSwish Erf Sqrt Exp Neg Abs Sin Cos [X]
//   LeakyRelu [X] alpha; HardSigmoid [X] alpha, beta; Gelu [X] approximate ("none"|"tanh")
//   Clip [X]                   min, max (float; -inf/+inf when absent)
//   Cast [X]                   to (int: a ml::dtype)
//   Concat [X...] axis (>= 0); Split [X] axis, split (explicit sizes, one per output)
//   Slice [X]                  axes, starts, ends, steps (same length, axes >= 0; starts and
//                              ends clamped to the dim: start in [0, d] ([0, d-1] for negative
//                              steps), end in [0, d] ([-1, d-1] for negative steps), so a kernel
//                              loops `for (i = start; step > 0 ? i < end : i > end; i += step)`)
//   Flatten [X] axis (>= 0); Reshape [X] shape (as in ONNX: 0 copies, -1 infers), allowzero
//   Transpose [X] perm (explicit); Squeeze [X] axes; Unsqueeze [X] axes (sorted, >= 0)
//   Gather [X, indices] axis (>= 0)
//   Expand [X] shape; ConstantOfShape [] shape, value (only when too big to fold)
//   Softmax/LogSoftmax [X]     axis (>= 0), coerce_2d (1: the pre-opset-13 semantics, the
//                              input seen as 2-D [prod(d<axis), prod(d>=axis)]; only kept when
//                              it differs from the single-axis form)
//   LayerNormalization [X, scale, B?] axis (>= 0), epsilon, stash_type; outputs Y, Mean?,
//                              InvStdDev?
//   ReduceMean [X]             axes (explicit, sorted, >= 0), keepdims
//   Pad [X]                    pads (2*rank: begins, ends), mode, value (float)
//   Identity [X]               only where a graph input is also a graph output (a copy)
//   Range, Shape, Constant, Dropout never remain after import (Range and ConstantOfShape
//   could only remain when folding would exceed the fold limits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace reefline::ml {

// ---- errors -------------------------------------------------------------------------------

class model_error : public std::runtime_error {
public:
    enum class kind {
        io,                    // file missing, unreadable, too large
        parse,                 // not a (complete) ONNX protobuf
        unsupported_opset,     // opset outside 9..25, or no ai.onnx opset
        unsupported_operator,  // operator (or domain) not supported
        unsupported_dtype,     // data type outside the supported set
        unsupported_feature,   // a supported op with an unsupported attribute/mode/output
        external_data,         // tensors stored outside the file
        invalid_graph,         // structure: undefined inputs, cycles, unsorted, duplicates
        shape,                 // shape or type mismatch found by inference
        limits,                // absurd dims or sizes
        dynamic,               // a shape parameter is not constant (data-dependent shape)
    };
    model_error(kind k, const std::string& message, std::string subject = {})
        : std::runtime_error(message), kind_(k), subject_(std::move(subject)) {}
    kind code() const { return kind_; }
    // For kind::dynamic: the name of the value that must be constant (a graph input that
    // import_options::constant_inputs can bind). Otherwise possibly empty.
    const std::string& subject() const { return subject_; }

private:
    kind kind_;
    std::string subject_;
};
const char* to_string(model_error::kind k);

// ---- data types and tensors ---------------------------------------------------------------

enum class dtype : uint8_t { undefined = 0, f32, f16, f64, i8, u8, i32, i64, boolean };
size_t dtype_size(dtype t);
const char* dtype_name(dtype t);
bool is_float(dtype t);    // f32, f16, f64
bool is_integer(dtype t);  // i8, u8, i32, i64

using shape_t = std::vector<int64_t>;
using bytes_t = std::vector<std::byte>;

// Limits enforced on every tensor (inputs, constants, inferred values).
inline constexpr int64_t max_elements = int64_t{1} << 31;
inline constexpr int64_t max_tensor_bytes = int64_t{4} << 30;

// Product of dims; -1 if any dim is unknown (< 0); throws model_error(limits) on overflow.
int64_t element_count(const shape_t& s);
std::string shape_str(const shape_t& s);  // "[1x3x224x224]", "[]" for a scalar, "?" unknown dims

struct tensor {
    dtype type = dtype::undefined;
    shape_t shape;
    std::shared_ptr<const bytes_t> data;  // row-major, native (little-endian) elements

    int64_t elements() const { return element_count(shape); }
    size_t bytes() const { return data ? data->size() : 0; }
    template <class T>
    std::span<const T> view() const {
        return {reinterpret_cast<const T*>(data->data()), data->size() / sizeof(T)};
    }
    // Element i converted (integers and bool exactly, f16 decoded).
    double as_f64(int64_t i) const;
    int64_t as_i64(int64_t i) const;
    std::vector<int64_t> to_i64() const;
    std::vector<double> to_f64() const;

    static tensor make(dtype t, shape_t shape, bytes_t bytes);
    static tensor from_i64(const std::vector<int64_t>& v, shape_t shape, dtype t = dtype::i64);
    static tensor from_f64(const std::vector<double>& v, shape_t shape, dtype t = dtype::f32);
    static tensor scalar_f32(float v);

    // Same dtype, shape and bytes.
    friend bool operator==(const tensor& a, const tensor& b) {
        if (a.type != b.type || a.shape != b.shape) return false;
        if (a.data == b.data) return true;
        return a.data && b.data && *a.data == *b.data;
    }
};

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// ---- operators and attributes ---------------------------------------------------------------

enum class op_type : uint8_t {
    Conv, BatchNormalization, Relu, LeakyRelu, Sigmoid, Tanh, Clip, HardSigmoid, HardSwish,
    Erf, Gelu, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LRN, Gemm, MatMul,
    Add, Sub, Mul, Div, Pow, Sqrt, Exp, Neg, Abs, Sum, Mean, Max, Min, Concat, Split, Slice,
    Flatten, Reshape, Transpose, Squeeze, Unsqueeze, Gather, Shape, Constant, ConstantOfShape,
    Range, Sin, Cos, Cast, Where, Equal, Expand, Softmax, LogSoftmax, LayerNormalization,
    ReduceMean, Dropout, Identity, Pad,
    count_
};
const char* op_name(op_type op);
std::optional<op_type> op_from_name(std::string_view onnx_op_type);
// The first ai.onnx opset that has the operator.
int op_since_opset(op_type op);

using ints = std::vector<int64_t>;
using floats = std::vector<float>;
using attribute = std::variant<int64_t, float, std::string, ints, floats, tensor>;

struct node {
    op_type op{};
    std::string name;         // the ONNX node name, or "<Op>#<index>" when the file had none
    std::vector<int> inputs;  // value ids, -1 = omitted optional input
    std::vector<int> outputs; // value ids, -1 = omitted optional output
    std::map<std::string, attribute, std::less<>> attrs;
    int opset = 0;            // the ai.onnx opset of the source model

    bool has(std::string_view key) const { return attrs.find(key) != attrs.end(); }
    int64_t i(std::string_view key, int64_t def) const;
    float f(std::string_view key, float def) const;
    std::string s(std::string_view key, const std::string& def = {}) const;
    ints is(std::string_view key, const ints& def = {}) const;
    floats fs(std::string_view key, const floats& def = {}) const;
    const tensor* t(std::string_view key) const;
    void set(const std::string& key, attribute a) { attrs[key] = std::move(a); }
    void erase(std::string_view key);
    int input(size_t k) const { return k < inputs.size() ? inputs[k] : -1; }
    int output(size_t k) const { return k < outputs.size() ? outputs[k] : -1; }
    std::string label() const;  // "Conv (node 'conv1')"
};

struct value {
    std::string name;
    dtype type = dtype::undefined;
    shape_t shape;                        // concrete after import; -1 marks unknown dims
    std::shared_ptr<const bytes_t> data;  // constant data (initializers, folded values)
    int producer = -1;                    // node index; -1 for graph inputs and constants
    bool batched = false;                 // dim 0 is the batch dimension

    bool is_constant() const { return data != nullptr; }
    tensor constant() const { return {type, shape, data}; }
    void set_constant(const tensor& t) {
        type = t.type;
        shape = t.shape;
        data = t.data;
    }
};

// ---- the graph ------------------------------------------------------------------------------

class graph {
public:
    std::string name;
    int opset = 0;                // ai.onnx opset of the source model
    std::vector<value> values;
    std::vector<node> nodes;      // topological order
    std::vector<int> inputs;      // runtime inputs, in ONNX graph-input order (no initializers)
    std::vector<int> outputs;     // in ONNX graph-output order (may be constants)
    int64_t batch = 0;            // current batch size (0: the model has no batch dimension)

    // Types the ONNX file declared for graph outputs and value_info entries, by value name;
    // inference checks its results against them (dims < 0 are symbolic).
    struct declared_type {
        dtype type = dtype::undefined;
        std::optional<shape_t> shape;
    };
    std::map<std::string, declared_type, std::less<>> declared;
    // Non-fatal findings of the last specialization, e.g. a declared output shape that
    // disagrees with inference (ONNX Runtime also keeps the inferred shape there).
    std::vector<std::string> warnings;

    int find(std::string_view value_name) const;  // value id or -1
    int add_value(value v);
    // consumers()[v] lists the (node index, input slot) pairs that read value v.
    std::vector<std::vector<std::pair<int, int>>> consumers() const;
    bool is_output(int v) const;
    size_t constant_bytes() const;

    // Re-specializes the graph for batch size n: every batched graph input gets dim 0 = n,
    // and shapes, Shape-derived constants and folds are recomputed from the import-time
    // (batch-independent) form. Throws model_error if the graph has no batch dimension or
    // the new shapes are inconsistent.
    void set_batch(int64_t n);
    // Same, with explicit shapes for some graph inputs (by name); the others keep theirs.
    void specialize(const std::map<std::string, shape_t>& input_shapes);

    // Checks the structural invariants (ids in range, topological order, SSA, concrete
    // shapes); throws model_error(invalid_graph) naming the first violation.
    void validate() const;
    std::string dump() const;  // human-readable listing

    // The batch-independent form this graph was specialized from (shared, immutable).
    const std::shared_ptr<const graph>& generic() const { return generic_; }
    void set_generic(std::shared_ptr<const graph> g) { generic_ = std::move(g); }

private:
    std::shared_ptr<const graph> generic_;
};

}  // namespace reefline::ml
