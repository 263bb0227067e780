// reefverify: whether a top-k or tensor answer is what the model's output says it should be.
// Header-only so that tests/reefverify_test.cc checks the rules themselves as well as the tool
// around them.
#pragma once

#include <algorithm>
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

// The dims of a request's tensor answer, from `item`, the shape of its slice of output 0 (the
// batch dim removed), as a model IF answers: a sequence model's [N, L, ...] output, run at
// `length` tokens, is cut to the request's own `tokens` positions (the rest is padding); any
// other output is answered whole.
inline std::vector<int64_t> tensor_answer_dims(std::span<const int64_t> item, bool sequence, int64_t length,
                                               int64_t tokens) {
    std::vector<int64_t> dims(item.begin(), item.end());
    if (sequence && dims.size() >= 2 && dims[0] == length) dims[0] = tokens;
    return dims;
}

inline std::string dims_text(std::span<const int64_t> dims) {
    std::string s;
    for (size_t d = 0; d < dims.size(); ++d) s += (d ? "x" : "") + std::to_string(dims[d]);
    return s.empty() ? "(none)" : s;
}

// Empty when `got` with dims `got_dims` is the tensor answer for the reference `want` (row-major,
// dims `want_dims`), else why not. Correct means: the same dims, as many values as they hold,
// and every value within tolerance * (1 + |reference|). A null in the results file (NaN here:
// the writer's mark for any non-finite value) agrees with a non-finite reference value only.
inline std::string tensor_problem(std::span<const int64_t> want_dims, std::span<const float> want,
                                  std::span<const int64_t> got_dims, std::span<const float> got, double tolerance) {
    if (!std::equal(want_dims.begin(), want_dims.end(), got_dims.begin(), got_dims.end()))
        return "dims " + dims_text(got_dims) + ", the reference has " + dims_text(want_dims);
    if (got.size() != want.size())
        return std::to_string(got.size()) + " values for dims " + dims_text(got_dims) + ", which hold " +
               std::to_string(want.size());
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const bool ok = std::isnan(got[i]) ? !std::isfinite(want[i]) : close(got[i], want[i], tolerance);
        if (!ok && wrong++ == 0) first = i;
    }
    if (wrong == 0) return {};
    // The first wrong value's index in every dim, e.g. [12, 3].
    std::string at;
    size_t rest = first;
    for (size_t d = want_dims.size(); d-- > 0;) {
        const size_t extent = size_t(std::max<int64_t>(want_dims[d], 1));
        at = std::to_string(rest % extent) + (at.empty() ? "" : ", ") + at;
        rest /= extent;
    }
    return std::to_string(wrong) + " of " + std::to_string(got.size()) + " values differ; the first at [" + at +
           "]: " + (std::isnan(got[first]) ? std::string("null") : format_score(got[first])) + ", reference " +
           format_score(want[first]);
}

}  // namespace reefline::reefverify
