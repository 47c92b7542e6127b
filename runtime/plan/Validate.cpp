// ValidatePlan: every rule a plan must satisfy before any kernel sees it. The FlatBuffers
// verifier only proves the file can be read safely; this proves it can be *run* safely: every
// buffer lies inside its arena, every step's buffers hold exactly the elements its kernel will
// touch given its ints, and no step writes over what it reads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/KernelCheck.h"
#include "runtime/plan/Plan.h"
#include "runtime/plan/Schedule.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::plan {
namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();

// The product of non-negative factors, or nullopt if it does not fit in an int64.
std::optional<int64_t> CheckedProduct(const std::vector<int64_t>& factors) {
  int64_t product = 1;
  for (int64_t factor : factors) {
    if (factor < 0 || __builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string BufferLabel(const Plan& plan, uint32_t index) {
  return absl::StrFormat("buffer %d '%s'", index, plan.buffers[index].name);
}

bool IsValidArena(Arena arena) { return static_cast<int>(arena) < kNumArenas; }
bool IsValidDType(DType dtype) { return static_cast<int>(dtype) < kNumDTypes; }

absl::Status CheckBuffers(const Plan& plan) {
  if (plan.buffers.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("too many buffers for 32-bit indices");
  }
  for (uint32_t i = 0; i < plan.buffers.size(); ++i) {
    const Buffer& b = plan.buffers[i];
    if (b.name.empty())
      return absl::InvalidArgumentError(absl::StrFormat("buffer %d has no name", i));
    const std::string label = BufferLabel(plan, i);
    if (!IsValidArena(b.arena)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s has arena %d, expected 0..%d", label,
                                                        static_cast<int>(b.arena), kNumArenas - 1));
    }
    if (!IsValidDType(b.dtype)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s has dtype %d, expected 0..%d", label,
                                                        static_cast<int>(b.dtype), kNumDTypes - 1));
    }
    std::optional<int64_t> shape_elements = CheckedProduct(b.shape);
    if (!shape_elements) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has shape %s: a negative dimension or too many elements", label,
                          ShapeString(b.shape)));
    }
    if (static_cast<uint64_t>(*shape_elements) != b.elements) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has shape %s (%d elements) but says it has %d elements", label,
                          ShapeString(b.shape), *shape_elements, b.elements));
    }
    const uint64_t size = DTypeSize(b.dtype);
    if (b.offset % size != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: offset %d is not a multiple of its %s element size %d", label,
                          b.offset, DTypeName(b.dtype), size));
    }
    uint64_t bytes = 0, end = 0;
    const uint64_t arena_bytes = plan.arena_size(b.arena);
    if (__builtin_mul_overflow(b.elements, size, &bytes) ||
        __builtin_add_overflow(b.offset, bytes, &end) || end > arena_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s (offset %d, %d elements of %s) does not fit in the %s arena of %d bytes", label,
          b.offset, b.elements, DTypeName(b.dtype), ArenaName(b.arena), arena_bytes));
    }
  }
  return absl::OkStatus();
}

// Buffers of one role (parameter values, or gradients) must not share bytes: each is written on
// its own (initialisation, loading, the gradient kernels).
absl::Status CheckDisjoint(const Plan& plan, const std::vector<uint32_t>& indices,
                           std::string_view what) {
  std::vector<uint32_t> sorted = indices;
  std::sort(sorted.begin(), sorted.end(), [&](uint32_t a, uint32_t b) {
    return plan.buffers[a].offset < plan.buffers[b].offset;
  });
  // Sorted by offset, a buffer overlaps an earlier one iff it starts before the furthest end
  // seen so far (all of them live in the same arena).
  uint64_t furthest_end = 0;
  std::optional<uint32_t> furthest;
  for (uint32_t index : sorted) {
    const Buffer& b = plan.buffers[index];
    if (b.elements == 0) continue;
    if (furthest && b.offset < furthest_end) {
      return absl::InvalidArgumentError(absl::StrFormat("%s %s overlaps %s %s", what,
                                                        BufferLabel(plan, index), what,
                                                        BufferLabel(plan, *furthest)));
    }
    if (b.offset + b.bytes() > furthest_end || !furthest) {
      furthest_end = b.offset + b.bytes();
      furthest = index;
    }
  }
  return absl::OkStatus();
}

