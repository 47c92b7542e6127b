// Mamba2 SSD scan, backward: exact gradients by recomputation, no saved activations.
//
// Per (batch row, head), with a_t = exp(dt_t A) and G_t the gradient reaching the state S_t:
//   G_t      = dy_t C_t^T + a_{t+1} G_{t+1}            (G past the end is dfinal_state)
//   dC_t     = S_t^T dy_t                  dB_t = dt_t G_t^T x_t
//   dx_t     = D dy_t + dt_t G_t B_t       dD  += dy_t . x_t
//   ddt_t    = <G_t, x_t B_t^T> + A a_t <G_t, S_{t-1}>
//   dA      += dt_t a_t <G_t, S_{t-1}>     dinit_state = a_0 G_0
// The states S_t are recomputed: first the chunk-start states with the forward's own chunk
// step, then, walking the chunks in reverse, each chunk's per-position states from its start.
// Memory: the chunk-start states plus one chunk of states.
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/kernels/cpu/SsdScanDetail.h"

namespace hcp::cpu {

template <typename T>
void ssd_scan_backward(T* dx, T* ddt, T* dA, T* dBm, T* dCm, T* dD, T* dinit_state, const T* dy,
                       const T* dfinal_state, const T* x, const T* dt, const T* A, const T* Bm,
                       const T* Cm, const T* D, const T* init_state, const SsdShape& shape,
                       Threads threads, const int32_t* positions, const T* chunk_states) {
  const int64_t P = shape.head_dim, N = shape.state, PN = P * N;
  const int64_t num_chunks = (shape.seq + shape.chunk - 1) / shape.chunk;
  // B and C are shared by the heads of a group, A and D by the batch rows: these gradients are
  // sums over several heads / rows, in double. Heads go to threads whole, so each head keeps its
  // terms of dB and dC ([head, batch, seq, state]), summed over the group's heads in head order
  // at the end: the order one walk over (batch row, head) would add them in.
  const int64_t rows = shape.batch * shape.seq;
  std::vector<double> dB_terms(shape.heads * rows * N), dC_terms(dB_terms.size());
  std::vector<double> dA_acc(shape.heads, 0.0), dD_acc(shape.heads, 0.0);

  // Heads [h_begin, h_end), every batch row of each.
  auto backward_heads = [&](int64_t h_begin, int64_t h_end) {
    std::vector<T> chunk_start(num_chunks * PN);
    std::vector<double> S((shape.chunk + 1) * PN);  // S[l] = state before chunk position l
    std::vector<double> G(PN);                      // a_{t+1} G_{t+1}, then G_t

    for (int64_t h = h_begin; h < h_end; h++) {
      for (int64_t b = 0; b < shape.batch; b++) {
        detail::SsdHead<T> hd(shape, b, h, x, dt, A, Bm, Cm, D, positions);
        double* dB_h = dB_terms.data() + (h * rows + b * shape.seq) * N;
        double* dC_h = dC_terms.data() + (h * rows + b * shape.seq) * N;
        const double a_h = static_cast<double>(hd.A), d_h = static_cast<double>(hd.D);

        // Chunk-start states H_0 .. H_{num_chunks - 1}: the forward's, or computed exactly as
        // the forward computes them.
        const T* starts = chunk_start.data();
        if (chunk_states != nullptr) {
          starts = chunk_states + (b * shape.heads + h) * num_chunks * PN;
        } else {
          if (init_state != nullptr) {
            std::copy(init_state + hd.state_offset(), init_state + hd.state_offset() + PN,
                      chunk_start.begin());
          } else {
            std::fill(chunk_start.begin(), chunk_start.begin() + PN, T(0));
          }
          for (int64_t c = 0; c + 1 < num_chunks; c++) {
            const int64_t t0 = c * shape.chunk, t1 = std::min(t0 + shape.chunk, shape.seq);
            detail::ssd_chunk_forward<T>(nullptr, chunk_start.data() + (c + 1) * PN,
                                         chunk_start.data() + c * PN, hd, t0, t1);
          }
        }

        for (int64_t i = 0; i < PN; i++) {
          G[i] = dfinal_state != nullptr ? static_cast<double>(dfinal_state[hd.state_offset() + i])
                                         : 0.0;
        }

        for (int64_t c = num_chunks - 1; c >= 0; c--) {
          const int64_t t0 = c * shape.chunk, t1 = std::min(t0 + shape.chunk, shape.seq);
          const int64_t L = t1 - t0;
          // Per-position states of this chunk by the plain recurrence from its start state.
          for (int64_t i = 0; i < PN; i++) S[i] = static_cast<double>(starts[c * PN + i]);
          for (int64_t l = 0; l < L; l++) {
            const int64_t t = t0 + l;
            const double dt_t = static_cast<double>(dt[hd.dti(t)]);
            const double a_t = hd.decay_into(t);
            for (int64_t p = 0; p < P; p++) {
              const double xdt = dt_t * static_cast<double>(x[hd.xi(t, p)]);
              for (int64_t n = 0; n < N; n++) {
                S[(l + 1) * PN + p * N + n] =
                    a_t * S[l * PN + p * N + n] + xdt * static_cast<double>(Bm[hd.bci(t, n)]);
              }
            }
          }

          // Reverse recurrence over the chunk.
          for (int64_t l = L - 1; l >= 0; l--) {
            const int64_t t = t0 + l;
            const double dt_t = static_cast<double>(dt[hd.dti(t)]);
            const double a_t = hd.decay_into(t);  // 0 at a document start: no gradient through
            const double* S_t = S.data() + (l + 1) * PN;
            const double* S_prev = S.data() + l * PN;

            for (int64_t p = 0; p < P; p++) {
              const double dy_p = static_cast<double>(dy[hd.xi(t, p)]);
              for (int64_t n = 0; n < N; n++) {
                G[p * N + n] += dy_p * static_cast<double>(Cm[hd.bci(t, n)]);
              }
            }

            double dot_dy_x = 0.0, g_xb = 0.0, g_s = 0.0;
            for (int64_t p = 0; p < P; p++) {
              const double dy_p = static_cast<double>(dy[hd.xi(t, p)]);
              const double x_p = static_cast<double>(x[hd.xi(t, p)]);
              dot_dy_x += dy_p * x_p;
              double g_b = 0.0;  // (G_t B_t)[p]
              for (int64_t n = 0; n < N; n++) {
                const double g = G[p * N + n];
                g_b += g * static_cast<double>(Bm[hd.bci(t, n)]);
                g_s += g * S_prev[p * N + n];
              }
              g_xb += g_b * x_p;
              dx[hd.xi(t, p)] = static_cast<T>(d_h * dy_p + dt_t * g_b);
            }
            for (int64_t n = 0; n < N; n++) {
              double dc = 0.0, db = 0.0;
              for (int64_t p = 0; p < P; p++) {
                dc += static_cast<double>(dy[hd.xi(t, p)]) * S_t[p * N + n];
                db += G[p * N + n] * static_cast<double>(x[hd.xi(t, p)]);
              }
              dC_h[t * N + n] = dc;
              dB_h[t * N + n] = dt_t * db;
            }
            ddt[hd.dti(t)] = static_cast<T>(g_xb + a_h * a_t * g_s);
            dA_acc[h] += dt_t * a_t * g_s;
            dD_acc[h] += dot_dy_x;

            for (int64_t i = 0; i < PN; i++) G[i] *= a_t;  // now a_t G_t, the gradient of S_{t-1}
          }
        }

        if (dinit_state != nullptr) {
          for (int64_t i = 0; i < PN; i++)
            dinit_state[hd.state_offset() + i] = static_cast<T>(G[i]);
        }
      }
    }
  };
  parallel_for(threads, shape.heads, /*min_items=*/1, /*align=*/1, backward_heads);

  const int64_t per_group = shape.heads / shape.groups;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t g = 0; g < shape.groups; g++) {
      for (int64_t n = 0; n < N; n++) {
        double db = 0.0, dc = 0.0;
        for (int64_t h = g * per_group; h < (g + 1) * per_group; h++) {
          db += dB_terms[(h * rows + r) * N + n];
          dc += dC_terms[(h * rows + r) * N + n];
        }
        dBm[(r * shape.groups + g) * N + n] = static_cast<T>(db);
        dCm[(r * shape.groups + g) * N + n] = static_cast<T>(dc);
      }
    }
  }
  for (int64_t h = 0; h < shape.heads; h++) {
    dA[h] = static_cast<T>(dA_acc[h]);
    dD[h] = static_cast<T>(dD_acc[h]);
  }
}

