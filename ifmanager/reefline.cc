// reefline: the appliance daemon. Turns its command line (and --config file) into an
// appliance_config, starts EAL and runs an appliance (ifmanager/appliance.h): the port, the
// device (cpu backend by default), the GPU scheduler, the data plane, the IF manager with the
// model repository's models, the ZeroMQ control plane (docs/control.md) and the Prometheus
// metrics endpoint; serves until SIGINT/SIGTERM or a shutdown request, then stops ingest,
// answers or fails what is in flight and checks that every mbuf went back to its pool. Offline
// mode replays a capture through net_pcap without a control plane and exits once the capture
// is exhausted and every response has been written. The last line of output is a JSON object
// of counters.
#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "dataplane/eal.h"
#include "ifmanager/appliance.h"
#include "ifmanager/byte_size.h"
#include "ifmanager/curve_keys.h"
#include "ifmanager/daemon_config.h"
#include "ifmanager/metrics.h"
#include "libml/regular_file.h"
#include "preempt/backend_option.h"

namespace dp = reefline::dp;

namespace {

std::atomic<bool> stop_requested{false};

void on_signal(int) { stop_requested.store(true, std::memory_order_relaxed); }

// --model NAME:PORT:FILE.onnx[:rt|be[:SLO_MS[:topk|tensor]]] -> add_model fields.
nlohmann::json parse_model(const std::string& s, uint32_t max_batch) {
    std::vector<std::string> parts;
    for (size_t at = 0;;) {
        const size_t c = s.find(':', at);
        parts.push_back(s.substr(at, c == std::string::npos ? c : c - at));
        if (c == std::string::npos) break;
        at = c + 1;
    }
    if (parts.size() < 3 || parts.size() > 6)
        throw CLI::ValidationError("--model", "expected NAME:PORT:FILE.onnx[:rt|be[:SLO_MS[:topk|tensor]]], got '" + s + "'");
    nlohmann::json f = {{"name", parts[0]}, {"onnx", parts[2]}, {"max_batch", max_batch}};
    try {
        const unsigned long p = std::stoul(parts[1]);
        if (p == 0 || p > 65535) throw std::out_of_range("port");
        f["port"] = p;
        if (parts.size() > 3) f["class"] = parts[3];
        if (parts.size() > 4) f["slo_ms"] = std::stod(parts[4]);
        if (parts.size() > 5) f["output"] = parts[5];
    } catch (const std::exception&) {
        throw CLI::ValidationError("--model", "bad UDP port or SLO in '" + s + "'");
    }
    return f;
}

reefline::ifm::builtin_if parse_builtin(const std::string& s) {
    const auto colon = s.find(':');
    if (colon == std::string::npos)
        throw CLI::ValidationError("--builtin", "expected NAME:PORT, e.g. crc32:9000, got '" + s + "'");
    reefline::ifm::builtin_if b{s.substr(0, colon), 0};
    if (b.kind != "crc32")
        throw CLI::ValidationError("--builtin", "unknown built-in IF '" + b.kind + "' (known: crc32)");
    try {
        const unsigned long p = std::stoul(s.substr(colon + 1));
        if (p == 0 || p > 65535) throw std::out_of_range("port");
        b.port = uint16_t(p);
    } catch (const std::exception&) {
        throw CLI::ValidationError("--builtin", "bad UDP port in '" + s + "'");
    }
    return b;
}


// The command line as given, before it is checked and turned into an appliance_config.
struct command_line {
    std::string offline, responses, eal_args, lcores = "0", local_ip, control, repo_dir, policy = "reef",
                                              backend = "cpu", metrics = "127.0.0.1:9464", curve_key_file,
                                              curve_clients_file, abacus_file, dkp = "auto", gpu_math = "fp32",
                                              eviction = dp::to_string(dp::reassembly_config{}.eviction),
                                              memory_budget, max_model_file = "1G";
    std::vector<std::string> builtins, models;
    uint32_t max_batch = 8, compute_units = 0;
    uint16_t port_id = 0, rx_queues = 1;
    uint32_t entries = 1024, mbufs = 16383, held_high = 0, held_low = 0;
    uint64_t age_ms = 100;
    int gpu_ordinal = 0;
    double duration = 0, stats_interval = 0, profile_budget_ms = 10000;
    bool busy_poll = false;
};

void add_options(CLI::App& app, command_line& o) {
    app.set_version_flag("--version", std::string("reefline ") + REEFLINE_VERSION);
    app.config_formatter(std::make_shared<reefline::ifm::toml_or_json_config>());
    app.set_config("--config", "",
                   "configuration file, TOML (option = value, e.g. repo = \"/var/lib/reefline\") or JSON ({\"repo\": "
                   "\"/var/lib/reefline\", \"model\": [...]}); flags override it");
    app.add_option("--control", o.control, "control endpoint: ipc://PATH (default " + reefline::ifm::default_control_endpoint() +
                                               ") or tcp://127.0.0.1:PORT");
    app.add_option("--curve-secret-key", o.curve_key_file,
                   "file with the daemon's Z85 CURVE secret key (reefctl keygen); encrypts the control plane and allows tcp:// beyond loopback");
    app.add_option("--curve-clients", o.curve_clients_file,
                   "file with the Z85 public keys of the clients allowed in, one per line (with --curve-secret-key)");
    app.add_option("--repo", o.repo_dir, "model repository directory, created if missing (default /var/lib/reefline/models as root, else ~/.reefline/models)");
    {
        std::string help = "GPU scheduling policy:";
        for (const auto& p : reefline::gpu::policies()) help += std::string("\n  ") + p.name + ": " + p.help;
        app.add_option("--policy", o.policy, help)->capture_default_str();
    }
    app.add_option("--abacus-predictor", o.abacus_file,
                   "policy abacus: the group predictor (build/tools/abacus_train); default <repo>/abacus.json if "
                   "present, else the models' kernel profiles predict");
    app.add_option("--dkp", o.dkp,
                   "dynamic kernel padding: on, off, or auto (on with policy reef on a device that pads)")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off", "auto"}));
    app.add_option("--profile-budget-ms", o.profile_budget_ms,
                   "kernel profiling (kprof, for DKP and prema) per model added: at most this long")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 3.6e6));
    reefline::gpu::add_backend_option(app, o.backend);
    app.add_option("--gpu", o.gpu_ordinal, "cuda/hip backend: the GPU's ordinal")->capture_default_str();
    app.add_option("--gpu-math", o.gpu_math, "cuda/hip backend: GEMM and convolution math: fp32, f16 or bf16 (tensor cores)")
        ->capture_default_str();
    app.add_option("--compute-units", o.compute_units, "cpu backend: worker threads (0: cores - 1)")->capture_default_str();
    app.add_option("--metrics", o.metrics, "Prometheus endpoint HOST:PORT on loopback, or off")->capture_default_str();
    app.add_option("--offline", o.offline, "replay this pcap through net_pcap, then exit (no control plane)")
        ->check(CLI::ExistingFile);
    app.add_option("--responses", o.responses, "offline: write responses to this pcap");
    app.add_option("--builtin", o.builtins, "built-in IF as NAME:UDP_PORT (crc32:9000); repeatable");
    app.add_option("--model", o.models, "model IF NAME:UDP_PORT:FILE.onnx[:rt|be[:SLO_MS[:topk|tensor]]] (not persisted); repeatable");
    app.add_option("--max-batch", o.max_batch, "largest batch of a --model IF")->capture_default_str()->check(CLI::Range(1u, 256u));
    app.add_option("--eal", o.eal_args, "EAL arguments, e.g. \"--no-huge -m 512 --no-pci --vdev=net_null0\"");
    app.add_option("--lcores", o.lcores, "EAL lcore list when --eal is not given")->capture_default_str();
    app.add_option("--port", o.port_id, "ethdev port id")->capture_default_str();
    app.add_option("--rx-queues", o.rx_queues, "rx queues (RSS keeps a request on one queue)")
        ->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--entries", o.entries, "reassembly entries per rx queue")
        ->capture_default_str()->check(CLI::Range(8u, 1u << 20));
    app.add_option("--mbufs", o.mbufs, "rx mbufs")->capture_default_str()->check(CLI::Range(1023u, 1u << 24));
    app.add_option("--age-ms", o.age_ms, "reassembly age limit in milliseconds")
        ->capture_default_str()->check(CLI::Range(1, 60000));
    app.add_option("--reassembly-high", o.held_high,
                   "per rx queue: above this many mbufs held by incomplete requests, evict them (0: derived from --mbufs, "
                   "--rx-queues and the rx ring)")
        ->capture_default_str();
    app.add_option("--reassembly-low", o.held_low, "per rx queue: evict down to this many mbufs (0: 3/4 of the high watermark)")
        ->capture_default_str();
    app.add_option("--reassembly-evict", o.eviction, "which incomplete requests go first: largest or oldest")
        ->capture_default_str()->check(CLI::IsMember({"largest", "oldest"}));
    app.add_option("--ip", o.local_ip,
                   "the appliance's IPv4 address on the port, optionally with its prefix length (198.18.0.2/24): answers ARP "
                   "for it, and refuses the subnet's broadcast address as source or destination");
    app.add_option("--duration", o.duration, "stop after this many seconds (0: until SIGINT/SIGTERM or shutdown)");
    app.add_option("--stats-interval", o.stats_interval, "print counters every N seconds (0: never)");
    app.add_flag("--busy-poll", o.busy_poll, "never sleep when idle (lowest latency; burns the main lcore)");
    app.add_option("--memory-budget", o.memory_budget,
                   "memory the models may take together (weights, their host copies, arenas), e.g. 2G or 512M; a model "
                   "that does not fit is refused (default: 3/4 of MemAvailable at start)");
    app.add_option("--max-model-file", o.max_model_file, "largest ONNX file the daemon reads, e.g. 1G")->capture_default_str();
    // A misspelt option in the configuration file is an error, as it is on the command line.
    app.allow_config_extras(CLI::config_extras_mode::error);
}

