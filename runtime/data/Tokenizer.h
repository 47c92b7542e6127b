// A Hugging Face tokenizer (tokenizer.json) of the byte-level BPE kind: Granite 4.0's (a Split on
// a cl100k-style expression, then ByteLevel without its own expression), GPT-2's (ByteLevel with
// its expression) and the like. Encode gives the ids Hugging Face's tokenizers gives for
// `encode(text, add_special_tokens=False)`: added tokens found first, then the pre-tokenizer's
// words, then BPE. (The post-processor's template, e.g. a BOS in front, is not applied: training
// data puts the end-of-text token between documents itself.) Decode turns ids back into text.
//
// What is not implemented is refused by name when the file is loaded: other models (Unigram,
// WordPiece, WordLevel), normalizers, other pre-tokenizers and decoders, BPE dropout,
// byte_fallback, subword prefixes, single_word added tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/data/AddedTokens.h"
#include "runtime/data/Bpe.h"
#include "runtime/data/PreTokenizer.h"

namespace hcp::data {

class Tokenizer {
 public:
  static absl::StatusOr<Tokenizer> Load(const std::string& path);
  // `json` is a tokenizer.json's text; `where` names it in errors.
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json, const std::string& where);

  // One past the highest id (vocabulary and added tokens): the model's vocab must be at least
  // this.
  int64_t vocab_size() const { return vocab_size_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // The id of an added token's content or of a vocabulary token (byte-level alphabet).
  std::optional<uint32_t> TokenId(std::string_view token) const;
  // One line: "byte-level BPE, 100,352 ids (100,000 merges), 96 added tokens".
  std::string Describe() const;

  // The text of `ids` as the ByteLevel decoder gives it (bytes as they come: ids cut inside a
  // character give invalid UTF-8). An id that is neither in the vocabulary nor added is an
  // error, and so is a tokenizer.json without a decoder.
  absl::StatusOr<std::string> Decode(std::span<const uint32_t> ids,
                                     bool skip_special = false) const;

  // Encode with a fresh Encoder (for a few texts; an Encoder keeps its word cache).
  absl::StatusOr<std::vector<uint32_t>> Encode(std::string_view text) const;

 private:
  friend class Encoder;
  Tokenizer(BpeModel model, PreTokenizer pre_tokenizer)
      : model_(std::move(model)), pre_tokenizer_(std::move(pre_tokenizer)) {}

  BpeModel model_;
  PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<uint32_t, size_t> added_by_id_;  // id -> index into added_
  // Matched in two rounds like Hugging Face's (before and after normalizing, which is the same
  // text here): tokens with normalized false first, then those with normalized true.
  std::vector<AddedTokenMatcher> matchers_;
  int64_t vocab_size_ = 0;
  bool has_decoder_ = false;
};

// Encodes many texts with one tokenizer, reusing its working space and a cache of the words it
// has seen. One per thread; the tokenizer must outlive it.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& tokenizer);

  // Appends the ids of `text` to `ids`. Text that is not valid UTF-8 is an error naming the
  // byte offset (nothing is appended then).
  absl::Status Encode(std::string_view text, std::vector<uint32_t>& ids);

 private:
  void EncodeWord(std::string_view word, std::vector<uint32_t>& ids);

  const Tokenizer* tokenizer_;
  PreTokenizer::Scratch pre_scratch_;
  BpeModel::Scratch bpe_scratch_;
  std::vector<TextPiece> pieces_, next_pieces_;
  std::vector<std::string_view> words_;
  // word bytes -> (offset, count) in cached_ids_; cleared when it grows past its bound.
  absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> cache_;
  std::vector<uint32_t> cached_ids_;
};

}  // namespace hcp::data
