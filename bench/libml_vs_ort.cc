// libml_vs_ort: the zoo's model families at full size (ResNet-50, VGG-19, MobileNet-v2,
// DenseNet-121, Inception-v3, and BERT-base at sequence length 128) on reefline's cpu backend vs
// ONNX Runtime's CPU provider on the same machine, in one run, with the same number of compute
// threads (reefline: compute units of the cpu device; ORT: intra-op threads, --threads N for
// both). Prints a table and a last line `resnet50_ratio=A vgg19_ratio=B ... <model>_ratio=X`
// (reefline throughput / ORT throughput at batch 1), one entry per model measured.
//
// The two sides take turns run by run: ONNX Runtime waits in a child process
// (tests/ort/run_model.js --serve) while reefline runs, then runs once while reefline waits,
// and so on; the cores are not shared between the two runtimes at any moment, and both get the
// same N threads. A model's ratio is the median of the pairs' ratios. Taking turns matters on
// a shared VM whose speed drifts for seconds at a time: with each side's runs done in one go,
// ResNet-50 at batch 1 read 0.77, 0.84 and 1.40 in three runs within minutes of each other.
//
// Every step (the zoo, npm, each model and batch, both sides) prints a progress line on
// stderr; --csv FILE writes the table, one row per model and batch.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "preempt/backend_option.h"
#include "bench/bench_report.h"
#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_onednn.h"
#include "libml/kernels/kernels.h"
#include "libml/planner/c16_layout.h"
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

// Untimed runs before the timed ones, on both sides: with several compute units, the first
// runs touch each unit's scratch for the first time and their block-to-unit assignments vary,
// so one warm-up left the median of five runs 1.6x slow (MobileNet-v2 on two units).
constexpr int kWarmupRuns = 3;

// ONNX Runtime with the model loaded in a child process (run_model.js --serve): each run_ms()
// asks for one run and returns the time the child measured around it.
class ort_runner {
public:
    // `length` > 0: a sequence model at that length (ids below 1000, attention mask all ones).
    ort_runner(const fs::path& root, const fs::path& model, int64_t batch, int64_t length, int threads) {
        const std::string cmd = "exec node " + (root / "tests/ort/run_model.js").string() + " " + model.string() +
                                " --batch " + std::to_string(batch) +
                                (length ? " --dim L=" + std::to_string(length) + " --int-range 0,1000" : "") +
                                " --threads " + std::to_string(threads) + " --serve";
        int to[2], from[2];
        if (pipe(to) != 0) throw std::runtime_error("pipe failed");
        if (pipe(from) != 0) {
            close(to[0]);
            close(to[1]);
            throw std::runtime_error("pipe failed");
        }
        _pid = fork();
        if (_pid == 0) {
            dup2(to[0], 0);
            dup2(from[1], 1);
            close(to[0]), close(to[1]), close(from[0]), close(from[1]);
            execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
            _exit(127);
        }
        close(to[0]);
        close(from[1]);
        if (_pid < 0) {
            close(to[1]);
            close(from[0]);
            throw std::runtime_error("fork failed");
        }
        _in = fdopen(to[1], "w");
        _out = fdopen(from[0], "r");
        _what = cmd;
    }
    ort_runner(const ort_runner&) = delete;
    ort_runner& operator=(const ort_runner&) = delete;
    ~ort_runner() {
        if (_in) std::fclose(_in);  // end of input: the child exits
        if (_out) std::fclose(_out);
        int status = 0;
        waitpid(_pid, &status, 0);
    }

