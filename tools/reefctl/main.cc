// reefctl: the operator CLI over reefline's control plane (docs/control.md).
//
//   reefctl [--endpoint E] [--json] [--timeout-ms T] SUBCOMMAND ...
//
// Exit status: 0 success; 1 the daemon answered with an error (printed as
// "reefctl: <code>: <message>"); 2 bad usage or an unreadable local file; 3 no daemon, no reply
// within the timeout, or a reply that is not a version-1 envelope.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "ifmanager/bounded_json.h"
#include "ifmanager/curve_keys.h"
#include "tools/reefctl/client.h"
#include "tools/reefctl/render.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace reefline::reefctl;

constexpr int exit_daemon_error = 1;
constexpr int exit_usage = 2;
constexpr int exit_unreachable = 3;

// add_model loads, plans, uploads and warms up a model, and remove_model drains its queue (up
// to 30 s in the daemon): seconds of work on a large model. Giving up after the usual 5 s would
// report a healthy daemon as absent while the operation goes on to complete.
constexpr int slow_op_timeout_ms = 120 * 1000;

// A local problem found before anything is sent (bad --onnx, inconsistent options).
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::atomic<bool> stop_requested{false};
void on_stop_signal(int) { stop_requested.store(true, std::memory_order_relaxed); }

struct globals {
    std::string endpoint;
    bool json_output = false;
    int timeout_ms = 5000;
    std::string curve_server_key_file, curve_key_file;
    std::optional<curve_client_keys> curve;
    json call(const json& request) const { return reefline::reefctl::call(endpoint, request, timeout_ms, curve ? &*curve : nullptr); }
};

// Numbers go out as JSON integers when they are whole, so that a daemon checking
// is_number_integer() for slo_ms accepts "--slo-ms 50".
json number_value(double v) {
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15)
        return static_cast<int64_t>(v);
    return v;
}

bool parse_triplet(const std::string& text, std::array<double, 3>& out) {
    std::stringstream in(text);
    std::string part;
    size_t n = 0;
    while (std::getline(in, part, ',')) {
        if (n == 3) return false;
        try {
            size_t used = 0;
            out[n] = std::stod(part, &used);
            if (part.find_first_not_of(" \t", used) != std::string::npos) return false;
            if (!std::isfinite(out[n])) return false;  // JSON has no inf or nan
        } catch (const std::exception&) {
            return false;
        }
        ++n;
    }
    return n == 3 && text.back() != ',';
}

std::string check_triplet(const std::string& text) {
    std::array<double, 3> v{};
    return parse_triplet(text, v) ? std::string() : "expected three numbers R,G,B, got '" + text + "'";
}

// The input is divided by std: a zero would turn every pixel into inf.
std::string check_nonzero_triplet(const std::string& text) {
    std::array<double, 3> v{};
    if (!parse_triplet(text, v)) return {};
    return v[0] != 0 && v[1] != 0 && v[2] != 0 ? std::string() : "std must not hold zeros, got '" + text + "'";
}

std::string check_slo_ms(const std::string& text) {
    try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && std::isfinite(v) && v > 0) return {};
    } catch (const std::exception&) {
    }
    return "the SLO is a number of milliseconds above 0, got '" + text + "'";
}

std::string check_share(const std::string& text) {
    if (text == "auto") return {};
    try {
        size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && v > 0 && v <= 1) return {};
    } catch (const std::exception&) {
    }
    return "a share is a fraction of the device above 0 and at most 1, or auto, got '" + text + "'";
}

std::string check_model_name(const std::string& name) {
    static const std::regex re("[A-Za-z0-9_.-]{1,64}");
    return std::regex_match(name, re)
               ? std::string()
               : "a model name is 1 to 64 of A-Z a-z 0-9 _ . -, got '" + name + "'";
}

// The IF tunables shared by add-model and set; only the options given are sent, so that the
// daemon's defaults (add_model) or the IF's current values (set) apply to the rest.
struct tunables {
    std::string cls, batching, mean, std_dev, output, share;
    double slo_ms = 0;
    unsigned min_batch = 0, max_batch = 0, fixed_batch = 0, priority = 0, top_k = 0;
    std::vector<std::string> rt_sources;
    bool shed = true, clear_rt_sources = false;

    std::map<std::string, CLI::Option*> given;

