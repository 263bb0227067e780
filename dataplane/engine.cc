#include "dataplane/engine.h"
#include "dataplane/response.h"

#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_prefetch.h>

#include <cstring>

#include <stdexcept>
#include <string>

namespace reefline::dp {

namespace {

cksum_state ip_state(uint64_t ol) {
    switch (ol & RTE_MBUF_F_RX_IP_CKSUM_MASK) {
    case RTE_MBUF_F_RX_IP_CKSUM_GOOD: return cksum_state::good;
    case RTE_MBUF_F_RX_IP_CKSUM_BAD: return cksum_state::bad;
    default: return cksum_state::unknown;
    }
}

cksum_state l4_state(uint64_t ol) {
    switch (ol & RTE_MBUF_F_RX_L4_CKSUM_MASK) {
    case RTE_MBUF_F_RX_L4_CKSUM_GOOD: return cksum_state::good;
    case RTE_MBUF_F_RX_L4_CKSUM_BAD: return cksum_state::bad;
    default: return cksum_state::unknown;
    }
}

}  // namespace

reassembly_config derive_held_limits(const port_config& port, reassembly_config config) {
    const uint32_t queues = std::max<uint32_t>(port.rx_queues, 1);
    const uint32_t share = port.rx_mbufs / queues;
    // The rx pool's per-lcore cache (port.cc) can hold up to 1.5 times its size.
    constexpr uint32_t mempool_cache_reserve = 384;
    const uint32_t reserve = port.rx_descriptors + 2u * rx_burst_size + mempool_cache_reserve;
    const std::string pool = "the rx pool of " + std::to_string(port.rx_mbufs) + " mbufs shared by " +
                             std::to_string(queues) + " rx queue(s) of " +
                             std::to_string(port.rx_descriptors) + " descriptors";
    if (config.held_high == 0) {
        constexpr uint32_t smallest = 2u * rx_burst_size;
        if (share < reserve + 2 * smallest)
            throw std::invalid_argument(pool + " leaves no room for reassembly: give more mbufs (--mbufs) or fewer rx queues");
        config.held_high = (share - reserve) / 2;
    } else if (config.held_high > share) {
        throw std::invalid_argument("reassembly high watermark of " + std::to_string(config.held_high) +
                                    " mbufs is more than each queue's share of " + pool);
    }
    if (config.held_low == 0) config.held_low = config.held_high / 4 * 3;
    if (config.held_low >= config.held_high)
        throw std::invalid_argument("reassembly low watermark (" + std::to_string(config.held_low) +
                                    " mbufs) must be below the high watermark (" +
                                    std::to_string(config.held_high) + ")");
    return config;
}

dataplane::dataplane(const dataplane_config& config)
    : _port(std::make_unique<dp::port>(config.port)), _ifs(config.port.rx_queues) {
    const reassembly_config reassembly = derive_held_limits(config.port, config.reassembly);
    uint32_t subnet_broadcast_be = 0;
    if (config.local_ip_be && config.local_prefix_length >= 1 && config.local_prefix_length <= 30)
        subnet_broadcast_be =
            config.local_ip_be | rte_cpu_to_be_32(~uint32_t(0) >> config.local_prefix_length);
    for (uint16_t q = 0; q < config.port.rx_queues; ++q) {
        auto s = std::make_unique<rx_queue>();
        s->queue_id = q;
        s->port_id = config.port.port_id;
        s->subnet_broadcast_be = subnet_broadcast_be;
        s->reasm = std::make_unique<reassembler>(
            std::to_string(config.port.port_id) + "_" + std::to_string(q), reassembly,
            s->counters);
        _queues.push_back(std::move(s));
    }
    const std::string name = "tx_ring_" + std::to_string(config.port.port_id);
    _tx_ring = rte_ring_create(name.c_str(), rte_align32pow2(config.tx_ring_size),
                               rte_eth_dev_socket_id(config.port.port_id) < 0
                                   ? 0 : rte_eth_dev_socket_id(config.port.port_id),
                               RING_F_SC_DEQ);
    if (!_tx_ring) throw std::runtime_error("dataplane: tx ring: " + std::string(rte_strerror(rte_errno)));
    _local_ip_be = config.local_ip_be;
    rte_ether_addr mac{};
    rte_eth_macaddr_get(config.port.port_id, &mac);
    std::memcpy(_local_mac, mac.addr_bytes, 6);
}

bool dataplane::answer_arp(rx_queue& s, rte_mbuf* m) {
    if (!_local_ip_be ||
        !is_arp_request_for(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len, _local_ip_be))
        return false;
    // A request that cannot be answered (tx pool dry, tx ring full) is left to the caller,
    // which counts it as a drop: every received packet is a drop or an answer.
    rte_mbuf* reply = build_arp_reply(_port->tx_pool(), rte_pktmbuf_mtod(m, const uint8_t*), _local_mac);
    if (!reply) return false;
    if (send(&reply, 1) != 1) {
        rte_pktmbuf_free(reply);
        return false;
    }
    s.counters.arp_replies.add();
    rte_pktmbuf_free(m);
    return true;
}

dataplane::~dataplane() {
    // Responses not yet sent are freed; requests under reassembly go with their tables.
    rte_mbuf* m[64];
    while (unsigned n = rte_ring_dequeue_burst(_tx_ring, reinterpret_cast<void**>(m), 64, nullptr))
        rte_pktmbuf_free_bulk(m, n);
    if (_tx_staged) rte_pktmbuf_free_bulk(_tx_stage, _tx_staged);
    rte_ring_free(_tx_ring);
    _port->stop();
    _queues.clear();
    _port.reset();
}

uint16_t dataplane::poll_rx(uint16_t q, uint64_t now) {
    rx_queue& s = *_queues[q];
    rte_mbuf* pkts[rx_burst_size];
    const uint16_t n = rte_eth_rx_burst(_port->id(), q, pkts, rx_burst_size);
    s.reasm->expire(now);
    if (n) s.process(_ifs.current(), pkts, n, now, this);
    _ifs.quiescent(q);
    return n;
}

void rx_queue::process(const port_map* map, rte_mbuf** pkts, uint16_t n, uint64_t now,
                       dataplane* arp) {
    // A request frame's headers (Ethernet, IPv4, UDP, reefline: 82 bytes untagged) span two
    // cache lines; parse_request reads the second one, so prefetch both.
    constexpr uint16_t prefetch_ahead = 4;
    auto prefetch_headers = [](const rte_mbuf* m) {
        rte_prefetch0(rte_pktmbuf_mtod(m, const char*));
        rte_prefetch0(rte_pktmbuf_mtod(m, const char*) + RTE_CACHE_LINE_SIZE);
    };
    for (uint16_t i = 0; i < std::min(n, prefetch_ahead); ++i) prefetch_headers(pkts[i]);

    // Counted before any of them is dropped: a counter snapshot must never show more drops
    // than received packets (struct counter).
    counters.rx_packets.add(n);
    udp_view udps[rx_burst_size];
    fragment frags[rx_burst_size];
    uint16_t nf = 0;
    uint64_t bytes = 0;
    for (uint16_t i = 0; i < n; ++i) {
        if (i + prefetch_ahead < n) prefetch_headers(pkts[i + prefetch_ahead]);
        rte_mbuf* m = pkts[i];
        bytes += m->pkt_len;
        drop_reason why;
        if (m->nb_segs != 1) {
            why = drop_reason::multi_segment;
        } else {
            why = parse_udp(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len, ip_state(m->ol_flags),
                            l4_state(m->ol_flags), udps[nf], subnet_broadcast_be);
            const if_binding* b = nullptr;
            if (why == drop_reason::none) {
                b = if_table::lookup(map, udps[nf].dst_port);
                if (!b) why = drop_reason::unknown_port;
            }
            if (why == drop_reason::not_ipv4 && arp && arp->answer_arp(*this, m)) continue;
            if (why == drop_reason::none) why = parse_request(udps[nf], frags[nf].view);
            if (why == drop_reason::none) {
                frags[nf].mbuf = m;
                frags[nf].udp = &udps[nf];
                frags[nf].if_slot = b->slot;
                frags[nf].port_id = port_id;
                ++nf;
                continue;
            }
        }
        counters.drop(why);
        rte_pktmbuf_free(m);
    }
    counters.rx_bytes.add(bytes);
    file(map, frags, nf, now);
}

void rx_queue::file(const port_map* map, const fragment* frags, uint32_t n, uint64_t now) {
    request* done[rx_burst_size * 2];
    for (uint32_t base = 0; base < n; base += rx_burst_size * 2) {
        const uint32_t m = std::min<uint32_t>(rx_burst_size * 2, n - base);
        const uint32_t nd = reasm->file_burst(frags + base, m, now, done);
        for (uint32_t i = 0; i < nd; ++i) {
            request* r = done[i];
            const if_binding* b = map->by_slot[r->if_slot];
            if (!b) {  // the IF was removed while its request was under reassembly
                counters.drop(drop_reason::unknown_port, release(r));
            } else if (rte_ring_mp_enqueue(b->ring, r) != 0) {
                counters.requests_ring_full.add();
                counters.drop(drop_reason::ring_full, release(r));
            }
        }
    }
}

void dataplane::flush(uint16_t q) { _queues[q]->reasm->flush(); }

uint16_t dataplane::send(rte_mbuf** mbufs, uint16_t n) {
    return uint16_t(rte_ring_mp_enqueue_burst(_tx_ring, reinterpret_cast<void**>(mbufs), n, nullptr));
}

uint16_t dataplane::poll_tx() {
    constexpr uint16_t cap = rx_burst_size * 2;
    if (_tx_staged < cap)
        _tx_staged += uint16_t(rte_ring_sc_dequeue_burst(
            _tx_ring, reinterpret_cast<void**>(_tx_stage + _tx_staged), cap - _tx_staged, nullptr));
    if (_tx_staged == 0) return 0;
    // Sizes are read before the burst: the driver owns (and may free) what it accepts.
    uint64_t bytes = 0;
    for (uint16_t i = 0; i < _tx_staged; ++i) bytes += _tx_stage[i]->pkt_len;
    const uint16_t sent = rte_eth_tx_burst(_port->id(), 0, _tx_stage, _tx_staged);
    for (uint16_t i = sent; i < _tx_staged; ++i) bytes -= _tx_stage[i]->pkt_len;
    _tx.tx_packets.add(sent);
    _tx.tx_bytes.add(bytes);
    for (uint16_t i = sent; i < _tx_staged; ++i) _tx_stage[i - sent] = _tx_stage[i];
    _tx_staged -= sent;
    return sent;
}

counter_snapshot dataplane::counters() const {
    counter_snapshot s;
    for (const auto& q : _queues) s.add(q->counters);
    s.add(_tx);
    return s;
}

}  // namespace reefline::dp
