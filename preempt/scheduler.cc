// The GPU scheduler: see scheduler.h for the design.
#include "preempt/scheduler.h"

#include "preempt/policy.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <deque>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace reefline::gpu {
namespace {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

}  // namespace

const policy_entry* find_policy(const std::string& name) {
    for (const auto& p : policies())
        if (name == p.name) return &p;
    return nullptr;
}

std::string policy_names() {
    std::string out;
    for (const auto& p : policies()) out += (out.empty() ? "" : ", ") + std::string(p.name);
    return out;
}

const char* policy_name(policy p) {
    for (const auto& e : policies())
        if (e.id == p) return e.name;
    return "?";
}

bool parse_policy(const char* s, policy& out) {
    const policy_entry* e = s ? find_policy(s) : nullptr;
    if (e) out = e->id;
    return e != nullptr;
}

scheduler::scheduler(device& dev, scheduler_options options) : _dev(dev), _opt(options) {
    if (_opt.be_queues == 0) _opt.be_queues = 1;
    if (_opt.vhq_capacity == 0) _opt.vhq_capacity = 1;
    const device_caps caps = _dev.caps();
    const uint32_t depth = std::max<uint32_t>(1, caps.max_queue_depth);
    auto make_q = [&](int prio, uint32_t cap) {
        auto q = std::make_unique<vhq>();
        q->s = _dev.create_stream(prio);
        q->w = _dev.task_words_create();
        q->drain = _dev.event_create();
        q->cap = std::min(cap, depth);
        return q;
    };
    const bool wide = _opt.pol == policy::streams;
    // DKP needs the device's padded launch and picks pads per RT launch, as each is issued:
    // two RT launches outstanding keep the device busy (the next one is queued while one
    // runs) and let each pick from what the BE queues offer then.
    if (_opt.pol != policy::reef || !_dev.pads_launches()) _opt.padding.reset();
    _rt = make_q(caps.highest_priority, _opt.padding ? std::min<uint32_t>(2, depth) : depth);
    // Reset-based preemption by level: every BE launch at be_level, which an RT arrival raises
    // with one write (device_ops::raise_levels) instead of a flag write per BE queue.
    _levels = _opt.use_levels && _opt.pol == policy::reef && _opt.preempt == preempt_mode::reset && _dev.has_levels();
    _stats.padding = _opt.padding != nullptr;
    for (uint32_t i = 0; i < _opt.be_queues; ++i)
        _be.push_back(make_q(caps.lowest_priority, wide ? depth : _opt.vhq_capacity));
    for (const policy_entry& e : policies())
        if (e.id == _opt.pol) _policy = e.make(*this);
    if (!_policy) throw std::invalid_argument("scheduler: unknown policy");
    _reclaimer = std::thread([this] { reclaim_loop(); });
    _thread = std::thread([this] { loop(); });
}

scheduler::~scheduler() { shutdown(); }

task_id scheduler::submit(task t) {
    auto* r = new record;
    r->res.cls = t.cls;
    r->res.kernels = static_cast<uint32_t>(t.launches.size());
    r->res.submit_ns = now_ns();
    r->t = std::move(t);
    for (const task_launch& l : r->t.launches)
        if (!l.kernel) {
            delete r;
            throw std::invalid_argument("scheduler: a launch without a kernel");
        }
    std::unique_lock lk(_in_mu);
    r->res.id = _next_id++;
    const task_id id = r->res.id;
    {
        std::lock_guard st(_st_mu);
        ++_stats.submitted;
    }
    if (!r->t.on_done) {
        std::lock_guard rl(_res_mu);
        _waitable[id] = true;
    }
    if (_stopped) {
        lk.unlock();
        finish(r, task_status::rejected);
        return id;
    }
    // Fast path of an RT arrival under reef (reset): stop the BE work from here, so that BE
    // blocks stop at their next check point even before the scheduler thread runs (on an
    // oversubscribed machine it may wait for a core). With levels it is one write (the BE level
    // raised) and no per-queue state: the arrival is counted first, so that a BE launch the
    // scheduler thread decides on after reading the new epoch sees the arrival and is not made
    // (pump), and one decided on before it carries the old epoch and stops. Without levels every
    // BE queue's flag is raised; the scheduler thread still preempts formally, and only it
    // clears a flag (after a drain); a flag raised on an idle vHQ is cleared when its next task
    // starts.
    const bool rt_reset = r->t.cls == task_class::rt && _opt.pol == policy::reef && _opt.preempt == preempt_mode::reset;
    if (rt_reset && _levels) _rt_submitted.fetch_add(1, std::memory_order_seq_cst);
    else if (rt_reset)
        for (auto& q : _be) raise_flag(*q);
    _incoming.push_back(r);
    _incoming_n.fetch_add(1, std::memory_order_release);
    lk.unlock();
    if (rt_reset && _levels) _dev.raise_levels(1u << be_level);
    _in_cv.notify_one();
    return id;
}

