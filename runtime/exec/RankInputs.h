// One place cuts a rank's shard of a global micro-batch: both executors' SetInputs take the
// whole sequences and keep what this rank's cp index holds.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/plan/Plan.h"

namespace hcp {

// What a rank's input buffers receive: its tokens and targets (the plan's input_ids and
// targets, local_tokens() each) and the loss scale.
struct RankInputs {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> targets;
  float loss_scale = 0.0f;
};

// ids and targets are one GLOBAL micro-batch, [micro_batch, seq] each. Local segment k of
// sequence b is global segment Mesh::GlobalSegment(cp_index, k) (one rank: the sequences whole,
// in order). Without `loss_scale`, 1 / (valid targets of this micro-batch) (0 when none is).
// InvalidArgument when the sizes are not the plan's.
absl::StatusOr<RankInputs> CutRankInputs(const plan::Plan& plan, int64_t cp_index,
                                         std::span<const int32_t> input_ids,
                                         std::span<const int32_t> targets,
                                         std::optional<float> loss_scale);

}  // namespace hcp
