// Grouped-query attention over one (query block, key block) pair, its backward, and the merge of
// partial results over key blocks (ring attention).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Index arithmetic of the attention layouts for one batch row and query head.
struct AttentionIndex {
  const AttentionShape& s;
  int64_t b, h, kvh;
  AttentionIndex(const AttentionShape& shape, int64_t batch_row, int64_t q_head)
      : s(shape), b(batch_row), h(q_head), kvh(q_head / (shape.q_heads / shape.kv_heads)) {}
  int64_t q(int64_t i) const { return ((b * s.q_len + i) * s.q_heads + h) * s.head_dim; }
  int64_t kv(int64_t j) const { return ((b * s.kv_len + j) * s.kv_heads + kvh) * s.head_dim; }
  int64_t lse(int64_t i) const { return (b * s.q_heads + h) * s.q_len + i; }
};

// Which keys a query row sees: with causal, none after it; with packed documents (q_positions),
// none before its document's start.
struct Visibility {
  bool causal;
  int64_t q_pos0, k_pos0, q_len;
  const int32_t* q_positions;  // [B, Sq] or null
  bool operator()(int64_t b, int64_t i, int64_t j) const {
    if (causal && k_pos0 + j > q_pos0 + i) return false;
    return q_positions == nullptr || k_pos0 + j >= q_pos0 + i - q_positions[b * q_len + i];
  }
};

template <typename T>
double dot(const T* a, const T* b, int64_t n) {
  double acc = 0.0;
  for (int64_t d = 0; d < n; d++) acc += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return acc;
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionShape& shape, T scale, bool causal, int64_t q_pos0,
                       int64_t k_pos0, const int32_t* q_positions) {
  const int64_t D = shape.head_dim;
  const Visibility visible{causal, q_pos0, k_pos0, shape.q_len, q_positions};
  std::vector<double> score(shape.kv_len), acc(D);
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t h = 0; h < shape.q_heads; h++) {
      AttentionIndex ix(shape, b, h);
      for (int64_t i = 0; i < shape.q_len; i++) {
        // Subtract the row max before exp() so the largest term is exp(0) = 1.
        double max_score = kNegInf;
        for (int64_t j = 0; j < shape.kv_len; j++) {
          if (!visible(b, i, j)) continue;
          score[j] = static_cast<double>(scale) * dot(q + ix.q(i), k + ix.kv(j), D);
          max_score = std::max(max_score, score[j]);
        }
        T* o = out + ix.q(i);
        if (max_score == kNegInf) {  // no visible key: an empty partial result
          for (int64_t d = 0; d < D; d++) o[d] = T(0);
          lse[ix.lse(i)] = static_cast<T>(kNegInf);
          continue;
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < shape.kv_len; j++) {
          if (!visible(b, i, j)) continue;
          const double p = std::exp(score[j] - max_score);
          sum += p;
          const T* vj = v + ix.kv(j);
          for (int64_t d = 0; d < D; d++) acc[d] += p * static_cast<double>(vj[d]);
        }
        for (int64_t d = 0; d < D; d++) o[d] = static_cast<T>(acc[d] / sum);
        lse[ix.lse(i)] = static_cast<T>(max_score + std::log(sum));
      }
    }
  }
}

