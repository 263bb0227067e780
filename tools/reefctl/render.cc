#include "tools/reefctl/render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "ifmanager/bounded_json.h"
#include "ifmanager/byte_size.h"
#include "tools/reefctl/client.h"

namespace reefline::reefctl {

namespace {

using json = nlohmann::json;

const json& member(const json& object, const char* key) {
    static const json null_value;
    if (!object.is_object()) return null_value;
    const auto it = object.find(key);
    return it == object.end() ? null_value : *it;
}

std::optional<double> number(const json& object, const char* key) {
    const json& v = member(object, key);
    if (!v.is_number()) return std::nullopt;
    return v.get<double>();
}

// Scalars as an operator would type them; arrays of scalars joined with ", ". Whatever the
// daemon sent, never throws and prints no control characters.
std::string plain(const json& v) {
    if (v.is_null()) return "-";
    if (v.is_string()) return printable(v.get<std::string>());
    if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
    if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
    if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15)
            return std::to_string(static_cast<long long>(d));
        // Six significant digits: the daemon's floats are often float32 values widened to
        // double (a mean of 123.675 arrives as 123.67500305175781), noise to an operator.
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", d);
        return buf;
    }
    if (v.is_array()) {
        bool scalars = std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_primitive(); });
        if (!scalars) return printable(ifm::serialise(v));
        std::string s;
        for (const auto& e : v) s += (s.empty() ? "" : ", ") + plain(e);
        return s.empty() ? "(none)" : s;
    }
    return printable(ifm::serialise(v));
}

std::string ms(const json& object, const char* key) {
    const auto v = number(object, key);
    return v ? fixed(*v, 2) : "-";
}

// A counter as an unsigned number: negative or missing is 0, beyond 2^64 is 2^64 - 1.
uint64_t counter(const json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (!v.is_number()) return 0;
    const double d = v.get<double>();
    if (!(d > 0)) return 0;
    return d >= 0x1p64 ? UINT64_MAX : static_cast<uint64_t>(d);
}

uint64_t count(const json& object, const char* key) { return counter(member(object, key)); }

std::string tensor(const json& t) {
    if (!t.is_object()) return plain(t);
    std::string s = cell(t, "name");
    const json& shape = member(t, "shape");
    if (shape.is_array()) {
        s += " [";
        for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + plain(shape[i]);
        s += "]";
    }
    if (const json& type = member(t, "type"); !type.is_null()) s += " " + plain(type);
    return s;
}

std::string bytes(double b) { return ifm::format_byte_size(b); }

// health's "memory": budget, used, free and the model file limit.
std::string memory_line(const json& m) {
    if (!m.is_object()) return plain(m);
    auto amount = [&](const char* key) {
        const auto v = number(m, key);
        return v ? bytes(*v) : std::string("-");
    };
    std::string s = member(m, "budget_bytes").is_null() ? "no budget, used " + amount("used_bytes")
                                                        : "budget " + amount("budget_bytes") + ", used " +
                                                              amount("used_bytes") + ", free " + amount("free_bytes");
    if (number(m, "max_model_file_bytes")) s += "; model files up to " + amount("max_model_file_bytes");
    return s;
}

// describe's "memory": what the IF holds, weights once however many IFs share them.
std::string footprint_line(const json& m) {
    if (!m.is_object()) return plain(m);
    auto amount = [&](const char* key) {
        const auto v = number(m, key);
        return v ? bytes(*v) : std::string("-");
    };
    std::string s = amount("total_bytes") + ": weights " + amount("weight_bytes") + " (+ " + amount("host_bytes") +
                    " host copy), instances " + amount("instance_bytes");
    if (const json& shared = member(m, "shared_weights"); shared.is_boolean() && shared.get<bool>())
        s += "; weights shared with another IF";
    return s;
}

