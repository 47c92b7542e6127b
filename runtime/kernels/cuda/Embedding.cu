// Token embedding lookup and its backward.
//
// The backward is a segmented reduction, not a scatter of atomics: a stable radix sort of
// (id, token) pairs puts each id's tokens together in token order, and one warp per vocabulary
// row finds its segment by binary search and sums it in fp32. So every dtable row is written
// exactly once (rows no token uses get zeros: no separate memset of the [vocab, hidden] table),
// and the sum order is fixed: the gradient is bit-reproducible. An id with more than
// kWarpRowLimit tokens (byte-level text: a space is every sixth token) would be one warp's long
// serial loop: its warp lists it instead, and a second kernel gives each listed row a block whose
// warps take every eighth token and add their sums in warp order (the order depends on the count
// alone). Atomics would need an fp32 copy
// of the whole table (bf16 atomics round at every add) plus a conversion pass, and their order,
// hence the rounding, would change from run to run.
#include <cub/device/device_radix_sort.cuh>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

// One warp per token.
__global__ void embedding_forward_kernel(bf16* out, const int32_t* ids, const bf16* table,
                                         int64_t tokens, int64_t vocab, int64_t hidden,
                                         float multiplier, bool vec, int32_t* bad_position) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t t = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); t < tokens;
       t += warps) {
    const int32_t id = ids[t];
    const bool good = id >= 0 && id < vocab;
    if (!good && lane == 0 && bad_position != nullptr) {
      atomicMin(bad_position, static_cast<int32_t>(t));
    }
    const bf16* row = table + (good ? int64_t{id} : 0) * hidden;
    for (int64_t c = lane * 8; c < hidden; c += 256) {
      const int valid = static_cast<int>(min(int64_t{8}, hidden - c));
      float v[8];
      if (good) {
        load8_any(v, row + c, valid, vec);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] *= multiplier;
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = __int_as_float(0x7fc00000);  // NaN
      }
      store8_any(out + t * hidden + c, v, valid, vec);
    }
  }
}

// Sort keys: the id, or `vocab` for an id outside the table (sorted last, never summed).
__global__ void embedding_keys_kernel(int32_t* keys, int32_t* order, const int32_t* ids,
                                      int64_t tokens, int64_t vocab) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < tokens;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int32_t id = ids[t];
    keys[t] = id >= 0 && id < vocab ? id : static_cast<int32_t>(vocab);
    order[t] = static_cast<int32_t>(t);
  }
}

// First index in sorted[0, n) whose key is >= key.
__device__ __forceinline__ int64_t lower_bound(const int32_t* sorted, int64_t n, int32_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// This lane's group g of 8 columns in the slab starting at column `slab`, and how many exist.
__device__ __forceinline__ int64_t slab_col(int64_t slab, int g, int lane) {
  return slab + (g * 32 + lane) * 8;
}
__device__ __forceinline__ int slab_valid(int64_t c, int64_t hidden) {
  return static_cast<int>(max(int64_t{0}, min(int64_t{8}, hidden - c)));
}

// acc += this lane's G groups of one token's row `src` in the slab.
template <int G>
__device__ __forceinline__ void add_row(float (&acc)[G][8], const bf16* src, int64_t slab,
                                        int64_t hidden, int lane, bool vec) {
#pragma unroll
  for (int g = 0; g < G; g++) {
    const int64_t c = slab_col(slab, g, lane);
    const int valid = slab_valid(c, hidden);
    if (valid == 0) continue;
    float x[8];
    load8_any(x, src + c, valid, vec);
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] += x[e];
  }
}

// The tokens one warp sums alone; a row with more goes to embedding_long_rows_kernel.
constexpr int64_t kWarpRowLimit = 64;

// At most this many rows have more than kWarpRowLimit of `tokens` tokens.
int64_t max_long_rows(int64_t tokens) { return tokens / (kWarpRowLimit + 1); }

