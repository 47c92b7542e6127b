// The loss mask of a fine-tuning dataset: which tokens are targets that count in the loss.
//
// Beside a Megatron indexed dataset PREFIX.bin + PREFIX.idx (IndexedDataset.h), a second indexed
// dataset PREFIX.lossmask.bin + PREFIX.lossmask.idx of uint8 values (dtype code 1), with exactly
// the same sequences and documents: value k of the mask belongs to token k of the stream, 1 when
// that token is a target the loss counts (the model is trained to predict it), 0 when it is
// masked (a prompt, a user turn, a role header). The tokens themselves are unchanged: a masked
// token is still an input; only the target that names it is ignored (TokenBatcher sets it to
// plan::kIgnoredTarget). A dataset without the mask files counts every target.
//
// `hybridcp tokenize --format chat|prompt-completion` writes it (FineTuning.h); DataSource opens
// it when present and refuses one that does not match its dataset.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/IndexedDataset.h"

namespace hcp::data {

// PREFIX.lossmask: the mask's own prefix (its files PREFIX.lossmask.bin and .idx).
std::string LossMaskPrefix(const std::string& prefix);

struct LossMask {
  IndexedDataset dataset;
  int64_t counted = 0;  // values that are 1
};

// The mask beside `tokens`, or none when neither of its files exists. Refused, naming the files:
// half a mask, a dtype other than uint8, sequences or documents other than the dataset's, a
// value other than 0 or 1.
absl::StatusOr<std::optional<LossMask>> OpenLossMask(const IndexedDataset& tokens);

// Removes PREFIX.lossmask.bin and .idx if they exist: a dataset written without a mask must not
// pick up one left by an earlier run at the same prefix.
absl::Status RemoveLossMask(const std::string& prefix);

}  // namespace hcp::data
