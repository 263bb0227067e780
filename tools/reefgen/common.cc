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

token_range parse_token_range(std::string_view text) {
    const auto fail = [&] {
        return usage_error("--tokens: expected L or MIN-MAX with lengths 1..65535 and MIN <= MAX, got '" +
                           std::string(text) + "'");
    };
    const auto number = [&](std::string_view t) {
        uint32_t v = 0;
        const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || v == 0 || v > 65535) throw fail();
        return v;
    };
    const size_t dash = text.find('-');
    if (dash == std::string_view::npos) {
        const uint32_t n = number(text);
        return {n, n};
    }
    const token_range r{number(text.substr(0, dash)), number(text.substr(dash + 1))};
    if (r.min > r.max) throw fail();
    return r;
}

std::vector<uint16_t> parse_dims(std::string_view text) {
    std::vector<uint16_t> dims;
    size_t pos = 0;
    for (;;) {
        uint32_t v = 0;
        const auto r = std::from_chars(text.data() + pos, text.data() + text.size(), v);
        if (r.ec != std::errc() || v == 0 || v > 65535 || dims.size() == 4)
            throw usage_error("--dims: expected D1[,D2[,D3[,D4]]] with extents 1..65535, got '" +
                              std::string(text) + "'");
        dims.push_back(uint16_t(v));
        pos = size_t(r.ptr - text.data());
        if (pos == text.size()) return dims;
        if (text[pos] != ',')
            throw usage_error("--dims: expected D1[,D2[,D3[,D4]]], got '" + std::string(text) + "'");
        ++pos;
    }
}

}  // namespace reefline::reefgen
