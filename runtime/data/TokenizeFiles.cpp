#include "runtime/data/TokenizeFiles.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/data/IndexedDataset.h"
#include "runtime/data/LossMask.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::data {
namespace {

namespace fs = std::filesystem;

// Documents are encoded in batches of about this much text (all threads at once).
constexpr int64_t kBatchBytes = 16 << 20;
constexpr double kProgressSeconds = 5.0;

struct Document {
  std::string text;                   // a text document
  std::vector<TextSegment> segments;  // or a fine-tuning record's (FineTuning.h)
  std::string where;                  // "file", "file:line" for errors
};

// The batch's documents encoded on `threads` threads: a text document followed by `eos`; a
// fine-tuning record's segments with their mask, and `eos` unless `eos_in_document` (a chat
// document's last <|end_of_text|> is it).
absl::Status EncodeBatch(std::deque<Encoder>& encoders, const std::vector<Document>& batch,
                         uint32_t eos, DocumentFormat format, bool eos_in_document,
                         std::vector<std::vector<uint32_t>>& ids,
                         std::vector<std::vector<uint32_t>>& masks) {
  ids.assign(batch.size(), {});
  masks.assign(batch.size(), {});
  std::vector<absl::Status> errors(batch.size());
  std::atomic<size_t> next{0};
  auto work = [&](Encoder& encoder) {
    for (size_t i = next++; i < batch.size(); i = next++) {
      if (format == DocumentFormat::kText) {
        errors[i] = encoder.Encode(batch[i].text, ids[i]);
        if (!ids[i].empty()) ids[i].push_back(eos);
        continue;
      }
      errors[i] = EncodeSegments(encoder, batch[i].segments, ids[i], masks[i]);
      if (!eos_in_document) {
        ids[i].push_back(eos);
        // A prompt-completion record learns to stop after the completion; after a chat the
        // extra token is only a separator.
        masks[i].push_back(format == DocumentFormat::kPromptCompletion ? 1 : 0);
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < encoders.size() && t < batch.size(); ++t) {
    threads.emplace_back(work, std::ref(encoders[t]));
  }
  work(encoders[0]);
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!errors[i].ok()) {
      return absl::InvalidArgumentError(absl::StrCat(batch[i].where, ": ", errors[i].message()));
    }
  }
  return absl::OkStatus();
}

// Reads `path` document by document, handing each batch to `flush`.
class DocumentReader {
 public:
  DocumentReader(const TokenizeOptions& options, DocumentFormat format,
                 std::function<absl::Status()> flush, std::vector<Document>& batch,
                 int64_t& batch_bytes, int64_t& bytes_read)
      : options_(options),
        format_(format),
        flush_(std::move(flush)),
        batch_(batch),
        batch_bytes_(batch_bytes),
        bytes_read_(bytes_read) {}

  absl::Status Read(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      return absl::NotFoundError(absl::StrCat(path, ": no such text file"));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open it"));
    bool jsonl = absl::EndsWith(path, ".jsonl");
    if (!jsonl && !options_.lines) {
      std::string text(std::istreambuf_iterator<char>(in), {});
      if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": cannot read it"));
      bytes_read_ += static_cast<int64_t>(text.size());
      return Add(std::move(text), path);
    }
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      bytes_read_ += static_cast<int64_t>(line.size()) + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::string where = absl::StrCat(path, ":", number);
      if (!jsonl) {
        HCP_RETURN_IF_ERROR(Add(std::move(line), where));
        continue;
      }
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      HCP_ASSIGN_OR_RETURN(nlohmann::json record, ParseJsonStrict(line, where));
      if (format_ != DocumentFormat::kText) {
        HCP_ASSIGN_OR_RETURN(std::vector<TextSegment> segments,
                             format_ == DocumentFormat::kChat
                                 ? ChatSegments(record, where)
                                 : PromptCompletionSegments(record, where));
        HCP_RETURN_IF_ERROR(AddSegments(std::move(segments), std::move(where)));
        continue;
      }
      auto field = record.is_object() ? record.find(options_.json_field) : record.end();
      if (!record.is_object() || field == record.end() || !field->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": no string field \"", options_.json_field, "\" in this line"));
      }
      HCP_RETURN_IF_ERROR(Add(field->get<std::string>(), where));
    }
    if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": cannot read it"));
    return absl::OkStatus();
  }

 private:
  absl::Status Add(std::string text, std::string where) {
    batch_bytes_ += static_cast<int64_t>(text.size());
    batch_.push_back({std::move(text), {}, std::move(where)});
    if (batch_bytes_ >= kBatchBytes) return flush_();
    return absl::OkStatus();
  }

  absl::Status AddSegments(std::vector<TextSegment> segments, std::string where) {
    for (const TextSegment& segment : segments) {
      batch_bytes_ += static_cast<int64_t>(segment.text.size());
    }
    batch_.push_back({std::string(), std::move(segments), std::move(where)});
    if (batch_bytes_ >= kBatchBytes) return flush_();
    return absl::OkStatus();
  }

  const TokenizeOptions& options_;
  DocumentFormat format_;
  std::function<absl::Status()> flush_;
  std::vector<Document>& batch_;
  int64_t& batch_bytes_;
  int64_t& bytes_read_;
};

}  // namespace

