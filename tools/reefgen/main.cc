// reefgen: reefline's traffic and pcap generator and response checker.
//
//   reefgen pcap  --out F ...        write request traffic to a pcap file
//   reefgen check --requests F --responses G [--max-pending-bytes 64MiB]
//   reefgen send  --dst IP ...       live traffic over a UDP socket, verified, with latencies
//
// Exit status: 0 success, 1 the traffic or the responses failed a check, 2 bad usage, an
// unreadable or unwritable file, or a socket failure.
#include <CLI/CLI.hpp>

#include <iostream>
#include <map>

#include "tools/reefgen/check.h"
#include "tools/reefgen/pcap_file.h"
#include "tools/reefgen/send.h"

namespace {

using namespace reefline;
using namespace reefline::reefgen;

// Payload options shared by `pcap` and `send`.
struct payload_cli {
    std::string shape = "224x224x3";
    std::string format;  // empty: tokens if --tokens is given, tensor if --dims, else image
    std::string tokens;  // "L" or "MIN-MAX"
    uint32_t vocab = default_vocab;
    std::string dims;    // "D1[,D2[,D3[,D4]]]"
    std::string image;
    std::string raw;
    uint32_t frag_size = 1024;
    uint64_t seed = 1;

    CLI::Option* shape_opt = nullptr;

    void add_to(CLI::App& app) {
        shape_opt =
            app.add_option("--shape", shape, "Image shape HxWxC (u8 HWC)")->capture_default_str();
        app.add_option("--format", format,
                       "Payload format: raw, image (image_u8_hwc), tokens (tokens_i32) or tensor "
                       "(tensor_f32); default: tokens with --tokens, tensor with --dims, else image")
            ->check(CLI::IsMember({"raw", "image", "tokens", "tensor"}));
        auto* tok = app.add_option("--tokens", tokens,
                                   "Tokens per request (format tokens_i32, dims {L}): L, or MIN-MAX for "
                                   "a length drawn uniformly per request (deterministic in --seed and "
                                   "the request number), e.g. 8-64");
        app.add_option("--vocab", vocab,
                       "Token ids are drawn uniformly below this. The default, 1000, is valid in "
                       "every vocabulary of the zoo's models (1024) and of real tokenizers "
                       "(BERT's 30522, ...); a larger value can draw ids a model refuses")
            ->capture_default_str()
            ->check(CLI::Range(1u, 2147483647u));
        auto* dims_opt = app.add_option("--dims", dims,
                                        "Tensor extents D1[,D2[,D3[,D4]]] (format tensor_f32: "
                                        "little-endian f32, 4*product bytes, each extent 1..65535). "
                                        "Synthetic payloads look like sensor windows: the last "
                                        "extent is channels, the others time; each channel a few "
                                        "sines of per-request phase and frequency plus noise");
        auto* img = app.add_option("--image", image,
                                   "Binary PPM (P6) or PGM (P5) image sent by every request");
        auto* raw_opt =
            app.add_option("--raw", raw, "File whose bytes every request carries (in --format; "
                                         "with --dims it must hold 4*product bytes)");
        img->excludes(shape_opt)->excludes(tok)->excludes(raw_opt)->excludes(dims_opt);
        dims_opt->excludes(tok);
        app.add_option("--frag-size", frag_size, "Payload bytes per fragment (last may be shorter)")
            ->capture_default_str()
            ->check(CLI::Range(1u, max_frag_size));
        app.add_option("--seed", seed, "Seed: payloads and all random choices follow from it")
            ->capture_default_str();
    }

