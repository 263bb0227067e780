// The data plane end to end inside one process: frames go into an rx ring behind a net_ring
// ethdev, through parsing, reassembly and the crc32 IF, and responses come out of its tx
// ring. Every scenario ends with every mbuf and every reassembly entry back in its pool.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ring.h>

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "dataplane/crc32_if.h"
#include "clients/c/wire/crc32c.h"
#include "dataplane/engine.h"
#include "dataplane/packet.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace dp = reefline::dp;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;

namespace {

constexpr uint16_t if_port = 9000;

gen::frame_addresses addresses(uint16_t src_port = 40000, uint32_t src_ip = 0xc6120001) {
    gen::frame_addresses a;
    a.src_mac = {0x02, 0, 0, 0, 0, 0x01};
    a.dst_mac = {0x02, 0, 0, 0, 0, 0x02};
    a.src_ip = src_ip;      // 198.18.0.1
    a.dst_ip = 0xc6120002;  // 198.18.0.2
    a.src_port = src_port;
    a.dst_port = if_port;
    return a;
}

std::vector<uint8_t> payload_of(size_t n, uint32_t seed) {
    std::vector<uint8_t> p(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto& b : p) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        b = uint8_t(x);
    }
    return p;
}

// One request cut into fragments of `frag` bytes: a frame per fragment, in index order.
struct request_frames {
    uint64_t id;
    std::vector<uint8_t> payload;
    std::vector<wire::fields> headers;
    std::vector<std::vector<uint8_t>> frames;
};

std::vector<uint8_t> frame_for(const wire::fields& h, std::span<const uint8_t> data,
                               const gen::frame_addresses& a = addresses()) {
    std::vector<uint8_t> udp;
    gen::append_udp_payload(udp, h, data);
    return gen::build_frame(a, 1, udp);
}

request_frames make_request(uint64_t id, size_t total, size_t frag,
                            const gen::frame_addresses& a = addresses()) {
    request_frames r{id, payload_of(total, uint32_t(id)), {}, {}};
    gen::request_payload payload;
    payload.bytes = r.payload;
    for (const wire::fields& h : gen::plan_fragments(payload, id, uint32_t(frag))) {
        r.headers.push_back(h);
        r.frames.push_back(frame_for(h, {r.payload.data() + h.payload_offset, gen::fragment_length(h, uint32_t(frag))}, a));
    }
    return r;
}

struct response {
    wire::fields header;
    uint32_t total = 0, crc = 0;
    uint32_t dst_ip = 0;
    uint16_t dst_port = 0;
    uint16_t vlan_tci = 0;
    bool vlan_tagged = false;
};

class dataplane_test : public ::testing::Test {
protected:
    void SetUp() override { start({}); }

