#include "ifmanager/model_if.h"

#include <arpa/inet.h>
#include <rte_cycles.h>
#include <rte_errno.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "dataplane/response.h"
#include "ifmanager/if_stats.h"
#include "ifmanager/share_tuner.h"

namespace reefline::ifm {

// The data plane's gather list is handed to the gather kernel as it is.
static_assert(sizeof(dp::gather_segment) == sizeof(ml::kernels::gather_segment));
static_assert(offsetof(dp::gather_segment, data) == offsetof(ml::kernels::gather_segment, data));
static_assert(offsetof(dp::gather_segment, length) == offsetof(ml::kernels::gather_segment, length));
static_assert(offsetof(dp::gather_segment, offset) == offsetof(ml::kernels::gather_segment, offset));

namespace {

constexpr uint32_t max_batch_limit = 256;
// Requests a lane holds between the ring and a batch: enough for the largest batch plus the
// next one forming, so the ring (not this) is where overload shows.
constexpr uint32_t lane_capacity = 2 * max_batch_limit;

const char* class_name(gpu::task_class c) { return c == gpu::task_class::rt ? "rt" : "be"; }

// The knee as describe() shows it: null when not measured.
nlohmann::json knee_json(const dkp::knee_curve& k) {
    if (k.points.empty() || k.device_units == 0) return nullptr;
    nlohmann::json curve = nlohmann::json::array();
    for (const dkp::share_point& p : k.points)
        curve.push_back({{"share", double(p.units) / k.device_units},
                         {"units", p.units},
                         {"batch_ms", p.ms},
                         {"throughput_rps", p.ms > 0 ? 1e3 * k.batch / p.ms : 0.0}});
    const uint32_t units = knee_units(k);
    return {{"share", double(units) / k.device_units},
            {"units", units},
            {"device_units", k.device_units},
            {"batch", k.batch},
            {"plan", k.plan},
            {"curve", curve}};
}

std::string ip_str(uint32_t be) {
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &be, buf, sizeof buf);
    return buf;
}

}  // namespace

// Length buckets a lane keeps a controller for (ml::sequence_buckets, or one).
constexpr size_t max_buckets = std::size(ml::sequence_buckets);

struct model_if::lane {
    gpu::task_class cls;
    // One batching controller per length bucket (images and tensors: [0] only).
    std::vector<batch_controller> controllers;
    // Requests waiting for a batch, oldest first (fixed ring).
    std::array<dp::request*, lane_capacity> pending{};
    uint32_t head = 0, count = 0;
    // Instances by batch size: a batch of n runs on the smallest configured size >= n, the
    // spare slots repeating the last request (padding costs compute, never changes results).
    std::map<uint32_t, std::unique_ptr<ml::instance>> instances;
    // The batch in flight.
    bool busy = false;
    std::atomic<bool> done{false};
    gpu::task_result result;
    std::array<dp::request*, max_batch_limit> batch{};
    uint32_t batch_n = 0;
    size_t batch_bucket = 0;
    ml::instance* batch_instance = nullptr;
    uint64_t launch_tsc = 0;
    std::vector<ml::kernels::gather_segment> segments;
    std::vector<uint32_t> first;
    // The controllers' targets, readable by the control thread.
    std::array<std::atomic<uint32_t>, max_buckets> targets{};
    std::atomic<uint32_t> last_bucket{0};
    // Arrivals: a batch waits for more requests only while they keep coming (a closed-loop
    // client with fewer requests outstanding than the target would otherwise wait out the
    // whole headroom on every batch).
    uint64_t last_arrival_tsc = 0;
    double gap_ewma_ms = 0;

    lane(gpu::task_class c, const batching_options& o, size_t buckets) : cls(c), controllers(buckets, batch_controller(o)) {
        publish_targets();
    }
    void publish_targets() {
        for (size_t b = 0; b < controllers.size(); ++b) targets[b].store(controllers[b].target(), std::memory_order_relaxed);
    }
    uint32_t target() const { return targets[last_bucket.load(std::memory_order_relaxed)].load(std::memory_order_relaxed); }
    dp::request* front() const { return pending[head]; }
    dp::request* pop() {
        dp::request* r = pending[head];
        head = (head + 1) % lane_capacity;
        --count;
        return r;
    }
    void push(dp::request* r, uint64_t now, double tsc_per_ms) {
        pending[(head + count) % lane_capacity] = r;
        ++count;
        if (last_arrival_tsc) {
            const double gap = double(now - last_arrival_tsc) / tsc_per_ms;
            gap_ewma_ms = gap_ewma_ms > 0 ? 0.875 * gap_ewma_ms + 0.125 * gap : gap;
        }
        last_arrival_tsc = now;
    }
};

void check_settings(const model_settings& s) {
    const auto& b = s.batching;
    if (b.max_batch < 1 || b.max_batch > max_batch_limit)
        throw std::invalid_argument("max_batch must be 1.." + std::to_string(max_batch_limit) + ", got " +
                                    std::to_string(b.max_batch));
    batch_controller::check(b);
    if (s.priority < 0 || s.priority > 2) throw std::invalid_argument("priority must be 0, 1 or 2");
    if (!(s.share > 0 && s.share <= 1)) throw std::invalid_argument("share must be > 0 and at most 1");
}

model_if::model_if(dp::dataplane& plane, ml::runtime& runtime, gpu::scheduler& scheduler,
                   const model_if_config& config, std::shared_ptr<ml::model> model)
    : _plane(plane), _runtime(runtime), _scheduler(scheduler), _config(config),
      _answers(plane, [this](uint32_t tag, bool sent) { answer_done(tag, sent); }) {
    check_settings(_config.settings);
    if (_config.top_k < 1 || _config.top_k > 100) throw std::invalid_argument("top_k must be 1..100");
    for (int c = 0; c < 3; ++c)
        if (!(std::fabs(_config.std[c]) > 0)) throw std::invalid_argument("std must be non-zero");
    _tsc_hz = rte_get_tsc_hz();
    _model = model ? std::move(model) : _runtime.load_model(_config.onnx, import_options());
    // The request format and the output check on the graph, before anything is planned.
    _input = request_input(_model->imported(), _config.settings);
    _predictor_model.store(predictor_model_of(_config.model_key), std::memory_order_relaxed);
    const size_t buckets = std::max<size_t>(1, planned_lengths(_input).size());
    for (int i = 0; i < 2; ++i)
        _lanes[i] = std::make_unique<lane>(i == 0 ? gpu::task_class::rt : gpu::task_class::be, _config.settings.batching,
                                           buckets);
    for (auto& l : _lanes) l->launch_tsc = rte_rdtsc();  // shedding's probes count from here (shed_late)
    lane& own = *_lanes[_config.settings.cls == gpu::task_class::rt ? 0 : 1];
    plan_sizes(own, _config.settings.batching.max_batch);
    if (!_config.settings.rt_sources_be.empty()) plan_sizes(*_lanes[0], _config.settings.batching.max_batch);
    const std::string ring_name = "mif_" + std::to_string(_config.slot) + "_" + std::to_string(_config.udp_port);
    _ring = rte_ring_create(ring_name.c_str(), rte_align32pow2(_config.ring_size), rte_socket_id(), RING_F_SC_DEQ);
    if (!_ring) throw std::runtime_error("model IF '" + _config.name + "': ring: " + rte_strerror(rte_errno));
}

