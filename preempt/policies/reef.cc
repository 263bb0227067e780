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
                start_task(q_rt, r, /*pump_now=*/false);  // pumped below, padded when DKP is on
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

    // DKP: the RT vHQ's pump with padding. Each RT launch, as it is issued, gets up to four BE
    // kernels that the selector (opt().padding, REEF's rules) picks from what the preempted BE
    // tasks offer, launched beside it on the units it leaves idle.
    void pump_padded(vhq& rt) {
        if (rt.st != vhq::state::running || !rt.pending) return;
        std::vector<launch>& p = *rt.pending;
        const uint32_t units = dev().caps().compute_units;
        constexpr uint32_t max_pads = 4;
        try {
            while (rt.head < p.size()) {
                const uint32_t done = rt.w->completed.load(std::memory_order_acquire);
                if (rt.submitted - done >= rt.cap) break;
                const launch& l = p[rt.head];
                const task_launch& rk = rt.cur->t.launches[l.kernel_index];
                // Offers: each preempted BE task whose stream has drained and whose pads have all
                // ended offers its next kernel: beside the pad it last got, if that pad's RT launch
                // has not ended yet, else where its counter stands.
                pad_candidate cand[16];
                vhq* owner[16];
                uint32_t next_kernel[16];
                uint32_t n = 0;
                const int64_t t0 = now_ns();
                for (const auto& qp : be()) {
                    vhq& q = *qp;
                    // A BE task waiting at the head of its queue offers its first kernel: it starts
                    // as if preempted before its first launch (REEF pads from the queues' heads).
                    if (q.st == vhq::state::idle && !q.waiting.empty() && q.waiting.front()->t.units == 0) {
                        record* r = q.waiting.front();
                        q.waiting.pop_front();
                        q.cur = r;
                        if (r->res.start_ns == 0) r->res.start_ns = now_ns();
                        lower_flag(q);
                        q.w->completed.store(0, std::memory_order_seq_cst);
                        q.pending.reset();
                        q.head = 0;
                        q.submitted = 0;
                        q.pad_pending = false;
                        dev().event_record(q.drain, q.s);
                        q.st = vhq::state::preempted;
                    }
                    if (n == std::size(cand) || q.st != vhq::state::preempted || !q.cur || q.cur->t.units) continue;
                    uint32_t k;
                    const bool rode_ahead = q.pad_pending && q.pad_rt_task == rt.cur && done <= q.pad_rt_kernel;
                    if (rode_ahead) {
                        // Its last pad rides a launch that has not ended: the next kernel if that
                        // pad has started (it will likely complete), else the same one again (an
                        // RT kernel may end before a unit takes its pad; a copy of a pad that did
                        // complete is skipped by the device).
                        const bool started = q.w->completed.load(std::memory_order_acquire) > q.pad_kernel ||
                                             q.w->pads_running.load(std::memory_order_acquire) != 0;
                        k = started ? q.pad_kernel + 1 : q.pad_kernel;
                    } else {
                        if (q.w->pads.load(std::memory_order_acquire) != 0) continue;
                        if (!dev().event_query(q.drain)) continue;
                        k = q.w->completed.load(std::memory_order_acquire);
                    }
                    if (k >= q.cur->t.launches.size()) continue;
                    cand[n] = {&q.cur->t.launches[k], uint32_t(&qp - be().data())};
                    owner[n] = &q;
                    next_kernel[n] = k;
                    ++n;
                }
                uint32_t chosen[max_pads];
                const uint32_t m = n ? opt().padding->select(rk, units, cand, n, chosen, max_pads) : 0;
                const int64_t sel_ns = now_ns() - t0;
                launch pads[max_pads];
                for (uint32_t i = 0; i < m; ++i) {
                    vhq& q = *owner[chosen[i]];
                    const task_launch& k = *cand[chosen[i]].kernel;
                    pads[i] = launch{k.kernel, k.args.empty() ? nullptr : k.args.data(), static_cast<uint32_t>(k.args.size()),
                                     k.grid, 0, k.grid, q.w, next_kernel[chosen[i]]};
                    q.pad_pending = true;
                    q.pad_kernel = next_kernel[chosen[i]];
                    q.pad_rt_task = rt.cur;
                    q.pad_rt_kernel = l.kernel_index;
                }
                if (m) dev().launch_padded(rt.s, l, pads, m);
                else dev().launch(rt.s, l);
                ++rt.head;
                ++rt.submitted;
                if (n)
                    count([&](scheduler_stats& s) {
                        ++s.select_count;
                        s.select_ns_sum += uint64_t(sel_ns);
                        size_t b = 0;
                        while (b < std::size(select_ns_buckets) && sel_ns > int64_t(select_ns_buckets[b])) ++b;
                        ++s.select_ns_hist[b];
                        if (m) {
                            ++s.padded_launches;
                            s.pads_issued += m;
                        }
                    });
            }
        } catch (const std::exception&) {
            fail_launches(rt);
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
