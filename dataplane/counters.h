// Data-plane counters: every drop reason has its own, per rx lcore, single writer.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace reefline::dp {

// Packet drop reasons, each counted in packets (one packet is dropped for one reason only).
// The X-macro keeps the enum, the counter names in JSON, the Prometheus label values,
// docs/protocol.md's table and the alert rules' groups (deploy/k8s, checked by metrics_test) in
// step. Each reason's kind says who should care:
// - capacity: a request lost for lack of room or time (alert: requests are being lost);
// - stray: traffic not meant for reefline, expected on a shared link (no alert);
// - malformed: a broken or hostile sender (alert above a rate).
#define REEFLINE_DROP_REASONS(X)                                                                      \
    X(not_ipv4, stray, "not Ethernet/IPv4 (other ethertype, or more than one VLAN tag)")              \
    X(not_udp, stray, "IPv4 but not UDP")                                                             \
    X(ip_fragment, malformed, "IPv4 fragment (reefline fragments at the application layer instead)")  \
    X(bad_ip, malformed, "IPv4 version, header length or header checksum wrong")                      \
    X(truncated, malformed, "frame shorter than the headers it announces")                            \
    X(multi_segment, malformed, "frame spans several mbufs (jumbo frame larger than the mbuf room)")  \
    X(bad_length, malformed, "IPv4 total length and UDP length disagree")                             \
    X(bad_checksum, malformed, "the NIC reported a bad IPv4 or UDP checksum")                         \
    X(bad_source, malformed, "a source that must not be answered: IPv4 0.0.0.0, broadcast, multicast " \
                  "or class E, UDP port 0, or a multicast/broadcast Ethernet address")                \
    X(bad_destination, stray, "IPv4 destination 0.0.0.0, broadcast (limited or the subnet's), "       \
                       "multicast or class E: a reply cannot come from it")                           \
    X(unknown_port, stray, "no IF listens on the UDP destination port")                               \
    X(bad_header, malformed, "reefline magic, version, kind, format, status or reserved field wrong") \
    X(zero_length, malformed, "total length 0 or an empty fragment")                                  \
    X(too_large, malformed, "total length above the protocol limit")                                  \
    X(too_many_fragments, malformed, "fragment count 0 or above the limit, or index >= count")        \
    X(offset_out_of_range, malformed, "payload offset + fragment length beyond the total length")     \
    X(dims_mismatch, malformed, "dimensions do not describe the total length for the format")         \
    X(inconsistent, malformed, "disagrees with its request's other fragments, or offsets do not tile") \
    X(duplicate, malformed, "a fragment index that the request already has")                          \
    X(timeout, capacity, "held by a request that did not complete within the age limit")              \
    X(table_full, capacity, "held by the oldest request, evicted to make room for a new one")         \
    X(memory_pressure, capacity, "held by an incomplete request evicted because incomplete requests " \
                       "held more mbufs than the high watermark")                                     \
    X(no_entry, capacity, "no reassembly entry free and none to evict (all waiting on IF queues)")    \
    X(ring_full, capacity, "held by a complete request whose IF queue was full")

enum class drop_kind : uint8_t { capacity, stray, malformed };

enum class drop_reason : uint8_t {
#define X(name, kind, text) name,
    REEFLINE_DROP_REASONS(X)
#undef X
    count,
    none = count,
};
inline constexpr size_t drop_reason_count = static_cast<size_t>(drop_reason::count);

inline constexpr std::array<std::string_view, drop_reason_count> drop_reason_names = {
#define X(name, kind, text) #name,
    REEFLINE_DROP_REASONS(X)
#undef X
};

// What each reason means, as docs/protocol.md's table says it.
inline constexpr std::array<std::string_view, drop_reason_count> drop_reason_texts = {
#define X(name, kind, text) text,
    REEFLINE_DROP_REASONS(X)
#undef X
};

