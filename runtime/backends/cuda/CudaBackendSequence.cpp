// The sequence-mixing wrappers of the CUDA backend, in KernelTable.txt's order, each with the
// workspace its kernel needs: the causal conv, the Mamba2 SSD scan and its log-decay, attention.
// bf16 tensors; dt, A, D, the SSD states and the attention lse are fp32 (SequenceKernels.h).
// Buffers a step does not have (its flags off) are null, which the kernels read as absent.
#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/kernels/cuda/SequenceKernels.h"

namespace hcp::cuda_backend::detail {

// Without a halo every sequence starts at position 0 (zeros before it). silu: y = silu(conv).
absl::Status RunCausalConv1dForward(const Args& a,
                                    const plan::CausalConv1dForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::causal_conv1d_forward(
      a.stream(), k.y.as<bf16>(), k.x.as<bf16>(), k.halo.as<bf16>(), k.w.as<bf16>(),
      k.bias.as<bf16>(), k.batch, k.seq, k.channels, k.width, k.silu, a.positions(k.positions)));
}

// With silu, dy is the gradient of silu's output (the conv output recomputed from x and the
// bias).
absl::Status RunCausalConv1dBackward(const Args& a,
                                     const plan::CausalConv1dBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::causal_conv1d_backward(
      a.stream(), k.dx.as<bf16>(), k.dhalo.as<bf16>(), k.dw.as<bf16>(), k.dbias.as<bf16>(),
      k.dy.as<bf16>(), k.x.as<bf16>(), k.halo.as<bf16>(), k.w.as<bf16>(), k.bias.as<bf16>(),
      k.batch, k.seq, k.channels, k.width, k.silu, a.workspace(), a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::CausalConv1dBackwardArgs<DeviceBuffer>& k) {
  return cuda::causal_conv1d_backward_workspace_bytes(k.batch, k.seq, k.channels, k.width);
}

absl::Status RunSsdScanForward(const Args& a, const plan::SsdScanForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_scan_forward(
      a.stream(), k.y.as<bf16>(), k.final_state.as<float>(), k.x.as<bf16>(), k.dt.as<float>(),
      k.A.as<float>(), k.B.as<bf16>(), k.C.as<bf16>(), k.D.as<float>(), k.init_state.as<float>(),
      SsdShapeOf(k), a.workspace(), a.positions(k.positions), k.chunk_states.as<float>()));
}
size_t WorkspaceBytes(const plan::SsdScanForwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_scan_forward_workspace_bytes(SsdShapeOf(k));
}

absl::Status RunSsdScanBackward(const Args& a, const plan::SsdScanBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_scan_backward(
      a.stream(), k.dx.as<bf16>(), k.ddt.as<float>(), k.dA.as<float>(), k.dB.as<bf16>(),
      k.dC.as<bf16>(), k.dD.as<float>(), k.dinit_state.as<float>(), k.dy.as<bf16>(),
      k.dfinal_state.as<float>(), k.x.as<bf16>(), k.dt.as<float>(), k.A.as<float>(), k.B.as<bf16>(),
      k.C.as<bf16>(), k.D.as<float>(), k.init_state.as<float>(), SsdShapeOf(k), a.workspace(),
      a.positions(k.positions), k.chunk_states.as<float>()));
}
size_t WorkspaceBytes(const plan::SsdScanBackwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_scan_backward_workspace_bytes(SsdShapeOf(k));
}

absl::Status RunSsdLogDecayForward(const Args& a,
                                   const plan::SsdLogDecayForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_log_decay_forward(a.stream(), k.g.as<float>(), k.dt.as<float>(),
                                          k.A.as<float>(), k.batch, k.seq, k.heads, a.workspace(),
                                          a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::SsdLogDecayForwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_log_decay_workspace_bytes(k.batch, k.seq, k.heads);
}

absl::Status RunSsdLogDecayBackward(const Args& a,
                                    const plan::SsdLogDecayBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_log_decay_backward(a.stream(), k.ddt.as<float>(), k.dA.as<float>(),
                                           k.dg.as<float>(), k.dt.as<float>(), k.A.as<float>(),
                                           k.batch, k.seq, k.heads, a.workspace()));
}
size_t WorkspaceBytes(const plan::SsdLogDecayBackwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_log_decay_workspace_bytes(k.batch, k.seq, k.heads);
}

