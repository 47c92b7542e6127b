// The token-local wrappers (one per KernelTable.txt kernel, in table order; the sequence-mixing
// ones are in CudaBackendSequence.cpp), and the two dispatches over the table: RunCudaStep's and
// the workspace's (WorkspaceBytes).
#include "runtime/backends/cuda/CudaBackend.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/support/Status.h"

namespace hcp::cuda_backend {
namespace detail {
namespace {

using plan::DType;
using plan::KernelId;

// Pieces of the workspace are 256-byte aligned, as the kernels' own carving is.
size_t RoundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// ---------------------------------------------------------------------------------------------
// The wrappers, in KernelTable.txt's order, each with the workspace its kernel needs (none
// unless it has a WorkspaceBytes).

// gemm's and gemm_add's dense operands' row strides: the stored matrix's column count, at
// least 1 (which cuBLASLt requires even of an empty matrix).
struct GemmStrides {
  int64_t lda, ldb, ldc;
  template <typename GemmArgs>
  explicit GemmStrides(const GemmArgs& k)
      : lda(std::max<int64_t>(1, k.trans_a ? k.m : k.k)),
        ldb(std::max<int64_t>(1, k.trans_b ? k.k : k.n)),
        ldc(std::max<int64_t>(1, k.n)) {}
};

// a, b bf16; c bf16 or f32.
absl::Status RunGemm(const Args& a, const plan::GemmArgs<DeviceBuffer>& k) {
  const GemmStrides g(k);
  return WithType(k.c.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::gemm<T>(a.gemm(), a.stream(), k.trans_a, k.trans_b, k.m, k.n, k.k,
                              static_cast<float>(k.alpha), k.a.as<bf16>(), g.lda, k.b.as<bf16>(),
                              g.ldb, 0.f, k.c.as<T>(), g.ldc));
  });
}

// a, b bf16; c and out bf16 or f32 (the same).
absl::Status RunGemmAdd(const Args& a, const plan::GemmAddArgs<DeviceBuffer>& k) {
  const GemmStrides g(k);
  return WithType(k.out.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::gemm_add<T>(a.gemm(), a.stream(), k.trans_a, k.trans_b, k.m, k.n, k.k,
                                  static_cast<float>(k.alpha), k.a.as<bf16>(), g.lda,
                                  k.b.as<bf16>(), g.ldb, static_cast<float>(k.beta), k.c.as<T>(),
                                  k.out.as<T>(), g.ldc));
  });
}

// A bad id lowers bad_position (the executor reports it after the step run) and gives a NaN row.
absl::Status RunEmbeddingForward(const Args& a, const plan::EmbeddingForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::embedding_forward(a.stream(), k.out.as<bf16>(), k.ids.as<int32_t>(),
                                      k.table.as<bf16>(), k.tokens, k.vocab, k.hidden,
                                      static_cast<float>(k.multiplier), a.bad_position()));
}

absl::Status RunEmbeddingBackward(const Args& a,
                                  const plan::EmbeddingBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::embedding_backward(
      a.stream(), k.dtable.as<bf16>(), k.dout.as<bf16>(), k.ids.as<int32_t>(), k.tokens, k.vocab,
      k.hidden, static_cast<float>(k.multiplier), k.padding_idx, a.workspace()));
}
size_t WorkspaceBytes(const plan::EmbeddingBackwardArgs<DeviceBuffer>& k) {
  return cuda::embedding_backward_workspace_bytes(k.tokens, k.vocab);
}

// No rstd: the plan does not keep it.
absl::Status RunRmsNormForward(const Args& a, const plan::RmsNormForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::rms_norm_forward(a.stream(), k.y.as<bf16>(), /*rstd=*/nullptr, k.x.as<bf16>(),
                                     k.w.as<bf16>(), k.rows, k.dim, static_cast<float>(k.eps)));
}

