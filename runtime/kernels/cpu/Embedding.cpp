// Token embedding lookup and its scatter-add backward.
#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {

template <typename T>
absl::Status embedding_forward(T* out, const int32_t* ids, const T* table, int64_t tokens,
                               int64_t vocab, int64_t hidden, T multiplier) {
  // Validate everything first so a bad id leaves the output untouched.
  for (int64_t t = 0; t < tokens; t++) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("embedding: token id %d at position %d is outside the vocabulary [0, %d)",
                          ids[t], t, vocab));
    }
  }
  for (int64_t t = 0; t < tokens; t++) {
    const T* row = table + static_cast<int64_t>(ids[t]) * hidden;
    for (int64_t c = 0; c < hidden; c++) out[t * hidden + c] = row[c] * multiplier;
  }
  return absl::OkStatus();
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t tokens, int64_t vocab,
                        int64_t hidden, T multiplier, int64_t padding_idx) {
  std::fill(dtable, dtable + vocab * hidden, T(0));
  // Group the tokens by id (stable, so the sum order is the token order) and sum each group in
  // double: a vocab-sized double buffer would be far too large, one row is enough.
  std::vector<int64_t> order(tokens);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<double> acc(hidden);
  for (int64_t start = 0; start < tokens;) {
    int32_t id = ids[order[start]];
    int64_t end = start;
    while (end < tokens && ids[order[end]] == id) end++;
    // Out-of-range ids cannot reach here through a successful forward; skip rather than write
    // outside the table.
    bool in_table = id >= 0 && id < vocab;
    if (in_table && id != padding_idx) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t i = start; i < end; i++) {
        const T* g = dout + order[i] * hidden;
        for (int64_t c = 0; c < hidden; c++) acc[c] += static_cast<double>(g[c]);
      }
      T* row = dtable + static_cast<int64_t>(id) * hidden;
      for (int64_t c = 0; c < hidden; c++) {
        row[c] = static_cast<T>(acc[c] * static_cast<double>(multiplier));
      }
    }
    start = end;
  }
}

#define HCP_INSTANTIATE(T)                                                                        \
  template absl::Status embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t,      \
                                             int64_t, T);                                         \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, T, \
                                      int64_t);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
