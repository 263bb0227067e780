// A model IF: serves one ONNX model on one UDP port, in the request format the model's inputs
// call for (libml/runtime/request_input.h): u8 HWC images, token sequences or f32 tensors.
//
// Complete requests come off the IF's ring as gather lists of packet payloads. Each request
// goes to one of two lanes: RT (the IF's class is rt, or the request comes from a source the
// operator named RT) or BE. A lane forms a batch when its batching controller (SLAB, AIMD or
// fixed; ifmanager/batching.h) says so and submits it to the GPU scheduler as one task of its
// class: the gather kernel reads the payloads in place into the input tensors, then the model
// runs. One batch per lane is in flight; the mbufs stay held until its task has ended (a
// preempted task re-runs the gather from the same payloads). When the task completes, each
// request is answered with its top-k classes or its output tensor; requests that can no
// longer meet the SLO are answered with status overloaded instead of being served late (when
// shedding is on), and bad requests get an error datagram that names the problem.
//
// Sequences: a batch runs at one planned length (bucket). It is the bucket of the oldest
// request waiting; the requests behind it whose buckets are no longer join it in arrival
// order (padded to its length), longer ones wait for a batch of their own, which comes next
// since they are then the oldest. Each bucket has its own batching controller: a batch of 16
// tokens and one of 512 have different latencies, so each learns its own latency model.
//
// Threads: poll() runs on the serving thread only. The control thread calls settings() /
// prepare() / commit() / update() / describe() / stats(); the scheduler thread only sets a
// lane's done flag.
#pragma once

#include <rte_ring.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dataplane/engine.h"
#include "dataplane/if_service.h"
#include "dataplane/response.h"
#include "dkp/profile.h"
#include "ifmanager/batching.h"
#include "libml/libml.h"
#include "preempt/scheduler.h"

namespace reefline::ifm {

// What an operator can change while the IF serves (`set`).
struct model_settings {
    gpu::task_class cls = gpu::task_class::be;
    batching_options batching;         // policy, SLO, batch limits
    int priority = 0;                      // prema: 0 low, 1 medium, 2 high
    std::vector<uint32_t> rt_sources_be;   // IPv4 sources whose requests are RT
    bool shed = true;                      // answer overloaded instead of serving late
    bool tensor_output = false;            // answer result_tensor_f32 (the output) instead of top-k
    // GSLICE's spatial share ("GPU%"): the fraction of the device's compute units the IF's BE
    // batches may run on, 0 < share <= 1; the IF manager places the shares on units
    // (set_units). RT batches run on every unit. With share_auto the IF manager tunes it
    // (GSLICE's self-tuning; `share` is then where the tuner starts and what it last chose).
    double share = 1;
    bool share_auto = false;
};

// Every rule on settings, cross-field ones included (min_batch <= fixed_batch <= max_batch):
// throws std::invalid_argument naming the fields. The
// control plane runs it on what a message asks before anything is applied (and answers
// bad_request with its words); model IFs run it again on what they are given.
void check_settings(const model_settings& s);

struct model_if_config {
    std::string name;
    std::string onnx;           // model file
    uint16_t udp_port = 0;
    uint16_t slot = 0;
    uint32_t top_k = 5;
    float mean[3] = {123.675f, 116.28f, 103.53f};  // ImageNet, u8 scale
    float std[3] = {58.395f, 57.12f, 57.375f};
    uint32_t ring_size = 1024;
    bool warm_up = true;        // run every configured batch size once before serving
    // The model file's content key (abacus::model_key): which of the abacus predictor's models
    // it is (0: none; profiles predict its groups).
    uint64_t model_key = 0;
    model_settings settings;
};

// Latency buckets (seconds) of the per-IF histogram: Prometheus-style, cumulative on export.
inline constexpr std::array<double, 16> latency_buckets_s = {
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60};

class model_if final : public dp::if_service {
public:
    // Serves `model` (loaded from config.onnx when null; a model shared with other IFs keeps
    // its weights once), derives its request format, plans the batch sizes the controller may
    // pick (at every length bucket, for sequences) and warms them up. Throws
    // std::invalid_argument (bad settings or a model no request format fits) or the loader's
    // error.
    model_if(dp::dataplane& plane, ml::runtime& runtime, gpu::scheduler& scheduler,
             const model_if_config& config, std::shared_ptr<ml::model> model = nullptr);
    // Waits for batches in flight, frees what is queued.
    ~model_if() override;

