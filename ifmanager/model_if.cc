#include "ifmanager/model_if.h"

#include <arpa/inet.h>
#include <rte_cycles.h>
#include <rte_errno.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "dataplane/response.h"

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

void check_settings(const model_settings& s) {
    const auto& b = s.batching;
    if (!(b.slo_ms > 0) || !std::isfinite(b.slo_ms)) throw std::invalid_argument("slo_ms must be > 0");
    if (b.max_batch < 1 || b.max_batch > max_batch_limit)
        throw std::invalid_argument("max_batch must be 1.." + std::to_string(max_batch_limit));
    if (b.min_batch < 1 || b.min_batch > b.max_batch) throw std::invalid_argument("min_batch must be 1..max_batch");
    if (b.fixed_batch > b.max_batch) throw std::invalid_argument("fixed_batch must be <= max_batch");
    if (s.priority < 0 || s.priority > 2) throw std::invalid_argument("priority must be 0, 1 or 2");
}

std::string ip_str(uint32_t be) {
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &be, buf, sizeof buf);
    return buf;
}

}  // namespace

struct model_if::lane {
    gpu::task_class cls;
    ml::batch_controller controller;
    // Requests waiting for a batch, oldest first (fixed ring).
    std::array<dp::request*, lane_capacity> pending{};
    uint32_t head = 0, count = 0;
    // Instances by batch size: a batch of n runs on the smallest configured size >= n, the
    // spare slots repeating the last image (padding costs compute, never changes results).
    std::map<uint32_t, std::unique_ptr<ml::instance>> instances;
    // The batch in flight.
    bool busy = false;
    std::atomic<bool> done{false};
    gpu::task_result result;
    std::array<dp::request*, max_batch_limit> batch{};
    uint32_t batch_n = 0;
    ml::instance* batch_instance = nullptr;
    uint64_t launch_tsc = 0;
    std::vector<ml::kernels::gather_segment> segments;
    std::vector<uint32_t> first;
    std::atomic<uint32_t> target{1};
    // Arrivals: a batch waits for more requests only while they keep coming (a closed-loop
    // client with fewer requests outstanding than the target would otherwise wait out the
    // whole headroom on every batch).
    uint64_t last_arrival_tsc = 0;
    double gap_ewma_ms = 0;

