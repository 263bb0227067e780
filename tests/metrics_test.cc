// Prometheus metrics: the text exposition of a stats object (every family with HELP and TYPE,
// families contiguous, cumulative histograms ending in +Inf == _count, label escaping, any
// missing or mistyped field tolerated) and the loopback HTTP server.
#include <gtest/gtest.h>

#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "dataplane/counters.h"
#include "ifmanager/metrics.h"

using json = nlohmann::json;
using namespace reefline::metrics;

namespace {

json sample_stats() {
    auto one_if = [](const std::string& name, const std::string& cls, json latency) {
        return json{{"name", name},
                    {"udp_port", 9100},
                    {"class", cls},
                    {"slo_ms", 50},
                    {"requests_total", 1234},
                    {"responses_total", 1230},
                    {"errors_total", 1},
                    {"shed_total", 2},
                    {"slo_violations_total", 3},
                    {"send_failures_total", 0},
                    {"queue_depth", 5},
                    {"in_flight", 4},
                    {"batch_size", 8},
                    {"batches_total", 160},
                    {"batched_requests_total", 1230},
                    {"preemptions_total", 9},
                    {"reexecuted_kernels_total", 11},
                    {"latency_seconds", latency},
                    {"latency_ms", {{"p50", 1.5}, {"p90", 3.0}, {"p99", 7.0}, {"max", 9.0}}}};
    };
    return {{"uptime_s", 12.5},
            {"ifs",
             json::array({one_if("cam", "rt",
                                 {{"le", {0.0005, 0.001, 0.005, 0.01}},
                                  {"counts", {10, 200, 1100, 1225}},
                                  {"sum", 3.25},
                                  {"count", 1230}}),
                          one_if("we\"ird\\name\nx", "be",
                                 {{"le", {0.001, 0.01}}, {"counts", {4, 6}}, {"sum", 0.01}, {"count", 6}})})},
            {"port",
             {{"id", 0}, {"driver", "net_af_packet"}, {"rx_packets", 100}, {"rx_bytes", 6400},
              {"tx_packets", 90}, {"tx_bytes", 5000}, {"rx_missed", 1}, {"rx_errors", 2},
              {"tx_errors", 3}, {"rx_nombuf", 4}}},
            {"dataplane",
             {{"rx_packets", 100}, {"rx_bytes", 6400}, {"requests_started", 50},
              {"requests_completed", 48}, {"requests_timed_out", 1}, {"requests_evicted", 1},
              {"requests_malformed", 0}, {"requests_ring_full", 0}, {"arp_replies", 2},
              {"tx_packets", 90}, {"tx_bytes", 5000}, {"tx_dropped", 0},
              {"drops", {{"not_ipv4", 3}, {"bad_checksum", 0}, {"ring_full", 7}}}}},
            {"units",
             {{"mechanism", "green_contexts"}, {"usable", true}, {"step", 8}, {"binds", 5}, {"fallbacks", 2},
              {"partitions", 3}}},
            {"scheduler",
             {{"policy", "reef"}, {"submitted", 40}, {"completed_rt", 15}, {"completed_be", 25},
              {"preemptions", 6}, {"restores", 6}, {"reexecuted_kernels", 11}}}};
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    std::string l;
    while (std::getline(in, l)) lines.push_back(l);
    return lines;
}

std::string sample_family(const std::string& name, const std::map<std::string, std::string>& types) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s = suffix;
        if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
            const std::string base = name.substr(0, name.size() - s.size());
            if (types.count(base) && types.at(base) == "histogram") return base;
        }
    }
    return name;
}

