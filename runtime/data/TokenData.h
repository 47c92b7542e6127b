// Token data for training: flat binary token files, memory-mapped read-only, and the batching
// rule that turns them into the micro-batches of every rank.
//
// File format (".bin"; little-endian throughout):
//   bytes 0..7    magic "HCPTOK1\0"
//   bytes 8..11   u32 bytes per token: 2 (uint16 tokens) or 4 (uint32 tokens)
//   bytes 12..15  u32 reserved, must be 0
//   bytes 16..    the tokens, back to back
// Headerless ("raw") files of uint16, uint32 or int32 tokens (nanoGPT-style scripts write uint16;
// Megatron's int32), and uint8 ones, are read too when the caller names the dtype (OpenRaw); a raw
// open of a file that starts with the magic is refused, since the header would be read as tokens.
// Megatron indexed datasets (IndexedDataset.h) keep their tokens in such a raw file.
//
// Batching (one optimizer step, all ranks together):
//   A sequence is a window of seq + 1 consecutive tokens: inputs = window[0, seq),
//   targets = window[1, seq + 1) (the next-token labels; the last input's target is the token
//   after it, so no label is lost). Windows do not overlap: the pair (last token of window k,
//   first token of window k + 1) is never a training example.
//   A step reads global_batch = micro_batch * dp * grad_accum windows, back to back, from
//   the data state's position: window s covers [position + s * (seq + 1), + seq + 1).
//   The position then advances by step_tokens = global_batch * (seq + 1). When fewer than
//   step_tokens tokens remain at a step's start, the step starts at token 0 of the next epoch
//   (the tail is skipped in that epoch).
//   Window s of the global batch goes to dp rank d, accumulation step a, row i where
//   s = (a * dp + d) * micro_batch + i. Each rank gets the FULL sequences of its micro-batch;
//   the executor cuts its cp shard out of them.
//   With a loss mask (LossMask.h: one 0/1 value per token), target j of a window, which names
//   the window's token j + 1, is kIgnoredTarget where that token's mask is 0; inputs are the
//   same either way.
//   With a DocumentOrder (DocumentOrder.h: train --shuffle-seed), "token p of epoch e" is token p
//   of that pass's virtual stream (the documents in that pass's shuffled order) rather than of the
//   file; the rule above is unchanged, the mask following its tokens.
// Because the data state counts tokens, a run resumed with another dp / grad_accum split (same
// seq and global batch) reads exactly the same global batches.
// A blend of several sources (train --data W1 PATH1 W2 PATH2 ...) reads its windows by Blend.h's
// rule instead, through the same windows (ReadWindow).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/support/IgnoredTarget.h"

namespace hcp::data {

class DocumentOrder;
class IndexedDataset;

inline constexpr char kTokenFileMagic[8] = {'H', 'C', 'P', 'T', 'O', 'K', '1', '\0'};
inline constexpr int64_t kTokenFileHeaderBytes = 16;

// I32 is Megatron's int32: a token read from it must not be negative (FindTokenOutside).
enum class TokenDType { U8, U16, U32, I32 };

// 1, 2, 4 or 4.
int64_t TokenDTypeBytes(TokenDType dtype);
// "uint8", "uint16", "uint32" or "int32".
std::string_view TokenDTypeName(TokenDType dtype);
// Accepts "uint16", "u16", "uint32", "u32", "int32", "i32", "uint8", "u8"; anything else is
// InvalidArgument.
absl::StatusOr<TokenDType> ParseTokenDType(std::string_view name);

// A token file mapped read-only. The mapping lives as long as the object (movable, not
// copyable). The file must not be truncated while it is mapped (that raises SIGBUS on access):
// write new data to a new file and rename it into place (WriteTokenFile does).
class TokenFile {
 public:
  // A file with the HCPTOK1 header (uint16 or uint32 tokens).
  static absl::StatusOr<TokenFile> Open(const std::string& path);
  // A headerless file of `dtype` tokens.
  static absl::StatusOr<TokenFile> OpenRaw(const std::string& path, TokenDType dtype);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  TokenDType dtype() const { return dtype_; }
  bool has_header() const { return has_header_; }
  // Number of tokens.
  int64_t size() const { return size_; }
  // Token i, 0 <= i < size() (not range-checked), as stored: an I32 file's negative token reads
  // as its two's complement bits (>= 2^31); value() says what it is.
  uint32_t at(int64_t i) const;
  // Token i as a number: at(i), except that an I32 file's negative token is negative.
  int64_t value(int64_t i) const;
  // The first index in [begin, end) whose token is negative or >= limit, or -1 when all fit:
  // one scan of the mapping, a chunk at a time, for checking a whole file before training on it.
  int64_t FindTokenOutside(int64_t limit, int64_t begin, int64_t end) const;