// With P_ij = exp(scale q_i.k_j - lse_i) from the FINAL lse, this block's share of the gradient is
//   dS_ij = P_ij (dout_i . v_j - Delta_i),  Delta_i = dout_i . out_i (final out)
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij dout_i
// Both sides are gathered (one pass per query row, one per key row), so nothing is scattered.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionShape& shape, T scale,
                        bool causal, int64_t q_pos0, int64_t k_pos0, const int32_t* q_positions) {
  const int64_t D = shape.head_dim;
  const Visibility visible{causal, q_pos0, k_pos0, shape.q_len, q_positions};
  const double sc = static_cast<double>(scale);
  std::vector<double> delta(shape.batch * shape.q_heads * shape.q_len);
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t h = 0; h < shape.q_heads; h++) {
      AttentionIndex ix(shape, b, h);
      for (int64_t i = 0; i < shape.q_len; i++) {
        delta[ix.lse(i)] = dot(dout + ix.q(i), out + ix.q(i), D);
      }
    }
  }

  // dS_ij for one visible (i, j), or 0 for a row that saw no key at all (lse = -inf).
  auto grad_score = [&](const AttentionIndex& ix, int64_t i, int64_t j, double* prob) {
    const double row_lse = static_cast<double>(lse[ix.lse(i)]);
    if (row_lse == kNegInf) {
      *prob = 0.0;
      return 0.0;
    }
    *prob = std::exp(sc * dot(q + ix.q(i), k + ix.kv(j), D) - row_lse);
    return *prob * (dot(dout + ix.q(i), v + ix.kv(j), D) - delta[ix.lse(i)]);
  };

  std::vector<double> acc(D), acc_v(D);
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t h = 0; h < shape.q_heads; h++) {
      AttentionIndex ix(shape, b, h);
      for (int64_t i = 0; i < shape.q_len; i++) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < shape.kv_len; j++) {
          if (!visible(b, i, j)) continue;
          double prob;
          const double ds = grad_score(ix, i, j, &prob);
          const T* kj = k + ix.kv(j);
          for (int64_t d = 0; d < D; d++) acc[d] += ds * static_cast<double>(kj[d]);
        }
        for (int64_t d = 0; d < D; d++) dq[ix.q(i) + d] = static_cast<T>(sc * acc[d]);
      }
    }
  }

  const int64_t group = shape.q_heads / shape.kv_heads;
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t kvh = 0; kvh < shape.kv_heads; kvh++) {
      for (int64_t j = 0; j < shape.kv_len; j++) {
        std::fill(acc.begin(), acc.end(), 0.0);
        std::fill(acc_v.begin(), acc_v.end(), 0.0);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
          AttentionIndex ix(shape, b, h);
          for (int64_t i = 0; i < shape.q_len; i++) {
            if (!visible(b, i, j)) continue;
            double prob;
            const double ds = grad_score(ix, i, j, &prob);
            const T* qi = q + ix.q(i);
            const T* gi = dout + ix.q(i);
            for (int64_t d = 0; d < D; d++) {
              acc[d] += ds * static_cast<double>(qi[d]);
              acc_v[d] += prob * static_cast<double>(gi[d]);
            }
          }
        }
        const int64_t base = ((b * shape.kv_len + j) * shape.kv_heads + kvh) * D;
        for (int64_t d = 0; d < D; d++) {
          dk[base + d] = static_cast<T>(sc * acc[d]);
          dv[base + d] = static_cast<T>(acc_v[d]);
        }
      }
    }
  }
}

template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int64_t batch, int64_t seq,
                     int64_t heads, int64_t head_dim) {
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t h = 0; h < heads; h++) {
      for (int64_t s = 0; s < seq; s++) {
        const int64_t li = (b * heads + h) * seq + s;
        T* o = out + ((b * seq + s) * heads + h) * head_dim;
        const T* ob = out_b + ((b * seq + s) * heads + h) * head_dim;
        const double la = static_cast<double>(lse[li]), lb = static_cast<double>(lse_b[li]);
        if (lb == kNegInf) continue;  // b is empty: (out, lse) already is the merge
        if (la == kNegInf) {          // a is empty: the merge is b (avoids exp(-inf - -inf))
          for (int64_t d = 0; d < head_dim; d++) o[d] = ob[d];
          lse[li] = lse_b[li];
          continue;
        }
        // log(exp(la) + exp(lb)) around the larger one, so neither exp() overflows.
        const double m = std::max(la, lb);
        const double l = m + std::log(std::exp(la - m) + std::exp(lb - m));
        const double wa = std::exp(la - l), wb = std::exp(lb - l);
        for (int64_t d = 0; d < head_dim; d++) {
          o[d] = static_cast<T>(wa * static_cast<double>(o[d]) + wb * static_cast<double>(ob[d]));
        }
        lse[li] = static_cast<T>(l);
      }
    }
  }
}

#define HCP_INSTANTIATE(T)                                                                         \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionShape&,  \
                                     T, bool, int64_t, int64_t, const int32_t*);                   \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, const T*, const AttentionShape&, T, bool, int64_t, \
                                      int64_t, const int32_t*);                                    \
  template void attention_merge<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
