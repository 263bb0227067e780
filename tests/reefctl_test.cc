// reefctl against a scripted daemon: an in-test ZeroMQ REP server on an ipc:// socket in a
// temp dir that records every request and answers from a script. Checks the requests each
// subcommand sends (fields, types, the absolute --onnx path), exit statuses and stderr for the
// daemon's errors, a missing or silent daemon, bad local files, --json and table output, and
// --help everywhere. The binary comes from $REEFCTL (set by meson test).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "tools/reefctl/client.h"
#include "tools/reefctl/render.h"

extern char** environ;

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace reefline::reefctl;

namespace {

class temp_dir {
public:
    temp_dir() {
        std::string tmpl = (fs::temp_directory_path() / "reefctl_test.XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        _path = tmpl;
    }
    ~temp_dir() {
        std::error_code ec;
        fs::permissions(_path, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(_path, ec);
    }
    std::string file(const std::string& name) const { return (_path / name).string(); }
    const fs::path& path() const { return _path; }

private:
    fs::path _path;
};

std::string ok_reply(const json& result) {
    return json{{"v", 1}, {"ok", true}, {"result", result}}.dump();
}
std::string error_reply(const std::string& code, const std::string& message) {
    return json{{"v", 1}, {"ok", false}, {"error", {{"code", code}, {"message", message}}}}.dump();
}

json summary(const std::string& name, int port, const std::string& cls, uint64_t requests) {
    return {{"name", name},       {"udp_port", port},   {"class", cls},          {"slo_ms", 50},
            {"batching", "slab"}, {"batch_size", 4},    {"min_batch", 1},        {"max_batch", 16},
            {"priority", 0},      {"state", "serving"}, {"requests_total", requests},
            {"responses_total", requests}};
}

json describe_result(const std::string& name) {
    json d = summary(name, 9100, "rt", 10);
    d["onnx"] = "/models/" + name + ".onnx";
    d["input"] = {{"name", "x"}, {"shape", {1, 3, 32, 32}}, {"type", "f32"}};
    d["outputs"] = json::array({{{"name", "y"}, {"shape", {1, 10}}, {"type", "f32"}}});
    d["weight_bytes"] = 123456;
    d["arena_bytes"] = 65536;
    d["kernels"] = 12;
    d["top_k"] = 5;
    d["mean"] = {123.675, 116.28, 103.53};
    d["std"] = {58.395, 57.12, 57.375};
    d["rt_sources"] = json::array({"198.18.0.1"});
    d["shed"] = true;
    return d;
}

json stats_result(uint64_t requests, double uptime) {
    auto one_if = [&](const std::string& name, const std::string& cls, uint64_t n) {
        return json{{"name", name},
                    {"udp_port", cls == "rt" ? 9100 : 9101},
                    {"class", cls},
                    {"slo_ms", 50},
                    {"requests_total", n},
                    {"responses_total", n - 2},
                    {"errors_total", 1},
                    {"shed_total", 1},
                    {"slo_violations_total", 3},
                    {"send_failures_total", 0},
                    {"queue_depth", 2},
                    {"in_flight", 1},
                    {"batch_size", 4},
                    {"batches_total", n / 4},
                    {"batched_requests_total", n},
                    {"preemptions_total", 5},
                    {"reexecuted_kernels_total", 7},
                    {"latency_seconds",
                     {{"le", {0.001, 0.01, 0.1}}, {"counts", {1, 5, n}}, {"sum", 1.5}, {"count", n}}},
                    {"latency_ms", {{"p50", 1.25}, {"p90", 4.0}, {"p99", 9.5}, {"max", 12.0}}}};
    };
    return {{"uptime_s", uptime},
            {"ifs", json::array({one_if("cam", "rt", requests), one_if("batchjob", "be", requests * 2)})},
            {"port",
             {{"id", 0}, {"driver", "net_af_packet"}, {"rx_packets", 1000}, {"rx_bytes", 2000000},
              {"tx_packets", 900}, {"tx_bytes", 90000}, {"rx_missed", 4}, {"rx_errors", 0},
              {"tx_errors", 0}, {"rx_nombuf", 0}}},
            {"dataplane",
             {{"rx_packets", 1000}, {"rx_bytes", 2000000}, {"requests_started", 100},
              {"requests_completed", 99}, {"requests_timed_out", 1}, {"requests_evicted", 0},
              {"requests_malformed", 0}, {"requests_ring_full", 0}, {"arp_replies", 2},
              {"tx_packets", 900}, {"tx_bytes", 90000}, {"tx_dropped", 0},
              {"drops", {{"not_ipv4", 3}, {"bad_checksum", 0}, {"ring_full", 2}}}}},
            {"scheduler",
             {{"policy", "reef"}, {"submitted", 50}, {"completed_rt", 20}, {"completed_be", 30},
              {"preemptions", 5}, {"restores", 5}, {"reexecuted_kernels", 7}}}};
}

// An answer for every operation, as a daemon with two IFs would give; `stats` counts up so
// that `watch` has rates to show.
std::optional<std::string> typical_answer(const json& req) {
    static std::atomic<uint64_t> stats_calls{0};
    const std::string op = req.value("op", "");
    if (op == "list")
        return ok_reply({{"models", json::array({summary("cam", 9100, "rt", 1234),
                                                 summary("batchjob", 9101, "be", 55)})}});
    if (op == "describe" || op == "add_model" || op == "set")
        return ok_reply(describe_result(req.value("name", "cam")));
    if (op == "remove_model")
        return ok_reply({{"name", req.value("name", "")}, {"answered_while_draining", 3}});
    if (op == "stats") {
        const uint64_t n = ++stats_calls;
        return ok_reply(stats_result(100 * n, 10.0 + 0.1 * double(n)));
    }
    if (op == "health")
        return ok_reply({{"status", "ok"}, {"version", "0.1.0"}, {"uptime_s", 12.3},
                         {"backend", "cpu (1 compute unit)"}, {"policy", "reef"}, {"models", 2},
                         {"port", {{"id", 0}, {"driver", "net_af_packet"}, {"link_up", true}}}});
    if (op == "shutdown") return ok_reply({{"stopping", true}});
    return error_reply("unknown_op", "no operation '" + op + "'");
}

// The scripted daemon: binds a REP socket at construction (so the socket file exists before
// the test runs reefctl), then answers on its own thread. A script returning nullopt leaves
// the request unanswered, as a wedged daemon would.
class scripted_daemon {
public:
    using script = std::function<std::optional<std::string>(const json&)>;

    explicit scripted_daemon(std::string endpoint, script answer = typical_answer)
        : _endpoint(std::move(endpoint)), _answer(std::move(answer)),
          _socket(_context, zmq::socket_type::rep) {
        _socket.set(zmq::sockopt::linger, 0);
        _socket.bind(_endpoint);
        _thread = std::thread([this] { serve(); });
    }
    ~scripted_daemon() {
        _stop = true;
        _thread.join();
    }

    std::vector<json> requests() {
        std::lock_guard lock(_mutex);
        return _requests;
    }
    json last_request() {
        auto r = requests();
        return r.empty() ? json() : r.back();
    }
    const std::string& endpoint() const { return _endpoint; }

private:
    void serve() {
        bool awaiting_reply = false;
        while (!_stop) {
            zmq::pollitem_t item{_socket.handle(), 0, ZMQ_POLLIN, 0};
            zmq::poll(&item, 1, std::chrono::milliseconds(20));
            if (!(item.revents & ZMQ_POLLIN) || awaiting_reply) continue;
            zmq::message_t msg;
            if (!_socket.recv(msg, zmq::recv_flags::dontwait)) continue;
            json req;
            try {
                req = json::parse(msg.to_string());
            } catch (const json::parse_error&) {
                req = msg.to_string();
            }
            {
                std::lock_guard lock(_mutex);
                _requests.push_back(req);
            }
            if (auto reply = _answer(req)) _socket.send(zmq::buffer(*reply), zmq::send_flags::none);
            else awaiting_reply = true;  // a REP socket cannot take another request now
        }
        _socket.close();
    }

    std::string _endpoint;
    script _answer;
    zmq::context_t _context;
    zmq::socket_t _socket;
    std::thread _thread;
    std::atomic<bool> _stop{false};
    std::mutex _mutex;
    std::vector<json> _requests;
};

struct run_result {
    int status = -1;
    std::string out, err;
    double seconds = 0;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

const char* reefctl_path() { return std::getenv("REEFCTL"); }

// Runs reefctl with `args` (a shell word list) in `cwd`, stdout and stderr captured apart.
run_result run_reefctl(const temp_dir& dir, const std::string& args, const std::string& cwd = "",
                       const std::string& env = "") {
    const std::string out = dir.file("stdout"), err = dir.file("stderr");
    std::string cmd = (cwd.empty() ? "" : "cd '" + cwd + "' && ") + env + " '" + reefctl_path() +
                      "' " + args + " >'" + out + "' 2>'" + err + "'";
    const auto start = std::chrono::steady_clock::now();
    const int rc = std::system(cmd.c_str());
    run_result r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
}

class reefctl_cli : public ::testing::Test {
protected:
    void SetUp() override {
        if (!reefctl_path()) GTEST_SKIP() << "REEFCTL not set (run through meson test)";
        endpoint = "ipc://" + dir.file("control.sock");
        model = dir.file("tiny.onnx");
        std::ofstream(model) << "not really onnx, but reefctl only checks that it can read it";
    }

    run_result run(const std::string& args) {
        return run_reefctl(dir, "--endpoint " + endpoint + " " + args);
    }

    temp_dir dir;
    std::string endpoint, model;
};

TEST_F(reefctl_cli, AddModelSendsEveryTunableWithItsType) {
    scripted_daemon daemon(endpoint);
    fs::create_directory(dir.file("sub"));
    const auto r = run_reefctl(
        dir,
        "--endpoint " + endpoint +
            " add-model --name cam --onnx ../tiny.onnx --port 9100 --class rt --slo-ms 50"
            " --batching fixed --min-batch 2 --max-batch 8 --fixed-batch 4 --priority 1"
            " --top-k 3 --mean 1,2,3.5 --std 4,5,6 --rt-source 198.18.0.1"
            " --rt-source 198.18.0.2 --no-shed",
        dir.file("sub"));
    ASSERT_EQ(r.status, 0) << r.err;
    const json req = daemon.last_request();
    const json expected = {{"v", 1},
                           {"op", "add_model"},
                           {"name", "cam"},
                           {"onnx", fs::canonical(model).string()},
                           {"port", 9100},
                           {"class", "rt"},
                           {"slo_ms", 50},
                           {"batching", "fixed"},
                           {"min_batch", 2},
                           {"max_batch", 8},
                           {"fixed_batch", 4},
                           {"priority", 1},
                           {"top_k", 3},
                           {"mean", {1, 2, 3.5}},
                           {"std", {4, 5, 6}},
                           {"rt_sources", {"198.18.0.1", "198.18.0.2"}},
                           {"shed", false}};
    EXPECT_EQ(req, expected) << req.dump(2);
    // Types, not only values: a daemon that checks is_number_integer() must accept these.
    EXPECT_TRUE(req["v"].is_number_integer());
    EXPECT_TRUE(req["port"].is_number_integer());
    EXPECT_TRUE(req["slo_ms"].is_number_integer());
    EXPECT_TRUE(req["max_batch"].is_number_integer());
    EXPECT_TRUE(req["shed"].is_boolean());
    EXPECT_NE(r.out.find("cam"), std::string::npos) << r.out;
}

TEST_F(reefctl_cli, AddModelSendsOnlyWhatWasGiven) {
    scripted_daemon daemon(endpoint);
    const auto r = run_reefctl(dir,
                               "--endpoint " + endpoint +
                                   " add-model --name cam --onnx tiny.onnx --port 9100 --class be "
                                   "--slo-ms 2.5",
                               dir.path().string());
    ASSERT_EQ(r.status, 0) << r.err;
    const json req = daemon.last_request();
    EXPECT_EQ(req, (json{{"v", 1}, {"op", "add_model"}, {"name", "cam"},
                         {"onnx", fs::canonical(model).string()}, {"port", 9100},
                         {"class", "be"}, {"slo_ms", 2.5}}))
        << req.dump();
    EXPECT_TRUE(fs::path(req["onnx"].get<std::string>()).is_absolute());

    // Without --onnx the daemon takes the repository entry of that name.
    ASSERT_EQ(run("add-model --name cam --port 9100").status, 0);
    EXPECT_EQ(daemon.last_request(),
              (json{{"v", 1}, {"op", "add_model"}, {"name", "cam"}, {"port", 9100}}));
}

TEST_F(reefctl_cli, EverySubcommandSendsItsOperation) {
    scripted_daemon daemon(endpoint);
    struct expectation {
        std::string args;
        json request;
    };
    const std::vector<expectation> cases = {
        {"remove-model --name cam", {{"v", 1}, {"op", "remove_model"}, {"name", "cam"}}},
        {"remove-model cam", {{"v", 1}, {"op", "remove_model"}, {"name", "cam"}}},
        {"list", {{"v", 1}, {"op", "list"}}},
        {"list --json", {{"v", 1}, {"op", "list"}}},
        {"describe --name cam", {{"v", 1}, {"op", "describe"}, {"name", "cam"}}},
        {"describe cam", {{"v", 1}, {"op", "describe"}, {"name", "cam"}}},
        {"set --name cam --slo-ms 20 --class be --shed --max-batch 32 --priority 2",
         {{"v", 1}, {"op", "set"}, {"name", "cam"}, {"slo_ms", 20}, {"class", "be"},
          {"shed", true}, {"max_batch", 32}, {"priority", 2}}},
        {"set --name cam --batching aimd --min-batch 2 --rt-source 10.0.0.1,10.0.0.2",
         {{"v", 1}, {"op", "set"}, {"name", "cam"}, {"batching", "aimd"}, {"min_batch", 2},
          {"rt_sources", {"10.0.0.1", "10.0.0.2"}}}},
        {"set cam --clear-rt-sources --no-shed",
         {{"v", 1}, {"op", "set"}, {"name", "cam"}, {"rt_sources", json::array()}, {"shed", false}}},
        {"set cam --share 0.25", {{"v", 1}, {"op", "set"}, {"name", "cam"}, {"share", 0.25}}},
        {"set cam --share auto", {{"v", 1}, {"op", "set"}, {"name", "cam"}, {"share", "auto"}}},
        {"stats", {{"v", 1}, {"op", "stats"}}},
        {"stats --name cam", {{"v", 1}, {"op", "stats"}, {"name", "cam"}}},
        {"watch --count 1 --interval 0.1", {{"v", 1}, {"op", "stats"}}},
        {"health", {{"v", 1}, {"op", "health"}}},
        {"shutdown", {{"v", 1}, {"op", "shutdown"}}},
    };
    for (const auto& c : cases) {
        const size_t before = daemon.requests().size();
        const auto r = run(c.args);
        EXPECT_EQ(r.status, 0) << c.args << "\n" << r.err;
        const auto reqs = daemon.requests();
        ASSERT_EQ(reqs.size(), before + 1) << c.args;
        EXPECT_EQ(reqs.back(), c.request) << c.args << "\n" << reqs.back().dump();
        EXPECT_TRUE(r.err.empty()) << c.args << "\n" << r.err;
    }
}

TEST_F(reefctl_cli, UsageErrorsSendNothing) {
    scripted_daemon daemon(endpoint);
    for (const std::string args :
         {"set --name cam", "add-model --name cam --port 9100 --class gold",
          "add-model --name 'bad name' --port 9100", "add-model --name cam --port 0",
          "add-model --name cam --port 9100 --mean 1,2", "add-model --name cam --port 9100 --rt-source nope",
          "add-model --name cam --port 9100 --min-batch 8 --max-batch 4",
          "add-model --name cam --port 9100 --std 1,0,1",
          "add-model --name cam --port 9100 --mean 1,nan,1", "add-model --name cam --port 9100 --slo-ms inf",
          "add-model --name cam --port 9100 --slo-ms 0", "set cam --slo-ms -5", "set cam --share 0",
          "set cam --share 1.5", "set cam --share half", "set cam --share automatic", "remove-model",
          "frobnicate", ""}) {
        const auto r = run(args);
        EXPECT_EQ(r.status, 2) << args << "\n" << r.out << r.err;
        EXPECT_FALSE(r.err.empty()) << args;
    }
    EXPECT_TRUE(daemon.requests().empty()) << daemon.requests().size();
}

TEST_F(reefctl_cli, DaemonErrorsExitNonZeroWithCodeAndMessage) {
    scripted_daemon daemon(endpoint, [](const json& req) -> std::optional<std::string> {
        if (req["op"] == "add_model") return error_reply("port_in_use", "UDP port 9100 is taken by IF cam");
        if (req["op"] == "remove_model") return error_reply("unknown_model", "no model IF named 'ghost'");
        if (req["op"] == "list") return error_reply("shutting_down", "the daemon is stopping");
        return error_reply("bad_model", "cannot parse /x.onnx: truncated protobuf");
    });
    auto r = run("add-model --name cam2 --onnx " + model + " --port 9100");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "reefctl: port_in_use: UDP port 9100 is taken by IF cam\n");
    EXPECT_TRUE(r.out.empty()) << r.out;
    r = run("remove-model --name ghost");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "reefctl: unknown_model: no model IF named 'ghost'\n");
    r = run("list --json");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "reefctl: shutting_down: the daemon is stopping\n");
    EXPECT_TRUE(r.out.empty()) << r.out;
    r = run("describe cam");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "reefctl: bad_model: cannot parse /x.onnx: truncated protobuf\n");
    r = run("watch --count 3 --interval 0.1");
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("bad_model"), std::string::npos) << r.err;
}