    void start(dp::reassembly_config rc, uint32_t if_ring = 1024, uint8_t prefix_length = 0) {
        static std::atomic<int> seq{0};
        const std::string n = std::to_string(seq++);
        _rx = rte_ring_create(("trx" + n).c_str(), 4096, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        _tx = rte_ring_create(("ttx" + n).c_str(), 4096, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        ASSERT_TRUE(_rx && _tx);
        const int pid = rte_eth_from_rings(("tring" + n).c_str(), &_rx, 1, &_tx, 1, 0);
        ASSERT_GE(pid, 0);
        dp::dataplane_config c;
        c.port.port_id = uint16_t(pid);
        c.port.rx_mbufs = 8191;
        c.port.tx_mbufs = 1023;
        c.port.rx_descriptors = 512;
        c.port.tx_descriptors = 512;
        c.reassembly = rc;
        c.local_ip_be = htonl(0xc6120002);  // 198.18.0.2
        c.local_prefix_length = prefix_length;
        _plane = std::make_unique<dp::dataplane>(c);
        _if = std::make_unique<dp::crc32_if>(*_plane, "crc32", if_port, 0, if_ring);
        _plane->ifs().publish({_if->binding()});
        _plane->rx_online(0);
    }

    void TearDown() override {
        if (!_plane) return;
        stop_and_check_pools();
    }

    void stop_and_check_pools() {
        drain_responses();
        _plane->flush(0);
        _plane->rx_offline(0);
        _if.reset();
        rte_mempool* rx = _plane->eth().rx_pool();
        rte_mempool* tx = _plane->eth().tx_pool();
        rte_mempool* entries = _plane->queue_reassembler(0).entry_pool();
        _plane->eth().close();
        EXPECT_EQ(rte_mempool_avail_count(rx), rx->size) << "rx mbufs leaked";
        EXPECT_EQ(rte_mempool_avail_count(tx), tx->size) << "tx mbufs leaked";
        EXPECT_EQ(rte_mempool_avail_count(entries), entries->size) << "entries leaked";
        _plane.reset();
        rte_ring_free(_rx);
        rte_ring_free(_tx);
    }

    void inject(const std::vector<uint8_t>& frame) {
        rte_mbuf* m = rte_pktmbuf_alloc(_plane->eth().rx_pool());
        ASSERT_NE(m, nullptr) << "rx pool empty";
        auto* p = rte_pktmbuf_append(m, uint16_t(frame.size()));
        ASSERT_NE(p, nullptr);
        std::memcpy(p, frame.data(), frame.size());
        ASSERT_EQ(rte_ring_enqueue(_rx, m), 0);
    }

    // Runs rx, the IF and tx until the rx ring is empty and nothing is left to answer.
    void pump() {
        for (int i = 0; i < 64; ++i) {
            _plane->poll_rx(0);
            _if->poll();
            _plane->poll_tx();
        }
    }

    std::vector<response> drain_responses() {
        pump();
        std::vector<response> out;
        void* obj;
        while (rte_ring_dequeue(_tx, &obj) == 0) {
            auto* m = static_cast<rte_mbuf*>(obj);
            std::span<const uint8_t> f(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len);
            gen::parsed_frame p = gen::parse_frame(f);
            EXPECT_EQ(p.error, gen::frame_error::none) << gen::to_string(p.error);
            response r;
            r.header = wire::decode(&p.header);
            r.dst_ip = p.dst_ip;
            r.dst_port = p.dst_port;
            if (f.size() >= 16 && f[12] == 0x81 && f[13] == 0x00) {
                r.vlan_tagged = true;
                r.vlan_tci = uint16_t(f[14] << 8 | f[15]);
            }
            if (p.fragment.size() == 8) {
                r.total = uint32_t(p.fragment[0]) << 24 | p.fragment[1] << 16 | p.fragment[2] << 8 | p.fragment[3];
                r.crc = uint32_t(p.fragment[4]) << 24 | p.fragment[5] << 16 | p.fragment[6] << 8 | p.fragment[7];
            }
            out.push_back(r);
            rte_pktmbuf_free(m);
        }
        _responses.insert(_responses.end(), out.begin(), out.end());
        return out;
    }

    uint64_t drops(dp::drop_reason r) const {
        return _plane->queue_counters(0).drops[size_t(r)].get();
    }
    const dp::rx_counters& rx() const { return _plane->queue_counters(0); }

    static void expect_answer(const response& r, const request_frames& q) {
        EXPECT_EQ(r.header.kind, uint8_t(wire::kind::response));
        EXPECT_EQ(r.header.status, uint8_t(wire::status::ok));
        EXPECT_EQ(r.header.format, uint8_t(wire::format::result_crc32));
        EXPECT_EQ(r.header.request_id, q.id);
        EXPECT_EQ(r.total, q.payload.size());
        EXPECT_EQ(r.crc, reefline::crc32c(q.payload.data(), q.payload.size()));
        EXPECT_EQ(r.dst_ip, 0xc6120001u);
        EXPECT_EQ(r.dst_port, 40000);
    }

    rte_ring* _rx = nullptr;
    rte_ring* _tx = nullptr;
    std::unique_ptr<dp::dataplane> _plane;
    std::unique_ptr<dp::crc32_if> _if;
    std::vector<response> _responses;
};

TEST_F(dataplane_test, in_order) {
    auto q = make_request(1, 5000, 1024);
    for (auto& f : q.frames) inject(f);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 1u);
    expect_answer(rs[0], q);
    EXPECT_EQ(rx().requests_completed.get(), 1u);
    EXPECT_EQ(rx().rx_packets.get(), 5u);
}

TEST_F(dataplane_test, reordered_and_interleaved) {
    std::vector<request_frames> qs;
    for (uint64_t id = 10; id < 20; ++id) qs.push_back(make_request(id, 3000 + id * 7, 512));
    std::vector<const std::vector<uint8_t>*> all;
    for (auto& q : qs)
        for (auto& f : q.frames) all.push_back(&f);
    std::reverse(all.begin(), all.end());
    std::rotate(all.begin(), all.begin() + 13, all.end());
    for (auto* f : all) inject(*f);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), qs.size());
    for (auto& r : rs) expect_answer(r, qs[r.header.request_id - 10]);
}

TEST_F(dataplane_test, duplicate_fragment_is_dropped) {
    auto q = make_request(2, 4096, 1024);
    inject(q.frames[0]);
    inject(q.frames[1]);
    inject(q.frames[1]);
    inject(q.frames[2]);
    inject(q.frames[3]);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 1u);
    expect_answer(rs[0], q);
    EXPECT_EQ(drops(dp::drop_reason::duplicate), 1u);
}

TEST_F(dataplane_test, missing_fragment_times_out) {
    TearDown();
    dp::reassembly_config rc;
    rc.age_limit_us = 1000;
    start(rc);
    auto q = make_request(3, 5000, 1024);
    for (size_t i = 0; i < q.frames.size(); ++i)
        if (i != 2) inject(q.frames[i]);
    pump();
    EXPECT_EQ(rx().requests_timed_out.get(), 0u);
    EXPECT_EQ(_plane->queue_reassembler(0).pending(), 1u);
    rte_delay_us_block(2000);
    pump();
    EXPECT_EQ(rx().requests_timed_out.get(), 1u);
    EXPECT_EQ(drops(dp::drop_reason::timeout), 4u);
    EXPECT_EQ(_plane->queue_reassembler(0).pending(), 0u);
    // The late fragment starts a new request, which times out too.
    inject(q.frames[2]);
    pump();
    EXPECT_TRUE(drain_responses().empty());
}