// The configuration file is checked before CLI11 opens it: a FIFO (or any file that is not a
// regular one) would block the start for ever, a huge one be read whole.
void check_config_file(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        std::string path;
        if (a == "--config" && i + 1 < argc) path = argv[i + 1];
        else if (a.rfind("--config=", 0) == 0) path = a.substr(9);
        if (path.empty()) continue;
        try {
            (void)reefline::ml::read_regular_file(path, reefline::ifm::max_config_file_bytes);
        } catch (const std::exception& e) {
            throw std::runtime_error(std::string("--config: ") + e.what());
        }
    }
}

// --ip A.B.C.D[/PREFIX] into the data plane's address and prefix length.
void parse_local_ip(const std::string& text, dp::dataplane_config& config) {
    if (text.empty()) return;
    const auto slash = text.find('/');
    int prefix = 0;
    if (slash != std::string::npos) {
        const std::string p = text.substr(slash + 1);
        prefix = p.empty() || p.size() > 2 || p.find_first_not_of("0123456789") != std::string::npos ? -1 : std::stoi(p);
    }
    if (inet_pton(AF_INET, text.substr(0, slash).c_str(), &config.local_ip_be) != 1 || prefix < 0 || prefix > 32)
        throw std::runtime_error("--ip: '" + text + "' is not an IPv4 address with an optional /PREFIX (0..32)");
    config.local_prefix_length = uint8_t(prefix);
}

