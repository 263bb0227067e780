// Prometheus metrics: the control plane's `stats` result (docs/control.md) in the text
// exposition format 0.0.4, served over HTTP on a loopback address.
//
// Rendering works from the same JSON object that `reefctl stats --json` prints, so that the two
// views of the daemon can never disagree, and so that the renderer is testable without a daemon.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace reefline::metrics {

// The `stats` result as Prometheus text. Fields absent from `stats` (or of the wrong type) are
// left out; families without a sample are omitted entirely. Never throws on a well-formed
// nlohmann::json value, whatever its shape.
std::string prometheus_text(const nlohmann::json& stats);

// The numeric and boolean fields of `stats` that no metric carries and that are not listed as
// left out on purpose (metrics.cc, not_exported), as paths ("ifs[].shed_total"): a stats key
// added without its metric shows up here (tests run it on a real daemon's stats).
std::vector<std::string> stats_without_metric(const nlohmann::json& stats);

// The content type of prometheus_text()'s output.
inline constexpr const char* content_type = "text/plain; version=0.0.4";

// An HTTP/1.1 server answering GET /metrics with body() (404 for any other path), on one
// thread that polls every connection: idle or slow clients cannot starve a scrape. At most 32
// connections are held (a new one replaces the oldest), a request must arrive within 2 s of
// its connection and its answer be taken within 10 s, one request per connection. Loopback
// only: metrics reveal model names and traffic, and the daemon has no authentication for
// them, so binding a routable address is refused rather than configurable.
class metrics_server {
public:
    // Binds at once (port 0: an ephemeral port, see port()). Throws std::invalid_argument if
    // `host` is not a loopback address (127.0.0.0/8, ::1 or "localhost") and
    // std::runtime_error if the address cannot be bound.
    metrics_server(const std::string& host, uint16_t port, std::function<std::string()> body);
    ~metrics_server();  // stops serving and joins the thread

    metrics_server(const metrics_server&) = delete;
    metrics_server& operator=(const metrics_server&) = delete;

    uint16_t port() const { return _port; }
    const std::string& host() const { return _host; }

private:
    struct impl;
    std::unique_ptr<impl> _impl;
    std::string _host;
    uint16_t _port = 0;
};

// Parses "HOST:PORT" ("127.0.0.1:9464", "[::1]:9464", "localhost:9464") as given to the
// daemon's --metrics; throws std::invalid_argument on anything else.
std::pair<std::string, uint16_t> parse_listen_address(const std::string& text);

}  // namespace reefline::metrics
