// The MoE load-balancing loss (Kernels.h): a layer's routing statistics, their combination, and
// both backwards.
//
// router_load.forward: the tokens are cut into at most kMaxBlocks contiguous ranges, a block
// each (the cut depends on the token count alone, not on the device); in a block one warp per
// token, lane l holding experts l, l + 32, ...; each lane sums its experts' softmax values and
// picks over its tokens in order, the block adds its warps' sums in order into fp32 partials
// [blocks, experts], and sum_partials adds the blocks in order: the same bits on every run.
#include <algorithm>
#include <cstdint>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 256;  // 8 per lane
constexpr int kPerLane = kMaxExperts / 32;
constexpr int64_t kMaxBlocks = 512;

// Blocks of router_load.forward: a function of the token count alone (at least one).
int64_t blocks_for(int64_t tokens) {
  return std::max<int64_t>(1, std::min(kMaxBlocks, ceil_div(tokens, 64)));
}

// softmax(row) of lane's experts into s[i] (expert lane + 32 i; 0 past the last).
template <typename T>
__device__ __forceinline__ void lane_softmax(float (&s)[kPerLane], const T* row, int experts,
                                             int lane) {
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int e = lane + 32 * i;
    s[i] = e < experts ? to_float(row[e]) : -INFINITY;
    max_logit = fmaxf(max_logit, s[i]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, offset));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    s[i] = lane + 32 * i < experts ? expf(s[i] - max_logit) : 0.f;
    sum += s[i];
  }
  const float inv = 1.f / warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kPerLane; i++) s[i] *= inv;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    load_partials_kernel(float* prob_partials, float* pick_partials, const T* logits,
                         const int32_t* indices, int64_t tokens, int experts, int k,
                         int64_t per_block) {
  __shared__ float probs[kWarps][kMaxExperts], picks[kWarps][kMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first = blockIdx.x * per_block;
  const int64_t end = first + per_block < tokens ? first + per_block : tokens;
  float prob_sum[kPerLane] = {}, pick_sum[kPerLane] = {};
  for (int64_t t = first + warp; t < end; t += kWarps) {
    float s[kPerLane];
    lane_softmax(s, logits + t * experts, experts, lane);
#pragma unroll
    for (int i = 0; i < kPerLane; i++) prob_sum[i] += s[i];
    for (int j = 0; j < k; j++) {
      const int e = indices[t * k + j];
      if ((e & 31) == lane) {
#pragma unroll
        for (int i = 0; i < kPerLane; i++) pick_sum[i] += (e >> 5) == i ? 1.f : 0.f;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    probs[warp][lane + 32 * i] = prob_sum[i];
    picks[warp][lane + 32 * i] = pick_sum[i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    float p = 0.f, c = 0.f;
    for (int w = 0; w < kWarps; w++) p += probs[w][e], c += picks[w][e];
    prob_partials[blockIdx.x * int64_t{experts} + e] = p;
    pick_partials[blockIdx.x * int64_t{experts} + e] = c;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    load_backward_kernel(T* dlogits, const float* dprobs, const T* logits, int64_t tokens,
                         int experts) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  float dp[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; i++) dp[i] = lane + 32 * i < experts ? dprobs[lane + 32 * i] : 0.f;
  for (int64_t t = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5); t < tokens; t += warps) {
    float s[kPerLane];
    lane_softmax(s, logits + t * experts, experts, lane);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; i++) dot += s[i] * dp[i];
    dot = warp_sum(dot);
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
      const int e = lane + 32 * i;
      if (e < experts) dlogits[t * experts + e] = from_float<T>(s[i] * (dp[i] - dot));
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    aux_loss_kernel(float* loss, const float* probs, const float* picks, int64_t experts,
                    float scale) {
  __shared__ float scratch[32];
  float sum = 0.f;
  for (int64_t e = threadIdx.x; e < experts; e += kThreads) sum += probs[e] * picks[e];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) loss[0] = scale * sum;
}

__global__ void aux_loss_backward_kernel(float* dprobs, const float* dloss, const float* picks,
                                         int64_t experts, float scale) {
  const float factor = dloss[0] * scale;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < experts;
       e += int64_t{gridDim.x} * blockDim.x) {
    dprobs[e] = factor * picks[e];
  }
}

Status check_shape(const char* name, int64_t tokens, int64_t experts) {
  if (tokens < 0 || experts <= 0 || experts > kMaxExperts) {
    return Status(name, "need tokens >= 0 and 0 < experts <= 256");
  }
  return Status();
}

}  // namespace

size_t router_load_forward_workspace_bytes(int64_t tokens, int64_t experts) {
  WorkspaceCarver carver(Workspace{});
  carver.take<float>(blocks_for(tokens) * experts);
  carver.take<float>(blocks_for(tokens) * experts);
  return carver.used();
}

template <typename T>
Status router_load_forward(cudaStream_t stream, float* probs, float* picks, const T* logits,
                           const int32_t* indices, int64_t tokens, int64_t experts, int64_t k,
                           Workspace workspace) {
  const char* name = "router_load.forward";
  if (Status s = check_shape(name, tokens, experts); !s.ok()) return s;
  if (k <= 0 || k > experts) return Status(name, "need 0 < k <= experts");
  const int64_t blocks = blocks_for(tokens);
  WorkspaceCarver carver(workspace);
  float* prob_partials = carver.take<float>(blocks * experts);
  float* pick_partials = carver.take<float>(blocks * experts);
  if (!carver.fits()) return Status(name, "workspace too small");
  load_partials_kernel<<<blocks, kThreads, 0, stream>>>(
      prob_partials, pick_partials, logits, indices, tokens, static_cast<int>(experts),
      static_cast<int>(k), ceil_div(tokens, blocks));
  if (Status s = launch_status(name); !s.ok()) return s;
  if (Status s = sum_partials(stream, probs, prob_partials, blocks, experts); !s.ok()) return s;
  return sum_partials(stream, picks, pick_partials, blocks, experts);
}

template <typename T>
Status router_load_backward(cudaStream_t stream, T* dlogits, const float* dprobs, const T* logits,
                            int64_t tokens, int64_t experts) {
  const char* name = "router_load.backward";
  if (Status s = check_shape(name, tokens, experts); !s.ok()) return s;
  if (tokens == 0) return Status();
  load_backward_kernel<<<grid_for(tokens, kWarps), kThreads, 0, stream>>>(
      dlogits, dprobs, logits, tokens, static_cast<int>(experts));
  return launch_status(name);
}

Status router_aux_loss_forward(cudaStream_t stream, float* loss, const float* probs,
                               const float* picks, int64_t experts, float scale) {
  if (experts <= 0) return Status("router_aux_loss.forward", "need experts > 0");
  aux_loss_kernel<<<1, kThreads, 0, stream>>>(loss, probs, picks, experts, scale);
  return launch_status("router_aux_loss.forward");
}

Status router_aux_loss_backward(cudaStream_t stream, float* dprobs, const float* dloss,
                                const float* picks, int64_t experts, float scale) {
  if (experts <= 0) return Status("router_aux_loss.backward", "need experts > 0");
  aux_loss_backward_kernel<<<grid_for(experts, kThreads), kThreads, 0, stream>>>(
      dprobs, dloss, picks, experts, scale);
  return launch_status("router_aux_loss.backward");
}

template Status router_load_forward<float>(cudaStream_t, float*, float*, const float*,
                                           const int32_t*, int64_t, int64_t, int64_t, Workspace);
template Status router_load_forward<bf16>(cudaStream_t, float*, float*, const bf16*, const int32_t*,
                                          int64_t, int64_t, int64_t, Workspace);
template Status router_load_backward<float>(cudaStream_t, float*, const float*, const float*,
                                            int64_t, int64_t);
template Status router_load_backward<bf16>(cudaStream_t, bf16*, const float*, const bf16*, int64_t,
                                           int64_t);

}  // namespace hcp::cuda