// rstd is recomputed from x.
absl::Status RunRmsNormBackward(const Args& a, const plan::RmsNormBackwardArgs<DeviceBuffer>& k) {
  const bf16* dresidual = k.has_residual ? k.dresidual.as<bf16>() : nullptr;
  return Done(cuda::rms_norm_backward(a.stream(), k.dx.as<bf16>(), k.dw.as<bf16>(), k.dy.as<bf16>(),
                                      k.x.as<bf16>(), k.w.as<bf16>(), dresidual,
                                      /*rstd=*/nullptr, k.rows, k.dim, static_cast<float>(k.eps),
                                      a.workspace()));
}
size_t WorkspaceBytes(const plan::RmsNormBackwardArgs<DeviceBuffer>& k) {
  return cuda::rms_norm_backward_workspace_bytes(k.rows, k.dim);
}

absl::Status RunGatedRmsNormForward(const Args& a,
                                    const plan::GatedRmsNormForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::gated_rms_norm_forward(a.stream(), k.out.as<bf16>(), /*rstd=*/nullptr,
                                           k.y.as<bf16>(), k.z.as<bf16>(), k.w.as<bf16>(), k.rows,
                                           k.dim, static_cast<float>(k.eps)));
}

absl::Status RunGatedRmsNormBackward(const Args& a,
                                     const plan::GatedRmsNormBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::gated_rms_norm_backward(
      a.stream(), k.dy.as<bf16>(), k.dz.as<bf16>(), k.dw.as<bf16>(), k.dout.as<bf16>(),
      k.y.as<bf16>(), k.z.as<bf16>(), k.w.as<bf16>(), /*rstd=*/nullptr, k.rows, k.dim,
      static_cast<float>(k.eps), a.workspace()));
}
size_t WorkspaceBytes(const plan::GatedRmsNormBackwardArgs<DeviceBuffer>& k) {
  return cuda::gated_rms_norm_backward_workspace_bytes(k.rows, k.dim);
}

// Elementwise, in the step's type T (f32 or bf16): the forward y = f(x); the backward dx from
// dy and `saved`, the forward's x (silu, softplus) or y (neg_exp).
#define HCP_UNARY_WRAPPER(Id, kernel)                                          \
  absl::Status Run##Id(const Args& a, const plan::Id##Args<DeviceBuffer>& k) { \
    return WithType(k.y.dtype(), [&](auto type) {                              \
      using T = decltype(type);                                                \
      return Done(cuda::kernel<T>(a.stream(), k.y.as<T>(), k.x.as<T>(), k.n)); \
    });                                                                        \
  }
#define HCP_UNARY_BACKWARD_WRAPPER(Id, kernel, saved)                                             \
  absl::Status Run##Id(const Args& a, const plan::Id##Args<DeviceBuffer>& k) {                    \
    return WithType(k.dx.dtype(), [&](auto type) {                                                \
      using T = decltype(type);                                                                   \
      return Done(cuda::kernel<T>(a.stream(), k.dx.as<T>(), k.dy.as<T>(), k.saved.as<T>(), k.n)); \
    });                                                                                           \
  }
HCP_UNARY_WRAPPER(SiluForward, silu_forward)
HCP_UNARY_BACKWARD_WRAPPER(SiluBackward, silu_backward, x)
HCP_UNARY_WRAPPER(SoftplusForward, softplus_forward)
HCP_UNARY_BACKWARD_WRAPPER(SoftplusBackward, softplus_backward, x)
HCP_UNARY_WRAPPER(NegExpForward, neg_exp_forward)
HCP_UNARY_BACKWARD_WRAPPER(NegExpBackward, neg_exp_backward, y)
#undef HCP_UNARY_WRAPPER
#undef HCP_UNARY_BACKWARD_WRAPPER

absl::Status RunSwigluForward(const Args& a, const plan::SwigluForwardArgs<DeviceBuffer>& k) {
  return WithType(k.y.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::swiglu_forward<T>(a.stream(), k.y.as<T>(), k.x.as<T>(), k.rows, k.inner));
  });
}
absl::Status RunSwigluBackward(const Args& a, const plan::SwigluBackwardArgs<DeviceBuffer>& k) {
  return WithType(k.dx.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::swiglu_backward<T>(a.stream(), k.dx.as<T>(), k.dy.as<T>(), k.x.as<T>(),
                                         k.rows, k.inner));
  });
}

