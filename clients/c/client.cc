// libreefline-client: the client. One UDP socket, bound locally and connected to one IF, so
// that the kernel drops datagrams from anyone else. No threads: answers are read, resends
// made and give-ups decided inside the calls that wait (receive, wait, request), which keeps
// the library free of locks and callbacks and lets an application drive it from its own loop
// through reefline_client_fd().
//
// What the client keeps is bounded whatever arrives: fragments are filed only for requests
// that await an answer (at most max_outstanding), reassembling responses allocates at most
// max_pending_bytes (every byte the assembler allocates: entries, pieces, the completed copy;
// 64 MiB by default), and answers not yet collected are at most max_outstanding.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <set>
#include <utility>
#include <vector>

#include "clients/c/internal.h"

using reefline::client::fail;

namespace {

int64_t mono_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

timespec to_timespec(int64_t ns) {
    timespec t;
    t.tv_sec = time_t(ns / 1'000'000'000);
    t.tv_nsec = long(ns % 1'000'000'000);
    return t;
}

void sleep_until_ns(int64_t when) {
    const timespec t = to_timespec(when);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, nullptr) == EINTR) {
    }
}

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int system_error(const char* what) { return fail(REEFLINE_E_SYSTEM, "%s: %s", what, std::strerror(errno)); }

// Runs an API body, turning an allocation failure into REEFLINE_E_NO_MEMORY: no exception
// crosses the C boundary.
template <class F>
int guarded(F&& body) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return fail(REEFLINE_E_NO_MEMORY, "out of memory");
    }
}

constexpr size_t receive_batch = 16;
constexpr size_t receive_buffer = 65536;  // any UDP datagram fits: none is cut short

struct outstanding_request {
    std::vector<uint8_t> datagrams;  // every fragment's UDP payload, kept while it may be resent
    std::vector<size_t> ends;        // end of each datagram in `datagrams`
    int64_t first_sent_ns = 0;
    int64_t deadline_ns = 0;  // resend or give up then; 0: never
    uint32_t attempts = 0;
};

}  // namespace

struct reefline_client {
    reefline_client_options options{};
    int fd = -1;
    uint64_t next_id = 1;
    reefline_assembler* assembler = nullptr;
    // By request id: ids grow with every request, so begin() is the oldest.
    std::map<uint64_t, outstanding_request> outstanding;
    std::set<std::pair<int64_t, uint64_t>> deadlines;  // (deadline_ns, id)
    std::deque<reefline_result> ready;                 // answers not yet collected, oldest first
    double next_send_ns = 0;                           // pacing: when the next datagram may go
    reefline_client_stats stats{};
    std::vector<uint8_t> rx;

    ~reefline_client() {
        for (reefline_result& r : ready) reefline_result_clear(&r);
        reefline_assembler_destroy(assembler);
        if (fd >= 0) ::close(fd);
    }

    void pace(size_t bytes);
    int transmit(const outstanding_request& r);
    int send_request(int format, const uint16_t dims[4], const void* payload, size_t length, uint64_t* id);
    void forget(std::map<uint64_t, outstanding_request>::iterator it);
    int drain();
    void file(const uint8_t* data, size_t length);
    int run_timers();
    template <class Done>
    int pump(int timeout_ms, Done done);
    bool take_ready(uint64_t id, reefline_result* out);
};

void reefline_client::pace(size_t bytes) {
    const double pps = options.pace_packets_per_s, bps = options.pace_bytes_per_s;
    if (pps <= 0 && bps <= 0) return;
    const double gap = std::max(pps > 0 ? 1e9 / pps : 0.0, bps > 0 ? double(bytes) * 1e9 / bps : 0.0);
    // Sleep most of the way (timer slack is ~50 us), then spin for the exact time.
    const int64_t target = int64_t(next_send_ns);
    if (target - mono_ns() > 200'000) sleep_until_ns(target - 100'000);
    int64_t now = mono_ns();
    while (now < target) now = mono_ns();
    // The gap counts from when this datagram actually leaves: a late wake-up is never made up
    // by sending the next ones closer together (that would be the burst pacing is there to
    // avoid), and idle time earns no credit either.
    next_send_ns = double(now) + gap;
}

