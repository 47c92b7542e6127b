// ValidatePlan: every rule a plan must satisfy before any kernel sees it. The FlatBuffers
// verifier only proves the file can be read safely; this proves it can be *run* safely: every
// buffer lies inside its arena, every step's buffers hold exactly the elements its kernel will
// touch given its ints, and no step writes over what it reads.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/Plan.h"
#include "runtime/support/Status.h"

namespace hcp::plan {
namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();

// a - b, clamped to the int64 range: bounds computed from a step's ints must not overflow
// before the ints themselves have been checked.
int64_t SaturatingSub(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_sub_overflow(a, b, &result)) {
    return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return result;
}

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
  const struct {
    uint32_t index;
    std::string_view role;
  } token_buffers[] = {{plan.input_ids, "input_ids"}, {plan.targets, "targets"}};
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
  if (plan.buffers[plan.input_ids].Overlaps(plan.buffers[plan.targets])) {
    return absl::InvalidArgumentError("input_ids and targets overlap");
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
  for (uint32_t tokens : {plan.input_ids, plan.targets}) {
    if (scale.Overlaps(plan.buffers[tokens])) {
      return absl::InvalidArgumentError("loss_scale overlaps the token inputs");
    }
  }
  return absl::OkStatus();
}

// The checks of one step. Each check records the first failure and later checks do nothing,
// so a kernel's rules read as a flat list (see CheckKernelRules).
class StepChecker {
 public:
  // A factor of an element count: one of the step's ints by name (plus a constant: the conv
  // halo's width-1 rows), or a constant.
  struct Factor {
    Factor(const char* int_name) : name(int_name) {}
    Factor(const char* int_name, int64_t plus) : name(int_name), value(plus) {}
    Factor(int constant) : value(constant) {}
    // A constant computed from already checked ints (experts / ep, say).
    static Factor Constant(int64_t constant) {
      Factor f(0);
      f.value = constant;
      return f;
    }
    const char* name = nullptr;
    int64_t value = 0;  // the constant, or what is added to the named int
  };

  StepChecker(const Plan& plan, size_t index)
      : plan_(plan), step_(plan.steps[index]), label_(StepLabel(plan, index)) {}

  const Plan& plan() const { return plan_; }
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  void Fail(std::string_view message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(label_ + ": " + std::string(message));
  }

  // Gives the ints their names from KernelTable.def, in order; every later check uses them.
  void Ints(std::initializer_list<const char*> names) { int_names_.assign(names); }

  int64_t Int(std::string_view name) const {
    for (size_t i = 0; i < int_names_.size(); ++i) {
      if (int_names_[i] == name && i < step_.ints.size()) return step_.ints[i];
    }
    return 0;  // only reached with a name missing from Ints(): a bug in this file
  }

