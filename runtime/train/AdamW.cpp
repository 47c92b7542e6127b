#include "runtime/train/AdamW.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::train {

// ------------------------------------------------------------------------------------------------
// Schedule

absl::Status ValidateSchedule(const LrSchedule& s) {
  if (!std::isfinite(s.max_lr) || !std::isfinite(s.min_lr) || s.min_lr < 0 || s.min_lr > s.max_lr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LR schedule: need 0 <= min_lr <= max_lr, got min_lr %g, max_lr %g", s.min_lr, s.max_lr));
  }
  if (s.total_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LR schedule: total_steps must be at least 1, got %d", s.total_steps));
  }
  if (s.warmup_steps < 0 || s.warmup_steps > s.total_steps) {
    return absl::InvalidArgumentError(
        absl::StrFormat("LR schedule: warmup_steps %d is not within [0, total_steps %d]",
                        s.warmup_steps, s.total_steps));
  }
  return absl::OkStatus();
}

std::string_view LrDecayName(LrDecay decay) {
  switch (decay) {
    case LrDecay::kCosine:
      return "cosine";
    case LrDecay::kLinear:
      return "linear";
    case LrDecay::kConstant:
      return "constant";
  }
  return "?";
}

absl::StatusOr<LrDecay> ParseLrDecay(std::string_view name) {
  for (LrDecay decay : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    if (name == LrDecayName(decay)) return decay;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("schedule %s: the learning-rate schedules are cosine, linear and constant",
                      std::string(name)));
}

