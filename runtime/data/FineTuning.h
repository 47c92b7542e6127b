// Fine-tuning records of a .jsonl file -> text segments that do or do not count in the loss, for
// `hybridcp tokenize --format chat|prompt-completion` (TokenizeFiles.h encodes the segments and
// writes the loss mask, LossMask.h).
//
// chat: {"messages": [{"role": "system"|"user"|"assistant"|..., "content": "..."}, ...]} is one
//   document, each message rendered as Granite 4.0's chat template renders it:
//     <|start_of_role|>ROLE<|end_of_role|>CONTENT<|end_of_text|>\n
//   Only the assistant turns are learned: each assistant message's CONTENT and its closing
//   <|end_of_text|> count; every role header, the other roles' turns and the newlines do not.
//   A conversation without an assistant message is refused rather than skipped: it has nothing
//   to learn, and a whole file of them (role names spelled another way) would otherwise train on
//   nothing without a word.
// prompt-completion: {"prompt": "...", "completion": "..."}: the prompt does not count, the
//   completion and the end-of-document token after it do.
//
// The segments are encoded one by one and their ids concatenated. Since the tokenizer splits its
// added tokens out of the text before anything else, and every boundary between segments is next
// to an added token, that gives the ids of encoding the whole rendered text (FineTuningTest
// checks it), with the mask known exactly per token.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "runtime/data/Tokenizer.h"

namespace hcp::data {

// How the records of the inputs become documents: text (a file, a line, a .jsonl record's text
// field: every token counts), chat or prompt-completion (the top of this file).
enum class DocumentFormat { kText, kChat, kPromptCompletion };

// "text", "chat", "prompt-completion".
std::string_view DocumentFormatName(DocumentFormat format);
// The names above; anything else is InvalidArgument naming --format.
absl::StatusOr<DocumentFormat> ParseDocumentFormat(std::string_view name);

// The format of a .jsonl file from its first non-blank record: chat when it has "messages",
// prompt-completion when it has "prompt" and "completion", else text. A record that is not JSON
// is an error naming the file and line.
absl::StatusOr<DocumentFormat> DetectJsonlFormat(const std::string& path);

inline constexpr char kStartOfRole[] = "<|start_of_role|>";
inline constexpr char kEndOfRole[] = "<|end_of_role|>";
inline constexpr char kEndOfText[] = "<|end_of_text|>";

// The chat template's tokens must be added tokens of the tokenizer (so that they are split out
// first and the segments encode as the whole text does); the error names those missing.
absl::Status CheckChatTokens(const Tokenizer& tokenizer, const std::string& tokenizer_path);

struct TextSegment {
  std::string text;
  bool counts = false;  // its tokens are targets the loss counts
};

// The segments of one record; `where` ("file:line") starts each error: a record that is not an
// object or lacks its fields, a message whose role or content is not a string (naming the
// message's index), an empty conversation, one without an assistant message, an empty
// completion.
absl::StatusOr<std::vector<TextSegment>> ChatSegments(const nlohmann::json& record,
                                                      const std::string& where);
absl::StatusOr<std::vector<TextSegment>> PromptCompletionSegments(const nlohmann::json& record,
                                                                  const std::string& where);

// Appends the ids of the segments, one after another, to `ids`, and to `mask` a 1 for each id of
// a segment that counts, a 0 for the others.
absl::Status EncodeSegments(Encoder& encoder, const std::vector<TextSegment>& segments,
                            std::vector<uint32_t>& ids, std::vector<uint32_t>& mask);

}  // namespace hcp::data