// describe's "instances": "be 1: 1.2 MiB, be 2: 2.3 MiB, ...".
std::string instances_line(const json& list) {
    if (!list.is_array()) return plain(list);
    std::string s;
    for (const auto& i : list) {
        const auto b = number(i, "bytes");
        s += (s.empty() ? "" : ", ") + cell(i, "lane") + " " + cell(i, "batch") + ": " + (b ? bytes(*b) : "-");
    }
    return s.empty() ? "(none)" : s;
}

// describe's "arenas": "be 28.0 MiB for batch 1, 2, 4, 8, 16" (the lane's instances share it).
std::string arenas_line(const json& list) {
    if (!list.is_array()) return plain(list);
    std::string s;
    for (const auto& a : list) {
        const auto b = number(a, "bytes");
        std::string sizes;
        if (const json& l = member(a, "batch_sizes"); l.is_array())
            for (const auto& x : l) sizes += (sizes.empty() ? "" : ", ") + plain(x);
        s += (s.empty() ? "" : "; ") + cell(a, "lane") + " " + (b ? bytes(*b) : "-") + " for batch " + sizes;
    }
    return s.empty() ? "(none)" : s;
}

// describe's "knee": "0.5 of the device (2 of 4 units) at batch 16; 1 unit 80.2 ms, 2 units 41.0 ms, ...".
std::string knee_line(const json& k) {
    if (!k.is_object()) return k.is_null() ? "not measured" : plain(k);
    char share[32];
    std::snprintf(share, sizeof share, "%.2f", number(k, "share").value_or(0));
    std::string s = std::string(share) + " of the device (" + cell(k, "units") + " of " + cell(k, "device_units") +
                    " units) at batch " + cell(k, "batch");
    if (const json& curve = member(k, "curve"); curve.is_array()) {
        s += ";";
        for (const auto& p : curve) {
            char ms[32];
            std::snprintf(ms, sizeof ms, "%.1f", number(p, "batch_ms").value_or(0));
            s += " " + cell(p, "units") + "u " + ms + " ms";
        }
    }
    return s;
}

// health's "abacus" (policy abacus): "predictor /srv/models/abacus.json: 3 models, held-out
// error 6.9%" or "kernel profiles (...)" and why.
std::string abacus_line(const json& a) {
    if (!a.is_object()) return plain(a);
    std::string s;
    if (const json& p = member(a, "predictor"); p.is_string()) {
        const json& models = member(a, "models");
        char err[32];
        std::snprintf(err, sizeof err, "%.1f%%", number(a, "held_out_err_pct").value_or(0));
        s = "predictor " + p.get<std::string>() + ": " + std::to_string(models.is_array() ? models.size() : 0) +
            " model(s), held-out error " + err;
    } else {
        s = cell(a, "predicts_from");
        if (const json& why = member(a, "problem"); why.is_string()) s += "; the predictor was refused: " + why.get<std::string>();
    }
    return s;
}

