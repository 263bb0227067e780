// dataplane_bench: rx throughput of the DPDK data plane against the Linux socket path.
//
// 1. DPDK path, one lcore, in memory: 1 KB fragments of 224x224x3 u8 images (150528 bytes,
//    147 fragments each) for `inflight` concurrent requests, fragments round-robin across
//    them, a few source ports. The frames are built once into mbufs; every burst of 32 gets
//    its mbufs' refcounts bumped (what a NIC handing over filled mbufs costs, roughly), then
//    goes through exactly the steps of dataplane::poll_rx after rte_eth_rx_burst: parse_udp,
//    IF lookup, parse_request, reassembler::file_burst, completed requests onto the IF's
//    ring; the IF stand-in dequeues them and release()s them (which drops the refcounts).
// 2. Linux socket path: a sender thread pushes the same datagrams (reefline header + 1024 B)
//    over loopback with sendmmsg; a receiver thread recvmmsg()s them straight into mbufs and
//    files them into the same kind of reassembler, then releases completed requests.
//
// Prints a table and, as its last line: mpps_per_core=X socket_mpps=Y ratio=Z
// Exit status 1 when a correctness check fails (wrong completion count, drops, leaks).
//
// --frag-size B cuts the images into fragments of B payload bytes instead of 1024 (up to 1432,
// a full 1514-byte Ethernet frame). --sweep measures both paths at every fragment size of
// sweep_frag_sizes, --repeat times (rounds over all sizes, so that a burst of host load falls
// on every size alike), prints the medians per size, and ends with the same last line for
// the 1024 B configuration (the medians of its runs).
//
// Every step prints a progress line on stderr; --csv FILE writes one row per path and
// configuration measured (bench/plot.py dataplane plots a sweep's).
//
// --flood instead measures what the reassembly watermarks leave to legitimate traffic under a
// flood of partial requests that never complete, for each eviction order (see run_flood).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_report.h"
#include "dataplane/counters.h"
#include "dataplane/eal.h"
#include "dataplane/engine.h"  // rx_burst_size
#include "dataplane/if_table.h"
#include "dataplane/packet.h"
#include "clients/c/wire/protocol.h"
#include "dataplane/reassembly.h"
#include "dataplane/request.h"
#include "tools/reefgen/packet.h"

namespace dp = reefline::dp;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
namespace report = reefline::bench;

namespace {

using clock_type = std::chrono::steady_clock;

// printf into a std::string: progress lines and table cells are built whole before they are
// printed, so that stderr's progress lines never cut into a half-printed row.
[[gnu::format(printf, 1, 2)]] std::string strf(const char* format, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, format);
    const int n = std::vsnprintf(buf, sizeof buf, format, ap);
    va_end(ap);
    return std::string(buf, size_t(std::clamp(n, 0, int(sizeof buf) - 1)));
}

constexpr uint16_t image_dims[4] = {224, 224, 3, 0};
constexpr uint32_t image_bytes = 224u * 224u * 3u;  // 150528
constexpr uint32_t default_frag_payload = 1024;
// The largest payload whose frame is a full Ethernet frame: 14 + 20 + 8 + 40 + 1432 = 1514.
constexpr uint32_t max_frag_payload = 1432;
// --sweep: from small sensor-sized fragments to full frames; 1024 is the default
// configuration, whose medians make the last line.
constexpr uint32_t sweep_frag_sizes[] = {256, 512, 768, 1024, 1280, 1432};
constexpr uint16_t if_port = 9000;
constexpr uint16_t if_slot = 0;
constexpr uint32_t src_ports = 4;            // DPDK path: requests spread over 4 source ports
constexpr uint32_t src_ip = 0xc6120001;      // 198.18.0.1
constexpr uint32_t dst_ip = 0xc6120002;      // 198.18.0.2
constexpr uint16_t mbuf_room = RTE_MBUF_DEFAULT_BUF_SIZE;  // 2176: 2048 + headroom

// How a request's image is cut: `payload` bytes per fragment, the last one shorter. The
// fragment size is a run-time choice (--frag-size, --sweep): per-packet costs stay, bytes per
// packet change, and so does the number of mbufs a request holds under reassembly.
struct fragment_geometry {
    uint32_t payload = default_frag_payload;

    constexpr uint32_t count() const { return (image_bytes + payload - 1) / payload; }  // 147 at 1024 B
    constexpr uint32_t length(uint32_t index) const { return std::min(payload, image_bytes - index * payload); }
    // Ethernet + IPv4 + UDP + reefline header + a full fragment's payload.
    constexpr uint32_t frame_bytes() const { return uint32_t(gen::wire_offset + wire::header_size + payload); }
    constexpr bool valid() const { return payload > 0 && payload <= max_frag_payload && count() <= wire::max_fragments; }

    wire::fields header(uint64_t request_id, uint32_t index) const {
        wire::fields h;
        h.kind = uint8_t(wire::kind::request);
        h.format = uint8_t(wire::format::image_u8_hwc);
        h.request_id = request_id;
        h.frag_index = uint16_t(index);
        h.frag_count = uint16_t(count());
        h.payload_offset = index * payload;
        h.total_length = image_bytes;
        for (int i = 0; i < 4; ++i) h.dims[i] = image_dims[i];
        return h;
    }
};
static_assert(fragment_geometry{}.count() == 147);

struct options {
    double seconds = 1.0;
    double warmup = 0.2;
    uint32_t inflight = 64;
    bool breakdown = false;  // also time the parts of the DPDK path
    bool nic_cksum = false;  // mbufs say "IP checksum good" (a NIC with rx offload)
    bool socket = true;
    bool no_huge = false;    // force EAL's --no-huge (valgrind, or to compare)
    uint64_t age_limit_us = dp::reassembly_config{}.age_limit_us;
    bool gso = false;        // socket sender: UDP_SEGMENT, to offer the receiver more load
    bool flood = false;      // the flood comparison of eviction orders instead
    uint32_t flood_requests = 1000;  // --flood: legitimate requests per scenario
    fragment_geometry frag;  // --frag-size
    bool sweep = false;      // every size of sweep_frag_sizes, `repeat` rounds
    uint32_t repeat = 3;     // --sweep: rounds over the sizes
    std::string csv_path;    // --csv: the results table
};

[[noreturn]] void usage(const char* prog, int status) {
    std::fprintf(status ? stderr : stdout,
                 "usage: %s [--seconds S] [--inflight N] [--frag-size B] [--quick] [--breakdown] [--nic-cksum]"
                 " [--no-socket] [--gso] [--no-huge] [--age-ms MS] [--sweep [--repeat N]] [--csv FILE]"
                 " [--flood [--flood-requests N]]\n"
                 "  --seconds S   measurement time per path (default 1.0)\n"
                 "  --inflight N  concurrent requests under reassembly (default 64)\n"
                 "  --frag-size B payload bytes per fragment (default 1024, at most 1432: a 1514-byte frame)\n"
                 "  --quick       0.5 s per path, 0.1 s warm-up\n"
                 "  --breakdown   also time the parts of the DPDK path (harness, parse, full)\n"
                 "  --nic-cksum   mark mbufs IP-checksum-good, as a NIC with rx offload would\n"
                 "  --no-socket   skip the socket path (socket_mpps=0, ratio=0)\n"
                 "  --gso         socket sender uses UDP GSO (the receiver still gets one datagram\n"
                 "                per fragment); offers the receiver more than sendmmsg alone\n"
                 "  --no-huge     EAL without hugepages even when some are free\n"
                 "  --age-ms MS   reassembly age limit (default 100; raise it under valgrind)\n"
                 "  --sweep       both paths at fragment sizes 256, 512, 768, 1024, 1280, 1432 B, --repeat\n"
                 "                rounds over them (default 3); the last line is the 1024 B medians\n"
                 "  --csv FILE    write the results as CSV: one row per path and configuration measured\n"
                 "                (with --flood: one row per case and eviction order)\n"
                 "  --flood       instead: legitimate requests among partial ones that never complete,\n"
                 "                per eviction order (largest, oldest); --flood-requests N per case\n"
                 "progress (one line per step) goes to stderr; stdout has the tables and the last line\n",
                 prog);
    std::exit(status);
}

