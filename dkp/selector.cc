#include "dkp/selector.h"

#include <algorithm>

namespace reefline::dkp {

uint32_t rules_selector::units_of(const gpu::task_launch& rt, uint32_t units) {
    // An RT kernel holds ceil(grid / occupancy) units at once (every unit when it has more).
    const uint32_t occ = std::max<uint32_t>(1, rt.occupancy);
    const uint32_t need = (std::max<uint32_t>(1, rt.grid) + occ - 1) / occ;
    return std::min(need, units);
}

double rules_selector::time_on(const gpu::task_launch& be, uint32_t units_given, uint32_t units) {
    const uint64_t occ = std::max<uint32_t>(1, be.occupancy);
    const uint64_t grid = std::max<uint32_t>(1, be.grid);
    const auto waves = [&](uint64_t u) { return (grid + u * occ - 1) / (u * occ); };
    return double(be.est_us) * double(waves(std::max<uint32_t>(1, units_given))) / double(waves(std::max<uint32_t>(1, units)));
}

uint32_t rules_selector::select(const gpu::task_launch& rt, uint32_t units, const gpu::pad_candidate* candidates, uint32_t n,
                                uint32_t* out, uint32_t max) {
    if (!(rt.est_us > 0) || units == 0) return 0;
    uint32_t left = units - units_of(rt, units);
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && left > 0 && chosen < max; ++i) {
        const gpu::task_launch& be = *candidates[i].kernel;
        if (!(be.est_us > 0)) continue;
        if (be.occupancy < rt.occupancy) continue;                // rule 2
        const uint32_t given = std::min(left, units_of(be, units));
        if (time_on(be, given, units) > _margin * double(rt.est_us)) continue;  // rule 1
        out[chosen++] = i;
        left -= given;
    }
    return chosen;
}

}  // namespace reefline::dkp
