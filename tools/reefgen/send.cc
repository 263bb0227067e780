#include "tools/reefgen/send.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "clients/c/wire/crc32c.h"
#include "tools/reefgen/check.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/reassembly.h"

namespace reefline::reefgen {
namespace {

using clock_type = std::chrono::steady_clock;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               clock_type::now().time_since_epoch())
        .count();
}

[[noreturn]] void throw_errno(const std::string& what) {
    throw std::system_error(errno, std::generic_category(), what);
}

// Owns the socket descriptor so every exit path closes it.
class socket_fd {
public:
    socket_fd() : _fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
        if (_fd < 0) throw_errno("socket");
    }
    ~socket_fd() { ::close(_fd); }
    socket_fd(const socket_fd&) = delete;
    socket_fd& operator=(const socket_fd&) = delete;
    int get() const { return _fd; }

private:
    int _fd;
};

// Large buffers: a burst of fragments (or of responses while we are busy sending) must not
// overflow the default ~200 KiB. The FORCE variants need CAP_NET_ADMIN; fall back quietly.
void enlarge_buffers(int fd) {
    const int bytes = 8 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) != 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

// A request's datagrams, encoded once by the client library and reused: sending only patches
// the request id (bytes 8..15 of each header), so the pacing loop does no payload copies.
struct prepared_request {
    std::vector<uint8_t> datagrams;  // concatenated UDP payloads
    std::vector<size_t> offsets;     // start of each datagram in `datagrams`
    std::vector<size_t> lengths;
    uint32_t total_length = 0;
    uint32_t crc = 0;
};

// Distinct payloads cycled through: enough variety that a wrong-request answer is caught,
// few enough that building them does not dominate start-up for large N.
constexpr uint64_t payload_pool_size = 16;

prepared_request prepare(const request_payload& p, uint32_t frag_size) {
    prepared_request r;
    r.total_length = static_cast<uint32_t>(p.bytes.size());
    r.crc = crc32c(p.bytes.data(), p.bytes.size());
    check_fragment_plan(p.bytes.size(), frag_size);  // reefgen's messages for what cannot be sent
    uint32_t count = 0;
    reefline_fragment_count(p.bytes.size(), frag_size, &count);
    r.datagrams.resize(size_t(count) * wire::header_size + p.bytes.size());
    size_t at = 0;
    for (uint32_t i = 0; i < count; ++i) {
        size_t n = 0;
        if (reefline_encode_request_fragment(int(p.format), p.dims, p.bytes.data(), p.bytes.size(), 0, frag_size, i,
                                             r.datagrams.data() + at, r.datagrams.size() - at, &n) != REEFLINE_OK)
            throw usage_error(std::string("request: ") + reefline_last_error());
        r.offsets.push_back(at);
        r.lengths.push_back(n);
        at += n;
    }
    return r;
}

struct request_state {
    int64_t sent_ns = 0;
    int64_t done_ns = 0;
    bool answered = false;
    bool released = false;  // no longer counted as outstanding (answered or timed out)
    // Kept for --results only: the first answer's header fields and its payload.
    uint8_t kind = 0, status = 0, format = 0;
    uint16_t dims[4] = {0, 0, 0, 0};
    std::vector<uint8_t> answer;
};

// Everything the sender and the receiver thread share, under one mutex.
struct shared_state {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<request_state> requests;
    uint64_t sent = 0;
    uint64_t answered = 0;
    uint64_t outstanding = 0;
    uint64_t ok = 0, bad = 0, errors = 0, duplicates = 0, stray = 0;
    std::vector<std::string> problems;  // the first few, for the log
    std::vector<std::string> shown;     // per-request result lines (--show)
    std::string receive_error;
};

constexpr size_t max_problem_lines = 5;

