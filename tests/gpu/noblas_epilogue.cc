// For -Dgpu_core builds without OpenBLAS only: the cpu kernels library is built without
// cpu_gemm_conv.cc there, but cpu_elementwise.cc applies fused activations through
// apply_epilogue, which lives in that file. The same formulas (cpu_gemm_conv.cc: act()), so the
// element-wise references of the GPU tests stay the cpu kernels'.
#include <cmath>

#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {
void apply_epilogue(float* v, int64_t n, const epilogue& ep) {
    for (int64_t i = 0; i < n; ++i) {
        const float x = v[i];
        float y = x;
        switch (ep.act) {
        case activation::none: break;
        case activation::relu: y = x > 0 ? x : 0; break;
        case activation::leaky_relu: y = x >= 0 ? x : ep.alpha * x; break;
        case activation::sigmoid: y = 1.0f / (1.0f + std::exp(-x)); break;
        case activation::tanh: y = std::tanh(x); break;
        case activation::clip: { const float t = x < ep.alpha ? ep.alpha : x; y = t > ep.beta ? ep.beta : t; break; }
        case activation::hard_sigmoid: { const float t = ep.alpha * x + ep.beta; y = t < 0 ? 0 : (t > 1 ? 1 : t); break; }
        case activation::hard_swish: { const float t = x / 6.0f + 0.5f; y = x * (t < 0 ? 0 : (t > 1 ? 1 : t)); break; }
        case activation::gelu_erf: y = 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); break;
        case activation::gelu_tanh: y = 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x))); break;
        }
        v[i] = y;
    }
}
}  // namespace reefline::ml::kernels
