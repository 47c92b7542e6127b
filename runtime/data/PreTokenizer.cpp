#include "runtime/data/PreTokenizer.h"

#include <algorithm>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/support/Status.h"

namespace hcp::data {

// GPT-2's expression, which ByteLevel runs when its use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern, bool literal,
                                                        const std::string& where) {
    uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     options, &error, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat(where, ": the expression ", pattern,
                                                     " does not compile at offset ", error_offset,
                                                     ": ", reinterpret_cast<const char*>(message)));
    }
    // Without JIT support (another CPU), pcre2_match interprets the pattern: slower, the same.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::unique_ptr<Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }
  pcre2_code* code() const { return code_; }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

namespace {

absl::StatusOr<SplitBehavior> ParseBehavior(const nlohmann::json& value, const std::string& where) {
  static const std::pair<const char*, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  if (value.is_string()) {
    for (const auto& [name, behavior] : kNames) {
      if (value.get<std::string>() == name) return behavior;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": behavior ", value.dump(),
      " is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous"));
}

bool BoolField(const nlohmann::json& config, const char* key, bool fallback) {
  auto it = config.find(key);
  return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// A piece of a word: [begin, end) and whether it is the Split's delimiter.
struct Piece {
  size_t begin, end;
  bool delimiter;
};

// Emits `pieces` in order, each that `joins` (given whether it and the neighbour before it, or
// after it when `backward`, are delimiters) merged into that neighbour's piece.
template <typename Joins, typename Emit>
void JoinPieces(const std::vector<Piece>& pieces, bool backward, Joins joins, Emit emit) {
  std::vector<std::pair<size_t, size_t>> merged;
  bool neighbour_delimiter = false;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[backward ? pieces.size() - 1 - k : k];
    if (!merged.empty() && joins(p.delimiter, neighbour_delimiter)) {
      merged.back().first = std::min(merged.back().first, p.begin);
      merged.back().second = std::max(merged.back().second, p.end);
    } else {
      merged.emplace_back(p.begin, p.end);
    }
    neighbour_delimiter = p.delimiter;
  }
  if (backward) std::reverse(merged.begin(), merged.end());
  for (auto [begin, end] : merged) emit(begin, end);
}

size_t Utf8Length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
}

}  // namespace

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& config,
                                                    const std::string& where) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a byte-level tokenizer needs a ByteLevel pre_tokenizer; found ", config.dump()));
  }
  std::vector<nlohmann::json> steps;
  if (config["type"] == "Sequence") {
    if (!config.contains("pretokenizers") || !config["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": Sequence without pretokenizers"));
    }
    for (const nlohmann::json& step : config["pretokenizers"]) steps.push_back(step);
  } else {
    steps.push_back(config);
  }

  PreTokenizer pre_tokenizer;
  for (size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& step = steps[i];
    std::string step_where = absl::StrCat(where, " step ", i);
    std::string type = step.is_object() && step.contains("type") && step["type"].is_string()
                           ? step["type"].get<std::string>()
                           : "";
    bool last = i + 1 == steps.size();
    if (type == "ByteLevel") {
      if (!last) {
        return absl::InvalidArgumentError(
            absl::StrCat(step_where, ": ByteLevel must be the last pre-tokenizer"));
      }
      Step byte_level;
      byte_level.add_prefix_space = BoolField(step, "add_prefix_space", true);
      if (BoolField(step, "use_regex", true)) {
        HCP_ASSIGN_OR_RETURN(byte_level.regex, Regex::Compile(kGpt2Pattern, false, step_where));
      }
      if (byte_level.regex || byte_level.add_prefix_space) {
        pre_tokenizer.steps_.push_back(std::move(byte_level));
      }
      return pre_tokenizer;
    }
    if (type != "Split") {
      return absl::InvalidArgumentError(
          absl::StrCat(step_where, ": pre-tokenizer ", type.empty() ? step.dump() : type,
                       " is not supported (supported: Split, ByteLevel, and a Sequence of them)"));
    }
    const nlohmann::json* pattern = step.contains("pattern") ? &step["pattern"] : nullptr;
    bool literal = pattern && pattern->is_object() && pattern->contains("String");
    bool regex = pattern && pattern->is_object() && pattern->contains("Regex");
    const char* key = literal ? "String" : "Regex";
    if (!(literal || regex) || !(*pattern)[key].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          step_where, ": Split needs a pattern {\"Regex\": ...} or {\"String\": ...}"));
    }
    Step split;
    HCP_ASSIGN_OR_RETURN(split.regex,
                         Regex::Compile((*pattern)[key].get<std::string>(), literal, step_where));
    if (!step.contains("behavior")) {
      return absl::InvalidArgumentError(absl::StrCat(step_where, ": Split without a behavior"));
    }
    HCP_ASSIGN_OR_RETURN(split.behavior, ParseBehavior(step["behavior"], step_where));
    split.invert = BoolField(step, "invert", false);
    pre_tokenizer.steps_.push_back(std::move(split));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": the last pre-tokenizer must be ByteLevel (the vocabulary is byte-level)"));
}

