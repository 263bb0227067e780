// The GPU scheduler: see scheduler.h for the design.
#include "preempt/scheduler.h"

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

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

}  // namespace

const char* policy_name(policy p) {
    switch (p) {
    case policy::reef: return "reef";
    case policy::rt_only: return "rt_only";
    case policy::seq: return "seq";
    case policy::streams: return "streams";
    case policy::prema: return "prema";
    case policy::abacus: return "abacus";
    }
    return "?";
}

bool parse_policy(const char* s, policy& out) {
    for (policy p : {policy::reef, policy::rt_only, policy::seq, policy::streams, policy::prema, policy::abacus})
        if (std::strcmp(s, policy_name(p)) == 0) {
            out = p;
            return true;
        }
    return false;
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

scheduler::scheduler(device& dev, scheduler_options options) : _dev(dev), _opt(options) {
    if (_opt.be_queues == 0) _opt.be_queues = 1;
    if (_opt.vhq_capacity == 0) _opt.vhq_capacity = 1;
    const device_caps caps = _dev.caps();
    const uint32_t depth = std::max<uint32_t>(1, caps.max_queue_depth);
    auto make_q = [&](int prio, uint32_t cap) {
        auto q = std::make_unique<vhq>();
        q->s = _dev.create_stream(prio);
        q->w = _dev.ops().task_words_create(&_dev);
        q->drain = _dev.ops().event_create(&_dev);
        q->cap = std::min(cap, depth);
        return q;
    };
    const bool wide = _opt.pol == policy::streams;
    // DKP needs the device's padded launch and picks pads per RT launch, as each is issued:
    // two RT launches outstanding keep the device busy (the next one is queued while one
    // runs) and let each pick from what the BE queues offer then.
    if (_opt.pol != policy::reef || !_dev.ops().launch_padded) _opt.padding.reset();
    _rt = make_q(caps.highest_priority, _opt.padding ? std::min<uint32_t>(2, depth) : depth);
    // Reset-based preemption by level: every BE launch at be_level, which an RT arrival raises
    // with one write (device_ops::raise_levels) instead of a flag write per BE queue.
    _levels = _opt.use_levels && _opt.pol == policy::reef && _opt.preempt == preempt_mode::reset && _dev.ops().raise_levels &&
              _dev.ops().level_epoch;
    _stats.padding = _opt.padding != nullptr;
    for (uint32_t i = 0; i < _opt.be_queues; ++i)
        _be.push_back(make_q(caps.lowest_priority, wide ? depth : _opt.vhq_capacity));
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
    if (rt_reset && _levels) _dev.ops().raise_levels(&_dev, 1u << be_level);
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

namespace {
// Launches [from, to) of the task (to: its end).
std::unique_ptr<std::vector<launch>> build_pending(const task& t, task_words* w, uint32_t from, uint32_t to = ~0u) {
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
}  // namespace

void scheduler::raise_flag(vhq& q) { _dev.set_task_flag(q.w, 1); }

void scheduler::lower_flag(vhq& q) {
    if (q.w->preempt.load(std::memory_order_seq_cst) != 0) _dev.set_task_flag(q.w, 0);
}

void scheduler::bind_units(vhq& q) {
    if (&q == _rt.get() || !q.cur) return;
    const uint64_t want = q.cur->t.units;
    if (want == q.units || !_dev.ops().stream_set_units) return;
    _dev.ops().stream_set_units(&_dev, q.s, want ? want : ~uint64_t{0});
    q.units = want;
}

void scheduler::start_task(vhq& q, record* r) {
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
    if (&q == _rt.get() && _opt.padding) pump_padded(q);
    else pump(q);
}

void scheduler::pump(vhq& q) {
    if (q.st != vhq::state::running || !q.pending) return;
    std::vector<launch>& p = *q.pending;
    // BE launches under levels: the epoch is read before the check for RT arrivals that the
    // loop has not taken in yet (submit counts an arrival before it raises the level).
    const bool level = _levels && &q != _rt.get();
    uint32_t epoch = 0;
    if (level) {
        epoch = _dev.ops().level_epoch(&_dev, be_level);
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

void scheduler::pump_padded(vhq& rt) {
    if (rt.st != vhq::state::running || !rt.pending) return;
    std::vector<launch>& p = *rt.pending;
    const uint32_t units = _dev.caps().compute_units;
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
            for (auto& qp : _be) {
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
                    _dev.ops().event_record(&_dev, q.drain, q.s);
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
                    if (!_dev.ops().event_query(&_dev, q.drain)) continue;
                    k = q.w->completed.load(std::memory_order_acquire);
                }
                if (k >= q.cur->t.launches.size()) continue;
                cand[n] = {&q.cur->t.launches[k], uint32_t(&qp - _be.data())};
                owner[n] = &q;
                next_kernel[n] = k;
                ++n;
            }
            uint32_t chosen[max_pads];
            const uint32_t m = n ? _opt.padding->select(rk, units, cand, n, chosen, max_pads) : 0;
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
            if (m) _dev.ops().launch_padded(&_dev, rt.s, l, pads, m);
            else _dev.launch(rt.s, l);
            ++rt.head;
            ++rt.submitted;
            if (n) {
                std::lock_guard lk(_st_mu);
                ++_stats.select_count;
                _stats.select_ns_sum += uint64_t(sel_ns);
                size_t b = 0;
                while (b < std::size(select_ns_buckets) && sel_ns > int64_t(select_ns_buckets[b])) ++b;
                ++_stats.select_ns_hist[b];
                if (m) {
                    ++_stats.padded_launches;
                    _stats.pads_issued += m;
                }
            }
        }
    } catch (const std::exception&) {
        fail_launches(rt);
    }
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
    _dev.ops().event_record(&_dev, q.drain, q.s);
    q.st = vhq::state::preempted;
    ++q.cur->res.preemptions;
    std::lock_guard lk(_st_mu);
    ++_stats.preemptions;
}

bool scheduler::try_restore(vhq& q) {
    if (q.st != vhq::state::preempted) return false;
    if (!_dev.ops().event_query(&_dev, q.drain)) return false;
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

// ---- policies ---------------------------------------------------------------------------------

// Runs the RT queue: starts tasks back to back. Returns true if anything is in progress.
static bool rt_busy(const scheduler::vhq& q) { return q.cur || !q.waiting.empty(); }

bool scheduler::step_reef() {
    vhq& rt = *_rt;
    if (rt_busy(rt) && !_rt_mode) {
        _rt_mode = true;
        {
            std::lock_guard lk(_st_mu);
            ++_stats.rt_episodes;
        }
        for (auto& q : _be) preempt(*q);
    }
    if (_rt_mode) {
        check_done(rt);
        if (!rt.cur && !rt.waiting.empty()) {
            bool go = true;
            if (_opt.preempt == preempt_mode::wait)
                for (auto& q : _be)
                    if (q->st == vhq::state::preempted && !_dev.ops().event_query(&_dev, q->drain)) go = false;
            if (go) {
                record* r = rt.waiting.front();
                rt.waiting.pop_front();
                start_task(rt, r);  // (pumps unpadded; the loop below pads what is left)
            }
        }
        if (_opt.padding) pump_padded(rt);
        else pump(rt);
        if (!rt_busy(rt)) _rt_mode = false;
    }
    if (!_rt_mode) {
        for (auto& qp : _be) {
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
    bool busy = rt_busy(rt);
    for (auto& q : _be) busy = busy || q->cur || !q->waiting.empty();
    return busy;
}

bool scheduler::step_streams() {
    bool busy = false;
    auto run = [&](vhq& q) {
        check_done(q);
        if (q.st == vhq::state::idle && !q.waiting.empty()) {
            record* r = q.waiting.front();
            q.waiting.pop_front();
            start_task(q, r);
        }
        pump(q);
        busy = busy || q.cur || !q.waiting.empty();
    };
    run(*_rt);
    for (auto& q : _be) run(*q);
    return busy;
}

bool scheduler::step_seq() {
    vhq* cur = nullptr;
    if (_rt->cur) cur = _rt.get();
    for (auto& q : _be)
        if (q->cur) cur = q.get();
    if (cur && check_done(*cur)) cur = nullptr;
    if (!cur) {
        if (!_rt->waiting.empty()) {
            cur = _rt.get();
        } else {
            for (uint32_t i = 0; i < _be.size() && !cur; ++i) {
                vhq& q = *_be[(_rr + i) % _be.size()];
                if (!q.waiting.empty()) {
                    cur = &q;
                    _rr = static_cast<uint32_t>((_rr + i + 1) % _be.size());
                }
            }
        }
        if (cur) {
            record* r = cur->waiting.front();
            cur->waiting.pop_front();
            start_task(*cur, r);
            if (check_done(*cur)) return true;
        }
    }
    if (cur) pump(*cur);
    bool busy = rt_busy(*_rt);
    for (auto& q : _be) busy = busy || q->cur || !q->waiting.empty();
    return busy;
}

// prema: one task at a time among the pool (not started) and the preempted tasks.
bool scheduler::step_prema() {
    std::vector<vhq*> all{_rt.get()};
    for (auto& q : _be) all.push_back(q.get());
    vhq* running = nullptr;
    for (vhq* q : all) {
        if (q->st == vhq::state::running) {
            if (check_done(*q)) continue;
            running = q;
        }
    }
    const int64_t now = now_ns();
    const bool tick = now - _last_tick >= 250'000;
    if (running && !tick) {
        pump(*running);
        return true;
    }
    auto weight = [](const record* r) {
        const int p = r->t.cls == task_class::rt ? 2 : std::clamp(r->t.priority, 0, 2);
        return p == 0 ? 1.0 : p == 1 ? 3.0 : 9.0;
    };
    auto est_total = [&](const record* r) {
        return r->t.est_us > 0 ? r->t.est_us : std::max(1.0, _kernel_est_us * r->res.kernels);
    };
    auto remaining = [&](const record* r, const vhq* q) {
        const double done = q ? double(std::min(q->w->completed.load(std::memory_order_acquire), r->res.kernels)) : 0;
        return r->res.kernels ? est_total(r) * (1.0 - done / r->res.kernels) : 0.0;
    };
    // Candidates: (record, vhq holding it preempted or null for the pool).
    std::vector<std::pair<record*, vhq*>> cands;
    for (record* r : _pool) cands.push_back({r, nullptr});
    for (vhq* q : all)
        if (q->st == vhq::state::preempted) cands.push_back({q->cur, q});
    if (cands.empty()) {
        if (running) pump(*running);
        return running != nullptr;
    }
    if (tick) {
        const double dt_us = _last_tick ? double(now - _last_tick) / 1000.0 : 0;
        _last_tick = now;
        for (auto& [r, q] : cands) r->tokens += weight(r) * dt_us / est_total(r);
    }
    // Runnable candidates: a preempted task once its stream has drained; a new one when a vHQ
    // of its class is free. (Tokens rank only these, so a task holding a vHQ is never
    // starved by one that waits for that vHQ.)
    auto free_vhq = [&](const record* r) -> vhq* {
        if (r->t.cls == task_class::rt) return _rt->st == vhq::state::idle ? _rt.get() : nullptr;
        for (auto& q : _be)
            if (q->st == vhq::state::idle) return q.get();
        return nullptr;
    };
    std::vector<std::pair<record*, vhq*>> ready;
    for (auto& [r, q] : cands) {
        if (q ? _dev.ops().event_query(&_dev, q->drain) : free_vhq(r) != nullptr) ready.push_back({r, q});
    }
    double top = 0;
    for (auto& [r, q] : ready) top = std::max(top, r->tokens);
    const double threshold = top >= 9 ? 9 : top >= 3 ? 3 : top >= 1 ? 1 : 0;
    record* best = nullptr;
    vhq* best_q = nullptr;
    double best_rem = 0;
    for (auto& [r, q] : ready) {
        if (r->tokens < threshold) continue;
        const double rem = remaining(r, q);
        if (!best || rem < best_rem) {
            best = r;
            best_q = q;
            best_rem = rem;
        }
    }
    if (!best) {
        if (running) pump(*running);
        return true;
    }
    vhq* target = best_q ? best_q : free_vhq(best);
    if (running) {
        const double run_rem = remaining(running->cur, running);
        if (run_rem <= best_rem) {  // DRAIN
            ++_drains;
            std::lock_guard lk(_st_mu);
            _stats.prema_drains = _drains;
        } else {  // KILL
            ++_kills;
            {
                std::lock_guard lk(_st_mu);
                _stats.prema_kills = _kills;
            }
            preempt(*running);
            running = nullptr;
        }
    }
    if (!running) {
        best->tokens = 0;  // (best may end, and be freed, right here)
        if (best_q) {
            try_restore(*best_q);
        } else {
            _pool.erase(std::find(_pool.begin(), _pool.end(), best));
            start_task(*target, best);
        }
    } else {
        pump(*running);
    }
    return true;
}

// ---- abacus ----------------------------------------------------------------------------------

void scheduler::start_segment(vhq& q, record* r, uint32_t from, uint32_t end) {
    q.cur = r;
    if (r->res.start_ns == 0) r->res.start_ns = now_ns();
    bind_units(q);
    lower_flag(q);
    q.w->completed.store(from, std::memory_order_seq_cst);
    q.pending = build_pending(r->t, q.w, from, end);
    q.head = 0;
    q.submitted = from;
    q.seg_end = end;
    q.st = vhq::state::running;
    pump(q);
}

// The group's duration: the predictor's where it covers every part's model, else the
// profiles' times of the parts' launches back to back (a device shared by segments running
// side by side takes about as long as running them in turn).
double scheduler::abacus_predict(std::vector<abacus::segment>& group, const std::vector<record*>& owners,
                                 bool& by_profile) const {
    for (size_t i = 0; i < group.size(); ++i)
        group[i].profile_us = owners[i]->est_prefix[group[i].end] - owners[i]->est_prefix[group[i].start];
    if (_opt.predictor && _opt.predictor->covers(group)) {
        const double us = _opt.predictor->predict_us(group);
        if (std::isfinite(us) && us > 0) {
            by_profile = false;
            return us;
        }
    }
    by_profile = true;
    double us = 0;
    for (const abacus::segment& s : group) us += s.profile_us;
    return us;
}

bool scheduler::step_abacus() {
    std::vector<vhq*> all{_rt.get()};
    for (auto& q : _be) all.push_back(q.get());
    const int64_t now = now_ns();

    // ---- the round in flight
    if (!_round.empty()) {
        // An RT query waiting preempts the round's BE parts (REEF's reset): they resume in a
        // later round from where their counters stand.
        const bool rt_waiting =
            std::any_of(_pool.begin(), _pool.end(), [](const record* r) { return r->t.cls == task_class::rt; });
        bool open = false;
        for (round_part& part : _round) {
            if (!part.q) continue;
            vhq& q = *part.q;
            if (q.st == vhq::state::running) {
                if (rt_waiting && q.cur->t.cls == task_class::be) {
                    preempt(q);
                    _round_report.preempted = true;
                } else {
                    pump(q);
                    if (q.w->completed.load(std::memory_order_acquire) >= part.end) {
                        record* r = q.cur;
                        r->next = part.end;
                        q.pending.reset();
                        if (part.end >= r->res.kernels) {
                            r->res.completed_kernels = r->res.kernels;
                            q.cur = nullptr;
                            q.st = vhq::state::idle;
                            finish(r, task_status::completed);
                        } else {
                            q.st = vhq::state::parked;
                        }
                        part.q = nullptr;
                        continue;
                    }
                }
            }
            if (q.st == vhq::state::preempted) {
                // Parked once its stream has drained: no stale launch of it may run after that.
                if (!_dev.ops().event_query(&_dev, q.drain)) {
                    open = true;
                    continue;
                }
                record* r = q.cur;
                const uint32_t done = std::min(q.w->completed.load(std::memory_order_acquire), r->res.kernels);
                r->res.lost_launches += q.submitted - done;
                {
                    std::lock_guard lk(_st_mu);
                    _stats.lost_launches += q.submitted - done;
                }
                r->next = done;
                q.pending.reset();
                if (done >= r->res.kernels) {
                    r->res.completed_kernels = r->res.kernels;
                    q.cur = nullptr;
                    q.st = vhq::state::idle;
                    {
                        std::lock_guard lk(_st_mu);
                        ++_stats.finished_in_drain;
                    }
                    finish(r, task_status::completed);
                } else {
                    q.st = vhq::state::parked;
                }
                part.q = nullptr;
                continue;
            }
            open = true;
        }
        if (open) return true;
        _round.clear();
        _round_report.measured_us = double(now_ns() - _round_start) / 1e3;
        {
            std::lock_guard lk(_st_mu);
            ++_stats.abacus_groups;
            if (_round_report.by_profile) ++_stats.abacus_by_profile;
            if (!_round_report.preempted) {
                _stats.abacus_predicted_us += _round_report.predicted_us;
                _stats.abacus_measured_us += _round_report.measured_us;
            }
        }
        if (_opt.on_group) _opt.on_group(_round_report);
    }

    // ---- plan the next group
    struct query {
        record* r;
        vhq* held;        // the vHQ a partly run query is parked on (null: in the pool)
        double headroom;  // us until its deadline (+inf: none)
        double alone;     // predicted us of the rest of it alone
    };
    std::vector<query> qs;
    const auto seg_of = [](const record* r, uint32_t from, uint32_t to) {
        abacus::segment s;
        s.model = r->t.model;
        s.start = from;
        s.end = to;
        s.kernels = r->res.kernels;
        s.batch = r->t.batch;
        s.length = r->t.length;
        return s;
    };
    const auto headroom_of = [&](const record* r) {
        return r->t.deadline_ns ? double(r->t.deadline_ns - now) / 1e3 : std::numeric_limits<double>::infinity();
    };
    bool by_profile = false;
    for (vhq* q : all)
        if (q->st == vhq::state::parked) qs.push_back({q->cur, q, headroom_of(q->cur), 0});
    for (record* r : _pool) qs.push_back({r, nullptr, headroom_of(r), 0});
    if (qs.empty()) return false;
    for (query& x : qs) {
        std::vector<abacus::segment> alone{seg_of(x.r, x.r->next, x.r->res.kernels)};
        x.alone = abacus_predict(alone, {x.r}, by_profile);
    }
    // Queries that cannot make their deadline even alone are dropped now, before they take
    // device time from the ones that can (Abacus's query drop).
    for (auto it = qs.begin(); it != qs.end();) {
        if (it->headroom < it->alone) {
            record* r = it->r;
            if (it->held) {
                it->held->cur = nullptr;
                it->held->st = vhq::state::idle;
            } else {
                _pool.erase(std::find(_pool.begin(), _pool.end(), r));
            }
            r->res.completed_kernels = r->next;
            it = qs.erase(it);
            finish(r, task_status::dropped);
        } else {
            ++it;
        }
    }
    if (qs.empty()) return true;
    // RT queries first, then by headroom (least first), then by arrival.
    std::stable_sort(qs.begin(), qs.end(), [](const query& a, const query& b) {
        if ((a.r->t.cls == task_class::rt) != (b.r->t.cls == task_class::rt)) return a.r->t.cls == task_class::rt;
        if (a.headroom != b.headroom) return a.headroom < b.headroom;
        return a.r->res.id < b.r->res.id;
    });
    std::vector<vhq*> free;
    for (vhq* q : all)
        if (q->st == vhq::state::idle) free.push_back(q);
    // The lead: to its end, on its own vHQ, or a free one (an RT query the RT vHQ where free).
    const query& lead = qs.front();
    vhq* lead_q = lead.held;
    if (!lead_q) {
        if (free.empty()) return true;  // (cannot happen: a round always leaves a vHQ free)
        auto it = lead.r->t.cls == task_class::rt && std::find(free.begin(), free.end(), _rt.get()) != free.end()
                      ? std::find(free.begin(), free.end(), _rt.get())
                      : free.end() - 1;
        lead_q = *it;
        free.erase(it);
    }
    std::vector<abacus::segment> group{seg_of(lead.r, lead.r->next, lead.r->res.kernels)};
    std::vector<record*> owners{lead.r};
    std::vector<vhq*> queues{lead_q};
    // What the group may take: the lead's headroom; an RT lead's own time (+5%: RT work is not
    // slowed for throughput); a lead without a deadline its time +25%.
    const double budget = lead.r->t.cls == task_class::rt ? 1.05 * lead.alone
                          : std::isfinite(lead.headroom)  ? lead.headroom
                                                          : 1.25 * lead.alone;
    double predicted = lead.alone;
    bool group_by_profile = false;
    (void)abacus_predict(group, owners, group_by_profile);
    for (size_t i = 1; i < qs.size() && group.size() < all.size(); ++i) {
        const query& x = qs[i];
        // A vHQ for it, always leaving one free for the next round's lead.
        if (!x.held && free.size() < 2) continue;
        const uint32_t from = x.r->next, k = x.r->res.kernels;
        group.push_back(seg_of(x.r, from, from + 1));
        owners.push_back(x.r);
        bool bp = false;
        double at_least = abacus_predict(group, owners, bp);
        if (!(at_least <= budget)) {
            group.pop_back();
            owners.pop_back();
            continue;
        }
        // The longest segment that fits: binary search on its end (predictions grow with it).
        uint32_t lo = from + 1, hi = k;
        double best = at_least;
        bool best_bp = bp;
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            group.back().end = mid;
            const double us = abacus_predict(group, owners, bp);
            if (us <= budget) {
                lo = mid;
                best = us;
                best_bp = bp;
            } else {
                hi = mid - 1;
            }
        }
        group.back().end = lo;
        predicted = best;
        group_by_profile = group_by_profile || best_bp;
        if (x.held) {
            queues.push_back(x.held);
        } else {
            queues.push_back(free.back());
            free.pop_back();
        }
    }
    // Issue it.
    _round_report = abacus_group{};
    for (const query& x : qs) _round_report.ranked.emplace_back(x.r->res.id, x.r->t.cls, x.headroom);
    _round_report.predicted_us = predicted;
    _round_report.by_profile = group_by_profile;
    _round_start = now_ns();
    for (size_t i = 0; i < group.size(); ++i) {
        record* r = owners[i];
        vhq& q = *queues[i];
        if (q.st == vhq::state::parked && q.cur == r && r->res.preemptions > r->res.restores) {  // resumes after a preemption
            ++r->res.restores;
            std::lock_guard lk(_st_mu);
            ++_stats.restores;
        }
        if (q.st != vhq::state::parked || q.cur != r) {
            // From the pool.
            _pool.erase(std::find(_pool.begin(), _pool.end(), r));
        }
        _round_report.parts.push_back({r->res.id, r->t.cls, group[i].start, group[i].end, r->res.kernels});
        _round.push_back({&q, group[i].end});
        start_segment(q, r, group[i].start, group[i].end);
    }
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
        if (_opt.pol == policy::prema) {
            _pool.push_back(r);
            continue;
        }
        if (_opt.pol == policy::abacus) {
            r->est_prefix.assign(r->t.launches.size() + 1, 0.0);
            for (size_t i = 0; i < r->t.launches.size(); ++i) {
                // Unprofiled launches: the running average of a kernel's time.
                const double us = r->t.launches[i].est_us > 0 ? r->t.launches[i].est_us : _kernel_est_us;
                r->est_prefix[i + 1] = r->est_prefix[i] + us;
            }
            _pool.push_back(r);
            continue;
        }
        if (r->t.cls == task_class::rt) {
            if (_levels) ++_rt_intaken;  // submit counted it in _rt_submitted
            _rt->waiting.push_back(r);
            continue;
        }
        if (_opt.pol == policy::rt_only) {
            finish(r, task_status::rejected);
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
    for (record* r : _pool) finish(r, task_status::cancelled);
    _pool.clear();
    _round.clear();
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
        bool busy = false;
        switch (_opt.pol) {
        case policy::reef:
        case policy::rt_only: busy = step_reef(); break;
        case policy::seq: busy = step_seq(); break;
        case policy::streams: busy = step_streams(); break;
        case policy::prema: busy = step_prema(); break;
        case policy::abacus: busy = step_abacus(); break;
        }
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
        _dev.ops().event_destroy(&_dev, q->drain);
        _dev.ops().task_words_destroy(&_dev, q->w);
        _dev.ops().stream_destroy(&_dev, q->s);
    }
}

}  // namespace reefline::gpu
