#include "runtime/data/FineTuning.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::data {

std::string_view DocumentFormatName(DocumentFormat format) {
  switch (format) {
    case DocumentFormat::kText:
      return "text";
    case DocumentFormat::kChat:
      return "chat";
    case DocumentFormat::kPromptCompletion:
      return "prompt-completion";
  }
  return "text";
}

absl::StatusOr<DocumentFormat> ParseDocumentFormat(std::string_view name) {
  for (DocumentFormat format :
       {DocumentFormat::kText, DocumentFormat::kChat, DocumentFormat::kPromptCompletion}) {
    if (name == DocumentFormatName(format)) return format;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--format ", std::string(name), ": give text, chat or prompt-completion"));
}

absl::StatusOr<DocumentFormat> DetectJsonlFormat(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such text file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open it"));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    HCP_ASSIGN_OR_RETURN(nlohmann::json record,
                         ParseJsonStrict(line, absl::StrCat(path, ":", number)));
    if (!record.is_object()) return DocumentFormat::kText;  // the reader names the line
    if (record.contains("messages")) return DocumentFormat::kChat;
    if (record.contains("prompt") && record.contains("completion")) {
      return DocumentFormat::kPromptCompletion;
    }
    return DocumentFormat::kText;
  }
  return DocumentFormat::kText;
}

absl::Status CheckChatTokens(const Tokenizer& tokenizer, const std::string& tokenizer_path) {
  std::vector<std::string> missing;
  for (const char* token : {kStartOfRole, kEndOfRole, kEndOfText}) {
    bool found = false;
    for (const AddedToken& added : tokenizer.added_tokens()) found |= added.content == token;
    if (!found) missing.push_back(token);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      tokenizer_path, ": the chat format needs Granite's role tokens as added tokens, and ",
      absl::StrJoin(missing, ", "), missing.size() == 1 ? " is" : " are",
      " not among them (is this a Granite tokenizer?)"));
}

namespace {

// The string field `name` of `object`, or an error saying what it is instead.
absl::StatusOr<std::string> StringField(const nlohmann::json& object, const char* name,
                                        const std::string& where) {
  auto field = object.find(name);
  if (field == object.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no \"", name, "\""));
  }
  if (!field->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", name, "\" is ", field->type_name(), ", not a string"));
  }
  return field->get<std::string>();
}

}  // namespace

absl::StatusOr<std::vector<TextSegment>> ChatSegments(const nlohmann::json& record,
                                                      const std::string& where) {
  auto messages = record.is_object() ? record.find("messages") : record.end();
  if (!record.is_object() || messages == record.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": no \"messages\" in this line (the chat format wants {\"messages\": "
                     "[{\"role\": ..., \"content\": ...}, ...]})"));
  }
  if (!messages->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"messages\" is ", messages->type_name(), ", not a list"));
  }
  if (messages->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": an empty conversation"));
  }
  std::vector<TextSegment> segments;
  bool learned = false;
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& message = (*messages)[i];
    const std::string what = absl::StrCat(where, ": message ", i);
    if (!message.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is ", message.type_name(), ", not an object"));
    }
    HCP_ASSIGN_OR_RETURN(std::string role, StringField(message, "role", what));
    HCP_ASSIGN_OR_RETURN(std::string content, StringField(message, "content", what));
    const bool assistant = role == "assistant";
    learned |= assistant;
    segments.push_back({absl::StrCat(kStartOfRole, role, kEndOfRole), false});
    segments.push_back({std::move(content), assistant});
    // The assistant's closing token counts: it is how the model learns to stop.
    segments.push_back({kEndOfText, assistant});
    segments.push_back({"\n", false});
  }
  if (!learned) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": no message with the role \"assistant\": the conversation has nothing to learn"));
  }
  return segments;
}

absl::StatusOr<std::vector<TextSegment>> PromptCompletionSegments(const nlohmann::json& record,
                                                                  const std::string& where) {
  if (!record.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not an object {\"prompt\": ..., \"completion\": ...}"));
  }
  HCP_ASSIGN_OR_RETURN(std::string prompt, StringField(record, "prompt", where));
  HCP_ASSIGN_OR_RETURN(std::string completion, StringField(record, "completion", where));
  if (completion.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": an empty \"completion\": the record has nothing to learn"));
  }
  return std::vector<TextSegment>{{std::move(prompt), false}, {std::move(completion), true}};
}

absl::Status EncodeSegments(Encoder& encoder, const std::vector<TextSegment>& segments,
                            std::vector<uint32_t>& ids, std::vector<uint32_t>& mask) {
  for (const TextSegment& segment : segments) {
    HCP_RETURN_IF_ERROR(encoder.Encode(segment.text, ids));
    mask.resize(ids.size(), segment.counts ? 1 : 0);
  }
  return absl::OkStatus();
}

}  // namespace hcp::data