// The structural rules of format 0.0.4 that a scraper enforces: HELP then TYPE once per
// family, before its samples; a family's samples contiguous; every sample line well-formed.
void check_exposition(const std::string& text) {
    if (text.empty()) return;
    ASSERT_EQ(text.back(), '\n');
    static const std::regex sample_re(
        R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*)\})? (\S+)$)");
    std::map<std::string, std::string> types;
    std::set<std::string> helped, finished;
    std::string current;
    for (const auto& l : lines_of(text)) {
        std::smatch m;
        if (l.rfind("# HELP ", 0) == 0) {
            const std::string name = l.substr(7, l.find(' ', 7) - 7);
            EXPECT_TRUE(helped.insert(name).second) << "second HELP for " << name;
            continue;
        }
        if (l.rfind("# TYPE ", 0) == 0) {
            std::istringstream in(l.substr(7));
            std::string name, type;
            in >> name >> type;
            EXPECT_TRUE(helped.count(name)) << "TYPE before HELP for " << name;
            EXPECT_TRUE(types.emplace(name, type).second) << "second TYPE for " << name;
            EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << l;
            if (type == "counter") {
                EXPECT_TRUE(name.ends_with("_total")) << name;
            }
            if (!current.empty() && current != name) finished.insert(current);
            current = name;
            continue;
        }
        ASSERT_TRUE(std::regex_match(l, m, sample_re)) << "malformed sample line: " << l;
        const std::string family = sample_family(m[1], types);
        EXPECT_TRUE(types.count(family)) << "no TYPE for " << family;
        EXPECT_EQ(family, current) << "samples of " << family << " not contiguous";
        EXPECT_FALSE(finished.count(family)) << family;
        EXPECT_NO_THROW((void)std::stod(m[7] == "+Inf" ? "inf" : std::string(m[7]))) << l;
    }
}

// The value of the one sample line that starts with `prefix` (name and labels).
std::optional<std::string> value_of(const std::string& text, const std::string& prefix) {
    for (const auto& l : lines_of(text))
        if (l.rfind(prefix + " ", 0) == 0) return l.substr(prefix.size() + 1);
    return std::nullopt;
}

TEST(metrics_text, EveryFamilyHasHelpAndType) {
    const std::string text = prometheus_text(sample_stats());
    check_exposition(text);
    for (const char* family :
         {"reefline_if_requests_total", "reefline_if_responses_total", "reefline_if_errors_total",
          "reefline_if_shed_total", "reefline_if_slo_violations_total",
          "reefline_if_send_failures_total", "reefline_if_queue_depth", "reefline_if_in_flight",
          "reefline_if_batch_size", "reefline_if_batches_total", "reefline_if_batched_requests_total",
          "reefline_if_preemptions_total", "reefline_if_reexecuted_kernels_total",
          "reefline_if_latency_seconds", "reefline_port_rx_packets_total",
          "reefline_port_rx_bytes_total", "reefline_port_tx_packets_total",
          "reefline_port_tx_bytes_total", "reefline_port_rx_missed_total",
          "reefline_port_rx_errors_total", "reefline_port_tx_errors_total",
          "reefline_port_rx_nombuf_total", "reefline_dataplane_requests_started_total",
          "reefline_dataplane_requests_timed_out_total", "reefline_dataplane_drops_total",
          "reefline_scheduler_preemptions_total", "reefline_scheduler_completed_total",
          "reefline_uptime_seconds"}) {
        EXPECT_NE(text.find(std::string("# HELP ") + family + " "), std::string::npos) << family;
        EXPECT_NE(text.find(std::string("# TYPE ") + family + " "), std::string::npos) << family;
    }
    EXPECT_NE(text.find("# TYPE reefline_if_latency_seconds histogram\n"), std::string::npos);
    EXPECT_NE(text.find("# TYPE reefline_if_queue_depth gauge\n"), std::string::npos);
    EXPECT_EQ(value_of(text, R"(reefline_if_requests_total{if="cam",class="rt"})"), "1234");
    EXPECT_EQ(value_of(text, R"(reefline_if_batch_size{if="cam",class="rt"})"), "8");
    EXPECT_EQ(value_of(text, R"(reefline_port_rx_nombuf_total{port="0",driver="net_af_packet"})"), "4");
    EXPECT_EQ(value_of(text, R"(reefline_dataplane_drops_total{reason="not_ipv4"})"), "3");
    EXPECT_EQ(value_of(text, R"(reefline_dataplane_drops_total{reason="bad_checksum"})"), "0");
    EXPECT_EQ(value_of(text, R"(reefline_dataplane_drops_total{reason="ring_full"})"), "7");
    EXPECT_EQ(value_of(text, R"(reefline_scheduler_completed_total{class="be"})"), "25");
    EXPECT_EQ(value_of(text, "reefline_scheduler_preemptions_total"), "6");
    EXPECT_EQ(value_of(text, "reefline_uptime_seconds"), "12.5");
    EXPECT_EQ(value_of(text, R"(reefline_if_slo_seconds{if="cam",class="rt"})"), "0.05");
    EXPECT_EQ(value_of(text, "reefline_device_units_usable"), "1");
    EXPECT_EQ(value_of(text, "reefline_device_unit_binds_total"), "5");
    EXPECT_EQ(value_of(text, "reefline_device_unit_fallbacks_total"), "2");
    EXPECT_EQ(value_of(text, "reefline_device_unit_partitions"), "3");
}