    void add_to(CLI::App& app, bool for_set) {
        given["class"] = app.add_option("--class", cls, "Service class: rt (real time) or be (best effort)")
                             ->check(CLI::IsMember({"rt", "be"}));
        given["slo_ms"] = app.add_option("--slo-ms", slo_ms, "Latency SLO in milliseconds (> 0)")
                              ->check(check_slo_ms);
        given["batching"] =
            app.add_option("--batching", batching, "Batch size controller: slab, aimd or fixed")
                ->check(CLI::IsMember({"slab", "aimd", "fixed"}));
        given["min_batch"] = app.add_option("--min-batch", min_batch, "Smallest batch size")
                                 ->check(CLI::Range(1u, 256u));
        given["max_batch"] = app.add_option("--max-batch", max_batch, "Largest batch size (1..256)")
                                 ->check(CLI::Range(1u, 256u));
        given["fixed_batch"] =
            app.add_option("--fixed-batch", fixed_batch, "Batch size for --batching fixed")
                ->check(CLI::Range(1u, 256u));
        given["priority"] = app.add_option("--priority", priority, "Priority for the prema policy (0..2)")
                                ->check(CLI::Range(0u, 2u));
        if (!for_set) {
            // The schema's set operation does not take these: they shape the model's input and
            // output, fixed when the IF is planned.
            given["top_k"] = app.add_option("--top-k", top_k, "Classes returned per request (1..100)")
                                 ->check(CLI::Range(1u, 100u));
            given["mean"] = app.add_option("--mean", mean, "Per-channel mean R,G,B (u8 scale)")
                                ->check(check_triplet);
            given["std"] = app.add_option("--std", std_dev, "Per-channel std R,G,B (u8 scale, non-zero)")
                               ->check(check_triplet)
                               ->check(check_nonzero_triplet);
        }
        given["rt_sources"] =
            app.add_option("--rt-source", rt_sources,
                           "IPv4 source whose requests are RT whatever the class (repeatable, or A,B)")
                ->check(CLI::ValidIPV4)
                ->take_all()
                ->allow_extra_args(false)
                ->delimiter(',');
        given["output"] = app.add_option("--output", output,
                                         "Answers: topk (the best classes, default) or tensor (the model's "
                                         "output for the request, format result_tensor_f32)")
                              ->check(CLI::IsMember({"topk", "tensor"}));
        given["share"] = app.add_option("--share", share,
                                        "Fraction of the device's compute units the IF's BE batches may run on "
                                        "(0 < F <= 1; GSLICE's GPU%), or auto: tuned to the IF's load")
                             ->check(check_share);
        given["shed"] = app.add_flag("--shed,!--no-shed", shed,
                                     "Answer requests that can no longer meet the SLO with status "
                                     "overloaded (default) or, with --no-shed, serve them late");
        if (for_set)
            given["clear_rt_sources"] =
                app.add_flag("--clear-rt-sources", clear_rt_sources, "Remove every --rt-source override")
                    ->excludes(given["rt_sources"]);
    }

    bool any_given() const {
        for (const auto& [key, opt] : given)
            if (opt->count()) return true;
        return false;
    }

    void fill(json& req) const {
        auto is = [&](const char* key) {
            const auto it = given.find(key);
            return it != given.end() && it->second->count() > 0;
        };
        if (is("class")) req["class"] = cls;
        if (is("slo_ms")) req["slo_ms"] = number_value(slo_ms);
        if (is("batching")) req["batching"] = batching;
        if (is("min_batch")) req["min_batch"] = min_batch;
        if (is("max_batch")) req["max_batch"] = max_batch;
        if (is("fixed_batch")) req["fixed_batch"] = fixed_batch;
        if (is("priority")) req["priority"] = priority;
        if (is("top_k")) req["top_k"] = top_k;
        for (const auto& [key, text] : {std::pair{"mean", &mean}, std::pair{"std", &std_dev}})
            if (is(key)) {
                std::array<double, 3> v{};
                parse_triplet(*text, v);
                req[key] = json::array({number_value(v[0]), number_value(v[1]), number_value(v[2])});
            }
        if (is("rt_sources")) req["rt_sources"] = rt_sources;
        if (is("clear_rt_sources")) req["rt_sources"] = json::array();
        if (is("shed")) req["shed"] = shed;
        if (is("share")) req["share"] = share == "auto" ? json(share) : number_value(std::stod(share));
        if (is("output")) req["output"] = output;
        if (is("min_batch") && is("max_batch") && min_batch > max_batch)
            throw usage_error("--min-batch " + std::to_string(min_batch) + " is above --max-batch " +
                              std::to_string(max_batch));
    }
};

