// reefverify: proves that a model IF's answers equal libml run directly on the same inputs.
//
//   reefgen send ... --seed S --shape HxWxC --results answers.jsonl          (image model)
//   reefverify --model model.onnx --results answers.jsonl --seed S --shape HxWxC
//   reefgen send ... --seed S --tokens 8-64 --results answers.jsonl          (sequence model)
//   reefverify --model model.onnx --results answers.jsonl --seed S --tokens 8-64
//   reefgen send ... --seed S --dims 64,6 --results answers.jsonl            (tensor model)
//   reefverify --model model.onnx --results answers.jsonl --seed S --dims 64,6
//
// What requests carry follows from the model (ml::model::requests()): u8 HWC images, token
// sequences or f32 tensors. Every answered request's payload is rebuilt with reefgen's
// payload_source (same options, same seed: the same bytes that went on the wire), turned into
// the model's inputs on the host (images normalised as the IF's gather kernel does; tokens as
// ids padded with 0 to the request's length bucket, a mask of 1s then 0s and token types 0,
// independently of the runtime's token gather kernel; tensors as they are) and run through
// libml on the cpu device; each distinct payload runs once. Each top-k or tensor answer must
// match the reference (compare.h); a request the IF must refuse (a token outside the
// vocabulary, a length the model does not take) must not have a result. Output: detail lines
// for the first mismatches, then as the LAST line exactly "verified=N mismatched=M errors=E".
//
// Exit status: 0 every response verified (and at least one did; with --no-errors also no
// error answers), 1 otherwise, 2 bad usage or an unreadable results file or model.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "preempt/backend_option.h"
#include "libml/libml.h"
#include "tools/reefgen/common.h"
#include "tools/reefgen/payload.h"
#include "tools/reefverify/compare.h"

namespace {

namespace ml = reefline::ml;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
namespace rv = reefline::reefverify;
using rv::topk_entry;
using gen::usage_error;

// "R,G,B": three finite numbers.
std::array<float, 3> parse_triple(const std::string& text, const char* what) {
    std::array<float, 3> v{};
    const char* p = text.c_str();
    for (int i = 0; i < 3; ++i) {
        if (i > 0) {
            if (*p != ',') throw usage_error(std::string(what) + ": expected R,G,B, got '" + text + "'");
            ++p;
        }
        char* end = nullptr;
        errno = 0;
        const double d = std::strtod(p, &end);
        if (end == p || errno != 0 || !std::isfinite(d))
            throw usage_error(std::string(what) + ": expected R,G,B, got '" + text + "'");
        v[i] = float(d);
        p = end;
    }
    if (*p != '\0') throw usage_error(std::string(what) + ": expected R,G,B, got '" + text + "'");
    return v;
}

// One line of the results file, as far as the check needs it.
struct answer_line {
    size_t line = 0;  // 1-based, for messages
    uint64_t id = 0;
    uint64_t payload = 0;
    bool error = false;
    int status = 0;
    int format = 0;
    std::vector<topk_entry> topk;
    bool has_tensor = false;
    std::vector<int64_t> tensor_dims;
    std::vector<float> tensor_data;  // NaN where the file has null (a non-finite value)
    std::string message;
};

uint64_t unsigned_field(const nlohmann::json& j, const char* key, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned())
        throw usage_error(where + ": \"" + key + "\" missing or not a non-negative integer");
    return it->get<uint64_t>();
}

