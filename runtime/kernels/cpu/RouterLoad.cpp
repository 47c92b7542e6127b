// The MoE load-balancing loss: a layer's routing statistics and their combination (Kernels.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

// softmax(row) over `experts` values, in double.
template <typename T>
void Softmax(const T* row, int64_t experts, std::vector<double>& out) {
  double max_logit = static_cast<double>(row[0]);
  for (int64_t e = 1; e < experts; e++)
    max_logit = std::max(max_logit, static_cast<double>(row[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < experts; e++) {
    out[e] = std::exp(static_cast<double>(row[e]) - max_logit);
    sum += out[e];
  }
  for (int64_t e = 0; e < experts; e++) out[e] /= sum;
}

}  // namespace

template <typename T>
absl::Status router_load_forward(T* probs, T* picks, const T* logits, const int32_t* indices,
                                 int64_t tokens, int64_t experts, int64_t k) {
  for (int64_t i = 0; i < tokens * k; i++) {
    if (indices[i] < 0 || indices[i] >= experts) {
      return absl::InvalidArgumentError(
          absl::StrFormat("router_load: expert index %d of token %d, slot %d, is outside [0, %d)",
                          indices[i], i / k, i % k, experts));
    }
  }
  std::vector<double> prob_sum(experts, 0.0), pick_count(experts, 0.0), s(experts);
  for (int64_t t = 0; t < tokens; t++) {
    Softmax(logits + t * experts, experts, s);
    for (int64_t e = 0; e < experts; e++) prob_sum[e] += s[e];
    for (int64_t j = 0; j < k; j++) pick_count[indices[t * k + j]] += 1.0;
  }
  for (int64_t e = 0; e < experts; e++) {
    probs[e] = static_cast<T>(prob_sum[e]);
    picks[e] = static_cast<T>(pick_count[e]);
  }
  return absl::OkStatus();
}

template <typename T>
void router_load_backward(T* dlogits, const T* dprobs, const T* logits, int64_t tokens,
                          int64_t experts) {
  std::vector<double> s(experts);
  for (int64_t t = 0; t < tokens; t++) {
    Softmax(logits + t * experts, experts, s);
    double dot = 0.0;
    for (int64_t e = 0; e < experts; e++) dot += s[e] * static_cast<double>(dprobs[e]);
    for (int64_t e = 0; e < experts; e++) {
      dlogits[t * experts + e] = static_cast<T>(s[e] * (static_cast<double>(dprobs[e]) - dot));
    }
  }
}

template <typename T>
void router_aux_loss_forward(T* loss, const T* probs, const T* picks, int64_t experts, T scale) {
  double sum = 0.0;
  for (int64_t e = 0; e < experts; e++) {
    sum += static_cast<double>(probs[e]) * static_cast<double>(picks[e]);
  }
  loss[0] = static_cast<T>(static_cast<double>(scale) * sum);
}

template <typename T>
void router_aux_loss_backward(T* dprobs, const T* dloss, const T* picks, int64_t experts, T scale) {
  const double factor = static_cast<double>(dloss[0]) * static_cast<double>(scale);
  for (int64_t e = 0; e < experts; e++) dprobs[e] = static_cast<T>(factor * picks[e]);
}

#define HCP_INSTANTIATE(T)                                                                         \
  template absl::Status router_load_forward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, \
                                               int64_t);                                           \
  template void router_load_backward<T>(T*, const T*, const T*, int64_t, int64_t);                 \
  template void router_aux_loss_forward<T>(T*, const T*, const T*, int64_t, T);                    \
  template void router_aux_loss_backward<T>(T*, const T*, const T*, int64_t, T);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
