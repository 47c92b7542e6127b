// The training data a run names with --data PATH (and --data-dtype), opened in one place for
// every command that trains on it:
//   - a Megatron indexed dataset (IndexedDataset.h) when PATH is its prefix (PATH.idx and
//     PATH.bin exist), or PATH is its .bin with the .idx beside it, or its .idx;
//   - else an HCPTOK1 token file (TokenData.h), when PATH starts with the header;
//   - else, with --data-dtype, a raw file of tokens of that dtype.
// An indexed dataset may have a loss mask beside it (PREFIX.lossmask.bin/.idx, LossMask.h): it is
// opened with it and must match it.
// Whatever the format, training reads one stream of tokens back to back (the documents of an
// indexed dataset separated by the EOS tokens the data's writer put in), through the TokenFile.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/IndexedDataset.h"
#include "runtime/data/LossMask.h"
#include "runtime/data/TokenData.h"

namespace hcp::data {

enum class DataFormat { kIndexedDataset, kTokenFile, kRawTokens };

class DataSource {
 public:
  // Opens `path` as the top of this file says. `dtype` is --data-dtype: required for a raw file;
  // for a token file or an indexed dataset, which say their dtype, it must agree with them.
  static absl::StatusOr<DataSource> Open(const std::string& path, std::optional<TokenDType> dtype);

  DataSource(DataSource&&) noexcept = default;
  DataSource& operator=(DataSource&&) noexcept = default;

  DataFormat format() const { return format_; }
  // The token stream training reads (an indexed dataset's .bin). A TokenBatcher keeps a pointer
  // to it: the DataSource must stay where it is while one reads.
  const TokenFile& tokens() const { return indexed_ ? indexed_->token_file() : *file_; }
  // The indexed dataset, or nullptr for the other formats.
  const IndexedDataset* indexed() const { return indexed_ ? &*indexed_ : nullptr; }
  // The loss mask's values, one per token of tokens(), or nullptr when every target counts (no
  // mask, or not an indexed dataset). Give it to TokenBatcher::Create with tokens().
  const TokenFile* loss_mask() const { return mask_ ? &mask_->dataset.token_file() : nullptr; }

  // "Megatron indexed dataset PREFIX (.bin/.idx): 3 documents, 1,234 int32 tokens" (and ", with
  // a loss mask (N of M targets count)"),
  // "token file PATH: 1,234 uint16 tokens", "raw token file PATH: 1,234 uint16 tokens".
  std::string Describe() const;

  // Every token is below `vocab` (and none negative): one scan of the whole stream, before any
  // step runs. The error names the file, the token's index in the stream and, for an indexed
  // dataset, its document.
  absl::Status CheckVocab(int64_t vocab) const;

 private:
  DataSource() = default;

  DataFormat format_ = DataFormat::kTokenFile;
  std::optional<TokenFile> file_;          // a token file or a raw file
  std::optional<IndexedDataset> indexed_;  // an indexed dataset
  std::optional<LossMask> mask_;           // its loss mask, if it has one
};

}  // namespace hcp::data
