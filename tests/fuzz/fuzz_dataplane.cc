// libFuzzer target for the data plane's receive path: frames (tests/fuzz/dataplane_input.h)
// go onto a net_ring port's rx ring and through dataplane::poll_rx — parsing, the IF table,
// reassembly with ageing (a virtual clock) and eviction under small watermarks and a small
// entry table — to two IFs: a crc32 IF whose responses go out through the tx path, and a
// consumer that checks every gather list. Checked after every burst (abort on violation):
//  - every received packet is dropped for one reason, answered as ARP, held by an incomplete
//    request, or part of a request handed to an IF;
//  - the rx pool's mbufs in use are exactly those incomplete requests hold (so no mbuf is
//    leaked or freed twice), and after the input every pool is full again;
//  - what goes out is a well-formed response or ARP reply to a unicast address.
#include <arpa/inet.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "dataplane/crc32_if.h"
#include "dataplane/eal.h"
#include "dataplane/engine.h"
#include "tests/fuzz/dataplane_input.h"
#include "tests/fuzz/fuzz_check.h"
#include "tools/reefgen/packet.h"

namespace dp = reefline::dp;
namespace fz = reefline::fuzz;
namespace gen = reefline::reefgen;
namespace wire = reefline::wire;

namespace {

constexpr uint16_t crc32_port = 9000, gather_port = 9001;
constexpr uint32_t local_ip = 0xc6120002;  // 198.18.0.2/24

// One data plane on a net_ring port with its two IFs.
struct plane {
    rte_ring* rx = nullptr;
    rte_ring* tx = nullptr;
    std::unique_ptr<dp::dataplane> dataplane;
    std::unique_ptr<dp::crc32_if> crc32;
    rte_ring* crc32_in = nullptr;  // the data plane's ring for crc32_port
    rte_ring* gather_in = nullptr;  // the data plane's ring for gather_port
    uint64_t delivered_fragments = 0;  // fragments of requests handed to the two IFs
    uint64_t now = 0;                  // the virtual clock, TSC units

