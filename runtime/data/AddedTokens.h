// Added tokens (tokenizer.json's "added_tokens": special tokens such as <|end_of_text|> and
// tokens added after training) are found in the text before anything else runs, the way Hugging
// Face's tokenizers finds them: the leftmost match first, the longest of those that start there;
// `lstrip` / `rstrip` tokens also take the whitespace to their left / right. The text between
// matches goes on to the pre-tokenizer and the model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hcp::data {

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool special = false;     // dropped by Decode(skip_special)
  bool normalized = false;  // matched after the normalizer (none is supported: same text)
  bool lstrip = false;
  bool rstrip = false;
};

// A piece of the text: [begin, end) and, for a match, the added token's id.
struct TextPiece {
  size_t begin = 0;
  size_t end = 0;
  int64_t added_id = -1;  // -1: ordinary text
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<const AddedToken*>& tokens);

  bool empty() const { return nodes_.size() == 1; }
  // Appends the pieces of text[begin, end) to `out`, in order, covering all of it (empty
  // ordinary pieces left out).
  void Split(std::string_view text, size_t begin, size_t end, std::vector<TextPiece>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // byte -> node
    int32_t token = -1;                                       // index into tokens_
  };
  int32_t Child(int32_t node, unsigned char byte) const;
  // The longest token that starts at `at`, or -1.
  int32_t LongestAt(std::string_view text, size_t at, size_t end, size_t& length) const;

  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace hcp::data
