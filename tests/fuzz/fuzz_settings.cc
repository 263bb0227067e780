// libFuzzer target: the settings validator (ifm::check_settings, what the control plane runs
// on every add_model and set before anything is applied) against the layers that apply
// settings afterwards. Invariants: settings the validator accepts are accepted by every one
// of them (a batching controller configured with them, fresh or after other settings), so a
// contradiction is always refused where the message is checked and never surfaces later as an
// internal error; a refusal names the field it is about; an accepted controller's batch size
// lies within [min_batch, max_batch].
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "ifmanager/model_if.h"
#include "ifmanager/batching.h"
#include "tests/fuzz/fuzz_check.h"

namespace ifm = reefline::ifm;
namespace ml = reefline::ml;

namespace {

double pick_double(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return std::numeric_limits<double>::quiet_NaN();
    case 1: return std::numeric_limits<double>::infinity();
    case 2: return -in.ConsumeFloatingPointInRange<double>(0, 1e9);
    case 3: return 0;
    default: return in.ConsumeFloatingPointInRange<double>(0, 4e6);
    }
}

uint32_t pick_batch(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 300) : in.ConsumeIntegral<uint32_t>();
}

ifm::model_settings pick_settings(FuzzedDataProvider& in) {
    ifm::model_settings s;
    s.cls = in.ConsumeBool() ? reefline::gpu::task_class::rt : reefline::gpu::task_class::be;
    s.batching.policy = static_cast<ifm::batching_policy>(in.ConsumeIntegralInRange<int>(0, 3));
    s.batching.slo_ms = pick_double(in);
    s.batching.min_batch = pick_batch(in);
    s.batching.max_batch = pick_batch(in);
    s.batching.fixed_batch = pick_batch(in);
    s.priority = in.ConsumeIntegralInRange<int>(-2, 4);
    s.share = in.ConsumeBool() ? 1.0 : pick_double(in);
    s.share_auto = in.ConsumeBool();
    s.shed = in.ConsumeBool();
    s.tensor_output = in.ConsumeBool();
    return s;
}

bool accepted(const ifm::model_settings& s, std::string& why) {
    try {
        ifm::check_settings(s);
        return true;
    } catch (const std::invalid_argument& e) {
        why = e.what();
        return false;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const ifm::model_settings first = pick_settings(in), second = pick_settings(in);
    std::string why;
    const bool first_ok = accepted(first, why);
    if (!first_ok) {
        bool named = false;
        for (const char* f : {"slo_ms", "min_batch", "max_batch", "fixed_batch", "priority", "share", "policy"})
            named |= why.find(f) != std::string::npos;
        FUZZ_CHECK(named, "refusal names no field: %s", why.c_str());
        return 0;
    }
    try {
        ifm::batch_controller c(first.batching);
        FUZZ_CHECK(c.target() >= first.batching.min_batch && c.target() <= first.batching.max_batch,
                   "target %u outside [%u, %u]", c.target(), first.batching.min_batch, first.batching.max_batch);
        c.observe(c.target(), 3.0, 3.5);
        // A `set` of other accepted settings applies to a controller that has learned.
        if (accepted(second, why)) {
            c.configure(second.batching);
            FUZZ_CHECK(c.target() >= second.batching.min_batch && c.target() <= second.batching.max_batch,
                       "target %u outside [%u, %u] after configure", c.target(), second.batching.min_batch,
                       second.batching.max_batch);
        }
    } catch (const std::exception& e) {
        FUZZ_CHECK(false, "settings the validator accepted were refused when applied: %s", e.what());
    }
    return 0;
}