TEST_F(dataplane_test, fragments_disagreeing_on_total_or_count) {
    auto q = make_request(4, 3072, 1024);
    inject(q.frames[0]);
    auto h = q.headers[1];
    h.total_length = 4000;  // disagrees with fragment 0
    inject(frame_for(h, {q.payload.data() + 1024, 1024}));
    h = q.headers[1];
    h.frag_count = 4;
    inject(frame_for(h, {q.payload.data() + 1024, 1024}));
    h = q.headers[1];
    h.format = uint8_t(wire::format::tokens_i32);
    h.dims[0] = 768;
    inject(frame_for(h, {q.payload.data() + 1024, 1024}));
    EXPECT_EQ(drain_responses().size(), 0u);
    EXPECT_EQ(drops(dp::drop_reason::inconsistent), 3u);
    inject(q.frames[1]);
    inject(q.frames[2]);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 1u);
    expect_answer(rs[0], q);
}

TEST_F(dataplane_test, offsets_that_do_not_tile_drop_the_request) {
    auto q = make_request(5, 3072, 1024);
    auto h = q.headers[1];
    h.payload_offset = 1000;  // overlaps fragment 0 and leaves a gap
    inject(q.frames[0]);
    inject(frame_for(h, {q.payload.data() + 1000, 1024}));
    inject(q.frames[2]);
    EXPECT_TRUE(drain_responses().empty());
    EXPECT_EQ(rx().requests_malformed.get(), 1u);
    EXPECT_EQ(drops(dp::drop_reason::inconsistent), 3u);
}

TEST_F(dataplane_test, offset_beyond_total) {
    auto q = make_request(6, 2048, 1024);
    auto h = q.headers[1];
    h.payload_offset = 1500;
    inject(frame_for(h, {q.payload.data() + 1024, 1024}));
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::offset_out_of_range), 1u);
}

TEST_F(dataplane_test, zero_lengths) {
    auto q = make_request(7, 2048, 1024);
    auto h = q.headers[0];
    inject(frame_for(h, {}));  // empty fragment
    h.total_length = 0;
    inject(frame_for(h, {q.payload.data(), 16}));
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::zero_length), 2u);
}

TEST_F(dataplane_test, limits) {
    auto q = make_request(8, 2048, 1024);
    auto h = q.headers[0];
    h.total_length = wire::max_total_length + 1;
    inject(frame_for(h, {q.payload.data(), 1024}));
    h = q.headers[0];
    h.frag_count = wire::max_fragments + 1;
    inject(frame_for(h, {q.payload.data(), 1024}));
    h = q.headers[0];
    h.frag_index = 2;  // == count
    inject(frame_for(h, {q.payload.data(), 1024}));
    h = q.headers[0];
    h.format = uint8_t(wire::format::image_u8_hwc);
    h.dims[0] = 10; h.dims[1] = 10; h.dims[2] = 3;  // 300 != 2048
    inject(frame_for(h, {q.payload.data(), 1024}));
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::too_large), 1u);
    EXPECT_EQ(drops(dp::drop_reason::too_many_fragments), 2u);
    EXPECT_EQ(drops(dp::drop_reason::dims_mismatch), 1u);
}

TEST_F(dataplane_test, bad_magic_version_kind) {
    auto q = make_request(9, 1024, 1024);
    for (int variant = 0; variant < 4; ++variant) {
        auto f = q.frames[0];
        uint8_t* h = f.data() + gen::wire_offset;
        if (variant == 0) h[0] ^= 0xff;                 // magic
        if (variant == 1) h[4] = 2;                     // version
        if (variant == 2) h[5] = uint8_t(wire::kind::response);
        if (variant == 3) h[39] = 1;                    // reserved
        gen::refresh_checksums(f);
        inject(f);
    }
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::bad_header), 4u);
}

TEST_F(dataplane_test, truncated_headers) {
    auto q = make_request(11, 1024, 1024);
    auto f = q.frames[0];
    f.resize(14 + 10);  // inside the IPv4 header
    inject(f);
    f = q.frames[0];
    f.resize(10);  // inside the Ethernet header
    inject(f);
    // A UDP payload shorter than the reefline header, with consistent IP/UDP lengths.
    std::vector<uint8_t> small(20, 0x55);
    inject(gen::build_frame(addresses(), 1, small));
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::truncated), 3u);
}

TEST_F(dataplane_test, ip_and_udp_length_mismatches) {
    auto q = make_request(12, 1024, 1024);
    auto f = q.frames[0];
    f[gen::udp_offset + 5] ^= 0x04;  // UDP length
    gen::refresh_checksums(f);
    inject(f);
    f = q.frames[0];
    f[gen::ipv4_offset + 3] += 40;  // IP total length beyond the frame
    gen::refresh_checksums(f);
    inject(f);
    f = q.frames[0];
    f[gen::ipv4_offset + 10] ^= 0x11;  // header checksum
    inject(f);
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::bad_length), 1u);
    EXPECT_EQ(drops(dp::drop_reason::truncated), 1u);
    EXPECT_EQ(drops(dp::drop_reason::bad_ip), 1u);
}

