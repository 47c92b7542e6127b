// Megatron-LM's indexed datasets: the token data of Megatron's preprocess_data.py, read as they
// are and written so that Megatron reads ours.
//
// A dataset is two files beside each other, PREFIX.bin and PREFIX.idx (little-endian throughout):
//   PREFIX.bin   the tokens of every sequence, back to back, each the dtype's width
//   PREFIX.idx   bytes 0..8     magic "MMIDIDX\0\0"
//                bytes 9..16    u64 version, 1
//                byte  17       u8 dtype code (Megatron's DType: uint8 = 1, int8 = 2, int16 = 3,
//                               int32 = 4, int64 = 5, float64 = 6, float32 = 7, uint16 = 8)
//                bytes 18..25   u64 sequence count N
//                bytes 26..33   u64 document index count D
//                then           int32 sequence lengths[N] (tokens), int64 sequence pointers[N]
//                               (byte offsets into .bin), int64 document index[D]
// A document is the sequences [doc[k], doc[k + 1]): the list starts with 0 and holds the sequence
// count at each document's end, so D = documents + 1, doc[0] = 0 and doc[D - 1] = N. A sequence
// may be empty (Megatron writes one for an empty text), and so may a document.
//
// Training reads the tokens as one stream (documents separated by the EOS tokens the writer of
// the data put in), so only datasets whose sequences lie back to back in .bin, in order, are
// read: what Megatron's builder writes. Tokens are uint16 or int32 (Megatron picks uint16 for a
// vocabulary below 65,500, int32 above); uint8 is read too.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/TokenData.h"
#include "runtime/support/AtomicFile.h"

namespace hcp::data {

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
// Magic, version, dtype code, sequence count, document index count.
inline constexpr int64_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// PREFIX.idx and PREFIX.bin.
std::string IndexPath(const std::string& prefix);
std::string DataPath(const std::string& prefix);

// Megatron's dtype code of a token dtype: 1 (uint8), 8 (uint16), 4 (int32); none for uint32,
// which Megatron has no code for.
std::optional<uint8_t> MegatronDTypeCode(TokenDType dtype);

// Writes a dataset one document at a time: the tokens go straight into PREFIX.bin's temporary
// file, the lengths stay in memory until Finish writes PREFIX.idx. Both files are written through
// AtomicFileWriter: until Finish, nothing appears under PREFIX, and a writer destroyed without
// Finish (or whose Finish fails) leaves nothing behind.
class IndexedDatasetWriter {
 public:
  // U8, U16 or I32 tokens; U32 is refused (Megatron has no uint32).
  static absl::StatusOr<IndexedDatasetWriter> Create(std::string prefix, TokenDType dtype);

  IndexedDatasetWriter(IndexedDatasetWriter&&) noexcept = default;
  IndexedDatasetWriter& operator=(IndexedDatasetWriter&&) noexcept = default;

  // One document of one sequence. A token that does not fit the dtype refuses the whole document
  // (nothing of it is written, naming the document and the position); a failed write of .bin
  // (a full disk) leaves the writer unusable.
  absl::Status AddDocument(std::span<const uint32_t> tokens);
  // Writes PREFIX.idx's contents, then commits PREFIX.bin and PREFIX.idx, in that order (a crash
  // between the two renames leaves a .bin that an older .idx does not describe, which Open
  // refuses). On failure neither file stays.
  absl::Status Finish();

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype, std::unique_ptr<AtomicFileWriter> bin)
      : prefix_(std::move(prefix)), dtype_(dtype), bin_(std::move(bin)) {}

  std::string prefix_;
  TokenDType dtype_;
  std::unique_ptr<AtomicFileWriter> bin_;  // nullptr once finished or broken
  std::vector<int32_t> lengths_;           // one per document (one sequence each)
  int64_t tokens_ = 0;
  std::string broken_;  // why bin_ is nullptr: finished, or a write failed
};

// A dataset opened for reading: PREFIX.idx read whole and checked field by field against itself
// and PREFIX.bin's size before anything is used, PREFIX.bin mapped as a raw token file.
class IndexedDataset {
 public:
  // Refuses, saying what is wrong and where: a missing file (naming both), a bad magic, a version
  // other than 1, a dtype that is not uint16, int32 or uint8, counts that do not fit the .idx's
  // size, negative lengths, sequences not back to back, a .bin whose size is not the lengths'
  // sum, a document index that does not run from 0 to N without going back.
  static absl::StatusOr<IndexedDataset> Open(const std::string& prefix);

  IndexedDataset(IndexedDataset&&) noexcept = default;
  IndexedDataset& operator=(IndexedDataset&&) noexcept = default;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return tokens_.dtype(); }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t documents() const { return static_cast<int64_t>(document_starts_.size()) - 1; }
  int64_t tokens() const { return tokens_.size(); }
  // Tokens of each sequence.
  std::span<const int32_t> sequence_lengths() const { return lengths_; }
  // documents() + 1 offsets into the token stream: document k is tokens
  // [document_starts()[k], document_starts()[k + 1]); the first is 0, the last tokens().
  std::span<const int64_t> document_starts() const { return document_starts_; }
  // The document that holds token `index` of the stream (0 <= index < tokens()).
  int64_t DocumentOf(int64_t index) const;
  // PREFIX.bin: every sequence's tokens, back to back.
  const TokenFile& token_file() const { return tokens_; }

 private:
  IndexedDataset() = default;

  std::string prefix_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_starts_;
  TokenFile tokens_;
};

}  // namespace hcp::data
