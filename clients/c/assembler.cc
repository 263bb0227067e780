// libreefline-client: reassembly of fragmented messages (responses on a client's socket;
// requests and responses of a capture in reefgen check), following the receiver rules of
// the protocol: fragments may come in any order or twice; the first copy of an index wins; a
// fragment whose total_length, frag_count, kind, format, status or dims disagree with the
// entry's first fragment is ignored; a message is complete when every index
// 0..frag_count-1 is present, and then its offsets must tile [0, total_length).
//
// Memory is bounded by what is really allocated, whatever a sender claims. Nothing is sized by
// a header's frag_count or total_length: an entry holds the pieces that arrived, each one
// allocation (its index, offset and bytes), found through a small array sorted by index that
// grows with them. Every allocation the assembler makes after its creation is charged to
// pending_bytes at what malloc spends on it (alloc_cost): the entries, their piece arrays and
// pieces, the hash table's buckets, the memory of completed flows and the last completed
// message. Before anything is allocated, add() works out the most that filing the fragment
// will hold at once (old and new arrays while one grows, the completed copy next to the
// pieces it is made of); a message that alone would not fit max_pending_bytes is dropped
// (too_large), otherwise the oldest other incomplete messages make room. So, apart from the
// assembler object itself, live memory never exceeds max_pending_bytes.
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "clients/c/internal.h"

namespace {

size_t flow_hash(const reefline_flow& k) {
    // SplitMix64's finaliser: request ids of one sender differ in their low bits only.
    uint64_t x = k.request_id ^ (uint64_t(k.ip) << 16) ^ k.port;
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return size_t(x ^ (x >> 31));
}

bool same_flow(const reefline_flow& a, const reefline_flow& b) {
    return a.ip == b.ip && a.port == b.port && a.request_id == b.request_id;
}

bool same_message(const reefline_header& a, const reefline_header& b) {
    return a.kind == b.kind && a.format == b.format && a.status == b.status &&
           a.total_length == b.total_length && a.frag_count == b.frag_count &&
           std::equal(std::begin(a.dims), std::end(a.dims), std::begin(b.dims));
}

// What an allocation of n bytes costs: glibc's malloc chunk (an 8-byte size field, 16-byte
// granules, 32 bytes at least), or whole pages for what it maps (128 KiB and more). Never
// less than n, so a counter of the bytes requested from operator new stays below the charge.
constexpr size_t alloc_cost(size_t n) {
    if (n >= (size_t(128) << 10)) return (n + 16 + 4095) & ~size_t(4095);
    return std::max<size_t>(32, (n + 8 + 15) & ~size_t(15));
}

// One fragment: its place and bytes in one allocation (the bytes follow the struct).
struct piece {
    uint32_t offset;
    uint32_t length;
    uint16_t index;
    uint8_t* bytes() { return reinterpret_cast<uint8_t*>(this + 1); }
    static size_t size(size_t length) { return sizeof(piece) + length; }
};

// The piece array: 2 slots first, doubling up to frag_count.
uint32_t first_slots(uint16_t frag_count) { return std::min<uint32_t>(2, frag_count); }
uint32_t grown_slots(uint32_t slots, uint16_t frag_count) { return std::min<uint32_t>(slots * 2, frag_count); }

constexpr size_t first_buckets = 16;
constexpr uint32_t no_slot = std::numeric_limits<uint32_t>::max();
constexpr size_t default_remembered = 65536;  // remember_completed with no byte bound
constexpr size_t first_remembered = 64;

size_t round_up_pow2(size_t n) {
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

}  // namespace

struct reefline_assembler {
    struct entry {
        reefline_flow key;
        reefline_header head;
        entry* chain = nullptr;  // next in its hash bucket
        entry* older = nullptr;  // age list: by first fragment
        entry* newer = nullptr;
        piece** pieces = nullptr;  // sorted by index
        uint32_t received = 0;     // pieces held: distinct indices
        uint32_t slots = 0;        // capacity of `pieces`
        size_t bytes = 0;          // fragment bytes held
        size_t charge = 0;         // alloc_cost of the entry, its array and its pieces
    };

