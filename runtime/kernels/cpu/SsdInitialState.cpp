// Context parallelism's correction of a segment scanned from a zero start by the state that
// enters it (Kernels.h, ssd_add_initial_state_*): the oracle, in double per (batch row, head).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

// One (batch row, head)'s view: element offsets into the [B,S,...] tensors.
struct InitialStateHead {
  const SsdShape& s;
  int64_t b, h, g;
  InitialStateHead(const SsdShape& shape, int64_t batch_row, int64_t head)
      : s(shape), b(batch_row), h(head), g(head / (shape.heads / shape.groups)) {}
  int64_t dt_at(int64_t t) const { return (b * s.seq + t) * s.heads + h; }
  int64_t y_at(int64_t t) const { return dt_at(t) * s.head_dim; }
  int64_t c_at(int64_t t) const { return ((b * s.seq + t) * s.groups + g) * s.state; }
  int64_t state_at() const { return (b * s.heads + h) * s.head_dim * s.state; }
  // Whether the state entering the segment reaches token t: no document starts in [0, t].
  bool reached(const int32_t* positions, int64_t t) const {
    return positions == nullptr || positions[b * s.seq + t] > t;
  }
};

}  // namespace

template <typename T>
void ssd_add_initial_state_forward(T* out, const T* y, const T* dt, const T* A, const T* Cm,
                                   const T* init_state, const SsdShape& shape,
                                   const int32_t* positions) {
  const int64_t P = shape.head_dim, N = shape.state;
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t h = 0; h < shape.heads; h++) {
      InitialStateHead hd(shape, b, h);
      const T* S = init_state + hd.state_at();
      double cum_dt = 0.0;
      for (int64_t t = 0; t < shape.seq; t++) {
        cum_dt += static_cast<double>(dt[hd.dt_at(t)]);
        const double decay =
            hd.reached(positions, t) ? std::exp(static_cast<double>(A[h]) * cum_dt) : 0.0;
        const T* C = Cm + hd.c_at(t);
        for (int64_t p = 0; p < P; p++) {
          double q = 0.0;
          for (int64_t n = 0; n < N; n++) {
            q += static_cast<double>(S[p * N + n]) * static_cast<double>(C[n]);
          }
          const int64_t i = hd.y_at(t) + p;
          out[i] = static_cast<T>(static_cast<double>(y[i]) + decay * q);
        }
      }
    }
  }
}

template <typename T>
void ssd_add_initial_state_backward(T* ddt, T* dA, T* dCm, T* dinit_state, const T* dout,
                                    const T* dt, const T* A, const T* Cm, const T* init_state,
                                    const SsdShape& shape, const int32_t* positions) {
  const int64_t P = shape.head_dim, N = shape.state;
  // C is shared by the heads of a group and A by the batch rows: gathered in double, written
  // once at the end.
  std::vector<double> dC_acc(shape.batch * shape.seq * shape.groups * N, 0.0);
  std::vector<double> dA_acc(shape.heads, 0.0);
  std::vector<double> w(shape.seq), dS(P * N);
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t h = 0; h < shape.heads; h++) {
      InitialStateHead hd(shape, b, h);
      const T* S = init_state + hd.state_at();
      const double a_h = static_cast<double>(A[h]);
      std::fill(dS.begin(), dS.end(), 0.0);
      double cum_dt = 0.0;
      for (int64_t t = 0; t < shape.seq; t++) {
        cum_dt += static_cast<double>(dt[hd.dt_at(t)]);
        const double decay = hd.reached(positions, t) ? std::exp(a_h * cum_dt) : 0.0;
        const T* C = Cm + hd.c_at(t);
        const T* dy = dout + hd.y_at(t);
        double dot = 0.0;  // <dout_t, q_t>
        for (int64_t p = 0; p < P; p++) {
          const double g = static_cast<double>(dy[p]);
          double q = 0.0;
          for (int64_t n = 0; n < N; n++) {
            q += static_cast<double>(S[p * N + n]) * static_cast<double>(C[n]);
            dS[p * N + n] += decay * g * static_cast<double>(C[n]);
            dC_acc[hd.c_at(t) + n] += decay * g * static_cast<double>(S[p * N + n]);
          }
          dot += g * q;
        }
        w[t] = decay * dot;
        dA_acc[h] += w[t] * cum_dt;
      }
      double suffix = 0.0;  // sum_{t>=u} w_t
      for (int64_t u = shape.seq - 1; u >= 0; u--) {
        suffix += w[u];
        ddt[hd.dt_at(u)] = static_cast<T>(a_h * suffix);
      }
      for (int64_t i = 0; i < P * N; i++) dinit_state[hd.state_at() + i] = static_cast<T>(dS[i]);
    }
  }
  for (size_t i = 0; i < dC_acc.size(); i++) dCm[i] = static_cast<T>(dC_acc[i]);
  for (int64_t h = 0; h < shape.heads; h++) dA[h] = static_cast<T>(dA_acc[h]);
}

#define HCP_INSTANTIATE(T)                                                                      \
  template void ssd_add_initial_state_forward<T>(T*, const T*, const T*, const T*, const T*,    \
                                                 const T*, const SsdShape&, const int32_t*);    \
  template void ssd_add_initial_state_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, \
                                                  const T*, const T*, const SsdShape&,          \
                                                  const int32_t*);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
