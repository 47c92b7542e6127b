#include "runtime/data/Blend.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "runtime/data/DocumentOrder.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"

namespace hcp::data {

absl::StatusOr<std::vector<double>> NormalizeBlendWeights(std::span<const double> weights) {
  if (weights.empty()) return absl::InvalidArgumentError("a blend needs at least one source");
  double sum = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    if (!std::isfinite(weights[d]) || !(weights[d] > 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "blend: the weight of source %d is %g; weights are positive numbers", d, weights[d]));
    }
    sum += weights[d];
  }
  if (!std::isfinite(sum)) {
    return absl::InvalidArgumentError("blend: the weights' sum is not a finite number");
  }
  std::vector<double> normalized(weights.begin(), weights.end());
  for (double& w : normalized) w /= sum;
  return normalized;
}

int64_t BlendChoose(std::span<const double> weights, int64_t k, std::span<const int64_t> taken) {
  const double next = static_cast<double>(k + 1);
  int64_t best = 0;
  double best_gap = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    const double gap = weights[d] * next - static_cast<double>(taken[d]);
    if (d == 0 || gap > best_gap) {  // strictly greater: a tie stays with the lower source
      best = static_cast<int64_t>(d);
      best_gap = gap;
    }
  }
  return best;
}

uint64_t BlendSourceSeed(uint64_t seed, int64_t source) {
  return Mix64(seed + (static_cast<uint64_t>(source) + 1) * 0x9E3779B97F4A7C15ULL);
}

BlendBatcher::BlendBatcher(std::vector<TokenStream> streams, std::vector<double> weights,
                           const BatchConfig& config)
    : streams_(std::move(streams)), weights_(std::move(weights)), config_(config) {
  state_.sources.resize(streams_.size());
}

absl::StatusOr<BlendBatcher> BlendBatcher::Create(std::vector<TokenStream> streams,
                                                  std::vector<double> weights,
                                                  const BatchConfig& config) {
  HCP_RETURN_IF_ERROR(ValidateBatchConfig(config));
  if (streams.empty() || streams.size() != weights.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a blend of %d sources with %d weights", streams.size(), weights.size()));
  }
  double sum = 0;
  for (double w : weights) {
    if (!std::isfinite(w) || !(w > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("blend: weight %g is not a positive number", w));
    }
    sum += w;
  }
  if (std::abs(sum - 1) > 1e-9) {
    return absl::InvalidArgumentError(
        absl::StrFormat("blend: the weights add up to %.17g, not 1 (normalise them)", sum));
  }
  for (const TokenStream& stream : streams) {
    HCP_RETURN_IF_ERROR(CheckTokenStream(stream));
    HCP_RETURN_IF_ERROR(CheckDocuments(stream, config));
    if (stream.file->size() < config.seq + 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has %s tokens; a blend reads windows of seq + 1 = %s tokens from each source",
          stream.file->path(), FormatCount(stream.file->size()), FormatCount(config.seq + 1)));
    }
  }
  return BlendBatcher(std::move(streams), std::move(weights), config);
}

int64_t BlendBatcher::WindowsPerEpoch(size_t d) const {
  return streams_[d].file->size() / (config_.seq + 1);
}

