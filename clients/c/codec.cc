// libreefline-client: the codec. Header encoding and fragment planning for requests, the
// per-fragment checks for what comes back, and validated decoding of results. The header
// layout, limits and request checks are clients/c/wire/protocol.h's, the same code the appliance
// runs, so a client and the data plane cannot drift apart.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "clients/c/internal.h"
#include "clients/c/wire/crc32c.h"

namespace reefline::client {
namespace {

thread_local std::string last_error;

// The result's extents when its header dims are 1..4 non-zero extents followed only by
// zeros (the rule for result_tensor_f32 and tensor_f32); 0 otherwise.
size_t leading_extents(const uint16_t dims[4], uint32_t out[4]) {
    size_t n = 0;
    for (; n < 4 && dims[n] != 0; ++n) out[n] = dims[n];
    for (size_t d = n; d < 4; ++d)
        if (dims[d] != 0) return 0;
    return n;
}

bool is_response(const reefline_result* r) { return r->kind == REEFLINE_KIND_RESPONSE; }

}  // namespace

// The payload against format and dims, whatever kind and status say (the decoders' check:
// tools show what a response with an odd status carried).
static int check_payload(const reefline_result* r) {
    if (r->payload_length && !r->payload) return fail(REEFLINE_E_INVALID_ARGUMENT, "result without its payload");
    switch (r->format) {
    case REEFLINE_FORMAT_RESULT_CRC32:
        if (r->payload_length != 8)
            return fail(REEFLINE_E_MALFORMED, "result_crc32 of %zu bytes, expected 8", r->payload_length);
        return REEFLINE_OK;
    case REEFLINE_FORMAT_RESULT_TOPK: {
        if (r->payload_length % 8 != 0)
            return fail(REEFLINE_E_MALFORMED, "result_topk of %zu bytes: not whole 8-byte entries", r->payload_length);
        const size_t k = r->payload_length / 8;
        if (r->dims[0] != k || r->dims[1] || r->dims[2] || r->dims[3])
            return fail(REEFLINE_E_MALFORMED, "result_topk of %zu entries with dims %u,%u,%u,%u (expected %zu,0,0,0)",
                        k, r->dims[0], r->dims[1], r->dims[2], r->dims[3], k);
        return REEFLINE_OK;
    }
    case REEFLINE_FORMAT_RESULT_TENSOR_F32: {
        uint32_t dims[4];
        const size_t n = leading_extents(r->dims, dims);
        if (n == 0)
            return fail(REEFLINE_E_MALFORMED,
                        "result_tensor_f32 with dims %u,%u,%u,%u: expected 1 to 4 non-zero extents, then zeros",
                        r->dims[0], r->dims[1], r->dims[2], r->dims[3]);
        uint64_t want = 4;
        for (size_t d = 0; d < n; ++d) want *= dims[d];
        if (r->payload_length != want)
            return fail(REEFLINE_E_MALFORMED, "result_tensor_f32 of %zu bytes, its dims need %llu (4 per f32)",
                        r->payload_length, static_cast<unsigned long long>(want));
        return REEFLINE_OK;
    }
    default: return REEFLINE_OK;
    }
}

int fail(int code, const char* format, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, format);
    std::vsnprintf(buf, sizeof buf, format, ap);
    va_end(ap);
    last_error = buf;
    return code;
}

}  // namespace reefline::client

using namespace reefline;
using reefline::client::fail;

