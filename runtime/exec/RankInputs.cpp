#include "runtime/exec/RankInputs.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace hcp {

absl::StatusOr<RankInputs> CutRankInputs(const plan::Plan& plan, int64_t cp_index,
                                         std::span<const int32_t> input_ids,
                                         std::span<const int32_t> targets,
                                         std::optional<float> loss_scale) {
  const auto tokens = static_cast<size_t>(plan.tokens());
  if (input_ids.size() != tokens || targets.size() != tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "got %d input ids and %d targets, the plan takes micro_batch*seq = %d*%d = %d of each",
        input_ids.size(), targets.size(), plan.micro_batch, plan.seq, tokens));
  }
  RankInputs local;
  local.input_ids = CutRankTokens(plan, cp_index, input_ids);
  local.targets = CutRankTokens(plan, cp_index, targets);
  if (loss_scale) {
    local.loss_scale = *loss_scale;
  } else {
    const auto valid = std::count_if(targets.begin(), targets.end(),
                                     [](int32_t t) { return t != plan::kIgnoredTarget; });
    local.loss_scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
  }
  return local;
}

std::vector<int32_t> CutRankTokens(const plan::Plan& plan, int64_t cp_index,
                                   std::span<const int32_t> values) {
  const plan::Mesh& mesh = plan.mesh;
  const int64_t len = plan.seq / mesh.segments(), segs = mesh.segments_per_rank();
  std::vector<int32_t> local(plan.local_tokens());
  for (int64_t b = 0; b < plan.micro_batch; ++b) {
    for (int64_t k = 0; k < segs; ++k) {
      const int64_t from = b * plan.seq + mesh.GlobalSegment(cp_index, k) * len;
      std::copy_n(values.begin() + from, len, local.begin() + (b * segs + k) * len);
    }
  }
  return local;
}

absl::Status CheckPositionIds(const plan::Plan& plan, std::span<const int32_t> position_ids) {
  if (static_cast<int64_t>(position_ids.size()) != plan.tokens()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("got %d position ids, the plan takes micro_batch*seq = %d*%d = %d",
                        position_ids.size(), plan.micro_batch, plan.seq, plan.tokens()));
  }
  for (int64_t b = 0; b < plan.micro_batch; ++b) {
    const int32_t* row = position_ids.data() + b * plan.seq;
    constexpr char kConvention[] =
        "position_ids count each token's position in its document (Hugging Face's padding-free "
        "convention), every row starting one";
    if (plan.seq > 0 && row[0] != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("position_ids row %d starts with %d, not 0: %s", b, row[0], kConvention));
    }
    for (int64_t t = 1; t < plan.seq; ++t) {
      if (row[t] == row[t - 1] + 1 || row[t] == 0) continue;
      return absl::InvalidArgumentError(
          absl::StrFormat("position_ids row %d, position %d: %d, where a document goes on (%d) or "
                          "starts (0): %s",
                          b, t, row[t], row[t - 1] + 1, kConvention));
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> OneDocumentPerRow(const plan::Plan& plan) {
  std::vector<int32_t> positions(plan.tokens());
  for (int64_t i = 0; i < plan.tokens(); ++i) positions[i] = static_cast<int32_t>(i % plan.seq);
  return positions;
}

bool IsOneDocumentPerRow(const plan::Plan& plan, std::span<const int32_t> position_ids) {
  for (size_t i = 0; i < position_ids.size(); ++i) {
    if (position_ids[i] == 0 && i % plan.seq != 0) return false;
  }
  return true;
}

}  // namespace hcp
