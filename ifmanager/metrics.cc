#include "ifmanager/metrics.h"

#include "dataplane/counters.h"
#include "ifmanager/if_stats.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace reefline::metrics {

namespace {

using json = nlohmann::json;
using labels = std::vector<std::pair<std::string, std::string>>;

// Shortest text that reads back as the same double, in %g style like the Go client's
// FormatFloat(v, 'g', -1) (so le="0.0005", not "5e-04": bucket labels must match what other
// exporters and recording rules use), with the format's spellings of the non-finite values.
std::string format_double(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
    return std::string(buf, r.ptr);
}

// A JSON number as a sample value; integers stay exact (counters beyond 2^53 exist).
std::optional<std::string> value_text(const json& v) {
    if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    if (v.is_number_float()) return format_double(v.get<double>());
    return std::nullopt;
}

std::optional<double> as_double(const json& v) {
    if (!v.is_number()) return std::nullopt;
    return v.get<double>();
}

const json& member(const json& object, const char* key) {
    static const json null_value;
    if (!object.is_object()) return null_value;
    const auto it = object.find(key);
    return it == object.end() ? null_value : *it;
}

// Label values: backslash, double quote and line feed are the characters the format escapes.
std::string escape_label(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

// HELP text escapes backslash and line feed only.
std::string escape_help(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

std::string label_text(const labels& ls) {
    if (ls.empty()) return {};
    std::string s = "{";
    for (size_t i = 0; i < ls.size(); ++i)
        s += (i ? "," : "") + ls[i].first + "=\"" + escape_label(ls[i].second) + "\"";
    return s + "}";
}

// Collects samples per family so that each family's HELP/TYPE comes once, followed by all its
// samples (the format does not allow a family's samples to be interleaved with another's),
// whatever order the input visits them in.
class exposition {
public:
    // Where the section being rendered sits in the stats object ("ifs[]", "scheduler.dkp"): the
    // paths of the fields read are recorded under it (stats_without_metric).
    void at(std::string prefix) { _prefix = std::move(prefix); }
    void consumed(const std::string& key) { _consumed.insert(_prefix.empty() ? key : _prefix + "." + key); }
    const std::set<std::string>& consumed_paths() const { return _consumed; }

    void sample(const std::string& family, const char* type, const char* help,
                const std::string& suffix, const labels& ls, const std::string& value) {
        auto [it, added] = _index.try_emplace(family, _families.size());
        if (added) _families.push_back({family, type, help, {}});
        _families[it->second].lines.push_back(family + suffix + label_text(ls) + " " + value);
    }

    // A scalar field of `object`, when present and numeric.
    void field(const json& object, const char* key, const std::string& family, const char* type,
               const char* help, const labels& ls) {
        consumed(key);
        if (auto v = value_text(member(object, key))) sample(family, type, help, "", ls, *v);
    }
    // A boolean field of `object`, when present, as a 0/1 gauge.
    void flag(const json& object, const char* key, const std::string& family, const char* help) {
        consumed(key);
        if (const json& b = member(object, key); b.is_boolean())
            sample(family, "gauge", help, "", {}, b.get<bool>() ? "1" : "0");
    }

    std::string str() const {
        std::string out;
        for (const auto& f : _families) {
            out += "# HELP " + f.name + " " + escape_help(f.help) + "\n";
            out += "# TYPE " + f.name + " " + f.type + "\n";
            for (const auto& l : f.lines) out += l + "\n";
        }
        return out;
    }

private:
    struct family_lines {
        std::string name, type, help;
        std::vector<std::string> lines;
    };
    std::vector<family_lines> _families;
    std::map<std::string, size_t> _index;
    std::string _prefix;
    std::set<std::string> _consumed;
};

struct field_spec {
    const char* key;
    const char* family;
    const char* type;
    const char* help;
};

constexpr field_spec port_fields[] = {
    {"rx_packets", "reefline_port_rx_packets_total", "counter", "Packets received by the port."},
    {"rx_bytes", "reefline_port_rx_bytes_total", "counter", "Bytes received by the port."},
    {"tx_packets", "reefline_port_tx_packets_total", "counter", "Packets sent by the port."},
    {"tx_bytes", "reefline_port_tx_bytes_total", "counter", "Bytes sent by the port."},
    {"rx_missed", "reefline_port_rx_missed_total", "counter",
     "Packets the NIC dropped because the receive queues were full."},
    {"rx_errors", "reefline_port_rx_errors_total", "counter", "Erroneous packets received."},
    {"tx_errors", "reefline_port_tx_errors_total", "counter", "Failed transmissions."},
    {"rx_nombuf", "reefline_port_rx_nombuf_total", "counter",
     "Receive buffer allocation failures (mempool exhausted)."},
    {"rx_mbufs", "reefline_port_rx_mbufs", "gauge", "Mbufs in the receive pool."},
    {"rx_mbufs_in_use", "reefline_port_rx_mbufs_in_use", "gauge",
     "Receive mbufs out of their pool: held by the port, by requests under reassembly or queued, or being served."},
    {"tx_mbufs", "reefline_port_tx_mbufs", "gauge", "Mbufs in the transmit pool."},
    {"tx_mbufs_in_use", "reefline_port_tx_mbufs_in_use", "gauge",
     "Transmit mbufs out of their pool: responses queued or being sent."},
};

constexpr field_spec scheduler_fields[] = {
    {"submitted", "reefline_scheduler_submitted_total", "counter", "Tasks submitted to the scheduler."},
    {"preemptions", "reefline_scheduler_preemptions_total", "counter", "Preemptions of BE work by RT work."},
    {"restores", "reefline_scheduler_restores_total", "counter", "Preempted tasks restored."},
    {"reexecuted_kernels", "reefline_scheduler_reexecuted_kernels_total", "counter",
     "Kernels executed again after a preemption."},
};

// `latency_seconds`: {"le": [...], "counts": [...cumulative], "sum": S, "count": C}. The output
// always satisfies the format's invariants (buckets non-decreasing, +Inf equal to _count) even
// when the input does not, since one inconsistent histogram would otherwise make Prometheus
// reject the whole scrape. `counts` may carry one more entry than `le`: the +Inf bucket.
void histogram(exposition& out, const json& h, const labels& ls,
               const std::string& family = "reefline_if_latency_seconds",
               const char* help = "Time from a request's completion in the data plane to its answer being queued.") {
    if (!h.is_object()) return;
    const json& le = member(h, "le");
    const json& counts = member(h, "counts");
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    double running = 0;
    if (le.is_array() && counts.is_array()) {
        const size_t n = std::min(le.size(), counts.size());
        for (size_t i = 0; i < n; ++i) {
            const auto bound = as_double(le[i]);
            const auto c = as_double(counts[i]);
            if (!bound || !c || !std::isfinite(*bound) || !std::isfinite(*c)) continue;
            if (!buckets.empty() && *bound <= buckets.back().first) continue;
            running = std::max(running, *c);
            buckets.emplace_back(*bound, running);
        }
        if (counts.size() == le.size() + 1)
            if (auto inf = as_double(counts.back()); inf && std::isfinite(*inf))
                running = std::max(running, *inf);
    }
    const auto count = as_double(member(h, "count"));
    if (buckets.empty() && !count) return;
    const double total = std::max(running, count && std::isfinite(*count) ? *count : 0.0);
    for (const auto& [bound, c] : buckets) {
        labels with_le = ls;
        with_le.emplace_back("le", format_double(bound));
        out.sample(family, "histogram", help, "_bucket", with_le, format_double(c));
    }
    labels inf = ls;
    inf.emplace_back("le", "+Inf");
    out.sample(family, "histogram", help, "_bucket", inf, format_double(total));
    if (auto sum = value_text(member(h, "sum"))) out.sample(family, "histogram", help, "_sum", ls, *sum);
    out.sample(family, "histogram", help, "_count", ls, format_double(total));
}

std::string label_value(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (auto t = value_text(v)) return *t;
    return v.dump();
}

bool is_loopback(const std::string& host) {
    in_addr v4{};
    if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    in6_addr v6{};
    if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
        return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
    }
    return false;
}

}  // namespace

namespace {

// Every family, from the stats object; `out` records the stats paths it read.
void render(exposition& out, const json& stats) {
    if (!stats.is_object()) return;

    const json& ifs = member(stats, "ifs");
    out.at("ifs[]");
    if (ifs.is_array())
        for (const auto& i : ifs) {
            const json& name = member(i, "name");
            if (!name.is_string()) continue;  // samples without their IF could not be told apart
            labels ls{{"if", name.get<std::string>()}};
            if (const json& cls = member(i, "class"); cls.is_string())
                ls.emplace_back("class", cls.get<std::string>());
            // The IF's statistics as ifmanager/if_stats.h declares them (literals: data() ends in NUL).
            for (const ifm::if_stat_info& f : ifm::if_stat_infos) {
                const std::string key(f.key);
                if (f.per_unit == 1) {
                    out.field(i, key.c_str(), std::string(f.family), f.type.data(), f.help.data(), ls);
                    continue;
                }
                out.consumed(key);
                if (auto v = as_double(member(i, key.c_str())))
                    out.sample(std::string(f.family), f.type.data(), f.help.data(), "", ls, format_double(*v / f.per_unit));
            }
            out.consumed("slo_ms");
            if (auto slo = as_double(member(i, "slo_ms")))
                out.sample("reefline_if_slo_seconds", "gauge", "The IF's latency SLO.", "", ls,
                           format_double(*slo / 1000.0));
            out.consumed("latency_seconds");
            histogram(out, member(i, "latency_seconds"), ls);
        }

    if (const json& port = member(stats, "port"); port.is_object()) {
        out.at("port");
        labels ls;
        if (const json& id = member(port, "id"); !id.is_null()) ls.emplace_back("port", label_value(id));
        if (const json& d = member(port, "driver"); !d.is_null()) ls.emplace_back("driver", label_value(d));
        out.consumed("id");  // a label
        for (const auto& f : port_fields) out.field(port, f.key, f.family, f.type, f.help, ls);
    }

    if (const json& dp = member(stats, "dataplane"); dp.is_object()) {
        out.at("dataplane");
        // The data plane's counters as dataplane/counters.h declares them: name and help.
        for (const auto& c : dp::dataplane_counter_infos) {
            const std::string key(c.name), help(c.help);
            out.field(dp, key.c_str(), "reefline_dataplane_" + key + "_total", "counter", help.c_str(), {});
        }
        out.consumed("drops");
        if (const json& drops = member(dp, "drops"); drops.is_object())
            for (const auto& [reason, n] : drops.items())
                if (auto v = value_text(n))
                    out.sample("reefline_dataplane_drops_total", "counter",
                               "Packets dropped by the data plane, by reason.", "",
                               {{"reason", reason}}, *v);
    }

    if (const json& u = member(stats, "units"); u.is_object()) {
        out.at("units");
        out.flag(u, "usable", "reefline_device_units_usable",
                 "Streams can be bound to a share of the device's compute units (1), or every share runs on "
                 "the whole device (0).");
        out.field(u, "binds", "reefline_device_unit_binds_total", "counter",
                  "Times a stream was bound to a share of the device's compute units.", {});
        out.field(u, "fallbacks", "reefline_device_unit_fallbacks_total", "counter",
                  "Binds the device could not make: those launches ran on every compute unit.", {});
        out.field(u, "partitions", "reefline_device_unit_partitions", "gauge",
                  "Vendor partitions of the device alive (green contexts).", {});
        out.field(u, "step", "reefline_device_unit_step", "gauge",
                  "Compute units a share is rounded to (an SM slice on green contexts).", {});
    }

    if (const json& s = member(stats, "scheduler"); s.is_object()) {
        out.at("scheduler");
        if (const json& policy = member(s, "policy"); policy.is_string())
            out.sample("reefline_scheduler_info", "gauge", "The scheduling policy in use (value 1).",
                       "", {{"policy", policy.get<std::string>()}}, "1");
        out.field(s, "submitted", scheduler_fields[0].family, "counter", scheduler_fields[0].help, {});
        for (const auto& [key, cls] : {std::pair{"completed_rt", "rt"}, std::pair{"completed_be", "be"}}) {
            out.consumed(key);
            if (auto v = value_text(member(s, key)))
                out.sample("reefline_scheduler_completed_total", "counter",
                           "Tasks completed, by class.", "", {{"class", cls}}, *v);
        }
        for (const auto& f : scheduler_fields)
            if (std::strcmp(f.key, "submitted") != 0) out.field(s, f.key, f.family, f.type, f.help, {});
        if (const json& d = member(s, "dkp"); d.is_object()) {
            out.at("scheduler.dkp");
            out.flag(d, "enabled", "reefline_dkp_enabled", "Dynamic kernel padding is on (1) or off (0).");
            out.field(d, "padded_launches", "reefline_dkp_padded_launches_total", "counter",
                      "RT kernel launches padded with BE kernels.", {});
            out.field(d, "pad_blocks", "reefline_dkp_pad_blocks_total", "counter",
                      "BE blocks run to their end as padding.", {});
            for (const auto& [key, state] : {std::pair{"pads_issued", "issued"}, std::pair{"pads_completed", "completed"},
                                             std::pair{"pads_cut", "cut"}, std::pair{"pads_skipped", "skipped"}}) {
                out.consumed(key);
                if (auto v = value_text(member(d, key)))
                    out.sample("reefline_dkp_pads_total", "counter",
                               "BE kernels given as padding, by what became of them.", "", {{"state", state}}, *v);
            }
            out.consumed("selection_seconds");
            histogram(out, member(d, "selection_seconds"), {}, "reefline_dkp_selection_seconds",
                      "Time to choose the pads of one RT launch.");
        }
        if (const json& a = member(s, "abacus"); a.is_object()) {
            out.at("scheduler.abacus");
            out.field(a, "groups", "reefline_abacus_groups_total", "counter",
                      "Operator groups the abacus policy ran (0 under other policies).", {});
            out.field(a, "groups_by_profile", "reefline_abacus_groups_by_profile_total", "counter",
                      "Groups predicted from kernel profiles (a model the predictor was not trained on).", {});
            out.field(a, "dropped", "reefline_abacus_dropped_total", "counter",
                      "Tasks dropped because they could no longer meet their deadline.", {});
            out.field(a, "predicted_seconds", "reefline_abacus_predicted_seconds_total", "counter",
                      "Predicted duration of the groups that ran to their end.", {});
            out.field(a, "measured_seconds", "reefline_abacus_measured_seconds_total", "counter",
                      "Measured duration of the same groups.", {});
        }
    }

    out.at("");
    out.consumed("uptime_s");
    if (auto v = value_text(member(stats, "uptime_s")))
        out.sample("reefline_uptime_seconds", "gauge", "Seconds since the daemon started.", "", {}, *v);
}

// Numeric and boolean fields of `stats` that no metric carries on purpose, and why.
constexpr std::pair<const char*, const char*> not_exported[] = {
    {"ifs[].udp_port", "configuration, not a measurement (reefctl describe)"},
    {"ifs[].latency_ms", "the same distribution as reefline_if_latency_seconds, as percentiles for people"},
};

// The numeric and boolean leaves under `v`, as paths ("ifs[].requests_total"); arrays of
// objects as "[]", arrays of values as one leaf.
void leaves(const json& v, const std::string& path, std::set<std::string>& out) {
    if (v.is_object()) {
        for (const auto& [k, c] : v.items()) leaves(c, path.empty() ? k : path + "." + k, out);
    } else if (v.is_array()) {
        bool objects = false;
        for (const auto& c : v)
            if (c.is_object()) {
                objects = true;
                leaves(c, path + "[]", out);
            }
        if (!objects && !v.empty()) out.insert(path);
    } else if (v.is_number() || v.is_boolean()) {
        out.insert(path);
    }
}

// `path` is `prefix` or lies under it.
bool within(const std::string& path, const std::string& prefix) {
    return path == prefix || (path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
                              (path[prefix.size()] == '.' || path[prefix.size()] == '['));
}

}  // namespace

std::string prometheus_text(const json& stats) {
    exposition out;
    render(out, stats);
    return out.str();
}

std::vector<std::string> stats_without_metric(const json& stats) {
    exposition out;
    render(out, stats);
    std::set<std::string> all;
    leaves(stats, "", all);
    std::vector<std::string> missing;
    for (const auto& p : all) {
        bool covered = false;
        for (const auto& c : out.consumed_paths()) covered = covered || within(p, c);
        for (const auto& [n, why] : not_exported) covered = covered || within(p, n);
        if (!covered) missing.push_back(p);
    }
    return missing;
}

std::pair<std::string, uint16_t> parse_listen_address(const std::string& text) {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
        throw std::invalid_argument("expected HOST:PORT for the metrics address, got '" + text + "'");
    std::string host = text.substr(0, colon);
    if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    const std::string port_text = text.substr(colon + 1);
    unsigned port = 0;
    const auto r = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (r.ec != std::errc() || r.ptr != port_text.data() + port_text.size() || port > 65535)
        throw std::invalid_argument("bad port in metrics address '" + text + "'");
    return {host, static_cast<uint16_t>(port)};
}

// The HTTP side: one thread polls the listening socket and every connection, so a client that
// connects and sends nothing, or trickles its request a byte at a time, holds at most one of
// max_connections slots and never a thread. A request must arrive whole within
// request_timeout of the connection, its answer be taken within response_timeout; each
// connection carries one request (Connection: close). When every slot is taken, a new
// connection replaces the oldest, so a scrape always gets in however many idle connections
// were opened before it.
namespace {

constexpr size_t max_connections = 32;
constexpr size_t max_request_head = 8192;
constexpr auto request_timeout = std::chrono::seconds(2);
constexpr auto response_timeout = std::chrono::seconds(10);

using steady = std::chrono::steady_clock;

struct connection {
    int fd = -1;
    uint64_t order = 0;        // accept order: the smallest is the oldest
    steady::time_point deadline;
    std::string in, out;       // request head so far; response (once known)
    size_t sent = 0;
    bool answering = false;
};

std::string http_response(int status, const char* reason, const std::string& content_type, const std::string& body,
                          bool head_only, const char* extra_header = "") {
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
                    "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" + extra_header + "\r\n";
    if (!head_only) r += body;
    return r;
}

}  // namespace

struct metrics_server::impl {
    int listener = -1;
    int wake[2] = {-1, -1};  // written by the destructor: the poll loop returns at once
    std::atomic<bool> stop{false};
    std::function<std::string()> body;
    std::vector<connection> connections;
    uint64_t accepted = 0;
    std::thread thread;

