// Cross-entropy with an ignore index, on given logits or fused with the vocabulary projection.
//
// Row statistics: one block per row reads the row once with an online log-sum-exp (running max
// and sum, rescaled when the max grows), fp32; each row's loss goes to a workspace array and one
// block sums the rows in double in a fixed order, so the loss is bit-reproducible.
// The fused op never holds the logits of the whole sequence: chunk by chunk, cuBLASLt writes
// chunk_tokens rows of bf16 logits, the row kernel reads them, and (backward) the same buffer is
// turned into dlogits in place and fed to the two gradient GEMMs.
#include <cmath>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kRowThreads = 512;
constexpr int kThreads = 256;

// (max, sum) of two partial log-sum-exps.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// lse[row] for every row; row_loss[row] = lse - logit[target] (0 when ignored, NaN when bad).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    ce_rows_kernel(float* lse, float* row_loss, const T* logits, const int32_t* targets,
                   int64_t rows, int64_t vocab, int64_t ignore_index, bool vec,
                   int32_t* bad_position, int64_t first_row) {
  __shared__ float m_s[32], s_s[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* r = logits + row * vocab;
    float m = -INFINITY, s = 0.f;
    for (int64_t c = threadIdx.x * int64_t{8}; c < vocab; c += int64_t{blockDim.x} * 8) {
      const int valid = static_cast<int>(min(int64_t{8}, vocab - c));
      float v[8];
      load8_any(v, r + c, valid, vec, -INFINITY);
      float vmax = v[0];
#pragma unroll
      for (int e = 1; e < 8; e++) vmax = fmaxf(vmax, v[e]);
      if (vmax > m) {
        s *= __expf(m - vmax);
        m = vmax;
      }
#pragma unroll
      for (int e = 0; e < 8; e++) s += __expf(v[e] - m);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset),
                __shfl_xor_sync(0xffffffffu, s, offset));
    }
    __syncthreads();  // the previous row's readers of m_s, s_s are done
    if (lane == 0) {
      m_s[warp] = m;
      s_s[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float M = m_s[0], S = s_s[0];
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); w++) lse_merge(M, S, m_s[w], s_s[w]);
      const float row_lse = M + logf(S);
      lse[row] = row_lse;
      const int64_t target = targets[row];
      float loss = 0.f;
      if (target != ignore_index) {
        if (target < 0 || target >= vocab) {
          loss = __int_as_float(0x7fc00000);
          if (bad_position != nullptr) {
            atomicMin(bad_position, static_cast<int32_t>(first_row + row));
          }
        } else {
          loss = row_lse - to_float(r[target]);
        }
      }
      row_loss[row] = loss;
    }
  }
}

// loss_sum = sum of row_loss (double, fixed order); valid_count = rows whose target is not
// ignore_index. One block.
__global__ void ce_total_kernel(float* loss_sum, float* valid_count, const float* row_loss,
                                const int32_t* targets, int64_t rows, int64_t ignore_index) {
  __shared__ double scratch[32];
  double loss = 0.0, count = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    loss += static_cast<double>(row_loss[r]);
    count += targets[r] != ignore_index ? 1.0 : 0.0;
  }
  loss = block_sum(loss, scratch);
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) {
    *loss_sum = static_cast<float>(loss);
    *valid_count = static_cast<float>(count);
  }
}

// dlogits = dloss * extra_scale * (exp(logit - lse) - onehot); zero rows when ignored. Over
// groups of 8 of the flattened [rows, vocab]; in place is fine.
template <typename T>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                   const int32_t* targets, int64_t rows, int64_t vocab,
                                   int64_t ignore_index, const float* dloss, float extra_scale,
                                   bool vec) {
  const float scale = dloss[0] * extra_scale;
  const int64_t per_row = (vocab + 7) / 8, groups = rows * per_row;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = g / per_row, c = (g % per_row) * 8;
    const int valid = static_cast<int>(min(int64_t{8}, vocab - c));
    const int64_t target = targets[r];
    float v[8];
    if (target == ignore_index) {
#pragma unroll
      for (int e = 0; e < 8; e++) v[e] = 0.f;
    } else {
      const float row_lse = lse[r];
      load8_any(v, logits + r * vocab + c, valid, vec);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        v[e] = scale * (__expf(v[e] - row_lse) - (c + e == target ? 1.f : 0.f));
      }
    }
    store8_any(dlogits + r * vocab + c, v, valid, vec);
  }
}