// A parameter's shards and checkpoint shape: a sharded parameter holds rows
// [i * R / shards, (i + 1) * R / shards) of its checkpoint tensor, i = the rank's expert index,
// so shards is the mesh's ep and the buffers are the checkpoint shape with dim 0 divided.
// Runs after the mesh has been checked (CheckInputsAndLoss is later: check the ep here too).
absl::Status CheckSharding(const Plan& plan, const Parameter& p, const std::string& label) {
  const Buffer& value = plan.buffers[p.buffer];
  if (p.shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has %d shards, expected at least 1", label, p.shards));
  }
  if (p.full_shape.empty()) {
    if (p.shards == 1) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is split into %d shards but has no checkpoint shape", label, p.shards));
  }
  if (p.shards > 1 && p.shards != plan.mesh.ep) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is split into %d shards, but the mesh has ep=%d (shards follow the expert index)",
        label, p.shards, plan.mesh.ep));
  }
  std::vector<int64_t> expected = p.full_shape;
  if (!CheckedProduct(expected)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has checkpoint shape %s: a negative dimension or too many elements",
                        label, ShapeString(p.full_shape)));
  }
  if (p.shards > 1) {
    if (expected[0] % p.shards != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %d rows of its checkpoint shape %s cannot be split into %d shards",
                          label, expected[0], ShapeString(p.full_shape), p.shards));
    }
    expected[0] /= p.shards;
  }
  if (value.shape != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: value %s has shape %s, but %d shard%s of checkpoint shape %s %s %s", label,
        BufferLabel(plan, p.buffer), ShapeString(value.shape), p.shards, p.shards == 1 ? "" : "s",
        ShapeString(p.full_shape), p.shards == 1 ? "is" : "are", ShapeString(expected)));
  }
  return absl::OkStatus();
}

// The runtime sums replicated gradients over the world and sharded ones over the ep replicas,
// each region with one all-reduce: every sharded parameter's gradient must lie after every
// replicated one's in the Gradients arena.
absl::Status CheckShardedGradientsLast(const Plan& plan) {
  const uint64_t boundary = plan.ShardedGradientsOffset();
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const Parameter& p = plan.parameters[i];
    const Buffer& g = plan.buffers[p.gradient];
    if (!p.sharded() && g.elements > 0 && g.offset + g.bytes() > boundary) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "parameter %d '%s': its gradient %s ends at byte %d, after the sharded parameters' "
          "gradients start (byte %d): replicated gradients must come first",
          i, p.name, BufferLabel(plan, p.gradient), g.offset + g.bytes(), boundary));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckParameters(const Plan& plan) {
  std::set<std::string_view> names;
  std::vector<uint32_t> values, gradients;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const Parameter& p = plan.parameters[i];
    if (p.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("parameter %d has no name", i));
    }
    const std::string label = absl::StrFormat("parameter %d '%s'", i, p.name);
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("%s appears twice", label));
    }
    if (static_cast<int>(p.init) >= kNumParamInits) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has init %d, expected 0..%d", label, static_cast<int>(p.init), kNumParamInits - 1));
    }
    if (p.init == ParamInit::Normal && !(p.std >= 0 && p.std <= kFloatMax)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has normal init with std %g, expected a finite fp32 std >= 0", label, p.std));
    }
    const struct {
      uint32_t index;
      Arena arena;
      std::string_view role;
    } parts[] = {{p.buffer, Arena::Parameters, "value"},
                 {p.gradient, Arena::Gradients, "gradient"}};
    for (const auto& part : parts) {
      if (part.index >= plan.buffers.size()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %s is buffer %d, but the plan has %d buffers", label, part.role,
                            part.index, plan.buffers.size()));
      }
      const Buffer& b = plan.buffers[part.index];
      if (b.arena != part.arena || b.dtype == DType::I32) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %s %s is %s in the %s arena, expected f32 or bf16 in the %s arena",
                            label, part.role, BufferLabel(plan, part.index), DTypeName(b.dtype),
                            ArenaName(b.arena), ArenaName(part.arena)));
      }
    }
    const Buffer& value = plan.buffers[p.buffer];
    const Buffer& gradient = plan.buffers[p.gradient];
    if (value.dtype != gradient.dtype) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: value %s is %s but gradient %s is %s", label, BufferLabel(plan, p.buffer),
          DTypeName(value.dtype), BufferLabel(plan, p.gradient), DTypeName(gradient.dtype)));
    }
    if (value.elements != gradient.elements) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: value %s has %d elements but gradient %s has %d", label, BufferLabel(plan, p.buffer),
          value.elements, BufferLabel(plan, p.gradient), gradient.elements));
    }
    HCP_RETURN_IF_ERROR(CheckSharding(plan, p, label));
    values.push_back(p.buffer);
    gradients.push_back(p.gradient);
  }
  HCP_RETURN_IF_ERROR(CheckDisjoint(plan, values, "parameter value"));
  HCP_RETURN_IF_ERROR(CheckDisjoint(plan, gradients, "parameter gradient"));
  return CheckShardedGradientsLast(plan);
}

