// ONNX front end: ONNX file -> validated, shape-inferred, constant-folded graph IR
// (libml/frontend/graph.h). Supported: ai.onnx opsets 9..25, the operators of ml::op_type, data types
// f32 f16 f64 i8 u8 i32 i64 bool. Anything else is refused with a model_error that names it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "libml/frontend/graph.h"

namespace reefline::ml {

struct import_options {
    // Concrete shapes for graph inputs, by name (symbolic dims must be given here unless
    // they are the batch dim). Inputs not listed keep their declared shape.
    std::map<std::string, shape_t> input_shapes;
    // Graph inputs to bind to constant values: shape parameters (Reshape shape, Slice starts,
    // Pad pads, Clip min/max, ...) that a model takes as inputs but a deployment fixes. Import
    // throws model_error(kind::dynamic) with subject() = the input's name when one is needed.
    std::map<std::string, tensor> constant_inputs;
    // Batch size for the batched inputs (dim 0 symbolic, or declared 1 on a rank >= 2 input
    // when no input has a symbolic dim 0). 0: the declared size, or 1 where symbolic.
    int64_t batch = 0;
    // Size of the symbolic dims (other than the batch dim) of graph inputs that input_shapes
    // does not give, e.g. a sequence model's length "L" (the generic graph keeps them
    // symbolic: graph::specialize() plans other lengths). 0: import fails naming them.
    int64_t unbound_dim = 0;
    // Folding limits: the largest tensor that constant folding may create, and all together.
    int64_t max_fold_bytes = int64_t{1} << 30;
    int64_t max_total_fold_bytes = int64_t{12} << 30;
};

// Imports an ONNX model file. Throws model_error (message prefixed with the path).
graph import_onnx(const std::string& path, const import_options& opts = {});
// Imports from a serialized ModelProto in memory. `label` prefixes error messages.
graph import_onnx_buffer(const void* data, size_t size, const import_options& opts = {},
                         const std::string& label = "<memory>");

// Reads a serialized onnx.TensorProto (the input_<i>.pb / output_<j>.pb files of the ONNX
// backend-test layout). Throws model_error.
tensor read_tensor_file(const std::string& path, std::string* name = nullptr);
tensor parse_tensor(const void* data, size_t size, std::string* name = nullptr);

// The ONNX name of a TensorProto.DataType code ("FLOAT", "INT16", "BFLOAT16", ...).
const char* onnx_dtype_name(int onnx_type);

}  // namespace reefline::ml