double LearningRate(const LrSchedule& s, int64_t step) {
  step = std::max<int64_t>(step, 0);
  if (step < s.warmup_steps) {
    return s.max_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (s.decay == LrDecay::kConstant) return s.max_lr;
  if (step >= s.total_steps) return s.min_lr;
  const double ratio = static_cast<double>(step - s.warmup_steps) /
                       static_cast<double>(s.total_steps - s.warmup_steps);
  const double coeff =
      s.decay == LrDecay::kLinear ? 1.0 - ratio : 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return s.min_lr + coeff * (s.max_lr - s.min_lr);
}

absl::Status ValidateAdamWConfig(const AdamWConfig& c) {
  auto bad = [](std::string_view what, double value) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AdamW: %s, got %g", std::string(what), value));
  };
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad("beta1 must be in [0, 1)", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad("beta2 must be in [0, 1)", c.beta2);
  if (!(c.eps > 0 && std::isfinite(c.eps))) return bad("eps must be positive", c.eps);
  if (!(c.weight_decay >= 0 && std::isfinite(c.weight_decay))) {
    return bad("weight_decay must be >= 0", c.weight_decay);
  }
  if (std::isnan(c.max_grad_norm)) return bad("max_grad_norm must be a number", c.max_grad_norm);
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Parameters

bool DefaultDecay(std::string_view name, std::span<const int64_t> shape) {
  if (shape.size() < 2) return false;
  if (name.size() >= 5 && name.substr(name.size() - 5) == ".bias") return false;
  for (absl::string_view component : absl::StrSplit(ToAbsl(name), '.')) {
    if (component.find("norm") != absl::string_view::npos) return false;
  }
  return true;
}

ParamSpec ParamSpec::WithDefaultDecay(std::string name, std::vector<int64_t> shape) {
  bool decay = DefaultDecay(name, shape);
  return ParamSpec{std::move(name), std::move(shape), decay};
}

FlatRange ShardRange(int64_t total, int64_t index, int64_t parts) {
  // 128-bit products: total * parts may not fit in 64 bits.
  auto cut = [&](int64_t k) {
    return static_cast<int64_t>(static_cast<__int128>(total) * k / parts);
  };
  return {cut(index), cut(index + 1)};
}

absl::StatusOr<FlatLayout> FlatLayout::Create(std::vector<ParamSpec> params) {
  FlatLayout layout;
  for (const ParamSpec& p : params) {
    if (p.name.empty()) return absl::InvalidArgumentError("parameter with an empty name");
    if (!layout.index_.emplace(p.name, layout.index_.size()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", Quote(p.name), " is listed twice"));
    }
    int64_t numel = 1;
    for (int64_t dim : p.shape) {
      if (dim < 0 || __builtin_mul_overflow(numel, dim, &numel)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", Quote(p.name), " has a negative or oversized shape"));
      }
    }
    int64_t end = 0;
    if (__builtin_add_overflow(layout.offsets_.back(), numel, &end)) {
      return absl::InvalidArgumentError("parameters have more elements than int64 can count");
    }
    layout.offsets_.push_back(end);
  }
  layout.params_ = std::move(params);
  return layout;
}

std::optional<size_t> FlatLayout::Find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

// ------------------------------------------------------------------------------------------------
// Norm, clipping, policy

double SumOfSquares(std::span<const float> values) {
  double sum = 0;
  for (float x : values) sum += static_cast<double>(x) * static_cast<double>(x);
  return sum;
}

double GradNorm(std::span<const std::span<const float>> grads) {
  double sum = 0;
  for (std::span<const float> g : grads) sum += SumOfSquares(g);
  return std::sqrt(sum);
}

double ClipCoefficient(double grad_norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0;
  return std::min(1.0, max_norm / (grad_norm + 1e-6));
}

std::string_view StepOutcomeName(StepOutcome outcome) {
  switch (outcome) {
    case StepOutcome::kApplied:
      return "applied";
    case StepOutcome::kSkippedLossNotFinite:
      return "skipped: loss is not finite";
    case StepOutcome::kSkippedGradNormNotFinite:
      return "skipped: gradient norm is not finite";
  }
  return "unknown";
}

StepDecision DecideStep(double loss, double grad_norm, double max_grad_norm) {
  if (!std::isfinite(loss)) return {StepOutcome::kSkippedLossNotFinite, grad_norm, 1.0};
  if (!std::isfinite(grad_norm)) return {StepOutcome::kSkippedGradNormNotFinite, grad_norm, 1.0};
  return {StepOutcome::kApplied, grad_norm, ClipCoefficient(grad_norm, max_grad_norm)};
}

// ------------------------------------------------------------------------------------------------
// The optimizer

void AdamWKernel(const AdamWConfig& c, const AdamWUpdate& u, bool decay, int64_t n, float* param,
                 const float* grad, float* m, float* v) {
  const double t = static_cast<double>(u.t);
  const float beta1 = static_cast<float>(c.beta1);
  const float beta2 = static_cast<float>(c.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  const float clip = static_cast<float>(u.clip_coef);
  const float decay_factor = static_cast<float>(1.0 - u.lr * (decay ? c.weight_decay : 0.0));
  const float step_size = static_cast<float>(u.lr / (1.0 - std::pow(c.beta1, t)));
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(c.beta2, t)));
  const float eps = static_cast<float>(c.eps);
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * clip;
    m[i] = beta1 * m[i] + one_minus_beta1 * g;
    v[i] = beta2 * v[i] + one_minus_beta2 * g * g;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
    param[i] = param[i] * decay_factor - step_size * (m[i] / denom);
  }
}

absl::StatusOr<AdamW> AdamW::Create(FlatLayout layout, const AdamWConfig& config,
                                    std::optional<FlatRange> owned) {
  HCP_RETURN_IF_ERROR(ValidateAdamWConfig(config));
  FlatRange range = owned.value_or(FlatRange{0, layout.total()});
  if (range.begin < 0 || range.begin > range.end || range.end > layout.total()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AdamW: owned range [%d, %d) is not within the %d parameter elements",
                        range.begin, range.end, layout.total()));
  }
  AdamW opt(std::move(layout), config, range);
  opt.m_.assign(range.size(), 0.0f);
  opt.v_.assign(range.size(), 0.0f);
  return opt;
}

absl::StatusOr<FlatRange> AdamW::OwnedRangeOf(std::string_view name) const {
  std::optional<size_t> index = layout_.Find(name);
  if (!index) {
    return absl::NotFoundError(absl::StrCat("AdamW: no parameter named ", Quote(name)));
  }
  FlatRange r = layout_.range(*index);
  if (r.begin < owned_.begin || r.end > owned_.end) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "AdamW: parameter %s (flat [%d, %d)) is not wholly in this optimizer's range [%d, %d)",
        Quote(name), r.begin, r.end, owned_.begin, owned_.end));
  }
  return r;
}

