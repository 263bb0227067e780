// libFuzzer target: the abacus predictor file (preempt/abacus.h), which the daemon reads from
// the model repository at start. Invariant: parse() returns a predictor or throws
// std::invalid_argument naming the problem, whatever the bytes; a predictor it returns
// predicts finite, positive durations (or NaN for groups it does not cover) without reading
// out of bounds, and writes a file that parses again to the same models.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "preempt/abacus.h"

namespace ab = reefline::gpu::abacus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    ab::predictor p;
    try {
        p = ab::predictor::parse(text, "abacus.json");
    } catch (const std::invalid_argument&) {
        return 0;
    }
    // Groups over the first models, one of them foreign.
    std::vector<ab::segment> group;
    for (int32_t m = 0; m < int32_t(p.models().size()) && m < 4; ++m)
        group.push_back({m, uint32_t(m), uint32_t(m + 3), 10, uint32_t(1 + m), uint32_t(8 * m), 100.0 * (m + 1)});
    for (const double us : {p.predict_us(group), p.predict_linear_us(group)})
        if (!group.empty() && !std::isnan(us) && !(us > 0 || std::isinf(us))) std::abort();
    group.push_back({-1, 0, 1, 1, 1, 0, 1});
    if (!std::isnan(p.predict_us(group))) std::abort();
    const ab::predictor q = ab::predictor::parse(p.to_json(), "round trip");
    if (q.models().size() != p.models().size()) std::abort();
    return 0;
}