TEST_F(reefctl_cli, BadRepliesAreReported) {
    scripted_daemon daemon(endpoint, [](const json& req) -> std::optional<std::string> {
        if (req["op"] == "list") return std::string("<html>hello</html>");
        if (req["op"] == "stats") return std::string(R"({"v":1,"result":{}})");
        if (req["op"] == "health") return std::string(R"({"v":2,"ok":true,"result":{}})");
        return std::string(R"([1,2,3])");
    });
    auto r = run("list");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("is not valid JSON"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("<html>hello</html>"), std::string::npos) << r.err;
    r = run("stats");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("\"ok\""), std::string::npos) << r.err;
    r = run("health");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("schema version 2"), std::string::npos) << r.err;
    r = run("describe cam");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("not a JSON object"), std::string::npos) << r.err;
}

// A hostile or broken daemon: wrong types, absurd numbers, terminal escapes, huge or deep
// replies. reefctl prints what it can, never crashes, and exits as documented.
TEST_F(reefctl_cli, HostileRepliesAreClearErrors) {
    const std::string esc = "\x1b[2J\x1b]0;owned\x07";
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    scripted_daemon daemon(endpoint, [&](const json& req) -> std::optional<std::string> {
        const std::string op = req.value("op", "");
        if (op == "list")
            return ok_reply({{"models", json::array({{{"name", esc + "cam"}, {"udp_port", "x"}, {"class", {1, 2}},
                                                       {"requests_total", 1e300}, {"batch_size", -5}}})}});
        if (op == "stats")
            return ok_reply({{"uptime_s", "soon"},
                             {"ifs", json::array({{{"name", "cam"}, {"requests_total", -1e300}, {"errors_total", 1e300},
                                                   {"shed_total", 18446744073709551615ull}, {"latency_ms", 7}}})},
                             {"dataplane", {{"drops", {{esc, 1e300}, {"b", -3}, {"c", "many"}}}}},
                             {"port", "eth0"}});
        if (op == "health")
            return ok_reply({{"status", 5}, {"memory", {{"budget_bytes", "lots"}, {"used_bytes", -1}}}});
        if (op == "describe") return "{\"v\":1,\"ok\":true,\"result\":{\"x\":" + deep + "}}";
        if (op == "remove_model") return error_reply("bad" + esc, std::string(1 << 20, 'm'));
        return std::string("{\"v\":1,\"ok\":true,\"result\":{\"n\":1e999}}");
    });
    auto r = run("list");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << "an escape sequence reached the terminal";
    EXPECT_NE(r.out.find("?[2J"), std::string::npos) << r.out;
    r = run("stats");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
    r = run("watch --count 2 --interval 0.05");
    EXPECT_EQ(r.status, 0) << r.err;
    r = run("health");
    EXPECT_EQ(r.status, 1) << "status is not \"ok\"";
    r = run("describe cam");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("nested more than"), std::string::npos) << r.err.substr(0, 300);
    EXPECT_LT(r.err.size(), 600u);
    r = run("remove-model cam");
    EXPECT_EQ(r.status, 1);
    EXPECT_LT(r.err.size(), max_message_bytes + 200) << "a huge message is cut";
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos);
    r = run("shutdown");
    EXPECT_EQ(r.status, 3) << "a number JSON cannot hold is not a reply";
    EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
}

