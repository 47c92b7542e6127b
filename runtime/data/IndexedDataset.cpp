#include "runtime/data/IndexedDataset.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"

namespace hcp::data {

static_assert(std::endian::native == std::endian::little,
              "indexed datasets are little-endian and are read as they are");

namespace fs = std::filesystem;

namespace {

// Megatron's DType codes.
constexpr uint8_t kCodeUInt8 = 1;
constexpr uint8_t kCodeInt32 = 4;
constexpr uint8_t kCodeUInt16 = 8;

// Megatron's name of a dtype code, or "" for a code Megatron does not have.
std::string_view MegatronDTypeName(uint8_t code) {
  switch (code) {
    case 1:
      return "uint8";
    case 2:
      return "int8";
    case 3:
      return "int16";
    case 4:
      return "int32";
    case 5:
      return "int64";
    case 6:
      return "float64";
    case 7:
      return "float32";
    case 8:
      return "uint16";
    default:
      return "";
  }
}

template <typename T>
void Append(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <typename T>
T Load(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// The largest token a dtype holds.
uint32_t MaxToken(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8:
      return 0xFF;
    case TokenDType::U16:
      return 0xFFFF;
    case TokenDType::U32:
      return 0xFFFFFFFFu;
    case TokenDType::I32:
      return static_cast<uint32_t>(std::numeric_limits<int32_t>::max());
  }
  return 0;
}

// a * b + c without int64 overflow (all non-negative), or nullopt.
std::optional<int64_t> MulAdd(int64_t a, int64_t b, int64_t c) {
  int64_t product = 0, sum = 0;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, &sum)) {
    return std::nullopt;
  }
  return sum;
}

}  // namespace

std::string IndexPath(const std::string& prefix) { return prefix + ".idx"; }
std::string DataPath(const std::string& prefix) { return prefix + ".bin"; }

std::optional<uint8_t> MegatronDTypeCode(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8:
      return kCodeUInt8;
    case TokenDType::U16:
      return kCodeUInt16;
    case TokenDType::I32:
      return kCodeInt32;
    case TokenDType::U32:
      return std::nullopt;
  }
  return std::nullopt;
}

// ------------------------------------------------------------------------------------------------
// Writing

absl::StatusOr<IndexedDatasetWriter> IndexedDatasetWriter::Create(std::string prefix,
                                                                  TokenDType dtype) {
  if (!MegatronDTypeCode(dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: Megatron indexed datasets have no %s tokens; write uint16 (a vocabulary up to 65,536) "
        "or int32",
        prefix, TokenDTypeName(dtype)));
  }
  HCP_ASSIGN_OR_RETURN(AtomicFileWriter bin, AtomicFileWriter::Create(DataPath(prefix)));
  return IndexedDatasetWriter(std::move(prefix), dtype,
                              std::make_unique<AtomicFileWriter>(std::move(bin)));
}

absl::Status IndexedDatasetWriter::AddDocument(std::span<const uint32_t> tokens) {
  if (bin_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: cannot add a document: %s", prefix_, broken_));
  }
  const int64_t document = documents();
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: document %d has %s tokens; a Megatron sequence holds at most 2,147,483,647", prefix_,
        document, FormatCount(static_cast<int64_t>(tokens.size()))));
  }
  if (document == std::numeric_limits<int32_t>::max()) {
    // Far beyond any corpus; it keeps documents() an exact count of lengths_.
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: too many documents for one dataset", prefix_));
  }
  // Every token is checked before any is written: a refused document leaves no trace.
  const uint32_t max = MaxToken(dtype_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: token %d at position %d of document %d does not fit in %s (at most %d)", prefix_,
          tokens[i], i, document, TokenDTypeName(dtype_), max));
    }
  }
  // Convert in bounded chunks: a document can be large.
  constexpr size_t kChunk = size_t{1} << 16;
  std::vector<unsigned char> narrow;
  const size_t width = static_cast<size_t>(TokenDTypeBytes(dtype_));
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const size_t count = std::min(kChunk, tokens.size() - begin);
    absl::Status written;
    if (width == 4) {  // I32: the checked values are the same bits
      written = bin_->Write(tokens.data() + begin, count * 4);
    } else {
      narrow.resize(count * width);
      for (size_t i = 0; i < count; ++i) {
        const uint32_t token = tokens[begin + i];
        if (width == 1) {
          narrow[i] = static_cast<unsigned char>(token);
        } else {
          const uint16_t v = static_cast<uint16_t>(token);
          std::memcpy(narrow.data() + 2 * i, &v, 2);
        }
      }
      written = bin_->Write(narrow.data(), narrow.size());
    }
    if (!written.ok()) {
      broken_ = absl::StrCat("writing it failed (", written.message(), ")");
      bin_.reset();  // removes the temporary .bin
      return written;
    }
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  tokens_ += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::Finish() {
  if (bin_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: cannot finish the dataset: %s", prefix_, broken_));
  }
  std::unique_ptr<AtomicFileWriter> bin = std::move(bin_);
  broken_ = "an earlier Finish failed";
  const int64_t n = static_cast<int64_t>(lengths_.size());
  std::string index(kIndexMagic, sizeof(kIndexMagic));
  Append<uint64_t>(index, kIndexVersion);
  Append<uint8_t>(index, *MegatronDTypeCode(dtype_));
  Append<uint64_t>(index, static_cast<uint64_t>(n));
  Append<uint64_t>(index, static_cast<uint64_t>(n + 1));  // one sequence per document
  index.reserve(index.size() + 20 * static_cast<size_t>(n) + 8);
  for (int32_t length : lengths_) Append<int32_t>(index, length);
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    Append<int64_t>(index, pointer);
    pointer += int64_t{length} * TokenDTypeBytes(dtype_);
  }
  for (int64_t k = 0; k <= n; ++k) Append<int64_t>(index, k);
  // The .idx is written whole before the .bin is renamed into place: what can fail (a full disk)
  // fails before anything appears under the prefix.
  HCP_ASSIGN_OR_RETURN(AtomicFileWriter idx, AtomicFileWriter::Create(IndexPath(prefix_)));
  HCP_RETURN_IF_ERROR(idx.Write(index.data(), index.size()));
  HCP_RETURN_IF_ERROR(bin->Commit());
  absl::Status committed = idx.Commit();
  if (!committed.ok()) {
    // No .bin without the .idx that describes it.
    std::error_code ignored;
    fs::remove(DataPath(prefix_), ignored);
    return committed;
  }
  broken_ = "it is finished already";
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Reading

