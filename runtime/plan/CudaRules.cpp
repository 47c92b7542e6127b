// What the CUDA backend can run, as rules over a plan alone (no CUDA): the backend checks a plan
// with them before it runs one, and `hybridcp compile --dtype bf16` before it writes one.
#include "runtime/plan/CudaRules.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hcp::cuda_backend {
namespace {

using plan::DType;
using plan::KernelId;

// The shapes the sequence kernels take (cuda::SsdShape, cuda::AttentionShape in
// runtime/kernels/cuda/SequenceKernels.h), from a step's ints as the backend's wrappers read them
// (CudaBackendSequence.cpp).
struct SsdShape {
  int64_t batch, seq, heads, head_dim, groups, state, chunk;
};
SsdShape SsdShapeOf(const plan::Step& step) {
  const std::vector<int64_t>& v = step.ints;
  // ssd_add_initial_state is not chunked: its ints stop before the chunk, its kernels take 256.
  const bool chunked = step.kernel != KernelId::SsdAddInitialStateForward &&
                       step.kernel != KernelId::SsdAddInitialStateBackward;
  return SsdShape{v[0], v[1], v[2], v[3], v[4], v[5], chunked ? v[6] : 256};
}

struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
};
AttentionShape AttentionShapeOf(const plan::Step& step) {
  const std::vector<int64_t>& v = step.ints;
  return AttentionShape{v[0], v[1], v[2], v[3], v[4]};
}

// ---------------------------------------------------------------------------------------------
// Dtypes. What a CUDA kernel takes for each buffer of a step, in the step's order.
enum class Want : uint8_t {
  kBf16,
  kF32,
  kI32,
  kT,      // the step's compute type: f32 or bf16, the dtype of the signature's reference buffer
  kFloat,  // f32 or bf16, each buffer on its own (cast; gemm's C)
};

struct Signature {
  std::vector<Want> ins, outs;
  // The buffer whose dtype is the step's type T (when some entry is kT).
  bool t_from_output = true;
  int t_index = 0;
};

Signature Uniform(int ins, int outs) {
  return Signature{std::vector<Want>(ins, Want::kT), std::vector<Want>(outs, Want::kT)};
}
Signature AllBf16(int ins, int outs) {
  return Signature{std::vector<Want>(ins, Want::kBf16), std::vector<Want>(outs, Want::kBf16)};
}

