// reefverify: proves that a model IF's answers equal libml run directly on the same inputs.
//
//   reefgen send ... --seed S --shape HxWxC --results answers.jsonl
//   reefverify --model model.onnx --results answers.jsonl --seed S --shape HxWxC
//
// Every answered request's payload is rebuilt with reefgen's payload_source (same options,
// same seed: the same bytes that went on the wire), normalised on the host the way the IF's
// gather kernel does, and run through libml on the cpu device; each distinct payload runs
// once. Each top-k answer must match the reference (compare.h). Output: detail lines for the
// first mismatches, then as the LAST line exactly "verified=N mismatched=M errors=E".
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
#include <sstream>

#include "libml/libml.h"
#include "tools/reefgen/common.h"
#include "tools/reefgen/payload.h"
#include "tools/reefverify/compare.h"

namespace {

namespace ml = reefline::ml;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
using reefline::reefverify::topk_entry;
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
        } else if (const auto t = j.find("topk"); t != j.end()) {
            if (!t->is_array()) throw usage_error(where + ": \"topk\" is not an array");
            for (const auto& e : *t) {
                if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() ||
                    e[0].get<uint64_t>() > UINT32_MAX || !(e[1].is_number() || e[1].is_null()))
                    throw usage_error(where + ": \"topk\" entries must be [class, score]");
                a.topk.push_back({uint32_t(e[0].get<uint64_t>()),
                                  e[1].is_null() ? NAN : e[1].get<float>()});
            }
        }
        out.push_back(std::move(a));
    }
    if (in.bad()) throw usage_error("--results: cannot read '" + path + "'");
    return out;
}

// The model and an instance for the reference runs, with the input layout checked against
// the payload shape (a model IF answers only images of its own input size).
class reference_model {
public:
    reference_model(ml::runtime& rt, const std::string& path, uint32_t batch) : _runtime(rt) {
        _model = rt.load_model(path);
        _in = rt.link_model(_model);
        const auto ins = _in->inputs();
        if (ins.size() != 1 || ins[0].type != ml::dtype::f32 || ins[0].shape.size() != 4 ||
            ins[0].shape[1] < 1 || ins[0].shape[1] > 3)
            throw usage_error("--model: expected one f32 [N, C<=3, H, W] image input, got " +
                              (ins.empty() ? std::string("none") : ml::shape_str(ins[0].shape)));
        _c = ins[0].shape[1];
        _h = ins[0].shape[2];
        _w = ins[0].shape[3];
        if (_in->batch() != batch) rt.configure_batch(*_in, batch);
        _batch = batch;
    }
    int64_t height() const { return _h; }
    int64_t width() const { return _w; }
    int64_t channels() const { return _c; }
    uint32_t batch() const { return _batch; }

    // Scores per image for up to batch() u8 HWC images; a short batch repeats its last image
    // in the spare slots (as the model IF pads), and those rows are dropped.
    std::vector<std::vector<float>> run(const std::vector<const std::vector<uint8_t>*>& images,
                                        const std::array<float, 3>& mean,
                                        const std::array<float, 3>& sd) {
        const int64_t plane = _h * _w;
        ml::bytes_t b(size_t(_batch * _c * plane) * sizeof(float));
        auto* x = reinterpret_cast<float*>(b.data());
        for (int64_t i = 0; i < _batch; ++i) {
            const std::vector<uint8_t>& img = *images[std::min<size_t>(size_t(i), images.size() - 1)];
            float* y = x + i * _c * plane;
            // The same arithmetic as the gather kernel and tests/model_if_test.cc:
            // (u8 - mean) * (1 / std), HWC to CHW.
            for (int64_t ch = 0; ch < _c; ++ch) {
                const float m = mean[size_t(ch)], inv = 1.0f / sd[size_t(ch)];
                for (int64_t p = 0; p < plane; ++p)
                    y[ch * plane + p] = (float(img[size_t(p * _c + ch)]) - m) * inv;
            }
        }
        std::vector<ml::tensor> ys;
        _runtime.infer_batch(*_in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {_batch, _c, _h, _w}, std::move(b))},
                             ys);
        if (ys.empty() || ys[0].type != ml::dtype::f32)
            throw usage_error("--model: expected an f32 score output (the model IF reads output 0 as f32)");
        const auto v = ys[0].view<float>();
        const size_t per = v.size() / size_t(_batch);
        std::vector<std::vector<float>> out;
        for (size_t i = 0; i < images.size(); ++i) out.emplace_back(v.begin() + i * per, v.begin() + (i + 1) * per);
        return out;
    }

