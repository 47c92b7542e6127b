// Internal to the CPU SSD scan: the chunk step shared by the forward and the backward's
// recomputation of chunk-start states, so both walk exactly the same arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu::detail {

// The tensors of one (batch row, head) pair, with the index arithmetic of their layouts.
template <typename T>
struct SsdHead {
  const SsdShape& s;
  int64_t b, h, g;
  const T* x;                // [B,S,H,P]
  const T* dt;               // [B,S,H]
  const T* Bm;               // [B,S,G,N]
  const T* Cm;               // [B,S,G,N]
  const int32_t* positions;  // [B,S]: packed documents, or null (one document)
  T A, D;

  SsdHead(const SsdShape& shape, int64_t batch_row, int64_t head, const T* x_, const T* dt_,
          const T* A_, const T* Bm_, const T* Cm_, const T* D_, const int32_t* positions_)
      : s(shape),
        b(batch_row),
        h(head),
        g(head / (shape.heads / shape.groups)),
        x(x_),
        dt(dt_),
        Bm(Bm_),
        Cm(Cm_),
        positions(positions_),
        A(A_[head]),
        D(D_ == nullptr ? T(0) : D_[head]) {}

  // Whether what token s wrote into the state still reaches token t >= s: s lies in t's document
  // (s = -1 stands for the state entering the segment).
  bool reaches(int64_t s_pos, int64_t t) const {
    return positions == nullptr || s_pos >= t - positions[b * s.seq + t];
  }
  // The decay into token t from the state before it: exp(dt_t A), or 0 where t starts a document.
  double decay_into(int64_t t) const {
    if (!reaches(t - 1, t)) return 0.0;
    return std::exp(static_cast<double>(dt[dti(t)]) * static_cast<double>(A));
  }

  int64_t xi(int64_t t, int64_t p) const {
    return ((b * s.seq + t) * s.heads + h) * s.head_dim + p;
  }
  int64_t dti(int64_t t) const { return (b * s.seq + t) * s.heads + h; }
  int64_t bci(int64_t t, int64_t n) const { return ((b * s.seq + t) * s.groups + g) * s.state + n; }
  // Offset of this head's [P, N] state in a [B, H, P, N] tensor.
  int64_t state_offset() const { return (b * s.heads + h) * s.head_dim * s.state; }
};

// One chunk [t0, t1) of one head. H is the state entering the chunk ([P, N]); writes the state
// leaving it into H_next and, if y is not null, the chunk's outputs:
//   Acs_l  = sum_{s<=l} dt_s A                                (inclusive cumsum within the chunk)
//   y_l    = sum_{s<=l} (C_l . B_s) exp(Acs_l - Acs_s) dt_s x_s + exp(Acs_l) H C_l + D x_l
//   H_next = exp(Acs_last) H + sum_s exp(Acs_last - Acs_s) dt_s x_s B_s^T
// The cumsum restarts at every chunk so exp() never sees more than a chunk's worth of decay.
// With packed documents each term counts only where its source reaches the token (SsdHead::
// reaches; H stands at position t0 - 1): the recurrence with a zero decay at document starts.
template <typename T>
void ssd_chunk_forward(T* y, T* H_next, const T* H, const SsdHead<T>& hd, int64_t t0, int64_t t1) {
  const int64_t L = t1 - t0, P = hd.s.head_dim, N = hd.s.state;
  std::vector<T> acs(L);
  double run = 0.0;
  for (int64_t l = 0; l < L; l++) {
    run += static_cast<double>(hd.dt[hd.dti(t0 + l)]) * static_cast<double>(hd.A);
    acs[l] = static_cast<T>(run);
  }

  if (y != nullptr) {
    std::vector<double> weight(L);  // weight[s] = (C_l . B_s) exp(Acs_l - Acs_s) dt_s
    for (int64_t l = 0; l < L; l++) {
      const int64_t tl = t0 + l;
      for (int64_t s = 0; s <= l; s++) {
        double cb = 0.0;
        for (int64_t n = 0; n < N; n++) {
          cb += static_cast<double>(hd.Cm[hd.bci(tl, n)]) *
                static_cast<double>(hd.Bm[hd.bci(t0 + s, n)]);
        }
        weight[s] = hd.reaches(t0 + s, tl) ? cb * std::exp(static_cast<double>(acs[l] - acs[s])) *
                                                 static_cast<double>(hd.dt[hd.dti(t0 + s)])
                                           : 0.0;
      }
      const double decay_in = hd.reaches(t0 - 1, tl) ? std::exp(static_cast<double>(acs[l])) : 0.0;
      for (int64_t p = 0; p < P; p++) {
        double intra = 0.0;
        for (int64_t s = 0; s <= l; s++)
          intra += weight[s] * static_cast<double>(hd.x[hd.xi(t0 + s, p)]);
        double inter = 0.0;
        for (int64_t n = 0; n < N; n++) {
          inter += static_cast<double>(H[p * N + n]) * static_cast<double>(hd.Cm[hd.bci(tl, n)]);
        }
        double skip = static_cast<double>(hd.D) * static_cast<double>(hd.x[hd.xi(tl, p)]);
        y[hd.xi(tl, p)] = static_cast<T>(intra + decay_in * inter + skip);
      }
    }
  }

  // An empty chunk (L == 0) passes the state through unchanged.
  const T acs_last = L > 0 ? acs[L - 1] : T(0);
  std::vector<double> decay_out(L);  // exp(Acs_last - Acs_s) dt_s
  for (int64_t s = 0; s < L; s++) {
    decay_out[s] = hd.reaches(t0 + s, t1 - 1) ? std::exp(static_cast<double>(acs_last - acs[s])) *
                                                    static_cast<double>(hd.dt[hd.dti(t0 + s)])
                                              : 0.0;
  }
  const double decay_chunk =
      L == 0 || hd.reaches(t0 - 1, t1 - 1) ? std::exp(static_cast<double>(acs_last)) : 0.0;
  for (int64_t p = 0; p < P; p++) {
    for (int64_t n = 0; n < N; n++) {
      double acc = decay_chunk * static_cast<double>(H[p * N + n]);
      for (int64_t s = 0; s < L; s++) {
        acc += decay_out[s] * static_cast<double>(hd.x[hd.xi(t0 + s, p)]) *
               static_cast<double>(hd.Bm[hd.bci(t0 + s, n)]);
      }
      H_next[p * N + n] = static_cast<T>(acc);
    }
  }
}

}  // namespace hcp::cpu::detail
