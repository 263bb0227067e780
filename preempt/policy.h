// The scheduling-policy interface, internal to the scheduler (preempt/scheduler.cc and
// preempt/policies/*.cc; nothing outside preempt/ includes it).
//
// The scheduler owns the mechanics: the vHQs (a stream, its task words and the launches not yet
// submitted), intake, starting, pumping, preempting and restoring tasks, reclamation and
// statistics (DKP's padding is reef's: preempt/policies/reef.cc). A policy decides: where an arriving task goes (take) and, on each pass of the
// scheduler thread, which vHQs start, run, stop or resume (step). It runs on the scheduler
// thread only, through the operations below.
//
// Adding a policy touches three files (preempt/policy_registry.h says which). Every program's
// --policy, their help, the docs check and the scheduler's randomized test then have it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "preempt/scheduler.h"

namespace reefline::gpu {

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

struct scheduler::record {
    task t;
    task_result res;
    double tokens = 0;  // prema
    // abacus: the first launch not yet run (where its next segment starts), and the profiles'
    // times summed up to each launch (est_prefix[i]: launches [0, i)).
    uint32_t next = 0;
    std::vector<double> est_prefix;
};

struct scheduler::vhq {
    // parked (abacus): holds a query between its segments; nothing of it is on the stream.
    enum class state : uint8_t { idle, running, preempted, parked };
    stream* s = nullptr;
    task_words* w = nullptr;
    event* drain = nullptr;
    uint32_t cap = 4;
    std::deque<record*> waiting;
    record* cur = nullptr;
    state st = state::idle;
    std::unique_ptr<std::vector<launch>> pending;  // launches not yet submitted
    size_t head = 0;                               // next entry of *pending
    uint32_t submitted = 0;                        // kernels submitted (index of the next + 0)
    uint32_t seg_end = 0;                          // abacus: the end of the segment it runs
    uint64_t units = 0;                            // what its stream is bound to (0: every unit)
    // DKP, for a preempted BE task: the last pad issued (its kernel index, and the RT task
    // and RT kernel it rode on).
    bool pad_pending = false;
    uint32_t pad_kernel = 0;
    const record* pad_rt_task = nullptr;
    uint32_t pad_rt_kernel = 0;
};

// Launches [from, to) of the task (to: its end), as a vHQ submits them.
std::unique_ptr<std::vector<launch>> build_pending(const task& t, task_words* w, uint32_t from, uint32_t to = ~0u);

class scheduling_policy {
public:
    using record = scheduler::record;
    using vhq = scheduler::vhq;

    explicit scheduling_policy(scheduler& s) : _s(s) {}
    virtual ~scheduling_policy() = default;
    scheduling_policy(const scheduling_policy&) = delete;
    scheduling_policy& operator=(const scheduling_policy&) = delete;

    // A task taken in. True when the policy took it itself (its pool, or an answer: rt_only
    // rejects BE work); false: the scheduler queues it on the RT vHQ, or a BE task on its
    // be_queue or the least loaded BE vHQ.
    virtual bool take(record* r) {
        (void)r;
        return false;
    }
    // One pass of the scheduler thread; true while anything is in progress.
    virtual bool step() = 0;
    // Shutdown: every task the policy holds (not on a vHQ) ends cancelled.
    virtual void cancel_held() {}

protected:
    // The scheduler's state (scheduler thread).
    vhq& rt() const { return *_s._rt; }
    const std::vector<std::unique_ptr<vhq>>& be() const { return _s._be; }
    std::vector<vhq*> all_queues() const {  // the RT vHQ first
        std::vector<vhq*> all{_s._rt.get()};
        for (auto& q : _s._be) all.push_back(q.get());
        return all;
    }
    device& dev() const { return _s._dev; }
    const scheduler_options& opt() const { return _s._opt; }
    double kernel_est_us() const { return _s._kernel_est_us; }  // running average of a kernel's time

    // The scheduler's operations (scheduler.cc).
    void start_task(vhq& q, record* r, bool pump_now = true) { _s.start_task(q, r, pump_now); }
    void pump(vhq& q) { _s.pump(q); }
    void fail_launches(vhq& q) { _s.fail_launches(q); }
    bool check_done(vhq& q) { return _s.check_done(q); }
    void preempt(vhq& q) { _s.preempt(q); }
    bool try_restore(vhq& q) { return _s.try_restore(q); }
    void finish(record* r, task_status st) { _s.finish(r, st); }
    void bind_units(vhq& q) { _s.bind_units(q); }
    void lower_flag(vhq& q) { _s.lower_flag(q); }
    // Updates the statistics under their lock.
    template <typename F>
    void count(F&& f) {
        std::lock_guard lk(_s._st_mu);
        f(_s._stats);
    }

private:
    scheduler& _s;
};


}  // namespace reefline::gpu