task_result scheduler::wait(task_id id) {
    std::unique_lock lk(_res_mu);
    for (;;) {
        auto it = _results.find(id);
        if (it != _results.end()) {
            task_result r = it->second;
            _results.erase(it);
            _waitable.erase(id);
            return r;
        }
        if (!_waitable.count(id)) {
            task_result r;
            r.id = id;
            r.status = task_status::rejected;
            return r;
        }
        _res_cv.wait(lk);
    }
}

scheduler_stats scheduler::stats() const {
    std::lock_guard lk(_st_mu);
    return _stats;
}

void scheduler::finish(record* r, task_status st) {
    r->res.status = st;
    r->res.end_ns = now_ns();
    {
        std::lock_guard lk(_st_mu);
        switch (st) {
        case task_status::completed:
            ++(r->res.cls == task_class::rt ? _stats.completed_rt : _stats.completed_be);
            break;
        case task_status::rejected: ++_stats.rejected; break;
        case task_status::cancelled: ++_stats.cancelled; break;
        case task_status::failed: ++_stats.failed; break;
        case task_status::dropped: ++_stats.abacus_dropped; break;
        }
    }
    if (r->t.on_done) {
        r->t.on_done(r->res);
    } else {
        std::lock_guard lk(_res_mu);
        _results[r->res.id] = r->res;
        _res_cv.notify_all();
    }
    delete r;
}

// ---- vHQ mechanics (scheduler thread) ---------------------------------------------------------

std::unique_ptr<std::vector<launch>> build_pending(const task& t, task_words* w, uint32_t from, uint32_t to) {
    to = std::min<uint32_t>(to, uint32_t(t.launches.size()));
    auto v = std::make_unique<std::vector<launch>>();
    v->reserve(to > from ? to - from : 0);
    for (uint32_t i = from; i < to; ++i) {
        const task_launch& l = t.launches[i];
        v->push_back(launch{l.kernel, l.args.empty() ? nullptr : l.args.data(),
                            static_cast<uint32_t>(l.args.size()), l.grid, 0, l.grid, w, i});
    }
    return v;
}

void scheduler::raise_flag(vhq& q) { _dev.set_task_flag(q.w, 1); }

void scheduler::lower_flag(vhq& q) {
    if (q.w->preempt.load(std::memory_order_seq_cst) != 0) _dev.set_task_flag(q.w, 0);
}

void scheduler::bind_units(vhq& q) {
    if (&q == _rt.get() || !q.cur) return;
    const uint64_t want = q.cur->t.units;
    if (want == q.units || !_dev.has_unit_sets()) return;
    _dev.stream_set_units(q.s, want ? want : ~uint64_t{0});
    q.units = want;
}

void scheduler::start_task(vhq& q, record* r, bool pump_now) {
    q.cur = r;
    if (r->res.start_ns == 0) r->res.start_ns = now_ns();
    bind_units(q);
    lower_flag(q);
    q.w->completed.store(0, std::memory_order_seq_cst);
    q.pending = build_pending(r->t, q.w, 0);
    q.head = 0;
    q.submitted = 0;
    q.st = vhq::state::running;
    q.pad_pending = false;
    if (pump_now) pump(q);
}

void scheduler::pump(vhq& q) {
    if (q.st != vhq::state::running || !q.pending) return;
    std::vector<launch>& p = *q.pending;
    // BE launches under levels: the epoch is read before the check for RT arrivals that the
    // loop has not taken in yet (submit counts an arrival before it raises the level).
    const bool level = _levels && &q != _rt.get();
    uint32_t epoch = 0;
    if (level) {
        epoch = _dev.level_epoch(be_level);
        if (_rt_submitted.load(std::memory_order_seq_cst) != _rt_intaken) return;
    }
    try {
        while (q.head < p.size()) {
            const uint32_t done = q.w->completed.load(std::memory_order_acquire);
            if (q.submitted - done >= q.cap) break;
            if (level) {
                p[q.head].level = be_level;
                p[q.head].epoch = epoch;
            }
            _dev.launch(q.s, p[q.head]);
            ++q.head;
            ++q.submitted;
        }
    } catch (const std::exception&) {
        fail_launches(q);
    }
}