int reefline_client::transmit(const outstanding_request& r) {
    const bool paced = options.pace_packets_per_s > 0 || options.pace_bytes_per_s > 0;
    constexpr size_t batch = 64;
    iovec iov[batch];
    mmsghdr msgs[batch];
    size_t next = 0;
    int refused = 0;
    while (next < r.ends.size()) {
        // Paced: one datagram per call, each at its time. Otherwise batches of 64.
        const size_t n = paced ? 1 : std::min(batch, r.ends.size() - next);
        for (size_t i = 0; i < n; ++i) {
            const size_t begin = next + i == 0 ? 0 : r.ends[next + i - 1];
            iov[i] = {const_cast<uint8_t*>(r.datagrams.data()) + begin, r.ends[next + i] - begin};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        if (paced) pace(iov[0].iov_len);
        const int sent = ::sendmmsg(fd, msgs, unsigned(n), 0);
        if (sent < 0) {
            // ENOBUFS/EAGAIN: the device queue is full, back off briefly. ECONNREFUSED reports
            // an ICMP error caused by an earlier datagram (nothing listened then), not this
            // batch: the error is consumed by reporting it, so sending again goes through.
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
                sleep_until_ns(mono_ns() + 50'000);
                continue;
            }
            if (errno == ECONNREFUSED && ++refused < 16) continue;
            return system_error("send");
        }
        for (int i = 0; i < sent; ++i) stats.bytes_sent += iov[i].iov_len;
        stats.datagrams_sent += uint64_t(sent);
        next += size_t(sent);
    }
    return REEFLINE_OK;
}

void reefline_client::forget(std::map<uint64_t, outstanding_request>::iterator it) {
    if (it->second.deadline_ns) deadlines.erase({it->second.deadline_ns, it->first});
    const reefline_flow flow{0, 0, it->first};
    reefline_assembler_forget(assembler, &flow);
    outstanding.erase(it);
}

int reefline_client::send_request(int format, const uint16_t dims[4], const void* payload, size_t length,
                                  uint64_t* request_id) {
    if (!payload) return fail(REEFLINE_E_INVALID_ARGUMENT, "null payload");
    if (format < 0 || format > 255 || !reefline::wire::is_request_format(uint8_t(format)))
        return fail(REEFLINE_E_INVALID_ARGUMENT, "format %d is not a request format", format);
    const uint16_t none[4] = {0, 0, 0, 0};
    if (!dims) dims = none;
    if (format != REEFLINE_FORMAT_RAW) {
        // reefline drops a request whose dims do not describe its length (drop_dims_mismatch)
        // without an answer: refuse it here, where the caller can be told.
        const uint64_t want = reefline_described_length(format, dims);
        if (want != length)
            return fail(REEFLINE_E_INVALID_ARGUMENT, "dims %u,%u,%u,%u describe %llu bytes, the payload has %zu",
                        dims[0], dims[1], dims[2], dims[3], static_cast<unsigned long long>(want), length);
    }
    uint32_t count = 0;
    if (const int rc = reefline_fragment_count(length, options.fragment_size, &count); rc != REEFLINE_OK)
        return rc;

    const uint64_t id = next_id++;
    outstanding_request r;
    r.datagrams.resize(size_t(count) * REEFLINE_HEADER_SIZE + length);
    r.ends.reserve(count);
    size_t at = 0;
    for (uint32_t i = 0; i < count; ++i) {
        size_t n = 0;
        if (const int rc = reefline_encode_request_fragment(format, dims, payload, length, id, options.fragment_size,
                                                            i, r.datagrams.data() + at, r.datagrams.size() - at, &n);
            rc != REEFLINE_OK)
            return rc;
        at += n;
        r.ends.push_back(at);
    }
    // Room for it: the oldest request still waiting is abandoned (its answer will be dropped).
    while (outstanding.size() >= options.max_outstanding) {
        forget(outstanding.begin());
        ++stats.abandoned;
    }
    r.first_sent_ns = mono_ns();
    r.attempts = 1;
    if (const int rc = transmit(r); rc != REEFLINE_OK) return rc;
    ++stats.requests_sent;
    if (options.retries == 0) {
        // Never resent: the datagrams need not be kept.
        r.datagrams = {};
        r.ends = {};
    }
    if (options.retry_timeout_ms) r.deadline_ns = mono_ns() + int64_t(options.retry_timeout_ms) * 1'000'000;
    auto it = outstanding.emplace(id, std::move(r)).first;
    if (it->second.deadline_ns) deadlines.emplace(it->second.deadline_ns, id);
    if (request_id) *request_id = id;
    return REEFLINE_OK;
}

// Files one datagram; completes an answer into `ready` when it was the last piece.
void reefline_client::file(const uint8_t* data, size_t length) {
    reefline_header h;
    const uint8_t* fragment = nullptr;
    size_t fragment_length = 0;
    if (reefline_parse_response(data, length, &h, &fragment, &fragment_length) != REEFLINE_FRAGMENT_OK) {
        ++stats.rejected;
        return;
    }
    auto it = outstanding.find(h.request_id);
    if (it == outstanding.end()) {
        // Already answered (a resend's answer), given up, abandoned, or never ours: not filed,
        // so such traffic cannot hold memory.
        ++stats.duplicates;
        return;
    }
    const reefline_flow flow{0, 0, h.request_id};
    reefline_message m;
    const int outcome = reefline_assembler_add(assembler, &flow, &h, fragment, fragment_length, &m);
    if (outcome == REEFLINE_ADD_INCONSISTENT) ++stats.inconsistent;
    if (outcome != REEFLINE_ADD_COMPLETED) return;
    if (!m.tiles) {
        // Gaps or overlaps: no answer can be read from it. The request stays outstanding, so
        // a resend may still get a good one.
        ++stats.inconsistent;
        return;
    }
    reefline_result res{};
    auto* bytes = static_cast<uint8_t*>(std::malloc(m.length + 1));
    if (!bytes) throw std::bad_alloc();
    std::memcpy(bytes, m.payload, m.length + 1);  // the assembler's copy is NUL-terminated
    res.request_id = h.request_id;
    res.kind = m.head.kind;
    res.status = m.head.status;
    res.format = m.head.format;
    std::copy(m.head.dims, m.head.dims + 4, res.dims);
    res.payload = bytes;
    res.payload_length = m.length;
    res.owner = bytes;
    res.attempts = it->second.attempts;
    res.latency_us = double(mono_ns() - it->second.first_sent_ns) / 1e3;
    try {
        ready.push_back(res);
    } catch (...) {
        std::free(bytes);
        throw;
    }
    forget(it);
    ++stats.answers;
    if (res.kind == REEFLINE_KIND_ERROR) ++stats.errors;
    while (ready.size() > options.max_outstanding) {
        reefline_result_clear(&ready.front());
        ready.pop_front();
        ++stats.abandoned;
    }
}

int reefline_client::drain() {
    if (rx.empty()) rx.resize(receive_batch * receive_buffer);
    mmsghdr msgs[receive_batch];
    iovec iov[receive_batch];
    for (;;) {
        for (size_t i = 0; i < receive_batch; ++i) {
            iov[i] = {rx.data() + i * receive_buffer, receive_buffer};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        const int n = ::recvmmsg(fd, msgs, unsigned(receive_batch), MSG_DONTWAIT, nullptr);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return REEFLINE_OK;
            // ECONNREFUSED: an ICMP error for an earlier send (no IF on that port yet); the
            // request it belongs to is retried or times out like a lost one.
            if (errno == EINTR || errno == ECONNREFUSED) continue;
            return system_error("recvmmsg");
        }
        for (int i = 0; i < n; ++i) {
            if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
                ++stats.rejected;
                continue;
            }
            file(rx.data() + size_t(i) * receive_buffer, msgs[i].msg_len);
        }
        if (size_t(n) < receive_batch) return REEFLINE_OK;
    }
}