TEST_F(dataplane_test, ip_fragments_non_ipv4_non_udp) {
    auto q = make_request(13, 1024, 1024);
    auto f = q.frames[0];
    f[gen::ipv4_offset + 6] = 0x20;  // MF
    gen::refresh_checksums(f);
    inject(f);
    f = q.frames[0];
    f[12] = 0x86; f[13] = 0xdd;  // IPv6 ethertype
    inject(f);
    f = q.frames[0];
    f[12] = 0x08; f[13] = 0x06;  // ARP
    inject(f);
    f = q.frames[0];
    f[gen::ipv4_offset + 9] = 6;  // TCP
    gen::refresh_checksums(f);
    inject(f);
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::ip_fragment), 1u);
    EXPECT_EQ(drops(dp::drop_reason::not_ipv4), 2u);
    EXPECT_EQ(drops(dp::drop_reason::not_udp), 1u);
}

TEST_F(dataplane_test, unknown_port) {
    auto a = addresses();
    a.dst_port = 9001;
    auto q = make_request(14, 2048, 1024, a);
    for (auto& f : q.frames) inject(f);
    drain_responses();
    EXPECT_EQ(drops(dp::drop_reason::unknown_port), 2u);
}

TEST_F(dataplane_test, vlan_tag_is_echoed) {
    auto q = make_request(15, 1024, 1024);
    auto f = q.frames[0];
    const uint8_t tag[4] = {0x81, 0x00, 0x00, 0x2a};
    f.insert(f.begin() + 12, tag, tag + 4);
    inject(f);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 1u);
    expect_answer(rs[0], q);
    EXPECT_TRUE(rs[0].vlan_tagged);
    EXPECT_EQ(rs[0].vlan_tci, 0x2a);
}

TEST_F(dataplane_test, priority_tag_is_echoed) {
    // 802.1p: a tag with VLAN 0 carries only a priority; TCI 0 is still a tag to echo.
    for (const uint8_t tci_low : {0x00, 0x01}) {
        auto q = make_request(16 + tci_low, 1024, 1024);
        auto f = q.frames[0];
        const uint8_t tag[4] = {0x81, 0x00, 0x00, tci_low};
        f.insert(f.begin() + 12, tag, tag + 4);
        inject(f);
        auto rs = drain_responses();
        ASSERT_EQ(rs.size(), 1u);
        expect_answer(rs[0], q);
        EXPECT_TRUE(rs[0].vlan_tagged) << "TCI " << int(tci_low);
        EXPECT_EQ(rs[0].vlan_tci, tci_low);
    }
    // Untagged stays untagged.
    auto q = make_request(18, 1024, 1024);
    inject(q.frames[0]);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_FALSE(rs[0].vlan_tagged);
}

TEST_F(dataplane_test, table_full_evicts_oldest) {
    TearDown();
    dp::reassembly_config rc;
    rc.entries = 8;
    start(rc);
    std::vector<request_frames> qs;
    for (uint64_t id = 100; id < 109; ++id) qs.push_back(make_request(id, 2048, 1024));
    for (auto& q : qs) inject(q.frames[0]);  // nine requests open, eight entries
    pump();
    EXPECT_EQ(rx().requests_evicted.get(), 1u);
    EXPECT_EQ(drops(dp::drop_reason::table_full), 1u);
    // The evicted request (the oldest, id 100) is not resent; a fragment of it would take
    // an entry and evict the next oldest in turn.
    for (size_t i = 1; i < qs.size(); ++i) inject(qs[i].frames[1]);
    auto rs = drain_responses();
    EXPECT_EQ(rs.size(), 8u);
    for (auto& r : rs) EXPECT_NE(r.header.request_id, 100u);
}

TEST_F(dataplane_test, held_mbufs_and_bytes_are_counted) {
    auto a = make_request(650, 64 * 20, 64);
    for (size_t i = 0; i < 7; ++i) inject(a.frames[i]);
    pump();
    const dp::reassembler& r = _plane->queue_reassembler(0);
    EXPECT_EQ(r.held_mbufs(), 7u);
    rte_mbuf* probe = rte_pktmbuf_alloc(_plane->eth().rx_pool());
    ASSERT_NE(probe, nullptr);
    EXPECT_EQ(r.held_bytes(), 7 * (sizeof(rte_mbuf) + probe->buf_len));  // memory, not frame bytes
    rte_pktmbuf_free(probe);
    for (size_t i = 7; i < a.frames.size(); ++i) inject(a.frames[i]);
    EXPECT_EQ(drain_responses().size(), 1u);
    EXPECT_EQ(r.held_mbufs(), 0u);  // complete requests are not "held by incomplete ones"
    EXPECT_EQ(r.held_bytes(), 0u);
}

