#include "preempt/abacus.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace reefline::gpu::abacus {

namespace {

using json = nlohmann::json;

// Bounds of what a predictor file may describe: enough for any appliance's model set, small
// enough that a prediction runs on the stack.
constexpr size_t max_models = 32;
constexpr int max_width = 256;
constexpr size_t max_layers = 8;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
    throw std::invalid_argument(where + ": " + what);
}

double number_at(const json& j, const char* key, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number()) bad(where, std::string("\"") + key + "\" missing or not a number");
    const double v = it->get<double>();
    if (!std::isfinite(v)) bad(where, std::string("\"") + key + "\" is not finite");
    return v;
}

std::vector<float> floats_at(const json& j, const char* key, size_t n, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array()) bad(where, std::string("\"") + key + "\" missing or not an array");
    if (it->size() != n)
        bad(where, std::string("\"") + key + "\" has " + std::to_string(it->size()) + " numbers, " + std::to_string(n) +
                       " expected");
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        const json& x = (*it)[i];
        // Finite as a float too: weights are floats, and 1e39 is not one.
        if (!x.is_number() || !std::isfinite(x.get<double>()) || !std::isfinite(float(x.get<double>())))
            bad(where, std::string("\"") + key + "\"[" + std::to_string(i) + "] is not a finite number");
        v[i] = x.get<float>();
    }
    return v;
}

// Names and the device are shown by tools and in the daemon's replies: printable ASCII only.
bool printable(const std::string& s, size_t most) {
    if (s.empty() || s.size() > most) return false;
    for (const char c : s)
        if (c < 0x20 || c > 0x7e) return false;
    return true;
}

double relative_error_pct(double predicted, double measured) {
    return measured > 0 ? 100.0 * std::abs(predicted - measured) / measured : 0.0;
}

error_stats stats_of(std::vector<double> errs) {
    error_stats s;
    s.groups = errs.size();
    if (errs.empty()) return s;
    double sum = 0;
    for (double e : errs) sum += e;
    s.mean_pct = sum / double(errs.size());
    std::sort(errs.begin(), errs.end());
    s.p95_pct = errs[std::min(errs.size() - 1, size_t(0.95 * double(errs.size())))];
    return s;
}

}  // namespace

uint64_t model_key(std::string_view bytes) {
    uint64_t h = 1469598103934665603ull;
    for (const char c : bytes) h = (h ^ uint8_t(c)) * 1099511628211ull;
    return h;
}

std::string key_text(uint64_t key) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(key));
    return buf;
}

int32_t predictor::index_of(uint64_t key) const {
    for (size_t i = 0; i < _models.size(); ++i)
        if (_models[i].key == key) return int32_t(i);
    return -1;
}

bool predictor::covers(std::span<const segment> group) const {
    if (_models.empty() || group.empty()) return false;
    for (const segment& s : group)
        if (s.model < 0 || size_t(s.model) >= _models.size()) return false;
    return true;
}

void predictor::features(std::span<const segment> group, float* x) const {
    std::fill(x, x + inputs(), 0.0f);
    for (const segment& s : group) {
        const model_entry& m = _models[size_t(s.model)];
        float* f = x + s.model * features_per_model;
        const float k = float(std::max<uint32_t>(1, s.kernels));
        f[0] += 1;
        f[1] += float(s.start) / k;
        f[2] += float(s.end) / k;
        f[3] += float(s.end - std::min(s.start, s.end)) / k;
        f[4] += float(s.batch) / float(std::max<uint32_t>(1, m.max_batch));
        f[5] += m.max_length ? float(s.length) / float(m.max_length) : 0.0f;
        f[6] += float(s.profile_us / 1e3);
    }
}

double predictor::mlp_raw(const float* x) const {
    std::array<float, max_width> a{}, b{};
    std::copy(x, x + inputs(), a.begin());
    for (size_t l = 0; l < _layers.size(); ++l) {
        const layer& L = _layers[l];
        const bool last = l + 1 == _layers.size();
        for (int o = 0; o < L.out; ++o) {
            const float* w = L.w.data() + size_t(o) * size_t(L.in);
            float s = L.b[size_t(o)];
            for (int i = 0; i < L.in; ++i) s += w[i] * a[size_t(i)];
            b[size_t(o)] = last ? s : std::max(0.0f, s);
        }
        std::swap(a, b);
    }
    return double(a[0]);
}

