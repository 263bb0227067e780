// reefgen: shared small pieces (errors, deterministic RNG, address and shape parsing, keys).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reefline::reefgen {

// A problem with the command line or an input file. main() maps it to exit status 2, so
// that scripts can tell "you called me wrong" from "the check failed" (status 1).
class usage_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// SplitMix64: turns a seed and a stream number into well-mixed 64-bit values. Used to derive
// independent generator states, so that e.g. enabling --dup does not change which fragments
// --drop removes.
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// xorshift64*: fast, deterministic across platforms (unlike std::uniform_*_distribution,
// whose output the standard leaves to the implementation).
class rng {
public:
    explicit rng(uint64_t seed, uint64_t stream = 0)
            : _state(splitmix64(seed ^ splitmix64(stream + 0x5eed))) {
        if (_state == 0) _state = 0x2545f4914f6cdd1dull;
    }
    uint64_t next() {
        _state ^= _state >> 12;
        _state ^= _state << 25;
        _state ^= _state >> 27;
        return _state * 0x2545f4914f6cdd1dull;
    }
    // Uniform in [0, bound) for bound > 0 (multiply-shift; bias is negligible for our sizes).
    uint64_t below(uint64_t bound) {
        return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
    }
    // Uniform in [0, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    bool chance(double p) { return p > 0 && uniform() < p; }

private:
    uint64_t _state;
};

// Which requests belong together: what a receiver keys its reassembly entries by. Addresses
// and ports are host order.
struct flow_key {
    uint32_t ip = 0;
    uint16_t port = 0;
    uint64_t request_id = 0;
    bool operator==(const flow_key&) const = default;
};

struct flow_key_hash {
    size_t operator()(const flow_key& k) const {
        return splitmix64(k.request_id ^ (uint64_t(k.ip) << 16) ^ k.port);
    }
};

// Big-endian loads and stores on byte buffers (frames and results are network order).
inline uint16_t load_be16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }
inline uint32_t load_be32(const uint8_t* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
inline void store_be16(uint8_t* p, uint16_t v) {
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}
inline void store_be32(uint8_t* p, uint32_t v) {
    p[0] = uint8_t(v >> 24);
    p[1] = uint8_t(v >> 16);
    p[2] = uint8_t(v >> 8);
    p[3] = uint8_t(v);
}

struct mac_address {
    uint8_t bytes[6] = {0, 0, 0, 0, 0, 0};
};

// Parsers for command-line values; they throw usage_error naming `what` on bad input.
uint32_t parse_ipv4(std::string_view text, std::string_view what);  // host order
mac_address parse_mac(std::string_view text, std::string_view what);
std::string format_ipv4(uint32_t ip);  // host order in, dotted quad out

// "HxWxC" image shape; every extent in 1..65535 (the header's dims are 16 bits).
struct image_shape {
    uint16_t height = 224;
    uint16_t width = 224;
    uint16_t channels = 3;
    uint64_t bytes() const { return uint64_t(height) * width * channels; }
};
image_shape parse_shape(std::string_view text);

// --tokens: "L" (every request L tokens) or "MIN-MAX" (each request's length drawn in
// [MIN, MAX]); lengths 1..65535 (tokens_i32 dims are 16 bits).
struct token_range {
    uint32_t min = 0;
    uint32_t max = 0;
};
token_range parse_token_range(std::string_view text);

// --dims: "D1[,D2[,D3[,D4]]]", the extents of a tensor_f32 request, each 1..65535.
std::vector<uint16_t> parse_dims(std::string_view text);

}  // namespace reefline::reefgen
