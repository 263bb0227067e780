// libml_vs_ort: ResNet-50, VGG-19 and BERT-base at sequence length 128 (the project's zoo, full
// size) on reefline's cpu backend vs ONNX Runtime's CPU provider on the same machine, in one
// run, with the same number of compute threads (reefline: compute units of the cpu device;
// ORT: intra-op threads). Prints a table and a last line `resnet50_ratio=X vgg19_ratio=Y
// bert_ratio=Z` (reefline throughput / ORT throughput at batch 1).
//
// Every step (the zoo, npm, each model and batch on each runtime) prints a progress line on
// stderr; --csv FILE writes the table, one row per model and batch.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "bench/bench_report.h"
#include "libml/libml.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;
namespace report = reefline::bench;

namespace {

std::string run(const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run: " + cmd);
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    if (pclose(p) != 0) throw std::runtime_error("failed: " + cmd + "\n" + out);
    return out;
}

// The median "run_ms" ONNX Runtime reported for `repeat` runs.
// `length` > 0: a sequence model at that length (ids below 1000, attention mask all ones).
double ort_median_ms(const fs::path& root, const fs::path& model, int64_t batch, int64_t length, int threads,
                     int repeat, const fs::path& work) {
    const fs::path dir = work / ("ort_" + model.stem().string() + "_" + std::to_string(batch));
    run("node " + (root / "tests/ort/run_model.js").string() + " " + model.string() + " --batch " +
        std::to_string(batch) + (length ? " --dim L=" + std::to_string(length) + " --int-range 0,1000" : "") +
        " --threads " + std::to_string(threads) + " --repeat " + std::to_string(repeat) + " --output-dir " +
        dir.string() + " > /dev/null");
    std::ifstream f(dir / "summary.json");
    std::stringstream s;
    s << f.rdbuf();
    const std::string j = s.str();
    const auto at = j.find("\"median\"", j.find("\"run_ms\""));
    if (at == std::string::npos) throw std::runtime_error("no run_ms.median in " + (dir / "summary.json").string());
    return std::strtod(j.c_str() + j.find(':', at) + 1, nullptr);
}

double reefline_median_ms(ml::runtime& rt, const fs::path& model, int64_t batch, int64_t length, int repeat) {
    ml::import_options opts;
    opts.batch = batch;
    opts.unbound_dim = length;
    auto m = rt.load_model(model, opts);
    auto in = rt.link_model(m);
    std::vector<ml::tensor> xs;
    std::mt19937 rng(1);
    std::normal_distribution<float> d;
    for (const auto& desc : in->inputs()) {
        if (desc.type == ml::dtype::f32) {
            ml::bytes_t b(size_t(ml::element_count(desc.shape)) * ml::dtype_size(desc.type));
            auto* f = reinterpret_cast<float*>(b.data());
            for (size_t i = 0; i < b.size() / 4; ++i) f[i] = d(rng);
            xs.push_back(ml::tensor::make(desc.type, desc.shape, std::move(b)));
            continue;
        }
        // Token inputs as run_model.js makes them: a mask of ones, token types 0, ids < 1000.
        std::vector<int64_t> v(size_t(ml::element_count(desc.shape)));
        const bool mask = desc.name.find("mask") != std::string::npos, types = desc.name.find("type") != std::string::npos;
        for (auto& x : v) x = mask ? 1 : types ? 0 : int64_t(rng() % 1000);
        xs.push_back(ml::tensor::from_i64(v, desc.shape, desc.type));
    }
    std::vector<ml::tensor> ys;
    rt.infer_batch(*in, xs, ys);  // warm-up
    std::vector<double> ms;
    for (int r = 0; r < repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        rt.infer_batch(*in, xs, ys);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"libml_vs_ort: reefline cpu backend vs ONNX Runtime CPU, ResNet-50, VGG-19 and BERT-base (L=128)"};
    std::string models;
    int repeat = 5;
    bool quick = false;
    unsigned units = 0;
    std::string root_dir, csv_path;
    app.add_option("--models", models, "directory with resnet50.onnx, vgg19.onnx and bert.onnx (default: written by build/tools/zoo)");
    app.add_option("--repeat", repeat, "timed runs per configuration")->capture_default_str();
    app.add_option("--compute-units", units, "cpu device compute units = ORT threads (default: cores - 1, at least 1)");
    app.add_option("--root", root_dir, "repository root, for tests/ort and build/tools/zoo (default: two levels above the build dir)");
    app.add_flag("--quick", quick, "batch 1 only, 3 runs");
    app.add_option("--csv", csv_path, "write the table as CSV: one row per model and batch");
    app.footer("Progress (one line per step) goes to stderr; stdout has the table and the last line.");
    CLI11_PARSE(app, argc, argv);
    const fs::path root = root_dir.empty() ? fs::canonical(fs::path(argv[0])).parent_path().parent_path().parent_path()
                                           : fs::path(root_dir);
    if (!units) units = std::max(1u, std::thread::hardware_concurrency() - 1);
    if (quick) repeat = 3;
    const std::vector<int64_t> batches = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 8};
    const bool need_npm = !fs::exists(root / "tests/ort/node_modules/onnxruntime-node");
    // The zoo and npm when they run, then every model and batch on each runtime.
    report::progress progress("libml_vs_ort",
                              (models.empty() ? 1u : 0u) + (need_npm ? 1u : 0u) + unsigned(3 * batches.size() * 2));
    try {
        // Opened before minutes of measuring: an unwritable path fails now, naming the file.
        std::unique_ptr<report::csv_writer> csv;
        if (!csv_path.empty())
            csv = std::make_unique<report::csv_writer>(
                csv_path, std::vector<std::string>{"model", "batch", "sequence_length", "compute_units", "timed_runs",
                                                   "reefline_ms", "ort_ms", "ratio"});
        fs::path work = fs::temp_directory_path() / ("libml_vs_ort." + std::to_string(getpid()));
        fs::create_directories(work);
        fs::path dir = models.empty() ? work : fs::path(models);
        if (models.empty()) {
            auto step = progress.begin("ResNet-50, VGG-19 and BERT-base written by the zoo");
            run((root / "build/tools/zoo").string() + " --out " + dir.string() + " --only resnet50,vgg19,bert -q");
        }
        if (need_npm) {
            auto step = progress.begin("onnxruntime-node installed by npm in tests/ort");
            run("cd " + (root / "tests/ort").string() + " && npm install --ignore-scripts --no-audit --no-fund > /dev/null");
        }
        reefline::gpu::cpu_device_options o;
        o.compute_units = units;
        auto device = reefline::gpu::make_cpu_device(o);
        ml::runtime rt(*device);
        std::printf("%u compute unit(s) for reefline, %u intra-op thread(s) for ONNX Runtime, %d timed runs, medians\n\n",
                    units, units, repeat);
        std::printf("%-10s %5s %14s %14s %8s\n", "model", "batch", "reefline ms", "ORT ms", "ratio");
        double ratio_b1[3] = {0, 0, 0};
        const char* names[3] = {"resnet50", "vgg19", "bert"};
        const int64_t lengths[3] = {0, 0, 128};  // BERT-base at sequence length 128
        for (int mi = 0; mi < 3; ++mi) {
            const fs::path model = dir / (std::string(names[mi]) + ".onnx");
            for (int64_t batch : batches) {
                const std::string config = std::string(names[mi]) + " batch " + std::to_string(batch);
                auto step = progress.begin(config + ", reefline");
                const double r = reefline_median_ms(rt, model, batch, lengths[mi], repeat);
                step.result(std::to_string(int(std::lround(r))) + " ms median");
                step.end();
                auto ort_step = progress.begin(config + ", ONNX Runtime");
                const double o_ms = ort_median_ms(root, model, batch, lengths[mi], int(units), repeat, work);
                ort_step.result(std::to_string(int(std::lround(o_ms))) + " ms median");
                ort_step.end();
                std::printf("%-10s %5lld %14.1f %14.1f %8.2f\n", names[mi], static_cast<long long>(batch), r, o_ms, o_ms / r);
                std::fflush(stdout);
                if (csv)
                    csv->row({names[mi], batch, lengths[mi] ? report::csv_cell(lengths[mi]) : report::csv_cell::empty(), units, repeat, report::csv_cell::fixed(r, 1),
                              report::csv_cell::fixed(o_ms, 1), report::csv_cell::fixed(o_ms / r, 3)});
                if (batch == 1) ratio_b1[mi] = o_ms / r;
            }
        }
        if (models.empty()) fs::remove_all(work);
        if (csv) csv->commit();
        std::printf("resnet50_ratio=%.3f vgg19_ratio=%.3f bert_ratio=%.3f\n", ratio_b1[0], ratio_b1[1], ratio_b1[2]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "libml_vs_ort: %s\n", e.what());
        return 1;
    }
    return 0;
}
