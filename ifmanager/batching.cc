#include "ifmanager/batching.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace reefline::ifm {

namespace {

// Margin = k x deviation. The worst request of a batch sees two service times (the batch
// ahead of it, then its own), each off the model by about one deviation; 3 mean absolute
// deviations of their sum keeps a miss to a few percent of batches for roughly normal noise.
constexpr double k_dev = 3.0;
// Hysteresis (a Schmitt trigger on the batch size). SLAB grows only to a batch that fits with
// k_dev times the *held* deviation (the peak of the recent past, decaying with a half-life of
// hold_half_life batches), and keeps its batch while that one still fits with k_keep times the
// current deviation. Host noise comes in bursts that double the deviation for a few batches;
// without the band each burst shrinks the batch and the next quiet stretch grows it back
// (measured on a shared VM: the target left its band ~13% of the time). With it a burst
// shrinks the batch only when it eats the narrower margin, and a quiet stretch grows it only
// once the burst has aged out of the held deviation, so a moment of calm in iid noise cannot
// ratchet the batch up to a size the keep test then holds.
constexpr double k_keep = 2.0;
constexpr double hold_half_life = 8;
// A batch within this fraction of the best measured throughput counts as as good (see
// throughput_batch()).
constexpr double throughput_tolerance = 0.9;
// Never plan closer to the SLO than this fraction of it: the serving loop notices a deadline
// only when it polls, and a timestamp is taken a little after the packet arrived.
constexpr double margin_floor = 0.02;
// EWMA gains. The deviation follows Jacobson's RTT variance estimator (1/4); a size's own
// service time moves faster (0.3) so that a slower device shows within a few batches.
constexpr double dev_gain = 0.25;
constexpr double size_gain = 0.3;
// A level shift: this many batches in a row off the model, on the same side, by more than
// shift_rel of the prediction. One slow batch is host noise (steal, another tenant's burst);
// two in a row are taken as a device that changed, which costs little when wrong: the next
// two batches, back at the old speed, shift the table back. The test is relative, not in
// deviations: a wrong model inflates the deviation, and a threshold that grew with it could
// never see the model come right again (the table would stay scaled up, the margin wide and
// the batch at its minimum, where the only size run cannot correct the line).
constexpr int shift_batches = 2;
constexpr double shift_rel = 0.2;
// A shift is first taken up as one ratio, the only reading the size it was seen at allows. It
// may as well be a fixed cost per batch (another IF's kernels ahead of each of ours, on a
// shared device): then a ratio overrates the sizes above that size and underrates those below,
// by up to 10x on the cpu device, and the target moves far, then climbs back one size at a time
// as each is measured again. For learn_batches batches after the shift, the observations are
// fitted as a mix of the two readings once two sizes at least min_spread apart have run (the
// target moves after a shift, so they come by themselves), and the table is rebuilt from the one
// before the shift.
constexpr int learn_batches = 32;
constexpr double min_spread = 0.25;
// How far one sample may move its size's entry: clip_devs deviations, or clip_rel of the entry.
constexpr double clip_devs = 3.0;
constexpr double clip_rel = 0.1;
// The line is fitted over every size seen, each weighted by its sample count (capped, so that
// the size run most does not pin the line) and halved every `half_life` batches since it was
// last run: recent sizes describe the device as it is now, old ones still fix the slope once
// the controller has settled on one size.
constexpr double half_life = 32;
constexpr uint32_t count_cap = 8;
// Clipper's backoff: "multiplicatively reduce the batch size by 10%".
constexpr double aimd_backoff = 0.9;
constexpr uint32_t max_sizes = 65536;

}  // namespace

const char* batching_policy_name(batching_policy p) {
    switch (p) {
    case batching_policy::slab: return "slab";
    case batching_policy::aimd: return "aimd";
    case batching_policy::fixed: return "fixed";
    }
    return "?";
}

bool parse_batching_policy(std::string_view s, batching_policy& out) {
    for (auto p : {batching_policy::slab, batching_policy::aimd, batching_policy::fixed})
        if (s == batching_policy_name(p)) {
            out = p;
            return true;
        }
    return false;
}

