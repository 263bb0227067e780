// reefline: the appliance daemon. Starts EAL and one port, the device (cpu backend by
// default), the GPU scheduler, the data plane, the IF manager with the model repository's
// models, the ZeroMQ control plane (docs/control.md) and the Prometheus metrics endpoint;
// serves until SIGINT/SIGTERM or a shutdown request, then stops ingest, answers or fails what
// is in flight and checks that every mbuf went back to its pool. Offline mode replays a
// capture through net_pcap without a control plane and exits once the capture is exhausted
// and every response has been written. The last line of output is a JSON object of counters.
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <CLI/CLI.hpp>

#include <arpa/inet.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dataplane/crc32_if.h"
#include "dkp/selector.h"
#include "ifmanager/available_memory.h"
#include "ifmanager/control.h"
#include "ifmanager/byte_size.h"
#include "ifmanager/curve_keys.h"
#include "ifmanager/daemon_config.h"
#include "ifmanager/manager.h"
#include "ifmanager/metrics.h"
#include "ifmanager/model_if.h"
#include "libml/kernels/cpu_onednn.h"
#include "libml/kernels/kernels.h"
#include "libml/libml.h"
#include "libml/regular_file.h"
#include "dataplane/eal.h"
#include "dataplane/engine.h"
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

struct builtin_spec {
    std::string kind;
    uint16_t port;
};

