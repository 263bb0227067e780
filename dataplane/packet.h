// Parsing of request frames: Ethernet (one optional VLAN tag) / IPv4 / UDP / reefline header.
// Pure functions over bytes, so unit tests and the socket benchmark use them without mbufs.
#pragma once

#include <cstdint>

#include "dataplane/counters.h"
#include "clients/c/wire/protocol.h"

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
    uint16_t vlan_tci_be;  // the request's 802.1Q TCI (0 when untagged)
    uint16_t port_id;      // ethdev that received the request
    bool vlan_tagged;      // the request carried a tag (a priority tag has TCI 0)
};

// L2-L4 of a frame.
struct udp_view {
    const uint8_t* eth;        // frame start
    const uint8_t* payload;    // UDP payload (the reefline header)
    uint32_t payload_length;   // UDP length - 8
    uint32_t src_ip_be, dst_ip_be;
    uint16_t src_port, dst_port;  // host order
    uint16_t vlan_tci_be;
    bool vlan_tagged;
};

// Checksum state the NIC reported (from mbuf ol_flags); software checks what is unknown.
enum class cksum_state : uint8_t { unknown, good, bad };

// Parses Ethernet/IPv4/UDP. Returns drop_reason::none on success. Frames that must not be
// answered (RFC 1122 3.2.1.3, 3.2.2, 4.1.3.6) are dropped here, so no reply can be reflected
// to a third party or multiplied: a multicast or broadcast Ethernet source, an IPv4 source of
// 0.0.0.0, 255.255.255.255, 224/4 or 240/4 (bad_source), UDP source port 0 (bad_source), an
// IPv4 destination of 0.0.0.0, 224/4 or 240/4 with 255.255.255.255 (bad_destination): the reply
// would come from it. `subnet_broadcast_be`, the
// directed broadcast address of the appliance's subnet when known (0: unknown), is refused as
// a source and as a destination too.
drop_reason parse_udp(const uint8_t* frame, uint32_t frame_length, cksum_state ip_cksum,
                      cksum_state l4_cksum, udp_view& out, uint32_t subnet_broadcast_be = 0);

// Validates the reefline request header in a UDP payload.
struct fragment_view {
    const wire::header* header;
    const uint8_t* data;  // fragment payload (after the reefline header)
    uint32_t length;      // fragment payload length, >= 1
};
drop_reason parse_request(const udp_view& udp, fragment_view& out);

drop_reason to_drop_reason(wire::header_error e);

// True when the frame is an Ethernet ARP request (IPv4 over Ethernet) asking for `ip_be`
// from a unicast sender hardware address (the reply goes there).
bool is_arp_request_for(const uint8_t* frame, uint32_t frame_length, uint32_t ip_be);

}  // namespace reefline::dp
