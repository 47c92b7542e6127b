// Fine-tuning records: chat conversations and prompt-completion pairs rendered as Granite's chat
// template renders them, encoded a segment at a time with the ids of encoding the whole text, the
// mask on exactly the learned tokens; bad records refused naming the line and the message; the
// dataset and its mask written together or not at all.
#include "runtime/data/FineTuning.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/IndexedDataset.h"
#include "runtime/data/LossMask.h"
#include "runtime/data/TokenizeFiles.h"
#include "runtime/data/Tokenizer.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;
using testing::ScratchDir;
using testing::WriteFileBytes;

const std::string kFixtures = std::string(HYBRIDCP_SOURCE_DIR) + "/tests/fixtures/tokenizer/";

Tokenizer Granite() {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(kFixtures + "granite-style.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

nlohmann::json Chat(const std::vector<std::pair<std::string, std::string>>& messages) {
  nlohmann::json record = {{"messages", nlohmann::json::array()}};
  for (const auto& [role, content] : messages) {
    record["messages"].push_back({{"role", role}, {"content", content}});
  }
  return record;
}

// Granite's template, written out whole.
std::string Rendered(const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string text;
  for (const auto& [role, content] : messages) {
    text += "<|start_of_role|>" + role + "<|end_of_role|>" + content + "<|end_of_text|>\n";
  }
  return text;
}

TEST(FineTuning, SegmentsEncodeAsTheWholeRenderedConversation) {
  const Tokenizer tokenizer = Granite();
  const std::vector<std::vector<std::pair<std::string, std::string>>> conversations = {
      {{"user", "Hello world"}, {"assistant", "Hi! How can I help?"}},
      {{"system", "You are terse.\n"},
       {"user", "  spaces around  "},
       {"assistant", "\n\nOK.\n"},
       {"user", "What's 12,345 + 1?"},
       {"assistant", "12,346 ❤"}},
      // Content that holds the template's own tokens, and an empty turn.
      {{"user", "say <|end_of_text|> please"}, {"assistant", ""}, {"assistant", "done"}},
      {{"tool", "{\"x\": 1}"}, {"assistant", "I ❤ NY\r\n"}},
  };
  for (const auto& messages : conversations) {
    absl::StatusOr<std::vector<TextSegment>> segments = ChatSegments(Chat(messages), "t:1");
    ASSERT_TRUE(segments.ok()) << segments.status();
    Encoder encoder(tokenizer);
    std::vector<uint32_t> ids, mask;
    ASSERT_TRUE(EncodeSegments(encoder, *segments, ids, mask).ok());
    absl::StatusOr<std::vector<uint32_t>> whole = tokenizer.Encode(Rendered(messages));
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(ids, *whole) << Rendered(messages);
    ASSERT_EQ(mask.size(), ids.size());

    // The mask is 1 on each assistant content's ids and its <|end_of_text|>, nowhere else.
    std::vector<uint32_t> want;
    for (const auto& [role, content] : messages) {
      absl::StatusOr<std::vector<uint32_t>> header =
          tokenizer.Encode("<|start_of_role|>" + role + "<|end_of_role|>");
      absl::StatusOr<std::vector<uint32_t>> body = tokenizer.Encode(content);
      ASSERT_TRUE(header.ok() && body.ok());
      const uint32_t learned = role == "assistant" ? 1 : 0;
      want.insert(want.end(), header->size(), 0);
      want.insert(want.end(), body->size() + 1, learned);  // + <|end_of_text|>
      want.push_back(0);                                   // "\n"
    }
    EXPECT_EQ(mask, want) << Rendered(messages);
  }
}

TEST(FineTuning, PromptCompletionMasksThePrompt) {
  const Tokenizer tokenizer = Granite();
  absl::StatusOr<std::vector<TextSegment>> segments =
      PromptCompletionSegments({{"prompt", "Translate: Hello"}, {"completion", " world"}}, "t:1");
  ASSERT_TRUE(segments.ok()) << segments.status();
  Encoder encoder(tokenizer);
  std::vector<uint32_t> ids, mask;
  ASSERT_TRUE(EncodeSegments(encoder, *segments, ids, mask).ok());
  absl::StatusOr<std::vector<uint32_t>> prompt = tokenizer.Encode("Translate: Hello");
  absl::StatusOr<std::vector<uint32_t>> completion = tokenizer.Encode(" world");
  ASSERT_TRUE(prompt.ok() && completion.ok());
  std::vector<uint32_t> want_ids = *prompt, want_mask(prompt->size(), 0);
  want_ids.insert(want_ids.end(), completion->begin(), completion->end());
  want_mask.insert(want_mask.end(), completion->size(), 1);
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(mask, want_mask);
}

TEST(FineTuning, BadRecordsAreRefusedNamingTheLineAndMessage) {
  EXPECT_TRUE(FailsWith(ChatSegments({{"text", "x"}}, "f.jsonl:3").status(),
                        "f.jsonl:3: no \"messages\" in this line"));
  EXPECT_TRUE(FailsWith(ChatSegments({{"messages", "hi"}}, "f.jsonl:3").status(),
                        "f.jsonl:3: \"messages\" is string, not a list"));
  EXPECT_TRUE(FailsWith(ChatSegments({{"messages", nlohmann::json::array()}}, "f.jsonl:3").status(),
                        "f.jsonl:3: an empty conversation"));
  nlohmann::json role_number = Chat({{"user", "a"}, {"assistant", "b"}});
  role_number["messages"][1]["role"] = 7;
  EXPECT_TRUE(FailsWith(ChatSegments(role_number, "f.jsonl:3").status(),
                        "f.jsonl:3: message 1: \"role\" is number, not a string"));
  nlohmann::json no_content = Chat({{"user", "a"}});
  no_content["messages"][0].erase("content");
  EXPECT_TRUE(FailsWith(ChatSegments(no_content, "f.jsonl:3").status(),
                        "f.jsonl:3: message 0: no \"content\""));
  EXPECT_TRUE(FailsWith(ChatSegments(Chat({{"system", "a"}, {"user", "b"}}), "f.jsonl:3").status(),
                        "f.jsonl:3: no message with the role \"assistant\": the conversation has "
                        "nothing to learn"));
  EXPECT_TRUE(FailsWith(PromptCompletionSegments({{"prompt", "a"}}, "f.jsonl:2").status(),
                        "f.jsonl:2: no \"completion\""));
  EXPECT_TRUE(FailsWith(
      PromptCompletionSegments({{"prompt", "a"}, {"completion", ""}}, "f.jsonl:2").status(),
      "f.jsonl:2: an empty \"completion\": the record has nothing to learn"));
}

TEST(FineTuning, ATokenizerWithoutTheRoleTokensIsRefusedByName) {
  absl::StatusOr<Tokenizer> gpt2 = Tokenizer::Load(kFixtures + "gpt2-style.json");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_TRUE(FailsWith(CheckChatTokens(*gpt2, "gpt2.json"),
                        "gpt2.json: the chat format needs Granite's role tokens as added tokens, "
                        "and <|start_of_role|>, <|end_of_role|>, <|end_of_text|> are not among "
                        "them"));
  EXPECT_TRUE(CheckChatTokens(Granite(), "granite.json").ok());
}

TEST(FineTuning, FormatIsDetectedFromTheFirstRecord) {
  ScratchDir dir;
  WriteFileBytes(dir / "chat.jsonl", "\n{\"messages\": []}\n{\"text\": \"x\"}\n");
  WriteFileBytes(dir / "pc.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  WriteFileBytes(dir / "text.jsonl", "{\"text\": \"a\", \"prompt\": \"b\"}\n");
  WriteFileBytes(dir / "a.txt", "hello");
  EXPECT_EQ(*DetectJsonlFormat(dir / "chat.jsonl"), DocumentFormat::kChat);
  EXPECT_EQ(*DetectJsonlFormat(dir / "pc.jsonl"), DocumentFormat::kPromptCompletion);
  EXPECT_EQ(*DetectJsonlFormat(dir / "text.jsonl"), DocumentFormat::kText);
  EXPECT_EQ(*ResolveDocumentFormat({dir / "text.jsonl", dir / "a.txt"}, std::nullopt),
            DocumentFormat::kText);
  EXPECT_TRUE(FailsWith(
      ResolveDocumentFormat({dir / "chat.jsonl", dir / "a.txt"}, std::nullopt).status(),
      (dir / "chat.jsonl") + " holds chat documents but " + (dir / "a.txt") + " holds text ones"));
  EXPECT_TRUE(FailsWith(
      ResolveDocumentFormat({dir / "a.txt"}, DocumentFormat::kChat).status(),
      (dir / "a.txt") + ": --format chat reads .jsonl files of records, and this is a text file"));
  EXPECT_TRUE(FailsWith(ParseDocumentFormat("sft").status(), "--format sft: give text, chat or"));
}

TEST(FineTuning, TokenizeWritesTheMaskBesideTheDatasetOrNothing) {
  const Tokenizer tokenizer = Granite();
  ScratchDir dir;
  WriteFileBytes(dir / "chat.jsonl",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello world\"}, {\"role\": "
                 "\"assistant\", \"content\": \"Hi\"}]}\n\n"
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
                 "\"assistant\", \"content\": \"I ❤ NY\"}]}\n");
  TokenizeOptions options;
  options.threads = 2;
  absl::StatusOr<TokenizeProgress> done =
      TokenizeToIndexedDataset(tokenizer, {dir / "chat.jsonl"}, options, dir / "out");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->masked);
  absl::StatusOr<IndexedDataset> tokens = IndexedDataset::Open(dir / "out");
  absl::StatusOr<IndexedDataset> mask = IndexedDataset::Open(dir / "out.lossmask");
  ASSERT_TRUE(tokens.ok() && mask.ok());
  EXPECT_EQ(mask->dtype(), TokenDType::U8);
  EXPECT_EQ(tokens->documents(), 2);
  EXPECT_EQ(
      std::vector<int32_t>(mask->sequence_lengths().begin(), mask->sequence_lengths().end()),
      std::vector<int32_t>(tokens->sequence_lengths().begin(), tokens->sequence_lengths().end()));
  absl::StatusOr<std::optional<LossMask>> opened = OpenLossMask(*tokens);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(opened->has_value());
  EXPECT_EQ((*opened)->counted, done->counted);
  // No end-of-document token after a chat: the last <|end_of_text|> (id 0) is it, then "\n".
  const TokenFile& t = tokens->token_file();
  EXPECT_EQ(t.at(tokens->document_starts()[1] - 2), 0u);

  // A bad record in the second file: neither the dataset nor the mask is written.
  WriteFileBytes(dir / "bad.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n");
  done = TokenizeToIndexedDataset(tokenizer, {dir / "chat.jsonl", dir / "bad.jsonl"}, options,
                                  dir / "bad");
  EXPECT_TRUE(FailsWith(done.status(), (dir / "bad.jsonl") + ":1: no message with the role"));
  for (const char* name : {"bad.bin", "bad.idx", "bad.lossmask.bin", "bad.lossmask.idx"}) {
    EXPECT_FALSE(std::filesystem::exists(dir / name)) << name;
  }

  // Text over the same prefix: the old mask goes with the old tokens.
  WriteFileBytes(dir / "a.txt", "Hello world");
  done = TokenizeToIndexedDataset(tokenizer, {dir / "a.txt"}, options, dir / "out");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->masked);
  EXPECT_FALSE(std::filesystem::exists(dir / "out.lossmask.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out.lossmask.idx"));
}

}  // namespace
}  // namespace hcp::data
