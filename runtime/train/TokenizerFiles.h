// The tokenizer a run's checkpoints carry, so that each checkpoint is a whole Hugging Face model
// directory (AutoTokenizer.from_pretrained loads it as it loads the model).
//
// `train --tokenizer PATH` names it: a directory holding a tokenizer.json, or a tokenizer.json
// file (the Hugging Face files beside it, kTokenizerFileNames, are taken too), or a JSON file of
// another name (tokenize --tokenizer takes any), which the checkpoints carry as tokenizer.json.
// Without the option, a run takes the tokenizer of --init DIR or, resumed, of the checkpoint it
// resumes from, when that directory has a tokenizer.json. The files are read once, when the run
// starts (they are small: Granite 4.0's tokenizer.json is 7 MB), and written into every checkpoint
// as they were read.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hcp::train {

// The files a Hugging Face tokenizer may consist of; tokenizer.json is the one required.
inline constexpr const char* kTokenizerFileNames[] = {"tokenizer.json",
                                                      "tokenizer_config.json",
                                                      "special_tokens_map.json",
                                                      "added_tokens.json",
                                                      "vocab.json",
                                                      "merges.txt",
                                                      "chat_template.jinja",
                                                      "chat_template.json"};
// A tokenizer file larger than this is refused (no tokenizer comes near it; a model file does).
inline constexpr int64_t kMaxTokenizerFileBytes = int64_t{256} << 20;

struct TokenizerFiles {
  std::string dir;  // where they were read: the directory, or the file given
  std::vector<std::pair<std::string, std::string>> files;  // file name, contents
};

// Whether `dir` holds a tokenizer.json.
bool HasTokenizer(const std::string& dir);

// The tokenizer at `path` (a directory, tokenizer.json, or a tokenizer file of another name).
// tokenizer.json must be a JSON object whose token ids (its model's vocab and its added tokens) are
// all below `vocab`, the model's embedding rows: a tokenizer of another model is refused now, not
// found out by the user after training. Errors name the file.
absl::StatusOr<TokenizerFiles> ReadTokenizerFiles(const std::string& path, int64_t vocab);

// "3 files from DIR (tokenizer.json, tokenizer_config.json, special_tokens_map.json)".
std::string DescribeTokenizerFiles(const TokenizerFiles& tokenizer);

// Writes each file into `dir`, atomically.
absl::Status WriteTokenizerFiles(const TokenizerFiles& tokenizer, const std::string& dir);

}  // namespace hcp::train