options parse_options(int argc, char** argv) {
    options o;
    bool quick = false, seconds_given = false, frag_given = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(argv[0], 2);
            return argv[++i];
        };
        try {
            if (a == "--seconds") { o.seconds = std::stod(value()); seconds_given = true; }
            else if (a == "--inflight") o.inflight = uint32_t(std::stoul(value()));
            else if (a == "--quick") quick = true;
            else if (a == "--breakdown") o.breakdown = true;
            else if (a == "--nic-cksum") o.nic_cksum = true;
            else if (a == "--no-socket") o.socket = false;
            else if (a == "--no-huge") o.no_huge = true;
            else if (a == "--gso") o.gso = true;
            else if (a == "--age-ms") o.age_limit_us = uint64_t(std::stod(value()) * 1000);
            else if (a == "--flood") o.flood = true;
            else if (a == "--flood-requests") o.flood_requests = uint32_t(std::stoul(value()));
            else if (a == "--frag-size") { o.frag.payload = uint32_t(std::stoul(value())); frag_given = true; }
            else if (a == "--sweep") o.sweep = true;
            else if (a == "--repeat") o.repeat = uint32_t(std::stoul(value()));
            else if (a == "--csv") o.csv_path = value();
            else if (a == "--help" || a == "-h") usage(argv[0], 0);
            else usage(argv[0], 2);
        } catch (const std::logic_error&) {
            usage(argv[0], 2);
        }
    }
    if (quick) {
        o.warmup = 0.1;
        if (!seconds_given) o.seconds = 0.5;
    }
    if (o.seconds <= 0 || o.inflight == 0 || o.inflight > 512 || o.flood_requests == 0 || o.repeat == 0 ||
        o.csv_path == "-")
        usage(argv[0], 2);
    if (!o.frag.valid()) {
        std::fprintf(stderr, "%s: --frag-size must be %u..%u bytes (a request has at most %u fragments)\n", argv[0],
                     (image_bytes + wire::max_fragments - 1) / wire::max_fragments, max_frag_payload,
                     wire::max_fragments);
        std::exit(2);
    }
    // UDP GSO cuts a message into equal segments, so the image must divide into them.
    if (o.gso && image_bytes % o.frag.payload != 0) {
        std::fprintf(stderr, "%s: --gso needs a fragment size that divides %u bytes (1024 does)\n", argv[0], image_bytes);
        std::exit(2);
    }
    if (o.sweep && o.gso) {
        std::fprintf(stderr, "%s: --sweep runs without --gso (most of its sizes do not divide the image)\n", argv[0]);
        std::exit(2);
    }
    if (o.sweep && (frag_given || o.breakdown || o.flood)) {
        std::fprintf(stderr, "%s: --sweep chooses the fragment sizes itself and takes no --frag-size, --breakdown"
                     " or --flood\n", argv[0]);
        std::exit(2);
    }
    return o;
}

std::vector<uint8_t> make_image() {
    std::vector<uint8_t> p(image_bytes);
    uint32_t x = 0x9e3779b9;
    for (auto& b : p) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        b = uint8_t(x);
    }
    return p;
}

// The IF side of the data plane, minimal: one binding on if_port with a ring that the bench
// drains itself, releasing each request (what an IF does once it has read the payload).
struct bench_if {
    explicit bench_if(const std::string& name, uint32_t readers) : ifs(readers) {
        ring = rte_ring_create(("bq_" + name).c_str(), 4096, SOCKET_ID_ANY, RING_F_SC_DEQ);
        if (!ring) throw std::runtime_error("rte_ring_create: " + std::string(rte_strerror(rte_errno)));
        dp::if_binding b;
        b.name = "bench";
        b.udp_port = if_port;
        b.slot = if_slot;
        b.ring = ring;
        ifs.publish({b});
    }
    ~bench_if() { rte_ring_free(ring); }
    dp::if_table ifs;
    rte_ring* ring = nullptr;
};

// One rx lcore's state and the steps of dataplane::poll_rx from the parsed udp_views on:
// IF lookup, parse_request, file_burst, completed requests onto the IF's ring.
struct rx_lane {
    rx_lane(const std::string& name, const dp::reassembly_config& rc, bench_if& bench_if_, uint32_t reader)
        : ifs(bench_if_.ifs), ring(bench_if_.ring), reader(reader) {
        queue.reasm = std::make_unique<dp::reassembler>(name, rc, queue.counters);
        ifs.reader_online(reader);
    }
    ~rx_lane() {
        consume();
        reasm->flush();
        ifs.reader_offline(reader);
    }

    dp::rx_queue queue;  // the data plane's own per-queue state and receive path
    dp::rx_counters& counters = queue.counters;
    std::unique_ptr<dp::reassembler>& reasm = queue.reasm;
    dp::if_table& ifs;
    rte_ring* ring;
    uint32_t reader;
    uint64_t consumed = 0;        // requests the IF stand-in released
    uint64_t consumed_mbufs = 0;  // mbufs those requests held

    // Validated fragments -> reassembly -> IF ring (the tail of the receive path).
    void file(const dp::port_map* map, dp::fragment* frags, uint32_t nf, uint64_t now) {
        queue.file(map, frags, nf, now);
    }

    // The IF consumer: takes complete requests off its ring and releases them.
    void consume() {
        void* objs[64];
        while (unsigned k = rte_ring_sc_dequeue_burst(ring, objs, 64, nullptr)) {
            for (unsigned i = 0; i < k; ++i) consumed_mbufs += dp::release(static_cast<dp::request*>(objs[i]));
            consumed += k;
        }
    }

    uint64_t drops_total() const {
        uint64_t d = 0;
        for (const auto& c : counters.drops) d += c.get();
        return d;
    }
    std::string drops_text() const {
        std::string s;
        for (size_t i = 0; i < dp::drop_reason_count; ++i)
            if (uint64_t v = counters.drops[i].get())
                s += " " + std::string(dp::drop_reason_names[i]) + "=" + std::to_string(v);
        return s.empty() ? " none" : s;
    }
};

// ---------------------------------------------------------------------------------------
// DPDK path

double thread_cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct dpdk_result {
    double seconds = 0;
    double cpu_seconds = 0;  // this thread's CPU time in the window (< seconds: core shared)
    uint64_t packets = 0;
    uint64_t completed = 0;
    double mpps() const { return packets / seconds / 1e6; }
    double ns_per_packet() const { return seconds * 1e9 / packets; }
    double cpu_share() const { return cpu_seconds / seconds; }
    double mpps_per_cpu_second() const { return packets / cpu_seconds / 1e6; }
};

dp::cksum_state ip_state(uint64_t ol) {
    switch (ol & RTE_MBUF_F_RX_IP_CKSUM_MASK) {
    case RTE_MBUF_F_RX_IP_CKSUM_GOOD: return dp::cksum_state::good;
    case RTE_MBUF_F_RX_IP_CKSUM_BAD: return dp::cksum_state::bad;
    default: return dp::cksum_state::unknown;
    }
}

dp::cksum_state l4_state(uint64_t ol) {
    switch (ol & RTE_MBUF_F_RX_L4_CKSUM_MASK) {
    case RTE_MBUF_F_RX_L4_CKSUM_GOOD: return dp::cksum_state::good;
    case RTE_MBUF_F_RX_L4_CKSUM_BAD: return dp::cksum_state::bad;
    default: return dp::cksum_state::unknown;
    }
}

// harness: the refcount bump and the free only; parse: + parse_udp, IF lookup, parse_request;
// full: the whole path; full_timed: the whole path with the rx side (poll_rx's work) and the
// IF side (release) timed apart.
enum class stage { harness, parse, full, full_timed };

