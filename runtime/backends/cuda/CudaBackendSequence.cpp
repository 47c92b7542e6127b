// The sequence-mixing wrappers of the CUDA backend, in KernelTable.def's order: the causal conv,
// the Mamba2 SSD scan and its log-decay, attention. bf16 tensors; dt, A, D, the SSD states and
// the attention lse are fp32 (SequenceKernels.h).
#include <vector>

#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/kernels/cuda/SequenceKernels.h"

namespace hcp::cuda_backend::detail {

cuda::SsdShape SsdShapeOf(const plan::Step& step) {
  // The plan's chunk as it is (CheckPlanRunsOnCuda requires the kernels' 256): the CUDA kernels
  // pad a partial last chunk themselves, so unlike the CPU wrapper there is no capping at seq.
  // ssd_add_initial_state's ints stop before the chunk (it is not chunked); its kernels take the
  // scan's shapes, chunk 256 among them.
  const std::vector<int64_t>& v = step.ints;
  const bool chunked = step.kernel != plan::KernelId::SsdAddInitialStateForward &&
                       step.kernel != plan::KernelId::SsdAddInitialStateBackward;
  return cuda::SsdShape{.batch = v[0],
                        .seq = v[1],
                        .heads = v[2],
                        .head_dim = v[3],
                        .groups = v[4],
                        .state = v[5],
                        .chunk = chunked ? v[6] : 256};
}

// For attention.forward and .backward queries and keys are the same positions.
cuda::AttentionShape AttentionShapeOf(const plan::Step& step) {
  const std::vector<int64_t>& v = step.ints;
  return cuda::AttentionShape{.batch = v[0],
                              .q_len = v[1],
                              .kv_len = v[1],
                              .q_heads = v[2],
                              .kv_heads = v[3],
                              .head_dim = v[4]};
}

// ins: x, w, bias[, halo]. outs: y. ints: batch, seq, channels, width, has_halo, silu. Without
// a halo every sequence starts at position 0 (zeros before it). silu: y = silu(conv).
absl::Status RunCausalConv1dForward(const Args& a) {
  const bf16* halo = a.i(4) != 0 ? a.in<bf16>(3) : nullptr;
  return Done(cuda::causal_conv1d_forward(a.stream(), a.out<bf16>(0), a.in<bf16>(0), halo,
                                          a.in<bf16>(1), a.in<bf16>(2), a.i(0), a.i(1), a.i(2),
                                          a.i(3), a.i(5) != 0));
}

// ins: dy, x, w[, halo][, bias]. outs: dx, dw, dbias[, dhalo]. With silu, dy is the gradient of
// silu's output (the conv output recomputed from x and the bias).
absl::Status RunCausalConv1dBackward(const Args& a) {
  const bool has_halo = a.i(4) != 0, silu = a.i(5) != 0;
  return Done(cuda::causal_conv1d_backward(
      a.stream(), a.out<bf16>(0), has_halo ? a.out<bf16>(3) : nullptr, a.out<bf16>(1),
      a.out<bf16>(2), a.in<bf16>(0), a.in<bf16>(1), has_halo ? a.in<bf16>(3) : nullptr,
      a.in<bf16>(2), silu ? a.in<bf16>(3 + has_halo) : nullptr, a.i(0), a.i(1), a.i(2), a.i(3),
      silu, a.workspace()));
}

// ins: x, dt, A, B, C, D[, init_state]. outs: y, final_state.
// ints: batch, seq, heads, head_dim, groups, state, chunk, has_init.
absl::Status RunSsdScanForward(const Args& a) {
  const bool has_init = a.i(7) != 0;
  return Done(cuda::ssd_scan_forward(a.stream(), a.out<bf16>(0), a.out<float>(1), a.in<bf16>(0),
                                     a.in<float>(1), a.in<float>(2), a.in<bf16>(3), a.in<bf16>(4),
                                     a.in<float>(5), has_init ? a.in<float>(6) : nullptr,
                                     SsdShapeOf(a.step()), a.workspace()));
}

// ins: dy, x, dt, A, B, C, D[, init_state][, dfinal_state].
// outs: dx, ddt, dA, dB, dC, dD[, dinit_state]. ints: as the forward, then has_dfinal.
absl::Status RunSsdScanBackward(const Args& a) {
  const bool has_init = a.i(7) != 0, has_dfinal = a.i(8) != 0;
  const float* init_state = has_init ? a.in<float>(7) : nullptr;
  const float* dfinal_state = has_dfinal ? a.in<float>(has_init ? 8 : 7) : nullptr;
  float* dinit_state = has_init ? a.out<float>(6) : nullptr;
  return Done(cuda::ssd_scan_backward(a.stream(), a.out<bf16>(0), a.out<float>(1), a.out<float>(2),
                                      a.out<bf16>(3), a.out<bf16>(4), a.out<float>(5), dinit_state,
                                      a.in<bf16>(0), dfinal_state, a.in<bf16>(1), a.in<float>(2),
                                      a.in<float>(3), a.in<bf16>(4), a.in<bf16>(5), a.in<float>(6),
                                      init_state, SsdShapeOf(a.step()), a.workspace()));
}

// ins: x, dt, A, B. outs: final_state. ints: batch, seq, heads, head_dim, groups, state, chunk.
absl::Status RunSsdFinalStateForward(const Args& a) {
  return Done(cuda::ssd_final_state_forward(a.stream(), a.out<float>(0), a.in<bf16>(0),
                                            a.in<float>(1), a.in<float>(2), a.in<bf16>(3),
                                            SsdShapeOf(a.step()), a.workspace()));
}

// ins: dfinal_state, x, dt, A, B. outs: dx, ddt, dA, dB. ints as the forward.
absl::Status RunSsdFinalStateBackward(const Args& a) {
  return Done(cuda::ssd_final_state_backward(a.stream(), a.out<bf16>(0), a.out<float>(1),
                                             a.out<float>(2), a.out<bf16>(3), a.in<float>(0),
                                             a.in<bf16>(1), a.in<float>(2), a.in<float>(3),
                                             a.in<bf16>(4), SsdShapeOf(a.step()), a.workspace()));
}

// ins: dt, A. outs: g. ints: batch, seq, heads.
absl::Status RunSsdLogDecayForward(const Args& a) {
  return Done(cuda::ssd_log_decay_forward(a.stream(), a.out<float>(0), a.in<float>(0),
                                          a.in<float>(1), a.i(0), a.i(1), a.i(2), a.workspace()));
}
// ins: dg, dt, A. outs: ddt, dA. ints: batch, seq, heads.
absl::Status RunSsdLogDecayBackward(const Args& a) {
  return Done(cuda::ssd_log_decay_backward(a.stream(), a.out<float>(0), a.out<float>(1),
                                           a.in<float>(0), a.in<float>(1), a.in<float>(2), a.i(0),
                                           a.i(1), a.i(2), a.workspace()));
}

// ins: y, dt, A, C, init_state. outs: out. ints: batch, seq, heads, head_dim, groups, state.
absl::Status RunSsdAddInitialStateForward(const Args& a) {
  return Done(cuda::ssd_add_initial_state_forward(
      a.stream(), a.out<bf16>(0), a.in<bf16>(0), a.in<float>(1), a.in<float>(2), a.in<bf16>(3),
      a.in<float>(4), SsdShapeOf(a.step()), a.workspace()));
}
// ins: dout, dt, A, C, init_state. outs: ddt, dA, dC, dinit_state.
absl::Status RunSsdAddInitialStateBackward(const Args& a) {
  return Done(cuda::ssd_add_initial_state_backward(
      a.stream(), a.out<float>(0), a.out<float>(1), a.out<bf16>(2), a.out<float>(3), a.in<bf16>(0),
      a.in<float>(1), a.in<float>(2), a.in<bf16>(3), a.in<float>(4), SsdShapeOf(a.step()),
      a.workspace()));
}

// ins: q, k, v. outs: out, lse. ints: batch, seq, q_heads, kv_heads, head_dim, causal.
// floats: scale. Queries and keys both start at position 0.
absl::Status RunAttentionForward(const Args& a) {
  return Done(cuda::attention_forward(a.stream(), a.out<bf16>(0), a.out<float>(1), a.in<bf16>(0),
                                      a.in<bf16>(1), a.in<bf16>(2), AttentionShapeOf(a.step()),
                                      a.f(0), a.i(5) != 0, /*q_pos0=*/0, /*k_pos0=*/0));
}

// ins: dout, q, k, v, out, lse. outs: dq, dk, dv.
absl::Status RunAttentionBackward(const Args& a) {
  return Done(cuda::attention_backward(
      a.stream(), a.out<bf16>(0), a.out<bf16>(1), a.out<bf16>(2), a.in<bf16>(0), a.in<bf16>(1),
      a.in<bf16>(2), a.in<bf16>(3), a.in<bf16>(4), a.in<float>(5), AttentionShapeOf(a.step()),
      a.f(0), a.i(5) != 0, /*q_pos0=*/0, /*k_pos0=*/0, a.workspace()));
}

}  // namespace hcp::cuda_backend::detail
