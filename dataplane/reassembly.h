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

// Which incomplete requests go first when they hold too many mbufs.
enum class eviction_order : uint8_t {
    largest_first,  // the request holding the most mbufs (to within size_class_width)
    oldest_first,   // the request whose first fragment came first
};
const char* to_string(eviction_order o);

struct reassembly_config {
    uint32_t entries = 1024;         // concurrent requests under reassembly (and in IF queues)
    uint64_t age_limit_us = 100000;  // a request must complete within this since its first fragment
    // Watermarks on the mbufs that incomplete requests hold, as Linux bounds IP reassembly
    // (ipfrag_high_thresh, ipfrag_low_thresh): when they hold more than `held_high`, incomplete
    // requests are evicted (drop memory_pressure) until they hold at most `held_low`, so that
    // partial requests cannot drain the rx pool. held_high 0: the data plane derives both
    // from its rx pool (derive_held_limits); a reassembler built on its own has no limit then.
    // held_low 0: 3/4 of held_high.
    uint32_t held_high = 0;
    uint32_t held_low = 0;
    eviction_order eviction = eviction_order::largest_first;
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
    // What incomplete requests hold now: mbufs, and the memory those take (an mbuf's header
    // and buffer, whatever the frame's length: what Linux counts as truesize).
    uint32_t held_mbufs() const { return _held_mbufs; }
    uint64_t held_bytes() const { return uint64_t(_held_mbufs) * _mbuf_bytes; }
    uint32_t held_high() const { return _held_high; }
    uint32_t held_low() const { return _held_low; }
    eviction_order eviction() const { return _eviction; }
    rte_mempool* entry_pool() const { return _entries; }

private:
    request* create(const fragment& f, uint64_t now_tsc, hash_sig_t sig, request*& evicted);
    void unlink(request* r);
    void drop_request(request* r, drop_reason why);  // removes from table, frees, counts
    request* file_one(const fragment& f, request* r, uint64_t now_tsc, bool& malformed);
    // Evicts incomplete requests until they hold at most _held_low mbufs.
    void shed();
    // Size classes for largest_first: class k holds the requests with k * size_class_width ..
    // (k + 1) * size_class_width - 1 fragments, the first to reach that size first. A request
    // changes class once per size_class_width fragments, so keeping the classes costs the hot
    // path one test per fragment and a relink per 16, and finding the largest is a bit scan.
    void enter_size_class(request* r, uint8_t size_class);
    void leave_size_class(request* r);
    static constexpr unsigned size_class_width = 16;
    static constexpr unsigned size_classes = wire::max_fragments / size_class_width;  // 64
    static_assert(size_classes <= 64, "one bit per class in _size_classes_used");
    struct size_list {
        request* first = nullptr;
        request* last = nullptr;
    };
    size_list _by_size[size_classes];
    uint64_t _size_classes_used = 0;  // bit k: _by_size[k] is not empty

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
    uint32_t _held_mbufs = 0;
    uint32_t _mbuf_bytes = 0;  // header + buffer of the mbufs filed (one pool per port)
    uint32_t _held_high;  // UINT32_MAX: no limit
    uint32_t _held_low;
    eviction_order _eviction;
};

}  // namespace reefline::dp
