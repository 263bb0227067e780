#include "ifmanager/metrics.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
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
    void sample(const std::string& family, const char* type, const char* help,
                const std::string& suffix, const labels& ls, const std::string& value) {
        auto [it, added] = _index.try_emplace(family, _families.size());
        if (added) _families.push_back({family, type, help, {}});
        _families[it->second].lines.push_back(family + suffix + label_text(ls) + " " + value);
    }

    // A scalar field of `object`, when present and numeric.
    void field(const json& object, const char* key, const std::string& family, const char* type,
               const char* help, const labels& ls) {
        if (auto v = value_text(member(object, key))) sample(family, type, help, "", ls, *v);
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
};

struct field_spec {
    const char* key;
    const char* family;
    const char* type;
    const char* help;
};

constexpr field_spec if_fields[] = {
    {"requests_total", "reefline_if_requests_total", "counter", "Requests taken from the IF's queue."},
    {"responses_total", "reefline_if_responses_total", "counter", "Requests answered with a result."},
    {"errors_total", "reefline_if_errors_total", "counter",
     "Requests answered with an error datagram (bad format, size)."},
    {"shed_total", "reefline_if_shed_total", "counter",
     "Requests answered with status overloaded because they could no longer meet the SLO."},
    {"slo_violations_total", "reefline_if_slo_violations_total", "counter",
     "Requests answered with a result later than the SLO."},
    {"send_failures_total", "reefline_if_send_failures_total", "counter",
     "Responses that could not be queued for transmission."},
    {"queue_depth", "reefline_if_queue_depth", "gauge", "Requests waiting in the IF's queue."},
    {"in_flight", "reefline_if_in_flight", "gauge", "Requests being executed."},
    {"batch_size", "reefline_if_batch_size", "gauge", "The batching controller's current target batch size."},
    {"batches_total", "reefline_if_batches_total", "counter", "Batches executed."},
    {"batched_requests_total", "reefline_if_batched_requests_total", "counter",
     "Requests executed as part of a batch."},
    {"preemptions_total", "reefline_if_preemptions_total", "counter",
     "Times the IF's kernels were preempted by the scheduler."},
    {"reexecuted_kernels_total", "reefline_if_reexecuted_kernels_total", "counter",
     "Kernels executed again after a preemption."},
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

constexpr field_spec dataplane_fields[] = {
    {"rx_packets", "reefline_dataplane_rx_packets_total", "counter", "Packets polled by the data plane."},
    {"rx_bytes", "reefline_dataplane_rx_bytes_total", "counter", "Bytes polled by the data plane."},
    {"requests_started", "reefline_dataplane_requests_started_total", "counter",
     "Requests whose first fragment arrived."},
    {"requests_completed", "reefline_dataplane_requests_completed_total", "counter",
     "Requests fully reassembled and handed to an IF."},
    {"requests_timed_out", "reefline_dataplane_requests_timed_out_total", "counter",
     "Requests abandoned because fragments stopped arriving."},
    {"requests_evicted", "reefline_dataplane_requests_evicted_total", "counter",
     "Partial requests evicted to make room for new ones."},
    {"requests_malformed", "reefline_dataplane_requests_malformed_total", "counter",
     "Requests with inconsistent fragments."},
    {"requests_ring_full", "reefline_dataplane_requests_ring_full_total", "counter",
     "Complete requests dropped because the IF's ring was full."},
    {"arp_replies", "reefline_dataplane_arp_replies_total", "counter", "ARP requests answered."},
    {"tx_packets", "reefline_dataplane_tx_packets_total", "counter", "Packets queued for transmission."},
    {"tx_bytes", "reefline_dataplane_tx_bytes_total", "counter", "Bytes queued for transmission."},
    {"tx_dropped", "reefline_dataplane_tx_dropped_total", "counter",
     "Packets the port would not take for transmission."},
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
void histogram(exposition& out, const json& h, const labels& ls) {
    if (!h.is_object()) return;
    static const std::string family = "reefline_if_latency_seconds";
    static const char* help =
        "Time from a request's completion in the data plane to its answer being queued.";
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

std::string prometheus_text(const json& stats) {
    exposition out;
    if (!stats.is_object()) return out.str();

    const json& ifs = member(stats, "ifs");
    if (ifs.is_array())
        for (const auto& i : ifs) {
            const json& name = member(i, "name");
            if (!name.is_string()) continue;  // samples without their IF could not be told apart
            labels ls{{"if", name.get<std::string>()}};
            if (const json& cls = member(i, "class"); cls.is_string())
                ls.emplace_back("class", cls.get<std::string>());
            for (const auto& f : if_fields) out.field(i, f.key, f.family, f.type, f.help, ls);
            if (auto slo = as_double(member(i, "slo_ms")))
                out.sample("reefline_if_slo_seconds", "gauge", "The IF's latency SLO.", "", ls,
                           format_double(*slo / 1000.0));
            histogram(out, member(i, "latency_seconds"), ls);
        }

    if (const json& port = member(stats, "port"); port.is_object()) {
        labels ls;
        if (const json& id = member(port, "id"); !id.is_null()) ls.emplace_back("port", label_value(id));
        if (const json& d = member(port, "driver"); !d.is_null()) ls.emplace_back("driver", label_value(d));
        for (const auto& f : port_fields) out.field(port, f.key, f.family, f.type, f.help, ls);
    }

    if (const json& dp = member(stats, "dataplane"); dp.is_object()) {
        for (const auto& f : dataplane_fields) out.field(dp, f.key, f.family, f.type, f.help, {});
        if (const json& drops = member(dp, "drops"); drops.is_object())
            for (const auto& [reason, n] : drops.items())
                if (auto v = value_text(n))
                    out.sample("reefline_dataplane_drops_total", "counter",
                               "Packets dropped by the data plane, by reason.", "",
                               {{"reason", reason}}, *v);
    }

    if (const json& s = member(stats, "scheduler"); s.is_object()) {
        if (const json& policy = member(s, "policy"); policy.is_string())
            out.sample("reefline_scheduler_info", "gauge", "The scheduling policy in use (value 1).",
                       "", {{"policy", policy.get<std::string>()}}, "1");
        out.field(s, "submitted", scheduler_fields[0].family, "counter", scheduler_fields[0].help, {});
        for (const auto& [key, cls] : {std::pair{"completed_rt", "rt"}, std::pair{"completed_be", "be"}})
            if (auto v = value_text(member(s, key)))
                out.sample("reefline_scheduler_completed_total", "counter",
                           "Tasks completed, by class.", "", {{"class", cls}}, *v);
        for (const auto& f : scheduler_fields)
            if (std::strcmp(f.key, "submitted") != 0) out.field(s, f.key, f.family, f.type, f.help, {});
    }

    if (auto v = value_text(member(stats, "uptime_s")))
        out.sample("reefline_uptime_seconds", "gauge", "Seconds since the daemon started.", "", {}, *v);
    return out.str();
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

struct metrics_server::impl {
    httplib::Server server;
    std::thread thread;
    std::atomic<bool> finished{false};
};

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

    auto& server = _impl->server;
    // Scrapes come one at a time from one Prometheus; httplib's default pool is 8+ threads.
    server.new_task_queue = [] { return new httplib::ThreadPool(2); };
    server.set_payload_max_length(64 * 1024);
    // httplib's default sets SO_REUSEPORT, which would let a second daemon configured with the
    // same port bind it too and silently take half the scrapes. SO_REUSEADDR alone still
    // allows a restart while old connections sit in TIME_WAIT.
    server.set_socket_options([](socket_t sock) {
        const int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    server.Get("/metrics", [body = std::move(body)](const httplib::Request&, httplib::Response& res) {
        try {
            res.set_content(body(), content_type);
        } catch (const std::exception& e) {
            res.status = 500;
            res.set_content(std::string("metrics unavailable: ") + e.what() + "\n", "text/plain");
        }
    });

    errno = 0;
    int bound = -1;
    if (port == 0) bound = server.bind_to_any_port(bind_host);
    else if (server.bind_to_port(bind_host, port)) bound = port;
    if (bound <= 0) {
        const int err = errno;
        throw std::runtime_error("metrics: cannot listen on " + host + ":" + std::to_string(port) +
                                 (err ? std::string(": ") + std::strerror(err) : std::string()));
    }
    _port = static_cast<uint16_t>(bound);

    _impl->thread = std::thread([this] {
        _impl->server.listen_after_bind();
        _impl->finished = true;
    });
    // httplib's stop() does nothing until the accept loop has started, so the destructor could
    // otherwise miss a server that is just starting and wait on its thread for ever.
    while (!_impl->server.is_running() && !_impl->finished)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

metrics_server::~metrics_server() {
    _impl->server.stop();
    if (_impl->thread.joinable()) _impl->thread.join();
}

}  // namespace reefline::metrics
