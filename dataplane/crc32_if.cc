#include "dataplane/crc32_if.h"

#include <rte_errno.h>

#include <stdexcept>

#include "clients/c/wire/crc32c.h"
#include "dataplane/response.h"

namespace reefline::dp {

crc32_result crc32_of(const request& r) {
    uint32_t crc = 0;
    for (const gather_segment& s : r.gather_list()) crc = crc32c_extend(crc, s.data, s.length);
    return {r.total_length, crc};
}

crc32_if::crc32_if(dataplane& dp, std::string name, uint16_t udp_port, uint16_t slot,
                   uint32_t ring_size)
    : _dp(dp), _name(std::move(name)), _udp_port(udp_port), _slot(slot),
      _answers(dp, [this](uint32_t, bool sent) { (sent ? _counters.responses_sent : _counters.responses_failed).add(); }) {
    const std::string ring_name = "if_" + std::to_string(slot) + "_" + std::to_string(udp_port);
    _ring = rte_ring_create(ring_name.c_str(), rte_align32pow2(ring_size), rte_socket_id(),
                            RING_F_SC_DEQ);
    if (!_ring)
        throw std::runtime_error("crc32 IF '" + _name + "': ring: " + rte_strerror(rte_errno));
}

crc32_if::~crc32_if() {
    void* r;
    while (rte_ring_sc_dequeue(_ring, &r) == 0) release(static_cast<request*>(r));
    rte_ring_free(_ring);
}

uint32_t crc32_if::poll() {
    if (!_answers.empty()) {
        // Backpressure: no new request is taken while answers wait for transmit buffers.
        const uint32_t moved = _answers.flush();
        if (!_answers.empty()) return moved ? 1 : 0;
    }
    constexpr unsigned burst = 32;
    request* reqs[burst];
    const unsigned n =
        rte_ring_sc_dequeue_burst(_ring, reinterpret_cast<void**>(reqs), burst, nullptr);
    for (unsigned i = 0; i < n; ++i) {
        request* r = reqs[i];
        const crc32_result c = crc32_of(*r);
        const uint32_t be[2] = {htonl(c.total_length), htonl(c.crc)};
        response_spec spec;
        spec.format = wire::format::result_crc32;
        _counters.requests_served.add();
        _answers.push(r->reply, r->key.request_id, spec, {reinterpret_cast<const uint8_t*>(be), sizeof be}, 0);
        release(r);
    }
    return n;
}

}  // namespace reefline::dp
