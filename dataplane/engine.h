// The data plane: a port, per-rx-queue state (reassembly table and counters, one lcore
// each), the IF table, and the response tx path.
//
// Threads: poll_rx(q) is called by the one lcore that owns queue q; send() by any IF
// consumer; poll_tx() by one lcore. On a single lcore all three run in one loop.
#pragma once

#include <rte_ring.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dataplane/counters.h"
#include "dataplane/if_table.h"
#include "dataplane/port.h"
#include "dataplane/reassembly.h"

namespace reefline::dp {

struct dataplane_config {
    port_config port;
    reassembly_config reassembly;  // per rx queue
    uint32_t tx_ring_size = 4096;
    uint32_t local_ip_be = 0;  // answer ARP requests for this address (0: none)
};

inline constexpr uint16_t rx_burst_size = 32;

class dataplane {
public:
    explicit dataplane(const dataplane_config& config);
    ~dataplane();
    dataplane(const dataplane&) = delete;
    dataplane& operator=(const dataplane&) = delete;

    if_table& ifs() { return _ifs; }
    dp::port& eth() { return *_port; }
    uint16_t rx_queues() const { return uint16_t(_queues.size()); }

    // Receives and files one burst on queue q, expires old requests, hands complete ones to
    // their IF's ring. Returns the number of packets received.
    uint16_t poll_rx(uint16_t q);
    // Frees every request still under reassembly on queue q (counted as timeouts).
    void flush(uint16_t q);
    // The lcore that polls q registers itself as an RCU reader of the IF table.
    void rx_online(uint16_t q) { _ifs.reader_online(q); }
    void rx_offline(uint16_t q) { _ifs.reader_offline(q); }

    // Queues response mbufs for transmission (any thread). Returns how many were taken; the
    // caller keeps (and must free) the rest.
    uint16_t send(rte_mbuf** mbufs, uint16_t n);
    // Transmits queued responses; returns packets sent. Unsent packets are retried later.
    uint16_t poll_tx();
    uint32_t tx_pending() const { return rte_ring_count(_tx_ring); }

    counter_snapshot counters() const;
    const rx_counters& queue_counters(uint16_t q) const { return _queues[q]->counters; }
    const reassembler& queue_reassembler(uint16_t q) const { return *_queues[q]->reasm; }

private:
    struct alignas(64) rx_queue_state {
        uint16_t queue_id;
        rx_counters counters;
        std::unique_ptr<reassembler> reasm;
    };

    std::unique_ptr<dp::port> _port;
    if_table _ifs;
    std::vector<std::unique_ptr<rx_queue_state>> _queues;
    // Answers an ARP request for our address; false when `m` is no such request.
    bool answer_arp(rx_queue_state& s, rte_mbuf* m);

    rte_ring* _tx_ring = nullptr;
    uint32_t _local_ip_be = 0;
    uint8_t _local_mac[6] = {};
    tx_counters _tx;
    // Transmit staging for packets the NIC did not take on the last poll.
    rte_mbuf* _tx_stage[rx_burst_size * 2];
    uint16_t _tx_staged = 0;
};

}  // namespace reefline::dp