int reefline_client::run_timers() {
    const int64_t now = mono_ns();
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
        const uint64_t id = deadlines.begin()->second;
        deadlines.erase(deadlines.begin());
        auto it = outstanding.find(id);
        if (it == outstanding.end()) continue;
        outstanding_request& r = it->second;
        r.deadline_ns = 0;
        if (r.attempts > options.retries) {
            forget(it);
            ++stats.gave_up;
            continue;
        }
        // Every fragment again, same id: reefline files the copies of fragments it already
        // has as duplicates, and answers a request it already answered once more.
        ++r.attempts;
        ++stats.resends;
        if (const int rc = transmit(r); rc != REEFLINE_OK) return rc;
        r.deadline_ns = mono_ns() + int64_t(options.retry_timeout_ms) * 1'000'000;
        deadlines.emplace(r.deadline_ns, id);
    }
    return REEFLINE_OK;
}

// Reads, resends and gives up until done() or the timeout; REEFLINE_E_TIMEOUT then.
template <class Done>
int reefline_client::pump(int timeout_ms, Done done) {
    const int32_t t = timeout_ms == REEFLINE_TIMEOUT_DEFAULT ? options.receive_timeout_ms : timeout_ms;
    const int64_t deadline = t < 0 ? INT64_MAX : mono_ns() + int64_t(t) * 1'000'000;
    for (;;) {
        // Whatever already arrived is filed before timers run: an answer that came in time is
        // never thrown away because it was read late.
        if (const int rc = drain(); rc != REEFLINE_OK) return rc;
        if (const int rc = run_timers(); rc != REEFLINE_OK) return rc;
        if (done()) return REEFLINE_OK;
        const int64_t now = mono_ns();
        if (now >= deadline) return fail(REEFLINE_E_TIMEOUT, "no answer within %d ms", int(t));
        int64_t until = deadline;
        if (!deadlines.empty()) until = std::min(until, deadlines.begin()->first);
        pollfd p{fd, POLLIN, 0};
        timespec wait = to_timespec(std::max<int64_t>(until - now, 0));
        if (::ppoll(&p, 1, until == INT64_MAX ? nullptr : &wait, nullptr) < 0 && errno != EINTR)
            return system_error("ppoll");
    }
}

