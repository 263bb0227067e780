// kprof: kernel profiles of a model on this machine's device (dkp/profile.h): for every launch
// of the model's plan at one batch size (and sequence length), its median time alone on the
// device, blocks, threads per block, registers, shared memory and occupancy, as JSON.
//
//   build/tools/kprof MODEL.onnx [--batch N] [--length L] [--runs R] [--compute-units U] --out profile.json
//
// The daemon profiles the models it serves itself (through the scheduler, as BE tasks) and
// keeps the profiles in its repository; kprof is the same measurement by hand.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "preempt/backend_option.h"
#include "libml/libml.h"

namespace ml = reefline::ml;

int main(int argc, char** argv) {
    CLI::App app{"kprof: kernel profiles of a model's plan on a device backend (cpu by default)"};
    std::string model, out;
    int64_t batch = 1, length = 0;
    int runs = 5;
    unsigned units = 0, top = 10;
    app.add_option("MODEL", model, "model.onnx")->required()->check(CLI::ExistingFile);
    app.add_option("--batch", batch, "batch size of the plan")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(4096)));
    app.add_option("--length", length, "sequence models: the length (default: their longest bucket)")
        ->check(CLI::Range(int64_t(1), int64_t(65535)));
    app.add_option("--runs", runs, "timed runs of every launch (median)")->capture_default_str()->check(CLI::Range(1, 1000));
    app.add_option("--compute-units", units, "compute units of the cpu device (default: cores - 1)");
    app.add_option("--out", out, "where to write the profile (JSON); default: stdout");
    app.add_option("--top", top, "print the N slowest launches")->capture_default_str();
    std::string backend = "cpu";
    reefline::gpu::add_backend_option(app, backend);
    CLI11_PARSE(app, argc, argv);
    try {
        reefline::gpu::backend_options o;
        o.compute_units = units;
        auto device = reefline::gpu::make_backend(backend, o);
        ml::runtime rt(*device);
        ml::import_options io;
        io.unbound_dim = length ? length : ml::sequence_buckets[0];
        auto m = rt.load_model(model, io);
        auto in = rt.link_model(m);
        std::vector<int64_t> lengths;
        try {
            const ml::request_input& r = m->requests();
            if (r.kind == ml::request_kind::sequence) {
                if (length && !r.bucket_for(length))
                    throw std::invalid_argument("--length " + std::to_string(length) + ": the model runs at lengths up to " +
                                                std::to_string(r.max_length()));
                lengths = {length ? length : r.max_length()};
            }
        } catch (const std::invalid_argument& e) {
            if (length) throw;  // a model no request format fits: profiled at its own shapes
        }
        rt.configure_batch(*in, batch, lengths);
        reefline::dkp::model_profile p;
        p.device = device->caps().name;
        p.put(rt.profile(*in, runs));
        const std::string json = p.to_json();
        if (out.empty()) {
            std::fputs(json.c_str(), stdout);
        } else {
            std::ofstream f(out, std::ios::binary | std::ios::trunc);
            f << json;
            f.close();
            if (!f) throw std::runtime_error("cannot write " + out);
        }
        const auto& ls = p.plans[0].launches;
        std::vector<size_t> order(ls.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ls[a].time_us > ls[b].time_us; });
        double total = 0;
        for (const auto& l : ls) total += l.time_us;
        std::fprintf(stderr, "kprof: %s, plan %s (%zu launches, %.1f us in all) on %s\n", model.c_str(),
                     p.plans[0].plan.c_str(), ls.size(), total, p.device.c_str());
        for (size_t r = 0; r < std::min<size_t>(top, order.size()); ++r) {
            const auto& l = ls[order[r]];
            std::fprintf(stderr, "  %10.1f us  %-12s blocks=%-6u occupancy=%-3u %s\n", l.time_us, l.kernel.c_str(), l.blocks,
                         l.occupancy, l.node.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kprof: %s\n", e.what());
        return 1;
    }
    return 0;
}