template <typename T>
Status rows_pass(cudaStream_t stream, float* lse, float* row_loss, const T* logits,
                 const int32_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index,
                 int32_t* bad_position, int64_t first_row) {
  const bool vec = vocab % 8 == 0 && aligned16(logits);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{sm_count()} * 32));
  ce_rows_kernel<<<grid, kRowThreads, 0, stream>>>(lse, row_loss, logits, targets, rows, vocab,
                                                   ignore_index, vec, bad_position, first_row);
  return launch_status("cross_entropy: rows");
}

template <typename T>
Status backward_pass(cudaStream_t stream, T* dlogits, const T* logits, const float* lse,
                     const int32_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index,
                     const float* dloss, float extra_scale) {
  const bool vec = vocab % 8 == 0 && aligned16(logits) && aligned16(dlogits);
  ce_backward_kernel<<<grid_for(rows * ceil_div(vocab, 8), kThreads), kThreads, 0, stream>>>(
      dlogits, logits, lse, targets, rows, vocab, ignore_index, dloss, extra_scale, vec);
  return launch_status("cross_entropy: backward");
}

Status total_pass(cudaStream_t stream, float* loss_sum, float* valid_count, const float* row_loss,
                  const int32_t* targets, int64_t rows, int64_t ignore_index) {
  ce_total_kernel<<<1, 1024, 0, stream>>>(loss_sum, valid_count, row_loss, targets, rows,
                                          ignore_index);
  return launch_status("cross_entropy: total");
}

int64_t chunk_rows(int64_t tokens, int64_t chunk_tokens) {
  return std::max<int64_t>(1, std::min(tokens, chunk_tokens));
}

}  // namespace

size_t cross_entropy_forward_workspace_bytes(int64_t tokens) {
  return sizeof(float) * std::max<int64_t>(tokens, 1);
}

template <typename T>
Status cross_entropy_forward(cudaStream_t stream, float* loss_sum, float* valid_count, float* lse,
                             const T* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                             int64_t ignore_index, int32_t* bad_position, Workspace workspace) {
  const char* name = "cross_entropy.forward";
  if (tokens < 0 || vocab <= 0) return Status(name, "bad shape");
  if (workspace.ptr == nullptr || workspace.bytes < cross_entropy_forward_workspace_bytes(tokens)) {
    return Status(name, "workspace too small");
  }
  float* row_loss = static_cast<float*>(workspace.ptr);
  if (tokens > 0) {
    if (Status s = rows_pass(stream, lse, row_loss, logits, targets, tokens, vocab, ignore_index,
                             bad_position, 0);
        !s.ok()) {
      return s;
    }
  }
  return total_pass(stream, loss_sum, valid_count, row_loss, targets, tokens, ignore_index);
}

template <typename T>
Status cross_entropy_backward(cudaStream_t stream, T* dlogits, const float* dloss_sum,
                              const T* logits, const float* lse, const int32_t* targets,
                              int64_t tokens, int64_t vocab, int64_t ignore_index) {
  if (tokens < 0 || vocab <= 0) return Status("cross_entropy.backward", "bad shape");
  if (tokens == 0) return Status();
  return backward_pass(stream, dlogits, logits, lse, targets, tokens, vocab, ignore_index,
                       dloss_sum, 1.f);
}

template Status cross_entropy_forward<float>(cudaStream_t, float*, float*, float*, const float*,
                                             const int32_t*, int64_t, int64_t, int64_t, int32_t*,
                                             Workspace);
template Status cross_entropy_forward<bf16>(cudaStream_t, float*, float*, float*, const bf16*,
                                            const int32_t*, int64_t, int64_t, int64_t, int32_t*,
                                            Workspace);
template Status cross_entropy_backward<float>(cudaStream_t, float*, const float*, const float*,
                                              const float*, const int32_t*, int64_t, int64_t,
                                              int64_t);
template Status cross_entropy_backward<bf16>(cudaStream_t, bf16*, const float*, const bf16*,
                                             const float*, const int32_t*, int64_t, int64_t,
                                             int64_t);

// ---------------------------------------------------------------------------------------------
// Fused with the vocabulary projection.

size_t lm_head_cross_entropy_forward_workspace_bytes(int64_t tokens, int64_t vocab,
                                                     int64_t chunk_tokens) {
  WorkspaceCarver carver(Workspace{});
  carver.take<bf16>(chunk_rows(tokens, chunk_tokens) * vocab);
  carver.take<float>(std::max<int64_t>(tokens, 1));
  return carver.used();
}

