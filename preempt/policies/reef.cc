// reef: REEF's reset-based preemption (scheduler.h). An RT task waiting switches the scheduler
// to real-time mode: every BE vHQ is preempted (its queued launches evicted, running blocks
// stopped at a check point, or, preempt_mode::wait, drained), the RT task runs (its launches
// padded with BE kernels when DKP is on), and when no RT work is left the BE vHQs restore and
// run again. rt_only is the same loop with every BE task rejected: the RT latency reference.
#include "preempt/policy.h"

namespace reefline::gpu {
namespace {

// Anything on the RT vHQ, running or waiting.
bool rt_busy(const scheduler::vhq& q) { return q.cur || !q.waiting.empty(); }

class reef_policy : public scheduling_policy {
public:
    using scheduling_policy::scheduling_policy;

    bool step() override {
        vhq& q_rt = rt();
        if (rt_busy(q_rt) && !_rt_mode) {
            _rt_mode = true;
            count([](scheduler_stats& s) { ++s.rt_episodes; });
            for (auto& q : be()) preempt(*q);
        }
        if (_rt_mode) run_rt(q_rt);
        if (!_rt_mode) run_be();
        bool busy = rt_busy(q_rt);
        for (auto& q : be()) busy = busy || q->cur || !q->waiting.empty();
        return busy;
    }

private:
    void run_rt(vhq& q_rt) {
        check_done(q_rt);
        if (!q_rt.cur && !q_rt.waiting.empty()) {
            bool go = true;
            if (opt().preempt == preempt_mode::wait)
                for (auto& q : be())
                    if (q->st == vhq::state::preempted && !dev().event_query(q->drain)) go = false;
            if (go) {
                record* r = q_rt.waiting.front();
                q_rt.waiting.pop_front();
                start_task(q_rt, r);  // (pumps unpadded; the pump below pads what is left)
            }
        }
        if (opt().padding)
            pump_padded(q_rt);
        else
            pump(q_rt);
        if (!rt_busy(q_rt)) _rt_mode = false;
    }

    void run_be() {
        for (auto& qp : be()) {
            vhq& q = *qp;
            if (q.st == vhq::state::preempted) try_restore(q);
            if (q.st == vhq::state::running) {
                check_done(q);
                pump(q);
            }
            if (q.st == vhq::state::idle && !q.waiting.empty()) {
                record* r = q.waiting.front();
                q.waiting.pop_front();
                start_task(q, r);
            }
        }
    }

    bool _rt_mode = false;  // an RT task is in progress: BE vHQs stay preempted
};

class rt_only_policy final : public reef_policy {
public:
    using reef_policy::reef_policy;
    bool take(record* r) override {
        if (r->t.cls == task_class::rt) return false;
        finish(r, task_status::rejected);
        return true;
    }
};

}  // namespace

std::unique_ptr<scheduling_policy> make_reef_policy(scheduler& s) { return std::make_unique<reef_policy>(s); }
std::unique_ptr<scheduling_policy> make_rt_only_policy(scheduler& s) { return std::make_unique<rt_only_policy>(s); }

}  // namespace reefline::gpu