extern "C" {

const char* reefline_client_version(void) { return "1.0.0"; }

const char* reefline_status_name(int status) {
    if (status < 0 || status > 255) return "unknown";
    // wire::to_string returns views of string literals: NUL-terminated.
    return wire::to_string(static_cast<wire::status>(status)).data();
}

const char* reefline_strerror(int error) {
    switch (error) {
    case REEFLINE_OK: return "success";
    case REEFLINE_E_INVALID_ARGUMENT: return "invalid argument";
    case REEFLINE_E_LIMIT: return "beyond the protocol's limits";
    case REEFLINE_E_NO_MEMORY: return "out of memory";
    case REEFLINE_E_SYSTEM: return "system call failed";
    case REEFLINE_E_TIMEOUT: return "timed out";
    case REEFLINE_E_MALFORMED: return "malformed result";
    case REEFLINE_E_WRONG_FORMAT: return "result is not of that format";
    case REEFLINE_E_NOT_FOUND: return "not an outstanding request";
    }
    return "unknown error";
}

const char* reefline_last_error(void) { return client::last_error.c_str(); }

void reefline_header_encode(const reefline_header* header, void* out) {
    wire::encode(client::to_wire(*header), out);
}

void reefline_header_decode(const void* in, reefline_header* out) {
    *out = client::from_wire(wire::decode(in));
}

uint64_t reefline_described_length(int format, const uint16_t dims[4]) {
    if (format < 0 || format > 255 || !wire::is_request_format(uint8_t(format))) return 0;
    return wire::described_length(uint8_t(format), dims);
}

// Element encodings byte by byte: correct on any host, whatever its endianness or alignment.
void reefline_encode_f32(const float* values, size_t count, void* out) {
    auto* p = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < count; ++i, p += 4) {
        uint32_t v;
        std::memcpy(&v, &values[i], 4);
        p[0] = uint8_t(v);
        p[1] = uint8_t(v >> 8);
        p[2] = uint8_t(v >> 16);
        p[3] = uint8_t(v >> 24);
    }
}

void reefline_encode_i32(const int32_t* values, size_t count, void* out) {
    auto* p = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < count; ++i, p += 4) {
        const uint32_t v = static_cast<uint32_t>(values[i]);
        p[0] = uint8_t(v);
        p[1] = uint8_t(v >> 8);
        p[2] = uint8_t(v >> 16);
        p[3] = uint8_t(v >> 24);
    }
}

void reefline_decode_f32(const void* in, size_t count, float* out) {
    const auto* p = static_cast<const uint8_t*>(in);
    for (size_t i = 0; i < count; ++i, p += 4) {
        const uint32_t v = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
        std::memcpy(&out[i], &v, 4);
    }
}

void reefline_decode_i32(const void* in, size_t count, int32_t* out) {
    const auto* p = static_cast<const uint8_t*>(in);
    for (size_t i = 0; i < count; ++i, p += 4)
        out[i] = static_cast<int32_t>(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                                      uint32_t(p[3]) << 24);
}

void reefline_decode_topk(const void* in, size_t count, reefline_topk_entry* out) {
    const auto* p = static_cast<const uint8_t*>(in);
    for (size_t i = 0; i < count; ++i, p += 8) {
        out[i].class_index = client::load_be32(p);
        const uint32_t bits = client::load_be32(p + 4);
        std::memcpy(&out[i].score, &bits, 4);
    }
}

uint32_t reefline_crc32c(const void* data, size_t length) { return crc32c(data, length); }

int reefline_fragment_count(uint64_t total_length, uint32_t fragment_size, uint32_t* count) {
    if (fragment_size == 0 || fragment_size > REEFLINE_MAX_FRAGMENT_SIZE)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "fragment size %u: must be 1..%u", fragment_size,
                    REEFLINE_MAX_FRAGMENT_SIZE);
    const uint64_t n = (total_length + fragment_size - 1) / fragment_size;
    if (count) *count = uint32_t(std::min<uint64_t>(n, UINT32_MAX));
    if (total_length == 0) return fail(REEFLINE_E_LIMIT, "empty payload");
    if (total_length > wire::max_total_length)
        return fail(REEFLINE_E_LIMIT, "payload of %llu bytes exceeds the protocol limit of %u",
                    static_cast<unsigned long long>(total_length), wire::max_total_length);
    if (n > wire::max_fragments)
        return fail(REEFLINE_E_LIMIT,
                    "fragment size %u cuts a %llu-byte payload into %llu fragments; the protocol "
                    "allows %u",
                    fragment_size, static_cast<unsigned long long>(total_length),
                    static_cast<unsigned long long>(n), wire::max_fragments);
    return REEFLINE_OK;
}

