#include "runtime/data/LossMask.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"

namespace hcp::data {

namespace fs = std::filesystem;

std::string LossMaskPrefix(const std::string& prefix) { return prefix + ".lossmask"; }

absl::StatusOr<std::optional<LossMask>> OpenLossMask(const IndexedDataset& tokens) {
  const std::string prefix = LossMaskPrefix(tokens.prefix());
  std::error_code error;
  if (!fs::exists(IndexPath(prefix), error) && !fs::exists(DataPath(prefix), error)) {
    return std::nullopt;
  }
  absl::StatusOr<IndexedDataset> opened = IndexedDataset::Open(prefix);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrCat("the loss mask of ", tokens.prefix(),
                                                             ": ", opened.status().message()));
  }
  LossMask mask{*std::move(opened)};
  const IndexedDataset& m = mask.dataset;
  const std::string against =
      absl::StrFormat("%s (the loss mask of %s)", IndexPath(prefix), IndexPath(tokens.prefix()));
  if (m.dtype() != TokenDType::U8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds %s values; a loss mask is uint8 (0 or 1)", against, TokenDTypeName(m.dtype())));
  }
  if (m.sequences() != tokens.sequences() || m.documents() != tokens.documents()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %s sequences in %s documents, its dataset %s in %s: they do not belong together",
        against, FormatCount(m.sequences()), FormatCount(m.documents()),
        FormatCount(tokens.sequences()), FormatCount(tokens.documents())));
  }
  for (int64_t s = 0; s < m.sequences(); ++s) {
    if (m.sequence_lengths()[s] != tokens.sequence_lengths()[s]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: sequence %d has %d values, but the dataset's sequence %d has %d tokens: they do "
          "not belong together",
          against, s, m.sequence_lengths()[s], s, tokens.sequence_lengths()[s]));
    }
  }
  if (!std::equal(m.document_starts().begin(), m.document_starts().end(),
                  tokens.document_starts().begin())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: its documents start elsewhere than the dataset's", against));
  }
  const TokenFile& values = m.token_file();
  const int64_t bad = values.FindTokenOutside(2, 0, values.size());
  if (bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: value %d at index %d; a loss mask holds only 0 (masked) and 1 "
                        "(counts)",
                        DataPath(prefix), values.value(bad), bad));
  }
  for (int64_t i = 0; i < values.size(); ++i) mask.counted += values.at(i);
  return mask;
}

absl::Status RemoveLossMask(const std::string& prefix) {
  const std::string mask = LossMaskPrefix(prefix);
  for (const std::string& path : {IndexPath(mask), DataPath(mask)}) {
    std::error_code error;
    fs::remove(path, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot remove the stale loss mask ", path, ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace hcp::data
