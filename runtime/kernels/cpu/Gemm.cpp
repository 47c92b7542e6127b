// Matrix product, the one op every linear layer and its backward lowers to.
//
// Each element of C is one double accumulator summing a[i,p] * b[p,j] for p = 0, 1, ..., k-1 in
// that order, whatever the blocking: the result depends on the element's row of op(A) and column
// of op(B) only, never on m, n or where the element falls in a block (context-parallel splits
// change m and must not change a row's value). For speed the work goes in blocks of kRows x
// kCols outputs: the block's slices of op(A) and op(B) are copied into contiguous panels, so the
// inner loop streams one row of B's panel into kCols accumulators that stay in cache. Threads
// take contiguous runs of blocks of rows (each packing its own panels).
#include <algorithm>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

constexpr int64_t kRows = 4, kCols = 64;
// A thread's share is worth its start (tens of microseconds) from this many multiply-adds.
constexpr int64_t kMinThreadWork = int64_t{1} << 22;

// Rows [row_begin, row_end) of C.
template <typename T>
void gemm_rows(bool trans_a, bool trans_b, int64_t row_begin, int64_t row_end, int64_t n, int64_t k,
               T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
               int64_t ldc) {
  std::vector<T> b_panel(static_cast<size_t>(k * kCols)), a_panel(static_cast<size_t>(k * kRows));
  double acc[kRows][kCols];
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t cols = std::min(kCols, n - j0);
    for (int64_t p = 0; p < k; p++) {  // b_panel[p][jj] = op(B)[p, j0 + jj]
      for (int64_t jj = 0; jj < cols; jj++) {
        b_panel[p * kCols + jj] = trans_b ? b[(j0 + jj) * ldb + p] : b[p * ldb + j0 + jj];
      }
    }
    for (int64_t i0 = row_begin; i0 < row_end; i0 += kRows) {
      const int64_t rows = std::min(kRows, row_end - i0);
      for (int64_t p = 0; p < k; p++) {  // a_panel[p][ii] = op(A)[i0 + ii, p]
        for (int64_t ii = 0; ii < rows; ii++) {
          a_panel[p * kRows + ii] = trans_a ? a[p * lda + i0 + ii] : a[(i0 + ii) * lda + p];
        }
      }
      for (int64_t ii = 0; ii < rows; ii++) std::fill(acc[ii], acc[ii] + cols, 0.0);
      for (int64_t p = 0; p < k; p++) {
        const T* b_row = &b_panel[p * kCols];
        for (int64_t ii = 0; ii < rows; ii++) {
          const double a_ip = static_cast<double>(a_panel[p * kRows + ii]);
          double* acc_row = acc[ii];
          for (int64_t jj = 0; jj < cols; jj++)
            acc_row[jj] += a_ip * static_cast<double>(b_row[jj]);
        }
      }
      for (int64_t ii = 0; ii < rows; ii++) {
        T* c_row = c + (i0 + ii) * ldc + j0;
        for (int64_t jj = 0; jj < cols; jj++) {
          double result = static_cast<double>(alpha) * acc[ii][jj];
          // beta == 0 must not read C: it may be uninitialised (and NaN * 0 is NaN).
          if (beta != T(0)) result += static_cast<double>(beta) * static_cast<double>(c_row[jj]);
          c_row[jj] = static_cast<T>(result);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, Threads threads) {
  const int64_t min_rows = kMinThreadWork / std::max<int64_t>(1, n * k) + 1;
  parallel_for(threads, m, min_rows, kRows, [&](int64_t begin, int64_t end) {
    gemm_rows(trans_a, trans_b, begin, end, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t, Threads);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t, Threads);

}  // namespace hcp::cpu
