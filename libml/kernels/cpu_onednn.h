// The cpu blocks' GEMM: oneDNN's sgemm where this build has it, OpenBLAS's otherwise.
//
// Measured on this project's AVX-512 VM (docs/PERF.md, "GEMM libraries compared"), one thread:
// oneDNN's sgemm runs the convolution and transformer shapes 1.04-1.2x faster than OpenBLAS's
// best kernels, and 1.2-1.4x on planes of few pixels (ResNet-50's 7x7 layers). Weights packed
// once at plan time for oneDNN's matmul were tried too and measured no faster in the model:
// what they saved, the transpose they need into NCHW cost again.
#pragma once

#include <cstdint>
#include <string>

namespace reefline::ml::kernels {

// C = alpha * op(A) op(B) + beta * C, row major, on the calling thread only.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Every GEMM through OpenBLAS (true) or through oneDNN where built with it (false, the
// default): for side-by-side measurements (reefrun --gemm, libml_vs_ort --gemm).
void use_openblas_only(bool on);
bool openblas_only();

// What sgemm runs, for logs: "oneDNN 2.6.3", or "OpenBLAS's <kernel set> kernels (why)".
std::string cpu_gemm_library();

}  // namespace reefline::ml::kernels