std::vector<answer_line> read_results(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw usage_error("--results: cannot open '" + path + "': " + std::strerror(errno));
    std::vector<answer_line> out;
    std::string text;
    for (size_t n = 1; std::getline(in, text); ++n) {
        if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = path + ":" + std::to_string(n);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            throw usage_error(where + ": not JSON: " + e.what());
        }
        if (!j.is_object()) throw usage_error(where + ": not a JSON object");
        answer_line a;
        a.line = n;
        a.id = unsigned_field(j, "id", where);
        a.payload = unsigned_field(j, "payload", where);
        const auto kind = j.find("kind");
        if (kind == j.end() || !kind->is_string() || (*kind != "response" && *kind != "error"))
            throw usage_error(where + ": \"kind\" must be \"response\" or \"error\"");
        a.error = *kind == "error";
        a.status = int(unsigned_field(j, "status", where));
        a.format = int(unsigned_field(j, "format", where));
        if (a.error) {
            if (const auto m = j.find("message"); m != j.end() && m->is_string()) a.message = *m;
            out.push_back(std::move(a));
            continue;
        }
        if (const auto t = j.find("topk"); t != j.end()) {
            if (!t->is_array()) throw usage_error(where + ": \"topk\" is not an array");
            for (const auto& e : *t) {
                if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() ||
                    e[0].get<uint64_t>() > UINT32_MAX || !(e[1].is_number() || e[1].is_null()))
                    throw usage_error(where + ": \"topk\" entries must be [class, score]");
                a.topk.push_back({uint32_t(e[0].get<uint64_t>()),
                                  e[1].is_null() ? NAN : e[1].get<float>()});
            }
        }
        if (const auto t = j.find("tensor"); t != j.end()) {
            const auto dims = t->is_object() ? t->find("dims") : t->end();
            const auto data = t->is_object() ? t->find("data") : t->end();
            if (dims == t->end() || data == t->end() || !dims->is_array() || !data->is_array())
                throw usage_error(where + ": \"tensor\" must be {\"dims\": [...], \"data\": [...]}");
            for (const auto& d : *dims) {
                if (!d.is_number_unsigned() || d.get<uint64_t>() > 65535)
                    throw usage_error(where + ": \"tensor\" dims must be integers 0..65535");
                a.tensor_dims.push_back(int64_t(d.get<uint64_t>()));
            }
            a.tensor_data.reserve(data->size());
            for (const auto& v : *data) {
                if (!(v.is_number() || v.is_null()))
                    throw usage_error(where + ": \"tensor\" data must be numbers or null");
                a.tensor_data.push_back(v.is_null() ? NAN : v.get<float>());
            }
            a.has_tensor = true;
        }
        out.push_back(std::move(a));
    }
    if (in.bad()) throw usage_error("--results: cannot read '" + path + "'");
    return out;
}

// What a request's reference run gave: output 0 for it, the batch dim removed.
struct reference {
    std::vector<float> values;  // row-major; a top-k answer ranks all of them (as the IF does)
    std::vector<int64_t> item;  // their shape
    int64_t tokens = 0;         // sequences: the request's token count and the length it ran at
    int64_t length = 0;
    std::string refused;  // non-empty: why the IF must refuse the request (then nothing ran)
};

// The model and an instance for the reference runs, on inputs built on the host.
class reference_model {
public:
    reference_model(ml::runtime& rt, const std::string& path) : _runtime(rt) {
        // As model_if::import_options() (reefverify does not link the IF manager): a sequence
        // model's symbolic length is bound for the import and planned per bucket below.
        ml::import_options o;
        o.unbound_dim = ml::sequence_buckets[0];
        _model = rt.load_model(path, o);
        try {
            _input = _model->requests();
        } catch (const std::invalid_argument& e) {
            throw usage_error("--model: " + std::string(e.what()));
        }
        _in = rt.link_model(_model);
    }
    const ml::request_input& input() const { return _input; }
    const ml::graph& graph() const { return _model->imported(); }
    bool sequence() const { return _input.kind == ml::request_kind::sequence; }
    uint32_t batch() const { return _batch; }

    // Plans `batch` requests per run (images, tensors); a sequence runs alone, at its bucket.
    void plan(uint32_t batch) {
        if (sequence()) {
            _runtime.configure_batch(*_in, 1, _input.lengths);
            _batch = 1;
            return;
        }
        if (_in->batch() != batch) _runtime.configure_batch(*_in, batch);
        _batch = batch;
    }