absl::StatusOr<std::span<const float>> AdamW::ExpAvgOf(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(FlatRange r, OwnedRangeOf(name));
  return std::span<const float>(m_).subspan(r.begin - owned_.begin, r.size());
}

absl::StatusOr<std::span<const float>> AdamW::ExpAvgSqOf(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(FlatRange r, OwnedRangeOf(name));
  return std::span<const float>(v_).subspan(r.begin - owned_.begin, r.size());
}

absl::Status AdamW::UpdateRange(const AdamWUpdate& update, FlatRange range, float* param,
                                const float* grad) {
  if (range.begin < owned_.begin || range.begin > range.end || range.end > owned_.end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AdamW: range [%d, %d) is not within this optimizer's range [%d, %d)",
                        range.begin, range.end, owned_.begin, owned_.end));
  }
  if (update.t != updates_ + 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "AdamW: update t = %d, but %d updates have been applied", update.t, updates_));
  }
  if (range.size() == 0) return absl::OkStatus();
  // Binary search for the first parameter that ends after range.begin, then walk the range
  // parameter by parameter (each piece has one decay flag).
  size_t i = 0;
  for (size_t hi = layout_.size(); i < hi;) {
    size_t mid = (i + hi) / 2;
    if (layout_.range(mid).end <= range.begin) {
      i = mid + 1;
    } else {
      hi = mid;
    }
  }
  for (int64_t pos = range.begin; pos < range.end; ++i) {
    const int64_t piece_end = std::min(range.end, layout_.range(i).end);
    if (piece_end <= pos) continue;        // an empty parameter
    const int64_t k = pos - range.begin;   // into param/grad
    const int64_t o = pos - owned_.begin;  // into m/v
    AdamWKernel(config_, update, layout_.param(i).decay, piece_end - pos, param + k, grad + k,
                m_.data() + o, v_.data() + o);
    pos = piece_end;
  }
  return absl::OkStatus();
}

absl::Status AdamW::UpdateTensor(const AdamWUpdate& update, std::string_view name, float* param,
                                 const float* grad) {
  HCP_ASSIGN_OR_RETURN(FlatRange r, OwnedRangeOf(name));
  return UpdateRange(update, r, param, grad);
}

absl::Status AdamW::Commit(const AdamWUpdate& update) {
  if (update.t != updates_ + 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "AdamW: committing update t = %d, but %d updates have been applied", update.t, updates_));
  }
  updates_ = update.t;
  return absl::OkStatus();
}

absl::StatusOr<StepDecision> AdamW::Step(double lr, double loss,
                                         std::span<const ParamGrad> tensors) {
  if (!owns_all()) {
    return absl::FailedPreconditionError(
        "AdamW::Step needs an optimizer that owns every parameter; a sharded one uses "
        "DecideStep, UpdateRange and Commit");
  }
  if (tensors.size() != layout_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AdamW::Step: %d tensors given for %d parameters", tensors.size(), layout_.size()));
  }
  std::vector<std::span<const float>> grads;
  grads.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (layout_.numel(i) > 0 && (tensors[i].param == nullptr || tensors[i].grad == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("AdamW::Step: no storage given for ", Quote(layout_.param(i).name)));
    }
    grads.emplace_back(tensors[i].grad, layout_.numel(i));
  }
  StepDecision decision = DecideStep(loss, GradNorm(grads), config_.max_grad_norm);
  if (!decision.applied()) return decision;
  AdamWUpdate update = NextUpdate(lr, decision.clip_coef);
  for (size_t i = 0; i < tensors.size(); ++i) {
    HCP_RETURN_IF_ERROR(UpdateRange(update, layout_.range(i), tensors[i].param, tensors[i].grad));
  }
  HCP_RETURN_IF_ERROR(Commit(update));
  return decision;
}

}  // namespace hcp::train