void scheduler::fail_launches(vhq& q) {
    // The device refused a launch: stop the task's launches already queued, wait for the
    // stream (a rare error path), fail the task. The flag stays raised until the vHQ's next
    // task starts (on a drained stream).
    raise_flag(q);
    q.pending.reset();
    _dev.synchronize(q.s);
    record* r = q.cur;
    r->res.completed_kernels = std::min(q.w->completed.load(std::memory_order_acquire), r->res.kernels);
    q.cur = nullptr;
    q.st = vhq::state::idle;
    finish(r, task_status::failed);
}

bool scheduler::check_done(vhq& q) {
    if (q.st != vhq::state::running) return false;
    if (q.w->completed.load(std::memory_order_acquire) < q.cur->res.kernels) return false;
    record* r = q.cur;
    r->res.completed_kernels = r->res.kernels;
    if (r->res.preemptions == 0 && r->res.kernels) {
        const double per = double(now_ns() - r->res.start_ns) / 1000.0 / r->res.kernels;
        _kernel_est_us = 0.8 * _kernel_est_us + 0.2 * per;
    }
    q.cur = nullptr;
    q.st = vhq::state::idle;
    if (q.pending) {
        q.pending.reset();
    }
    finish(r, task_status::completed);
    return true;
}

void scheduler::preempt(vhq& q) {
    if (q.st != vhq::state::running) return;
    // O(1): the pending list goes to the reclamation thread, handed over after this step
    // (hand_over_reclaim): waking that thread here would cost the RT arrival a futex call per
    // queue, and on a small machine the woken thread takes a core from the RT launch.
    if (q.pending) _rc_local.push_back(std::move(q.pending));
    // With levels the arrival's raise stopped every launch the queue had made (all at the BE
    // level, older epochs): nothing to write here.
    if (_opt.preempt == preempt_mode::reset && !_levels) raise_flag(q);
    _dev.event_record(q.drain, q.s);
    q.st = vhq::state::preempted;
    ++q.cur->res.preemptions;
    std::lock_guard lk(_st_mu);
    ++_stats.preemptions;
}

bool scheduler::try_restore(vhq& q) {
    if (q.st != vhq::state::preempted) return false;
    if (!_dev.event_query(q.drain)) return false;
    // A pad of the task may still run a block (DKP): its writes must end before a restore.
    if (q.w->pads.load(std::memory_order_acquire) != 0) return false;
    q.pad_pending = false;
    record* r = q.cur;
    const uint32_t done = q.w->completed.load(std::memory_order_acquire);
    const uint64_t lost = q.submitted - done;
    r->res.lost_launches += lost;
    if (done >= r->res.kernels) {
        q.st = vhq::state::running;
        {
            std::lock_guard lk(_st_mu);
            _stats.lost_launches += lost;
            ++_stats.finished_in_drain;
        }
        check_done(q);
        return true;
    }
    uint32_t from = done;
    if (_opt.restore == restore_mode::approximate)
        from = std::min<uint32_t>(done, q.submitted > q.cap ? q.submitted - q.cap : 0);
    r->res.reexecuted_kernels += done - from;
    ++r->res.restores;
    {
        std::lock_guard lk(_st_mu);
        _stats.lost_launches += lost;
        _stats.reexecuted_kernels += done - from;
        ++_stats.restores;
    }
    // The stream is drained: no stale launch of this task is left to run.
    q.w->completed.store(from, std::memory_order_seq_cst);
    bind_units(q);  // a task that started as a pad never went through start_task
    lower_flag(q);
    q.pending = build_pending(r->t, q.w, from);
    q.head = 0;
    q.submitted = from;
    q.st = vhq::state::running;
    pump(q);
    return true;
}

// ---- the scheduler thread ---------------------------------------------------------------------

void scheduler::intake() {
    if (_incoming_n.load(std::memory_order_acquire) == 0) return;
    std::vector<record*> in;
    {
        std::lock_guard lk(_in_mu);
        in.swap(_incoming);
        _incoming_n.store(0, std::memory_order_relaxed);
    }
    for (record* r : in) {
        if (_policy->take(r)) continue;
        if (r->t.cls == task_class::rt) {
            if (_levels) ++_rt_intaken;  // submit counted it in _rt_submitted
            _rt->waiting.push_back(r);
            continue;
        }
        vhq* best = nullptr;
        if (r->t.be_queue >= 0) {
            best = _be[static_cast<size_t>(r->t.be_queue) % _be.size()].get();
        } else {
            size_t load = SIZE_MAX;
            for (auto& q : _be) {
                const size_t l = q->waiting.size() + (q->cur ? 1 : 0);
                if (l < load) {
                    load = l;
                    best = q.get();
                }
            }
        }
        best->waiting.push_back(r);
    }
}

