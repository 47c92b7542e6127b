// RMSNorm and Mamba2's gated RMSNorm (gate applied before the norm).
#include <cmath>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// One row's RMSNorm backward given its input u, rstd r and upstream gradient dy:
//   y_i = u_i r w_i,  r = (mean(u^2) + eps)^(-1/2),  dr/du_i = -r^3 u_i / dim
//   du_i = r (dy_i w_i - u_i r^2 mean_j(dy_j w_j u_j)).
// dw contributions are added to dw_acc (double, summed over rows by the caller).
template <typename T>
void rms_row_backward(double* du, double* dw_acc, const T* dy, const double* u, const T* w,
                      double r, int64_t dim) {
  double dot = 0.0;
  for (int64_t c = 0; c < dim; c++) {
    dot += static_cast<double>(dy[c]) * static_cast<double>(w[c]) * u[c];
  }
  double mean_dot = dot / static_cast<double>(dim);
  for (int64_t c = 0; c < dim; c++) {
    du[c] = r * (static_cast<double>(dy[c]) * static_cast<double>(w[c]) - u[c] * r * r * mean_dot);
    dw_acc[c] += static_cast<double>(dy[c]) * u[c] * r;
  }
}

template <typename T>
double inverse_rms(const double* u, int64_t dim, T eps) {
  double sum_sq = 0.0;
  for (int64_t c = 0; c < dim; c++) sum_sq += u[c] * u[c];
  return 1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + static_cast<double>(eps));
}

}  // namespace

template <typename T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t dim, T eps) {
  std::vector<double> u(dim);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < dim; c++) u[c] = static_cast<double>(x[r * dim + c]);
    // Round rstd to T first so forward and backward (which reads the saved T value) agree.
    T rs = static_cast<T>(inverse_rms(u.data(), dim, eps));
    rstd[r] = rs;
    for (int64_t c = 0; c < dim; c++) y[r * dim + c] = x[r * dim + c] * rs * w[c];
  }
}

template <typename T>
void rms_norm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                       int64_t rows, int64_t dim) {
  std::vector<double> u(dim), du(dim), dw_acc(dim, 0.0);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < dim; c++) u[c] = static_cast<double>(x[r * dim + c]);
    rms_row_backward(du.data(), dw_acc.data(), dy + r * dim, u.data(), w,
                     static_cast<double>(rstd[r]), dim);
    for (int64_t c = 0; c < dim; c++) dx[r * dim + c] = static_cast<T>(du[c]);
  }
  for (int64_t c = 0; c < dim; c++) dw[c] = static_cast<T>(dw_acc[c]);
}

template <typename T>
void gated_rms_norm_forward(T* out, T* rstd, const T* y, const T* z, const T* w, int64_t rows,
                            int64_t dim, T eps) {
  std::vector<double> u(dim);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < dim; c++) {
      T zc = z[r * dim + c];
      u[c] = static_cast<double>(y[r * dim + c] * zc * sigmoid(zc));
    }
    T rs = static_cast<T>(inverse_rms(u.data(), dim, eps));
    rstd[r] = rs;
    for (int64_t c = 0; c < dim; c++) {
      out[r * dim + c] = static_cast<T>(u[c] * static_cast<double>(rs) * static_cast<double>(w[c]));
    }
  }
}

template <typename T>
void gated_rms_norm_backward(T* dy, T* dz, T* dw, const T* dout, const T* y, const T* z, const T* w,
                             const T* rstd, int64_t rows, int64_t dim) {
  std::vector<double> u(dim), du(dim), dw_acc(dim, 0.0);
  for (int64_t r = 0; r < rows; r++) {
    // Recompute the gated input u = y * silu(z) rather than saving it.
    for (int64_t c = 0; c < dim; c++) {
      T zc = z[r * dim + c];
      u[c] = static_cast<double>(y[r * dim + c] * zc * sigmoid(zc));
    }
    rms_row_backward(du.data(), dw_acc.data(), dout + r * dim, u.data(), w,
                     static_cast<double>(rstd[r]), dim);
    for (int64_t c = 0; c < dim; c++) {
      double zc = static_cast<double>(z[r * dim + c]);
      double s = 1.0 / (1.0 + std::exp(-zc));
      double silu = zc * s;
      double dsilu = s * (1.0 + zc * (1.0 - s));
      dy[r * dim + c] = static_cast<T>(du[c] * silu);
      dz[r * dim + c] = static_cast<T>(du[c] * static_cast<double>(y[r * dim + c]) * dsilu);
    }
  }
  for (int64_t c = 0; c < dim; c++) dw[c] = static_cast<T>(dw_acc[c]);
}

#define HCP_INSTANTIATE(T)                                                                        \
  template void rms_norm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T);             \
  template void rms_norm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t,     \
                                     int64_t);                                                    \
  template void gated_rms_norm_forward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                          T);                                                     \
  template void gated_rms_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,    \
                                           const T*, int64_t, int64_t);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