    dp::if_binding binding() const override { return {_config.name, _config.udp_port, _config.slot, _ring}; }
    uint32_t poll() override;
    uint32_t queued() const override;
    const dp::if_counters& counters() const override { return _counters; }
    const std::string& name() const override { return _config.name; }

    // True when nothing is queued, pending or in flight.
    bool idle() const { return queued() == 0 && _in_flight.load(std::memory_order_relaxed) == 0; }
    // Answers everything pending and still queued with status shutting_down (the daemon stops).
    void fail_pending();

    const model_if_config& config() const { return _config; }
    model_settings settings() const;

    // A settings change built on the side, as GSLICE's shadow IF: prepare() plans and warms
    // up the instances the new settings need (larger batch sizes, a lane not planned before)
    // while the IF keeps serving with the ones it has; profile(prepared) measures them, still
    // on the side; commit() switches over between two batches, holding the IF only to move the
    // new instances in and reconfigure the controllers (microseconds; `switch_us_*` in stats).
    // Instances are never replaced, only added: a batch in flight keeps running on its own.
    struct prepared_settings {
        model_settings settings;
        // A new version of the model (null: the same model): every planned batch size is
        // planned anew on it, and commit() retires the old instances once no batch runs on them.
        std::shared_ptr<ml::model> model;
        ml::request_input input;  // the new model's (the same requests as the old one's)
        std::string onnx;         // the new model's file, as the repository keeps it
        uint64_t model_key = 0;   // the new model's content key
        struct planned {
            int lane;  // 0 RT, 1 BE
            uint32_t batch;
            std::unique_ptr<ml::instance> instance;
        };
        std::vector<planned> instances;
        struct warm_up_sample {  // a warm-up run's time, for the lane's latency model
            int lane;
            size_t bucket;
            uint32_t batch;
            double ms;
        };
        std::vector<warm_up_sample> samples;
        nlohmann::json profile_summary;  // profile(prepared, ...); null when not profiled
        dkp::knee_curve knee;            // measure_knee(&prepared, ...); no points: unchanged
    };
    // Throws std::invalid_argument on bad values, or a `replacement` that does not take the
    // requests the IF takes (nothing changes then). Control thread only (one change at a time:
    // the daemon's operations are serialised).
    prepared_settings prepare(const model_settings& s, std::shared_ptr<ml::model> replacement = nullptr) const;
    void commit(prepared_settings&& p);
    // prepare() and commit() in one: the new settings apply at the next batch.
    void update(const model_settings& s) { commit(prepare(s)); }

    // The model it serves now (a replacement's once committed). Any thread.
    std::shared_ptr<ml::model> model() const {
        std::lock_guard<std::mutex> g(_model_mu);
        return _model;
    }

    // The compute units its BE batches run on from the next batch (bit u = unit u; 0: every
    // unit), as the IF manager places the shares.
    void set_units(uint64_t units) { _units.store(units, std::memory_order_relaxed); }
    uint64_t units() const { return _units.load(std::memory_order_relaxed); }

    // What the share tuner reads, as totals since the IF started (it takes differences).
    struct share_totals {
        uint64_t arrived = 0, answered = 0, late = 0;
        uint64_t be_batches = 0;
        uint64_t be_busy_ns = 0;  // BE batches on the device, launch to completion
        uint32_t queued = 0;
    };
    share_totals share_counters() const;

