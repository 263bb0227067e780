// reefverify: the top-k and tensor rules (ties, swaps, tolerance, dims, the sequence cut) and
// the tool end to end on the tiny ResNet-50 (images), DistilBERT (token sequences of mixed
// lengths) and sensor TCN (f32 tensors). The results files are produced the way a model IF
// produces its answers -- the payloads reefgen send would carry, read in place by libml's
// gather kernel at batch 4 (images normalised, tokens padded to the batch's longest bucket,
// short batches padded like the IF's), top-k encoded best first with ties to the lower class
// or the request's output slice as a tensor -- and written with reefgen's own --results
// writer, so the tool is checked against an answer path that is not its own host-side input
// building at batch 1.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "libml/libml.h"
#include "tests/tiny_zoo.h"
#include "tools/reefgen/payload.h"
#include "tools/reefgen/send.h"
#include "tools/reefverify/compare.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
using reefline::reefverify::tensor_answer_dims;
using reefline::reefverify::tensor_problem;
using reefline::reefverify::topk_entry;
using reefline::reefverify::topk_problem;

namespace {

// --- The rule --------------------------------------------------------------------------------

TEST(ReefverifyRule, ExactTopKPasses) {
    const std::vector<float> s{0.1f, 0.9f, 0.5f, 0.7f};
    const std::vector<topk_entry> a{{1, 0.9f}, {3, 0.7f}, {2, 0.5f}};
    EXPECT_EQ(topk_problem(s, a, 1e-4), "");
}

TEST(ReefverifyRule, TiesGoToTheLowerClassButNearTiesMaySwap) {
    const std::vector<float> s{0.5f, 0.5f, 0.50001f, 0.1f};
    // Reference order: 2, 0, 1. Classes 0, 1 and 2 are within 1e-4 of each other.
    EXPECT_EQ(topk_problem(s, std::vector<topk_entry>{{2, 0.50001f}, {0, 0.5f}}, 1e-4), "");
    EXPECT_EQ(topk_problem(s, std::vector<topk_entry>{{0, 0.5f}, {2, 0.50001f}}, 1e-4), "");
    // A near-tie at the k boundary: class 1 instead of class 0 in the last place.
    EXPECT_EQ(topk_problem(s, std::vector<topk_entry>{{2, 0.50001f}, {1, 0.5f}}, 1e-4), "");
    // With no tolerance the order must be exact.
    EXPECT_NE(topk_problem(s, std::vector<topk_entry>{{0, 0.5f}, {2, 0.50001f}}, 0), "");
}

TEST(ReefverifyRule, SwapsBeyondTheToleranceAndWrongScoresFail) {
    const std::vector<float> s{0.1f, 0.9f, 0.5f, 0.7f};
    const std::string swap = topk_problem(s, std::vector<topk_entry>{{3, 0.7f}, {1, 0.9f}}, 1e-4);
    EXPECT_NE(swap.find("position 0: class 3"), std::string::npos) << swap;
    const std::string score = topk_problem(s, std::vector<topk_entry>{{1, 0.9002f}}, 1e-4);
    EXPECT_NE(score.find("score"), std::string::npos) << score;
    EXPECT_EQ(topk_problem(s, std::vector<topk_entry>{{1, 0.90001f}}, 1e-4), "");
    EXPECT_NE(topk_problem(s, std::vector<topk_entry>{{1, 0.9f}, {1, 0.9f}}, 1e-4), "");
    EXPECT_NE(topk_problem(s, std::vector<topk_entry>{{4, 0.9f}}, 1e-4), "");
    EXPECT_NE(topk_problem(s, std::vector<topk_entry>{}, 1e-4), "");
    EXPECT_NE(topk_problem(s, std::vector<topk_entry>{{1, NAN}}, 1e-4), "");
    const std::vector<float> n{NAN, 0.2f};
    EXPECT_EQ(topk_problem(n, std::vector<topk_entry>{{1, 0.2f}, {0, NAN}}, 1e-4), "");
}

TEST(ReefverifyRule, TensorAnswersNeedTheDimsAndEveryValue) {
    const std::vector<int64_t> dims{2, 3};
    const std::vector<float> want{0.5f, -1, 2, 0, 1e-3f, -7};
    EXPECT_EQ(tensor_problem(dims, want, dims, want, 1e-4), "");
    // Within tolerance * (1 + |reference|): 1e-4 * 8 around -7.
    std::vector<float> got = want;
    got[5] = -7.0007f;
    EXPECT_EQ(tensor_problem(dims, want, dims, got, 1e-4), "");
    got[5] = -7.001f;
    got[1] = -1.01f;
    const std::string bad = tensor_problem(dims, want, dims, got, 1e-4);
    EXPECT_NE(bad.find("2 of 6 values differ; the first at [0, 1]: -1.01, reference -1"), std::string::npos) << bad;
    // Other dims, even with the same count of values, and a count the dims do not hold.
    const std::vector<int64_t> flat{6}, three{3, 2};
    EXPECT_NE(tensor_problem(dims, want, flat, want, 1e-4).find("dims 6, the reference has 2x3"), std::string::npos);
    EXPECT_NE(tensor_problem(dims, want, three, want, 1e-4), "");
    EXPECT_NE(tensor_problem(dims, want, dims, std::vector<float>(want.begin(), want.end() - 1), 1e-4)
                  .find("5 values for dims 2x3"),
              std::string::npos);
    // null (NaN here) stands for any non-finite value, and only matches one.
    const std::vector<float> inf{INFINITY, 1};
    const std::vector<int64_t> two{2};
    EXPECT_EQ(tensor_problem(two, inf, two, std::vector<float>{NAN, 1}, 1e-4), "");
    EXPECT_NE(tensor_problem(two, std::vector<float>{3, 1}, two, std::vector<float>{NAN, 1}, 1e-4), "");
    EXPECT_NE(tensor_problem(two, inf, two, std::vector<float>{1e30f, 1}, 1e-4), "");
}

TEST(ReefverifyRule, ASequenceOutputIsCutToTheRequestsTokens) {
    // [L, C] per request at length 32, 9 tokens: the L dim becomes 9.
    EXPECT_EQ(tensor_answer_dims(std::vector<int64_t>{32, 8}, true, 32, 9), (std::vector<int64_t>{9, 8}));
    // Not for a pooled output, an output whose dim 1 is not the length, or a non-sequence model.
    EXPECT_EQ(tensor_answer_dims(std::vector<int64_t>{8}, true, 32, 9), (std::vector<int64_t>{8}));
    EXPECT_EQ(tensor_answer_dims(std::vector<int64_t>{16, 8}, true, 32, 9), (std::vector<int64_t>{16, 8}));
    EXPECT_EQ(tensor_answer_dims(std::vector<int64_t>{32, 8}, false, 32, 9), (std::vector<int64_t>{32, 8}));
}

// --- The tool ----------------------------------------------------------------------------------

int run_tool(const std::string& args, std::string* output) {
    const std::string cmd = std::string(std::getenv("REEFVERIFY")) + " " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = ::pclose(p);
    *output = out;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string last_line(const std::string& out) {
    std::string s = out;
    while (!s.empty() && s.back() == '\n') s.pop_back();
    const size_t nl = s.rfind('\n');
    return nl == std::string::npos ? s : s.substr(nl + 1);
}

class reefverify_tool : public ::testing::Test {
protected:
    static constexpr uint64_t seed = 5;
    static constexpr uint32_t pool = 4;  // like reefgen send's payload pool, smaller
    static constexpr uint32_t requests = 7;
    static constexpr uint32_t top_k = 5;

    void SetUp() override {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (!zoo || !std::getenv("REEFVERIFY"))
            GTEST_SKIP() << "REEFLINE_ZOO and REEFVERIFY not set (run through meson test)";
        _dir = reefline::testing::write_tiny_zoo(zoo, "reefverify_test", "resnet50_tiny");
        ASSERT_FALSE(_dir.empty()) << "the zoo tool failed";
        _model = (_dir / "resnet50_tiny.onnx").string();
        make_answers();
    }
    void TearDown() override {
        std::error_code ec;
        if (!_dir.empty()) fs::remove_all(_dir, ec);
    }

    // Answers for `requests` requests over `pool` payloads, as a model IF computes them.
    void make_answers() {
        auto device = reefline::gpu::make_cpu_device();
        ml::runtime rt(*device);
        auto m = rt.load_model(_model);
        auto in = rt.link_model(m);
        const auto ins = in->inputs();
        ASSERT_EQ(ins.size(), 1u);
        _c = uint16_t(ins[0].shape[1]);
        _h = uint16_t(ins[0].shape[2]);
        _w = uint16_t(ins[0].shape[3]);
        _shape = std::to_string(_h) + "x" + std::to_string(_w) + "x" + std::to_string(_c);
        rt.configure_batch(*in, 4);
        gen::payload_options po;
        po.shape = gen::image_shape{_h, _w, _c};
        po.seed = seed;
        const gen::payload_source source(po);
        std::vector<std::vector<uint8_t>> images;
        for (uint32_t p = 0; p < pool; ++p) images.push_back(source.make(p).bytes);
        // Batch 4 with payload 3 twice: the last slot pads as an IF pads a short batch.
        std::vector<ml::kernels::gather_segment> segments;
        std::vector<uint32_t> first{0};
        for (uint32_t i = 0; i < 4; ++i) {
            const auto& img = images[std::min(i, pool - 1)];
            // Two segments per image, as reassembled fragments arrive.
            const uint32_t half = uint32_t(img.size() / 2);
            segments.push_back({img.data(), half, 0});
            segments.push_back({img.data() + half, uint32_t(img.size()) - half, half});
            first.push_back(uint32_t(segments.size()));
        }
        ml::runtime::request_batch b;
        b.segments = segments;
        b.first = first;
        const float mean[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
        for (int c = 0; c < 3; ++c) {
            b.mean[c] = mean[c];
            b.std[c] = sd[c];
        }
        std::vector<ml::tensor> ys;
        rt.infer_requests(*in, b, ys);
        const auto v = ys.at(0).view<float>();
        const size_t per = v.size() / 4;
        _classes = per;
        for (uint32_t p = 0; p < pool; ++p) _scores.emplace_back(v.begin() + p * per, v.begin() + (p + 1) * per);
        for (uint32_t i = 0; i < requests; ++i) {
            const std::vector<float>& s = _scores[i % pool];
            std::vector<uint32_t> order(per);
            std::iota(order.begin(), order.end(), 0u);
            std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return s[a] > s[b]; });
            gen::answer_record r;
            r.request = i;
            r.payload = i % pool;
            r.kind = uint8_t(wire::kind::response);
            r.format = uint8_t(wire::format::result_topk);
            r.latency_us = 100 + i;
            for (uint32_t j = 0; j < std::min<size_t>(top_k, per); ++j) {
                r.payload_bytes.resize(r.payload_bytes.size() + 8);
                uint8_t* at = r.payload_bytes.data() + r.payload_bytes.size() - 8;
                uint32_t bits;
                std::memcpy(&bits, &s[order[j]], 4);
                gen::store_be32(at, order[j]);
                gen::store_be32(at + 4, bits);
            }
            _answers.push_back(std::move(r));
        }
    }

    std::string write(const std::string& name, const std::vector<gen::answer_record>& records,
                      const std::string& extra = "") {
        const std::string path = (_dir / name).string();
        std::ofstream out(path);
        gen::write_results(out, records);
        out << extra;
        return path;
    }

    std::string args(const std::string& results) const {
        return "--model " + _model + " --results " + results + " --shape " + _shape + " --seed " +
               std::to_string(seed);
    }

    fs::path _dir;
    std::string _model, _shape;
    uint16_t _h = 0, _w = 0, _c = 0;
    size_t _classes = 0;
    std::vector<std::vector<float>> _scores;
    std::vector<gen::answer_record> _answers;
};

const std::string error_line =
    "{\"id\":7,\"payload\":3,\"kind\":\"error\",\"status\":3,\"format\":0,"
    "\"message\":\"overloaded: cannot answer within the 10 ms SLO\",\"latency_us\":50.0}\n";

TEST_F(reefverify_tool, CorrectAnswersVerifyAndErrorsAreCountedApart) {
    std::string out;
    const std::string good = write("good.jsonl", _answers, error_line);
    EXPECT_EQ(run_tool(args(good), &out), 0) << out;
    EXPECT_EQ(last_line(out), "verified=7 mismatched=0 errors=1") << out;
    EXPECT_NE(out.find("overloaded=1"), std::string::npos) << out;
    // Batched reference runs give the same verdict.
    EXPECT_EQ(run_tool(args(good) + " --batch 3", &out), 0) << out;
    EXPECT_EQ(last_line(out), "verified=7 mismatched=0 errors=1") << out;
    // --no-errors: the error answer fails the run, and is shown.
    EXPECT_EQ(run_tool(args(good) + " --no-errors", &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=7 mismatched=0 errors=1") << out;
    EXPECT_NE(out.find("error answer id=7 payload=3"), std::string::npos) << out;
    // Nothing verified is not a pass.
    const std::string only_errors = write("errors.jsonl", {}, error_line);
    EXPECT_EQ(run_tool(args(only_errors), &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=0 mismatched=0 errors=1") << out;
}

TEST_F(reefverify_tool, AWrongClassIsAMismatch) {
    ASSERT_GT(_classes, top_k);
    auto answers = _answers;
    // The lowest-ranked class in first place, with the right score for first place.
    const std::vector<float>& s = _scores[2];
    const uint32_t worst = uint32_t(std::min_element(s.begin(), s.end()) - s.begin());
    gen::store_be32(answers[2].payload_bytes.data(), worst);
    std::string out;
    EXPECT_EQ(run_tool(args(write("class.jsonl", answers)), &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=6 mismatched=1 errors=0") << out;
    EXPECT_NE(out.find("mismatch id=2 payload=2 (line 3): position 0: class " + std::to_string(worst)),
              std::string::npos)
        << out;
}

TEST_F(reefverify_tool, AWrongScoreIsAMismatch) {
    auto answers = _answers;
    // Request 5 (payload 1), third place: off by 1e-3 relative, ten times the tolerance.
    uint8_t* at = answers[5].payload_bytes.data() + 2 * 8 + 4;
    const uint32_t bits = gen::load_be32(at);
    float score;
    std::memcpy(&score, &bits, 4);
    score += 1e-3f * (1 + std::fabs(score));
    uint32_t wrong;
    std::memcpy(&wrong, &score, 4);
    gen::store_be32(at, wrong);
    std::string out;
    EXPECT_EQ(run_tool(args(write("score.jsonl", answers)), &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=6 mismatched=1 errors=0") << out;
    EXPECT_NE(out.find("mismatch id=5 payload=1 (line 6): position 2: class"), std::string::npos) << out;
    // A tolerance that admits the error passes.
    EXPECT_EQ(run_tool(args(write("score.jsonl", answers)) + " --tolerance 2e-3", &out), 0) << out;
}

TEST_F(reefverify_tool, ThePayloadsMustBeTheOnesSent) {
    std::string out;
    const std::string good = write("good.jsonl", _answers);
    // Another seed rebuilds other images: their scores differ from the answers.
    EXPECT_EQ(run_tool("--model " + _model + " --results " + good + " --shape " + _shape + " --seed 6", &out), 1)
        << out;
    EXPECT_NE(last_line(out).find("mismatched="), std::string::npos) << out;
    EXPECT_EQ(last_line(out).find("mismatched=0"), std::string::npos) << out;
    // A shape the model does not take is a usage error that says what to pass.
    EXPECT_EQ(run_tool("--model " + _model + " --results " + good + " --seed 5", &out), 2) << out;
    EXPECT_NE(out.find("--shape"), std::string::npos) << out;
}

TEST_F(reefverify_tool, BadInputsAreUsageErrors) {
    std::string out;
    EXPECT_EQ(run_tool(args((_dir / "missing.jsonl").string()), &out), 2) << out;
    EXPECT_NE(out.find("missing.jsonl"), std::string::npos) << out;
    EXPECT_EQ(run_tool(args(write("junk.jsonl", _answers, "{\"id\":1}\n")), &out), 2) << out;
    EXPECT_NE(out.find("junk.jsonl:8"), std::string::npos) << out;
    EXPECT_EQ(run_tool(args(write("good.jsonl", _answers)) + " --mean 1,2", &out), 2) << out;
    EXPECT_EQ(run_tool(args(write("good.jsonl", _answers)) + " --std 1,0,1", &out), 2) << out;
    // Options of another request format name what the model takes.
    EXPECT_EQ(run_tool(args(write("good.jsonl", _answers)) + " --tokens 8", &out), 2) << out;
    EXPECT_NE(out.find("--tokens is for sequence models: the model takes image_u8_hwc requests of " + _shape),
              std::string::npos)
        << out;
    EXPECT_EQ(run_tool(args(write("good.jsonl", _answers)) + " --dims 64,6", &out), 2) << out;
    EXPECT_EQ(run_tool("--model " + (_dir / "none.onnx").string() + " --results " + write("good.jsonl", _answers) +
                           " --shape " + _shape,
                       &out),
              2)
        << out;
}

// --- Token sequences and tensors ----------------------------------------------------------------

// A top-k answer as a model IF encodes it: the k best classes of `s`, ties to the lower class.
gen::answer_record topk_answer(uint32_t request, uint64_t payload, const std::vector<float>& s, uint32_t k) {
    std::vector<uint32_t> order(s.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return s[a] > s[b]; });
    gen::answer_record r;
    r.request = request;
    r.payload = payload;
    r.kind = uint8_t(wire::kind::response);
    r.format = uint8_t(wire::format::result_topk);
    r.dims[0] = uint16_t(std::min<size_t>(k, s.size()));
    for (uint32_t j = 0; j < r.dims[0]; ++j) {
        r.payload_bytes.resize(r.payload_bytes.size() + 8);
        uint8_t* at = r.payload_bytes.data() + r.payload_bytes.size() - 8;
        uint32_t bits;
        std::memcpy(&bits, &s[order[j]], 4);
        gen::store_be32(at, order[j]);
        gen::store_be32(at + 4, bits);
    }
    return r;
}

// A result_tensor_f32 answer: `v` as little-endian f32 with header dims `dims`.
gen::answer_record tensor_answer(uint32_t request, uint64_t payload, const std::vector<float>& v,
                                 const std::vector<uint16_t>& dims) {
    gen::answer_record r;
    r.request = request;
    r.payload = payload;
    r.kind = uint8_t(wire::kind::response);
    r.format = uint8_t(wire::format::result_tensor_f32);
    std::copy(dims.begin(), dims.end(), r.dims);
    r.payload_bytes.resize(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) gen::store_f32(r.payload_bytes.data() + i * 4, v[i]);
    return r;
}

gen::answer_record error_answer(uint32_t request, uint64_t payload, wire::status status, const std::string& message) {
    gen::answer_record r;
    r.request = request;
    r.payload = payload;
    r.kind = uint8_t(wire::kind::error);
    r.status = uint8_t(status);
    r.payload_bytes.assign(message.begin(), message.end());
    return r;
}

// The outputs a model IF computes for `payloads`: libml's request path (the gather kernel
// reading each payload in place from two segments, as reassembled fragments arrive), in
// batches of 4 whose spare slots repeat the last payload; a sequence batch runs at the
// longest bucket any of its requests needs, as the IF batches shorter requests with longer ones.
struct if_outputs {
    std::vector<std::vector<float>> rows;               // output 0's slice per payload
    std::vector<ml::kernels::token_error> token_errors;  // sequences: per payload
};

if_outputs run_like_an_if(const std::string& model, const std::vector<gen::request_payload>& payloads) {
    auto device = reefline::gpu::make_cpu_device();
    ml::runtime rt(*device);
    ml::import_options o;
    o.unbound_dim = ml::sequence_buckets[0];
    auto m = rt.load_model(model, o);
    const ml::request_input& ri = m->requests();
    const bool sequence = ri.kind == ml::request_kind::sequence;
    auto in = rt.link_model(m);
    constexpr uint32_t batch = 4;
    if (sequence)
        rt.configure_batch(*in, batch, ri.lengths);
    else
        rt.configure_batch(*in, batch);
    if_outputs out;
    for (size_t at = 0; at < payloads.size(); at += batch) {
        std::vector<ml::kernels::gather_segment> segments;
        std::vector<uint32_t> first{0};
        int64_t length = 0;
        for (uint32_t i = 0; i < batch; ++i) {
            const gen::request_payload& p = payloads[std::min(at + i, payloads.size() - 1)];
            const uint32_t half = uint32_t(p.bytes.size() / 8 * 4);
            segments.push_back({p.bytes.data(), half, 0});
            segments.push_back({p.bytes.data() + half, uint32_t(p.bytes.size()) - half, half});
            first.push_back(uint32_t(segments.size()));
            if (sequence) length = std::max(length, ri.bucket_for(p.dims[0]));
        }
        ml::runtime::request_batch b;
        b.segments = segments;
        b.first = first;
        b.length = length;
        std::vector<ml::tensor> ys;
        rt.infer_requests(*in, b, ys);
        const auto v = ys.at(0).view<float>();
        const size_t per = v.size() / batch;
        const std::vector<ml::kernels::token_error> errors =
            sequence ? rt.token_errors(*in) : std::vector<ml::kernels::token_error>{};
        for (size_t i = 0; i < batch && at + i < payloads.size(); ++i) {
            out.rows.emplace_back(v.begin() + i * per, v.begin() + (i + 1) * per);
            if (sequence) out.token_errors.push_back(errors.at(i));
        }
    }
    return out;
}

// Flips one f32 of an answer by 1e-3 relative, ten times the default tolerance: the score of
// top-k entry `index`, or tensor value `index`.
void tamper(gen::answer_record& r, size_t index) {
    if (r.format == uint8_t(wire::format::result_topk)) {
        uint8_t* at = r.payload_bytes.data() + index * 8 + 4;
        const uint32_t bits = gen::load_be32(at);
        float score;
        std::memcpy(&score, &bits, 4);
        score += 1e-3f * (1 + std::fabs(score));
        uint32_t wrong;
        std::memcpy(&wrong, &score, 4);
        gen::store_be32(at, wrong);
    } else {
        uint8_t* at = r.payload_bytes.data() + index * 4;
        const float v = gen::load_f32(at);
        gen::store_f32(at, v + 1e-3f * (1 + std::fabs(v)));
    }
}

// Shared by the sequence and tensor fixtures: a model of the tiny zoo, the payloads reefgen
// makes for `options`, and the IF's outputs for them.
class reefverify_requests : public ::testing::Test {
protected:
    static constexpr uint64_t seed = 11;
    static constexpr uint32_t pool = 6;
    static constexpr uint32_t requests = 10;

    void load(const std::string& stem, gen::payload_options po) {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (!zoo || !std::getenv("REEFVERIFY"))
            GTEST_SKIP() << "REEFLINE_ZOO and REEFVERIFY not set (run through meson test)";
        _dir = reefline::testing::write_tiny_zoo(zoo, "reefverify_" + stem, stem);
        ASSERT_FALSE(_dir.empty()) << "the zoo tool failed";
        _model = (_dir / (stem + ".onnx")).string();
        po.seed = seed;
        const gen::payload_source source(po);
        for (uint32_t p = 0; p < pool; ++p) _payloads.push_back(source.make(p));
        _out = run_like_an_if(_model, _payloads);
    }
    void TearDown() override {
        std::error_code ec;
        if (!_dir.empty()) fs::remove_all(_dir, ec);
    }
    std::string write(const std::string& name, const std::vector<gen::answer_record>& records) {
        const std::string path = (_dir / name).string();
        std::ofstream out(path);
        gen::write_results(out, records);
        return path;
    }
    std::string base(const std::string& results) const {
        return "--model " + _model + " --results " + results + " --seed " + std::to_string(seed);
    }

    fs::path _dir;
    std::string _model;
    std::vector<gen::request_payload> _payloads;
    if_outputs _out;
};

class reefverify_sequence : public reefverify_requests {
protected:
    void SetUp() override {
        gen::payload_options po;
        po.format = wire::format::tokens_i32;
        po.tokens = 8;
        po.tokens_max = 64;
        load("distilbert_tiny", po);
    }
    // Even requests answered with their top 3, odd ones with their logits as a tensor.
    std::vector<gen::answer_record> answers() const {
        std::vector<gen::answer_record> a;
        for (uint32_t i = 0; i < requests; ++i) {
            const std::vector<float>& s = _out.rows[i % pool];
            a.push_back(i % 2 == 0 ? topk_answer(i, i % pool, s, 3)
                                   : tensor_answer(i, i % pool, s, {uint16_t(s.size())}));
        }
        return a;
    }
};

TEST_F(reefverify_sequence, MixedLengthsVerifyAsTopKAndTensors) {
    // The pool spans several length buckets, and the IF's batches ran some requests padded
    // beyond their own bucket: reefverify's batch-1 runs at each request's bucket agree.
    std::set<int64_t> buckets;
    for (const auto& p : _payloads) {
        EXPECT_GE(p.dims[0], 8);
        EXPECT_LE(p.dims[0], 64);
        buckets.insert(p.dims[0] <= 16 ? 16 : p.dims[0] <= 32 ? 32 : 64);
    }
    EXPECT_GE(buckets.size(), 2u) << "the seed gives lengths of one bucket only";
    for (const auto& e : _out.token_errors) ASSERT_EQ(e.position, -1) << "the default vocabulary is valid";
    std::string out;
    const std::string good = write("good.jsonl", answers());
    EXPECT_EQ(run_tool(base(good) + " --tokens 8-64", &out), 0) << out;
    EXPECT_EQ(last_line(out), "verified=10 mismatched=0 errors=0") << out;
    // Another seed or another length range rebuilds other requests.
    EXPECT_EQ(run_tool("--model " + _model + " --results " + good + " --seed 12 --tokens 8-64", &out), 1) << out;
    EXPECT_EQ(last_line(out).find("mismatched=0"), std::string::npos) << out;
    EXPECT_EQ(run_tool(base(good) + " --tokens 8-63", &out), 1) << out;
    EXPECT_EQ(last_line(out).find("mismatched=0"), std::string::npos) << out;
}

TEST_F(reefverify_sequence, ATamperedScoreValueOrDimsIsAMismatch) {
    auto a = answers();
    tamper(a[2], 1);  // top-k: second place's score
    tamper(a[5], 7);  // tensor: the last logit
    std::string out;
    EXPECT_EQ(run_tool(base(write("tampered.jsonl", a)) + " --tokens 8-64", &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=8 mismatched=2 errors=0") << out;
    EXPECT_NE(out.find("mismatch id=2 payload=2 (line 3): position 1: class"), std::string::npos) << out;
    EXPECT_NE(out.find("mismatch id=5 payload=5 (line 6): 1 of 8 values differ; the first at [7]"), std::string::npos)
        << out;
    // The right values under other dims: [2, 4] instead of [8].
    a = answers();
    a[3] = tensor_answer(3, 3, _out.rows[3], {2, 4});
    EXPECT_EQ(run_tool(base(write("dims.jsonl", a)) + " --tokens 8-64", &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=9 mismatched=1 errors=0") << out;
    EXPECT_NE(out.find("dims 2x4, the reference has 8"), std::string::npos) << out;
}

TEST_F(reefverify_sequence, TokensOutsideTheVocabularyAreErrorsNotMismatches) {
    // Ids below 1100 where the model has 1024: some requests hold an id the IF must refuse.
    gen::payload_options po;
    po.format = wire::format::tokens_i32;
    po.tokens = 8;
    po.tokens_max = 64;
    po.vocab = 1100;
    po.seed = seed;
    const gen::payload_source source(po);
    std::vector<gen::request_payload> payloads;
    for (uint32_t p = 0; p < pool; ++p) payloads.push_back(source.make(p));
    const if_outputs out_of = run_like_an_if(_model, payloads);
    std::vector<gen::answer_record> a;
    uint32_t refused = 0, first_refused = pool, first_valid = pool;
    for (uint32_t i = 0; i < pool; ++i) {
        const ml::kernels::token_error& e = out_of.token_errors[i];
        if (e.position >= 0) {
            // The IF's refusal, word for word.
            a.push_back(error_answer(i, i, wire::status::bad_request,
                                     "token " + std::to_string(e.token) + " at position " + std::to_string(e.position) +
                                         " is outside the vocabulary [0, 1024)"));
            ++refused;
            first_refused = std::min(first_refused, i);
        } else {
            a.push_back(topk_answer(i, i, out_of.rows[i], 3));
            first_valid = std::min(first_valid, i);
        }
    }
    ASSERT_GT(refused, 0u) << "the seed draws no id outside the vocabulary";
    ASSERT_LT(first_valid, pool) << "the seed draws an id outside the vocabulary in every request";
    const std::string args = " --tokens 8-64 --vocab 1100";
    std::string out;
    EXPECT_EQ(run_tool(base(write("vocab.jsonl", a)) + args, &out), 0) << out;
    EXPECT_EQ(last_line(out), "verified=" + std::to_string(pool - refused) + " mismatched=0 errors=" +
                                  std::to_string(refused))
        << out;
    EXPECT_NE(out.find(std::to_string(refused) + " refused a token outside the vocabulary"), std::string::npos) << out;
    EXPECT_EQ(run_tool(base(write("vocab.jsonl", a)) + args + " --no-errors", &out), 1) << out;

    // A refusal that names a token the request does not have is a mismatch ...
    auto wrong = a;
    wrong[first_refused] = error_answer(first_refused, first_refused, wire::status::bad_request,
                                        "token 1050 at position 70 is outside the vocabulary [0, 1024)");
    EXPECT_EQ(run_tool(base(write("claim.jsonl", wrong)) + args, &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=" + std::to_string(pool - refused) + " mismatched=1 errors=" +
                                  std::to_string(refused - 1))
        << out;
    // ... and so is a result for a request the IF must refuse.
    wrong = a;
    wrong[first_refused] = topk_answer(first_refused, first_refused, out_of.rows[first_refused], 3);
    EXPECT_EQ(run_tool(base(write("result.jsonl", wrong)) + args, &out), 1) << out;
    EXPECT_NE(out.find("is outside the vocabulary [0, 1024): it must be refused"), std::string::npos) << out;
}

TEST_F(reefverify_sequence, OptionsForAnotherKindOfModelAreUsageErrors) {
    const std::string good = write("good.jsonl", answers());
    std::string out;
    EXPECT_EQ(run_tool(base(good), &out), 2) << out;
    EXPECT_NE(out.find("--tokens L or MIN-MAX is needed: the model takes tokens_i32 requests of 1..64 tokens"),
              std::string::npos)
        << out;
    EXPECT_EQ(run_tool(base(good) + " --tokens 8-64 --dims 64,6", &out), 2) << out;
    EXPECT_NE(out.find("--dims is for tensor models"), std::string::npos) << out;
    EXPECT_EQ(run_tool(base(good) + " --tokens 8-64 --shape 64x64x3", &out), 2) << out;
    EXPECT_EQ(run_tool(base(good) + " --tokens 65-80", &out), 2) << out;
    EXPECT_EQ(run_tool(base(good) + " --tokens 8-64 --format tensor", &out), 2) << out;
}

class reefverify_tensor : public reefverify_requests {
protected:
    void SetUp() override {
        gen::payload_options po;
        po.format = wire::format::tensor_f32;
        po.dims = {64, 6};
        load("sensor_tcn_tiny", po);
    }
    std::vector<gen::answer_record> answers() const {
        std::vector<gen::answer_record> a;
        for (uint32_t i = 0; i < requests; ++i) {
            const std::vector<float>& s = _out.rows[i % pool];
            a.push_back(i % 3 == 0 ? topk_answer(i, i % pool, s, 5)
                                   : tensor_answer(i, i % pool, s, {uint16_t(s.size())}));
        }
        return a;
    }
};

TEST_F(reefverify_tensor, SensorWindowsVerifyAndTamperingFails) {
    // The synthetic windows give the model distinct answers (a constant answer would verify
    // whatever payloads reefverify rebuilt).
    ASSERT_EQ(_out.rows[0].size(), 8u);
    EXPECT_NE(_out.rows[0], _out.rows[1]);
    std::string out;
    const std::string good = write("good.jsonl", answers());
    EXPECT_EQ(run_tool(base(good) + " --dims 64,6", &out), 0) << out;
    EXPECT_EQ(last_line(out), "verified=10 mismatched=0 errors=0") << out;
    EXPECT_EQ(run_tool(base(good) + " --format tensor --dims 64,6 --batch 4", &out), 0) << out;
    EXPECT_EQ(last_line(out), "verified=10 mismatched=0 errors=0") << out;
    EXPECT_EQ(run_tool("--model " + _model + " --results " + good + " --seed 12 --dims 64,6", &out), 1) << out;

    auto a = answers();
    tamper(a[4], 0);  // tensor: the first logit
    tamper(a[6], 2);  // top-k: third place's score
    EXPECT_EQ(run_tool(base(write("tampered.jsonl", a)) + " --dims 64,6", &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=8 mismatched=2 errors=0") << out;
    EXPECT_NE(out.find("mismatch id=4 payload=4 (line 5): 1 of 8 values differ; the first at [0]"), std::string::npos)
        << out;
    a = answers();
    a[1] = tensor_answer(1, 1, std::vector<float>(_out.rows[1].begin(), _out.rows[1].end() - 1), {7});
    EXPECT_EQ(run_tool(base(write("dims.jsonl", a)) + " --dims 64,6", &out), 1) << out;
    EXPECT_EQ(last_line(out), "verified=9 mismatched=1 errors=0") << out;
    EXPECT_NE(out.find("dims 7, the reference has 8"), std::string::npos) << out;
}

TEST_F(reefverify_tensor, WrongOrMissingDimsAreUsageErrors) {
    const std::string good = write("good.jsonl", answers());
    std::string out;
    EXPECT_EQ(run_tool(base(good) + " --dims 64,5", &out), 2) << out;
    EXPECT_NE(out.find("the model takes tensor_f32 requests of dims 64x6 (reefgen --dims 64,6)"), std::string::npos)
        << out;
    EXPECT_EQ(run_tool(base(good), &out), 2) << out;
    EXPECT_NE(out.find("--dims is needed"), std::string::npos) << out;
    EXPECT_EQ(run_tool(base(good) + " --dims 64,6 --tokens 8", &out), 2) << out;
    EXPECT_EQ(run_tool(base(good) + " --dims 64,6 --mean 1,2,3", &out), 2) << out;
}

}  // namespace
