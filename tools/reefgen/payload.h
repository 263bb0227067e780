// reefgen: what requests carry (synthetic images, token sequences, files) and how a request
// is cut into fragments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dataplane/protocol.h"
#include "tools/reefgen/common.h"

namespace reefline::reefgen {

// One request's payload and the header fields that describe it.
struct request_payload {
    wire::format format = wire::format::raw;
    uint16_t dims[4] = {0, 0, 0, 0};
    std::vector<uint8_t> bytes;
};

// What the command line chose. Exactly one source applies: a file (image or raw) or a
// synthetic generator for `format`.
struct payload_options {
    wire::format format = wire::format::image_u8_hwc;
    image_shape shape;       // image and synthetic raw payloads (H*W*C bytes)
    uint32_t tokens = 0;     // tokens_i32: sequence length
    uint32_t vocab = 30522;  // tokens_i32: every token < vocab
    std::string image_file;  // binary PPM (P6) or PGM (P5); forces image_u8_hwc
    std::string raw_file;    // bytes as they are, in the chosen format
    uint64_t seed = 1;
};

// Builds payloads; deterministic in (options, request number). File sources are read once,
// at construction, so a missing file is reported before anything is written or sent.
class payload_source {
public:
    explicit payload_source(const payload_options& options);  // throws usage_error

    // The payload of the n-th request (0-based).
    request_payload make(uint64_t n) const;

    wire::format format() const { return _format; }
    uint32_t total_length() const { return _total_length; }

private:
    payload_options _options;
    wire::format _format;
    uint16_t _dims[4] = {0, 0, 0, 0};
    uint32_t _total_length = 0;
    std::optional<std::vector<uint8_t>> _file_bytes;  // set for --image and --raw
};

// Token ids are stored as little-endian i32: the payload is handed to the model as is, and
// both x86 hosts and GPUs are little-endian (header fields alone are network order).
void store_token(uint8_t* out, int32_t token);
int32_t load_token(const uint8_t* in);

// Reads a binary PPM (P6, C=3) or PGM (P5, C=1) with maxval <= 255.
request_payload read_netpbm(const std::string& path);  // throws usage_error

// Header fields of every fragment of a request, in index order: fragments of `frag_size`
// payload bytes, the last possibly shorter. Throws usage_error when the request cannot be
// expressed (empty, over max_total_length, more than max_fragments fragments).
std::vector<wire::fields> plan_fragments(const request_payload& payload, uint64_t request_id,
                                         uint32_t frag_size);

// Payload bytes of a fragment that plan_fragments() made with the same frag_size.
inline uint32_t fragment_length(const wire::fields& f, uint32_t frag_size) {
    const uint32_t rest = f.total_length - f.payload_offset;
    return rest < frag_size ? rest : frag_size;
}

// The largest --frag-size whose frame still fits a 65535-byte IPv4 datagram and pcap snaplen.
inline constexpr uint32_t max_frag_size = 65535 - 14 - 20 - 8 - wire::header_size;

}  // namespace reefline::reefgen
