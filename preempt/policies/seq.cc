// seq: one task at a time on the whole device, RT first, BE vHQs in turn; a running task is
// never preempted (an RT arrival waits for it).
#include "preempt/policy.h"

namespace reefline::gpu {
namespace {

class seq_policy final : public scheduling_policy {
public:
    using scheduling_policy::scheduling_policy;

    bool step() override {
        vhq* cur = nullptr;
        for (vhq* q : all_queues())
            if (q->cur) cur = q;
        if (cur && check_done(*cur)) cur = nullptr;
        if (!cur) {
            cur = next_queue();
            if (cur) {
                record* r = cur->waiting.front();
                cur->waiting.pop_front();
                start_task(*cur, r);
                if (check_done(*cur)) return true;
            }
        }
        if (cur) pump(*cur);
        bool busy = false;
        for (vhq* q : all_queues()) busy = busy || q->cur || !q->waiting.empty();
        return busy;
    }

private:
    // The RT vHQ when a task waits there, else the next BE vHQ with one (round robin).
    vhq* next_queue() {
        if (!rt().waiting.empty()) return &rt();
        const auto& qs = be();
        for (uint32_t i = 0; i < qs.size(); ++i) {
            vhq& q = *qs[(_rr + i) % qs.size()];
            if (!q.waiting.empty()) {
                _rr = static_cast<uint32_t>((_rr + i + 1) % qs.size());
                return &q;
            }
        }
        return nullptr;
    }

    uint32_t _rr = 0;  // the BE vHQ to look at first
};

}  // namespace

std::unique_ptr<scheduling_policy> make_seq_policy(scheduler& s) { return std::make_unique<seq_policy>(s); }

}  // namespace reefline::gpu
