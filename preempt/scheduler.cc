// The GPU scheduler: see scheduler.h for the design.
#include "preempt/scheduler.h"

#include <algorithm>
#include <chrono>
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
    }
    return "?";
}

bool parse_policy(const char* s, policy& out) {
    for (policy p : {policy::reef, policy::rt_only, policy::seq, policy::streams, policy::prema})
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
};

struct scheduler::vhq {
    enum class state : uint8_t { idle, running, preempted };
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
    // Fast path of an RT arrival under reef (reset): raise every BE task's flag from here, so
    // that BE blocks stop at their next check point even before the scheduler thread runs (on
    // an oversubscribed machine it may wait for a core). Only raising is done here; the
    // scheduler thread still preempts formally, and only it clears a flag (after a drain).
    // A flag raised on an idle vHQ is cleared when its next task starts.
    if (r->t.cls == task_class::rt && _opt.pol == policy::reef && _opt.preempt == preempt_mode::reset)
        for (auto& q : _be) raise_flag(*q);
    _incoming.push_back(r);
    _incoming_n.fetch_add(1, std::memory_order_release);
    lk.unlock();
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
std::unique_ptr<std::vector<launch>> build_pending(const task& t, task_words* w, uint32_t from) {
    auto v = std::make_unique<std::vector<launch>>();
    v->reserve(t.launches.size() - from);
    for (uint32_t i = from; i < t.launches.size(); ++i) {
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
    try {
        while (q.head < p.size()) {
            const uint32_t done = q.w->completed.load(std::memory_order_acquire);
            if (q.submitted - done >= q.cap) break;
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
    if (q.pending) {  // O(1): hand the pending list to the reclamation thread
        std::lock_guard lk(_rc_mu);
        _rc_queue.push_back(std::move(q.pending));
    }
    _rc_cv.notify_one();
    if (_opt.preempt == preempt_mode::reset) raise_flag(q);
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
        if (r->t.cls == task_class::rt) {
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
    int64_t idle_since = 0;
    for (;;) {
        intake();
        if (_stop.load(std::memory_order_acquire)) {
            intake();
            cancel_all();
            return;
        }
        bool busy = false;
        switch (_opt.pol) {
        case policy::reef:
        case policy::rt_only: busy = step_reef(); break;
        case policy::seq: busy = step_seq(); break;
        case policy::streams: busy = step_streams(); break;
        case policy::prema: busy = step_prema(); break;
        }
        if (busy) {
            // Poll; give the core away between polls so that a compute unit sharing it (an
            // oversubscribed machine) is not starved. On a dedicated core yield returns at once.
            idle_since = 0;
            relax();
            std::this_thread::yield();
            continue;
        }
        const int64_t t = now_ns();
        if (idle_since == 0) idle_since = t;
        if (t - idle_since < _opt.idle_spin_ns) {
            relax();
            std::this_thread::yield();
            continue;
        }
        std::unique_lock lk(_in_mu);
        _in_cv.wait_for(lk, std::chrono::milliseconds(5), [&] {
            return _incoming_n.load(std::memory_order_relaxed) != 0 || _stop.load(std::memory_order_relaxed);
        });
        idle_since = 0;
    }
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