Status lm_head_cross_entropy_forward(GemmContext* ctx, cudaStream_t stream, float* loss_sum,
                                     float* valid_count, float* lse, const bf16* hidden,
                                     const bf16* table, const int32_t* targets, int64_t tokens,
                                     int64_t vocab, int64_t hid, float logits_scaling,
                                     int64_t ignore_index, int64_t chunk_tokens,
                                     int32_t* bad_position, Workspace workspace) {
  const char* name = "lm_head_cross_entropy.forward";
  if (tokens < 0 || vocab <= 0 || hid <= 0 || chunk_tokens <= 0) return Status(name, "bad shape");
  const int64_t chunk = chunk_rows(tokens, chunk_tokens);
  WorkspaceCarver carver(workspace);
  bf16* logits = carver.take<bf16>(chunk * vocab);
  float* row_loss = carver.take<float>(std::max<int64_t>(tokens, 1));
  if (!carver.fits()) return Status(name, "workspace too small");
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, tokens - t0);
    if (Status s = gemm(ctx, stream, false, true, rows, vocab, hid, 1.f / logits_scaling,
                        hidden + t0 * hid, hid, table, hid, 0.f, logits, vocab);
        !s.ok()) {
      return s;
    }
    if (Status s = rows_pass(stream, lse + t0, row_loss + t0, logits, targets + t0, rows, vocab,
                             ignore_index, bad_position, t0);
        !s.ok()) {
      return s;
    }
  }
  return total_pass(stream, loss_sum, valid_count, row_loss, targets, tokens, ignore_index);
}

size_t lm_head_cross_entropy_backward_workspace_bytes(int64_t tokens, int64_t vocab, int64_t hid,
                                                      int64_t chunk_tokens) {
  WorkspaceCarver carver(Workspace{});
  const int64_t chunk = chunk_rows(tokens, chunk_tokens);
  carver.take<bf16>(chunk * vocab);
  if (tokens > chunk) carver.take<float>(vocab * hid);  // dtable accumulates over chunks
  return carver.used();
}

Status lm_head_cross_entropy_backward(GemmContext* ctx, cudaStream_t stream, bf16* dhidden,
                                      bf16* dtable, const float* dloss_sum, const bf16* hidden,
                                      const bf16* table, const int32_t* targets, const float* lse,
                                      int64_t tokens, int64_t vocab, int64_t hid,
                                      float logits_scaling, int64_t ignore_index,
                                      int64_t chunk_tokens, Workspace workspace) {
  const char* name = "lm_head_cross_entropy.backward";
  if (tokens < 0 || vocab <= 0 || hid <= 0 || chunk_tokens <= 0) return Status(name, "bad shape");
  if (tokens == 0) return fill(stream, dtable, 0.f, vocab * hid);
  const int64_t chunk = chunk_rows(tokens, chunk_tokens);
  const bool single = tokens <= chunk;
  WorkspaceCarver carver(workspace);
  bf16* dlogits = carver.take<bf16>(chunk * vocab);
  float* dtable_acc = single ? nullptr : carver.take<float>(vocab * hid);
  if (!carver.fits()) return Status(name, "workspace too small");
  const float inv_scaling = 1.f / logits_scaling;
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, tokens - t0);
    // Logits again (bit-identical to the forward's), then dlogits in place: d(loss)/d(logits)
    // times d(logits)/d(hidden @ table^T) = 1 / logits_scaling.
    if (Status s = gemm(ctx, stream, false, true, rows, vocab, hid, inv_scaling, hidden + t0 * hid,
                        hid, table, hid, 0.f, dlogits, vocab);
        !s.ok()) {
      return s;
    }
    if (Status s = backward_pass(stream, dlogits, static_cast<const bf16*>(dlogits), lse + t0,
                                 targets + t0, rows, vocab, ignore_index, dloss_sum, inv_scaling);
        !s.ok()) {
      return s;
    }
    if (Status s = gemm(ctx, stream, false, false, rows, hid, vocab, 1.f, dlogits, vocab, table,
                        hid, 0.f, dhidden + t0 * hid, hid);
        !s.ok()) {
      return s;
    }
    Status s = single ? gemm(ctx, stream, true, false, vocab, hid, rows, 1.f, dlogits, vocab,
                             hidden + t0 * hid, hid, 0.f, dtable, hid)
                      : gemm(ctx, stream, true, false, vocab, hid, rows, 1.f, dlogits, vocab,
                             hidden + t0 * hid, hid, t0 == 0 ? 0.f : 1.f, dtable_acc, hid);
    if (!s.ok()) return s;
  }
  return single ? Status() : cast(stream, dtable, dtable_acc, vocab * hid);
}

}  // namespace hcp::cuda