class dpdk_bench {
public:
    dpdk_bench(const options& o, const fragment_geometry& g, bench_if& bench_if_) : _o(o), _g(g) {
        // A sweep builds one of these per configuration: DPDK object names must be unique
        // while both exist, and a counter keeps them so without relying on the free order.
        static unsigned instances = 0;
        const std::string tag = std::to_string(instances++);
        const uint32_t n = o.inflight * g.count();
        _pool = rte_pktmbuf_pool_create(("bench_dp_mbufs" + tag).c_str(), n + 512, 256, 0, mbuf_room, SOCKET_ID_ANY);
        if (!_pool) throw std::runtime_error("mbuf pool: " + std::string(rte_strerror(rte_errno)));
        dp::reassembly_config rc;  // the appliance's defaults: 1024 entries, 100 ms age limit
        rc.entries = std::max<uint32_t>(rc.entries, 2 * o.inflight);
        rc.age_limit_us = o.age_limit_us;
        _lane = std::make_unique<rx_lane>("bench_dp" + tag, rc, bench_if_, 0);

        // Frames, once: request s (id s+1) from source port 40000 + s % 4; the feed order is
        // fragment-major, so consecutive packets belong to different requests.
        const std::vector<uint8_t> image = make_image();
        std::vector<std::vector<rte_mbuf*>> by_request(o.inflight);
        for (uint32_t s = 0; s < o.inflight; ++s) {
            gen::frame_addresses a;
            a.src_mac = {{0x02, 0, 0, 0, 0, 0x01}};
            a.dst_mac = {{0x02, 0, 0, 0, 0, 0x02}};
            a.src_ip = src_ip;
            a.dst_ip = dst_ip;
            a.src_port = uint16_t(40000 + s % src_ports);
            a.dst_port = if_port;
            for (uint32_t f = 0; f < g.count(); ++f) {
                std::vector<uint8_t> udp;
                gen::append_udp_payload(udp, g.header(s + 1, f), {image.data() + f * g.payload, g.length(f)});
                const std::vector<uint8_t> frame = gen::build_frame(a, uint16_t(f), udp);
                rte_mbuf* m = rte_pktmbuf_alloc(_pool);
                if (!m) throw std::runtime_error("mbuf pool too small");
                char* p = rte_pktmbuf_append(m, uint16_t(frame.size()));
                if (!p) throw std::runtime_error("frame does not fit an mbuf");
                std::memcpy(p, frame.data(), frame.size());
                if (o.nic_cksum) m->ol_flags |= RTE_MBUF_F_RX_IP_CKSUM_GOOD;
                by_request[s].push_back(m);
            }
        }
        for (uint32_t f = 0; f < g.count(); ++f)
            for (uint32_t s = 0; s < o.inflight; ++s) _seq.push_back(by_request[s][f]);
    }

    ~dpdk_bench() {
        _lane.reset();
        for (rte_mbuf* m : _seq) rte_pktmbuf_free(m);
        rte_mempool_free(_pool);
    }

    // Runs whole rounds (every request once, start to completion) for at least `seconds`.
    dpdk_result run(stage st, double seconds) {
        dpdk_result r;
        const uint64_t completed0 = _lane->consumed;
        const double cpu0 = thread_cpu_seconds();
        const auto t0 = clock_type::now();
        const auto limit = t0 + std::chrono::duration_cast<clock_type::duration>(
                                    std::chrono::duration<double>(seconds));
        auto t = t0;
        do {
            round(st);
            r.packets += _seq.size();
            ++_rounds[size_t(st)];
            t = clock_type::now();
        } while (t < limit);
        r.seconds = std::chrono::duration<double>(t - t0).count();
        r.cpu_seconds = thread_cpu_seconds() - cpu0;
        r.completed = _lane->consumed - completed0;
        return r;
    }

    // Everything fed must have completed, nothing dropped, every mbuf back to refcount 1,
    // every entry back in its pool. Returns an error message or "".
    std::string check() const {
        std::ostringstream e;
        const uint64_t full_rounds = _rounds[size_t(stage::full)] + _rounds[size_t(stage::full_timed)];
        const uint64_t want = full_rounds * _o.inflight;
        if (_lane->consumed != want)
            e << "completed " << _lane->consumed << " requests, expected " << want << "; ";
        if (_lane->counters.requests_completed.get() != want)
            e << "reassembler counted " << _lane->counters.requests_completed.get() << " completions; ";
        if (_lane->consumed_mbufs != want * _g.count())
            e << "released " << _lane->consumed_mbufs << " mbufs, expected " << want * _g.count() << "; ";
        if (_lane->drops_total() != 0) e << "drops:" << _lane->drops_text() << "; ";
        if (_lane->reasm->pending() != 0) e << _lane->reasm->pending() << " requests pending; ";
        rte_mempool* entries = _lane->reasm->entry_pool();
        if (rte_mempool_avail_count(entries) != entries->size) e << "reassembly entries leaked; ";
        for (const rte_mbuf* m : _seq)
            if (rte_mbuf_refcnt_read(m) != 1) { e << "mbuf refcount " << rte_mbuf_refcnt_read(m) << " != 1; "; break; }
        return e.str();
    }

private:
    void round(stage st) {
        const uint32_t n = uint32_t(_seq.size());
        for (uint32_t off = 0; off < n; off += dp::rx_burst_size) {
            const uint16_t k = uint16_t(std::min<uint32_t>(dp::rx_burst_size, n - off));
            rte_mbuf** pkts = _seq.data() + off;
            // "rx_burst": the NIC hands over filled mbufs (here: one more reference each).
            for (uint16_t i = 0; i < k; ++i) rte_mbuf_refcnt_update(pkts[i], 1);
            switch (st) {
            case stage::harness: rte_pktmbuf_free_bulk(pkts, k); break;
            case stage::parse: parse_only(pkts, k); break;
            case stage::full: poll_rx_body(pkts, k); _lane->consume(); break;
            case stage::full_timed: {
                const uint64_t t0 = rte_rdtsc();
                poll_rx_body(pkts, k);
                const uint64_t t1 = rte_rdtsc();
                _lane->consume();
                rx_tsc += t1 - t0;
                release_tsc += rte_rdtsc() - t1;
                break;
            }
            }
        }
    }

    // dataplane::poll_rx from rte_eth_rx_burst on: the same calls, on in-memory mbufs.
    void poll_rx_body(rte_mbuf** pkts, uint16_t n) {
        constexpr uint16_t q = 0;
        rx_lane& s = *_lane;
        const uint64_t now = rte_rdtsc();
        s.reasm->expire(now);
        if (n) s.queue.process(s.ifs.current(), pkts, n, now, nullptr);
        s.ifs.quiescent(q);
    }

    // Parsing and the IF lookup only, then the mbufs are freed (refcount back to 1).
    void parse_only(rte_mbuf** pkts, uint16_t n) {
        const dp::port_map* map = _lane->ifs.current();
        uint32_t bad = 0;
        for (uint16_t i = 0; i < n; ++i) {
            if (i + 4 < n) rte_prefetch0(rte_pktmbuf_mtod(pkts[i + 4], void*));
            rte_mbuf* m = pkts[i];
            dp::udp_view u;
            dp::fragment_view v;
            dp::drop_reason why = dp::parse_udp(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len,
                                                ip_state(m->ol_flags), l4_state(m->ol_flags), u);
            if (why == dp::drop_reason::none && !dp::if_table::lookup(map, u.dst_port))
                why = dp::drop_reason::unknown_port;
            if (why == dp::drop_reason::none) why = dp::parse_request(u, v);
            bad += why != dp::drop_reason::none;
        }
        parse_errors += bad;
        rte_pktmbuf_free_bulk(pkts, n);
    }

    const options& _o;
    const fragment_geometry _g;
    rte_mempool* _pool = nullptr;
    std::unique_ptr<rx_lane> _lane;
    std::vector<rte_mbuf*> _seq;
    uint64_t _rounds[4] = {0, 0, 0, 0};

public:
    uint64_t parse_errors = 0;             // parse stage: frames that did not parse (none)
    uint64_t rx_tsc = 0, release_tsc = 0;  // full_timed: poll_rx's part, the IF's part
};

// ---------------------------------------------------------------------------------------
// Socket path

