#include "dataplane/reassembly.h"

#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_hash_crc.h>
#include <rte_prefetch.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>

namespace reefline::dp {

namespace {

// A fragment's flow_key as two words, built in registers. Hashing or comparing a flow_key
// just stored field by field would load 8 bytes across a 4- and two 2-byte stores, which the
// CPU cannot forward (a ~15-cycle stall per packet).
struct key_words {
    uint64_t w0, w1;
};
inline key_words words_of(const fragment& f) {
    return {uint64_t(f.udp->src_ip_be) | uint64_t(f.udp->src_port) << 32,
            wire::ntoh64(f.view.header->request_id_be)};
}
inline key_words words_of(const flow_key& k) {
    key_words w;
    std::memcpy(&w, &k, sizeof k);
    return w;
}
// Equals rte_hash_crc(&key, 16, 0), the table's hash_func, so the table's own hashing (e.g.
// in rte_hash_del_key) agrees with the signatures computed here.
inline hash_sig_t hash_of(key_words w) {
    return rte_hash_crc_8byte(w.w1, rte_hash_crc_8byte(w.w0, 0));
}
static_assert(sizeof(flow_key) == sizeof(key_words) && offsetof(flow_key, src_port) == 4 &&
              offsetof(flow_key, request_id) == 8 && RTE_BYTE_ORDER == RTE_LITTLE_ENDIAN);

}  // namespace

const char* to_string(eviction_order o) {
    return o == eviction_order::oldest_first ? "oldest" : "largest";
}

uint32_t release(request* r) {
    rte_mbuf* held[wire::max_fragments];
    uint32_t n = 0;
    for (uint32_t w = 0; w < (r->frag_count + 63u) / 64; ++w) {
        for (uint64_t bits = r->bitmap[w]; bits; bits &= bits - 1)
            held[n++] = r->mbufs[w * 64 + __builtin_ctzll(bits)];
    }
    if (n) rte_pktmbuf_free_bulk(held, n);
    rte_mempool_put(r->pool, r);
    return n;
}

reassembler::reassembler(const std::string& name, const reassembly_config& config,
                         rx_counters& counters)
    : _counters(counters),
      _age_limit_tsc(config.age_limit_us * rte_get_tsc_hz() / 1000000),
      _held_high(config.held_high ? config.held_high : UINT32_MAX),
      _held_low(!config.held_high ? UINT32_MAX
                : config.held_low ? std::min(config.held_low, config.held_high)
                                  : config.held_high / 4 * 3),
      _eviction(config.eviction) {
    const std::string hash_name = "rh_" + name;
    rte_hash_parameters params{};
    params.name = hash_name.c_str();
    params.entries = std::max<uint32_t>(config.entries, 8);
    params.key_len = sizeof(flow_key);
    params.hash_func = rte_hash_crc;
    params.hash_func_init_val = 0;
    params.socket_id = config.socket_id;
    // The extendable bucket table guarantees that `entries` keys always fit, so only the
    // entry pool bounds the table.
    params.extra_flag = RTE_HASH_EXTRA_FLAGS_EXT_TABLE;
    _table = rte_hash_create(&params);
    if (!_table)
        throw std::runtime_error("reassembly: rte_hash_create(" + hash_name +
                                 "): " + rte_strerror(rte_errno));
    const std::string pool_name = "re_" + name;
    _entries = rte_mempool_create(pool_name.c_str(), config.entries, sizeof(request), 0, 0,
                                  nullptr, nullptr, nullptr, nullptr, config.socket_id, 0);
    if (!_entries) {
        rte_hash_free(_table);
        throw std::runtime_error("reassembly: rte_mempool_create(" + pool_name +
                                 "): " + rte_strerror(rte_errno));
    }
}

reassembler::~reassembler() {
    flush();
    rte_hash_free(_table);
    rte_mempool_free(_entries);
}

void reassembler::enter_size_class(request* r, uint8_t size_class) {
    size_list& l = _by_size[size_class];
    r->size_class = size_class;
    r->size_prev = l.last;
    r->size_next = nullptr;
    r->in_size_class = true;
    (l.last ? l.last->size_next : l.first) = r;
    l.last = r;
    _size_classes_used |= uint64_t(1) << size_class;
}

void reassembler::leave_size_class(request* r) {
    size_list& l = _by_size[r->size_class];
    (r->size_prev ? r->size_prev->size_next : l.first) = r->size_next;
    (r->size_next ? r->size_next->size_prev : l.last) = r->size_prev;
    if (!l.first) _size_classes_used &= ~(uint64_t(1) << r->size_class);
    r->in_size_class = false;
}

void reassembler::unlink(request* r) {
    recent_slot& s = _recent[hash_of(words_of(r->key)) & (recent_size - 1)];
    if (s.r == r) s.r = nullptr;
    (r->older ? r->older->newer : _oldest) = r->newer;
    (r->newer ? r->newer->older : _newest) = r->older;
    r->older = r->newer = nullptr;
    if (r->in_size_class) leave_size_class(r);
    _held_mbufs -= r->received;
    --_pending;
}

void reassembler::drop_request(request* r, drop_reason why) {
    rte_hash_del_key(_table, &r->key);
    unlink(r);
    _counters.drop(why, release(r));
}

request* reassembler::create(const fragment& f, uint64_t now_tsc, hash_sig_t sig,
                              request*& evicted) {
    request* r = nullptr;
    evicted = nullptr;
    if (rte_mempool_get(_entries, reinterpret_cast<void**>(&r)) != 0) {
        if (!_oldest) return nullptr;  // every entry is waiting on an IF queue
        _counters.requests_evicted.add();
        evicted = _oldest;
        drop_request(_oldest, drop_reason::table_full);
        if (rte_mempool_get(_entries, reinterpret_cast<void**>(&r)) != 0) return nullptr;
    }
    const wire::header& h = *f.view.header;
    const udp_view& u = *f.udp;
    r->key = flow_key{u.src_ip_be, u.src_port, 0, wire::ntoh64(h.request_id_be)};
    std::memcpy(r->reply.requester_mac, u.eth + 6, 6);
    std::memcpy(r->reply.local_mac, u.eth, 6);
    r->reply.requester_ip_be = u.src_ip_be;
    r->reply.local_ip_be = u.dst_ip_be;
    r->reply.requester_port_be = rte_cpu_to_be_16(u.src_port);
    r->reply.local_port_be = rte_cpu_to_be_16(u.dst_port);
    r->reply.vlan_tci_be = u.vlan_tci_be;
    r->reply.vlan_tagged = u.vlan_tagged;
    r->reply.port_id = f.port_id;
    r->first_tsc = r->last_tsc = now_tsc;
    r->total_length = rte_be_to_cpu_32(h.total_length_be);
    r->frag_count = rte_be_to_cpu_16(h.frag_count_be);
    r->received = 0;
    _mbuf_bytes = uint32_t(sizeof(rte_mbuf)) + f.mbuf->buf_len;
    r->in_size_class = false;
    r->format = h.format;
    for (int i = 0; i < 4; ++i) r->dims[i] = rte_be_to_cpu_16(h.dims_be[i]);
    r->if_slot = f.if_slot;
    r->frag_count_be = h.frag_count_be;
    r->total_length_be = h.total_length_be;
    std::memcpy(&r->dims_be, h.dims_be, sizeof r->dims_be);
    r->pool = _entries;
    std::memset(r->bitmap, 0, (r->frag_count + 63u) / 64 * sizeof(uint64_t));
    if (rte_hash_add_key_with_hash_data(_table, &r->key, sig, r) < 0) {
        rte_mempool_put(_entries, r);
        return nullptr;
    }
    const key_words kw = words_of(r->key);
    _recent[sig & (recent_size - 1)] = {{kw.w0, kw.w1}, r};
    r->older = _newest;
    r->newer = nullptr;
    (_newest ? _newest->newer : _oldest) = r;
    _newest = r;
    ++_pending;
    _counters.requests_started.add();
    return r;
}

// Files one fragment into r. Returns r when this fragment completed it; `malformed` then
// says whether it was dropped instead of completed (its offsets did not tile the payload).
request* reassembler::file_one(const fragment& f, request* r, uint64_t now_tsc,
                               bool& malformed) {
    malformed = false;
    const wire::header& h = *f.view.header;
    const uint16_t index = rte_be_to_cpu_16(h.frag_index_be);
    uint64_t dims_be;
    std::memcpy(&dims_be, h.dims_be, sizeof dims_be);
    const bool same = h.frag_count_be == r->frag_count_be &&
                      h.total_length_be == r->total_length_be && dims_be == r->dims_be &&
                      h.format == r->format;
    if (!same) {
        _counters.drop(drop_reason::inconsistent);
        rte_pktmbuf_free(f.mbuf);
        return nullptr;
    }
    if (r->has(index)) {
        _counters.drop(drop_reason::duplicate);
        rte_pktmbuf_free(f.mbuf);
        return nullptr;
    }
    r->bitmap[index / 64] |= uint64_t(1) << (index % 64);
    r->mbufs[index] = f.mbuf;
    r->segments[index] = {f.view.data, f.view.length, rte_be_to_cpu_32(h.payload_offset_be)};
    r->last_tsc = now_tsc;
    ++_held_mbufs;
    const uint16_t received = ++r->received;
    if (received != r->frag_count) {
        if (_eviction == eviction_order::largest_first &&
            (received % size_class_width == 0 || received == 1)) {
            if (r->in_size_class) leave_size_class(r);
            enter_size_class(r, uint8_t(received / size_class_width));
        }
        return nullptr;
    }

    // Complete: the fragments, in index order, must tile [0, total_length) exactly.
    uint64_t expect = 0;
    for (uint32_t i = 0; i < r->frag_count && expect != UINT64_MAX; ++i)
        expect = r->segments[i].offset == expect ? expect + r->segments[i].length : UINT64_MAX;
    if (expect != r->total_length) {
        _counters.requests_malformed.add();
        drop_request(r, drop_reason::inconsistent);
        malformed = true;
        return r;  // gone from the table; the caller only needs its identity
    }
    rte_hash_del_key(_table, &r->key);
    unlink(r);
    _counters.requests_completed.add();
    return r;
}

uint32_t reassembler::file_burst(const fragment* frags, uint32_t n, uint64_t now_tsc,
                                 request** completed) {
    constexpr uint32_t max_burst = 64;
    uint32_t done = 0;
    for (uint32_t base = 0; base < n; base += max_burst) {
        const uint32_t m = std::min(max_burst, n - base);
        const fragment* fb = frags + base;
        flow_key keys[max_burst];
        hash_sig_t sigs[max_burst];
        void* data[max_burst];
        uint64_t hits = 0;
        // Requests in _recent first; the rest in one bulk lookup of _table.
        const void* miss_keys[max_burst];
        hash_sig_t miss_sigs[max_burst];
        uint8_t miss_at[max_burst];
        uint32_t misses = 0;
        for (uint32_t i = 0; i < m; ++i) {
            const key_words w = words_of(fb[i]);
            keys[i] = flow_key{fb[i].udp->src_ip_be, fb[i].udp->src_port, 0, w.w1};
            sigs[i] = hash_of(w);
            const recent_slot& s = _recent[sigs[i] & (recent_size - 1)];
            if (s.r && ((s.key[0] ^ w.w0) | (s.key[1] ^ w.w1)) == 0) {
                data[i] = s.r;
                hits |= uint64_t(1) << i;
            } else {
                miss_keys[misses] = &keys[i];
                miss_sigs[misses] = sigs[i];
                miss_at[misses++] = uint8_t(i);
            }
        }
        if (misses) {
            uint64_t found = 0;
            void* found_data[max_burst];
            rte_hash_lookup_with_hash_bulk_data(_table, miss_keys, miss_sigs, misses, &found,
                                                found_data);
            for (uint32_t j = 0; j < misses; ++j) {
                if (!(found >> j & 1)) continue;
                const uint32_t i = miss_at[j];
                data[i] = found_data[j];
                hits |= uint64_t(1) << i;
                const key_words w = words_of(keys[i]);
                _recent[sigs[i] & (recent_size - 1)] = {{w.w0, w.w1}, static_cast<request*>(data[i])};
            }
        }
        for (uint32_t i = 0; i < m; ++i) {
            if (!(hits >> i & 1)) { data[i] = nullptr; continue; }
            auto* r = static_cast<request*>(data[i]);
            const uint16_t index = rte_be_to_cpu_16(fb[i].view.header->frag_index_be);
            rte_prefetch0(&r->bitmap[index / 64]);
            rte_prefetch0(&r->mbufs[index]);
            rte_prefetch0(&r->segments[index]);
        }
        // A request that leaves the table mid-burst (completed, malformed, evicted) must not
        // be reached through a pointer looked up before it left.
        auto forget = [&](uint32_t from, const void* gone) {
            for (uint32_t j = from; j < m; ++j)
                if (data[j] == gone) data[j] = nullptr;
        };
        for (uint32_t i = 0; i < m; ++i) {
            auto* r = static_cast<request*>(data[i]);
            if (!r) {
                void* found = nullptr;
                if (rte_hash_lookup_with_hash_data(_table, &keys[i], sigs[i], &found) >= 0) {
                    r = static_cast<request*>(found);
                } else {
                    request* evicted = nullptr;
                    r = create(fb[i], now_tsc, sigs[i], evicted);
                    if (evicted) forget(i + 1, evicted);
                    if (!r) {
                        _counters.drop(drop_reason::no_entry);
                        rte_pktmbuf_free(fb[i].mbuf);
                        continue;
                    }
                }
            }
            bool malformed = false;
            if (request* c = file_one(fb[i], r, now_tsc, malformed)) {
                forget(i + 1, c);
                if (!malformed) completed[done++] = c;
            }
        }
        // Checked once per burst: the watermarks leave room for a burst above the high one.
        if (_held_mbufs > _held_high) shed();
    }
    return done;
}

void reassembler::shed() {
    while (_held_mbufs > _held_low) {
        request* victim = _oldest;
        if (_eviction == eviction_order::largest_first && _size_classes_used)
            victim = _by_size[63 - __builtin_clzll(_size_classes_used)].first;
        if (!victim) return;
        _counters.requests_evicted.add();
        drop_request(victim, drop_reason::memory_pressure);
    }
}

void reassembler::expire(uint64_t now_tsc) {
    while (_oldest && now_tsc - _oldest->first_tsc > _age_limit_tsc) {
        _counters.requests_timed_out.add();
        drop_request(_oldest, drop_reason::timeout);
    }
}

void reassembler::flush() {
    while (_oldest) {
        _counters.requests_timed_out.add();
        drop_request(_oldest, drop_reason::timeout);
    }
}

}  // namespace reefline::dp
