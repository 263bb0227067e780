// blas_compare: single-threaded sgemm of the GEMM libraries the cpu device could hand its
// tiles to, on the shapes its convolutions and BERT's linears give them (C[M x N] = W[M x K] *
// cols[K x N], row major): OpenBLAS (what the cpu device links), BLIS and oneDNN. Each is
// loaded with dlopen (RTLD_DEEPBIND, as each exports its own cblas_sgemm), so the libraries
// that are not installed are reported and skipped:
//
//   apt-get install libblis4-serial libdnnl2 && build/bench/blas_compare
//
// Prints GFLOPS per shape (median of 15 timed calls after one warm-up) and a last line
// `openblas_gflops=A blis_gflops=B onednn_gflops=C` (geometric means over the shapes; 0 for a
// library not installed). OpenBLAS honours OPENBLAS_CORETYPE from the environment; the
// header says which kernel set it runs.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using cblas_sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                                int);
using dnnl_sgemm_fn = int (*)(char, char, long, long, long, float, const float*, long, const float*, long, float, float*,
                              long);

struct shape {
    int m, n, k;
    const char* what;
};

constexpr int kRowMajor = 101, kNoTrans = 111;  // CBLAS's enum values

void* open_library(const char* file) { return dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND); }

}  // namespace

int main() {
    // Every library on one thread, as a compute unit calls it.
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("BLIS_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void* openblas = open_library("libopenblas.so.0");
    void* blis = open_library("libblis.so.4");
    void* onednn = open_library("libdnnl.so.2");
    const auto openblas_sgemm = openblas ? reinterpret_cast<cblas_sgemm_fn>(dlsym(openblas, "cblas_sgemm")) : nullptr;
    const auto blis_sgemm = blis ? reinterpret_cast<cblas_sgemm_fn>(dlsym(blis, "cblas_sgemm")) : nullptr;
    const auto onednn_sgemm = onednn ? reinterpret_cast<dnnl_sgemm_fn>(dlsym(onednn, "dnnl_sgemm")) : nullptr;
    const auto corename =
        openblas ? reinterpret_cast<const char* (*)()>(dlsym(openblas, "openblas_get_corename")) : nullptr;
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    std::printf("OpenBLAS: %s%s%s; BLIS: %s; oneDNN: %s\n", corename ? corename() : "not installed",
                coretype ? ", as OPENBLAS_CORETYPE=" : "", coretype ? coretype : "",
                blis_sgemm ? "libblis.so.4" : "not installed (libblis4-serial)",
                onednn_sgemm ? "libdnnl.so.2" : "not installed (libdnnl2)");
    const shape shapes[] = {{64, 3136, 576, "ResNet-50 3x3, 64 ch, 56x56"},   {128, 784, 1152, "3x3, 128 ch, 28x28"},
                            {256, 196, 2304, "3x3, 256 ch, 14x14"},         {512, 49, 4608, "3x3, 512 ch, 7x7"},
                            {64, 3136, 64, "1x1 64 -> 64, 56x56"},          {256, 3136, 64, "1x1 64 -> 256, 56x56"},
                            {1024, 196, 256, "1x1 256 -> 1024, 14x14"},     {2048, 49, 512, "1x1 512 -> 2048, 7x7"},
                            {768, 128, 768, "BERT-base linear, L = 128"},    {3072, 128, 768, "BERT-base FFN up, L = 128"}};
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    std::printf("\n%-28s %16s %9s %9s %9s\n", "shape", "M x N x K", "OpenBLAS", "BLIS", "oneDNN");
    double log_sum[3] = {0, 0, 0};
    for (const shape& s : shapes) {
        std::vector<float> a(size_t(s.m) * size_t(s.k)), b(size_t(s.k) * size_t(s.n)), c(size_t(s.m) * size_t(s.n));
        for (float& x : a) x = normal(rng);
        for (float& x : b) x = normal(rng);
        double gflops[3] = {0, 0, 0};
        for (int lib = 0; lib < 3; ++lib) {
            if ((lib == 0 && !openblas_sgemm) || (lib == 1 && !blis_sgemm) || (lib == 2 && !onednn_sgemm)) continue;
            std::vector<double> seconds;
            for (int r = 0; r < 16; ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                if (lib == 2)
                    onednn_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, 0.0f, c.data(), s.n);
                else
                    (lib == 0 ? openblas_sgemm : blis_sgemm)(kRowMajor, kNoTrans, kNoTrans, s.m, s.n, s.k, 1.0f, a.data(),
                                                             s.k, b.data(), s.n, 0.0f, c.data(), s.n);
                if (r) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(seconds.begin(), seconds.end());
            gflops[lib] = 2.0 * s.m * s.n * s.k / seconds[seconds.size() / 2] / 1e9;
            log_sum[lib] += std::log(gflops[lib]);
        }
        char dims[32];
        std::snprintf(dims, sizeof dims, "%dx%dx%d", s.m, s.n, s.k);
        std::printf("%-28s %16s %9.1f %9.1f %9.1f\n", s.what, dims, gflops[0], gflops[1], gflops[2]);
    }
    const double n = double(std::size(shapes));
    std::printf("openblas_gflops=%.1f blis_gflops=%.1f onednn_gflops=%.1f\n", openblas_sgemm ? std::exp(log_sum[0] / n) : 0.0,
                blis_sgemm ? std::exp(log_sum[1] / n) : 0.0, onednn_sgemm ? std::exp(log_sum[2] / n) : 0.0);
    return openblas_sgemm ? 0 : 1;
}
