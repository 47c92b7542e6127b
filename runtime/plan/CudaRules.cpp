// What the CUDA backend can run, as rules over a plan alone (no CUDA): the backend checks a plan
// with them before it runs one, and `hybridcp compile --dtype bf16` before it writes one.
#include "runtime/plan/CudaRules.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/KernelTable.h"

namespace hcp::cuda_backend {
namespace {

using plan::DType;
using plan::KernelId;

// ---------------------------------------------------------------------------------------------
// Dtypes. A CUDA kernel takes each buffer in the table's dtype, `storage` being bf16 (the
// backend runs bf16 plans), except the buffers CudaDTypesOf names.
enum class Want : uint8_t {
  kBf16,
  kF32,
  kI32,
  kT,      // the step's compute type: f32 or bf16, the dtype of its step_type_from buffer
  kFloat,  // f32 or bf16, each buffer on its own (cast; gemm's C)
};

// Where a kernel's CUDA dtypes differ from the table's, by buffer name.
struct CudaDTypes {
  bool all_step_type = false;                    // every buffer takes T (the elementwise kernels)
  std::vector<std::string_view> step_type = {};  // these take T
  std::string_view step_type_from = {};          // the buffer whose dtype is T (if some take it)
  std::vector<std::string_view> any_float = {};  // these take f32 or bf16, each on its own
};

// Elementwise kernels compute in whichever float type their output has.
CudaDTypes Elementwise(KernelId kernel) {
  return CudaDTypes{.all_step_type = true,
                    .step_type_from = plan::GetKernelSignature(kernel).outs[0].name};
}

// The dtypes of the CUDA kernels (Kernels.h, SequenceKernels.h) that the table does not say.
CudaDTypes CudaDTypesOf(KernelId kernel) {
  switch (kernel) {
    case KernelId::Gemm:
      return CudaDTypes{.any_float = {"c"}};
    case KernelId::GemmAdd:
      return CudaDTypes{.step_type = {"c", "out"}, .step_type_from = "out"};
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
    case KernelId::HaloExchangeForward:  // the conv input's type
    case KernelId::HaloExchangeBackward:
    case KernelId::AllReduce:
      return Elementwise(kernel);
    case KernelId::Cast:
      return CudaDTypes{.any_float = {"x", "y"}};
    case KernelId::MoeRouteForward:
      return CudaDTypes{.step_type = {"logits"}, .step_type_from = "logits"};
    case KernelId::MoeRouteBackward:
      return CudaDTypes{.step_type = {"dlogits"}, .step_type_from = "dlogits"};
    case KernelId::RouterLoadForward:
      return CudaDTypes{.step_type = {"logits"}, .step_type_from = "logits"};
    case KernelId::RouterLoadBackward:
      return CudaDTypes{.step_type = {"logits", "dlogits"}, .step_type_from = "logits"};
    case KernelId::CrossEntropyForward:
      return CudaDTypes{.step_type = {"logits"}, .step_type_from = "logits"};
    case KernelId::CrossEntropyBackward:
      return CudaDTypes{.step_type = {"logits", "dlogits"}, .step_type_from = "logits"};
    default:
      return CudaDTypes{};
  }
}

bool Names(const std::vector<std::string_view>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Want WantOf(const plan::BufferSpec& spec, const CudaDTypes& cuda) {
  if (cuda.all_step_type || Names(cuda.step_type, spec.name)) return Want::kT;
  if (Names(cuda.any_float, spec.name)) return Want::kFloat;
  switch (spec.dtype) {
    case plan::DTypeRule::Storage:
      return Want::kBf16;
    case plan::DTypeRule::F32:
      return Want::kF32;
    case plan::DTypeRule::I32:
      return Want::kI32;
  }
  return Want::kF32;
}

// One buffer of a step: where it is in the step's lists, the argument it is, what the CUDA
// kernel takes for it.
struct StepBuffer {
  bool output;
  int position;
  std::string_view argument;
  const plan::Buffer* buffer;
  Want want;
};

// The step's buffers, inputs then outputs, in the step's order (the absent optional ones left
// out).
std::vector<StepBuffer> StepBuffers(const plan::Plan& plan, const plan::Step& step,
                                    const CudaDTypes& cuda) {
  const plan::KernelSignature& signature = plan::GetKernelSignature(step.kernel);
  std::vector<StepBuffer> buffers;
  auto add = [&](bool output, std::span<const plan::BufferSpec> specs,
                 const std::vector<uint32_t>& indices) {
    int position = 0;
    for (const plan::BufferSpec& spec : specs) {
      if (spec.present_if >= 0 && step.ints[spec.present_if] == 0) continue;
      buffers.push_back(StepBuffer{output, position, spec.name, &plan.buffers[indices[position]],
                                   WantOf(spec, cuda)});
      ++position;
    }
  };
  add(false, signature.ins, step.ins);
  add(true, signature.outs, step.outs);
  return buffers;
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

std::string_view Role(bool output) { return output ? "output" : "input"; }

// "input 1 'act.7' is bf16, the CUDA kernel takes f32" for each buffer of the step that does not
// have the dtype its kernel takes.
std::vector<std::string> DTypeProblems(const plan::Plan& plan, const plan::Step& step) {
  const CudaDTypes cuda = CudaDTypesOf(step.kernel);
  const std::vector<StepBuffer> buffers = StepBuffers(plan, step, cuda);
  std::vector<std::string> problems;
  // The step's type: that of its step_type_from buffer, which must itself be f32 or bf16.
  DType t = DType::F32;
  std::string t_source;
  for (const StepBuffer& b : buffers) {
    if (cuda.step_type_from.empty() || b.argument != cuda.step_type_from) continue;
    t = b.buffer->dtype;
    t_source = absl::StrFormat(" (the step's type, from %s %d '%s')", Role(b.output), b.position,
                               b.buffer->name);
    if (t != DType::F32 && t != DType::BF16) {
      problems.push_back(absl::StrFormat("%s %d '%s' is %s, the CUDA kernel takes f32 or bf16",
                                         Role(b.output), b.position, b.buffer->name,
                                         plan::DTypeName(t)));
      return problems;
    }
  }
  for (const StepBuffer& b : buffers) {
    if (Allows(b.want, b.buffer->dtype, t)) continue;
    problems.push_back(absl::StrFormat(
        "%s %d '%s' is %s, the CUDA kernel takes %s%s", Role(b.output), b.position, b.buffer->name,
        plan::DTypeName(b.buffer->dtype), WantName(b.want, t), b.want == Want::kT ? t_source : ""));
  }
  return problems;
}

// ---------------------------------------------------------------------------------------------
// Shapes the kernels support (beyond what ValidatePlan already guarantees), kernel family by
// kernel family, from the step's arguments by name.
using Problems = std::vector<std::string>;

void Require(Problems& problems, bool ok, std::string message) {
  if (!ok) problems.push_back(std::move(message));
}

// rms_norm, gated_rms_norm.
template <typename NormArgs>
Problems NormProblems(const NormArgs& k) {
  Problems problems;
  Require(problems, k.dim <= 32768,
          absl::StrFormat("dim %d is above the CUDA norms' 32768", k.dim));
  return problems;
}

Problems EmbeddingBackwardProblems(const plan::EmbeddingBackwardArgs<>& k) {
  Problems problems;
  Require(problems,
          k.tokens <= std::numeric_limits<int32_t>::max() &&
              k.vocab < std::numeric_limits<int32_t>::max(),
          absl::StrFormat("tokens %d or vocab %d do not fit the CUDA kernel's int32 sort", k.tokens,
                          k.vocab));
  return problems;
}

template <typename ConvArgs>
Problems ConvProblems(const ConvArgs& k) {
  Problems problems;
  Require(problems, k.width <= 8,
          absl::StrFormat("conv width %d is above the CUDA kernel's 8", k.width));
  Require(problems, k.batch <= 65535,
          absl::StrFormat("batch %d is above the CUDA kernel's 65535", k.batch));
  return problems;
}

// ssd_scan, ssd_final_state, ssd_add_initial_state. The last is not chunked (it has no chunk):
// its kernels take the scan's shapes, chunk 256 among them.
template <typename SsdArgs>
Problems SsdProblems(const SsdArgs& k) {
  int64_t chunk = 256;
  if constexpr (requires { k.chunk; }) chunk = k.chunk;
  Problems problems;
  Require(problems, chunk == 256,
          absl::StrFormat("chunk %d: the CUDA SSD kernels take 256", chunk));
  Require(problems, k.state == 128,
          absl::StrFormat("state %d: the CUDA SSD kernels take 128", k.state));
  Require(problems, k.head_dim == 32 || k.head_dim == 64,
          absl::StrFormat("head_dim %d: the CUDA SSD kernels take 32 or 64", k.head_dim));
  // The grid limits (batch * groups, heads, chunks) behind anything the checks above pass: those
  // of cuda::ssd_supported, which the kernels check again before they launch.
  if (problems.empty()) {
    Require(problems,
            k.batch * k.groups <= 65535 && k.heads <= 65535 && (k.seq + 255) / 256 <= 32767,
            absl::StrFormat("batch %d x groups %d, heads %d or seq %d exceed the CUDA SSD "
                            "kernels' grid limits",
                            k.batch, k.groups, k.heads, k.seq));
  }
  return problems;
}

template <typename LogDecayArgs>
Problems LogDecayProblems(const LogDecayArgs& k) {
  Problems problems;
  Require(problems, k.batch <= 65535 && (k.seq + 1023) / 1024 <= 65535,
          absl::StrFormat("batch %d or seq %d exceed the CUDA kernel's limits (65535, "
                          "65535*1024)",
                          k.batch, k.seq));
  return problems;
}

// attention, ring_attention (whose pieces the same kernels run).
template <typename AttentionArgs>
Problems AttentionProblems(const AttentionArgs& k) {
  Problems problems;
  Require(problems, k.head_dim == 64 || k.head_dim == 128,
          absl::StrFormat("head_dim %d: the CUDA attention kernels take 64 or 128", k.head_dim));
  if (problems.empty()) {
    // cuda::attention_supported's grid limits (64-row blocks).
    Require(problems, k.batch <= 65535 && k.q_heads <= 65535 && (k.seq + 63) / 64 <= 0x7fffffff,
            absl::StrFormat("batch %d or q_heads %d exceed the CUDA attention kernels' grid "
                            "limits (65535)",
                            k.batch, k.q_heads));
  }
  return problems;
}

template <typename RouteArgs>
Problems RouteProblems(const RouteArgs& k) {
  Problems problems;
  Require(problems, k.experts <= 256,
          absl::StrFormat("%d experts: the CUDA routing kernels take at most 256", k.experts));
  Require(problems, k.k <= 16,
          absl::StrFormat("k = %d: the CUDA routing kernels take at most 16", k.k));
  return problems;
}

Problems RouterLoadProblems(int64_t experts) {
  Problems problems;
  Require(problems, experts <= 256,
          absl::StrFormat("%d experts: the CUDA load-balancing loss kernels take at most 256",
                          experts));
  return problems;
}

// moe_experts on one GPU (ranks 1) and moe_experts_ep, where a rank runs experts / ep experts on
// up to ep * tokens * k arriving rows.
template <typename ExpertsArgs>
Problems ExpertsProblems(const ExpertsArgs& k, int64_t ranks) {
  Problems problems;
  Require(problems, k.experts / ranks <= 4096,
          absl::StrFormat("%d experts per GPU: the CUDA expert kernels take at most 4096",
                          k.experts / ranks));
  Require(problems, k.k <= 16,
          absl::StrFormat("k = %d: the CUDA expert kernels take at most 16", k.k));
  Require(problems, ranks <= 16,
          absl::StrFormat("ep = %d: the CUDA expert exchange takes at most 16 ranks", ranks));
  Require(
      problems, ranks * k.tokens * k.k <= std::numeric_limits<int32_t>::max(),
      absl::StrFormat("%d*%d*%d (rank, token, slot) rows do not fit int32", ranks, k.tokens, k.k));
  return problems;
}

Problems ShapeProblems(const plan::Step& step) {
  using plan::DecodeStep;
  switch (step.kernel) {
    case KernelId::RmsNormForward:
      return NormProblems(DecodeStep<plan::RmsNormForwardArgs>(step));
    case KernelId::RmsNormBackward:
      return NormProblems(DecodeStep<plan::RmsNormBackwardArgs>(step));
    case KernelId::GatedRmsNormForward:
      return NormProblems(DecodeStep<plan::GatedRmsNormForwardArgs>(step));
    case KernelId::GatedRmsNormBackward:
      return NormProblems(DecodeStep<plan::GatedRmsNormBackwardArgs>(step));
    case KernelId::EmbeddingBackward:
      return EmbeddingBackwardProblems(DecodeStep<plan::EmbeddingBackwardArgs>(step));
    case KernelId::CausalConv1dForward:
      return ConvProblems(DecodeStep<plan::CausalConv1dForwardArgs>(step));
    case KernelId::CausalConv1dBackward:
      return ConvProblems(DecodeStep<plan::CausalConv1dBackwardArgs>(step));
    case KernelId::SsdScanForward:
      return SsdProblems(DecodeStep<plan::SsdScanForwardArgs>(step));
    case KernelId::SsdScanBackward:
      return SsdProblems(DecodeStep<plan::SsdScanBackwardArgs>(step));
    case KernelId::SsdFinalStateForward:
      return SsdProblems(DecodeStep<plan::SsdFinalStateForwardArgs>(step));
    case KernelId::SsdFinalStateBackward:
      return SsdProblems(DecodeStep<plan::SsdFinalStateBackwardArgs>(step));
    case KernelId::SsdAddInitialStateForward:
      return SsdProblems(DecodeStep<plan::SsdAddInitialStateForwardArgs>(step));
    case KernelId::SsdAddInitialStateBackward:
      return SsdProblems(DecodeStep<plan::SsdAddInitialStateBackwardArgs>(step));
    case KernelId::SsdLogDecayForward:
      return LogDecayProblems(DecodeStep<plan::SsdLogDecayForwardArgs>(step));
    case KernelId::SsdLogDecayBackward:
      return LogDecayProblems(DecodeStep<plan::SsdLogDecayBackwardArgs>(step));
    case KernelId::AttentionForward:
      return AttentionProblems(DecodeStep<plan::AttentionForwardArgs>(step));
    case KernelId::AttentionBackward:
      return AttentionProblems(DecodeStep<plan::AttentionBackwardArgs>(step));
    case KernelId::RingAttentionForward:
      return AttentionProblems(DecodeStep<plan::RingAttentionForwardArgs>(step));
    case KernelId::RingAttentionBackward:
      return AttentionProblems(DecodeStep<plan::RingAttentionBackwardArgs>(step));
    case KernelId::MoeRouteForward:
      return RouteProblems(DecodeStep<plan::MoeRouteForwardArgs>(step));
    case KernelId::MoeRouteBackward:
      return RouteProblems(DecodeStep<plan::MoeRouteBackwardArgs>(step));
    case KernelId::RouterLoadForward:
      return RouterLoadProblems(DecodeStep<plan::RouterLoadForwardArgs>(step).experts);
    case KernelId::RouterLoadBackward:
      return RouterLoadProblems(DecodeStep<plan::RouterLoadBackwardArgs>(step).experts);
    case KernelId::MoeExpertsForward:
      return ExpertsProblems(DecodeStep<plan::MoeExpertsForwardArgs>(step), /*ranks=*/1);
    case KernelId::MoeExpertsBackward:
      return ExpertsProblems(DecodeStep<plan::MoeExpertsBackwardArgs>(step), /*ranks=*/1);
    case KernelId::MoeExpertsEpForward: {
      const auto k = DecodeStep<plan::MoeExpertsEpForwardArgs>(step);
      return ExpertsProblems(k, k.ep);
    }
    case KernelId::MoeExpertsEpBackward: {
      const auto k = DecodeStep<plan::MoeExpertsEpBackwardArgs>(step);
      return ExpertsProblems(k, k.ep);
    }
    default:
      return {};
  }
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
