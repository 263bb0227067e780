// streams: every vHQ runs its tasks back to back on its own stream, concurrently with the
// others (the RT stream at the highest priority); nothing is ever preempted.
#include "preempt/policy.h"

namespace reefline::gpu {
namespace {

class streams_policy final : public scheduling_policy {
public:
    using scheduling_policy::scheduling_policy;

    bool step() override {
        bool busy = false;
        for (vhq* q : all_queues()) {
            check_done(*q);
            if (q->st == vhq::state::idle && !q->waiting.empty()) {
                record* r = q->waiting.front();
                q->waiting.pop_front();
                start_task(*q, r);
            }
            pump(*q);
            busy = busy || q->cur || !q->waiting.empty();
        }
        return busy;
    }
};

}  // namespace

std::unique_ptr<scheduling_policy> make_streams_policy(scheduler& s) { return std::make_unique<streams_policy>(s); }

}  // namespace reefline::gpu
