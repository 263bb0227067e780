// reefgen: what requests carry (synthetic images, token sequences, files) and how a request
// is cut into fragments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "clients/c/reefline_client.h"
#include "clients/c/wire/protocol.h"
#include "tools/reefgen/common.h"

namespace reefline::reefgen {

// One request's payload and the header fields that describe it.
struct request_payload {
    wire::format format = wire::format::raw;
    uint16_t dims[4] = {0, 0, 0, 0};
    std::vector<uint8_t> bytes;
};

// The default --vocab: ids below 1000 are valid in every vocabulary of the zoo's models
// (1024) and of real tokenizers (BERT's 30522, GPT-2's 50257, ...), so default traffic is
// never refused for an out-of-vocabulary token.
inline constexpr uint32_t default_vocab = 1000;

// What the command line chose. Exactly one source applies: a file (image or raw) or a
// synthetic generator for `format`.
struct payload_options {
    wire::format format = wire::format::image_u8_hwc;
    image_shape shape;           // image and synthetic raw payloads (H*W*C bytes)
    uint32_t tokens = 0;         // tokens_i32: sequence length (the shortest, with tokens_max)
    uint32_t tokens_max = 0;     // tokens_i32: > tokens: each request's length in [tokens, tokens_max]
    uint32_t vocab = default_vocab;  // tokens_i32: every token < vocab
    std::vector<uint16_t> dims;  // tensor_f32: 1..4 extents
    std::string image_file;      // binary PPM (P6) or PGM (P5); forces image_u8_hwc
    std::string raw_file;        // bytes as they are, in the chosen format
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
    // The largest payload any request carries (requests of --tokens MIN-MAX vary in length),
    // so that a fragment plan checked for it holds for every request; and the smallest.
    uint32_t total_length() const { return _total_length; }
    uint32_t min_total_length() const { return _min_total_length; }
    // tokens_i32: the token count of the n-th request (the same for every n unless a range).
    uint32_t tokens_of(uint64_t n) const;

private:
    payload_options _options;
    wire::format _format;
    uint16_t _dims[4] = {0, 0, 0, 0};
    uint32_t _total_length = 0;
    uint32_t _min_total_length = 0;
    uint32_t _tokens_min = 0, _tokens_max = 0;
    std::optional<std::vector<uint8_t>> _file_bytes;  // set for --image and --raw
};

// Token ids are stored as little-endian i32: the payload is handed to the model as is, and
// both x86 hosts and GPUs are little-endian (header fields alone are network order). The
// element codecs are the client library's.
void store_token(uint8_t* out, int32_t token);
int32_t load_token(const uint8_t* in);
// tensor_f32 elements (and result_tensor_f32 values): little-endian IEEE-754 binary32.
void store_f32(uint8_t* out, float v);
float load_f32(const uint8_t* in);

// sin(x) from + and * alone (range reduction, then a polynomial): the same bits on every host,
// where libm's sin may differ in the last place between versions; reefverify rebuilds the
// synthetic tensors that reefgen sent, possibly on another machine.
double portable_sin(double x);

// Reads a binary PPM (P6, C=3) or PGM (P5, C=1) with maxval <= 255.
request_payload read_netpbm(const std::string& path);  // throws usage_error

// Header fields of every fragment of a request, in index order: fragments of `frag_size`
// payload bytes, the last possibly shorter (the client library's plan). Throws usage_error
// when the request cannot be expressed (empty, over max_total_length, more than
// max_fragments fragments).
std::vector<wire::fields> plan_fragments(const request_payload& payload, uint64_t request_id,
                                         uint32_t frag_size);

// Throws the usage_error plan_fragments() throws when a `total`-byte request cannot be cut
// into fragments of `frag_size` bytes; checked for payload_source::total_length() before any
// traffic is written, so a long request late in a run cannot fail it half-way.
void check_fragment_plan(uint64_t total, uint32_t frag_size);

// Payload bytes of a fragment that plan_fragments() made with the same frag_size.
uint32_t fragment_length(const wire::fields& f, uint32_t frag_size);

// The largest --frag-size whose frame still fits a 65535-byte IPv4 datagram and pcap snaplen.
inline constexpr uint32_t max_frag_size = 65535 - 14 - 20 - 8 - wire::header_size;

}  // namespace reefline::reefgen
