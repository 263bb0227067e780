// libFuzzer target for libreefline-client's assembler (clients/c/assembler.cc): fragments of
// any claims, within a small byte bound taken from the input, against a model of the receiver
// rules and against the heap.
//
// Input: [B_hi][B_lo][R][P] then records. max_pending_bytes = 16 * B (0: unbounded);
// remember_completed = 0 when R bit 0 is clear, else 1 when R bit 1 is clear, else
// 2 + (R >> 2); max_pending = P (0: unbounded). A record is
//   [op][count: 2][index: 2][offset: 3][total: 3][length: 2][bytes]
// (big-endian): request id = op & 15, port = 1 + (op >> 4 & 1); op bit 5: forget the flow
// instead; op >> 6 picks kind/status/format/dims (so that fragments of one flow disagree);
// frag_count and frag_index are the low 11 bits (up to 2047: beyond the protocol too);
// length bit 15: that many synthetic bytes (2 * (length & 0x7fff), a pattern), else
// length & 0x7fff bytes from the input (as many as are left).
//
// Checked (abort on violation):
//  - every byte operator new hands the assembler is counted (replaced operator new/delete,
//    counting while an assembler call runs): live bytes never exceed max_pending_bytes plus
//    the assembler object, at any allocation; pending_bytes never exceeds the bound and never
//    counts less than is live; nothing is left after destroy;
//  - outcomes follow the receiver rules of a model without bounds (first copy wins,
//    inconsistent claims ignored, duplicates reported, completion when every index is
//    present, after_completion only for flows that completed), messages the model holds
//    disappear only when a bound is set, pending() agrees with the model;
//  - a completed message holds exactly the bytes its fragments brought, tiles exactly when
//    its offsets tile [0, total_length) (then its length is total_length and the bytes are
//    the fragments' in offset order), and is NUL-terminated.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <tuple>
#include <vector>

#include "clients/c/reefline_client.h"
#include "tests/fuzz/fuzz_check.h"

// ---- counted heap --------------------------------------------------------------------------
// Every block carries a 16-byte prefix (its size, and whether it was counted) in front of
// what operator new returns; blocks allocated while `counting` is set (inside an assembler
// call) add to `live` until freed.
namespace {

constexpr uint64_t counted_tag = 0xc0a7ed0000000000ull;
constexpr uint64_t plain_tag = 0x9a1f000000000000ull;
constexpr uint64_t tag_mask = 0xffffff0000000000ull;

thread_local bool counting = false;
size_t live = 0;
size_t peak = 0;

struct prefix {
    uint64_t tag_and_size;
    uint64_t offset;  // from the malloc'd block to the returned pointer
};
static_assert(sizeof(prefix) == 16);

void* allocate(size_t n, size_t alignment) {
    alignment = std::max<size_t>(alignment, 16);
    const size_t total = alignment + n;
    void* block = alignment > 16 ? std::aligned_alloc(alignment, (total + alignment - 1) / alignment * alignment)
                                 : std::malloc(total);
    if (!block) return nullptr;
    auto* user = static_cast<uint8_t*>(block) + alignment;
    auto* pre = reinterpret_cast<prefix*>(user) - 1;
    pre->tag_and_size = (counting ? counted_tag : plain_tag) | n;
    pre->offset = alignment;
    if (counting) {
        live += n;
        peak = std::max(peak, live);
    }
    return user;
}

void release(void* p) {
    if (!p) return;
    auto* pre = static_cast<prefix*>(p) - 1;
    const uint64_t tag = pre->tag_and_size & tag_mask;
    FUZZ_CHECK(tag == counted_tag || tag == plain_tag, "operator delete of a block operator new did not make");
    if (tag == counted_tag) live -= size_t(pre->tag_and_size & ~tag_mask);
    std::free(static_cast<uint8_t*>(p) - pre->offset);
}

void* allocate_or_throw(size_t n, size_t alignment) {
    if (void* p = allocate(n, alignment)) return p;
    throw std::bad_alloc();
}

}  // namespace