// "key  value" lines in the given order first, then whatever else the daemon sent, so that
// fields added to the schema later still show.
std::string key_values(const json& result, const std::vector<std::string>& order) {
    if (!result.is_object()) return plain(result) + "\n";
    std::vector<std::pair<std::string, std::string>> lines;
    std::set<std::string> seen;
    auto add = [&](const std::string& key, const json& v) {
        std::string text;
        if (key == "input") text = tensor(v);
        else if (key == "outputs" && v.is_array()) {
            for (const auto& t : v) text += (text.empty() ? "" : "; ") + tensor(t);
        } else if ((key == "weight_bytes" || key == "arena_bytes") && v.is_number())
            text = bytes(v.get<double>()) + " (" + plain(v) + ")";
        else if (key == "memory" && v.is_object() && v.contains("budget_bytes"))
            text = memory_line(v);
        else if (key == "memory")
            text = footprint_line(v);
        else if (key == "instances")
            text = instances_line(v);
        else if (key == "arenas")
            text = arenas_line(v);
        else if (key == "knee")
            text = knee_line(v);
        else if (key == "abacus")
            text = abacus_line(v);
        else if (key == "units_granted" && v.is_object())  // describe: "2 units (worker threads)"
            text = member(v, "bound") == json(true) ? cell(v, "count") + " units (" + cell(v, "note") + ")"
                                                   : "none: runs on the whole device (" + cell(v, "note") + ")";
        else if (key == "units" && v.is_object())  // health: "green_contexts, usable, 5 binds, 0 fallbacks"
            text = cell(v, "mechanism") + (member(v, "usable") == json(true) ? ", usable" : ", unusable: " + cell(v, "why")) +
                   ", " + cell(v, "binds") + " binds, " + cell(v, "fallbacks") + " fallbacks, " + cell(v, "partitions") +
                   " partitions";
        else if (key == "port" && v.is_object()) {
            text = "id " + cell(v, "id") + ", driver " + cell(v, "driver");
            if (const json& up = member(v, "link_up"); up.is_boolean())
                text += up.get<bool>() ? ", link up" : ", link down";
        } else
            text = plain(v);
        lines.emplace_back(printable(key), text);
        seen.insert(key);
    };
    for (const auto& key : order)
        if (result.contains(key)) add(key, result[key]);
    for (const auto& [key, v] : result.items())
        if (!seen.count(key)) add(key, v);
    size_t width = 0;
    for (const auto& l : lines) width = std::max(width, l.first.size());
    std::string out;
    for (const auto& [key, text] : lines)
        out += key + std::string(width - key.size() + 2, ' ') + text + "\n";
    return out;
}

const json& ifs_of(const json& stats) {
    static const json empty = json::array();
    const json& ifs = member(stats, "ifs");
    return ifs.is_array() ? ifs : empty;
}

// "label value, label value" for the fields present (and, with skip_zero, non-zero).
std::string join_fields(const json& object,
                        const std::vector<std::pair<const char*, const char*>>& fields,
                        bool skip_zero) {
    std::string s;
    for (const auto& [key, label] : fields) {
        const auto v = number(object, key);
        if (!v || (skip_zero && *v == 0)) continue;
        s += (s.empty() ? "" : ", ") + std::string(label) + " " + plain(member(object, key));
    }
    return s;
}

}  // namespace

std::string fixed(double value, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
    return buf;
}

std::string cell(const json& object, const char* key) { return plain(member(object, key)); }

std::string table::str() const {
    std::vector<size_t> width(_columns.size());
    for (size_t c = 0; c < _columns.size(); ++c) width[c] = _columns[c].title.size();
    for (const auto& row : _rows)
        for (size_t c = 0; c < row.size() && c < width.size(); ++c)
            width[c] = std::max(width[c], row[c].size());
    auto line = [&](auto&& text_of) {
        std::string s;
        for (size_t c = 0; c < _columns.size(); ++c) {
            const std::string text = text_of(c);
            const std::string pad(width[c] - std::min(width[c], text.size()), ' ');
            const bool last = c + 1 == _columns.size();
            if (_columns[c].how == align::right) s += pad + text;
            else s += text + (last ? "" : pad);
            if (!last) s += "  ";
        }
        return s + "\n";
    };
    std::string out = line([&](size_t c) { return _columns[c].title; });
    for (const auto& row : _rows) out += line([&](size_t c) { return c < row.size() ? row[c] : ""; });
    return out;
}

std::string render_list(const json& result) {
    using a = table::align;
    table t({{"NAME"}, {"PORT", a::right}, {"CLASS"}, {"INPUT"}, {"OUTPUT"}, {"SLO_MS", a::right}, {"BATCHING"},
             {"BATCH", a::right}, {"STATE"}, {"REQUESTS", a::right}});
    const json& models = member(result, "models");
    if (models.is_array())
        for (const auto& m : models)
            t.add_row({cell(m, "name"), cell(m, "udp_port"), cell(m, "class"), cell(m, "input_format"),
                       cell(m, "output"), cell(m, "slo_ms"), cell(m, "batching"), cell(m, "batch_size"),
                       cell(m, "state"), cell(m, "requests_total")});
    if (t.rows() == 0) return "no models loaded (add one with: reefctl add-model --name N --onnx FILE --port P)\n";
    return t.str();
}

