// Row passes of the cpu kernel library shared between its files (cpu_rows.cc).
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace reefline::ml::kernels {

// Whether this CPU runs AVX-512F: the row passes' vector paths are chosen by it at run time.
bool cpu_has_avx512();
#if defined(__x86_64__) && defined(__GNUC__)
// The first k of a vector's 16 lanes (none below 0, all from 16): the mask of a partial vector.
inline __mmask16 first_lanes(int64_t k) { return __mmask16(k >= 16 ? 0xffff : (1u << (k > 0 ? k : 0)) - 1); }
#endif
// o[i] = in[2 * i] for i < n.
void copy_stride2(float* o, const float* in, int64_t n);
// acc[j] += w * x[j] for j < n.
void axpy_row(float* __restrict acc, const float* __restrict x, float w, int64_t n);

}  // namespace reefline::ml::kernels