batch_controller::batch_controller(const batching_options& o) {
    check(o);
    _options = o;
    _target = _options.policy == batching_policy::fixed ? clamp(_options.fixed_batch ? _options.fixed_batch : _options.max_batch)
                                                        : _options.min_batch;
}

// An operator's mistake is refused rather than silently reinterpreted: the control plane
// turns the exception into an error reply and the IF keeps its previous settings.
void batch_controller::check(const batching_options& o) {
    const auto n = [](auto v) { return std::to_string(v); };
    if (o.policy != batching_policy::slab && o.policy != batching_policy::aimd && o.policy != batching_policy::fixed)
        throw std::invalid_argument("batching: unknown policy");
    if (!std::isfinite(o.slo_ms) || o.slo_ms <= 0)
        throw std::invalid_argument("slo_ms must be a positive number");
    if (o.max_batch == 0 || o.max_batch > max_sizes)
        throw std::invalid_argument("max_batch must be 1.." + n(max_sizes) + ", got " + n(o.max_batch));
    if (o.min_batch == 0) throw std::invalid_argument("min_batch must be at least 1");
    if (o.min_batch > o.max_batch)
        throw std::invalid_argument("min_batch (" + n(o.min_batch) + ") must not exceed max_batch (" + n(o.max_batch) + ")");
    if (o.fixed_batch != 0 && o.fixed_batch > o.max_batch)
        throw std::invalid_argument("fixed_batch (" + n(o.fixed_batch) + ") must not exceed max_batch (" + n(o.max_batch) + ")");
    if (o.fixed_batch != 0 && o.fixed_batch < o.min_batch)
        throw std::invalid_argument("fixed_batch (" + n(o.fixed_batch) + ") must not be below min_batch (" + n(o.min_batch) +
                                    ")");
}

void batch_controller::configure(const batching_options& o) {
    check(o);
    _options = o;
    switch (_options.policy) {
    case batching_policy::fixed:
        _target = clamp(_options.fixed_batch ? _options.fixed_batch : _options.max_batch);
        break;
    case batching_policy::slab:
        // The model already knows what a tighter SLO allows: act on it before the next batch
        // rather than after a miss. A looser one is taken up by observe(), at its growth rate.
        _draining = false;
        _target = clamp(_target);
        if (_batches) _target = std::min(_target, slo_batch());
        break;
    case batching_policy::aimd:
        _target = clamp(_target);
        break;
    }
}

uint32_t batch_controller::clamp(int64_t b) const {
    return uint32_t(std::clamp<int64_t>(b, _options.min_batch, _options.max_batch));
}

double batch_controller::margin_ms() const {
    return std::max(k_dev * _dev_ms, margin_floor * _options.slo_ms);
}

double batch_controller::grow_margin_ms() const {
    return std::max(k_dev * _dev_hold_ms, margin_floor * _options.slo_ms);
}

// The service time a batch size is expected to take: its own measurement where it has run,
// however old (past a knee the line underrates it; and the line also moves with the partial
// batches of a light load, which say little about this size), else the line. A device that
// slows as a whole rescales the measurements too (observe()).
double batch_controller::expect_ms(uint32_t batch) const {
    if (batch < _sizes.size() && _sizes[batch].count) return _sizes[batch].ewma_ms;
    return predict_ms(batch);
}

// The fitted line. A size's own EWMA is not used here even where it differs: on a noisy host
// it is the average of a few samples, and the per-size differences it shows are mostly noise
// (believing the slow ones biases every target downwards: smaller batches, less capacity, a
// backlog). Where a device really bends (the cpu backend's time per request rises again once a
// batch leaves the caches) the sizes past the bend pull the line up as they are run, and
// throughput_batch() judges sizes by their own measurements.
double batch_controller::predict_ms(uint32_t batch) const {
    if (_batches == 0 || batch == 0) return 0;
    return std::max(0.0, _a_ms + _c_ms * batch);
}