// Watermarks 40/20 mbufs: A (oldest) holds 10, B 30; C's fragments push the total to 45.
TEST_F(dataplane_test, memory_watermark_evicts_the_largest_first) {
    TearDown();
    dp::reassembly_config rc;
    rc.held_high = 40;
    rc.held_low = 20;
    rc.eviction = dp::eviction_order::largest_first;
    start(rc);
    auto a = make_request(700, 64 * 20, 64), b = make_request(701, 64 * 40, 64),
         c = make_request(702, 64 * 8, 64);
    for (size_t i = 0; i < 10; ++i) inject(a.frames[i]);
    for (size_t i = 0; i < 30; ++i) inject(b.frames[i]);
    pump();
    EXPECT_EQ(_plane->queue_reassembler(0).held_mbufs(), 40u);
    EXPECT_EQ(rx().requests_evicted.get(), 0u);
    for (size_t i = 0; i < 5; ++i) inject(c.frames[i]);
    pump();
    // B goes (30 mbufs); A and C stay and complete.
    EXPECT_EQ(rx().requests_evicted.get(), 1u);
    EXPECT_EQ(drops(dp::drop_reason::memory_pressure), 30u);
    EXPECT_EQ(_plane->queue_reassembler(0).held_mbufs(), 15u);
    for (size_t i = 10; i < a.frames.size(); ++i) inject(a.frames[i]);
    for (size_t i = 5; i < c.frames.size(); ++i) inject(c.frames[i]);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 2u);
    for (auto& r : rs) expect_answer(r, r.header.request_id == 700 ? a : c);
}

TEST_F(dataplane_test, memory_watermark_evicts_the_oldest_first) {
    TearDown();
    dp::reassembly_config rc;
    rc.held_high = 40;
    rc.held_low = 20;
    rc.eviction = dp::eviction_order::oldest_first;
    start(rc);
    auto a = make_request(700, 64 * 20, 64), b = make_request(701, 64 * 40, 64),
         c = make_request(702, 64 * 8, 64);
    for (size_t i = 0; i < 10; ++i) inject(a.frames[i]);
    for (size_t i = 0; i < 30; ++i) inject(b.frames[i]);
    for (size_t i = 0; i < 5; ++i) inject(c.frames[i]);
    pump();
    // A (oldest, 10) is not enough to reach 20: B goes too; C stays and completes.
    EXPECT_EQ(rx().requests_evicted.get(), 2u);
    EXPECT_EQ(drops(dp::drop_reason::memory_pressure), 40u);
    EXPECT_EQ(_plane->queue_reassembler(0).held_mbufs(), 5u);
    for (size_t i = 5; i < c.frames.size(); ++i) inject(c.frames[i]);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 1u);
    expect_answer(rs[0], c);
}

// Partial requests that never complete (300 of 301 fragments each, from another source)
// interleaved with cameras' requests, far more of them than the rx pool holds: the
// watermarks derived from the pool keep the NIC supplied and every camera request served.
TEST_F(dataplane_test, flood_of_partial_requests_leaves_legitimate_ones_served) {
    for (const auto order : {dp::eviction_order::largest_first, dp::eviction_order::oldest_first}) {
        SCOPED_TRACE(dp::to_string(order));
        TearDown();
        _responses.clear();
        dp::reassembly_config rc;
        rc.eviction = order;
        start(rc);
        const dp::reassembler& reasm = _plane->queue_reassembler(0);
        const uint32_t pool = _plane->eth().rx_pool()->size;
        ASSERT_GT(reasm.held_high(), 0u);
        ASSERT_LT(reasm.held_high(), pool / 2);
        const auto attacker = addresses(50000, 0xc6120009);
        std::vector<request_frames> legit;
        constexpr int rounds = 40;  // 40 x 300 flood fragments: 12000 > 8191 mbufs
        for (int round = 0; round < rounds; ++round) {
            auto flood = make_request(10000 + round, 64 * 301, 64, attacker);
            legit.push_back(make_request(800 + round, 16 * 1024, 1024));
            const auto& q = legit.back();
            size_t next_legit = 0;
            for (size_t i = 0; i + 1 < flood.frames.size(); ++i) {
                inject(flood.frames[i]);
                if (i % 19 == 0 && next_legit < q.frames.size()) inject(q.frames[next_legit++]);
            }
            while (next_legit < q.frames.size()) inject(q.frames[next_legit++]);
            if (HasFatalFailure()) return;
            drain_responses();
            EXPECT_LE(reasm.held_mbufs(), reasm.held_high());
        }
        ASSERT_EQ(_responses.size(), legit.size());
        for (auto& r : _responses) expect_answer(r, legit[r.header.request_id - 800]);
        EXPECT_GT(drops(dp::drop_reason::memory_pressure), 0u);
        EXPECT_GT(rx().requests_evicted.get(), 0u);
        EXPECT_EQ(_plane->eth().stats().rx_nombuf, 0u);
        // The pools are checked full by stop_and_check_pools (TearDown or the next round).
    }
}

