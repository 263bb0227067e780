// abacus: Abacus (SC'21; scheduler.h). Every task is a query with a deadline, run in segments
// (launch ranges) within operator groups, one group per round: the query with the least
// headroom leads and runs to its end; the others add the longest segments that keep the
// group's predicted duration within the lead's budget. An RT arrival preempts the round's BE
// parts (reset), which resume in a later round; a query that cannot meet its deadline even
// alone is dropped.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "preempt/abacus.h"
#include "preempt/policy.h"

namespace reefline::gpu {
namespace {

class abacus_policy final : public scheduling_policy {
public:
    using scheduling_policy::scheduling_policy;

    bool take(record* r) override {
        r->est_prefix.assign(r->t.launches.size() + 1, 0.0);
        for (size_t i = 0; i < r->t.launches.size(); ++i) {
            // Unprofiled launches: the running average of a kernel's time.
            const double us = r->t.launches[i].est_us > 0 ? r->t.launches[i].est_us : kernel_est_us();
            r->est_prefix[i + 1] = r->est_prefix[i] + us;
        }
        _pool.push_back(r);
        return true;
    }

    void cancel_held() override {
        for (record* r : _pool) finish(r, task_status::cancelled);
        _pool.clear();
        _round.clear();
    }

    bool step() override {
        const std::vector<vhq*> all = all_queues();
        const int64_t now = now_ns();
        if (!_round.empty() && round_open()) return true;
        return plan(all, now);
    }

private:
    // The round in flight: parts that reached their segment's end park (or finish), preempted
    // parts park once their stream drained; true while some part is still on the device. When
    // the last part is done, the round is reported.
    bool round_open() {
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
                if (!dev().event_query(q.drain)) {
                    open = true;
                    continue;
                }
                record* r = q.cur;
                const uint32_t done = std::min(q.w->completed.load(std::memory_order_acquire), r->res.kernels);
                r->res.lost_launches += q.submitted - done;
                count([&](scheduler_stats& s) { s.lost_launches += q.submitted - done; });
                r->next = done;
                q.pending.reset();
                if (done >= r->res.kernels) {
                    r->res.completed_kernels = r->res.kernels;
                    q.cur = nullptr;
                    q.st = vhq::state::idle;
                    count([](scheduler_stats& s) { ++s.finished_in_drain; });
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
        count([&](scheduler_stats& s) {
            ++s.abacus_groups;
            if (_round_report.by_profile) ++s.abacus_by_profile;
            if (!_round_report.preempted) {
                s.abacus_predicted_us += _round_report.predicted_us;
                s.abacus_measured_us += _round_report.measured_us;
            }
        });
        if (opt().on_group) opt().on_group(_round_report);
        return false;
    }

    // The next group: drops the queries that cannot make their deadline, picks the lead, adds
    // the other queries' longest segments that fit, and issues it. True while work is left.
    bool plan(const std::vector<vhq*>& all, int64_t now) {
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
            x.alone = predict(alone, {x.r}, by_profile);
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
            auto it = lead.r->t.cls == task_class::rt && std::find(free.begin(), free.end(), &rt()) != free.end()
                          ? std::find(free.begin(), free.end(), &rt())
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
        (void)predict(group, owners, group_by_profile);
        for (size_t i = 1; i < qs.size() && group.size() < all.size(); ++i) {
            const query& x = qs[i];
            // A vHQ for it, always leaving one free for the next round's lead.
            if (!x.held && free.size() < 2) continue;
            const uint32_t from = x.r->next, k = x.r->res.kernels;
            group.push_back(seg_of(x.r, from, from + 1));
            owners.push_back(x.r);
            bool bp = false;
            double at_least = predict(group, owners, bp);
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
                const double us = predict(group, owners, bp);
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
            // Resumes after a preemption.
            if (q.st == vhq::state::parked && q.cur == r && r->res.preemptions > r->res.restores) {
                ++r->res.restores;
                count([](scheduler_stats& s) { ++s.restores; });
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

    void start_segment(vhq& q, record* r, uint32_t from, uint32_t end) {
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
    double predict(std::vector<abacus::segment>& group, const std::vector<record*>& owners, bool& by_profile) const {
        for (size_t i = 0; i < group.size(); ++i)
            group[i].profile_us = owners[i]->est_prefix[group[i].end] - owners[i]->est_prefix[group[i].start];
        if (opt().predictor && opt().predictor->covers(group)) {
            const double us = opt().predictor->predict_us(group);
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

    std::vector<record*> _pool;  // queries not started
    // The group in flight (each part's vHQ and the end of its segment; a finished part's vHQ is
    // null), its report, and when it was issued.
    struct round_part {
        vhq* q;
        uint32_t end;
    };
    std::vector<round_part> _round;
    abacus_group _round_report;
    int64_t _round_start = 0;
};

}  // namespace

std::unique_ptr<scheduling_policy> make_abacus_policy(scheduler& s) { return std::make_unique<abacus_policy>(s); }

}  // namespace reefline::gpu
