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

// This rank's share of one GLOBAL micro-batch's [micro_batch, seq] values (ids, targets or
// positions), as CutRankInputs cuts them. `values` must hold the plan's micro_batch * seq.
std::vector<int32_t> CutRankTokens(const plan::Plan& plan, int64_t cp_index,
                                   std::span<const int32_t> values);

// Packed documents: `position_ids` [micro_batch, seq] hold Hugging Face's padding-free
// position_ids, each token's position in its document: every row starts a document (0), and
// each later value is 0 (a document starts) or one more than the one before. InvalidArgument
// names the first row and position that breaks this, or a size that is not the plan's.
absl::Status CheckPositionIds(const plan::Plan& plan, std::span<const int32_t> position_ids);
// One document per row: 0, 1, ..., seq - 1 in every row.
std::vector<int32_t> OneDocumentPerRow(const plan::Plan& plan);
// Whether checked `position_ids` start no document but at each row's first token (then they are
// OneDocumentPerRow's, and the step is that of a plan without --documents).
bool IsOneDocumentPerRow(const plan::Plan& plan, std::span<const int32_t> position_ids);

}  // namespace hcp
