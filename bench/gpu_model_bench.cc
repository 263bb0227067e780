// gpu_model_bench (GPU builds): ResNet-50, VGG-19 and BERT-base (the zoo's full-size models;
// BERT at sequence length --seq, 128 by default) through libml's runtime on the GPU device, at
// batch 1 and 8. PyTorch eager on the same GPU is timed by bench/gpu_vs_torch.py (torchvision's
// resnet50 and vgg19, a BERT-base encoder of the same dimensions); scripts/gpu-check divides the
// two.
//
// Per model and batch: `kernels_ms`, the plan's launches on one stream until the stream is idle
// (inputs already in place: what PyTorch's timing of model(x) on a GPU tensor covers), and
// `end_to_end_ms`, runtime::infer_batch (inputs written, launches, outputs copied back).
// Weights come from the zoo tool without its calibration run (timing does not depend on them).
//
// Lines: `reefline model=M batch=B kernels_ms=X end_to_end_ms=Y math=fp32|tensor_f16|tensor_bf16`
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "libml/libml.h"
#include "libml/runtime/synthetic_inputs.h"
#include "preempt/gpu_device.h"

namespace fs = std::filesystem;
namespace gpu = reefline::gpu;
namespace ml = reefline::ml;
using clk = std::chrono::steady_clock;

namespace {

double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"gpu_model_bench: zoo models on the GPU device through libml's runtime"};
    std::string zoo, dir, math = "fp32";
    std::vector<std::string> models = {"resnet50", "vgg19", "bert"};
    int64_t seq = 128;
    std::vector<int64_t> batches = {1, 8};
    int iterations = 20;
    app.add_option("--zoo", zoo, "the zoo tool (build/tools/zoo)")->required();
    app.add_option("--dir", dir, "where the models are written (default: a temporary directory)");
    app.add_option("--models", models, "zoo model names")->delimiter(',');
    app.add_option("--batches", batches, "batch sizes")->delimiter(',');
    app.add_option("--iterations", iterations, "timed runs per model and batch")->capture_default_str();
    app.add_option("--math", math, "fp32, tensor_f16 or tensor_bf16")->capture_default_str();
    app.add_option("--seq", seq, "sequence length of the sequence models (BERT)")->capture_default_str();
    bool no_task = false;
    app.add_flag("--no-task", no_task,
                 "time the plan's launches without task words too (no preemption checks): the checks' cost");
    CLI11_PARSE(app, argc, argv);

    gpu::gpu_device_options o;
    if (math == "tensor_f16") o.math = gpu::gpu_math::tensor_f16;
    else if (math == "tensor_bf16") o.math = gpu::gpu_math::tensor_bf16;
    else if (math != "fp32") {
        std::fprintf(stderr, "gpu_model_bench: --math %s?\n", math.c_str());
        return 2;
    }
    std::unique_ptr<gpu::device> d;
    try {
        d = gpu::make_gpu_device(o);
    } catch (const gpu::no_device_error& e) {
        std::fprintf(stderr, "gpu_model_bench: %s\n", e.what());
        return 77;
    }
    const bool own_dir = dir.empty();
    if (own_dir) dir = (fs::temp_directory_path() / ("gpu_model_bench." + std::to_string(getpid()))).string();
    fs::create_directories(dir);
    std::string only;
    for (const auto& m : models) only += (only.empty() ? "" : ",") + m;
    const std::string cmd = zoo + " --out " + dir + " --only " + only + " --no-calibration -q";
    std::printf("gpu_model_bench: %s (%s), math %s; writing models: %s\n", d->caps().name.c_str(),
                gpu::gpu_backend_name(), math.c_str(), cmd.c_str());
    std::fflush(stdout);
    if (std::system(cmd.c_str()) != 0) {
        std::fprintf(stderr, "gpu_model_bench: the zoo tool failed\n");
        return 1;
    }
    ml::runtime rt(*d);
    for (const auto& name : models) {
        ml::import_options io;
        io.unbound_dim = seq;  // BERT's L; the CNNs have no unbound dims
        auto m = rt.load_model((fs::path(dir) / (name + ".onnx")).string(), io);
        for (int64_t batch : batches) {
            auto in = rt.link_model(m);
            rt.configure_batch(*in, batch);
            const auto x = ml::synthetic_inputs(in->inputs(), 1);  // ids within the vocabulary
            std::vector<ml::tensor> y;
            for (int i = 0; i < 3; ++i) rt.infer_batch(*in, x, y);  // warm-up (pool, caches, clocks)
            std::vector<double> e2e, kernels;
            for (int i = 0; i < iterations; ++i) {
                const auto t0 = clk::now();
                rt.infer_batch(*in, x, y);
                e2e.push_back(ms_since(t0));
            }
            // The plan's launches alone, inputs in place, on a stream of our own.
            rt.write_inputs(*in, x);
            const auto launches = rt.task_launches(*in);
            gpu::stream* s = d->create_stream(0);
            gpu::task_words* w = d->task_words_create();
            const auto time_launches = [&](gpu::task_words* words, std::vector<double>& times) {
                for (int i = 0; i < iterations + 3; ++i) {
                    const auto t0 = clk::now();
                    for (size_t j = 0; j < launches.size(); ++j) {
                        const auto& l = launches[j];
                        d->launch(s, gpu::launch{l.kernel, l.args.data(), uint32_t(l.args.size()), l.grid, 0, l.grid,
                                                 words, uint32_t(j)});
                    }
                    d->synchronize(s);
                    if (i >= 3) times.push_back(ms_since(t0));
                }
            };
            time_launches(w, kernels);
            std::vector<double> unchecked;
            if (no_task) time_launches(nullptr, unchecked);
            d->task_words_destroy(w);
            d->stream_destroy(s);
            std::printf("reefline model=%s batch=%lld kernels_ms=%.3f end_to_end_ms=%.3f math=%s launches=%zu",
                        name.c_str(), (long long)batch, median(kernels), median(e2e), math.c_str(), launches.size());
            if (no_task) std::printf(" no_task_kernels_ms=%.3f", median(unchecked));
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    if (own_dir) fs::remove_all(dir);
    return 0;
}
