// Mixture of experts: top-k routing with a softmax over the selected logits, and the experts'
// SwiGLU MLPs combined with the gates.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One expert's forward on one token, kept in double for the backward:
// hin = W_in[e] x ([a | b], 2*inner), u = silu(a) * b (inner), o = W_out[e] u (hidden).
// With `kept_hin` (the forward's hin, stored in T) hin is read from there instead.
template <typename T>
void expert_forward(std::vector<double>& hin, std::vector<double>& u, std::vector<double>& o,
                    const T* x, const T* w_in_e, const T* w_out_e, int64_t hidden, int64_t inner,
                    const T* kept_hin = nullptr) {
  if (kept_hin != nullptr) {
    std::copy(kept_hin, kept_hin + 2 * inner, hin.begin());
  } else {
    for (int64_t r = 0; r < 2 * inner; r++) {
      double acc = 0.0;
      for (int64_t c = 0; c < hidden; c++) {
        acc += static_cast<double>(w_in_e[r * hidden + c]) * static_cast<double>(x[c]);
      }
      hin[r] = acc;
    }
  }
  for (int64_t i = 0; i < inner; i++) u[i] = hin[i] * sigmoid(hin[i]) * hin[inner + i];
  for (int64_t r = 0; r < hidden; r++) {
    double acc = 0.0;
    for (int64_t i = 0; i < inner; i++) acc += static_cast<double>(w_out_e[r * inner + i]) * u[i];
    o[r] = acc;
  }
}

}  // namespace

template <typename T>
void selected_softmax_forward(T* gates, const int32_t* indices, const T* logits, int64_t tokens,
                              int64_t experts, int64_t k) {
  for (int64_t t = 0; t < tokens; t++) {
    const T* row = logits + t * experts;
    const int32_t* chosen = indices + t * k;
    // Subtract the largest selected logit before exp().
    double max_logit = static_cast<double>(row[chosen[0]]);
    for (int64_t j = 1; j < k; j++) max_logit = std::max(max_logit, double{row[chosen[j]]});
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++)
      sum += std::exp(static_cast<double>(row[chosen[j]]) - max_logit);
    for (int64_t j = 0; j < k; j++) {
      gates[t * k + j] =
          static_cast<T>(std::exp(static_cast<double>(row[chosen[j]]) - max_logit) / sum);
    }
  }
}

template <typename T>
void topk_softmax_forward(T* gates, int32_t* indices, const T* logits, int64_t tokens,
                          int64_t experts, int64_t k) {
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; t++) {
    const T* row = logits + t * experts;
    std::iota(order.begin(), order.end(), 0);
    // Stable sort by descending logit: equal logits keep ascending expert order.
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    std::copy_n(order.begin(), k, indices + t * k);
  }
  selected_softmax_forward(gates, indices, logits, tokens, experts, k);
}

// Softmax backward on the selected entries: dl_j = g_j (dg_j - sum_i g_i dg_i).
template <typename T>
void topk_softmax_backward(T* dlogits, const T* dgates, const T* gates, const int32_t* indices,
                           int64_t tokens, int64_t experts, int64_t k) {
  std::fill(dlogits, dlogits + tokens * experts, T(0));
  for (int64_t t = 0; t < tokens; t++) {
    double dot = 0.0;
    for (int64_t j = 0; j < k; j++) {
      dot += static_cast<double>(gates[t * k + j]) * static_cast<double>(dgates[t * k + j]);
    }
    for (int64_t j = 0; j < k; j++) {
      const double g = static_cast<double>(gates[t * k + j]);
      dlogits[t * experts + indices[t * k + j]] =
          static_cast<T>(g * (static_cast<double>(dgates[t * k + j]) - dot));
    }
  }
}

template <typename T>
void moe_experts_forward(T* out, const T* x, const T* gates, const int32_t* indices, const T* w_in,
                         const T* w_out, int64_t tokens, int64_t hidden, int64_t inner,
                         int64_t experts, int64_t k, Threads threads, T* kept_h) {
  parallel_for(threads, tokens, /*min_items=*/8, /*align=*/1, [&](int64_t begin, int64_t end) {
    std::vector<double> hin(2 * inner), u(inner), o(hidden), acc(hidden);
    for (int64_t t = begin; t < end; t++) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < k; j++) {
        const int64_t e = indices[t * k + j];
        if (e < 0 || e >= experts) continue;  // no expert: contributes nothing (as on the GPU)
        expert_forward(hin, u, o, x + t * hidden, w_in + e * 2 * inner * hidden,
                       w_out + e * hidden * inner, hidden, inner);
        if (kept_h != nullptr) {
          T* kept = kept_h + (t * k + j) * 2 * inner;
          for (int64_t r = 0; r < 2 * inner; r++) kept[r] = static_cast<T>(hin[r]);
        }
        const double gate = static_cast<double>(gates[t * k + j]);
        for (int64_t r = 0; r < hidden; r++) acc[r] += gate * o[r];
      }
      for (int64_t r = 0; r < hidden; r++) out[t * hidden + r] = static_cast<T>(acc[r]);
    }
  });
}

