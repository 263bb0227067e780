#include "ifmanager/share_tuner.h"

#include <algorithm>
#include <numeric>

namespace reefline::ifm {

uint32_t knee_units(const dkp::knee_curve& c) {
    double best = 0;
    for (const dkp::share_point& p : c.points)
        if (p.ms > 0) best = std::max(best, double(c.batch) / p.ms);
    for (const dkp::share_point& p : c.points)
        if (p.ms > 0 && double(c.batch) / p.ms >= knee_throughput_fraction * best) return p.units;
    return c.points.empty() ? 0 : c.points.back().units;
}

std::vector<uint32_t> knee_samples(uint32_t n, uint32_t points) {
    std::vector<uint32_t> out;
    if (n == 0) return out;
    points = std::clamp<uint32_t>(points, 2, n < 2 ? 2 : n);
    for (uint32_t i = 0; i < points; ++i) {
        const uint32_t u = n == 1 ? 1 : 1 + uint32_t(uint64_t(n - 1) * i / (points - 1));
        if (out.empty() || u > out.back()) out.push_back(u);
    }
    return out;
}

int share_step(const share_window& w) {
    if (w.seconds <= 0 || w.slo_ms <= 0) return 0;
    if (w.arrived == 0 && w.queued == 0) return -1;  // idle: give the units back
    const uint64_t done = w.answered + w.late;
    const double late_fraction = done ? double(w.late) / double(done) : 0;
    // Short: requests missed the SLO, a batch takes half of it on the device, or the lane never
    // rested (it cannot absorb more load) with requests left waiting.
    if (late_fraction > 0.01 || w.service_ms > 0.5 * w.slo_ms || (w.busy > 0.9 && w.queued > 0)) return +1;
    // Ample: nothing late, a batch takes under a quarter of the SLO and the lane is idle half
    // of the time.
    if (w.late == 0 && w.service_ms < 0.25 * w.slo_ms && w.busy < 0.5) return -1;
    return 0;
}

std::vector<uint32_t> max_min_fair(std::span<const uint32_t> demands, uint32_t capacity) {
    const size_t n = demands.size();
    std::vector<uint32_t> out(n, 1);
    if (n == 0) return out;
    if (capacity <= n) return out;
    std::vector<uint32_t> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = std::max<uint32_t>(1, demands[i]);
    // Water-filling: while some demand is unmet, raise every unmet one by an equal part of
    // what is left (at least one unit, in entry order), capped at its demand.
    std::vector<uint32_t> have(n, 0);
    uint32_t left = capacity;
    for (;;) {
        std::vector<size_t> open;
        for (size_t i = 0; i < n; ++i)
            if (have[i] < want[i]) open.push_back(i);
        if (open.empty() || left == 0) break;
        const uint32_t part = std::max<uint32_t>(1, left / uint32_t(open.size()));
        for (size_t i : open) {
            const uint32_t give = std::min({part, want[i] - have[i], left});
            have[i] += give;
            left -= give;
            if (left == 0) break;
        }
    }
    for (size_t i = 0; i < n; ++i) out[i] = std::max<uint32_t>(1, have[i]);
    return out;
}

}  // namespace reefline::ifm