int reefline_request_fragment_header(int format, const uint16_t dims[4], uint64_t total_length,
                                     uint64_t request_id, uint32_t fragment_size, uint32_t index,
                                     reefline_header* out) {
    if (!out) return fail(REEFLINE_E_INVALID_ARGUMENT, "no header to write");
    if (format < 0 || format > 255 || !wire::is_request_format(uint8_t(format)))
        return fail(REEFLINE_E_INVALID_ARGUMENT, "format %d is not a request format", format);
    uint32_t count = 0;
    if (const int rc = reefline_fragment_count(total_length, fragment_size, &count); rc != REEFLINE_OK)
        return rc;
    if (index >= count)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "fragment %u of a request of %u fragments", index, count);
    reefline_header& h = *out;
    h = reefline_header{};
    h.kind = REEFLINE_KIND_REQUEST;
    h.format = uint8_t(format);
    h.status = 0;
    h.request_id = request_id;
    h.frag_index = uint16_t(index);
    h.frag_count = uint16_t(count);
    h.payload_offset = index * fragment_size;  // < total_length <= 8 MiB: no overflow
    h.total_length = uint32_t(total_length);
    if (dims) std::copy(dims, dims + 4, h.dims);
    return REEFLINE_OK;
}

uint32_t reefline_fragment_length(const reefline_header* header, uint32_t fragment_size) {
    if (header->payload_offset >= header->total_length) return 0;
    const uint32_t rest = header->total_length - header->payload_offset;
    return rest < fragment_size ? rest : fragment_size;
}

int reefline_encode_request_fragment(int format, const uint16_t dims[4], const void* payload,
                                     size_t length, uint64_t request_id, uint32_t fragment_size,
                                     uint32_t index, void* out, size_t capacity, size_t* written) {
    if (!payload || !out) return fail(REEFLINE_E_INVALID_ARGUMENT, "null payload or output buffer");
    reefline_header h;
    if (const int rc = reefline_request_fragment_header(format, dims, length, request_id, fragment_size,
                                                        index, &h);
        rc != REEFLINE_OK)
        return rc;
    const uint32_t n = reefline_fragment_length(&h, fragment_size);
    if (capacity < REEFLINE_HEADER_SIZE + n)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "output buffer of %zu bytes, the fragment needs %u", capacity,
                    REEFLINE_HEADER_SIZE + n);
    auto* o = static_cast<uint8_t*>(out);
    reefline_header_encode(&h, o);
    std::memcpy(o + REEFLINE_HEADER_SIZE, static_cast<const uint8_t*>(payload) + h.payload_offset, n);
    if (written) *written = REEFLINE_HEADER_SIZE + n;
    return REEFLINE_OK;
}

const char* reefline_fragment_verdict_name(int verdict) {
    switch (verdict) {
    case REEFLINE_FRAGMENT_OK: return "ok";
    case REEFLINE_FRAGMENT_REQUEST: return "request";
    case REEFLINE_FRAGMENT_SHORT: return "short_payload";
    case REEFLINE_FRAGMENT_BAD_HEADER: return "bad_header";
    case REEFLINE_FRAGMENT_BAD_KIND: return "bad_kind";
    case REEFLINE_FRAGMENT_TOO_MANY_FRAGMENTS: return "too_many_fragments";
    case REEFLINE_FRAGMENT_TOO_LARGE: return "too_large";
    case REEFLINE_FRAGMENT_OFFSET_OUT_OF_RANGE: return "offset_out_of_range";
    }
    return "unknown";
}

