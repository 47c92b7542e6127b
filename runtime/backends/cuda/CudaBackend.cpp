// The token-local wrappers (one per KernelTable.def line, in table order; the sequence-mixing
// ones are in CudaBackendSequence.cpp), and RunCudaStep's switch over the table.
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
// The wrappers, in KernelTable.def's order. Argument comments follow the table.

// gemm's and gemm_add's ints (trans_a, trans_b, m, n, k) and dense operands' row strides: the
// stored matrix's column count, at least 1 (which cuBLASLt requires even of an empty matrix).
struct GemmShape {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  explicit GemmShape(const Args& a)
      : trans_a(a.i(0) != 0),
        trans_b(a.i(1) != 0),
        m(a.i(2)),
        n(a.i(3)),
        k(a.i(4)),
        lda(std::max<int64_t>(1, trans_a ? m : k)),
        ldb(std::max<int64_t>(1, trans_b ? k : n)),
        ldc(std::max<int64_t>(1, n)) {}
};

// ins: a, b (bf16). outs: c (bf16 or f32). ints: trans_a, trans_b, m, n, k. floats: alpha.
absl::Status RunGemm(const Args& a) {
  const GemmShape g(a);
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::gemm<T>(a.gemm(), a.stream(), g.trans_a, g.trans_b, g.m, g.n, g.k, a.f(0),
                              a.in<bf16>(0), g.lda, a.in<bf16>(1), g.ldb, 0.f, a.out<T>(0), g.ldc));
  });
}

// ins: a, b (bf16), c (as out). outs: out (bf16 or f32). ints, floats: gemm's.
absl::Status RunGemmAdd(const Args& a) {
  const GemmShape g(a);
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::gemm_add<T>(a.gemm(), a.stream(), g.trans_a, g.trans_b, g.m, g.n, g.k, a.f(0),
                                  a.in<bf16>(0), g.lda, a.in<bf16>(1), g.ldb, a.in<T>(2),
                                  a.out<T>(0), g.ldc));
  });
}

// ins: table, ids. outs: out. ints: tokens, vocab, hidden. floats: multiplier. A bad id lowers
// bad_position (the executor reports it after the step run) and gives a NaN row.
absl::Status RunEmbeddingForward(const Args& a) {
  return Done(cuda::embedding_forward(a.stream(), a.out<bf16>(0), a.in_i32(1), a.in<bf16>(0),
                                      a.i(0), a.i(1), a.i(2), a.f(0), a.bad_position()));
}

// ins: dout, ids. outs: dtable. ints: tokens, vocab, hidden, padding_idx. floats: multiplier.
absl::Status RunEmbeddingBackward(const Args& a) {
  return Done(cuda::embedding_backward(a.stream(), a.out<bf16>(0), a.in<bf16>(0), a.in_i32(1),
                                       a.i(0), a.i(1), a.i(2), a.f(0), a.i(3), a.workspace()));
}

// ins: x, w. outs: y. ints: rows, dim. floats: eps. No rstd: the plan does not keep it.
absl::Status RunRmsNormForward(const Args& a) {
  return Done(cuda::rms_norm_forward(a.stream(), a.out<bf16>(0), /*rstd=*/nullptr, a.in<bf16>(0),
                                     a.in<bf16>(1), a.i(0), a.i(1), a.f(0)));
}

// ins: dy, x, w. outs: dx, dw. ints: rows, dim. floats: eps. rstd is recomputed from x.
absl::Status RunRmsNormBackward(const Args& a) {
  return Done(cuda::rms_norm_backward(a.stream(), a.out<bf16>(0), a.out<bf16>(1), a.in<bf16>(0),
                                      a.in<bf16>(1), a.in<bf16>(2), /*rstd=*/nullptr, a.i(0),
                                      a.i(1), a.f(0), a.workspace()));
}

// ins: y, z, w. outs: out. ints: rows, dim. floats: eps.
absl::Status RunGatedRmsNormForward(const Args& a) {
  return Done(cuda::gated_rms_norm_forward(a.stream(), a.out<bf16>(0), /*rstd=*/nullptr,
                                           a.in<bf16>(0), a.in<bf16>(1), a.in<bf16>(2), a.i(0),
                                           a.i(1), a.f(0)));
}

// ins: dout, y, z, w. outs: dy, dz, dw. ints: rows, dim. floats: eps.
absl::Status RunGatedRmsNormBackward(const Args& a) {
  return Done(cuda::gated_rms_norm_backward(
      a.stream(), a.out<bf16>(0), a.out<bf16>(1), a.out<bf16>(2), a.in<bf16>(0), a.in<bf16>(1),
      a.in<bf16>(2), a.in<bf16>(3), /*rstd=*/nullptr, a.i(0), a.i(1), a.f(0), a.workspace()));
}

