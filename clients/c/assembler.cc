// libreefline-client: reassembly of fragmented messages (responses on a client's socket;
// requests and responses of a capture in reefgen check), following the receiver rules of
// the protocol: fragments may come in any order or twice; the first copy of an index wins; a
// fragment whose total_length, frag_count, kind, format, status or dims disagree with the
// entry's first fragment is ignored; a message is complete when every index
// 0..frag_count-1 is present, and then its offsets must tile [0, total_length).
//
// Memory is bounded whatever a sender claims: an entry allocates per fragment index (at most
// max_fragments) and holds only the bytes that arrived, and the optional limits on incomplete
// messages and their bytes drop the oldest first.
#include <algorithm>
#include <list>
#include <new>
#include <numeric>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clients/c/internal.h"

namespace {

struct flow_hash {
    size_t operator()(const reefline_flow& k) const {
        // SplitMix64's finaliser: request ids of one sender differ in their low bits only.
        uint64_t x = k.request_id ^ (uint64_t(k.ip) << 16) ^ k.port;
        x += 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        return size_t(x ^ (x >> 31));
    }
};

struct flow_equal {
    bool operator()(const reefline_flow& a, const reefline_flow& b) const {
        return a.ip == b.ip && a.port == b.port && a.request_id == b.request_id;
    }
};

bool same_message(const reefline_header& a, const reefline_header& b) {
    return a.kind == b.kind && a.format == b.format && a.status == b.status &&
           a.total_length == b.total_length && a.frag_count == b.frag_count &&
           std::equal(std::begin(a.dims), std::end(a.dims), std::begin(b.dims));
}

}  // namespace

struct reefline_assembler {
    struct entry {
        reefline_header head{};
        uint32_t received = 0;
        size_t bytes = 0;
        std::list<reefline_flow>::iterator age;  // its place in oldest_first
        std::vector<bool> present;
        std::vector<uint32_t> offsets;
        std::vector<std::vector<uint8_t>> pieces;
    };
    using entry_map = std::unordered_map<reefline_flow, entry, flow_hash, flow_equal>;

    reefline_assembler_options options{};
    entry_map entries;
    std::list<reefline_flow> oldest_first;  // keys of entries by first fragment
    size_t pending_bytes = 0;
    uint64_t evicted = 0;
    std::unordered_set<reefline_flow, flow_hash, flow_equal> completed;
    std::vector<uint8_t> done;  // the last completed message, NUL-terminated

    void erase(entry_map::iterator it) {
        pending_bytes -= it->second.bytes;
        oldest_first.erase(it->second.age);
        entries.erase(it);
    }

    int add(const reefline_flow& key, const reefline_header& f, const uint8_t* fragment, size_t length,
            reefline_message* out);
};

int reefline_assembler::add(const reefline_flow& key, const reefline_header& f, const uint8_t* fragment,
                            size_t length, reefline_message* out) {
    if (options.remember_completed && completed.count(key)) return REEFLINE_ADD_AFTER_COMPLETION;
    // The protocol limits bound what one entry may allocate, whatever a sender claims.
    if (f.frag_count == 0 || f.frag_count > REEFLINE_MAX_FRAGMENTS || f.frag_index >= f.frag_count ||
        f.total_length > REEFLINE_MAX_TOTAL_LENGTH || uint64_t(f.payload_offset) + length > f.total_length)
        return REEFLINE_ADD_INCONSISTENT;

    auto it = entries.find(key);
    if (it == entries.end()) {
        if (options.max_pending && entries.size() >= options.max_pending) {
            erase(entries.find(oldest_first.front()));
            ++evicted;
        }
        // Built aside and linked last, so that running out of memory leaves no half entry.
        entry fresh;
        fresh.head = f;
        fresh.present.assign(f.frag_count, false);
        fresh.offsets.assign(f.frag_count, 0);
        fresh.pieces.resize(f.frag_count);
        const auto age = oldest_first.insert(oldest_first.end(), key);
        try {
            it = entries.emplace(key, std::move(fresh)).first;
        } catch (...) {
            oldest_first.erase(age);
            throw;
        }
        it->second.age = age;
    } else if (!same_message(it->second.head, f)) {
        return REEFLINE_ADD_INCONSISTENT;
    }
    entry& e = it->second;
    if (e.present[f.frag_index]) return REEFLINE_ADD_DUPLICATE;
    if (options.max_pending_bytes) {
        if (e.bytes + length > options.max_pending_bytes) {
            erase(it);
            ++evicted;
            return REEFLINE_ADD_TOO_LARGE;
        }
        // The oldest other messages make room: `e` fits on its own, so while the total does
        // not, there is another message to drop.
        while (pending_bytes + length > options.max_pending_bytes) {
            auto victim = oldest_first.begin();
            if (flow_equal{}(*victim, key)) ++victim;
            erase(entries.find(*victim));
            ++evicted;
        }
    }
    e.pieces[f.frag_index].assign(fragment, fragment + length);  // the only allocation: first
    e.present[f.frag_index] = true;
    e.offsets[f.frag_index] = f.payload_offset;
    e.bytes += length;
    pending_bytes += length;
    if (++e.received < e.head.frag_count) return REEFLINE_ADD_ACCEPTED;

    // Complete: concatenate in offset order and check that the pieces tile the message. The
    // buffer holds what arrived (e.bytes), not what the header claims.
    bool tiles = true;
    try {
        std::vector<uint32_t> order(e.head.frag_count);
        std::iota(order.begin(), order.end(), 0u);
        std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return e.offsets[a] < e.offsets[b]; });
        done.clear();
        done.reserve(e.bytes + 1);
        for (uint32_t i : order) {
            if (e.offsets[i] != done.size()) tiles = false;
            done.insert(done.end(), e.pieces[i].begin(), e.pieces[i].end());
        }
    } catch (...) {
        erase(it);  // a complete entry would only collect duplicates: drop it
        throw;
    }
    if (done.size() != e.head.total_length) tiles = false;
    const size_t n = done.size();
    done.push_back(0);  // capacity reserved: so that an error's message reads as a C string
    if (out) {
        out->flow = key;
        out->head = e.head;
        out->payload = done.data();
        out->length = n;
        out->tiles = tiles;
    }
    erase(it);
    if (options.remember_completed) {
        try {
            completed.insert(key);
        } catch (...) {
            // Only the late-duplicate report is lost; the message itself is complete.
        }
    }
    return REEFLINE_ADD_COMPLETED;
}

