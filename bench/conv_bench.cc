// conv_bench (GPU builds): the convolutions of ResNet-50 and VGG-19 and the GEMMs of BERT-base
// (L = 128), at batch 1 and 8, through each variant of the GPU kernel library, per layer:
// microseconds and TFLOPS (2 x MACs / time), beside each other on the same card in one run.
//
// Variants: `v1`, the first GPU plans' tiles (64 x 64, one image a tile, no split-K); `span`,
// 64 x 64 tiles across the batch's images; `wide`, 128 x 128 tiles across images; `plan`, what
// the planner picks for this device (use_gpu_tiles: wide or 64, span, split-K for the device's
// units), which is what models run; and `f16` / `bf16`, the plan's tiles on the tensor cores
// (WMMA). GEMMs: v1 (64 x 64) and plan. The vendor libraries (cuDNN, cuBLAS) are not timed
// here yet; see docs/PERF.md.
//
// Every variant's output is first checked against the v1 output of the same layer (fp32
// variants within 1e-4 of the largest output, tensor-core ones within 5e-2).
//
// Lines: `layer=MODEL.NAME batch=B variant=V us=X tflops=Y blocks=N splits=S`, then the
// summary `conv_bench: plan_vs_v1=R span_vs_v1=R wide_vs_v1=R` (geometric means of v1 time /
// variant time over the layers where the variant applies).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "libml/kernels/gpu/launcher.h"
#include "libml/kernels/kernels.h"
#include "libml/planner/plan.h"
#include "preempt/gpu_device.h"

namespace gpu = reefline::gpu;
namespace k = reefline::ml::kernels;
namespace ml = reefline::ml;
using clk = std::chrono::steady_clock;