// Elementwise, in the step's type T (f32 or bf16). ints: n. Backward ins: dy, then x (silu,
// softplus) or y (neg_exp).
#define HCP_UNARY_WRAPPER(Id, kernel)                                            \
  absl::Status Run##Id(const Args& a) {                                          \
    return WithType(a.out_dtype(0), [&](auto type) {                             \
      using T = decltype(type);                                                  \
      return Done(cuda::kernel<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.i(0))); \
    });                                                                          \
  }
#define HCP_UNARY_BACKWARD_WRAPPER(Id, kernel)                                               \
  absl::Status Run##Id(const Args& a) {                                                      \
    return WithType(a.out_dtype(0), [&](auto type) {                                         \
      using T = decltype(type);                                                              \
      return Done(cuda::kernel<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.in<T>(1), a.i(0))); \
    });                                                                                      \
  }
HCP_UNARY_WRAPPER(SiluForward, silu_forward)
HCP_UNARY_BACKWARD_WRAPPER(SiluBackward, silu_backward)
HCP_UNARY_WRAPPER(SoftplusForward, softplus_forward)
HCP_UNARY_BACKWARD_WRAPPER(SoftplusBackward, softplus_backward)
HCP_UNARY_WRAPPER(NegExpForward, neg_exp_forward)
HCP_UNARY_BACKWARD_WRAPPER(NegExpBackward, neg_exp_backward)
#undef HCP_UNARY_WRAPPER
#undef HCP_UNARY_BACKWARD_WRAPPER

// ins: x [rows, 2*inner]. outs: y [rows, inner]. ints: rows, inner.
absl::Status RunSwigluForward(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::swiglu_forward<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.i(0), a.i(1)));
  });
}
// ins: dy, x. outs: dx. ints: rows, inner.
absl::Status RunSwigluBackward(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(
        cuda::swiglu_backward<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.in<T>(1), a.i(0), a.i(1)));
  });
}

// y = x * factor. ints: n. floats: factor.
absl::Status RunScale(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::scale<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.f(0), a.i(0)));
  });
}

// y[i] = a[i] op b[i % rhs_n]. ints: n, rhs_n.
absl::Status RunBinary(const Args& a, cuda::BinaryOp op) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(
        cuda::binary<T>(a.stream(), op, a.out<T>(0), a.in<T>(0), a.in<T>(1), a.i(0), a.i(1)));
  });
}
absl::Status RunAdd(const Args& a) { return RunBinary(a, cuda::BinaryOp::kAdd); }
absl::Status RunMul(const Args& a) { return RunBinary(a, cuda::BinaryOp::kMul); }
absl::Status RunDiv(const Args& a) { return RunBinary(a, cuda::BinaryOp::kDiv); }

// y[c] = sum_r x[r, c]. ints: rows, cols.
absl::Status RunSumLeading(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(
        cuda::column_sum<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.i(0), a.i(1), a.workspace()));
  });
}

// ints: n. floats: value.
absl::Status RunFill(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::fill<T>(a.stream(), a.out<T>(0), a.f(0), a.i(0)));
  });
}

// out[r, :] = in[r, offset : offset + width]. ints: rows, in_cols, offset, width.
absl::Status RunSliceColumns(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::slice_columns<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.i(0), a.i(1), a.i(2),
                                       a.i(3)));
  });
}

// out[r, offset : offset + width] = in[r, :]. ints: rows, out_cols, offset, width.
absl::Status RunInsertColumns(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::insert_columns<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.i(0), a.i(1), a.i(2),
                                        a.i(3)));
  });
}

// ints: n.
absl::Status RunCopy(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::copy<T>(a.stream(), a.out<T>(0), a.in<T>(0), a.i(0)));
  });
}

// y = x converted (bf16 <- f32 rounds to nearest even); the same dtype on both sides is a copy.
// ints: n.
absl::Status RunCast(const Args& a) {
  const DType from = a.in_dtype(0), to = a.out_dtype(0);
  const int64_t n = a.i(0);
  if (from == to) return RunCopy(a);
  if (to == DType::BF16) {
    return Done(cuda::cast(a.stream(), a.out<bf16>(0), a.in<float>(0), n));
  }
  return Done(cuda::cast(a.stream(), a.out<float>(0), a.in<bf16>(0), n));
}

// ins: logits (T). outs: gates (f32), experts (i32). ints: tokens, experts, k.
absl::Status RunMoeRouteForward(const Args& a) {
  return WithType(a.in_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::moe_route_forward<T>(a.stream(), a.out<float>(0), a.out_i32(1), a.in<T>(0),
                                           a.i(0), a.i(1), a.i(2)));
  });
}

// ins: dgates, gates, experts (i32). outs: dlogits (T). ints: tokens, experts, k. The expert
// indices come from moe_route.forward on the device, in range by construction; unlike the CPU
// wrapper this one cannot check them without waiting for the device.
absl::Status RunMoeRouteBackward(const Args& a) {
  return WithType(a.out_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::moe_route_backward<T>(a.stream(), a.out<T>(0), a.in<float>(0), a.in<float>(1),
                                            a.in_i32(2), a.i(0), a.i(1), a.i(2)));
  });
}