// Every number of the stats object reaches a metric; one added without its metric is named.
TEST(metrics_text, StatsKeysWithoutAMetricAreNamed) {
    json stats = sample_stats();
    EXPECT_EQ(stats_without_metric(stats), std::vector<std::string>{});
    stats["scheduler"]["brand_new_total"] = 3;
    stats["ifs"][0]["another_gauge"] = 1.5;
    stats["dataplane"]["drops"]["a_new_reason"] = 2;  // exported: drops carry any reason as a label
    EXPECT_EQ(stats_without_metric(stats), (std::vector<std::string>{"ifs[].another_gauge", "scheduler.brand_new_total"}));
}

// The data plane's counters are declared once (dataplane/counters.h): each is exported under
// its name with its help, without a table here to keep in step.
TEST(metrics_text, EveryDataplaneCounterIsExportedWithItsHelp) {
    json dp = json::object();
    for (const auto& c : reefline::dp::dataplane_counter_infos) dp[std::string(c.name)] = 7;
    const std::string text = prometheus_text(json{{"dataplane", dp}});
    for (const auto& c : reefline::dp::dataplane_counter_infos) {
        const std::string family = "reefline_dataplane_" + std::string(c.name) + "_total";
        EXPECT_NE(text.find("# HELP " + family + " " + std::string(c.help) + "\n"), std::string::npos) << family;
        EXPECT_NE(text.find("# TYPE " + family + " counter\n"), std::string::npos) << family;
        EXPECT_NE(text.find(family + " 7\n"), std::string::npos) << family;
    }
}

// The alert rules' groups of drop reasons (deploy/k8s) are the kinds dataplane/counters.h
// gives each reason: a reason added or moved there and not in the rules fails here.
TEST(metrics_alerts, DropAlertsFollowTheDropKinds) {
    const char* root = std::getenv("REEFLINE_SOURCE_ROOT");
    if (!root) GTEST_SKIP() << "REEFLINE_SOURCE_ROOT not set (meson sets it)";
    std::ifstream in(std::filesystem::path(root) / "deploy/k8s/base/prometheusrule.yaml");
    ASSERT_TRUE(in) << "cannot read the alert rules";
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string rules = ss.str();
    auto reasons_in = [&](const std::string& op) {
        std::set<std::string> out;
        const std::regex re("reefline_dataplane_drops_total\\{reason" + op + "\"([a-z0-9_|]+)\"\\}");
        std::smatch m;
        if (!std::regex_search(rules, m, re)) return out;
        std::stringstream names(m[1].str());
        for (std::string n; std::getline(names, n, '|');) out.insert(n);
        return out;
    };
    std::set<std::string> capacity, quiet;
    for (size_t i = 0; i < reefline::dp::drop_reason_count; ++i) {
        const std::string n(reefline::dp::drop_reason_names[i]);
        const auto kind = reefline::dp::drop_reason_kinds[i];
        if (kind == reefline::dp::drop_kind::capacity) capacity.insert(n);
        if (kind != reefline::dp::drop_kind::malformed) quiet.insert(n);
    }
    EXPECT_EQ(reasons_in("=~"), capacity) << "ReeflineDataplaneDropsRising must match the capacity reasons";
    EXPECT_EQ(reasons_in("!~"), quiet) << "ReeflineMalformedTraffic must leave out the capacity and stray reasons";
}

