// reefctl's human-readable views of control-plane results (docs/control.md). Every renderer
// tolerates missing or mistyped fields (shown as "-"): a newer or older daemon must still give
// a readable table rather than an exception.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace reefline::reefctl {

// Columns padded to their widest cell; numbers right-aligned so that digits line up.
class table {
public:
    enum class align { left, right };
    struct column {
        std::string title;
        align how = align::left;
    };

    explicit table(std::vector<column> columns) : _columns(std::move(columns)) {}
    void add_row(std::vector<std::string> cells) { _rows.push_back(std::move(cells)); }
    size_t rows() const { return _rows.size(); }
    std::string str() const;

private:
    std::vector<column> _columns;
    std::vector<std::vector<std::string>> _rows;
};

// `list`: NAME PORT CLASS SLO_MS BATCHING BATCH STATE REQUESTS.
std::string render_list(const nlohmann::json& result);
// `describe`, `add_model` and `set` results: one "key  value" line per field.
std::string render_describe(const nlohmann::json& result);
// `health`.
std::string render_health(const nlohmann::json& result);
// `stats`: the per-IF table, then port, data plane (non-zero drops by reason) and scheduler.
std::string render_stats(const nlohmann::json& result);

// `watch`: one frame from a `stats` result and the previous one (null on the first frame, when
// rates are not known yet). `elapsed_s` is the wall time between the two samples, used when
// the daemon's uptime_s is missing.
std::string render_watch(const std::string& endpoint, const nlohmann::json& current,
                         const nlohmann::json& previous, double elapsed_s, double interval_s);

// Cell formatting shared with main.cc.
std::string cell(const nlohmann::json& object, const char* key);
std::string fixed(double value, int decimals);

}  // namespace reefline::reefctl
