// What requests a model takes, derived from its graph inputs alone (no flag to set):
//
//   image     one f32 [N, C, H, W] input, C in 1..3           -> image_u8_hwc requests H x W x C
//   sequence  one to three integer [N, L] inputs: token ids, and -> tokens_i32 requests of
//             optionally an attention mask and token types        1 .. longest length tokens
//   tensor    one f32 input of fixed shape [N, d1 .. dk], k <= 4 -> tensor_f32 requests d1 x .. x dk
//
// Sequence inputs are told apart by name: one whose name contains "mask" is the attention
// mask, one with "type" or "segment" the token types, the other the ids. With a symbolic
// length L the model is planned at length buckets (16, 32, .. 512, as far as the model takes
// them: a position table of 64 stops at 64), a request runs padded to the smallest bucket
// that holds it (ids 0, mask 0 past its end), so a short sequence does not pay for the
// longest. A model without a mask cannot be padded without changing its answer: it takes
// only requests of exactly a bucket's length. The vocabulary (ids must be in [0, vocab)) is
// the row count of the embedding table the ids index (a Gather on axis 0 of a constant,
// through Cast/Reshape/Unsqueeze/Squeeze/Flatten).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "libml/frontend/graph.h"

namespace reefline::ml {

enum class request_kind : uint8_t { image, sequence, tensor };
const char* request_kind_name(request_kind k);  // "image", "sequence", "tensor"

// The length buckets a sequence model with a symbolic length is planned at, at most.
inline constexpr int64_t sequence_buckets[] = {16, 32, 64, 128, 256, 512};
// Longest token sequence a request can carry (tokens_i32 dims[0] is 16 bits).
inline constexpr int64_t max_request_tokens = 65535;

struct request_input {
    request_kind kind = request_kind::image;
    // image: the input's C, H, W
    int64_t channels = 0, height = 0, width = 0;
    // tensor: the shape of one request (the input's dims after the batch dim)
    shape_t item;
    // sequence: positions in graph::inputs (-1: the model has no such input), the ids' upper
    // bound, the planned lengths (ascending) and whether requests must match one exactly.
    int ids = -1, mask = -1, types = -1;
    int64_t vocab = 0;
    bool vocab_known = false;
    std::vector<int64_t> lengths;
    bool exact_length = false;
    // The first output's dim 1 is the sequence at every planned length ([N, L, ...]: hidden
    // states, token tags), so a request's answer is cut to its own tokens. With one planned
    // length it is taken to be the sequence where it equals that length.
    bool per_token_output = false;

    // The wire format's name of what requests carry ("image_u8_hwc", "tokens_i32", "tensor_f32").
    const char* format_name() const;
    int64_t max_length() const { return lengths.empty() ? 0 : lengths.back(); }
    // The length a request of n tokens runs at, or 0 when no planned length takes it.
    int64_t bucket_for(int64_t n) const;
    // Graph input shapes of a plan for `batch` requests at `length` (sequence models).
    std::map<std::string, shape_t> shapes(const graph& g, int64_t batch, int64_t length) const;
    // Why `next` would not take exactly the requests this takes (empty: it would), in words
    // for operators ("images of 32x32x3 instead of 64x64x3"): the format, an image's shape, a
    // tensor's dims, a sequence's lengths, whether they must match a length exactly, and the
    // vocabulary. The one rule for a new version of a model IF's model.
    std::string differences(const request_input& next) const;
    // One line for operators: "tokens_i32: input_ids i64, attention_mask i64 [N, 16..64], vocabulary 1024".
    std::string describe(const graph& g) const;
};

// Derives what `imported` (a graph as import_onnx returns it, with its generic form) takes.
// Throws std::invalid_argument naming the input and what would be accepted.
request_input derive_request_input(const graph& imported);

}  // namespace reefline::ml