// One line for --show: what was sent, what came back, and whether it checked out.
std::string describe_result(const assembled_message& msg, const prepared_request& sent,
                            const request_state& rs, const std::string& problem) {
    char head[160];
    std::snprintf(head, sizeof head, "request %llu: %u B in %zu fragments -> %s ",
                  static_cast<unsigned long long>(msg.head.request_id), sent.total_length,
                  sent.offsets.size(), std::string(wire::to_string(static_cast<wire::status>(msg.head.status))).c_str());
    char tail[48];
    std::snprintf(tail, sizeof tail, " in %.0f us", double(rs.done_ns - rs.sent_ns) / 1e3);
    // Only a crc32 answer is verified here; a model's answer is checked for its form alone.
    const bool verified = msg.head.format == uint8_t(wire::format::result_crc32) &&
                          msg.head.kind == uint8_t(wire::kind::response);
    return head + describe_answer(msg) + tail +
           (!problem.empty() ? "  [WRONG: " + problem + "]" : verified ? "  [matches]" : "");
}

// Receives and reassembles responses until `stop`, and judges each completed one.
void receive_loop(int fd, const send_options& o, uint64_t id_base,
                  const std::vector<prepared_request>& pool, shared_state& st,
                  const std::atomic<bool>& stop) {
    constexpr unsigned batch = 64;
    constexpr size_t buffer_size = 65536;
    std::vector<uint8_t> buffers(batch * buffer_size);
    std::vector<mmsghdr> msgs(batch);
    std::vector<iovec> iovs(batch);
    std::vector<sockaddr_in> from(batch);
    // Responses that never complete (lost fragments, stray traffic) must not grow memory
    // for as long as the run lasts.
    message_assembler assembler(/*remember_completed=*/false,
                                assembler_limits{.max_pending = 65536, .max_pending_bytes = size_t(256) << 20});
    assembled_message msg;

    const auto note = [&](std::string text) {  // caller holds the lock
        if (st.problems.size() < max_problem_lines) st.problems.push_back(std::move(text));
    };
    while (!stop.load(std::memory_order_relaxed)) {
        pollfd pfd{fd, POLLIN, 0};
        const int pr = ::poll(&pfd, 1, 20);
        if (pr < 0 && errno != EINTR) {
            std::lock_guard lock(st.mutex);
            st.receive_error = std::string("poll: ") + std::strerror(errno);
            return;
        }
        if (pr <= 0) continue;
        for (unsigned i = 0; i < batch; ++i) {
            iovs[i] = {buffers.data() + i * buffer_size, buffer_size};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &from[i];
            msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
        }
        const int n = ::recvmmsg(fd, msgs.data(), batch, MSG_DONTWAIT, nullptr);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            std::lock_guard lock(st.mutex);
            st.receive_error = std::string("recvmmsg: ") + std::strerror(errno);
            return;
        }
        const int64_t t = now_ns();
        std::lock_guard lock(st.mutex);
        for (int i = 0; i < n; ++i) {
            const uint8_t* data = buffers.data() + size_t(i) * buffer_size;
            const size_t len = msgs[i].msg_len;
            const bool from_dst = msgs[i].msg_hdr.msg_namelen >= sizeof(sockaddr_in) &&
                                  ntohl(from[i].sin_addr.s_addr) == o.dst_ip &&
                                  ntohs(from[i].sin_port) == o.dst_port;
            if (!from_dst || (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)) {
                ++st.stray;
                continue;
            }
            const response_fragment rf = parse_response_datagram({data, len});
            if (!rf.acceptable()) {
                ++st.stray;
                continue;
            }
            if (assembler.add(flow_key{0, 0, rf.fields.request_id}, rf.fields, rf.fragment, msg) !=
                message_assembler::outcome::completed)
                continue;
            const uint64_t idx = msg.head.request_id - id_base;
            if (msg.head.request_id < id_base || idx >= st.sent) {
                ++st.stray;  // e.g. a late answer to an earlier run on the same port
                continue;
            }
            request_state& rs = st.requests[idx];
            if (rs.answered) {
                ++st.duplicates;
                continue;
            }
            rs.answered = true;
            rs.done_ns = t;
            if (!o.results_file.empty()) {
                rs.kind = msg.head.kind;
                rs.status = msg.head.status;
                rs.format = msg.head.format;
                std::copy(std::begin(msg.head.dims), std::end(msg.head.dims), rs.dims);
                // A crc32 result is fully judged here; only top-k lists, tensors and error
                // messages are worth keeping for a later check.
                if (msg.head.kind == uint8_t(wire::kind::error) ||
                    msg.head.format == uint8_t(wire::format::result_topk) ||
                    msg.head.format == uint8_t(wire::format::result_tensor_f32))
                    rs.answer.assign(msg.payload.begin(), msg.payload.end());
            }
            ++st.answered;
            if (!rs.released) {
                rs.released = true;
                --st.outstanding;
            }
            const prepared_request& expect = pool[idx % pool.size()];
            const std::string problem =
                response_problem(msg, expect.total_length, expect.crc, false);
            if (problem.empty()) {
                ++st.ok;
            } else {
                ++st.bad;
                if (msg.head.kind == uint8_t(wire::kind::error)) ++st.errors;
                note("bad: request id=" + std::to_string(msg.head.request_id) + ": " + problem);
            }
            if (st.shown.size() < o.show) st.shown.push_back(describe_result(msg, expect, rs, problem));
        }
        st.changed.notify_all();
    }
}

