#include "runtime/data/Tokenizer.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/data/ByteLevel.h"
#include "runtime/support/Format.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::data {
namespace {

// The cache's bound: past it, the cache starts over (the words of one language fit easily).
constexpr size_t kMaxCachedWords = 1 << 20;
constexpr size_t kMaxCachedWordBytes = 256;

bool IsAbsent(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  return it == config.end() || it->is_null();
}

std::string TypeOf(const nlohmann::json& value) {
  if (value.is_object() && value.contains("type") && value["type"].is_string()) {
    return value["type"].get<std::string>();
  }
  return value.dump();
}

// A normalizer that changes nothing: none, or an empty Sequence.
bool IsNoNormalizer(const nlohmann::json& config) {
  if (IsAbsent(config, "normalizer")) return true;
  const nlohmann::json& normalizer = config["normalizer"];
  return TypeOf(normalizer) == "Sequence" && normalizer.contains("normalizers") &&
         normalizer["normalizers"].is_array() && normalizer["normalizers"].empty();
}

absl::StatusOr<AddedToken> ParseAddedToken(const nlohmann::json& entry, size_t index,
                                           const std::string& where) {
  std::string at = absl::StrCat(where, ": added_tokens[", index, "]");
  if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_unsigned() ||
      entry["id"].get<uint64_t>() > 0x7FFFFFFF || !entry.contains("content") ||
      !entry["content"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, " needs an \"id\" and a \"content\"; found ", entry.dump()));
  }
  auto flag = [&](const char* key, bool fallback) {
    auto it = entry.find(key);
    return it != entry.end() && it->is_boolean() ? it->get<bool>() : fallback;
  };
  AddedToken token;
  token.id = entry["id"].get<uint32_t>();
  token.content = entry["content"].get<std::string>();
  token.special = flag("special", false);
  token.normalized = flag("normalized", !token.special);
  token.lstrip = flag("lstrip", false);
  token.rstrip = flag("rstrip", false);
  if (token.content.empty()) return absl::InvalidArgumentError(absl::StrCat(at, " is empty"));
  if (!IsValidUtf8(token.content)) {
    return absl::InvalidArgumentError(absl::StrCat(at, " is not valid UTF-8"));
  }
  if (flag("single_word", false)) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, " (", token.content, "): single_word added tokens are not supported"));
  }
  return token;
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the tokenizer file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": cannot read it"));
  return FromJson(text.str(), path);
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view json, const std::string& where) {
  HCP_ASSIGN_OR_RETURN(nlohmann::json config, ParseJsonStrict(json, where));
  if (!config.is_object() || !config.contains("model")) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a Hugging Face tokenizer.json (no \"model\")"));
  }
  if (!IsNoNormalizer(config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": normalizer ", TypeOf(config["normalizer"]), " is not supported (only none)"));
  }
  if (!IsAbsent(config, "decoder") && TypeOf(config["decoder"]) != "ByteLevel") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": decoder ", TypeOf(config["decoder"]),
                                                   " is not supported (only ByteLevel)"));
  }
  HCP_ASSIGN_OR_RETURN(BpeModel model, BpeModel::FromJson(config["model"], where));
  if (IsAbsent(config, "pre_tokenizer")) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no pre_tokenizer (a byte-level tokenizer ends with ByteLevel)"));
  }
  HCP_ASSIGN_OR_RETURN(PreTokenizer pre_tokenizer,
                       PreTokenizer::FromJson(config["pre_tokenizer"], where + ": pre_tokenizer"));
  Tokenizer tokenizer(std::move(model), std::move(pre_tokenizer));
  tokenizer.has_decoder_ = !IsAbsent(config, "decoder");

  if (!IsAbsent(config, "added_tokens")) {
    const nlohmann::json& entries = config["added_tokens"];
    if (!entries.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": added_tokens is not a list"));
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      HCP_ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken(entries[i], i, where));
      if (tokenizer.added_by_id_.contains(token.id)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": added_tokens[", i, "] repeats id ", token.id));
      }
      tokenizer.added_by_id_[token.id] = tokenizer.added_.size();
      tokenizer.added_.push_back(std::move(token));
    }
  }
  for (bool normalized : {false, true}) {
    std::vector<const AddedToken*> round;
    for (const AddedToken& token : tokenizer.added_) {
      if (token.normalized == normalized) round.push_back(&token);
    }
    if (!round.empty()) tokenizer.matchers_.emplace_back(round);
  }

  tokenizer.vocab_size_ = static_cast<int64_t>(tokenizer.model_.tokens().size());
  for (const AddedToken& token : tokenizer.added_) {
    tokenizer.vocab_size_ = std::max<int64_t>(tokenizer.vocab_size_, int64_t{token.id} + 1);
  }
  return tokenizer;
}

