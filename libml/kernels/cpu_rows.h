// Row passes of the cpu kernel library shared between its files (cpu_rows.cc).
#pragma once

#include <cstdint>

namespace reefline::ml::kernels {

// Whether this CPU runs AVX-512F: the row passes' vector paths are chosen by it at run time.
bool cpu_has_avx512();
// o[i] = in[2 * i] for i < n.
void copy_stride2(float* o, const float* in, int64_t n);
// acc[j] += w * x[j] for j < n.
void axpy_row(float* __restrict acc, const float* __restrict x, float w, int64_t n);

}  // namespace reefline::ml::kernels