// Sends all datagrams of one request, retrying what the kernel did not take.
void send_request(int fd, const sockaddr_in& dst, prepared_request& r, uint64_t request_id) {
    const uint64_t id_be = wire::hton64(request_id);
    for (size_t off : r.offsets)
        std::memcpy(r.datagrams.data() + off + offsetof(wire::header, request_id_be), &id_be, 8);
    constexpr size_t batch = 64;
    iovec iov[batch];
    mmsghdr msgs[batch];
    size_t next = 0;
    while (next < r.offsets.size()) {
        const size_t n = std::min(batch, r.offsets.size() - next);
        for (size_t i = 0; i < n; ++i) {
            iov[i] = {r.datagrams.data() + r.offsets[next + i], r.lengths[next + i]};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_name = const_cast<sockaddr_in*>(&dst);
            msgs[i].msg_hdr.msg_namelen = sizeof dst;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        const int sent = ::sendmmsg(fd, msgs, static_cast<unsigned>(n), 0);
        if (sent < 0) {
            // ENOBUFS: the device queue is full, back off briefly. ECONNREFUSED reports an
            // ICMP error caused by an earlier datagram (nobody listening yet), not this batch.
            // Either way retry the batch: a request nobody answers shows up as lost.
            if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) {
                std::this_thread::sleep_for(std::chrono::microseconds(50));
                continue;
            }
            if (errno == ECONNREFUSED) continue;
            throw_errno("sendmmsg");
        }
        next += static_cast<size_t>(sent);
    }
}