namespace {

struct conv_layer {
    const char* name;
    int64_t c_in, hw, c_out, kernel, stride;
};
struct gemm_layer {
    const char* name;
    int64_t m_per_image, n, k;  // BERT: rows = batch x 128 tokens
};

// One of each shape class of the models' layers (ResNet-50 v1.5: stride on the 3x3).
const conv_layer resnet50[] = {
    {"stem_7x7", 3, 224, 64, 7, 2},     {"l1_1x1_reduce", 256, 56, 64, 1, 1}, {"l1_3x3", 64, 56, 64, 3, 1},
    {"l1_1x1_expand", 64, 56, 256, 1, 1}, {"l2_3x3", 128, 28, 128, 3, 1},  {"l2_1x1_expand", 128, 28, 512, 1, 1},
    {"l3_3x3", 256, 14, 256, 3, 1},     {"l3_1x1_expand", 256, 14, 1024, 1, 1}, {"l4_3x3", 512, 7, 512, 3, 1},
    {"l4_1x1_expand", 512, 7, 2048, 1, 1},
};
const conv_layer vgg19[] = {
    {"conv1_2", 64, 224, 64, 3, 1}, {"conv2_2", 128, 112, 128, 3, 1}, {"conv3_4", 256, 56, 256, 3, 1},
    {"conv4_4", 512, 28, 512, 3, 1}, {"conv5_4", 512, 14, 512, 3, 1},
};
const gemm_layer bert[] = {
    {"qkv", 128, 2304, 768}, {"attn_out", 128, 768, 768}, {"ffn_up", 128, 3072, 768}, {"ffn_down", 128, 768, 3072},
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

k::conv2d_args conv_args(const conv_layer& l, int64_t batch) {
    k::conv2d_args a{};
    a.n = batch; a.c_in = l.c_in; a.h = a.w_in = l.hw; a.c_out = l.c_out; a.kh = a.kw = l.kernel;
    a.stride_h = a.stride_w = l.stride; a.pad_top = a.pad_left = l.kernel / 2; a.dil_h = a.dil_w = 1; a.groups = 1;
    a.h_out = a.w_out = (l.hw + 2 * (l.kernel / 2) - l.kernel) / l.stride + 1;
    a.ep.act = k::activation::relu;
    return a;
}

// A variant's tiles on top of the plan's choice for `units` (ml::use_gpu_tiles).
k::conv2d_args conv_variant(k::conv2d_args a, const std::string& v, uint32_t units) {
    ml::use_gpu_tiles(a, units);
    if (v == "plan" || v == "f16" || v == "bf16") return a;
    const int64_t co = a.c_out;
    a.k_splits = a.k_chunk = a.split_phase = 0;
    a.span_images = v == "v1" ? 0 : (a.n > 1 ? 1 : 0);
    const int64_t tile = v == "wide" ? 128 : 64;
    a.tile_co = int32_t(std::min(co, tile));
    a.tile_pix = int32_t(std::min(k::conv2d_pixels(a), tile));
    return a;
}

struct timing {
    double us = 0;
    std::vector<float> out;
};

class layer_runner {
public:
    explicit layer_runner(gpu::device& d) : _d(d), _s(d.create_stream(0)), _w(d.task_words_create()) {}
    ~layer_runner() {
        _d.task_words_destroy(_w);
        _d.stream_destroy(_s);
    }
    template <class Args>
    void launch(const gpu::kernel_info& kernel, const Args& a, int64_t grid) {
        _d.launch(_s, gpu::launch{&kernel, &a, sizeof a, uint32_t(grid), 0, uint32_t(grid), _w, 0});
    }
    // A layer's launches (`run`) timed over `iterations` after two warm-up runs.
    template <class Run>
    double time_us(Run run, int iterations) {
        for (int i = 0; i < 2; ++i) run();
        _d.synchronize(_s);
        const auto t0 = clk::now();
        for (int i = 0; i < iterations; ++i) run();
        _d.synchronize(_s);
        return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / iterations;
    }

private:
    gpu::device& _d;
    gpu::stream* _s;
    gpu::task_words* _w;
};

struct device_buffer {
    gpu::device& d;
    void* p;
    size_t bytes;
    device_buffer(gpu::device& dev, size_t n) : d(dev), p(dev.alloc(std::max<size_t>(n, 4))), bytes(n) {
        if (!p) throw std::bad_alloc();
    }
    device_buffer(gpu::device& dev, const std::vector<float>& v) : device_buffer(dev, v.size() * 4) {
        dev.copy_to_device(p, v.data(), bytes);
    }
    ~device_buffer() { d.free(p); }
    std::vector<float> read() const {
        std::vector<float> v(bytes / 4);
        d.copy_to_host(v.data(), p, bytes);
        return v;
    }
    float* f() const { return static_cast<float*>(p); }
};

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, double(std::fabs(x)));
    return m;
}

// Worst |got - want| relative to want's largest value.
double deviation(const std::vector<float>& got, const std::vector<float>& want) {
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    return worst / std::max(1e-30, max_abs(want));
}

struct summary {
    std::map<std::string, std::vector<double>> speedup;  // v1 time / variant time
    void add(const std::string& v, double v1_us, double us) { speedup[v].push_back(v1_us / us); }
    double geomean(const std::string& v) const {
        auto it = speedup.find(v);
        if (it == speedup.end() || it->second.empty()) return 0;
        double s = 0;
        for (double x : it->second) s += std::log(x);
        return std::exp(s / double(it->second.size()));
    }
};

// What every layer's runs share: the devices (fp32 and, where built, the tensor-core ones), the
// units plans are made for, and the speedups gathered for the summary.
struct bench {
    gpu::device* fp32;
    gpu::device* f16;
    gpu::device* bf16;
    uint32_t units;
    int iterations;
    bool tiny;
    std::vector<std::string> models;
    summary sum;
    bool ok = true;
    bool wants(const char* m) const { return std::find(models.begin(), models.end(), m) != models.end(); }
    void convs(int64_t batch);
    void gemms(int64_t batch);
};