  // Each named int is >= 1.
  void Sizes(std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (ok() && Int(name) < 1) {
        Fail(absl::StrFormat("%s is %d, expected a positive size", IntLabel(name), Int(name)));
      }
    }
  }
  // Each named int is 0 or 1.
  void Flags(std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (ok() && Int(name) != 0 && Int(name) != 1) {
        Fail(absl::StrFormat("%s is %d, expected 0 or 1", IntLabel(name), Int(name)));
      }
    }
  }
  // lo <= int <= hi, where `bound` says in words what hi is.
  void InRange(const char* name, int64_t lo, int64_t hi, std::string_view bound) {
    if (ok() && (Int(name) < lo || Int(name) > hi)) {
      Fail(absl::StrFormat("%s is %d, expected %d..%s", IntLabel(name), Int(name), lo, bound));
    }
  }
  // int `dividend` is a multiple of int `divisor` (both already checked positive).
  void Divisible(const char* dividend, const char* divisor) {
    if (ok() && Int(dividend) % Int(divisor) != 0) {
      Fail(absl::StrFormat("%s = %d is not divisible by %s = %d", dividend, Int(dividend), divisor,
                           Int(divisor)));
    }
  }

  // int `segs` is the mesh layout's segments per rank (collectives of context parallelism).
  void SegmentsPerRank(const char* segs) {
    const Mesh& mesh = plan_.mesh;
    if (ok() && Int(segs) != mesh.segments_per_rank()) {
      Fail(absl::StrFormat("%s is %d, but the plan's %s layout puts %d segment%s on each rank",
                           IntLabel(segs), Int(segs), SequenceLayoutName(mesh.layout),
                           mesh.segments_per_rank(), mesh.segments_per_rank() == 1 ? "" : "s"));
    }
  }
  // int `len` is the length of one segment of the plan's sequence: seq / segments.
  void SegmentLength(const char* len) {
    const Mesh& mesh = plan_.mesh;
    const int64_t want = plan_.seq / mesh.segments();
    if (ok() && Int(len) != want) {
      Fail(absl::StrFormat(
          "%s is %d, but the plan's sequence of %d tokens in %d segments (cp=%d, %s) makes "
          "segments of %d",
          IntLabel(len), Int(len), plan_.seq, mesh.segments(), mesh.cp,
          SequenceLayoutName(mesh.layout), want));
    }
  }
  // int `seq` is one rank's share of the plan's sequence: seq / cp.
  void LocalSequence(const char* seq) {
    if (ok() && Int(seq) != plan_.local_seq()) {
      Fail(absl::StrFormat("%s is %d, but each rank holds %d / cp %d = %d tokens of the sequence",
                           IntLabel(seq), Int(seq), plan_.seq, plan_.mesh.cp, plan_.local_seq()));
    }
  }

  // int `ep` is the plan's mesh's ep (expert parallelism), and `experts` splits over it.
  void ExpertParallel(const char* ep, const char* experts) {
    const Mesh& mesh = plan_.mesh;
    if (ok() && Int(ep) != mesh.ep) {
      Fail(absl::StrFormat("%s is %d, but the plan's mesh has ep=%d", IntLabel(ep), Int(ep),
                           mesh.ep));
    }
    if (ok() && Int(experts) % Int(ep) != 0) {
      Fail(absl::StrFormat("%d experts cannot be split over ep=%d ranks", Int(experts), Int(ep)));
    }
  }

  // Input/output `arg` is a buffer of exactly (or at least) product(factors) elements: In/Out a
  // float one (f32 or bf16: the plan's storage type for tensors), InF32/OutF32 one that is f32
  // whatever the plan's precision (SSD dt, A, D and states, log-sum-exps, routing gates,
  // losses), InI32/OutI32 an int32 one.
  void In(int arg, std::initializer_list<Factor> f) { Tensor("input", arg, kFloat, f, false); }
  void InF32(int arg, std::initializer_list<Factor> f) { Tensor("input", arg, kF32, f, false); }
  void InI32(int arg, std::initializer_list<Factor> f) { Tensor("input", arg, kI32, f, false); }
  void InAtLeast(int arg, std::initializer_list<Factor> f) {
    Tensor("input", arg, kFloat, f, true);
  }
  void Out(int arg, std::initializer_list<Factor> f) { Tensor("output", arg, kFloat, f, false); }
  void OutF32(int arg, std::initializer_list<Factor> f) { Tensor("output", arg, kF32, f, false); }
  void OutI32(int arg, std::initializer_list<Factor> f) { Tensor("output", arg, kI32, f, false); }
  void OutAtLeast(int arg, std::initializer_list<Factor> f) {
    Tensor("output", arg, kFloat, f, true);
  }

  // Elementwise kernels compute in one type: every buffer of the step has the same dtype.
  void SameDType() {
    if (!ok()) return;
    const Buffer& first = plan_.buffers[step_.outs[0]];
    for (const auto& [list, role] :
         {std::pair{&step_.ins, "input"}, std::pair{&step_.outs, "output"}}) {
      for (size_t i = 0; i < list->size(); ++i) {
        const Buffer& b = plan_.buffers[(*list)[i]];
        if (b.dtype != first.dtype) {
          Fail(absl::StrFormat(
              "%s %d '%s' is %s but output 0 '%s' is %s (an elementwise kernel "
              "computes in one type; convert with a cast step)",
              role, i, b.name, DTypeName(b.dtype), first.name, DTypeName(first.dtype)));
          return;
        }
      }
    }
  }

 private:
  std::string IntLabel(std::string_view name) const {
    for (size_t i = 0; i < int_names_.size(); ++i) {
      if (int_names_[i] == name) return absl::StrFormat("int %d (%s)", i, name);
    }
    return std::string(name);
  }

  enum DTypeRule { kFloat, kF32, kI32 };
  static bool Allows(DTypeRule rule, DType dtype) {
    switch (rule) {
      case kFloat:
        return dtype == DType::F32 || dtype == DType::BF16;
      case kF32:
        return dtype == DType::F32;
      case kI32:
        return dtype == DType::I32;
    }
    return false;
  }
  static std::string_view RuleName(DTypeRule rule) {
    return rule == kFloat ? "f32 or bf16" : rule == kF32 ? "f32" : "i32";
  }

  void Tensor(std::string_view role, int arg, DTypeRule rule, std::initializer_list<Factor> factors,
              bool at_least) {
    if (!ok()) return;
    const std::vector<uint32_t>& list = role == "input" ? step_.ins : step_.outs;
    if (arg < 0 || static_cast<size_t>(arg) >= list.size()) {
      Fail(absl::StrFormat("%s %d is missing (a bug in Validate.cpp)", role, arg));
      return;
    }
    const uint32_t index = list[arg];
    const Buffer& b = plan_.buffers[index];
    const std::string what = absl::StrFormat("%s %d '%s'", role, arg, b.name);
    if (!Allows(rule, b.dtype)) {
      Fail(absl::StrFormat("%s is %s, expected %s", what, DTypeName(b.dtype), RuleName(rule)));
      return;
    }
    std::vector<int64_t> values;
    std::vector<std::string> names;
    for (const Factor& factor : factors) {
      if (factor.name == nullptr) {
        values.push_back(factor.value);
        names.push_back(absl::StrCat(factor.value));
      } else if (factor.value == 0) {
        values.push_back(Int(factor.name));
        names.push_back(factor.name);
      } else {  // only after Sizes() has checked the int, so this cannot overflow
        values.push_back(Int(factor.name) + factor.value);
        names.push_back(absl::StrFormat("(%s%+d)", factor.name, factor.value));
      }
    }
    const std::string expr = absl::StrJoin(names, "*");
    std::optional<int64_t> expected = CheckedProduct(values);
    if (!expected) {
      Fail(absl::StrFormat("%s: %s overflows", what, expr));
      return;
    }
    const uint64_t want = static_cast<uint64_t>(*expected);
    if (at_least ? b.elements < want : b.elements != want) {
      // "rows*dim = 128", or just "128" when the expression is a single constant.
      const std::string expectation = names.size() == 1 && factors.begin()->name == nullptr
                                          ? absl::StrCat(want)
                                          : absl::StrFormat("%s = %d", expr, want);
      Fail(absl::StrFormat("%s has %d elements, expected %s%s", what, b.elements,
                           at_least ? "at least " : "", expectation));
    }
  }

  const Plan& plan_;
  const Step& step_;
  std::string label_;
  std::vector<const char*> int_names_;
  absl::Status status_;
};