reefline_fragment_verdict reefline_check_response_header(const void* header40, size_t fragment_length) {
    wire::header h;
    std::memcpy(&h, header40, sizeof h);
    if (h.magic_be != htonl(wire::magic) || h.version != wire::version || h.reserved_be != 0)
        return REEFLINE_FRAGMENT_BAD_HEADER;
    if (h.kind != uint8_t(wire::kind::response) && h.kind != uint8_t(wire::kind::error))
        return REEFLINE_FRAGMENT_BAD_KIND;
    const wire::fields f = wire::decode(&h);
    if (f.frag_count == 0 || f.frag_count > wire::max_fragments || f.frag_index >= f.frag_count)
        return REEFLINE_FRAGMENT_TOO_MANY_FRAGMENTS;
    if (f.total_length > wire::max_total_length) return REEFLINE_FRAGMENT_TOO_LARGE;
    if (uint64_t(f.payload_offset) + fragment_length > f.total_length)
        return REEFLINE_FRAGMENT_OFFSET_OUT_OF_RANGE;
    return REEFLINE_FRAGMENT_OK;
}

reefline_fragment_verdict reefline_parse_response(const void* datagram, size_t length, reefline_header* header,
                                                  const uint8_t** fragment, size_t* fragment_length) {
    if (!datagram || length < wire::header_size) return REEFLINE_FRAGMENT_SHORT;
    wire::header h;
    std::memcpy(&h, datagram, sizeof h);
    // A capture of both directions holds requests too: they are not responses to judge.
    if (h.magic_be == htonl(wire::magic) && h.kind == uint8_t(wire::kind::request))
        return REEFLINE_FRAGMENT_REQUEST;
    const size_t n = length - wire::header_size;
    const reefline_fragment_verdict v = reefline_check_response_header(&h, n);
    if (v != REEFLINE_FRAGMENT_OK) return v;
    if (header) *header = client::from_wire(wire::decode(&h));
    if (fragment) *fragment = static_cast<const uint8_t*>(datagram) + wire::header_size;
    if (fragment_length) *fragment_length = n;
    return REEFLINE_FRAGMENT_OK;
}

int reefline_parse_request(const void* datagram, size_t length, reefline_header* header,
                           const uint8_t** fragment, size_t* fragment_length) {
    if (!datagram || length < wire::header_size) return 7;
    wire::header h;
    std::memcpy(&h, datagram, sizeof h);
    const size_t n = length - wire::header_size;
    // A UDP datagram is below 64 KiB: the length fits the field validate_request takes.
    const wire::header_error e = wire::validate_request(h, uint32_t(std::min<size_t>(n, UINT32_MAX)));
    if (e != wire::header_error::none) return int(e);
    if (header) *header = client::from_wire(wire::decode(&h));
    if (fragment) *fragment = static_cast<const uint8_t*>(datagram) + wire::header_size;
    if (fragment_length) *fragment_length = n;
    return 0;
}

void reefline_result_clear(reefline_result* result) {
    if (!result) return;
    std::free(result->owner);
    *result = reefline_result{};
}

int reefline_result_validate(const reefline_result* r) {
    if (!r) return fail(REEFLINE_E_INVALID_ARGUMENT, "no result");
    if (r->payload_length && !r->payload) return fail(REEFLINE_E_INVALID_ARGUMENT, "result without its payload");
    if (r->kind == REEFLINE_KIND_ERROR) {
        if (r->status == REEFLINE_STATUS_OK) return fail(REEFLINE_E_MALFORMED, "an error answer with status ok");
        return REEFLINE_OK;
    }
    if (r->kind != REEFLINE_KIND_RESPONSE) return fail(REEFLINE_E_MALFORMED, "kind %u is not an answer", r->kind);
    if (r->status != REEFLINE_STATUS_OK)
        return fail(REEFLINE_E_MALFORMED, "a response with status %s (errors have kind 3)",
                    reefline_status_name(r->status));
    return reefline::client::check_payload(r);
}