absl::Status RunSsdFinalStateForward(const Args& a,
                                     const plan::SsdFinalStateForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_final_state_forward(
      a.stream(), k.final_state.as<float>(), k.x.as<bf16>(), k.dt.as<float>(), k.A.as<float>(),
      k.B.as<bf16>(), SsdShapeOf(k), a.workspace(), a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::SsdFinalStateForwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_final_state_forward_workspace_bytes(SsdShapeOf(k));
}

absl::Status RunSsdFinalStateBackward(const Args& a,
                                      const plan::SsdFinalStateBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_final_state_backward(
      a.stream(), k.dx.as<bf16>(), k.ddt.as<float>(), k.dA.as<float>(), k.dB.as<bf16>(),
      k.dfinal_state.as<float>(), k.x.as<bf16>(), k.dt.as<float>(), k.A.as<float>(), k.B.as<bf16>(),
      SsdShapeOf(k), a.workspace(), a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::SsdFinalStateBackwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_final_state_backward_workspace_bytes(SsdShapeOf(k));
}

absl::Status RunSsdAddInitialStateForward(
    const Args& a, const plan::SsdAddInitialStateForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_add_initial_state_forward(a.stream(), k.out.as<bf16>(), k.y.as<bf16>(),
                                                  k.dt.as<float>(), k.A.as<float>(), k.C.as<bf16>(),
                                                  k.init_state.as<float>(), SsdShapeOf(k),
                                                  a.workspace(), a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::SsdAddInitialStateForwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_add_initial_state_forward_workspace_bytes(SsdShapeOf(k));
}

absl::Status RunSsdAddInitialStateBackward(
    const Args& a, const plan::SsdAddInitialStateBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::ssd_add_initial_state_backward(
      a.stream(), k.ddt.as<float>(), k.dA.as<float>(), k.dC.as<bf16>(), k.dinit_state.as<float>(),
      k.dout.as<bf16>(), k.dt.as<float>(), k.A.as<float>(), k.C.as<bf16>(),
      k.init_state.as<float>(), SsdShapeOf(k), a.workspace(), a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::SsdAddInitialStateBackwardArgs<DeviceBuffer>& k) {
  return cuda::ssd_add_initial_state_backward_workspace_bytes(SsdShapeOf(k));
}

// Queries and keys both start at position 0.
absl::Status RunAttentionForward(const Args& a, const plan::AttentionForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::attention_forward(a.stream(), k.out.as<bf16>(), k.lse.as<float>(),
                                      k.q.as<bf16>(), k.k.as<bf16>(), k.v.as<bf16>(),
                                      AttentionShapeOf(k), static_cast<float>(k.scale), k.causal,
                                      /*q_pos0=*/0, /*k_pos0=*/0, a.positions(k.positions)));
}

absl::Status RunAttentionBackward(const Args& a,
                                  const plan::AttentionBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::attention_backward(
      a.stream(), k.dq.as<bf16>(), k.dk.as<bf16>(), k.dv.as<bf16>(), k.dout.as<bf16>(),
      k.q.as<bf16>(), k.k.as<bf16>(), k.v.as<bf16>(), k.out.as<bf16>(), k.lse.as<float>(),
      AttentionShapeOf(k), static_cast<float>(k.scale), k.causal, /*q_pos0=*/0, /*k_pos0=*/0,
      a.workspace(), a.positions(k.positions)));
}
size_t WorkspaceBytes(const plan::AttentionBackwardArgs<DeviceBuffer>& k) {
  return cuda::attention_backward_workspace_bytes(AttentionShapeOf(k));
}

}  // namespace hcp::cuda_backend::detail
