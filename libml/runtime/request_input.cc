#include "libml/runtime/request_input.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <stdexcept>

namespace reefline::ml {

namespace {

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string input_text(const value& v) { return "'" + v.name + "' " + dtype_name(v.type) + " " + shape_str(v.shape); }

[[noreturn]] void refuse(const graph& g, const std::string& why) {
    std::string got;
    for (int v : g.inputs) got += (got.empty() ? "" : ", ") + input_text(g.values[size_t(v)]);
    throw std::invalid_argument(why + "; a model IF takes one f32 image input [N, C<=3, H, W], one f32 tensor input [N, d1..d4] "
                                "of fixed dims, or integer token inputs [N, L] (ids, attention mask, token types); the model has " +
                                std::to_string(g.inputs.size()) + " input(s): " + got);
}

// The row count of the embedding tables that value `v` (token ids) indexes in graph g: the
// smallest over every Gather on axis 0 of a constant reached through shape-only ops.
int64_t embedding_rows(const graph& g, int v) {
    const auto consumers = g.consumers();
    int64_t rows = INT64_MAX;
    std::vector<int> todo{v}, seen;
    while (!todo.empty()) {
        const int x = todo.back();
        todo.pop_back();
        if (std::find(seen.begin(), seen.end(), x) != seen.end()) continue;
        seen.push_back(x);
        for (const auto& [ni, slot] : consumers[size_t(x)]) {
            const node& n = g.nodes[size_t(ni)];
            switch (n.op) {
            case op_type::Cast: case op_type::Reshape: case op_type::Unsqueeze: case op_type::Squeeze:
            case op_type::Flatten: case op_type::Identity:
                if (slot == 0 && n.output(0) >= 0) todo.push_back(n.output(0));
                break;
            case op_type::Gather: {
                const value& table = g.values[size_t(n.input(0))];
                if (slot == 1 && n.i("axis", 0) == 0 && table.is_constant() && !table.shape.empty())
                    rows = std::min(rows, table.shape[0]);
                break;
            }
            default:
                break;
            }
        }
    }
    return rows;
}

request_input derive_sequence(const graph& imported) {
    const graph& generic = imported.generic() ? *imported.generic() : imported;
    request_input r;
    r.kind = request_kind::sequence;
    for (size_t i = 0; i < imported.inputs.size(); ++i) {
        const std::string name = lower(imported.values[size_t(imported.inputs[i])].name);
        int* role = name.find("mask") != std::string::npos ? &r.mask
                    : name.find("type") != std::string::npos || name.find("segment") != std::string::npos ? &r.types
                                                                                                       : &r.ids;
        if (*role >= 0)
            refuse(imported, "cannot tell the token inputs apart: '" + imported.values[size_t(imported.inputs[size_t(*role)])].name +
                                 "' and '" + imported.values[size_t(imported.inputs[i])].name + "' both look like " +
                                 (role == &r.mask ? "the attention mask" : role == &r.types ? "token types" : "token ids"));
        *role = int(i);
    }
    if (r.ids < 0) refuse(imported, "no input holds the token ids (the others' names say mask or token types)");
    // The length: symbolic (planned at buckets) or fixed by the model, the same for every input.
    int64_t fixed = 0;
    bool symbolic = false;
    for (int gi : generic.inputs) {
        const value& v = generic.values[size_t(gi)];
        if (v.shape.size() != 2) refuse(imported, "token input '" + v.name + "' is not [N, L]");
        if (v.shape[1] < 0) symbolic = true;
        else if (fixed && fixed != v.shape[1]) refuse(imported, "the token inputs disagree on the sequence length");
        else fixed = v.shape[1];
    }
    if (symbolic && fixed) refuse(imported, "one token input has a fixed length and another a symbolic one");
    // Whether the first output's dim 1 is the sequence (a per-token output: hidden states,
    // token tags), seen at every length the model runs at.
    auto output_dim1 = [](const graph& g) -> int64_t {
        if (g.outputs.empty()) return -1;
        const shape_t& s = g.values[size_t(g.outputs[0])].shape;
        return s.size() >= 2 ? s[1] : -1;
    };
    bool follows = true;
    if (!symbolic) {
        if (fixed < 1 || fixed > max_request_tokens)
            refuse(imported, "sequence length " + std::to_string(fixed) + " is outside 1.." + std::to_string(max_request_tokens));
        r.lengths = {fixed};
        follows = output_dim1(imported) == fixed;
    } else {
        std::string first_error;
        for (int64_t len : sequence_buckets) {
            graph g = imported;
            try {
                g.specialize(r.shapes(imported, 1, len));
                r.lengths.push_back(len);
                follows &= output_dim1(g) == len;
            } catch (const model_error& e) {
                if (first_error.empty()) first_error = e.what();
            }
        }
        if (r.lengths.empty())
            throw std::invalid_argument("the model runs at none of the sequence lengths 16..512: " + first_error);
    }
    r.per_token_output = follows;
    r.exact_length = r.mask < 0 && r.lengths.size() > 1;
    const int64_t rows = embedding_rows(generic, generic.inputs[size_t(r.ids)]);
    r.vocab_known = rows != INT64_MAX;
    r.vocab = r.vocab_known ? rows : INT32_MAX;
    return r;
}

}  // namespace

const char* request_kind_name(request_kind k) {
    switch (k) {
    case request_kind::image: return "image";
    case request_kind::sequence: return "sequence";
    case request_kind::tensor: return "tensor";
    }
    return "?";
}

std::string request_input::differences(const request_input& next) const {
    if (kind != next.kind) return std::string(next.format_name()) + " instead of " + format_name();
    const auto image = [](const request_input& r) {
        return std::to_string(r.height) + "x" + std::to_string(r.width) + "x" + std::to_string(r.channels);
    };
    const auto vocabulary = [](const request_input& r) {
        return r.vocab_known ? "a vocabulary of " + std::to_string(r.vocab) : std::string("no known vocabulary");
    };
    switch (kind) {
    case request_kind::image:
        if (channels != next.channels || height != next.height || width != next.width)
            return "images of " + image(next) + " instead of " + image(*this);
        break;
    case request_kind::tensor:
        if (item != next.item) return "tensors of " + shape_str(next.item) + " instead of " + shape_str(item);
        break;
    case request_kind::sequence:
        if (lengths != next.lengths || exact_length != next.exact_length)
            return "sequences of up to " + std::to_string(next.max_length()) + " tokens at other lengths than the " +
                   std::to_string(max_length()) + " it takes now";
        if (vocab_known != next.vocab_known || vocab != next.vocab)
            return vocabulary(next) + " instead of " + (vocab_known ? std::to_string(vocab) : "none");
        break;
    }
    return {};
}

const char* request_input::format_name() const {
    switch (kind) {
    case request_kind::image: return "image_u8_hwc";
    case request_kind::sequence: return "tokens_i32";
    case request_kind::tensor: return "tensor_f32";
    }
    return "?";
}

int64_t request_input::bucket_for(int64_t n) const {
    if (n < 1) return 0;
    for (int64_t len : lengths)
        if (exact_length ? len == n : len >= n) return len;
    return 0;
}

std::map<std::string, shape_t> request_input::shapes(const graph& g, int64_t batch, int64_t length) const {
    std::map<std::string, shape_t> s;
    for (int role : {ids, mask, types})
        if (role >= 0) s[g.values[size_t(g.inputs[size_t(role)])].name] = {batch, length};
    return s;
}

std::string request_input::describe(const graph& g) const {
    const auto name = [&](int i) { return g.values[size_t(g.inputs[size_t(i)])].name; };
    switch (kind) {
    case request_kind::image:
        return std::string(format_name()) + ": " + std::to_string(height) + "x" + std::to_string(width) + "x" +
               std::to_string(channels) + " images into '" + name(0) + "'";
    case request_kind::tensor: {
        std::string dims;
        for (int64_t d : item) dims += (dims.empty() ? "" : "x") + std::to_string(d);
        return std::string(format_name()) + ": " + dims + " into '" + name(0) + "'";
    }
    case request_kind::sequence: {
        std::string s = std::string(format_name()) + ": ids '" + name(ids) + "'";
        if (mask >= 0) s += ", mask '" + name(mask) + "'";
        if (types >= 0) s += ", types '" + name(types) + "'";
        s += ", lengths ";
        for (size_t i = 0; i < lengths.size(); ++i) s += (i ? "," : "") + std::to_string(lengths[i]);
        s += exact_length ? " (exactly: no attention mask)" : "";
        s += vocab_known ? ", vocabulary " + std::to_string(vocab) : ", vocabulary unknown";
        return s;
    }
    }
    return "?";
}

request_input derive_request_input(const graph& g) {
    if (g.inputs.empty()) refuse(g, "the model has no runtime input");
    bool all_int = true;
    for (int v : g.inputs) {
        const dtype t = g.values[size_t(v)].type;
        all_int &= t == dtype::i64 || t == dtype::i32;
    }
    if (all_int) {
        if (g.inputs.size() > 3) refuse(g, "more than three integer inputs");
        return derive_sequence(g);
    }
    if (g.inputs.size() != 1) refuse(g, std::to_string(g.inputs.size()) + " inputs that are not all token inputs");
    const value& v = g.values[size_t(g.inputs[0])];
    if (v.type != dtype::f32) refuse(g, "input " + input_text(v) + " is neither f32 nor integer tokens");
    const graph& generic = g.generic() ? *g.generic() : g;
    const value& gv = generic.values[size_t(generic.inputs[0])];
    if (v.shape.size() < 2 || v.shape.size() > 5) refuse(g, "input " + input_text(v) + " has rank " + std::to_string(v.shape.size()));
    for (size_t d = 1; d < gv.shape.size(); ++d)
        if (gv.shape[d] < 0) refuse(g, "input '" + v.name + "' has a symbolic dim " + std::to_string(d) + " (only the batch dim may be)");
    if (v.shape[0] < 1)
        refuse(g, "input " + input_text(v) + ": dimension 0 (N) is " + std::to_string(v.shape[0]) + "; the batch needs at least 1");
    request_input r;
    if (v.shape.size() == 4 && v.shape[1] >= 1 && v.shape[1] <= 3) {
        // A dimension out of range would make an IF that can never answer (no request can
        // carry a 0-pixel image) or one whose requests the wire format cannot describe.
        static constexpr const char* dim_names[4] = {"N", "C", "H", "W"};
        for (size_t d = 2; d < 4; ++d)
            if (v.shape[d] < 1 || v.shape[d] > 65535)
                refuse(g, "input " + input_text(v) + ": dimension " + std::to_string(d) + " (" + dim_names[d] + ") is " +
                              std::to_string(v.shape[d]) + "; an image input needs it in 1..65535");
        r.kind = request_kind::image;
        r.channels = v.shape[1];
        r.height = v.shape[2];
        r.width = v.shape[3];
        return r;
    }
    r.kind = request_kind::tensor;
    r.item.assign(v.shape.begin() + 1, v.shape.end());
    int64_t bytes = 4;
    for (int64_t d : r.item) {
        if (d < 1 || d > 65535)
            refuse(g, "input " + input_text(v) + ": a tensor request's dims must each be 1..65535");
        bytes *= d;
    }
    if (bytes > int64_t(8) << 20) refuse(g, "input " + input_text(v) + ": one request would be over the 8 MiB protocol limit");
    return r;
}

}  // namespace reefline::ml
