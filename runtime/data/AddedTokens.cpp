#include "runtime/data/AddedTokens.h"

#include <algorithm>

namespace hcp::data {
namespace {

// Rust's char::is_whitespace (Unicode White_Space), which Hugging Face's lstrip / rstrip use.
bool IsWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point at `at` (valid UTF-8) and its length.
uint32_t DecodeAt(std::string_view s, size_t at, size_t& length) {
  unsigned char c = static_cast<unsigned char>(s[at]);
  if (c < 0x80) return length = 1, c;
  length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t code = c & (0x3F >> (length - 1));
  for (size_t k = 1; k < length; ++k) code = (code << 6) | (s[at + k] & 0x3F);
  return code;
}

// The start of the whitespace run that ends at `end` (no earlier than `floor`).
size_t WhitespaceBefore(std::string_view s, size_t end, size_t floor) {
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t length;
    if (!IsWhitespace(DecodeAt(s, start, length))) break;
    end = start;
  }
  return end;
}

// The end of the whitespace run that starts at `begin` (no later than `ceiling`).
size_t WhitespaceAfter(std::string_view s, size_t begin, size_t ceiling) {
  while (begin < ceiling) {
    size_t length;
    if (!IsWhitespace(DecodeAt(s, begin, length))) break;
    begin += length;
  }
  return begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens)
    : tokens_(tokens), nodes_(1) {
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t]->content;
    if (content.empty()) continue;
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    int32_t node = 0;
    for (unsigned char byte : content) {
      int32_t next = Child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, unsigned char byte) const {
  for (const auto& [b, child] : nodes_[node].children) {
    if (b == byte) return child;
  }
  return -1;
}

int32_t AddedTokenMatcher::LongestAt(std::string_view text, size_t at, size_t end,
                                     size_t& length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = at; i < end; ++i) {
    node = Child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) best = nodes_[node].token, length = i + 1 - at;
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, size_t begin, size_t end,
                              std::vector<TextPiece>& out) const {
  size_t piece_begin = begin;  // where the ordinary text since the last match starts
  size_t at = begin;
  while (at < end) {
    size_t length = 0;
    int32_t token =
        first_byte_[static_cast<unsigned char>(text[at])] ? LongestAt(text, at, end, length) : -1;
    if (token < 0) {
      ++at;
      continue;
    }
    const AddedToken& added = *tokens_[token];
    size_t match_begin = added.lstrip ? WhitespaceBefore(text, at, piece_begin) : at;
    size_t match_end = added.rstrip ? WhitespaceAfter(text, at + length, end) : at + length;
    if (match_begin > piece_begin) out.push_back({piece_begin, match_begin, -1});
    out.push_back({match_begin, match_end, added.id});
    piece_begin = at = match_end;
  }
  if (end > piece_begin) out.push_back({piece_begin, end, -1});
}

}  // namespace hcp::data