    ~impl() {
        for (int fd : {listener, wake[0], wake[1]})
            if (fd >= 0) ::close(fd);
    }

    void run();
    void accept_all(steady::time_point now);
    void read_request(connection& c, steady::time_point now);
    std::string answer(const std::string& head) const;
};

void metrics_server::impl::run() {
    std::vector<pollfd> fds;
    for (;;) {
        const auto now = steady::now();
        // Expired connections go first: a slow client is cut off at its deadline.
        std::erase_if(connections, [&](const connection& c) {
            if (c.deadline > now) return false;
            ::close(c.fd);
            return true;
        });
        auto next = now + std::chrono::seconds(1);
        fds.assign({{wake[0], POLLIN, 0}, {listener, POLLIN, 0}});
        for (const auto& c : connections) {
            fds.push_back({c.fd, short(c.answering ? POLLOUT : POLLIN), 0});
            next = std::min(next, c.deadline);
        }
        const int wait_ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count()) + 1;
        if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) return;
        if (fds[0].revents || stop.load()) return;
        const auto after = steady::now();
        // Connections first (their pollfds are in order), then new ones.
        for (size_t i = 0; i < connections.size(); ++i) {
            connection& c = connections[i];
            const short ev = fds[i + 2].revents;
            if (!ev) continue;
            if (!c.answering) read_request(c, after);
            if (c.answering && c.fd >= 0 && (ev & (POLLOUT | POLLERR | POLLHUP))) {
                const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) c.sent += size_t(n);
                if ((n < 0 && errno != EAGAIN && errno != EINTR) || c.sent == c.out.size()) {
                    ::close(c.fd);
                    c.fd = -1;
                }
            }
        }
        std::erase_if(connections, [](const connection& c) { return c.fd < 0; });
        if (fds[1].revents & POLLIN) accept_all(after);
    }
}