model_if::~model_if() {
    // Batches in flight hold mbufs and the lanes' instances: wait for their tasks.
    for (auto& l : _lanes)
        while (l->busy && !l->done.load(std::memory_order_acquire)) std::this_thread::yield();
    for (auto& l : _lanes) {
        for (uint32_t i = 0; l->busy && i < l->batch_n; ++i) dp::release(l->batch[i]);
        while (l->count) dp::release(l->pop());
    }
    void* r;
    while (rte_ring_sc_dequeue(_ring, &r) == 0) dp::release(static_cast<dp::request*>(r));
    rte_ring_free(_ring);
}

ml::request_input model_if::request_input(const ml::graph& g, const model_settings& s) {
    ml::request_input r = ml::derive_request_input(g);
    if (g.outputs.empty()) throw std::invalid_argument("the model has no output");
    const ml::value& out = g.values.at(size_t(g.outputs[0]));
    if (out.type != ml::dtype::f32)
        throw std::invalid_argument("output '" + out.name + "' is " + ml::dtype_name(out.type) +
                                    "; a model IF answers from an f32 first output");
    if (s.tensor_output) {
        // Answered per request: the output's dims after the batch dim, at most 4 of 16 bits
        // (dim 1 of a sequence model's [N, L, ...] output is the request's own length).
        if (out.shape.size() < 2 || out.shape.size() > 5)
            throw std::invalid_argument("output '" + out.name + "' " + ml::shape_str(out.shape) +
                                        ": tensor answers carry 1 to 4 dims after the batch dim");
        int64_t elements = 1;
        for (size_t d = 1; d < out.shape.size(); ++d) {
            const int64_t n = d == 1 && r.kind == ml::request_kind::sequence && r.per_token_output ? r.max_length() : out.shape[d];
            if (n > 65535)
                throw std::invalid_argument("output '" + out.name + "' " + ml::shape_str(out.shape) +
                                            ": a tensor answer's dims must each be at most 65535");
            elements *= n;
        }
        // A response may have at most max_fragments fragments of at most an MTU's payload.
        const int64_t limit = int64_t(wire::max_fragments) * wire::mtu_fragment_payload;
        if (elements * 4 > limit)
            throw std::invalid_argument("output '" + out.name + "' " + ml::shape_str(out.shape) + ": " +
                                        std::to_string(elements * 4) + " bytes per answer is over the " +
                                        std::to_string(limit) + " a response can carry; use top-k answers");
    }
    return r;
}

int32_t model_if::predictor_model_of(uint64_t key) const {
    const auto& p = _scheduler.options().predictor;
    return p && key ? p->index_of(key) : -1;
}

std::vector<int64_t> model_if::planned_lengths(const ml::request_input& r) {
    return r.kind == ml::request_kind::sequence ? r.lengths : std::vector<int64_t>{};
}

ml::import_options model_if::import_options() {
    ml::import_options o;
    o.unbound_dim = ml::sequence_buckets[0];
    return o;
}

std::vector<int64_t> model_if::batch_sizes(uint32_t max_batch) {
    // Powers of two up to max_batch, and max_batch itself: a batch pads to the next size.
    std::vector<int64_t> sizes;
    for (uint32_t b = 1; b < max_batch; b *= 2) sizes.push_back(b);
    sizes.push_back(std::max<uint32_t>(max_batch, 1));
    return sizes;
}

std::vector<std::vector<int64_t>> model_if::initial_instances(const model_settings& s) {
    std::vector<std::vector<int64_t>> lanes{batch_sizes(s.batching.max_batch)};
    // The constructor plans the IF's own lane, and the RT lane too when RT sources are named.
    if (s.cls == gpu::task_class::be && !s.rt_sources_be.empty()) lanes.push_back(lanes.front());
    return lanes;
}

bool model_if::lane_planned_by(const model_settings& s, int i) const {
    const bool used = (i == 0) == (s.cls == gpu::task_class::rt) || (i == 0 && !s.rt_sources_be.empty());
    return used || !_lanes[i]->instances.empty();
}

std::vector<std::vector<int64_t>> model_if::instances_to_plan(const model_settings& s, bool all) const {
    std::lock_guard<std::mutex> g(_mu);
    std::vector<std::vector<int64_t>> lanes;
    for (int i = 0; i < 2; ++i) {
        if (!lane_planned_by(s, i)) continue;
        std::vector<int64_t> sizes;
        for (const int64_t b : batch_sizes(s.batching.max_batch))
            if (all || !_lanes[i]->instances.count(uint32_t(b))) sizes.push_back(b);
        if (!sizes.empty()) lanes.push_back(std::move(sizes));
    }
    return lanes;
}

namespace {
// The distinct shared arenas of a set of instances.
template <typename Instances>
void add_arenas(const Instances& instances, std::vector<const ml::shared_arena*>& seen) {
    for (const auto& [b, in] : instances)
        if (const ml::shared_arena* a = in->shared().get(); a && std::find(seen.begin(), seen.end(), a) == seen.end())
            seen.push_back(a);
}
}  // namespace

int64_t model_if::memory_bytes() const {
    std::lock_guard<std::mutex> g(_mu);
    int64_t total = 0;
    std::vector<const ml::shared_arena*> arenas;
    for (const auto& l : _lanes) {
        for (const auto& [b, in] : l->instances) total += in->memory_bytes();
        add_arenas(l->instances, arenas);
    }
    for (const ml::shared_arena* a : arenas) total += a->bytes();
    return total;
}

