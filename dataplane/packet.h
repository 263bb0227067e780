// Parsing of request frames: Ethernet (one optional VLAN tag) / IPv4 / UDP / reefline header.
// Pure functions over bytes, so unit tests and the socket benchmark use them without mbufs.
#pragma once

#include <cstdint>

#include "dataplane/counters.h"
#include "dataplane/protocol.h"

namespace reefline::dp {

// Where the request came from and how to answer it: the request's addresses, which a
// response swaps. Addresses and ports are kept in network byte order, as on the wire.
struct reply_address {
    uint8_t requester_mac[6];
    uint8_t local_mac[6];
    uint32_t requester_ip_be;
    uint32_t local_ip_be;
    uint16_t requester_port_be;
    uint16_t local_port_be;
    uint16_t vlan_tci_be;  // 0 when untagged
    uint16_t port_id;      // ethdev that received the request
};

// L2-L4 of a frame.
struct udp_view {
    const uint8_t* eth;        // frame start
    const uint8_t* payload;    // UDP payload (the reefline header)
    uint32_t payload_length;   // UDP length - 8
    uint32_t src_ip_be, dst_ip_be;
    uint16_t src_port, dst_port;  // host order
    uint16_t vlan_tci_be;
};

// Checksum state the NIC reported (from mbuf ol_flags); software checks what is unknown.
enum class cksum_state : uint8_t { unknown, good, bad };

// Parses Ethernet/IPv4/UDP. Returns drop_reason::none on success.
drop_reason parse_udp(const uint8_t* frame, uint32_t frame_length, cksum_state ip_cksum,
                      cksum_state l4_cksum, udp_view& out);

// Validates the reefline request header in a UDP payload.
struct fragment_view {
    const wire::header* header;
    const uint8_t* data;  // fragment payload (after the reefline header)
    uint32_t length;      // fragment payload length, >= 1
};
drop_reason parse_request(const udp_view& udp, fragment_view& out);

drop_reason to_drop_reason(wire::header_error e);

// True when the frame is an Ethernet ARP request (IPv4 over Ethernet) asking for `ip_be`.
bool is_arp_request_for(const uint8_t* frame, uint32_t frame_length, uint32_t ip_be);

}  // namespace reefline::dp
