// Matrix product, the one op every linear layer and its backward lowers to.
#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; p++) {
        T a_ip = trans_a ? a[p * lda + i] : a[i * lda + p];
        T b_pj = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += static_cast<double>(a_ip) * static_cast<double>(b_pj);
      }
      double result = static_cast<double>(alpha) * acc;
      // beta == 0 must not read C: it may be uninitialised (and NaN * 0 is NaN).
      if (beta != T(0)) result += static_cast<double>(beta) * static_cast<double>(c[i * ldc + j]);
      c[i * ldc + j] = static_cast<T>(result);
    }
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace hcp::cpu