double predictor::predict_us(std::span<const segment> group) const {
    if (!covers(group) || _layers.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::array<float, max_width> x{};
    features(group, x.data());
    // The ratio to the profiles within 4 standard deviations of the ratios it was trained on:
    // a small MLP fitted to noisy samples can extrapolate wildly (a group "taking" minutes), and
    // the scheduler drops a query whose prediction exceeds its deadline. At least a microsecond
    // (no group takes less; an output that underflows must not read as a free group).
    const double z = std::clamp(mlp_raw(x.data()), -4.0, 4.0);
    return std::max(1.0, profile_base_us(group) * std::exp(z * _y_std + _y_mean));
}

double predictor::profile_base_us(std::span<const segment> group) {
    double us = 0;
    for (const segment& s : group) us += s.profile_us;
    return std::max(1.0, us);
}

double predictor::predict_linear_us(std::span<const segment> group) const {
    if (!covers(group) || _linear_w.size() != size_t(inputs()) + 1) return std::numeric_limits<double>::quiet_NaN();
    std::array<float, max_width> x{};
    features(group, x.data());
    double s = _linear_w.back();
    for (int i = 0; i < inputs(); ++i) s += _linear_w[size_t(i)] * double(x[size_t(i)]);
    return std::max(1.0, s);
}

error_stats predictor::mlp_error(std::span<const sample> samples) const {
    std::vector<double> e;
    for (const sample& s : samples)
        if (covers(s.group)) e.push_back(relative_error_pct(predict_us(s.group), s.us));
    return stats_of(std::move(e));
}

error_stats predictor::linear_error(std::span<const sample> samples) const {
    std::vector<double> e;
    for (const sample& s : samples)
        if (covers(s.group)) e.push_back(relative_error_pct(predict_linear_us(s.group), s.us));
    return stats_of(std::move(e));
}

// ---- training ---------------------------------------------------------------------------------

predictor predictor::train(std::vector<model_entry> models, std::span<const sample> samples, const fit_options& o) {
    if (models.empty() || models.size() > max_models)
        throw std::invalid_argument("abacus: a predictor covers 1 to " + std::to_string(max_models) + " models");
    if (o.hidden_layers < 1 || o.hidden < 1 || o.hidden > max_width || size_t(o.hidden_layers) + 1 > max_layers)
        throw std::invalid_argument("abacus: hidden layers 1.." + std::to_string(max_layers - 1) + " of 1.." +
                                    std::to_string(max_width));
    predictor p;
    p._models = std::move(models);
    for (model_entry& m : p._models) {  // names are shown: printable ASCII, as parse() demands
        for (char& c : m.name)
            if (c < 0x20 || c > 0x7e) c = '_';
        if (m.name.empty()) m.name = "model";
        if (m.name.size() > 128) m.name.resize(128);
    }
    const int d = p.inputs();
    std::vector<float> X;
    std::vector<double> y;
    for (const sample& s : samples) {
        if (!p.covers(s.group)) throw std::invalid_argument("abacus: a sample's model is not among the predictor's");
        if (!(s.us > 0) || !std::isfinite(s.us)) continue;
        X.resize(X.size() + size_t(d));
        p.features(s.group, X.data() + X.size() - size_t(d));
        y.push_back(s.us);
    }
    const size_t n = y.size();
    if (n < 8) throw std::invalid_argument("abacus: at least 8 measured groups are needed to train, got " + std::to_string(n));

    // Linear regression on the duration itself (an additive model of each model's part, which
    // is what running segments back to back would take): ridge-regularised normal equations.
    {
        const size_t m = size_t(d) + 1;
        std::vector<double> A(m * m, 0.0), rhs(m, 0.0);
        for (size_t r = 0; r < n; ++r) {
            std::vector<double> row(m, 1.0);
            for (int i = 0; i < d; ++i) row[size_t(i)] = X[r * size_t(d) + size_t(i)];
            for (size_t i = 0; i < m; ++i) {
                rhs[i] += row[i] * y[r];
                for (size_t j = 0; j < m; ++j) A[i * m + j] += row[i] * row[j];
            }
        }
        for (size_t i = 0; i + 1 < m; ++i) A[i * m + i] += 1e-6 * double(n);  // features never present stay 0
        // Gaussian elimination with partial pivoting.
        std::vector<double> w = rhs;
        for (size_t c = 0; c < m; ++c) {
            size_t piv = c;
            for (size_t r = c + 1; r < m; ++r)
                if (std::abs(A[r * m + c]) > std::abs(A[piv * m + c])) piv = r;
            if (std::abs(A[piv * m + c]) < 1e-12) continue;
            if (piv != c) {
                for (size_t j = 0; j < m; ++j) std::swap(A[c * m + j], A[piv * m + j]);
                std::swap(w[c], w[piv]);
            }
            for (size_t r = 0; r < m; ++r) {
                if (r == c) continue;
                const double f = A[r * m + c] / A[c * m + c];
                if (f == 0) continue;
                for (size_t j = c; j < m; ++j) A[r * m + j] -= f * A[c * m + j];
                w[r] -= f * w[c];
            }
        }
        for (size_t c = 0; c < m; ++c) w[c] = std::abs(A[c * m + c]) < 1e-12 ? 0.0 : w[c] / A[c * m + c];
        p._linear_w = std::move(w);
    }

    // The MLP on the standardised log of the duration over the parts' profiled times back to
    // back: full-batch Adam on the mean squared error.
    std::vector<double> t(n);
    double mean = 0, var = 0;
    {
        size_t r = 0;
        for (const sample& s : samples)
            if (s.us > 0 && std::isfinite(s.us)) {
                t[r] = std::log(s.us / profile_base_us(s.group));
                mean += t[r];
                ++r;
            }
    }
    mean /= double(n);
    for (size_t r = 0; r < n; ++r) var += (t[r] - mean) * (t[r] - mean);
    p._y_mean = mean;
    p._y_std = std::max(1e-3, std::sqrt(var / double(n)));
    for (double& v : t) v = (v - mean) / p._y_std;

    std::mt19937_64 rng(o.seed);
    std::vector<int> widths{d};
    for (int l = 0; l < o.hidden_layers; ++l) widths.push_back(o.hidden);
    widths.push_back(1);
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
        layer L;
        L.in = widths[l];
        L.out = widths[l + 1];
        std::normal_distribution<float> init(0.0f, std::sqrt(2.0f / float(L.in)));
        L.w.resize(size_t(L.in) * size_t(L.out));
        for (float& w : L.w) w = init(rng);
        L.b.assign(size_t(L.out), 0.0f);
        p._layers.push_back(std::move(L));
    }
    const size_t nl = p._layers.size();
    // Adam state per parameter.
    std::vector<std::vector<double>> mw(nl), vw(nl), mb(nl), vb(nl), gw(nl), gb(nl);
    for (size_t l = 0; l < nl; ++l) {
        mw[l].assign(p._layers[l].w.size(), 0);
        vw[l] = mw[l];
        gw[l] = mw[l];
        mb[l].assign(p._layers[l].b.size(), 0);
        vb[l] = mb[l];
        gb[l] = mb[l];
    }
    // Activations per layer for every sample (n x width).
    std::vector<std::vector<float>> act(nl + 1);
    act[0] = X;
    for (size_t l = 0; l < nl; ++l) act[l + 1].assign(n * size_t(p._layers[l].out), 0.0f);
    std::vector<std::vector<float>> delta(nl + 1);
    for (size_t l = 0; l <= nl; ++l) delta[l].assign(n * size_t(widths[l]), 0.0f);
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int epoch = 1; epoch <= o.epochs; ++epoch) {
        // Forward.
        for (size_t l = 0; l < nl; ++l) {
            const layer& L = p._layers[l];
            const bool last = l + 1 == nl;
            for (size_t r = 0; r < n; ++r) {
                const float* in = act[l].data() + r * size_t(L.in);
                float* out = act[l + 1].data() + r * size_t(L.out);
                for (int j = 0; j < L.out; ++j) {
                    const float* w = L.w.data() + size_t(j) * size_t(L.in);
                    float s = L.b[size_t(j)];
                    for (int i = 0; i < L.in; ++i) s += w[i] * in[i];
                    out[j] = last ? s : std::max(0.0f, s);
                }
            }
        }
        // Backward: d(mse)/d(output) = 2 (out - t) / n.
        for (size_t r = 0; r < n; ++r) delta[nl][r] = float(2.0 * (double(act[nl][r]) - t[r]) / double(n));
        for (size_t l = nl; l-- > 0;) {
            const layer& L = p._layers[l];
            std::fill(gw[l].begin(), gw[l].end(), 0.0);
            std::fill(gb[l].begin(), gb[l].end(), 0.0);
            std::fill(delta[l].begin(), delta[l].end(), 0.0f);
            for (size_t r = 0; r < n; ++r) {
                const float* in = act[l].data() + r * size_t(L.in);
                const float* dout = delta[l + 1].data() + r * size_t(L.out);
                float* din = delta[l].data() + r * size_t(L.in);
                for (int j = 0; j < L.out; ++j) {
                    const float g = dout[j];
                    if (g == 0) continue;
                    gb[l][size_t(j)] += g;
                    const float* w = L.w.data() + size_t(j) * size_t(L.in);
                    double* gwr = gw[l].data() + size_t(j) * size_t(L.in);
                    for (int i = 0; i < L.in; ++i) {
                        gwr[i] += double(g) * in[i];
                        din[i] += g * w[i];
                    }
                }
                if (l > 0)  // through the ReLU of the layer below
                    for (int i = 0; i < L.in; ++i)
                        if (in[i] <= 0) din[i] = 0;
            }
        }
        // Adam step (decoupled weight decay on weights only).
        const double c1 = 1 - std::pow(b1, epoch), c2 = 1 - std::pow(b2, epoch);
        for (size_t l = 0; l < nl; ++l) {
            layer& L = p._layers[l];
            for (size_t i = 0; i < L.w.size(); ++i) {
                mw[l][i] = b1 * mw[l][i] + (1 - b1) * gw[l][i];
                vw[l][i] = b2 * vw[l][i] + (1 - b2) * gw[l][i] * gw[l][i];
                const double step = o.learning_rate * (mw[l][i] / c1) / (std::sqrt(vw[l][i] / c2) + eps);
                L.w[i] = float(double(L.w[i]) * (1 - o.learning_rate * o.weight_decay) - step);
            }
            for (size_t i = 0; i < L.b.size(); ++i) {
                mb[l][i] = b1 * mb[l][i] + (1 - b1) * gb[l][i];
                vb[l][i] = b2 * vb[l][i] + (1 - b2) * gb[l][i] * gb[l][i];
                L.b[i] = float(double(L.b[i]) - o.learning_rate * (mb[l][i] / c1) / (std::sqrt(vb[l][i] / c2) + eps));
            }
        }
    }
    return p;
}