void pin_to(unsigned cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

struct socket_result {
    double seconds = 0;
    uint64_t received = 0;   // datagrams processed by the receiver in the window
    uint64_t sent = 0;       // datagrams the sender handed to the kernel in the window
    uint64_t completed = 0;  // requests completed in the window
    uint64_t sent_total = 0;      // whole run, warm-up included
    uint64_t received_total = 0;  // the receiver drains the socket after the sender stops
    double rx_cpu_seconds = 0;    // receiver / sender thread CPU time in the window
    double tx_cpu_seconds = 0;
    uint64_t busy_tsc = 0;   // receiver cycles in recvmmsg calls that returned data + processing
    uint64_t batches = 0;    // such calls
    bool pinned = false;
    std::string error;
    std::string drops;
    double mpps() const { return received / seconds / 1e6; }
    double ns_per_packet() const { return received ? seconds * 1e9 / received : 0; }
    uint64_t lost() const { return sent_total - received_total; }  // in the kernel
    // What the receiver spends per datagram when it has work (excludes empty polls).
    double busy_ns_per_packet() const {
        return received ? busy_tsc * 1e9 / double(rte_get_tsc_hz()) / received : 0;
    }
};

class socket_bench {
public:
    socket_bench(const options& o, const fragment_geometry& g, bench_if& bench_if_)
        : _o(o), _g(g), _bench_if(bench_if_), _image(make_image()) {
        static unsigned instances = 0;  // unique DPDK names, as in dpdk_bench
        _tag = std::to_string(instances++);
        // Requests under reassembly, and the mbufs they may hold when datagrams are lost in
        // the kernel (incomplete requests wait for their age limit or eviction).
        _rc.entries = 2 * o.inflight;
        _rc.age_limit_us = o.age_limit_us;
        _pool = rte_pktmbuf_pool_create(("bench_sk_mbufs" + _tag).c_str(), _rc.entries * g.count() + 1024,
                                        256, 0, mbuf_room, SOCKET_ID_ANY);
        if (!_pool) throw std::runtime_error("mbuf pool: " + std::string(rte_strerror(rte_errno)));

        _rx_fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (_rx_fd < 0) throw std::runtime_error("socket: " + std::string(strerror(errno)));
        const int rcvbuf = 32 << 20;
        if (setsockopt(_rx_fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0)
            setsockopt(_rx_fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = 0;
        if (bind(_rx_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
            throw std::runtime_error("bind: " + std::string(strerror(errno)));
        socklen_t len = sizeof a;
        getsockname(_rx_fd, reinterpret_cast<sockaddr*>(&a), &len);
        _rx_addr = a;
    }

    ~socket_bench() {
        if (_rx_fd >= 0) close(_rx_fd);
        rte_mempool_free(_pool);
    }

    socket_result run(double warmup, double seconds) {
        socket_result r;
        const unsigned ncpu = std::thread::hardware_concurrency();
        r.pinned = ncpu >= 2;
        std::thread receiver([&] { receive(r.pinned); });
        std::thread sender([&] { send(r.pinned); });
        clockid_t rx_clock, tx_clock;
        pthread_getcpuclockid(receiver.native_handle(), &rx_clock);
        pthread_getcpuclockid(sender.native_handle(), &tx_clock);
        auto cpu = [](clockid_t c) {
            timespec ts;
            clock_gettime(c, &ts);
            return ts.tv_sec + ts.tv_nsec * 1e-9;
        };

        std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
        const uint64_t rx0 = _received.load(), tx0 = _sent.load(), c0 = _completed.load();
        const uint64_t b0 = _busy.load(), n0 = _batches.load();
        const double rc0 = cpu(rx_clock), tc0 = cpu(tx_clock);
        const auto t0 = clock_type::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        const uint64_t rx1 = _received.load(), tx1 = _sent.load(), c1 = _completed.load();
        const uint64_t b1 = _busy.load(), n1 = _batches.load();
        const double rc1 = cpu(rx_clock), tc1 = cpu(tx_clock);
        const auto t1 = clock_type::now();
        _stop.store(true);
        sender.join();
        _stop_rx.store(true);  // the receiver drains what the kernel still holds, then stops
        receiver.join();

        r.seconds = std::chrono::duration<double>(t1 - t0).count();
        r.received = rx1 - rx0;
        r.sent = tx1 - tx0;
        r.completed = c1 - c0;
        r.sent_total = _sent.load();
        r.received_total = _received.load();
        r.rx_cpu_seconds = rc1 - rc0;
        r.tx_cpu_seconds = tc1 - tc0;
        r.busy_tsc = b1 - b0;
        r.batches = n1 - n0;
        r.error = _error;
        r.drops = _drops;
        return r;
    }

private:
    static constexpr unsigned batch = 64;      // recvmmsg
    static constexpr unsigned send_batch = 64;  // datagrams per sendmmsg
    static constexpr unsigned gso_segments = 32;  // --gso: datagrams per message
    // --gso needs equal segments: parse_options refuses a fragment size that does not divide
    // the image.
    static constexpr unsigned sender_sockets = 4;

    void send(bool pin) {
        if (pin) pin_to(0);
        struct flow {
            int fd;
            uint32_t requests;   // concurrent requests of this socket
            uint64_t next_id;    // id of request 0 of the current round
            uint32_t pos = 0;    // position in the round: fragment-major
        };
        std::vector<flow> flows;
        const unsigned nsock = std::min<unsigned>(sender_sockets, _o.inflight);
        for (unsigned k = 0; k < nsock; ++k) {
            const int fd = socket(AF_INET, SOCK_DGRAM, 0);
            if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&_rx_addr), sizeof _rx_addr) != 0) {
                _error = "sender socket: " + std::string(strerror(errno));
                _stop.store(true);
                return;
            }
            const uint32_t share = _o.inflight / nsock + (k < _o.inflight % nsock ? 1 : 0);
            flows.push_back({fd, share, (uint64_t(k) << 48) + 1});
        }
        // send_batch datagrams per sendmmsg: one per message, or with --gso gso_segments
        // per message (UDP_SEGMENT: the kernel cuts each message into datagrams).
        const unsigned per_msg = _o.gso ? gso_segments : 1;
        const unsigned nmsgs = send_batch / per_msg;
        if (_o.gso) {
            const int seg = int(wire::header_size + _g.payload);
            for (flow& f : flows)
                if (setsockopt(f.fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) != 0) {
                    _error = "UDP_SEGMENT: " + std::string(strerror(errno));
                    _stop.store(true);
                }
        }
        uint8_t headers[send_batch][wire::header_size];
        iovec iov[send_batch][2];
        mmsghdr msgs[send_batch];
        std::memset(msgs, 0, sizeof msgs);
        for (unsigned i = 0; i < send_batch; ++i) iov[i][0] = {headers[i], wire::header_size};
        for (unsigned m = 0; m < nmsgs; ++m) {
            msgs[m].msg_hdr.msg_iov = iov[m * per_msg];
            msgs[m].msg_hdr.msg_iovlen = 2 * per_msg;
        }
        uint64_t sent = 0;
        while (!_stop.load(std::memory_order_relaxed)) {
            for (flow& f : flows) {
                const uint32_t round_len = f.requests * _g.count();
                uint32_t pos = f.pos;
                uint64_t id = f.next_id;
                for (unsigned i = 0; i < send_batch; ++i) {
                    const uint32_t frag = pos / f.requests, req = pos % f.requests;
                    wire::encode(_g.header(id + req, frag), headers[i]);
                    iov[i][1] = {const_cast<uint8_t*>(_image.data()) + frag * _g.payload, _g.length(frag)};
                    if (++pos == round_len) { pos = 0; id += f.requests; }
                }
                const int sent_msgs = sendmmsg(f.fd, msgs, nmsgs, 0);
                if (sent_msgs <= 0) continue;  // ENOBUFS and the like: try again
                // Advance by what was taken.
                const int k = sent_msgs * int(per_msg);
                for (int i = 0; i < k; ++i)
                    if (++f.pos == round_len) { f.pos = 0; f.next_id += f.requests; }
                sent += unsigned(k);
                _sent.store(sent, std::memory_order_relaxed);
            }
        }
        for (flow& f : flows) close(f.fd);
    }

    void receive(bool pin) {
        if (pin) pin_to(1);
        rte_thread_register();  // an lcore id, so that the mbuf pool's per-lcore cache is used
        {
            rx_lane lane("bench_sk" + _tag, _rc, _bench_if, 1);
            receive_loop(lane);
            lane.consume();
            lane.reasm->flush();
            _drops = lane.drops_text();
            // Only losses in the kernel may cost requests here: incomplete ones time out or
            // are evicted. Anything else is a bug.
            for (size_t i = 0; i < dp::drop_reason_count; ++i) {
                const auto why = dp::drop_reason(i);
                if (why != dp::drop_reason::timeout && why != dp::drop_reason::table_full &&
                    lane.counters.drops[i].get())
                    _error += "unexpected drops:" + lane.drops_text() + "; ";
            }
        }
        if (rte_mempool_avail_count(_pool) != _pool->size) _error += "socket path leaked mbufs; ";
        rte_thread_unregister();
    }

    void receive_loop(rx_lane& lane) {
        rte_mbuf* slot[batch];
        mmsghdr msgs[batch];
        iovec iov[batch];
        sockaddr_in from[batch];
        std::memset(msgs, 0, sizeof msgs);
        if (rte_pktmbuf_alloc_bulk(_pool, slot, batch) != 0) {
            _error = "socket path: mbuf pool empty at start";
            _stop.store(true);
            return;
        }
        auto arm = [&](unsigned i) {
            iov[i] = {rte_pktmbuf_mtod(slot[i], void*), rte_pktmbuf_tailroom(slot[i])};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &from[i];
        };
        for (unsigned i = 0; i < batch; ++i) arm(i);
        // A socket has no Ethernet header; create() copies the MACs from udp_view::eth.
        static const uint8_t no_ethernet[RTE_ETHER_HDR_LEN] = {};
        const uint32_t local_ip_be = htonl(INADDR_LOOPBACK);

        uint64_t received = 0, completed = 0, busy = 0, batches = 0;
        for (;;) {
            for (unsigned i = 0; i < batch; ++i) msgs[i].msg_hdr.msg_namelen = sizeof from[i];
            const uint64_t before = rte_rdtsc();
            const int k = recvmmsg(_rx_fd, msgs, batch, MSG_DONTWAIT, nullptr);
            const uint64_t now = rte_rdtsc();
            lane.reasm->expire(now);
            if (k <= 0) {
                if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    _error = "recvmmsg: " + std::string(strerror(errno));
                    _stop.store(true);
                    break;
                }
                if (_stop_rx.load(std::memory_order_relaxed)) break;  // drained
                continue;
            }
            const dp::port_map* map = lane.ifs.current();
            dp::udp_view udps[batch];
            dp::fragment frags[batch];
            uint32_t nf = 0;
            for (int i = 0; i < k; ++i) {
                rte_mbuf* m = slot[i];
                const uint32_t len = msgs[i].msg_len;
                m->data_len = uint16_t(len);
                m->pkt_len = len;
                dp::drop_reason why = dp::drop_reason::none;
                if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) why = dp::drop_reason::truncated;
                dp::udp_view& u = udps[nf];
                u.eth = no_ethernet;
                u.payload = rte_pktmbuf_mtod(m, const uint8_t*);
                u.payload_length = len;
                u.src_ip_be = from[i].sin_addr.s_addr;
                u.dst_ip_be = local_ip_be;
                u.src_port = ntohs(from[i].sin_port);
                u.dst_port = if_port;  // the socket's port stands for the IF's port
                u.vlan_tci_be = 0;
                u.vlan_tagged = false;
                const dp::if_binding* b = nullptr;
                if (why == dp::drop_reason::none) {
                    b = dp::if_table::lookup(map, u.dst_port);
                    if (!b) why = dp::drop_reason::unknown_port;
                }
                if (why == dp::drop_reason::none) why = dp::parse_request(u, frags[nf].view);
                if (why == dp::drop_reason::none) {
                    frags[nf].mbuf = m;
                    frags[nf].udp = &u;
                    frags[nf].if_slot = b->slot;
                    frags[nf].port_id = 0;
                    ++nf;
                    continue;
                }
                lane.counters.drop(why);
                rte_pktmbuf_free(m);
            }
            lane.counters.rx_packets.add(unsigned(k));
            lane.file(map, frags, nf, now);
            lane.ifs.quiescent(1);
            lane.consume();
            // Fresh mbufs for the slots just used.
            if (rte_pktmbuf_alloc_bulk(_pool, slot, unsigned(k)) != 0) {
                // Cannot happen: the pool has room for every entry's fragments and a batch.
                lane.reasm->flush();
                if (rte_pktmbuf_alloc_bulk(_pool, slot, unsigned(k)) != 0) {
                    _error = "socket path: mbuf pool empty";
                    rte_pktmbuf_free_bulk(slot + k, batch - unsigned(k));
                    return;
                }
            }
            for (int i = 0; i < k; ++i) arm(unsigned(i));
            received += unsigned(k);
            completed = lane.consumed;
            busy += rte_rdtsc() - before;
            ++batches;
            _received.store(received, std::memory_order_relaxed);
            _completed.store(completed, std::memory_order_relaxed);
            _busy.store(busy, std::memory_order_relaxed);
            _batches.store(batches, std::memory_order_relaxed);
        }
        rte_pktmbuf_free_bulk(slot, batch);
    }

    const options& _o;
    const fragment_geometry _g;
    std::string _tag;
    bench_if& _bench_if;
    const std::vector<uint8_t> _image;
    dp::reassembly_config _rc;
    rte_mempool* _pool = nullptr;
    int _rx_fd = -1;
    sockaddr_in _rx_addr{};
    std::atomic<bool> _stop{false};     // the sender stops
    std::atomic<bool> _stop_rx{false};  // the receiver stops once the socket is empty
    std::atomic<uint64_t> _received{0}, _sent{0}, _completed{0}, _busy{0}, _batches{0};
    std::string _error, _drops;
};

