// reefverify: whether a top-k answer is what the model's scores say it should be. Header-only
// so that tests/reefverify_test.cc checks the rule itself as well as the tool around it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace reefline::reefverify {

struct topk_entry {
    uint32_t cls = 0;
    float score = 0;  // NaN when the results file has null (a non-finite score)
};

// |got - want| within tolerance relative to want's magnitude; two NaNs agree (a model that
// yields NaN yields it on both paths), a NaN and a number do not.
inline bool close(double got, double want, double tolerance) {
    if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <= tolerance * (1 + std::fabs(want));
}

// Class ids best first, ties by the lower id: the order the model IF answers in. NaN sorts
// last so that the comparison stays a strict weak order.
inline std::vector<uint32_t> reference_order(std::span<const float> scores) {
    std::vector<uint32_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0u);
    const auto key = [&](uint32_t c) {
        return std::isnan(scores[c]) ? -INFINITY : double(scores[c]);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
    return order;
}

inline std::string format_score(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.7g", v);
    return buf;
}

// Empty when `answer` is a correct top-k list for `scores` (one image's model output), else
// why not. Correct means: 1..scores.size() distinct valid classes; the j-th answered class
// has a reference score within tolerance of the j-th best reference score (so classes may
// trade places only where the reference itself cannot tell them apart, e.g. near-ties that
// batching or kernel order may flip); and every answered score is within tolerance of the
// reference score of its class.
inline std::string topk_problem(std::span<const float> scores, std::span<const topk_entry> answer,
                                double tolerance) {
    if (answer.empty()) return "empty top-k list";
    if (answer.size() > scores.size())
        return std::to_string(answer.size()) + " classes answered, the model has " +
               std::to_string(scores.size());
    std::vector<bool> seen(scores.size());
    for (size_t j = 0; j < answer.size(); ++j) {
        const uint32_t c = answer[j].cls;
        if (c >= scores.size())
            return "position " + std::to_string(j) + ": class " + std::to_string(c) +
                   " does not exist (the model has " + std::to_string(scores.size()) + ")";
        if (seen[c]) return "class " + std::to_string(c) + " answered twice";
        seen[c] = true;
    }
    const std::vector<uint32_t> order = reference_order(scores);
    for (size_t j = 0; j < answer.size(); ++j) {
        const uint32_t c = answer[j].cls, want = order[j];
        if (c != want && !close(scores[c], scores[want], tolerance))
            return "position " + std::to_string(j) + ": class " + std::to_string(c) +
                   " (reference score " + format_score(scores[c]) +
                   ") where the reference ranks class " + std::to_string(want) + " (" +
                   format_score(scores[want]) + ")";
    }
    for (size_t j = 0; j < answer.size(); ++j) {
        const uint32_t c = answer[j].cls;
        if (!close(answer[j].score, scores[c], tolerance))
            return "position " + std::to_string(j) + ": class " + std::to_string(c) + " score " +
                   format_score(answer[j].score) + ", reference " + format_score(scores[c]);
    }
    return {};
}

}  // namespace reefline::reefverify
