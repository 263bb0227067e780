// reefline: the appliance daemon. For now it starts EAL and one port, runs the data plane
// with the built-in IFs named on the command line, and prints counters. Offline mode replays
// a capture through net_pcap and exits once the capture is exhausted and every response has
// been written; its last line of output is a JSON object of counters.
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <CLI/CLI.hpp>

#include <arpa/inet.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "dataplane/crc32_if.h"
#include "ifmanager/model_if.h"
#include "libml/libml.h"
#include "dataplane/eal.h"
#include "dataplane/engine.h"

namespace dp = reefline::dp;

namespace {

std::atomic<bool> stop_requested{false};

void on_signal(int) { stop_requested.store(true, std::memory_order_relaxed); }

struct model_spec {
    std::string name;
    uint16_t port;
    std::string path;
};

model_spec parse_model(const std::string& s) {
    const auto a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
    if (b == std::string::npos)
        throw CLI::ValidationError("--model", "expected NAME:PORT:FILE.onnx, got '" + s + "'");
    model_spec m{s.substr(0, a), 0, s.substr(b + 1)};
    try {
        const unsigned long p = std::stoul(s.substr(a + 1, b - a - 1));
        if (p == 0 || p > 65535) throw std::out_of_range("port");
        m.port = uint16_t(p);
    } catch (const std::exception&) {
        throw CLI::ValidationError("--model", "bad UDP port in '" + s + "'");
    }
    if (m.name.empty()) throw CLI::ValidationError("--model", "empty model name in '" + s + "'");
    return m;
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
    CLI::App app{"reefline: network inference appliance (data plane with built-in IFs)"};
    std::string offline, responses, eal_args, lcores = "0", local_ip;
    std::vector<std::string> builtins, models;
    uint32_t max_batch = 8;
    uint16_t port_id = 0, rx_queues = 1;
    uint32_t entries = 1024, mbufs = 16383;
    uint64_t age_ms = 100;
    double duration = 0, stats_interval = 0;
    app.add_option("--offline", offline, "replay this pcap through net_pcap, then exit")
        ->check(CLI::ExistingFile);
    app.add_option("--responses", responses, "offline: write responses to this pcap");
    app.add_option("--builtin", builtins, "built-in IF as NAME:UDP_PORT (crc32:9000); repeatable");
    app.add_option("--model", models, "model IF as NAME:UDP_PORT:FILE.onnx (u8 HWC image requests, top-5 answers); repeatable");
    app.add_option("--max-batch", max_batch, "largest batch a model IF forms from queued requests")
        ->capture_default_str()->check(CLI::Range(1u, 256u));
    app.add_option("--eal", eal_args, "EAL arguments, e.g. \"-l 0-1 --vdev=net_af_packet0,iface=veth0\"");
    app.add_option("--lcores", lcores, "EAL lcore list when --eal is not given")->capture_default_str();
    app.add_option("--port", port_id, "ethdev port id")->capture_default_str();
    app.add_option("--rx-queues", rx_queues, "rx queues (RSS keeps a request on one queue)")
        ->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--entries", entries, "reassembly entries per rx queue")
        ->capture_default_str()->check(CLI::Range(8u, 1u << 20));
    app.add_option("--mbufs", mbufs, "rx mbufs")->capture_default_str()->check(CLI::Range(1023u, 1u << 24));
    app.add_option("--age-ms", age_ms, "reassembly age limit in milliseconds")
        ->capture_default_str()->check(CLI::Range(1, 60000));
    app.add_option("--ip", local_ip, "the appliance's IPv4 address on the port (answers ARP for it)");
    app.add_option("--duration", duration, "live: stop after this many seconds (0: until SIGINT)");
    app.add_option("--stats-interval", stats_interval, "print counters every N seconds (0: never)");
    CLI11_PARSE(app, argc, argv);

    if (!offline.empty() && responses.empty()) {
        std::cerr << "reefline: --offline needs --responses FILE for the responses\n";
        return 2;
    }
    std::vector<builtin_spec> specs;
    std::vector<model_spec> model_specs;
    try {
        for (const auto& b : builtins) specs.push_back(parse_builtin(b));
        for (const auto& m : models) model_specs.push_back(parse_model(m));
    } catch (const CLI::Error& e) {
        std::cerr << "reefline: " << e.what() << "\n";
        return 2;
    }

    std::vector<std::string> eal;
    if (eal_args.empty()) {
        eal = dp::eal_default_args(offline.empty() ? lcores : "0");
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
        if (!local_ip.empty() && inet_pton(AF_INET, local_ip.c_str(), &config.local_ip_be) != 1) {
            std::cerr << "reefline: --ip: '" << local_ip << "' is not an IPv4 address\n";
            dp::eal_cleanup();
            return 2;
        }

        std::unique_ptr<dp::dataplane> plane;
        // The cpu device (embedded default) and the model runtime, when there are models.
        std::unique_ptr<reefline::gpu::device> device;
        std::unique_ptr<reefline::ml::runtime> runtime;
        std::vector<std::unique_ptr<dp::if_service>> ifs;
        try {
            plane = std::make_unique<dp::dataplane>(config);
            std::vector<dp::if_binding> bindings;
            uint16_t slot = 0;
            for (const auto& b : specs) {
                ifs.push_back(std::make_unique<dp::crc32_if>(*plane, b.kind + ":" + std::to_string(b.port), b.port, slot++));
                bindings.push_back(ifs.back()->binding());
            }
            if (!model_specs.empty()) {
                device = reefline::gpu::make_cpu_device();
                runtime = std::make_unique<reefline::ml::runtime>(*device);
            }
            for (const auto& m : model_specs) {
                reefline::ifm::model_if_config mc;
                mc.name = m.name;
                mc.onnx = m.path;
                mc.udp_port = m.port;
                mc.slot = slot++;
                mc.max_batch = max_batch;
                auto mif = std::make_unique<reefline::ifm::model_if>(*plane, *runtime, mc);
                std::fprintf(stderr, "reefline: model %s (%s): %ux%ux%u images, weights %.1f MB\n", m.name.c_str(),
                             m.path.c_str(), mif->height(), mif->width(), mif->channels(),
                             double(mif->model()->weight_bytes()) / 1e6);
                ifs.push_back(std::move(mif));
                bindings.push_back(ifs.back()->binding());
            }
            plane->ifs().publish(bindings);
        } catch (const std::exception& e) {
            std::cerr << "reefline: " << e.what() << "\n";
            ifs.clear();
            runtime.reset();
            device.reset();
            plane.reset();
            dp::eal_cleanup();
            return 1;
        }
        std::fprintf(stderr, "reefline: port %u (%s), %u rx queue(s), %zu IF(s)%s\n",
                     plane->eth().id(), plane->eth().driver().c_str(), plane->rx_queues(),
                     ifs.size(), offline.empty() ? "" : ", offline");
        for (auto& f : ifs) std::fprintf(stderr, "reefline: IF %s on UDP port %u\n", f->name().c_str(), f->binding().udp_port);

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

        const uint64_t hz = rte_get_tsc_hz();
        const uint64_t start = rte_rdtsc();
        uint64_t next_stats = start + uint64_t(stats_interval * hz);
        uint64_t idle_polls = 0;
        auto snapshot = [&] {
            auto s = plane->counters();
            for (auto& f : ifs) s.add(f->counters());
            return s;
        };
        auto serve = [&] {
            uint32_t work = 0;
            for (auto& f : ifs) work += f->poll();
            work += plane->poll_tx();
            return work;
        };
        while (!stop_requested.load(std::memory_order_relaxed)) {
            uint32_t rx = 0;
            if (inline_rx)
                for (uint16_t q = 0; q < rx_queues; ++q) rx += plane->poll_rx(q);
            const uint32_t work = serve();
            const uint64_t now = rte_rdtsc();
            if (stats_interval > 0 && now >= next_stats) {
                print_summary(snapshot(), stderr);
                next_stats = now + uint64_t(stats_interval * hz);
            }
            if (duration > 0 && now - start >= uint64_t(duration * hz)) break;
            if (!offline.empty()) {
                // net_pcap returns nothing once the capture is exhausted.
                idle_polls = (rx || work) ? 0 : idle_polls + 1;
                if (idle_polls > 10000) break;
            }
        }
        stop_requested.store(true);
        rte_eal_mp_wait_lcore();
        if (inline_rx)
            for (uint16_t q = 0; q < rx_queues; ++q) plane->rx_offline(q);

        // Requests still incomplete are freed (counted as timeouts); complete ones are
        // answered; every queued response is transmitted before the port closes.
        for (uint16_t q = 0; q < rx_queues; ++q) plane->flush(q);
        for (int quiet = 0; quiet < 1000;) {
            bool pending = plane->tx_pending() > 0;
            for (auto& f : ifs) pending |= f->queued() > 0;
            quiet = (serve() == 0 && !pending) ? quiet + 1 : 0;
        }
        const rte_eth_stats ps = plane->eth().stats();
        const dp::counter_snapshot c = snapshot();
        ifs.clear();
        rte_mempool* rx_pool = plane->eth().rx_pool();
        rte_mempool* tx_pool = plane->eth().tx_pool();
        const std::string driver = plane->eth().driver();
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
        runtime.reset();
        device.reset();
    }
    dp::eal_cleanup();
    return status;
}