    // A completed flow remembered (remember_completed), in a ring of the most recent ones
    // with chained hash buckets (indices into the ring).
    struct remembered {
        reefline_flow key;
        uint32_t chain;
    };

    reefline_assembler_options options{};

    // Incomplete messages.
    entry** buckets = nullptr;
    size_t bucket_count = 0;  // 0 or a power of two
    size_t count = 0;
    entry* oldest = nullptr;
    entry* newest = nullptr;

    // Completed flows (remember_completed).
    size_t remember_limit = 0;  // most flows remembered
    remembered* ring = nullptr;
    uint32_t* ring_heads = nullptr;
    size_t ring_slots = 0;
    size_t ring_head_count = 0;  // power of two
    size_t ring_used = 0;
    size_t ring_next = 0;        // where the next one goes: the oldest once the ring is full

    // The last completed message, NUL-terminated; valid until the next add or forget.
    uint8_t* done = nullptr;
    size_t done_size = 0;

    size_t pending_bytes = 0;  // every charge below, together
    size_t entry_charges = 0;  // of which the entries' (entry::charge)
    uint64_t evicted = 0;

    ~reefline_assembler() {
        while (oldest) erase(oldest);
        release_table();
        release_done();
        if (ring) ::operator delete(ring);
        if (ring_heads) ::operator delete(ring_heads);
    }

    size_t table_charge() const { return bucket_count ? alloc_cost(bucket_count * sizeof(entry*)) : 0; }
    static size_t ring_charge(size_t slots, size_t heads) {
        return slots ? alloc_cost(slots * sizeof(remembered)) + alloc_cost(heads * sizeof(uint32_t)) : 0;
    }

    entry* find(const reefline_flow& key) const {
        if (!bucket_count) return nullptr;
        for (entry* e = buckets[flow_hash(key) & (bucket_count - 1)]; e; e = e->chain)
            if (same_flow(e->key, key)) return e;
        return nullptr;
    }

    // Doubles the bucket array (or makes the first); throws std::bad_alloc, changing nothing.
    void grow_table() {
        const size_t n = bucket_count ? bucket_count * 2 : first_buckets;
        auto** fresh = static_cast<entry**>(::operator new(n * sizeof(entry*)));
        std::fill(fresh, fresh + n, nullptr);
        for (entry* e = oldest; e; e = e->newer) {
            entry*& head = fresh[flow_hash(e->key) & (n - 1)];
            e->chain = head;
            head = e;
        }
        pending_bytes -= table_charge();
        release_buckets();
        buckets = fresh;
        bucket_count = n;
        pending_bytes += table_charge();
    }
    void release_buckets() {
        if (buckets) ::operator delete(buckets);
        buckets = nullptr;
    }
    // Without incomplete messages the table costs nothing.
    void release_table() {
        if (count) return;
        pending_bytes -= table_charge();
        release_buckets();
        bucket_count = 0;
    }

    void release_done() {
        if (!done) return;
        pending_bytes -= alloc_cost(done_size);
        ::operator delete(done);
        done = nullptr;
        done_size = 0;
    }

    static void free_pieces(entry* e) {
        for (uint32_t i = 0; i < e->received; ++i)
            ::operator delete(e->pieces[i]);
        if (e->pieces) ::operator delete(e->pieces);
    }

    void erase(entry* e) {
        entry** link = &buckets[flow_hash(e->key) & (bucket_count - 1)];
        while (*link != e) link = &(*link)->chain;
        *link = e->chain;
        (e->older ? e->older->newer : oldest) = e->newer;
        (e->newer ? e->newer->older : newest) = e->older;
        --count;
        pending_bytes -= e->charge;
        entry_charges -= e->charge;
        free_pieces(e);
        delete e;
    }

    // The oldest incomplete message other than `keep`.
    entry* oldest_other(const entry* keep) const { return oldest != keep ? oldest : oldest->newer; }

