// reefgen: reassembly of fragmented messages (requests in `check`, responses in `check` and
// `send`). The assembler is libreefline-client's (clients/c), the one applications use;
// message_assembler is its C++ face. Receiver rules of the protocol: fragments may come in any
// order or twice; the first copy of an index wins; a fragment whose total_length, frag_count,
// kind, format, status or dims disagree with the entry's first fragment is ignored; a message
// is complete when every index 0..frag_count-1 is present.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "clients/c/reefline_client.h"
#include "clients/c/wire/protocol.h"
#include "tools/reefgen/common.h"

namespace reefline::reefgen {

struct assembled_message {
    flow_key key;
    wire::fields head;             // fields of the first fragment seen
    std::vector<uint8_t> payload;  // fragments concatenated in offset order
    bool tiles = true;             // offsets tile [0, total_length) exactly, no gap or overlap
};

// Bounds on what the assembler may hold (`send` on its socket, `check` on a capture): beyond
// them the oldest incomplete messages are dropped (evicted()). 0: no bound, for trusted input
// only: a hostile capture of N one-byte fragments still costs N entries.
struct assembler_limits {
    size_t max_pending = 0;  // incomplete messages
    // Bytes of memory the assembler allocates, all of it (entries, pieces, the reassembled
    // copy of a completing message, remembered completions): reefline_assembler_options.
    size_t max_pending_bytes = 0;
};

class message_assembler {
public:
    // The library's outcomes (reefline_add_outcome), same values.
    enum class outcome : uint8_t {
        accepted = REEFLINE_ADD_ACCEPTED,        // filed, message still incomplete
        completed = REEFLINE_ADD_COMPLETED,      // this fragment completed the message
        duplicate = REEFLINE_ADD_DUPLICATE,      // index already present: ignored
        inconsistent = REEFLINE_ADD_INCONSISTENT,  // disagrees with the entry's first fragment: ignored
        after_completion = REEFLINE_ADD_AFTER_COMPLETION,  // key already completed (only with remember_completed)
        too_large = REEFLINE_ADD_TOO_LARGE,  // the message alone would need more than max_pending_bytes: dropped
    };

    // remember_completed: keep the keys of the most recent completed messages (a quarter of
    // max_pending_bytes, or 65536 without it) so that late duplicates are reported as such
    // instead of opening a new entry (what `check` wants for requests).
    explicit message_assembler(bool remember_completed, assembler_limits limits = {});

    // `f` must describe a fragment with frag_index < frag_count and
    // payload_offset + fragment.size() <= total_length (callers validate first; others are
    // reported inconsistent). Throws std::bad_alloc when memory runs out.
    outcome add(const flow_key& key, const wire::fields& f, std::span<const uint8_t> fragment,
                assembled_message& completed);

    struct pending_info {
        flow_key key;
        wire::fields head;
        uint32_t received = 0;  // distinct indices present
    };
    // Messages still missing fragments, oldest first.
    std::vector<pending_info> pending() const;
    bool is_completed(const flow_key& key) const;
    size_t pending_bytes() const { return reefline_assembler_pending_bytes(_assembler.get()); }  // as the bound counts
    uint64_t evicted() const { return reefline_assembler_evicted(_assembler.get()); }  // dropped by the limits

private:
    struct destroy {
        void operator()(reefline_assembler* a) const { reefline_assembler_destroy(a); }
    };
    std::unique_ptr<reefline_assembler, destroy> _assembler;
};

std::string_view to_string(message_assembler::outcome o);

}  // namespace reefline::reefgen