TEST(metrics_text, HistogramIsCumulativeWithInfEqualToCount) {
    const std::string text = prometheus_text(sample_stats());
    const std::string labels = R"(if="cam",class="rt")";
    std::vector<std::pair<std::string, double>> buckets;
    for (const auto& l : lines_of(text)) {
        const std::string prefix = "reefline_if_latency_seconds_bucket{" + labels + ",le=\"";
        if (l.rfind(prefix, 0) != 0) continue;
        const auto q = l.find('"', prefix.size());
        buckets.emplace_back(l.substr(prefix.size(), q - prefix.size()), std::stod(l.substr(l.rfind(' '))));
    }
    ASSERT_EQ(buckets.size(), 5u);
    EXPECT_EQ(buckets[0].first, "0.0005");
    EXPECT_EQ(buckets[3].first, "0.01");
    EXPECT_EQ(buckets.back().first, "+Inf");
    for (size_t i = 1; i < buckets.size(); ++i) EXPECT_LE(buckets[i - 1].second, buckets[i].second);
    const auto count = value_of(text, "reefline_if_latency_seconds_count{" + labels + "}");
    ASSERT_TRUE(count);
    EXPECT_EQ(buckets.back().second, std::stod(*count));
    EXPECT_EQ(*count, "1230");
    EXPECT_EQ(value_of(text, "reefline_if_latency_seconds_sum{" + labels + "}"), "3.25");

    // Inconsistent input (a bucket going down, count below the last bucket, unsorted le, an
    // explicit +Inf entry) still gives a valid histogram.
    json stats = {{"ifs", {{{"name", "x"},
                            {"latency_seconds",
                             {{"le", {0.1, 0.05, 0.2, 0.3}}, {"counts", {5, 1, 3, 9, 12}}, {"count", 7}}}}}}};
    const std::string odd = prometheus_text(stats);
    check_exposition(odd);
    EXPECT_EQ(value_of(odd, R"(reefline_if_latency_seconds_bucket{if="x",le="0.1"})"), "5");
    EXPECT_EQ(value_of(odd, R"(reefline_if_latency_seconds_bucket{if="x",le="0.05"})"), std::nullopt);
    EXPECT_EQ(value_of(odd, R"(reefline_if_latency_seconds_bucket{if="x",le="0.2"})"), "5");
    EXPECT_EQ(value_of(odd, R"(reefline_if_latency_seconds_bucket{if="x",le="0.3"})"), "9");
    EXPECT_EQ(value_of(odd, R"(reefline_if_latency_seconds_bucket{if="x",le="+Inf"})"), "12");
    EXPECT_EQ(value_of(odd, R"(reefline_if_latency_seconds_count{if="x"})"), "12");
}

TEST(metrics_text, LabelValuesAreEscaped) {
    const std::string text = prometheus_text(sample_stats());
    check_exposition(text);
    EXPECT_EQ(value_of(text, R"(reefline_if_requests_total{if="we\"ird\\name\nx",class="be"})"), "1234")
        << text;
    EXPECT_EQ(text.find("ird\\name\nx"), std::string::npos) << "raw newline in a label";
    json stats = {{"dataplane", {{"drops", {{"a\"b\\c\nd", 1}}}}}};
    EXPECT_EQ(prometheus_text(stats).find(R"({reason="a\"b\\c\nd"} 1)") != std::string::npos, true)
        << prometheus_text(stats);
}

TEST(metrics_text, MissingFieldsAreSkipped) {
    for (const json& j :
         {json(), json::array(), json("stats"), json(3), json::object(), json{{"ifs", 5}},
          json{{"ifs", {1, "x", nullptr, json::object()}}},
          json{{"ifs", {{{"requests_total", 5}}}}},  // no name: nothing to label it with
          json{{"ifs", {{{"name", 3}, {"requests_total", 5}}}}},
          json{{"ifs", {{{"name", "a"}, {"requests_total", "many"}, {"latency_seconds", {{"le", "x"}}}}}}},
          json{{"ifs", {{{"name", "a"}, {"latency_seconds", {{"le", {0.1}}, {"counts", {"x"}}}}}}}},
          json{{"ifs", {{{"name", "a"}, {"latency_seconds", {{"count", 3}}}}}}},
          json{{"port", {{"rx_packets", "x"}, {"id", {1, 2}}}}, {"dataplane", {{"drops", {1, 2}}}}},
          json{{"scheduler", 7}, {"uptime_s", "long"}}}) {
        std::string text;
        ASSERT_NO_THROW(text = prometheus_text(j)) << j.dump();
        check_exposition(text);
    }
    EXPECT_EQ(prometheus_text(json()), "");
    EXPECT_EQ(prometheus_text(json{{"ifs", {{{"requests_total", 5}}}}}), "");
    const std::string only_count = prometheus_text(json{{"ifs", {{{"name", "a"}, {"latency_seconds", {{"count", 3}}}}}}});
    EXPECT_EQ(value_of(only_count, R"(reefline_if_latency_seconds_bucket{if="a",le="+Inf"})"), "3");
    EXPECT_EQ(value_of(only_count, R"(reefline_if_latency_seconds_count{if="a"})"), "3");
    const std::string partial = prometheus_text(json{{"ifs", {{{"name", "a"}, {"queue_depth", 2}}}}});
    EXPECT_EQ(partial,
              "# HELP reefline_if_queue_depth Requests waiting in the IF's queue.\n"
              "# TYPE reefline_if_queue_depth gauge\n"
              "reefline_if_queue_depth{if=\"a\"} 2\n");
}

