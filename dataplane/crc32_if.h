// The built-in diagnostic IF `crc32`: answers each request with its total length and the
// CRC32C of its reassembled payload, computed segment by segment from the gather list. It
// proves the network path end to end (reefgen check verifies every answer) and stays in
// the product as an operator's diagnostic.
#pragma once

#include <rte_ring.h>

#include <cstdint>
#include <string>

#include "dataplane/counters.h"
#include "dataplane/engine.h"
#include "dataplane/if_service.h"
#include "dataplane/if_table.h"
#include "dataplane/request.h"
#include "dataplane/response.h"

namespace reefline::dp {

// The result of the crc32 IF for a gather list: be32 total length, be32 CRC32C.
struct crc32_result {
    uint32_t total_length;
    uint32_t crc;
};
crc32_result crc32_of(const request& r);

class crc32_if final : public if_service {
public:
    crc32_if(dataplane& dp, std::string name, uint16_t udp_port, uint16_t slot,
             uint32_t ring_size = 1024);
    ~crc32_if() override;  // releases requests still queued
    crc32_if(const crc32_if&) = delete;
    crc32_if& operator=(const crc32_if&) = delete;

    if_binding binding() const override { return {_name, _udp_port, _slot, _ring}; }
    // Answers up to one burst of queued requests (none while earlier answers wait for
    // transmit buffers); returns how many requests, or 1 when only answers moved.
    uint32_t poll() override;
    // Requests on the ring and answers not yet on the tx ring.
    uint32_t queued() const override { return rte_ring_count(_ring) + _answers.size(); }
    const if_counters& counters() const override { return _counters; }
    const std::string& name() const override { return _name; }

private:
    dataplane& _dp;
    std::string _name;
    uint16_t _udp_port;
    uint16_t _slot;
    rte_ring* _ring;
    if_counters _counters;
    response_queue _answers;
};

}  // namespace reefline::dp