std::optional<uint32_t> Tokenizer::TokenId(std::string_view token) const {
  for (const AddedToken& added : added_) {
    if (added.content == token) return added.id;
  }
  return model_.Find(token);
}

std::string Tokenizer::Describe() const {
  return absl::StrCat("byte-level BPE, ", FormatCount(vocab_size_), " ids (",
                      FormatCount(static_cast<int64_t>(model_.merge_count())), " merges), ",
                      added_.size(), " added tokens");
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const uint32_t> ids,
                                              bool skip_special) const {
  if (!has_decoder_) {
    return absl::FailedPreconditionError(
        "the tokenizer has no decoder (tokenizer.json's \"decoder\" is null)");
  }
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = ids[i];
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      const AddedToken& added = added_[it->second];
      if (!(skip_special && added.special)) text += ByteLevelDecode(added.content);
      continue;
    }
    if (id >= model_.tokens().size() || model_.tokens()[id].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", id, " (at ", i, ") is not in the tokenizer's vocabulary"));
    }
    text += ByteLevelDecode(model_.tokens()[id]);
  }
  return text;
}

absl::StatusOr<std::vector<uint32_t>> Tokenizer::Encode(std::string_view text) const {
  Encoder encoder(*this);
  std::vector<uint32_t> ids;
  HCP_RETURN_IF_ERROR(encoder.Encode(text, ids));
  return ids;
}

Encoder::Encoder(const Tokenizer& tokenizer)
    : tokenizer_(&tokenizer), pre_scratch_(tokenizer.pre_tokenizer_) {}

absl::Status Encoder::Encode(std::string_view text, std::vector<uint32_t>& ids) {
  if (size_t bad = FirstInvalidUtf8(text); bad != text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("not valid UTF-8 at byte ", bad));
  }
  pieces_.assign(1, TextPiece{0, text.size(), -1});
  for (const AddedTokenMatcher& matcher : tokenizer_->matchers_) {
    next_pieces_.clear();
    for (const TextPiece& piece : pieces_) {
      if (piece.added_id >= 0) {
        next_pieces_.push_back(piece);
      } else {
        matcher.Split(text, piece.begin, piece.end, next_pieces_);
      }
    }
    std::swap(pieces_, next_pieces_);
  }

  size_t first = ids.size();
  for (const TextPiece& piece : pieces_) {
    if (piece.added_id >= 0) {
      ids.push_back(static_cast<uint32_t>(piece.added_id));
      continue;
    }
    words_.clear();
    absl::Status split = tokenizer_->pre_tokenizer_.Split(
        text.substr(piece.begin, piece.end - piece.begin), pre_scratch_, words_);
    if (!split.ok()) {
      ids.resize(first);
      return split;
    }
    for (std::string_view word : words_) EncodeWord(word, ids);
  }
  return absl::OkStatus();
}

void Encoder::EncodeWord(std::string_view word, std::vector<uint32_t>& ids) {
  if (word.size() > kMaxCachedWordBytes) {
    tokenizer_->model_.Encode(word, bpe_scratch_, ids);
    return;
  }
  absl::string_view key(word.data(), word.size());
  if (auto it = cache_.find(key); it != cache_.end()) {
    auto [offset, count] = it->second;
    ids.insert(ids.end(), cached_ids_.begin() + offset, cached_ids_.begin() + offset + count);
    return;
  }
  if (cache_.size() >= kMaxCachedWords) {
    cache_.clear();
    cached_ids_.clear();
  }
  size_t before = ids.size();
  tokenizer_->model_.Encode(word, bpe_scratch_, ids);
  auto offset = static_cast<uint32_t>(cached_ids_.size());
  cached_ids_.insert(cached_ids_.end(), ids.begin() + before, ids.end());
  cache_.emplace(std::string(word),
                 std::make_pair(offset, static_cast<uint32_t>(ids.size() - before)));
}

}  // namespace hcp::data