void batch_controller::refit() {
    const auto weight = [this](const size_stats& s) {
        const double age = double(_batches - s.last);
        return std::max(double(std::min(s.count, count_cap)) * std::exp2(-age / half_life), 1e-9);
    };
    double sw = 0, sx = 0, sy = 0;
    int distinct = 0;
    for (size_t b = 1; b < _sizes.size(); ++b) {
        if (!_sizes[b].count) continue;
        const double w = weight(_sizes[b]);
        sw += w;
        sx += w * double(b);
        sy += w * _sizes[b].ewma_ms;
        ++distinct;
    }
    if (sw <= 0) return;
    const double xm = sx / sw, ym = sy / sw;
    double sxx = 0, sxy = 0, sxx0 = 0, sxy0 = 0;
    for (size_t b = 1; b < _sizes.size(); ++b) {
        if (!_sizes[b].count) continue;
        const double w = weight(_sizes[b]), x = double(b), y = _sizes[b].ewma_ms;
        sxx += w * (x - xm) * (x - xm);
        sxy += w * (x - xm) * (y - ym);
        sxx0 += w * x * x;
        sxy0 += w * x * y;
    }
    // With one size (or sizes whose weights have all but vanished) the slope is unknown:
    // assume all the time is per request (t = b x t(b0)/b0). That over-predicts larger
    // batches when there is a fixed cost, so growth errs on the side of the SLO.
    if (distinct < 2 || sxx <= 1e-9 * sw * xm * xm) {
        _a_ms = 0;
        _c_ms = ym / xm;
        return;
    }
    _c_ms = sxy / sxx;
    _a_ms = ym - _c_ms * xm;
    if (_c_ms < 0) {
        // Larger batches measured faster: noise on a flat region. Believing it would send the
        // batch to max_batch on nothing; the proportional line is the safe reading.
        _a_ms = 0;
        _c_ms = ym / xm;
    } else if (_a_ms < 0) {
        // A negative fixed cost is not physical: fit through the origin instead.
        _a_ms = 0;
        _c_ms = sxy0 / sxx0;
    }
}

uint32_t batch_controller::slo_batch() const {
    if (_batches == 0) return _options.min_batch;
    // The queue wait a batch size implies: under a load that keeps the device busy, the
    // request that arrives just after a launch waits for that batch, then runs in its own,
    // so a batch of b has a worst latency of two service times t(b).
    const double m = grow_margin_ms();
    for (uint32_t b = _options.max_batch; b > _options.min_batch; --b)
        if (2 * predict_ms(b) + m <= _options.slo_ms) return b;
    return _options.min_batch;
}

bool batch_controller::dispatch_now(uint32_t queued, double oldest_wait_ms) const {
    if (queued == 0) return false;
    if (queued >= _target) return true;
    // Clipper runs whatever is queued as soon as the model is free; its batch size only caps.
    if (_options.policy == batching_policy::aimd) return true;
    // Nothing learned yet: no basis for waiting, and a first measurement is worth more.
    if (_batches == 0) return true;
    const double t = predict_ms(_target);
    // fixed: wait for a full batch unless the oldest request would then miss the SLO.
    if (_options.policy == batching_policy::fixed) return oldest_wait_ms + t + margin_ms() >= _options.slo_ms;
    // slab: waiting for a fuller batch buys efficiency (fewer, larger launches: device time
    // for other IFs) with the requests' headroom. It stops while the oldest request can still
    // absorb its own batch and one more service time, the same two-batch budget target() is
    // sized by: requests that arrive behind this launch wait for it, and idling until the
    // oldest's last moment leaves them no room, so under load every burst becomes misses.
    // When the SLO sizes the target the budget is about zero and a batch goes as soon as the
    // device is free; it opens up when max_batch bounds the batch instead.
    return oldest_wait_ms + 2 * t + margin_ms() >= _options.slo_ms;
}