// The dtypes of the CUDA kernels (Kernels.h, SequenceKernels.h); `ins`/`outs` count the step's
// buffers (its flags resolved). Collectives never get here.
Signature SignatureOf(const plan::Step& step, int ins, int outs) {
  constexpr Want B = Want::kBf16, F = Want::kF32, I = Want::kI32, T = Want::kT;
  switch (step.kernel) {
    case KernelId::Gemm:
      return Signature{{B, B}, {Want::kFloat}};
    case KernelId::GemmAdd:
      return Signature{{B, B, T}, {T}};
    case KernelId::EmbeddingForward:
    case KernelId::EmbeddingBackward:
      return Signature{{B, I}, {B}};
    case KernelId::RmsNormForward:
    case KernelId::RmsNormBackward:
    case KernelId::GatedRmsNormForward:
    case KernelId::GatedRmsNormBackward:
    case KernelId::CausalConv1dForward:
    case KernelId::CausalConv1dBackward:
      return AllBf16(ins, outs);
    case KernelId::SiluForward:
    case KernelId::SiluBackward:
    case KernelId::SoftplusForward:
    case KernelId::SoftplusBackward:
    case KernelId::NegExpForward:
    case KernelId::NegExpBackward:
    case KernelId::SwigluForward:
    case KernelId::SwigluBackward:
    case KernelId::Scale:
    case KernelId::Add:
    case KernelId::Mul:
    case KernelId::Div:
    case KernelId::SumLeading:
    case KernelId::Fill:
    case KernelId::SliceColumns:
    case KernelId::InsertColumns:
    case KernelId::Copy:
      return Uniform(ins, outs);
    case KernelId::Cast:
      return Signature{{Want::kFloat}, {Want::kFloat}};
    case KernelId::SsdScanForward: {
      // x, dt, A, B, C, D[, init_state] -> y, final_state.
      Signature s{{B, F, F, B, B, F}, {B, F}};
      s.ins.resize(ins, F);
      return s;
    }
    case KernelId::SsdScanBackward: {
      // dy, x, dt, A, B, C, D[, init_state][, dfinal_state] -> dx, ddt, dA, dB, dC, dD[, dinit].
      Signature s{{B, B, F, F, B, B, F}, {B, F, F, B, B, F}};
      s.ins.resize(ins, F);
      s.outs.resize(outs, F);
      return s;
    }
    case KernelId::SsdFinalStateForward:
      // x, dt, A, B -> final_state.
      return Signature{{B, F, F, B}, {F}};
    case KernelId::SsdFinalStateBackward:
      // dfinal_state, x, dt, A, B -> dx, ddt, dA, dB.
      return Signature{{F, B, F, F, B}, {B, F, F, B}};
    case KernelId::SsdLogDecayForward:
    case KernelId::SsdLogDecayBackward:
      return Signature{std::vector<Want>(ins, F), std::vector<Want>(outs, F)};
    case KernelId::SsdAddInitialStateForward:
      // y, dt, A, C, init_state -> out.
      return Signature{{B, F, F, B, F}, {B}};
    case KernelId::SsdAddInitialStateBackward:
      // dout, dt, A, C, init_state -> ddt, dA, dC, dinit_state.
      return Signature{{B, F, F, B, F}, {F, F, B, F}};
    case KernelId::AttentionForward:
    case KernelId::RingAttentionForward:
      return Signature{{B, B, B}, {B, F}};
    case KernelId::AttentionBackward:
    case KernelId::RingAttentionBackward:
      return Signature{{B, B, B, B, B, F}, {B, B, B}};
    case KernelId::MoeRouteForward:
      return Signature{{T}, {F, I}, /*t_from_output=*/false, 0};
    case KernelId::MoeRouteBackward:
      return Signature{{F, F, I}, {T}};
    case KernelId::MoeExpertsForward: {
      Signature s{{B, F, I, B, B}, {B}};
      s.outs.resize(outs, B);  // [, kept_h]
      return s;
    }
    case KernelId::MoeExpertsBackward: {
      Signature s{{B, B, F, I, B, B}, {B, F, B, B}};
      s.ins.resize(ins, B);  // [, kept_h]
      return s;
    }
    case KernelId::CrossEntropyForward:
      return Signature{{T, I}, {F, F}, /*t_from_output=*/false, 0};
    case KernelId::CrossEntropyBackward:
      return Signature{{F, T, I}, {T}, /*t_from_output=*/false, 1};
    case KernelId::HaloExchangeForward:  // the conv input's type
    case KernelId::HaloExchangeBackward:
    case KernelId::AllReduce:
      return Uniform(ins, outs);
    case KernelId::StateScanForward:
    case KernelId::StateScanBackward:
      return Signature{std::vector<Want>(ins, F), std::vector<Want>(outs, F)};
    case KernelId::MoeExpertsEpForward:
      return Signature{{B, F, I, B, B}, {B}};
    case KernelId::MoeExpertsEpBackward:
      return Signature{{B, B, F, I, B, B}, {B, F, B, B}};
  }
  return Signature{};
}

std::string_view WantName(Want want, DType t) {
  switch (want) {
    case Want::kBf16:
      return "bf16";
    case Want::kF32:
      return "f32";
    case Want::kI32:
      return "i32";
    case Want::kT:
      return plan::DTypeName(t);
    case Want::kFloat:
      return "f32 or bf16";
  }
  return "?";
}

bool Allows(Want want, DType dtype, DType t) {
  switch (want) {
    case Want::kBf16:
      return dtype == DType::BF16;
    case Want::kF32:
      return dtype == DType::F32;
    case Want::kI32:
      return dtype == DType::I32;
    case Want::kT:
      return dtype == t;
    case Want::kFloat:
      return dtype == DType::F32 || dtype == DType::BF16;
  }
  return false;
}

