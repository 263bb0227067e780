// reefverify: the top-k rule (ties, swaps, tolerance) and the tool end to end on the tiny
// ResNet-50. The results files are produced the way a model IF produces its answers -- the
// payloads reefgen send would carry, normalised by libml's gather kernel at batch 4 (padded
// like the IF's batches), top-k encoded best first with ties to the lower class -- and
// written with reefgen's own --results writer, so the tool is checked against an answer path
// that is not its own host-side normalisation at batch 1.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
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
        ml::runtime::image_batch b;
        b.segments = segments;
        b.first = first;
        const float mean[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
        for (int c = 0; c < 3; ++c) {
            b.mean[c] = mean[c];
            b.std[c] = sd[c];
        }
        std::vector<ml::tensor> ys;
        rt.infer_images(*in, b, ys);
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
    EXPECT_EQ(run_tool("--model " + (_dir / "none.onnx").string() + " --results " + write("good.jsonl", _answers) +
                           " --shape " + _shape,
                       &out),
              2)
        << out;
}

}  // namespace
