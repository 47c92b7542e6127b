#include "runtime/data/TokenData.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/data/DocumentOrder.h"
#include "runtime/data/IndexedDataset.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"

namespace hcp::data {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and are read as they are");

namespace {

uint32_t LoadU32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void StoreU32(uint32_t v, std::string& out) {
  char bytes[4];
  std::memcpy(bytes, &v, 4);
  out.append(bytes, 4);
}

}  // namespace

int64_t TokenDTypeBytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8:
      return 1;
    case TokenDType::U16:
      return 2;
    case TokenDType::U32:
    case TokenDType::I32:
      return 4;
  }
  return 4;
}

std::string_view TokenDTypeName(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8:
      return "uint8";
    case TokenDType::U16:
      return "uint16";
    case TokenDType::U32:
      return "uint32";
    case TokenDType::I32:
      return "int32";
  }
  return "?";
}

absl::StatusOr<TokenDType> ParseTokenDType(std::string_view name) {
  if (name == "uint16" || name == "u16") return TokenDType::U16;
  if (name == "uint32" || name == "u32") return TokenDType::U32;
  if (name == "int32" || name == "i32") return TokenDType::I32;
  if (name == "uint8" || name == "u8") return TokenDType::U8;
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown token dtype \"%s\" (expected uint16, uint32, int32 or uint8)", std::string(name)));
}

// ------------------------------------------------------------------------------------------------
// TokenFile

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path) {
  return OpenImpl(path, /*raw=*/false, TokenDType::U16);
}

absl::StatusOr<TokenFile> TokenFile::OpenRaw(const std::string& path, TokenDType dtype) {
  return OpenImpl(path, /*raw=*/true, dtype);
}

absl::StatusOr<TokenFile> TokenFile::OpenImpl(const std::string& path, bool raw, TokenDType dtype,
                                              bool refuse_magic) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such token file"));
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  TokenFile file;
  file.path_ = path;
  file.map_bytes_ = static_cast<size_t>(st.st_size);
  if (file.map_bytes_ > 0) {
    void* map = ::mmap(nullptr, file.map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(err)));
    }
    file.map_ = map;
    ::madvise(map, file.map_bytes_, MADV_SEQUENTIAL);
  }
  ::close(fd);  // the mapping keeps the file alive

  const auto* bytes = static_cast<const unsigned char*>(file.map_);
  const uint64_t nbytes = file.map_bytes_;
  const bool starts_with_magic = nbytes >= sizeof(kTokenFileMagic) &&
                                 std::memcmp(bytes, kTokenFileMagic, sizeof(kTokenFileMagic)) == 0;
  uint64_t data_bytes = nbytes;
  if (raw) {
    if (starts_with_magic && refuse_magic) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: starts with the HCPTOK1 header; open it as a token file with a header, not as "
          "raw %s tokens",
          path, TokenDTypeName(dtype)));
    }
    file.dtype_ = dtype;
  } else {
    if (nbytes < static_cast<uint64_t>(kTokenFileHeaderBytes)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: %d bytes, shorter than the %d-byte HCPTOK1 header (truncated, or a raw token file "
          "whose dtype must be given)",
          path, nbytes, kTokenFileHeaderBytes));
    }
    if (!starts_with_magic) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": does not start with the HCPTOK1 header (a raw token file? give its dtype, "
          "uint16, uint32 or int32)"));
    }
    uint32_t token_bytes = LoadU32(bytes + 8);
    uint32_t reserved = LoadU32(bytes + 12);
    if (token_bytes != 2 && token_bytes != 4) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: header says %d bytes per token; only 2 (uint16) and 4 (uint32) exist", path,
          token_bytes));
    }
    if (reserved != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: header's reserved field is %d, expected 0 (a newer format version?)",
                          path, reserved));
    }
    file.dtype_ = token_bytes == 2 ? TokenDType::U16 : TokenDType::U32;
    file.has_header_ = true;
    data_bytes -= kTokenFileHeaderBytes;
  }
  const uint64_t token_bytes = static_cast<uint64_t>(TokenDTypeBytes(file.dtype_));
  if (data_bytes % token_bytes != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes of tokens is not a whole number of %d-byte (%s) tokens (truncated?)", path,
        data_bytes, token_bytes, TokenDTypeName(file.dtype_)));
  }
  file.size_ = static_cast<int64_t>(data_bytes / token_bytes);
  file.tokens_ = bytes == nullptr ? nullptr : bytes + (nbytes - data_bytes);
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this == &other) return *this;
  Unmap();
  path_ = std::move(other.path_);
  dtype_ = other.dtype_;
  has_header_ = other.has_header_;
  size_ = other.size_;
  map_ = std::exchange(other.map_, nullptr);
  map_bytes_ = std::exchange(other.map_bytes_, 0);
  tokens_ = std::exchange(other.tokens_, nullptr);
  other.size_ = 0;
  return *this;
}

