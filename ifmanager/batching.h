// Batching controllers for a model IF: how many queued requests to run as one batch, and
// whether to launch now or wait for more. One controller per IF, driven by the IF's serving
// thread (no locks; every call is O(max_batch) at most): dispatch_now() and target() before a
// launch, observe() after it.
//
//   slab   GSLICE's self-learning adaptive batching (Dhakal et al., "GSLICE: controlled spatial
//          sharing of GPUs for a scalable inference platform", SoCC'20): a per-size latency
//          table and a line t(b) = a + c*b fitted over it, learned online; the target is the
//          largest batch whose worst latency (the batch ahead of it plus its own: 2 t(b)) plus
//          k times the observed deviation fits the SLO, reached in one jump (at most doubling
//          per batch), never past the batch with the best measured throughput; a hysteresis
//          band keeps the batch while it still fits with a narrower margin, so that bursts of
//          host noise do not move it; a lasting change of device speed rescales the whole
//          table. A batch waits for more requests only within the headroom that leaves. While
//          full batches leave requests behind (a burst, a backlog) it sizes for throughput
//          instead: the batch with the best measured throughput that meets the SLO on its own.
//   aimd   Clipper's additive-increase / multiplicative-decrease (Crankshaw et al., "Clipper: a
//          low-latency online prediction serving system", NSDI'17): +1 after a full batch whose
//          processing latency was under the SLO, x0.9 after one over it; never waits.
//   fixed  one batch size; launches when it is full or when waiting longer would break the SLO.
//
// All three learn the same latency model (predict_ms), so that fixed can bound how long a
// batch waits, and so that switching policy at run time keeps what was learned.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace reefline::ifm {

enum class batching_policy : uint8_t { slab, aimd, fixed };

const char* batching_policy_name(batching_policy p);  // "slab" | "aimd" | "fixed"
bool parse_batching_policy(std::string_view s, batching_policy& out);

struct batching_options {
    batching_policy policy = batching_policy::slab;
    double slo_ms = 100;       // per-request latency objective: arrival in the IF queue -> answer
    uint32_t min_batch = 1;
    uint32_t max_batch = 16;
    uint32_t fixed_batch = 0;  // fixed policy; 0 = max_batch
};

class batch_controller {
public:
    // Options are checked: slo_ms > 0 and finite, 1 <= min_batch <= max_batch <= 65536,
    // fixed_batch 0 or within [min_batch, max_batch]; otherwise std::invalid_argument (and
    // configure() keeps the previous options).
    explicit batch_controller(const batching_options& o = {});
    // The rules above, alone: throws std::invalid_argument naming the field (and the field
    // it contradicts, with both values). What a control plane checks before applying options.
    static void check(const batching_options& o);
    // Runtime change (operator `set`): new policy, SLO or limits take effect at once (a tighter
    // SLO lowers target() before the next batch); the learned latency model is kept.
    void configure(const batching_options& o);
    const batching_options& options() const { return _options; }

    // Batch size to form now, in [min_batch, max_batch].
    uint32_t target() const { return _target; }
    // `queued` requests wait, the oldest since `oldest_wait_ms`: true = launch a batch of
    // min(queued, target()) now; false = wait for more (only while the headroom allows).
    bool dispatch_now(uint32_t queued, double oldest_wait_ms) const;
    // After a batch of `batch` requests ran: its service time (launch to results) and the worst
    // end-to-end latency of its requests (queue wait + service). Nonsense (batch 0, negative or
    // non-finite times) is ignored. Latency is steered by the service time: the rest of the
    // worst latency is queueing, which a smaller batch cannot cure; SLAB reads a long queue
    // wait as a backlog to drain (batching.cc).
    void observe(uint32_t batch, double service_ms, double worst_latency_ms);
    // Predicted service time for a batch of this size (learned online; 0 before observations):
    // the line fitted over the per-size table.
    double predict_ms(uint32_t batch) const;

    // The safety margin the controller keeps below the SLO now: k x the deviation of observed
    // service times from the model, at least a small fraction of the SLO.
    double margin_ms() const;
    // SLAB grows only to a batch that fits with this margin: k x the held (recent peak)
    // deviation; it keeps its batch while that fits with a narrower one (batching.cc).
    double grow_margin_ms() const;
    // Mean absolute deviation of service times from the model's prediction (EWMA).
    double deviation_ms() const { return _dev_ms; }
    // The learned linear model t(b) = intercept + slope * b (0, 0 before observations).
    double intercept_ms() const { return _a_ms; }
    double slope_ms() const { return _c_ms; }
    uint64_t batches() const { return _batches; }
    // The largest batch in [min_batch, max_batch] whose predicted worst latency plus the grow
    // margin fits the SLO (what SLAB steers to); min_batch when none does or nothing is
    // learned yet.
    uint32_t slo_batch() const;
    // The batch with the best predicted throughput (requests per ms) among those whose own
    // service time fits the SLO: SLAB's target while it drains a backlog (draining()).
    uint32_t throughput_batch() const;
    // SLAB only: requests are being left behind by full batches, so the target is sized for
    // throughput (up to throughput_batch()) until a batch is not full again.
    bool draining() const { return _draining; }

private:
    struct size_stats {
        double ewma_ms = 0;   // service time at this batch size
        uint32_t count = 0;
        uint64_t last = 0;    // _batches when last observed
    };
    void refit();
    uint32_t clamp(int64_t b) const;
    double expect_ms(uint32_t batch) const;
    void observe_slab(uint32_t batch, double service_ms, double worst_ms);
    void observe_aimd(uint32_t batch, double service_ms);

    batching_options _options;
    uint32_t _target = 1;
    std::vector<size_stats> _sizes;  // indexed by batch size
    uint64_t _batches = 0;
    double _a_ms = 0, _c_ms = 0;     // the fitted line
    double _dev_ms = 0;
    double _dev_hold_ms = 0;  // the deviation's recent peak (hysteresis)
    double _last_service_ms = 0;
    bool _draining = false;
    // A run of same-signed large residuals: the device got slower or faster as a whole.
    int _shift_run = 0;
    bool _shift_up = false;   // the run's sign: slower than predicted
    double _shift_ratio = 0;  // sum of observed / predicted over the run
    std::vector<double> _shift_base;  // the service times per size when the run began
    double _shift_a = 0, _shift_c = 0; // the line when the run began (sizes without entries)
    std::vector<std::pair<uint32_t, double>> _shift_samples;  // the run's (batch, service ms)
    // After a shift is taken up (as one ratio: the only reading one size allows), the window in
    // which it is learned as a mix of a slower device (a ratio) and a fixed cost per batch
    // (another IF's kernels ahead of every batch) from the sizes run since (learn_shift()).
    int _learn_left = 0;
    std::vector<double> _learn_base;  // the table before the shift
    double _learn_a = 0, _learn_c = 0;
    uint64_t _learn_at = 0;  // _batches when the shift was taken up
    std::vector<std::pair<uint32_t, double>> _learn_samples;
    double base_ms(uint32_t batch) const;
    void learn_shift(uint32_t batch, double service_ms);
};

}  // namespace reefline::ifm
