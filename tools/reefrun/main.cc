// reefrun: runs one model on the cpu backend. Inputs and outputs are serialized
// onnx.TensorProto files (the ONNX backend-test format). With --batch N, the model is
// configured for batch N and an input of batch 1 is repeated N times.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "preempt/backend_option.h"
#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_onednn.h"
#include "libml/planner/c16_layout.h"
#include "libml/libml.h"

namespace ml = reefline::ml;

namespace {

ml::tensor repeat_batch(const ml::tensor& t, int64_t n) {
    ml::shape_t s = t.shape;
    if (s.empty() || s[0] != 1) throw std::invalid_argument("--batch needs inputs of batch 1, got " + ml::shape_str(t.shape));
    s[0] = n;
    ml::bytes_t b;
    for (int64_t i = 0; i < n; ++i) b.insert(b.end(), t.data->begin(), t.data->end());
    return ml::tensor::make(t.type, s, std::move(b));
}

void write_tensor(const std::string& path, const ml::tensor& t, const std::string& name);

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefrun: run an ONNX model on a reefline device backend (cpu by default)"};
    std::string model;
    std::vector<std::string> inputs, outputs;
    int64_t batch = 0;
    int repeat = 1;
    int profile = 0;
    app.add_option("MODEL", model, "model.onnx")->required()->check(CLI::ExistingFile);
    app.add_option("--input", inputs, "input TensorProto file, one per graph input in order")->check(CLI::ExistingFile);
    app.add_option("--output", outputs, "where to write output TensorProto files, in order");
    app.add_option("--batch", batch, "batch size (inputs of batch 1 are repeated)");
    app.add_option("--repeat", repeat, "run this many times and report the median time per run (the first run is left out of it)")->check(CLI::PositiveNumber);
    app.add_option("--profile", profile, "print the N slowest launches (kernel, node, grid, ms)");
    uint32_t footprint = 0;
    app.add_option("--footprint", footprint,
                   "print the memory an IF lane planned up to this max_batch holds (batch sizes 1, 2, 4, .., "
                   "max_batch), its instances sharing one arena and each with its own; runs nothing")
        ->check(CLI::Range(1, 4096));
    std::string gemm = "onednn";
    app.add_option("--gemm", gemm,
                   "the library the GEMM and convolution blocks call, for comparisons (onednn falls back to "
                   "OpenBLAS in a build without it)")
        ->check(CLI::IsMember({"onednn", "openblas"}))
        ->capture_default_str();
    std::string conv = "auto";
    app.add_option("--conv", conv,
                   "how convolutions other than pointwise and depthwise run, for comparisons: direct or Winograd "
                   "where measured faster (auto), direct wherever it can (AVX-512), Winograd F(2x2, 3x3) wherever "
                   "it can (3x3 at stride 1, AVX-512), or im2col and the GEMM")
        ->check(CLI::IsMember({"auto", "direct", "winograd", "im2col"}))
        ->capture_default_str();
    std::string layout = "auto";
    app.add_option("--layout", layout,
                   "the cpu device's activation layout, for comparisons: channel-blocked (c16) where its kernels "
                   "run and it pays (auto), or NCHW throughout")
        ->check(CLI::IsMember({"auto", "nchw"}))
        ->capture_default_str();
    uint32_t units = 0;
    app.add_option("--compute-units", units, "the cpu device's compute units (default: cores - 1, at least 1)");
    std::string backend = "cpu";
    reefline::gpu::add_backend_option(app, backend);
    CLI11_PARSE(app, argc, argv);
    try {
        reefline::gpu::backend_options device_options;
        device_options.compute_units = units;
        auto device = reefline::gpu::make_backend(backend, device_options);
        ml::kernels::use_openblas_only(gemm == "openblas");
        ml::kernels::use_conv_method(ml::kernels::conv_method_named(conv));
        ml::use_c16_layout(layout == "auto");
        ml::runtime rt(*device);
        if (footprint) {
            // The sizes a lane plans (the powers of two below max_batch, and max_batch).
            std::vector<int64_t> sizes;
            for (int64_t b = 1; b < footprint; b *= 2) sizes.push_back(b);
            sizes.push_back(footprint);
            // A symbolic sequence length at the first bucket, as the daemon imports models.
            ml::import_options fopts;
            fopts.unbound_dim = ml::sequence_buckets[0];
            const ml::graph g = ml::import_onnx(model, fopts);
            std::vector<int64_t> lengths;
            if (const ml::request_input r = ml::derive_request_input(g); r.kind == ml::request_kind::sequence) lengths = r.lengths;
            const ml::memory_footprint own = rt.footprint(g, sizes, 0, lengths);
            const std::vector<std::vector<int64_t>> lane{sizes};
            const ml::memory_footprint shared = rt.footprint(g, lane, 0, lengths);
            std::printf("%6s %16s %16s\n", "batch", "own arena", "shared arena");
            for (size_t i = 0; i < sizes.size(); ++i)
                std::printf("%6lld %16lld %16lld\n", static_cast<long long>(sizes[i]),
                            static_cast<long long>(own.instances[i].second), static_cast<long long>(shared.instances[i].second));
            std::printf("%6s %16s %16lld\n", "arena", "-", static_cast<long long>(shared.arenas.at(0)));
            std::printf("weight_bytes=%lld instances_own_arenas=%lld instances_shared_arena=%lld ratio=%.2f\n",
                        static_cast<long long>(own.weight_bytes), static_cast<long long>(own.instance_bytes()),
                        static_cast<long long>(shared.instance_bytes()),
                        double(own.instance_bytes()) / double(std::max<int64_t>(1, shared.instance_bytes())));
            return 0;
        }
        ml::import_options opts;
        if (batch > 0) opts.batch = batch;
        std::vector<ml::tensor> xs;
        for (const auto& f : inputs) {
            std::string name;
            xs.push_back(ml::read_tensor_file(f, &name));
            if (batch > 1 && !xs.back().shape.empty() && xs.back().shape[0] == 1) xs.back() = repeat_batch(xs.back(), batch);
            // The inputs' own shapes give symbolic dims (a sequence model's length) their size.
            if (!name.empty()) opts.input_shapes[name] = xs.back().shape;
        }
        auto m = rt.load_model(model, opts);
        auto in = rt.link_model(m);
        // Every plan must keep the idempotence invariant (restore re-executes kernels).
        if (const std::string v = in->current_plan().check_idempotence(); !v.empty())
            throw std::runtime_error("plan violates idempotence: " + v);
        std::vector<ml::tensor> ys;
        // Each run timed on its own: the first pays for first-touch page faults, and this
        // figure is for comparing with other runtimes' steady state.
        std::vector<double> run_ms;
        for (int r = 0; r < repeat; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            rt.infer_batch(*in, xs, ys);
            run_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        const double first_ms = run_ms.front();
        if (run_ms.size() > 1) run_ms.erase(run_ms.begin());
        std::sort(run_ms.begin(), run_ms.end());
        const double ms = run_ms[run_ms.size() / 2];
        if (profile > 0) {
            std::vector<double> ms_each;
            rt.infer_batch_profiled(*in, xs, ys, ms_each);
            const auto& ls = in->current_plan().launches();
            std::vector<size_t> order(ls.size());
            for (size_t i = 0; i < order.size(); ++i) order[i] = i;
            std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms_each[a] > ms_each[b]; });
            double total = 0;
            for (double v : ms_each) total += v;
            std::printf("profile: %zu launches, %.2f ms in total\n", ls.size(), total);
            for (size_t r = 0; r < std::min<size_t>(size_t(profile), order.size()); ++r) {
                const auto& l = ls[order[r]];
                std::printf("  %8.3f ms  %5.1f%%  %-10s grid=%-6u %s\n", ms_each[order[r]], 100 * ms_each[order[r]] / total,
                            l.kernel->name, l.grid, l.node.c_str());
            }
        }
        const auto descs = in->outputs();
        for (size_t i = 0; i < ys.size(); ++i) {
            std::printf("output %zu '%s': %s %s\n", i, descs[i].name.c_str(), ml::dtype_name(ys[i].type),
                        ml::shape_str(ys[i].shape).c_str());
            if (i < outputs.size()) write_tensor(outputs[i], ys[i], descs[i].name);
        }
        std::printf("batch=%lld launches=%zu arena_bytes=%lld weight_bytes=%lld ms_per_run=%.3f ms_min=%.3f ms_first=%.3f\n",
                    static_cast<long long>(in->batch()), in->current_plan().launches().size(),
                    static_cast<long long>(in->arena_bytes()), static_cast<long long>(m->weight_bytes()), ms,
                    run_ms.front(), first_ms);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "reefrun: %s\n", e.what());
        return 1;
    }
    return 0;
}