TokenFile::~TokenFile() { Unmap(); }

void TokenFile::Unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

uint32_t TokenFile::at(int64_t i) const {
  switch (dtype_) {
    case TokenDType::U8:
      return tokens_[i];
    case TokenDType::U16: {
      uint16_t v;
      std::memcpy(&v, tokens_ + 2 * i, 2);
      return v;
    }
    case TokenDType::U32:
    case TokenDType::I32:
      return LoadU32(tokens_ + 4 * i);
  }
  return 0;
}

int64_t TokenFile::value(int64_t i) const {
  const uint32_t bits = at(i);
  if (dtype_ == TokenDType::I32) return static_cast<int32_t>(bits);
  return bits;
}

namespace {

// The first index in [begin, end) of `tokens` (little-endian T) whose value is >= limit, or -1.
// A chunk's maximum first (a loop the compiler vectorises), the position only in a chunk that
// holds one: the whole corpus is scanned before training.
template <typename T>
int64_t FindAtLeast(const unsigned char* tokens, uint64_t limit, int64_t begin, int64_t end) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  for (int64_t chunk = begin; chunk < end; chunk += kChunk) {
    const int64_t stop = std::min(end, chunk + kChunk);
    T max = 0;
    for (int64_t i = chunk; i < stop; ++i) {
      T v;
      std::memcpy(&v, tokens + i * sizeof(T), sizeof(T));
      max = std::max(max, v);
    }
    if (max < limit) continue;
    for (int64_t i = chunk; i < stop; ++i) {
      T v;
      std::memcpy(&v, tokens + i * sizeof(T), sizeof(T));
      if (v >= limit) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t TokenFile::FindTokenOutside(int64_t limit, int64_t begin, int64_t end) const {
  if (limit <= 0) return begin < end ? begin : -1;
  // As unsigned numbers, an I32 file's negative tokens are >= 2^31, above any int32 limit.
  const uint64_t bound = static_cast<uint64_t>(limit);
  switch (dtype_) {
    case TokenDType::U8:
      return FindAtLeast<uint8_t>(tokens_, bound, begin, end);
    case TokenDType::U16:
      return FindAtLeast<uint16_t>(tokens_, bound, begin, end);
    case TokenDType::U32:
      return FindAtLeast<uint32_t>(tokens_, bound, begin, end);
    case TokenDType::I32:
      return FindAtLeast<uint32_t>(tokens_, std::min<uint64_t>(bound, uint64_t{1} << 31), begin,
                                   end);
  }
  return -1;
}

absl::Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens,
                            TokenDType dtype) {
  if (dtype != TokenDType::U16 && dtype != TokenDType::U32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: an HCPTOK1 token file holds uint16 or uint32 tokens, not %s (write %s tokens as a "
        "Megatron indexed dataset)",
        path, TokenDTypeName(dtype), TokenDTypeName(dtype)));
  }
  std::string header(kTokenFileMagic, sizeof(kTokenFileMagic));
  StoreU32(static_cast<uint32_t>(TokenDTypeBytes(dtype)), header);
  StoreU32(0, header);
  HCP_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  HCP_RETURN_IF_ERROR(writer.Write(header.data(), header.size()));
  // Convert in bounded chunks: a corpus can be large.
  constexpr size_t kChunk = size_t{1} << 16;
  std::vector<uint16_t> narrow;
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const size_t count = std::min(kChunk, tokens.size() - begin);
    if (dtype == TokenDType::U32) {
      HCP_RETURN_IF_ERROR(writer.Write(tokens.data() + begin, count * 4));
      continue;
    }
    narrow.resize(count);
    for (size_t i = 0; i < count; ++i) {
      uint32_t token = tokens[begin + i];
      if (token > 0xFFFF) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: token %d at position %d does not fit in uint16", path, token, begin + i));
      }
      narrow[i] = static_cast<uint16_t>(token);
    }
    HCP_RETURN_IF_ERROR(writer.Write(narrow.data(), count * 2));
  }
  return writer.Commit();
}

// ------------------------------------------------------------------------------------------------
// Batching