std::string render_describe(const json& result) {
    return key_values(result, {"name", "onnx", "udp_port", "class", "slo_ms", "state", "input_format", "request",
                               "output", "batching", "batch_size", "min_batch", "max_batch", "fixed_batch", "priority",
                               "shed", "share", "share_policy", "share_demand", "units", "units_granted", "knee", "rt_sources", "top_k", "mean", "std", "input", "inputs", "outputs",
                               "kernels", "weight_bytes", "arena_bytes", "memory", "instances", "arenas",
                               "requests_total", "responses_total"});
}

std::string render_health(const json& result) {
    return key_values(result, {"status", "version", "uptime_s", "backend", "policy", "abacus", "models", "memory", "units", "port"});
}

std::string render_stats(const json& result) {
    using a = table::align;
    table t({{"NAME"}, {"CLASS"}, {"REQUESTS", a::right}, {"RESPONSES", a::right},
             {"ERRORS", a::right}, {"SHED", a::right}, {"SLO_VIOL", a::right},
             {"P50_MS", a::right}, {"P99_MS", a::right}, {"MAX_MS", a::right},
             {"BATCH", a::right}, {"QUEUE", a::right}});
    for (const auto& i : ifs_of(result)) {
        const json& lat = member(i, "latency_ms");
        t.add_row({cell(i, "name"), cell(i, "class"), cell(i, "requests_total"),
                   cell(i, "responses_total"), cell(i, "errors_total"), cell(i, "shed_total"),
                   cell(i, "slo_violations_total"), ms(lat, "p50"), ms(lat, "p99"), ms(lat, "max"),
                   cell(i, "batch_size"), cell(i, "queue_depth")});
    }
    std::string out = t.rows() ? t.str() : "no models loaded\n";

    if (const json& port = member(result, "port"); port.is_object()) {
        out += "\nport " + cell(port, "id") + " (" + cell(port, "driver") + "): rx " +
               cell(port, "rx_packets") + " packets";
        if (auto b = number(port, "rx_bytes")) out += " / " + bytes(*b);
        out += ", tx " + cell(port, "tx_packets") + " packets";
        if (auto b = number(port, "tx_bytes")) out += " / " + bytes(*b);
        const std::string errs = join_fields(port, {{"rx_missed", "missed"},
                                                     {"rx_errors", "rx errors"},
                                                     {"tx_errors", "tx errors"},
                                                     {"rx_nombuf", "no mbuf"}},
                                              true);
        out += (errs.empty() ? "" : "; " + errs) + "\n";
    }
    if (const json& dp = member(result, "dataplane"); dp.is_object()) {
        out += "data plane: rx " + cell(dp, "rx_packets") + " packets";
        const std::string req = join_fields(dp, {{"requests_started", "started"},
                                                  {"requests_completed", "completed"},
                                                  {"requests_timed_out", "timed out"},
                                                  {"requests_evicted", "evicted"},
                                                  {"requests_malformed", "malformed"},
                                                  {"requests_ring_full", "ring full"}},
                                             false);
        if (!req.empty()) out += "; requests " + req;
        out += "; tx " + cell(dp, "tx_packets") + " packets";
        if (auto d = number(dp, "tx_dropped"); d && *d > 0) out += " (" + cell(dp, "tx_dropped") + " dropped)";
        out += "\n";
        std::string drops;
        if (const json& d = member(dp, "drops"); d.is_object())
            for (const auto& [reason, n] : d.items())
                if (n.is_number() && n.get<double>() > 0)
                    drops += (drops.empty() ? "" : ", ") + printable(reason) + " " + plain(n);
        out += "drops: " + (drops.empty() ? std::string("none") : drops) + "\n";
    }
    if (const json& s = member(result, "scheduler"); s.is_object()) {
        out += "scheduler (" + cell(s, "policy") + "): " +
               join_fields(s, {{"submitted", "submitted"},
                                {"completed_rt", "completed rt"},
                                {"completed_be", "completed be"},
                                {"preemptions", "preemptions"},
                                {"restores", "restores"},
                                {"reexecuted_kernels", "re-executed kernels"}},
                           false) +
               "\n";
    }
    if (auto up = number(result, "uptime_s")) out += "uptime " + fixed(*up, 1) + " s\n";
    return out;
}