    // GSLICE's knee curve: one batch of the IF's largest batch size (its BE lane's; an RT
    // IF's RT lane's), timed alone on each of knee_samples(device_units) unit counts by
    // `run_on` (a task bound to that many units). With `p`, the largest of p's new instances
    // instead, only when it is larger than the batch of the knee the IF has (the result goes
    // into p.knee; commit() takes it). `stored` is reused when it describes the same plan. No
    // points when `budget_ms` runs out first, or device_units < 2. Call before the IF serves,
    // or with `p` (its instances serve nothing yet).
    using bound_runner = std::function<double(std::vector<gpu::task_launch>, uint64_t units)>;
    dkp::knee_curve measure_knee(prepared_settings* p, const dkp::knee_curve* stored, const bound_runner& run_on,
                                 uint32_t device_units, double budget_ms);
    void set_knee(dkp::knee_curve k);
    dkp::knee_curve knee() const;

    // What requests an imported graph takes (ml::derive_request_input) and, with tensor
    // output, that its first output can be answered as a tensor. Throws std::invalid_argument
    // naming the input or output and what would be accepted.
    static ml::request_input request_input(const ml::graph& g, const model_settings& s);
    // The lengths each instance is planned at: a sequence model's buckets, else none.
    static std::vector<int64_t> planned_lengths(const ml::request_input& r);
    // Imports a model file for serving: a symbolic sequence length starts at the first bucket.
    static ml::import_options import_options();
    // The batch sizes a lane plans for `max_batch`: the powers of two below it, and it.
    static std::vector<int64_t> batch_sizes(uint32_t max_batch);
    // The instances a new IF with these settings plans: per lane, its batch sizes (a lane's
    // instances share one arena).
    static std::vector<std::vector<int64_t>> initial_instances(const model_settings& s);
    // The instances update(s) would add to those planned now, per lane (they share a new arena
    // per lane); with `all`, every instance the settings plan (what a replacement model needs).
    std::vector<std::vector<int64_t>> instances_to_plan(const model_settings& s, bool all = false) const;
    // Gather segments per request the data plane can hand over (its fragments per request).
    static constexpr int64_t segments_per_request = wire::max_fragments;
    // Memory the IF's instances hold now (arenas, inputs, gather lists; not the weights).
    int64_t memory_bytes() const;
    const ml::request_input& input() const { return _input; }

    nlohmann::json describe() const;
    nlohmann::json stats() const;

    // Kernel profiles (kprof) of every planned plan: taken from `stored` (the repository's,
    // when its device and plans match) or measured with `run_alone` (the daemon: BE tasks
    // through the scheduler) while `budget_ms` lasts; the rest stays unprofiled (never padded
    // nor padded with). Every profile in use is put into `out` (what the repository keeps).
    // Returns the summary describe() shows. Call before the IF serves, or under load: it holds
    // the IF's lock (serving skips the IF meanwhile).
    nlohmann::json profile(const dkp::model_profile* stored, const ml::runtime::launch_runner& run_alone,
                           double budget_ms, dkp::model_profile& out);
    // The same for a prepared change's new instances only, without holding the IF (nothing
    // serves them yet); commit() adds the summary to the IF's.
    nlohmann::json profile(prepared_settings& p, const dkp::model_profile* stored,
                           const ml::runtime::launch_runner& run_alone, double budget_ms, dkp::model_profile& out);

private:
    struct lane;
    void intake(uint32_t& work);
    // Whether the IF can serve request r; if not, the status and message of its error answer.
    bool acceptable(const dp::request& r, wire::status& status, std::string& why) const;
    // The index of r's length bucket in _input.lengths (0 for images and tensors).
    size_t bucket_of(const dp::request& r) const;
    void dispatch(lane& l);
    // The answer of request i of a completed batch: top-k or its slice of the output tensor.
    void answer(lane& l, uint32_t i, const std::shared_ptr<const std::vector<ml::tensor>>& outputs);
    void complete(lane& l);
    void shed_late(lane& l, uint64_t now);
    void plan_sizes(lane& l, uint32_t max_batch);
    // One instance of batch size b for a lane of class cls, warmed up when the config says so
    // (directly on the device before the IF serves, as BE tasks through the scheduler while
    // it does); the warm-up runs' times go to `warm_ms` as (length bucket, ms). Its plans use
    // `arena`, which the lane's other instances planned in the same round share.
    std::unique_ptr<ml::instance> plan_instance(const std::shared_ptr<ml::model>& model, const ml::request_input& input,
                                                gpu::task_class cls, uint32_t b, bool through_scheduler,
                                                std::vector<std::pair<size_t, double>>& warm_ms,
                                                const std::shared_ptr<ml::shared_arena>& arena) const;
    // Profiles `instances` (kprof; see profile()) and returns the summary.
    nlohmann::json profile_instances(const std::vector<ml::instance*>& instances, const dkp::model_profile* stored,
                                     const ml::runtime::launch_runner& run_alone, double budget_ms,
                                     dkp::model_profile& out);
    // Whether update(s) plans lane i (the RT lane is 0).
    bool lane_planned_by(const model_settings& s, int i) const;
    // What an answer counts once it has gone out (response_queue's tag).
    enum answer_tag : uint32_t { result_answer = 1, error_answer = 2, counted_as_error = 4 };
    // An error answer; `counted`: it counts in errors_total (shed and deadline_exceeded
    // answers have counters of their own).
    void answer_error(const dp::request& r, wire::status status, const std::string& message, bool counted = true);
    void send(std::span<const uint8_t> result, const dp::request& r, const dp::response_spec& spec, uint32_t tag,
              std::shared_ptr<const void> owner = nullptr);
    void answer_done(uint32_t tag, bool sent);
    void record_latency(double seconds);