namespace {

// A minimal TensorProto writer: dims (1), data_type (2), name (8), raw_data (9).
void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) { out.push_back(char(v | 0x80)); v >>= 7; }
    out.push_back(char(v));
}

int onnx_type(ml::dtype t) {
    switch (t) {
    case ml::dtype::f32: return 1;
    case ml::dtype::u8: return 2;
    case ml::dtype::i8: return 3;
    case ml::dtype::i32: return 6;
    case ml::dtype::i64: return 7;
    case ml::dtype::boolean: return 9;
    case ml::dtype::f16: return 10;
    case ml::dtype::f64: return 11;
    default: return 0;
    }
}

void write_tensor(const std::string& path, const ml::tensor& t, const std::string& name) {
    std::string out;
    for (int64_t d : t.shape) { out.push_back(char(1 << 3 | 0)); put_varint(out, uint64_t(d)); }
    out.push_back(char(2 << 3 | 0));
    put_varint(out, uint64_t(onnx_type(t.type)));
    out.push_back(char(8 << 3 | 2));
    put_varint(out, name.size());
    out += name;
    out.push_back(char(9 << 3 | 2));
    put_varint(out, t.bytes());
    if (t.bytes()) out.append(reinterpret_cast<const char*>(t.data->data()), t.bytes());
    std::ofstream f(path, std::ios::binary);
    if (!(f << out)) throw std::runtime_error("cannot write " + path);
}

}  // namespace