    lane(gpu::task_class c, const ml::batching_options& o) : cls(c), controller(o) { target = controller.target(); }
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

model_if::model_if(dp::dataplane& plane, ml::runtime& runtime, gpu::scheduler& scheduler,
                   const model_if_config& config, std::shared_ptr<ml::model> model)
    : _plane(plane), _runtime(runtime), _scheduler(scheduler), _config(config) {
    check_settings(_config.settings);
    if (_config.top_k < 1 || _config.top_k > 100) throw std::invalid_argument("top_k must be 1..100");
    for (int c = 0; c < 3; ++c)
        if (!(std::fabs(_config.std[c]) > 0)) throw std::invalid_argument("std must be non-zero");
    _tsc_hz = rte_get_tsc_hz();
    _model = model ? std::move(model) : _runtime.load_model(_config.onnx);
    // The input check on the graph, before anything is planned.
    const image_input_shape in = image_input(_model->imported());
    _c = in.c;
    _h = in.h;
    _w = in.w;
    for (int i = 0; i < 2; ++i)
        _lanes[i] = std::make_unique<lane>(i == 0 ? gpu::task_class::rt : gpu::task_class::be, _config.settings.batching);
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

image_input_shape model_if::image_input(const ml::graph& g) {
    const auto expected = [&](const std::string& got) {
        return std::invalid_argument("expected one f32 [N, C<=3, H, W] image input, got " + got);
    };
    if (g.inputs.size() != 1)
        throw expected(std::to_string(g.inputs.size()) + " inputs");
    const ml::value& v = g.values.at(size_t(g.inputs[0]));
    if (v.type != ml::dtype::f32 || v.shape.size() != 4)
        throw expected("input '" + v.name + "' " + ml::dtype_name(v.type) + " " + ml::shape_str(v.shape));
    // A dimension out of range would make an IF that can never answer (no request can carry
    // a 0-pixel image) or one whose requests the wire format cannot describe.
    static constexpr const char* dim_names[4] = {"N", "C", "H", "W"};
    static constexpr int64_t dim_max[4] = {1 << 16, 3, 65535, 65535};
    for (size_t d = 0; d < 4; ++d)
        if (v.shape[d] < 1 || v.shape[d] > dim_max[d])
            throw std::invalid_argument("input '" + v.name + "' " + ml::shape_str(v.shape) + ": dimension " +
                                        std::to_string(d) + " (" + dim_names[d] + ") is " + std::to_string(v.shape[d]) +
                                        "; an image input needs it in 1.." + std::to_string(dim_max[d]));
    return {v.name, uint16_t(v.shape[1]), uint16_t(v.shape[2]), uint16_t(v.shape[3])};
}

std::vector<int64_t> model_if::batch_sizes(uint32_t max_batch) {
    // Powers of two up to max_batch, and max_batch itself: a batch pads to the next size.
    std::vector<int64_t> sizes;
    for (uint32_t b = 1; b < max_batch; b *= 2) sizes.push_back(b);
    sizes.push_back(std::max<uint32_t>(max_batch, 1));
    return sizes;
}

std::vector<int64_t> model_if::initial_instances(const model_settings& s) {
    std::vector<int64_t> sizes = batch_sizes(s.batching.max_batch);
    // The constructor plans the IF's own lane, and the RT lane too when RT sources are named.
    if (s.cls == gpu::task_class::be && !s.rt_sources_be.empty()) {
        const size_t n = sizes.size();
        for (size_t i = 0; i < n; ++i) sizes.push_back(sizes[i]);
    }
    return sizes;
}

bool model_if::lane_planned_by(const model_settings& s, int i) const {
    const bool used = (i == 0) == (s.cls == gpu::task_class::rt) || (i == 0 && !s.rt_sources_be.empty());
    return used || !_lanes[i]->instances.empty();
}

std::vector<int64_t> model_if::instances_to_plan(const model_settings& s) const {
    std::lock_guard<std::mutex> g(_mu);
    std::vector<int64_t> sizes;
    for (int i = 0; i < 2; ++i) {
        if (!lane_planned_by(s, i)) continue;
        for (const int64_t b : batch_sizes(s.batching.max_batch))
            if (!_lanes[i]->instances.count(uint32_t(b))) sizes.push_back(b);
    }
    return sizes;
}

int64_t model_if::memory_bytes() const {
    std::lock_guard<std::mutex> g(_mu);
    int64_t total = 0;
    for (const auto& l : _lanes)
        for (const auto& [b, in] : l->instances) total += in->memory_bytes();
    return total;
}

void model_if::plan_sizes(lane& l, uint32_t max_batch) {
    for (const int64_t size : batch_sizes(max_batch)) {
        const uint32_t b = uint32_t(size);
        if (l.instances.count(b)) continue;
        auto in = _runtime.link_model(_model, l.cls == gpu::task_class::rt ? -1 : 0);
        if (in->batch() != b) _runtime.configure_batch(*in, b);
        if (_config.warm_up && _h) {
            // One run with zero inputs: touches the arena and weights, and seeds the
            // controller's latency model with a measured time for this size.
            std::vector<ml::tensor> inputs, outputs;
            for (const auto& d : in->inputs())
                inputs.push_back(ml::tensor::make(d.type, d.shape, ml::bytes_t(ml::dtype_size(d.type) * size_t(ml::element_count(d.shape)))));
            const uint64_t t0 = rte_rdtsc();
            _runtime.infer_batch(*in, inputs, outputs);
            const double ms = double(rte_rdtsc() - t0) * 1e3 / double(_tsc_hz);
            l.controller.observe(b, ms, ms);
        }
        l.instances.emplace(b, std::move(in));
    }
    l.target.store(l.controller.target(), std::memory_order_relaxed);
}

uint32_t model_if::queued() const {
    return rte_ring_count(_ring) + _pending.load(std::memory_order_relaxed);
}

model_settings model_if::settings() const {
    std::lock_guard<std::mutex> g(_mu);
    return _config.settings;
}

void model_if::update(const model_settings& s) {
    check_settings(s);
    std::lock_guard<std::mutex> g(_mu);
    for (int i = 0; i < 2; ++i) {
        lane& l = *_lanes[i];
        if (lane_planned_by(s, i)) plan_sizes(l, s.batching.max_batch);
        l.controller.configure(s.batching);
        l.target.store(l.controller.target(), std::memory_order_relaxed);
    }
    _config.settings = s;
}

void model_if::send(std::span<const uint8_t> result, const dp::request& r, const dp::response_spec& spec) {
    rte_mbuf* out[16];
    const uint16_t k = dp::build_response(_plane.eth().tx_pool(), r.reply, r.key.request_id, spec, result,
                                          _plane.eth().max_fragment_payload(), out, 16);
    const uint16_t queued = k ? _plane.send(out, k) : 0;
    if (queued < k) rte_pktmbuf_free_bulk(out + queued, k - queued);
    (k && queued == k ? _counters.responses_sent : _counters.responses_failed).add();
}

void model_if::answer_error(const dp::request& r, wire::status status, const std::string& message) {
    dp::response_spec spec;
    spec.kind = wire::kind::error;
    spec.status = status;
    _counters.error_responses.add();
    send({reinterpret_cast<const uint8_t*>(message.data()), message.size()}, r, spec);
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
        if (r->format != uint8_t(wire::format::image_u8_hwc)) {
            answer_error(*r, wire::status::unsupported_format, "this IF takes u8 HWC images");
            _errors.add();
            dp::release(r);
        } else if (r->dims[0] != _h || r->dims[1] != _w || r->dims[2] != _c) {
            answer_error(*r, wire::status::bad_request,
                         "expected a " + std::to_string(_h) + "x" + std::to_string(_w) + "x" + std::to_string(_c) +
                             " image, got " + std::to_string(r->dims[0]) + "x" + std::to_string(r->dims[1]) + "x" +
                             std::to_string(r->dims[2]));
            _errors.add();
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

void model_if::shed_late(lane& l, uint64_t now) {
    // A request that waited w and would finish at w + service(batch) > SLO cannot be served
    // in time any more: answering it now keeps the ones behind it inside their SLO.
    const double slo = _config.settings.batching.slo_ms;
    const double service = l.controller.predict_ms(std::min(l.count, l.controller.target()));
    if (!(service > 0)) return;
    while (l.count) {
        const double waited = double(now - l.front()->last_tsc) * 1e3 / double(_tsc_hz);
        if (waited + service <= slo) break;
        dp::request* r = l.pop();
        _pending.fetch_sub(1, std::memory_order_relaxed);
        answer_error(*r, wire::status::overloaded,
                     "overloaded: cannot answer within the " + std::to_string(int64_t(slo)) + " ms SLO");
        _shed.add();
        dp::release(r);
    }
}

void model_if::dispatch(lane& l) {
    const uint32_t largest = l.instances.rbegin()->first;
    const uint32_t n = std::min({l.count, std::max(l.controller.target(), 1u), largest});
    const auto it = l.instances.lower_bound(n);
    ml::instance& in = *it->second;
    const uint32_t size = it->first;
    l.segments.clear();
    l.first.assign(1, 0);
    for (uint32_t i = 0; i < n; ++i) {
        l.batch[i] = l.pop();
        _pending.fetch_sub(1, std::memory_order_relaxed);
    }
    for (uint32_t i = 0; i < size; ++i) {
        const auto list = l.batch[std::min(i, n - 1)]->gather_list();
        l.segments.insert(l.segments.end(), reinterpret_cast<const ml::kernels::gather_segment*>(list.data()),
                          reinterpret_cast<const ml::kernels::gather_segment*>(list.data()) + list.size());
        l.first.push_back(uint32_t(l.segments.size()));
    }
    ml::runtime::image_batch images;
    images.segments = l.segments;
    images.first = l.first;
    for (int c = 0; c < 3; ++c) {
        images.mean[c] = _config.mean[c];
        images.std[c] = _config.std[c];
    }
    gpu::task t;
    try {
        t.launches = _runtime.image_task(in, images);
    } catch (const std::exception& e) {
        for (uint32_t i = 0; i < n; ++i) {
            answer_error(*l.batch[i], wire::status::internal_error, e.what());
            _errors.add();
            dp::release(l.batch[i]);
        }
        return;
    }
    t.cls = l.cls;
    t.priority = _config.settings.priority;
    lane* lp = &l;
    t.on_done = [lp](const gpu::task_result& r) {
        lp->result = r;
        lp->done.store(true, std::memory_order_release);
    };
    l.batch_n = n;
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
    if (res.status != gpu::task_status::completed) {
        const bool stopping = res.status == gpu::task_status::cancelled || res.status == gpu::task_status::rejected;
        for (uint32_t i = 0; i < n; ++i) {
            answer_error(*l.batch[i], stopping ? wire::status::shutting_down : wire::status::internal_error,
                         stopping ? "the daemon is stopping" : "the device failed to run the model");
            _errors.add();
            dp::release(l.batch[i]);
        }
    } else {
        const double service_ms = double(now - l.launch_tsc) * 1e3 / double(_tsc_hz);
        const std::vector<ml::tensor> outputs = _runtime.read_outputs(*l.batch_instance);
        const ml::tensor& scores = outputs.at(0);
        const int64_t per = scores.elements() / l.batch_instance->batch();
        const uint32_t k = uint32_t(std::min<int64_t>(_config.top_k, per));
        std::vector<int64_t> order(static_cast<size_t>(per));
        std::vector<uint8_t> result(size_t(k) * 8);
        const double slo_s = _config.settings.batching.slo_ms / 1e3;
        double worst_ms = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const float* s = scores.view<float>().data() + int64_t(i) * per;
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
            dp::response_spec spec;
            spec.format = wire::format::result_topk;
            spec.dims[0] = uint16_t(k);
            send(result, *l.batch[i], spec);
            const double latency_s = double(rte_rdtsc() - l.batch[i]->last_tsc) / double(_tsc_hz);
            record_latency(latency_s);
            worst_ms = std::max(worst_ms, latency_s * 1e3);
            if (latency_s > slo_s) _slo_violations.add();
            _responses.add();
            dp::release(l.batch[i]);
        }
        _batches.add();
        _batched_requests.add(n);
        l.controller.observe(n, service_ms, worst_ms);
        l.target.store(l.controller.target(), std::memory_order_relaxed);
    }
    l.busy = false;
    l.done.store(false, std::memory_order_relaxed);
    _in_flight.fetch_sub(1, std::memory_order_relaxed);
}

uint32_t model_if::poll() {
    std::unique_lock<std::mutex> g(_mu, std::try_to_lock);
    if (!g.owns_lock()) return 0;
    uint32_t work = 0;
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
        if (l->cls == gpu::task_class::rt || arrivals_stopped || l->controller.dispatch_now(l->count, oldest_ms)) {
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
            _errors.add();
            dp::release(r);
        }
    void* r;
    while (rte_ring_sc_dequeue(_ring, &r) == 0) {
        auto* q = static_cast<dp::request*>(r);
        _counters.requests_served.add();
        answer_error(*q, wire::status::shutting_down, "the daemon is stopping");
        _errors.add();
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
        {"batching", ml::batching_policy_name(s.batching.policy)},
        {"batch_size", _lanes[s.cls == gpu::task_class::rt ? 0 : 1]->target.load(std::memory_order_relaxed)},
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
    };
    nlohmann::json sources = nlohmann::json::array();
    for (uint32_t ip : s.rt_sources_be) sources.push_back(ip_str(ip));
    j["rt_sources"] = sources;
    std::lock_guard<std::mutex> g(_mu);
    const lane& own = *_lanes[s.cls == gpu::task_class::rt ? 0 : 1];
    if (!own.instances.empty()) {
        const ml::instance& one = *own.instances.begin()->second;
        const auto in = one.inputs().at(0);
        j["input"] = {{"name", in.name}, {"type", ml::dtype_name(in.type)}, {"shape", in.shape}};
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
    nlohmann::json instances = nlohmann::json::array();
    for (int i = 0; i < 2; ++i)
        for (const auto& [b, in] : _lanes[i]->instances)
            instances.push_back({{"lane", i == 0 ? "rt" : "be"}, {"batch", b}, {"bytes", in->memory_bytes()}});
    j["instances"] = instances;
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
    uint32_t batch = _lanes[s.cls == gpu::task_class::rt ? 0 : 1]->target.load(std::memory_order_relaxed);
    return {
        {"name", _config.name},
        {"udp_port", _config.udp_port},
        {"class", class_name(s.cls)},
        {"slo_ms", s.batching.slo_ms},
        {"requests_total", _counters.requests_served.get()},
        {"responses_total", _responses.get()},
        {"errors_total", _errors.get()},
        {"shed_total", _shed.get()},
        {"slo_violations_total", _slo_violations.get()},
        {"send_failures_total", _counters.responses_failed.get()},
        {"queue_depth", queued()},
        {"in_flight", _in_flight.load(std::memory_order_relaxed)},
        {"batch_size", batch},
        {"batches_total", _batches.get()},
        {"batched_requests_total", _batched_requests.get()},
        {"preemptions_total", _preemptions.get()},
        {"reexecuted_kernels_total", _reexecuted.get()},
        {"latency_seconds",
         {{"le", le}, {"counts", counts}, {"sum", double(_latency_sum_ns.load(std::memory_order_relaxed)) / 1e9},
          {"count", total}}},
        {"latency_ms",
         {{"p50", quantile(0.5)},
          {"p90", quantile(0.9)},
          {"p99", quantile(0.99)},
          {"max", max_ms}}},
    };
}

}  // namespace reefline::ifm
