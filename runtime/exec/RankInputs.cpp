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
  const plan::Mesh& mesh = plan.mesh;
  const int64_t len = plan.seq / mesh.segments(), segs = mesh.segments_per_rank();
  RankInputs local;
  local.input_ids.resize(plan.local_tokens());
  local.targets.resize(plan.local_tokens());
  for (int64_t b = 0; b < plan.micro_batch; ++b) {
    for (int64_t k = 0; k < segs; ++k) {
      const int64_t from = b * plan.seq + mesh.GlobalSegment(cp_index, k) * len;
      const int64_t to = (b * segs + k) * len;
      std::copy_n(input_ids.begin() + from, len, local.input_ids.begin() + to);
      std::copy_n(targets.begin() + from, len, local.targets.begin() + to);
    }
  }
  if (loss_scale) {
    local.loss_scale = *loss_scale;
  } else {
    const auto valid = std::count_if(targets.begin(), targets.end(),
                                     [](int32_t t) { return t != plan::kIgnoredTarget; });
    local.loss_scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
  }
  return local;
}

}  // namespace hcp
