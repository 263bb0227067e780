// The data plane: a port, per-rx-queue state (reassembly table and counters, one lcore
// each), the IF table, and the response tx path.
//
// Threads: poll_rx(q) is called by the one lcore that owns queue q; send() by any IF
// consumer; poll_tx() by one lcore. On a single lcore all three run in one loop.
#pragma once

#include <rte_cycles.h>
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
    // The subnet's prefix length when known (1..30): its directed broadcast address is then
    // neither answered nor answered to. 0: unknown.
    uint8_t local_prefix_length = 0;
};

inline constexpr uint16_t rx_burst_size = 32;

// The reassembly watermarks for one rx queue (reassembly_config::held_high/held_low) that
// `config` leaves at 0, derived from the rx pool so that partial requests can never drain it:
// each queue's share of the pool, less what its NIC ring holds (rx_descriptors), two bursts in
// the lcore's hands and the mempool's per-lcore cache, is split in half between incomplete
// requests and complete ones waiting on IF rings; the low watermark is 3/4 of the high one.
// Values given are checked (low < high, high within the queue's share). Throws
// std::invalid_argument naming the problem.
reassembly_config derive_held_limits(const port_config& port, reassembly_config config);

class dataplane;

// One rx queue's state, owned by the lcore that polls it, and the receive path after
// rte_eth_rx_burst. Public so that benchmarks drive exactly this code with in-memory mbufs.
struct alignas(64) rx_queue {
    uint16_t queue_id = 0;
    uint16_t port_id = 0;
    uint32_t subnet_broadcast_be = 0;  // refused as source and destination (0: unknown)
    rx_counters counters;
    std::unique_ptr<reassembler> reasm;

    // Parses, looks up the IF, files into reassembly and hands complete requests to their
    // IF's ring. Takes ownership of every mbuf. `arp`: where ARP requests are answered
    // (null: counted as not_ipv4).
    void process(const port_map* map, rte_mbuf** pkts, uint16_t n, uint64_t now_tsc, dataplane* arp);
    // Files validated fragments; complete requests go to their IF's ring.
    void file(const port_map* map, const fragment* frags, uint32_t n, uint64_t now_tsc);
};

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
    uint16_t poll_rx(uint16_t q) { return poll_rx(q, rte_rdtsc()); }
    // The same at a given time (TSC units): tests and fuzzers drive ageing with a clock of
    // their own.
    uint16_t poll_rx(uint16_t q, uint64_t now_tsc);
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

    // Answers an ARP request for our address and frees it; false (m untouched) when `m` is no
    // such request or the reply could not be queued.
    bool answer_arp(rx_queue& q, rte_mbuf* m);

private:
    std::unique_ptr<dp::port> _port;
    if_table _ifs;
    std::vector<std::unique_ptr<rx_queue>> _queues;

    rte_ring* _tx_ring = nullptr;
    uint32_t _local_ip_be = 0;
    uint8_t _local_mac[6] = {};
    tx_counters _tx;
    // Transmit staging for packets the NIC did not take on the last poll.
    rte_mbuf* _tx_stage[rx_burst_size * 2];
    uint16_t _tx_staged = 0;
};

}  // namespace reefline::dp
