#include "ifmanager/model_if.h"

#include <rte_errno.h>

#include <algorithm>
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

model_if::model_if(dp::dataplane& plane, ml::runtime& runtime, const model_if_config& config,
                   std::shared_ptr<ml::model> shared)
    : _plane(plane), _runtime(runtime), _config(config) {
    if (_config.max_batch == 0 || _config.max_batch > 256) throw std::invalid_argument("max_batch must be 1..256");
    _model = shared ? std::move(shared) : _runtime.load_model(_config.onnx);
    ml::instance& one = instance_for(1);
    const auto ins = one.inputs();
    if (ins.size() != 1 || ins[0].type != ml::dtype::f32 || ins[0].shape.size() != 4 || ins[0].shape[1] > 3 ||
        ins[0].shape[2] > 65535 || ins[0].shape[3] > 65535)
        throw std::invalid_argument("model '" + _config.name + "': expected one f32 [N, C<=3, H, W] image input, got " +
                                    (ins.empty() ? std::string("none") : ml::shape_str(ins[0].shape)));
    _c = uint16_t(ins[0].shape[1]);
    _h = uint16_t(ins[0].shape[2]);
    _w = uint16_t(ins[0].shape[3]);
    const std::string ring_name = "mif_" + std::to_string(_config.slot) + "_" + std::to_string(_config.udp_port);
    _ring = rte_ring_create(ring_name.c_str(), rte_align32pow2(_config.ring_size), rte_socket_id(), RING_F_SC_DEQ);
    if (!_ring) throw std::runtime_error("model IF '" + _config.name + "': ring: " + rte_strerror(rte_errno));
}

model_if::~model_if() {
    void* r;
    while (rte_ring_sc_dequeue(_ring, &r) == 0) dp::release(static_cast<dp::request*>(r));
    rte_ring_free(_ring);
}

ml::instance& model_if::instance_for(uint32_t batch) {
    auto it = _by_batch.find(batch);
    if (it != _by_batch.end()) return *it->second;
    auto in = _runtime.link_model(_model);
    if (in->batch() != batch) _runtime.configure_batch(*in, batch);
    return *_by_batch.emplace(batch, std::move(in)).first->second;
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

uint32_t model_if::poll() {
    dp::request* reqs[256];
    const unsigned n = rte_ring_sc_dequeue_burst(_ring, reinterpret_cast<void**>(reqs), _config.max_batch, nullptr);
    if (n == 0) return 0;
    // Requests the model cannot take are answered with an error; the rest form the batch.
    dp::request* batch[256];
    uint32_t nb = 0;
    for (unsigned i = 0; i < n; ++i) {
        dp::request* r = reqs[i];
        _counters.requests_served.add();
        if (r->format != uint8_t(wire::format::image_u8_hwc)) {
            answer_error(*r, wire::status::unsupported_format, "this IF takes u8 HWC images");
            dp::release(r);
        } else if (r->dims[0] != _h || r->dims[1] != _w || r->dims[2] != _c) {
            answer_error(*r, wire::status::bad_request,
                         "expected a " + std::to_string(_h) + "x" + std::to_string(_w) + "x" + std::to_string(_c) +
                             " image, got " + std::to_string(r->dims[0]) + "x" + std::to_string(r->dims[1]) + "x" +
                             std::to_string(r->dims[2]));
            dp::release(r);
        } else {
            batch[nb++] = r;
        }
    }
    if (nb == 0) return n;
    std::vector<ml::kernels::gather_segment> segments;
    std::vector<uint32_t> first{0};
    for (uint32_t i = 0; i < nb; ++i) {
        const auto list = batch[i]->gather_list();
        const size_t at = segments.size();
        segments.resize(at + list.size());
        std::memcpy(segments.data() + at, list.data(), list.size_bytes());
        first.push_back(uint32_t(segments.size()));
    }
    ml::runtime::image_batch images;
    images.segments = segments;
    images.first = first;
    for (int c = 0; c < 3; ++c) {
        images.mean[c] = _config.mean[c];
        images.std[c] = _config.std[c];
    }
    std::vector<ml::tensor> outputs;
    try {
        _runtime.infer_images(instance_for(nb), images, outputs);
    } catch (const std::exception& e) {
        for (uint32_t i = 0; i < nb; ++i) {
            answer_error(*batch[i], wire::status::internal_error, e.what());
            dp::release(batch[i]);
        }
        return n;
    }
    // The payloads have been read into the input tensor: the mbufs can go back now.
    const ml::tensor& scores = outputs.at(0);
    const int64_t per = scores.elements() / nb;
    const uint32_t k = uint32_t(std::min<int64_t>(_config.top_k, per));
    std::vector<int64_t> order(static_cast<size_t>(per));
    std::vector<uint8_t> result(size_t(k) * 8);
    for (uint32_t i = 0; i < nb; ++i) {
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
        send(result, *batch[i], spec);
        dp::release(batch[i]);
    }
    return n;
}

}  // namespace reefline::ifm