TEST(metrics_text, LargeCountersStayExact) {
    const std::string text = prometheus_text(json{{"dataplane", {{"rx_bytes", 18446744073709551615ull}}}});
    EXPECT_EQ(value_of(text, "reefline_dataplane_rx_bytes_total"), "18446744073709551615");
}

TEST(metrics_server, ServesMetricsOnLoopback) {
    std::atomic<int> calls{0};
    metrics_server server("127.0.0.1", 0, [&] {
        ++calls;
        return prometheus_text(sample_stats());
    });
    ASSERT_GT(server.port(), 0);
    httplib::Client client("127.0.0.1", server.port());
    client.set_connection_timeout(2);
    client.set_read_timeout(5);
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");
    EXPECT_EQ(res->body, prometheus_text(sample_stats()));
    EXPECT_EQ(calls, 1);

    res = client.Get("/");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404);
    res = client.Get("/metrics/extra");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404);
    res = client.Post("/metrics", "x", "text/plain");
    ASSERT_TRUE(res);
    EXPECT_NE(res->status, 200);
    EXPECT_EQ(calls, 1);
}

TEST(metrics_server, BodyFailureIsA500) {
    metrics_server server("localhost", 0, []() -> std::string { throw std::runtime_error("no stats yet"); });
    httplib::Client client("127.0.0.1", server.port());
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 500);
    EXPECT_NE(res->body.find("no stats yet"), std::string::npos);
}

TEST(metrics_server, RefusesNonLoopbackAddresses) {
    for (const std::string host : {"0.0.0.0", "192.168.1.10", "::", "example.com", "", "10.0.0.1"}) {
        try {
            metrics_server server(host, 0, [] { return std::string(); });
            ADD_FAILURE() << "bound " << host;
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("'" + host + "'"), std::string::npos) << e.what();
        }
    }
}

TEST(metrics_server, StopsOnDestruction) {
    // Built and destroyed back to back: the destructor must not miss a server still starting.
    for (int i = 0; i < 20; ++i) metrics_server server("127.0.0.1", 0, [] { return std::string("x"); });
    uint16_t port = 0;
    {
        metrics_server server("127.0.0.2", 0, [] { return std::string("x"); });
        port = server.port();
        httplib::Client client("127.0.0.2", port);
        ASSERT_TRUE(client.Get("/metrics"));
    }
    httplib::Client client("127.0.0.2", port);
    client.set_connection_timeout(1);
    EXPECT_FALSE(client.Get("/metrics"));
}

TEST(metrics_server, BusyPortIsAnError) {
    metrics_server first("127.0.0.1", 0, [] { return std::string(); });
    EXPECT_THROW(metrics_server("127.0.0.1", first.port(), [] { return std::string(); }),
                 std::runtime_error);
}

// A raw loopback TCP client: connect, send, read until the server closes.
int connect_to(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Reads until EOF or `timeout`; what arrived.
std::string read_all(int fd, std::chrono::milliseconds timeout) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, int(left.count())) <= 0) break;
        char buf[65536];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    return out;
}

size_t entries_in(const char* dir) {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
    return n;
}