TEST_F(reefctl_cli, AnOversizedReplyIsDroppedNotAllocated) {
    const std::string huge = ok_reply({{"x", std::string(17u << 20, 'x')}});
    scripted_daemon daemon(endpoint, [&](const json&) -> std::optional<std::string> { return huge; });
    const auto r = run("--timeout-ms 1500 health");
    EXPECT_EQ(r.status, 3) << r.err;
    EXPECT_NE(r.err.find("no reply"), std::string::npos) << r.err;
}

TEST_F(reefctl_cli, NoDaemonIsAClearErrorAndQuick) {
    // No socket file at all: reported before anything is sent.
    auto r = run("--timeout-ms 5000 list");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("is reefline running (reefline --control " + endpoint + ")?"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 3.0);

    // A file that is not a socket.
    std::ofstream(dir.file("control.sock")) << "x";
    r = run("list");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("is not a socket"), std::string::npos) << r.err;
    fs::remove(dir.file("control.sock"));

    // A daemon that takes the request and never answers: the timeout bounds the wait.
    scripted_daemon wedged(endpoint, [](const json&) { return std::nullopt; });
    r = run("--timeout-ms 300 list");
    EXPECT_EQ(r.status, 3);
    EXPECT_EQ(r.err, "reefctl: no reply from " + endpoint +
                         " within 300 ms: is reefline running (reefline --control " + endpoint +
                         ")?\n");
    EXPECT_LT(r.seconds, 3.0);
    EXPECT_GE(r.seconds, 0.29);
}