void batch_controller::observe(uint32_t batch, double service_ms, double worst_latency_ms) {
    if (batch == 0 || batch >= max_sizes || !std::isfinite(service_ms) || service_ms < 0 ||
        !std::isfinite(worst_latency_ms))
        return;
    const double dev_before = _dev_ms;
    if (_batches == 0) {
        _dev_ms = 0.1 * service_ms;  // a first guess; residuals take over from the next batch
    } else {
        // Within a shift's window every sample first refines its form (learn_shift); what is
        // still off after that is judged as usual, and may start another shift.
        if (_learn_left > 0) learn_shift(batch, service_ms);
        const double predicted = predict_ms(batch);
        const double residual = service_ms - predicted;
        // A device that slows down (another tenant, thermal limits, a smaller GPU share) slows
        // every batch size alike, but only the size being run shows it: rescale the whole
        // table so that sizes not run lately are not read at the old speed (which would tilt
        // the line and send the batch size the wrong way). Only sizes run lately count as
        // evidence: a size run for the first time in a while may simply sit off the line (past
        // a knee), which is not a change of the device.
        // So does a size just below one run lately (within a quarter of it): when the device
        // slows, the margin grows with the misses and moves the target down by a size or two
        // per batch, and each new size would otherwise restart the run, leaving the change to
        // the slow per-size averages. Not above: past a knee the line underrates sizes not
        // run yet, and that is not a change of the device.
        const auto recent = [this](int64_t b) {
            return b >= 1 && b < int64_t(_sizes.size()) && _sizes[size_t(b)].count &&
                   double(_batches - _sizes[size_t(b)].last) <= half_life;
        };
        bool known = false;
        const int64_t near = std::max<int64_t>(1, int64_t(batch) / 4);
        for (int64_t b = int64_t(batch); b <= int64_t(batch) + near && !known; ++b) known = recent(b);
        // Judged against the size's own recent measurement where it has one: the line bends
        // away from sizes at the ends of a curve with a knee, and a size the line misreads is
        // not a device that changed.
        const double expected = recent(batch) ? _sizes[batch].ewma_ms : predicted;
        const double off = service_ms - expected;
        // And only batches of at least half the target: under a light load most batches are
        // a few requests, whose times jitter by half on this kind of host (caches, wake-ups),
        // and a shift read off them would move the sizes that matter on noise.
        if (known && 2 * batch >= _target && expected > 0 && std::abs(off) > shift_rel * expected) {
            const bool same_side = _shift_run && (off > 0) == _shift_up;
            if (!same_side) {
                _shift_up = off > 0;
                _shift_base.resize(_sizes.size());
                for (size_t b = 0; b < _sizes.size(); ++b) _shift_base[b] = _sizes[b].ewma_ms;
                _shift_a = _a_ms;
                _shift_c = _c_ms;
                _shift_samples.clear();
            }
            _shift_run = same_side ? _shift_run + 1 : 1;
            _shift_ratio = (same_side ? _shift_ratio : 0) + service_ms / expected;
            _shift_samples.emplace_back(batch, service_ms);
            if (_shift_run >= shift_batches) {
                // From the table as it was before the shift: sizes run during it have partly
                // moved already and would be scaled twice.
                const double f = _shift_ratio / _shift_run;
                for (size_t b = 0; b < _shift_base.size(); ++b)
                    if (_shift_base[b] > 0) _sizes[b].ewma_ms = _shift_base[b] * f;
                _learn_base = _shift_base;
                _learn_a = _shift_a;
                _learn_c = _shift_c;
                _learn_samples = _shift_samples;
                _learn_left = learn_batches;
                _learn_at = _batches;
                _shift_run = 0;
                _shift_ratio = 0;
                refit();
            }
        } else {
            _shift_run = 0;
            _shift_ratio = 0;
        }
        // Clipped (at 4 deviations, or clip_rel): a lone spike raises the margin a little
        // instead of shrinking the batch for the next ten batches; noise that lasts still
        // doubles the deviation every few batches until it is matched.
        // A batch far faster than the model says (past shift_rel) is not noise to guard
        // against but a device that got faster (another IF stopped) or a model that overrates
        // it: it must not widen the margin, which would shrink the batch just when the device
        // has room. It counts as one deviation (no change).
        const double spread = residual < -shift_rel * predicted ? _dev_ms : std::abs(residual);
        _dev_ms += dev_gain * (std::min(spread, std::max(4 * _dev_ms, clip_rel * predicted)) - _dev_ms);
    }
    _dev_hold_ms = std::max(_dev_ms, _batches ? _dev_hold_ms * std::exp2(-1 / hold_half_life) : 0.0);
    ++_batches;
    if (batch >= _sizes.size()) _sizes.resize(batch + 1);
    size_stats& s = _sizes[batch];
    if (s.count) {
        // An outlier moves its size's entry only as far as the clipping band: a single
        // spike (steal, a page fault storm) must not stay in the table, where it would hold
        // the batch size down long after the device is back; the margin, through the
        // deviation, already answers it. A lasting change is taken up whole above.
        const double band = std::max(clip_devs * dev_before, clip_rel * s.ewma_ms);
        const double x = std::clamp(service_ms, s.ewma_ms - band, s.ewma_ms + band);
        s.ewma_ms += size_gain * (x - s.ewma_ms);
    } else {
        s.ewma_ms = service_ms;
    }
    ++s.count;
    s.last = _batches;
    refit();
    switch (_options.policy) {
    case batching_policy::slab: observe_slab(batch, service_ms, worst_latency_ms); break;
    case batching_policy::aimd: observe_aimd(batch, service_ms); break;
    case batching_policy::fixed: break;
    }
    _last_service_ms = service_ms;
}

