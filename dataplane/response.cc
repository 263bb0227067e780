#include "dataplane/response.h"

#include <netinet/in.h>
#include <rte_arp.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_udp.h>

#include <rte_cycles.h>

#include <algorithm>
#include <cstring>

#include "dataplane/engine.h"

namespace reefline::dp {

uint32_t response_fragments(size_t result_bytes, uint32_t max_fragment_payload) {
    const uint64_t per = std::max<uint32_t>(1, max_fragment_payload);
    return result_bytes == 0 ? 1 : uint32_t(std::min<uint64_t>((result_bytes + per - 1) / per, UINT32_MAX));
}

uint16_t build_response_fragments(rte_mempool* pool, const reply_address& to, uint64_t request_id,
                                  const response_spec& spec, std::span<const uint8_t> result,
                                  uint32_t max_fragment_payload, uint32_t first, rte_mbuf** out,
                                  uint16_t capacity) {
    const uint32_t per = std::max<uint32_t>(1, max_fragment_payload);
    const uint32_t total = response_fragments(result.size(), per);
    if (total > wire::max_fragments || first >= total) return 0;
    // As many as the pool gives now: one bulk allocation, or one by one when it cannot
    // (part of what the pool counts sits in other lcores' caches).
    uint32_t count = std::min(total - first, uint32_t(capacity));
    if (rte_pktmbuf_alloc_bulk(pool, out, count) != 0) {
        uint32_t got = 0;
        while (got < count && (out[got] = rte_pktmbuf_alloc(pool)) != nullptr) ++got;
        count = got;
        if (count == 0) return 0;
    }

    const bool tagged = to.vlan_tagged;  // a priority tag (TCI 0) is echoed too
    const uint32_t l2 = RTE_ETHER_HDR_LEN + (tagged ? 4 : 0);
    for (uint32_t j = 0; j < count; ++j) {
        const uint32_t i = first + j;
        const uint32_t offset = i * per;
        const uint32_t length = std::min<uint32_t>(per, uint32_t(result.size()) - offset);
        const uint32_t udp_len = sizeof(rte_udp_hdr) + wire::header_size + length;
        const uint32_t frame_len = l2 + sizeof(rte_ipv4_hdr) + udp_len;
        rte_mbuf* m = out[j];
        auto* p = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, frame_len));
        if (!p) {  // the mbuf's data room is smaller than the fragment
            rte_pktmbuf_free_bulk(out, count);
            return 0;
        }
        auto* eth = reinterpret_cast<rte_ether_hdr*>(p);
        std::memcpy(&eth->dst_addr, to.requester_mac, 6);
        std::memcpy(&eth->src_addr, to.local_mac, 6);
        if (tagged) {
            eth->ether_type = RTE_BE16(RTE_ETHER_TYPE_VLAN);
            auto* vlan = reinterpret_cast<rte_vlan_hdr*>(eth + 1);
            vlan->vlan_tci = to.vlan_tci_be;
            vlan->eth_proto = RTE_BE16(RTE_ETHER_TYPE_IPV4);
        } else {
            eth->ether_type = RTE_BE16(RTE_ETHER_TYPE_IPV4);
        }
        auto* ip = reinterpret_cast<rte_ipv4_hdr*>(p + l2);
        ip->version_ihl = RTE_IPV4_VHL_DEF;
        ip->type_of_service = 0;
        ip->total_length = rte_cpu_to_be_16(uint16_t(sizeof(rte_ipv4_hdr) + udp_len));
        ip->packet_id = 0;
        ip->fragment_offset = RTE_BE16(RTE_IPV4_HDR_DF_FLAG);
        ip->time_to_live = 64;
        ip->next_proto_id = IPPROTO_UDP;
        ip->src_addr = to.local_ip_be;
        ip->dst_addr = to.requester_ip_be;
        ip->hdr_checksum = 0;
        ip->hdr_checksum = rte_ipv4_cksum(ip);
        auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
        udp->src_port = to.local_port_be;
        udp->dst_port = to.requester_port_be;
        udp->dgram_len = rte_cpu_to_be_16(uint16_t(udp_len));
        udp->dgram_cksum = 0;
        wire::fields f;
        f.kind = static_cast<uint8_t>(spec.kind);
        f.format = static_cast<uint8_t>(spec.format);
        f.status = static_cast<uint8_t>(spec.status);
        f.request_id = request_id;
        f.frag_index = uint16_t(i);
        f.frag_count = uint16_t(total);
        f.payload_offset = offset;
        f.total_length = uint32_t(result.size());
        std::copy(spec.dims, spec.dims + 4, f.dims);
        auto* h = reinterpret_cast<uint8_t*>(udp + 1);
        wire::encode(f, h);
        if (length) std::memcpy(h + wire::header_size, result.data() + offset, length);
        // Software checksum: responses are small and a kernel socket on the other end
        // drops datagrams whose checksum is wrong.
        udp->dgram_cksum = rte_ipv4_udptcp_cksum(ip, udp);
        m->l2_len = l2;
        m->l3_len = sizeof(rte_ipv4_hdr);
    }
    return uint16_t(count);
}