extern "C" {

const char* reefline_add_outcome_name(int outcome) {
    switch (outcome) {
    case REEFLINE_ADD_ACCEPTED: return "accepted";
    case REEFLINE_ADD_COMPLETED: return "completed";
    case REEFLINE_ADD_DUPLICATE: return "duplicate";
    case REEFLINE_ADD_INCONSISTENT: return "inconsistent";
    case REEFLINE_ADD_AFTER_COMPLETION: return "after_completion";
    case REEFLINE_ADD_TOO_LARGE: return "too_large";
    }
    return "unknown";
}

reefline_assembler* reefline_assembler_create(const reefline_assembler_options* options) {
    auto* a = new (std::nothrow) reefline_assembler;
    if (!a) {
        reefline::client::fail(REEFLINE_E_NO_MEMORY, "no memory for an assembler");
        return nullptr;
    }
    if (options) a->options = *options;
    return a;
}

void reefline_assembler_destroy(reefline_assembler* assembler) { delete assembler; }

int reefline_assembler_add(reefline_assembler* assembler, const reefline_flow* flow, const reefline_header* header,
                           const void* fragment, size_t length, reefline_message* completed) {
    if (!assembler || !flow || !header || (length && !fragment))
        return reefline::client::fail(REEFLINE_E_INVALID_ARGUMENT, "null assembler, flow, header or fragment");
    try {
        return assembler->add(*flow, *header, static_cast<const uint8_t*>(fragment), length, completed);
    } catch (const std::bad_alloc&) {
        // add() leaves the assembler consistent when an allocation fails.
        return reefline::client::fail(REEFLINE_E_NO_MEMORY, "no memory to file a fragment");
    }
}

int reefline_assembler_forget(reefline_assembler* assembler, const reefline_flow* flow) {
    if (!assembler || !flow) return 0;
    auto it = assembler->entries.find(*flow);
    if (it == assembler->entries.end()) return 0;
    assembler->erase(it);
    return 1;
}

size_t reefline_assembler_pending(const reefline_assembler* assembler, reefline_pending* out, size_t capacity) {
    if (!assembler) return 0;
    size_t i = 0;
    for (const reefline_flow& key : assembler->oldest_first) {
        if (i >= capacity || !out) break;
        const auto& e = assembler->entries.at(key);
        out[i++] = reefline_pending{key, e.head, e.received};
    }
    return assembler->entries.size();
}

size_t reefline_assembler_pending_bytes(const reefline_assembler* assembler) {
    return assembler ? assembler->pending_bytes : 0;
}

uint64_t reefline_assembler_evicted(const reefline_assembler* assembler) { return assembler ? assembler->evicted : 0; }

int reefline_assembler_is_completed(const reefline_assembler* assembler, const reefline_flow* flow) {
    return assembler && flow && assembler->completed.count(*flow) ? 1 : 0;
}

}  // extern "C"
