// Text files -> a Megatron indexed dataset (IndexedDataset.h) through a Hugging Face tokenizer:
// what `hybridcp tokenize --tokenizer tokenizer.json` runs. Documents come from
//   - a text file: the whole file is one document (or each line, with `lines`);
//   - a .jsonl file: each line is a JSON object whose `json_field` string is one document;
// each document is encoded, followed by the end-of-document token, and written as one sequence
// (empty documents are skipped). Encoding runs on `threads` threads over batches of documents;
// the output is the same for any number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/Tokenizer.h"

namespace hcp::data {

struct TokenizeOptions {
  bool lines = false;               // text files: a document per line, not per file
  std::string json_field = "text";  // .jsonl files: the field that holds the text
  uint32_t eos = 0;                 // appended to every document
  int threads = 1;
  // Called now and then (and once at the end) with what has been done.
  std::function<void(const struct TokenizeProgress&)> progress;
};

struct TokenizeProgress {
  int64_t bytes = 0;        // text read
  int64_t total_bytes = 0;  // of all input files
  int64_t documents = 0;    // written
  int64_t skipped = 0;      // empty documents
  int64_t tokens = 0;       // written, end-of-document tokens included
  double seconds = 0;       // since the start
};

// Writes PREFIX.bin and PREFIX.idx (uint16 tokens when the tokenizer's ids fit, else int32);
// on any error (an unreadable file, a .jsonl line that is not JSON or lacks the field, text that
// is not UTF-8: each named with its file, line and byte) nothing is written.
absl::StatusOr<TokenizeProgress> TokenizeToIndexedDataset(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& files,
                                                          const TokenizeOptions& options,
                                                          const std::string& prefix);

}  // namespace hcp::data