    bool is_remembered(const reefline_flow& key) const {
        if (!ring_used) return false;
        for (uint32_t i = ring_heads[flow_hash(key) & (ring_head_count - 1)]; i != no_slot; i = ring[i].chain)
            if (same_flow(ring[i].key, key)) return true;
        return false;
    }
    void remember(const reefline_flow& key);

    int add(const reefline_flow& key, const reefline_header& f, const uint8_t* fragment, size_t length,
            reefline_message* out);
    int complete(entry* e, reefline_message* out);
};

// Keeps `key` among the most recent completed flows: the ring grows (doubling, up to
// remember_limit) while the bound leaves room for the old and the new ring side by side;
// otherwise the oldest remembered flow makes way. Evicts no incomplete message.
void reefline_assembler::remember(const reefline_flow& key) {
    if (!remember_limit || is_remembered(key)) return;
    if (ring_used == ring_slots && ring_slots < remember_limit) {
        const size_t slots = ring_slots ? std::min(ring_slots * 2, remember_limit) : std::min(first_remembered, remember_limit);
        const size_t heads = round_up_pow2(slots);
        const size_t fresh_charge = ring_charge(slots, heads);
        if (!options.max_pending_bytes || pending_bytes + fresh_charge <= options.max_pending_bytes) {
            auto* r = static_cast<remembered*>(::operator new(slots * sizeof(remembered)));
            uint32_t* h;
            try {
                h = static_cast<uint32_t*>(::operator new(heads * sizeof(uint32_t)));
            } catch (...) {
                ::operator delete(r);
                throw;
            }
            std::fill(h, h + heads, no_slot);
            // Oldest first: the full ring's oldest is at ring_next.
            for (size_t i = 0; i < ring_used; ++i) {
                r[i].key = ring[(ring_next + i) % ring_slots].key;
                uint32_t& head = h[flow_hash(r[i].key) & (heads - 1)];
                r[i].chain = head;
                head = uint32_t(i);
            }
            pending_bytes -= ring_charge(ring_slots, ring_head_count);
            if (ring) ::operator delete(ring);
            if (ring_heads) ::operator delete(ring_heads);
            ring = r;
            ring_heads = h;
            ring_next = ring_used;
            ring_slots = slots;
            ring_head_count = heads;
            pending_bytes += ring_charge(ring_slots, ring_head_count);
        }
    }
    if (!ring_slots) return;  // no room for the first ring
    const uint32_t at = uint32_t(ring_next);
    if (ring_used == ring_slots) {
        // Full: forget the oldest, which sits where the new one goes.
        uint32_t* link = &ring_heads[flow_hash(ring[at].key) & (ring_head_count - 1)];
        while (*link != at) link = &ring[*link].chain;
        *link = ring[at].chain;
    } else {
        ++ring_used;
    }
    ring[at].key = key;
    uint32_t& head = ring_heads[flow_hash(key) & (ring_head_count - 1)];
    ring[at].chain = head;
    head = at;
    ring_next = (ring_next + 1) % ring_slots;
}

int reefline_assembler::add(const reefline_flow& key, const reefline_header& f, const uint8_t* fragment,
                            size_t length, reefline_message* out) {
    release_done();  // the last completed message is valid until this call only
    if (options.remember_completed && is_remembered(key)) return REEFLINE_ADD_AFTER_COMPLETION;
    // The protocol limits, whatever a sender claims.
    if (f.frag_count == 0 || f.frag_count > REEFLINE_MAX_FRAGMENTS || f.frag_index >= f.frag_count ||
        f.total_length > REEFLINE_MAX_TOTAL_LENGTH || uint64_t(f.payload_offset) + length > f.total_length)
        return REEFLINE_ADD_INCONSISTENT;

    entry* e = find(key);
    uint32_t at = 0;  // where the index goes in e->pieces
    if (e) {
        if (!same_message(e->head, f)) return REEFLINE_ADD_INCONSISTENT;
        piece** end = e->pieces + e->received;
        piece** pos = std::lower_bound(e->pieces, end, f.frag_index,
                                       [](const piece* p, uint16_t index) { return p->index < index; });
        if (pos != end && (*pos)->index == f.frag_index) return REEFLINE_ADD_DUPLICATE;
        at = uint32_t(pos - e->pieces);
    } else if (options.max_pending && count >= options.max_pending) {
        erase(oldest);
        ++evicted;
    }

    // What filing it allocates, step by step; `peak` is the most held at once, beyond what
    // is charged now.
    const uint32_t received = e ? e->received : 0;
    const uint32_t slots = e ? e->slots : 0;
    const bool completes = received + 1 == f.frag_count;
    const size_t piece_charge = alloc_cost(piece::size(length));
    size_t held = 0, peak = 0;
    uint32_t new_slots = slots;
    if (!e) {
        if (count + 1 > bucket_count) {  // a bigger table, built beside the old one
            const size_t grown = alloc_cost((bucket_count ? bucket_count * 2 : first_buckets) * sizeof(entry*));
            peak = grown;
            held = grown - table_charge();
        }
        new_slots = first_slots(f.frag_count);
        held += alloc_cost(sizeof(entry)) + alloc_cost(new_slots * sizeof(piece*));
    } else if (received == slots) {  // a bigger array, filled from the old one
        new_slots = grown_slots(slots, f.frag_count);
        peak = alloc_cost(new_slots * sizeof(piece*));
        held = peak - alloc_cost(slots * sizeof(piece*));
    }
    held += piece_charge;
    // A message that completes is copied out next to its pieces; a message that cannot hold
    // its pieces and that copy at once will never be delivered, so it counts from the start.
    const size_t bytes_after = (e ? e->bytes : 0) + length;
    peak = std::max(peak, held + alloc_cost(bytes_after + 1));

    if (options.max_pending_bytes) {
        // What stays however many others are dropped: the table, the remembered flows and this
        // message.
        const size_t others = entry_charges - (e ? e->charge : 0);
        if (pending_bytes - others + peak > options.max_pending_bytes) {
            if (e) erase(e);
            release_table();
            ++evicted;
            return REEFLINE_ADD_TOO_LARGE;
        }
        // The oldest others make room: this message fits on its own, so while the total does
        // not, there is another message to drop.
        while (pending_bytes + peak > options.max_pending_bytes) {
            erase(oldest_other(e));
            ++evicted;
        }
    }

    // Allocations, each undone if a later one fails, before anything is linked.
    if (!e) {
        if (count + 1 > bucket_count) grow_table();
        entry* fresh = new entry;
        try {
            fresh->pieces = static_cast<piece**>(::operator new(new_slots * sizeof(piece*)));
        } catch (...) {
            delete fresh;
            throw;
        }
        fresh->key = key;
        fresh->head = f;
        fresh->slots = new_slots;
        fresh->charge = alloc_cost(sizeof(entry)) + alloc_cost(new_slots * sizeof(piece*));
        piece* p;
        try {
            p = static_cast<piece*>(::operator new(piece::size(length)));
        } catch (...) {
            free_pieces(fresh);
            delete fresh;
            throw;
        }
        p->index = f.frag_index;
        p->offset = f.payload_offset;
        p->length = uint32_t(length);
        if (length) std::memcpy(p->bytes(), fragment, length);
        fresh->pieces[0] = p;
        fresh->received = 1;
        fresh->bytes = length;
        fresh->charge += piece_charge;
        entry*& head = buckets[flow_hash(key) & (bucket_count - 1)];
        fresh->chain = head;
        head = fresh;
        fresh->older = newest;
        (newest ? newest->newer : oldest) = fresh;
        newest = fresh;
        ++count;
        pending_bytes += fresh->charge;
        entry_charges += fresh->charge;
        e = fresh;
    } else {
        if (new_slots != slots) {
            auto** grown = static_cast<piece**>(::operator new(new_slots * sizeof(piece*)));
            std::copy(e->pieces, e->pieces + received, grown);
            ::operator delete(e->pieces);
            e->pieces = grown;
            e->slots = new_slots;
            const size_t delta = alloc_cost(new_slots * sizeof(piece*)) - alloc_cost(slots * sizeof(piece*));
            e->charge += delta;
            pending_bytes += delta;
            entry_charges += delta;
        }
        auto* p = static_cast<piece*>(::operator new(piece::size(length)));
        p->index = f.frag_index;
        p->offset = f.payload_offset;
        p->length = uint32_t(length);
        if (length) std::memcpy(p->bytes(), fragment, length);
        std::copy_backward(e->pieces + at, e->pieces + received, e->pieces + received + 1);
        e->pieces[at] = p;
        ++e->received;
        e->bytes += length;
        e->charge += piece_charge;
        pending_bytes += piece_charge;
        entry_charges += piece_charge;
    }
    if (!completes) return REEFLINE_ADD_ACCEPTED;
    return complete(e, out);
}

// Every index is present: concatenate in offset order and check that the pieces tile the
// message. The copy holds what arrived (e->bytes), not what the header claims.
int reefline_assembler::complete(entry* e, reefline_message* out) {
    try {
        done = static_cast<uint8_t*>(::operator new(e->bytes + 1));
    } catch (...) {
        erase(e);  // a complete entry would only collect duplicates: drop it
        release_table();
        throw;
    }
    done_size = e->bytes + 1;
    pending_bytes += alloc_cost(done_size);
    // The entry goes next: its array may be reordered.
    std::sort(e->pieces, e->pieces + e->received,
              [](const piece* a, const piece* b) { return a->offset < b->offset; });
    bool tiles = true;
    size_t n = 0;
    for (uint32_t i = 0; i < e->received; ++i) {
        piece* p = e->pieces[i];
        if (p->offset != n) tiles = false;
        if (p->length) std::memcpy(done + n, p->bytes(), p->length);
        n += p->length;
    }
    if (n != e->head.total_length) tiles = false;
    done[n] = 0;  // so that an error's message reads as a C string
    const reefline_flow key = e->key;
    if (out) {
        out->flow = key;
        out->head = e->head;
        out->payload = done;
        out->length = n;
        out->tiles = tiles;
    }
    erase(e);
    release_table();
    if (options.remember_completed) {
        try {
            remember(key);
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
    if (a->options.remember_completed) {
        // As many as asked (1 or less: as many as room allows), within a quarter of the bound.
        size_t limit = a->options.remember_completed > 1 ? size_t(a->options.remember_completed)
                       : a->options.max_pending_bytes    ? std::numeric_limits<uint32_t>::max() - 1
                                                         : default_remembered;
        if (a->options.max_pending_bytes) {
            const size_t quarter = a->options.max_pending_bytes / 4;
            limit = std::min(limit, quarter / (sizeof(reefline_assembler::remembered) + sizeof(uint32_t)));
            while (limit && reefline_assembler::ring_charge(limit, round_up_pow2(limit)) > quarter)
                limit -= limit / 16 + 1;
        }
        a->remember_limit = std::min<size_t>(limit, std::numeric_limits<uint32_t>::max() - 1);
    }
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
    assembler->release_done();
    reefline_assembler::entry* e = assembler->find(*flow);
    if (!e) return 0;
    assembler->erase(e);
    assembler->release_table();
    return 1;
}

size_t reefline_assembler_pending(const reefline_assembler* assembler, reefline_pending* out, size_t capacity) {
    if (!assembler) return 0;
    size_t i = 0;
    for (const reefline_assembler::entry* e = assembler->oldest; e && out && i < capacity; e = e->newer)
        out[i++] = reefline_pending{e->key, e->head, e->received};
    return assembler->count;
}

size_t reefline_assembler_pending_bytes(const reefline_assembler* assembler) {
    return assembler ? assembler->pending_bytes : 0;
}

uint64_t reefline_assembler_evicted(const reefline_assembler* assembler) { return assembler ? assembler->evicted : 0; }

int reefline_assembler_is_completed(const reefline_assembler* assembler, const reefline_flow* flow) {
    return assembler && flow && assembler->is_remembered(*flow) ? 1 : 0;
}

}  // extern "C"