absl::StatusOr<DocumentFormat> ResolveDocumentFormat(const std::vector<std::string>& files,
                                                     std::optional<DocumentFormat> given) {
  std::optional<DocumentFormat> format;
  std::string first;  // a file of `format`
  for (const std::string& file : files) {
    DocumentFormat this_one = DocumentFormat::kText;
    if (absl::EndsWith(file, ".jsonl")) {
      if (given) {
        this_one = *given;
      } else {
        HCP_ASSIGN_OR_RETURN(this_one, DetectJsonlFormat(file));
      }
    } else if (given && *given != DocumentFormat::kText) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": --format ", std::string(DocumentFormatName(*given)),
                       " reads .jsonl files of records, and this is a text file"));
    }
    if (format && *format != this_one) {
      return absl::InvalidArgumentError(absl::StrCat(
          first, " holds ", std::string(DocumentFormatName(*format)), " documents but ", file,
          " holds ", std::string(DocumentFormatName(this_one)),
          " ones: tokenize them into two datasets (a dataset has a loss mask or none)"));
    }
    if (!format) first = file;
    format = this_one;
  }
  return format.value_or(DocumentFormat::kText);
}

absl::StatusOr<TokenizeProgress> TokenizeToIndexedDataset(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& files,
                                                          const TokenizeOptions& options,
                                                          const std::string& prefix) {
  if (files.empty()) return absl::InvalidArgumentError("no text files to tokenize");
  auto start = std::chrono::steady_clock::now();
  TokenizeProgress progress;
  for (const std::string& file : files) {
    std::error_code ec;
    uintmax_t size = fs::file_size(file, ec);
    if (!ec) progress.total_bytes += static_cast<int64_t>(size);
  }
  HCP_ASSIGN_OR_RETURN(DocumentFormat format, ResolveDocumentFormat(files, options.format));
  const bool masked = format != DocumentFormat::kText;
  if (format == DocumentFormat::kChat) {
    HCP_RETURN_IF_ERROR(CheckChatTokens(tokenizer, "the tokenizer"));
  }
  const bool eos_in_document =
      format == DocumentFormat::kChat && tokenizer.TokenId(kEndOfText) == options.eos;
  TokenDType dtype = tokenizer.vocab_size() <= 65536 ? TokenDType::U16 : TokenDType::I32;
  HCP_ASSIGN_OR_RETURN(IndexedDatasetWriter writer, IndexedDatasetWriter::Create(prefix, dtype));
  std::optional<IndexedDatasetWriter> mask_writer;
  if (masked) {
    HCP_ASSIGN_OR_RETURN(mask_writer,
                         IndexedDatasetWriter::Create(LossMaskPrefix(prefix), TokenDType::U8));
  }

  std::deque<Encoder> encoders;  // one per thread (an Encoder does not move)
  for (int t = 0; t < std::max(1, options.threads); ++t) encoders.emplace_back(tokenizer);
  std::vector<Document> batch;
  int64_t batch_bytes = 0;
  std::vector<std::vector<uint32_t>> ids, masks;
  double last_report = 0;
  auto flush = [&]() -> absl::Status {
    HCP_RETURN_IF_ERROR(
        EncodeBatch(encoders, batch, options.eos, format, eos_in_document, ids, masks));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i].empty()) {
        ++progress.skipped;
        continue;
      }
      HCP_RETURN_IF_ERROR(writer.AddDocument(ids[i]));
      if (mask_writer) {
        HCP_RETURN_IF_ERROR(mask_writer->AddDocument(masks[i]));
        for (uint32_t value : masks[i]) progress.counted += value;
      }
    }
    batch.clear();
    batch_bytes = 0;
    progress.documents = writer.documents();
    progress.tokens = writer.tokens();
    progress.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.progress && progress.seconds - last_report >= kProgressSeconds) {
      last_report = progress.seconds;
      options.progress(progress);
    }
    return absl::OkStatus();
  };
  DocumentReader reader(options, format, flush, batch, batch_bytes, progress.bytes);
  for (const std::string& file : files) HCP_RETURN_IF_ERROR(reader.Read(file));
  HCP_RETURN_IF_ERROR(flush());
  if (writer.documents() == 0) {
    return absl::InvalidArgumentError("the inputs hold no text: nothing to write");
  }
  if (mask_writer) {
    // The mask first: a dataset never appears without the mask that says what it trains on.
    HCP_RETURN_IF_ERROR(mask_writer->Finish());
    absl::Status finished = writer.Finish();
    if (!finished.ok()) {
      RemoveLossMask(prefix).IgnoreError();  // the failure that matters is `finished`
      return finished;
    }
  } else {
    HCP_RETURN_IF_ERROR(writer.Finish());
    HCP_RETURN_IF_ERROR(RemoveLossMask(prefix));
  }
  progress.masked = masked;
  progress.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return progress;
}

}  // namespace hcp::data