// Every check that needs no EAL, so a usage error exits with 2 before anything starts.
reefline::ifm::appliance_config make_config(const command_line& o) {
    namespace gpu = reefline::gpu;
    reefline::ifm::appliance_config c;
    if (!o.offline.empty() && o.responses.empty()) throw std::runtime_error("--offline needs --responses FILE for the responses");
    for (const auto& b : o.builtins) c.builtins.push_back(parse_builtin(b));
    for (const auto& m : o.models) c.models.push_back(parse_model(m, o.max_batch));
    if (!gpu::parse_policy(o.policy.c_str(), c.policy))
        throw CLI::ValidationError("--policy", "unknown policy '" + o.policy + "' (" + gpu::policy_names() + ")");
    if (!o.abacus_file.empty() && c.policy != gpu::policy::abacus)
        throw CLI::ValidationError("--abacus-predictor", "the predictor is the abacus policy's (--policy abacus), not " +
                                                              o.policy + "'s");
    if (o.dkp == "on" && c.policy != gpu::policy::reef)
        throw CLI::ValidationError("--dkp", "padding is part of the reef policy (--policy reef), not " + o.policy);
    if (o.gpu_math != "fp32" && o.gpu_math != "f16" && o.gpu_math != "bf16")
        throw CLI::ValidationError("--gpu-math", "'" + o.gpu_math + "': expected fp32, f16 or bf16");
    if (o.metrics != "off") reefline::metrics::parse_listen_address(o.metrics);
    for (auto [text, value, flag] : {std::tuple{&o.memory_budget, &c.memory_budget, "--memory-budget"},
                                     std::tuple{&o.max_model_file, &c.max_model_file, "--max-model-file"}})
        if (!text->empty()) {
            try {
                *value = reefline::ifm::parse_byte_size(*text);
            } catch (const std::invalid_argument& e) {
                throw CLI::ValidationError(flag, e.what());
            }
        }
    dp::dataplane_config& d = c.dataplane;
    d.port.port_id = o.port_id;
    d.port.rx_queues = o.rx_queues;
    d.port.rx_mbufs = o.mbufs;
    d.reassembly.entries = o.entries;
    d.reassembly.age_limit_us = o.age_ms * 1000;
    d.reassembly.held_high = o.held_high;
    d.reassembly.held_low = o.held_low;
    d.reassembly.eviction = o.eviction == "oldest" ? dp::eviction_order::oldest_first : dp::eviction_order::largest_first;
    dp::reassembly_config limits = d.reassembly;  // the watermarks against the pool, before EAL starts
    dp::derive_held_limits(d.port, limits);
    parse_local_ip(o.local_ip, d);
    if (o.curve_key_file.empty() != o.curve_clients_file.empty())
        throw std::runtime_error(o.curve_key_file.empty() ? "--curve-clients needs --curve-secret-key"
                                                          : "--curve-secret-key needs --curve-clients FILE (the client public keys allowed in)");
    c.control.endpoint = o.control;
    if (!o.curve_key_file.empty()) {
        c.control.curve_secret = reefline::ifm::read_z85_key(o.curve_key_file, "--curve-secret-key");
        c.control.curve_clients = reefline::ifm::read_z85_key_list(o.curve_clients_file);
    }
    c.repo_dir = o.repo_dir;
    if (c.repo_dir.empty()) {
        const char* home = std::getenv("HOME");
        c.repo_dir = geteuid() == 0 || !home ? "/var/lib/reefline/models" : std::string(home) + "/.reefline/models";
    }
    c.backend = o.backend;
    c.backend_options.compute_units = o.compute_units;
    c.backend_options.ordinal = o.gpu_ordinal;
    c.backend_options.math = o.gpu_math;
    c.dkp = o.dkp;
    c.abacus_predictor = o.abacus_file;
    c.profile_budget_ms = o.profile_budget_ms;
    c.metrics = o.metrics;
    c.offline = !o.offline.empty();
    c.duration_s = o.duration;
    c.stats_interval_s = o.stats_interval;
    c.busy_poll = o.busy_poll;
    return c;
}