std::unique_ptr<ml::instance> model_if::plan_instance(const std::shared_ptr<ml::model>& model,
                                                      const ml::request_input& input, gpu::task_class cls, uint32_t b,
                                                      bool through_scheduler,
                                                      std::vector<std::pair<size_t, double>>& warm_ms,
                                                      const std::shared_ptr<ml::shared_arena>& arena) const {
    const std::vector<int64_t> lengths = planned_lengths(input);
    auto in = _runtime.link_model(model, cls == gpu::task_class::rt ? -1 : 0);
    _runtime.configure_batch(*in, b, lengths, arena);
    if (_config.warm_up) {
        // One run with zero inputs: touches the arena and weights, and seeds the controller's
        // latency model with a measured time for this size. Sequences warm up every size at
        // the shortest length and the longer lengths at batch 1 (a batch of the longest would
        // take seconds on a cpu device for a large encoder).
        const size_t runs = lengths.empty() || b != 1 ? 1 : lengths.size();
        for (size_t k = 0; k < runs; ++k) {
            std::vector<ml::tensor> inputs, outputs;
            std::vector<ml::tensor_desc> descs = in->inputs();
            for (auto& d : descs) {
                if (!lengths.empty()) d.shape[1] = lengths[k];
                inputs.push_back(ml::tensor::make(d.type, d.shape, ml::bytes_t(ml::dtype_size(d.type) * size_t(ml::element_count(d.shape)))));
            }
            if (!through_scheduler) {
                const uint64_t t0 = rte_rdtsc();
                _runtime.infer_batch(*in, inputs, outputs);
                warm_ms.emplace_back(k, double(rte_rdtsc() - t0) * 1e3 / double(_tsc_hz));
                continue;
            }
            // While the IF serves: a BE task like any batch, so that the IF's own batches (and
            // RT work anywhere) take turns with it instead of queueing behind the whole
            // warm-up; the time is the task's, taken again if it was preempted.
            _runtime.write_inputs(*in, inputs);
            double ms = 0;
            for (int attempt = 0; attempt < 3; ++attempt) {
                gpu::task t;
                t.cls = gpu::task_class::be;
                t.units = units();  // the IF's own work: inside its share
                t.launches = _runtime.task_launches(*in);
                const gpu::task_result r = _scheduler.wait(_scheduler.submit(std::move(t)));
                if (r.status != gpu::task_status::completed)
                    throw std::runtime_error("model IF '" + _config.name + "': a warm-up run of batch " +
                                             std::to_string(b) + " did not complete");
                ms = double(r.end_ns - r.start_ns) / 1e6;
                if (r.preemptions == 0) break;
            }
            warm_ms.emplace_back(k, ms);
        }
    }
    return in;
}

void model_if::plan_sizes(lane& l, uint32_t max_batch) {
    // The lane runs one batch at a time: its instances share one arena.
    const auto arena = _runtime.make_shared_arena();
    for (const int64_t size : batch_sizes(max_batch)) {
        const uint32_t b = uint32_t(size);
        if (l.instances.count(b)) continue;
        std::vector<std::pair<size_t, double>> warm_ms;
        auto in = plan_instance(_model, _input, l.cls, b, false, warm_ms, arena);
        for (const auto& [bucket, ms] : warm_ms) l.controllers[bucket].observe(b, ms, ms);
        l.instances.emplace(b, std::move(in));
    }
    l.publish_targets();
}

nlohmann::json model_if::profile(const dkp::model_profile* stored, const ml::runtime::launch_runner& run_alone,
                                 double budget_ms, dkp::model_profile& out) {
    std::lock_guard<std::mutex> g(_mu);
    std::vector<ml::instance*> all;
    for (auto& l : _lanes)
        for (auto& [b, in] : l->instances) all.push_back(in.get());
    _profile_summary = profile_instances(all, stored, run_alone, budget_ms, out);
    return _profile_summary;
}

nlohmann::json model_if::profile(prepared_settings& p, const dkp::model_profile* stored,
                                 const ml::runtime::launch_runner& run_alone, double budget_ms,
                                 dkp::model_profile& out) {
    std::vector<ml::instance*> fresh;
    for (auto& planned : p.instances) fresh.push_back(planned.instance.get());
    p.profile_summary = profile_instances(fresh, stored, run_alone, budget_ms, out);
    return p.profile_summary;
}

nlohmann::json model_if::profile_instances(const std::vector<ml::instance*>& instances,
                                           const dkp::model_profile* stored,
                                           const ml::runtime::launch_runner& run_alone, double budget_ms,
                                           dkp::model_profile& out) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto elapsed_ms = [&] {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    uint32_t plans = 0, reused = 0, measured = 0, skipped = 0;
    const std::vector<int64_t> lengths = planned_lengths(_input);
    const std::vector<int64_t> each = lengths.empty() ? std::vector<int64_t>{0} : lengths;
    for (ml::instance* in : instances)
        for (const int64_t len : each) {
            if (len) _runtime.select_length(*in, len);
            ++plans;
            const auto [name, key] = _runtime.profile_name(*in);
            const dkp::plan_profile* have = out.find(name, key);
            if (!have && stored) have = stored->find(name, key);
            if (have && _runtime.apply_profile(*in, *have)) {
                out.put(*have);
                ++reused;
                continue;
            }
            if (elapsed_ms() > budget_ms) {
                ++skipped;
                continue;
            }
            out.put(_runtime.profile(*in, 5, run_alone));
            ++measured;
        }
    return {{"device", out.device}, {"plans", plans}, {"profiled", reused + measured}, {"measured", measured},
            {"from_repository", reused}, {"not_profiled", skipped}, {"ms", elapsed_ms()}};
}

model_if::share_totals model_if::share_counters() const {
    share_totals t;
    t.arrived = _counters.requests_served.get();
    t.answered = _responses.get();
    t.late = _slo_violations.get() + _shed.get() + _deadline_exceeded.get();
    t.be_batches = _be_batches.load(std::memory_order_relaxed);
    t.be_busy_ns = _be_busy_ns.load(std::memory_order_relaxed);
    t.queued = queued();
    return t;
}

dkp::knee_curve model_if::measure_knee(prepared_settings* p, const dkp::knee_curve* stored, const bound_runner& run_on,
                                       uint32_t device_units, double budget_ms) {
    dkp::knee_curve k;
    if (device_units < 2) return k;
    const auto t0 = std::chrono::steady_clock::now();
    const int lane_index = settings().cls == gpu::task_class::rt ? 0 : 1;
    std::unique_lock<std::mutex> g(_mu, std::defer_lock);
    ml::instance* in = nullptr;
    uint32_t batch = 0;
    if (p) {
        for (auto& planned : p->instances)
            if (planned.lane == lane_index && planned.batch > batch) {
                batch = planned.batch;
                in = planned.instance.get();
            }
        if (!in || (batch <= knee().batch && !p->model)) return k;
    } else {
        g.lock();  // before the IF serves: nobody else waits for it
        const auto& instances = _lanes[lane_index]->instances;
        if (instances.empty()) return k;
        batch = instances.rbegin()->first;
        in = instances.rbegin()->second.get();
    }
    const std::vector<int64_t> lengths = planned_lengths(_input);
    if (!lengths.empty()) _runtime.select_length(*in, lengths.front());
    const auto [plan, key] = _runtime.profile_name(*in);
    if (stored && stored->plan == plan && stored->key == key && stored->device_units == device_units &&
        !stored->points.empty())
        return *stored;
    k.plan = plan;
    k.key = key;
    k.batch = batch;
    k.device_units = device_units;
    for (const uint32_t units : knee_samples(device_units)) {
        if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() > budget_ms)
            return {};  // a partial curve would put the knee wrong
        const uint64_t mask = units >= 64 || units >= device_units ? 0 : (uint64_t{1} << units) - 1;
        std::array<double, 3> ms{};
        for (double& m : ms) m = run_on(_runtime.task_launches(*in), mask) / 1e3;
        std::sort(ms.begin(), ms.end());
        k.points.push_back({units, ms[1]});
    }
    return k;
}