    double run_ms() {
        char line[256];
        if (std::fputs("run\n", _in) < 0 || std::fflush(_in) != 0 || !std::fgets(line, sizeof line, _out) ||
            std::strncmp(line, "run_ms ", 7) != 0)
            throw std::runtime_error("ONNX Runtime stopped answering (its error above): " + _what);
        wait_idle();
        return std::strtod(line + 7, nullptr);
    }

private:
    // Returns once none of the child's threads is running (two looks 1 ms apart), or after
    // 500 ms: ONNX Runtime's intra-op workers spin for a while after a run, and reefline's run
    // started at once shared the cores with them (ResNet-50 at batch 1 on two units read 98 ms
    // against 54 when each side ran alone).
    void wait_idle() const {
        const fs::path tasks = "/proc/" + std::to_string(_pid) + "/task";
        int quiet = 0;
        for (int look = 0; look < 500 && quiet < 2; ++look) {
            bool running = false;
            std::error_code ec;
            for (const auto& t : fs::directory_iterator(tasks, ec)) {
                std::ifstream f(t.path() / "stat");
                std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
                const size_t paren = stat.rfind(')');  // the name may hold spaces and parentheses
                if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'R') running = true;
            }
            if (ec) return;  // no /proc: nothing to wait for that can be seen
            quiet = running ? 0 : quiet + 1;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    pid_t _pid = -1;
    FILE* _in = nullptr;
    FILE* _out = nullptr;
    std::string _what;
};

// A model on reefline's cpu device with inputs made as run_model.js makes them.
class reefline_runner {
public:
    reefline_runner(ml::runtime& rt, const fs::path& model, int64_t batch, int64_t length) : _rt(rt) {
        ml::import_options opts;
        opts.batch = batch;
        opts.unbound_dim = length;
        _model = rt.load_model(model, opts);
        _instance = rt.link_model(_model);
        std::mt19937 rng(1);
        std::normal_distribution<float> d;
        for (const auto& desc : _instance->inputs()) {
            if (desc.type == ml::dtype::f32) {
                ml::bytes_t b(size_t(ml::element_count(desc.shape)) * ml::dtype_size(desc.type));
                auto* f = reinterpret_cast<float*>(b.data());
                for (size_t i = 0; i < b.size() / 4; ++i) f[i] = d(rng);
                _xs.push_back(ml::tensor::make(desc.type, desc.shape, std::move(b)));
                continue;
            }
            // Token inputs: a mask of ones, token types 0, ids < 1000.
            std::vector<int64_t> v(size_t(ml::element_count(desc.shape)));
            const bool mask = desc.name.find("mask") != std::string::npos,
                       types = desc.name.find("type") != std::string::npos;
            for (auto& x : v) x = mask ? 1 : types ? 0 : int64_t(rng() % 1000);
            _xs.push_back(ml::tensor::from_i64(v, desc.shape, desc.type));
        }
    }

    double run_ms() {
        const auto t0 = std::chrono::steady_clock::now();
        _rt.infer_batch(*_instance, _xs, _ys);
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }

private:
    ml::runtime& _rt;
    std::shared_ptr<ml::model> _model;
    std::unique_ptr<ml::instance> _instance;
    std::vector<ml::tensor> _xs, _ys;
};

// The middle value (the mean of the two middle ones for an even count).
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// The families measured, in the order of the last line; BERT-base runs at sequence length 128.
struct family {
    const char* name;
    int64_t length;
};
constexpr family kFamilies[] = {{"resnet50", 0},    {"vgg19", 0},        {"mobilenet_v2", 0},
                                {"densenet121", 0}, {"inception_v3", 0}, {"bert", 128}};

}  // namespace

