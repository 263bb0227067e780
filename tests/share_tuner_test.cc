// GSLICE's self-tuning shares as pure functions: the knee of a measured curve, the unit counts
// a knee measurement samples, the tuner's step from one window, and max-min fair division.
#include <gtest/gtest.h>

#include "ifmanager/share_tuner.h"

using namespace reefline;
using ifm::max_min_fair;

namespace {

dkp::knee_curve curve(uint32_t batch, std::vector<std::pair<uint32_t, double>> points) {
    dkp::knee_curve k;
    k.batch = batch;
    k.device_units = points.empty() ? 0 : points.back().first;
    for (auto [u, ms] : points) k.points.push_back({u, ms});
    return k;
}

ifm::share_window window(double busy, double service_ms, uint64_t late = 0, uint32_t queued = 0) {
    ifm::share_window w;
    w.seconds = 1;
    w.arrived = 100;
    w.answered = 100 - late;
    w.late = late;
    w.service_ms = service_ms;
    w.busy = busy;
    w.queued = queued;
    w.slo_ms = 100;
    return w;
}

}  // namespace

TEST(share_tuner, knee_is_the_smallest_share_within_a_tenth_of_the_best_throughput) {
    // Linear up to 4 units, flat after: the knee is at 4 of 8.
    EXPECT_EQ(ifm::knee_units(curve(16, {{1, 80}, {2, 40}, {4, 20}, {6, 19.5}, {8, 19}})), 4u);
    // Perfect scaling to the whole device: no knee before it.
    EXPECT_EQ(ifm::knee_units(curve(16, {{1, 80}, {2, 40}, {4, 20}, {8, 10}})), 8u);
    // Nothing to gain from more units (a small model): one unit.
    EXPECT_EQ(ifm::knee_units(curve(1, {{1, 2.0}, {2, 1.95}, {4, 1.9}})), 1u);
    EXPECT_EQ(ifm::knee_units(dkp::knee_curve{}), 0u);
}

TEST(share_tuner, knee_samples_cover_one_unit_to_all) {
    EXPECT_EQ(ifm::knee_samples(1), (std::vector<uint32_t>{1}));
    EXPECT_EQ(ifm::knee_samples(2), (std::vector<uint32_t>{1, 2}));
    EXPECT_EQ(ifm::knee_samples(4), (std::vector<uint32_t>{1, 2, 3, 4}));
    const std::vector<uint32_t> h100 = ifm::knee_samples(132);
    EXPECT_EQ(h100.size(), 8u);
    EXPECT_EQ(h100.front(), 1u);
    EXPECT_EQ(h100.back(), 132u);
    EXPECT_TRUE(std::is_sorted(h100.begin(), h100.end()));
}

TEST(share_tuner, steps_up_when_short_down_when_ample_and_holds_between) {
    EXPECT_EQ(ifm::share_step(window(0.3, 20)), -1) << "idle lane, batches far below the SLO";
    EXPECT_EQ(ifm::share_step(window(0.3, 20, 5)), +1) << "late answers";
    EXPECT_EQ(ifm::share_step(window(0.5, 60)), +1) << "a batch takes most of the SLO";
    EXPECT_EQ(ifm::share_step(window(0.97, 20, 0, 30)), +1) << "a lane that never rests with requests waiting";
    EXPECT_EQ(ifm::share_step(window(0.97, 20, 0, 0)), 0) << "busy but keeping up";
    EXPECT_EQ(ifm::share_step(window(0.7, 20)), 0) << "neither short nor ample";
    EXPECT_EQ(ifm::share_step(window(0.3, 40)), 0);
    ifm::share_window idle = window(0, 0);
    idle.arrived = idle.answered = 0;
    EXPECT_EQ(ifm::share_step(idle), -1) << "no traffic: give the units back";
    idle.seconds = 0;
    EXPECT_EQ(ifm::share_step(idle), 0) << "no window yet";
}

TEST(share_tuner, max_min_fair_on_crafted_demands) {
    const auto fair = [](std::vector<uint32_t> d, uint32_t cap) { return max_min_fair(d, cap); };
    EXPECT_EQ(fair({2, 1}, 8), (std::vector<uint32_t>{2, 1})) << "demands that fit are met";
    EXPECT_EQ(fair({1, 7}, 4), (std::vector<uint32_t>{1, 3})) << "the small demand is met, the large one takes the rest";
    EXPECT_EQ(fair({6, 6}, 8), (std::vector<uint32_t>{4, 4})) << "equal demands split equally";
    EXPECT_EQ(fair({3, 3, 3}, 4), (std::vector<uint32_t>{2, 1, 1})) << "the odd unit goes to the first";
    EXPECT_EQ(fair({2, 10, 10}, 12), (std::vector<uint32_t>{2, 5, 5}));
    EXPECT_EQ(fair({5, 5, 5}, 2), (std::vector<uint32_t>{1, 1, 1})) << "over-committed: one unit each";
    EXPECT_EQ(fair({0, 4}, 4), (std::vector<uint32_t>{1, 3})) << "every IF keeps at least one unit";
    EXPECT_TRUE(fair({}, 4).empty());
    // Max-min: no allocation can raise the smallest without lowering one no larger.
    const std::vector<uint32_t> d = {1, 2, 9, 9, 30};
    const std::vector<uint32_t> got = fair(d, 32);
    uint32_t sum = 0;
    for (size_t i = 0; i < d.size(); ++i) {
        EXPECT_LE(got[i], d[i]);
        sum += got[i];
    }
    EXPECT_EQ(sum, 32u);
    EXPECT_EQ(got, (std::vector<uint32_t>{1, 2, 9, 9, 11}));
}