// gemm's and gemm_add's ints and product operands.
void CheckGemmOperands(StepChecker& c) {
  c.Ints({"trans_a", "trans_b", "m", "n", "k"});
  c.Flags({"trans_a", "trans_b"});
  c.Sizes({"m", "n", "k"});
  c.InAtLeast(0, {"m", "k"});
  c.InAtLeast(1, {"k", "n"});
}

// What each kernel requires of its ints and buffers, following KernelTable.def line by line.
// Element counts are exact where the buffer is exactly that tensor; gemm's operands only need to
// be large enough, so a GEMM may read the leading rows of a larger buffer.
void CheckKernelRules(KernelId kernel, StepChecker& c) {
  switch (kernel) {
    case KernelId::Gemm:
      CheckGemmOperands(c);
      c.OutAtLeast(0, {"m", "n"});
      return;
    case KernelId::GemmAdd:
      CheckGemmOperands(c);
      c.In(2, {"m", "n"});
      c.Out(0, {"m", "n"});
      return;
    case KernelId::EmbeddingForward:
      c.Ints({"tokens", "vocab", "hidden"});
      c.Sizes({"tokens", "vocab", "hidden"});
      c.In(0, {"vocab", "hidden"});
      c.InI32(1, {"tokens"});
      c.Out(0, {"tokens", "hidden"});
      return;
    case KernelId::EmbeddingBackward:
      c.Ints({"tokens", "vocab", "hidden", "padding_idx"});
      c.Sizes({"tokens", "vocab", "hidden"});
      c.InRange("padding_idx", -1, SaturatingSub(c.Int("vocab"), 1), "vocab-1");
      c.In(0, {"tokens", "hidden"});
      c.InI32(1, {"tokens"});
      c.Out(0, {"vocab", "hidden"});
      return;
    case KernelId::RmsNormForward:
      c.Ints({"rows", "dim"});
      c.Sizes({"rows", "dim"});
      c.In(0, {"rows", "dim"});
      c.In(1, {"dim"});
      c.Out(0, {"rows", "dim"});
      return;
    case KernelId::RmsNormBackward:
      c.Ints({"rows", "dim"});
      c.Sizes({"rows", "dim"});
      c.In(0, {"rows", "dim"});
      c.In(1, {"rows", "dim"});
      c.In(2, {"dim"});
      c.Out(0, {"rows", "dim"});
      c.Out(1, {"dim"});
      return;
    case KernelId::GatedRmsNormForward:
      c.Ints({"rows", "dim"});
      c.Sizes({"rows", "dim"});
      c.In(0, {"rows", "dim"});
      c.In(1, {"rows", "dim"});
      c.In(2, {"dim"});
      c.Out(0, {"rows", "dim"});
      return;
    case KernelId::GatedRmsNormBackward:
      c.Ints({"rows", "dim"});
      c.Sizes({"rows", "dim"});
      c.In(0, {"rows", "dim"});
      c.In(1, {"rows", "dim"});
      c.In(2, {"rows", "dim"});
      c.In(3, {"dim"});
      c.Out(0, {"rows", "dim"});
      c.Out(1, {"rows", "dim"});
      c.Out(2, {"dim"});
      return;
    case KernelId::SiluForward:
    case KernelId::SoftplusForward:
    case KernelId::NegExpForward:
    case KernelId::Scale:
    case KernelId::Copy:
      c.Ints({"n"});
      c.Sizes({"n"});
      c.In(0, {"n"});
      c.Out(0, {"n"});
      c.SameDType();
      return;
    case KernelId::Cast:
      c.Ints({"n"});
      c.Sizes({"n"});
      c.In(0, {"n"});
      c.Out(0, {"n"});
      return;
    case KernelId::SiluBackward:
    case KernelId::SoftplusBackward:
    case KernelId::NegExpBackward:
      c.Ints({"n"});
      c.Sizes({"n"});
      c.In(0, {"n"});
      c.In(1, {"n"});
      c.Out(0, {"n"});
      c.SameDType();
      return;
    case KernelId::SwigluForward:
      c.Ints({"rows", "inner"});
      c.Sizes({"rows", "inner"});
      c.In(0, {"rows", 2, "inner"});
      c.Out(0, {"rows", "inner"});
      c.SameDType();
      return;
    case KernelId::SwigluBackward:
      c.Ints({"rows", "inner"});
      c.Sizes({"rows", "inner"});
      c.In(0, {"rows", "inner"});
      c.In(1, {"rows", 2, "inner"});
      c.Out(0, {"rows", 2, "inner"});
      c.SameDType();
      return;
    case KernelId::Add:
    case KernelId::Mul:
    case KernelId::Div:
      c.Ints({"n", "rhs_n"});
      c.Sizes({"n", "rhs_n"});
      c.Divisible("n", "rhs_n");
      c.In(0, {"n"});
      c.In(1, {"rhs_n"});
      c.Out(0, {"n"});
      c.SameDType();
      return;
    case KernelId::SumLeading:
      c.Ints({"rows", "cols"});
      c.Sizes({"rows", "cols"});
      c.In(0, {"rows", "cols"});
      c.Out(0, {"cols"});
      c.SameDType();
      return;
    case KernelId::Fill:
      c.Ints({"n"});
      c.Sizes({"n"});
      c.Out(0, {"n"});
      return;
    case KernelId::SliceColumns:
      c.Ints({"rows", "in_cols", "offset", "width"});
      c.Sizes({"rows", "in_cols", "width"});
      c.InRange("offset", 0, SaturatingSub(c.Int("in_cols"), c.Int("width")), "in_cols-width");
      c.In(0, {"rows", "in_cols"});
      c.Out(0, {"rows", "width"});
      c.SameDType();
      return;
    case KernelId::InsertColumns:
      c.Ints({"rows", "out_cols", "offset", "width"});
      c.Sizes({"rows", "out_cols", "width"});
      c.InRange("offset", 0, SaturatingSub(c.Int("out_cols"), c.Int("width")), "out_cols-width");
      c.In(0, {"rows", "width"});
      c.Out(0, {"rows", "out_cols"});
      c.SameDType();
      return;
    case KernelId::CausalConv1dForward:
      c.Ints({"batch", "seq", "channels", "width", "has_halo", "silu"});
      c.Sizes({"batch", "seq", "channels", "width"});
      c.Flags({"has_halo", "silu"});
      c.In(0, {"batch", "seq", "channels"});
      c.In(1, {"channels", "width"});
      c.In(2, {"channels"});
      if (c.Int("has_halo") == 1) c.In(3, {"batch", {"width", -1}, "channels"});
      c.Out(0, {"batch", "seq", "channels"});
      return;
    case KernelId::CausalConv1dBackward:
      c.Ints({"batch", "seq", "channels", "width", "has_halo", "silu"});
      c.Sizes({"batch", "seq", "channels", "width"});
      c.Flags({"has_halo", "silu"});
      c.In(0, {"batch", "seq", "channels"});
      c.In(1, {"batch", "seq", "channels"});
      c.In(2, {"channels", "width"});
      if (c.Int("has_halo") == 1) c.In(3, {"batch", {"width", -1}, "channels"});
      if (c.Int("silu") == 1) c.In(3 + c.Int("has_halo"), {"channels"});
      c.Out(0, {"batch", "seq", "channels"});
      c.Out(1, {"channels", "width"});
      c.Out(2, {"channels"});
      if (c.Int("has_halo") == 1) c.Out(3, {"batch", {"width", -1}, "channels"});
      return;
    case KernelId::SsdScanForward:
    case KernelId::SsdScanBackward: {
      const bool backward = kernel == KernelId::SsdScanBackward;
      if (backward) {
        c.Ints({"batch", "seq", "heads", "head_dim", "groups", "state", "chunk", "has_init",
                "has_dfinal"});
        c.Flags({"has_init", "has_dfinal"});
      } else {
        c.Ints({"batch", "seq", "heads", "head_dim", "groups", "state", "chunk", "has_init"});
        c.Flags({"has_init"});
      }
      c.Sizes({"batch", "seq", "heads", "head_dim", "groups", "state", "chunk"});
      c.Divisible("heads", "groups");
      // The tensors in the order the forward takes them; the backward takes dy first and
      // returns their gradients (dinit_state only with has_init).
      const int first = backward ? 1 : 0;
      if (backward) c.In(0, {"batch", "seq", "heads", "head_dim"});  // dy
      c.In(first + 0, {"batch", "seq", "heads", "head_dim"});        // x
      c.InF32(first + 1, {"batch", "seq", "heads"});                 // dt
      c.InF32(first + 2, {"heads"});                                 // A
      c.In(first + 3, {"batch", "seq", "groups", "state"});          // B
      c.In(first + 4, {"batch", "seq", "groups", "state"});          // C
      c.InF32(first + 5, {"heads"});                                 // D
      int next = first + 6;
      if (c.Int("has_init") == 1) c.InF32(next++, {"batch", "heads", "head_dim", "state"});
      if (!backward) {
        c.Out(0, {"batch", "seq", "heads", "head_dim"});       // y
        c.OutF32(1, {"batch", "heads", "head_dim", "state"});  // final_state
        return;
      }
      if (c.Int("has_dfinal") == 1) c.InF32(next++, {"batch", "heads", "head_dim", "state"});
      c.Out(0, {"batch", "seq", "heads", "head_dim"});  // dx
      c.OutF32(1, {"batch", "seq", "heads"});           // ddt
      c.OutF32(2, {"heads"});                           // dA
      c.Out(3, {"batch", "seq", "groups", "state"});    // dB
      c.Out(4, {"batch", "seq", "groups", "state"});    // dC
      c.OutF32(5, {"heads"});                           // dD
      if (c.Int("has_init") == 1) c.OutF32(6, {"batch", "heads", "head_dim", "state"});
      return;
    }
    case KernelId::SsdFinalStateForward:
    case KernelId::SsdFinalStateBackward: {
      // ssd_scan's checks without C, D and the states' flags; the backward takes dfinal_state
      // first and returns the gradients of x, dt, A, B.
      const bool backward = kernel == KernelId::SsdFinalStateBackward;
      c.Ints({"batch", "seq", "heads", "head_dim", "groups", "state", "chunk"});
      c.Sizes({"batch", "seq", "heads", "head_dim", "groups", "state", "chunk"});
      c.Divisible("heads", "groups");
      const int first = backward ? 1 : 0;
      if (backward) c.InF32(0, {"batch", "heads", "head_dim", "state"});  // dfinal_state
      c.In(first + 0, {"batch", "seq", "heads", "head_dim"});             // x
      c.InF32(first + 1, {"batch", "seq", "heads"});                      // dt
      c.InF32(first + 2, {"heads"});                                      // A
      c.In(first + 3, {"batch", "seq", "groups", "state"});               // B
      if (!backward) {
        c.OutF32(0, {"batch", "heads", "head_dim", "state"});  // final_state
        return;
      }
      c.Out(0, {"batch", "seq", "heads", "head_dim"});  // dx
      c.OutF32(1, {"batch", "seq", "heads"});           // ddt
      c.OutF32(2, {"heads"});                           // dA
      c.Out(3, {"batch", "seq", "groups", "state"});    // dB
      return;
    }
    case KernelId::SsdAddInitialStateForward:
    case KernelId::SsdAddInitialStateBackward: {
      // The forward takes y, the backward dout, in its place; the backward returns the
      // gradients of dt, A, C and init_state.
      c.Ints({"batch", "seq", "heads", "head_dim", "groups", "state"});
      c.Sizes({"batch", "seq", "heads", "head_dim", "groups", "state"});
      c.Divisible("heads", "groups");
      c.In(0, {"batch", "seq", "heads", "head_dim"});       // y | dout
      c.InF32(1, {"batch", "seq", "heads"});                // dt
      c.InF32(2, {"heads"});                                // A
      c.In(3, {"batch", "seq", "groups", "state"});         // C
      c.InF32(4, {"batch", "heads", "head_dim", "state"});  // init_state
      if (kernel == KernelId::SsdAddInitialStateForward) {
        c.Out(0, {"batch", "seq", "heads", "head_dim"});  // out
        return;
      }
      c.OutF32(0, {"batch", "seq", "heads"});                // ddt
      c.OutF32(1, {"heads"});                                // dA
      c.Out(2, {"batch", "seq", "groups", "state"});         // dC
      c.OutF32(3, {"batch", "heads", "head_dim", "state"});  // dinit_state
      return;
    }
    case KernelId::SsdLogDecayForward:
      c.Ints({"batch", "seq", "heads"});
      c.Sizes({"batch", "seq", "heads"});
      c.InF32(0, {"batch", "seq", "heads"});  // dt
      c.InF32(1, {"heads"});                  // A
      c.OutF32(0, {"batch", "heads"});        // g
      return;
    case KernelId::SsdLogDecayBackward:
      c.Ints({"batch", "seq", "heads"});
      c.Sizes({"batch", "seq", "heads"});
      c.InF32(0, {"batch", "heads"});          // dg
      c.InF32(1, {"batch", "seq", "heads"});   // dt
      c.InF32(2, {"heads"});                   // A
      c.OutF32(0, {"batch", "seq", "heads"});  // ddt
      c.OutF32(1, {"heads"});                  // dA
      return;
    case KernelId::HaloExchangeForward:
    case KernelId::HaloExchangeBackward: {
      c.Ints({"batch", "segs", "len", "channels", "width"});
      c.Sizes({"batch", "segs", "len", "channels", "width"});
      c.SegmentsPerRank("segs");
      c.SegmentLength("len");
      // The halo comes from one segment: it cannot be longer than a segment.
      c.InRange("width", 1, c.Int("len"), "len");
      const std::initializer_list<StepChecker::Factor> x = {"batch", "segs", "len", "channels"};
      const std::initializer_list<StepChecker::Factor> halo = {"batch", "segs", "width",
                                                               "channels"};
      const bool forward = kernel == KernelId::HaloExchangeForward;
      c.In(0, forward ? x : halo);
      c.Out(0, forward ? halo : x);
      return;
    }
    case KernelId::StateScanForward:
    case KernelId::StateScanBackward: {
      c.Ints({"batch", "segs", "heads", "head_dim", "state", "strategy"});
      c.Sizes({"batch", "segs", "heads", "head_dim", "state"});
      c.InRange("strategy", 0, 1, "1 (0 all-gather, 1 send/recv chain)");
      c.SegmentsPerRank("segs");
      const std::initializer_list<StepChecker::Factor> g = {"batch", "segs", "heads"};
      const std::initializer_list<StepChecker::Factor> s = {"batch", "segs", "heads", "head_dim",
                                                            "state"};
      if (kernel == KernelId::StateScanForward) {
        c.InF32(0, g);
        c.InF32(1, s);
        c.OutF32(0, s);  // s_in
      } else {
        c.InF32(0, s);  // ds_in
        c.InF32(1, g);
        c.InF32(2, s);  // s_in
        c.OutF32(0, g);
        c.OutF32(1, s);
      }
      return;
    }
    case KernelId::AllReduce:
      c.Ints({"n", "group"});
      c.Sizes({"n"});
      c.InRange("group", 0, 2, "2 (0 world, 1 cp, 2 dp)");
      c.In(0, {"n"});
      c.Out(0, {"n"});
      return;
    case KernelId::RingAttentionForward:
    case KernelId::RingAttentionBackward:
    case KernelId::AttentionForward:
    case KernelId::AttentionBackward: {
      c.Ints({"batch", "seq", "q_heads", "kv_heads", "head_dim", "causal"});
      c.Sizes({"batch", "seq", "q_heads", "kv_heads", "head_dim"});
      c.Flags({"causal"});
      c.Divisible("q_heads", "kv_heads");
      const bool ring =
          kernel == KernelId::RingAttentionForward || kernel == KernelId::RingAttentionBackward;
      // The ring attends over the whole sequence: its local part is exactly the rank's share
      // (the pieces' global positions follow from the mesh).
      if (ring) c.LocalSequence("seq");
      const std::initializer_list<StepChecker::Factor> q = {"batch", "seq", "q_heads", "head_dim"};
      const std::initializer_list<StepChecker::Factor> kv = {"batch", "seq", "kv_heads",
                                                             "head_dim"};
      const std::initializer_list<StepChecker::Factor> lse = {"batch", "q_heads", "seq"};
      if (kernel == KernelId::AttentionForward || kernel == KernelId::RingAttentionForward) {
        c.In(0, q);
        c.In(1, kv);
        c.In(2, kv);
        c.Out(0, q);
        c.OutF32(1, lse);
      } else {
        c.In(0, q);  // dout
        c.In(1, q);
        c.In(2, kv);
        c.In(3, kv);
        c.In(4, q);  // out
        c.InF32(5, lse);
        c.Out(0, q);
        c.Out(1, kv);
        c.Out(2, kv);
      }
      return;
    }
    case KernelId::MoeRouteForward:
      c.Ints({"tokens", "experts", "k"});
      c.Sizes({"tokens", "experts", "k"});
      // Expert indices are int32.
      c.InRange("experts", 1, std::numeric_limits<int32_t>::max(), "2^31-1");
      c.InRange("k", 1, c.Int("experts"), "experts");
      c.In(0, {"tokens", "experts"});
      c.OutF32(0, {"tokens", "k"});  // gates
      c.OutI32(1, {"tokens", "k"});
      return;
    case KernelId::MoeRouteBackward:
      c.Ints({"tokens", "experts", "k"});
      c.Sizes({"tokens", "experts", "k"});
      c.InRange("k", 1, c.Int("experts"), "experts");
      c.InF32(0, {"tokens", "k"});  // dgates
      c.InF32(1, {"tokens", "k"});  // gates
      c.InI32(2, {"tokens", "k"});
      c.Out(0, {"tokens", "experts"});
      return;
    case KernelId::MoeExpertsForward:
    case KernelId::MoeExpertsBackward: {
      c.Ints({"tokens", "hidden", "inner", "experts", "k", "keep_h"});
      c.Sizes({"tokens", "hidden", "inner", "experts", "k"});
      c.Flags({"keep_h"});
      c.InRange("k", 1, c.Int("experts"), "experts");
      const int first = kernel == KernelId::MoeExpertsBackward ? 1 : 0;
      if (first == 1) c.In(0, {"tokens", "hidden"});       // dout
      c.In(first + 0, {"tokens", "hidden"});               // x
      c.InF32(first + 1, {"tokens", "k"});                 // gates
      c.InI32(first + 2, {"tokens", "k"});                 // experts
      c.In(first + 3, {"experts", 2, "inner", "hidden"});  // w_in
      c.In(first + 4, {"experts", "hidden", "inner"});     // w_out
      c.Out(0, {"tokens", "hidden"});                      // out, or dx
      if (first == 1) {
        c.OutF32(1, {"tokens", "k"});  // dgates
        c.Out(2, {"experts", 2, "inner", "hidden"});
        c.Out(3, {"experts", "hidden", "inner"});
        if (c.Int("keep_h") == 1) c.In(6, {"tokens", "k", 2, "inner"});  // kept_h
      } else if (c.Int("keep_h") == 1) {
        c.Out(1, {"tokens", "k", 2, "inner"});  // kept_h
      }
      return;
    }
    case KernelId::MoeExpertsEpForward:
    case KernelId::MoeExpertsEpBackward: {
      c.Ints({"tokens", "hidden", "inner", "experts", "k", "ep"});
      c.Sizes({"tokens", "hidden", "inner", "experts", "k", "ep"});
      // Expert indices are int32.
      c.InRange("experts", 1, std::numeric_limits<int32_t>::max(), "2^31-1");
      c.InRange("k", 1, c.Int("experts"), "experts");
      c.ExpertParallel("ep", "experts");
      if (!c.ok()) return;
      // This rank's experts only.
      const StepChecker::Factor local =
          StepChecker::Factor::Constant(c.Int("experts") / c.Int("ep"));
      const int first = kernel == KernelId::MoeExpertsEpBackward ? 1 : 0;
      if (first == 1) c.In(0, {"tokens", "hidden"});   // dout
      c.In(first + 0, {"tokens", "hidden"});           // x
      c.InF32(first + 1, {"tokens", "k"});             // gates
      c.InI32(first + 2, {"tokens", "k"});             // experts (global ids)
      c.In(first + 3, {local, 2, "inner", "hidden"});  // w_in
      c.In(first + 4, {local, "hidden", "inner"});     // w_out
      c.Out(0, {"tokens", "hidden"});                  // out, or dx
      if (first == 1) {
        c.OutF32(1, {"tokens", "k"});  // dgates
        c.Out(2, {local, 2, "inner", "hidden"});
        c.Out(3, {local, "hidden", "inner"});
      }
      return;
    }
    case KernelId::CrossEntropyForward:
      c.Ints({"tokens", "vocab", "ignore_index"});
      c.Sizes({"tokens", "vocab"});
      c.In(0, {"tokens", "vocab"});
      c.InI32(1, {"tokens"});
      c.OutF32(0, {1});  // loss_sum
      c.OutF32(1, {1});  // valid_count
      return;
    case KernelId::CrossEntropyBackward:
      c.Ints({"tokens", "vocab", "ignore_index"});
      c.Sizes({"tokens", "vocab"});
      c.InF32(0, {1});  // dloss_sum
      c.In(1, {"tokens", "vocab"});
      c.InI32(2, {"tokens"});
      c.Out(0, {"tokens", "vocab"});
      return;
  }
  c.Fail("kernel has no validation rules (add them to Validate.cpp)");
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
  const KernelInfo& info = GetKernelInfo(step.kernel);
  // The int count first: the -1 buffer counts depend on the flags among the ints.
  if (step.ints.size() != static_cast<size_t>(info.ints)) {
    return fail(absl::StrFormat("takes %d ints, got %d", info.ints, step.ints.size()));
  }
  if (step.floats.size() != static_cast<size_t>(info.floats)) {
    return fail(absl::StrFormat("takes %d floats, got %d", info.floats, step.floats.size()));
  }
  const Arity arity = ExpectedArity(step);
  if (step.ins.size() != static_cast<size_t>(arity.ins)) {
    return fail(absl::StrFormat("takes %d inputs, got %d", arity.ins, step.ins.size()));
  }
  if (step.outs.size() != static_cast<size_t>(arity.outs)) {
    return fail(absl::StrFormat("takes %d outputs, got %d", arity.outs, step.outs.size()));
  }
  for (const auto& [list, role] :
       {std::pair{&step.ins, "input"}, std::pair{&step.outs, "output"}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      if ((*list)[i] >= plan.buffers.size()) {
        return fail(absl::StrFormat("%s %d is buffer %d, but the plan has %d buffers", role, i,
                                    (*list)[i], plan.buffers.size()));
      }
    }
  }
  for (size_t i = 0; i < step.floats.size(); ++i) {
    // Kernels take fp32 scalars: the value must survive the conversion.
    if (!(std::abs(step.floats[i]) <= kFloatMax)) {
      return fail(
          absl::StrFormat("float %d is %g, expected a finite fp32 value", i, step.floats[i]));
    }
  }

  StepChecker checker(plan, index);
  CheckKernelRules(step.kernel, checker);
  HCP_RETURN_IF_ERROR(checker.status());

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

}  // namespace

absl::Status ValidatePlan(const Plan& plan) {
  HCP_RETURN_IF_ERROR(CheckBuffers(plan));
  HCP_RETURN_IF_ERROR(CheckParameters(plan));
  HCP_RETURN_IF_ERROR(CheckInputsAndLoss(plan));
  for (size_t i = 0; i < plan.steps.size(); ++i) HCP_RETURN_IF_ERROR(CheckStep(plan, i));
  return absl::OkStatus();
}

}  // namespace hcp::plan
