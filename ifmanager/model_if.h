// A model IF: serves requests for one ONNX model on one UDP port. Complete requests come off
// its ring as gather lists of packet payloads; a batch of them runs as one task (gather
// kernel straight from the payloads into the input tensor, then the model), and each request
// is answered with its top-k classes, or with an error datagram that names the problem.
#pragma once

#include <rte_ring.h>

#include <map>
#include <memory>
#include <string>

#include "dataplane/engine.h"
#include "dataplane/if_service.h"
#include "dataplane/response.h"
#include "libml/libml.h"

namespace reefline::ifm {

struct model_if_config {
    std::string name;
    std::string onnx;           // model file
    uint16_t udp_port = 0;
    uint16_t slot = 0;
    uint32_t max_batch = 8;     // requests taken per task
    uint32_t top_k = 5;
    float mean[3] = {123.675f, 116.28f, 103.53f};  // ImageNet, u8 scale
    float std[3] = {58.395f, 57.12f, 57.375f};
    uint32_t ring_size = 1024;
};

class model_if final : public dp::if_service {
public:
    // Loads the model (weights shared with other IFs of the same model via `shared`, when
    // given) and checks it takes one [N, C, H, W] f32 image input. Throws on a bad model.
    model_if(dp::dataplane& plane, ml::runtime& runtime, const model_if_config& config,
             std::shared_ptr<ml::model> shared = nullptr);
    ~model_if() override;

    dp::if_binding binding() const override { return {_config.name, _config.udp_port, _config.slot, _ring}; }
    uint32_t poll() override;
    uint32_t queued() const override { return rte_ring_count(_ring); }
    const dp::if_counters& counters() const override { return _counters; }
    const std::string& name() const override { return _config.name; }

    const std::shared_ptr<ml::model>& model() const { return _model; }
    // The image shape requests must have: H, W, C.
    uint16_t height() const { return _h; }
    uint16_t width() const { return _w; }
    uint16_t channels() const { return _c; }

private:
    ml::instance& instance_for(uint32_t batch);
    void answer_error(const dp::request& r, wire::status status, const std::string& message);
    void send(std::span<const uint8_t> result, const dp::request& r, const dp::response_spec& spec);

    dp::dataplane& _plane;
    ml::runtime& _runtime;
    model_if_config _config;
    std::shared_ptr<ml::model> _model;
    std::map<uint32_t, std::unique_ptr<ml::instance>> _by_batch;  // plans per batch size
    rte_ring* _ring = nullptr;
    dp::if_counters _counters;
    uint16_t _h = 0, _w = 0, _c = 0;
};

}  // namespace reefline::ifm
