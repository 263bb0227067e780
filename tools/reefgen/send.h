// reefgen send: live traffic over a kernel UDP socket, open loop (uniform or Poisson
// arrivals) or closed loop (K outstanding), with response verification and latency
// percentiles.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tools/reefgen/payload.h"

namespace reefline::reefgen {

struct send_options {
    uint32_t dst_ip = 0;  // host order
    uint16_t dst_port = 9000;
    uint32_t bind_ip = 0;   // 0: any
    uint16_t src_port = 0;  // 0: ephemeral
    uint64_t requests = 1;
    double rate = 0;           // requests/s; 0: as fast as the loop allows
    bool poisson = false;      // exponential inter-arrival times instead of uniform spacing
    uint32_t closed_loop = 0;  // > 0: at most this many requests outstanding
    payload_options payload;
    uint32_t frag_size = 1024;
    uint32_t timeout_ms = 1000;  // wait after the last send; in closed loop also per request
    uint64_t seed = 1;
    uint32_t show = 0;  // print the first N requests' results, one line each
    // Non-empty: after the run, one JSON object per answered request, in request order (see
    // write_results); reefverify reads it to check model answers against libml.
    std::string results_file;
};

struct send_result {
    uint64_t sent = 0;
    uint64_t responses = 0;  // requests answered (reassembled response, first one counts)
    uint64_t ok = 0;
    uint64_t bad = 0;         // answers that are not a correct result (errors included)
    uint64_t errors = 0;      // of those, the appliance's own error replies (e.g. "overloaded")
    uint64_t lost = 0;        // sent - responses
    uint64_t duplicates = 0;  // further responses for an answered request
    uint64_t stray = 0;       // datagrams not from the destination or for no request of ours
    double p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0;
    double min_us = 0, mean_us = 0, max_us = 0;
    double elapsed_s = 0;  // first send to the end of the wait
    double loss() const { return sent ? double(lost) / double(sent) : 0; }
};

// One answered request as --results records it.
struct answer_record {
    uint64_t request = 0;  // request index, 0-based
    uint64_t payload = 0;  // the n passed to payload_source::make for this request
    uint8_t kind = 0;      // wire::kind::response or wire::kind::error
    uint8_t status = 0;
    uint8_t format = 0;
    uint16_t dims[4] = {0, 0, 0, 0};     // the answer's header dims (result_tensor_f32: its extents)
    std::vector<uint8_t> payload_bytes;  // the reassembled result or error message
    double latency_us = 0;
};

// Writes `records` as JSON lines: {"id":I,"payload":P,"kind":"response"|"error","status":S,
// "format":F,"topk":[[class,score],...] (result_topk only),"tensor":{"dims":[D1,..],
// "data":[v,...]} (result_tensor_f32 only: the non-zero header dims, and every little-endian
// f32 of the payload in order, a trailing partial value dropped),"message":"..." (errors
// only),"latency_us":X}. Scores and values are printed with 9 significant digits, so they read
// back as the same float; a non-finite one is written as null (JSON has no NaN).
void write_results(std::ostream& out, const std::vector<answer_record>& records);

// Runs the exchange; detail lines (configuration, first problems, latency summary) go to
// `log`. Throws usage_error on bad options, std::system_error on socket failures.
send_result run_send(const send_options& options, std::ostream& log);

// The line the tools print last: "sent=N responses=R ok=K bad=B lost=L p50_us=X ... errors=E"
// or, with json, the same keys as one JSON object. bad - errors answers were wrong or
// malformed; errors were well-formed refusals (a shed request, an IF that went away).
std::string format_send_result(const send_result& r, bool json);

}  // namespace reefline::reefgen
