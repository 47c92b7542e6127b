#include "runtime/train/TokenizerFiles.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"

namespace hcp::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

absl::StatusOr<std::string> ReadWhole(const fs::path& path) {
  std::error_code error;
  const uintmax_t bytes = fs::file_size(path, error);
  if (error) {
    return absl::NotFoundError(absl::StrFormat("%s: %s", path.string(), error.message()));
  }
  if (bytes > static_cast<uintmax_t>(kMaxTokenizerFileBytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s bytes is larger than any tokenizer file (at most %s)", path.string(),
        FormatCount(static_cast<int64_t>(bytes)), FormatCount(kMaxTokenizerFileBytes)));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (!in && !in.eof()) return absl::DataLossError(absl::StrCat(path.string(), ": cannot read"));
  return text;
}

// The largest token id tokenizer.json names: its BPE/WordPiece model's vocab values (a Unigram
// model's vocab is a list of pieces, whose ids are their indices) and its added tokens' ids.
absl::StatusOr<int64_t> LargestTokenId(const json& tokenizer, const std::string& path) {
  int64_t largest = -1;
  auto take = [&](const json& id, std::string_view where) -> absl::Status {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s is not an integer token id", path, where));
    }
    largest = std::max(largest, id.get<int64_t>());
    return absl::OkStatus();
  };
  if (auto model = tokenizer.find("model"); model != tokenizer.end() && model->is_object()) {
    if (auto vocab = model->find("vocab"); vocab != model->end()) {
      if (vocab->is_object()) {
        for (const auto& [token, id] : vocab->items()) {
          HCP_RETURN_IF_ERROR(take(id, absl::StrCat("model.vocab[\"", token, "\"]")));
        }
      } else if (vocab->is_array()) {
        largest = std::max(largest, static_cast<int64_t>(vocab->size()) - 1);
      }
    }
  }
  if (auto added = tokenizer.find("added_tokens"); added != tokenizer.end() && added->is_array()) {
    for (size_t i = 0; i < added->size(); ++i) {
      const json& entry = (*added)[i];
      if (!entry.is_object() || !entry.contains("id")) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: added_tokens[%d] has no id", path, i));
      }
      HCP_RETURN_IF_ERROR(take(entry["id"], absl::StrFormat("added_tokens[%d].id", i)));
    }
  }
  return largest;
}

}  // namespace

bool HasTokenizer(const std::string& dir) {
  std::error_code error;
  return fs::is_regular_file(fs::path(dir) / kTokenizerFileNames[0], error);
}

absl::StatusOr<TokenizerFiles> ReadTokenizerFiles(const std::string& path, int64_t vocab) {
  std::error_code error;
  const bool is_dir = fs::is_directory(path, error);
  if (!is_dir && !fs::is_regular_file(path, error)) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no such tokenizer.json or directory holding one", path));
  }
  // A file of another name is the tokenizer.json itself (tokenize --tokenizer takes any name);
  // the files beside it are another tokenizer's, or none, so only tokenizer.json's neighbours go.
  fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const bool with_neighbours = is_dir || fs::path(path).filename() == kTokenizerFileNames[0];
  TokenizerFiles tokenizer{is_dir ? dir.string() : path, {}};
  const fs::path main_file = is_dir ? dir / kTokenizerFileNames[0] : fs::path(path);
  if (!fs::exists(main_file, error)) {
    return absl::NotFoundError(absl::StrFormat("%s has no tokenizer.json", dir.string()));
  }
  HCP_ASSIGN_OR_RETURN(std::string main_text, ReadWhole(main_file));
  tokenizer.files.emplace_back(kTokenizerFileNames[0], std::move(main_text));
  for (const char* name : kTokenizerFileNames) {
    const fs::path file = dir / name;
    if (!with_neighbours || name == kTokenizerFileNames[0] || !fs::exists(file, error)) continue;
    HCP_ASSIGN_OR_RETURN(std::string text, ReadWhole(file));
    tokenizer.files.emplace_back(name, std::move(text));
  }
  const std::string main_path = main_file.string();
  const json parsed =
      json::parse(tokenizer.files.front().second, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not a JSON object (not a Hugging Face tokenizer.json)", main_path));
  }
  HCP_ASSIGN_OR_RETURN(const int64_t largest, LargestTokenId(parsed, main_path));
  if (largest >= vocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has token ids up to %s, but the model's vocabulary has %s rows: the tokenizer of "
        "another model?",
        main_path, FormatCount(largest), FormatCount(vocab)));
  }
  return tokenizer;
}

std::string DescribeTokenizerFiles(const TokenizerFiles& tokenizer) {
  std::vector<std::string> names;
  for (const auto& [name, text] : tokenizer.files) names.push_back(name);
  return absl::StrFormat("%d file%s from %s (%s)", names.size(), names.size() == 1 ? "" : "s",
                         tokenizer.dir, absl::StrJoin(names, ", "));
}

absl::Status WriteTokenizerFiles(const TokenizerFiles& tokenizer, const std::string& dir) {
  for (const auto& [name, text] : tokenizer.files) {
    HCP_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / name).string(), text));
  }
  return absl::OkStatus();
}

}  // namespace hcp::train