void scheduler::cancel_all() {
    _policy->cancel_held();
    std::vector<vhq*> all{_rt.get()};
    for (auto& q : _be) all.push_back(q.get());
    for (vhq* q : all) {
        if (q->cur) {
            raise_flag(*q);
            q->pending.reset();
        }
    }
    for (vhq* q : all) {
        _dev.synchronize(q->s);
        // Pads (DKP) end with their RT launches; a cut one's running blocks stop at their
        // next check point: wait for them before the task's memory may go.
        while (q->w->pads.load(std::memory_order_acquire) != 0) std::this_thread::yield();
        if (q->cur) {
            record* r = q->cur;
            q->cur = nullptr;
            const uint32_t done = q->w->completed.load(std::memory_order_acquire);
            r->res.completed_kernels = std::min(done, r->res.kernels);
            const bool ok = done >= r->res.kernels && q->st == vhq::state::running;
            q->st = vhq::state::idle;
            finish(r, ok ? task_status::completed : task_status::cancelled);
        }
        while (!q->waiting.empty()) {
            record* r = q->waiting.front();
            q->waiting.pop_front();
            finish(r, task_status::cancelled);
        }
        lower_flag(*q);
    }
}

void scheduler::loop() {
#if defined(__linux__)
    if (_opt.dispatcher_cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(_opt.dispatcher_cpu, &one);
        (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);  // unpinned if refused
    }
#endif
    const bool spin = _opt.dispatcher_cpu >= 0;
    int64_t idle_since = 0;
    for (;;) {
        intake();
        if (_stop.load(std::memory_order_acquire)) {
            intake();
            cancel_all();
            hand_over_reclaim();
            return;
        }
        const bool busy = _policy->step();
        hand_over_reclaim();  // after the step's RT launch
        if (busy) {
            // Poll; give the core away between polls so that a compute unit sharing it (an
            // oversubscribed machine) is not starved. On a dedicated core yield returns at once.
            idle_since = 0;
            relax();
            if (!spin) std::this_thread::yield();
            continue;
        }
        const int64_t t = now_ns();
        if (idle_since == 0) idle_since = t;
        if (spin || t - idle_since < _opt.idle_spin_ns) {
            relax();
            if (!spin) std::this_thread::yield();
            continue;
        }
        std::unique_lock lk(_in_mu);
        _in_cv.wait_for(lk, std::chrono::milliseconds(5), [&] {
            return _incoming_n.load(std::memory_order_relaxed) != 0 || _stop.load(std::memory_order_relaxed);
        });
        idle_since = 0;
    }
}

void scheduler::hand_over_reclaim() {
    if (_rc_local.empty()) return;
    {
        std::lock_guard lk(_rc_mu);
        for (auto& l : _rc_local) _rc_queue.push_back(std::move(l));
    }
    _rc_local.clear();
    _rc_cv.notify_one();
}

void scheduler::reclaim_loop() {
    std::unique_lock lk(_rc_mu);
    for (;;) {
        _rc_cv.wait(lk, [&] { return _rc_stop || !_rc_queue.empty(); });
        std::vector<std::unique_ptr<std::vector<launch>>> batch;
        batch.swap(_rc_queue);
        const bool stop = _rc_stop;
        lk.unlock();
        const size_t n = batch.size();
        batch.clear();  // frees the detached lists
        {
            std::lock_guard sl(_st_mu);
            _stats.reclaimed_lists += n;
        }
        lk.lock();
        if (stop && _rc_queue.empty()) return;
    }
}

void scheduler::shutdown() {
    {
        std::lock_guard lk(_in_mu);
        if (_stopped) return;
        _stopped = true;
        _stop.store(true, std::memory_order_release);
    }
    _in_cv.notify_all();
    if (_thread.joinable()) _thread.join();
    {
        std::lock_guard lk(_rc_mu);
        _rc_stop = true;
    }
    _rc_cv.notify_all();
    if (_reclaimer.joinable()) _reclaimer.join();
    std::vector<std::unique_ptr<vhq>> all;
    all.push_back(std::move(_rt));
    for (auto& q : _be) all.push_back(std::move(q));
    _be.clear();
    for (auto& q : all) {
        _dev.synchronize(q->s);
        _dev.event_destroy(q->drain);
        _dev.task_words_destroy(q->w);
        _dev.stream_destroy(q->s);
    }
}

}  // namespace reefline::gpu