absl::StatusOr<IndexedDataset> IndexedDataset::Open(const std::string& prefix) {
  const std::string idx_path = IndexPath(prefix);
  const std::string bin_path = DataPath(prefix);
  std::error_code error;
  const auto state = [&error](const std::string& path) -> std::string_view {
    const fs::file_status status = fs::status(path, error);
    if (fs::is_regular_file(status)) return "";
    return fs::exists(status) ? "not a regular file" : "missing";
  };
  const std::string_view idx_state = state(idx_path);
  const std::string_view bin_state = state(bin_path);
  if (!idx_state.empty() || !bin_state.empty()) {
    const auto say = [](std::string_view what) { return what.empty() ? "present" : what; };
    return absl::NotFoundError(
        absl::StrFormat("%s is not a Megatron indexed dataset: it needs %s (%s) and %s (%s)",
                        prefix, idx_path, say(idx_state), bin_path, say(bin_state)));
  }

  // The .idx is small beside the .bin (20 bytes a document against the document's tokens): read
  // whole, once its size is known to be what its header says.
  std::ifstream in(idx_path, std::ios::binary);
  const uintmax_t idx_bytes = fs::file_size(idx_path, error);
  if (!in || error) return absl::InternalError(absl::StrCat("cannot read ", idx_path));
  std::string header(static_cast<size_t>(std::min<uintmax_t>(idx_bytes, kIndexHeaderBytes)), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header.size()))) {
    return absl::InternalError(absl::StrCat("cannot read the header of ", idx_path));
  }
  const size_t magic_bytes = std::min(header.size(), sizeof(kIndexMagic));
  if (std::memcmp(header.data(), kIndexMagic, magic_bytes) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: does not start with the magic \"MMIDIDX\\0\\0\" of a Megatron index", idx_path));
  }
  if (idx_bytes < static_cast<uintmax_t>(kIndexHeaderBytes)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, shorter than the %d-byte header of a Megatron index (truncated?)", idx_path,
        idx_bytes, kIndexHeaderBytes));
  }
  const uint64_t version = Load<uint64_t>(header.data() + 9);
  if (version != kIndexVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: index version %d; only version 1 is read (Megatron's indexed dataset)",
                        idx_path, version));
  }
  const uint8_t code = Load<uint8_t>(header.data() + 17);
  const std::string_view type = MegatronDTypeName(code);
  TokenDType dtype = TokenDType::U16;
  if (code == kCodeUInt16) {
    dtype = TokenDType::U16;
  } else if (code == kCodeInt32) {
    dtype = TokenDType::I32;
  } else if (code == kCodeUInt8) {
    dtype = TokenDType::U8;
  } else if (type.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: dtype code %d is none of Megatron's (1-8); tokens are uint16 (8) or int32 (4), "
        "uint8 (1) is read too",
        idx_path, code));
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: dtype code %d (%s) is not supported: tokens are uint16 (8) or int32 (4), uint8 (1) "
        "is read too",
        idx_path, code, type));
  }
  const uint64_t sequences = Load<uint64_t>(header.data() + 18);
  const uint64_t doc_entries = Load<uint64_t>(header.data() + 26);
  // The exact size those counts need (counts too large for the file cannot be its counts).
  const uint64_t body_bytes = static_cast<uint64_t>(idx_bytes) - kIndexHeaderBytes;
  const bool fit = sequences <= body_bytes / 12 && doc_entries <= body_bytes / 8;
  const uint64_t expected = fit ? kIndexHeaderBytes + 12 * sequences + 8 * doc_entries : 0;
  if (!fit || expected != idx_bytes) {
    const std::string need =
        fit ? absl::StrFormat("%d bytes", expected) : std::string("more bytes than it has");
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, but its header's %d sequences and %d document indices need %s (34 + 12 * "
        "sequences + 8 * document indices): %s",
        idx_path, idx_bytes, sequences, doc_entries, need,
        fit && expected < idx_bytes ? "extra bytes after the document index"
                                    : "truncated, or counts that are wrong"));
  }
  const int64_t n = static_cast<int64_t>(sequences);
  const int64_t d = static_cast<int64_t>(doc_entries);
  if (d < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: 0 document indices; the document index starts with 0 and ends with the sequence "
        "count, so it holds at least one",
        idx_path));
  }

  std::string body(static_cast<size_t>(body_bytes), '\0');
  if (!in.read(body.data(), static_cast<std::streamsize>(body.size()))) {
    return absl::InternalError(absl::StrCat("cannot read ", idx_path));
  }
  const char* lengths_at = body.data();
  const char* pointers_at = lengths_at + 4 * n;
  const char* docs_at = pointers_at + 8 * n;

  IndexedDataset dataset;
  dataset.prefix_ = prefix;
  dataset.lengths_.resize(static_cast<size_t>(n));
  const int64_t width = TokenDTypeBytes(dtype);
  // Token offset of each sequence's start (n + 1 values), for the document starts.
  std::vector<int64_t> starts(static_cast<size_t>(n) + 1, 0);
  for (int64_t k = 0; k < n; ++k) {
    const int32_t length = Load<int32_t>(lengths_at + 4 * k);
    if (length < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: sequence %d has length %d; lengths are token counts, at least 0",
                          idx_path, k, length));
    }
    const int64_t pointer = Load<int64_t>(pointers_at + 8 * k);
    // Equal to the previous start times the width: no overflow, since the previous pointer was.
    const int64_t expected_pointer = starts[k] * width;
    if (pointer != expected_pointer) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: sequence %d starts at byte %d of %s, expected %d (%s): sequences that are not "
          "stored back to back, in order, are not supported",
          idx_path, k, pointer, bin_path, expected_pointer,
          k == 0 ? std::string("the start of the file")
                 : absl::StrFormat("right after sequence %d", k - 1)));
    }
    dataset.lengths_[k] = length;
    // Tokens fit in int64 bytes: the pointers that follow must be able to hold them.
    const std::optional<int64_t> next = MulAdd(1, starts[k], length);
    if (!next || !MulAdd(*next, width, 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the sequence lengths add up to more bytes than int64 holds", idx_path));
    }
    starts[k + 1] = *next;
  }
  const int64_t total = starts[n];
  const uintmax_t bin_bytes = fs::file_size(bin_path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot read the size of ", bin_path));
  if (bin_bytes != static_cast<uintmax_t>(total * width)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, but %s's %d sequences hold %s %s tokens = %d bytes (%s)", bin_path,
        bin_bytes, idx_path, n, FormatCount(total), TokenDTypeName(dtype), total * width,
        bin_bytes < static_cast<uintmax_t>(total * width)
            ? "truncated, or another dataset's index"
            : "extra bytes, or another dataset's index"));
  }

  dataset.document_starts_.resize(static_cast<size_t>(d));
  int64_t previous = 0;
  for (int64_t k = 0; k < d; ++k) {
    const int64_t index = Load<int64_t>(docs_at + 8 * k);
    if (k == 0 && index != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the document index starts with %d, expected 0", idx_path, index));
    }
    if (index < previous) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: document index %d is %d, less than the %d before it (the index must not go back)",
          idx_path, k, index, previous));
    }
    if (index > n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: document index %d is %d, beyond the %d sequences", idx_path, k, index, n));
    }
    dataset.document_starts_[k] = starts[index];
    previous = index;
  }
  if (previous != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the document index ends with %d, expected the sequence count %d (sequences %d-%d "
        "belong to no document)",
        idx_path, previous, n, previous, n - 1));
  }

  absl::StatusOr<TokenFile> tokens =
      TokenFile::OpenImpl(bin_path, /*raw=*/true, dtype, /*refuse_magic=*/false);
  HCP_RETURN_IF_ERROR(tokens.status());
  if (tokens->size() != total) {  // changed since its size was read
    return absl::DataLossError(absl::StrFormat("%s changed while it was opened", bin_path));
  }
  dataset.tokens_ = *std::move(tokens);
  return dataset;
}

int64_t IndexedDataset::DocumentOf(int64_t index) const {
  // The last start at or before `index`: empty documents before it share its start.
  auto it = std::upper_bound(document_starts_.begin(), document_starts_.end(), index);
  return static_cast<int64_t>(it - document_starts_.begin()) - 1;
}

}  // namespace hcp::data