absl::Status RunScale(const Args& a, const plan::ScaleArgs<DeviceBuffer>& k) {
  return WithType(k.y.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(
        cuda::scale<T>(a.stream(), k.y.as<T>(), k.x.as<T>(), static_cast<float>(k.factor), k.n));
  });
}

// y[i] = a[i] op b[i % rhs_n], for add, mul and div.
template <typename BinaryArgs>
absl::Status RunBinary(const Args& a, const BinaryArgs& k, cuda::BinaryOp op) {
  return WithType(k.y.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::binary<T>(a.stream(), op, k.y.template as<T>(), k.a.template as<T>(),
                                k.b.template as<T>(), k.n, k.rhs_n));
  });
}
absl::Status RunAdd(const Args& a, const plan::AddArgs<DeviceBuffer>& k) {
  return RunBinary(a, k, cuda::BinaryOp::kAdd);
}
absl::Status RunMul(const Args& a, const plan::MulArgs<DeviceBuffer>& k) {
  return RunBinary(a, k, cuda::BinaryOp::kMul);
}
absl::Status RunDiv(const Args& a, const plan::DivArgs<DeviceBuffer>& k) {
  return RunBinary(a, k, cuda::BinaryOp::kDiv);
}

absl::Status RunSumLeading(const Args& a, const plan::SumLeadingArgs<DeviceBuffer>& k) {
  return WithType(k.y.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(
        cuda::column_sum<T>(a.stream(), k.y.as<T>(), k.x.as<T>(), k.rows, k.cols, a.workspace()));
  });
}
size_t WorkspaceBytes(const plan::SumLeadingArgs<DeviceBuffer>& k) {
  return cuda::column_sum_workspace_bytes(k.rows, k.cols);
}

absl::Status RunFill(const Args& a, const plan::FillArgs<DeviceBuffer>& k) {
  return WithType(k.y.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::fill<T>(a.stream(), k.y.as<T>(), static_cast<float>(k.value), k.n));
  });
}

absl::Status RunSliceColumns(const Args& a, const plan::SliceColumnsArgs<DeviceBuffer>& k) {
  return WithType(k.out.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::slice_columns<T>(a.stream(), k.out.as<T>(), k.in.as<T>(), k.rows, k.in_cols,
                                       k.offset, k.width));
  });
}

absl::Status RunInsertColumns(const Args& a, const plan::InsertColumnsArgs<DeviceBuffer>& k) {
  return WithType(k.out.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::insert_columns<T>(a.stream(), k.out.as<T>(), k.in.as<T>(), k.rows, k.out_cols,
                                        k.offset, k.width));
  });
}

// y = x, n values (copy, and cast between equal dtypes).
template <typename CopyArgs>
absl::Status CopyValues(const Args& a, const CopyArgs& k) {
  return WithType(k.y.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::copy<T>(a.stream(), k.y.template as<T>(), k.x.template as<T>(), k.n));
  });
}
absl::Status RunCopy(const Args& a, const plan::CopyArgs<DeviceBuffer>& k) {
  return CopyValues(a, k);
}

// y = x converted (bf16 <- f32 rounds to nearest even); the same dtype on both sides is a copy.
absl::Status RunCast(const Args& a, const plan::CastArgs<DeviceBuffer>& k) {
  if (k.x.dtype() == k.y.dtype()) return CopyValues(a, k);
  if (k.y.dtype() == DType::BF16) {
    return Done(cuda::cast(a.stream(), k.y.as<bf16>(), k.x.as<float>(), k.n));
  }
  return Done(cuda::cast(a.stream(), k.y.as<float>(), k.x.as<bf16>(), k.n));
}

// logits in the step's type T.
absl::Status RunMoeRouteForward(const Args& a, const plan::MoeRouteForwardArgs<DeviceBuffer>& k) {
  return WithType(k.logits.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::moe_route_forward<T>(a.stream(), k.gates.as<float>(),
                                           k.expert_ids.as<int32_t>(), k.logits.as<T>(), k.tokens,
                                           k.experts, k.k));
  });
}