// The mesh's sizes, and that the sequence splits evenly into its segments (plan.seq > 0).
absl::Status CheckMesh(const Plan& plan) {
  const Mesh& mesh = plan.mesh;
  if (mesh.cp < 1 || mesh.dp < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("mesh cp=%d x dp=%d: both must be positive", mesh.cp, mesh.dp));
  }
  // MPI numbers ranks with an int.
  std::optional<int64_t> world = CheckedProduct({mesh.cp, mesh.dp});
  if (!world || *world > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mesh cp=%d x dp=%d is more ranks than MPI can number (2^31-1)", mesh.cp, mesh.dp));
  }
  if (mesh.ep < 1 || *world % mesh.ep != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mesh ep=%d must be positive and divide the cp*dp = %d ranks", mesh.ep, *world));
  }
  if (static_cast<int>(mesh.layout) >= kNumSequenceLayouts) {
    return absl::InvalidArgumentError(absl::StrFormat("mesh has sequence layout %d, expected 0..%d",
                                                      static_cast<int>(mesh.layout),
                                                      kNumSequenceLayouts - 1));
  }
  if (plan.seq % mesh.segments() != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence length %d cannot be split into %d pieces for cp=%d (%s layout)",
                        plan.seq, mesh.segments(), mesh.cp, SequenceLayoutName(mesh.layout)));
  }
  return absl::OkStatus();
}

// The load-balancing loss's coefficient is a positive number, its scale an f32 [1] input apart
// from the others, its result an f32 [1] buffer.
absl::Status CheckRouterAuxLoss(const Plan& plan, const Plan::RouterAuxLoss& aux) {
  if (!(aux.coefficient > 0) || !std::isfinite(aux.coefficient)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the load-balancing loss's coefficient is %g, expected a positive number",
                        aux.coefficient));
  }
  for (auto [index, role] : {std::pair{aux.scale, "its scale"}, std::pair{aux.loss, "its loss"}}) {
    if (index >= plan.buffers.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the load-balancing loss: %s is buffer %d, but the plan has %d buffers",
                          role, index, plan.buffers.size()));
    }
    const Buffer& b = plan.buffers[index];
    if (b.dtype != DType::F32 || b.elements != 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the load-balancing loss: %s %s is %s [%d elements], expected f32 [1]",
                          role, BufferLabel(plan, index), DTypeName(b.dtype), b.elements));
    }
  }
  const Buffer& scale = plan.buffers[aux.scale];
  if (scale.arena != Arena::Inputs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the load-balancing loss's scale %s is in the %s arena, not the inputs",
                        BufferLabel(plan, aux.scale), ArenaName(scale.arena)));
  }
  std::vector<uint32_t> inputs = {plan.input_ids, plan.targets, plan.loss_scale};
  if (plan.position_ids) inputs.push_back(*plan.position_ids);
  for (uint32_t input : inputs) {
    if (scale.Overlaps(plan.buffers[input])) {
      return absl::InvalidArgumentError(
          "the load-balancing loss's scale overlaps the other inputs");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInputsAndLoss(const Plan& plan) {
  if (plan.seq <= 0 || plan.micro_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("seq %d and micro_batch %d must be positive", plan.seq, plan.micro_batch));
  }
  HCP_RETURN_IF_ERROR(CheckMesh(plan));
  if (!CheckedProduct({plan.micro_batch, plan.seq})) {
    return absl::InvalidArgumentError("micro_batch * seq overflows");
  }
  // This rank's tokens: micro_batch * seq / cp.
  const int64_t tokens = plan.local_tokens();
  struct TokenBuffer {
    uint32_t index;
    std::string_view role;
  };
  std::vector<TokenBuffer> token_buffers = {{plan.input_ids, "input_ids"},
                                            {plan.targets, "targets"}};
  if (plan.position_ids) token_buffers.push_back({*plan.position_ids, "position_ids"});
  for (const auto& t : token_buffers) {
    if (t.index >= plan.buffers.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is buffer %d, but the plan has %d buffers", t.role, t.index, plan.buffers.size()));
    }
    const Buffer& b = plan.buffers[t.index];
    if (b.arena != Arena::Inputs || b.dtype != DType::I32 ||
        b.elements != static_cast<uint64_t>(tokens)) {
      const std::string expected =
          plan.mesh.cp == 1 ? absl::StrFormat("micro_batch*seq = %d", tokens)
                            : absl::StrFormat("micro_batch*seq/cp = %d*%d/%d = %d",
                                              plan.micro_batch, plan.seq, plan.mesh.cp, tokens);
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %s is %s [%d elements] in the %s arena, expected i32 [%s] in the inputs arena",
          t.role, BufferLabel(plan, t.index), DTypeName(b.dtype), b.elements, ArenaName(b.arena),
          expected));
    }
  }
  for (size_t i = 0; i < token_buffers.size(); ++i) {
    for (size_t j = i + 1; j < token_buffers.size(); ++j) {
      if (plan.buffers[token_buffers[i].index].Overlaps(plan.buffers[token_buffers[j].index])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s and %s overlap", token_buffers[i].role, token_buffers[j].role));
      }
    }
  }
  if (plan.loss >= plan.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "loss is buffer %d, but the plan has %d buffers", plan.loss, plan.buffers.size()));
  }
  const Buffer& loss = plan.buffers[plan.loss];
  if (loss.dtype != DType::F32 || loss.elements != 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("loss %s is %s [%d elements], expected f32 [1]",
                        BufferLabel(plan, plan.loss), DTypeName(loss.dtype), loss.elements));
  }
  if (plan.loss_scale >= plan.buffers.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("loss_scale is buffer %d, but the plan has %d buffers", plan.loss_scale,
                        plan.buffers.size()));
  }
  const Buffer& scale = plan.buffers[plan.loss_scale];
  if (scale.arena != Arena::Inputs || scale.dtype != DType::F32 || scale.elements != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "loss_scale %s is %s [%d elements] in the %s arena, expected f32 [1] in the inputs arena",
        BufferLabel(plan, plan.loss_scale), DTypeName(scale.dtype), scale.elements,
        ArenaName(scale.arena)));
  }
  for (const TokenBuffer& t : token_buffers) {
    if (scale.Overlaps(plan.buffers[t.index])) {
      return absl::InvalidArgumentError("loss_scale overlaps the token inputs");
    }
  }
  if (plan.router_aux_loss) return CheckRouterAuxLoss(plan, *plan.router_aux_loss);
  return absl::OkStatus();
}

