// Text files -> a Megatron indexed dataset (IndexedDataset.h) through a Hugging Face tokenizer:
// what `hybridcp tokenize --tokenizer tokenizer.json` runs. Documents come from
//   - a text file: the whole file is one document (or each line, with `lines`);
//   - a .jsonl file: each line is a JSON object whose `json_field` string is one document;
// each document is encoded, followed by the end-of-document token, and written as one sequence
// (empty documents are skipped). Encoding runs on `threads` threads over batches of documents;
// the output is the same for any number of threads.
//
// A .jsonl file of fine-tuning records (FineTuning.h: chat or prompt-completion, given or
// detected from its first record) gives a document per record and a loss mask beside the dataset
// (LossMask.h: PREFIX.lossmask.bin + .idx), 1 for the tokens the loss counts. A chat document
// ends with the assistant's <|end_of_text|> already; the end-of-document token is appended only
// when it is another one (and masked then).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/FineTuning.h"
#include "runtime/data/Tokenizer.h"

namespace hcp::data {

struct TokenizeOptions {
  bool lines = false;               // text files: a document per line, not per file
  std::string json_field = "text";  // .jsonl files: the field that holds the text
  uint32_t eos = 0;                 // appended to every document
  // The .jsonl files' format; none: detected from each file's first record (FineTuning.h).
  std::optional<DocumentFormat> format;
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
  bool masked = false;      // a loss mask was written
  int64_t counted = 0;      // with a mask: tokens whose mask is 1
  double seconds = 0;       // since the start
};

// The one format of all `files`: `given` for every .jsonl file (a text file with a fine-tuning
// format is refused), else each .jsonl file's detected one; inputs of different formats are
// refused (a dataset has a mask or not), naming a file of each.
absl::StatusOr<DocumentFormat> ResolveDocumentFormat(const std::vector<std::string>& files,
                                                     std::optional<DocumentFormat> given);

// Writes PREFIX.bin and PREFIX.idx (uint16 tokens when the tokenizer's ids fit, else int32);
// on any error (an unreadable file, a .jsonl line that is not JSON or lacks the field, text that
// is not UTF-8, a bad fine-tuning record: each named with its file, line and byte) nothing is
// written. With a mask, PREFIX.lossmask.* is committed before PREFIX.* (and removed if that
// fails); without, a PREFIX.lossmask.* left by an earlier run is removed.
absl::StatusOr<TokenizeProgress> TokenizeToIndexedDataset(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& files,
                                                          const TokenizeOptions& options,
                                                          const std::string& prefix);

}  // namespace hcp::data
