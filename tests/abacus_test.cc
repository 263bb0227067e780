// Abacus's group predictor (preempt/abacus.h): the features, training on a synthetic device
// whose group durations overlap (the MLP must learn what linear regression cannot), the
// file's round trip, and the file's refusals, each naming its problem.
#include "preempt/abacus.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ab = reefline::gpu::abacus;

namespace {

// Three models of 10, 20 and 40 launches whose launches take 100, 60 and 25 us at batch 1,
// 0.6 more per extra request (the profiles know each segment's time alone); segments running
// together overlap: the group takes the longest segment plus 40% of the others (a device two
// of them share well). Linear regression can weigh the parts' times, not take their maximum.
struct synthetic_device {
    uint32_t kernels[3] = {10, 20, 40};
    double per_launch_us[3] = {100, 60, 25};
    double segment_us(const ab::segment& s) const {
        return double(s.end - s.start) * per_launch_us[s.model] * (1 + 0.6 * double(s.batch - 1));
    }
    double group_us(const std::vector<ab::segment>& g) const {
        double sum = 0, top = 0;
        for (const auto& s : g) {
            const double t = segment_us(s);
            sum += t;
            top = std::max(top, t);
        }
        return top + 0.4 * (sum - top);
    }
    std::vector<ab::sample> sample(size_t n, uint64_t seed) const {
        std::mt19937_64 rng(seed);
        std::vector<ab::sample> out;
        for (size_t i = 0; i < n; ++i) {
            ab::sample s;
            const int parts = 1 + int(rng() % 3);
            std::vector<int> models = {0, 1, 2};
            std::shuffle(models.begin(), models.end(), rng);
            for (int p = 0; p < parts; ++p) {
                ab::segment seg;
                seg.model = models[size_t(p)];
                seg.kernels = kernels[seg.model];
                seg.start = uint32_t(rng() % seg.kernels);
                seg.end = seg.start + 1 + uint32_t(rng() % (seg.kernels - seg.start));
                seg.batch = 1u << (rng() % 4);
                seg.profile_us = segment_us(seg);  // what the kernel profiles say of it alone
                s.group.push_back(seg);
            }
            s.us = group_us(s.group);
            out.push_back(std::move(s));
        }
        return out;
    }
};

std::vector<ab::model_entry> models() {
    return {{"a", 0x1111222233334444ull, 8, 0}, {"b", 0xaaaabbbbccccddddull, 8, 0}, {"c", 0x0123456789abcdefull, 8, 0}};
}

const ab::predictor& trained() {
    static const ab::predictor p = [] {
        synthetic_device dev;
        const auto train = dev.sample(600, 1);
        return ab::predictor::train(models(), train, ab::fit_options{});
    }();
    return p;
}

std::string expect_refused(const std::string& text) {
    try {
        (void)ab::predictor::parse(text, "abacus.json");
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    ADD_FAILURE() << "accepted: " << text.substr(0, 200);
    return "";
}

}  // namespace

TEST(Abacus, ModelKeysAreTheDaemonsFileHash) {
    EXPECT_EQ(ab::model_key(""), 1469598103934665603ull);
    EXPECT_NE(ab::model_key("model a"), ab::model_key("model b"));
    EXPECT_EQ(ab::key_text(0x00ab), "00000000000000ab");
}

TEST(Abacus, TheMlpLearnsOverlapThatLinearRegressionCannot) {
    synthetic_device dev;
    const auto held_out = dev.sample(300, 2);
    const ab::predictor& p = trained();
    const ab::error_stats mlp = p.mlp_error(held_out), lin = p.linear_error(held_out);
    std::printf("[ abacus ] held-out groups %zu: MLP mean %.1f%% p95 %.1f%%, linear mean %.1f%% p95 %.1f%%\n", mlp.groups,
                mlp.mean_pct, mlp.p95_pct, lin.mean_pct, lin.p95_pct);
    EXPECT_EQ(mlp.groups, 300u);
    EXPECT_LT(mlp.mean_pct, 12.0);
    EXPECT_LT(mlp.mean_pct, 0.6 * lin.mean_pct) << "overlap is not additive: linear regression must do worse";
    // A longer segment of the same group is predicted longer (the policy's binary search
    // relies on it).
    std::vector<ab::segment> g = {{0, 0, 10, 10, 1, 0}, {1, 0, 2, 20, 1, 0}};
    g[0].profile_us = dev.segment_us(g[0]);
    double last = 0;
    for (uint32_t e = 2; e <= 20; e += 6) {
        g[1].end = e;
        g[1].profile_us = dev.segment_us(g[1]);
        const double us = p.predict_us(g);
        EXPECT_GT(us, last) << "end " << e;
        last = us;
    }
}

TEST(Abacus, OnlyGroupsOfItsOwnModelsArePredicted) {
    const ab::predictor& p = trained();
    EXPECT_EQ(p.index_of(0xaaaabbbbccccddddull), 1);
    EXPECT_EQ(p.index_of(42), -1);
    const std::vector<ab::segment> unknown = {{0, 0, 5, 10, 1, 0}, {-1, 0, 3, 7, 1, 0}};
    EXPECT_FALSE(p.covers(unknown));
    EXPECT_TRUE(std::isnan(p.predict_us(unknown)));
    EXPECT_TRUE(std::isnan(p.predict_linear_us(unknown)));
    const std::vector<ab::segment> out_of_range = {{3, 0, 5, 10, 1, 0}};
    EXPECT_FALSE(p.covers(out_of_range));
    EXPECT_FALSE(ab::predictor().covers(unknown));
}

TEST(Abacus, TheFileRoundTripsAndPredictsTheSame) {
    const ab::predictor& p = trained();
    const ab::predictor q = ab::predictor::parse(p.to_json(), "abacus.json");
    ASSERT_EQ(q.models().size(), 3u);
    EXPECT_EQ(q.models()[2].key, 0x0123456789abcdefull);
    EXPECT_EQ(q.models()[1].name, "b");
    synthetic_device dev;
    for (const auto& s : dev.sample(50, 3)) {
        EXPECT_NEAR(q.predict_us(s.group), p.predict_us(s.group), 1e-3 * p.predict_us(s.group));
        EXPECT_NEAR(q.predict_linear_us(s.group), p.predict_linear_us(s.group), 1e-3 * std::abs(p.predict_linear_us(s.group)) + 1e-3);
    }
}

TEST(Abacus, ACorruptFileIsRefusedNamingTheProblem) {
    const std::string good = trained().to_json();
    EXPECT_NE(expect_refused("{not json").find("not JSON"), std::string::npos);
    EXPECT_NE(expect_refused("[1,2]").find("not a JSON object"), std::string::npos);
    EXPECT_NE(expect_refused("{\"models\": []}").find("not an Abacus predictor file"), std::string::npos);

    nlohmann::json j = nlohmann::json::parse(good);
    auto refused_with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& words) {
        nlohmann::json bad = j;
        edit(bad);
        const std::string why = expect_refused(bad.dump());
        EXPECT_NE(why.find(words), std::string::npos) << why;
        EXPECT_EQ(why.rfind("abacus.json", 0), 0u) << "the message names the file: " << why;
    };
    refused_with([](auto& b) { b["models"] = nlohmann::json::array(); }, "\"models\" must be an array of 1 to 32");
    refused_with([](auto& b) { b["models"][0]["key"] = "xyz"; }, "\"key\" must be 16 hex digits");
    refused_with([](auto& b) { b["models"][1].erase("max_batch"); }, "model 1: \"max_batch\" missing");
    refused_with([](auto& b) { b["mlp"]["layers"][1]["w"].erase(0); }, "mlp layer 1: \"w\" has 1023 numbers, 1024 expected");
    refused_with([](auto& b) { b["mlp"]["layers"][0]["in"] = 14; }, "mlp layer 0: takes 14 inputs, the layer below gives 21");
    // Widths beyond int's range or not whole are refused as such, never converted (the fuzzer
    // found 4.3e96 converted to int: undefined behaviour).
    refused_with([](auto& b) { b["mlp"]["layers"][1]["in"] = 4.33333e96; }, "mlp layer 1: takes 4.33333e+96 inputs");
    refused_with([](auto& b) { b["mlp"]["layers"][0]["out"] = 4.33333e96; }, "\"out\" must be an integer 1..");
    refused_with([](auto& b) { b["mlp"]["layers"][0]["out"] = 2.5; }, "\"out\" must be an integer 1..");
    refused_with([](auto& b) { b["mlp"]["layers"][0]["out"] = -3e10; }, "\"out\" must be an integer 1..");
    refused_with([](auto& b) { b["mlp"]["layers"][2]["b"][3] = "x"; }, "\"b\"[3] is not a finite number");
    refused_with([](auto& b) { b["mlp"]["layers"].back()["out"] = 2; }, "the output layer must have 1 output");
    refused_with([](auto& b) { b["mlp"]["y_std"] = 0; }, "\"y_std\" must be positive");
    refused_with([](auto& b) { b["mlp"].erase("layers"); }, "\"layers\" must be an array");
    refused_with([](auto& b) { b["linear"].erase(0); }, "\"linear\" has 21 numbers, 22 expected");
    refused_with([](auto& b) { b["features_per_model"] = 4; }, "\"features_per_model\" must be 7");
    refused_with([](auto& b) { b["models"][0]["name"] = std::string("a\nb"); }, "\"name\" must be printable ASCII");
    refused_with([](auto& b) { b["mlp"]["layers"][0]["w"][5] = 3.5e39; }, "\"w\"[5] is not a finite number");
    // A weight of 1e400 is out of range for JSON numbers as doubles: not finite.
    std::string huge = good;
    const size_t at = huge.find("\"w\": [") + 7;
    huge.insert(at, "1e400, ");
    EXPECT_FALSE(expect_refused(huge).empty());
}

TEST(Abacus, TrainingRefusesWhatItCannotFit) {
    synthetic_device dev;
    const auto few = dev.sample(4, 9);
    EXPECT_THROW(ab::predictor::train(models(), few, {}), std::invalid_argument);
    EXPECT_THROW(ab::predictor::train({}, dev.sample(20, 9), {}), std::invalid_argument);
    auto foreign = dev.sample(20, 9);
    foreign[3].group[0].model = 7;
    EXPECT_THROW(ab::predictor::train(models(), foreign, {}), std::invalid_argument);
}
