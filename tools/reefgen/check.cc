#include "tools/reefgen/check.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string_view>
#include <unordered_map>

#include "clients/c/wire/crc32c.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"
#include "tools/reefgen/pcap_file.h"
#include "tools/reefgen/send.h"

namespace reefline::reefgen {
namespace {

std::string_view to_string(wire::header_error e) {
    switch (e) {
    case wire::header_error::none: return "none";
    case wire::header_error::bad_header: return "bad_header";
    case wire::header_error::zero_length: return "zero_length";
    case wire::header_error::too_large: return "too_large";
    case wire::header_error::too_many_fragments: return "too_many_fragments";
    case wire::header_error::offset_out_of_range: return "offset_out_of_range";
    case wire::header_error::dims_mismatch: return "dims_mismatch";
    }
    return "unknown";
}

std::string describe(const flow_key& k) {
    return format_ipv4(k.ip) + ":" + std::to_string(k.port) + " id=" + std::to_string(k.request_id);
}

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

// Prints at most `limit` lines of one kind, then how many more there were.
class limited_report {
public:
    limited_report(std::ostream& out, size_t limit) : _out(out), _limit(limit) {}
    void line(const std::string& text) {
        if (_count++ < _limit) _out << text << '\n';
    }
    void finish(std::string_view what) {
        if (_count > _limit) _out << "... and " << (_count - _limit) << " more " << what << '\n';
    }
    uint64_t count() const { return _count; }

private:
    std::ostream& _out;
    size_t _limit;
    uint64_t _count = 0;
};

// "64x8": the first n extents.
std::string dims_text(const uint16_t dims[4], size_t n) {
    std::string s;
    for (size_t d = 0; d < n; ++d) s += (d ? "x" : "") + std::to_string(dims[d]);
    return s;
}

}  // namespace

namespace {

// A message as the client library's result view (no copy) for its decoders.
reefline_result result_view(const assembled_message& m) {
    reefline_result r{};
    r.request_id = m.key.request_id;
    r.kind = m.head.kind;
    r.status = m.head.status;
    r.format = m.head.format;
    std::copy(std::begin(m.head.dims), std::end(m.head.dims), r.dims);
    r.payload = m.payload.data();
    r.payload_length = m.payload.size();
    return r;
}

}  // namespace

std::vector<uint32_t> tensor_result_dims(const uint16_t dims[4]) {
    reefline_result r{};
    r.kind = REEFLINE_KIND_RESPONSE;
    r.format = REEFLINE_FORMAT_RESULT_TENSOR_F32;
    std::copy(dims, dims + 4, r.dims);
    uint32_t d[4];
    size_t n = 0;
    if (reefline_result_tensor_dims(&r, d, &n) != REEFLINE_OK) return {};
    return std::vector<uint32_t>(d, d + n);
}

std::string describe_answer(const assembled_message& m) {
    char buf[64];
    const std::vector<uint8_t>& p = m.payload;
    const reefline_result r = result_view(m);
    if (m.head.kind == uint8_t(wire::kind::error))
        return "message='" + std::string(p.begin(), p.end()) + "'";
    if (m.head.format == uint8_t(wire::format::result_crc32)) {
        uint32_t crc = 0;
        if (reefline_result_crc32(&r, nullptr, &crc) != REEFLINE_OK) crc = 0;
        std::snprintf(buf, sizeof buf, "crc32c=%08x", crc);
        return buf;
    }
    if (m.head.format == uint8_t(wire::format::result_topk)) {
        // Whatever whole entries arrived, the first three: a line shows, it does not judge.
        reefline_topk_entry top[3];
        const size_t shown = std::min<size_t>(p.size() / 8, 3);
        reefline_decode_topk(p.data(), shown, top);
        std::string s = "top:";
        for (size_t j = 0; j < shown; ++j) {
            std::snprintf(buf, sizeof buf, "%s class %u (%.2f)", j ? "," : "", top[j].class_index,
                          double(top[j].score));
            s += buf;
        }
        return s + (p.size() > 24 ? ", ..." : "");
    }
    if (m.head.format == uint8_t(wire::format::result_tensor_f32)) {
        std::string s = "tensor " + dims_text(m.head.dims, std::max<size_t>(tensor_result_dims(m.head.dims).size(), 1)) + " [";
        constexpr size_t shown = 4;
        float values[shown];
        const size_t n = std::min(shown, p.size() / 4);
        reefline_decode_f32(p.data(), n, values);
        for (size_t i = 0; i < n; ++i) {
            std::snprintf(buf, sizeof buf, "%s%.4g", i ? ", " : "", double(values[i]));
            s += buf;
        }
        return s + (p.size() > shown * 4 ? ", ...]" : "]");
    }
    return "format " + std::to_string(m.head.format) + ", " + std::to_string(p.size()) + " bytes";
}

std::string response_problem(const assembled_message& m, uint32_t length, uint32_t crc,
                             bool require_crc32) {
    const auto st = static_cast<wire::status>(m.head.status);
    if (m.head.kind != uint8_t(wire::kind::response) || st != wire::status::ok) {
        std::string p =
            "kind=" + std::to_string(m.head.kind) + " status=" + std::string(wire::to_string(st));
        if (m.head.kind == uint8_t(wire::kind::error))
            p += " message='" + std::string(m.payload.begin(), m.payload.end()) + "'";
        return p;
    }
    if (!m.tiles) return "response fragments do not tile its payload";
    const reefline_result r = result_view(m);
    if (m.head.format == uint8_t(wire::format::result_tensor_f32)) {
        const std::vector<uint32_t> dims = tensor_result_dims(m.head.dims);
        if (dims.empty())
            return "result_tensor_f32 with dims " + dims_text(m.head.dims, 4) +
                   ": expected 1 to 4 non-zero extents, then zeros";
        if (reefline_result_tensor(&r, nullptr, 0, nullptr, nullptr, nullptr) != REEFLINE_OK) {
            uint64_t want = 4;
            for (uint32_t d : dims) want *= d;
            return "result_tensor_f32 of " + std::to_string(m.payload.size()) + " bytes, dims " +
                   dims_text(m.head.dims, dims.size()) + " need " + std::to_string(want) + " (4 per f32)";
        }
    }
    if (m.head.format != uint8_t(wire::format::result_crc32))
        return require_crc32
                   ? "format=" + std::to_string(m.head.format) + ", expected result_crc32 (16)"
                   : std::string();
    uint32_t got_length = 0, got_crc = 0;
    if (reefline_result_crc32(&r, &got_length, &got_crc) != REEFLINE_OK)
        return "result_crc32 of " + std::to_string(m.payload.size()) + " bytes, expected 8";
    if (got_length != length || got_crc != crc)
        return "length=" + std::to_string(got_length) + " crc=" + hex32(got_crc) +
               ", expected length=" + std::to_string(length) + " crc=" + hex32(crc);
    return {};
}

request_capture read_request_capture(const std::string& path,
                                     std::vector<assembled_message>* messages,
                                     size_t max_pending_bytes) {
    request_capture cap;
    std::unordered_map<flow_key, size_t, flow_key_hash> index;  // key -> cap.requests position
    message_assembler assembler(/*remember_completed=*/true,
                                assembler_limits{.max_pending_bytes = max_pending_bytes});
    assembled_message done;
    for_each_frame(path, "--requests", [&](std::span<const uint8_t> data, bool complete) {
        ++cap.frames;
        if (!complete) {
            ++cap.rejected["snapped"];
            return;
        }
        const parsed_frame pf = parse_frame(data);
        if (pf.error != frame_error::none) {
            ++cap.rejected[std::string(to_string(pf.error))];
            return;
        }
        const wire::header_error he =
            wire::validate_request(pf.header, static_cast<uint32_t>(pf.fragment.size()));
        if (he != wire::header_error::none) {
            ++cap.rejected[std::string(to_string(he))];
            return;
        }
        ++cap.good;
        const wire::fields f = wire::decode(&pf.header);
        const flow_key key{pf.src_ip, pf.src_port, f.request_id};
        auto [it, inserted] = index.try_emplace(key, cap.requests.size());
        if (inserted) {
            request_record r;
            r.key = key;
            r.dst_ip = pf.dst_ip;
            r.dst_port = pf.dst_port;
            r.head = f;
            cap.requests.push_back(r);
        }
        request_record& r = cap.requests[it->second];
        switch (assembler.add(key, f, pf.fragment, done)) {
        case message_assembler::outcome::accepted: ++r.received; break;
        case message_assembler::outcome::completed:
            ++r.received;
            r.complete = done.tiles;
            r.length = done.head.total_length;
            r.crc = crc32c(done.payload.data(), done.payload.size());
            if (done.tiles && messages) messages->push_back(std::move(done));
            break;
        case message_assembler::outcome::duplicate:
        case message_assembler::outcome::after_completion: ++cap.duplicates; break;
        case message_assembler::outcome::inconsistent: ++cap.inconsistent; break;
        case message_assembler::outcome::too_large: break;  // counted by evicted()
        }
    });
    cap.evicted = assembler.evicted();
    return cap;
}

check_result run_check(const check_options& o, std::ostream& out) {
    const request_capture cap = read_request_capture(o.requests, nullptr, o.max_pending_bytes);
    check_result res;
    res.requests = cap.requests.size();
    // An eviction loses what a message would have become: say so, and fail.
    const auto report_evicted = [&](uint64_t n, std::string_view what) {
        if (n)
            out << "evicted: " << n << " incomplete " << what << " dropped to stay within --max-pending-bytes="
                << o.max_pending_bytes << " (a hostile capture, or raise the bound)\n";
    };

    std::unordered_map<flow_key, size_t, flow_key_hash> by_key;
    for (size_t i = 0; i < cap.requests.size(); ++i) {
        by_key.emplace(cap.requests[i].key, i);
        if (cap.requests[i].complete) ++res.complete;
    }
    out << "requests: frames=" << cap.frames << " good=" << cap.good
        << " duplicate=" << cap.duplicates << " inconsistent=" << cap.inconsistent
        << " evicted=" << cap.evicted;
    uint64_t rejected = 0;
    for (const auto& [why, n] : cap.rejected) rejected += n;
    out << " rejected=" << rejected;
    for (const auto& [why, n] : cap.rejected) out << ' ' << why << '=' << n;
    out << '\n';
    report_evicted(cap.evicted, "requests");

    // Responses: reassemble by the requester's address (their destination) and request id.
    std::vector<uint32_t> answered(cap.requests.size(), 0);
    message_assembler assembler(/*remember_completed=*/false,
                                assembler_limits{.max_pending_bytes = o.max_pending_bytes});
    assembled_message msg;
    uint64_t frames = 0, ignored = 0, duplicate_responses = 0, errors_for_incomplete = 0;
    std::map<std::string, uint64_t> response_rejected;
    limited_report bad_lines(out, o.max_report);
    size_t shown = 0;
    std::vector<answer_record> answers;
    const uint64_t id_base = request_id_base(o.seed);
    std::ofstream results_out;
    if (!o.results_file.empty()) {
        results_out.open(o.results_file, std::ios::out | std::ios::trunc);
        if (!results_out) throw usage_error("--results: cannot create '" + o.results_file + "'");
    }

    const auto judge = [&](const assembled_message& m, uint32_t src_ip, uint16_t src_port) {
        const auto it = by_key.find(m.key);
        const std::string who = describe(m.key);
        if (it == by_key.end()) {
            ++res.responses;
            ++res.bad;
            bad_lines.line("bad: response for unknown request " + who);
            return;
        }
        const request_record& req = cap.requests[it->second];
        const bool again = answered[it->second]++ > 0;
        const auto st = static_cast<wire::status>(m.head.status);
        std::string problem;
        if (src_ip != req.dst_ip || src_port != req.dst_port) {
            problem = "comes from " + format_ipv4(src_ip) + ":" + std::to_string(src_port) +
                      ", request went to " + format_ipv4(req.dst_ip) + ":" +
                      std::to_string(req.dst_port);
        } else if (!req.complete) {
            // An IF may answer an unfinished request with an error (e.g. reassembly timeout);
            // claiming a result for it means it accepted a fragment the checks reject.
            if (m.head.kind == uint8_t(wire::kind::error) && st != wire::status::ok) {
                if (!again) {
                    ++res.responses;
                    ++errors_for_incomplete;
                }
                return;
            }
            problem = "answered, but the capture never completes this request";
        } else {
            problem = response_problem(m, req.length, req.crc, o.expect == expectation::crc32);
        }
        if (again) {
            // Replies to a retransmitted single-fragment request are legitimate; only count
            // them against the IF if they differ from what was expected.
            ++duplicate_responses;
            if (!problem.empty()) {
                ++res.bad;
                bad_lines.line("bad: duplicate response for " + who + ": " + problem);
            }
            return;
        }
        ++res.responses;
        if (!o.results_file.empty()) {
            answer_record a;
            a.request = a.payload = m.key.request_id - id_base;
            a.kind = m.head.kind;
            a.status = m.head.status;
            a.format = m.head.format;
            std::copy(std::begin(m.head.dims), std::end(m.head.dims), a.dims);
            a.payload_bytes = m.payload;
            answers.push_back(std::move(a));
        }
        if (problem.empty()) {
            ++res.ok;
            if (shown++ < o.show)
                out << who << ": " << req.length << " B -> " << wire::to_string(st) << ' ' << describe_answer(m)
                    << (m.head.format == uint8_t(wire::format::result_crc32) ? "  [matches]" : "") << '\n';
        } else {
            ++res.bad;
            bad_lines.line("bad: response for " + who + ": " + problem);
        }
    };

    for_each_frame(o.responses, "--responses", [&](std::span<const uint8_t> data, bool complete) {
        ++frames;
        if (!complete) {
            ++response_rejected["snapped"];
            return;
        }
        const response_fragment rf = parse_response_frame(data);
        if (rf.ignored) {
            ++ignored;
            return;
        }
        if (!rf.problem.empty()) {
            ++response_rejected[std::string(rf.problem)];
            return;
        }
        const flow_key key{rf.dst_ip, rf.dst_port, rf.fields.request_id};
        const auto outcome = assembler.add(key, rf.fields, rf.fragment, msg);
        if (outcome == message_assembler::outcome::completed)
            judge(msg, rf.src_ip, rf.src_port);
        else if (outcome == message_assembler::outcome::inconsistent)
            ++response_rejected[std::string(to_string(outcome))];
    });

    uint64_t rejected_responses = 0;
    for (const auto& [why, n] : response_rejected) rejected_responses += n;
    const auto unfinished = assembler.pending();
    const uint64_t evicted_responses = assembler.evicted();
    out << "responses: frames=" << frames << " ignored=" << ignored
        << " incomplete=" << unfinished.size() << " evicted=" << evicted_responses
        << " duplicate=" << duplicate_responses
        << " errors_for_incomplete_requests=" << errors_for_incomplete
        << " rejected=" << rejected_responses;
    for (const auto& [why, n] : response_rejected) out << ' ' << why << '=' << n;
    out << '\n';
    report_evicted(evicted_responses, "responses");
    res.evicted = cap.evicted + evicted_responses;
    bad_lines.finish("bad responses");
    {
        limited_report lines(out, o.max_report);
        for (const auto& p : unfinished)
            lines.line("incomplete response for " + describe(p.key) + ": " +
                       std::to_string(p.received) + " of " + std::to_string(p.head.frag_count) +
                       " fragments");
        lines.finish("incomplete responses");
    }
    {
        limited_report lines(out, o.max_report);
        for (size_t i = 0; i < cap.requests.size(); ++i)
            if (cap.requests[i].complete && !answered[i])
                lines.line("missing: no response for complete request " +
                           describe(cap.requests[i].key));
        lines.finish("missing responses");
        res.missing = lines.count();
    }
    if (results_out.is_open()) {
        std::sort(answers.begin(), answers.end(),
                  [](const answer_record& a, const answer_record& b) { return a.request < b.request; });
        write_results(results_out, answers);
        results_out.close();
        if (!results_out) throw std::runtime_error("--results: cannot write '" + o.results_file + "'");
        out << "results: " << answers.size() << " answers written to " << o.results_file << '\n';
    }
    out << "requests=" << res.requests << " complete=" << res.complete
        << " responses=" << res.responses << " ok=" << res.ok << " bad=" << res.bad << '\n';
    return res;
}

}  // namespace reefline::reefgen
