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
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::data {
namespace {

namespace fs = std::filesystem;

// Documents are encoded in batches of about this much text (all threads at once).
constexpr int64_t kBatchBytes = 16 << 20;
constexpr double kProgressSeconds = 5.0;

struct Document {
  std::string text;
  std::string where;  // "file", "file:line" for errors
};

// The batch's documents encoded, each followed by `eos`, on `threads` threads.
absl::Status EncodeBatch(std::deque<Encoder>& encoders, const std::vector<Document>& batch,
                         uint32_t eos, std::vector<std::vector<uint32_t>>& ids) {
  ids.assign(batch.size(), {});
  std::vector<absl::Status> errors(batch.size());
  std::atomic<size_t> next{0};
  auto work = [&](Encoder& encoder) {
    for (size_t i = next++; i < batch.size(); i = next++) {
      errors[i] = encoder.Encode(batch[i].text, ids[i]);
      if (!ids[i].empty()) ids[i].push_back(eos);
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
  DocumentReader(const TokenizeOptions& options, std::function<absl::Status()> flush,
                 std::vector<Document>& batch, int64_t& batch_bytes, int64_t& bytes_read)
      : options_(options),
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
    batch_.push_back({std::move(text), std::move(where)});
    if (batch_bytes_ >= kBatchBytes) return flush_();
    return absl::OkStatus();
  }

  const TokenizeOptions& options_;
  std::function<absl::Status()> flush_;
  std::vector<Document>& batch_;
  int64_t& batch_bytes_;
  int64_t& bytes_read_;
};

}  // namespace

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
  TokenDType dtype = tokenizer.vocab_size() <= 65536 ? TokenDType::U16 : TokenDType::I32;
  HCP_ASSIGN_OR_RETURN(IndexedDatasetWriter writer, IndexedDatasetWriter::Create(prefix, dtype));

  std::deque<Encoder> encoders;  // one per thread (an Encoder does not move)
  for (int t = 0; t < std::max(1, options.threads); ++t) encoders.emplace_back(tokenizer);
  std::vector<Document> batch;
  int64_t batch_bytes = 0;
  std::vector<std::vector<uint32_t>> ids;
  double last_report = 0;
  auto flush = [&]() -> absl::Status {
    HCP_RETURN_IF_ERROR(EncodeBatch(encoders, batch, options.eos, ids));
    for (const std::vector<uint32_t>& document : ids) {
      if (document.empty()) {
        ++progress.skipped;
        continue;
      }
      HCP_RETURN_IF_ERROR(writer.AddDocument(document));
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
  DocumentReader reader(options, flush, batch, batch_bytes, progress.bytes);
  for (const std::string& file : files) HCP_RETURN_IF_ERROR(reader.Read(file));
  HCP_RETURN_IF_ERROR(flush());
  if (writer.documents() == 0) {
    return absl::InvalidArgumentError("the inputs hold no text: nothing to write");
  }
  HCP_RETURN_IF_ERROR(writer.Finish());
  progress.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return progress;
}

}  // namespace hcp::data