// In two passes. Expert by expert (split over threads; one expert's weight gradients fit in a
// double buffer, all experts' would not at real sizes): each of its slots' forward again, dgates,
// dW_out, the SwiGLU backward dhin (kept per slot) and dW_in, over the tokens in order. Then token
// by token (split over threads): dx = W_in^T dhin summed in double over the token's experts in
// expert order, the order one expert-by-expert walk would add them in.
template <typename T>
void moe_experts_backward(T* dx, T* dgates, T* dw_in, T* dw_out, const T* dout, const T* x,
                          const T* gates, const int32_t* indices, const T* w_in, const T* w_out,
                          int64_t tokens, int64_t hidden, int64_t inner, int64_t experts, int64_t k,
                          Threads threads, const T* kept_h) {
  std::fill(dgates, dgates + tokens * k, T(0));  // stays 0 for a slot without an expert
  std::vector<double> dhin_of_slot(tokens * k * 2 * inner, 0.0);
  parallel_for(threads, experts, /*min_items=*/1, /*align=*/1, [&](int64_t begin, int64_t end) {
    std::vector<double> dw_in_e(2 * inner * hidden), dw_out_e(hidden * inner);
    std::vector<double> hin(2 * inner), u(inner), o(hidden), du(inner);
    for (int64_t e = begin; e < end; e++) {
      const T* w_in_e = w_in + e * 2 * inner * hidden;
      const T* w_out_e = w_out + e * hidden * inner;
      std::fill(dw_in_e.begin(), dw_in_e.end(), 0.0);
      std::fill(dw_out_e.begin(), dw_out_e.end(), 0.0);
      for (int64_t t = 0; t < tokens; t++) {
        for (int64_t j = 0; j < k; j++) {
          if (indices[t * k + j] != e) continue;
          const T* xt = x + t * hidden;
          const T* gt = dout + t * hidden;
          expert_forward(hin, u, o, xt, w_in_e, w_out_e, hidden, inner,
                         kept_h == nullptr ? nullptr : kept_h + (t * k + j) * 2 * inner);
          const double gate = static_cast<double>(gates[t * k + j]);

          double dgate = 0.0;
          for (int64_t r = 0; r < hidden; r++) dgate += static_cast<double>(gt[r]) * o[r];
          dgates[t * k + j] = static_cast<T>(dgate);

          // Through W_out: du = gate W_out^T dout, dW_out += gate dout u^T.
          std::fill(du.begin(), du.end(), 0.0);
          for (int64_t r = 0; r < hidden; r++) {
            const double g = gate * static_cast<double>(gt[r]);
            for (int64_t i = 0; i < inner; i++) {
              du[i] += g * static_cast<double>(w_out_e[r * inner + i]);
              dw_out_e[r * inner + i] += g * u[i];
            }
          }
          // Through SwiGLU: u = silu(a) b.
          double* dhin = dhin_of_slot.data() + (t * k + j) * 2 * inner;
          for (int64_t i = 0; i < inner; i++) {
            const double a = hin[i], bb = hin[inner + i], s = sigmoid(a);
            dhin[i] = du[i] * bb * s * (1.0 + a * (1.0 - s));
            dhin[inner + i] = du[i] * a * s;
          }
          // dW_in += dhin x^T.
          for (int64_t r = 0; r < 2 * inner; r++) {
            for (int64_t c = 0; c < hidden; c++) {
              dw_in_e[r * hidden + c] += dhin[r] * static_cast<double>(xt[c]);
            }
          }
        }
      }
      for (size_t i = 0; i < dw_in_e.size(); i++)
        dw_in[e * 2 * inner * hidden + i] = static_cast<T>(dw_in_e[i]);
      for (size_t i = 0; i < dw_out_e.size(); i++)
        dw_out[e * hidden * inner + i] = static_cast<T>(dw_out_e[i]);
    }
  });
  // dx = sum over the token's slots, by expert then slot, of W_in[e]^T dhin.
  parallel_for(threads, tokens, /*min_items=*/8, /*align=*/1, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(hidden);
    std::vector<int64_t> order(k);
    for (int64_t t = begin; t < end; t++) {
      std::fill(acc.begin(), acc.end(), 0.0);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
        return indices[t * k + p] < indices[t * k + q];
      });
      for (int64_t j : order) {
        const int64_t e = indices[t * k + j];
        if (e < 0 || e >= experts) continue;
        const T* w_in_e = w_in + e * 2 * inner * hidden;
        const double* dhin = dhin_of_slot.data() + (t * k + j) * 2 * inner;
        for (int64_t r = 0; r < 2 * inner; r++) {
          for (int64_t c = 0; c < hidden; c++) {
            acc[c] += dhin[r] * static_cast<double>(w_in_e[r * hidden + c]);
          }
        }
      }
      for (int64_t c = 0; c < hidden; c++) dx[t * hidden + c] = static_cast<T>(acc[c]);
    }
  });
}

#define HCP_INSTANTIATE(T)                                                                         \
  template void topk_softmax_forward<T>(T*, int32_t*, const T*, int64_t, int64_t, int64_t);        \
  template void selected_softmax_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t,        \
                                            int64_t);                                              \
  template void topk_softmax_backward<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, \
                                         int64_t);                                                 \
  template void moe_experts_forward<T>(T*, const T*, const T*, const int32_t*, const T*, const T*, \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, Threads, T*);  \
  template void moe_experts_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,              \
                                        const int32_t*, const T*, const T*, int64_t, int64_t,      \
                                        int64_t, int64_t, int64_t, Threads, const T*);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