bool reefline_client::take_ready(uint64_t id, reefline_result* out) {
    for (auto it = ready.begin(); it != ready.end(); ++it)
        if (it->request_id == id) {
            *out = *it;
            ready.erase(it);
            return true;
        }
    return false;
}

extern "C" {

void reefline_client_options_init(reefline_client_options* o) {
    if (!o) return;
    *o = reefline_client_options{};
    o->fragment_size = REEFLINE_MTU_FRAGMENT_SIZE;
    o->retries = 0;
    o->retry_timeout_ms = 1000;
    o->receive_timeout_ms = 1000;
    o->max_outstanding = 4096;
    o->max_pending_bytes = size_t(64) << 20;
    o->socket_buffer_bytes = 4 << 20;
}

int reefline_client_create(const reefline_client_options* options, reefline_client** client) {
    if (!client) return fail(REEFLINE_E_INVALID_ARGUMENT, "no place for the client");
    *client = nullptr;
    if (!options) return fail(REEFLINE_E_INVALID_ARGUMENT, "no options");
    reefline_client_options o = *options;
    if (o.fragment_size == 0) o.fragment_size = REEFLINE_MTU_FRAGMENT_SIZE;
    if (o.max_outstanding == 0) o.max_outstanding = 4096;
    if (o.max_pending_bytes == 0) o.max_pending_bytes = size_t(64) << 20;
    if (o.fragment_size > REEFLINE_MAX_FRAGMENT_SIZE)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "fragment size %u: must be 1..%u", o.fragment_size,
                    REEFLINE_MAX_FRAGMENT_SIZE);
    if (!(o.pace_bytes_per_s >= 0) || !std::isfinite(o.pace_bytes_per_s) || !(o.pace_packets_per_s >= 0) ||
        !std::isfinite(o.pace_packets_per_s))
        return fail(REEFLINE_E_INVALID_ARGUMENT, "pacing rates must be finite and >= 0");
    sockaddr_in dst{}, local{};
    dst.sin_family = local.sin_family = AF_INET;
    if (!o.address || inet_pton(AF_INET, o.address, &dst.sin_addr) != 1)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "address: not an IPv4 address: '%s'", o.address ? o.address : "(null)");
    if (o.port == 0) return fail(REEFLINE_E_INVALID_ARGUMENT, "port: must be 1..65535");
    dst.sin_port = htons(o.port);
    if (o.bind_address && *o.bind_address && inet_pton(AF_INET, o.bind_address, &local.sin_addr) != 1)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "bind address: not an IPv4 address: '%s'", o.bind_address);
    local.sin_port = htons(o.bind_port);
    o.address = o.bind_address = nullptr;  // the caller's strings are not kept

    return guarded([&] {
        auto* c = new reefline_client;
        c->options = o;
        c->fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (c->fd < 0) {
            const int rc = system_error("socket");
            delete c;
            return rc;
        }
        if (o.socket_buffer_bytes > 0) {
            // A burst of response fragments must not overflow the default ~200 KiB. The FORCE
            // variants need CAP_NET_ADMIN; without it the kernel's cap applies.
            const int b = o.socket_buffer_bytes;
            if (setsockopt(c->fd, SOL_SOCKET, SO_RCVBUFFORCE, &b, sizeof b) != 0)
                setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
            if (setsockopt(c->fd, SOL_SOCKET, SO_SNDBUFFORCE, &b, sizeof b) != 0)
                setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        }
        char where[64];
        if (::bind(c->fd, reinterpret_cast<const sockaddr*>(&local), sizeof local) != 0) {
            char ip[INET_ADDRSTRLEN] = "";
            inet_ntop(AF_INET, &local.sin_addr, ip, sizeof ip);
            std::snprintf(where, sizeof where, "bind %s:%u", ip, unsigned(o.bind_port));
            const int rc = system_error(where);
            delete c;
            return rc;
        }
        if (::connect(c->fd, reinterpret_cast<const sockaddr*>(&dst), sizeof dst) != 0) {
            const int rc = system_error("connect");
            delete c;
            return rc;
        }
        // Ids are unique per source address and port across runs: a clock-derived base keeps
        // a restarted client on a fixed port from matching entries reefline still holds.
        c->next_id = o.first_request_id
                         ? o.first_request_id
                         : ((splitmix64(uint64_t(mono_ns()) ^ splitmix64(uint64_t(::getpid()) ^
                                                                         reinterpret_cast<uintptr_t>(c))) >>
                             24)
                            << 16) +
                               1;
        // A byte bound on the assembler's memory (never 0 here: unbounded is for captures).
        const reefline_assembler_options ao{o.max_outstanding, o.max_pending_bytes, 0};
        c->assembler = reefline_assembler_create(&ao);
        if (!c->assembler) {
            delete c;
            return int(REEFLINE_E_NO_MEMORY);
        }
        *client = c;
        return int(REEFLINE_OK);
    });
}

