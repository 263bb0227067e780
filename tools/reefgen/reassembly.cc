#include "tools/reefgen/reassembly.h"

#include <algorithm>
#include <numeric>

namespace reefline::reefgen {
namespace {

bool same_message(const wire::fields& a, const wire::fields& b) {
    return a.kind == b.kind && a.format == b.format && a.status == b.status &&
           a.total_length == b.total_length && a.frag_count == b.frag_count &&
           std::equal(std::begin(a.dims), std::end(a.dims), std::begin(b.dims));
}

}  // namespace

std::string_view to_string(message_assembler::outcome o) {
    switch (o) {
    case message_assembler::outcome::accepted: return "accepted";
    case message_assembler::outcome::completed: return "completed";
    case message_assembler::outcome::duplicate: return "duplicate";
    case message_assembler::outcome::inconsistent: return "inconsistent";
    case message_assembler::outcome::after_completion: return "after_completion";
    case message_assembler::outcome::too_large: return "too_large";
    }
    return "unknown";
}

void message_assembler::erase(entry_map::iterator it) {
    _pending_bytes -= it->second.bytes;
    _oldest_first.erase(it->second.age);
    _entries.erase(it);
}

message_assembler::outcome message_assembler::add(const flow_key& key, const wire::fields& f,
                                                  std::span<const uint8_t> fragment,
                                                  assembled_message& completed) {
    if (_remember_completed && _completed.count(key)) return outcome::after_completion;
    // The protocol limits bound what one entry may allocate, whatever a sender claims.
    if (f.frag_count == 0 || f.frag_count > wire::max_fragments || f.frag_index >= f.frag_count ||
        f.total_length > wire::max_total_length ||
        uint64_t(f.payload_offset) + fragment.size() > f.total_length)
        return outcome::inconsistent;

    auto it = _entries.find(key);
    if (it == _entries.end()) {
        if (_limits.max_pending && _entries.size() >= _limits.max_pending) {
            erase(_entries.find(_oldest_first.front()));
            ++_evicted;
        }
        it = _entries.try_emplace(key).first;
        entry& e = it->second;
        e.head = f;
        e.age = _oldest_first.insert(_oldest_first.end(), key);
        e.present.assign(f.frag_count, false);
        e.offsets.assign(f.frag_count, 0);
        e.pieces.resize(f.frag_count);
    } else if (!same_message(it->second.head, f)) {
        return outcome::inconsistent;
    }
    entry& e = it->second;
    if (e.present[f.frag_index]) return outcome::duplicate;
    if (_limits.max_pending_bytes) {
        if (e.bytes + fragment.size() > _limits.max_pending_bytes) {
            erase(it);
            ++_evicted;
            return outcome::too_large;
        }
        // The oldest other messages make room: `e` fits on its own, so while the total does
        // not, there is another message to drop.
        while (_pending_bytes + fragment.size() > _limits.max_pending_bytes) {
            auto victim = _oldest_first.begin();
            if (*victim == key) ++victim;
            erase(_entries.find(*victim));
            ++_evicted;
        }
    }
    e.present[f.frag_index] = true;
    e.offsets[f.frag_index] = f.payload_offset;
    e.pieces[f.frag_index].assign(fragment.begin(), fragment.end());
    e.bytes += fragment.size();
    _pending_bytes += fragment.size();
    if (++e.received < e.head.frag_count) return outcome::accepted;

    // Complete: concatenate in offset order and check that the pieces tile the message.
    std::vector<uint32_t> order(e.head.frag_count);
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return e.offsets[a] < e.offsets[b]; });
    completed.key = key;
    completed.head = e.head;
    completed.payload.clear();
    completed.payload.reserve(e.head.total_length);
    completed.tiles = true;
    for (uint32_t i : order) {
        if (e.offsets[i] != completed.payload.size()) completed.tiles = false;
        completed.payload.insert(completed.payload.end(), e.pieces[i].begin(), e.pieces[i].end());
    }
    if (completed.payload.size() != e.head.total_length) completed.tiles = false;
    erase(it);
    if (_remember_completed) _completed.insert(key);
    return outcome::completed;
}

std::vector<message_assembler::pending_info> message_assembler::pending() const {
    std::vector<pending_info> out;
    out.reserve(_entries.size());
    for (const flow_key& key : _oldest_first) {
        const entry& e = _entries.at(key);
        out.push_back({key, e.head, e.received});
    }
    return out;
}

}  // namespace reefline::reefgen
