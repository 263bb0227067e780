#include "tools/reefgen/pcap_file.h"

#include <pcap/pcap.h>

#include <algorithm>
#include <cmath>
#include <memory>

namespace reefline::reefgen {
namespace {

// Offsets of wire header fields inside the UDP payload (see wire::header).
constexpr size_t off_magic = 0;
constexpr size_t off_version = 4;
constexpr size_t off_frag_index = 16;
constexpr size_t off_frag_count = 18;
constexpr size_t off_payload_offset = 20;
constexpr size_t off_total_length = 24;

// Independent generator streams per purpose and window: a decision of one kind never shifts
// the random sequence of another, so e.g. --dup does not change which fragments --drop removes.
enum stream : uint64_t { s_drop = 1, s_shuffle, s_dup, s_corrupt };
rng stream_rng(uint64_t seed, stream s, uint64_t window) {
    return rng(seed, (uint64_t(s) << 48) ^ window);
}

struct pcap_closer {
    void operator()(pcap_t* p) const { pcap_close(p); }
    void operator()(pcap_dumper_t* d) const { pcap_dump_close(d); }
};

// One fragment to emit: which request of the window, which fragment, and where in the
// window's sequence it goes (copies sort just after the original they follow).
struct slot {
    uint32_t request;
    uint32_t fragment;
    uint64_t order;
    bool copy;
};

}  // namespace

std::string_view to_string(corruption c) {
    switch (c) {
    case corruption::bad_magic: return "bad_magic";
    case corruption::bad_version: return "bad_version";
    case corruption::index_out_of_range: return "index_out_of_range";
    case corruption::offset_out_of_range: return "offset_out_of_range";
    case corruption::udp_length: return "udp_length";
    case corruption::ip_checksum: return "ip_checksum";
    }
    return "unknown";
}

void corrupt_frame(std::vector<uint8_t>& frame, corruption kind, rng& r) {
    uint8_t* w = frame.data() + wire_offset;
    const uint32_t fragment_length =
        static_cast<uint32_t>(frame.size() - wire_offset - wire::header_size);
    switch (kind) {
    case corruption::bad_magic:
        store_be32(w + off_magic, load_be32(w + off_magic) ^ static_cast<uint32_t>(r.next() | 1));
        break;
    case corruption::bad_version:
        w[off_version] = static_cast<uint8_t>(wire::version + 1 + r.below(255));  // never 1
        break;
    case corruption::index_out_of_range: {
        const uint16_t count = load_be16(w + off_frag_count);
        store_be16(w + off_frag_index, static_cast<uint16_t>(count + r.below(65536u - count)));
        break;
    }
    case corruption::offset_out_of_range: {
        const uint32_t total = load_be32(w + off_total_length);
        // Smallest offset that overruns, plus a random excess up to one more total.
        store_be32(w + off_payload_offset, static_cast<uint32_t>(total - fragment_length + 1 +
                                                                 r.below(uint64_t(total) + 1)));
        break;
    }
    case corruption::udp_length: {
        // Larger than the datagram: invalid under every reading. A smaller value would be
        // legal trailing padding to some stacks, and would silently shorten the fragment.
        uint8_t* udp = frame.data() + udp_offset;
        store_be16(udp + 4, static_cast<uint16_t>(load_be16(udp + 4) + 1 + r.below(16)));
        break;
    }
    case corruption::ip_checksum: break;  // below, after the checksums are refreshed
    }
    refresh_checksums(frame);
    if (kind == corruption::ip_checksum) {
        uint8_t* ip = frame.data() + ipv4_offset;
        store_be16(ip + 10, static_cast<uint16_t>(load_be16(ip + 10) ^ (1 + r.below(0xffff))));
    }
}

uint64_t request_id_base(uint64_t seed) {
    // 40 random bits shifted up leaves 2^16 ids per capture before two seeds could overlap,
    // and keeps ids clear of 0 and far below 2^63.
    return ((splitmix64(seed ^ 0x1d5) >> 24) << 16) + 1;
}

pcap_summary write_request_pcap(const pcap_options& o) {
    if (o.requests == 0) throw usage_error("--requests: must be at least 1");
    if (o.sources == 0 || uint64_t(o.addresses.src_port) + o.sources > 65536)
        throw usage_error("--sources: source ports --sport .. --sport+K-1 must fit in 1..65535");
    for (double p : {o.dup, o.drop, o.corrupt})
        if (!(p >= 0 && p <= 1))
            throw usage_error("--dup/--drop/--corrupt: probability must be in [0, 1]");
    if (!(o.pps > 0) || !std::isfinite(o.pps)) throw usage_error("--pps: must be > 0");

    const payload_source source(o.payload);
    // The largest request (--tokens MIN-MAX varies them) must fit the fragment limit before
    // a byte is written, not fail the run half-way through the file.
    check_fragment_plan(source.total_length(), o.frag_size);

    std::unique_ptr<pcap_t, pcap_closer> dead(pcap_open_dead(DLT_EN10MB, 65535));
    if (!dead) throw usage_error("pcap_open_dead failed");
    std::unique_ptr<pcap_dumper_t, pcap_closer> dumper(pcap_dump_open(dead.get(), o.out.c_str()));
    if (!dumper)
        throw usage_error("--out: cannot write '" + o.out + "': " + pcap_geterr(dead.get()));

    pcap_summary sum;
    sum.requests = o.requests;
    sum.first_request_id = request_id_base(o.seed);
    // A fixed epoch keeps the file byte-identical for a given seed.
    constexpr uint64_t epoch_ns = 1'700'000'000ull * 1'000'000'000ull;
    const double ns_per_packet = 1e9 / o.pps;
    uint16_t ip_id = 0;

    std::vector<uint8_t> udp_payload;
    for (uint64_t first = 0; first < o.requests; first += window_requests) {
        const uint64_t window = first / window_requests;
        const uint32_t in_window =
            static_cast<uint32_t>(std::min<uint64_t>(window_requests, o.requests - first));
        std::vector<request_payload> payloads;
        std::vector<std::vector<wire::fields>> plans;
        std::vector<slot> slots;
        rng drop_rng = stream_rng(o.seed, s_drop, window);
        for (uint32_t r = 0; r < in_window; ++r) {
            payloads.push_back(source.make(first + r));
            plans.push_back(
                plan_fragments(payloads.back(), sum.first_request_id + first + r, o.frag_size));
            for (uint32_t f = 0; f < plans.back().size(); ++f) {
                ++sum.fragments;
                if (drop_rng.chance(o.drop)) {
                    ++sum.dropped;
                    continue;
                }
                slots.push_back({r, f, 0, false});
            }
        }
        if (o.shuffle) {
            rng shuffle_rng = stream_rng(o.seed, s_shuffle, window);
            for (size_t i = slots.size(); i > 1; --i)
                std::swap(slots[i - 1], slots[shuffle_rng.below(i)]);
        }
        // Originals keep their positions (2i); a copy goes right after a uniformly chosen
        // original at or after its own position (2j+1), i.e. later within the same window.
        const size_t originals = slots.size();
        rng dup_rng = stream_rng(o.seed, s_dup, window);
        for (size_t i = 0; i < originals; ++i) slots[i].order = 2 * i;
        for (size_t i = 0; i < originals; ++i) {
            if (!dup_rng.chance(o.dup)) continue;
            const size_t j = i + dup_rng.below(originals - i);
            slot copy = slots[i];
            copy.order = 2 * j + 1;
            copy.copy = true;
            slots.push_back(copy);
            ++sum.duplicated;
        }
        std::stable_sort(slots.begin(), slots.end(),
                         [](const slot& a, const slot& b) { return a.order < b.order; });

        rng corrupt_rng = stream_rng(o.seed, s_corrupt, window);
        for (const slot& s : slots) {
            const wire::fields& f = plans[s.request][s.fragment];
            const std::span<const uint8_t> bytes(
                payloads[s.request].bytes.data() + f.payload_offset,
                fragment_length(f, o.frag_size));
            udp_payload.clear();
            append_udp_payload(udp_payload, f, bytes);
            frame_addresses a = o.addresses;
            a.src_port =
                static_cast<uint16_t>(o.addresses.src_port + (first + s.request) % o.sources);
            std::vector<uint8_t> frame = build_frame(a, ip_id++, udp_payload);
            if (corrupt_rng.chance(o.corrupt)) {
                const auto kind = static_cast<corruption>(corrupt_rng.below(corruption_kinds));
                corrupt_frame(frame, kind, corrupt_rng);
                ++sum.corrupted;
                ++sum.by_corruption[static_cast<size_t>(kind)];
            }
            const uint64_t t =
                epoch_ns + static_cast<uint64_t>(std::llround(double(sum.packets) * ns_per_packet));
            pcap_pkthdr h{};
            h.ts.tv_sec = static_cast<time_t>(t / 1'000'000'000ull);
            h.ts.tv_usec = static_cast<suseconds_t>((t % 1'000'000'000ull) / 1000);
            h.caplen = h.len = static_cast<bpf_u_int32>(frame.size());
            pcap_dump(reinterpret_cast<u_char*>(dumper.get()), &h, frame.data());
            ++sum.packets;
        }
    }
    if (pcap_dump_flush(dumper.get()) != 0 || ferror(pcap_dump_file(dumper.get())))
        throw usage_error("--out: write error on '" + o.out + "'");
    return sum;
}

void for_each_frame(const std::string& path, std::string_view what,
                    const std::function<void(std::span<const uint8_t>, bool)>& frame) {
    char errbuf[PCAP_ERRBUF_SIZE] = "";
    std::unique_ptr<pcap_t, pcap_closer> p(pcap_open_offline(path.c_str(), errbuf));
    if (!p) throw usage_error(std::string(what) + ": cannot read '" + path + "': " + errbuf);
    if (pcap_datalink(p.get()) != DLT_EN10MB)
        throw usage_error(std::string(what) + ": '" + path + "' is not an Ethernet capture");
    for (;;) {
        pcap_pkthdr* h = nullptr;
        const u_char* data = nullptr;
        const int rc = pcap_next_ex(p.get(), &h, &data);
        if (rc == PCAP_ERROR_BREAK) break;  // end of file
        if (rc != 1)
            throw usage_error(std::string(what) + ": '" + path +
                              "' is damaged: " + pcap_geterr(p.get()));
        frame(std::span<const uint8_t>(data, h->caplen), h->caplen >= h->len);
    }
}

}  // namespace reefline::reefgen
