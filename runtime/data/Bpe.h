// The BPE model of a byte-level tokenizer.json ("model": {"type": "BPE", "vocab", "merges"}):
// a word's bytes start as single characters of the byte-level alphabet and are merged pair by
// pair, always the pair of lowest rank (the earliest merge) first, the leftmost of equal pairs
// first, until no pair of the merge list is left, as Hugging Face's tokenizers does.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace hcp::data {

class BpeModel {
 public:
  // Reads tokenizer.json's "model". Refuses what this BPE does not implement (dropout,
  // byte_fallback, subword prefixes and suffixes) by name, and merges whose parts or result are
  // not in the vocabulary.
  static absl::StatusOr<BpeModel> FromJson(const nlohmann::json& model, const std::string& where);

  // Working space for Encode, one per thread.
  struct Scratch {
    struct Symbol {
      uint32_t id;
      int32_t prev, next;
    };
    struct Candidate {
      uint32_t rank, merged;
      int32_t pos;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the ids of one word (its raw bytes). A byte whose character is not in the vocabulary
  // becomes the unknown token when there is one and is dropped otherwise (as Hugging Face does).
  void Encode(std::string_view word, Scratch& scratch, std::vector<uint32_t>& out) const;

  // The id of a token written in the byte-level alphabet.
  std::optional<uint32_t> Find(std::string_view token) const;
  // Id -> token (byte-level alphabet); empty for ids the vocabulary skips.
  const std::vector<std::string>& tokens() const { return tokens_; }
  size_t merge_count() const { return merges_.size(); }

 private:
  static uint64_t PairKey(uint32_t left, uint32_t right) {
    return (static_cast<uint64_t>(left) << 32) | right;
  }
  // The merge of (left, right), if any: (rank, merged id).
  const std::pair<uint32_t, uint32_t>* FindMerge(uint32_t left, uint32_t right) const;

  absl::flat_hash_map<std::string, uint32_t> vocab_;
  std::vector<std::string> tokens_;
  absl::flat_hash_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;
  std::array<int64_t, 256> byte_ids_{};  // the id of each byte's character, -1 when absent
  std::optional<uint32_t> unk_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;  // a word that is itself in the vocabulary is one token
};

}  // namespace hcp::data
