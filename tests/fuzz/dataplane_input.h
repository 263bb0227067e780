// The input language of fuzz_dataplane, shared with the seed writer (write_seeds.cc).
//
// An input is a sequence of records:
//   0xff  T_hi T_lo             the clock advances by T * 10 us (ageing), then rx is polled
//   F     L_hi L_lo  L bytes    a frame of L bytes (at most max_frame) put on the rx ring
// where F (any value but 0xff) says how the frame arrives:
//   bit 0     fix its IPv4 header checksum (and nothing else), so that the fuzzer reaches past it
//   bits 1-2  the NIC's IPv4 checksum flag: 0 none, 1 good, 2 bad, 3 none
//   bits 3-4  the NIC's L4 checksum flag: 0 none, 1 good, 2 bad, 3 none
//   bit 5     split across two chained mbufs (a multi-segment frame)
//   bit 6     poll rx after it (the end of a burst)
// Bit 7 of the input's first byte picks the plane that receives it: set, the one that evicts
// the oldest incomplete requests first, else the largest first. A record cut short by the end
// of the input ends it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace reefline::fuzz {

inline constexpr uint8_t advance_clock = 0xff;
inline constexpr uint8_t fix_ip_checksum = 0x01;
inline constexpr uint8_t ip_good = 0x02, ip_bad = 0x04;
inline constexpr uint8_t l4_good = 0x08, l4_bad = 0x10;
inline constexpr uint8_t two_segments = 0x20;
inline constexpr uint8_t end_of_burst = 0x40;
inline constexpr uint8_t oldest_first = 0x80;
inline constexpr uint32_t max_frame = 2048;

inline void append_frame(std::vector<uint8_t>& input, uint8_t flags, std::span<const uint8_t> frame) {
    input.push_back(flags);
    input.push_back(uint8_t(frame.size() >> 8));
    input.push_back(uint8_t(frame.size()));
    input.insert(input.end(), frame.begin(), frame.end());
}

inline void append_advance(std::vector<uint8_t>& input, uint16_t units_of_10us) {
    input.push_back(advance_clock);
    input.push_back(uint8_t(units_of_10us >> 8));
    input.push_back(uint8_t(units_of_10us));
}

}  // namespace reefline::fuzz
