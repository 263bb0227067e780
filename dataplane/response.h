// Response datagrams: the request's Ethernet/IPv4/UDP addresses swapped, a reefline header
// of kind response or error, and the result cut into fragments like a request's payload.
#pragma once

#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "dataplane/packet.h"
#include "clients/c/wire/protocol.h"

namespace reefline::dp {

struct response_spec {
    wire::kind kind = wire::kind::response;
    wire::format format = wire::format::raw;
    wire::status status = wire::status::ok;
    uint16_t dims[4] = {0, 0, 0, 0};
};

// Builds datagrams [first, first + n) of one response into `out`, n at most `capacity` and
// what the pool has now (0 when it is dry). The response is cut into ceil(size / max payload)
// fragments (one when `result` is empty); response_fragments() says how many.
uint16_t build_response_fragments(rte_mempool* pool, const reply_address& to, uint64_t request_id,
                                  const response_spec& spec, std::span<const uint8_t> result,
                                  uint32_t max_fragment_payload, uint32_t first, rte_mbuf** out,
                                  uint16_t capacity);
uint32_t response_fragments(size_t result_bytes, uint32_t max_fragment_payload);

// Turns an ARP request (checked by is_arp_request_for) into the reply from `local_mac`,
// in a new mbuf from `pool`; nullptr when the pool is dry.
rte_mbuf* build_arp_reply(rte_mempool* pool, const uint8_t* request, const uint8_t local_mac[6]);

class dataplane;

// The answers of one IF on their way to the tx ring: built fragment by fragment as the
// transmit pool and ring have room, in order, never dropped for want of buffers. An answer
// of 1024 fragments thus goes out through a pool smaller than a batch of them, and an IF
// whose answers wait stops taking requests (its ring fills and the data plane counts
// ring_full drops): backpressure from the port to the senders. An answer that makes no
// progress for `give_up_ms` (the port takes nothing: link down, a wedged driver) is given up
// and reported as not sent, once; so is every answer still waiting when the queue is cleared.
//
// Used by one thread (the IF's consumer); size() may be read from any.
class response_queue {
public:
    // done(tag, sent): each answer ends exactly once, sent (every fragment on the tx ring) or
    // not (given up, cleared, or refused by push()).
    using done_fn = std::function<void(uint32_t tag, bool sent)>;
    // `capacity`: answers that may wait (beyond it push() refuses); the IF bounds what one
    // poll can add, so this is a backstop.
    response_queue(dataplane& plane, done_fn done, uint32_t capacity = 4096, double give_up_ms = 1000);
    ~response_queue();
    response_queue(const response_queue&) = delete;
    response_queue& operator=(const response_queue&) = delete;

    // Sends what fits of an answer now (when nothing waits before it) and keeps the rest:
    // `payload` stays where it is while `owner` keeps it alive (a batch's output tensors,
    // shared by the batch's answers), and is copied otherwise (small results, error texts;
    // only when it must wait). Returns false when `capacity` answers wait already: the
    // answer is then reported as not sent.
    bool push(const reply_address& to, uint64_t request_id, const response_spec& spec,
              std::span<const uint8_t> payload, uint32_t tag, std::shared_ptr<const void> owner = nullptr);
    // Goes on with the waiting answers, oldest first; returns the fragments queued.
    uint32_t flush();
    // Gives up every waiting answer (reported as not sent).
    void clear();
    bool empty() const { return _waiting.empty(); }
    uint32_t size() const { return _size.load(std::memory_order_relaxed); }
    // Bytes the waiting answers hold of their own (copies; shared outputs are not counted).
    uint64_t own_bytes() const { return _own_bytes; }

private:
    struct entry {
        reply_address to{};
        uint64_t request_id = 0;
        response_spec spec;
        std::span<const uint8_t> payload;  // in `own` or kept alive by `owner`
        std::shared_ptr<const void> owner;
        std::vector<uint8_t> own;
        uint32_t tag = 0;    // the IF's: what it counts when the answer ends
        uint32_t next = 0;   // first fragment not on the ring
        uint32_t count = 0;  // fragments in all
    };
    // Queues fragments of `e` while buffers allow; true when all of it is on the ring.
    bool advance(entry& e, uint32_t& queued);
    void finish(const entry& e, bool sent);

    dataplane& _plane;
    done_fn _done;
    uint32_t _capacity;
    uint64_t _give_up_tsc;
    uint64_t _progress_tsc = 0;  // when the head answer last moved
    std::deque<entry> _waiting;
    std::atomic<uint32_t> _size{0};
    uint64_t _own_bytes = 0;
};

}  // namespace reefline::dp