std::vector<std::string> eal_arguments(const command_line& o) {
    std::vector<std::string> eal;
    if (o.eal_args.empty()) {
        eal = dp::eal_default_args(o.offline.empty() ? o.lcores : "0");
        // The embedded default: a virtual port that receives nothing until told otherwise.
        if (o.offline.empty()) eal.push_back("--vdev=net_null0,no-rx=1");
    } else {
        eal = dp::eal_split(o.eal_args);
    }
    if (!o.offline.empty()) eal.push_back("--vdev=net_pcap_offline,rx_pcap=" + o.offline + ",tx_pcap=" + o.responses);
    return eal;
}

// Starts the appliance, serves, stops it and prints the exit report: 0, or 1 when it could not
// start or an mbuf did not come back.
int run(reefline::ifm::appliance_config config) {
    if (config.offline) {
        // The offline capture's port is the last one probed.
        uint16_t pid = 0, last = 0;
        RTE_ETH_FOREACH_DEV(pid) last = pid;
        config.dataplane.port.port_id = last;
    }
    config.dataplane.reassembly.socket_id = int(rte_socket_id());
    reefline::ifm::appliance appliance(std::move(config));
    try {
        appliance.start();
    } catch (const reefline::ifm::control_error& e) {
        std::cerr << "reefline: " << e.code << ": " << e.what() << "\n";
        return 1;
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 1;
    }
    appliance.serve(stop_requested);
    const reefline::ifm::appliance_report report = appliance.stop();
    std::fprintf(stderr, "%s\n", report.summary().c_str());
    if (report.mbufs_in_use) std::fprintf(stderr, "reefline: %lu mbufs not returned to their pools at exit\n", report.mbufs_in_use);
    std::printf("%s\n", report.json().c_str());
    std::fflush(stdout);
    return report.mbufs_in_use ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefline: network inference appliance"};
    command_line options;
    add_options(app, options);
    try {
        check_config_file(argc, argv);
        app.parse(argc, argv);
    } catch (const CLI::ConfigError& e) {
        // CLI11 words an unknown key as "INI was not able to parse KEY".
        const std::string what = e.what(), prefix = "INI was not able to parse ";
        std::cerr << "reefline: "
                  << (what.rfind(prefix, 0) == 0 ? "--config: unknown option '" + what.substr(prefix.size()) + "' (see --help)" : what)
                  << "\n";
        return 2;
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;  // --help: 0; every usage error: 2, as the checks below
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 2;
    }
    reefline::ifm::appliance_config config;
    try {
        config = make_config(options);
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 2;
    }
    try {
        dp::eal_init(argv[0], eal_arguments(options));
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 1;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGPIPE, SIG_IGN);
    const int status = run(std::move(config));
    dp::eal_cleanup();
    return status;
}