int main(int argc, char** argv) {
    std::string all_names;
    for (const family& f : kFamilies) all_names += std::string(all_names.empty() ? "" : ",") + f.name;
    CLI::App app{"libml_vs_ort: reefline cpu backend vs ONNX Runtime CPU on the zoo's model families"};
    std::string models, only = all_names;
    int repeat = 5;
    bool quick = false;
    unsigned units = 0;
    std::string root_dir, csv_path;
    app.add_option("--models", models, "directory with <model>.onnx for each model measured (default: written by build/tools/zoo)");
    app.add_option("--only", only, "models to measure, comma-separated, from: " + all_names)->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per configuration")->capture_default_str();
    auto* units_opt = app.add_option("--threads", units, "compute threads on both sides: cpu device compute units and ORT intra-op threads (default: cores - 1, at least 1)");
    app.add_option("--compute-units", units, "the same as --threads")->excludes(units_opt);
    app.add_option("--root", root_dir, "repository root, for tests/ort and build/tools/zoo (default: two levels above the build dir)");
    app.add_flag("--quick", quick, "batch 1 only, 3 runs");
    app.add_option("--csv", csv_path, "write the table as CSV: one row per model and batch");
    std::string gemm = "onednn";
    app.add_option("--gemm", gemm, "the library reefline's GEMM and convolution blocks call (onednn falls back to OpenBLAS in a build without it)")
        ->check(CLI::IsMember({"onednn", "openblas"}))
        ->capture_default_str();
    std::string conv = "auto";
    app.add_option("--conv", conv, "how reefline runs convolutions other than pointwise and depthwise: direct or Winograd where measured faster (auto), direct wherever it can, Winograd F(2x2, 3x3) wherever it can (3x3 at stride 1), or im2col and the GEMM")
        ->check(CLI::IsMember({"auto", "direct", "winograd", "im2col"}))
        ->capture_default_str();
    std::string layout = "auto";
    app.add_option("--layout", layout, "reefline's activation layout: channel-blocked (c16) where its kernels run and it pays (auto), or NCHW throughout")
        ->check(CLI::IsMember({"auto", "nchw"}))
        ->capture_default_str();
    app.footer("Progress (one line per step) goes to stderr; stdout has the table and the last line.");
    std::string backend = "cpu";
    reefline::gpu::add_backend_option(app, backend);
    CLI11_PARSE(app, argc, argv);
    // A child ONNX Runtime that dies leaves a closed pipe: the write fails and says so
    // (ort_runner::run_ms) instead of the signal ending the run.
    std::signal(SIGPIPE, SIG_IGN);
    const fs::path root = root_dir.empty() ? fs::canonical(fs::path(argv[0])).parent_path().parent_path().parent_path()
                                           : fs::path(root_dir);
    if (!units) units = std::max(1u, std::thread::hardware_concurrency() - 1);
    std::vector<family> chosen;
    {
        std::stringstream names(only);
        for (std::string n; std::getline(names, n, ',');) {
            const auto it = std::find_if(std::begin(kFamilies), std::end(kFamilies), [&](const family& f) { return n == f.name; });
            if (it == std::end(kFamilies)) {
                std::fprintf(stderr, "libml_vs_ort: --only: unknown model '%s' (known: %s)\n", n.c_str(), all_names.c_str());
                return 2;
            }
            chosen.push_back(*it);
        }
        if (chosen.empty()) {
            std::fprintf(stderr, "libml_vs_ort: --only names no model\n");
            return 2;
        }
    }
    if (quick) repeat = 3;
    const std::vector<int64_t> batches = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 8};
    const bool need_npm = !fs::exists(root / "tests/ort/node_modules/onnxruntime-node");
    // The zoo and npm when they run, then every model and batch on each runtime.
    report::progress progress("libml_vs_ort",
                              (models.empty() ? 1u : 0u) + (need_npm ? 1u : 0u) + unsigned(chosen.size() * batches.size()));
    try {
        // Opened before minutes of measuring: an unwritable path fails now, naming the file.
        std::unique_ptr<report::csv_writer> csv;
        if (!csv_path.empty())
            csv = std::make_unique<report::csv_writer>(
                csv_path, std::vector<std::string>{"model", "batch", "sequence_length", "compute_units", "timed_runs",
                                                   "reefline_ms", "ort_ms", "ratio"});
        const fs::path work = fs::temp_directory_path() / ("libml_vs_ort." + std::to_string(getpid()));
        const fs::path dir = models.empty() ? work : fs::path(models);
        if (models.empty()) {
            fs::create_directories(work);
            std::string names;
            for (const family& f : chosen) names += std::string(names.empty() ? "" : ",") + f.name;
            auto step = progress.begin(names + " written by the zoo");
            run((root / "build/tools/zoo").string() + " --out " + dir.string() + " --only " + names + " -q");
        }
        if (need_npm) {
            auto step = progress.begin("onnxruntime-node installed by npm in tests/ort");
            run("cd " + (root / "tests/ort").string() + " && npm install --ignore-scripts --no-audit --no-fund > /dev/null");
        }
        reefline::gpu::backend_options o;
        o.compute_units = units;
        auto device = reefline::gpu::make_backend(backend, o);
        ml::kernels::use_openblas_only(gemm == "openblas");
        ml::kernels::use_conv_method(ml::kernels::conv_method_named(conv));
        ml::use_c16_layout(layout == "auto");
        ml::runtime rt(*device);
        std::printf("%u compute unit(s) for reefline, %u intra-op thread(s) for ONNX Runtime, %d timed runs each, the "
                    "sides taking turns; medians of the times and of the pairs' ratios\n",
                    units, units, repeat);
        // The GEMM library, and OpenBLAS's kernel set where it runs (Haswell's AVX2 on an AVX-512
        // core is worth ~1.6x on the convolution models), so the figures say what ran.
        std::printf("GEMM: %s; convolutions: %s; layout: %s\n\n", ml::kernels::cpu_gemm_library().c_str(), conv.c_str(),
                    ml::c16_layout_in_use() ? "c16 where it pays" : "NCHW");
        std::printf("%-13s %5s %14s %14s %8s\n", "model", "batch", "reefline ms", "ORT ms", "ratio");
        std::vector<double> ratio_b1(chosen.size(), 0.0);
        for (size_t mi = 0; mi < chosen.size(); ++mi) {
            const char* name = chosen[mi].name;
            const int64_t length = chosen[mi].length;
            const fs::path model = dir / (std::string(name) + ".onnx");
            for (int64_t batch : batches) {
                const std::string config = std::string(name) + " batch " + std::to_string(batch);
                auto step = progress.begin(config + ", reefline and ONNX Runtime taking turns");
                reefline_runner reef(rt, model, batch, length);
                ort_runner ort(root, model, batch, length, int(units));
                for (int w = 0; w < kWarmupRuns; ++w) {
                    reef.run_ms();
                    ort.run_ms();
                }
                std::vector<double> reef_each, ort_each, ratio_each;
                for (int i = 0; i < repeat; ++i) {
                    reef_each.push_back(reef.run_ms());
                    ort_each.push_back(ort.run_ms());
                    ratio_each.push_back(ort_each.back() / reef_each.back());
                }
                const double r = median(reef_each), o_ms = median(ort_each), ratio = median(ratio_each);
                step.result(std::to_string(int(std::lround(r))) + " / " + std::to_string(int(std::lround(o_ms))) +
                            " ms medians");
                step.end();
                std::printf("%-13s %5lld %14.1f %14.1f %8.2f\n", name, static_cast<long long>(batch), r, o_ms, ratio);
                std::fflush(stdout);
                if (csv)
                    csv->row({name, batch, length ? report::csv_cell(length) : report::csv_cell::empty(), units, repeat, report::csv_cell::fixed(r, 1),
                              report::csv_cell::fixed(o_ms, 1), report::csv_cell::fixed(ratio, 3)});
                if (batch == 1) ratio_b1[mi] = ratio;
            }
        }
        if (models.empty()) fs::remove_all(work);
        if (csv) csv->commit();
        for (size_t mi = 0; mi < chosen.size(); ++mi)
            std::printf("%s%s_ratio=%.3f", mi ? " " : "", chosen[mi].name, ratio_b1[mi]);
        std::printf("\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "libml_vs_ort: %s\n", e.what());
        return 1;
    }
    return 0;
}