absl::Status CheckStep(const Plan& plan, size_t index) {
  const Step& step = plan.steps[index];
  const std::string label = StepLabel(plan, index);
  auto fail = [&](const std::string& message) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", message));
  };
  if (static_cast<int>(step.kernel) >= kNumKernels) {
    return absl::InvalidArgumentError(absl::StrFormat("%s is unknown", label));
  }
  std::vector<BufferFacts> ins, outs;
  for (const auto& [list, facts, role] :
       {std::tuple{&step.ins, &ins, "input"}, std::tuple{&step.outs, &outs, "output"}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const uint32_t buffer = (*list)[i];
      if (buffer >= plan.buffers.size()) {
        return fail(absl::StrFormat("%s %d is buffer %d, but the plan has %d buffers", role, i,
                                    buffer, plan.buffers.size()));
      }
      const Buffer& b = plan.buffers[buffer];
      facts->push_back({b.elements, b.dtype, b.name});
    }
  }
  const SequenceContext context{&plan.mesh, plan.seq};
  const absl::Status arguments =
      CheckKernelArguments({step.kernel, step.ints, step.floats, ins, outs}, &context);
  if (!arguments.ok()) return fail(std::string(arguments.message()));

  // No kernel reads and writes the same bytes: each output is written while inputs are still
  // being read, and two outputs must not clobber each other.
  for (size_t o = 0; o < step.outs.size(); ++o) {
    const Buffer& out = plan.buffers[step.outs[o]];
    for (size_t i = 0; i < step.ins.size(); ++i) {
      const Buffer& in = plan.buffers[step.ins[i]];
      if (out.Overlaps(in)) {
        return fail(absl::StrFormat(
            "output %d '%s' overlaps input %d '%s' (%s arena bytes [%d, %d) and [%d, %d))", o,
            out.name, i, in.name, ArenaName(out.arena), out.offset, out.offset + out.bytes(),
            in.offset, in.offset + in.bytes()));
      }
    }
    for (size_t p = 0; p < o; ++p) {
      const Buffer& other = plan.buffers[step.outs[p]];
      if (out.Overlaps(other)) {
        return fail(
            absl::StrFormat("output %d '%s' overlaps output %d '%s'", o, out.name, p, other.name));
      }
    }
  }
  return absl::OkStatus();
}

// The config.json a plan carries goes into checkpoints as it is: it must be a JSON object.
absl::Status CheckModelConfig(const Plan& plan) {
  if (plan.model_config.empty()) return absl::OkStatus();
  absl::StatusOr<nlohmann::json> config =
      ParseJsonStrict(plan.model_config, "the plan's config.json");
  if (!config.ok()) return config.status();
  if (!config->is_object()) {
    return absl::InvalidArgumentError("the plan's config.json is not a JSON object");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const Plan& plan) {
  HCP_RETURN_IF_ERROR(CheckModelConfig(plan));
  HCP_RETURN_IF_ERROR(CheckBuffers(plan));
  HCP_RETURN_IF_ERROR(CheckParameters(plan));
  HCP_RETURN_IF_ERROR(CheckInputsAndLoss(plan));
  for (size_t i = 0; i < plan.steps.size(); ++i) HCP_RETURN_IF_ERROR(CheckStep(plan, i));
  return CheckSchedule(plan);
}

}  // namespace hcp::plan