// One warp per vocabulary row: the sum of its tokens' gradients (token order), or zeros; a row of
// more than kWarpRowLimit tokens is listed in long_rows instead (the long-rows kernel writes it).
// The warp covers kSlab columns per pass, each lane 8 groups of 8, so one token's row is 8
// independent 16-byte loads per lane.
constexpr int kGroupsPerLane = 8;
constexpr int64_t kSlab = 32 * 8 * kGroupsPerLane;

__global__ void embedding_rows_kernel(bf16* dtable, int32_t* long_rows, int32_t* long_count,
                                      const bf16* dout, const int32_t* sorted_keys,
                                      const int32_t* sorted_tokens, int64_t tokens, int64_t vocab,
                                      int64_t hidden, float multiplier, int64_t padding_idx,
                                      bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t v = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); v < vocab;
       v += warps) {
    int64_t begin = 0, end = 0;
    if (v != padding_idx) {
      begin = lower_bound(sorted_keys, tokens, static_cast<int32_t>(v));
      end = lower_bound(sorted_keys, tokens, static_cast<int32_t>(v + 1));
    }
    if (end - begin > kWarpRowLimit) {
      if (lane == 0) long_rows[atomicAdd(long_count, 1)] = static_cast<int32_t>(v);
      continue;
    }
    for (int64_t slab = 0; slab < hidden; slab += kSlab) {
      float acc[kGroupsPerLane][8] = {};
#pragma unroll 2
      for (int64_t i = begin; i < end; i++) {
        add_row(acc, dout + int64_t{sorted_tokens[i]} * hidden, slab, hidden, lane, vec);
      }
#pragma unroll
      for (int g = 0; g < kGroupsPerLane; g++) {
        const int64_t c = slab_col(slab, g, lane);
        const int valid = slab_valid(c, hidden);
        if (valid == 0) continue;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] *= multiplier;
        store8_any(dtable + v * hidden + c, acc[g], valid, vec);
      }
    }
  }
}

// One block per listed row (block b takes long_rows[b] while b < long_count): warp w sums the
// row's tokens w, w + 8, ... (in order), then warp 0 adds the warps' sums in warp order. Slabs of
// kLongSlab columns, each lane 4 groups of 8 (the warps' sums fit in 32 KiB of shared memory).
constexpr int kLongGroups = 4;
constexpr int64_t kLongSlab = 32 * 8 * kLongGroups;

__global__ void __launch_bounds__(kThreads)
    embedding_long_rows_kernel(bf16* dtable, const int32_t* long_rows, const int32_t* long_count,
                               const bf16* dout, const int32_t* sorted_keys,
                               const int32_t* sorted_tokens, int64_t tokens, int64_t hidden,
                               float multiplier, bool vec) {
  __shared__ float sums[kWarpsPerBlock][kLongGroups][32][8];
  if (blockIdx.x >= *long_count) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t v = long_rows[blockIdx.x];
  const int64_t begin = lower_bound(sorted_keys, tokens, v);
  const int64_t end = lower_bound(sorted_keys, tokens, v + 1);
  for (int64_t slab = 0; slab < hidden; slab += kLongSlab) {
    float acc[kLongGroups][8] = {};
    for (int64_t i = begin + warp; i < end; i += kWarpsPerBlock) {
      add_row(acc, dout + int64_t{sorted_tokens[i]} * hidden, slab, hidden, lane, vec);
    }
#pragma unroll
    for (int g = 0; g < kLongGroups; g++) {
#pragma unroll
      for (int e = 0; e < 8; e++) sums[warp][g][lane][e] = acc[g][e];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int g = 0; g < kLongGroups; g++) {
        const int64_t c = slab_col(slab, g, lane);
        const int valid = slab_valid(c, hidden);
        if (valid == 0) continue;
        float total[8] = {};
        for (int w = 0; w < kWarpsPerBlock; w++) {
#pragma unroll
          for (int e = 0; e < 8; e++) total[e] += sums[w][g][lane][e];
        }
#pragma unroll
        for (int e = 0; e < 8; e++) total[e] *= multiplier;
        store8_any(dtable + int64_t{v} * hidden + c, total, valid, vec);
      }
    }
    __syncthreads();
  }
}

