// A request under reassembly and, once complete, its descriptor on the IF's ring.
//
// The entry is the descriptor: filing a fragment stores the mbuf pointer and the
// (payload pointer, length, offset) of its data, so when the last fragment arrives the
// gather list is already there, in fragment-index order, which completion checks is also
// offset order. No payload byte is copied. The consumer (an IF) reads the gather list and
// then calls release(), which frees every mbuf once and returns the entry to its pool.
#pragma once

#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <cstdint>
#include <span>

#include "dataplane/packet.h"
#include "clients/c/wire/protocol.h"

namespace reefline::dp {

// Key of the reassembly table: (source IPv4, source UDP port, request id).
struct flow_key {
    uint32_t src_ip_be;
    uint16_t src_port;
    uint16_t zero;  // padding kept zero so the 16 bytes hash deterministically
    uint64_t request_id;
};
static_assert(sizeof(flow_key) == 16);

struct gather_segment {
    const uint8_t* data;
    uint32_t length;
    uint32_t offset;
};

struct alignas(64) request {
    flow_key key;
    reply_address reply;
    uint64_t first_tsc;  // first fragment filed
    uint64_t last_tsc;   // last fragment filed (completion)
    uint32_t total_length;
    uint16_t frag_count;
    uint16_t received;
    uint16_t dims[4];
    uint8_t format;
    uint16_t if_slot;  // which IF the request was filed for
    // The first fragment's frag_count, total_length and dims as on the wire, so that later
    // fragments are checked against it without byte swaps.
    uint16_t frag_count_be;
    uint32_t total_length_be;
    uint64_t dims_be;
    request* older;    // age list (oldest first), while in the table
    request* newer;
    request* size_prev;  // the reassembler's size-class list (largest_first eviction)
    request* size_next;
    uint8_t size_class;  // which size-class list, when in_size_class
    bool in_size_class;
    rte_mempool* pool;  // where release() returns the entry
    uint64_t bitmap[wire::max_fragments / 64];
    rte_mbuf* mbufs[wire::max_fragments];
    gather_segment segments[wire::max_fragments];

    std::span<const gather_segment> gather_list() const { return {segments, frag_count}; }
    bool has(uint32_t index) const { return bitmap[index / 64] >> (index % 64) & 1; }
};

// Frees every mbuf the request holds, exactly once, and returns the entry to its pool.
// Returns the number of mbufs freed.
uint32_t release(request* r);

}  // namespace reefline::dp