// The service time of a batch size before the last shift: its entry in the table then, or the
// line then for a size that had not run.
double batch_controller::base_ms(uint32_t batch) const {
    if (batch < _learn_base.size() && _learn_base[batch] > 0) return _learn_base[batch];
    return std::max(0.0, _learn_a + _learn_c * batch);
}

// A shift seen at several sizes: t_new(b) = f t_old(b) + d, fitted to the samples by least
// squares under one constraint: a device that got slower made no size faster, and one that got
// faster made none slower (checked at the table's ends: f t + d against t for the smallest and
// the largest size; the constraint is linear, so the ends suffice). Within it any form is
// allowed: a ratio (a slower device, a smaller share), a fixed cost (another IF's kernels ahead
// of every batch), or a flat time (a batch that mostly waits for another IF's, whatever its
// size). Noise between two sizes can then not make large batches cheaper than before a
// slowdown. Fitted on the boundary where the free fit breaks the constraint; with no
// spread between the sizes, nothing is learned (the ratio stays). Rebuilds the table from the
// one before the shift.
void batch_controller::learn_shift(uint32_t batch, double service_ms) {
    --_learn_left;
    if (_learn_samples.size() >= size_t(learn_batches + shift_batches)) return;
    _learn_samples.emplace_back(batch, service_ms);
    uint32_t lo = ~0u, hi = 0;
    double sx = 0, sy = 0;
    for (const auto& [b, y] : _learn_samples) {
        lo = std::min(lo, b);
        hi = std::max(hi, b);
        sx += base_ms(b);
        sy += y;
    }
    const double n = double(_learn_samples.size());
    if (hi < lo + std::max(1.0, std::ceil(min_spread * lo)) || !(sx > 0)) return;
    const double xm = sx / n, ym = sy / n, ratio = sy / sx;
    double sxx = 0;
    for (const auto& [b, y] : _learn_samples) sxx += (base_ms(b) - xm) * (base_ms(b) - xm);
    if (!(sxx > 1e-6 * xm * xm * n)) return;  // the sizes took the same time before: no slope to learn
    const bool slower = ratio >= 1;
    const double ends[2] = {base_ms(std::max<uint32_t>(1, _options.min_batch)),
                            base_ms(std::max<uint32_t>(_options.max_batch, uint32_t(_learn_base.size()) - 1))};
    const auto feasible = [&](double f, double d) {
        if (!(f >= 0) || !std::isfinite(f) || !std::isfinite(d)) return false;
        for (const double t : ends)
            if (slower ? f * t + d < t * (1 - 1e-9) : f * t + d > t * (1 + 1e-9)) return false;
        return true;
    };
    const auto sse = [&](double f, double d) {
        double e = 0;
        for (const auto& [b, y] : _learn_samples) e += (y - f * base_ms(b) - d) * (y - f * base_ms(b) - d);
        return e;
    };
    // Candidates: the free fit, the fits through each end's boundary point (t, t), and the two
    // pure readings (which meet the constraint whenever any line does near the samples).
    std::vector<std::pair<double, double>> candidates;
    double sxy = 0;
    for (const auto& [b, y] : _learn_samples) sxy += (base_ms(b) - xm) * (y - ym);
    candidates.emplace_back(sxy / sxx, ym - sxy / sxx * xm);
    for (const double t : ends) {
        double num = 0, den = 0;  // y - t = f (x - t)
        for (const auto& [b, y] : _learn_samples) {
            num += (y - t) * (base_ms(b) - t);
            den += (base_ms(b) - t) * (base_ms(b) - t);
        }
        if (den > 0) candidates.emplace_back(num / den, t * (1 - num / den));
    }
    candidates.emplace_back(ratio, 0.0);
    candidates.emplace_back(1.0, ym - xm);
    double f = ratio, d = 0, best = std::numeric_limits<double>::infinity();
    for (const auto& [cf, cd] : candidates)
        if (feasible(cf, cd) && sse(cf, cd) < best) {
            best = sse(cf, cd);
            f = cf;
            d = cd;
        }
    // Only sizes run shortly before the shift describe the device the shift started from; an
    // older entry may predate an earlier change that was followed without a shift (the target
    // slid away from it), and a fixed cost applied to it can make it absurdly fast or slow.
    // Such sizes are forgotten: the line speaks for them until they run again.
    for (size_t b = 1; b < _learn_base.size() && b < _sizes.size(); ++b) {
        if (!(_learn_base[b] > 0)) continue;
        if (double(_learn_at - std::min(_learn_at, _sizes[b].last)) > half_life) {
            _sizes[b] = size_stats{};
            _learn_base[b] = 0;
            continue;
        }
        _sizes[b].ewma_ms = std::max(0.05 * _learn_base[b], f * _learn_base[b] + d);
    }
    refit();
}