// The routing on the host (cuBLASLt takes the experts' row counts there): the host copy of the
// expert ids. ints: tokens, hidden, inner, experts, k.
absl::StatusOr<cuda::ExpertRoutingOnHost> RoutingOnHost(const Args& a) {
  HCP_ASSIGN_OR_RETURN(std::span<const int32_t> ids, a.host_expert_ids(a.i(0) * a.i(4)));
  return cuda::ExpertRoutingOnHost{.indices = ids.data()};
}

// ins: x, gates, experts (i32), w_in, w_out. outs: out [, kept_h]. ints: tokens, hidden, inner,
// experts, k, keep_h.
absl::Status RunMoeExpertsForward(const Args& a) {
  HCP_ASSIGN_OR_RETURN(const cuda::ExpertRoutingOnHost on_host, RoutingOnHost(a));
  return Done(cuda::moe_experts_forward(
      a.gemm(), a.stream(), a.out<bf16>(0), a.in<bf16>(0), a.in<float>(1), a.in_i32(2),
      a.in<bf16>(3), a.in<bf16>(4), a.i(0), a.i(1), a.i(2), a.i(3), a.i(4), a.workspace(), on_host,
      cuda::kExpertTokenChunk, a.i(5) == 1 ? a.out<bf16>(1) : nullptr));
}

// ins: dout, x, gates, experts (i32), w_in, w_out [, kept_h]. outs: dx, dgates, dw_in, dw_out.
absl::Status RunMoeExpertsBackward(const Args& a) {
  HCP_ASSIGN_OR_RETURN(const cuda::ExpertRoutingOnHost on_host, RoutingOnHost(a));
  return Done(cuda::moe_experts_backward(
      a.gemm(), a.stream(), a.out<bf16>(0), a.out<float>(1), a.out<bf16>(2), a.out<bf16>(3),
      a.in<bf16>(0), a.in<bf16>(1), a.in<float>(2), a.in_i32(3), a.in<bf16>(4), a.in<bf16>(5),
      a.i(0), a.i(1), a.i(2), a.i(3), a.i(4), a.workspace(), on_host, cuda::kExpertTokenChunk,
      a.i(5) == 1 ? a.in<bf16>(6) : nullptr));
}

// ins: logits (T), targets (i32). outs: loss_sum, valid_count (f32). ints: tokens, vocab,
// ignore_index. The lse goes to workspace scratch (the backward recomputes it). A bad target
// lowers bad_position and makes the loss NaN.
absl::Status RunCrossEntropyForward(const Args& a) {
  const int64_t tokens = a.i(0);
  const CrossEntropyScratch scratch = CarveCrossEntropyScratch(a.workspace(), tokens);
  return WithType(a.in_dtype(0), [&](auto type) {
    using T = decltype(type);
    return Done(cuda::cross_entropy_forward<T>(a.stream(), a.out<float>(0), a.out<float>(1),
                                               scratch.lse, a.in<T>(0), a.in_i32(1), tokens, a.i(1),
                                               a.i(2), a.bad_position(), scratch.forward));
  });
}

// ins: dloss_sum (f32), logits (T), targets (i32). outs: dlogits (T). ints: tokens, vocab,
// ignore_index. lse is recomputed with the forward kernel into workspace scratch first (the
// same kernel on the same logits: the forward's lse bit for bit).
absl::Status RunCrossEntropyBackward(const Args& a) {
  const int64_t tokens = a.i(0), vocab = a.i(1), ignore_index = a.i(2);
  const CrossEntropyScratch scratch = CarveCrossEntropyScratch(a.workspace(), tokens);
  return WithType(a.in_dtype(1), [&](auto type) {
    using T = decltype(type);
    if (absl::Status s = Done(cuda::cross_entropy_forward<T>(
            a.stream(), scratch.loss_sum, scratch.valid_count, scratch.lse, a.in<T>(1), a.in_i32(2),
            tokens, vocab, ignore_index, a.bad_position(), scratch.forward));
        !s.ok()) {
      return s;
    }
    return Done(cuda::cross_entropy_backward<T>(a.stream(), a.out<T>(0), a.in<float>(0), a.in<T>(1),
                                                scratch.lse, a.in_i32(2), tokens, vocab,
                                                ignore_index));
  });
}

// The collectives are in CudaBackendCollectives.cpp, expert parallelism in
// CudaBackendExperts.cpp.
}  // namespace

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
  // One case per kernel of the table: a kernel added to KernelTable.txt without a wrapper here
  // fails to compile (RunX is not declared).
  switch (step.kernel) {
#define HCP_RUN_KERNEL(Id, name) \
  case KernelId::Id:             \
    status = Run##Id(args);      \
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

}  // namespace hcp::cuda_backend
