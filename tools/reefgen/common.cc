#include "tools/reefgen/common.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstdio>

namespace reefline::reefgen {

uint32_t parse_ipv4(std::string_view text, std::string_view what) {
    const std::string s(text);
    in_addr a{};
    if (inet_pton(AF_INET, s.c_str(), &a) != 1)
        throw usage_error(std::string(what) + ": not an IPv4 address: '" + s + "'");
    return ntohl(a.s_addr);
}

std::string format_ipv4(uint32_t ip) {
    char buf[INET_ADDRSTRLEN];
    in_addr a{};
    a.s_addr = htonl(ip);
    inet_ntop(AF_INET, &a, buf, sizeof buf);
    return buf;
}

mac_address parse_mac(std::string_view text, std::string_view what) {
    mac_address m;
    const auto fail = [&] {
        return usage_error(std::string(what) + ": not a MAC address (xx:xx:xx:xx:xx:xx): '" +
                           std::string(text) + "'");
    };
    size_t pos = 0;
    for (int i = 0; i < 6; ++i) {
        if (i > 0) {
            if (pos >= text.size() || (text[pos] != ':' && text[pos] != '-')) throw fail();
            ++pos;
        }
        if (pos + 2 > text.size()) throw fail();
        unsigned v = 0;
        const auto r = std::from_chars(text.data() + pos, text.data() + pos + 2, v, 16);
        if (r.ec != std::errc() || r.ptr != text.data() + pos + 2) throw fail();
        m.bytes[i] = static_cast<uint8_t>(v);
        pos += 2;
    }
    if (pos != text.size()) throw fail();
    return m;
}

image_shape parse_shape(std::string_view text) {
    uint32_t v[3];
    size_t pos = 0;
    for (int i = 0; i < 3; ++i) {
        if (i > 0) {
            if (pos >= text.size() || (text[pos] != 'x' && text[pos] != 'X'))
                throw usage_error("--shape: expected HxWxC, got '" + std::string(text) + "'");
            ++pos;
        }
        const auto r = std::from_chars(text.data() + pos, text.data() + text.size(), v[i]);
        if (r.ec != std::errc() || v[i] == 0 || v[i] > 65535)
            throw usage_error("--shape: expected HxWxC with extents 1..65535, got '" +
                              std::string(text) + "'");
        pos = r.ptr - text.data();
    }
    if (pos != text.size())
        throw usage_error("--shape: expected HxWxC, got '" + std::string(text) + "'");
    return image_shape{uint16_t(v[0]), uint16_t(v[1]), uint16_t(v[2])};
}

}  // namespace reefline::reefgen