private:
    ml::runtime& _runtime;
    std::shared_ptr<ml::model> _model;
    std::unique_ptr<ml::instance> _in;
    int64_t _c = 0, _h = 0, _w = 0;
    uint32_t _batch = 1;
};

std::string topk_json(std::span<const topk_entry> t) {
    std::string s = "[";
    for (size_t j = 0; j < t.size(); ++j) {
        s += (j ? ",[" : "[") + std::to_string(t[j].cls) + "," +
             (std::isnan(t[j].score) ? std::string("null") : reefline::reefverify::format_score(t[j].score)) + "]";
    }
    return s + "]";
}

std::string reference_json(const std::vector<float>& scores, size_t k) {
    const auto order = reefline::reefverify::reference_order(scores);
    std::vector<topk_entry> t;
    for (size_t j = 0; j < std::min(k, order.size()); ++j) t.push_back({order[j], scores[order[j]]});
    return topk_json(t);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefverify: check a model IF's answers (reefgen send --results) against libml"};
    std::string model, results, shape = "224x224x3", image, raw, mean_text, std_text;
    uint64_t seed = 1;
    double tolerance = 1e-4;
    uint32_t max_errors = 10, batch = 1;
    bool no_errors = false;
    app.add_option("--model", model, "The ONNX model the IF serves")->required();
    app.add_option("--results", results, "JSON lines written by reefgen send --results")->required();
    auto* shape_opt = app.add_option("--shape", shape, "Image shape HxWxC, as given to reefgen send")
                          ->capture_default_str();
    auto* image_opt = app.add_option("--image", image, "PPM/PGM image, as given to reefgen send --image");
    auto* raw_opt = app.add_option("--raw", raw, "File, as given to reefgen send --raw");
    image_opt->excludes(shape_opt)->excludes(raw_opt);
    app.add_option("--seed", seed, "Seed, as given to reefgen send")->capture_default_str();
    app.add_option("--mean", mean_text, "Per-channel mean R,G,B in u8 scale, as the IF is configured "
                                        "(default: ImageNet 123.675,116.28,103.53)");
    app.add_option("--std", std_text, "Per-channel std R,G,B in u8 scale, as the IF is configured "
                                      "(default: ImageNet 58.395,57.12,57.375)");
    app.add_option("--tolerance", tolerance, "Scores agree within tolerance * (1 + |reference|)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--max-errors", max_errors, "Detail lines for the first N mismatches")->capture_default_str();
    app.add_option("--batch", batch, "Reference runs batch this many distinct payloads")
        ->capture_default_str()
        ->check(CLI::Range(1u, 256u));
    app.add_flag("--no-errors", no_errors, "Fail on any error answer (default: count them apart)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    }

    try {
        std::array<float, 3> mean{123.675f, 116.28f, 103.53f}, sd{58.395f, 57.12f, 57.375f};
        if (!mean_text.empty()) mean = parse_triple(mean_text, "--mean");
        if (!std_text.empty()) sd = parse_triple(std_text, "--std");
        for (float s : sd)
            if (s == 0) throw usage_error("--std: must be non-zero");

        // The same payload options reefgen send resolves for an image run.
        gen::payload_options po;
        po.format = wire::format::image_u8_hwc;
        po.shape = gen::parse_shape(shape);
        po.image_file = image;
        po.raw_file = raw;
        po.seed = seed;
        const gen::payload_source source(po);
        const std::vector<answer_line> answers = read_results(results);

        // Distinct payloads that some response needs a reference for.
        std::vector<uint64_t> needed;
        for (const answer_line& a : answers)
            if (!a.error) needed.push_back(a.payload);
        std::sort(needed.begin(), needed.end());
        needed.erase(std::unique(needed.begin(), needed.end()), needed.end());

        std::map<uint64_t, std::vector<float>> reference;
        if (!needed.empty()) {
            auto device = reefline::gpu::make_cpu_device();
            ml::runtime rt(*device);
            reference_model ref(rt, model, uint32_t(std::min<size_t>(batch, needed.size())));
            const gen::request_payload probe = source.make(0);
            if (probe.dims[0] != ref.height() || probe.dims[1] != ref.width() || probe.dims[2] != ref.channels())
                throw usage_error("the payloads are " + std::to_string(probe.dims[0]) + "x" +
                                  std::to_string(probe.dims[1]) + "x" + std::to_string(probe.dims[2]) +
                                  " but the model takes " + std::to_string(ref.height()) + "x" +
                                  std::to_string(ref.width()) + "x" + std::to_string(ref.channels()) +
                                  " images: pass the --shape (or --image) given to reefgen send");
            for (size_t at = 0; at < needed.size(); at += ref.batch()) {
                const size_t n = std::min<size_t>(ref.batch(), needed.size() - at);
                std::vector<std::vector<uint8_t>> bytes;
                for (size_t i = 0; i < n; ++i) bytes.push_back(source.make(needed[at + i]).bytes);
                std::vector<const std::vector<uint8_t>*> images;
                for (const auto& b : bytes) images.push_back(&b);
                auto scores = ref.run(images, mean, sd);
                for (size_t i = 0; i < n; ++i) reference[needed[at + i]] = std::move(scores[i]);
            }
        }

        uint64_t verified = 0, mismatched = 0, errors = 0, shown = 0;
        std::map<int, uint64_t> errors_by_status;
        for (const answer_line& a : answers) {
            const std::string who = "id=" + std::to_string(a.id) + " payload=" + std::to_string(a.payload);
            if (a.error) {
                ++errors;
                ++errors_by_status[a.status];
                if (no_errors && shown < max_errors) {
                    ++shown;
                    std::cout << "error answer " << who << ": status "
                              << wire::to_string(static_cast<wire::status>(a.status)) << ": " << a.message << '\n';
                }
                continue;
            }
            std::string problem;
            if (a.status != 0)
                problem = "response with status " + std::to_string(a.status);
            else if (a.format != int(wire::format::result_topk))
                problem = "format " + std::to_string(a.format) + ", expected result_topk (" +
                          std::to_string(int(wire::format::result_topk)) + ")";
            else
                problem = reefline::reefverify::topk_problem(reference.at(a.payload), a.topk, tolerance);
            if (problem.empty()) {
                ++verified;
                continue;
            }
            ++mismatched;
            if (shown < max_errors) {
                ++shown;
                std::cout << "mismatch " << who << " (line " << a.line << "): " << problem << "\n  answered  "
                          << topk_json(a.topk) << "\n  reference "
                          << reference_json(reference.at(a.payload), std::max<size_t>(a.topk.size(), 1)) << '\n';
            }
        }
        if (shown == max_errors && mismatched + (no_errors ? errors : 0) > shown)
            std::cout << "... and " << (mismatched + (no_errors ? errors : 0) - shown) << " more\n";
        if (errors) {
            std::cout << "error answers by status:";
            for (const auto& [status, count] : errors_by_status)
                std::cout << ' ' << wire::to_string(static_cast<wire::status>(status)) << '=' << count;
            std::cout << (no_errors ? " (--no-errors: they fail the check)\n" : " (not counted as mismatches)\n");
        }
        if (answers.empty()) std::cout << "no answers in " << results << '\n';
        std::cout << "verified=" << verified << " mismatched=" << mismatched << " errors=" << errors << std::endl;
        const bool pass = mismatched == 0 && verified > 0 && !(no_errors && errors > 0);
        return pass ? 0 : 1;
    } catch (const usage_error& e) {
        std::cerr << "reefverify: " << e.what() << '\n';
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "reefverify: " << e.what() << '\n';
        return 2;
    }
}
