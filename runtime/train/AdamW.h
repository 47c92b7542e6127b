// AdamW with fp32 master weights and moments, the learning-rate schedule, global gradient-norm
// clipping and the policy for non-finite steps.
//
// One update of element p with gradient g, at update number t (1 for the first update applied):
//   g  = g * clip_coef
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p  = p * (1 - lr * weight_decay)                        (decoupled; only where decay is on)
//   p  = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// which is PyTorch's torch.optim.AdamW (eps added to the bias-corrected sqrt(v)). Element math is
// fp32 with the per-step scalars computed in double, as the CUDA kernel will do it. The parameter
// arrays the optimizer updates ARE the fp32 master weights; a bf16 compute copy, where a backend
// has one, is derived from them after the update.
//
// Sharding (ZeRO-1): the parameters are concatenated, in the order of the parameter list, into
// one flat index space (FlatLayout). An optimizer owns the moments of a contiguous range of it
// (the whole of it by default); ShardRange cuts [0, total) into near-equal parts, one per rank.
// UpdateRange updates any sub-range of the owned range, splitting it at parameter boundaries
// where the decay flag changes; UpdateTensor and Step are the whole-tensor API on top.
//
// A step, as the training loop runs it:
//   grad_norm = GradNorm(all gradients)            (sharded: sqrt of the all-reduced SumOfSquares)
//   decision  = DecideStep(loss, grad_norm, config.max_grad_norm)
//   if decision.applied(): update = opt.NextUpdate(lr, decision.clip_coef);
//                          opt.UpdateRange(update, ...) for each owned piece; opt.Commit(update)
//   else: log StepOutcomeName(decision.outcome); parameters, moments and t stay as they were.
// AdamW::Step does all of it for an optimizer that owns everything.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hcp::train {

// ------------------------------------------------------------------------------------------------
// Learning-rate schedule: linear warmup, then a decay to min_lr (cosine by default).
//   step < warmup_steps:           max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total:  cosine: min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2,
//                                  linear: max_lr + (min_lr - max_lr) * r,
//                                  constant: max_lr,
//                                  r = (step - warmup_steps) / (total_steps - warmup_steps)
//   step >= total_steps:           min_lr (constant: max_lr)
// `step` counts from 0 (the first step of a run is step 0), so the last warmup step (warmup - 1)
// and the first decay step (warmup) both get max_lr, and the step halfway through the decay
// gets (max_lr + min_lr) / 2. The schedule follows the training step, skipped steps included.
enum class LrDecay { kCosine, kLinear, kConstant };
// "cosine", "linear", "constant".
std::string_view LrDecayName(LrDecay decay);
// The inverse; anything else is InvalidArgument naming the three.
absl::StatusOr<LrDecay> ParseLrDecay(std::string_view name);

struct LrSchedule {
  LrDecay decay = LrDecay::kCosine;
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// 0 <= min_lr <= max_lr (finite), 0 <= warmup_steps <= total_steps, total_steps >= 1.
absl::Status ValidateSchedule(const LrSchedule& schedule);
// The learning rate of training step `step` (see above; a negative step is treated as 0).
double LearningRate(const LrSchedule& schedule, int64_t step);

// ------------------------------------------------------------------------------------------------
// Hyperparameters.
struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;  // global clipping threshold; <= 0 turns clipping off
};

// 0 <= beta1, beta2 < 1; eps > 0; weight_decay >= 0; all finite.
absl::Status ValidateAdamWConfig(const AdamWConfig& config);

// ------------------------------------------------------------------------------------------------
// Parameters and the flat index space.

// The weight-decay rule: decay a parameter iff it has at least 2 dimensions, its name does not
// end in ".bias", and no component of its dotted name contains "norm". So matrices, the
// embedding, MoE expert stacks and the Mamba conv1d weight [C, 1, K] decay; norm weights
// (input_layernorm, mamba.norm, model.norm), biases and the Mamba 1-D parameters A_log, D and
// dt_bias do not.
bool DefaultDecay(std::string_view name, std::span<const int64_t> shape);

struct ParamSpec {
  std::string name;  // Hugging Face checkpoint name
  std::vector<int64_t> shape;
  bool decay = true;

  // ParamSpec with decay = DefaultDecay(name, shape).
  static ParamSpec WithDefaultDecay(std::string name, std::vector<int64_t> shape);
};

// [begin, end) in the flat index space.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

// Part `index` of `parts` near-equal contiguous parts of [0, total):
// [total * index / parts, total * (index + 1) / parts). The parts partition [0, total).
FlatRange ShardRange(int64_t total, int64_t index, int64_t parts);

// The parameters in order, each at offset = sum of the sizes before it.
class FlatLayout {
 public:
  // Refuses an empty name, a duplicate name or a negative dimension.
  static absl::StatusOr<FlatLayout> Create(std::vector<ParamSpec> params);

  const std::vector<ParamSpec>& params() const { return params_; }
  size_t size() const { return params_.size(); }
  const ParamSpec& param(size_t i) const { return params_[i]; }
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel(size_t i) const { return offsets_[i + 1] - offsets_[i]; }
  FlatRange range(size_t i) const { return {offsets_[i], offsets_[i + 1]}; }
  int64_t total() const { return offsets_.back(); }
  // Index of the parameter named `name`, if any.
  std::optional<size_t> Find(std::string_view name) const;