    // Up to batch() u8 HWC images; a short batch repeats its last image in the spare slots (as
    // the model IF pads), and those rows are dropped.
    std::vector<reference> run_images(const std::vector<const std::vector<uint8_t>*>& images,
                                      const std::array<float, 3>& mean, const std::array<float, 3>& sd) {
        const int64_t c = _input.channels, h = _input.height, w = _input.width, plane = h * w;
        ml::bytes_t b(size_t(_batch * c * plane) * sizeof(float));
        auto* x = reinterpret_cast<float*>(b.data());
        for (int64_t i = 0; i < _batch; ++i) {
            const std::vector<uint8_t>& img = *images[std::min<size_t>(size_t(i), images.size() - 1)];
            float* y = x + i * c * plane;
            // The same arithmetic as the gather kernel and tests/model_if_test.cc:
            // (u8 - mean) * (1 / std), HWC to CHW.
            for (int64_t ch = 0; ch < c; ++ch) {
                const float m = mean[size_t(ch)], inv = 1.0f / sd[size_t(ch)];
                for (int64_t p = 0; p < plane; ++p)
                    y[ch * plane + p] = (float(img[size_t(p * c + ch)]) - m) * inv;
            }
        }
        return infer({ml::tensor::make(ml::dtype::f32, {_batch, c, h, w}, std::move(b))}, images.size());
    }

    // Up to batch() tensor_f32 payloads (little-endian f32) as the input [batch, dims...].
    std::vector<reference> run_tensors(const std::vector<const std::vector<uint8_t>*>& payloads) {
        ml::shape_t shape{_batch};
        shape.insert(shape.end(), _input.item.begin(), _input.item.end());
        const size_t per = payloads[0]->size() / 4;
        ml::bytes_t b(size_t(_batch) * per * sizeof(float));
        auto* x = reinterpret_cast<float*>(b.data());
        for (int64_t i = 0; i < _batch; ++i) {
            const std::vector<uint8_t>& p = *payloads[std::min<size_t>(size_t(i), payloads.size() - 1)];
            for (size_t j = 0; j < per; ++j) x[size_t(i) * per + j] = gen::load_f32(p.data() + j * 4);
        }
        return infer({ml::tensor::make(ml::dtype::f32, shape, std::move(b))}, payloads.size());
    }

    // One token sequence at its bucket `length`: ids padded with 0, the mask 1 over the tokens
    // and 0 past them, token types 0; each in its input's integer type.
    reference run_tokens(const std::vector<int32_t>& tokens, int64_t length) {
        const ml::graph& g = graph();
        std::vector<ml::tensor> inputs;
        for (size_t i = 0; i < g.inputs.size(); ++i) {
            std::vector<int64_t> v(size_t(length), 0);
            if (int(i) == _input.ids)
                std::copy(tokens.begin(), tokens.end(), v.begin());
            else if (int(i) == _input.mask)
                std::fill(v.begin(), v.begin() + int64_t(tokens.size()), 1);
            inputs.push_back(ml::tensor::from_i64(v, {1, length}, g.values[size_t(g.inputs[i])].type));
        }
        reference r = infer(inputs, 1).at(0);
        r.tokens = int64_t(tokens.size());
        r.length = length;
        return r;
    }

private:
    std::vector<reference> infer(const std::vector<ml::tensor>& inputs, size_t rows) {
        std::vector<ml::tensor> ys;
        _runtime.infer_batch(*_in, inputs, ys);
        if (ys.empty() || ys[0].type != ml::dtype::f32)
            throw usage_error("--model: expected an f32 first output (the model IF answers from output 0 as f32)");
        const auto v = ys[0].view<float>();
        const size_t per = v.size() / size_t(_batch);
        std::vector<reference> out(rows);
        for (size_t i = 0; i < rows; ++i) {
            out[i].values.assign(v.begin() + i * per, v.begin() + (i + 1) * per);
            out[i].item.assign(ys[0].shape.begin() + 1, ys[0].shape.end());
        }
        return out;
    }

    ml::runtime& _runtime;
    std::shared_ptr<ml::model> _model;
    ml::request_input _input;
    std::unique_ptr<ml::instance> _in;
    int64_t _batch = 1;
};