// dlogits in the step's type T. The expert indices come from moe_route.forward on the device, in
// range by construction; unlike the CPU wrapper this one cannot check them without waiting for
// the device.
absl::Status RunMoeRouteBackward(const Args& a, const plan::MoeRouteBackwardArgs<DeviceBuffer>& k) {
  return WithType(k.dlogits.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::moe_route_backward<T>(a.stream(), k.dlogits.as<T>(), k.dgates.as<float>(),
                                            k.gates.as<float>(), k.expert_ids.as<int32_t>(),
                                            k.tokens, k.experts, k.k));
  });
}

// The load-balancing loss's statistics: logits in the step's type T.
absl::Status RunRouterLoadForward(const Args& a,
                                  const plan::RouterLoadForwardArgs<DeviceBuffer>& k) {
  return WithType(k.logits.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::router_load_forward<T>(a.stream(), k.probs.as<float>(), k.picks.as<float>(),
                                             k.logits.as<T>(), k.expert_ids.as<int32_t>(), k.tokens,
                                             k.experts, k.k, a.workspace()));
  });
}

size_t WorkspaceBytes(const plan::RouterLoadForwardArgs<DeviceBuffer>& k) {
  return cuda::router_load_forward_workspace_bytes(k.tokens, k.experts);
}

absl::Status RunRouterLoadBackward(const Args& a,
                                   const plan::RouterLoadBackwardArgs<DeviceBuffer>& k) {
  return WithType(k.logits.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::router_load_backward<T>(a.stream(), k.dlogits.as<T>(), k.dprobs.as<float>(),
                                              k.logits.as<T>(), k.tokens, k.experts));
  });
}

absl::Status RunRouterAuxLossForward(const Args& a,
                                     const plan::RouterAuxLossForwardArgs<DeviceBuffer>& k) {
  return Done(cuda::router_aux_loss_forward(a.stream(), k.loss.as<float>(), k.probs.as<float>(),
                                            k.picks.as<float>(), k.experts,
                                            static_cast<float>(k.scale)));
}

absl::Status RunRouterAuxLossBackward(const Args& a,
                                      const plan::RouterAuxLossBackwardArgs<DeviceBuffer>& k) {
  return Done(cuda::router_aux_loss_backward(a.stream(), k.dprobs.as<float>(), k.dloss.as<float>(),
                                             k.picks.as<float>(), k.experts,
                                             static_cast<float>(k.scale)));
}

// The routing on the host (cuBLASLt takes the experts' row counts there): the host copy of the
// expert ids, tokens * k of them.
template <typename ExpertsArgs>
absl::StatusOr<cuda::ExpertRoutingOnHost> RoutingOnHost(const Args& a, const ExpertsArgs& k) {
  HCP_ASSIGN_OR_RETURN(std::span<const int32_t> ids, a.host_expert_ids(k.tokens * k.k));
  return cuda::ExpertRoutingOnHost{.indices = ids.data()};
}

// kept_h only with keep_h.
absl::Status RunMoeExpertsForward(const Args& a,
                                  const plan::MoeExpertsForwardArgs<DeviceBuffer>& k) {
  HCP_ASSIGN_OR_RETURN(const cuda::ExpertRoutingOnHost on_host, RoutingOnHost(a, k));
  return Done(cuda::moe_experts_forward(a.gemm(), a.stream(), k.out.as<bf16>(), k.x.as<bf16>(),
                                        k.gates.as<float>(), k.expert_ids.as<int32_t>(),
                                        k.w_in.as<bf16>(), k.w_out.as<bf16>(), k.tokens, k.hidden,
                                        k.inner, k.experts, k.k, a.workspace(), on_host,
                                        cuda::kExpertTokenChunk, k.kept_h.as<bf16>()));
}
size_t WorkspaceBytes(const plan::MoeExpertsForwardArgs<DeviceBuffer>& k) {
  return cuda::moe_experts_forward_workspace_bytes(k.tokens, k.hidden, k.inner, k.experts, k.k);
}

