#include "libml/kernels/cpu_onednn.h"

#include <cblas.h>

#include <atomic>

#include "libml/kernels/kernels.h"

#if REEFLINE_HAVE_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#endif

namespace reefline::ml::kernels {

namespace {

std::atomic<bool> openblas_only_flag{false};

void openblas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n),
                int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

}  // namespace

void use_openblas_only(bool on) { openblas_only_flag = on; }
bool openblas_only() { return openblas_only_flag.load(std::memory_order_relaxed); }

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if REEFLINE_HAVE_DNNL
    if (!openblas_only()) {
        // Each compute unit is one thread, and oneDNN must not fan out from it: this build of
        // oneDNN runs on OpenMP, whose default team is every core. The setting is per thread.
        thread_local const bool one_thread = (omp_set_num_threads(1), true);
        (void)one_thread;
        const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
        // oneDNN takes a last single column of C (n = 16j + 1) at a fraction of its speed:
        // 512 x 49 x 4608 (a 7x7 plane) ran at 87 GMAC/s whole and 108 as 48 columns then one,
        // 192 x 289 x 768 (17x17) at 115 and 121. No other remainder showed such a step (n =
        // 50..63 within 2% either way). The split is the same on every call, so a block's
        // results do not change between runs or after a preemption.
        if (n > 16 && n % 16 == 1) {
            const int64_t n0 = n - 1;
            if (dnnl_sgemm(ta, tb, m, n0, k, alpha, a, lda, b, ldb, beta, c, ldc) == dnnl_success) {
                const float* b_last = trans_b ? b + n0 * ldb : b + n0;
                if (dnnl_sgemm(ta, tb, m, 1, k, alpha, a, lda, b_last, ldb, beta, c + n0, ldc) != dnnl_success)
                    openblas_sgemm(trans_a, trans_b, m, 1, k, alpha, a, lda, b_last, ldb, beta, c + n0, ldc);
                return;
            }
        } else if (dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == dnnl_success) {
            return;
        }
    }
#endif
    openblas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

std::string cpu_gemm_library() {
    const std::string openblas = "OpenBLAS's " + cpu_blas_kernels() + " kernels";
#if REEFLINE_HAVE_DNNL
    if (openblas_only()) return openblas + " (oneDNN turned off)";
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#else
    return openblas + " (built without oneDNN)";
#endif
}

}  // namespace reefline::ml::kernels