void* operator new(size_t n) { return allocate_or_throw(n, 16); }
void* operator new[](size_t n) { return allocate_or_throw(n, 16); }
void* operator new(size_t n, std::align_val_t a) { return allocate_or_throw(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return allocate_or_throw(n, size_t(a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate(n, 16); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate(n, 16); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return allocate(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return allocate(n, size_t(a)); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, size_t) noexcept { release(p); }
void operator delete[](void* p, size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }

namespace {

// What an assembler call allocates is counted; the model's allocations are not.
struct counted_scope {
    counted_scope() { counting = true; }
    ~counted_scope() { counting = false; }
};

// The assembler object itself (created inside a counted scope) is outside the bound.
constexpr size_t slack = 1024;

using flow_id = std::tuple<uint32_t, uint16_t, uint64_t>;
flow_id id_of(const reefline_flow& f) { return {f.ip, f.port, f.request_id}; }

struct model_piece {
    uint32_t offset;
    std::vector<uint8_t> bytes;
};
struct model_message {
    reefline_header head;
    std::map<uint16_t, model_piece> pieces;  // index -> the first copy
};

bool same_message(const reefline_header& a, const reefline_header& b) {
    return a.kind == b.kind && a.format == b.format && a.status == b.status && a.total_length == b.total_length &&
           a.frag_count == b.frag_count && std::equal(a.dims, a.dims + 4, b.dims);
}

struct reader {
    const uint8_t* data;
    size_t size;
    size_t at = 0;
    bool has(size_t n) const { return at + n <= size; }
    uint32_t be(size_t n) {
        uint32_t v = 0;
        for (size_t i = 0; i < n; ++i) v = v << 8 | data[at++];
        return v;
    }
};

uint8_t pattern_byte(size_t i) { return uint8_t(i * 131 + 7); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    reader in{data, size};
    if (!in.has(4)) return 0;
    reefline_assembler_options o{};
    o.max_pending_bytes = size_t(in.be(2)) * 16;
    const uint8_t r = uint8_t(in.be(1));
    o.remember_completed = !(r & 1) ? 0 : !(r & 2) ? 1 : 2 + (r >> 2);
    o.max_pending = in.be(1);
    const bool bounded = o.max_pending_bytes || o.max_pending;

    live = peak = 0;
    reefline_assembler* a;
    {
        counted_scope c;
        a = reefline_assembler_create(&o);
    }
    FUZZ_CHECK(a, "no assembler");
    const size_t base = live;  // the assembler object
    FUZZ_CHECK(base <= slack, "assembler object of %zu bytes", base);

    std::map<flow_id, model_message> model;
    std::set<flow_id> completed_ever;
    std::vector<uint8_t> synthetic;
    std::vector<reefline_pending> pending;

    while (in.has(13)) {
        const uint8_t op = uint8_t(in.be(1));
        reefline_header h{};
        const uint8_t variant = op >> 6;
        h.kind = variant == 1 ? REEFLINE_KIND_ERROR : REEFLINE_KIND_RESPONSE;
        h.status = variant == 1 ? REEFLINE_STATUS_BAD_REQUEST : REEFLINE_STATUS_OK;
        h.format = variant == 2 ? REEFLINE_FORMAT_RESULT_TOPK : REEFLINE_FORMAT_RAW;
        if (variant == 2) h.dims[0] = 3;
        if (variant == 3) h.dims[0] = 1, h.dims[1] = 2, h.dims[2] = 3, h.dims[3] = 4;
        h.request_id = op & 15;
        h.frag_count = uint16_t(in.be(2) & 0x7ff);
        h.frag_index = uint16_t(in.be(2) & 0x7ff);
        h.payload_offset = in.be(3);
        h.total_length = in.be(3);
        const uint32_t len_field = in.be(2);
        const uint8_t* fragment;
        size_t length;
        if (len_field & 0x8000) {
            length = size_t(len_field & 0x7fff) * 2;
            if (synthetic.size() < length) {
                const size_t from = synthetic.size();
                synthetic.resize(length);
                for (size_t i = from; i < length; ++i) synthetic[i] = pattern_byte(i);
            }
            fragment = synthetic.data();
        } else {
            length = std::min<size_t>(len_field & 0x7fff, size - in.at);
            fragment = data + in.at;
            in.at += length;
        }
        const reefline_flow flow{0x0a000001, uint16_t(1 + (op >> 4 & 1)), h.request_id};
        const flow_id key = id_of(flow);

        if (op & 0x20) {
            int forgot;
            {
                counted_scope c;
                forgot = reefline_assembler_forget(a, &flow);
            }
            FUZZ_CHECK(forgot == int(model.count(key)), "forget said %d", forgot);
            model.erase(key);
        } else {
            reefline_message m{};
            int rc;
            {
                counted_scope c;
                rc = reefline_assembler_add(a, &flow, &h, fragment, length, &m);
            }
            FUZZ_CHECK(rc >= REEFLINE_ADD_ACCEPTED && rc <= REEFLINE_ADD_TOO_LARGE, "outcome %d", rc);
            const bool beyond_protocol = h.frag_count == 0 || h.frag_count > REEFLINE_MAX_FRAGMENTS ||
                                         h.frag_index >= h.frag_count || h.total_length > REEFLINE_MAX_TOTAL_LENGTH ||
                                         uint64_t(h.payload_offset) + length > h.total_length;
            auto it = model.find(key);
            if (rc == REEFLINE_ADD_AFTER_COMPLETION) {
                FUZZ_CHECK(o.remember_completed && completed_ever.count(key) && it == model.end(),
                           "after_completion for a flow that did not complete");
            } else if (beyond_protocol) {
                FUZZ_CHECK(rc == REEFLINE_ADD_INCONSISTENT, "%d for a fragment beyond the protocol", rc);
            } else if (it != model.end() && !same_message(it->second.head, h)) {
                FUZZ_CHECK(rc == REEFLINE_ADD_INCONSISTENT, "%d for a fragment that disagrees", rc);
            } else if (it != model.end() && it->second.pieces.count(h.frag_index)) {
                FUZZ_CHECK(rc == REEFLINE_ADD_DUPLICATE, "%d for a duplicate", rc);
            } else {
                FUZZ_CHECK(rc == REEFLINE_ADD_ACCEPTED || rc == REEFLINE_ADD_COMPLETED ||
                               (rc == REEFLINE_ADD_TOO_LARGE && o.max_pending_bytes),
                           "%d for a new piece", rc);
                if (it == model.end()) it = model.emplace(key, model_message{h, {}}).first;
                it->second.pieces.emplace(h.frag_index, model_piece{h.payload_offset, {fragment, fragment + length}});
                const bool all = it->second.pieces.size() == h.frag_count;
                if (rc == REEFLINE_ADD_TOO_LARGE) {
                    model.erase(it);
                } else if (!all) {
                    FUZZ_CHECK(rc == REEFLINE_ADD_ACCEPTED, "completed with %zu of %u pieces",
                               it->second.pieces.size(), h.frag_count);
                } else {
                    FUZZ_CHECK(rc == REEFLINE_ADD_COMPLETED, "every piece present, outcome %d", rc);
                    std::vector<const model_piece*> by_offset;
                    for (const auto& [index, p] : it->second.pieces) by_offset.push_back(&p);
                    std::stable_sort(by_offset.begin(), by_offset.end(),
                                     [](const model_piece* x, const model_piece* y) { return x->offset < y->offset; });
                    std::vector<uint8_t> want;
                    bool tiles = true;
                    for (const model_piece* p : by_offset) {
                        if (p->offset != want.size()) tiles = false;
                        want.insert(want.end(), p->bytes.begin(), p->bytes.end());
                    }
                    if (want.size() != h.total_length) tiles = false;
                    FUZZ_CHECK(id_of(m.flow) == key && same_message(m.head, it->second.head), "wrong message");
                    FUZZ_CHECK(m.length == want.size(), "completed with %zu bytes, its pieces hold %zu", m.length,
                               want.size());
                    FUZZ_CHECK(bool(m.tiles) == tiles, "tiles %d, expected %d", m.tiles, tiles);
                    if (m.tiles) {
                        FUZZ_CHECK(m.length == m.head.total_length, "tiles but %zu bytes of %u", m.length,
                                   m.head.total_length);
                        FUZZ_CHECK(std::equal(want.begin(), want.end(), m.payload), "bytes not in offset order");
                    }
                    FUZZ_CHECK(m.payload[m.length] == 0, "not NUL-terminated");
                    model.erase(it);
                    completed_ever.insert(key);
                }
            }
        }

        // The bounds, the heap and the model.
        const size_t held = reefline_assembler_pending_bytes(a);
        FUZZ_CHECK(live - base <= held, "%zu bytes live, %zu charged", live - base, held);
        if (o.max_pending_bytes) {
            FUZZ_CHECK(held <= o.max_pending_bytes, "%zu bytes charged, bound %zu", held, o.max_pending_bytes);
            FUZZ_CHECK(peak <= o.max_pending_bytes + base, "%zu bytes live at the peak, bound %zu", peak - base,
                       o.max_pending_bytes);
        }
        pending.resize(reefline_assembler_pending(a, nullptr, 0));
        FUZZ_CHECK(reefline_assembler_pending(a, pending.data(), pending.size()) == pending.size(), "pending()");
        if (o.max_pending) FUZZ_CHECK(pending.size() <= o.max_pending, "%zu pending", pending.size());
        std::set<flow_id> still;
        for (const reefline_pending& p : pending) {
            const auto m = model.find(id_of(p.flow));
            FUZZ_CHECK(m != model.end(), "a pending message the model does not hold");
            FUZZ_CHECK(p.received == m->second.pieces.size() && same_message(p.head, m->second.head),
                       "pending %u pieces, the model %zu", p.received, m->second.pieces.size());
            still.insert(id_of(p.flow));
        }
        for (auto m = model.begin(); m != model.end();) {
            if (still.count(m->first)) {
                ++m;
                continue;
            }
            FUZZ_CHECK(bounded, "a message vanished without a bound");
            m = model.erase(m);
        }
    }
    {
        counted_scope c;
        reefline_assembler_destroy(a);
    }
    FUZZ_CHECK(live == 0, "%zu bytes left after destroy", live);
    return 0;
}