// kept_h only with keep_h (without it the backward recomputes h).
absl::Status RunMoeExpertsBackward(const Args& a,
                                   const plan::MoeExpertsBackwardArgs<DeviceBuffer>& k) {
  HCP_ASSIGN_OR_RETURN(const cuda::ExpertRoutingOnHost on_host, RoutingOnHost(a, k));
  return Done(cuda::moe_experts_backward(
      a.gemm(), a.stream(), k.dx.as<bf16>(), k.dgates.as<float>(), k.dw_in.as<bf16>(),
      k.dw_out.as<bf16>(), k.dout.as<bf16>(), k.x.as<bf16>(), k.gates.as<float>(),
      k.expert_ids.as<int32_t>(), k.w_in.as<bf16>(), k.w_out.as<bf16>(), k.tokens, k.hidden,
      k.inner, k.experts, k.k, a.workspace(), on_host, cuda::kExpertTokenChunk, k.kept_h.as<bf16>(),
      static_cast<float>(k.dout_scale)));
}
size_t WorkspaceBytes(const plan::MoeExpertsBackwardArgs<DeviceBuffer>& k) {
  return cuda::moe_experts_backward_workspace_bytes(k.tokens, k.hidden, k.inner, k.experts, k.k);
}

// cross_entropy's scratch in the workspace, carved in this order (256-byte aligned pieces): the
// lse the plan does not keep (the backward recomputes it with the forward kernel), the loss_sum
// and valid_count of that recomputation (discarded), and the forward kernel's own workspace.
// With a null workspace only `bytes` is meaningful (for WorkspaceBytes).
struct CrossEntropyScratch {
  float* lse = nullptr;
  float* loss_sum = nullptr;
  float* valid_count = nullptr;
  cuda::Workspace forward;
  size_t bytes = 0;
};
CrossEntropyScratch CarveCrossEntropyScratch(cuda::Workspace workspace, int64_t tokens) {
  CrossEntropyScratch s;
  const size_t lse_bytes = RoundUp256(sizeof(float) * std::max<int64_t>(1, tokens));
  const size_t scalar_bytes = 256;  // one float, padded to the next piece's alignment
  const size_t forward_bytes = cuda::cross_entropy_forward_workspace_bytes(tokens);
  s.bytes = lse_bytes + 2 * scalar_bytes + RoundUp256(forward_bytes);
  // Too small (or only sizing): every pointer stays null, and the forward kernel refuses its
  // null workspace before it writes anything.
  if (workspace.ptr == nullptr || workspace.bytes < s.bytes) return s;
  auto* base = static_cast<std::byte*>(workspace.ptr);
  s.lse = reinterpret_cast<float*>(base);
  s.loss_sum = reinterpret_cast<float*>(base + lse_bytes);
  s.valid_count = reinterpret_cast<float*>(base + lse_bytes + scalar_bytes);
  s.forward = cuda::Workspace{base + lse_bytes + 2 * scalar_bytes, forward_bytes};
  return s;
}

// logits in the step's type T. The lse goes to workspace scratch (the backward recomputes it). A
// bad target lowers bad_position and makes the loss NaN.
absl::Status RunCrossEntropyForward(const Args& a,
                                    const plan::CrossEntropyForwardArgs<DeviceBuffer>& k) {
  const CrossEntropyScratch scratch = CarveCrossEntropyScratch(a.workspace(), k.tokens);
  return WithType(k.logits.dtype(), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::cross_entropy_forward<T>(
        a.stream(), k.loss_sum.as<float>(), k.valid_count.as<float>(), scratch.lse,
        k.logits.as<T>(), k.targets.as<int32_t>(), k.tokens, k.vocab, k.ignore_index,
        a.bad_position(), scratch.forward));
  });
}
size_t WorkspaceBytes(const plan::CrossEntropyForwardArgs<DeviceBuffer>& k) {
  return CarveCrossEntropyScratch(cuda::Workspace{}, k.tokens).bytes;
}

