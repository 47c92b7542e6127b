// The pre-tokenizer: how a piece of text is cut into words before the BPE model sees them, as
// tokenizer.json's "pre_tokenizer" says. Supported: Split (a regular expression or a literal
// string, with any of Hugging Face's five behaviours and `invert`) and ByteLevel (with or without
// GPT-2's own expression and add_prefix_space), alone or in a Sequence that ends with ByteLevel.
// The expressions run on PCRE2 in UTF mode with Unicode properties (\p{L}, \s, look-ahead), JIT
// compiled.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace hcp::data {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class Regex;  // a compiled PCRE2 expression (PreTokenizer.cpp)

class PreTokenizer {
 public:
  // Reads tokenizer.json's "pre_tokenizer" (`where` names it in errors). The last step must be
  // ByteLevel: the model's vocabulary is written in its alphabet.
  static absl::StatusOr<PreTokenizer> FromJson(const nlohmann::json& config,
                                               const std::string& where);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Per-thread scratch space for the expressions (PCRE2 match data).
  class Scratch {
   public:
    explicit Scratch(const PreTokenizer& pre_tokenizer);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class PreTokenizer;
    void* match_context_ = nullptr;  // pcre2_match_context with a JIT stack
    void* jit_stack_ = nullptr;      // pcre2_jit_stack
    std::vector<void*> match_data_;  // pcre2_match_data, one per step
    std::deque<std::string> owned_;  // words that add_prefix_space changed (stable addresses)
    std::vector<std::string_view> current_, next_;
    std::vector<std::pair<size_t, size_t>> matches_;
  };

  // Cuts `text` (valid UTF-8) into words, appended to `words` as raw bytes (the byte-level
  // alphabet is the model's business). A view may point into `scratch` until the next call.
  // Fails only when PCRE2 does (a match that needs more than the JIT stack's 8 MiB).
  absl::Status Split(std::string_view text, Scratch& scratch,
                     std::vector<std::string_view>& words) const;

 private:
  struct Step {
    // A Split step; ByteLevel with use_regex runs GPT-2's expression as an Isolated split.
    std::unique_ptr<Regex> regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel only
  };
  PreTokenizer() = default;
  absl::Status RunStep(size_t index, std::string_view word, Scratch& scratch,
                       std::vector<std::string_view>& out) const;

  std::vector<Step> steps_;
};

}  // namespace hcp::data
