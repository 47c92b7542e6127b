// Mamba2 SSD scan, forward: chunked, with an optional incoming state (context parallelism).
#include <algorithm>
#include <limits>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/kernels/cpu/SsdScanDetail.h"

namespace hcp::cpu {

template <typename T>
void ssd_scan_forward(T* y, T* final_state, const T* x, const T* dt, const T* A, const T* Bm,
                      const T* Cm, const T* D, const T* init_state, const SsdShape& shape,
                      Threads threads, const int32_t* positions, T* chunk_states) {
  const int64_t PN = shape.head_dim * shape.state;
  const int64_t num_chunks = (shape.seq + shape.chunk - 1) / shape.chunk;
  // Each (batch row, head) writes only its own y and final state: they go to threads whole.
  auto scan_heads = [&](int64_t begin, int64_t end) {
    std::vector<T> H(PN), H_next(PN);
    for (int64_t bh = begin; bh < end; bh++) {
      detail::SsdHead<T> hd(shape, bh / shape.heads, bh % shape.heads, x, dt, A, Bm, Cm, D,
                            positions);
      if (init_state != nullptr) {
        std::copy(init_state + hd.state_offset(), init_state + hd.state_offset() + PN, H.begin());
      } else {
        std::fill(H.begin(), H.end(), T(0));
      }
      // Inter-chunk state passing: H_{c+1} = exp(Acs_last^(c)) H_c + s_c.
      for (int64_t t0 = 0; t0 < shape.seq; t0 += shape.chunk) {
        const int64_t t1 = std::min(t0 + shape.chunk, shape.seq);
        if (chunk_states != nullptr) {
          std::copy(H.begin(), H.end(), chunk_states + (bh * num_chunks + t0 / shape.chunk) * PN);
        }
        detail::ssd_chunk_forward(y, H_next.data(), H.data(), hd, t0, t1);
        std::swap(H, H_next);
      }
      if (final_state != nullptr) std::copy(H.begin(), H.end(), final_state + hd.state_offset());
    }
  };
  parallel_for(threads, shape.batch * shape.heads, /*min_items=*/1, /*align=*/1, scan_heads);
}

template <typename T>
void ssd_final_state_forward(T* final_state, const T* x, const T* dt, const T* A, const T* Bm,
                             const SsdShape& shape, Threads threads, const int32_t* positions) {
  // Without y the chunk step never reads C or D.
  ssd_scan_forward<T>(/*y=*/nullptr, final_state, x, dt, A, Bm, /*Cm=*/nullptr, /*D=*/nullptr,
                      /*init_state=*/nullptr, shape, threads, positions);
}

template <typename T>
void ssd_log_decay(T* g, const T* dt, const T* A, int64_t batch, int64_t seq, int64_t heads,
                   const int32_t* positions) {
  for (int64_t b = 0; b < batch; b++) {
    // A document starts in this row of the segment: nothing passes through it.
    const bool blocked = positions != nullptr && seq > 0 && positions[b * seq + seq - 1] < seq;
    for (int64_t h = 0; h < heads; h++) {
      if (blocked) {
        g[b * heads + h] = -std::numeric_limits<T>::infinity();
        continue;
      }
      double acc = 0.0;
      for (int64_t t = 0; t < seq; t++) {
        acc += static_cast<double>(dt[(b * seq + t) * heads + h]) * static_cast<double>(A[h]);
      }
      g[b * heads + h] = static_cast<T>(acc);
    }
  }
}

template <typename T>
void ssd_log_decay_backward(T* ddt, T* dA, const T* dg, const T* dt, const T* A, int64_t batch,
                            int64_t seq, int64_t heads) {
  for (int64_t h = 0; h < heads; h++) {
    double acc = 0.0;
    for (int64_t b = 0; b < batch; b++) {
      const double g = static_cast<double>(dg[b * heads + h]);
      for (int64_t t = 0; t < seq; t++) {
        const int64_t i = (b * seq + t) * heads + h;
        ddt[i] = static_cast<T>(g * static_cast<double>(A[h]));
        acc += g * static_cast<double>(dt[i]);
      }
    }
    dA[h] = static_cast<T>(acc);
  }
}

#define HCP_INSTANTIATE(T)                                                                        \
  template void ssd_scan_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,     \
                                    const T*, const T*, const SsdShape&, Threads, const int32_t*, \
                                    T*);                                                          \
  template void ssd_final_state_forward<T>(T*, const T*, const T*, const T*, const T*,            \
                                           const SsdShape&, Threads, const int32_t*);             \
  template void ssd_log_decay<T>(T*, const T*, const T*, int64_t, int64_t, int64_t,               \
                                 const int32_t*);                                                 \
  template void ssd_log_decay_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                          int64_t);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