rte_mbuf* build_arp_reply(rte_mempool* pool, const uint8_t* request, const uint8_t local_mac[6]) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (!m) return nullptr;
    constexpr uint16_t len = RTE_ETHER_HDR_LEN + sizeof(rte_arp_hdr);
    auto* p = rte_pktmbuf_mtod(m, uint8_t*);
    rte_arp_hdr req;
    std::memcpy(&req, request + RTE_ETHER_HDR_LEN, sizeof req);
    auto* eth = reinterpret_cast<rte_ether_hdr*>(p);
    std::memcpy(&eth->dst_addr, &req.arp_data.arp_sha, 6);
    std::memcpy(&eth->src_addr, local_mac, 6);
    eth->ether_type = RTE_BE16(RTE_ETHER_TYPE_ARP);
    rte_arp_hdr rep = req;
    rep.arp_opcode = RTE_BE16(RTE_ARP_OP_REPLY);
    std::memcpy(&rep.arp_data.arp_sha, local_mac, 6);
    rep.arp_data.arp_sip = req.arp_data.arp_tip;
    rep.arp_data.arp_tha = req.arp_data.arp_sha;
    rep.arp_data.arp_tip = req.arp_data.arp_sip;
    std::memcpy(p + RTE_ETHER_HDR_LEN, &rep, sizeof rep);
    m->data_len = m->pkt_len = len;
    return m;
}

response_queue::response_queue(dataplane& plane, done_fn done, uint32_t capacity, double give_up_ms)
    : _plane(plane), _done(std::move(done)), _capacity(capacity),
      _give_up_tsc(uint64_t(give_up_ms * 1e-3 * double(rte_get_tsc_hz()))) {}

response_queue::~response_queue() { clear(); }

void response_queue::finish(const entry& e, bool sent) {
    if (_done) _done(e.tag, sent);
}

bool response_queue::advance(entry& e, uint32_t& queued) {
    rte_mempool* pool = _plane.eth().tx_pool();
    const uint32_t per = _plane.eth().max_fragment_payload();
    constexpr uint16_t chunk = 64;
    rte_mbuf* out[chunk];
    while (e.next < e.count) {
        const uint16_t k = build_response_fragments(pool, e.to, e.request_id, e.spec, e.payload, per,
                                                    e.next, out, chunk);
        if (k == 0) return false;
        const uint16_t taken = _plane.send(out, k);
        if (taken < k) rte_pktmbuf_free_bulk(out + taken, k - taken);
        e.next += taken;
        queued += taken;
        if (taken < k) return false;
    }
    return true;
}

bool response_queue::push(const reply_address& to, uint64_t request_id, const response_spec& spec,
                          std::span<const uint8_t> payload, uint32_t tag, std::shared_ptr<const void> owner) {
    entry e;
    e.to = to;
    e.request_id = request_id;
    e.spec = spec;
    e.payload = payload;
    e.tag = tag;
    e.count = response_fragments(payload.size(), _plane.eth().max_fragment_payload());
    if (e.count > wire::max_fragments) {  // IFs refuse outputs that large: never here
        finish(e, false);
        return false;
    }
    if (_waiting.empty()) {
        uint32_t queued = 0;
        if (advance(e, queued)) {
            finish(e, true);
            return true;
        }
        _progress_tsc = rte_rdtsc();
    } else if (_waiting.size() >= _capacity) {
        finish(e, false);
        return false;
    }
    if (owner) {
        e.owner = std::move(owner);
    } else {
        e.own.assign(payload.begin(), payload.end());
        e.payload = e.own;
        _own_bytes += e.own.size();
    }
    _waiting.push_back(std::move(e));
    _size.store(uint32_t(_waiting.size()), std::memory_order_relaxed);
    return true;
}

uint32_t response_queue::flush() {
    uint32_t queued = 0;
    while (!_waiting.empty()) {
        entry& e = _waiting.front();
        const uint32_t before = queued;
        const bool done = advance(e, queued);
        const uint64_t now = rte_rdtsc();
        if (queued != before) _progress_tsc = now;
        if (!done) {
            // Nothing moved for give_up_ms: the port takes nothing, and what waits behind
            // would wait as long. Fragments of a half-sent answer already on the ring still
            // go; the sender's reassembly times them out.
            if (now - _progress_tsc >= _give_up_tsc) clear();
            break;
        }
        finish(e, true);
        _own_bytes -= e.own.size();
        _waiting.pop_front();
    }
    _size.store(uint32_t(_waiting.size()), std::memory_order_relaxed);
    return queued;
}

void response_queue::clear() {
    for (const entry& e : _waiting) finish(e, false);
    _waiting.clear();
    _own_bytes = 0;
    _size.store(0, std::memory_order_relaxed);
}

}  // namespace reefline::dp
