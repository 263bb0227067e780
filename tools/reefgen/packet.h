// reefgen: the one place where Ethernet frames are built and parsed.
//
// Every reefline datagram's UDP payload is the 40-byte wire header followed by one fragment;
// the header encoding and the checks on response fragments are libreefline-client's
// (clients/c), the same code applications run: append_udp_payload() and
// parse_response_datagram() are its C++ face for the pcap writer, `check` and `send`.
// build_frame() wraps a datagram in Ethernet/IPv4/UDP with correct checksums; parse_frame()
// is the inverse that `check` applies to every captured frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "clients/c/reefline_client.h"
#include "clients/c/wire_header.h"
#include "clients/c/wire/protocol.h"
#include "tools/reefgen/common.h"
#include "tools/reefgen/payload.h"

namespace reefline::reefgen {

// The header in the client library's terms and back (the same fields, host order).
inline reefline_header to_client(const wire::fields& f) { return client::from_wire(f); }
inline wire::fields from_client(const reefline_header& h) { return client::to_wire(h); }

inline constexpr size_t eth_header_size = 14;
inline constexpr size_t ipv4_header_size = 20;  // we never emit IP options
inline constexpr size_t udp_header_size = 8;
inline constexpr size_t frame_overhead = eth_header_size + ipv4_header_size + udp_header_size;
// Offsets inside a frame that build_frame() made (no VLAN tag, no IP options).
inline constexpr size_t ipv4_offset = eth_header_size;
inline constexpr size_t udp_offset = ipv4_offset + ipv4_header_size;
inline constexpr size_t wire_offset = udp_offset + udp_header_size;

// Addresses of one direction of a flow; IPs and ports in host order.
struct frame_addresses {
    mac_address src_mac;
    mac_address dst_mac;
    uint32_t src_ip = 0;
    uint32_t dst_ip = 0;
    uint16_t src_port = 0;
    uint16_t dst_port = 0;
};

// Internet checksum of an IPv4 header (the checksum field is included as it stands, so
// store the result into a zeroed field, or verify by expecting 0).
uint16_t ipv4_header_checksum(const uint8_t* header, size_t length);

// UDP checksum over the pseudo-header (with `udp_length_field` as the length, which is what a
// receiver uses) and `length` bytes of datagram starting at the UDP header. The checksum field
// is included as it stands. Returns the value to store: 0 is sent as 0xffff (RFC 768).
uint16_t udp_checksum(uint32_t src_ip, uint32_t dst_ip, uint16_t udp_length_field,
                      const uint8_t* udp, size_t length);

// Appends wire header + fragment to `out`.
void append_udp_payload(std::vector<uint8_t>& out, const wire::fields& header,
                        std::span<const uint8_t> fragment);

// A complete Ethernet II / IPv4 (DF set, TTL 64) / UDP frame around `udp_payload`.
std::vector<uint8_t> build_frame(const frame_addresses& addresses, uint16_t ip_id,
                                 std::span<const uint8_t> udp_payload);

// One request as a camera sends it: the fragments plan_fragments() cuts `payload` into at
// `frag` payload bytes, each wrapped by build_frame() (all with IPv4 id `ip_id`).
std::vector<std::vector<uint8_t>> request_frames(const frame_addresses& addresses, const request_payload& payload,
                                                 uint64_t request_id, uint32_t frag, uint16_t ip_id = 1);

// An Ethernet ARP request (IPv4 over Ethernet, to the broadcast address) from `src_mac` /
// `src_ip` asking for `target_ip` (host order).
std::vector<uint8_t> build_arp_request(const mac_address& src_mac, uint32_t src_ip, uint32_t target_ip);

// Recomputes the IPv4 header checksum and the UDP checksum of a frame that build_frame()
// made, from whatever its header fields now say. Used after deliberately editing a field so
// that only the intended defect remains.
void refresh_checksums(std::vector<uint8_t>& frame);

enum class frame_error : uint8_t {
    none = 0,
    not_ipv4,       // not an IPv4 frame at all (ARP, IPv6, ...): ignored by check
    truncated,      // shorter than its headers claim
    bad_ip_header,  // IP version, header length or total length wrong
    bad_ip_checksum,
    ip_fragment,  // MF set or fragment offset non-zero: reefline never reassembles IP
    not_udp,
    bad_udp_length,    // UDP length != IP payload length
    bad_udp_checksum,  // non-zero and wrong
    short_payload,     // UDP payload shorter than the wire header
};
std::string_view to_string(frame_error e);

struct parsed_frame {
    frame_error error = frame_error::none;
    uint32_t src_ip = 0;  // host order
    uint32_t dst_ip = 0;
    uint16_t src_port = 0;
    uint16_t dst_port = 0;
    // Valid only when error == none: the wire header and the fragment after it. Views into
    // the frame passed to parse_frame().
    wire::header header{};
    std::span<const uint8_t> fragment;
};

// Parses Ethernet (optionally one 802.1Q tag) / IPv4 / UDP / wire header. Does not validate
// the wire header itself; callers apply validate_request() or their own response checks.
parsed_frame parse_frame(std::span<const uint8_t> frame);

// Per-packet checks on a response or error fragment, the counterpart of validate_request()
// (which only accepts requests): empty when acceptable, else the reason.
std::string_view response_header_problem(const wire::header& h, size_t fragment_length);

// A fragment of a response or error as the tools receive it: from a frame of a capture
// (`check`) or from a UDP datagram on a socket (`send`).
struct response_fragment {
    bool ignored = false;      // not ours to judge: not IPv4 (ARP, ...) or a request fragment
    std::string_view problem;  // why it is rejected; empty when it is a fragment to file
    uint32_t src_ip = 0, dst_ip = 0;  // host order; frames only
    uint16_t src_port = 0, dst_port = 0;
    wire::fields fields;
    std::span<const uint8_t> fragment;  // a view into the frame or datagram
    bool acceptable() const { return !ignored && problem.empty(); }
};
response_fragment parse_response_frame(std::span<const uint8_t> frame);
response_fragment parse_response_datagram(std::span<const uint8_t> datagram);

}  // namespace reefline::reefgen