// Many more idle and slowloris connections than the server holds: every scrape is still
// answered within a second, with one server thread and a bounded number of sockets.
TEST(metrics_server, IdleAndSlowConnectionsCannotStarveAScrape) {
    const std::string expected = prometheus_text(sample_stats());
    const size_t threads_before = entries_in("/proc/self/task"), fds_before = entries_in("/proc/self/fd");
    metrics_server server("127.0.0.1", 0, [&] { return expected; });
    EXPECT_EQ(entries_in("/proc/self/task"), threads_before + 1) << "one server thread";
    std::vector<int> idle, slow;
    for (int i = 0; i < 64; ++i) idle.push_back(connect_to(server.port()));
    for (int i = 0; i < 64; ++i) {
        slow.push_back(connect_to(server.port()));
        ::send(slow.back(), "GET /metrics HTTP/1.1\r\nX-Slow: ", 31, MSG_NOSIGNAL);
    }
    for (int fd : idle) ASSERT_GE(fd, 0);
    for (int fd : slow) ASSERT_GE(fd, 0);
    std::atomic<bool> done{false};
    std::thread trickle([&] {
        while (!done.load()) {
            for (int fd : slow) ::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int scrape = 0; scrape < 5; ++scrape) {
        const auto t0 = std::chrono::steady_clock::now();
        httplib::Client client("127.0.0.1", server.port());
        client.set_connection_timeout(1);
        client.set_read_timeout(1);
        const auto res = client.Get("/metrics");
        const auto took = std::chrono::steady_clock::now() - t0;
        ASSERT_TRUE(res) << "scrape " << scrape << ": " << httplib::to_string(res.error());
        EXPECT_EQ(res->status, 200);
        EXPECT_EQ(res->body, expected);
        EXPECT_LT(took, std::chrono::seconds(1)) << "scrape " << scrape;
        // Sockets: the 128 client ends, and at most 32 held by the server (+ listener, pipe).
        EXPECT_LE(entries_in("/proc/self/fd"), fds_before + idle.size() + slow.size() + 32 + 3);
        EXPECT_EQ(entries_in("/proc/self/task"), threads_before + 2) << "the server's thread and the trickler";
    }
    done = true;
    trickle.join();
    // A connection that sends nothing, or trickles its request, is closed at its deadline.
    const int quiet = connect_to(server.port());
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(read_all(quiet, std::chrono::seconds(5)), "");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
    ::close(quiet);
    for (int fd : idle) ::close(fd);
    for (int fd : slow) ::close(fd);
}

TEST(metrics_server, AnswersEachRequestOnceAndRefusesOversizedHeads) {
    metrics_server server("127.0.0.1", 0, [] { return std::string("up 1\n"); });
    int fd = connect_to(server.port());
    const std::string two = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n";
    ::send(fd, two.data(), two.size(), MSG_NOSIGNAL);
    const std::string r = read_all(fd, std::chrono::seconds(3));
    ::close(fd);
    EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
    EXPECT_NE(r.find("Content-Length: 5\r\n"), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
    EXPECT_EQ(r.find("HTTP/1.1", 5), std::string::npos) << "one answer per connection: " << r;
    EXPECT_EQ(r.substr(r.size() - 5), "up 1\n");

    fd = connect_to(server.port());
    const std::string big = "GET /metrics HTTP/1.1\r\nX: " + std::string(10000, 'a');
    ::send(fd, big.data(), big.size(), MSG_NOSIGNAL);
    EXPECT_EQ(read_all(fd, std::chrono::seconds(3)).rfind("HTTP/1.1 431 ", 0), 0u);
    ::close(fd);
    for (const auto& [request, status] : {std::pair{"HEAD /metrics HTTP/1.1\r\n\r\n", "200"},
                                          std::pair{"DELETE /metrics HTTP/1.1\r\n\r\n", "405"},
                                          std::pair{"hello\r\n\r\n", "400"}, std::pair{"GET / HTTP/1.0\r\n\r\n", "404"}}) {
        fd = connect_to(server.port());
        ::send(fd, request, std::strlen(request), MSG_NOSIGNAL);
        const std::string a = read_all(fd, std::chrono::seconds(3));
        ::close(fd);
        EXPECT_EQ(a.rfind(std::string("HTTP/1.1 ") + status, 0), 0u) << request << " -> " << a;
        if (std::string(request).rfind("HEAD", 0) == 0) {
            EXPECT_EQ(a.find("up 1"), std::string::npos) << a;
        }
    }
}

TEST(metrics_address, Parse) {
    EXPECT_EQ(parse_listen_address("127.0.0.1:9464"), (std::pair<std::string, uint16_t>{"127.0.0.1", 9464}));
    EXPECT_EQ(parse_listen_address("[::1]:80"), (std::pair<std::string, uint16_t>{"::1", 80}));
    EXPECT_EQ(parse_listen_address("localhost:0"), (std::pair<std::string, uint16_t>{"localhost", 0}));
    for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:70000", "127.0.0.1:8x"})
        EXPECT_THROW(parse_listen_address(bad), std::invalid_argument) << bad;
}

}  // namespace
