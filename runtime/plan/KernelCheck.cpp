// CheckKernelArguments: one generic reading of a kernel's signature. Each check records the
// first failure and later checks do nothing, so the order of the messages is the order of the
// signature: counts, floats, sizes, flags, rules, buffers, dtype agreement.
#include "runtime/plan/KernelCheck.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hcp::plan {
namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();

// a + b, clamped to the int64 range: bounds computed from a step's ints must not overflow
// before the ints themselves have been checked.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_add_overflow(a, b, &result)) {
    return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return result;
}
int64_t SaturatingSub(int64_t a, int64_t b) {
  int64_t result;
  if (__builtin_sub_overflow(a, b, &result)) {
    return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return result;
}

bool Allows(DTypeRule rule, std::optional<DType> dtype) {
  switch (rule) {
    case DTypeRule::Storage:
      return dtype == DType::F32 || dtype == DType::BF16;
    case DTypeRule::F32:
      return dtype == DType::F32;
    case DTypeRule::I32:
      return dtype == DType::I32;
  }
  return false;
}

std::string_view RuleName(DTypeRule rule) {
  switch (rule) {
    case DTypeRule::Storage:
      return "f32 or bf16";
    case DTypeRule::F32:
      return "f32";
    case DTypeRule::I32:
      return "i32";
  }
  return "?";
}

std::string_view DTypeText(std::optional<DType> dtype) {
  return dtype ? DTypeName(*dtype) : "of an element type no kernel takes";
}

class Checker {
 public:
  Checker(const StepFacts& step, const SequenceContext* context)
      : step_(step), signature_(GetKernelSignature(step.kernel)), context_(context) {}

  absl::Status Run() {
    Counts();
    Floats();
    for (size_t i = 0; i < signature_.ints.size(); ++i) {
      if (signature_.ints[i].kind == IntKind::Size) Size(i);
    }
    for (size_t i = 0; i < signature_.ints.size(); ++i) {
      if (signature_.ints[i].kind == IntKind::Flag) Flag(i);
    }
    bool same_dtype = false;
    for (const RuleSpec& rule : signature_.rules) {
      if (rule.kind == RuleKind::SameDType) same_dtype = true;
      Rule(rule);
    }
    Buffers("input", signature_.ins, step_.ins);
    Buffers("output", signature_.outs, step_.outs);
    if (same_dtype) SameDType();
    return status_;
  }

 private:
  bool ok() const { return status_.ok(); }
  void Fail(std::string message) {
    if (ok()) status_ = absl::InvalidArgumentError(std::move(message));
  }

  int64_t Int(int index) const { return step_.ints[index]; }
  std::string_view IntName(int index) const { return signature_.ints[index].name; }
  std::string IntLabel(int index) const {
    return absl::StrFormat("int %d (%s)", index, IntName(index));
  }

  // The int count first: which buffers are present depends on the flags among the ints.
  void Counts() {
    if (step_.ints.size() != signature_.ints.size()) {
      return Fail(
          absl::StrFormat("takes %d ints, got %d", signature_.ints.size(), step_.ints.size()));
    }
    if (step_.floats.size() != signature_.floats.size()) {
      return Fail(absl::StrFormat("takes %d floats, got %d", signature_.floats.size(),
                                  step_.floats.size()));
    }
    const Arity arity = ExpectedArity(step_.kernel, step_.ints);
    if (step_.ins.size() != static_cast<size_t>(arity.ins)) {
      return Fail(absl::StrFormat("takes %d inputs, got %d", arity.ins, step_.ins.size()));
    }
    if (step_.outs.size() != static_cast<size_t>(arity.outs)) {
      Fail(absl::StrFormat("takes %d outputs, got %d", arity.outs, step_.outs.size()));
    }
  }

  // Kernels take fp32 scalars: the value must survive the conversion.
  void Floats() {
    for (size_t i = 0; ok() && i < step_.floats.size(); ++i) {
      if (!(std::abs(step_.floats[i]) <= kFloatMax)) {
        Fail(absl::StrFormat("float %d (%s) is %g, expected a finite fp32 value", i,
                             signature_.floats[i], step_.floats[i]));
      }
    }
  }

  void Size(int index) {
    if (ok() && Int(index) < 1) {
      Fail(absl::StrFormat("%s is %d, expected a positive size", IntLabel(index), Int(index)));
    }
  }
  void Flag(int index) {
    if (ok() && Int(index) != 0 && Int(index) != 1) {
      Fail(absl::StrFormat("%s is %d, expected 0 or 1", IntLabel(index), Int(index)));
    }
  }

  int64_t BoundValue(const Bound& bound) const {
    int64_t value = bound.constant;
    if (bound.plus >= 0) value = SaturatingAdd(value, Int(bound.plus));
    if (bound.minus >= 0) value = SaturatingSub(value, Int(bound.minus));
    return value;
  }

  void Rule(const RuleSpec& rule) {
    if (!ok()) return;
    switch (rule.kind) {
      case RuleKind::Range: {
        const int64_t hi = BoundValue(rule.hi);
        if (Int(rule.a) < rule.lo || Int(rule.a) > hi) {
          Fail(absl::StrFormat("%s is %d, expected %d..%s", IntLabel(rule.a), Int(rule.a), rule.lo,
                               rule.words));
        }
        return;
      }
      case RuleKind::Divisible:
        if (Int(rule.b) == 0 || Int(rule.a) % Int(rule.b) != 0) {
          Fail(absl::StrFormat("%s = %d is not divisible by %s = %d", IntName(rule.a), Int(rule.a),
                               IntName(rule.b), Int(rule.b)));
        }
        return;
      case RuleKind::SameDType:
        return;  // after the buffers' own dtypes (Run)
      case RuleKind::SegmentsPerRank:
      case RuleKind::SegmentLength:
      case RuleKind::LocalSequence:
      case RuleKind::ExpertParallel:
        return MeshRule(rule);
    }
  }

  void MeshRule(const RuleSpec& rule) {
    if (context_ == nullptr) return;
    const Mesh& mesh = *context_->mesh;
    const int64_t value = Int(rule.a);
    switch (rule.kind) {
      case RuleKind::SegmentsPerRank:
        if (value != mesh.segments_per_rank()) {
          Fail(absl::StrFormat("%s is %d, but the plan's %s layout puts %d segment%s on each rank",
                               IntLabel(rule.a), value, SequenceLayoutName(mesh.layout),
                               mesh.segments_per_rank(), mesh.segments_per_rank() == 1 ? "" : "s"));
        }
        return;
      case RuleKind::SegmentLength: {
        const int64_t want = context_->seq / mesh.segments();
        if (value != want) {
          Fail(absl::StrFormat(
              "%s is %d, but the plan's sequence of %d tokens in %d segments (cp=%d, %s) makes "
              "segments of %d",
              IntLabel(rule.a), value, context_->seq, mesh.segments(), mesh.cp,
              SequenceLayoutName(mesh.layout), want));
        }
        return;
      }
      case RuleKind::LocalSequence: {
        const int64_t want = context_->seq / mesh.cp;
        if (value != want) {
          Fail(
              absl::StrFormat("%s is %d, but each rank holds %d / cp %d = %d tokens of the "
                              "sequence",
                              IntLabel(rule.a), value, context_->seq, mesh.cp, want));
        }
        return;
      }
      case RuleKind::ExpertParallel:
        if (value != mesh.ep) {
          Fail(absl::StrFormat("%s is %d, but the plan's mesh has ep=%d", IntLabel(rule.a), value,
                               mesh.ep));
        } else if (Int(rule.b) % value != 0) {
          Fail(absl::StrFormat("%d experts cannot be split over ep=%d ranks", Int(rule.b), value));
        }
        return;
      default:
        return;
    }
  }

  // One buffer's dtype and element count. The factors have been checked (sizes >= 1, the
  // divisor of a quotient a positive size), so each one is computed without overflow.
  void Buffer(std::string_view role, int position, const BufferSpec& spec,
              const BufferFacts& facts) {
    if (!ok()) return;
    const std::string what = absl::StrFormat("%s %d '%s'", role, position, facts.name);
    if (!Allows(spec.dtype, facts.dtype)) {
      return Fail(absl::StrFormat("%s is %s, expected %s", what, DTypeText(facts.dtype),
                                  RuleName(spec.dtype)));
    }
    std::vector<std::string> names;
    int64_t product = 1;
    bool overflow = false;
    for (const Factor& f : spec.shape) {
      int64_t value = f.constant;
      std::string name = absl::StrCat(f.constant);
      if (f.index >= 0) {
        value = Int(f.index) + f.constant;
        name = f.constant == 0 ? std::string(IntName(f.index))
                               : absl::StrFormat("(%s%+d)", IntName(f.index), f.constant);
      }
      if (f.divisor >= 0) {
        value = f.ceil ? (value + Int(f.divisor) - 1) / Int(f.divisor) : value / Int(f.divisor);
        name = f.ceil ? absl::StrCat("ceil(", name, "/", std::string(IntName(f.divisor)), ")")
                      : absl::StrCat(name, "/", std::string(IntName(f.divisor)));
      }
      names.push_back(name);
      overflow = overflow || __builtin_mul_overflow(product, value, &product);
    }
    const std::string expr = absl::StrJoin(names, "*");
    if (overflow) return Fail(absl::StrFormat("%s: %s overflows", what, expr));
    const uint64_t want = static_cast<uint64_t>(product);
    if (spec.at_least ? facts.elements < want : facts.elements != want) {
      // "rows*dim = 128", or just "128" when the expression is a single constant.
      const bool constant = spec.shape.size() == 1 && spec.shape[0].index < 0;
      const std::string expectation =
          constant ? absl::StrCat(want) : absl::StrFormat("%s = %d", expr, want);
      Fail(absl::StrFormat("%s has %d elements, expected %s%s", what, facts.elements,
                           spec.at_least ? "at least " : "", expectation));
    }
  }

  void Buffers(std::string_view role, std::span<const BufferSpec> specs,
               std::span<const BufferFacts> facts) {
    size_t position = 0;
    for (const BufferSpec& spec : specs) {
      if (!ok()) return;
      if (spec.present_if >= 0 && Int(spec.present_if) == 0) continue;
      Buffer(role, static_cast<int>(position), spec, facts[position]);
      ++position;
    }
  }

  // Elementwise kernels compute in one type: every buffer of the step has the same dtype.
  void SameDType() {
    if (!ok()) return;
    const BufferFacts& first = step_.outs[0];
    for (const auto& [list, role] :
         {std::pair{step_.ins, "input"}, std::pair{step_.outs, "output"}}) {
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].dtype != first.dtype) {
          return Fail(absl::StrFormat(
              "%s %d '%s' is %s but output 0 '%s' is %s (an elementwise kernel computes in one "
              "type; convert with a cast step)",
              role, i, list[i].name, DTypeText(list[i].dtype), first.name, DTypeText(first.dtype)));
        }
      }
    }
  }

  const StepFacts& step_;
  const KernelSignature& signature_;
  const SequenceContext* context_;
  absl::Status status_;
};

}  // namespace

Arity ExpectedArity(KernelId kernel, std::span<const int64_t> ints) {
  const KernelSignature& signature = GetKernelSignature(kernel);
  auto count = [&](std::span<const BufferSpec> specs) {
    int n = 0;
    for (const BufferSpec& spec : specs) {
      const bool present =
          spec.present_if < 0 ||
          (static_cast<size_t>(spec.present_if) < ints.size() && ints[spec.present_if] != 0);
      n += present ? 1 : 0;
    }
    return n;
  };
  return {count(signature.ins), count(signature.outs)};
}

absl::Status CheckKernelArguments(const StepFacts& step, const SequenceContext* context) {
  if (static_cast<int>(step.kernel) >= kNumKernels) {
    return absl::InvalidArgumentError("the kernel is unknown");
  }
  return Checker(step, context).Run();
}

}  // namespace hcp::plan
