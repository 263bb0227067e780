// reefline wire protocol v1 (docs/protocol.md is the normative text).
//
// One header, the protocol's only definition in code: the client library (clients/c) encodes and
// checks with it, the appliance's data plane parses with it, the tools (reefgen) and tests use it.
// It includes nothing of reefline and needs no DPDK.
//
// Every UDP datagram that reefline sends or accepts starts with a fixed 40-byte header in
// network byte order, followed by one fragment of the payload. A request's payload is cut
// into fragments that may arrive in any order; the receiver files them by fragment index
// and checks at completion that offsets tile [0, total_length) exactly.
#pragma once

#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace reefline::wire {

inline constexpr uint32_t magic = 0x52464c4e;  // "RFLN"
inline constexpr uint8_t version = 1;

// Limits. A request may have at most max_fragments fragments and at most
// max_total_length payload bytes; every fragment carries at least one byte.
inline constexpr uint32_t max_fragments = 1024;
inline constexpr uint32_t max_total_length = 8u << 20;  // 8 MiB
inline constexpr uint32_t header_size = 40;

enum class kind : uint8_t {
    request = 1,   // a fragment of a request (sensor -> reefline)
    response = 2,  // a fragment of a result (reefline -> sensor), status ok
    error = 3,     // a failed request: status != ok, payload is a UTF-8 message
};

enum class format : uint8_t {
    raw = 0,           // opaque bytes (the crc32 diagnostic IF accepts anything)
    image_u8_hwc = 1,  // dims = {H, W, C, 0}, total_length == H*W*C
    tensor_f32 = 2,    // dims = up to 4 extents (0 = unused), total_length == 4*prod
    tokens_i32 = 3,    // dims = {N, 0, 0, 0}, total_length == 4*N
    // tensor_f32 and tokens_i32 elements are little-endian (as the device reads them in place).
    // Result formats, only in responses:
    result_crc32 = 16,  // 8 bytes: be32 total_length, be32 CRC32C of the payload
    result_topk = 17,   // k x (be32 class, be32 f32 score bits), best first
    result_tensor_f32 = 18,  // dims = the output's extents for this request, total_length == 4*prod
};

enum class status : uint8_t {
    ok = 0,
    bad_request = 1,         // payload does not match what the IF accepts
    unsupported_format = 2,  // format not accepted by this IF
    overloaded = 3,          // shed under overload
    deadline_exceeded = 4,   // could no longer meet the IF's SLO
    internal_error = 5,
    shutting_down = 6,
};

// The header as it lies in the datagram. All multi-byte fields are big-endian; use
// the accessors below, never the raw fields.
struct [[gnu::packed]] header {
    uint32_t magic_be;
    uint8_t version;
    uint8_t kind;
    uint8_t format;
    uint8_t status;
    uint64_t request_id_be;
    uint16_t frag_index_be;
    uint16_t frag_count_be;
    uint32_t payload_offset_be;
    uint32_t total_length_be;
    uint16_t dims_be[4];
    uint32_t reserved_be;  // must be zero in v1
};
static_assert(sizeof(header) == header_size);

inline uint64_t hton64(uint64_t v) { return __builtin_bswap64(v); }
inline uint64_t ntoh64(uint64_t v) { return __builtin_bswap64(v); }

// Host-order view of a header.
struct fields {
    uint8_t kind = 0;
    uint8_t format = 0;
    uint8_t status = 0;
    uint64_t request_id = 0;
    uint16_t frag_index = 0;
    uint16_t frag_count = 0;
    uint32_t payload_offset = 0;
    uint32_t total_length = 0;
    uint16_t dims[4] = {0, 0, 0, 0};
};

inline void encode(const fields& f, void* out) {
    header h;
    h.magic_be = htonl(magic);
    h.version = version;
    h.kind = f.kind;
    h.format = f.format;
    h.status = f.status;
    h.request_id_be = hton64(f.request_id);
    h.frag_index_be = htons(f.frag_index);
    h.frag_count_be = htons(f.frag_count);
    h.payload_offset_be = htonl(f.payload_offset);
    h.total_length_be = htonl(f.total_length);
    for (int i = 0; i < 4; ++i) h.dims_be[i] = htons(f.dims[i]);
    h.reserved_be = 0;
    std::memcpy(out, &h, sizeof h);
}