absl::Status BlendBatcher::Restore(const BlendState& state) {
  const int64_t window = config_.seq + 1;
  if (state.sources.size() != streams_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data state of a blend of %d sources does not fit this blend of %d: was it saved "
        "with another --data?",
        state.sources.size(), streams_.size()));
  }
  if (state.windows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the blend's data state has %d windows done", state.windows));
  }
  int64_t total = 0;
  for (size_t d = 0; d < streams_.size(); ++d) {
    const DataState& s = state.sources[d];
    const int64_t per_epoch = WindowsPerEpoch(d);
    int64_t taken = 0;
    if (s.epoch < 0 || s.position < 0 || s.position % window != 0 ||
        s.position > per_epoch * window || __builtin_mul_overflow(s.epoch, per_epoch, &taken) ||
        __builtin_add_overflow(taken, s.position / window, &taken) ||
        __builtin_add_overflow(total, taken, &total)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "blend source %d's data state (epoch %d, position %s) does not fit %s (%s tokens, read "
          "in windows of %d): was it saved with another --data?",
          d, s.epoch, FormatCount(s.position), streams_[d].file->path(),
          FormatCount(streams_[d].file->size()), window));
    }
    // Never a window ahead of its share, never n - 1 behind it (Blend.h); a little slack for the
    // rounding of the share.
    const double share = weights_[d] * static_cast<double>(state.windows);
    const double ahead = static_cast<double>(taken) - share;
    const double slack = 1e-6 * std::max(1.0, share);
    if (ahead >= 1.0 + slack ||
        (streams_.size() > 1 && -ahead >= static_cast<double>(streams_.size() - 1) + slack)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "blend source %d (%s) has given %d of the %d windows done, far from its share %g: "
          "was the state saved with other weights?",
          d, streams_[d].file->path(), taken, state.windows, share));
    }
  }
  if (total != state.windows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the blend's sources have given %d windows, but its data state says %d "
                        "are done: was it saved with another --data?",
                        total, state.windows));
  }
  state_ = state;
  return absl::OkStatus();
}

std::vector<BlendWindow> BlendBatcher::StepWindows(const BlendState& state,
                                                   BlendState* next) const {
  const int64_t window = config_.seq + 1;
  BlendState at = state;
  std::vector<int64_t> taken(streams_.size());
  for (size_t d = 0; d < streams_.size(); ++d) {
    taken[d] = at.sources[d].epoch * WindowsPerEpoch(d) + at.sources[d].position / window;
  }
  std::vector<BlendWindow> windows;
  windows.reserve(static_cast<size_t>(config_.global_batch()));
  for (int64_t s = 0; s < config_.global_batch(); ++s) {
    const int64_t d = BlendChoose(weights_, at.windows, taken);
    DataState& source = at.sources[d];
    if (streams_[d].file->size() - source.position < window) source = {source.epoch + 1, 0};
    windows.push_back({d, source});
    source.position += window;
    ++taken[d];
    ++at.windows;
  }
  if (next != nullptr) *next = std::move(at);
  return windows;
}

BlendState BlendBatcher::NextState(const BlendState& state) const {
  BlendState next;
  StepWindows(state, &next);
  return next;
}

absl::Status BlendBatcher::ReadRows(std::span<const BlendWindow> windows, int64_t dp_index,
                                    int64_t accum_step, std::span<int32_t> inputs,
                                    std::span<int32_t> targets,
                                    std::span<int32_t> positions) const {
  const BatchConfig& c = config_;
  HCP_RETURN_IF_ERROR(CheckMicroBatch(c, dp_index, accum_step, inputs.size(), targets.size()));
  std::vector<int64_t> scratch(static_cast<size_t>(c.seq + 1));
  for (int64_t row = 0; row < c.micro_batch; ++row) {
    const BlendWindow& w = windows[GlobalSequenceIndex(c, dp_index, accum_step, row)];
    HCP_RETURN_IF_ERROR(
        ReadWindow(streams_[w.source], w.at, c, scratch, inputs.subspan(row * c.seq, c.seq),
                   targets.subspan(row * c.seq, c.seq),
                   c.documents ? positions.subspan(row * c.seq, c.seq) : std::span<int32_t>()));
  }
  return absl::OkStatus();
}

absl::Status BlendBatcher::ReadMicroBatch(const BlendState& state, int64_t dp_index,
                                          int64_t accum_step, std::span<int32_t> inputs,
                                          std::span<int32_t> targets,
                                          std::span<int32_t> positions) const {
  return ReadRows(StepWindows(state), dp_index, accum_step, inputs, targets, positions);
}

absl::StatusOr<StepBatch> BlendBatcher::NextStep(int64_t dp_index) {
  BlendState next;
  const std::vector<BlendWindow> windows = StepWindows(state_, &next);
  HCP_ASSIGN_OR_RETURN(StepBatch batch,
                       StepBatch::Read(config_, [&](int64_t a, std::span<int32_t> in,
                                                    std::span<int32_t> tg, std::span<int32_t> pos) {
                         return ReadRows(windows, dp_index, a, in, tg, pos);
                       }));
  state_ = std::move(next);
  return batch;
}

}  // namespace hcp::data
