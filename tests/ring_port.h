// Test support shared by the in-process model IF and control-plane tests: a net_ring ethdev
// with its rx and tx rings, and camera frames (image requests cut into UDP fragments by
// reefgen's code) put straight on the rx ring.
#pragma once

#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ring.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dataplane/engine.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace reefline::testing {

struct ring_port {
    rte_ring* rx = nullptr;  // frames put here are received by the port
    rte_ring* tx = nullptr;  // frames the port transmits land here
    int port_id = -1;

    // A net_ring port named after `prefix` and a sequence number (names must be unique).
    explicit ring_port(const std::string& prefix) {
        static int seq = 0;
        const std::string n = prefix + std::to_string(seq++);
        rx = rte_ring_create((n + "rx").c_str(), 8192, 0, RING_F_SC_DEQ);
        tx = rte_ring_create((n + "tx").c_str(), 8192, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        port_id = rte_eth_from_rings((n + "ring").c_str(), &rx, 1, &tx, 1, 0);
    }
    ~ring_port() {
        rte_ring_free(rx);
        rte_ring_free(tx);
    }
    dp::dataplane_config config(uint32_t rx_mbufs = 8191, uint32_t tx_mbufs = 2047) const {
        dp::dataplane_config c;
        c.port.port_id = uint16_t(port_id);
        c.port.rx_mbufs = rx_mbufs;
        c.port.tx_mbufs = tx_mbufs;
        c.port.rx_descriptors = c.port.tx_descriptors = 512;
        return c;
    }
};

// The source address every test camera uses (198.18.0.1 -> 198.18.0.2).
inline constexpr uint32_t camera_ip = 0xc6120001;

// Puts an H x W x C u8 image request for UDP port `dport` on the port's rx ring, in fragments
// of 1024 payload bytes.
// One request (any format) as datagrams of `frag` payload bytes on the ring port's rx ring.
inline void enqueue_request(dp::dataplane& plane, rte_ring* rx, uint64_t id, uint16_t dport,
                            const reefgen::request_payload& payload, uint32_t frag = 1024) {
    reefgen::frame_addresses a;
    a.src_mac = {0x02, 0, 0, 0, 0, 0x01};
    a.dst_mac = {0x02, 0, 0, 0, 0, 0x02};
    a.src_ip = camera_ip;
    a.dst_ip = 0xc6120002;
    a.src_port = 40000;
    a.dst_port = dport;
    for (const auto& frame : reefgen::request_frames(a, payload, id, frag)) {
        rte_mbuf* m = rte_pktmbuf_alloc(plane.eth().rx_pool());
        ASSERT_NE(m, nullptr);
        std::memcpy(rte_pktmbuf_append(m, uint16_t(frame.size())), frame.data(), frame.size());
        ASSERT_EQ(rte_ring_enqueue(rx, m), 0);
    }
}

inline void enqueue_image(dp::dataplane& plane, rte_ring* rx, uint64_t id, uint16_t dport,
                          const std::vector<uint8_t>& img, uint16_t h, uint16_t w, uint16_t c) {
    reefgen::request_payload payload;
    payload.format = wire::format::image_u8_hwc;
    payload.dims[0] = h;
    payload.dims[1] = w;
    payload.dims[2] = c;
    payload.bytes = img;
    enqueue_request(plane, rx, id, dport, payload);
}

inline std::vector<std::vector<uint8_t>> random_images(size_t n, size_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<uint8_t>> images(n, std::vector<uint8_t>(bytes));
    for (auto& img : images)
        for (auto& v : img) v = uint8_t(rng());
    return images;
}

}  // namespace reefline::testing