std::string topk_json(std::span<const topk_entry> t) {
    std::string s = "[";
    for (size_t j = 0; j < t.size(); ++j) {
        s += (j ? ",[" : "[") + std::to_string(t[j].cls) + "," +
             (std::isnan(t[j].score) ? std::string("null") : rv::format_score(t[j].score)) + "]";
    }
    return s + "]";
}

std::string reference_json(const std::vector<float>& scores, size_t k) {
    const auto order = rv::reference_order(scores);
    std::vector<topk_entry> t;
    for (size_t j = 0; j < std::min(k, order.size()); ++j) t.push_back({order[j], scores[order[j]]});
    return topk_json(t);
}

// "tensor 8 [0.1, -0.3, ...]": dims and the first values, for mismatch details.
std::string tensor_text(std::span<const int64_t> dims, std::span<const float> v) {
    std::string s = "tensor " + rv::dims_text(dims) + " [";
    for (size_t i = 0; i < std::min<size_t>(v.size(), 8); ++i)
        s += (i ? ", " : "") + (std::isnan(v[i]) ? std::string("null") : rv::format_score(v[i]));
    return s + (v.size() > 8 ? ", ...]" : "]");
}

// What a model IF says when it refuses a request for a token outside the vocabulary:
// "token T at position P is outside the vocabulary [0, V)".
struct vocabulary_claim {
    long long token = 0, position = 0, vocab = 0;
};
std::optional<vocabulary_claim> parse_vocabulary_claim(const std::string& message) {
    vocabulary_claim c;
    char close = 0;
    int end = 0;
    if (std::sscanf(message.c_str(), "token %lld at position %lld is outside the vocabulary [0, %lld%c%n", &c.token,
                    &c.position, &c.vocab, &close, &end) != 4 ||
        close != ')' || size_t(end) != message.size())
        return std::nullopt;
    return c;
}

// The first token of `tokens` outside [0, vocab), as "token T at position P ...", or empty.
std::string out_of_vocabulary(const std::vector<int32_t>& tokens, int64_t vocab) {
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                   " is outside the vocabulary [0, " + std::to_string(vocab) + ")";
    return {};
}

std::string takes_text(const ml::request_input& in) {
    switch (in.kind) {
    case ml::request_kind::image:
        return "image_u8_hwc requests of " + std::to_string(in.height) + "x" + std::to_string(in.width) + "x" +
               std::to_string(in.channels) + " images (reefgen --shape " + std::to_string(in.height) + "x" +
               std::to_string(in.width) + "x" + std::to_string(in.channels) + ", or --image)";
    case ml::request_kind::sequence: {
        std::string lengths;
        for (size_t i = 0; i < in.lengths.size(); ++i) lengths += (i ? "," : "") + std::to_string(in.lengths[i]);
        return "tokens_i32 requests of " +
               (in.exact_length ? "exactly " + lengths : "1.." + std::to_string(in.max_length())) + " tokens" +
               (in.vocab_known ? ", vocabulary [0, " + std::to_string(in.vocab) + ")" : std::string()) +
               " (reefgen --tokens L or MIN-MAX, --vocab V)";
    }
    case ml::request_kind::tensor: {
        std::string dims;
        for (size_t i = 0; i < in.item.size(); ++i) dims += (i ? "," : "") + std::to_string(in.item[i]);
        return "tensor_f32 requests of dims " + rv::dims_text(in.item) + " (reefgen --dims " + dims + ")";
    }
    }
    return "?";
}

// The command line, and the options whose presence matters (payload options for another
// kind of model are refused).
struct options {
    std::string model, results, shape = "224x224x3", image, raw, mean_text, std_text, format, tokens_text, dims_text;
    std::string backend = "cpu";
    uint64_t seed = 1;
    uint32_t vocab = gen::default_vocab;
    double tolerance = 1e-4;
    uint32_t max_errors = 10, batch = 1;
    bool no_errors = false;
    CLI::Option *shape_opt = nullptr, *image_opt = nullptr, *format_opt = nullptr, *tokens_opt = nullptr,
                *vocab_opt = nullptr, *dims_opt = nullptr, *mean_opt = nullptr, *std_opt = nullptr;
};

