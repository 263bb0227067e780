#include "dataplane/packet.h"

#include <netinet/in.h>
#include <rte_byteorder.h>
#include <rte_arp.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_udp.h>

#include <cstring>

namespace reefline::dp {

namespace {
uint16_t load_be16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// 0.0.0.0, 224/4 (multicast) and 240/4 (class E, which holds 255.255.255.255), or the subnet's
// broadcast address (when known: 0 is never a unicast address anyway).
inline bool not_unicast(uint32_t ip_be, uint32_t subnet_broadcast_be) {
    return (rte_be_to_cpu_32(ip_be) - 1u >= 0xe0000000u - 1u) | (ip_be == subnet_broadcast_be);
}

// The group bit of an Ethernet address's first octet: multicast, and broadcast.
inline bool group_mac(const uint8_t* mac) { return mac[0] & 1; }

// The address rules of parse_udp (IPv4 addresses network order, port host order). A reply
// goes to the source and comes from the destination, so both must be unicast, at every layer.
// One branch on the common path: the checks are combined before it.
drop_reason address_problem(const uint8_t* eth_source, uint32_t src_ip_be, uint32_t dst_ip_be,
                            uint16_t src_port, uint32_t subnet_broadcast_be) {
    const bool bad_source = group_mac(eth_source) | not_unicast(src_ip_be, subnet_broadcast_be) |
                            (src_port == 0);
    const bool bad_destination = not_unicast(dst_ip_be, subnet_broadcast_be);
    if (__builtin_expect(bad_source | bad_destination, 0))
        return bad_source ? drop_reason::bad_source : drop_reason::bad_destination;
    return drop_reason::none;
}

}  // namespace

drop_reason parse_udp(const uint8_t* frame, uint32_t len, cksum_state ip_cksum,
                      cksum_state l4_cksum, udp_view& out, uint32_t subnet_broadcast_be) {
    if (len < RTE_ETHER_HDR_LEN) return drop_reason::truncated;
    uint32_t l2 = RTE_ETHER_HDR_LEN;
    uint16_t ethertype = load_be16(frame + 12);
    out.vlan_tci_be = 0;
    out.vlan_tagged = false;
    if (ethertype == RTE_BE16(RTE_ETHER_TYPE_VLAN)) {
        if (len < l2 + 4) return drop_reason::truncated;
        out.vlan_tci_be = load_be16(frame + 14);
        out.vlan_tagged = true;
        ethertype = load_be16(frame + 16);
        l2 += 4;
    }
    // A group source address is invalid on Ethernet whatever the frame carries (an ARP
    // request from one is not answered either).
    if (ethertype != RTE_BE16(RTE_ETHER_TYPE_IPV4))
        return group_mac(frame + 6) ? drop_reason::bad_source : drop_reason::not_ipv4;
    if (len < l2 + sizeof(rte_ipv4_hdr)) return drop_reason::truncated;

    const auto* ip = reinterpret_cast<const rte_ipv4_hdr*>(frame + l2);
    const uint32_t ihl = (ip->version_ihl & 0x0f) * 4u;
    if ((ip->version_ihl >> 4) != 4 || ihl < sizeof(rte_ipv4_hdr)) return drop_reason::bad_ip;
    if (len < l2 + ihl) return drop_reason::truncated;
    if (ip_cksum == cksum_state::bad) return drop_reason::bad_checksum;
    // The header checksum is 20 bytes of arithmetic; the payload checksum would read every
    // payload byte on the CPU, so UDP checksums are left to NICs that verify them (l4_cksum).
    if (ip_cksum == cksum_state::unknown && rte_raw_cksum(ip, ihl) != 0xffff)
        return drop_reason::bad_ip;
    const uint32_t ip_total = rte_be_to_cpu_16(ip->total_length);
    if (ip_total < ihl + sizeof(rte_udp_hdr)) return drop_reason::bad_length;
    if (l2 + ip_total > len) return drop_reason::truncated;
    if (ip->fragment_offset & RTE_BE16(RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK))
        return drop_reason::ip_fragment;
    if (ip->next_proto_id != IPPROTO_UDP) return drop_reason::not_udp;

    const auto* udp = reinterpret_cast<const rte_udp_hdr*>(frame + l2 + ihl);
    const uint32_t udp_len = rte_be_to_cpu_16(udp->dgram_len);
    if (udp_len != ip_total - ihl) return drop_reason::bad_length;
    if (l4_cksum == cksum_state::bad) return drop_reason::bad_checksum;
    if (const drop_reason a = address_problem(frame + 6, ip->src_addr, ip->dst_addr,
                                              rte_be_to_cpu_16(udp->src_port), subnet_broadcast_be);
        a != drop_reason::none)
        return a;

    out.eth = frame;
    out.payload = reinterpret_cast<const uint8_t*>(udp + 1);
    out.payload_length = udp_len - sizeof(rte_udp_hdr);
    out.src_ip_be = ip->src_addr;
    out.dst_ip_be = ip->dst_addr;
    out.src_port = rte_be_to_cpu_16(udp->src_port);
    out.dst_port = rte_be_to_cpu_16(udp->dst_port);
    return drop_reason::none;
}

bool is_arp_request_for(const uint8_t* frame, uint32_t len, uint32_t ip_be) {
    if (len < RTE_ETHER_HDR_LEN + sizeof(rte_arp_hdr) ||
        load_be16(frame + 12) != RTE_BE16(RTE_ETHER_TYPE_ARP))
        return false;
    rte_arp_hdr arp;
    std::memcpy(&arp, frame + RTE_ETHER_HDR_LEN, sizeof arp);
    return arp.arp_hardware == RTE_BE16(RTE_ARP_HRD_ETHER) &&
           arp.arp_protocol == RTE_BE16(RTE_ETHER_TYPE_IPV4) && arp.arp_hlen == 6 &&
           arp.arp_plen == 4 && arp.arp_opcode == RTE_BE16(RTE_ARP_OP_REQUEST) &&
           arp.arp_data.arp_tip == ip_be && !(arp.arp_data.arp_sha.addr_bytes[0] & 1);
}

drop_reason to_drop_reason(wire::header_error e) {
    switch (e) {
    case wire::header_error::none: return drop_reason::none;
    case wire::header_error::bad_header: return drop_reason::bad_header;
    case wire::header_error::zero_length: return drop_reason::zero_length;
    case wire::header_error::too_large: return drop_reason::too_large;
    case wire::header_error::too_many_fragments: return drop_reason::too_many_fragments;
    case wire::header_error::offset_out_of_range: return drop_reason::offset_out_of_range;
    case wire::header_error::dims_mismatch: return drop_reason::dims_mismatch;
    }
    return drop_reason::bad_header;
}

drop_reason parse_request(const udp_view& udp, fragment_view& out) {
    if (udp.payload_length < wire::header_size) return drop_reason::truncated;
    const auto* h = reinterpret_cast<const wire::header*>(udp.payload);
    const uint32_t frag_len = udp.payload_length - wire::header_size;
    const drop_reason r = to_drop_reason(wire::validate_request(*h, frag_len));
    if (r != drop_reason::none) return r;
    out.header = h;
    out.data = udp.payload + wire::header_size;
    out.length = frag_len;
    return drop_reason::none;
}

}  // namespace reefline::dp
