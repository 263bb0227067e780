// Abacus (Cui et al., "Enable simultaneous DNN services based on deterministic operator
// overlap and precise latency prediction", SC'21): the pieces of the scheduler's `abacus`
// policy that are pure functions of numbers, so that the policy, the training tool and the
// tests share them.
//
// A query runs in segments: a segment is a range of its task's launches [start, end). An
// operator group is the segments of several queries run together; its duration depends on
// which models overlap, where in each model the segments lie, and their batch sizes and
// sequence lengths (Abacus Fig. 8). The predictor maps those features to the group's duration:
// a small MLP (3 hidden layers of 32, ReLU, as Abacus) trained offline on groups sampled on
// this device (tools/abacus_train), with linear regression on the same features as the
// baseline it is compared with. Both live in one JSON file next to the models (the
// repository's abacus.json), keyed by the models' content hashes, so that a predictor is used
// only for the models it was trained on.
//
// Features: for each model of the predictor's set, in its order, seven numbers summed over the
// group's segments of that model: the number of segments, start / kernels, end / kernels, the
// segment's share of the model (end - start) / kernels, batch / max_batch, length / max_length
// (0 without a sequence length), and the segment's profiled time in ms (its launches alone,
// from the kernel profiles the daemon keeps anyway). Abacus's features are the first ones; the
// share and the profiled time spell out what the duration mostly follows, so that a few
// hundred sampled groups suffice where the operators of a model differ a hundredfold in cost
// (Abacus sampled tens of thousands). The MLP's target is the log of the group's duration over
// its parts' profiled times back to back, standardised: it learns how the parts overlap (1 on
// a device that runs them in turn, less where they share it well) and what the device adds
// per launch; a prediction is the profiled time times exp of the output.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace reefline::gpu::abacus {

// The content key of a model file (FNV-1a over its bytes), as the daemon computes it when it
// reads a model, and as the predictor file names the models it was trained on.
uint64_t model_key(std::string_view bytes);
std::string key_text(uint64_t key);  // 16 lowercase hex digits

struct segment {
    int32_t model = -1;     // index into the predictor's models; -1: not one of them
    uint32_t start = 0;     // first launch of the segment
    uint32_t end = 0;       // one past its last launch
    uint32_t kernels = 1;   // launches of the whole task
    uint32_t batch = 1;
    uint32_t length = 0;    // sequence length (0: not a sequence model)
    double profile_us = 0;  // the segment's launches' profiled times alone, summed (kprof; 0: none)
};

struct model_entry {
    std::string name;       // for people (the zoo's or the repository's name)
    uint64_t key = 0;       // model_key of its file
    uint32_t max_batch = 1;
    uint32_t max_length = 0;
};

inline constexpr int features_per_model = 7;

// One measured group: its segments and how long it took, in us.
struct sample {
    std::vector<segment> group;
    double us = 0;
};

struct fit_options {
    int hidden_layers = 3;
    int hidden = 32;
    int epochs = 3000;
    double learning_rate = 1e-2;
    double weight_decay = 1e-4;
    uint64_t seed = 1;
};

// Mean and 95th percentile of |predicted - measured| / measured, in percent.
struct error_stats {
    double mean_pct = 0, p95_pct = 0;
    size_t groups = 0;
};

class predictor {
public:
    predictor() = default;

    // The models it covers, their features' scales, and both fits. A file that does not
    // parse, has the wrong shape, or holds a non-finite number is refused with
    // std::invalid_argument naming what and where (`where`: the file, for the message).
    static predictor parse(const std::string& json, const std::string& where);
    std::string to_json() const;

    // Trains both fits on `samples` (every segment's model must be in `models`).
    static predictor train(std::vector<model_entry> models, std::span<const sample> samples, const fit_options& o);

    const std::vector<model_entry>& models() const { return _models; }
    // The index of the model with this key, or -1.
    int32_t index_of(uint64_t key) const;
    bool empty() const { return _models.empty(); }
    // True when every segment's model is one of this predictor's.
    bool covers(std::span<const segment> group) const;

    // The group's predicted duration in us, by the MLP or by the linear fit. Only for groups it
    // covers (others: NaN). Allocation-free; microseconds.
    double predict_us(std::span<const segment> group) const;
    double predict_linear_us(std::span<const segment> group) const;

    // Errors of both fits on measured groups (e.g. held out from training).
    error_stats mlp_error(std::span<const sample> samples) const;
    error_stats linear_error(std::span<const sample> samples) const;

    // What training recorded about the held-out groups (written to the file, shown by tools).
    std::string device;          // device_caps::name the samples were measured on
    error_stats held_out_mlp, held_out_linear;

    int inputs() const { return int(_models.size()) * features_per_model; }

private:
    struct layer {
        int in = 0, out = 0;
        std::vector<float> w;  // out x in, row-major
        std::vector<float> b;  // out
    };
    void features(std::span<const segment> group, float* x) const;
    double mlp_raw(const float* x) const;  // standardised log(duration / profile_base_us)
    static double profile_base_us(std::span<const segment> group);  // the parts' profiled times, summed (>= 1)

    std::vector<model_entry> _models;
    std::vector<layer> _layers;            // hidden layers (ReLU), then one linear output
    double _y_mean = 0, _y_std = 1;        // of the MLP's target over the training samples
    std::vector<double> _linear_w;         // inputs() weights, then the intercept; predicts log(us)
};

}  // namespace reefline::gpu::abacus