// EAL on lcore 0, in memory (eal_default_args). Without hugepages, -m only as large as this
// process needs: the bigger of the two paths' mbuf pools (the socket path's holds two
// requests' worth of fragments per request in flight, ~5 KB per fragment of a request: 0.75 MB
// at 147 fragments) plus entries and slack; a sweep sizes it for its smallest fragments.
std::vector<std::string> eal_args(const options& o) {
    std::vector<std::string> a = dp::eal_default_args("0");
    if (o.no_huge && std::find(a.begin(), a.end(), "--no-huge") == a.end()) {
        std::erase(a, std::string("--in-memory"));
        a.insert(a.end(), {"--no-shconf", "--no-huge", "-m", "0"});
    }
    uint32_t most_fragments = o.frag.count();
    if (o.sweep)
        for (uint32_t b : sweep_frag_sizes) most_fragments = std::max(most_fragments, fragment_geometry{b}.count());
    const unsigned mb = std::max(256u, 128u + unsigned(uint64_t(o.inflight) * most_fragments * 5 / 1024));
    if (std::find(a.begin(), a.end(), "--no-huge") != a.end())
        for (size_t i = 0; i + 1 < a.size(); ++i)
            if (a[i] == "-m") a[i + 1] = std::to_string(mb);
    for (size_t i = 0; i + 1 < a.size(); ++i)
        if (a[i] == "--log-level") a[i + 1] = "lib.eal:error";
    return a;
}

// ---------------------------------------------------------------------------------------
// Flood: legitimate requests among partial requests that never complete
//
// The daemon's defaults: a 16383-mbuf rx pool, a 1024-descriptor ring (those mbufs stay
// with the NIC), one queue, watermarks from derive_held_limits, 1024 entries, 100 ms age
// limit. Packets arrive at 10 Mpps of virtual time (so ageing frees nothing within a case):
// each is the next fragment of one of 16 legitimate 147-fragment requests in flight (chosen
// at random), or with probability `flood_share` of one of 16 attacker requests in flight,
// each sent `partial` fragments of partial + 1 and then abandoned. A packet for which the
// pool has no mbuf is lost, as rx_nombuf. The IF stand-in releases complete requests every
// burst. Served: legitimate requests completed / legitimate requests whose every fragment
// was offered.

struct flood_case {
    uint32_t partial;    // fragments the attacker sends of each request
    double flood_share;  // of all packets
};

struct flood_result {
    uint64_t offered = 0;  // legitimate requests fully offered
    uint64_t served = 0;
    uint64_t nombuf = 0;
    uint64_t evicted = 0;  // requests evicted under memory pressure or a full table
    uint64_t packets = 0;
    double served_share() const { return offered ? double(served) / double(offered) : 0; }
};