TEST(held_limits, derived_from_the_rx_pool) {
    dp::port_config port;  // 16383 mbufs, 1 queue, 1024 descriptors
    const dp::reassembly_config d = dp::derive_held_limits(port, {});
    // (16383 - 1024 descriptors - 64 burst - 384 mempool cache) / 2, low 3/4 of it.
    EXPECT_EQ(d.held_high, 7455u);
    EXPECT_EQ(d.held_low, 7455u / 4 * 3);
    port.rx_queues = 4;  // each queue gets its share of the pool
    EXPECT_EQ(dp::derive_held_limits(port, {}).held_high, (16383u / 4 - 1024 - 64 - 384) / 2);
    dp::reassembly_config given;
    given.held_high = 1000;
    EXPECT_EQ(dp::derive_held_limits(port, given).held_low, 750u);
    given.held_low = 1000;
    EXPECT_THROW(dp::derive_held_limits(port, given), std::invalid_argument);  // low >= high
    given.held_high = 5000;
    given.held_low = 0;
    EXPECT_THROW(dp::derive_held_limits(port, given), std::invalid_argument);  // above the share
    port.rx_queues = 1;
    port.rx_mbufs = 1023;  // less than the ring itself
    EXPECT_THROW(dp::derive_held_limits(port, {}), std::invalid_argument);
}

TEST_F(dataplane_test, ring_full_drops_whole_requests) {
    TearDown();
    start({}, 4);  // ring of 4 holds 3
    std::vector<request_frames> qs;
    for (uint64_t id = 200; id < 206; ++id) qs.push_back(make_request(id, 2048, 1024));
    for (auto& q : qs)
        for (auto& f : q.frames) inject(f);
    for (int i = 0; i < 8; ++i) _plane->poll_rx(0);  // no IF polling: the ring fills
    EXPECT_EQ(rx().requests_ring_full.get(), 3u);
    EXPECT_EQ(drops(dp::drop_reason::ring_full), 6u);
    EXPECT_EQ(drain_responses().size(), 3u);
}

TEST_F(dataplane_test, many_sources_same_request_id) {
    std::vector<request_frames> qs;
    for (uint16_t s = 0; s < 4; ++s) qs.push_back(make_request(77, 3000, 1000, addresses(40000 + s)));
    for (size_t i = 0; i < 3; ++i)
        for (auto& q : qs) inject(q.frames[i]);
    auto rs = drain_responses();
    ASSERT_EQ(rs.size(), 4u);
    for (auto& r : rs) EXPECT_EQ(r.crc, reefline::crc32c(qs[r.dst_port - 40000].payload.data(), 3000));
}

TEST_F(dataplane_test, if_table_replaced_while_traffic_flows) {
    // A second IF appears and disappears while the rx loop runs on another thread.
    std::atomic<bool> stop{false};
    dp::crc32_if second(*_plane, "second", 9100, 1);
    std::thread control([&] {
        for (int i = 0; i < 200; ++i) {
            _plane->ifs().publish({_if->binding(), second.binding()});
            _plane->ifs().publish({_if->binding()});
        }
        stop = true;
    });
    std::vector<request_frames> qs;
    for (uint64_t id = 300; id < 340; ++id) qs.push_back(make_request(id, 2048, 1024));
    size_t next = 0;
    while (!stop) {
        if (next < qs.size()) {
            for (auto& f : qs[next].frames) inject(f);
            ++next;
        }
        pump();
    }
    control.join();
    for (; next < qs.size(); ++next)
        for (auto& f : qs[next].frames) inject(f);
    auto rs = drain_responses();
    EXPECT_EQ(_responses.size(), qs.size());
    EXPECT_EQ(drops(dp::drop_reason::unknown_port), 0u);
}

std::vector<uint8_t> arp_request(uint32_t target_ip) {
    return gen::build_arp_request(addresses().src_mac, 0xc6120001, target_ip);
}

TEST_F(dataplane_test, answers_arp_for_its_address_only) {
    inject(arp_request(0xc6120002));
    inject(arp_request(0xc6120003));
    pump();
    EXPECT_EQ(rx().arp_replies.get(), 1u);
    EXPECT_EQ(drops(dp::drop_reason::not_ipv4), 1u);
    void* obj;
    ASSERT_EQ(rte_ring_dequeue(_tx, &obj), 0);
    auto* m = static_cast<rte_mbuf*>(obj);
    const uint8_t* p = rte_pktmbuf_mtod(m, const uint8_t*);
    ASSERT_EQ(m->data_len, 42);
    EXPECT_EQ(p[0], 0x02);   // to the asker
    EXPECT_EQ(p[21], 2);     // opcode reply
    EXPECT_EQ(std::memcmp(p + 6, p + 22, 6), 0);  // sender hardware address = our source MAC
    uint32_t sip, tip;
    std::memcpy(&sip, p + 28, 4);
    std::memcpy(&tip, p + 38, 4);
    EXPECT_EQ(ntohl(sip), 0xc6120002u);
    EXPECT_EQ(ntohl(tip), 0xc6120001u);
    rte_pktmbuf_free(m);
}

TEST_F(dataplane_test, arp_to_a_group_address_is_not_answered) {
    auto f = arp_request(0xc6120002);
    f[22] |= 0x01;  // sender hardware address multicast: the reply would go to a group
    inject(f);
    f = arp_request(0xc6120002);
    std::memset(f.data() + 6, 0xff, 6);  // Ethernet source broadcast
    inject(f);
    pump();
    EXPECT_EQ(rx().arp_replies.get(), 0u);
    EXPECT_EQ(drops(dp::drop_reason::not_ipv4), 1u);
    EXPECT_EQ(drops(dp::drop_reason::bad_source), 1u);
    EXPECT_EQ(rte_ring_count(_tx), 0u);
}