void metrics_server::impl::accept_all(steady::time_point now) {
    for (int n = 0; n < 64; ++n) {
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;  // EAGAIN: none left; anything else: try again at the next poll
        if (connections.size() >= max_connections) {
            auto oldest = std::min_element(connections.begin(), connections.end(),
                                           [](const connection& a, const connection& b) { return a.order < b.order; });
            ::close(oldest->fd);
            connections.erase(oldest);
        }
        connection c;
        c.fd = fd;
        c.order = accepted++;
        c.deadline = now + request_timeout;
        connections.push_back(std::move(c));
    }
}

void metrics_server::impl::read_request(connection& c, steady::time_point now) {
    char buf[4096];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(c.fd);
        c.fd = -1;
        return;
    }
    if (n < 0) return;
    c.in.append(buf, size_t(n));
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos && c.in.size() < max_request_head) return;
    c.out = end == std::string::npos
                ? http_response(431, "Request Header Fields Too Large", "text/plain", "request head too large\n", false)
                : answer(c.in.substr(0, end));
    c.in.clear();
    c.answering = true;
    c.deadline = now + response_timeout;
}

// The answer to one request head: GET (or HEAD) /metrics, 404 for other paths, 405 for other
// methods, 400 for anything that is not an HTTP/1.x request line.
std::string metrics_server::impl::answer(const std::string& head) const {
    const std::string line = head.substr(0, head.find("\r\n"));
    const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 == std::string::npos || sp2 == sp1 || line.compare(sp2 + 1, 7, "HTTP/1.") != 0)
        return http_response(400, "Bad Request", "text/plain", "not an HTTP/1.x request\n", false);
    const std::string method = line.substr(0, sp1);
    std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    const bool head_only = method == "HEAD";
    if (target != "/metrics") return http_response(404, "Not Found", "text/plain", "only /metrics is served here\n", head_only);
    if (method != "GET" && !head_only)
        return http_response(405, "Method Not Allowed", "text/plain", "GET /metrics\n", false, "Allow: GET, HEAD\r\n");
    try {
        return http_response(200, "OK", content_type, body(), head_only);
    } catch (const std::exception& e) {
        return http_response(500, "Internal Server Error", "text/plain", std::string("metrics unavailable: ") + e.what() + "\n",
                             head_only);
    }
}