void model_if::set_knee(dkp::knee_curve k) {
    std::lock_guard<std::mutex> g(_mu);
    _knee = std::move(k);
}

dkp::knee_curve model_if::knee() const {
    std::lock_guard<std::mutex> g(_mu);
    return _knee;
}

uint32_t model_if::queued() const {
    return rte_ring_count(_ring) + _pending.load(std::memory_order_relaxed) + _answers.size();
}

model_settings model_if::settings() const {
    std::lock_guard<std::mutex> g(_mu);
    return _config.settings;
}

model_if::prepared_settings model_if::prepare(const model_settings& s, std::shared_ptr<ml::model> replacement) const {
    check_settings(s);
    prepared_settings p;
    p.settings = s;
    p.input = _input;
    if (replacement) {
        // A new version of the model must take the requests the IF takes: clients keep sending
        // what they sent.
        p.input = request_input(replacement->imported(), s);
        if (const std::string why = _input.differences(p.input); !why.empty())
            throw std::invalid_argument("the new model takes other requests than the IF (" + why +
                                        "): remove the IF and add the model");
        p.model = std::move(replacement);
    } else if (s.tensor_output != settings().tensor_output) {
        request_input(_model->imported(), s);
    }
    std::vector<std::pair<int, uint32_t>> wanted;  // (lane, batch size) not planned yet
    {
        std::lock_guard<std::mutex> g(_mu);
        for (int i = 0; i < 2; ++i)
            if (lane_planned_by(s, i))
                for (const int64_t b : batch_sizes(s.batching.max_batch))
                    if (p.model || !_lanes[i]->instances.count(uint32_t(b))) wanted.emplace_back(i, uint32_t(b));
    }
    // Planned and warmed up without the IF's lock: the serving thread goes on with the
    // instances it has (before, a `set` that added batch sizes held the IF for all of this).
    // A lane's new instances share one new arena: its live instances' arena is in use by the
    // batch the lane runs meanwhile, and the warm-up runs below are tasks of their own.
    const std::shared_ptr<ml::model>& model = p.model ? p.model : _model;
    std::array<std::shared_ptr<ml::shared_arena>, 2> arenas;
    for (const auto& [i, b] : wanted) {
        std::vector<std::pair<size_t, double>> warm_ms;
        if (!arenas[size_t(i)]) arenas[size_t(i)] = _runtime.make_shared_arena();
        p.instances.push_back({i, b, plan_instance(model, p.input, _lanes[i]->cls, b, true, warm_ms, arenas[size_t(i)])});
        for (const auto& [bucket, ms] : warm_ms) p.samples.push_back({i, bucket, b, ms});
    }
    return p;
}

void model_if::commit(prepared_settings&& p) {
    std::unique_lock<std::mutex> g(_mu);
    const uint64_t t0 = rte_rdtsc();
    std::vector<std::unique_ptr<ml::instance>> retired;
    if (p.model) {
        // The new version takes over at the next batch; a batch in flight finishes on the old
        // instances, retired below. Fresh controllers: the old model's latencies do not
        // describe the new one (its warm-up runs seed them).
        for (auto& l : _lanes) {
            for (auto& [b, in] : l->instances) retired.push_back(std::move(in));
            l->instances.clear();
            for (auto& c : l->controllers) c = batch_controller(p.settings.batching);
        }
        {
            std::lock_guard<std::mutex> m(_model_mu);
            _model = std::move(p.model);
        }
        _input = p.input;
        if (!p.onnx.empty()) _config.onnx = p.onnx;
        _config.model_key = p.model_key;
        _predictor_model.store(predictor_model_of(p.model_key), std::memory_order_relaxed);
        _knee = {};  // measured again on the new model (p.knee, below)
        _profile_summary = nullptr;
    }
    for (auto& planned : p.instances)
        _lanes[planned.lane]->instances.try_emplace(planned.batch, std::move(planned.instance));
    for (const auto& w : p.samples) _lanes[w.lane]->controllers[w.bucket].observe(w.batch, w.ms, w.ms);
    for (auto& l : _lanes) {
        for (auto& c : l->controllers) c.configure(p.settings.batching);
        l->publish_targets();
    }
    _config.settings = p.settings;
    if (!p.knee.points.empty()) _knee = std::move(p.knee);
    if (!p.profile_summary.is_null()) {
        // What the IF's plans have now: the earlier profile plus the new instances'.
        if (_profile_summary.is_object()) {
            for (const char* k : {"plans", "profiled", "measured", "from_repository", "not_profiled"})
                _profile_summary[k] = _profile_summary.value(k, 0u) + p.profile_summary.value(k, 0u);
            _profile_summary["ms"] = _profile_summary.value("ms", 0.0) + p.profile_summary.value("ms", 0.0);
        } else {
            _profile_summary = p.profile_summary;
        }
    }
    const uint64_t ns = uint64_t(double(rte_rdtsc() - t0) * 1e9 / double(_tsc_hz));
    g.unlock();
    // Instances a concurrent change planned first were not moved in: freed here, outside the lock.
    p.instances.clear();
    // Retired instances: freed once no batch runs on them (a lane's batch in flight ends
    // within one batch time; the serving thread clears `busy` when it has answered it).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!retired.empty()) {
        if (std::chrono::steady_clock::now() > deadline) {  // nothing serves the IF: the destructor frees them
            std::lock_guard<std::mutex> r(_mu);
            for (auto& in : retired) _retired.push_back(std::move(in));
            break;
        }
        bool running = false;
        {
            std::lock_guard<std::mutex> r(_mu);
            for (auto& l : _lanes)
                running |= l->busy && std::any_of(retired.begin(), retired.end(),
                                                  [&](const auto& in) { return in.get() == l->batch_instance; });
        }
        if (!running) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    retired.clear();
    _switch_ns_last.store(ns, std::memory_order_relaxed);
    if (ns > _switch_ns_max.load(std::memory_order_relaxed)) _switch_ns_max.store(ns, std::memory_order_relaxed);
    _switches.fetch_add(1, std::memory_order_relaxed);
}

void model_if::send(std::span<const uint8_t> result, const dp::request& r, const dp::response_spec& spec, uint32_t tag,
                    std::shared_ptr<const void> owner) {
    _answers.push(r.reply, r.key.request_id, spec, result, tag, std::move(owner));
}

