#include "runtime/data/Bpe.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/data/ByteLevel.h"
namespace hcp::data {
namespace {

// A token quoted for an error message (tokens from tokenizer.json are valid UTF-8).
std::string Shown(const std::string& token) { return nlohmann::json(token).dump(); }

bool IsSet(const nlohmann::json& model, const char* key) {
  auto it = model.find(key);
  return it != model.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
         !(it->is_number() && it->get<double>() == 0.0) && !(it->is_string() && it->empty());
}

bool Flag(const nlohmann::json& model, const char* key) {
  auto it = model.find(key);
  return it != model.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

absl::StatusOr<BpeModel> BpeModel::FromJson(const nlohmann::json& model, const std::string& where) {
  if (!model.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"model\" is not an object"));
  }
  std::string type = model.contains("type") && model["type"].is_string()
                         ? model["type"].get<std::string>()
                         : (model.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": model type ", type.empty() ? "(none)" : type,
                     " is not supported (hybridcp reads byte-level BPE tokenizers only)"));
  }
  for (const char* key :
       {"dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix"}) {
    if (IsSet(model, key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": BPE with ", key, " ", model[key].dump(), " is not supported"));
    }
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": model.vocab is not an object"));
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": model.merges is not a list"));
  }

  // Ids index a table: they must be dense enough for one (a trained vocabulary is 0..n-1).
  const nlohmann::json& vocab = model["vocab"];
  for (const auto& [token, id] : vocab.items()) {
    if (id.is_number_unsigned() && id.get<uint64_t>() >= 2 * vocab.size() + 1024) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": vocab entry ", Shown(token),
                                                     " has id ", id.get<uint64_t>(), ", beyond ",
                                                     vocab.size(), " entries"));
    }
  }
  BpeModel bpe;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0x7FFFFFFF) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": vocab entry ", Shown(token),
                                                     " has id ", id.dump(), ", not an id"));
    }
    uint32_t value = id.get<uint32_t>();
    if (value >= bpe.tokens_.size()) bpe.tokens_.resize(value + 1);
    if (!bpe.tokens_[value].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": id ", value, " is both ", Shown(bpe.tokens_[value]), " and ", Shown(token)));
    }
    bpe.tokens_[value] = token;
    bpe.vocab_.emplace(token, value);
  }

  const nlohmann::json& merges = model["merges"];
  bpe.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const nlohmann::json& merge = merges[rank];
    std::string left, right;
    // Two spellings: "a b" (tokenizers before 0.20) and ["a", "b"].
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": merge ", rank, " ", Shown(line), " is not two tokens"));
      }
      left = line.substr(0, space), right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": merge ", rank, " ", merge.dump(), " is not two tokens"));
    }
    std::optional<uint32_t> a = bpe.Find(left), b = bpe.Find(right);
    std::optional<uint32_t> merged = bpe.Find(left + right);
    if (!a || !b || !merged) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": merge ", rank, " (", Shown(left),
                                                     ", ", Shown(right), "): ",
                                                     !a   ? Shown(left)
                                                     : !b ? Shown(right)
                                                          : Shown(left + right),
                                                     " is not in the vocab"));
    }
    bpe.merges_.emplace(PairKey(*a, *b), std::make_pair(static_cast<uint32_t>(rank), *merged));
  }

  const auto& chars = ByteLevelChars();
  for (int byte = 0; byte < 256; ++byte) {
    std::optional<uint32_t> id = bpe.Find(chars[byte]);
    bpe.byte_ids_[byte] = id ? static_cast<int64_t>(*id) : -1;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    bpe.unk_ = bpe.Find(model["unk_token"].get<std::string>());
    if (!bpe.unk_) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unk_token ", model["unk_token"].dump(), " is not in the vocab"));
    }
  }
  bpe.fuse_unk_ = Flag(model, "fuse_unk");
  bpe.ignore_merges_ = Flag(model, "ignore_merges");
  return bpe;
}

std::optional<uint32_t> BpeModel::Find(std::string_view token) const {
  auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::pair<uint32_t, uint32_t>* BpeModel::FindMerge(uint32_t left, uint32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Encode(std::string_view word, Scratch& scratch, std::vector<uint32_t>& out) const {
  if (ignore_merges_) {
    if (std::optional<uint32_t> id = Find(ByteLevelEncode(word))) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<Scratch::Symbol>& symbols = scratch.symbols;
  symbols.clear();
  for (unsigned char byte : word) {
    int64_t id = byte_ids_[byte];
    if (id < 0) {
      if (!unk_) continue;
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_) continue;
      id = *unk_;
    }
    int32_t pos = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(id), pos - 1, pos + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // The candidate merges in a min-heap by (rank, position); a candidate whose pair has changed
  // since it was pushed is skipped when it comes up.
  std::vector<Scratch::Candidate>& heap = scratch.heap;
  heap.clear();
  auto push = [&](int32_t pos) {
    int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const auto* merge = FindMerge(symbols[pos].id, symbols[next].id)) {
      heap.push_back({merge->first, merge->second, pos});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push(pos);
  constexpr uint32_t kGone = 0xFFFFFFFF;  // a symbol merged into its left neighbour
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    Scratch::Candidate top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[top.pos];
    if (left.id == kGone || left.next < 0) continue;
    Scratch::Symbol& right = symbols[left.next];
    const auto* merge = FindMerge(left.id, right.id);
    if (merge == nullptr || merge->second != top.merged) continue;
    left.id = top.merged;
    right.id = kGone;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) out.push_back(symbols[pos].id);
}

}  // namespace hcp::data