absl::Status ValidateBatchConfig(const BatchConfig& c) {
  auto positive = [](int64_t value, std::string_view name) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("batch config: %s must be positive, got %d", std::string(name), value));
  };
  HCP_RETURN_IF_ERROR(positive(c.seq, "seq"));
  HCP_RETURN_IF_ERROR(positive(c.micro_batch, "micro_batch"));
  HCP_RETURN_IF_ERROR(positive(c.dp, "dp"));
  HCP_RETURN_IF_ERROR(positive(c.grad_accum, "grad_accum"));
  HCP_RETURN_IF_ERROR(positive(c.vocab, "vocab"));
  if (c.vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch config: vocab %d does not fit the int32 token inputs", c.vocab));
  }
  int64_t global = 0, tokens = 0;
  if (__builtin_mul_overflow(c.micro_batch, c.dp, &global) ||
      __builtin_mul_overflow(global, c.grad_accum, &global) ||
      __builtin_mul_overflow(global, c.seq + 1, &tokens)) {
    return absl::InvalidArgumentError("batch config: tokens per step overflow int64");
  }
  return absl::OkStatus();
}

int64_t GlobalSequenceIndex(const BatchConfig& config, int64_t dp_index, int64_t accum_step,
                            int64_t row) {
  return (accum_step * config.dp + dp_index) * config.micro_batch + row;
}

absl::Status CheckMicroBatch(const BatchConfig& c, int64_t dp_index, int64_t accum_step,
                             size_t inputs, size_t targets) {
  if (dp_index < 0 || dp_index >= c.dp || accum_step < 0 || accum_step >= c.grad_accum) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "micro-batch (dp rank %d, accumulation step %d) is outside dp %d, grad_accum %d", dp_index,
        accum_step, c.dp, c.grad_accum));
  }
  const int64_t tokens = c.micro_batch * c.seq;
  if (static_cast<int64_t>(inputs) != tokens || static_cast<int64_t>(targets) != tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "micro-batch buffers hold %d and %d tokens, expected micro_batch * seq = %d", inputs,
        targets, tokens));
  }
  return absl::OkStatus();
}

absl::Status CheckTokenStream(const TokenStream& stream) {
  const TokenFile& file = *stream.file;
  if (stream.mask != nullptr && stream.mask->size() != file.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the loss mask %s has %s values for the %s tokens of %s", stream.mask->path(),
        FormatCount(stream.mask->size()), FormatCount(file.size()), file.path()));
  }
  if (stream.order != nullptr && stream.order->tokens() != file.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the document order has %s tokens for the %s tokens of %s",
        FormatCount(stream.order->tokens()), FormatCount(file.size()), file.path()));
  }
  return absl::OkStatus();
}

absl::Status CheckDocuments(const TokenStream& stream, const BatchConfig& config) {
  if (!config.documents || stream.documents != nullptr || !config.eos_tokens.empty()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "the plan packs documents (compiled with --documents), but %s is one stream of tokens "
      "and the model names no eos_token_id to end its documents: write the data as an indexed "
      "dataset (hybridcp tokenize ... -o PREFIX), or give the config an eos_token_id",
      stream.file->path()));
}

namespace {

// Packed documents: whether the token at `where` (an index into the stream's file) starts a
// document, given the token before it in the window.
bool StartsDocument(const TokenStream& stream, const BatchConfig& config, int64_t where,
                    int64_t previous_token) {
  if (stream.documents != nullptr) {
    const int64_t doc = stream.documents->DocumentOf(where);
    return stream.documents->document_starts()[doc] == where;
  }
  return std::find(config.eos_tokens.begin(), config.eos_tokens.end(), previous_token) !=
         config.eos_tokens.end();
}

}  // namespace

absl::Status ReadWindow(const TokenStream& stream, const DataState& at, const BatchConfig& config,
                        std::span<int64_t> scratch, std::span<int32_t> inputs,
                        std::span<int32_t> targets, std::span<int32_t> positions) {
  const TokenFile& file = *stream.file;
  const int64_t seq = config.seq, vocab = config.vocab;
  // Where each token of the window lies in the file: the next seq + 1 indices, or, with an order,
  // the pieces of the documents the window covers in this epoch's stream.
  std::span<int64_t> where = scratch.first(static_cast<size_t>(seq + 1));
  if (stream.order != nullptr) {
    stream.order->Map(at.epoch, at.position, where);
  } else {
    std::iota(where.begin(), where.end(), at.position);
  }
  int64_t previous = -1;
  for (int64_t j = 0; j <= seq; ++j) {
    const int64_t token = file.value(where[j]);
    if (token < 0 || token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token %d at position %d is %s", file.path(), token, where[j],
                          token < 0 ? "negative" : absl::StrFormat(">= vocab %d", vocab)));
    }
    // A window starts a document; so does a token the data says starts one.
    const bool starts =
        config.documents && (j == 0 || StartsDocument(stream, config, where[j], previous));
    if (j < seq) {
      inputs[j] = static_cast<int32_t>(token);
      if (config.documents) positions[j] = starts ? 0 : positions[j - 1] + 1;
    }
    if (j > 0) {
      // The last token of a document predicts nothing (the next document's first token is no
      // continuation), as Hugging Face's packing collator sets it.
      const bool counts = (stream.mask == nullptr || stream.mask->at(where[j]) != 0) && !starts;
      targets[j - 1] = counts ? static_cast<int32_t>(token) : kIgnoredTarget;
    }
    previous = token;
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenBatcher> TokenBatcher::Create(const TokenFile& file, const BatchConfig& config,
                                                  const TokenFile* mask, const DocumentOrder* order,
                                                  const IndexedDataset* documents) {
  const TokenStream stream{&file, mask, order, documents};
  HCP_RETURN_IF_ERROR(ValidateBatchConfig(config));
  HCP_RETURN_IF_ERROR(CheckTokenStream(stream));
  HCP_RETURN_IF_ERROR(CheckDocuments(stream, config));
  if (file.size() < config.step_tokens()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %s tokens; one step needs global_batch * (seq + 1) = %d * (%d + 1) = %s "
        "(global_batch = micro_batch %d * dp %d * grad_accum %d)",
        file.path(), FormatCount(file.size()), config.global_batch(), config.seq,
        FormatCount(config.step_tokens()), config.micro_batch, config.dp, config.grad_accum));
  }
  return TokenBatcher(stream, config);
}

