// prema: PREMA's token scheduling (HPCA'20; scheduler.h): one task at a time; every 0.25 ms each
// waiting task gains tokens (its priority x its normalised slowdown); the candidates at or above
// the threshold compete, and the shortest estimated remaining job wins. On a switch the running
// task is drained (left to finish) when its remaining time is at most the winner's, else killed
// (preempted, restored later).
#include <algorithm>
#include <utility>
#include <vector>

#include "preempt/policy.h"

namespace reefline::gpu {
namespace {

class prema_policy final : public scheduling_policy {
public:
    using scheduling_policy::scheduling_policy;

    bool take(record* r) override {
        _pool.push_back(r);
        return true;
    }

    void cancel_held() override {
        for (record* r : _pool) finish(r, task_status::cancelled);
        _pool.clear();
    }

    bool step() override {
        const std::vector<vhq*> all = all_queues();
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
        auto [best, best_q, best_rem] = pick(cands);
        if (!best) {
            if (running) pump(*running);
            return true;
        }
        vhq* target = best_q ? best_q : free_vhq(best);
        if (running) {
            const double run_rem = remaining(running->cur, running);
            if (run_rem <= best_rem) {  // DRAIN
                ++_drains;
                count([&](scheduler_stats& s) { s.prema_drains = _drains; });
            } else {  // KILL
                ++_kills;
                count([&](scheduler_stats& s) { s.prema_kills = _kills; });
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

private:
    struct choice {
        record* r = nullptr;
        vhq* q = nullptr;
        double remaining = 0;
    };

    static double weight(const record* r) {
        const int p = r->t.cls == task_class::rt ? 2 : std::clamp(r->t.priority, 0, 2);
        return p == 0 ? 1.0 : p == 1 ? 3.0 : 9.0;
    }
    double est_total(const record* r) const {
        return r->t.est_us > 0 ? r->t.est_us : std::max(1.0, kernel_est_us() * r->res.kernels);
    }
    double remaining(const record* r, const vhq* q) const {
        const double done = q ? double(std::min(q->w->completed.load(std::memory_order_acquire), r->res.kernels)) : 0;
        return r->res.kernels ? est_total(r) * (1.0 - done / r->res.kernels) : 0.0;
    }
    // A vHQ a new task of r's class could start on now.
    vhq* free_vhq(const record* r) const {
        if (r->t.cls == task_class::rt) return rt().st == vhq::state::idle ? &rt() : nullptr;
        for (auto& q : be())
            if (q->st == vhq::state::idle) return q.get();
        return nullptr;
    }
    // Runnable candidates: a preempted task once its stream has drained; a new one when a vHQ
    // of its class is free. (Tokens rank only these, so a task holding a vHQ is never starved
    // by one that waits for that vHQ.) Of those at or above the token threshold, the shortest
    // remaining job.
    choice pick(const std::vector<std::pair<record*, vhq*>>& cands) {
        std::vector<std::pair<record*, vhq*>> ready;
        for (auto& [r, q] : cands)
            if (q ? dev().event_query(q->drain) : free_vhq(r) != nullptr) ready.push_back({r, q});
        double top = 0;
        for (auto& [r, q] : ready) top = std::max(top, r->tokens);
        const double threshold = top >= 9 ? 9 : top >= 3 ? 3 : top >= 1 ? 1 : 0;
        choice best;
        for (auto& [r, q] : ready) {
            if (r->tokens < threshold) continue;
            const double rem = remaining(r, q);
            if (!best.r || rem < best.remaining) best = {r, q, rem};
        }
        return best;
    }

    std::vector<record*> _pool;  // tasks not started
    int64_t _last_tick = 0;
    uint64_t _drains = 0, _kills = 0;
};

}  // namespace

std::unique_ptr<scheduling_policy> make_prema_policy(scheduler& s) { return std::make_unique<prema_policy>(s); }

}  // namespace reefline::gpu