std::string render_watch(const std::string& endpoint, const json& current, const json& previous,
                         double elapsed_s, double interval_s) {
    // Rates over the daemon's own clock when it reports one: the request/reply round trip
    // would otherwise add its jitter to every rate.
    double dt = elapsed_s;
    if (auto now = number(current, "uptime_s"), before = number(previous, "uptime_s");
        now && before && *now > *before)
        dt = *now - *before;
    std::map<std::string, const json*> before_by_name;
    for (const auto& i : ifs_of(previous))
        if (member(i, "name").is_string()) before_by_name[i["name"].get<std::string>()] = &i;

    // A counter that went down means the daemon restarted (or the IF was re-added): no rate.
    auto rate = [&](const json& now, const json* before, const char* key) -> std::string {
        if (!before || dt <= 0) return "-";
        const auto a = number(now, key), b = number(*before, key);
        if (!a || !b || *a < *b) return "-";
        return fixed((*a - *b) / dt, 1);
    };

    using a = table::align;
    table t({{"NAME"}, {"CLASS"}, {"REQ/S", a::right}, {"RESP/S", a::right},
             {"P50_MS", a::right}, {"P99_MS", a::right}, {"BATCH", a::right},
             {"QUEUE", a::right}, {"DROPS", a::right}});
    for (const auto& i : ifs_of(current)) {
        const json* before = nullptr;
        if (member(i, "name").is_string())
            if (auto it = before_by_name.find(i["name"].get<std::string>()); it != before_by_name.end())
                before = it->second;
        const json& lat = member(i, "latency_ms");
        // Requests an IF took but did not answer with a result.
        uint64_t drops = 0;
        for (const char* key : {"shed_total", "errors_total", "send_failures_total"})
            drops += std::min(count(i, key), UINT64_MAX - drops);
        t.add_row({cell(i, "name"), cell(i, "class"), rate(i, before, "requests_total"),
                   rate(i, before, "responses_total"), ms(lat, "p50"), ms(lat, "p99"),
                   cell(i, "batch_size"), cell(i, "queue_depth"), std::to_string(drops)});
    }

    std::string out = "reefline at " + endpoint;
    if (auto up = number(current, "uptime_s")) out += ", up " + fixed(*up, 1) + " s";
    out += "; every " + fixed(interval_s, interval_s < 1 ? 1 : 0) + " s (Ctrl-C to quit)\n\n";
    out += t.rows() ? t.str() : "no models loaded\n";
    if (const json& dp = member(current, "dataplane"); dp.is_object()) {
        uint64_t drops = 0;
        if (const json& d = member(dp, "drops"); d.is_object())
            for (const auto& [reason, n] : d.items()) drops += std::min(counter(n), UINT64_MAX - drops);
        out += "\ndata plane: rx " + rate(dp, &member(previous, "dataplane"), "rx_packets") +
               " packets/s, tx " + rate(dp, &member(previous, "dataplane"), "tx_packets") +
               " packets/s, drops " + std::to_string(drops) + "\n";
    }
    return out;
}

}  // namespace reefline::reefctl