void add_options(CLI::App& app, options& o) {
    app.footer("What the requests carried follows from the model: images (--shape or --image, --mean, --std), "
               "token sequences (--tokens, --vocab) or f32 tensors (--dims); pass the payload options and --seed "
               "given to reefgen. Top-k and tensor answers are compared with libml run on the same inputs; "
               "error answers are counted apart (a refusal of a token outside the vocabulary is checked against "
               "the rebuilt request). Last line: verified=N mismatched=M errors=E. Exit status: 0 all verified, "
               "1 a mismatch (or nothing verified, or --no-errors and an error answer), 2 bad usage.");
    app.add_option("--model", o.model, "The ONNX model the IF serves; what requests carry follows from it")->required();
    app.add_option("--results", o.results, "JSON lines written by reefgen send --results or check --results")->required();
    o.shape_opt = app.add_option("--shape", o.shape, "Image models: image shape HxWxC, as given to reefgen")
                      ->capture_default_str();
    o.image_opt = app.add_option("--image", o.image, "Image models: PPM/PGM image, as given to reefgen --image");
    auto* raw_opt = app.add_option("--raw", o.raw, "File, as given to reefgen --raw (image, tokens or tensor bytes)");
    o.image_opt->excludes(o.shape_opt)->excludes(raw_opt);
    o.format_opt = app.add_option("--format", o.format, "As given to reefgen (optional): must be what the model takes")
                       ->check(CLI::IsMember({"image", "tokens", "tensor"}));
    o.tokens_opt = app.add_option("--tokens", o.tokens_text,
                                  "Sequence models: L or MIN-MAX tokens per request, as given to reefgen");
    o.vocab_opt = app.add_option("--vocab", o.vocab, "Sequence models: token ids were drawn below this, as given "
                                                     "to reefgen")
                      ->capture_default_str()
                      ->check(CLI::Range(1u, 2147483647u));
    o.dims_opt = app.add_option("--dims", o.dims_text, "Tensor models: extents D1[,D2[,D3[,D4]]], as given to reefgen");
    app.add_option("--seed", o.seed, "Seed, as given to reefgen")->capture_default_str();
    o.mean_opt = app.add_option("--mean", o.mean_text, "Image models: per-channel mean R,G,B in u8 scale, as the IF "
                                                       "is configured (default: ImageNet 123.675,116.28,103.53)");
    o.std_opt = app.add_option("--std", o.std_text, "Image models: per-channel std R,G,B in u8 scale, as the IF is "
                                                    "configured (default: ImageNet 58.395,57.12,57.375)");
    app.add_option("--tolerance", o.tolerance,
                   "Scores and tensor values agree within tolerance * (1 + |reference|)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--max-errors", o.max_errors, "Detail lines for the first N mismatches")->capture_default_str();
    app.add_option("--batch", o.batch, "Image and tensor models: reference runs batch this many distinct payloads "
                                       "(sequences run one at a time, each at its own length bucket)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 256u));
    app.add_flag("--no-errors", o.no_errors, "Fail on any error answer (default: count them apart)");
    reefline::gpu::add_backend_option(app, o.backend);
}

// The payload options reefgen resolved for this model's format; options for another format
// mean the traffic was not made for this model.
gen::payload_options payload_options_for(const options& o, const ml::request_input& in) {
    const auto refuse = [&](const std::string& what) { return usage_error(what + ": the model takes " + takes_text(in)); };
    gen::payload_options po;
    po.raw_file = o.raw;
    po.seed = o.seed;
    const char* kind_option = in.kind == ml::request_kind::image      ? "image"
                              : in.kind == ml::request_kind::sequence ? "tokens"
                                                                      : "tensor";
    if (o.format_opt->count() && o.format != kind_option) throw refuse("--format " + o.format);
    if (in.kind != ml::request_kind::image) {
        for (const CLI::Option* opt : {o.shape_opt, o.image_opt, o.mean_opt, o.std_opt})
            if (opt->count()) throw refuse(opt->get_name() + " is for image models");
    }
    if (in.kind != ml::request_kind::sequence)
        for (const CLI::Option* opt : {o.tokens_opt, o.vocab_opt})
            if (opt->count()) throw refuse(opt->get_name() + " is for sequence models");
    if (in.kind != ml::request_kind::tensor && o.dims_opt->count()) throw refuse("--dims is for tensor models");
    switch (in.kind) {
    case ml::request_kind::image:
        po.format = wire::format::image_u8_hwc;
        po.shape = gen::parse_shape(o.shape);
        po.image_file = o.image;
        break;
    case ml::request_kind::sequence: {
        po.format = wire::format::tokens_i32;
        po.vocab = o.vocab;
        if (!o.tokens_opt->count() && o.raw.empty()) throw refuse("--tokens L or MIN-MAX is needed");
        if (o.tokens_opt->count()) {
            const gen::token_range r = gen::parse_token_range(o.tokens_text);
            po.tokens = r.min;
            po.tokens_max = r.max;
            bool any = false;
            for (uint32_t n = r.min; n <= r.max && !any; ++n) any = in.bucket_for(n) != 0;
            if (!any) throw refuse("no request of --tokens " + o.tokens_text + " fits");
        }
        break;
    }
    case ml::request_kind::tensor: {
        po.format = wire::format::tensor_f32;
        if (!o.dims_opt->count()) throw refuse("--dims is needed");
        po.dims = gen::parse_dims(o.dims_text);
        if (!std::equal(po.dims.begin(), po.dims.end(), in.item.begin(), in.item.end()))
            throw refuse("--dims " + o.dims_text + " is not what the model takes");
        break;
    }
    }
    return po;
}

// The requests' payloads rebuilt, and the references of those some answer needs.
class payloads {
public:
    explicit payloads(const gen::payload_options& po) : _source(po) {}
    const gen::payload_source& source() const { return _source; }
    // A sequence request's tokens (error answers that blame one are checked too).
    const std::vector<int32_t>& tokens_of(uint64_t p) {
        auto it = _tokens.find(p);
        if (it == _tokens.end()) {
            const gen::request_payload r = _source.make(p);
            std::vector<int32_t> t(r.bytes.size() / 4);
            for (size_t i = 0; i < t.size(); ++i) t[i] = gen::load_token(r.bytes.data() + i * 4);
            it = _tokens.emplace(p, std::move(t)).first;
        }
        return it->second;
    }

private:
    gen::payload_source _source;
    std::map<uint64_t, std::vector<int32_t>> _tokens;
};

// libml's answer for every distinct payload an ok answer needs: images and tensors in batches
// of --batch, sequences one at a time at their length bucket (or why the IF must refuse them).
std::map<uint64_t, reference> build_references(reference_model& ref, payloads& src, const std::vector<answer_line>& answers,
                                               uint32_t batch, const std::array<float, 3>& mean,
                                               const std::array<float, 3>& sd) {
    const ml::request_input& in = ref.input();
    std::vector<uint64_t> needed;
    for (const answer_line& a : answers)
        if (!a.error) needed.push_back(a.payload);
    std::sort(needed.begin(), needed.end());
    needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
    std::map<uint64_t, reference> refs;
    if (needed.empty()) return refs;
    ref.plan(uint32_t(std::min<size_t>(batch, needed.size())));
    if (ref.sequence()) {
        for (uint64_t p : needed) {
            const std::vector<int32_t>& t = src.tokens_of(p);
            reference r;
            const int64_t length = in.bucket_for(int64_t(t.size()));
            if (length == 0)
                r.refused = "the request has " + std::to_string(t.size()) + " tokens; the model takes " + takes_text(in);
            else if (std::string bad = out_of_vocabulary(t, in.vocab); !bad.empty())
                r.refused = "the request's " + bad;
            else
                r = ref.run_tokens(t, length);
            refs[p] = std::move(r);
        }
        return refs;
    }
    for (size_t at = 0; at < needed.size(); at += ref.batch()) {
        const size_t n = std::min<size_t>(ref.batch(), needed.size() - at);
        std::vector<std::vector<uint8_t>> bytes;
        for (size_t i = 0; i < n; ++i) bytes.push_back(src.source().make(needed[at + i]).bytes);
        std::vector<const std::vector<uint8_t>*> items;
        for (const auto& b : bytes) items.push_back(&b);
        auto out = in.kind == ml::request_kind::image ? ref.run_images(items, mean, sd) : ref.run_tensors(items);
        for (size_t i = 0; i < n; ++i) refs[needed[at + i]] = std::move(out[i]);
    }
    return refs;
}

// The verdict over every answer line.
struct tally {
    uint64_t verified = 0, mismatched = 0, errors = 0, shown = 0, vocabulary_refusals = 0;
    std::map<int, uint64_t> errors_by_status;
};

// Why a sequence model's refusal "token T at position P is outside the vocabulary [0, V)" is
// wrong for the rebuilt request; empty when it is right.
std::string wrong_vocabulary_claim(const vocabulary_claim& claim, const std::vector<int32_t>& t, int64_t vocab) {
    const vocabulary_claim* c = &claim;
    if (c->position < 0 || size_t(c->position) >= t.size()) return "the request has " + std::to_string(t.size()) + " tokens";
    if (t[size_t(c->position)] != c->token)
        return "the request's token at position " + std::to_string(c->position) + " is " +
               std::to_string(t[size_t(c->position)]);
    if (c->vocab != vocab) return "the model's vocabulary is [0, " + std::to_string(vocab) + ")";
    if (c->token >= 0 && c->token < vocab) return "token " + std::to_string(c->token) + " is inside the vocabulary";
    return "";
}

// Why an ok answer differs from its reference (empty when it matches), and the lines that show it.
std::string result_problem(const answer_line& a, const reference& r, bool sequence, double tolerance, std::string& details) {
    if (a.status != 0) return "response with status " + std::to_string(a.status);
    if (!r.refused.empty()) return "answered with a result, but " + r.refused + ": it must be refused (bad_request)";
    if (a.format == int(wire::format::result_topk)) {
        details = "  answered  " + topk_json(a.topk) + "\n  reference " +
                  reference_json(r.values, std::max<size_t>(a.topk.size(), 1)) + '\n';
        return rv::topk_problem(r.values, a.topk, tolerance);
    }
    if (a.format == int(wire::format::result_tensor_f32)) {
        const std::vector<int64_t> dims = rv::tensor_answer_dims(r.item, sequence, r.length, r.tokens);
        int64_t count = 1;
        for (int64_t d : dims) count *= d;
        const std::span<const float> want(r.values.data(), size_t(count));
        details = "  answered  " + tensor_text(a.tensor_dims, a.tensor_data) + "\n  reference " + tensor_text(dims, want) + '\n';
        if (!a.has_tensor) return "result_tensor_f32 without a \"tensor\" field";
        return rv::tensor_problem(dims, want, a.tensor_dims, a.tensor_data, tolerance);
    }
    return "format " + std::to_string(a.format) + ", expected result_topk (" +
           std::to_string(int(wire::format::result_topk)) + ") or result_tensor_f32 (" +
           std::to_string(int(wire::format::result_tensor_f32)) + ")";
}

tally judge(const options& o, reference_model& ref, payloads& src, const std::vector<answer_line>& answers,
            const std::map<uint64_t, reference>& refs) {
    tally t;
    const auto mismatch = [&](const answer_line& a, const std::string& who, const std::string& problem,
                              const std::string& details) {
        ++t.mismatched;
        if (t.shown < o.max_errors) {
            ++t.shown;
            std::cout << "mismatch " << who << " (line " << a.line << "): " << problem << '\n' << details;
        }
    };
    for (const answer_line& a : answers) {
        const std::string who = "id=" + std::to_string(a.id) + " payload=" + std::to_string(a.payload);
        if (a.error) {
            // A refusal for a token outside the vocabulary is an error answer like any other,
            // provided the request has that token: a refusal of a valid request is wrong.
            if (ref.sequence() && a.status == int(wire::status::bad_request)) {
                if (const auto claim = parse_vocabulary_claim(a.message)) {
                    const std::string wrong = wrong_vocabulary_claim(*claim, src.tokens_of(a.payload), ref.input().vocab);
                    if (!wrong.empty()) {
                        mismatch(a, who, "refused with '" + a.message + "', but " + wrong, "");
                        continue;
                    }
                    ++t.vocabulary_refusals;
                }
            }
            ++t.errors;
            ++t.errors_by_status[a.status];
            if (o.no_errors && t.shown < o.max_errors) {
                ++t.shown;
                std::cout << "error answer " << who << ": status " << wire::to_string(static_cast<wire::status>(a.status))
                          << ": " << a.message << '\n';
            }
            continue;
        }
        std::string details;
        const std::string problem = result_problem(a, refs.at(a.payload), ref.sequence(), o.tolerance, details);
        if (problem.empty())
            ++t.verified;
        else
            mismatch(a, who, problem, details);
    }
    return t;
}

void print_tally(const options& o, const tally& t, size_t answers) {
    if (t.shown == o.max_errors && t.mismatched + (o.no_errors ? t.errors : 0) > t.shown)
        std::cout << "... and " << (t.mismatched + (o.no_errors ? t.errors : 0) - t.shown) << " more\n";
    if (t.errors) {
        std::cout << "error answers by status:";
        for (const auto& [status, count] : t.errors_by_status)
            std::cout << ' ' << wire::to_string(static_cast<wire::status>(status)) << '=' << count;
        if (t.vocabulary_refusals)
            std::cout << " (" << t.vocabulary_refusals
                      << " refused a token outside the vocabulary, confirmed on the rebuilt request)";
        std::cout << (o.no_errors ? " (--no-errors: they fail the check)\n" : " (not counted as mismatches)\n");
    }
    if (answers == 0) std::cout << "no answers in " << o.results << '\n';
    std::cout << "verified=" << t.verified << " mismatched=" << t.mismatched << " errors=" << t.errors << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefverify: check a model IF's answers (reefgen send --results) against libml"};
    options o;
    add_options(app, o);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    }
    try {
        std::array<float, 3> mean{123.675f, 116.28f, 103.53f}, sd{58.395f, 57.12f, 57.375f};
        if (!o.mean_text.empty()) mean = parse_triple(o.mean_text, "--mean");
        if (!o.std_text.empty()) sd = parse_triple(o.std_text, "--std");
        for (float s : sd)
            if (s == 0) throw usage_error("--std: must be non-zero");
        const std::vector<answer_line> answers = read_results(o.results);

        auto device = reefline::gpu::make_backend(o.backend);
        ml::runtime rt(*device);
        reference_model ref(rt, o.model);
        const ml::request_input& in = ref.input();
        payloads src(payload_options_for(o, in));
        if (in.kind == ml::request_kind::image) {
            const gen::request_payload probe = src.source().make(0);
            if (probe.dims[0] != in.height || probe.dims[1] != in.width || probe.dims[2] != in.channels)
                throw usage_error("the payloads are " + std::to_string(probe.dims[0]) + "x" +
                                  std::to_string(probe.dims[1]) + "x" + std::to_string(probe.dims[2]) +
                                  " but the model takes " + std::to_string(in.height) + "x" +
                                  std::to_string(in.width) + "x" + std::to_string(in.channels) +
                                  " images: pass the --shape (or --image) given to reefgen send");
        }
        const std::map<uint64_t, reference> refs = build_references(ref, src, answers, o.batch, mean, sd);
        const tally t = judge(o, ref, src, answers, refs);
        print_tally(o, t, answers.size());
        const bool pass = t.mismatched == 0 && t.verified > 0 && !(o.no_errors && t.errors > 0);
        return pass ? 0 : 1;
    } catch (const usage_error& e) {
        std::cerr << "reefverify: " << e.what() << '\n';
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "reefverify: " << e.what() << '\n';
        return 2;
    }
}
