#include "runtime/data/DataSource.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"

namespace hcp::data {

namespace fs = std::filesystem;

namespace {

bool Exists(const std::string& path) {
  std::error_code error;
  return fs::exists(path, error);
}

bool IsFile(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// The prefix of the indexed dataset `path` names, if it names one.
std::optional<std::string> IndexedPrefix(const std::string& path) {
  if (absl::EndsWith(path, ".idx")) return path.substr(0, path.size() - 4);
  if (absl::EndsWith(path, ".bin")) {
    const std::string prefix = path.substr(0, path.size() - 4);
    if (Exists(IndexPath(prefix))) return prefix;
  }
  if (IsFile(IndexPath(path)) && IsFile(DataPath(path))) return path;
  // Half a dataset where no file is: IndexedDataset::Open says which half is missing.
  if (!Exists(path) && (Exists(IndexPath(path)) || Exists(DataPath(path)))) return path;
  return std::nullopt;
}

absl::Status CheckDTypeAgrees(std::optional<TokenDType> given, TokenDType stored,
                              const std::string& where) {
  if (!given || *given == stored) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--data-dtype %s, but %s says its tokens are %s: leave --data-dtype out (it is for raw "
      "files, which do not say)",
      TokenDTypeName(*given), where, TokenDTypeName(stored)));
}

}  // namespace

absl::StatusOr<DataSource> DataSource::Open(const std::string& path,
                                            std::optional<TokenDType> dtype) {
  DataSource source;
  if (std::optional<std::string> prefix = IndexedPrefix(path)) {
    HCP_ASSIGN_OR_RETURN(IndexedDataset dataset, IndexedDataset::Open(*prefix));
    HCP_RETURN_IF_ERROR(CheckDTypeAgrees(dtype, dataset.dtype(), IndexPath(*prefix)));
    HCP_ASSIGN_OR_RETURN(source.mask_, OpenLossMask(dataset));
    source.format_ = DataFormat::kIndexedDataset;
    source.indexed_ = std::move(dataset);
    return source;
  }
  if (!Exists(path)) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no such file, nor %s and %s of a Megatron indexed dataset", path,
                        IndexPath(path), DataPath(path)));
  }
  if (!IsFile(path)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));

  char start[sizeof(kTokenFileMagic)] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(start, sizeof(start));
  const bool has_header = in.gcount() == static_cast<std::streamsize>(sizeof(start)) &&
                          std::memcmp(start, kTokenFileMagic, sizeof(start)) == 0;
  if (has_header) {
    HCP_ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path));
    HCP_RETURN_IF_ERROR(CheckDTypeAgrees(dtype, file.dtype(), absl::StrCat(path, "'s header")));
    source.format_ = DataFormat::kTokenFile;
    source.file_ = std::move(file);
    return source;
  }
  if (!dtype) {
    const std::string no_index =
        absl::EndsWith(path, ".bin")
            ? absl::StrFormat(", nor the .bin of a Megatron indexed dataset (no %s beside it)",
                              IndexPath(path.substr(0, path.size() - 4)))
            : std::string();
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s does not start with the HCPTOK1 header of a token file%s: for a raw file of tokens, "
        "give their dtype with --data-dtype uint16, uint32 or int32",
        path, no_index));
  }
  HCP_ASSIGN_OR_RETURN(TokenFile file, TokenFile::OpenRaw(path, *dtype));
  source.format_ = DataFormat::kRawTokens;
  source.file_ = std::move(file);
  return source;
}

std::string DataSource::Describe() const {
  const TokenFile& t = tokens();
  const std::string count =
      absl::StrFormat("%s %s tokens", FormatCount(t.size()), TokenDTypeName(t.dtype()));
  switch (format_) {
    case DataFormat::kIndexedDataset: {
      const std::string mask =
          mask_ ? absl::StrFormat(", with a loss mask (%s of %s targets count)",
                                  FormatCount(mask_->counted), FormatCount(t.size()))
                : std::string();
      return absl::StrFormat("Megatron indexed dataset %s (.bin/.idx): %s documents, %s%s",
                             indexed_->prefix(), FormatCount(indexed_->documents()), count, mask);
    }
    case DataFormat::kTokenFile:
      return absl::StrFormat("token file %s: %s", t.path(), count);
    case DataFormat::kRawTokens:
      return absl::StrFormat("raw token file %s: %s", t.path(), count);
  }
  return count;
}

absl::Status DataSource::CheckVocab(int64_t vocab) const {
  const TokenFile& t = tokens();
  const int64_t at = t.FindTokenOutside(vocab, 0, t.size());
  if (at < 0) return absl::OkStatus();
  const int64_t token = t.value(at);
  std::string document;
  if (indexed_) {
    const int64_t k = indexed_->DocumentOf(at);
    document = absl::StrFormat(" (document %d of %d, its token %d)", k, indexed_->documents(),
                               at - indexed_->document_starts()[k]);
  }
  const std::string what =
      token < 0
          ? std::string("negative")
          : absl::StrFormat(
                ">= the model's vocab %d (was the data tokenized for another vocabulary?)", vocab);
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: token %d at index %d of the tokens%s is %s", t.path(), token, at, document, what));
}

}  // namespace hcp::data