// SLAB. GSLICE moves each IF's batch size in proportion to its headroom (SLO - observed
// latency) and deviation, growing fast while there is headroom and shrinking before the SLO is
// missed. Here the learned line turns the headroom into a batch size directly: the target is
// the largest batch whose predicted worst latency plus k x deviation fits (one step instead of
// many small ones, which is what makes it converge in a handful of batches; the deviation is
// what shrinks it before a miss), and growth is capped at doubling per batch so that a line
// fitted on small batches is never extrapolated far in one go. A slower device is met by the
// level-shift rescaling in observe() within two batches.
//
// The end-to-end latency is not fed back as a reason to shrink: beyond the batch ahead, a
// request's wait is backlog (a burst, arrivals above capacity, a stalled host), and a smaller
// batch lowers capacity and lengthens the backlog, a spiral. It is read the other way: a full
// batch whose oldest request waited longer than the batch ahead (and than dispatch_now may
// hold a batch) means requests are being left behind, and then the batch size limits
// throughput, not latency. Until a batch is not full again, SLAB drains: the target moves (at
// the same doubling rate when it grows) to the batch with the best measured throughput whose
// own service time fits the SLO, which clears a burst in fewer, more efficient batches instead
// of leaving part of it for the next round. (Requests that cannot make their SLO anyway are
// the IF's to shed.)
void batch_controller::observe_slab(uint32_t batch, double service_ms, double worst_ms) {
    const double slo = _options.slo_ms, m = margin_ms();
    const double wait = std::max(0.0, worst_ms - service_ms);
    const double ahead = _last_service_ms > 0 ? _last_service_ms : service_ms;
    const double hold = std::max(0.0, slo - 2 * predict_ms(_target) - m);
    if (batch >= _target && wait > ahead + hold + margin_floor * slo)
        _draining = true;
    else if (batch < _target)
        _draining = false;
    // Never past the throughput optimum: a batch larger than the one that serves the most
    // requests per second (as measured; past a knee the cpu backend's time per request rises
    // again) costs latency and device time and buys nothing. It also keeps the normal and the
    // drain-mode targets together, so that a backlog does not flip the batch size between two
    // far-apart values.
    const int64_t next = _draining ? throughput_batch() : std::min(slo_batch(), throughput_batch());
    if (next > int64_t(_target)) {
        _target = clamp(std::min<int64_t>(next, 2 * int64_t(_target)));
    } else if (next < int64_t(_target)) {
        if (_draining) {
            _target = clamp(next);
            return;
        }
        // The hysteresis band (k_keep): a smaller batch is taken only once the current one no
        // longer fits with the narrower margin, and then the largest that does (at least
        // `next`): a burst of noise costs a step or two, not a fall to the full-margin size
        // that the next quiet stretch would climb back from. A device that really slowed fails
        // the test for every size its slowdown rules out, so safety comes at once all the same.
        // Only sizes that have run are kept on their own evidence; the line's word on the
        // others is what `next` already says (past a knee the line underrates them).
        const double keep_margin = std::max(k_keep * _dev_ms, margin_floor * slo);
        const auto kept = [&](int64_t b) {
            return b < int64_t(_sizes.size()) && _sizes[b].count && 2 * expect_ms(uint32_t(b)) + keep_margin <= slo;
        };
        int64_t b = _target;
        while (b > next && !kept(b)) --b;
        _target = clamp(b);
    }
}

