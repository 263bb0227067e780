// reefgen: reassembly of fragmented messages (requests in `check`, responses in `check` and
// `send`), following the receiver rules of the protocol: fragments may come in any order or
// twice; the first copy of an index wins; a fragment whose total_length, frag_count, kind,
// format, status or dims disagree with the entry's first fragment is ignored; a message is
// complete when every index 0..frag_count-1 is present.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dataplane/protocol.h"
#include "tools/reefgen/common.h"

namespace reefline::reefgen {

struct assembled_message {
    flow_key key;
    wire::fields head;             // fields of the first fragment seen
    std::vector<uint8_t> payload;  // fragments concatenated in offset order
    bool tiles = true;             // offsets tile [0, total_length) exactly, no gap or overlap
};

// Bounds on what incomplete messages may hold, for receivers that run for long (`send`):
// beyond them the oldest incomplete messages are dropped. 0: no bound (a capture bounds it).
struct assembler_limits {
    size_t max_pending = 0;        // incomplete messages
    size_t max_pending_bytes = 0;  // fragment bytes they hold
};

class message_assembler {
public:
    enum class outcome : uint8_t {
        accepted,          // filed, message still incomplete
        completed,         // this fragment completed the message
        duplicate,         // index already present: ignored
        inconsistent,      // disagrees with the entry's first fragment: ignored
        after_completion,  // key already completed (only with remember_completed)
        too_large,         // the message alone would hold more than max_pending_bytes: dropped
    };

    // remember_completed: keep the keys of completed messages so that late duplicates are
    // reported as such instead of opening a new entry (what `check` wants for requests).
    explicit message_assembler(bool remember_completed, assembler_limits limits = {})
        : _remember_completed(remember_completed), _limits(limits) {}

    // `f` must describe a fragment with frag_index < frag_count and
    // payload_offset + fragment.size() <= total_length (callers validate first).
    outcome add(const flow_key& key, const wire::fields& f, std::span<const uint8_t> fragment,
                assembled_message& completed);

    struct pending_info {
        flow_key key;
        wire::fields head;
        uint32_t received = 0;  // distinct indices present
    };
    // Messages still missing fragments, oldest first.
    std::vector<pending_info> pending() const;
    bool is_completed(const flow_key& key) const { return _completed.count(key) != 0; }
    size_t pending_bytes() const { return _pending_bytes; }
    uint64_t evicted() const { return _evicted; }  // incomplete messages dropped by the limits

private:
    struct entry {
        wire::fields head;
        uint32_t received = 0;
        size_t bytes = 0;
        std::list<flow_key>::iterator age;  // its place in _oldest_first
        std::vector<bool> present;
        std::vector<uint32_t> offsets;
        std::vector<std::vector<uint8_t>> pieces;
    };
    using entry_map = std::unordered_map<flow_key, entry, flow_key_hash>;
    void erase(entry_map::iterator it);

    bool _remember_completed;
    assembler_limits _limits;
    entry_map _entries;
    std::list<flow_key> _oldest_first;  // keys of _entries by first fragment
    size_t _pending_bytes = 0;
    uint64_t _evicted = 0;
    std::unordered_set<flow_key, flow_key_hash> _completed;
};

std::string_view to_string(message_assembler::outcome o);

}  // namespace reefline::reefgen