    plane(const std::string& name, dp::eviction_order order) {
        rx = rte_ring_create((name + "rx").c_str(), 1024, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        tx = rte_ring_create((name + "tx").c_str(), 4096, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        FUZZ_CHECK(rx && tx, "rings");
        const int pid = rte_eth_from_rings((name + "ring").c_str(), &rx, 1, &tx, 1, 0);
        FUZZ_CHECK(pid >= 0, "rte_eth_from_rings");
        dp::dataplane_config c;
        c.port.port_id = uint16_t(pid);
        c.port.rx_mbufs = 1023;
        c.port.tx_mbufs = 1023;
        c.port.rx_descriptors = c.port.tx_descriptors = 64;
        // Small enough that short inputs reach ageing, table_full and eviction.
        c.reassembly.entries = 16;
        c.reassembly.age_limit_us = 1000;
        c.reassembly.held_high = 48;
        c.reassembly.held_low = 24;
        c.reassembly.eviction = order;
        c.local_ip_be = htonl(local_ip);
        c.local_prefix_length = 24;
        dataplane = std::make_unique<dp::dataplane>(c);
        // crc32_if's own slot and port only name its ring; the table routes to crc32_in,
        // from which the target forwards after counting.
        const uint16_t n = order == dp::eviction_order::oldest_first ? 1 : 0;
        crc32 = std::make_unique<dp::crc32_if>(*dataplane, "crc32", uint16_t(19000 + n), uint16_t(10 + n), 64);
        crc32_in = rte_ring_create((name + "c").c_str(), 64, 0, RING_F_SC_DEQ);
        gather_in = rte_ring_create((name + "g").c_str(), 64, 0, RING_F_SC_DEQ);
        FUZZ_CHECK(crc32_in && gather_in, "IF rings");
        dataplane->ifs().publish({{"crc32", crc32_port, 0, crc32_in}, {"gather", gather_port, 1, gather_in}});
        dataplane->rx_online(0);
        now = rte_get_tsc_hz();
    }

    const dp::reassembler& reasm() const { return dataplane->queue_reassembler(0); }

    // Polls until the rx ring is empty, then serves both IFs and drains the tx side.
    void poll() {
        do dataplane->poll_rx(0, now);
        while (rte_ring_count(rx) > 0);
        serve();
    }

    void serve() {
        void* objs[64];
        // crc32: counted, then handed on to the crc32 IF, which answers.
        while (unsigned k = rte_ring_sc_dequeue_burst(crc32_in, objs, 64, nullptr)) {
            for (unsigned i = 0; i < k; ++i) {
                auto* r = static_cast<dp::request*>(objs[i]);
                check_gather_list(*r);
                delivered_fragments += r->frag_count;
                FUZZ_CHECK(rte_ring_enqueue(crc32->binding().ring, r) == 0, "crc32 ring full");
                while (crc32->poll()) {}
            }
        }
        while (unsigned k = rte_ring_sc_dequeue_burst(gather_in, objs, 64, nullptr)) {
            for (unsigned i = 0; i < k; ++i) {
                auto* r = static_cast<dp::request*>(objs[i]);
                check_gather_list(*r);
                delivered_fragments += r->frag_count;
                const uint32_t freed = dp::release(r);
                FUZZ_CHECK(freed == r->frag_count, "release freed %u of %u fragments", freed, unsigned(r->frag_count));
            }
        }
        for (;;) {
            const uint16_t sent = dataplane->poll_tx();
            while (rte_ring_dequeue(tx, objs) == 0) {
                auto* m = static_cast<rte_mbuf*>(objs[0]);
                check_output(m);
                rte_pktmbuf_free(m);
            }
            if (!sent && !dataplane->tx_pending()) break;
        }
    }

    // A complete request: fragments in index order tile [0, total_length).
    static void check_gather_list(const dp::request& r) {
        FUZZ_CHECK(r.frag_count >= 1 && r.frag_count <= wire::max_fragments, "frag_count %u", unsigned(r.frag_count));
        uint64_t at = 0;
        for (const dp::gather_segment& s : r.gather_list()) {
            FUZZ_CHECK(s.offset == at && s.length >= 1, "segment at %u, expected %llu", s.offset, (unsigned long long)at);
            at += s.length;
        }
        FUZZ_CHECK(at == r.total_length, "segments cover %llu of %u", (unsigned long long)at, r.total_length);
    }

    // What the appliance sends: ARP replies and responses, each to a unicast address.
    void check_output(const rte_mbuf* m) const {
        const auto* p = rte_pktmbuf_mtod(m, const uint8_t*);
        FUZZ_CHECK(m->nb_segs == 1 && m->data_len >= 14, "short output frame");
        FUZZ_CHECK(!(p[0] & 1), "a frame to a group MAC address");
        if (p[12] == 0x08 && p[13] == 0x06) return;  // ARP reply (built from a checked request)
        const gen::parsed_frame f = gen::parse_frame({p, m->data_len});
        FUZZ_CHECK(f.error == gen::frame_error::none, "response does not parse: %s", std::string(gen::to_string(f.error)).c_str());
        // Neither end may be 0.0.0.0, multicast, class E, broadcast or the subnet's broadcast.
        for (const uint32_t ip : {f.src_ip, f.dst_ip})
            FUZZ_CHECK(ip != 0 && ip < 0xe0000000u && ip != 0xc61200ff, "a response between %08x and %08x", f.src_ip, f.dst_ip);
        FUZZ_CHECK(f.dst_port != 0, "response to port 0");
        const wire::fields h = wire::decode(&f.header);
        FUZZ_CHECK(h.kind == uint8_t(wire::kind::response) && h.format == uint8_t(wire::format::result_crc32) &&
                  f.fragment.size() == 8,
              "not a crc32 result");
    }

    // Packets in = drops + ARP answered + held + delivered; mbufs in use = held.
    void check_accounting() const {
        const dp::counter_snapshot c = dataplane->counters();
        const uint64_t accounted = c.drops_total() + c.arp_replies + reasm().held_mbufs() + delivered_fragments;
        FUZZ_CHECK(c.rx_packets == accounted, "rx_packets %llu != drops %llu + arp %llu + held %u + delivered %llu",
              (unsigned long long)c.rx_packets, (unsigned long long)c.drops_total(),
              (unsigned long long)c.arp_replies, reasm().held_mbufs(), (unsigned long long)delivered_fragments);
        rte_mempool* pool = dataplane->eth().rx_pool();
        const unsigned in_use = pool->size - rte_mempool_avail_count(pool);
        FUZZ_CHECK(in_use == reasm().held_mbufs(), "%u rx mbufs in use, incomplete requests hold %u", in_use,
              reasm().held_mbufs());
        FUZZ_CHECK(reasm().held_mbufs() <= reasm().held_high(), "held %u above the high watermark %u",
              reasm().held_mbufs(), reasm().held_high());
    }

    void end_of_input() {
        poll();
        dataplane->flush(0);
        check_accounting();
        // REEFLINE_FUZZ_VERBOSE=1: the counters after each input (what a seed exercises).
        if (std::getenv("REEFLINE_FUZZ_VERBOSE"))
            std::fprintf(stderr, "%s responses=%llu\n", dataplane->counters().to_json().c_str(),
                         (unsigned long long)crc32->counters().responses_sent.get());
        for (rte_mempool* pool : {dataplane->eth().rx_pool(), dataplane->eth().tx_pool(), reasm().entry_pool()})
            FUZZ_CHECK(rte_mempool_avail_count(pool) == pool->size, "%s: %u of %u free", pool->name,
                  rte_mempool_avail_count(pool), pool->size);
    }

    // Puts one frame on the rx ring as the record's flags say.
    void receive(uint8_t flags, const uint8_t* data, uint32_t len) {
        rte_mempool* pool = dataplane->eth().rx_pool();
        rte_mbuf* m = rte_pktmbuf_alloc(pool);
        FUZZ_CHECK(m, "rx pool empty with %u held", reasm().held_mbufs());
        const uint32_t first = (flags & fz::two_segments) ? len / 2 : len;
        std::memcpy(rte_pktmbuf_append(m, uint16_t(first)), data, first);
        if (first < len) {
            rte_mbuf* tail = rte_pktmbuf_alloc(pool);
            FUZZ_CHECK(tail, "rx pool empty");
            std::memcpy(rte_pktmbuf_append(tail, uint16_t(len - first)), data + first, len - first);
            FUZZ_CHECK(rte_pktmbuf_chain(m, tail) == 0, "chain");
        }
        if (flags & fz::fix_ip_checksum) fix_checksum(m);
        static constexpr uint64_t ip_flags[4] = {0, RTE_MBUF_F_RX_IP_CKSUM_GOOD, RTE_MBUF_F_RX_IP_CKSUM_BAD, 0};
        static constexpr uint64_t l4_flags[4] = {0, RTE_MBUF_F_RX_L4_CKSUM_GOOD, RTE_MBUF_F_RX_L4_CKSUM_BAD, 0};
        m->ol_flags |= ip_flags[(flags >> 1) & 3] | l4_flags[(flags >> 3) & 3];
        FUZZ_CHECK(rte_ring_enqueue(rx, m) == 0, "rx ring");
        // Bursts end where the input says, and at the latest when the ring holds what a NIC's
        // ring of 64 descriptors would.
        if ((flags & fz::end_of_burst) || rte_ring_count(rx) >= 64) poll();
    }

    // The IPv4 header checksum of a (first-segment) frame, where there is room for one.
    static void fix_checksum(rte_mbuf* m) {
        auto* p = rte_pktmbuf_mtod(m, uint8_t*);
        uint32_t l2 = 14;
        if (m->data_len >= 18 && p[12] == 0x81 && p[13] == 0x00) l2 = 18;
        if (m->data_len < l2 + sizeof(rte_ipv4_hdr)) return;
        auto* ip = reinterpret_cast<rte_ipv4_hdr*>(p + l2);
        const uint32_t ihl = (ip->version_ihl & 0x0f) * 4u;
        if (ihl < sizeof(rte_ipv4_hdr) || l2 + ihl > m->data_len) return;
        ip->hdr_checksum = 0;
        ip->hdr_checksum = uint16_t(~rte_raw_cksum(ip, ihl));
    }
};

plane* planes[2];

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    try {
        dp::eal_init("fuzz_dataplane", {"-l", "0", "--no-pci", "--no-huge", "-m", "256", "--no-shconf",
                                        "--no-telemetry", "--log-level", "lib.eal:error"});
        planes[0] = new plane("fzl", dp::eviction_order::largest_first);
        planes[1] = new plane("fzo", dp::eviction_order::oldest_first);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz_dataplane: %s\n", e.what());
        std::abort();
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    plane& p = *planes[(data[0] & fz::oldest_first) ? 1 : 0];
    size_t at = 0;
    while (at + 3 <= size) {
        const uint8_t flags = data[at];
        const uint16_t value = uint16_t(data[at + 1] << 8 | data[at + 2]);
        at += 3;
        if (flags == fz::advance_clock) {
            p.now += uint64_t(value) * rte_get_tsc_hz() / 100000;
            p.poll();
        } else {
            const uint32_t len = std::min<uint32_t>({value, fz::max_frame, uint32_t(size - at)});
            p.receive(flags, data + at, len);
            at += len;
        }
        if (rte_ring_count(p.rx) == 0) p.check_accounting();  // after each burst
    }
    p.end_of_input();
    return 0;
}