// "input 1 'act.7' is bf16, the CUDA kernel takes f32" for each buffer of the step that does not
// have the dtype its kernel takes.
std::vector<std::string> DTypeProblems(const plan::Plan& plan, const plan::Step& step) {
  std::vector<std::string> problems;
  const Signature sig =
      SignatureOf(step, static_cast<int>(step.ins.size()), static_cast<int>(step.outs.size()));
  auto role = [](bool output) { return output ? "output" : "input"; };
  // The step's type: that of its reference buffer, which must itself be f32 or bf16.
  DType t = DType::F32;
  const std::vector<Want>& ref_list = sig.t_from_output ? sig.outs : sig.ins;
  const bool has_t = std::find(sig.ins.begin(), sig.ins.end(), Want::kT) != sig.ins.end() ||
                     std::find(sig.outs.begin(), sig.outs.end(), Want::kT) != sig.outs.end();
  std::string t_source;
  if (has_t && sig.t_index < static_cast<int>(ref_list.size())) {
    const uint32_t index = (sig.t_from_output ? step.outs : step.ins)[sig.t_index];
    const plan::Buffer& b = plan.buffers[index];
    t = b.dtype;
    t_source = absl::StrFormat(" (the step's type, from %s %d '%s')", role(sig.t_from_output),
                               sig.t_index, b.name);
    if (t != DType::F32 && t != DType::BF16) {
      problems.push_back(absl::StrFormat("%s %d '%s' is %s, the CUDA kernel takes f32 or bf16",
                                         role(sig.t_from_output), sig.t_index, b.name,
                                         plan::DTypeName(t)));
      return problems;
    }
  }
  auto check = [&](bool output, const std::vector<uint32_t>& buffers,
                   const std::vector<Want>& wants) {
    for (size_t i = 0; i < buffers.size() && i < wants.size(); ++i) {
      const plan::Buffer& b = plan.buffers[buffers[i]];
      if (Allows(wants[i], b.dtype, t)) continue;
      problems.push_back(absl::StrFormat(
          "%s %d '%s' is %s, the CUDA kernel takes %s%s", role(output), i, b.name,
          plan::DTypeName(b.dtype), WantName(wants[i], t), wants[i] == Want::kT ? t_source : ""));
    }
  };
  check(false, step.ins, sig.ins);
  check(true, step.outs, sig.outs);
  return problems;
}