// An answer is counted once, when it has gone out (every datagram on the tx ring) or has
// been given up: never as a response and a send failure at once.
void model_if::answer_done(uint32_t tag, bool sent) {
    if (!sent) {
        _counters.responses_failed.add();
        return;
    }
    _counters.responses_sent.add();
    if (tag & result_answer) _responses.add();
    if (tag & error_answer) _counters.error_responses.add();
    if (tag & counted_as_error) _errors.add();
}

void model_if::answer_error(const dp::request& r, wire::status status, const std::string& message, bool counted) {
    dp::response_spec spec;
    spec.kind = wire::kind::error;
    spec.status = status;
    send({reinterpret_cast<const uint8_t*>(message.data()), message.size()}, r, spec,
         uint32_t(error_answer) | (counted ? uint32_t(counted_as_error) : 0u));
}

void model_if::record_latency(double seconds) {
    seconds = std::max(seconds, 0.0);  // TSCs of two cores may disagree by a little
    size_t b = 0;
    while (b < latency_buckets_s.size() && seconds > latency_buckets_s[b]) ++b;
    _latency_hist[b].add();
    const uint64_t ns = uint64_t(seconds * 1e9);
    _latency_sum_ns.store(_latency_sum_ns.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
    if (ns > _latency_max_ns.load(std::memory_order_relaxed)) _latency_max_ns.store(ns, std::memory_order_relaxed);
}

void model_if::intake(uint32_t& work) {
    const model_settings& s = _config.settings;
    uint32_t room = lane_capacity;
    for (auto& l : _lanes) room = std::min(room, lane_capacity - l->count);
    dp::request* reqs[64];
    const unsigned n = rte_ring_sc_dequeue_burst(_ring, reinterpret_cast<void**>(reqs), std::min(room, 64u), nullptr);
    work += n;
    const uint64_t now = rte_rdtsc();
    const double tsc_per_ms = double(_tsc_hz) / 1e3;
    for (unsigned i = 0; i < n; ++i) {
        dp::request* r = reqs[i];
        _counters.requests_served.add();
        wire::status status;
        std::string why;
        if (!acceptable(*r, status, why)) {
            answer_error(*r, status, why);
            dp::release(r);
        } else {
            const bool rt = s.cls == gpu::task_class::rt ||
                            std::find(s.rt_sources_be.begin(), s.rt_sources_be.end(), r->key.src_ip_be) !=
                                s.rt_sources_be.end();
            _lanes[rt ? 0 : 1]->push(r, now, tsc_per_ms);
            _pending.fetch_add(1, std::memory_order_relaxed);
        }
    }
}

namespace {

std::string dims_text(const int64_t* d, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s += (i ? "x" : "") + std::to_string(d[i]);
    return s;
}

std::string lengths_text(const std::vector<int64_t>& lengths) {
    std::string s;
    for (size_t i = 0; i < lengths.size(); ++i)
        s += (i == 0 ? "" : i + 1 == lengths.size() ? " or " : ", ") + std::to_string(lengths[i]);
    return s;
}

}  // namespace

bool model_if::acceptable(const dp::request& r, wire::status& status, std::string& why) const {
    const ml::request_input& in = _input;
    const auto format = static_cast<wire::format>(r.format);
    switch (in.kind) {
    case ml::request_kind::image: {
        const int64_t want[3] = {in.height, in.width, in.channels};
        if (format != wire::format::image_u8_hwc) {
            status = wire::status::unsupported_format;
            why = "this IF takes image_u8_hwc requests (" + dims_text(want, 3) + " images)";
            return false;
        }
        if (r.dims[0] != want[0] || r.dims[1] != want[1] || r.dims[2] != want[2]) {
            const int64_t got[3] = {r.dims[0], r.dims[1], r.dims[2]};
            status = wire::status::bad_request;
            why = "expected a " + dims_text(want, 3) + " image, got " + dims_text(got, 3);
            return false;
        }
        return true;
    }
    case ml::request_kind::sequence: {
        const std::string range = in.exact_length ? "exactly " + lengths_text(in.lengths) : "1.." + std::to_string(in.max_length());
        if (format != wire::format::tokens_i32) {
            status = wire::status::unsupported_format;
            why = "this IF takes tokens_i32 requests (" + range + " tokens)";
            return false;
        }
        if (!in.bucket_for(r.dims[0])) {
            status = wire::status::bad_request;
            why = "expected " + range + " tokens" + (in.exact_length ? " (the model has no attention mask)" : "") + ", got " +
                  std::to_string(r.dims[0]);
            return false;
        }
        return true;
    }
    case ml::request_kind::tensor: {
        const std::string want = dims_text(in.item.data(), in.item.size());
        if (format != wire::format::tensor_f32) {
            status = wire::status::unsupported_format;
            why = "this IF takes tensor_f32 requests (dims " + want + ")";
            return false;
        }
        bool same = true;
        for (size_t d = 0; d < 4; ++d) same &= int64_t(r.dims[d]) == (d < in.item.size() ? in.item[d] : 0);
        if (!same) {
            int64_t got[4];
            size_t n = 0;
            for (; n < 4 && r.dims[n]; ++n) got[n] = r.dims[n];
            status = wire::status::bad_request;
            why = "expected a tensor of dims " + want + ", got " + dims_text(got, n);
            return false;
        }
        return true;
    }
    }
    status = wire::status::internal_error;
    why = "unknown request kind";
    return false;
}

size_t model_if::bucket_of(const dp::request& r) const {
    if (_input.kind != ml::request_kind::sequence) return 0;
    const int64_t len = _input.bucket_for(r.dims[0]);
    return size_t(std::find(_input.lengths.begin(), _input.lengths.end(), len) - _input.lengths.begin());
}

void model_if::shed_late(lane& l, uint64_t now) {
    // A request that waited w and would finish at w + service(batch) > SLO cannot be served
    // in time any more: answering it now keeps the ones behind it inside their SLO.
    const double slo = _config.settings.batching.slo_ms;
    // Unless the lane has run nothing for a while (twice the SLO, at least half a second): the
    // prediction shedding rests on is only refreshed by batches that run, and one learned in a
    // slow spell (a host stall, another tenant) would otherwise shed every request for good.
    // The next batch then runs whatever the prediction says: a probe of the device's speed.
    const double idle_ms = double(now - l.launch_tsc) * 1e3 / double(_tsc_hz);
    if (idle_ms > std::max(2 * slo, 500.0)) return;
    while (l.count) {
        const batch_controller& c = l.controllers[bucket_of(*l.front())];
        const double service = c.predict_ms(std::min(l.count, c.target()));
        if (!(service > 0)) return;
        const double waited = double(now - l.front()->last_tsc) * 1e3 / double(_tsc_hz);
        if (waited + service <= slo) break;
        dp::request* r = l.pop();
        _pending.fetch_sub(1, std::memory_order_relaxed);
        answer_error(*r, wire::status::overloaded,
                     "overloaded: cannot answer within the " + std::to_string(int64_t(slo)) + " ms SLO", false);
        _shed.add();
        dp::release(r);
    }
}

void model_if::dispatch(lane& l) {
    const uint32_t largest = l.instances.rbegin()->first;
    const size_t bucket = bucket_of(*l.front());
    const uint32_t want = std::min(std::max(l.controllers[bucket].target(), 1u), largest);
    uint32_t n = 0;
    if (_input.kind == ml::request_kind::sequence) {
        // The oldest request's bucket, and those behind it that fit it, in arrival order; the
        // rest keep their order in the ring.
        uint32_t kept = 0;
        const uint32_t count = l.count;
        for (uint32_t i = 0; i < count; ++i) {
            dp::request* r = l.pending[(l.head + i) % lane_capacity];
            if (n < want && bucket_of(*r) <= bucket) l.batch[n++] = r;
            else l.pending[(l.head + kept++) % lane_capacity] = r;
        }
        l.count = kept;
    } else {
        n = std::min(l.count, want);
        for (uint32_t i = 0; i < n; ++i) l.batch[i] = l.pop();
    }
    _pending.fetch_sub(n, std::memory_order_relaxed);
    const auto it = l.instances.lower_bound(n);
    ml::instance& in = *it->second;
    const uint32_t size = it->first;
    l.segments.clear();
    l.first.assign(1, 0);
    for (uint32_t i = 0; i < size; ++i) {
        const auto list = l.batch[std::min(i, n - 1)]->gather_list();
        l.segments.insert(l.segments.end(), reinterpret_cast<const ml::kernels::gather_segment*>(list.data()),
                          reinterpret_cast<const ml::kernels::gather_segment*>(list.data()) + list.size());
        l.first.push_back(uint32_t(l.segments.size()));
    }
    ml::runtime::request_batch images;
    images.segments = l.segments;
    images.first = l.first;
    for (int c = 0; c < 3; ++c) {
        images.mean[c] = _config.mean[c];
        images.std[c] = _config.std[c];
    }
    if (_input.kind == ml::request_kind::sequence) images.length = _input.lengths[bucket];
    gpu::task t;
    try {
        t.launches = _runtime.request_task(in, images);
    } catch (const std::exception& e) {
        for (uint32_t i = 0; i < n; ++i) {
            answer_error(*l.batch[i], wire::status::internal_error, e.what());
            dp::release(l.batch[i]);
        }
        return;
    }
    t.cls = l.cls;
    t.priority = _config.settings.priority;
    if (l.cls == gpu::task_class::be) t.units = units();  // its share (RT runs on every unit)
    // PREMA's job length: the profiled kernels' times when the plan was profiled.
    for (const gpu::task_launch& k : t.launches) t.est_us += k.est_us;
    // Abacus: the batch must end by its oldest request's deadline; the predictor's features.
    {
        const double waited_ms = double(rte_rdtsc() - l.batch[0]->last_tsc) * 1e3 / double(_tsc_hz);
        const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count();
        t.deadline_ns = now + int64_t((_config.settings.batching.slo_ms - waited_ms) * 1e6);
        t.model = _predictor_model.load(std::memory_order_relaxed);
        t.batch = size;
        t.length = uint32_t(images.length);
    }
    lane* lp = &l;
    t.on_done = [lp](const gpu::task_result& r) {
        lp->result = r;
        lp->done.store(true, std::memory_order_release);
    };
    l.batch_n = n;
    l.batch_bucket = bucket;
    l.last_bucket.store(uint32_t(bucket), std::memory_order_relaxed);
    l.batch_instance = &in;
    l.busy = true;
    l.done.store(false, std::memory_order_relaxed);
    l.launch_tsc = rte_rdtsc();
    _in_flight.fetch_add(1, std::memory_order_relaxed);
    _scheduler.submit(std::move(t));
}

void model_if::complete(lane& l) {
    const uint64_t now = rte_rdtsc();
    const uint32_t n = l.batch_n;
    const gpu::task_result& res = l.result;
    _preemptions.add(res.preemptions);
    _reexecuted.add(res.reexecuted_kernels);
    if (res.status == gpu::task_status::dropped) {
        // The abacus scheduler found the batch could no longer end within the SLO.
        const std::string why = "deadline_exceeded: the scheduler dropped the batch: it could not finish within the " +
                                std::to_string(int64_t(_config.settings.batching.slo_ms)) + " ms SLO";
        for (uint32_t i = 0; i < n; ++i) {
            answer_error(*l.batch[i], wire::status::deadline_exceeded, why, false);
            _deadline_exceeded.add();
            dp::release(l.batch[i]);
        }
    } else if (res.status != gpu::task_status::completed) {
        const bool stopping = res.status == gpu::task_status::cancelled || res.status == gpu::task_status::rejected;
        for (uint32_t i = 0; i < n; ++i) {
            answer_error(*l.batch[i], stopping ? wire::status::shutting_down : wire::status::internal_error,
                         stopping ? "the daemon is stopping" : "the device failed to run the model");
            dp::release(l.batch[i]);
        }
    } else {
        const double service_ms = double(now - l.launch_tsc) * 1e3 / double(_tsc_hz);
        // Shared by the batch's answers until the last of them has gone out.
        const auto outputs = std::make_shared<const std::vector<ml::tensor>>(_runtime.read_outputs(*l.batch_instance));
        std::vector<ml::kernels::token_error> token_errors;
        if (_input.kind == ml::request_kind::sequence) token_errors = _runtime.token_errors(*l.batch_instance);
        const double slo_s = _config.settings.batching.slo_ms / 1e3;
        double worst_ms = 0;
        for (uint32_t i = 0; i < n; ++i) {
            if (i < token_errors.size() && token_errors[i].position >= 0) {
                // The kernel fed token 0 in its place; the request is answered with what was wrong.
                answer_error(*l.batch[i], wire::status::bad_request,
                             "token " + std::to_string(token_errors[i].token) + " at position " +
                                 std::to_string(token_errors[i].position) + " is outside the vocabulary [0, " +
                                 std::to_string(_input.vocab) + ")");
                dp::release(l.batch[i]);
                continue;
            }
            answer(l, i, outputs);
            const double latency_s = double(rte_rdtsc() - l.batch[i]->last_tsc) / double(_tsc_hz);
            record_latency(latency_s);
            worst_ms = std::max(worst_ms, latency_s * 1e3);
            if (latency_s > slo_s) _slo_violations.add();
            dp::release(l.batch[i]);
        }
        _batches.add();
        _batched_requests.add(n);
        if (l.cls == gpu::task_class::be) {
            _be_busy_ns.store(_be_busy_ns.load(std::memory_order_relaxed) + uint64_t(service_ms * 1e6),
                              std::memory_order_relaxed);
            _be_batches.store(_be_batches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        }
        l.controllers[l.batch_bucket].observe(n, service_ms, worst_ms);
        l.publish_targets();
    }
    l.busy = false;
    l.done.store(false, std::memory_order_relaxed);
    _in_flight.fetch_sub(1, std::memory_order_relaxed);
}

void model_if::answer(lane& l, uint32_t i, const std::shared_ptr<const std::vector<ml::tensor>>& outputs) {
    const ml::tensor& out = outputs->at(0);
    const dp::request& r = *l.batch[i];
    const int64_t per = out.elements() / l.batch_instance->batch();
    const float* s = out.view<float>().data() + int64_t(i) * per;
    dp::response_spec spec;
    if (_config.settings.tensor_output) {
        // The request's slice of the output, dims after the batch dim; a sequence model's
        // per-token output ([N, L] or [N, L, ...]) is cut to the request's own tokens (the
        // rest is padding).
        std::vector<int64_t> dims(out.shape.begin() + 1, out.shape.end());
        int64_t count = per;
        if (_input.kind == ml::request_kind::sequence && _input.per_token_output && !dims.empty() &&
            dims[0] == l.batch_instance->length() && r.dims[0] <= dims[0]) {
            count = per / dims[0] * r.dims[0];
            dims[0] = r.dims[0];
        }
        spec.format = wire::format::result_tensor_f32;
        for (size_t d = 0; d < dims.size() && d < 4; ++d) spec.dims[d] = uint16_t(dims[d]);
        // Little-endian f32, as tensor_f32 requests carry them (the device's own layout).
        send({reinterpret_cast<const uint8_t*>(s), size_t(count) * 4}, r, spec, result_answer, outputs);
        return;
    }
    const uint32_t k = uint32_t(std::min<int64_t>(_config.top_k, per));
    std::vector<int64_t> order(static_cast<size_t>(per));
    std::vector<uint8_t> result(size_t(k) * 8);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    for (uint32_t j = 0; j < k; ++j) {
        uint32_t cls = htonl(uint32_t(order[j])), bits;
        std::memcpy(&bits, &s[order[j]], 4);
        bits = htonl(bits);
        std::memcpy(result.data() + j * 8, &cls, 4);
        std::memcpy(result.data() + j * 8 + 4, &bits, 4);
    }
    spec.format = wire::format::result_topk;
    spec.dims[0] = uint16_t(k);
    send(result, r, spec, result_answer);
}

uint32_t model_if::poll() {
    std::unique_lock<std::mutex> g(_mu, std::try_to_lock);
    if (!g.owns_lock()) return 0;
    uint32_t work = 0;
    if (!_answers.empty()) {
        // Backpressure: while answers wait for transmit buffers the IF takes no request and
        // completes no batch (each would add answers); its ring fills instead.
        work += _answers.flush() ? 1 : 0;
        if (!_answers.empty()) return work;
    }
    for (auto& l : _lanes)
        if (l->busy && l->done.load(std::memory_order_acquire)) {
            complete(*l);
            ++work;
        }
    intake(work);
    const uint64_t now = rte_rdtsc();
    for (auto& l : _lanes) {
        if (l->busy || l->count == 0) continue;
        if (l->instances.empty()) plan_sizes(*l, _config.settings.batching.max_batch);
        if (_config.settings.shed) shed_late(*l, now);
        if (l->count == 0) continue;
        // RT work is served at once (work-conserving: whatever is queued, up to the target,
        // forms the batch); BE batches wait for more requests while the controller says the
        // headroom allows and requests keep arriving (no arrival for twice the usual gap:
        // the client is waiting for answers, so waiting longer only adds latency).
        const double oldest_ms = double(now - l->front()->last_tsc) * 1e3 / double(_tsc_hz);
        const double quiet_ms = double(now - l->last_arrival_tsc) * 1e3 / double(_tsc_hz);
        const bool arrivals_stopped = quiet_ms > std::max(2 * l->gap_ewma_ms, 0.2);
        if (l->cls == gpu::task_class::rt || arrivals_stopped ||
            l->controllers[bucket_of(*l->front())].dispatch_now(l->count, oldest_ms)) {
            dispatch(*l);
            ++work;
        }
    }
    return work;
}

void model_if::fail_pending() {
    std::lock_guard<std::mutex> g(_mu);
    for (auto& l : _lanes)
        while (l->count) {
            dp::request* r = l->pop();
            _pending.fetch_sub(1, std::memory_order_relaxed);
            answer_error(*r, wire::status::shutting_down, "the daemon is stopping");
            dp::release(r);
        }
    void* r;
    while (rte_ring_sc_dequeue(_ring, &r) == 0) {
        auto* q = static_cast<dp::request*>(r);
        _counters.requests_served.add();
        answer_error(*q, wire::status::shutting_down, "the daemon is stopping");
        dp::release(q);
    }
}

nlohmann::json model_if::describe() const {
    const model_settings s = settings();
    nlohmann::json j = {
        {"name", _config.name},
        {"udp_port", _config.udp_port},
        {"class", class_name(s.cls)},
        {"slo_ms", s.batching.slo_ms},
        {"batching", batching_policy_name(s.batching.policy)},
        {"batch_size", _lanes[s.cls == gpu::task_class::rt ? 0 : 1]->target()},
        {"min_batch", s.batching.min_batch},
        {"max_batch", s.batching.max_batch},
        {"fixed_batch", s.batching.fixed_batch},
        {"priority", s.priority},
        {"state", "serving"},
        {"requests_total", _counters.requests_served.get()},
        {"responses_total", _responses.get()},
        {"onnx", _config.onnx},
        {"top_k", _config.top_k},
        {"mean", {_config.mean[0], _config.mean[1], _config.mean[2]}},
        {"std", {_config.std[0], _config.std[1], _config.std[2]}},
        {"shed", s.shed},
        {"weight_bytes", _model->weight_bytes()},
        {"input_format", _input.format_name()},
        {"request", _input.describe(_model->imported())},
        {"output", s.tensor_output ? "tensor" : "topk"},
        {"share", s.share},
        {"share_policy", s.share_auto ? "auto" : "static"},
    };
    {
        // The compute units its BE batches run on (every unit when it has the whole device).
        const uint32_t n = _runtime.device().caps().compute_units;
        const uint64_t mask = units();
        nlohmann::json on = nlohmann::json::array();
        for (uint32_t u = 0; u < n; ++u)
            if (!mask || (u < 64 && (mask >> u & 1))) on.push_back(u);
        j["units"] = on;
        // Where they really are: backends round sets, place them by count, or run them unbound.
        gpu::device& dev = _runtime.device();
        if (mask && dev.has_unit_sets()) {
            const gpu::unit_grant g = dev.unit_grant_of(mask);
            nlohmann::json gj = {{"bound", g.bound}, {"note", g.note}};
            if (g.bound) {
                gj["count"] = g.count;
                gj["exact"] = g.exact;
                if (g.exact) gj["units"] = g.units;
            }
            j["units_granted"] = gj;
        }
    }
    if (_input.kind == ml::request_kind::image) {
        j["image"] = {{"height", _input.height}, {"width", _input.width}, {"channels", _input.channels}};
    } else if (_input.kind == ml::request_kind::tensor) {
        j["tensor_dims"] = _input.item;
    } else {
        j["sequence_lengths"] = _input.lengths;
        j["max_tokens"] = _input.max_length();
        j["exact_length"] = _input.exact_length;
        if (_input.vocab_known) j["vocabulary"] = _input.vocab;
        nlohmann::json targets = nlohmann::json::object();
        const lane& l = *_lanes[s.cls == gpu::task_class::rt ? 0 : 1];
        for (size_t b = 0; b < _input.lengths.size(); ++b)
            targets[std::to_string(_input.lengths[b])] = l.targets[b].load(std::memory_order_relaxed);
        j["batch_size_by_length"] = targets;
    }
    nlohmann::json sources = nlohmann::json::array();
    for (uint32_t ip : s.rt_sources_be) sources.push_back(ip_str(ip));
    j["rt_sources"] = sources;
    std::lock_guard<std::mutex> g(_mu);
    j["profile"] = _profile_summary.is_null() ? nlohmann::json("not profiled") : _profile_summary;
    j["knee"] = knee_json(_knee);
    const lane& own = *_lanes[s.cls == gpu::task_class::rt ? 0 : 1];
    if (!own.instances.empty()) {
        const ml::instance& one = *own.instances.begin()->second;
        const auto ins = one.inputs();
        j["input"] = {{"name", ins.at(0).name}, {"type", ml::dtype_name(ins[0].type)}, {"shape", ins[0].shape}};
        nlohmann::json all = nlohmann::json::array();
        for (const auto& in : ins) all.push_back({{"name", in.name}, {"type", ml::dtype_name(in.type)}, {"shape", in.shape}});
        j["inputs"] = all;
        nlohmann::json outs = nlohmann::json::array();
        for (const auto& o : one.outputs())
            outs.push_back({{"name", o.name}, {"type", ml::dtype_name(o.type)}, {"shape", o.shape}});
        j["outputs"] = outs;
        j["arena_bytes"] = one.arena_bytes();
        j["kernels"] = one.current_plan().launches().size() + 1;  // + the gather kernel
        nlohmann::json sizes = nlohmann::json::array();
        for (const auto& [b, _] : own.instances) sizes.push_back(b);
        j["planned_batch_sizes"] = sizes;
    }
    nlohmann::json instances = nlohmann::json::array(), arenas = nlohmann::json::array();
    for (int i = 0; i < 2; ++i) {
        for (const auto& [b, in] : _lanes[i]->instances)
            instances.push_back({{"lane", i == 0 ? "rt" : "be"}, {"batch", b}, {"bytes", in->memory_bytes()}});
        // The arenas the lane's instances share (one, or one per `set` that added sizes).
        std::vector<const ml::shared_arena*> seen;
        add_arenas(_lanes[i]->instances, seen);
        for (const ml::shared_arena* a : seen) {
            nlohmann::json sizes = nlohmann::json::array();
            for (const auto& [b, in] : _lanes[i]->instances)
                if (in->shared().get() == a) sizes.push_back(b);
            arenas.push_back({{"lane", i == 0 ? "rt" : "be"}, {"bytes", a->bytes()}, {"batch_sizes", sizes}});
        }
    }
    j["instances"] = instances;
    j["arenas"] = arenas;
    return j;
}

nlohmann::json model_if::stats() const {
    const model_settings s = settings();
    nlohmann::json le = nlohmann::json::array(), counts = nlohmann::json::array();
    uint64_t cumulative = 0;
    for (size_t b = 0; b < latency_buckets_s.size(); ++b) {
        cumulative += _latency_hist[b].get();
        le.push_back(latency_buckets_s[b]);
        counts.push_back(cumulative);
    }
    const uint64_t total = cumulative + _latency_hist.back().get();
    // Percentiles interpolated within the histogram's buckets (the exact samples are not kept),
    // never above the exact maximum (the top bucket's interpolation could overshoot it).
    const double max_ms = double(_latency_max_ns.load(std::memory_order_relaxed)) / 1e6;
    auto interpolated = [&](double q) {
        const double rank = q * double(total);
        uint64_t below = 0;
        double lo = 0;
        for (size_t b = 0; b < latency_buckets_s.size(); ++b) {
            const uint64_t c = _latency_hist[b].get();
            if (double(below + c) >= rank && c > 0)
                return 1e3 * (lo + (latency_buckets_s[b] - lo) * (rank - double(below)) / double(c));
            below += c;
            lo = latency_buckets_s[b];
        }
        return 1e3 * latency_buckets_s.back();
    };
    auto quantile = [&](double q) {
        if (total == 0) return 0.0;
        return std::min(max_ms, interpolated(q));
    };
    if_stats v;
    v.requests_total = _counters.requests_served.get();
    v.responses_total = _responses.get();
    v.errors_total = _errors.get();
    v.shed_total = _shed.get();
    v.deadline_exceeded_total = _deadline_exceeded.get();
    v.slo_violations_total = _slo_violations.get();
    v.send_failures_total = _counters.responses_failed.get();
    v.queue_depth = queued();
    v.in_flight = _in_flight.load(std::memory_order_relaxed);
    v.batch_size = _lanes[s.cls == gpu::task_class::rt ? 0 : 1]->target();
    v.batches_total = _batches.get();
    v.batched_requests_total = _batched_requests.get();
    v.preemptions_total = _preemptions.get();
    v.reexecuted_kernels_total = _reexecuted.get();
    v.settings_switches_total = _switches.load(std::memory_order_relaxed);
    v.switch_us_last = double(_switch_ns_last.load(std::memory_order_relaxed)) / 1e3;
    v.switch_us_max = double(_switch_ns_max.load(std::memory_order_relaxed)) / 1e3;
    nlohmann::json out = {
        {"name", _config.name},
        {"udp_port", _config.udp_port},
        {"class", class_name(s.cls)},
        {"slo_ms", s.batching.slo_ms},
        {"latency_seconds",
         {{"le", le}, {"counts", counts}, {"sum", double(_latency_sum_ns.load(std::memory_order_relaxed)) / 1e9},
          {"count", total}}},
        {"latency_ms",
         {{"p50", quantile(0.5)},
          {"p90", quantile(0.9)},
          {"p99", quantile(0.99)},
          {"max", max_ms}}},
    };
    v.add_to(out);
    return out;
}

}  // namespace reefline::ifm