// The ResNet-50 and VGG-19 layers at one batch size, every variant.
void bench::convs(int64_t batch) {
    std::vector<std::pair<std::string, const conv_layer*>> layers;
    if (wants("resnet50"))
        for (const auto& l : resnet50) layers.push_back({"resnet50", &l});
    if (wants("vgg19"))
        for (const auto& l : vgg19) layers.push_back({"vgg19", &l});
    for (const auto& [model, full] : layers) {
        conv_layer shrunk = *full;
        if (tiny) {
            shrunk.c_in = std::max<int64_t>(3, full->c_in / 8);
            shrunk.c_out = std::max<int64_t>(8, full->c_out / 8);
            shrunk.hw = std::min<int64_t>(full->hw, 14);
        }
        const conv_layer* l = &shrunk;
        const k::conv2d_args base = conv_args(*l, batch);
        const double flops = 2.0 * double(batch * base.c_out * base.h_out * base.w_out) * double(k::conv2d_k(base));
        const auto x = random_floats(size_t(batch * l->c_in * l->hw * l->hw), 1);
        const auto w = random_floats(size_t(k::conv2d_k(base) * l->c_out), 2);
        const auto b = random_floats(size_t(l->c_out), 3);
        const size_t out_n = size_t(batch * base.c_out * base.h_out * base.w_out);
        std::vector<float> v1_out;
        double v1_us = 0;
        for (const std::string v : {"v1", "span", "wide", "plan", "f16", "bf16"}) {
            gpu::device* d = v == "f16" ? f16 : v == "bf16" ? bf16 : fp32;
            if (!d || (v == "span" && batch == 1)) continue;
            k::conv2d_args a = conv_variant(base, v, units);
            device_buffer dx(*d, x), dw(*d, w), db(*d, b), dy(*d, out_n * 4);
            std::unique_ptr<device_buffer> part;
            a.x = dx.f(); a.w = dw.f(); a.bias = db.f(); a.y = dy.f();
            if (k::conv2d_split(a)) {
                part = std::make_unique<device_buffer>(*d, size_t(a.k_splits) * out_n * 4);
                a.partial = part->f();
            }
            layer_runner r(*d);
            const auto run = [&] {
                if (!k::conv2d_split(a)) return r.launch(k::conv2d_kernel, a, k::conv2d_grid(a));
                k::conv2d_args p = a;
                p.split_phase = 1;
                r.launch(k::conv2d_kernel, p, k::conv2d_grid(p));
                p.split_phase = 2;
                r.launch(k::conv2d_kernel, p, k::conv2d_grid(p));
            };
            const double us = r.time_us(run, iterations);
            const auto out = dy.read();
            if (v == "v1") {
                v1_out = out;
                v1_us = us;
            } else {
                const double dev = deviation(out, v1_out), tol = (v == "f16" || v == "bf16") ? 5e-2 : 1e-4;
                if (!(dev <= tol)) {
                    std::printf("conv_bench: %s.%s batch %lld %s deviates from v1 by %.3g of the largest output\n",
                                model.c_str(), l->name, (long long)batch, v.c_str(), dev);
                    ok = false;
                }
                sum.add(v, v1_us, us);
            }
            std::printf("layer=%s.%s batch=%lld variant=%s us=%.1f tflops=%.2f blocks=%lld splits=%d\n", model.c_str(),
                        l->name, (long long)batch, v.c_str(), us, flops / us / 1e6,
                        (long long)k::conv2d_grid(a) * std::max(1, int(a.k_splits)), std::max(1, int(a.k_splits)));
        }
    }
}