// ---------------------------------------------------------------------------------------------
// Shapes the kernels support (beyond what ValidatePlan already guarantees).
std::vector<std::string> ShapeProblems(const plan::Step& step) {
  std::vector<std::string> problems;
  const std::vector<int64_t>& v = step.ints;
  auto require = [&](bool ok, std::string message) {
    if (!ok) problems.push_back(std::move(message));
  };
  switch (step.kernel) {
    case KernelId::RmsNormForward:
    case KernelId::RmsNormBackward:
    case KernelId::GatedRmsNormForward:
    case KernelId::GatedRmsNormBackward:
      require(v[1] <= 32768, absl::StrFormat("dim %d is above the CUDA norms' 32768", v[1]));
      break;
    case KernelId::EmbeddingBackward:
      require(
          v[0] <= std::numeric_limits<int32_t>::max() && v[1] < std::numeric_limits<int32_t>::max(),
          absl::StrFormat("tokens %d or vocab %d do not fit the CUDA kernel's int32 sort", v[0],
                          v[1]));
      break;
    case KernelId::CausalConv1dForward:
    case KernelId::CausalConv1dBackward:
      require(v[3] <= 8, absl::StrFormat("conv width %d is above the CUDA kernel's 8", v[3]));
      require(v[0] <= 65535, absl::StrFormat("batch %d is above the CUDA kernel's 65535", v[0]));
      break;
    case KernelId::SsdScanForward:
    case KernelId::SsdScanBackward:
    case KernelId::SsdFinalStateForward:
    case KernelId::SsdFinalStateBackward:
    case KernelId::SsdAddInitialStateForward:  // not chunked: SsdShapeOf gives it chunk 256
    case KernelId::SsdAddInitialStateBackward: {
      const SsdShape s = SsdShapeOf(step);
      require(s.chunk == 256, absl::StrFormat("chunk %d: the CUDA SSD kernels take 256", s.chunk));
      require(s.state == 128, absl::StrFormat("state %d: the CUDA SSD kernels take 128", s.state));
      require(s.head_dim == 32 || s.head_dim == 64,
              absl::StrFormat("head_dim %d: the CUDA SSD kernels take 32 or 64", s.head_dim));
      // The grid limits (batch * groups, heads, chunks) behind anything the checks above pass:
      // those of cuda::ssd_supported, which the kernels check again before they launch.
      if (problems.empty()) {
        require(s.batch * s.groups <= 65535 && s.heads <= 65535 && (s.seq + 255) / 256 <= 32767,
                absl::StrFormat("batch %d x groups %d, heads %d or seq %d exceed the CUDA SSD "
                                "kernels' grid limits",
                                s.batch, s.groups, s.heads, s.seq));
      }
      break;
    }
    case KernelId::SsdLogDecayForward:
    case KernelId::SsdLogDecayBackward:
      require(v[0] <= 65535 && (v[1] + 1023) / 1024 <= 65535,
              absl::StrFormat("batch %d or seq %d exceed the CUDA kernel's limits (65535, "
                              "65535*1024)",
                              v[0], v[1]));
      break;
    case KernelId::AttentionForward:
    case KernelId::AttentionBackward:
    case KernelId::RingAttentionForward:
    case KernelId::RingAttentionBackward: {
      const AttentionShape s = AttentionShapeOf(step);
      require(
          s.head_dim == 64 || s.head_dim == 128,
          absl::StrFormat("head_dim %d: the CUDA attention kernels take 64 or 128", s.head_dim));
      if (problems.empty()) {
        // cuda::attention_supported's grid limits (64-row blocks).
        require(s.batch <= 65535 && s.q_heads <= 65535 && (s.seq + 63) / 64 <= 0x7fffffff,
                absl::StrFormat("batch %d or q_heads %d exceed the CUDA attention kernels' grid "
                                "limits (65535)",
                                s.batch, s.q_heads));
      }
      break;
    }
    case KernelId::MoeRouteForward:
    case KernelId::MoeRouteBackward:
      require(v[1] <= 256,
              absl::StrFormat("%d experts: the CUDA routing kernels take at most 256", v[1]));
      require(v[2] <= 16,
              absl::StrFormat("k = %d: the CUDA routing kernels take at most 16", v[2]));
      break;
    case KernelId::MoeExpertsForward:
    case KernelId::MoeExpertsBackward:
    case KernelId::MoeExpertsEpForward:
    case KernelId::MoeExpertsEpBackward: {
      // With ep, a rank runs E/ep experts on up to ep * tokens * k arriving rows.
      const bool ep = step.kernel == KernelId::MoeExpertsEpForward ||
                      step.kernel == KernelId::MoeExpertsEpBackward;
      const int64_t ranks = ep ? v[5] : 1;
      require(v[3] / ranks <= 4096,
              absl::StrFormat("%d experts per GPU: the CUDA expert kernels take at most 4096",
                              v[3] / ranks));
      require(v[4] <= 16, absl::StrFormat("k = %d: the CUDA expert kernels take at most 16", v[4]));
      require(ranks <= 16,
              absl::StrFormat("ep = %d: the CUDA expert exchange takes at most 16 ranks", ranks));
      require(
          ranks * v[0] * v[4] <= std::numeric_limits<int32_t>::max(),
          absl::StrFormat("%d*%d*%d (rank, token, slot) rows do not fit int32", ranks, v[0], v[4]));
      break;
    }
    default:
      break;
  }
  return problems;
}

}  // namespace

absl::Status CheckPlanRunsOnCuda(const plan::Plan& plan) {
  // An f32 plan fails every step's check; say what to do instead of listing the first one.
  if (!plan.StoresBf16()) {
    return absl::InvalidArgumentError(
        "the plan stores its tensors in f32 (compiled without --dtype bf16), which the CPU "
        "backend runs; the CUDA backend runs bf16 plans: compile with --dtype bf16");
  }
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const plan::Step& step = plan.steps[i];
    std::vector<std::string> problems = DTypeProblems(plan, step);
    // Shapes only once the dtypes are right (a plan of the wrong dtype is the first thing to fix).
    if (problems.empty()) problems = ShapeProblems(step);
    if (!problems.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(plan::StepLabel(plan, i), ": ", absl::StrJoin(problems, "; ")));
    }
  }
  return absl::OkStatus();
}

}  // namespace hcp::cuda_backend