// logits and dlogits in the step's type T. lse is recomputed with the forward kernel into
// workspace scratch first (the same kernel on the same logits: the forward's lse bit for bit).
absl::Status RunCrossEntropyBackward(const Args& a,
                                     const plan::CrossEntropyBackwardArgs<DeviceBuffer>& k) {
  const CrossEntropyScratch scratch = CarveCrossEntropyScratch(a.workspace(), k.tokens);
  return WithType(k.logits.dtype(), [&](auto type) {
    using T = decltype(type);
    if (absl::Status s = Done(cuda::cross_entropy_forward<T>(
            a.stream(), scratch.loss_sum, scratch.valid_count, scratch.lse, k.logits.as<T>(),
            k.targets.as<int32_t>(), k.tokens, k.vocab, k.ignore_index, a.bad_position(),
            scratch.forward));
        !s.ok()) {
      return s;
    }
    return Done(cuda::cross_entropy_backward<T>(
        a.stream(), k.dlogits.as<T>(), k.dloss_sum.as<float>(), k.logits.as<T>(), scratch.lse,
        k.targets.as<int32_t>(), k.tokens, k.vocab, k.ignore_index));
  });
}
size_t WorkspaceBytes(const plan::CrossEntropyBackwardArgs<DeviceBuffer>& k) {
  return CarveCrossEntropyScratch(cuda::Workspace{}, k.tokens).bytes;
}

// The collectives are in CudaBackendCollectives.cpp, expert parallelism in
// CudaBackendExperts.cpp.

// ---------------------------------------------------------------------------------------------
// The workspace a step with these arguments needs: its kernel's WorkspaceBytes (the mesh's too
// for the collectives that carve their scratch by it), 0 for a kernel that has none.
template <typename KernelArgs>
size_t WorkspaceBytesOf(const KernelArgs& k, const plan::Mesh& mesh) {
  if constexpr (requires { WorkspaceBytes(k, mesh); }) {
    return WorkspaceBytes(k, mesh);
  } else if constexpr (requires { WorkspaceBytes(k); }) {
    return WorkspaceBytes(k);
  } else {
    return 0;
  }
}

// The workspace a step of `plan` needs. Sizing reads no buffer: they have no address here, only
// their dtype.
size_t StepWorkspaceBytes(const plan::Plan& plan, const plan::Step& step) {
  auto sizing = [&](uint32_t buffer) { return DeviceBuffer(nullptr, plan.buffers[buffer].dtype); };
  switch (step.kernel) {
#define HCP_STEP_WORKSPACE(Id, name) \
  case KernelId::Id:                 \
    return WorkspaceBytesOf(plan::DecodeStep<plan::Id##Args>(step, sizing), plan.mesh);
    HCP_FOR_EACH_KERNEL(HCP_STEP_WORKSPACE)
#undef HCP_STEP_WORKSPACE
  }
  return 0;
}

}  // namespace
}  // namespace detail

absl::Status FromCuda(const cuda::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(status.where(), ": ", status.message()));
}

absl::Status FromCuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status RunCudaStep(const plan::Plan& plan, size_t step_index, const DeviceArenas& arenas,
                         const StepResources& resources) {
  using namespace detail;
  using plan::KernelId;
  const plan::Step& step = plan.steps[step_index];
  const Args args(plan, step, arenas, resources);
  absl::Status status;
  // One case per kernel of the table, its arguments decoded into the kernel's struct: a kernel
  // added to KernelTable.txt without a wrapper here fails to compile (RunX is not declared).
  switch (step.kernel) {
#define HCP_RUN_KERNEL(Id, name)                        \
  case KernelId::Id:                                    \
    status = Run##Id(args, args.Get<plan::Id##Args>()); \
    break;
    HCP_FOR_EACH_KERNEL(HCP_RUN_KERNEL)
#undef HCP_RUN_KERNEL
  }
  if (!status.ok()) {
    return absl::Status(status.code(),
                        plan::StepLabel(plan, step_index) + ": " + std::string(status.message()));
  }
  return absl::OkStatus();
}

size_t WorkspaceBytes(const plan::Plan& plan) {
  size_t bytes = 0;
  for (const plan::Step& step : plan.steps) {
    bytes = std::max(bytes, detail::StepWorkspaceBytes(plan, step));
  }
  return bytes;
}

size_t BesideComputeWorkspaceBytes(const plan::Plan& plan) {
  size_t bytes = 0;
  for (const plan::Step& step : plan.steps) {
    if (plan::RunsBesideCompute(step.kernel)) {
      bytes = std::max(bytes, detail::StepWorkspaceBytes(plan, step));
    }
  }
  return bytes;
}

}  // namespace hcp::cuda_backend
