// DKP's selection (REEF §5.2), behind the scheduler's pad_selector interface: before an RT
// kernel launches, reserve the compute units it needs, then fill the rest greedily from the
// heads of the BE queues with the kernels that pass
//   rule 1: the BE kernel, on the units it would get, takes no longer than the RT kernel (so
//           padding never prolongs the RT kernel: the device cuts a pad at the RT kernel's
//           end, and a pad that would be cut is work thrown away);
//   rule 2: the BE kernel's occupancy is at least the RT kernel's (a padded launch runs with
//           one block configuration; a BE kernel that fits fewer blocks per unit would lower
//           the RT kernel's).
// A kernel without a profile (est_us 0) is never padded and never padded with. No allocation,
// no lock: one pass over the candidates (< 1 us, measured by the scheduler).
#pragma once

#include "preempt/scheduler.h"

namespace reefline::dkp {

class rules_selector final : public gpu::pad_selector {
public:
    // Rule 1 with a margin: a BE kernel is padded only if its time on the units it gets is
    // at most `margin` x the RT kernel's (a profile is taken alone; next to an RT kernel a pad
    // runs slower, and one still running when the RT kernel ends is cut and wasted).
    explicit rules_selector(double margin = 1.0) : _margin(margin) {}

    uint32_t select(const gpu::task_launch& rt, uint32_t units, const gpu::pad_candidate* candidates, uint32_t n,
                    uint32_t* out, uint32_t max) override;

    // The time of `be` on `units_given` of a device of `units` compute units: its profiled time
    // (all units) scaled by its waves (ceil(grid / units held)).
    static double time_on(const gpu::task_launch& be, uint32_t units_given, uint32_t units);
    // The units `rt` occupies: its blocks, up to the device's units.
    static uint32_t units_of(const gpu::task_launch& rt, uint32_t units);

private:
    double _margin;
};

}  // namespace reefline::dkp