TEST_F(reefctl_cli, SlowOperationTimeoutSaysItMayStillComplete) {
    scripted_daemon wedged(endpoint, [](const json&) { return std::nullopt; });
    const auto r = run("--timeout-ms 200 add-model --name cam --onnx " + model + " --port 9100");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("no reply from " + endpoint + " within 200 ms"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("may still complete"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 3.0);
}

TEST_F(reefctl_cli, ClosedTcpPortTimesOut) {
    // Nothing listens there (port 1 needs root to bind); ZeroMQ keeps reconnecting quietly.
    const auto r = run_reefctl(dir, "--endpoint tcp://127.0.0.1:1 --timeout-ms 200 health");
    EXPECT_EQ(r.status, 3);
    EXPECT_NE(r.err.find("no reply from tcp://127.0.0.1:1 within 200 ms"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 3.0);
    const auto bad = run_reefctl(dir, "--endpoint bogus://x health");
    EXPECT_EQ(bad.status, 3);
    EXPECT_NE(bad.err.find("bogus://x"), std::string::npos) << bad.err;
}

TEST_F(reefctl_cli, UnreadableOnnxIsCaughtLocally) {
    scripted_daemon daemon(endpoint);
    auto r = run("add-model --name cam --onnx " + dir.file("missing.onnx") + " --port 9100");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("missing.onnx: no such file"), std::string::npos) << r.err;
    r = run("add-model --name cam --onnx " + dir.path().string() + " --port 9100");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
    std::ofstream(dir.file("empty.onnx")).close();
    r = run("add-model --name cam --onnx " + dir.file("empty.onnx") + " --port 9100");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
    if (::geteuid() != 0) {  // root reads files whatever their mode
        ::chmod(model.c_str(), 0);
        r = run("add-model --name cam --onnx " + model + " --port 9100");
        EXPECT_EQ(r.status, 2);
        EXPECT_NE(r.err.find("cannot be read"), std::string::npos) << r.err;
    }
    EXPECT_TRUE(daemon.requests().empty());
}

// keygen writes a usable pair (the secret unreadable to others, never overwritten); CURVE
// options are checked before anything is sent.
TEST_F(reefctl_cli, KeygenAndCurveOptions) {
    scripted_daemon daemon(endpoint);
    const std::string prefix = dir.file("op");
    auto r = run("keygen --out " + prefix);
    ASSERT_EQ(r.status, 0) << r.err;
    struct stat st {};
    ASSERT_EQ(::stat((prefix + ".key").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    const std::string pub = read_file(prefix + ".pub"), sec = read_file(prefix + ".key");
    ASSERT_EQ(pub.size(), 41u);
    ASSERT_EQ(sec.size(), 41u);
    char derived[41];
    ASSERT_EQ(zmq_curve_public(derived, sec.substr(0, 40).c_str()), 0);
    EXPECT_EQ(std::string(derived), pub.substr(0, 40));
    EXPECT_NE(r.out.find(pub.substr(0, 40)), std::string::npos) << r.out;
    r = run("keygen --out " + prefix);
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
    EXPECT_EQ(read_file(prefix + ".key"), sec) << "a key was overwritten";

    r = run("--curve-key " + prefix + ".key list");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("--curve-server-key"), std::string::npos) << r.err;
    std::ofstream(dir.file("bad.pub")) << "short\n";
    r = run("--curve-server-key " + dir.file("bad.pub") + " --curve-key " + prefix + ".key list");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("bad.pub: does not hold a 40-character Z85 key"), std::string::npos) << r.err;
    r = run_reefctl(dir, "--endpoint " + endpoint + " list", "", "REEFLINE_CURVE_KEY='" + prefix + ".key'");
    EXPECT_EQ(r.status, 2) << "the environment's key is checked like the option's";
    EXPECT_TRUE(daemon.requests().empty());
}

TEST_F(reefctl_cli, JsonOutputIsTheResult) {
    scripted_daemon daemon(endpoint);
    auto r = run("list --json");
    ASSERT_EQ(r.status, 0) << r.err;
    const json list = json::parse(r.out);
    EXPECT_EQ(list, json::parse(*typical_answer({{"op", "list"}}))["result"]);

    r = run("--json stats");
    ASSERT_EQ(r.status, 0) << r.err;
    const json stats = json::parse(r.out);
    ASSERT_TRUE(stats["ifs"].is_array());
    EXPECT_EQ(stats["ifs"][0]["name"], "cam");
    EXPECT_EQ(stats["dataplane"]["drops"]["not_ipv4"], 3);

    for (const std::string args : {"describe cam --json", "health --json", "remove-model cam --json",
                                   "add-model --name cam --port 1 --json", "shutdown --json"}) {
        r = run(args);
        ASSERT_EQ(r.status, 0) << args << r.err;
        json parsed;
        EXPECT_NO_THROW(parsed = json::parse(r.out)) << args << "\n" << r.out;
    }
    // watch --json: one stats object per line.
    r = run("watch --json --count 2 --interval 0.05");
    ASSERT_EQ(r.status, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    int n = 0;
    while (std::getline(lines, line)) {
        EXPECT_TRUE(json::parse(line).contains("ifs")) << line;
        ++n;
    }
    EXPECT_EQ(n, 2);
}

TEST_F(reefctl_cli, TablesNameTheModels) {
    scripted_daemon daemon(endpoint);
    auto r = run("list");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.rfind("NAME", 0), 0u) << r.out;
    for (const char* s : {"PORT", "CLASS", "SLO_MS", "BATCHING", "BATCH", "STATE", "REQUESTS", "cam",
                          "batchjob", "9100", "serving", "1234"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
    // Aligned: every row starts its PORT cell where the header's PORT column ends.
    std::istringstream in(r.out);
    std::string header, row;
    std::getline(in, header);
    const size_t port_end = header.find("PORT") + 4;
    while (std::getline(in, row)) EXPECT_NE(row[port_end - 1], ' ') << row;

    r = run("stats");
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* s : {"cam", "batchjob", "P99_MS", "9.50", "MAX_MS", "12.00", "net_af_packet", "not_ipv4 3",
                          "ring_full 2", "missed 4", "scheduler (reef)"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
    EXPECT_EQ(r.out.find("bad_checksum"), std::string::npos) << "zero drops are not listed\n" << r.out;

    r = run("describe cam");
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* s : {"/models/cam.onnx", "x [1, 3, 32, 32] f32", "198.18.0.1", "120.6 KiB"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;

    r = run("health");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("0.1.0"), std::string::npos) << r.out;

    // Two frames: the second has rates (the scripted stats grow by 100 requests per 0.1 s).
    r = run("watch --count 2 --interval 0.1");
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* s : {"REQ/S", "RESP/S", "P50_MS", "QUEUE", "DROPS", "cam", "batchjob", "1000.0"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST_F(reefctl_cli, WatchExitsZeroOnCtrlC) {
    scripted_daemon daemon(endpoint);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, dir.file("watch.out").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const std::string bin = reefctl_path();
    std::vector<std::string> args = {bin, "--endpoint", endpoint, "watch", "--interval", "0.1"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, bin.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // The handler is installed before the first request: wait for that, however slow the
    // machine, so that the signal tests the handler rather than the default action.
    for (int i = 0; i < 1000 && daemon.requests().empty(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ::kill(pid, SIGINT);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_NE(read_file(dir.file("watch.out")).find("cam"), std::string::npos);
    EXPECT_GE(daemon.requests().size(), 2u);
}

TEST_F(reefctl_cli, HelpForEverySubcommand) {
    for (const std::string sub : {"", "add-model ", "remove-model ", "list ", "describe ", "set ",
                                  "stats ", "watch ", "health ", "shutdown "}) {
        const auto r = run(sub + "--help");
        EXPECT_EQ(r.status, 0) << sub << r.err;
        EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub << r.out;
    }
}

TEST_F(reefctl_cli, EndpointFromEnvironment) {
    scripted_daemon daemon(endpoint);
    const auto r = run_reefctl(dir, "list --json", "", "REEFLINE_CONTROL=" + endpoint);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(daemon.requests().size(), 1u);
}

// The client library alone, as other tools and tests would use it.
TEST(reefctl_client, CallReturnsResultOrThrowsTypedError) {
    temp_dir dir;
    const std::string endpoint = "ipc://" + dir.file("c.sock");
    scripted_daemon daemon(endpoint, [](const json& req) -> std::optional<std::string> {
        if (req["op"] == "health") return ok_reply({{"status", "ok"}});
        if (req["op"] == "shutdown") return std::string(R"({"v":1,"ok":true})");
        return error_reply("unknown_op", "nope");
    });
    EXPECT_EQ(call(endpoint, {{"op", "health"}}, 1000), (json{{"status", "ok"}}));
    EXPECT_EQ(daemon.last_request(), (json{{"v", 1}, {"op", "health"}}));
    EXPECT_EQ(call(endpoint, {{"op", "shutdown"}}, 1000), json::object());
    try {
        call(endpoint, {{"op", "frob"}}, 1000);
        FAIL() << "no exception";
    } catch (const control_error& e) {
        EXPECT_EQ(e.code(), "unknown_op");
        EXPECT_STREQ(e.what(), "nope");
        EXPECT_TRUE(e.from_daemon());
    }
    try {
        call("ipc://" + dir.file("absent.sock"), {{"op", "health"}}, 1000);
        FAIL() << "no exception";
    } catch (const control_error& e) {
        EXPECT_EQ(e.code(), local_code::no_daemon);
        EXPECT_FALSE(e.from_daemon());
    }
}

TEST(reefctl_client, ReplyEnvelope) {
    EXPECT_EQ(parse_reply("e", R"({"v":1,"ok":true,"result":{"a":1}})"), (json{{"a", 1}}));
    auto code_of = [](const std::string& text) {
        try {
            parse_reply("e", text);
        } catch (const control_error& e) {
            return e.code();
        }
        return std::string("none");
    };
    EXPECT_EQ(code_of(R"({"v":1,"ok":false,"error":{"code":"internal","message":"m"}})"), "internal");
    EXPECT_EQ(code_of(R"({"v":1,"ok":false,"error":{"message":"m"}})"), local_code::bad_reply);
    EXPECT_EQ(code_of(R"({"v":1,"ok":false})"), local_code::bad_reply);
    EXPECT_EQ(code_of(R"({"v":1,"ok":"yes"})"), local_code::bad_reply);
    EXPECT_EQ(code_of(R"({"v":1,"ok":true,"result":[1]})"), local_code::bad_reply);
    EXPECT_EQ(code_of(""), local_code::bad_reply);
    EXPECT_EQ(code_of("{\"v\":1,\"ok\":true,\"result\":" + std::string(5000, '[') + std::string(5000, ']') + "}"),
              local_code::bad_reply);
    EXPECT_EQ(code_of("{\"v\":1,\"ok\":true,\"result\":{\"s\":\"\xff\"}}"), local_code::bad_reply);
    try {
        parse_reply("e", "{\"v\":1,\"ok\":false,\"error\":{\"code\":\"x\\u001b\",\"message\":\"" + std::string(10000, 'm') + "\"}}");
        ADD_FAILURE() << "no exception";
    } catch (const control_error& e) {
        EXPECT_EQ(e.code(), "x?");
        EXPECT_LE(std::string(e.what()).size(), max_message_bytes + 3);
    }
    EXPECT_EQ(ipc_path("ipc:///run/x.sock"), "/run/x.sock");
    EXPECT_EQ(ipc_path("ipc://@abstract"), "");
    EXPECT_EQ(ipc_path("tcp://127.0.0.1:5555"), "");
}

TEST(reefctl_render, ToleratesMissingFields) {
    for (const json& j : {json(), json::object(), json::array(), json("x"),
                          json{{"models", 3}}, json{{"ifs", {1, "x", nullptr}}},
                          json{{"ifs", json::array({json::object()})}, {"port", 1}, {"dataplane", {{"drops", 5}}}}}) {
        EXPECT_NO_THROW((void)render_list(j)) << j.dump();
        EXPECT_NO_THROW((void)render_stats(j)) << j.dump();
        EXPECT_NO_THROW((void)render_describe(j)) << j.dump();
        EXPECT_NO_THROW((void)render_health(j)) << j.dump();
        EXPECT_NO_THROW((void)render_watch("e", j, j, 1.0, 1.0)) << j.dump();
    }
    const json memory = {{"budget_bytes", 2147483648.0}, {"used_bytes", 1288490188.8}, {"free_bytes", 858993459.2},
                         {"max_model_file_bytes", 1073741824}};
    EXPECT_NE(render_health({{"status", "ok"}, {"memory", memory}}).find("budget 2.0 GiB, used 1.2 GiB, free 819.2 MiB"),
              std::string::npos)
        << render_health({{"memory", memory}});
    const json footprint = {{"total_bytes", 3 << 20}, {"weight_bytes", 1 << 20}, {"host_bytes", 1 << 20},
                            {"instance_bytes", 1 << 20}, {"shared_weights", true}};
    EXPECT_NE(render_describe({{"memory", footprint}}).find("3.0 MiB: weights 1.0 MiB (+ 1.0 MiB host copy), instances 1.0 MiB; "
                                                            "weights shared with another IF"),
              std::string::npos)
        << render_describe({{"memory", footprint}});
    const json granted = {{"bound", true}, {"count", 16}, {"exact", false}, {"note", "SM slices 0-1 of 16 (8 SMs each)"}};
    EXPECT_NE(render_describe({{"units_granted", granted}}).find("16 units (SM slices 0-1 of 16 (8 SMs each))"),
              std::string::npos)
        << render_describe({{"units_granted", granted}});
    const json unbound = {{"bound", false}, {"note", "the driver has no cuGreenCtxCreate"}};
    EXPECT_NE(render_describe({{"units_granted", unbound}}).find("none: runs on the whole device (the driver has no"),
              std::string::npos);
    const json shares = {{"mechanism", "green_contexts"}, {"usable", true}, {"binds", 5}, {"fallbacks", 0}, {"partitions", 2}};
    EXPECT_NE(render_health({{"units", shares}}).find("green_contexts, usable, 5 binds, 0 fallbacks, 2 partitions"),
              std::string::npos)
        << render_health({{"units", shares}});
    const json knee = {{"share", 0.5}, {"units", 2}, {"device_units", 4}, {"batch", 16},
                       {"curve", {{{"units", 1}, {"batch_ms", 80.25}}, {{"units", 2}, {"batch_ms", 41.0}}}}};
    EXPECT_NE(render_describe({{"knee", knee}}).find("0.50 of the device (2 of 4 units) at batch 16; 1u 80.2 ms 2u 41.0 ms"),
              std::string::npos)
        << render_describe({{"knee", knee}});
    EXPECT_NE(render_describe({{"knee", nullptr}}).find("not measured"), std::string::npos);
    const json arenas = json::array({{{"lane", "be"}, {"bytes", 3 << 20}, {"batch_sizes", {1, 2, 4}}}});
    EXPECT_NE(render_describe({{"arenas", arenas}}).find("be 3.0 MiB for batch 1, 2, 4"), std::string::npos)
        << render_describe({{"arenas", arenas}});
    EXPECT_NO_THROW((void)render_describe({{"arenas", json::array({json::object(), 1})}}));
}

}  // namespace