template <typename T>
void ssd_final_state_backward(T* dx, T* ddt, T* dA, T* dBm, const T* dfinal_state, const T* x,
                              const T* dt, const T* A, const T* Bm, const SsdShape& shape,
                              Threads threads, const int32_t* positions) {
  // The full backward with no output gradient: dy = 0 makes C and D irrelevant (zeros here), and
  // their gradients (dC = 0, dD = 0) are discarded.
  const size_t x_size = static_cast<size_t>(shape.batch * shape.seq * shape.heads * shape.head_dim);
  const size_t bc_size = static_cast<size_t>(shape.batch * shape.seq * shape.groups * shape.state);
  const std::vector<T> zero_dy(x_size, T(0)), zero_C(bc_size, T(0));
  std::vector<T> discarded_dC(bc_size), discarded_dD(shape.heads);
  ssd_scan_backward<T>(dx, ddt, dA, dBm, discarded_dC.data(), discarded_dD.data(),
                       /*dinit_state=*/nullptr, zero_dy.data(), dfinal_state, x, dt, A, Bm,
                       zero_C.data(), /*D=*/nullptr, /*init_state=*/nullptr, shape, threads,
                       positions);
}

#define HCP_INSTANTIATE(T)                                                                       \
  template void ssd_scan_backward<T>(T*, T*, T*, T*, T*, T*, T*, const T*, const T*, const T*,   \
                                     const T*, const T*, const T*, const T*, const T*, const T*, \
                                     const SsdShape&, Threads, const int32_t*, const T*);        \
  template void ssd_final_state_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,        \
                                            const T*, const T*, const SsdShape&, Threads,        \
                                            const int32_t*);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