 private:
  // Megatron's .bin holds raw tokens as its .idx describes them, whatever its first bytes are:
  // it is opened without the raw open's refusal of a file that starts like a token file.
  friend class IndexedDataset;

  TokenFile() = default;
  static absl::StatusOr<TokenFile> OpenImpl(const std::string& path, bool raw, TokenDType dtype,
                                            bool refuse_magic = true);
  void Unmap();

  std::string path_;
  TokenDType dtype_ = TokenDType::U16;
  bool has_header_ = false;
  int64_t size_ = 0;
  void* map_ = nullptr;  // the whole file; nullptr for an empty one
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // first token byte within the mapping
};

// Writes `tokens` with the HCPTOK1 header, atomically (see runtime/support/AtomicFile.h).
// U16 refuses a token above 65535, naming its position; the header has no room for U8 and I32
// (IndexedDatasetWriter writes those).
absl::Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens,
                            TokenDType dtype);

// The shape of one optimizer step's data (see the batching rule at the top).
struct BatchConfig {
  int64_t seq = 0;          // tokens per sequence the model sees (Plan::seq, global)
  int64_t micro_batch = 0;  // sequences per micro-batch on one rank (Plan::micro_batch)
  int64_t dp = 1;           // data-parallel ranks (Plan::mesh.dp)
  int64_t grad_accum = 1;   // micro-batches per rank per step
  int64_t vocab = 0;        // every token read must be < vocab
  // Packed documents (a plan compiled with --documents): each window also gets position_ids,
  // each token's position in its document; a document starts at the window's first token and
  // after each boundary (Documents below), and the target of a document's last token (the next
  // document's first) is ignored.
  bool documents = false;
  // Where a stream without document boundaries of its own (a token file, a raw file) ends a
  // document: after each of these tokens (the model's eos_token_id).
  std::vector<int64_t> eos_tokens = {};

  int64_t global_batch() const { return micro_batch * dp * grad_accum; }
  // global_batch * (seq + 1); meaningful once ValidateBatchConfig has passed.
  int64_t step_tokens() const { return global_batch() * (seq + 1); }
};

// All fields positive, vocab at most 2^31 - 1 (tokens become int32 inputs), and step_tokens
// without int64 overflow.
absl::Status ValidateBatchConfig(const BatchConfig& config);

// Index within the global batch of row i of micro-batch `accum_step` on dp rank `dp_index`:
// (accum_step * dp + dp_index) * micro_batch + i.
int64_t GlobalSequenceIndex(const BatchConfig& config, int64_t dp_index, int64_t accum_step,
                            int64_t row);

// Where the data stands: the next step begins at token `position` of pass `epoch` over the file
// (before the wrap-around check). Saving it after a step and restoring it resumes exactly.
struct DataState {
  int64_t epoch = 0;
  int64_t position = 0;
  bool operator==(const DataState&) const = default;
};

// One dp rank's share of one step: grad_accum micro-batches of [micro_batch, seq] int32 tokens,
// row-major, micro-batch a at offset a * micro_batch * seq.
struct StepBatch {
  DataState start;  // where the step read (after any wrap-around); {0, 0} for a blend's
  int64_t micro_batch = 0;
  int64_t seq = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  std::vector<int32_t> positions;  // packed documents' position_ids; empty without them

  // Room for `config`'s grad_accum micro-batches, filled by read(accum_step, inputs, targets,
  // positions) for each in turn (the first error returned); positions is empty unless
  // config.documents.
  using MicroBatchReader = std::function<absl::Status(int64_t, std::span<int32_t>,
                                                      std::span<int32_t>, std::span<int32_t>)>;
  static absl::StatusOr<StepBatch> Read(const BatchConfig& config, const MicroBatchReader& read);

  int64_t micro_tokens() const { return micro_batch * seq; }
  std::span<const int32_t> micro_inputs(int64_t accum_step) const {
    return std::span<const int32_t>(inputs).subspan(accum_step * micro_tokens(), micro_tokens());
  }
  std::span<const int32_t> micro_targets(int64_t accum_step) const {
    return std::span<const int32_t>(targets).subspan(accum_step * micro_tokens(), micro_tokens());
  }
  // Empty without packed documents.
  std::span<const int32_t> micro_positions(int64_t accum_step) const {
    if (positions.empty()) return {};
    return std::span<const int32_t>(positions).subspan(accum_step * micro_tokens(), micro_tokens());
  }
};