// ---- the file ---------------------------------------------------------------------------------

std::string predictor::to_json() const {
    json models = json::array();
    for (const model_entry& m : _models)
        models.push_back({{"name", m.name}, {"key", key_text(m.key)}, {"max_batch", m.max_batch}, {"max_length", m.max_length}});
    json layers = json::array();
    for (const layer& L : _layers) layers.push_back({{"in", L.in}, {"out", L.out}, {"w", L.w}, {"b", L.b}});
    json j = {{"abacus_predictor", 1},
              {"device", device},
              {"features_per_model", features_per_model},
              {"models", models},
              {"mlp", {{"layers", layers}, {"target", "log(duration / profiled time)"}, {"y_mean", _y_mean}, {"y_std", _y_std}}},
              {"held_out",
               {{"groups", held_out_mlp.groups},
                {"mlp_err_pct", held_out_mlp.mean_pct},
                {"mlp_p95_pct", held_out_mlp.p95_pct},
                {"linear_err_pct", held_out_linear.mean_pct},
                {"linear_p95_pct", held_out_linear.p95_pct}}}};
    if (!_linear_w.empty()) j["linear"] = _linear_w;  // optional: the baseline, for comparison
    return j.dump(1) + "\n";
}

predictor predictor::parse(const std::string& text, const std::string& where) {
    json j;
    try {
        j = json::parse(text);
    } catch (const std::exception& e) {
        bad(where, std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) bad(where, "not a JSON object");
    if (!j.contains("abacus_predictor") || !j["abacus_predictor"].is_number_integer() || j["abacus_predictor"].get<int64_t>() != 1)
        bad(where, "not an Abacus predictor file (\"abacus_predictor\": 1 missing)");
    if (number_at(j, "features_per_model", where) != features_per_model)
        bad(where, "\"features_per_model\" must be " + std::to_string(features_per_model));
    predictor p;
    if (j.contains("device")) {
        if (!j["device"].is_string() ||
            (!j["device"].get<std::string>().empty() && !printable(j["device"].get<std::string>(), 256)))
            bad(where, "\"device\" must be printable ASCII of at most 256 characters");
        p.device = j["device"].get<std::string>();
    }
    const auto models = j.find("models");
    if (models == j.end() || !models->is_array() || models->empty() || models->size() > max_models)
        bad(where, "\"models\" must be an array of 1 to " + std::to_string(max_models) + " models");
    for (size_t i = 0; i < models->size(); ++i) {
        const json& m = (*models)[i];
        const std::string at = where + ": model " + std::to_string(i);
        if (!m.is_object()) bad(at, "not an object");
        model_entry e;
        if (!m.contains("name") || !m["name"].is_string() || !printable(m["name"].get<std::string>(), 128))
            bad(at, "\"name\" must be printable ASCII of 1 to 128 characters");
        e.name = m["name"].get<std::string>();
        if (!m.contains("key") || !m["key"].is_string() || m["key"].get<std::string>().size() != 16)
            bad(at, "\"key\" must be 16 hex digits");
        const std::string k = m["key"].get<std::string>();
        for (const char c : k)
            if (!std::isxdigit(static_cast<unsigned char>(c))) bad(at, "\"key\" must be 16 hex digits");
        e.key = std::stoull(k, nullptr, 16);
        const double mb = number_at(m, "max_batch", at), ml = number_at(m, "max_length", at);
        if (mb < 1 || mb > 65536 || mb != std::floor(mb)) bad(at, "\"max_batch\" must be an integer 1..65536");
        if (ml < 0 || ml > 1e6 || ml != std::floor(ml)) bad(at, "\"max_length\" must be an integer 0..1000000");
        e.max_batch = uint32_t(mb);
        e.max_length = uint32_t(ml);
        p._models.push_back(std::move(e));
    }
    const auto mlp = j.find("mlp");
    if (mlp == j.end() || !mlp->is_object()) bad(where, "\"mlp\" missing");
    p._y_mean = number_at(*mlp, "y_mean", where + ": mlp");
    p._y_std = number_at(*mlp, "y_std", where + ": mlp");
    if (!(p._y_std > 0)) bad(where, "mlp: \"y_std\" must be positive");
    const auto layers = mlp->find("layers");
    if (layers == mlp->end() || !layers->is_array() || layers->size() < 2 || layers->size() > max_layers)
        bad(where, "mlp: \"layers\" must be an array of 2 to " + std::to_string(max_layers) + " layers");
    int in = p.inputs();
    for (size_t l = 0; l < layers->size(); ++l) {
        const json& L = (*layers)[l];
        const std::string at = where + ": mlp layer " + std::to_string(l);
        if (!L.is_object()) bad(at, "not an object");
        layer x;
        // Checked as numbers before they become ints: a width like 4e96 is a clear error, not a
        // conversion out of int's range.
        const double in_n = number_at(L, "in", at), out_n = number_at(L, "out", at);
        if (in_n != double(in)) {
            const bool whole = in_n == std::floor(in_n) && std::fabs(in_n) < 1e15;
            bad(at, "takes " + (whole ? std::to_string(int64_t(in_n)) : json(in_n).dump()) +
                        " inputs, the layer below gives " + std::to_string(in));
        }
        if (!(out_n >= 1 && out_n <= max_width) || out_n != std::floor(out_n))
            bad(at, "\"out\" must be an integer 1.." + std::to_string(max_width));
        x.in = in;
        x.out = int(out_n);
        if (l + 1 == layers->size() && x.out != 1) bad(at, "the output layer must have 1 output");
        x.w = floats_at(L, "w", size_t(x.in) * size_t(x.out), at);
        x.b = floats_at(L, "b", size_t(x.out), at);
        in = x.out;
        p._layers.push_back(std::move(x));
    }
    const auto lin = j.find("linear");
    if (lin != j.end()) {
        const std::vector<float> w = floats_at(j, "linear", size_t(p.inputs()) + 1, where);
        p._linear_w.assign(w.begin(), w.end());
    }
    if (j.contains("held_out") && j["held_out"].is_object()) {
        const json& h = j["held_out"];
        const auto num = [&](const char* k) { return h.contains(k) && h[k].is_number() ? h[k].get<double>() : 0.0; };
        p.held_out_mlp = {num("mlp_err_pct"), num("mlp_p95_pct"), size_t(num("groups"))};
        p.held_out_linear = {num("linear_err_pct"), num("linear_p95_pct"), size_t(num("groups"))};
    }
    return p;
}

}  // namespace reefline::gpu::abacus
