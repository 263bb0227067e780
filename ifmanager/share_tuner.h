// GSLICE's self-tuning shares, as pure functions the IF manager drives (and tests check on
// crafted inputs): where an IF's knee is, whether an IF wants a larger or smaller share from
// what it saw over the last window, and how the device's compute units are divided when the
// demands exceed them (max-min fairness).
//
// Residuals, as GSLICE's Algorithm 1 uses them: residual latency is the SLO minus the part of
// the latency the share decides, a batch's time on the device (the rest is the batching
// controller's choice: SLAB waits for larger batches while the SLO allows, so end-to-end
// latency near the SLO says nothing about the share); residual throughput is what the IF's BE
// lane could serve at its share minus what arrived, read from how busy the lane was (one
// batch in flight per lane, so a lane busy all the time cannot serve more). Requests answered
// late or shed say the share is short whatever the residuals. A share grows while either is
// short and shrinks while both are ample; in between it holds, so that a tuned share does not
// oscillate.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dkp/profile.h"

namespace reefline::ifm {

// Fraction of the best throughput on the curve at which the knee lies: the smallest share
// within 10% of what the whole device gives.
inline constexpr double knee_throughput_fraction = 0.9;

// The units of the knee of `c` (the smallest point whose throughput, batch / ms, reaches
// knee_throughput_fraction of the curve's best); 0 for an empty curve.
uint32_t knee_units(const dkp::knee_curve& c);

// The unit counts a knee measurement samples on a device of n units: at most `points`,
// spread evenly, always 1 and n, ascending.
std::vector<uint32_t> knee_samples(uint32_t n, uint32_t points = 8);

// What an IF did over one tuning window (differences of its counters).
struct share_window {
    double seconds = 0;
    uint64_t arrived = 0;    // requests that reached the IF
    uint64_t answered = 0;   // with a result
    uint64_t late = 0;       // answered past the SLO, or shed as overloaded
    double service_ms = 0;   // mean time a BE batch was on the device
    double busy = 0;         // fraction of the window the BE lane had a batch on the device
    uint32_t queued = 0;     // waiting at the window's end
    double slo_ms = 0;
};

// +1: the IF wants one more unit (latency or throughput residual short), -1: one fewer (both
// ample), 0: hold.
int share_step(const share_window& w);

// Max-min fair division of `capacity` units among `demands` (each at least 1 unit): every
// demand that fits in an equal split is met, the rest share what remains equally, earlier
// entries taking the odd units. With capacity below the number of demands, each still gets 1
// (shares then overlap, as an over-committed device must).
std::vector<uint32_t> max_min_fair(std::span<const uint32_t> demands, uint32_t capacity);

}  // namespace reefline::ifm
