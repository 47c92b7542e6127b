#include "runtime/data/ByteTokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/support/Status.h"

namespace hcp::data {

namespace fs = std::filesystem;

std::vector<uint32_t> ByteTokenize(std::string_view text, bool add_bos, bool add_eos) {
  std::vector<uint32_t> tokens;
  tokens.reserve(text.size() + 2);
  if (add_bos) tokens.push_back(kByteBos);
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  if (add_eos) tokens.push_back(kByteEos);
  return tokens;
}

std::string ByteDetokenize(std::span<const uint32_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (uint32_t token : tokens) {
    if (token < 256) {
      text.push_back(static_cast<char>(token));
    } else if (token == kByteBos) {
      text += "<bos>";
    } else if (token == kByteEos) {
      text += "<eos>";
    } else if (token == kBytePad) {
      text += "<pad>";
    } else {
      absl::StrAppend(&text, "<unk:", token, ">");
    }
  }
  return text;
}

absl::StatusOr<int64_t> TokenizeTextFiles(const std::vector<std::string>& inputs,
                                          const std::string& output, TokenDType dtype) {
  if (inputs.empty()) return absl::InvalidArgumentError("no text files to tokenize");
  std::vector<uint32_t> tokens;
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(input, ec)) {
      return absl::NotFoundError(absl::StrCat(input, ": no such text file"));
    }
    std::ifstream in(input, std::ios::binary);
    std::string text(std::istreambuf_iterator<char>(in), {});
    if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", input));
    std::vector<uint32_t> document = ByteTokenize(text);
    tokens.insert(tokens.end(), document.begin(), document.end());
  }
  HCP_RETURN_IF_ERROR(WriteTokenFile(output, tokens, dtype));
  return static_cast<int64_t>(tokens.size());
}

absl::StatusOr<std::vector<std::string>> ListTextFiles(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : it) {
    // Symbolic links are skipped: in the demo corpus they are aliases (GPL -> GPL-3), and
    // listing them would put the same text in twice.
    if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) continue;
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return absl::NotFoundError(absl::StrCat(dir, " holds no files"));
  return files;
}

}  // namespace hcp::data
