// Training data for Abacus's group predictor (preempt/abacus.h): operator groups sampled on
// this device the way Abacus §5.4 does (instance-based sampling). Each sample picks a few
// distinct models, and for each a batch size, a sequence length and a segment [start, end) of
// its launches (every instance profiled first, as the daemon profiles what it serves: a
// segment's profiled time is one of the features); the launches before each segment run first (untimed, so the segment reads
// what it would read in service), then the segments run side by side, each on its own BE
// queue of a scheduler with the streams policy (as the abacus policy runs a group's parts), and
// the group's duration is the time from its first part starting to its last part ending (the
// median of three runs).
// tools/abacus_train writes a predictor from these; bench/abacus_bench measures its error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "libml/libml.h"
#include "preempt/abacus.h"

namespace reefline::ml {

struct sampled_model {
    std::string name;
    uint64_t key = 0;                // abacus::model_key of its file
    std::shared_ptr<model> m;
    std::vector<int64_t> batches;    // the batch sizes it is served at (at least one)
    std::vector<int64_t> lengths;    // a sequence model's planned lengths (empty: none)
};

struct sampling_options {
    size_t groups = 400;
    uint32_t max_group = 4;          // parts per group, at most (and at most the models given)
    uint64_t seed = 1;
    // Called after each group: (done, total).
    std::function<void(size_t, size_t)> progress;
};

// The predictor's model entries for these models (max batch and length from what is served).
std::vector<gpu::abacus::model_entry> abacus_entries(std::span<const sampled_model> models);

// Samples `o.groups` groups on the runtime's device. Throws std::invalid_argument for no
// models or a model without batch sizes.
std::vector<gpu::abacus::sample> sample_abacus_groups(runtime& rt, std::span<const sampled_model> models,
                                                      const sampling_options& o);

}  // namespace reefline::ml