metrics_server::metrics_server(const std::string& host, uint16_t port,
                               std::function<std::string()> body)
    : _impl(std::make_unique<impl>()), _host(host) {
    std::string bind_host = host;
    if (bind_host.size() > 2 && bind_host.front() == '[' && bind_host.back() == ']')
        bind_host = bind_host.substr(1, bind_host.size() - 2);
    if (bind_host == "localhost") bind_host = "127.0.0.1";
    if (!is_loopback(bind_host))
        throw std::invalid_argument("metrics: refusing to serve on '" + host +
                                    "': only loopback addresses (127.0.0.1, ::1) are allowed");
    _impl->body = std::move(body);

    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    if (in_addr v4{}; ::inet_pton(AF_INET, bind_host.c_str(), &v4) == 1) {
        auto* a = reinterpret_cast<sockaddr_in*>(&addr);
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        a->sin_addr = v4;
        addr_len = sizeof *a;
    } else {
        auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        ::inet_pton(AF_INET6, bind_host.c_str(), &a->sin6_addr);
        addr_len = sizeof *a;
    }
    const auto fail = [&](const char* what) {
        throw std::runtime_error("metrics: cannot listen on " + host + ":" + std::to_string(port) + ": " + what + ": " +
                                 std::strerror(errno));
    };
    _impl->listener = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (_impl->listener < 0) fail("socket");
    // SO_REUSEADDR (a restart while old connections sit in TIME_WAIT), never SO_REUSEPORT,
    // which would let a second daemon configured with the same port take half the scrapes.
    const int yes = 1;
    ::setsockopt(_impl->listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(_impl->listener, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) fail("bind");
    if (::listen(_impl->listener, 64) != 0) fail("listen");
    if (::getsockname(_impl->listener, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) fail("getsockname");
    _port = ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                            : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (::pipe2(_impl->wake, O_CLOEXEC | O_NONBLOCK) != 0) fail("pipe");
    _impl->thread = std::thread([impl = _impl.get()] { impl->run(); });
}

metrics_server::~metrics_server() {
    _impl->stop.store(true);
    const char wake = 1;
    // Wakes the poll at once; were the write to fail, the loop sees `stop` within a second.
    [[maybe_unused]] const ssize_t woken = ::write(_impl->wake[1], &wake, 1);
    if (_impl->thread.joinable()) _impl->thread.join();
    for (const auto& c : _impl->connections) ::close(c.fd);
}

}  // namespace reefline::metrics