void reefline_client_destroy(reefline_client* client) { delete client; }

int reefline_client_fd(const reefline_client* client) { return client ? client->fd : -1; }

int reefline_client_local_address(const reefline_client* client, uint32_t* ip, uint16_t* port) {
    if (!client) return fail(REEFLINE_E_INVALID_ARGUMENT, "no client");
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (getsockname(client->fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return system_error("getsockname");
    if (ip) *ip = ntohl(a.sin_addr.s_addr);
    if (port) *port = ntohs(a.sin_port);
    return REEFLINE_OK;
}

int reefline_client_send(reefline_client* client, int format, const uint16_t dims[4], const void* payload,
                         size_t length, uint64_t* request_id) {
    if (!client) return fail(REEFLINE_E_INVALID_ARGUMENT, "no client");
    return guarded([&] { return client->send_request(format, dims, payload, length, request_id); });
}

int reefline_client_send_image(reefline_client* client, uint16_t height, uint16_t width, uint16_t channels,
                               const uint8_t* pixels, uint64_t* request_id) {
    if (height == 0 || width == 0 || channels == 0)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "image %ux%ux%u: extents must be 1..65535", height, width, channels);
    const uint16_t dims[4] = {height, width, channels, 0};
    const uint64_t n = uint64_t(height) * width * channels;
    if (n > REEFLINE_MAX_TOTAL_LENGTH)
        return fail(REEFLINE_E_LIMIT, "image of %llu bytes exceeds the protocol limit of %u",
                    static_cast<unsigned long long>(n), REEFLINE_MAX_TOTAL_LENGTH);
    return reefline_client_send(client, REEFLINE_FORMAT_IMAGE_U8_HWC, dims, pixels, size_t(n), request_id);
}

int reefline_client_send_tokens(reefline_client* client, const int32_t* tokens, size_t count, uint64_t* request_id) {
    if (!tokens || count == 0 || count > 65535)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "tokens: 1..65535 of them (dims are 16 bits), got %zu", count);
    return guarded([&] {
        std::vector<uint8_t> bytes(count * 4);
        reefline_encode_i32(tokens, count, bytes.data());
        const uint16_t dims[4] = {uint16_t(count), 0, 0, 0};
        return reefline_client_send(client, REEFLINE_FORMAT_TOKENS_I32, dims, bytes.data(), bytes.size(), request_id);
    });
}

