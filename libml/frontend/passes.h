// Internal passes of the front end (shape inference, folding, clean-up). Not a public API:
// import_onnx() and graph::specialize()/set_batch() run them in the right order.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "libml/frontend/graph.h"

namespace reefline::ml::detail {

[[noreturn]] void fail(model_error::kind k, const std::string& msg, std::string subject = {});
[[noreturn]] void fail_node(model_error::kind k, const node& n, const std::string& msg,
                            std::string subject = {});

// Checked arithmetic on dims: throws model_error(limits) on overflow.
int64_t checked_mul(int64_t a, int64_t b);
// Throws model_error(limits) if a tensor of this dtype and shape exceeds the limits.
void check_size(dtype t, const shape_t& s, const std::string& what);

// Number of data inputs in the canonical form (the rest are shape parameters that
// canonicalize_params() moves into attributes once they are constant). -1: no limit.
int canonical_input_count(op_type op);
// The most inputs an ONNX node of this op may have (any opset).
int onnx_max_inputs(op_type op);

// Moves the node's constant parameter inputs (Reshape shape, Slice starts, Pad pads, Clip
// min/max, Unsqueeze axes, ...) into attributes. All or nothing: returns true when the
// node is in canonical form afterwards; false (node untouched) while some parameter input is
// not constant. *pending receives the first non-constant parameter value id.
bool canonicalize_params(graph& g, int node_index, int* pending = nullptr);

// Infers the dtypes and shapes of the node's outputs from its (canonical) inputs, whose
// dtypes and shapes must be known; validates the node (broadcasts, channel counts, inner
// dims, ...) and resolves its attributes to the canonical explicit form (auto_pad to pads,
// negative axes, defaults). Also sets value::batched on the outputs. Throws model_error.
void infer_node(graph& g, int node_index);

// Evaluates a canonical node whose inputs are all constant (reference C++ loops).
// Returns std::nullopt if the op (or dtype) has no reference implementation.
std::optional<std::vector<tensor>> evaluate(const graph& g, const node& n);

struct fold_limits {
    int64_t max_fold_bytes = int64_t{1} << 30;    // largest tensor folding may create
    int64_t max_total_bytes = int64_t{12} << 30;  // all folded data together
};

// The batch-independent stage run once at import: folds every node whose inputs are all
// constant (weight subgraphs), removes Identity/Dropout where possible, folds
// BatchNormalization into a preceding Conv, dead-code elimination.
void fold_generic(graph& g, const fold_limits& limits = {});

// Specializes a generic graph for concrete input shapes: infers every value, folds Shape and
// everything constant downstream, checks declared shapes, DCE. `input_shapes` must give a
// concrete shape for every graph input. If `batch_fixups` is given, receives the indices of
// Reshape nodes whose constant target shape had the batch size in dim 0 and was rewritten to
// 0 (copy the batch dim) so that the graph can be re-batched; the caller applies the same
// rewrite to the generic graph (node indices are those of the generic graph).
graph specialize_graph(const graph& generic, const std::map<int, shape_t>& input_shapes,
                       const fold_limits& limits = {}, std::vector<int>* batch_fixups = nullptr);

void remove_identities(graph& g);
void fuse_batchnorm(graph& g);
void fuse_gelu(graph& g);
void eliminate_dead_code(graph& g);

}  // namespace reefline::ml::detail
