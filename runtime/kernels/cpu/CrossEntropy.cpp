// Cross-entropy over the vocabulary with an ignore index. The loss is a SUM over valid rows plus
// the count, so the caller can divide by the global count of valid tokens (over ranks and
// micro-batches), not a per-call mean.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {

template <typename T>
absl::Status cross_entropy_forward(T* loss_sum, T* valid_count, T* lse, const T* logits,
                                   const int32_t* targets, int64_t tokens, int64_t vocab,
                                   int64_t ignore_index) {
  // Validate everything first so a bad target leaves the outputs untouched.
  for (int64_t t = 0; t < tokens; t++) {
    if (targets[t] != ignore_index && (targets[t] < 0 || targets[t] >= vocab)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cross_entropy: target %d at position %d is neither the ignore index %d nor in "
          "[0, %d)",
          targets[t], t, ignore_index, vocab));
    }
  }
  double loss = 0.0, count = 0.0;
  for (int64_t t = 0; t < tokens; t++) {
    const T* row = logits + t * vocab;
    // Max subtraction keeps exp() in range; lse is kept for every row, ignored ones too.
    double max_logit = static_cast<double>(row[0]);
    for (int64_t v = 1; v < vocab; v++)
      max_logit = std::max(max_logit, static_cast<double>(row[v]));
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; v++) sum += std::exp(static_cast<double>(row[v]) - max_logit);
    const double row_lse = max_logit + std::log(sum);
    lse[t] = static_cast<T>(row_lse);
    if (targets[t] == ignore_index) continue;
    loss += row_lse - static_cast<double>(row[targets[t]]);
    count += 1.0;
  }
  *loss_sum = static_cast<T>(loss);
  *valid_count = static_cast<T>(count);
  return absl::OkStatus();
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* dloss_sum, const T* logits, const T* lse,
                            const int32_t* targets, int64_t tokens, int64_t vocab,
                            int64_t ignore_index) {
  const double scale = static_cast<double>(dloss_sum[0]);
  for (int64_t t = 0; t < tokens; t++) {
    T* grad = dlogits + t * vocab;
    const bool ignored = targets[t] == ignore_index;
    const double row_lse = static_cast<double>(lse[t]);
    for (int64_t v = 0; v < vocab; v++) {
      if (ignored) {
        grad[v] = T(0);
        continue;
      }
      const double prob = std::exp(static_cast<double>(logits[t * vocab + v]) - row_lse);
      const double onehot = v == targets[t] ? 1.0 : 0.0;
      grad[v] = static_cast<T>(scale * (prob - onehot));
    }
  }
}

#define HCP_INSTANTIATE(T)                                                                      \
  template absl::Status cross_entropy_forward<T>(T*, T*, T*, const T*, const int32_t*, int64_t, \
                                                 int64_t, int64_t);                             \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const T*, const int32_t*,     \
                                          int64_t, int64_t, int64_t);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