// Bits that cover every key in [0, vocab].
int key_bits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) <= vocab) bits++;
  return bits;
}

// The radix sort's own scratch.
size_t sort_temp_bytes(int64_t tokens, int64_t vocab) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int>(tokens), 0, key_bits(vocab));
  return bytes;
}

}  // namespace

Status embedding_forward(cudaStream_t stream, bf16* out, const int32_t* ids, const bf16* table,
                         int64_t tokens, int64_t vocab, int64_t hidden, float multiplier,
                         int32_t* bad_position) {
  const char* name = "embedding.forward";
  if (tokens < 0 || vocab <= 0 || hidden <= 0) return Status(name, "bad shape");
  if (tokens == 0) return Status();
  const bool vec = hidden % 8 == 0 && aligned16(out) && aligned16(table);
  embedding_forward_kernel<<<grid_for(tokens, kWarpsPerBlock), kThreads, 0, stream>>>(
      out, ids, table, tokens, vocab, hidden, multiplier, vec, bad_position);
  return launch_status(name);
}

size_t embedding_backward_workspace_bytes(int64_t tokens, int64_t vocab) {
  WorkspaceCarver carver(Workspace{});
  for (int i = 0; i < 4; i++) carver.take<int32_t>(tokens);
  carver.take<int32_t>(max_long_rows(tokens) + 1);  // the long rows and their count
  carver.take<char>(static_cast<int64_t>(sort_temp_bytes(tokens, vocab)));
  return carver.used();
}

Status embedding_backward(cudaStream_t stream, bf16* dtable, const bf16* dout, const int32_t* ids,
                          int64_t tokens, int64_t vocab, int64_t hidden, float multiplier,
                          int64_t padding_idx, Workspace workspace) {
  const char* name = "embedding.backward";
  if (tokens < 0 || vocab <= 0 || hidden <= 0 || tokens > INT32_MAX || vocab >= INT32_MAX) {
    return Status(name, "bad shape");
  }
  WorkspaceCarver carver(workspace);
  int32_t* keys = carver.take<int32_t>(tokens);
  int32_t* order = carver.take<int32_t>(tokens);
  int32_t* sorted_keys = carver.take<int32_t>(tokens);
  int32_t* sorted_tokens = carver.take<int32_t>(tokens);
  int32_t* long_count = carver.take<int32_t>(max_long_rows(tokens) + 1);
  int32_t* long_rows = long_count + 1;
  size_t temp_bytes = sort_temp_bytes(tokens, vocab);
  void* temp = carver.take<char>(static_cast<int64_t>(temp_bytes));
  if (!carver.fits()) return Status(name, "workspace too small");

  if (tokens > 0) {
    embedding_keys_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(keys, order, ids,
                                                                               tokens, vocab);
    if (Status s = launch_status(name); !s.ok()) return s;
    cudaError_t error =
        cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, sorted_keys, order, sorted_tokens,
                                        static_cast<int>(tokens), 0, key_bits(vocab), stream);
    if (error != cudaSuccess) return Status::Cuda(name, error);
  }
  const bool vec = hidden % 8 == 0 && aligned16(dtable) && aligned16(dout);
  if (cudaError_t error = cudaMemsetAsync(long_count, 0, sizeof(int32_t), stream);
      error != cudaSuccess) {
    return Status::Cuda(name, error);
  }
  embedding_rows_kernel<<<grid_for(vocab, kWarpsPerBlock), kThreads, 0, stream>>>(
      dtable, long_rows, long_count, dout, sorted_keys, sorted_tokens, tokens, vocab, hidden,
      multiplier, padding_idx, vec);
  if (Status s = launch_status(name); !s.ok()) return s;
  if (max_long_rows(tokens) == 0) return Status();
  embedding_long_rows_kernel<<<static_cast<unsigned>(max_long_rows(tokens)), kThreads, 0, stream>>>(
      dtable, long_rows, long_count, dout, sorted_keys, sorted_tokens, tokens, hidden, multiplier,
      vec);
  return launch_status(name);
}

}  // namespace hcp::cuda