 private:
  std::vector<ParamSpec> params_;
  std::vector<int64_t> offsets_{0};                   // size() + 1 entries
  std::map<std::string, size_t, std::less<>> index_;  // name -> index
};

// ------------------------------------------------------------------------------------------------
// Gradient norm, clipping and the NaN/Inf policy.

// Sum of squares of `values`, accumulated in double.
double SumOfSquares(std::span<const float> values);
// sqrt of the sum of squares over all spans, accumulated in double.
double GradNorm(std::span<const std::span<const float>> grads);
// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
double ClipCoefficient(double grad_norm, double max_norm);

enum class StepOutcome {
  kApplied,
  kSkippedLossNotFinite,      // loss NaN or inf: nothing updated
  kSkippedGradNormNotFinite,  // some gradient NaN or inf: nothing updated
};
// "applied", "skipped: loss is not finite", "skipped: gradient norm is not finite".
std::string_view StepOutcomeName(StepOutcome outcome);

struct StepDecision {
  StepOutcome outcome = StepOutcome::kApplied;
  double grad_norm = 0;  // before clipping (as given)
  double clip_coef = 1;  // what every gradient is multiplied by; 1 for a skipped step
  bool applied() const { return outcome == StepOutcome::kApplied; }
};

// The policy: a step whose loss or gradient norm is not finite is skipped (nothing changes:
// parameters, moments and the update count stay as they were); otherwise it is applied with
// ClipCoefficient(grad_norm, max_grad_norm).
StepDecision DecideStep(double loss, double grad_norm, double max_grad_norm);

// ------------------------------------------------------------------------------------------------
// The optimizer.

// Scalars of one update; the same for every range updated in one step.
struct AdamWUpdate {
  double lr = 0;
  double clip_coef = 1;
  int64_t t = 1;  // 1-based update number, for bias correction
};

// The element loop on n contiguous elements with one decay flag (the CPU reference of the
// CUDA kernel). weight_decay is applied only when `decay`.
void AdamWKernel(const AdamWConfig& config, const AdamWUpdate& update, bool decay, int64_t n,
                 float* param, const float* grad, float* m, float* v);

// One pointer pair per parameter, in layout order: for the whole-model Step.
struct ParamGrad {
  float* param = nullptr;
  const float* grad = nullptr;
};

class AdamW {
 public:
  // Owns the moments of flat range `owned` (the whole layout when absent), zero-initialised.
  static absl::StatusOr<AdamW> Create(FlatLayout layout, const AdamWConfig& config,
                                      std::optional<FlatRange> owned = std::nullopt);

  const FlatLayout& layout() const { return layout_; }
  const AdamWConfig& config() const { return config_; }
  FlatRange owned() const { return owned_; }
  bool owns_all() const { return owned_ == FlatRange{0, layout_.total()}; }
  // Updates applied so far (the next applied update has t = updates() + 1).
  int64_t updates() const { return updates_; }
  void set_updates(int64_t updates) { updates_ = updates; }

  // The first and second moments of the owned range: element k is flat element owned().begin + k.
  std::span<float> exp_avg() { return m_; }
  std::span<float> exp_avg_sq() { return v_; }
  std::span<const float> exp_avg() const { return m_; }
  std::span<const float> exp_avg_sq() const { return v_; }
  // The moments of parameter `name`, which must lie wholly in the owned range.
  absl::StatusOr<std::span<const float>> ExpAvgOf(std::string_view name) const;
  absl::StatusOr<std::span<const float>> ExpAvgSqOf(std::string_view name) const;

  // The update the next applied step makes: {lr, clip_coef, updates() + 1}.
  AdamWUpdate NextUpdate(double lr, double clip_coef) const {
    return {lr, clip_coef, updates_ + 1};
  }
  // Updates flat elements [range.begin, range.end), which must lie within owned(): param[k] and
  // grad[k] are flat element range.begin + k (the caller's slices of its parameter and
  // gradient storage).
  absl::Status UpdateRange(const AdamWUpdate& update, FlatRange range, float* param,
                           const float* grad);
  // Updates parameter `name` (which must lie wholly in the owned range): param and grad hold
  // its numel elements.
  absl::Status UpdateTensor(const AdamWUpdate& update, std::string_view name, float* param,
                            const float* grad);
  // Records that `update` was applied everywhere: updates() becomes update.t. Refuses an update
  // that is not the next one.
  absl::Status Commit(const AdamWUpdate& update);

  // The whole step for an optimizer that owns every parameter: grad norm (double), DecideStep,
  // and, when applied, every parameter updated and the update committed. `tensors` has one
  // entry per parameter, in layout order.
  absl::StatusOr<StepDecision> Step(double lr, double loss, std::span<const ParamGrad> tensors);

 private:
  AdamW(FlatLayout layout, const AdamWConfig& config, FlatRange owned)
      : layout_(std::move(layout)), config_(config), owned_(owned) {}
  absl::StatusOr<FlatRange> OwnedRangeOf(std::string_view name) const;

  FlatLayout layout_;
  AdamWConfig config_;
  FlatRange owned_;
  int64_t updates_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

}  // namespace hcp::train
