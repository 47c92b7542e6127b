// Several training datasets blended by weight: `train --data 0.3 A 0.7 B` (Megatron's
// convention: weight/path pairs, the weights normalised to sum 1).
//
// The rule (a blend's steps; plain --data PATH keeps TokenData.h's rule):
//   The global batch's windows (TokenData.h: seq + 1 tokens each, global_batch a step) are
//   numbered across the run, k = 0, 1, 2, ...: window s of the step that starts with k0 windows
//   done is k0 + s. Window k is drawn from the source d that maximises
//     weight[d] * (k + 1) - taken[d]
//   (taken[d]: the windows drawn from d before k; ties go to the lowest d), Megatron's
//   BlendedDataset greedy index. After any K windows no source is a window or more ahead of its
//   share: taken[d] < weight[d] * K + 1 (the gaps add up to 1, so the chosen one's is positive).
//   With two sources each stays within half a window of its share either way; with n sources one
//   may lag a little more than a window behind (measured: up to about 1.2 for 5-12 sources),
//   never n - 1 (the others' leads, each below one, make up its lag). The products are IEEE
//   doubles without fused multiply-adds (Blend.cpp is built with -ffp-contract=off), so every
//   build assigns alike.
//   Each source is read as windows of seq + 1 consecutive tokens of its own stream, back to back:
//   its file as stored, or with --shuffle-seed N its documents in DocumentOrder.h's order for the
//   seed BlendSourceSeed(N, d). When fewer than seq + 1 tokens remain at a source's position, it
//   starts its next epoch at 0 (per source, per window; the tail is skipped in that epoch). Its
//   loss mask, if it has one, applies to its tokens.
//   Window s goes to dp rank d, accumulation step a, row i as TokenData.h says
//   (s = (a * dp + d) * micro_batch + i).
// The assignment depends on k and the weights alone, never on the cp/dp/grad_accum split, so
// any split of the same global batch, and a resumed run, read exactly the same global batches.
//
// The state (BlendState) is the windows done and each source's DataState (epoch, position in its
// stream, before the wrap check). A source's windows taken follow from its state: epoch *
// (tokens / (seq + 1)) + position / (seq + 1), so the state holds nothing that could disagree.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/TokenData.h"

namespace hcp::data {

// The weights divided by their sum; each must be a positive finite number.
absl::StatusOr<std::vector<double>> NormalizeBlendWeights(std::span<const double> weights);

// The source window k is drawn from (the rule above), given taken[d] for the windows before k.
int64_t BlendChoose(std::span<const double> weights, int64_t k, std::span<const int64_t> taken);

// Source d's shuffle seed for --shuffle-seed `seed`: the (d + 1)-th number of SplitMix64 started
// at `seed` (DocumentOrder.h), Mix64(seed + (d + 1) * 0x9E3779B97F4A7C15).
uint64_t BlendSourceSeed(uint64_t seed, int64_t source);

// Where a blend stands: the next step begins with window `windows` of the run, and source d's next
// window at sources[d] (before its wrap-around check).
struct BlendState {
  int64_t windows = 0;
  std::vector<DataState> sources;
  bool operator==(const BlendState&) const = default;
};

// One window of a step: the source it is drawn from and where in that source's stream it lies.
struct BlendWindow {
  int64_t source = 0;
  DataState at;
  bool operator==(const BlendWindow&) const = default;
};

// Cuts steps out of several token streams (the rule above). Reads through the streams' files,
// masks and orders, which must outlive the batcher.
class BlendBatcher {
 public:
  // `weights` (one per stream) must be normalised (NormalizeBlendWeights). Checks the config,
  // each stream (CheckTokenStream) and that each holds at least one window:
  // "b.bin has 40 tokens; a blend reads windows of seq + 1 = 65 tokens from each source".
  static absl::StatusOr<BlendBatcher> Create(std::vector<TokenStream> streams,
                                             std::vector<double> weights,
                                             const BatchConfig& config);

  const BatchConfig& config() const { return config_; }
  const std::vector<double>& weights() const { return weights_; }
  // Where the next step begins.
  const BlendState& state() const { return state_; }
  // Continues from a saved state; refuses one that does not fit these sources and weights (its
  // count of sources, a position beyond a source's last window or between windows, windows taken
  // that do not add up to the windows done or stray from their shares beyond the bounds above).
  absl::Status Restore(const BlendState& state);

  // The global batch's windows of the step that begins at `state`, in order (global_batch of
  // them), and the state after it.
  std::vector<BlendWindow> StepWindows(const BlendState& state, BlendState* next = nullptr) const;
  BlendState NextState(const BlendState& state) const;

  // Micro-batch `accum_step` of dp rank `dp_index` for the step that begins at `state`, as
  // TokenBatcher::ReadMicroBatch.
  absl::Status ReadMicroBatch(const BlendState& state, int64_t dp_index, int64_t accum_step,
                              std::span<int32_t> inputs, std::span<int32_t> targets,
                              std::span<int32_t> positions = {}) const;
  // All grad_accum micro-batches of dp rank `dp_index` for the next step (StepBatch::start is
  // left {0, 0}), then advances the state. On error the state is left unchanged.
  absl::StatusOr<StepBatch> NextStep(int64_t dp_index);

 private:
  BlendBatcher(std::vector<TokenStream> streams, std::vector<double> weights,
               const BatchConfig& config);
  // Windows of seq + 1 tokens that fit one pass over source d.
  int64_t WindowsPerEpoch(size_t d) const;
  absl::Status ReadRows(std::span<const BlendWindow> windows, int64_t dp_index, int64_t accum_step,
                        std::span<int32_t> inputs, std::span<int32_t> targets,
                        std::span<int32_t> positions) const;

  std::vector<TokenStream> streams_;
  std::vector<double> weights_;
  BatchConfig config_;
  BlendState state_;
};

}  // namespace hcp::data