// The decoders check kind and format first (a request for the wrong view is the caller's
// mistake), then the bytes (a broken answer is the sender's).
int reefline_result_topk(const reefline_result* r, reefline_topk_entry* out, size_t capacity, size_t* count) {
    if (!r || (capacity && !out)) return fail(REEFLINE_E_INVALID_ARGUMENT, "null result or output");
    if (!client::is_response(r) || r->format != REEFLINE_FORMAT_RESULT_TOPK)
        return fail(REEFLINE_E_WRONG_FORMAT, "kind %u format %u is not a result_topk response", r->kind, r->format);
    if (const int rc = client::check_payload(r); rc != REEFLINE_OK) return rc;
    const size_t k = r->payload_length / 8;
    reefline_decode_topk(r->payload, std::min(k, capacity), out);
    if (count) *count = k;
    return REEFLINE_OK;
}

int reefline_result_tensor_dims(const reefline_result* r, uint32_t dims[4], size_t* ndims) {
    if (!r) return fail(REEFLINE_E_INVALID_ARGUMENT, "no result");
    if (!client::is_response(r) || r->format != REEFLINE_FORMAT_RESULT_TENSOR_F32)
        return fail(REEFLINE_E_WRONG_FORMAT, "kind %u format %u is not a result_tensor_f32 response", r->kind,
                    r->format);
    uint32_t d[4] = {0, 0, 0, 0};
    const size_t n = client::leading_extents(r->dims, d);
    if (n == 0)
        return fail(REEFLINE_E_MALFORMED,
                    "result_tensor_f32 with dims %u,%u,%u,%u: expected 1 to 4 non-zero extents, then zeros",
                    r->dims[0], r->dims[1], r->dims[2], r->dims[3]);
    if (dims) std::copy(d, d + 4, dims);
    if (ndims) *ndims = n;
    return REEFLINE_OK;
}

int reefline_result_tensor(const reefline_result* r, float* out, size_t capacity, size_t* count,
                           uint32_t dims[4], size_t* ndims) {
    if (!r || (capacity && !out)) return fail(REEFLINE_E_INVALID_ARGUMENT, "null result or output");
    if (const int rc = reefline_result_tensor_dims(r, dims, ndims); rc != REEFLINE_OK) return rc;
    if (const int rc = client::check_payload(r); rc != REEFLINE_OK) return rc;
    const size_t n = r->payload_length / 4;
    reefline_decode_f32(r->payload, std::min(n, capacity), out);
    if (count) *count = n;
    return REEFLINE_OK;
}

int reefline_result_crc32(const reefline_result* r, uint32_t* length, uint32_t* crc) {
    if (!r) return fail(REEFLINE_E_INVALID_ARGUMENT, "no result");
    if (!client::is_response(r) || r->format != REEFLINE_FORMAT_RESULT_CRC32)
        return fail(REEFLINE_E_WRONG_FORMAT, "kind %u format %u is not a result_crc32 response", r->kind, r->format);
    if (const int rc = client::check_payload(r); rc != REEFLINE_OK) return rc;
    if (length) *length = client::load_be32(r->payload);
    if (crc) *crc = client::load_be32(r->payload + 4);
    return REEFLINE_OK;
}

int reefline_result_error_message(const reefline_result* r, char* out, size_t capacity) {
    if (!r || (capacity && !out)) return fail(REEFLINE_E_INVALID_ARGUMENT, "null result or output");
    if (r->kind != REEFLINE_KIND_ERROR)
        return fail(REEFLINE_E_WRONG_FORMAT, "kind %u is not an error answer", r->kind);
    const size_t n = r->payload ? r->payload_length : 0;
    if (capacity) {
        const size_t c = std::min(n, capacity - 1);
        if (c) std::memcpy(out, r->payload, c);
        out[c] = '\0';
    }
    return int(std::min<size_t>(n, INT32_MAX));
}

}  // extern "C"