// A request that must not be answered (RFC 1122): dropped at parse time, counted, no reply.
struct reflection_case {
    const char* what;
    gen::frame_addresses a;
    dp::drop_reason why;
};

std::vector<reflection_case> reflection_cases() {
    std::vector<reflection_case> cases;
    auto with = [&](const char* what, dp::drop_reason why, auto edit) {
        gen::frame_addresses a = addresses();
        edit(a);
        cases.push_back({what, a, why});
    };
    using dr = dp::drop_reason;
    with("source 0.0.0.0", dr::bad_source, [](auto& a) { a.src_ip = 0; });
    with("source 255.255.255.255", dr::bad_source, [](auto& a) { a.src_ip = 0xffffffff; });
    with("source 224.0.0.1", dr::bad_source, [](auto& a) { a.src_ip = 0xe0000001; });
    with("source 239.255.255.250", dr::bad_source, [](auto& a) { a.src_ip = 0xeffffffa; });
    with("source 240.0.0.1 (class E)", dr::bad_source, [](auto& a) { a.src_ip = 0xf0000001; });
    with("source port 0", dr::bad_source, [](auto& a) { a.src_port = 0; });
    with("Ethernet source multicast", dr::bad_source, [](auto& a) { a.src_mac = {{0x01, 0, 0x5e, 0, 0, 1}}; });
    with("Ethernet source broadcast", dr::bad_source, [](auto& a) { a.src_mac = {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}; });
    with("destination 255.255.255.255", dr::bad_destination, [](auto& a) { a.dst_ip = 0xffffffff; });
    with("destination 224.0.0.251", dr::bad_destination, [](auto& a) { a.dst_ip = 0xe00000fb; });
    with("destination 239.1.2.3", dr::bad_destination, [](auto& a) { a.dst_ip = 0xef010203; });
    // Found by fuzz_dataplane: a reply came from 255.18.255.255.
    with("destination 255.18.255.255 (class E)", dr::bad_destination, [](auto& a) { a.dst_ip = 0xff12ffff; });
    with("destination 0.0.0.0", dr::bad_destination, [](auto& a) { a.dst_ip = 0; });
    return cases;
}

TEST_F(dataplane_test, unanswerable_addresses_are_dropped) {
    uint64_t id = 500;
    for (const auto& c : reflection_cases()) {
        const uint64_t before = drops(c.why), rx_before = rx().rx_packets.get();
        auto q = make_request(id++, 1024, 1024, c.a);
        inject(q.frames[0]);
        EXPECT_TRUE(drain_responses().empty()) << c.what << " was answered";
        EXPECT_EQ(rx().rx_packets.get(), rx_before + 1) << c.what;
        EXPECT_EQ(drops(c.why), before + 1) << c.what << " not counted as " << dp::drop_reason_names[size_t(c.why)];
    }
    EXPECT_EQ(rx().requests_started.get(), 0u);
    // The same frame from an ordinary unicast source is answered.
    auto q = make_request(id, 1024, 1024);
    inject(q.frames[0]);
    ASSERT_EQ(drain_responses().size(), 1u);
}

TEST_F(dataplane_test, subnet_broadcast_refused_when_the_prefix_is_known) {
    // Without a prefix length 198.18.0.255 is an ordinary address.
    auto a = addresses(40000, 0xc61200ff);
    auto q = make_request(600, 1024, 1024, a);
    inject(q.frames[0]);
    EXPECT_EQ(drain_responses().size(), 1u);
    stop_and_check_pools();
    start({}, 1024, 24);  // 198.18.0.2/24: 198.18.0.255 is the subnet's broadcast address
    inject(make_request(601, 1024, 1024, a).frames[0]);
    a = addresses();
    a.dst_ip = 0xc61200ff;
    inject(make_request(602, 1024, 1024, a).frames[0]);
    EXPECT_TRUE(drain_responses().empty());
    EXPECT_EQ(drops(dp::drop_reason::bad_source), 1u);
    EXPECT_EQ(drops(dp::drop_reason::bad_destination), 1u);
    inject(make_request(603, 1024, 1024).frames[0]);
    EXPECT_EQ(drain_responses().size(), 1u);
}

