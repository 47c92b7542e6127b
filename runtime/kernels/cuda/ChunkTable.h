// How the one-launch kernels over many tensors (AdamW.cu's adamw_update_many and
// sum_of_squares_many) find a block's tensor: the tensors' chunks are numbered in order, each
// tensor's table entry holds the number of its first chunk, and block c works on the tensor whose
// chunks hold chunk c. Plain C++ (host and device), so that the search is unit-tested without a
// GPU.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HCP_HOST_DEVICE __host__ __device__
#else
#define HCP_HOST_DEVICE
#endif

namespace hcp::cuda {

// The tensor (of `count`, count >= 1) whose chunks hold chunk `c`: the last whose first chunk is
// at or before c. An empty tensor shares its first chunk with the next one, which wins. Entry has
// an int64_t first_chunk.
template <typename Entry>
HCP_HOST_DEVICE inline int64_t tensor_of_chunk(const Entry* tensors, int64_t count, int64_t c) {
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tensors[mid].first_chunk <= c) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace hcp::cuda

#undef HCP_HOST_DEVICE