void wait_until_ns(int64_t target) {
    // Sleep most of the way (timer slack is ~50 us), then spin for precise spacing.
    const int64_t remaining = target - now_ns();
    if (remaining > 200'000)
        std::this_thread::sleep_for(std::chrono::nanoseconds(remaining - 100'000));
    while (now_ns() < target) {
    }
}

// Appends `text` as the body of a JSON string. Error messages come off the wire: bytes that
// are not valid UTF-8 become U+FFFD so that every JSON reader accepts the line.
void append_json_string(std::string& out, const std::vector<uint8_t>& text) {
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;
    while (i < text.size()) {
        const uint8_t c = text[i];
        if (c < 0x80) {
            if (c == '"' || c == '\\') {
                out += '\\';
                out += char(c);
            } else if (c < 0x20 || c == 0x7f) {
                out += "\\u00";
                out += hex[c >> 4];
                out += hex[c & 15];
            } else {
                out += char(c);
            }
            ++i;
            continue;
        }
        // Length of a well-formed sequence starting here (RFC 3629: no overlongs, no
        // surrogates, nothing above U+10FFFF), or 0.
        size_t n = 0;
        uint32_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
        if (c >= 0xc2 && c <= 0xdf) n = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            n = 3;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 4;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        }
        bool ok = n > 0 && i + n <= text.size() && text[i + 1] >= lo && text[i + 1] <= hi;
        for (size_t j = 2; ok && j < n; ++j) ok = text[i + j] >= 0x80 && text[i + j] <= 0xbf;
        if (ok) {
            out.append(reinterpret_cast<const char*>(text.data() + i), n);
            i += n;
        } else {
            out += "\\ufffd";
            ++i;
        }
    }
}

double percentile(const std::vector<double>& sorted, double p) {
    if (sorted.empty()) return 0;
    // Nearest rank: the smallest value with at least p of the samples at or below it.
    const size_t rank = static_cast<size_t>(std::ceil(p * double(sorted.size())));
    return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

}  // namespace

send_result run_send(const send_options& o, std::ostream& log) {
    if (o.requests == 0) throw usage_error("--requests: must be at least 1");
    if (o.dst_ip == 0) throw usage_error("--dst: required");
    if (o.dst_port == 0) throw usage_error("--dport: must be 1..65535");
    if (!(o.rate >= 0) || !std::isfinite(o.rate)) throw usage_error("--rate: must be >= 0");
    if (o.poisson && o.rate == 0) throw usage_error("--poisson: needs --rate");

    const payload_source source(o.payload);
    // Opened (and truncated) before anything is sent: a path that cannot be written fails
    // the run at once instead of after the traffic it was meant to record.
    std::ofstream results;
    if (!o.results_file.empty()) {
        results.open(o.results_file, std::ios::out | std::ios::trunc);
        if (!results)
            throw usage_error("--results: cannot create '" + o.results_file +
                              "': " + std::strerror(errno));
    }
    check_fragment_plan(source.total_length(), o.frag_size);
    std::vector<prepared_request> pool;
    for (uint64_t i = 0; i < std::min(o.requests, payload_pool_size); ++i)
        pool.push_back(prepare(source.make(i), o.frag_size));

    socket_fd sock;
    enlarge_buffers(sock.get());
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = htonl(o.bind_ip);
    local.sin_port = htons(o.src_port);
    if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&local), sizeof local) != 0)
        throw_errno("bind " + format_ipv4(o.bind_ip) + ":" + std::to_string(o.src_port));
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_addr.s_addr = htonl(o.dst_ip);
    dst.sin_port = htons(o.dst_port);

    // Ids are unique per source address and port across runs: a time-derived base keeps a
    // fresh run on a fixed --sport from matching entries an earlier run left in reefline.
    const uint64_t id_base =
        ((splitmix64(uint64_t(now_ns()) ^ splitmix64(o.seed)) >> 24) << 16) + 1;

    log << "send: " << format_ipv4(o.dst_ip) << ':' << o.dst_port << " requests=" << o.requests
        << " bytes/request="
        << (source.min_total_length() == source.total_length()
                ? std::to_string(source.total_length())
                : std::to_string(source.min_total_length()) + ".." + std::to_string(source.total_length()))
        << " fragments/request=" << pool[0].offsets.size() << " mode="
        << (o.closed_loop ? "closed-loop(" + std::to_string(o.closed_loop) + ")"
                          : std::string("open-loop"))
        << " rate=";
    if (o.rate > 0)
        log << o.rate << "/s " << (o.poisson ? "poisson" : "uniform");
    else
        log << "max";
    log << '\n';

    shared_state st;
    st.requests.resize(o.requests);
    std::atomic<bool> stop{false};
    std::thread receiver(receive_loop, sock.get(), std::cref(o), id_base, std::cref(pool),
                         std::ref(st), std::cref(stop));
    // Stop and join the receiver on every exit path, exceptions included.
    struct joiner {
        std::atomic<bool>& stop;
        std::thread& t;
        ~joiner() {
            stop = true;
            if (t.joinable()) t.join();
        }
    } join_receiver{stop, receiver};

    const int64_t timeout_ns = int64_t(o.timeout_ms) * 1'000'000;
    rng arrivals(o.seed, 0xa221);
    std::deque<uint64_t> in_flight;  // closed loop: sent, not yet released, oldest first
    const int64_t start = now_ns();
    int64_t next_at = start;
    for (uint64_t i = 0; i < o.requests; ++i) {
        if (o.closed_loop) {
            std::unique_lock lock(st.mutex);
            while (st.outstanding >= o.closed_loop) {
                while (!in_flight.empty() && st.requests[in_flight.front()].released)
                    in_flight.pop_front();
                if (in_flight.empty()) break;
                request_state& oldest = st.requests[in_flight.front()];
                const int64_t expires = oldest.sent_ns + timeout_ns;
                if (now_ns() >= expires) {
                    // Give up on it for pacing purposes; a late answer still counts.
                    oldest.released = true;
                    --st.outstanding;
                    continue;
                }
                st.changed.wait_for(lock, std::chrono::nanoseconds(expires - now_ns()));
            }
        }
        if (o.rate > 0) {
            wait_until_ns(next_at);
            const double gap_s =
                o.poisson ? -std::log1p(-arrivals.uniform()) / o.rate : 1.0 / o.rate;
            next_at += static_cast<int64_t>(gap_s * 1e9);
        }
        {
            std::lock_guard lock(st.mutex);
            st.requests[i].sent_ns = now_ns();
            ++st.sent;
            ++st.outstanding;
            if (o.closed_loop) in_flight.push_back(i);
        }
        send_request(sock.get(), dst, pool[i % pool.size()], id_base + i);
    }
    {
        std::unique_lock lock(st.mutex);
        st.changed.wait_until(lock, clock_type::now() + std::chrono::nanoseconds(timeout_ns),
                              [&] { return st.answered == st.sent || !st.receive_error.empty(); });
    }
    stop = true;
    receiver.join();
    const int64_t end = now_ns();

    send_result r;
    std::vector<double> lat;
    {
        std::lock_guard lock(st.mutex);
        if (!st.receive_error.empty()) throw std::runtime_error(st.receive_error);
        r.sent = st.sent;
        r.responses = st.answered;
        r.ok = st.ok;
        r.bad = st.bad;
        r.errors = st.errors;
        r.duplicates = st.duplicates;
        r.stray = st.stray;
        for (const auto& rs : st.requests)
            if (rs.answered) lat.push_back(double(rs.done_ns - rs.sent_ns) / 1e3);
        for (const auto& l : st.shown) log << l << '\n';
        for (const auto& p : st.problems) log << p << '\n';
        if (st.bad > st.problems.size())
            log << "... and " << (st.bad - st.problems.size()) << " more bad responses\n";
    }
    if (results.is_open()) {
        // The receiver has stopped: the request states are ours alone now.
        std::vector<answer_record> records;
        records.reserve(r.responses);
        for (uint64_t i = 0; i < st.requests.size(); ++i) {
            request_state& rs = st.requests[i];
            if (!rs.answered) continue;
            answer_record a;
            a.request = i;
            a.payload = i % pool.size();  // the pool entry send_request() sent
            a.kind = rs.kind;
            a.status = rs.status;
            a.format = rs.format;
            std::copy(std::begin(rs.dims), std::end(rs.dims), a.dims);
            a.payload_bytes = std::move(rs.answer);
            a.latency_us = double(rs.done_ns - rs.sent_ns) / 1e3;
            records.push_back(std::move(a));
        }
        write_results(results, records);
        results.close();
        if (!results) throw std::runtime_error("--results: cannot write '" + o.results_file + "'");
        log << "results: " << records.size() << " answers written to " << o.results_file << '\n';
    }
    r.lost = r.sent - r.responses;
    r.elapsed_s = double(end - start) / 1e9;
    std::sort(lat.begin(), lat.end());
    r.p50_us = percentile(lat, 0.50);
    r.p90_us = percentile(lat, 0.90);
    r.p99_us = percentile(lat, 0.99);
    r.p999_us = percentile(lat, 0.999);
    if (!lat.empty()) {
        r.min_us = lat.front();
        r.max_us = lat.back();
        double s = 0;
        for (double v : lat) s += v;
        r.mean_us = s / double(lat.size());
    }
    log << "latency_us: min=" << std::llround(r.min_us) << " mean=" << std::llround(r.mean_us)
        << " max=" << std::llround(r.max_us)
        << " (first fragment sent -> last response fragment received)\n"
        << "elapsed_s=" << r.elapsed_s << " duplicates=" << r.duplicates << " stray=" << r.stray
        << " loss=" << r.loss() << '\n';
    return r;
}