PreTokenizer::Scratch::Scratch(const PreTokenizer& pre_tokenizer) {
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  match_context_ = pcre2_match_context_create(nullptr);
  pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(match_context_), nullptr, jit_stack_);
  for (const Step& step : pre_tokenizer.steps_) {
    match_data_.push_back(
        step.regex ? pcre2_match_data_create_from_pattern(step.regex->code(), nullptr) : nullptr);
  }
}

PreTokenizer::Scratch::~Scratch() {
  for (void* data : match_data_) pcre2_match_data_free(static_cast<pcre2_match_data*>(data));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

absl::Status PreTokenizer::Split(std::string_view text, Scratch& scratch,
                                 std::vector<std::string_view>& words) const {
  scratch.owned_.clear();
  scratch.current_.assign(1, text);
  for (size_t i = 0; i < steps_.size(); ++i) {
    scratch.next_.clear();
    for (std::string_view word : scratch.current_) {
      HCP_RETURN_IF_ERROR(RunStep(i, word, scratch, scratch.next_));
    }
    std::swap(scratch.current_, scratch.next_);
  }
  for (std::string_view word : scratch.current_) {
    if (!word.empty()) words.push_back(word);
  }
  return absl::OkStatus();
}

absl::Status PreTokenizer::RunStep(size_t index, std::string_view word, Scratch& scratch,
                                   std::vector<std::string_view>& out) const {
  const Step& step = steps_[index];
  if (step.add_prefix_space && (word.empty() || word[0] != ' ')) {
    word = scratch.owned_.emplace_back(absl::StrCat(" ", std::string(word)));
  }
  if (!step.regex) {
    out.push_back(word);
    return absl::OkStatus();
  }

  // The expression's matches, in order (empty ones skipped).
  auto* data = static_cast<pcre2_match_data*>(scratch.match_data_[index]);
  auto* context = static_cast<pcre2_match_context*>(scratch.match_context_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(word.data());
  std::vector<std::pair<size_t, size_t>>& matches = scratch.matches_;
  matches.clear();
  size_t offset = 0;
  while (offset < word.size()) {
    int rc = pcre2_match(step.regex->code(), subject, word.size(), offset, PCRE2_NO_UTF_CHECK, data,
                         context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::ResourceExhaustedError(
          absl::StrCat("the pre-tokenizer's expression failed on a ", word.size(),
                       "-byte piece of text: ", reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(data);
    if (range[1] == range[0]) {
      offset = range[0] + Utf8Length(static_cast<unsigned char>(word[range[0]]));
      continue;
    }
    matches.emplace_back(range[0], range[1]);
    offset = range[1];
  }

  // The word as alternating pieces. With invert, the matches are what is kept and the text
  // between them the delimiters.
  std::vector<Piece> pieces;
  size_t previous = 0;
  for (auto [begin, end] : matches) {
    if (begin > previous) pieces.push_back({previous, begin, step.invert});
    pieces.push_back({begin, end, !step.invert});
    previous = end;
  }
  if (previous < word.size()) pieces.push_back({previous, word.size(), step.invert});

  auto emit = [&](size_t begin, size_t end) { out.push_back(word.substr(begin, end - begin)); };
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const Piece& p : pieces) {
        if (!p.delimiter) emit(p.begin, p.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Piece& p : pieces) emit(p.begin, p.end);
      break;
    // A delimiter joins the piece before (after) it, unless that one is a delimiter too.
    case SplitBehavior::kMergedWithPrevious:
      JoinPieces(
          pieces, /*backward=*/false, [](bool d, bool neighbour) { return d && !neighbour; }, emit);
      break;
    case SplitBehavior::kMergedWithNext:
      JoinPieces(
          pieces, /*backward=*/true, [](bool d, bool neighbour) { return d && !neighbour; }, emit);
      break;
    // Neighbours of one kind become one piece (delimiters; with invert, also matches that touch).
    case SplitBehavior::kContiguous:
      JoinPieces(
          pieces, /*backward=*/false, [](bool d, bool neighbour) { return d == neighbour; }, emit);
      break;
  }
  return absl::OkStatus();
}

}  // namespace hcp::data