    payload_options resolve() const {
        payload_options p;
        const std::string f = !format.empty() ? format
                              : !tokens.empty() ? "tokens"
                              : !dims.empty()   ? "tensor"
                                                : "image";
        if (!image.empty() && f != "image") throw usage_error("--image: only with --format image");
        if (!tokens.empty() && f != "tokens") throw usage_error("--tokens: only with --format tokens");
        if (!dims.empty() && f != "tensor") throw usage_error("--dims: only with --format tensor");
        if (f == "tensor" && shape_opt->count() > 0)
            throw usage_error("--shape: not with --format tensor (its extents are --dims)");
        p.format = f == "raw"      ? wire::format::raw
                   : f == "tokens" ? wire::format::tokens_i32
                   : f == "tensor" ? wire::format::tensor_f32
                                   : wire::format::image_u8_hwc;
        p.shape = parse_shape(shape);
        if (!tokens.empty()) {
            const token_range r = parse_token_range(tokens);
            p.tokens = r.min;
            p.tokens_max = r.max;
        }
        if (!dims.empty()) p.dims = parse_dims(dims);
        p.vocab = vocab;
        p.image_file = image;
        p.raw_file = raw;
        p.seed = seed;
        return p;
    }
};

int run_pcap(const pcap_options& o) {
    const pcap_summary s = write_request_pcap(o);
    std::cout << "reefgen pcap: wrote " << o.out << " (request ids " << s.first_request_id << ".."
              << s.first_request_id + s.requests - 1 << ")";
    if (s.corrupted) {
        std::cout << " corruptions:";
        for (size_t k = 0; k < corruption_kinds; ++k)
            std::cout << ' ' << to_string(static_cast<corruption>(k)) << '=' << s.by_corruption[k];
    }
    std::cout << "\nrequests=" << s.requests << " fragments=" << s.fragments
              << " packets=" << s.packets << " dropped=" << s.dropped
              << " duplicated=" << s.duplicated << " corrupted=" << s.corrupted << '\n';
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefgen: reefline traffic and pcap generator, response checker"};
    app.require_subcommand(1);

    // pcap
    auto* pcap_cmd = app.add_subcommand("pcap", "Write request traffic to a pcap file");
    pcap_options po;
    payload_cli pcap_payload;
    std::string src_ip = "198.18.0.1", dst_ip = "198.18.0.2";
    std::string src_mac = "02:00:00:00:00:01", dst_mac = "02:00:00:00:00:02";
    uint16_t sport = 40000, dport = 9000;
    pcap_cmd->add_option("--out", po.out, "Output pcap file")->required();
    pcap_cmd->add_option("--requests", po.requests, "Number of requests")
        ->required()
        ->check(CLI::PositiveNumber);
    pcap_payload.add_to(*pcap_cmd);
    pcap_cmd->add_option("--src", src_ip, "Source IPv4 address")->capture_default_str();
    pcap_cmd->add_option("--dst", dst_ip, "Destination IPv4 address")->capture_default_str();
    pcap_cmd->add_option("--sport", sport, "First source UDP port")
        ->capture_default_str()
        ->check(CLI::Range(1, 65535));
    pcap_cmd->add_option("--dport", dport, "Destination UDP port (the IF's port)")
        ->capture_default_str()
        ->check(CLI::Range(1, 65535));
    pcap_cmd
        ->add_option("--sources", po.sources,
                     "Requests round-robin over this many source ports (cameras)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 65535u));
    pcap_cmd->add_option("--src-mac", src_mac, "Source MAC")->capture_default_str();
    pcap_cmd->add_option("--dst-mac", dst_mac, "Destination MAC")->capture_default_str();
    pcap_cmd->add_flag("--shuffle", po.shuffle, "Interleave fragments of windows of 16 requests");
    pcap_cmd->add_option("--dup", po.dup, "Probability that a fragment is emitted twice")
        ->check(CLI::Range(0.0, 1.0));
    pcap_cmd->add_option("--drop", po.drop, "Probability that a fragment is omitted")
        ->check(CLI::Range(0.0, 1.0));
    pcap_cmd
        ->add_option("--corrupt", po.corrupt,
                     "Probability that a packet is replaced by a detectably corrupt one")
        ->check(CLI::Range(0.0, 1.0));
    pcap_cmd->add_option("--pps", po.pps, "Packets per second for the pcap timestamps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);

    // check
    auto* check_cmd =
        app.add_subcommand("check", "Verify a responses pcap against a requests pcap");
    check_options co;
    std::string expect = "crc32";
    check_cmd->add_option("--requests", co.requests, "Requests pcap (as sent to reefline)")
        ->required();
    check_cmd->add_option("--responses", co.responses, "Responses pcap (as reefline sent them)")
        ->required();
    check_cmd->add_option("--expect", expect,
                          "What responses carry: crc32 (verified here) or model (any well-formed ok "
                          "result: top-k, or a tensor of 4*product(dims) bytes; reefverify checks "
                          "--results)")
        ->capture_default_str()
        ->check(CLI::IsMember({"crc32", "model"}));
    check_cmd->add_option("--results", co.results_file,
                          "Write the first answer to every request as JSON lines, as reefgen send "
                          "--results does (for reefverify)");
    check_cmd->add_option("--seed", co.seed, "Seed the requests pcap was written with (maps request ids to payloads)")
        ->capture_default_str();
    check_cmd->add_option("--report", co.max_report, "Detail lines per kind of problem")
        ->capture_default_str();
    check_cmd->add_option("--show", co.show,
                          "Print the first N good responses (crc32, top-k classes, or a tensor's dims "
                          "and first values)");
    check_cmd
        ->add_option("--max-pending-bytes", co.max_pending_bytes,
                     "Memory for reassembling each capture: every byte the assembler allocates for "
                     "incomplete messages (beyond their bytes about 200 per message and 40 per "
                     "fragment, and twice a "
                     "message's bytes as it completes). Beyond it the oldest incomplete messages "
                     "are evicted, counted (evicted=N) and the check fails. 0: no bound (trusted "
                     "captures only). Units: 64MiB, 512k ...")
        ->transform(CLI::AsSizeValue(false))
        ->default_str("64MiB");

    // send
    auto* send_cmd =
        app.add_subcommand("send", "Send live requests over UDP and verify the responses");
    send_options so;
    payload_cli send_payload;
    std::string send_dst, bind_ip = "0.0.0.0";
    bool json = false;
    double max_loss = 1.0;
    send_cmd->add_option("--dst", send_dst, "Destination IPv4 address")->required();
    send_cmd->add_option("--dport", so.dst_port, "Destination UDP port")
        ->capture_default_str()
        ->check(CLI::Range(1, 65535));
    send_cmd->add_option("--requests", so.requests, "Number of requests")
        ->required()
        ->check(CLI::PositiveNumber);
    auto* rate = send_cmd
                     ->add_option("--rate", so.rate,
                                  "Open loop: requests per second (default: as fast as possible)")
                     ->check(CLI::NonNegativeNumber);
    send_cmd->add_flag("--poisson", so.poisson, "Exponential inter-arrival times (Poisson process)")
        ->needs(rate);
    send_cmd
        ->add_option("--closed-loop", so.closed_loop, "Closed loop: keep K requests outstanding")
        ->check(CLI::Range(1u, 1u << 20));
    send_payload.add_to(*send_cmd);
    send_cmd->add_option("--sport", so.src_port, "Source UDP port (default: ephemeral)");
    send_cmd->add_option("--bind", bind_ip, "Local address to bind")->capture_default_str();
    send_cmd
        ->add_option("--timeout-ms", so.timeout_ms, "Wait for responses after the last send (ms)")
        ->capture_default_str();
    send_cmd
        ->add_option("--max-loss", max_loss,
                     "Fail when more than this fraction of requests is lost")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    send_cmd->add_flag("--json", json, "Print the result as one JSON object");
    send_cmd->add_option("--show", so.show,
                         "Print the first N requests' results, one line each (crc32, top-k classes, or "
                         "a tensor's dims and first values, e.g. tensor 8 [0.1, -0.3, ...])");
    send_cmd->add_option("--results", so.results_file,
                         "After the run, write every answered request to this file as JSON lines "
                         "(id, payload index, kind, status, format, topk, tensor {dims, data} or "
                         "message, latency_us); reefverify checks model answers from it");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    }

    try {
        if (*pcap_cmd) {
            po.payload = pcap_payload.resolve();
            po.frag_size = pcap_payload.frag_size;
            po.seed = pcap_payload.seed;
            po.addresses.src_ip = parse_ipv4(src_ip, "--src");
            po.addresses.dst_ip = parse_ipv4(dst_ip, "--dst");
            po.addresses.src_mac = parse_mac(src_mac, "--src-mac");
            po.addresses.dst_mac = parse_mac(dst_mac, "--dst-mac");
            po.addresses.src_port = sport;
            po.addresses.dst_port = dport;
            return run_pcap(po);
        }
        if (*check_cmd) {
            co.expect = expect == "model" ? expectation::model : expectation::crc32;
            return run_check(co, std::cout).passed() ? 0 : 1;
        }
        if (*send_cmd) {
            so.payload = send_payload.resolve();
            so.frag_size = send_payload.frag_size;
            so.seed = send_payload.seed;
            so.dst_ip = parse_ipv4(send_dst, "--dst");
            so.bind_ip = parse_ipv4(bind_ip, "--bind");
            std::ostream& log = json ? std::cerr : std::cout;
            const send_result r = run_send(so, log);
            std::cout << format_send_result(r, json) << std::endl;
            if (r.bad > 0) return 1;
            if (r.loss() > max_loss) {
                log << "reefgen send: loss " << r.loss() << " exceeds --max-loss " << max_loss
                    << '\n';
                return 1;
            }
            return 0;
        }
    } catch (const usage_error& e) {
        std::cerr << "reefgen: " << e.what() << '\n';
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "reefgen: " << e.what() << '\n';
        return 2;
    }
    return 2;
}