inline constexpr std::array<drop_kind, drop_reason_count> drop_reason_kinds = {
#define X(name, kind, text) drop_kind::kind,
    REEFLINE_DROP_REASONS(X)
#undef X
};

// A counter with one writer (its lcore) and any number of readers, free of torn values. The
// writer's stores are releases and readers' loads acquires (plain moves on x86), so a reader
// that sees an increment also sees every increment the writer made before it: the rx lcore
// counts a burst in rx_packets before it counts any drop from it, and a snapshot reads the
// drops first, so a snapshot never shows more drops than received packets.
struct counter {
    std::atomic<uint64_t> _value{0};
    void add(uint64_t n = 1) {
        _value.store(_value.load(std::memory_order_relaxed) + n, std::memory_order_release);
    }
    uint64_t get() const { return _value.load(std::memory_order_acquire); }
};

// The data plane's counters, each declared once: its name (the struct member, the `stats` key
// and, as reefline_dataplane_<name>_total, the Prometheus counter) and its help text. A counter
// added here reaches stats, Prometheus and the docs' metric list without another edit.
// Written by the rx lcores.
#define REEFLINE_RX_COUNTERS(X)                                                                 \
    X(rx_packets, "Packets polled by the data plane.")                                         \
    X(rx_bytes, "Bytes polled by the data plane.")                                             \
    X(requests_started, "Requests whose first fragment arrived.")                              \
    X(requests_completed, "Requests fully reassembled and handed to an IF.")                  \
    X(requests_timed_out, "Requests abandoned because fragments stopped arriving.")           \
    X(requests_evicted, "Partial requests evicted to make room for new ones.")                 \
    X(requests_malformed, "Requests with inconsistent fragments.")                             \
    X(requests_ring_full, "Complete requests dropped because the IF's ring was full.")        \
    X(arp_replies, "ARP requests answered.")

// Written by the tx poller.
#define REEFLINE_TX_COUNTERS(X)                                                                 \
    X(tx_packets, "Packets queued for transmission.")                                          \
    X(tx_bytes, "Bytes queued for transmission.")                                              \
    X(tx_dropped, "Packets the port would not take for transmission.")

struct counter_info {
    std::string_view name;
    std::string_view help;
};
// The rx counters, then the tx ones (the order of `stats`).
inline constexpr counter_info dataplane_counter_infos[] = {
#define X(name, help) {#name, help},
    REEFLINE_RX_COUNTERS(X) REEFLINE_TX_COUNTERS(X)
#undef X
};

// Written by the IF that answers requests (one consumer per IF).
#define REEFLINE_IF_COUNTERS(X) \
    X(requests_served) X(responses_sent) X(responses_failed) X(error_responses)

struct alignas(64) rx_counters {
#define X(name, help) counter name;
    REEFLINE_RX_COUNTERS(X)
#undef X
    std::array<counter, drop_reason_count> drops;
    void drop(drop_reason r, uint64_t packets = 1) { drops[static_cast<size_t>(r)].add(packets); }
};

struct alignas(64) tx_counters {
#define X(name, help) counter name;
    REEFLINE_TX_COUNTERS(X)
#undef X
};

struct alignas(64) if_counters {
#define X(name) counter name;
    REEFLINE_IF_COUNTERS(X)
#undef X
};

// A plain-value sum over lcores, for printing.
struct counter_snapshot {
#define X(name, ...) uint64_t name = 0;
    REEFLINE_RX_COUNTERS(X)
    REEFLINE_TX_COUNTERS(X)
    REEFLINE_IF_COUNTERS(X)
#undef X
    std::array<uint64_t, drop_reason_count> drops{};

    void add(const rx_counters& c);
    void add(const tx_counters& c);
    void add(const if_counters& c);
    uint64_t drops_total() const;
    // One-line JSON object: every counter, one key per drop reason as "drop_<reason>".
    std::string to_json() const;
};

}  // namespace reefline::dp
