// reefgen: pcap files. `reefgen pcap` writes request traffic, optionally reordered, thinned,
// duplicated and corrupted in deterministic ways, for replay into reefline (net_pcap,
// tcpreplay) and for `reefgen check`, which reads captures back with for_each_frame().
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tools/reefgen/common.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace reefline::reefgen {

// Every corruption makes a single packet detectably invalid on its own: a receiver rejects it
// before it touches any reassembly entry. None alters total_length, frag_count, format or dims
// of a fragment that would otherwise pass, which could poison an entry instead.
enum class corruption : uint8_t {
    bad_magic,
    bad_version,
    index_out_of_range,   // frag_index >= frag_count
    offset_out_of_range,  // payload_offset + fragment length > total_length
    udp_length,           // UDP length larger than the datagram (checksum still correct)
    ip_checksum,          // IPv4 header checksum wrong
};
inline constexpr size_t corruption_kinds = 6;
std::string_view to_string(corruption c);

// Applies `kind` to a frame that build_frame() made around a valid request fragment.
void corrupt_frame(std::vector<uint8_t>& frame, corruption kind, rng& r);

// The first request id for a seed; request n carries base + n. Derived from the seed (not 1)
// so that captures made with different seeds can be replayed into one running reefline
// without their reassembly entries colliding.
uint64_t request_id_base(uint64_t seed);

struct pcap_options {
    std::string out;
    uint64_t requests = 1;
    uint32_t frag_size = 1024;
    payload_options payload;
    frame_addresses addresses;  // src_port is the first source port
    uint32_t sources = 1;       // requests round-robin over src_port .. src_port+sources-1
    uint64_t seed = 1;
    bool shuffle = false;
    double dup = 0;
    double drop = 0;
    double corrupt = 0;
    double pps = 1e6;  // pcap timestamps are spaced 1/pps apart
};

struct pcap_summary {
    uint64_t requests = 0;
    uint64_t fragments = 0;  // fragments the requests were cut into
    uint64_t packets = 0;    // frames written
    uint64_t dropped = 0;
    uint64_t duplicated = 0;
    uint64_t corrupted = 0;
    std::array<uint64_t, corruption_kinds> by_corruption{};
    uint64_t first_request_id = 0;
};

// Requests are processed in windows of this many: --shuffle interleaves fragments of the
// requests of one window, and --dup places each copy later within its window.
inline constexpr uint32_t window_requests = 16;

pcap_summary write_request_pcap(const pcap_options& options);  // throws usage_error

// Calls `frame` for every record of an Ethernet pcap file. `complete` is false for records
// captured shorter than they were on the wire. Throws usage_error if the file cannot be
// opened, is not Ethernet, or is damaged; `what` names the option for the message.
void for_each_frame(
    const std::string& path, std::string_view what,
    const std::function<void(std::span<const uint8_t> frame, bool complete)>& frame);

}  // namespace reefline::reefgen
