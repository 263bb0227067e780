// Per-lcore zero-copy reassembly: an rte_hash from flow_key to request entries drawn from a
// fixed mempool, and an age list (oldest first) for timeouts and eviction. One writer: the
// rx lcore that owns it (RSS sends every fragment of a request to the same queue), so the
// table needs no locks.
#pragma once

#include <rte_hash.h>
#include <rte_mempool.h>

#include <cstdint>
#include <string>

#include "dataplane/counters.h"
#include "dataplane/packet.h"
#include "dataplane/request.h"

namespace reefline::dp {

struct reassembly_config {
    uint32_t entries = 1024;         // concurrent requests under reassembly (and in IF queues)
    uint64_t age_limit_us = 100000;  // a request must complete within this since its first fragment
    int socket_id = 0;
};

// One fragment to file: the parsed frame plus what the reply needs.
struct fragment {
    rte_mbuf* mbuf;
    const udp_view* udp;
    fragment_view view;
    uint16_t if_slot;
    uint16_t port_id;
};

class reassembler {
public:
    reassembler(const std::string& name, const reassembly_config& config, rx_counters& counters);
    ~reassembler();
    reassembler(const reassembler&) = delete;
    reassembler& operator=(const reassembler&) = delete;

    // Files a burst of validated fragments. Each mbuf is either held by a request or freed
    // and counted. Completed requests are written to `completed` (capacity >= n) in
    // completion order; returns how many.
    uint32_t file_burst(const fragment* frags, uint32_t n, uint64_t now_tsc, request** completed);

    // Frees requests whose age limit has passed (counted as timeouts).
    void expire(uint64_t now_tsc);
    // Frees every pending request (counted as timeouts): end of an offline run, shutdown.
    void flush();

    uint32_t pending() const { return _pending; }
    rte_mempool* entry_pool() const { return _entries; }

private:
    request* create(const fragment& f, uint64_t now_tsc, hash_sig_t sig, request*& evicted);
    void unlink(request* r);
    void drop_request(request* r, drop_reason why);  // removes from table, frees, counts
    request* file_one(const fragment& f, request* r, uint64_t now_tsc, bool& malformed);

    // A direct-mapped cache in front of _table, indexed by the key's hash: a fragment of a
    // request that is under reassembly finds it here without the rte_hash lookup. Filled
    // when a request is created or found in _table, cleared when it leaves the table.
    struct recent_slot {
        uint64_t key[2];  // flow_key as two words
        request* r;
    };
    static constexpr uint32_t recent_size = 1024;
    recent_slot _recent[recent_size] = {};

    rte_hash* _table = nullptr;
    rte_mempool* _entries = nullptr;
    rx_counters& _counters;
    uint64_t _age_limit_tsc;
    request* _oldest = nullptr;
    request* _newest = nullptr;
    uint32_t _pending = 0;
};

}  // namespace reefline::dp