inline fields decode(const void* in) {
    header h;
    std::memcpy(&h, in, sizeof h);
    fields f;
    f.kind = h.kind;
    f.format = h.format;
    f.status = h.status;
    f.request_id = ntoh64(h.request_id_be);
    f.frag_index = ntohs(h.frag_index_be);
    f.frag_count = ntohs(h.frag_count_be);
    f.payload_offset = ntohl(h.payload_offset_be);
    f.total_length = ntohl(h.total_length_be);
    for (int i = 0; i < 4; ++i) f.dims[i] = ntohs(h.dims_be[i]);
    return f;
}

// Why a header is unacceptable as a request fragment, checked without any reassembly
// state. `fragment_length` is the number of payload bytes after the header.
enum class header_error : uint8_t {
    none = 0,
    bad_header,            // magic, version, kind, format or reserved field wrong
    zero_length,           // total_length == 0 or an empty fragment
    too_large,             // total_length > max_total_length
    too_many_fragments,    // frag_count == 0, > max_fragments, or frag_index >= frag_count
    offset_out_of_range,   // payload_offset + fragment_length > total_length
    dims_mismatch,         // dims do not describe total_length for the format
};

inline bool is_request_format(uint8_t fmt) {
    return fmt <= static_cast<uint8_t>(format::tokens_i32);
}

// Payload size that `dims` describe for `fmt`, or 0 when dims are not used (raw).
inline uint64_t described_length(uint8_t fmt, const uint16_t dims[4]) {
    switch (static_cast<format>(fmt)) {
    case format::image_u8_hwc:
        return uint64_t(dims[0]) * dims[1] * dims[2];
    case format::tensor_f32: {
        uint64_t n = 4;
        bool any = false;
        for (int i = 0; i < 4; ++i)
            if (dims[i]) { n *= dims[i]; any = true; }
        return any ? n : 0;
    }
    case format::tokens_i32:
        return uint64_t(dims[0]) * 4;
    default:
        return 0;
    }
}

inline header_error validate_request(const header& h, uint32_t fragment_length) {
    if (h.magic_be != htonl(magic) || h.version != version ||
        h.kind != static_cast<uint8_t>(kind::request) || !is_request_format(h.format) ||
        h.reserved_be != 0 || h.status != 0)
        return header_error::bad_header;
    const uint32_t total = ntohl(h.total_length_be);
    const uint32_t offset = ntohl(h.payload_offset_be);
    const uint16_t count = ntohs(h.frag_count_be);
    const uint16_t index = ntohs(h.frag_index_be);
    if (total == 0 || fragment_length == 0) return header_error::zero_length;
    if (total > max_total_length) return header_error::too_large;
    if (count == 0 || count > max_fragments || index >= count)
        return header_error::too_many_fragments;
    if (uint64_t(offset) + fragment_length > total) return header_error::offset_out_of_range;
    if (h.format != static_cast<uint8_t>(format::raw)) {
        uint16_t dims[4];
        for (int i = 0; i < 4; ++i) dims[i] = ntohs(h.dims_be[i]);
        if (described_length(h.format, dims) != total) return header_error::dims_mismatch;
    }
    return header_error::none;
}

inline std::string_view to_string(status s) {
    switch (s) {
    case status::ok: return "ok";
    case status::bad_request: return "bad_request";
    case status::unsupported_format: return "unsupported_format";
    case status::overloaded: return "overloaded";
    case status::deadline_exceeded: return "deadline_exceeded";
    case status::internal_error: return "internal_error";
    case status::shutting_down: return "shutting_down";
    }
    return "unknown";
}

// Largest fragment payload that fits a standard 1500-byte MTU (IPv4 20 + UDP 8 + header).
inline constexpr uint32_t mtu_fragment_payload = 1500 - 20 - 8 - header_size;

}  // namespace reefline::wire
