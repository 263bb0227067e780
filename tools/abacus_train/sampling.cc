#include "tools/abacus_train/sampling.h"

#include <algorithm>
#include <array>
#include <climits>
#include <chrono>
#include <map>
#include <random>
#include <stdexcept>

#include "libml/runtime/synthetic_inputs.h"
#include "preempt/scheduler.h"

namespace reefline::ml {

namespace ab = gpu::abacus;

std::vector<ab::model_entry> abacus_entries(std::span<const sampled_model> models) {
    std::vector<ab::model_entry> out;
    for (const sampled_model& s : models) {
        ab::model_entry e;
        e.name = s.name;
        e.key = s.key;
        e.max_batch = uint32_t(*std::max_element(s.batches.begin(), s.batches.end()));
        e.max_length = s.lengths.empty() ? 0 : uint32_t(*std::max_element(s.lengths.begin(), s.lengths.end()));
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<ab::sample> sample_abacus_groups(runtime& rt, std::span<const sampled_model> models, const sampling_options& o) {
    if (models.empty()) throw std::invalid_argument("abacus sampling: no models");
    for (const sampled_model& s : models)
        if (s.batches.empty() || !s.m) throw std::invalid_argument("abacus sampling: model " + s.name + " has no batch sizes");
    // One instance per (model, batch size), planned at every length, its inputs written once.
    std::map<std::pair<size_t, int64_t>, std::unique_ptr<instance>> instances;
    for (size_t i = 0; i < models.size(); ++i)
        for (const int64_t b : models[i].batches) {
            auto in = rt.link_model(models[i].m);
            rt.configure_batch(*in, b, models[i].lengths);
            // Profiled at every length, as the daemon profiles what it serves: the segments'
            // profiled times are a feature.
            if (models[i].lengths.empty()) {
                rt.apply_profile(*in, rt.profile(*in, 3));
                rt.write_inputs(*in, synthetic_inputs(in->inputs(), 7));
            } else {
                for (const int64_t len : models[i].lengths) {
                    rt.select_length(*in, len);
                    rt.apply_profile(*in, rt.profile(*in, 3));
                    rt.write_inputs(*in, synthetic_inputs(in->inputs(), 7));
                }
            }
            instances[{i, b}] = std::move(in);
        }
    const uint32_t most = std::max<uint32_t>(1, std::min<uint32_t>(o.max_group, uint32_t(models.size())));
    gpu::scheduler_options so;
    so.pol = gpu::policy::streams;
    so.be_queues = most;
    gpu::scheduler sched(rt.device(), so);
    const auto run_alone = [&](std::vector<gpu::task_launch> launches) {
        gpu::task t;
        t.cls = gpu::task_class::be;
        t.be_queue = 0;
        t.launches = std::move(launches);
        const gpu::task_result r = sched.wait(sched.submit(std::move(t)));
        if (r.status != gpu::task_status::completed) throw std::runtime_error("abacus sampling: a task did not complete");
    };

    std::mt19937_64 rng(o.seed);
    std::vector<ab::sample> out;
    out.reserve(o.groups);
    std::vector<size_t> order(models.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // A few groups first, not kept: caches, the workers' first wake-ups.
    const size_t warm = std::min<size_t>(8, o.groups);
    for (size_t n = 0; n < o.groups + warm; ++n) {
        const uint32_t parts = 1 + uint32_t(rng() % most);
        std::shuffle(order.begin(), order.end(), rng);
        ab::sample s;
        std::vector<std::vector<gpu::task_launch>> launches;
        for (uint32_t p = 0; p < parts; ++p) {
            const size_t mi = order[p];
            const sampled_model& sm = models[mi];
            const int64_t b = sm.batches[rng() % sm.batches.size()];
            instance& in = *instances.at({mi, b});
            int64_t len = 0;
            if (!sm.lengths.empty()) {
                len = sm.lengths[rng() % sm.lengths.size()];
                rt.select_length(in, len);
            }
            std::vector<gpu::task_launch> all = rt.task_launches(in);
            const uint32_t k = uint32_t(all.size());
            if (k == 0) continue;
            ab::segment seg;
            seg.model = int32_t(mi);
            seg.kernels = k;
            seg.start = uint32_t(rng() % k);
            seg.end = seg.start + 1 + uint32_t(rng() % (k - seg.start));
            seg.batch = uint32_t(b);
            seg.length = uint32_t(len);
            for (uint32_t j = seg.start; j < seg.end; ++j) seg.profile_us += all[j].est_us;
            // What the segment reads: the launches before it, once.
            if (seg.start > 0) run_alone(std::vector<gpu::task_launch>(all.begin(), all.begin() + seg.start));
            launches.emplace_back(all.begin() + seg.start, all.begin() + seg.end);
            s.group.push_back(seg);
        }
        if (s.group.empty()) continue;
        // The group's duration: from its first part starting on the device to its last part
        // ending (the scheduler's own times, without the submitting thread's), the median of
        // three runs (a group of a few launches lasts tens of microseconds, where one wake-up
        // of a worker late is a large part). The segments are idempotent: running them again
        // reads and writes the same buffers.
        std::array<double, 3> runs{};
        for (double& us : runs) {
            std::vector<gpu::task_id> ids;
            for (size_t p = 0; p < launches.size(); ++p) {
                gpu::task t;
                t.cls = gpu::task_class::be;
                t.be_queue = int(p);
                t.launches = launches[p];
                ids.push_back(sched.submit(std::move(t)));
            }
            int64_t start = INT64_MAX, end = 0;
            for (const gpu::task_id id : ids) {
                const gpu::task_result r = sched.wait(id);
                if (r.status != gpu::task_status::completed) throw std::runtime_error("abacus sampling: a group did not complete");
                start = std::min(start, r.start_ns);
                end = std::max(end, r.end_ns);
            }
            us = double(end - start) / 1e3;
        }
        std::sort(runs.begin(), runs.end());
        s.us = runs[1];
        if (n >= warm) out.push_back(std::move(s));
        if (o.progress && n >= warm) o.progress(n - warm + 1, o.groups);
    }
    return out;
}

}  // namespace reefline::ml