absl::Status TokenBatcher::Restore(const DataState& state) {
  const TokenFile* file = stream_.file;
  if (state.epoch < 0 || state.position < 0 || state.position > file->size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data state (epoch %d, position %s) does not fit %s (%s tokens): was it saved with "
        "another data file?",
        state.epoch, FormatCount(state.position), file->path(), FormatCount(file->size())));
  }
  state_ = state;
  return absl::OkStatus();
}

DataState TokenBatcher::StepStart(const DataState& state) const {
  if (stream_.file->size() - state.position < config_.step_tokens()) return {state.epoch + 1, 0};
  return state;
}

DataState TokenBatcher::NextState(const DataState& state) const {
  DataState start = StepStart(state);
  return {start.epoch, start.position + config_.step_tokens()};
}

absl::Status TokenBatcher::ReadMicroBatch(const DataState& state, int64_t dp_index,
                                          int64_t accum_step, std::span<int32_t> inputs,
                                          std::span<int32_t> targets,
                                          std::span<int32_t> positions) const {
  const BatchConfig& c = config_;
  HCP_RETURN_IF_ERROR(CheckMicroBatch(c, dp_index, accum_step, inputs.size(), targets.size()));
  const DataState start = StepStart(state);
  std::vector<int64_t> scratch(static_cast<size_t>(c.seq + 1));
  for (int64_t row = 0; row < c.micro_batch; ++row) {
    const int64_t window =
        start.position + GlobalSequenceIndex(c, dp_index, accum_step, row) * (c.seq + 1);
    HCP_RETURN_IF_ERROR(
        ReadWindow(stream_, {start.epoch, window}, c, scratch, inputs.subspan(row * c.seq, c.seq),
                   targets.subspan(row * c.seq, c.seq),
                   c.documents ? positions.subspan(row * c.seq, c.seq) : std::span<int32_t>()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepBatch> StepBatch::Read(const BatchConfig& config, const MicroBatchReader& read) {
  StepBatch batch;
  batch.micro_batch = config.micro_batch;
  batch.seq = config.seq;
  const int64_t micro = batch.micro_tokens();
  batch.inputs.resize(config.grad_accum * micro);
  batch.targets.resize(config.grad_accum * micro);
  if (config.documents) batch.positions.resize(config.grad_accum * micro);
  for (int64_t a = 0; a < config.grad_accum; ++a) {
    const std::span<int32_t> positions =
        config.documents ? std::span<int32_t>(batch.positions).subspan(a * micro, micro)
                         : std::span<int32_t>();
    HCP_RETURN_IF_ERROR(read(a, std::span<int32_t>(batch.inputs).subspan(a * micro, micro),
                             std::span<int32_t>(batch.targets).subspan(a * micro, micro),
                             positions));
  }
  return batch;
}

absl::StatusOr<StepBatch> TokenBatcher::NextStep(int64_t dp_index) {
  HCP_ASSIGN_OR_RETURN(StepBatch batch,
                       StepBatch::Read(config_, [&](int64_t a, std::span<int32_t> in,
                                                    std::span<int32_t> tg, std::span<int32_t> pos) {
                         return ReadMicroBatch(state_, dp_index, a, in, tg, pos);
                       }));
  batch.start = StepStart(state_);
  state_ = NextState(state_);
  return batch;
}

}  // namespace hcp::data
