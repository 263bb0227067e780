// libFuzzer target for what reefgen reads back from the appliance: response frames of a
// capture (`reefgen check`: parse_response_frame) and response datagrams of a socket
// (`reefgen send`: parse_response_datagram), reassembled by message_assembler (send's bounds
// on the datagram side), judged by response_problem and written by write_results.
//
// Input: records [F][L_hi][L_lo][L bytes]; bit 0 of F: a UDP datagram (else an Ethernet
// frame); bit 1: judge with require_crc32. Checked (abort on violation): a completed message
// that tiles holds exactly total_length bytes; the bounded assembler never holds more than
// its limits; every results line is one JSON object whose fields say what was written and
// whose top-k scores read back as the same floats.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tests/fuzz/fuzz_check.h"
#include "tools/reefgen/check.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/reassembly.h"
#include "tools/reefgen/send.h"

namespace gen = reefline::reefgen;
namespace wire = reefline::wire;

namespace {

constexpr gen::assembler_limits datagram_limits{.max_pending = 8, .max_pending_bytes = 64 << 10};

void check_results_line(const gen::assembled_message& m) {
    gen::answer_record a;
    a.request = m.key.request_id;
    a.payload = m.key.request_id ^ 1;
    a.kind = m.head.kind;
    a.status = m.head.status;
    a.format = m.head.format;
    std::copy(m.head.dims, m.head.dims + 4, a.dims);
    a.payload_bytes = m.payload;
    std::ostringstream out;
    gen::write_results(out, {a});
    const std::string text = out.str();
    FUZZ_CHECK(!text.empty() && text.back() == '\n' && text.find('\n') == text.size() - 1, "not one line");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        FUZZ_CHECK(false, "results line is not JSON (%s): %s", e.what(), text.c_str());
    }
    FUZZ_CHECK(j.at("id").get<uint64_t>() == a.request && j.at("payload").get<uint64_t>() == a.payload, "ids");
    const bool error = a.kind == uint8_t(wire::kind::error);
    FUZZ_CHECK(j.at("kind").get<std::string>() == (error ? "error" : "response"), "kind");
    FUZZ_CHECK(j.at("status").get<int>() == a.status && j.at("format").get<int>() == a.format, "status/format");
    if (error) FUZZ_CHECK(j.at("message").is_string(), "message");
    if (!error && a.format == uint8_t(wire::format::result_topk)) {
        const auto& topk = j.at("topk");
        FUZZ_CHECK(topk.size() == m.payload.size() / 8, "%zu top-k entries for %zu bytes", topk.size(), m.payload.size());
        for (size_t i = 0; i < topk.size(); ++i) {
            const uint8_t* p = m.payload.data() + i * 8;
            const uint32_t bits = gen::load_be32(p + 4);
            float score;
            std::memcpy(&score, &bits, 4);
            FUZZ_CHECK(topk[i][0].get<uint32_t>() == gen::load_be32(p), "class");
            if (std::isfinite(score)) {
                const float back = topk[i][1].get<float>();
                FUZZ_CHECK(std::memcmp(&back, &score, 4) == 0 || (back == 0 && score == 0), "score %.9g read back as %.9g",
                      double(score), double(back));
            } else {
                FUZZ_CHECK(topk[i][1].is_null(), "non-finite score not null");
            }
        }
    }
    if (!error && a.format == uint8_t(wire::format::result_tensor_f32)) {
        // Every whole little-endian f32 of the payload, read back exactly (or null if not finite).
        const auto& data = j.at("tensor").at("data");
        FUZZ_CHECK(data.size() == m.payload.size() / 4, "%zu tensor values for %zu bytes", data.size(), m.payload.size());
        for (size_t i = 0; i < data.size(); ++i) {
            const float v = gen::load_f32(m.payload.data() + i * 4);
            if (std::isfinite(v)) {
                const float back = data[i].get<float>();
                FUZZ_CHECK(std::memcmp(&back, &v, 4) == 0 || (back == 0 && v == 0), "value %.9g read back as %.9g",
                           double(v), double(back));
            } else {
                FUZZ_CHECK(data[i].is_null(), "non-finite value not null");
            }
        }
    }
}

void judge(const gen::assembled_message& m, bool require_crc32) {
    if (m.tiles) FUZZ_CHECK(m.payload.size() == m.head.total_length, "tiles but %zu bytes of %u", m.payload.size(),
                       m.head.total_length);
    FUZZ_CHECK(m.payload.size() <= size_t(m.head.frag_count) * 65536, "payload larger than its fragments");
    const std::string problem = gen::response_problem(m, m.head.total_length, uint32_t(m.key.request_id), require_crc32);
    (void)problem;
    check_results_line(m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    gen::message_assembler frames(false);
    gen::message_assembler datagrams(false, datagram_limits);
    gen::assembled_message done;
    size_t at = 0;
    while (at + 3 <= size) {
        const uint8_t flags = data[at];
        const size_t len = std::min<size_t>(size_t(data[at + 1]) << 8 | data[at + 2], size - at - 3);
        const std::span<const uint8_t> bytes(data + at + 3, len);
        at += 3 + len;
        const bool is_datagram = flags & 1;
        const gen::response_fragment rf =
            is_datagram ? gen::parse_response_datagram(bytes) : gen::parse_response_frame(bytes);
        if (!rf.acceptable()) continue;
        FUZZ_CHECK(rf.fragment.data() >= bytes.data() && rf.fragment.data() + rf.fragment.size() <= bytes.data() + bytes.size(),
              "fragment outside its datagram");
        gen::message_assembler& assembler = is_datagram ? datagrams : frames;
        const gen::flow_key key{rf.dst_ip, rf.dst_port, rf.fields.request_id};
        if (assembler.add(key, rf.fields, rf.fragment, done) == gen::message_assembler::outcome::completed)
            judge(done, flags & 2);
        FUZZ_CHECK(datagrams.pending().size() <= datagram_limits.max_pending &&
                  datagrams.pending_bytes() <= datagram_limits.max_pending_bytes,
              "%zu pending messages, %zu bytes", datagrams.pending().size(), datagrams.pending_bytes());
    }
    return 0;
}
