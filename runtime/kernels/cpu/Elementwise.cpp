// Elementwise ops, broadcasts and column slices.
#include <cmath>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

// 1 / (1 + exp(-x)) is safe at both ends: exp overflows to inf (giving 0) or underflows to 0.
template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// d/dx [x * sigmoid(x)] = s + x s (1 - s) = s (1 + x (1 - s)).
template <typename T>
T silu_grad(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// torch.nn.functional.softplus(beta=1, threshold=20).
constexpr double kSoftplusThreshold = 20.0;

}  // namespace

template <typename T>
void silu_forward(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoid(x[i]);
}

template <typename T>
void silu_backward(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * silu_grad(x[i]);
}

template <typename T>
void softplus_forward(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    y[i] = x[i] > T(kSoftplusThreshold) ? x[i] : std::log1p(std::exp(x[i]));
  }
}

template <typename T>
void softplus_backward(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    dx[i] = x[i] > T(kSoftplusThreshold) ? dy[i] : dy[i] * sigmoid(x[i]);
  }
}

template <typename T>
void add(T* y, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

template <typename T>
void scale(T* y, const T* x, T factor, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * factor;
}

template <typename T>
void neg_exp_forward(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = -std::exp(x[i]);
}

// d(-exp(x))/dx = -exp(x) = y, so the saved output is all the backward needs.
template <typename T>
void neg_exp_backward(T* dx, const T* dy, const T* y, int64_t n) {
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i];
}

template <typename T>
void bias_add_forward(T* y, const T* x, const T* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < cols; c++) y[r * cols + c] = x[r * cols + c] + bias[c];
  }
}

template <typename T>
void column_sum(T* dbias, const T* dy, int64_t rows, int64_t cols) {
  std::vector<double> acc(cols, 0.0);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < cols; c++) acc[c] += static_cast<double>(dy[r * cols + c]);
  }
  for (int64_t c = 0; c < cols; c++) dbias[c] = static_cast<T>(acc[c]);
}

template <typename T>
void slice_columns(T* out, const T* in, int64_t rows, int64_t in_cols, int64_t offset,
                   int64_t width) {
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < width; c++) out[r * width + c] = in[r * in_cols + offset + c];
  }
}

template <typename T>
void slice_columns_backward(T* din, const T* dout, int64_t rows, int64_t in_cols, int64_t offset,
                            int64_t width) {
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < width; c++) din[r * in_cols + offset + c] = dout[r * width + c];
  }
}

template <typename T>
void swiglu_forward(T* y, const T* x, int64_t rows, int64_t inner) {
  for (int64_t r = 0; r < rows; r++) {
    const T* a = x + r * 2 * inner;
    const T* b = a + inner;
    for (int64_t c = 0; c < inner; c++) y[r * inner + c] = a[c] * sigmoid(a[c]) * b[c];
  }
}

template <typename T>
void swiglu_backward(T* dx, const T* dy, const T* x, int64_t rows, int64_t inner) {
  for (int64_t r = 0; r < rows; r++) {
    const T* a = x + r * 2 * inner;
    const T* b = a + inner;
    T* da = dx + r * 2 * inner;
    T* db = da + inner;
    for (int64_t c = 0; c < inner; c++) {
      T g = dy[r * inner + c];
      da[c] = g * b[c] * silu_grad(a[c]);
      db[c] = g * a[c] * sigmoid(a[c]);
    }
  }
}

#define HCP_INSTANTIATE(T)                                                                   \
  template void silu_forward<T>(T*, const T*, int64_t);                                      \
  template void silu_backward<T>(T*, const T*, const T*, int64_t);                           \
  template void softplus_forward<T>(T*, const T*, int64_t);                                  \
  template void softplus_backward<T>(T*, const T*, const T*, int64_t);                       \
  template void add<T>(T*, const T*, const T*, int64_t);                                     \
  template void scale<T>(T*, const T*, T, int64_t);                                          \
  template void neg_exp_forward<T>(T*, const T*, int64_t);                                   \
  template void neg_exp_backward<T>(T*, const T*, const T*, int64_t);                        \
  template void bias_add_forward<T>(T*, const T*, const T*, int64_t, int64_t);               \
  template void column_sum<T>(T*, const T*, int64_t, int64_t);                               \
  template void slice_columns<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);          \
  template void slice_columns_backward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);                           \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