    dp::dataplane& _plane;
    ml::runtime& _runtime;
    gpu::scheduler& _scheduler;
    model_if_config _config;
    // The model and its request format: replaced by commit() under _mu (and _model_mu, for
    // model() on other threads); the serving and control threads read them under _mu or as
    // the only writer.
    std::shared_ptr<ml::model> _model;
    mutable std::mutex _model_mu;
    rte_ring* _ring = nullptr;
    ml::request_input _input;
    uint64_t _tsc_hz = 1;
    nlohmann::json _profile_summary;   // the last profile() (guarded by _mu)
    dkp::knee_curve _knee;             // guarded by _mu

    // Settings and lanes' instances: written by commit() under _mu; the serving thread holds
    // _mu while it polls (try_lock: a commit or a whole-IF profile() skips this IF for a round
    // instead of stalling the others).
    mutable std::mutex _mu;
    std::unique_ptr<lane> _lanes[2];  // [0] RT, [1] BE
    // A replaced model's instances a batch still ran on when commit() gave up waiting.
    std::vector<std::unique_ptr<ml::instance>> _retired;

    dp::if_counters _counters;
    // Statistics beyond the data plane's IF counters; single writer (the serving thread).
    dp::counter _responses, _errors, _shed, _slo_violations, _batches, _batched_requests,
        _preemptions, _reexecuted, _deadline_exceeded;
    // The abacus predictor's index of the model (-1: none or another policy), read by dispatch
    // on the serving thread, set when the model is (re)placed.
    std::atomic<int32_t> _predictor_model{-1};
    int32_t predictor_model_of(uint64_t key) const;
    std::array<dp::counter, latency_buckets_s.size() + 1> _latency_hist;  // last: +Inf
    std::atomic<uint64_t> _latency_sum_ns{0};
    std::atomic<uint64_t> _latency_max_ns{0};  // exact, unlike the percentiles
    std::atomic<uint64_t> _be_busy_ns{0}, _be_batches{0};
    // commit(): how many switch-overs and how long the IF was held for each (ns).
    std::atomic<uint64_t> _switches{0}, _switch_ns_last{0}, _switch_ns_max{0};
    std::atomic<uint64_t> _units{0};  // set_units()
    std::atomic<uint32_t> _in_flight{0};
    std::atomic<uint32_t> _pending{0};
    // Answers waiting for transmit buffers (under _mu; last: its destructor reports what it
    // still holds to the counters above).
    dp::response_queue _answers;
};

}  // namespace reefline::ifm