// BERT-base's GEMMs at one batch size: v1 and the plan's tiles.
void bench::gemms(int64_t batch) {
    for (const auto& l : bert) {
        k::gemm_args g{};
        g.batch = 1; g.m = batch * l.m_per_image; g.n = l.n; g.k = l.k;
        if (tiny) {
            g.m = batch * 16;
            g.n = l.n / 8;
            g.k = l.k / 8;
        }
        g.lda = g.k; g.ldb = g.n; g.ldc = g.n; g.alpha = 1; g.bias_mode = k::bias_kind::per_col; g.beta = 1;
        g.ep.act = k::activation::gelu_erf;
        const auto a_h = random_floats(size_t(g.m * g.k), 4), b_h = random_floats(size_t(g.k * g.n), 5);
        const auto bias_h = random_floats(size_t(g.n), 6);
        const double flops = 2.0 * double(g.m * g.n * g.k);
        std::vector<float> v1_out;
        double v1_us = 0;
        for (const std::string v : {"v1", "plan"}) {
            k::gemm_args h = g;
            ml::use_gpu_tiles(h, units);
            if (v == "v1") {
                h.tile_m = int32_t(std::min<int64_t>(h.m, 64));
                h.tile_n = int32_t(std::min<int64_t>(h.n, 64));
            }
            device_buffer da(*fp32, a_h), dbm(*fp32, b_h), dbias(*fp32, bias_h), dc(*fp32, size_t(g.m * g.n) * 4);
            h.a = da.f(); h.b = dbm.f(); h.bias = dbias.f(); h.c = dc.f();
            layer_runner r(*fp32);
            const double us = r.time_us([&] { r.launch(k::gemm_kernel, h, k::gemm_grid(h)); }, iterations);
            const auto out = dc.read();
            if (v == "v1") {
                v1_out = out;
                v1_us = us;
            } else {
                if (!(deviation(out, v1_out) <= 1e-4)) {
                    std::printf("conv_bench: bert.%s batch %lld plan deviates from v1\n", l.name, (long long)batch);
                    ok = false;
                }
                sum.add("gemm_plan", v1_us, us);
            }
            std::printf("layer=bert.%s batch=%lld variant=%s us=%.1f tflops=%.2f blocks=%lld splits=1\n", l.name,
                        (long long)batch, v.c_str(), us, flops / us / 1e6, (long long)k::gemm_grid(h));
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"conv_bench: ResNet-50 / VGG-19 convolutions and BERT-base GEMMs per kernel variant"};
    std::vector<int64_t> batches = {1, 8};
    std::vector<std::string> models = {"resnet50", "vgg19", "bert"};
    int iterations = 20;
    bool tensor_cores = true;
    app.add_option("--batches", batches, "batch sizes")->delimiter(',');
    app.add_option("--models", models, "resnet50, vgg19, bert")->delimiter(',');
    app.add_option("--iterations", iterations, "timed runs per layer and variant")->capture_default_str();
    app.add_flag("!--no-tensor-cores", tensor_cores, "leave out the f16/bf16 variants");
    uint32_t plan_units = 0;
    app.add_option("--units", plan_units, "plan for this many compute units (default: the device's)");
    bool tiny = false;
    app.add_flag("--tiny", tiny,
                 "layers an eighth as wide on planes of at most 14x14, BERT rows of 16 tokens (the SIMT "
                 "emulation: correctness of every variant, no speed)");
    CLI11_PARSE(app, argc, argv);

    std::unique_ptr<gpu::device> fp32, f16, bf16;
    try {
        fp32 = gpu::make_gpu_device({});
        if (tensor_cores && k::gpu_has_tensor_cores()) {
            gpu::gpu_device_options o;
            o.math = gpu::gpu_math::tensor_f16;
            f16 = gpu::make_gpu_device(o);
            o.math = gpu::gpu_math::tensor_bf16;
            bf16 = gpu::make_gpu_device(o);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "conv_bench: no GPU: %s\n", e.what());
        return 77;
    }
    const uint32_t units = plan_units ? plan_units : fp32->caps().compute_units;
    std::printf("conv_bench: %s, planned for %u units, %d iterations a variant%s\n", fp32->caps().name.c_str(), units,
                iterations, tiny ? ", tiny layers" : "");
    bench b{fp32.get(), f16.get(), bf16.get(), units, iterations, tiny, models, {}};
    for (const int64_t batch : batches) {
        b.convs(batch);
        if (b.wants("bert")) b.gemms(batch);
    }
    std::printf("conv_bench:");
    for (const char* v : {"plan", "span", "wide", "gemm_plan", "f16", "bf16"}) {
        const double g = b.sum.geomean(v);
        if (g > 0) std::printf(" %s_vs_v1=%.3f", v, g);
        else std::printf(" %s_vs_v1=n/a", v);
    }
    std::printf("\n");
    return b.ok ? 0 : 1;
}