// The daemon runs in another directory, so it gets an absolute path; the file is checked here
// first so that a typo is reported as such rather than as the daemon's bad_model.
std::string resolve_onnx(const std::string& path) {
    std::error_code ec;
    const fs::path abs = fs::absolute(path, ec).lexically_normal();
    if (ec) throw usage_error("--onnx " + path + ": " + ec.message());
    const auto st = fs::status(abs, ec);
    if (!fs::exists(st)) throw usage_error("--onnx " + path + ": no such file");
    if (fs::is_directory(st)) throw usage_error("--onnx " + path + ": is a directory, not an ONNX file");
    if (!fs::is_regular_file(st)) throw usage_error("--onnx " + path + ": is not a regular file");
    // Non-blocking: what is checked here may be swapped for a FIFO meanwhile.
    const int fd = ::open(abs.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        throw usage_error("--onnx " + path + ": cannot be read (" + std::strerror(errno) + ")");
    const auto size = fs::file_size(abs, ec);
    ::close(fd);
    if (!ec && size == 0) throw usage_error("--onnx " + path + ": the file is empty");
    return abs.string();
}

void print_result(const globals& g, const json& result, const std::string& human) {
    if (g.json_output) std::cout << result.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    else std::cout << human;
    std::cout.flush();
}

// `watch`: redraw the stats of every IF every --interval seconds until Ctrl-C (exit 0) or
// --count frames. The first request failing means there is nothing to watch (exit non-zero);
// a later one is shown in the frame and retried, so that a daemon restart does not end the view.
int run_watch(const globals& g, const std::string& name, double interval_s, unsigned count) {
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: a blocked poll returns at once
    ::sigaction(SIGTERM, &sa, nullptr);

    const bool tty = ::isatty(STDOUT_FILENO) && !g.json_output;
    json request{{"op", "stats"}};
    if (!name.empty()) request["name"] = name;
    json previous;
    auto previous_at = std::chrono::steady_clock::now();
    for (unsigned frame = 0; count == 0 || frame < count; ++frame) {
        if (stop_requested) break;
        std::string text;
        try {
            const json current = g.call(request);
            const auto now = std::chrono::steady_clock::now();
            if (g.json_output) text = reefline::ifm::serialise(current) + "\n";
            else
                text = render_watch(g.endpoint, current, previous,
                                    std::chrono::duration<double>(now - previous_at).count(),
                                    interval_s);
            previous = current;
            previous_at = now;
        } catch (const control_error& e) {
            if (stop_requested || e.code() == local_code::interrupted) break;
            if (frame == 0 || e.from_daemon()) throw;
            text = "reefctl: " + std::string(e.what()) + " (retrying every " +
                   fixed(interval_s, 1) + " s)\n";
            previous = json();
        }
        // Clear and home only on a terminal: a pipe or a log gets the frames one after another.
        if (tty) std::cout << "\x1b[H\x1b[2J";
        else if (frame > 0 && !g.json_output) std::cout << "\n";
        std::cout << text << std::flush;
        if (count != 0 && frame + 1 == count) break;
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(interval_s);
        while (!stop_requested && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefctl: control a running reefline daemon (ZeroMQ control plane, schema v1)"};
    app.footer(
        "Exit status: 0 success; 1 the daemon answered with an error; 2 bad usage or an\n"
        "unreadable file; 3 no daemon, no reply within the timeout, a refused CURVE handshake or a\n"
        "malformed reply.");
    // Global options are accepted after the subcommand too (`reefctl list --json`).
    app.fallthrough();
    app.require_subcommand(1);

    globals g;
    app.add_option("--endpoint", g.endpoint,
                   std::string("Control endpoint (default: $REEFLINE_CONTROL, else ") +
                       builtin_endpoint + ", or " + fallback_endpoint +
                       " when only that one exists)");
    app.add_flag("--json", g.json_output, "Print the daemon's result object as JSON");
    auto* timeout_opt =
        app.add_option("--timeout-ms", g.timeout_ms,
                       "How long to wait for each reply (add-model and remove-model: " +
                           std::to_string(slow_op_timeout_ms) + " unless given)")
            ->capture_default_str()
            ->check(CLI::Range(1, 3600 * 1000));

    app.add_option("--curve-server-key", g.curve_server_key_file,
                   "File with the daemon's CURVE public key (its --curve-secret-key's .pub): encrypt "
                   "the connection (default: $REEFLINE_CURVE_SERVER_KEY)");
    app.add_option("--curve-key", g.curve_key_file,
                   "File with this client's CURVE secret key (reefctl keygen; its .pub goes into the "
                   "daemon's --curve-clients list) (default: $REEFLINE_CURVE_KEY)");

    // keygen: local, no daemon
    auto* keygen = app.add_subcommand("keygen", "Write a CURVE key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub");
    std::string keygen_out;
    keygen->add_option("--out,out", keygen_out, "Path prefix of the two files")->required();

    // add-model
    auto* add = app.add_subcommand("add-model", "Load a model as a new IF and publish its UDP port");
    std::string add_name, add_onnx;
    unsigned add_port = 0;
    tunables add_t;
    add->add_option("--name", add_name, "IF name ([A-Za-z0-9_.-], at most 64)")
        ->required()
        ->check(check_model_name);
    add->add_option("--onnx", add_onnx,
                    "ONNX model file (sent as an absolute path); without it the daemon loads the "
                    "repository entry of that name");
    add->add_option("--port", add_port, "UDP port the IF listens on")
        ->required()
        ->check(CLI::Range(1u, 65535u));
    add_t.add_to(*add, false);

    // remove-model
    auto* remove = app.add_subcommand("remove-model", "Unpublish, drain and free an IF");
    std::string remove_name;
    remove->add_option("--name,name", remove_name, "IF name")->required();

    app.add_subcommand("list", "List the IFs");

    auto* describe = app.add_subcommand("describe", "Show one IF in full");
    std::string describe_name;
    describe->add_option("--name,name", describe_name, "IF name")->required();

    auto* set = app.add_subcommand("set", "Change an IF's tunables (applied at its next batch)");
    std::string set_name, set_onnx;
    tunables set_t;
    set->add_option("--name,name", set_name, "IF name")->required();
    set->add_option("--onnx", set_onnx,
                    "A new version of the IF's model (sent as an absolute path): planned and warmed up on "
                    "the side while the IF serves, then switched over between two batches; it must take "
                    "the same requests");
    set_t.add_to(*set, true);

    auto* stats = app.add_subcommand("stats", "Counters per IF, per port, data plane and scheduler");
    std::string stats_name;
    stats->add_option("--name,name", stats_name, "Only this IF");

    auto* watch = app.add_subcommand("watch", "Live view of every IF's rates, latency and queues");
    std::string watch_name;
    double watch_interval = 1.0;
    unsigned watch_count = 0;
    watch->add_option("--name,name", watch_name, "Only this IF");
    watch->add_option("--interval", watch_interval, "Seconds between refreshes")
        ->capture_default_str()
        ->check(CLI::Range(0.05, 3600.0));
    watch->add_option("--count", watch_count, "Refresh this many times, then exit (0: until Ctrl-C)")
        ->capture_default_str();

    app.add_subcommand("health", "Daemon status, version, backend and port (exit 1 unless ok)");
    app.add_subcommand("shutdown", "Stop the daemon cleanly");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : exit_usage;
    }
    if (keygen->parsed()) {
        try {
            const std::string pub = reefline::ifm::write_curve_keypair(keygen_out);
            if (g.json_output) std::cout << json{{"public_key", pub}, {"secret_key_file", keygen_out + ".key"},
                                                 {"public_key_file", keygen_out + ".pub"}}.dump() << "\n";
            else std::cout << "wrote " << keygen_out << ".key (secret) and " << keygen_out << ".pub (public: " << pub << ")\n";
            return 0;
        } catch (const std::exception& e) {
            std::cerr << "reefctl: keygen: " << e.what() << "\n";
            return exit_usage;
        }
    }
    if (g.endpoint.empty()) g.endpoint = default_endpoint();
    for (auto [file, env] : {std::pair{&g.curve_server_key_file, "REEFLINE_CURVE_SERVER_KEY"},
                             std::pair{&g.curve_key_file, "REEFLINE_CURVE_KEY"}})
        if (const char* v = std::getenv(env); file->empty() && v && *v) *file = v;
    if (!g.curve_server_key_file.empty() || !g.curve_key_file.empty()) {
        try {
            if (g.curve_server_key_file.empty() || g.curve_key_file.empty())
                throw std::runtime_error("CURVE needs both --curve-server-key (the daemon's public key) and "
                                         "--curve-key (this client's secret key)");
            curve_client_keys k;
            k.server_public = reefline::ifm::read_z85_key(g.curve_server_key_file, "--curve-server-key");
            k.secret_key = reefline::ifm::read_z85_key(g.curve_key_file, "--curve-key");
            k.public_key = reefline::ifm::curve_public_of(k.secret_key);
            g.curve = k;
        } catch (const std::exception& e) {
            std::cerr << "reefctl: " << e.what() << "\n";
            return exit_usage;
        }
    }

    const bool slow_op = add->parsed() || remove->parsed() || (set->parsed() && !set_onnx.empty());
    if (slow_op && timeout_opt->count() == 0) g.timeout_ms = slow_op_timeout_ms;
    auto request = [&](const json& req) { return g.call(req); };
    try {
        if (add->parsed()) {
            json req{{"op", "add_model"}, {"name", add_name}, {"port", add_port}};
            if (!add_onnx.empty()) req["onnx"] = resolve_onnx(add_onnx);
            add_t.fill(req);
            const json r = request(req);
            print_result(g, r,
                         "added " + add_name + " on UDP port " + std::to_string(add_port) + "\n" +
                             render_describe(r));
        } else if (remove->parsed()) {
            const json r = request({{"op", "remove_model"}, {"name", remove_name}});
            std::string text = "removed " + remove_name;
            if (r.contains("answered_while_draining"))
                text += " (" + cell(r, "answered_while_draining") + " requests answered while draining)";
            print_result(g, r, text + "\n");
        } else if (app.got_subcommand("list")) {
            const json r = request({{"op", "list"}});
            print_result(g, r, render_list(r));
        } else if (describe->parsed()) {
            const json r = request({{"op", "describe"}, {"name", describe_name}});
            print_result(g, r, render_describe(r));
        } else if (set->parsed()) {
            if (!set_t.any_given() && set_onnx.empty())
                throw usage_error("set: nothing to change (give --onnx, --class, --slo-ms, --batching, "
                                  "--min-batch, --max-batch, --fixed-batch, --priority, --share, "
                                  "--rt-source, --clear-rt-sources, --output, --shed or --no-shed)");
            json req{{"op", "set"}, {"name", set_name}};
            if (!set_onnx.empty()) req["onnx"] = resolve_onnx(set_onnx);
            set_t.fill(req);
            const json r = request(req);
            print_result(g, r, "updated " + set_name + "\n" + render_describe(r));
        } else if (stats->parsed()) {
            json req{{"op", "stats"}};
            if (!stats_name.empty()) req["name"] = stats_name;
            const json r = request(req);
            print_result(g, r, render_stats(r));
        } else if (watch->parsed()) {
            return run_watch(g, watch_name, watch_interval, watch_count);
        } else if (app.got_subcommand("health")) {
            const json r = request({{"op", "health"}});
            print_result(g, r, render_health(r));
            const auto status = r.find("status");
            return status != r.end() && *status == "ok" ? 0 : exit_daemon_error;
        } else if (app.got_subcommand("shutdown")) {
            const json r = request({{"op", "shutdown"}});
            print_result(g, r, "reefline at " + g.endpoint + " is stopping\n");
        }
    } catch (const usage_error& e) {
        std::cerr << "reefctl: " << e.what() << "\n";
        return exit_usage;
    } catch (const control_error& e) {
        if (e.from_daemon()) {
            std::cerr << "reefctl: " << e.code() << ": " << e.what() << "\n";
            return exit_daemon_error;
        }
        std::cerr << "reefctl: " << e.what() << "\n";
        if (slow_op && e.code() == local_code::no_reply)
            std::cerr << "reefctl: the daemon may still complete the request; see reefctl list\n";
        return exit_unreachable;
    }
    return 0;
}
