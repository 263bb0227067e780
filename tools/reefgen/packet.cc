#include "tools/reefgen/packet.h"

#include <arpa/inet.h>

#include <cstring>

namespace reefline::reefgen {
namespace {

constexpr uint16_t ethertype_ipv4 = 0x0800;
constexpr uint16_t ethertype_vlan = 0x8100;
constexpr uint8_t ip_proto_udp = 17;

// One's-complement sum of big-endian 16-bit words; an odd trailing byte is padded with zero.
uint64_t sum_words(const uint8_t* p, size_t n, uint64_t acc) {
    for (size_t i = 0; i + 1 < n; i += 2) acc += load_be16(p + i);
    if (n & 1) acc += uint64_t(p[n - 1]) << 8;
    return acc;
}

uint16_t fold(uint64_t acc) {
    while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
    return static_cast<uint16_t>(acc);
}

}  // namespace

uint16_t ipv4_header_checksum(const uint8_t* header, size_t length) {
    return static_cast<uint16_t>(~fold(sum_words(header, length, 0)));
}

uint16_t udp_checksum(uint32_t src_ip, uint32_t dst_ip, uint16_t udp_length_field,
                      const uint8_t* udp, size_t length) {
    uint64_t acc = (src_ip >> 16) + (src_ip & 0xffff) + (dst_ip >> 16) + (dst_ip & 0xffff) +
                   ip_proto_udp + udp_length_field;
    const uint16_t c = static_cast<uint16_t>(~fold(sum_words(udp, length, acc)));
    return c == 0 ? 0xffff : c;
}

void append_udp_payload(std::vector<uint8_t>& out, const wire::fields& header,
                        std::span<const uint8_t> fragment) {
    const size_t at = out.size();
    out.resize(at + wire::header_size + fragment.size());
    const reefline_header h = to_client(header);
    reefline_header_encode(&h, out.data() + at);
    if (!fragment.empty())
        std::memcpy(out.data() + at + wire::header_size, fragment.data(), fragment.size());
}

std::vector<std::vector<uint8_t>> request_frames(const frame_addresses& addresses, const request_payload& payload,
                                                 uint64_t request_id, uint32_t frag, uint16_t ip_id) {
    std::vector<std::vector<uint8_t>> frames;
    std::vector<uint8_t> udp;
    for (const wire::fields& f : plan_fragments(payload, request_id, frag)) {
        udp.clear();
        append_udp_payload(udp, f, {payload.bytes.data() + f.payload_offset, fragment_length(f, frag)});
        frames.push_back(build_frame(addresses, ip_id, udp));
    }
    return frames;
}

std::vector<uint8_t> build_frame(const frame_addresses& a, uint16_t ip_id,
                                 std::span<const uint8_t> udp_payload) {
    std::vector<uint8_t> f(frame_overhead + udp_payload.size());
    uint8_t* eth = f.data();
    std::memcpy(eth, a.dst_mac.bytes, 6);
    std::memcpy(eth + 6, a.src_mac.bytes, 6);
    store_be16(eth + 12, ethertype_ipv4);

    uint8_t* ip = f.data() + ipv4_offset;
    ip[0] = 0x45;  // version 4, 5 words
    ip[1] = 0;     // DSCP/ECN
    store_be16(ip + 2,
               static_cast<uint16_t>(ipv4_header_size + udp_header_size + udp_payload.size()));
    store_be16(ip + 4, ip_id);
    store_be16(ip + 6, 0x4000);  // DF: these datagrams must never be IP-fragmented
    ip[8] = 64;
    ip[9] = ip_proto_udp;
    store_be32(ip + 12, a.src_ip);
    store_be32(ip + 16, a.dst_ip);

    uint8_t* udp = f.data() + udp_offset;
    store_be16(udp, a.src_port);
    store_be16(udp + 2, a.dst_port);
    store_be16(udp + 4, static_cast<uint16_t>(udp_header_size + udp_payload.size()));
    if (!udp_payload.empty())
        std::memcpy(udp + udp_header_size, udp_payload.data(), udp_payload.size());
    refresh_checksums(f);
    return f;
}

std::vector<uint8_t> build_arp_request(const mac_address& src_mac, uint32_t src_ip, uint32_t target_ip) {
    std::vector<uint8_t> f(eth_header_size + 28, 0);
    std::memset(f.data(), 0xff, 6);
    std::memcpy(f.data() + 6, src_mac.bytes, 6);
    store_be16(f.data() + 12, 0x0806);
    uint8_t* arp = f.data() + eth_header_size;
    store_be16(arp, 1);  // Ethernet
    store_be16(arp + 2, ethertype_ipv4);
    arp[4] = 6;
    arp[5] = 4;
    store_be16(arp + 6, 1);  // request
    std::memcpy(arp + 8, src_mac.bytes, 6);
    store_be32(arp + 14, src_ip);
    store_be32(arp + 24, target_ip);  // target hardware address left zero
    return f;
}

void refresh_checksums(std::vector<uint8_t>& frame) {
    uint8_t* ip = frame.data() + ipv4_offset;
    store_be16(ip + 10, 0);
    store_be16(ip + 10, ipv4_header_checksum(ip, ipv4_header_size));
    // The checksum covers the bytes actually present (from the IP total length), with the
    // pseudo-header's length taken from the UDP length field as a receiver would.
    uint8_t* udp = frame.data() + udp_offset;
    const size_t datagram = load_be16(ip + 2) - ipv4_header_size;
    store_be16(udp + 6, 0);
    store_be16(udp + 6, udp_checksum(load_be32(ip + 12), load_be32(ip + 16), load_be16(udp + 4),
                                     udp, datagram));
}

std::string_view to_string(frame_error e) {
    switch (e) {
    case frame_error::none: return "none";
    case frame_error::not_ipv4: return "not_ipv4";
    case frame_error::truncated: return "truncated";
    case frame_error::bad_ip_header: return "bad_ip_header";
    case frame_error::bad_ip_checksum: return "bad_ip_checksum";
    case frame_error::ip_fragment: return "ip_fragment";
    case frame_error::not_udp: return "not_udp";
    case frame_error::bad_udp_length: return "bad_udp_length";
    case frame_error::bad_udp_checksum: return "bad_udp_checksum";
    case frame_error::short_payload: return "short_payload";
    }
    return "unknown";
}

parsed_frame parse_frame(std::span<const uint8_t> frame) {
    parsed_frame out;
    const uint8_t* p = frame.data();
    size_t n = frame.size();
    if (n < eth_header_size) {
        out.error = frame_error::not_ipv4;
        return out;
    }
    size_t l3 = eth_header_size;
    uint16_t ethertype = load_be16(p + 12);
    if (ethertype == ethertype_vlan) {
        if (n < eth_header_size + 4) {
            out.error = frame_error::not_ipv4;
            return out;
        }
        ethertype = load_be16(p + 16);
        l3 += 4;
    }
    if (ethertype != ethertype_ipv4) {
        out.error = frame_error::not_ipv4;
        return out;
    }
    const uint8_t* ip = p + l3;
    const size_t ip_avail = n - l3;
    if (ip_avail < ipv4_header_size) {
        out.error = frame_error::truncated;
        return out;
    }
    const size_t ihl = size_t(ip[0] & 0x0f) * 4;
    const size_t ip_total = load_be16(ip + 2);
    if ((ip[0] >> 4) != 4 || ihl < ipv4_header_size || ip_total < ihl) {
        out.error = frame_error::bad_ip_header;
        return out;
    }
    // Frames may carry Ethernet padding after the IP datagram, never less than it claims.
    if (ip_total > ip_avail || ihl > ip_avail) {
        out.error = frame_error::truncated;
        return out;
    }
    if (ipv4_header_checksum(ip, ihl) != 0) {
        out.error = frame_error::bad_ip_checksum;
        return out;
    }
    if ((load_be16(ip + 6) & 0x3fff) != 0) {  // MF flag or a fragment offset
        out.error = frame_error::ip_fragment;
        return out;
    }
    if (ip[9] != ip_proto_udp) {
        out.error = frame_error::not_udp;
        return out;
    }
    out.src_ip = load_be32(ip + 12);
    out.dst_ip = load_be32(ip + 16);
    const uint8_t* udp = ip + ihl;
    const size_t udp_avail = ip_total - ihl;
    if (udp_avail < udp_header_size) {
        out.error = frame_error::truncated;
        return out;
    }
    out.src_port = load_be16(udp);
    out.dst_port = load_be16(udp + 2);
    const uint16_t udp_len = load_be16(udp + 4);
    if (udp_len != udp_avail) {
        out.error = frame_error::bad_udp_length;
        return out;
    }
    const uint16_t stored = load_be16(udp + 6);
    // 0 means "no checksum" for UDP over IPv4; anything else must verify.
    if (stored != 0) {
        uint64_t acc = (out.src_ip >> 16) + (out.src_ip & 0xffff) + (out.dst_ip >> 16) +
                       (out.dst_ip & 0xffff) + ip_proto_udp + udp_len;
        if (fold(sum_words(udp, udp_len, acc)) != 0xffff) {
            out.error = frame_error::bad_udp_checksum;
            return out;
        }
    }
    const size_t payload = udp_len - udp_header_size;
    if (payload < wire::header_size) {
        out.error = frame_error::short_payload;
        return out;
    }
    std::memcpy(&out.header, udp + udp_header_size, wire::header_size);
    out.fragment = std::span<const uint8_t>(udp + udp_header_size + wire::header_size,
                                            payload - wire::header_size);
    return out;
}

std::string_view response_header_problem(const wire::header& h, size_t fragment_length) {
    const reefline_fragment_verdict v = reefline_check_response_header(&h, fragment_length);
    return v == REEFLINE_FRAGMENT_OK ? std::string_view() : reefline_fragment_verdict_name(v);
}

namespace {

// The wire header and what follows it, checked as a response fragment by the client library.
void parse_response_payload(std::span<const uint8_t> datagram, response_fragment& out) {
    reefline_header h;
    const uint8_t* fragment = nullptr;
    size_t length = 0;
    const reefline_fragment_verdict v =
        reefline_parse_response(datagram.data(), datagram.size(), &h, &fragment, &length);
    if (v == REEFLINE_FRAGMENT_REQUEST) {
        out.ignored = true;  // a capture of both directions: requests are not ours to judge
        return;
    }
    if (v != REEFLINE_FRAGMENT_OK) {
        out.problem = reefline_fragment_verdict_name(v);
        return;
    }
    out.fields = from_client(h);
    out.fragment = std::span<const uint8_t>(fragment, length);
}

}  // namespace

response_fragment parse_response_frame(std::span<const uint8_t> frame) {
    response_fragment out;
    const parsed_frame pf = parse_frame(frame);
    if (pf.error == frame_error::not_ipv4) {
        out.ignored = true;
        return out;
    }
    if (pf.error != frame_error::none) {
        out.problem = to_string(pf.error);
        return out;
    }
    out.src_ip = pf.src_ip;
    out.dst_ip = pf.dst_ip;
    out.src_port = pf.src_port;
    out.dst_port = pf.dst_port;
    // parse_frame() guarantees the header precedes the fragment in the frame.
    parse_response_payload({pf.fragment.data() - wire::header_size, pf.fragment.size() + wire::header_size}, out);
    return out;
}

response_fragment parse_response_datagram(std::span<const uint8_t> datagram) {
    response_fragment out;
    parse_response_payload(datagram, out);
    return out;
}

}  // namespace reefline::reefgen