flood_result run_flood(const flood_case& fc, dp::eviction_order order, uint32_t legit_requests,
                       bench_if& bench_if_) {
    static int seq = 0;
    const std::string name = "bench_fl" + std::to_string(seq++);
    const fragment_geometry g;  // legitimate requests: 147 fragments of 1024 B, whatever --frag-size says
    const dp::port_config port;
    dp::reassembly_config rc;
    rc.eviction = order;
    rc = dp::derive_held_limits(port, rc);
    rte_mempool* pool = rte_pktmbuf_pool_create(name.c_str(), port.rx_mbufs, 256, 0, mbuf_room, SOCKET_ID_ANY);
    if (!pool) throw std::runtime_error("mbuf pool: " + std::string(rte_strerror(rte_errno)));
    std::vector<rte_mbuf*> nic_ring(port.rx_descriptors);
    if (rte_pktmbuf_alloc_bulk(pool, nic_ring.data(), port.rx_descriptors) != 0)
        throw std::runtime_error("mbuf pool too small for the ring");
    flood_result res;
    {
        rx_lane lane(name, rc, bench_if_, 0);
        // Frame templates; the request id (bytes 8..15 of the reefline header) is patched per
        // request: the UDP checksum, which covers it, is not verified in software.
        const std::vector<uint8_t> image = make_image();
        gen::frame_addresses camera;
        camera.src_mac = {{0x02, 0, 0, 0, 0, 0x01}};
        camera.dst_mac = {{0x02, 0, 0, 0, 0, 0x02}};
        camera.src_ip = src_ip;
        camera.dst_ip = dst_ip;
        camera.src_port = 40000;
        camera.dst_port = if_port;
        gen::frame_addresses attacker = camera;
        attacker.src_ip = src_ip + 0x40;
        attacker.src_port = 50000;
        std::vector<std::vector<uint8_t>> legit_frames, flood_frames;
        for (uint32_t f = 0; f < g.count(); ++f) {
            std::vector<uint8_t> udp;
            gen::append_udp_payload(udp, g.header(0, f), {image.data() + f * g.payload, g.length(f)});
            legit_frames.push_back(gen::build_frame(camera, 1, udp));
        }
        constexpr uint32_t flood_payload = 64;
        for (uint32_t f = 0; f < fc.partial; ++f) {
            wire::fields h;
            h.kind = uint8_t(wire::kind::request);
            h.format = uint8_t(wire::format::raw);
            h.frag_index = uint16_t(f);
            h.frag_count = uint16_t(fc.partial + 1);
            h.payload_offset = f * flood_payload;
            h.total_length = (fc.partial + 1) * flood_payload;
            std::vector<uint8_t> udp;
            gen::append_udp_payload(udp, h, {image.data(), flood_payload});
            flood_frames.push_back(gen::build_frame(attacker, 1, udp));
        }
        constexpr uint32_t in_flight = 16;
        struct stream {
            uint64_t id;
            uint32_t next = 0;
            std::vector<uint16_t> order;  // legitimate: fragments in a shuffled order
        };
        gen::rng rng(7, uint64_t(fc.partial) << 8 | uint64_t(fc.flood_share * 100));
        uint64_t next_legit_id = 1, next_flood_id = uint64_t(1) << 40;
        auto shuffled = [&] {
            std::vector<uint16_t> v(g.count());
            for (uint32_t i = 0; i < g.count(); ++i) v[i] = uint16_t(i);
            for (uint32_t i = g.count(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
            return v;
        };
        std::vector<stream> legit(in_flight), flood(in_flight);
        for (auto& s : legit) { s.id = next_legit_id++; s.order = shuffled(); }
        for (auto& s : flood) s.id = next_flood_id++;
        const uint64_t tsc_per_packet = std::max<uint64_t>(1, rte_get_tsc_hz() / 10000000);
        uint64_t now = rte_get_tsc_hz();  // virtual time
        auto patch_id = [](rte_mbuf* m, uint64_t id) {
            const uint64_t be = wire::hton64(id);
            std::memcpy(rte_pktmbuf_mtod(m, uint8_t*) + gen::wire_offset + offsetof(wire::header, request_id_be), &be, 8);
        };
        while (res.offered < legit_requests) {
            rte_mbuf* burst[dp::rx_burst_size];
            uint16_t n = 0;
            for (uint32_t k = 0; k < dp::rx_burst_size; ++k) {
                ++res.packets;
                const bool is_flood = rng.chance(fc.flood_share);
                stream& s = (is_flood ? flood : legit)[rng.below(in_flight)];
                const std::vector<uint8_t>& frame =
                    is_flood ? flood_frames[s.next] : legit_frames[s.order[s.next]];
                const uint64_t id = s.id;
                if (++s.next == (is_flood ? fc.partial : g.count())) {
                    if (!is_flood) ++res.offered;
                    s.next = 0;
                    s.id = is_flood ? next_flood_id++ : next_legit_id++;
                }
                rte_mbuf* m = rte_pktmbuf_alloc(pool);
                if (!m) {
                    ++res.nombuf;
                    continue;
                }
                std::memcpy(rte_pktmbuf_append(m, uint16_t(frame.size())), frame.data(), frame.size());
                patch_id(m, id);
                burst[n++] = m;
            }
            now += tsc_per_packet * dp::rx_burst_size;
            lane.reasm->expire(now);
            lane.queue.process(lane.ifs.current(), burst, n, now, nullptr);
            lane.ifs.quiescent(0);
            void* objs[64];
            while (unsigned k = rte_ring_sc_dequeue_burst(lane.ring, objs, 64, nullptr)) {
                for (unsigned i = 0; i < k; ++i) {
                    auto* r = static_cast<dp::request*>(objs[i]);
                    if (r->key.request_id < (uint64_t(1) << 40)) ++res.served;
                    dp::release(r);
                }
            }
        }
        res.evicted = lane.counters.requests_evicted.get();
    }
    rte_pktmbuf_free_bulk(nic_ring.data(), port.rx_descriptors);
    if (rte_mempool_avail_count(pool) != pool->size) throw std::runtime_error("flood: mbufs leaked");
    rte_mempool_free(pool);
    return res;
}

int run_flood_comparison(const options& o) {
    // Before EAL and minutes of flooding: an unwritable --csv fails now, naming the file.
    std::unique_ptr<report::csv_writer> csv;
    if (!o.csv_path.empty())
        csv = std::make_unique<report::csv_writer>(
            o.csv_path, std::vector<std::string>{"partial_fragments", "flood_share_pct", "eviction", "legit_offered",
                                                 "served_pct", "rx_nombuf", "evicted_requests", "packets"});
    dp::eal_init("dataplane_bench", eal_args(o));
    bench_if bench_if_("bench", 2);
    const dp::reassembly_config limits = dp::derive_held_limits(dp::port_config{}, {});
    std::printf("reefline dataplane_bench --flood: 16 legitimate 147-fragment requests in flight (fragments"
                " shuffled) among 16 partial ones; rx pool 16383, ring 1024, watermarks %u/%u mbufs,"
                " %u legitimate requests per case\n\n",
                limits.held_high, limits.held_low, o.flood_requests);
    std::printf("%-9s %-7s | %-8s %8s %8s %8s | %-8s %8s %8s %8s\n", "partial", "flood", "largest",
                "served", "nombuf", "evicted", "oldest", "served", "nombuf", "evicted");
    std::fflush(stdout);
    const flood_case cases[] = {{1023, 0.5}, {1023, 0.9}, {500, 0.9}, {146, 0.5}, {146, 0.9},
                                {32, 0.5}, {32, 0.9}, {4, 0.9}};
    report::progress progress("dataplane_bench", unsigned(2 * std::size(cases)));
    double worst[2] = {1, 1}, sum[2] = {0, 0};
    for (const flood_case& fc : cases) {
        // The row is printed whole once both orders ran: progress lines on stderr would cut
        // into a row printed piecemeal on a terminal.
        std::string row = strf("%-9u %-7.0f |", fc.partial, fc.flood_share * 100);
        int k = 0;
        for (const auto order : {dp::eviction_order::largest_first, dp::eviction_order::oldest_first}) {
            const char* order_name = order == dp::eviction_order::largest_first ? "largest" : "oldest";
            auto step = progress.begin(strf("flood of %u-fragment partial requests, %.0f%% of packets, %s first",
                                            fc.partial, fc.flood_share * 100, order_name));
            const flood_result r = run_flood(fc, order, o.flood_requests, bench_if_);
            step.result(strf("%.1f%% served", 100 * r.served_share()));
            step.end();
            row += strf(" %-8s %7.1f%% %8llu %8llu |", "", 100 * r.served_share(), (unsigned long long)r.nombuf,
                        (unsigned long long)r.evicted);
            if (csv)
                csv->row({fc.partial, report::csv_cell::fixed(fc.flood_share * 100, 0), order_name, r.offered,
                          report::csv_cell::fixed(100 * r.served_share(), 2), r.nombuf, r.evicted, r.packets});
            worst[k] = std::min(worst[k], r.served_share());
            sum[k] += r.served_share();
            ++k;
        }
        std::printf("%s\n", row.c_str());
        std::fflush(stdout);
    }
    if (csv) csv->commit();
    const double n = double(std::size(cases));
    std::printf("largest_served_mean=%.3f largest_served_min=%.3f oldest_served_mean=%.3f oldest_served_min=%.3f\n",
                sum[0] / n, worst[0], sum[1] / n, worst[1]);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Throughput runs: one configuration (fragment size, round) through both paths

struct measurement {
    fragment_geometry g;
    uint32_t round = 1;
    dpdk_result d;
    std::string dpdk_error;
    dpdk_result harness, parse, timed;  // --breakdown
    double rx_ns = 0, release_ns = 0;
    bool socket = false;
    socket_result s;

    double socket_mpps() const { return socket ? s.mpps() : 0.0; }
    // Image bytes delivered per second (a request's fragments carry exactly its image).
    double payload_gbit_s(double mpps) const { return mpps * 1e6 * double(image_bytes) / g.count() * 8 / 1e9; }
};

measurement measure(const options& o, const fragment_geometry& g, uint32_t round, bench_if& bench_if_,
                    report::progress& progress) {
    measurement m;
    m.g = g;
    m.round = round;
    m.socket = o.socket;
    const std::string config =
        std::to_string(g.payload) + " B fragments" + (o.sweep ? ", round " + std::to_string(round) : "");
    {
        auto step = progress.begin("DPDK path, " + config);
        dpdk_bench b(o, g, bench_if_);
        b.run(stage::full, o.warmup);
        m.d = b.run(stage::full, o.seconds);
        step.result(strf("%.3f Mpps", m.d.mpps()));
        if (o.breakdown) {
            step.end();
            auto parts = progress.begin("DPDK path breakdown, " + config);
            b.run(stage::harness, o.warmup / 2);
            m.harness = b.run(stage::harness, o.seconds / 2);
            b.run(stage::parse, o.warmup / 2);
            m.parse = b.run(stage::parse, o.seconds / 2);
            b.run(stage::full_timed, o.warmup / 2);
            b.rx_tsc = b.release_tsc = 0;
            m.timed = b.run(stage::full_timed, o.seconds / 2);
            const double ns_per_tsc = 1e9 / double(rte_get_tsc_hz());
            m.rx_ns = b.rx_tsc * ns_per_tsc / m.timed.packets;
            m.release_ns = b.release_tsc * ns_per_tsc / m.timed.packets;
            if (b.parse_errors) m.dpdk_error += "parse errors in the parse stage; ";
        }
        m.dpdk_error += b.check();
    }
    if (o.socket) {
        auto step = progress.begin("socket path, " + config);
        socket_bench sb(o, g, bench_if_);
        m.s = sb.run(o.warmup, o.seconds);
        step.result(strf("%.3f Mpps", m.s.mpps()));
    }
    return m;
}

const std::vector<std::string> csv_columns = {
    "path", "path_description", "round", "frag_payload_bytes", "frame_bytes", "frags_per_request", "inflight",
    "seconds", "mpps", "ns_per_packet", "payload_gbit_s", "completed_requests",
    // The measured thread's CPU time over the window: the DPDK lcore, the socket receiver.
    "cpu_share_pct",
    // Socket path only (empty for the DPDK path, which is offered exactly what it processes).
    "offered_mpps", "kernel_lost_pct"};

void csv_rows(report::csv_writer& csv, const options& o, const measurement& m) {
    using report::csv_cell;
    const auto fixed = csv_cell::fixed;
    csv.row({"dpdk", "dpdk (1 lcore, in memory)", m.round, m.g.payload, m.g.frame_bytes(), m.g.count(), o.inflight,
             fixed(m.d.seconds, 3), fixed(m.d.mpps(), 3), fixed(m.d.ns_per_packet(), 1),
             fixed(m.payload_gbit_s(m.d.mpps()), 2), m.d.completed, fixed(100 * m.d.cpu_share(), 1),
             csv_cell::empty(), csv_cell::empty()});
    if (!m.socket) return;
    const socket_result& s = m.s;
    csv.row({"socket", s.pinned ? "socket (loopback, receiver; sender on cpu 0, receiver on cpu 1)"
                                : "socket (loopback, receiver; unpinned, 1 cpu)",
             m.round, m.g.payload, m.g.frame_bytes(), m.g.count(), o.inflight, fixed(s.seconds, 3), fixed(s.mpps(), 3),
             fixed(s.ns_per_packet(), 1), fixed(m.payload_gbit_s(s.mpps()), 2), s.completed,
             fixed(100 * s.rx_cpu_seconds / s.seconds, 1), fixed(s.sent / s.seconds / 1e6, 3),
             fixed(s.sent_total ? 100.0 * double(s.lost()) / double(s.sent_total) : 0.0, 3)});
}

std::unique_ptr<report::csv_writer> open_csv(const options& o) {
    if (o.csv_path.empty()) return nullptr;
    return std::make_unique<report::csv_writer>(o.csv_path, csv_columns);
}

int run(const options& o) {
    // Before EAL and the measurement: an unwritable --csv fails now, naming the file.
    std::unique_ptr<report::csv_writer> csv = open_csv(o);
    const std::vector<std::string> args = eal_args(o);
    const bool huge = std::find(args.begin(), args.end(), "--no-huge") == args.end();
    dp::eal_init("dataplane_bench", args);
    bench_if bench_if_("bench", 2);  // readers: 0 the DPDK lane, 1 the socket receiver

    std::printf("reefline dataplane_bench: %u B fragments of %ux%ux%u u8 images (%u B, %u fragments),"
                " %u requests in flight, bursts of %u, %.2f s per path%s, %s\n",
                o.frag.payload, image_dims[0], image_dims[1], image_dims[2], image_bytes,
                o.frag.count(), o.inflight, dp::rx_burst_size, o.seconds,
                o.nic_cksum ? ", NIC IP checksum" : ", software IP checksum",
                huge ? "hugepages" : "no hugepages (4 KiB pages: TLB misses cost the DPDK path)");
    std::fflush(stdout);

    report::progress progress("dataplane_bench", 1 + (o.breakdown ? 1 : 0) + (o.socket ? 1 : 0));
    const measurement m = measure(o, o.frag, 1, bench_if_, progress);
    const dpdk_result& d = m.d;
    const socket_result& s = m.s;

    std::printf("\n%-30s %10s %12s %12s\n", "path", "Mpps", "ns/packet", "completed");
    std::printf("%-30s %10.3f %12.1f %12llu\n", "dpdk (1 lcore, in memory)", d.mpps(),
                d.ns_per_packet(), (unsigned long long)d.completed);
    if (o.socket)
        std::printf("%-30s %10.3f %12.1f %12llu\n", "socket (loopback, receiver)", s.mpps(),
                    s.ns_per_packet(), (unsigned long long)s.completed);
    std::printf("\nDPDK lcore thread had the CPU %.0f%% of the window (%.3f Mpps per CPU-second)\n",
                100 * d.cpu_share(), d.mpps_per_cpu_second());
    if (d.cpu_share() < 0.9)
        std::printf("WARNING: the core was shared with other processes; Mpps is understated\n");
    if (o.breakdown) {
        std::printf("\nDPDK path breakdown (ns/packet):\n");
        std::printf("  harness (refcnt bump + free)          %6.1f\n", m.harness.ns_per_packet());
        std::printf("  + parse_udp, IF lookup, parse_request %6.1f  (parse: %.1f)\n",
                    m.parse.ns_per_packet(), m.parse.ns_per_packet() - m.harness.ns_per_packet());
        std::printf("  + file_burst, IF ring, release        %6.1f  (reassembly: %.1f)\n",
                    d.ns_per_packet(), d.ns_per_packet() - m.parse.ns_per_packet());
        std::printf("  full path timed apart (%.1f ns/packet in all): poll_rx's steps %.1f,"
                    " IF release() %.1f, refcount bump + loop %.1f\n",
                    m.timed.ns_per_packet(), m.rx_ns, m.release_ns,
                    m.timed.ns_per_packet() - m.rx_ns - m.release_ns);
    }
    if (o.socket) {
        std::printf("\nsocket path (%s%s): sender offered %.3f Mpps, receiver processed %.3f Mpps;"
                    " lost in the kernel %llu of %llu (%.2f%%)\n",
                    s.pinned ? "sender on cpu 0, receiver on cpu 1" : "unpinned, 1 cpu",
                    o.gso ? ", sender with UDP GSO" : "",
                    s.sent / s.seconds / 1e6, s.mpps(), (unsigned long long)s.lost(),
                    (unsigned long long)s.sent_total,
                    s.sent_total ? 100.0 * s.lost() / s.sent_total : 0.0);
        std::printf("  CPU time in the window: receiver %.0f%%, sender %.0f%% (the sender's core also"
                    " runs the kernel's loopback receive path)\n",
                    100 * s.rx_cpu_seconds / s.seconds, 100 * s.tx_cpu_seconds / s.seconds);
        std::printf("  receiver busy %.0f%% of the time, %.1f datagrams per recvmmsg, %.1f ns per"
                    " datagram when busy (%.3f Mpps if never idle)\n",
                    100.0 * s.busy_tsc / double(rte_get_tsc_hz()) / s.seconds,
                    s.batches ? double(s.received) / s.batches : 0.0, s.busy_ns_per_packet(),
                    s.busy_ns_per_packet() > 0 ? 1e3 / s.busy_ns_per_packet() : 0.0);
        std::printf("  receiver drops (incl. requests cut off at the end):%s\n", s.drops.c_str());
    }
    int rc = 0;
    if (!m.dpdk_error.empty()) {
        std::fprintf(stderr, "dataplane_bench: DPDK path check FAILED: %s\n", m.dpdk_error.c_str());
        rc = 1;
    } else {
        std::printf("check: DPDK path completed every request (%llu), no drops, no leaks\n",
                    (unsigned long long)d.completed);
    }
    if (!s.error.empty()) {
        std::fprintf(stderr, "dataplane_bench: socket path FAILED: %s\n", s.error.c_str());
        rc = 1;
    }
    if (csv) {
        csv_rows(*csv, o, m);
        csv->commit();
    }
    const double socket_mpps = m.socket_mpps();
    const double ratio = socket_mpps > 0 ? d.mpps() / socket_mpps : 0.0;
    std::fflush(stderr);
    std::printf("mpps_per_core=%.3f socket_mpps=%.3f ratio=%.2f\n", d.mpps(), socket_mpps, ratio);
    std::fflush(stdout);
    return rc;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// --sweep: both paths at every size of sweep_frag_sizes, `repeat` rounds over the sizes.
int run_sweep(const options& o) {
    std::unique_ptr<report::csv_writer> csv = open_csv(o);
    const std::vector<std::string> args = eal_args(o);
    const bool huge = std::find(args.begin(), args.end(), "--no-huge") == args.end();
    dp::eal_init("dataplane_bench", args);
    bench_if bench_if_("bench", 2);

    constexpr size_t sizes = std::size(sweep_frag_sizes);
    std::printf("reefline dataplane_bench --sweep: fragments of %u..%u B of %ux%ux%u u8 images (%u B),"
                " %u requests in flight, bursts of %u, %.2f s per path and size, %u round(s) over the sizes%s, %s\n",
                sweep_frag_sizes[0], sweep_frag_sizes[sizes - 1], image_dims[0], image_dims[1], image_dims[2],
                image_bytes, o.inflight, dp::rx_burst_size, o.seconds, o.repeat,
                o.nic_cksum ? ", NIC IP checksum" : ", software IP checksum",
                huge ? "hugepages" : "no hugepages (4 KiB pages: TLB misses cost the DPDK path)");
    std::printf("\n%-6s %7s %7s %6s | %10s %10s %6s | %10s %10s %7s | %7s\n", "round", "frag_B", "frame_B", "frags",
                "dpdk_Mpps", "dpdk_Gb/s", "cpu%", "sock_Mpps", "sock_Gb/s", "lost%", "ratio");
    std::fflush(stdout);

    report::progress progress("dataplane_bench", unsigned(o.repeat * sizes * (o.socket ? 2 : 1)));
    std::vector<std::vector<measurement>> by_size(sizes);
    std::string errors;
    for (uint32_t round = 1; round <= o.repeat; ++round) {
        for (size_t i = 0; i < sizes; ++i) {
            const fragment_geometry g{sweep_frag_sizes[i]};
            const measurement m = measure(o, g, round, bench_if_, progress);
            const double sm = m.socket_mpps();
            std::printf("%-6u %7u %7u %6u | %10.3f %10.2f %6.0f | %10.3f %10.2f %7.2f | %7.1f\n", round, g.payload,
                        g.frame_bytes(), g.count(), m.d.mpps(), m.payload_gbit_s(m.d.mpps()), 100 * m.d.cpu_share(), sm,
                        m.payload_gbit_s(sm),
                        m.s.sent_total ? 100.0 * double(m.s.lost()) / double(m.s.sent_total) : 0.0,
                        sm > 0 ? m.d.mpps() / sm : 0.0);
            std::fflush(stdout);
            if (!m.dpdk_error.empty()) errors += strf("DPDK path, %u B, round %u: %s", g.payload, round, m.dpdk_error.c_str());
            if (!m.s.error.empty()) errors += strf("socket path, %u B, round %u: %s", g.payload, round, m.s.error.c_str());
            if (csv) csv_rows(*csv, o, m);
            by_size[i].push_back(m);
        }
    }

    std::printf("\nmedians over %u round(s) [min .. max]\n%-7s %24s %14s %24s %14s %8s\n", o.repeat, "frag_B",
                "dpdk Mpps", "dpdk Gbit/s", "socket Mpps", "socket Gbit/s", "ratio");
    double last_dpdk = 0, last_socket = 0;
    for (size_t i = 0; i < sizes; ++i) {
        std::vector<double> dm, sm;
        for (const measurement& m : by_size[i]) {
            dm.push_back(m.d.mpps());
            sm.push_back(m.socket_mpps());
        }
        const measurement& any = by_size[i].front();
        const double d_med = median(dm), s_med = median(sm);
        std::printf("%-7u %24s %14.2f %24s %14.2f %8.1f\n", any.g.payload,
                    strf("%.3f [%.3f .. %.3f]", d_med, *std::min_element(dm.begin(), dm.end()),
                         *std::max_element(dm.begin(), dm.end())).c_str(),
                    any.payload_gbit_s(d_med),
                    strf("%.3f [%.3f .. %.3f]", s_med, *std::min_element(sm.begin(), sm.end()),
                         *std::max_element(sm.begin(), sm.end())).c_str(),
                    any.payload_gbit_s(s_med), s_med > 0 ? d_med / s_med : 0.0);
        if (any.g.payload == default_frag_payload) {
            last_dpdk = d_med;
            last_socket = s_med;
        }
    }
    int rc = 0;
    if (!errors.empty()) {
        std::fprintf(stderr, "dataplane_bench: check FAILED: %s\n", errors.c_str());
        rc = 1;
    } else {
        std::printf("check: DPDK path completed every request in every configuration, no drops, no leaks\n");
    }
    if (csv) csv->commit();
    // The contract line: the default configuration (1024 B), medians of its rounds.
    const double ratio = last_socket > 0 ? last_dpdk / last_socket : 0.0;
    std::fflush(stderr);
    std::printf("mpps_per_core=%.3f socket_mpps=%.3f ratio=%.2f\n", last_dpdk, last_socket, ratio);
    std::fflush(stdout);
    return rc;
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse_options(argc, argv);
    try {
        const int rc = o.flood ? run_flood_comparison(o) : o.sweep ? run_sweep(o) : run(o);
        dp::eal_cleanup();
        return rc;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dataplane_bench: %s\n", e.what());
        return 1;
    }
}