void write_results(std::ostream& out, const std::vector<answer_record>& records) {
    std::string line;
    char num[64];
    // %.9g: enough digits that the text reads back as the same float.
    const auto append_float = [&](float v) {
        if (std::isfinite(v)) {
            std::snprintf(num, sizeof num, "%.9g", double(v));
            line += num;
        } else {
            line += "null";
        }
    };
    for (const answer_record& a : records) {
        const bool error = a.kind == uint8_t(wire::kind::error);
        line = "{\"id\":" + std::to_string(a.request) + ",\"payload\":" + std::to_string(a.payload) +
               ",\"kind\":\"" + (error ? "error" : "response") + "\",\"status\":" +
               std::to_string(a.status) + ",\"format\":" + std::to_string(a.format);
        if (error) {
            line += ",\"message\":\"";
            append_json_string(line, a.payload_bytes);
            line += '"';
        } else if (a.format == uint8_t(wire::format::result_topk)) {
            line += ",\"topk\":[";
            // Every whole entry that arrived, decoded by the client library.
            for (size_t j = 0; j + 8 <= a.payload_bytes.size(); j += 8) {
                reefline_topk_entry e;
                reefline_decode_topk(a.payload_bytes.data() + j, 1, &e);
                if (j) line += ',';
                line += "[" + std::to_string(e.class_index) + ',';
                append_float(e.score);
                line += ']';
            }
            line += ']';
        } else if (a.format == uint8_t(wire::format::result_tensor_f32)) {
            line += ",\"tensor\":{\"dims\":[";
            for (size_t d = 0; d < 4 && a.dims[d]; ++d) line += (d ? "," : "") + std::to_string(a.dims[d]);
            line += "],\"data\":[";
            line.reserve(line.size() + a.payload_bytes.size() / 4 * 16);
            for (size_t j = 0; j + 4 <= a.payload_bytes.size(); j += 4) {
                if (j) line += ',';
                append_float(load_f32(a.payload_bytes.data() + j));
            }
            line += "]}";
        }
        std::snprintf(num, sizeof num, ",\"latency_us\":%.1f}\n", a.latency_us);
        line += num;
        out << line;
    }
}

std::string format_send_result(const send_result& r, bool json) {
    std::ostringstream s;
    const auto us = [](double v) { return std::llround(v); };
    if (json) {
        s << "{\"sent\":" << r.sent << ",\"responses\":" << r.responses << ",\"ok\":" << r.ok
          << ",\"bad\":" << r.bad << ",\"lost\":" << r.lost << ",\"p50_us\":" << us(r.p50_us)
          << ",\"p90_us\":" << us(r.p90_us) << ",\"p99_us\":" << us(r.p99_us)
          << ",\"p999_us\":" << us(r.p999_us) << ",\"errors\":" << r.errors << '}';
    } else {
        s << "sent=" << r.sent << " responses=" << r.responses << " ok=" << r.ok << " bad=" << r.bad
          << " lost=" << r.lost << " p50_us=" << us(r.p50_us) << " p90_us=" << us(r.p90_us)
          << " p99_us=" << us(r.p99_us) << " p999_us=" << us(r.p999_us) << " errors=" << r.errors;
    }
    return s.str();
}

}  // namespace reefline::reefgen