// The batch that serves the most requests per second among those whose own service time fits
// the SLO: the largest within throughput_tolerance of the best (fewer launches; and on a flat
// curve, as the cpu backend's is, the per-size measurements' noise would otherwise move the
// argmax, and the batch size with it, from one batch to the next). A size that has run is
// judged by its own measurements, however old (level shifts keep them at the device's current speed): on a
// device with a knee the line overrates the sizes past it and underrates those before it, and
// a backlog is exactly when that mistake costs most. Sizes not run yet are read off the line,
// so a backlog also explores them. No margin: it protects requests that can still be on time,
// and in a backlog the ones it would protect are late already; on an erratic host (stalls
// inflate the deviation until the margin exceeds the SLO) it would pin the batch at min_batch
// exactly when capacity is needed.
uint32_t batch_controller::throughput_batch() const {
    if (_batches == 0) return _options.min_batch;
    const auto rate = [this](uint32_t b) {
        const double t = expect_ms(b);
        return t > _options.slo_ms ? -1.0 : t > 0 ? b / t : 0.0;
    };
    double best_rate = 0;
    for (uint32_t b = _options.min_batch; b <= _options.max_batch; ++b) best_rate = std::max(best_rate, rate(b));
    for (uint32_t b = _options.max_batch; b > _options.min_batch; --b)
        if (rate(b) >= throughput_tolerance * best_rate) return b;
    return _options.min_batch;
}

// AIMD as in Clipper: the signal is the batch's own processing latency against the SLO
// (Clipper's definition), not the end-to-end latency, so queueing never triggers a decrease
// that would shrink throughput under a backlog. The size only grows when a full batch was
// run: a smaller batch says nothing about whether the target itself fits.
void batch_controller::observe_aimd(uint32_t batch, double service_ms) {
    if (service_ms > _options.slo_ms) {
        const int64_t cut = std::min<int64_t>(int64_t(_target) - 1, int64_t(std::floor(_target * aimd_backoff)));
        _target = clamp(cut);
    } else if (batch >= _target) {
        _target = clamp(int64_t(_target) + 1);
    }
}

}  // namespace reefline::ifm
