// A byte-level tokenizer for small demos: no vocabulary file, nothing to download.
//   ids 0..255   the bytes of the text (UTF-8 is split into its bytes)
//   256          BOS, begins every document
//   257          EOS, ends every document
//   258          PAD (never produced by Tokenize; reserved for padding)
// A model trained on it needs vocab >= 259 (kByteVocabMin); Granite's vocab (100k) is larger,
// and the ids above 258 are simply never seen.
//
// The demo corpus: the licence texts in /usr/share/common-licenses/ (Apache-2.0, GPL-3, ...),
// which Debian's base-files package ships. base-files is an essential package, so they are on
// every Debian and Ubuntu system: about 250 kB of English text that needs no download.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/TokenData.h"

namespace hcp::data {

inline constexpr uint32_t kByteBos = 256;
inline constexpr uint32_t kByteEos = 257;
inline constexpr uint32_t kBytePad = 258;
inline constexpr int64_t kByteVocabMin = 259;
inline constexpr char kDemoCorpusDir[] = "/usr/share/common-licenses";

// The bytes of `text` as tokens, with BOS in front and EOS behind when asked.
std::vector<uint32_t> ByteTokenize(std::string_view text, bool add_bos = true, bool add_eos = true);

// Back to text: bytes as they are; BOS, EOS and PAD as "<bos>", "<eos>", "<pad>"; any other id
// (>= 259, from a model with a larger vocab) as "<unk:ID>".
std::string ByteDetokenize(std::span<const uint32_t> tokens);

// Tokenizes each file of `inputs` as one document (BOS, its bytes, EOS), in the order given,
// and writes them back to back to `output` as a token file (TokenData.h), atomically.
// Returns the number of tokens written. A missing or unreadable input is an error naming it.
absl::StatusOr<int64_t> TokenizeTextFiles(const std::vector<std::string>& inputs,
                                          const std::string& output,
                                          TokenDType dtype = TokenDType::U16);

// The regular files of `dir` (symbolic links skipped), sorted by name: the input list for
// TokenizeTextFiles on kDemoCorpusDir.
absl::StatusOr<std::vector<std::string>> ListTextFiles(const std::string& dir);

}  // namespace hcp::data