// The rx lcore drops packets while another thread takes counter snapshots: no snapshot may
// show more drops than received packets.
TEST(counters, snapshots_never_show_more_drops_than_packets) {
    rte_mempool* pool = rte_pktmbuf_pool_create("hammer", 255, 0, 0, 2176, 0);
    ASSERT_NE(pool, nullptr);
    dp::if_table ifs(1);
    ifs.reader_online(0);
    auto q = std::make_unique<dp::rx_queue>();
    q->reasm = std::make_unique<dp::reassembler>("hammer", dp::reassembly_config{}, q->counters);
    // Frames for a port without an IF: each is parsed and dropped as unknown_port.
    auto a = addresses();
    a.dst_port = 9999;
    const auto frame = make_request(1, 1024, 1024, a).frames[0];
    constexpr uint16_t burst = dp::rx_burst_size;
    rte_mbuf* mbufs[burst];
    ASSERT_EQ(rte_pktmbuf_alloc_bulk(pool, mbufs, burst), 0);
    for (rte_mbuf* m : mbufs) std::memcpy(rte_pktmbuf_append(m, uint16_t(frame.size())), frame.data(), frame.size());

    std::atomic<bool> done{false};
    std::atomic<uint64_t> snapshots{0}, violations{0};
    std::thread reader([&] {
        while (!done.load(std::memory_order_relaxed)) {
            dp::counter_snapshot s;
            s.add(q->counters);
            if (s.drops_total() > s.rx_packets) violations.fetch_add(1);
            snapshots.fetch_add(1, std::memory_order_relaxed);
        }
    });
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    uint64_t bursts = 0;
    while (std::chrono::steady_clock::now() < until || snapshots.load() < 10000) {
        for (int i = 0; i < 64; ++i, ++bursts) {
            for (rte_mbuf* m : mbufs) rte_mbuf_refcnt_update(m, 1);  // process() frees one reference
            rte_mbuf* pkts[burst];
            std::copy(mbufs, mbufs + burst, pkts);
            q->process(ifs.current(), pkts, burst, rte_rdtsc(), nullptr);
        }
    }
    done = true;
    reader.join();
    EXPECT_EQ(violations.load(), 0u) << "of " << snapshots.load() << " snapshots";
    EXPECT_EQ(q->counters.rx_packets.get(), bursts * burst);
    EXPECT_EQ(q->counters.drops[size_t(dp::drop_reason::unknown_port)].get(), bursts * burst);
    rte_pktmbuf_free_bulk(mbufs, burst);
    q.reset();
    ifs.reader_offline(0);
    EXPECT_EQ(rte_mempool_avail_count(pool), pool->size);
    rte_mempool_free(pool);
}

// docs/protocol.md's table of drop counters is the X-macro's list, in order, word for word.
TEST(counters, protocol_doc_lists_every_drop_reason) {
    const char* path = std::getenv("REEFLINE_PROTOCOL_MD");
    ASSERT_NE(path, nullptr) << "REEFLINE_PROTOCOL_MD not set (meson sets it)";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::vector<std::pair<std::string, std::string>> rows;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("| `drop_", 0) != 0) continue;
        const size_t name_end = line.find('`', 3);
        const size_t text_at = line.find("| ", name_end) + 2;
        const size_t text_end = line.rfind(" |");
        rows.emplace_back(line.substr(3, name_end - 3), line.substr(text_at, text_end - text_at));
    }
    ASSERT_EQ(rows.size(), dp::drop_reason_count);
    for (size_t i = 0; i < dp::drop_reason_count; ++i) {
        EXPECT_EQ(rows[i].first, "drop_" + std::string(dp::drop_reason_names[i]));
        EXPECT_EQ(rows[i].second, dp::drop_reason_texts[i]) << rows[i].first;
    }
}

TEST(if_table, rejects_port_conflicts) {
    dp::if_table t(1);
    dp::if_binding a{"a", 9000, 0, nullptr}, b{"b", 9000, 1, nullptr};
    EXPECT_THROW(t.publish({a, b}), std::invalid_argument);
    b.udp_port = 9001;
    b.slot = 0;
    EXPECT_THROW(t.publish({a, b}), std::invalid_argument);
    b.slot = 1;
    t.publish({a, b});
    EXPECT_EQ(dp::if_table::lookup(t.current(), 9001)->name, "b");
}

TEST(memory_ranges, cover_every_mbuf_page_aligned) {
    rte_mempool* pool = rte_pktmbuf_pool_create("mr_test", 2047, 0, 0, 2176, 0);
    ASSERT_NE(pool, nullptr);
    auto ranges = dp::mempool_memory_ranges(pool);
    ASSERT_FALSE(ranges.empty());
    std::vector<rte_mbuf*> ms(64);
    ASSERT_EQ(rte_pktmbuf_alloc_bulk(pool, ms.data(), 64), 0);
    for (auto* m : ms) {
        auto* a = static_cast<uint8_t*>(m->buf_addr);
        bool inside = false;
        for (auto& r : ranges) {
            EXPECT_EQ(reinterpret_cast<uintptr_t>(r.address) % r.page_size, 0u);
            EXPECT_EQ(r.length % r.page_size, 0u);
            inside |= a >= r.address && a + m->buf_len <= static_cast<uint8_t*>(r.address) + r.length;
        }
        EXPECT_TRUE(inside);
    }
    rte_pktmbuf_free_bulk(ms.data(), 64);
    rte_mempool_free(pool);
}

TEST(crc32c, known_vectors_and_incremental) {
    const char* s = "123456789";
    EXPECT_EQ(reefline::crc32c(s, 9), 0xe3069283u);
    EXPECT_EQ(reefline::crc32c_extend(reefline::crc32c(s, 4), s + 4, 5), 0xe3069283u);
    std::vector<uint8_t> zeros(32, 0);
    EXPECT_EQ(reefline::crc32c(zeros.data(), 32), 0x8a9136aau);
}

}  // namespace
