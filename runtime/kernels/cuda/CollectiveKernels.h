// The on-device halves of the context-parallel collectives (runtime/backends/cuda's
// CudaBackendCollectives.cpp moves the data with NCCL and calls these on what arrives):
//   - ring attention: merging one key block's partial attention result into the running one by
//     log-sum-exp, and accumulating bf16 gradient pieces into fp32 sums (AttentionMerge.cu);
//   - Mamba state passing: one segment of the state recurrence over the sequence's segments and
//     of its transpose (StatePassing.cu).
// Conventions of Kernels.h (device pointers, work queued on `stream`, Status errors); fixed order,
// no atomics: bit-reproducible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/kernels/cuda/Kernels.h"

namespace hcp::cuda {

// ---------------------------------------------------------------------------------------------
// Ring attention (AttentionMerge.cu).

// Folds one partial result of `len` query rows into the running one, per row i and head h:
//   lse' = log(exp(acc_lse) + exp(part_lse)),
//   acc_out' = acc_out * exp(acc_lse - lse') + part_out * exp(part_lse - lse').
// acc_out [len, heads, dim] fp32; part_out [len, heads, dim] bf16; part_lse [heads, len] fp32;
// acc_lse[h * acc_lse_stride + i] fp32 (a window of a [heads, seq] array). The running result
// starts as acc_out = 0, acc_lse = -inf (nothing seen); a part with lse = -inf (no visible key)
// changes nothing. dim <= 256.
Status attention_merge(cudaStream_t stream, float* acc_out, float* acc_lse, int64_t acc_lse_stride,
                       const bf16* part_out, const float* part_lse, int64_t len, int64_t heads,
                       int64_t dim);

// y[i] += x[i], fp32 += bf16 (summing a ring step's gradient pieces in fp32).
Status accumulate(cudaStream_t stream, float* y, const bf16* x, int64_t n);

// ---------------------------------------------------------------------------------------------
// Mamba state passing (StatePassing.cu). Per batch row b and head h, over the segments j of the
// sequence in order:  s_in[j+1] = exp(g[j]) s_in[j] + s[j],  s_in[0] = 0, and the transpose
//   G[j] = ds_in[j] + exp(g[j]) G[j+1],  G[S] = 0;  ds[j] = G[j+1],  dg[j] = exp(g[j]) <s_in[j],
//   G[j+1]>.
// A segment's arrays come as one local segment k of a rank's [batch * segs, heads(, pn)] arrays
// (row b * segs + k; pn = head_dim * state). `run` [batch, heads, pn] fp32 is the recurrence's
// carry between segments.

// Forward, one segment: s_in[b,k,h,:] = run[b,h,:] (s_in nullable: the segment is another
// rank's, nothing written), then run[b,h,:] = exp(g[b,k,h]) run[b,h,:] + s[b,k,h,:].
Status state_pass_forward(cudaStream_t stream, float* s_in, float* run, const float* g,
                          const float* s, int64_t batch, int64_t segs, int64_t k, int64_t heads,
                          int64_t pn);

// Backward, one segment, with run = G[j+1] on entry and G[j] on exit:
// dg[b,k,h] = exp(g) <s_in[b,k,h,:], run[b,h,:]> (summed in double, fixed order) and
// ds[b,k,h,:] = run[b,h,:] (dg, ds and s_in all null: another rank's segment), then
// run[b,h,:] = ds_in[b,k,h,:] + exp(g[b,k,h]) run[b,h,:].
Status state_pass_backward(cudaStream_t stream, float* dg, float* ds, float* run, const float* g,
                           const float* ds_in, const float* s_in, int64_t batch, int64_t segs,
                           int64_t k, int64_t heads, int64_t pn);

}  // namespace hcp::cuda