int reefline_client_send_tensor(reefline_client* client, const uint16_t* dims, size_t ndims, const float* values,
                                uint64_t* request_id) {
    if (!dims || !values || ndims == 0 || ndims > 4)
        return fail(REEFLINE_E_INVALID_ARGUMENT, "tensor: 1 to 4 extents and their values");
    uint16_t d[4] = {0, 0, 0, 0};
    uint64_t count = 1;
    for (size_t i = 0; i < ndims; ++i) {
        if (dims[i] == 0) return fail(REEFLINE_E_INVALID_ARGUMENT, "tensor: extent %zu is 0 (must be 1..65535)", i);
        d[i] = dims[i];
        count *= dims[i];
    }
    if (count * 4 > REEFLINE_MAX_TOTAL_LENGTH)
        return fail(REEFLINE_E_LIMIT, "tensor of %llu bytes exceeds the protocol limit of %u",
                    static_cast<unsigned long long>(count * 4), REEFLINE_MAX_TOTAL_LENGTH);
    return guarded([&] {
        std::vector<uint8_t> bytes(size_t(count) * 4);
        reefline_encode_f32(values, size_t(count), bytes.data());
        return reefline_client_send(client, REEFLINE_FORMAT_TENSOR_F32, d, bytes.data(), bytes.size(), request_id);
    });
}

int reefline_client_send_raw(reefline_client* client, const void* bytes, size_t length, uint64_t* request_id) {
    return reefline_client_send(client, REEFLINE_FORMAT_RAW, nullptr, bytes, length, request_id);
}

int reefline_client_receive(reefline_client* client, int timeout_ms, reefline_result* result) {
    if (!client || !result) return fail(REEFLINE_E_INVALID_ARGUMENT, "null client or result");
    *result = reefline_result{};
    return guarded([&] {
        const int rc = client->pump(timeout_ms, [&] { return !client->ready.empty(); });
        if (rc != REEFLINE_OK) return rc;
        *result = client->ready.front();
        client->ready.pop_front();
        return int(REEFLINE_OK);
    });
}

int reefline_client_wait(reefline_client* client, uint64_t request_id, int timeout_ms, reefline_result* result) {
    if (!client || !result) return fail(REEFLINE_E_INVALID_ARGUMENT, "null client or result");
    *result = reefline_result{};
    return guarded([&] {
        if (client->take_ready(request_id, result)) return int(REEFLINE_OK);
        if (!client->outstanding.count(request_id))
            return fail(REEFLINE_E_NOT_FOUND, "request %llu is not awaiting an answer",
                        static_cast<unsigned long long>(request_id));
        bool answered = false;
        const int rc = client->pump(timeout_ms, [&] {
            answered = std::any_of(client->ready.begin(), client->ready.end(),
                                   [&](const reefline_result& r) { return r.request_id == request_id; });
            return answered || !client->outstanding.count(request_id);
        });
        if (rc != REEFLINE_OK) return rc;
        if (!answered || !client->take_ready(request_id, result))
            return fail(REEFLINE_E_TIMEOUT, "request %llu: no answer after %u attempts",
                        static_cast<unsigned long long>(request_id), client->options.retries + 1);
        return int(REEFLINE_OK);
    });
}

int reefline_client_request(reefline_client* client, int format, const uint16_t dims[4], const void* payload,
                            size_t length, int timeout_ms, reefline_result* result) {
    if (!client || !result) return fail(REEFLINE_E_INVALID_ARGUMENT, "null client or result");
    *result = reefline_result{};
    uint64_t id = 0;
    if (const int rc = reefline_client_send(client, format, dims, payload, length, &id); rc != REEFLINE_OK)
        return rc;
    const int rc = reefline_client_wait(client, id, timeout_ms, result);
    if (rc != REEFLINE_OK) reefline_client_abandon(client, id);
    return rc;
}

int reefline_client_abandon(reefline_client* client, uint64_t request_id) {
    if (!client) return 0;
    auto it = client->outstanding.find(request_id);
    if (it == client->outstanding.end()) return 0;
    client->forget(it);
    ++client->stats.abandoned;
    return 1;
}

size_t reefline_client_outstanding(const reefline_client* client) { return client ? client->outstanding.size() : 0; }

void reefline_client_get_stats(const reefline_client* client, reefline_client_stats* stats) {
    if (!client || !stats) return;
    *stats = client->stats;
    stats->evicted = reefline_assembler_evicted(client->assembler);
}

}  // extern "C"
