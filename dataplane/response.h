// Response datagrams: the request's Ethernet/IPv4/UDP addresses swapped, a reefline header
// of kind response or error, and the result cut into fragments like a request's payload.
#pragma once

#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <cstdint>
#include <span>

#include "dataplane/packet.h"
#include "dataplane/protocol.h"

namespace reefline::dp {

struct response_spec {
    wire::kind kind = wire::kind::response;
    wire::format format = wire::format::raw;
    wire::status status = wire::status::ok;
    uint16_t dims[4] = {0, 0, 0, 0};
};

// Builds the datagrams for one response into `out`. Returns how many (>= 1), or 0 when
// the pool ran dry or `capacity` is too small; nothing is leaked in either case.
uint16_t build_response(rte_mempool* pool, const reply_address& to, uint64_t request_id,
                        const response_spec& spec, std::span<const uint8_t> result,
                        uint32_t max_fragment_payload, rte_mbuf** out, uint16_t capacity);

// Turns an ARP request (checked by is_arp_request_for) into the reply from `local_mac`,
// in a new mbuf from `pool`; nullptr when the pool is dry.
rte_mbuf* build_arp_reply(rte_mempool* pool, const uint8_t* request, const uint8_t local_mac[6]);

}  // namespace reefline::dp