builtin_spec parse_builtin(const std::string& s) {
    const auto colon = s.find(':');
    if (colon == std::string::npos)
        throw CLI::ValidationError("--builtin", "expected NAME:PORT, e.g. crc32:9000, got '" + s + "'");
    builtin_spec b{s.substr(0, colon), 0};
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

std::string port_stats_json(const rte_eth_stats& s) {
    return "\"port_ipackets\":" + std::to_string(s.ipackets) +
           ",\"port_opackets\":" + std::to_string(s.opackets) +
           ",\"port_imissed\":" + std::to_string(s.imissed) +
           ",\"port_ierrors\":" + std::to_string(s.ierrors) +
           ",\"port_oerrors\":" + std::to_string(s.oerrors) +
           ",\"port_rx_nombuf\":" + std::to_string(s.rx_nombuf);
}

void print_summary(const dp::counter_snapshot& c, FILE* out) {
    std::fprintf(out,
                 "rx %lu pkts | requests %lu started, %lu completed, %lu timed out | "
                 "responses %lu sent | drops %lu\n",
                 c.rx_packets, c.requests_started, c.requests_completed, c.requests_timed_out,
                 c.responses_sent, c.drops_total());
}

struct rx_worker_args {
    dp::dataplane* plane;
    std::vector<uint16_t> queues;
};

int rx_worker(void* arg) {
    auto& a = *static_cast<rx_worker_args*>(arg);
    for (uint16_t q : a.queues) a.plane->rx_online(q);
    while (!stop_requested.load(std::memory_order_relaxed))
        for (uint16_t q : a.queues) a.plane->poll_rx(q);
    for (uint16_t q : a.queues) a.plane->rx_offline(q);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefline: network inference appliance"};
    app.set_version_flag("--version", std::string("reefline ") + REEFLINE_VERSION);
    app.config_formatter(std::make_shared<reefline::ifm::toml_or_json_config>());
    app.set_config("--config", "",
                   "configuration file, TOML (option = value, e.g. repo = \"/var/lib/reefline\") or JSON ({\"repo\": "
                   "\"/var/lib/reefline\", \"model\": [...]}); flags override it");
    std::string offline, responses, eal_args, lcores = "0", local_ip, control, repo_dir, policy_name = "reef",
                                              backend = "cpu", metrics = "127.0.0.1:9464", curve_key_file,
                                                          curve_clients_file;
    std::vector<std::string> builtins, models;
    uint32_t max_batch = 8, compute_units = 0;
    uint16_t port_id = 0, rx_queues = 1;
    uint32_t entries = 1024, mbufs = 16383, held_high = 0, held_low = 0;
    std::string eviction_name = dp::to_string(dp::reassembly_config{}.eviction);
    uint64_t age_ms = 100;
    double duration = 0, stats_interval = 0;
    bool busy_poll = false;
    app.add_option("--control", control, "control endpoint: ipc://PATH (default " + reefline::ifm::default_control_endpoint() +
                                             ") or tcp://127.0.0.1:PORT");
    app.add_option("--curve-secret-key", curve_key_file,
                   "file with the daemon's Z85 CURVE secret key (reefctl keygen); encrypts the control plane and allows tcp:// beyond loopback");
    app.add_option("--curve-clients", curve_clients_file,
                   "file with the Z85 public keys of the clients allowed in, one per line (with --curve-secret-key)");
    app.add_option("--repo", repo_dir, "model repository directory, created if missing (default /var/lib/reefline/models as root, else ~/.reefline/models)");
    {
        std::string help = "GPU scheduling policy:";
        for (const auto& p : reefline::gpu::policies()) help += std::string("\n  ") + p.name + ": " + p.help;
        app.add_option("--policy", policy_name, help)->capture_default_str();
    }
    std::string abacus_file;
    app.add_option("--abacus-predictor", abacus_file,
                   "policy abacus: the group predictor (build/tools/abacus_train); default <repo>/abacus.json if "
                   "present, else the models' kernel profiles predict");
    std::string dkp_mode = "auto";
    double profile_budget_ms = 10000;
    app.add_option("--dkp", dkp_mode,
                   "dynamic kernel padding: on, off, or auto (on with policy reef on a device that pads)")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off", "auto"}));
    app.add_option("--profile-budget-ms", profile_budget_ms,
                   "kernel profiling (kprof, for DKP and prema) per model added: at most this long")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 3.6e6));
    reefline::gpu::add_backend_option(app, backend);
    int gpu_ordinal = 0;
    std::string gpu_math_name = "fp32";
    app.add_option("--gpu", gpu_ordinal, "cuda/hip backend: the GPU's ordinal")->capture_default_str();
    app.add_option("--gpu-math", gpu_math_name, "cuda/hip backend: GEMM and convolution math: fp32, f16 or bf16 (tensor cores)")
        ->capture_default_str();
    app.add_option("--compute-units", compute_units, "cpu backend: worker threads (0: cores - 1)")->capture_default_str();
    app.add_option("--metrics", metrics, "Prometheus endpoint HOST:PORT on loopback, or off")->capture_default_str();
    app.add_option("--offline", offline, "replay this pcap through net_pcap, then exit (no control plane)")
        ->check(CLI::ExistingFile);
    app.add_option("--responses", responses, "offline: write responses to this pcap");
    app.add_option("--builtin", builtins, "built-in IF as NAME:UDP_PORT (crc32:9000); repeatable");
    app.add_option("--model", models, "model IF NAME:UDP_PORT:FILE.onnx[:rt|be[:SLO_MS[:topk|tensor]]] (not persisted); repeatable");
    app.add_option("--max-batch", max_batch, "largest batch of a --model IF")->capture_default_str()->check(CLI::Range(1u, 256u));
    app.add_option("--eal", eal_args, "EAL arguments, e.g. \"--no-huge -m 512 --no-pci --vdev=net_null0\"");
    app.add_option("--lcores", lcores, "EAL lcore list when --eal is not given")->capture_default_str();
    app.add_option("--port", port_id, "ethdev port id")->capture_default_str();
    app.add_option("--rx-queues", rx_queues, "rx queues (RSS keeps a request on one queue)")
        ->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--entries", entries, "reassembly entries per rx queue")
        ->capture_default_str()->check(CLI::Range(8u, 1u << 20));
    app.add_option("--mbufs", mbufs, "rx mbufs")->capture_default_str()->check(CLI::Range(1023u, 1u << 24));
    app.add_option("--age-ms", age_ms, "reassembly age limit in milliseconds")
        ->capture_default_str()->check(CLI::Range(1, 60000));
    app.add_option("--reassembly-high", held_high,
                   "per rx queue: above this many mbufs held by incomplete requests, evict them (0: derived from --mbufs, "
                   "--rx-queues and the rx ring)")
        ->capture_default_str();
    app.add_option("--reassembly-low", held_low, "per rx queue: evict down to this many mbufs (0: 3/4 of the high watermark)")
        ->capture_default_str();
    app.add_option("--reassembly-evict", eviction_name, "which incomplete requests go first: largest or oldest")
        ->capture_default_str()->check(CLI::IsMember({"largest", "oldest"}));
    app.add_option("--ip", local_ip,
                   "the appliance's IPv4 address on the port, optionally with its prefix length (198.18.0.2/24): answers ARP "
                   "for it, and refuses the subnet's broadcast address as source or destination");
    app.add_option("--duration", duration, "stop after this many seconds (0: until SIGINT/SIGTERM or shutdown)");
    app.add_option("--stats-interval", stats_interval, "print counters every N seconds (0: never)");
    app.add_flag("--busy-poll", busy_poll, "never sleep when idle (lowest latency; burns the main lcore)");
    std::string memory_budget_text, max_model_file_text = "1G";
    app.add_option("--memory-budget", memory_budget_text,
                   "memory the models may take together (weights, their host copies, arenas), e.g. 2G or 512M; a model "
                   "that does not fit is refused (default: 3/4 of MemAvailable at start)");
    app.add_option("--max-model-file", max_model_file_text, "largest ONNX file the daemon reads, e.g. 1G")->capture_default_str();
    // A misspelt option in the configuration file is an error, as it is on the command line.
    app.allow_config_extras(CLI::config_extras_mode::error);
    // The configuration file is checked before CLI11 opens it: a FIFO (or any file that is not
    // a regular one) would block the start for ever, a huge one be read whole.
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        std::string path;
        if (a == "--config" && i + 1 < argc) path = argv[i + 1];
        else if (a.rfind("--config=", 0) == 0) path = a.substr(9);
        if (path.empty()) continue;
        try {
            (void)reefline::ml::read_regular_file(path, reefline::ifm::max_config_file_bytes);
        } catch (const std::exception& e) {
            std::cerr << "reefline: --config: " << e.what() << "\n";
            return 2;
        }
    }
    try {
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
    }

    if (!offline.empty() && responses.empty()) {
        std::cerr << "reefline: --offline needs --responses FILE for the responses\n";
        return 2;
    }
    std::vector<builtin_spec> specs;
    std::vector<nlohmann::json> model_fields;
    uint64_t memory_budget = 0, max_model_file = 0;
    reefline::gpu::policy policy;
    try {
        for (const auto& b : builtins) specs.push_back(parse_builtin(b));
        for (const auto& m : models) model_fields.push_back(parse_model(m, max_batch));
        if (!reefline::gpu::parse_policy(policy_name.c_str(), policy))
            throw CLI::ValidationError("--policy", "unknown policy '" + policy_name + "' (" +
                                                       reefline::gpu::policy_names() + ")");
        if (!abacus_file.empty() && policy != reefline::gpu::policy::abacus)
            throw CLI::ValidationError("--abacus-predictor", "the predictor is the abacus policy's (--policy abacus), not " +
                                                                  policy_name + "'s");
        if (dkp_mode == "on" && policy != reefline::gpu::policy::reef)
            throw CLI::ValidationError("--dkp", "padding is part of the reef policy (--policy reef), not " + policy_name);
        if (gpu_math_name != "fp32" && gpu_math_name != "f16" && gpu_math_name != "bf16")
            throw CLI::ValidationError("--gpu-math", "'" + gpu_math_name + "': expected fp32, f16 or bf16");
        if (metrics != "off") reefline::metrics::parse_listen_address(metrics);
        for (auto [text, value, flag] : {std::tuple{&memory_budget_text, &memory_budget, "--memory-budget"},
                                         std::tuple{&max_model_file_text, &max_model_file, "--max-model-file"}})
            if (!text->empty()) {
                try {
                    *value = reefline::ifm::parse_byte_size(*text);
                } catch (const std::invalid_argument& e) {
                    throw CLI::ValidationError(flag, e.what());
                }
            }
        dp::port_config port;  // the watermarks against the pool, before EAL starts
        port.rx_queues = rx_queues;
        port.rx_mbufs = mbufs;
        dp::reassembly_config limits;
        limits.held_high = held_high;
        limits.held_low = held_low;
        dp::derive_held_limits(port, limits);
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 2;
    }
    reefline::ifm::control_options control_opts{control, {}, {}};
    try {
        if (curve_key_file.empty() != curve_clients_file.empty())
            throw std::runtime_error(curve_key_file.empty() ? "--curve-clients needs --curve-secret-key"
                                                            : "--curve-secret-key needs --curve-clients FILE (the client public keys allowed in)");
        if (!curve_key_file.empty()) {
            control_opts.curve_secret = reefline::ifm::read_z85_key(curve_key_file, "--curve-secret-key");
            control_opts.curve_clients = reefline::ifm::read_z85_key_list(curve_clients_file);
        }
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 2;
    }
    if (repo_dir.empty()) {
        const char* home = std::getenv("HOME");
        repo_dir = geteuid() == 0 || !home ? "/var/lib/reefline/models" : std::string(home) + "/.reefline/models";
    }

    std::vector<std::string> eal;
    if (eal_args.empty()) {
        eal = dp::eal_default_args(offline.empty() ? lcores : "0");
        // The embedded default: a virtual port that receives nothing until told otherwise.
        if (offline.empty()) eal.push_back("--vdev=net_null0,no-rx=1");
    } else {
        eal = dp::eal_split(eal_args);
    }
    if (!offline.empty())
        eal.push_back("--vdev=net_pcap_offline,rx_pcap=" + offline + ",tx_pcap=" + responses);

    try {
        dp::eal_init(argv[0], eal);
    } catch (const std::exception& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 1;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGPIPE, SIG_IGN);

    int status = 0;
    {
        dp::dataplane_config config;
        config.port.port_id = port_id;
        if (!offline.empty()) {
            // The offline capture's port is the last one probed.
            uint16_t pid = 0, last = 0;
            RTE_ETH_FOREACH_DEV(pid) last = pid;
            config.port.port_id = last;
        }
        config.port.rx_queues = rx_queues;
        config.port.rx_mbufs = mbufs;
        config.reassembly.entries = entries;
        config.reassembly.age_limit_us = age_ms * 1000;
        config.reassembly.socket_id = int(rte_socket_id());
        config.reassembly.held_high = held_high;
        config.reassembly.held_low = held_low;
        config.reassembly.eviction =
            eviction_name == "oldest" ? dp::eviction_order::oldest_first : dp::eviction_order::largest_first;
        const auto slash = local_ip.find('/');
        const std::string ip_text = local_ip.substr(0, slash);
        int prefix = 0;
        if (slash != std::string::npos) {
            const std::string p = local_ip.substr(slash + 1);
            prefix = p.empty() || p.size() > 2 || p.find_first_not_of("0123456789") != std::string::npos ? -1 : std::stoi(p);
        }
        if (!local_ip.empty() && (inet_pton(AF_INET, ip_text.c_str(), &config.local_ip_be) != 1 || prefix < 0 || prefix > 32)) {
            std::cerr << "reefline: --ip: '" << local_ip << "' is not an IPv4 address with an optional /PREFIX (0..32)\n";
            dp::eal_cleanup();
            return 2;
        }
        config.local_prefix_length = uint8_t(prefix);

        // Owned in dependency order: destroyed from the bottom up.
        std::unique_ptr<dp::dataplane> plane;
        std::unique_ptr<reefline::gpu::device> device;
        std::unique_ptr<reefline::ml::runtime> runtime;
        std::unique_ptr<reefline::gpu::scheduler> scheduler;
        std::unique_ptr<reefline::ifm::model_repository> repo;
        std::unique_ptr<reefline::ifm::if_manager> manager;
        std::unique_ptr<reefline::ifm::control_server> control_plane;
        std::unique_ptr<reefline::metrics::metrics_server> metrics_http;
        std::vector<void*> registered;  // packet memory registered with a GPU device
        auto tear_down = [&] {
            metrics_http.reset();
            control_plane.reset();
            if (scheduler) scheduler->shutdown();
            manager.reset();
            scheduler.reset();
            runtime.reset();
            for (void* p : registered) device->unregister_host(p);
            device.reset();
        };
        try {
            plane = std::make_unique<dp::dataplane>(config);
            reefline::gpu::backend_options dopt;
            dopt.compute_units = compute_units;
            dopt.ordinal = gpu_ordinal;
            dopt.math = gpu_math_name;
            device = reefline::gpu::make_backend(backend, dopt);
            if (!reefline::gpu::find_backend(backend)->gpu) {
                std::fprintf(stderr, "reefline: cpu device GEMM by %s\n",
                             reefline::ml::kernels::cpu_gemm_library().c_str());
            } else {
                // The gather kernel reads request payloads where the NIC wrote them: the rx
                // mempool's pages are registered (pinned, mapped) with the GPU.
                for (const auto& r : plane->eth().memory_ranges()) {
                    if (!device->register_host(r.address, r.length))
                        throw std::runtime_error("cannot register the packet memory (" + std::to_string(r.length >> 20) +
                                                 " MiB at " + std::to_string(reinterpret_cast<uintptr_t>(r.address)) +
                                                 ") with the " + backend + " device");
                    registered.push_back(r.address);
                }
            }
            runtime = std::make_unique<reefline::ml::runtime>(*device);
            reefline::gpu::scheduler_options sopt;
            sopt.pol = policy;
            if (dkp_mode != "off" && policy == reefline::gpu::policy::reef) {
                if (!device->pads_launches()) {
                    if (dkp_mode == "on")
                        throw std::runtime_error("--dkp on: the " + backend + " backend does not pad launches (yet)");
                } else {
                    sopt.padding = std::make_shared<reefline::dkp::rules_selector>();
                }
            }
            nlohmann::json abacus_info;
            if (policy == reefline::gpu::policy::abacus) {
                // The predictor given, or the repository's; a bad file given is an error, a bad
                // one in the repository is reported and the profiles predict instead.
                const bool given = !abacus_file.empty();
                const std::string file = given ? abacus_file : (std::filesystem::path(repo_dir) / "abacus.json").string();
                std::error_code ec;
                if (std::filesystem::exists(file, ec) || std::filesystem::is_symlink(file, ec)) {
                    try {
                        // Not a regular file (a FIFO would block the start for ever), or over
                        // 64 MiB: refused before it is read.
                        const std::string text = reefline::ml::read_regular_file(file, 64u << 20);
                        auto p = std::make_shared<reefline::gpu::abacus::predictor>(
                            reefline::gpu::abacus::predictor::parse(text, file));
                        nlohmann::json names = nlohmann::json::array();
                        for (const auto& m : p->models()) names.push_back(m.name);
                        abacus_info = {{"predictor", file},
                                       {"models", names},
                                       {"trained_on", p->device},
                                       {"held_out_err_pct", p->held_out_mlp.mean_pct}};
                        sopt.predictor = std::move(p);
                    } catch (const std::exception& e) {
                        if (given) throw std::runtime_error(std::string("--abacus-predictor: ") + e.what());
                        std::fprintf(stderr, "reefline: %s; abacus predicts from the kernel profiles\n", e.what());
                        abacus_info = {{"predictor", nullptr}, {"problem", e.what()}};
                    }
                } else if (given) {
                    throw std::runtime_error("--abacus-predictor: no such file: " + file);
                } else {
                    abacus_info = {{"predictor", nullptr}};
                }
                if (abacus_info["predictor"].is_null())
                    abacus_info["predicts_from"] = "kernel profiles (build/tools/abacus_train --repo " + repo_dir + " trains a predictor)";
                else
                    abacus_info["predicts_from"] = "predictor, and kernel profiles for other models";
            }
            scheduler = std::make_unique<reefline::gpu::scheduler>(*device, sopt);
            const bool padding = scheduler->stats().padding;
            if (offline.empty()) repo = std::make_unique<reefline::ifm::model_repository>(repo_dir);
            std::string budget_source = "--memory-budget", available_text;
            if (memory_budget == 0) {
                // Measured after the data plane took its memory, in the tighter of the host
                // and the daemon's memory cgroup (a pod's or a slice's limit kills the daemon
                // whatever the host has free). A quarter stays out of the budget: what it
                // does not count (an import's protobuf copy of the file, kernel scratch, the
                // control plane, other processes) and the estimate being optimistic.
                const reefline::ifm::available_memory available = reefline::ifm::read_available_memory();
                if (available.bytes() == 0)
                    throw std::runtime_error("cannot read MemAvailable from /proc/meminfo: give --memory-budget");
                memory_budget = available.bytes() / 4 * 3;
                budget_source = available.source();
                available_text = available.describe();
                std::fprintf(stderr, "reefline: memory budget %s (3/4 of %s; --memory-budget to change)\n",
                             reefline::ifm::format_byte_size(double(memory_budget)).c_str(), available_text.c_str());
            }
            reefline::ifm::manager_info info{"0.1.0", device->caps().name, reefline::gpu::policy_name(policy)};
            info.memory_budget_bytes = memory_budget;
            info.memory_budget_source = budget_source;
            info.memory_available = available_text;
            // A GPU's own memory is a budget of its own: weights and arenas live there.
            if (const reefline::gpu::device_caps caps = device->caps(); caps.gpu && caps.memory_free_bytes) {
                info.device_memory_free_at_start = caps.memory_free_bytes;
                info.device_memory_budget_bytes = caps.memory_free_bytes / 4 * 3;
                std::fprintf(stderr, "reefline: device memory budget %s (3/4 of the %s free on %s)\n",
                             reefline::ifm::format_byte_size(double(info.device_memory_budget_bytes)).c_str(),
                             reefline::ifm::format_byte_size(double(caps.memory_free_bytes)).c_str(), caps.name.c_str());
            }
            info.dkp = padding;
            info.abacus = abacus_info;
            // Profiles feed DKP's rules and prema's estimates; with one compute unit nothing
            // is ever padded (an RT kernel holds the unit), so nothing is profiled for it.
            if ((padding && device->caps().compute_units > 1) || policy == reefline::gpu::policy::prema ||
                policy == reefline::gpu::policy::abacus)
                info.profile_budget_ms = profile_budget_ms;
            if (max_model_file) info.max_model_file_bytes = max_model_file;
            manager = std::make_unique<reefline::ifm::if_manager>(*plane, *runtime, *scheduler, repo.get(), info);
            uint16_t slot = 0;
            for (const auto& b : specs)
                manager->add_service(std::make_shared<dp::crc32_if>(*plane, b.kind + ":" + std::to_string(b.port), b.port, slot++));
            for (const auto& f : model_fields) {
                const auto d = manager->add_model(f, false);
                std::fprintf(stderr, "reefline: model %s (%s): input %s, weights %.1f MB\n", d["name"].get<std::string>().c_str(),
                             d["onnx"].get<std::string>().c_str(), d["input"]["shape"].dump().c_str(),
                             d["weight_bytes"].get<double>() / 1e6);
            }
            for (const auto& p : manager->load_repository()) std::fprintf(stderr, "reefline: repository: %s\n", p.c_str());
            if (offline.empty()) {
                control_plane = std::make_unique<reefline::ifm::control_server>(
                    *manager, control_opts);
                std::fprintf(stderr, "reefline: control on %s (events on %s), repository %s\n",
                             control_plane->endpoint().c_str(), control_plane->events_endpoint().c_str(), repo_dir.c_str());
                if (metrics != "off") {
                    const auto [host, mport] = reefline::metrics::parse_listen_address(metrics);
                    auto* m = manager.get();
                    metrics_http = std::make_unique<reefline::metrics::metrics_server>(
                        host, mport, [m] { return reefline::metrics::prometheus_text(m->stats()); });
                    std::fprintf(stderr, "reefline: metrics on http://%s:%u/metrics\n", host.c_str(), metrics_http->port());
                }
            }
        } catch (const reefline::ifm::control_error& e) {
            std::cerr << "reefline: " << e.code << ": " << e.what() << "\n";
            status = 1;
        } catch (const std::exception& e) {
            std::cerr << "reefline: " << e.what() << "\n";
            status = 1;
        }
        if (status) {
            tear_down();
            plane.reset();
            dp::eal_cleanup();
            return status;
        }
        std::fprintf(stderr, "reefline: port %u (%s), %u rx queue(s), backend %s, policy %s%s%s\n", plane->eth().id(),
                     plane->eth().driver().c_str(), plane->rx_queues(), device->caps().name.c_str(),
                     reefline::gpu::policy_name(policy), scheduler->stats().padding ? " with DKP" : "",
                     offline.empty() ? "" : ", offline");
        if (const nlohmann::json& a = manager->health().value("abacus", nlohmann::json()); a.is_object())
            std::fprintf(stderr, "reefline: abacus predicts from %s\n",
                         a["predictor"].is_string() ? ("the predictor " + a["predictor"].get<std::string>()).c_str()
                                                    : "the kernel profiles");
        const nlohmann::json started = manager->stats();
        for (const auto& f : started["ifs"])
            std::fprintf(stderr, "reefline: IF %s on UDP port %u\n", f["name"].get<std::string>().c_str(),
                         f["udp_port"].get<unsigned>());

        // Lcores: rx queues go to worker lcores when there are any; the main lcore answers
        // requests and transmits. On one lcore (and always offline) it does everything.
        std::vector<unsigned> workers;
        unsigned lc;
        RTE_LCORE_FOREACH_WORKER(lc) workers.push_back(lc);
        const bool inline_rx = workers.empty() || !offline.empty();
        std::vector<rx_worker_args> worker_args(inline_rx ? 0 : std::min<size_t>(workers.size(), rx_queues));
        for (uint16_t q = 0; !inline_rx && q < rx_queues; ++q)
            worker_args[q % worker_args.size()].queues.push_back(q);
        for (size_t w = 0; w < worker_args.size(); ++w) {
            worker_args[w].plane = plane.get();
            rte_eal_remote_launch(rx_worker, &worker_args[w], workers[w]);
        }
        if (inline_rx)
            for (uint16_t q = 0; q < rx_queues; ++q) plane->rx_online(q);
        manager->set_serving(true);
        std::fprintf(stderr, "reefline: serving\n");

        const uint64_t hz = rte_get_tsc_hz();
        const uint64_t start = rte_rdtsc();
        uint64_t next_stats = start + uint64_t(stats_interval * hz);
        uint64_t idle_polls = 0;
        auto snapshot = [&] {
            auto s = plane->counters();
            manager->add_if_counters(s);
            return s;
        };
        while (!stop_requested.load(std::memory_order_relaxed) && !manager->shutdown_requested()) {
            uint32_t rx = 0;
            if (inline_rx)
                for (uint16_t q = 0; q < rx_queues; ++q) rx += plane->poll_rx(q);
            const uint32_t work = manager->serve();
            const uint64_t now = rte_rdtsc();
            if (stats_interval > 0 && now >= next_stats) {
                print_summary(snapshot(), stderr);
                next_stats = now + uint64_t(stats_interval * hz);
            }
            if (duration > 0 && now - start >= uint64_t(duration * hz)) break;
            idle_polls = (rx || work) ? 0 : idle_polls + 1;
            // net_pcap returns nothing once the capture is exhausted.
            if (!offline.empty() && idle_polls > 10000 && manager->quiet()) break;
            // Idle: give the core to the device's compute units and the scheduler (they share
            // the machine's cores on the embedded default) instead of spinning.
            if (!busy_poll && offline.empty() && idle_polls > 256)
                std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        stop_requested.store(true);
        rte_eal_mp_wait_lcore();
        if (inline_rx)
            for (uint16_t q = 0; q < rx_queues; ++q) plane->rx_offline(q);

        // Ingest has stopped. Requests still under reassembly are freed (counted as
        // timeouts); complete ones are answered, batches in flight finish (up to 10 s), then
        // whatever still waits is answered with status shutting_down; every queued response
        // is transmitted before the port closes.
        for (uint16_t q = 0; q < rx_queues; ++q) plane->flush(q);
        const uint64_t drain_until = rte_rdtsc() + 10 * hz;
        for (int quiet = 0; quiet < 1000 && rte_rdtsc() < drain_until;) quiet = manager->serve() == 0 && manager->quiet() ? quiet + 1 : 0;
        manager->fail_pending();
        // Answers that wait for transmit buffers are given up after a second without progress
        // (counted as send failures); a port that takes nothing at all is left after 10 s.
        const uint64_t answer_until = rte_rdtsc() + 10 * hz;
        for (int quiet = 0; quiet < 1000 && rte_rdtsc() < answer_until;)
            quiet = manager->serve() == 0 && manager->quiet() ? quiet + 1 : 0;
        manager->set_serving(false);
        const rte_eth_stats ps = plane->eth().stats();
        const dp::counter_snapshot c = snapshot();
        tear_down();
        rte_mempool* rx_pool = plane->eth().rx_pool();
        rte_mempool* tx_pool = plane->eth().tx_pool();
        plane->eth().close();
        const uint64_t in_use = (rx_pool->size - rte_mempool_avail_count(rx_pool)) +
                                (tx_pool->size - rte_mempool_avail_count(tx_pool));
        print_summary(c, stderr);
        if (in_use) {
            std::fprintf(stderr, "reefline: %lu mbufs not returned to their pools at exit\n", in_use);
            status = 1;
        }
        std::string json = c.to_json();
        json.pop_back();
        json += "," + port_stats_json(ps) + ",\"mbufs_in_use_at_exit\":" + std::to_string(in_use) + "}";
        std::printf("%s\n", json.c_str());
        std::fflush(stdout);
        plane.reset();
    }
    dp::eal_cleanup();
    return status;
}
