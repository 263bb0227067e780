// reefgen check: reads a requests pcap and a responses pcap and verifies that every request
// the capture completes got exactly the answer the IF must give.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "clients/c/wire/protocol.h"
#include "tools/reefgen/common.h"
#include "tools/reefgen/reassembly.h"

namespace reefline::reefgen {

// What the responses are expected to contain: the crc32 diagnostic IF's answer (verified
// here), or a model IF's (ok responses in any format, top-k or tensor, consistent in
// themselves; their results are checked against libml by reefverify from
// check_options::results_file).
enum class expectation : uint8_t { crc32, model };

// One request as the capture presents it to a receiver.
struct request_record {
    flow_key key;         // source address, source port, request id
    uint32_t dst_ip = 0;  // where it was sent: the response must come from there
    uint16_t dst_port = 0;
    wire::fields head;      // first good fragment
    uint32_t received = 0;  // distinct fragment indices present
    bool complete = false;  // every index present, offsets tile the payload
    uint32_t length = 0;    // total_length, when complete
    uint32_t crc = 0;       // CRC32C of the reassembled payload, when complete
};

struct request_capture {
    std::vector<request_record> requests;  // in order of first good fragment
    uint64_t frames = 0;
    uint64_t good = 0;                         // fragments that pass every per-packet check
    uint64_t duplicates = 0;                   // good fragments whose index was already present
    uint64_t inconsistent = 0;                 // good but disagreeing with the request's first
    uint64_t evicted = 0;  // incomplete requests dropped to stay within max_pending_bytes
    std::map<std::string, uint64_t> rejected;  // reason -> frames (frame and header checks)
};

// What reassembly may hold while checking a capture, by default (check --max-pending-bytes):
// every byte the assembler allocates, so that a hostile capture (one-byte fragments of
// distinct messages that each claim 1024 fragments, say) costs at most this much and is
// reported through its evictions, not silently accepted.
inline constexpr size_t default_check_pending_bytes = size_t(64) << 20;

// Parses every frame of `path` with the receiver's per-packet rules and reassembles within
// `max_pending_bytes` (0: no bound). When `messages` is given, the payloads of completed
// requests are appended to it (for tests).
request_capture read_request_capture(const std::string& path,
                                     std::vector<assembled_message>* messages = nullptr,
                                     size_t max_pending_bytes = default_check_pending_bytes);

// Why a reassembled response is not the right answer to a request whose payload had `length`
// bytes and CRC32C `crc`; empty when it is. A result_crc32 response is always verified; with
// require_crc32 false, an ok response in another format passes unverified (send's view: the
// IF may be a model), with it true that is a problem (check --expect crc32).
// A result_tensor_f32 (and a result_topk) response is checked for its own consistency: a
// tensor's payload must hold exactly 4 * product(dims) bytes, its dims 1..4 leading non-zero
// extents.
std::string response_problem(const assembled_message& response, uint32_t length, uint32_t crc,
                             bool require_crc32);

// The extents of a result_tensor_f32 answer: its leading non-zero dims, or empty when they
// are not 1..4 such extents followed only by zeros.
std::vector<uint32_t> tensor_result_dims(const uint16_t dims[4]);

// A short description of an answer for --show lines: "crc32c=0123abcd", "top: class 3 (0.91),
// class 1 (0.05)", "tensor 64x8 [0.12, -0.31, 0.5, 1.02, ...]" (the first values), or for an
// error "message='...'".
std::string describe_answer(const assembled_message& m);

struct check_options {
    std::string requests;
    std::string responses;
    expectation expect = expectation::crc32;
    size_t max_report = 5;  // detail lines per kind of problem
    size_t show = 0;        // print the first N verified responses, one line each
    // Write the first answer to every request as JSON lines (reefgen send --results' format,
    // for reefverify); the request ids map to payload indices through the capture's seed.
    std::string results_file;
    uint64_t seed = 1;
    // Memory for reassembling each capture (requests, then responses); beyond it the oldest
    // incomplete messages are evicted and the check fails. 0: no bound (trusted captures).
    size_t max_pending_bytes = default_check_pending_bytes;
};

struct check_result {
    uint64_t requests = 0;  // distinct requests seen, complete or not
    uint64_t complete = 0;
    uint64_t responses = 0;  // distinct responses reassembled
    uint64_t ok = 0;
    uint64_t bad = 0;
    uint64_t missing = 0;  // complete requests without a response
    // Incomplete requests and responses dropped to stay within max_pending_bytes: what they
    // would have become is unknown, so the check cannot pass.
    uint64_t evicted = 0;
    bool passed() const { return bad == 0 && missing == 0 && evicted == 0; }
};

// Writes detail lines and, last, "requests=N complete=C responses=R ok=K bad=B" to `out`.
// The "requests:" and "responses:" lines count evictions (evicted=N); any eviction adds an
// "evicted:" line and fails the check.
check_result run_check(const check_options& options, std::ostream& out);  // throws usage_error

}  // namespace reefline::reefgen