// One stream of tokens a batcher reads windows from: the file, and optionally its loss mask (a 0/1
// value per token) and its documents' order each epoch. None of them is owned.
struct TokenStream {
  const TokenFile* file = nullptr;
  const TokenFile* mask = nullptr;       // nullptr: every target counts
  const DocumentOrder* order = nullptr;  // nullptr: the file's own order
  // Packed documents: the indexed dataset whose documents `file` holds (its .idx says where
  // each starts); nullptr: documents end after the config's eos_tokens.
  const IndexedDataset* documents = nullptr;
};

// Micro-batch `accum_step` of dp rank `dp_index` exists in `config`, and buffers of `inputs` and
// `targets` tokens hold it (micro_batch * seq each).
absl::Status CheckMicroBatch(const BatchConfig& config, int64_t dp_index, int64_t accum_step,
                             size_t inputs, size_t targets);

// The mask and the order, when given, cover exactly the file's tokens.
absl::Status CheckTokenStream(const TokenStream& stream);

// One window of the batching rule above: tokens [at.position, at.position + seq] of pass
// at.epoch of `stream` (its virtual stream with an order) as inputs[0, seq) and targets[0, seq),
// the mask applied to the targets. The window must lie within the pass; `scratch` holds seq + 1
// values. A token >= vocab, or a negative one, is an error naming its position in the file.
absl::Status ReadWindow(const TokenStream& stream, const DataState& at, const BatchConfig& config,
                        std::span<int64_t> scratch, std::span<int32_t> inputs,
                        std::span<int32_t> targets, std::span<int32_t> positions);
// With config.documents: a stream whose documents cannot be found (no indexed dataset, no
// eos_tokens) is refused, naming it.
absl::Status CheckDocuments(const TokenStream& stream, const BatchConfig& config);

// Cuts steps out of a token file. Reads through `file`, which must outlive the batcher.
class TokenBatcher {
 public:
  // Checks the config and that the file holds at least one step:
  // "data.bin has 1,000 tokens; one step needs global_batch * (seq + 1) = 4 * (4096 + 1) = 16,388".
  // `mask`, when given (DataSource::loss_mask()), holds a 0/1 value per token of `file` and must
  // outlive the batcher too: a target whose token's value is 0 becomes kIgnoredTarget.
  // `order`, when given, is the order of `file`'s documents each epoch (it must outlive the
  // batcher and hold as many tokens as `file`).
  // `documents`: the indexed dataset `file` belongs to, whose document starts packed documents
  // follow (config.documents); nullptr: its eos_tokens end documents.
  static absl::StatusOr<TokenBatcher> Create(const TokenFile& file, const BatchConfig& config,
                                             const TokenFile* mask = nullptr,
                                             const DocumentOrder* order = nullptr,
                                             const IndexedDataset* documents = nullptr);

  const BatchConfig& config() const { return config_; }
  const TokenFile& file() const { return *stream_.file; }
  // Where the next step begins.
  const DataState& state() const { return state_; }
  // Continues from a saved state; refuses a position beyond the end of the file or negative
  // values (a state saved with another data file, most likely).
  absl::Status Restore(const DataState& state);

  // Where the step that begins at `state` reads: `state`, or {epoch + 1, 0} when fewer than
  // step_tokens tokens remain from its position.
  DataState StepStart(const DataState& state) const;
  // The state after the step that begins at `state`.
  DataState NextState(const DataState& state) const;

  // Micro-batch `accum_step` of dp rank `dp_index` for the step that begins at `state`, into
  // inputs and targets (micro_batch * seq values each, row-major). A token >= vocab, or a
  // negative one, is an error naming its position in the file.
  // With config.documents, positions (micro_batch * seq) gets the position_ids.
  absl::Status ReadMicroBatch(const DataState& state, int64_t dp_index, int64_t accum_step,
                              std::span<int32_t> inputs, std::span<int32_t> targets,
                              std::span<int32_t> positions = {}) const;

  // All grad_accum micro-batches of dp rank `dp_index` for the next step, then advances the
  // state. On error the state is left unchanged.
  absl::StatusOr<StepBatch> NextStep(int64_t dp_index);

 private:
  TokenBatcher(const TokenStream& stream, const BatchConfig& config)
      : stream_(stream), config_(config) {}

  TokenStream stream_;
  BatchConfig config_;
  DataState state_;
};

}  // namespace hcp::data
