// An IF's statistics, declared once: the key `stats` reports each under, its C++ type, its
// Prometheus family, type and help, and how many stats units make one of the metric's (the
// switch times are microseconds in `stats`, seconds in Prometheus: 1e6). Model IFs fill an if_stats
// (model_if::stats), built-in IFs the subset their counters have (builtin_if_stat_keys);
// ifmanager/metrics.cc exports every entry of if_stat_infos. A new statistic is a line here and
// its value where the IF computes it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>

namespace reefline::ifm {

// X(key, C++ type, Prometheus family, Prometheus type, stats units per metric unit, help)
#define REEFLINE_IF_STATS(X)                                                                                          \
    X(requests_total, uint64_t, "reefline_if_requests_total", counter, 1, "Requests taken from the IF's queue.")      \
    X(responses_total, uint64_t, "reefline_if_responses_total", counter, 1, "Requests answered with a result.")      \
    X(errors_total, uint64_t, "reefline_if_errors_total", counter, 1,                                                \
      "Requests answered with an error datagram (bad format, size).")                                                \
    X(shed_total, uint64_t, "reefline_if_shed_total", counter, 1,                                                    \
      "Requests answered with status overloaded because they could no longer meet the SLO.")                         \
    X(deadline_exceeded_total, uint64_t, "reefline_if_deadline_exceeded_total", counter, 1,                          \
      "Requests answered with status deadline_exceeded: the abacus scheduler dropped their batch, which could no "   \
      "longer meet the SLO.")                                                                                        \
    X(slo_violations_total, uint64_t, "reefline_if_slo_violations_total", counter, 1,                                \
      "Requests answered with a result later than the SLO.")                                                         \
    X(send_failures_total, uint64_t, "reefline_if_send_failures_total", counter, 1,                                  \
      "Responses that could not be queued for transmission.")                                                        \
    X(queue_depth, uint64_t, "reefline_if_queue_depth", gauge, 1, "Requests waiting in the IF's queue.")             \
    X(in_flight, uint64_t, "reefline_if_in_flight", gauge, 1, "Requests being executed.")                            \
    X(batch_size, uint64_t, "reefline_if_batch_size", gauge, 1, "The batching controller's current target batch size.") \
    X(batches_total, uint64_t, "reefline_if_batches_total", counter, 1, "Batches executed.")                         \
    X(batched_requests_total, uint64_t, "reefline_if_batched_requests_total", counter, 1,                            \
      "Requests executed as part of a batch.")                                                                       \
    X(preemptions_total, uint64_t, "reefline_if_preemptions_total", counter, 1,                                      \
      "Times the IF's kernels were preempted by the scheduler.")                                                     \
    X(reexecuted_kernels_total, uint64_t, "reefline_if_reexecuted_kernels_total", counter, 1,                        \
      "Kernels executed again after a preemption.")                                                                  \
    X(settings_switches_total, uint64_t, "reefline_if_settings_switches_total", counter, 1,                          \
      "Operator `set`s applied to the IF (each switches it to a new instance or new settings).")                     \
    X(switch_us_last, double, "reefline_if_switch_last_seconds", gauge, 1e6,                                        \
      "How long the last `set` held the IF's requests while it switched.")                                           \
    X(switch_us_max, double, "reefline_if_switch_max_seconds", gauge, 1e6,                                          \
      "The longest time a `set` held the IF's requests while it switched.")

struct if_stats {
#define REEFLINE_IF_STAT_FIELD(key, ctype, family, type, per_unit, help) ctype key{};
    REEFLINE_IF_STATS(REEFLINE_IF_STAT_FIELD)
#undef REEFLINE_IF_STAT_FIELD

    // Every statistic under its key, added to `out`.
    void add_to(nlohmann::json& out) const {
#define REEFLINE_IF_STAT_JSON(key, ctype, family, type, per_unit, help) out[#key] = key;
        REEFLINE_IF_STATS(REEFLINE_IF_STAT_JSON)
#undef REEFLINE_IF_STAT_JSON
    }
};

struct if_stat_info {
    std::string_view key, family, type, help;
    double per_unit;  // stats value / per_unit = metric value
};

inline constexpr if_stat_info if_stat_infos[] = {
#define REEFLINE_IF_STAT_INFO(key, ctype, family, type, per_unit, help) {#key, family, #type, help, per_unit},
    REEFLINE_IF_STATS(REEFLINE_IF_STAT_INFO)
#undef REEFLINE_IF_STAT_INFO
};

// What a built-in IF (no model, no batching) reports: the data plane's IF counters and its queue.
inline constexpr std::string_view builtin_if_stat_keys[] = {"requests_total", "responses_total", "errors_total",
                                                            "send_failures_total", "queue_depth"};

}  // namespace reefline::ifm
