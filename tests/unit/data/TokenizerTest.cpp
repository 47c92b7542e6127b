// The tokenizer against Hugging Face's tokenizers: the goldens in tests/fixtures/tokenizer (made
// by tests/fixtures/make_tokenizer_fixtures.py with tokenizers 0.23) hold, for tokenizers of both
// pre-tokenizer styles and every Split behaviour, the ids HF gives for texts with Unicode letters
// and digits, CJK, emoji with joiners, whitespace runs, CRLF, upper-case contractions, numbers,
// special tokens in running text and standard-library sources it was not trained on. Every id
// must be equal; so must the decoded text. Then what is refused, and corrupted files.
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/data/ByteLevel.h"
#include "runtime/data/Tokenizer.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;

const std::string kFixtures = std::string(HYBRIDCP_SOURCE_DIR) + "/tests/fixtures/tokenizer/";

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Golden {
  std::string name;
  std::string tokenizer_json;
  nlohmann::json cases;
};

// The golden and the tokenizer it was made with (for a split variant: the base tokenizer with the
// golden's pre_tokenizer in place of its own).
Golden ReadGolden(const std::string& name) {
  nlohmann::json golden = nlohmann::json::parse(ReadText(kFixtures + "goldens/" + name + ".json"));
  Golden out{name, "", golden["cases"]};
  if (golden.contains("base")) {
    nlohmann::json base =
        nlohmann::json::parse(ReadText(kFixtures + golden["base"].get<std::string>()));
    base["pre_tokenizer"] = golden["pre_tokenizer"];
    out.tokenizer_json = base.dump();
  } else {
    out.tokenizer_json = ReadText(kFixtures + golden["tokenizer"].get<std::string>());
  }
  return out;
}

std::string Shown(const std::string& text) { return nlohmann::json(text).dump().substr(0, 80); }

void ExpectMatchesGolden(const std::string& name) {
  Golden golden = ReadGolden(name);
  ASSERT_GT(golden.cases.size(), 50u) << name;
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(golden.tokenizer_json, name);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  Encoder encoder(*tokenizer);
  // Twice through one encoder: the second pass reads the word cache.
  for (int pass = 0; pass < 2; ++pass) {
    for (const nlohmann::json& c : golden.cases) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<uint32_t> expected = c["ids"].get<std::vector<uint32_t>>();
      std::vector<uint32_t> ids;
      ASSERT_TRUE(encoder.Encode(text, ids).ok()) << name << " " << Shown(text);
      size_t first = 0;
      while (first < ids.size() && first < expected.size() && ids[first] == expected[first])
        ++first;
      EXPECT_EQ(ids, expected) << name << " " << Shown(text) << ": first difference at id "
                               << first;

      std::string decoded = c.value("decoded", text);
      std::string skipped = c.value("decoded_skip_special", decoded);
      absl::StatusOr<std::string> back = tokenizer->Decode(expected);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, decoded) << name << " " << Shown(text);
      absl::StatusOr<std::string> back_skipped = tokenizer->Decode(expected, /*skip_special=*/true);
      ASSERT_TRUE(back_skipped.ok()) << back_skipped.status();
      EXPECT_EQ(*back_skipped, skipped) << name << " " << Shown(text);
    }
  }
}

// Granite 4.0's style: a Split on the cl100k-style expression, ByteLevel without its own,
// ignore_merges, role tokens.
TEST(Tokenizer, GraniteStyleMatchesHuggingFace) { ExpectMatchesGolden("granite-style"); }
// GPT-2's style: ByteLevel with its own expression.
TEST(Tokenizer, Gpt2StyleMatchesHuggingFace) { ExpectMatchesGolden("gpt2-style"); }
// add_prefix_space, merges as "a b" strings, an lstrip special token, a normalized added token.
TEST(Tokenizer, LegacyStyleMatchesHuggingFace) { ExpectMatchesGolden("legacy-style"); }

TEST(Tokenizer, EverySplitBehaviorMatchesHuggingFace) {
  for (const char* behavior :
       {"removed", "isolated", "mergedwithprevious", "mergedwithnext", "contiguous"}) {
    ExpectMatchesGolden(std::string("split-") + behavior);
    ExpectMatchesGolden(std::string("split-") + behavior + "-invert");
  }
  ExpectMatchesGolden("split-string");
}

TEST(Tokenizer, DescribesItselfAndFindsTokens) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(kFixtures + "granite-style.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->vocab_size(), 1500);
  nlohmann::json config = nlohmann::json::parse(ReadText(kFixtures + "granite-style.json"));
  ASSERT_EQ(config["model"]["merges"].size(), 1240u);
  EXPECT_EQ(tokenizer->Describe(), "byte-level BPE, 1,500 ids (1,240 merges), 4 added tokens");
  EXPECT_EQ(tokenizer->TokenId("<|end_of_text|>"), 0u);
  EXPECT_EQ(tokenizer->TokenId("<|end_of_role|>"), 2u);
  EXPECT_FALSE(tokenizer->TokenId("<|no such token|>").has_value());
}

TEST(Tokenizer, RefusesTextThatIsNotUtf8AndIdsItDoesNotHave) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(kFixtures + "granite-style.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  Encoder encoder(*tokenizer);
  std::vector<uint32_t> ids = {7};
  EXPECT_TRUE(FailsWith(encoder.Encode("ok \xC3(", ids), "not valid UTF-8 at byte 3"));
  EXPECT_EQ(ids, std::vector<uint32_t>{7});  // nothing appended
  EXPECT_TRUE(FailsWith(encoder.Encode("\xED\xA0\x80", ids), "not valid UTF-8 at byte 0"));
  EXPECT_TRUE(FailsWith(tokenizer->Decode(std::vector<uint32_t>{5, 1500}).status(),
                        "id 1500 (at 1) is not in the tokenizer's vocabulary"));
}

TEST(ByteLevel, EveryByteHasItsOwnCharacterAndComesBack) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string encoded = ByteLevelEncode(all);
  EXPECT_EQ(ByteLevelChars()[' '], "\xC4\xA0");  // U+0120
  EXPECT_EQ(ByteLevelChars()['A'], "A");
  EXPECT_EQ(ByteLevelDecode(encoded), all);
  // A token with a character outside the alphabet is its own bytes (an added token's space).
  EXPECT_EQ(ByteLevelDecode("hello world"), "hello world");
}

// tokenizer.json with one field replaced (a JSON pointer) by `value`.
std::string WithField(const std::string& pointer, const nlohmann::json& value) {
  nlohmann::json config = nlohmann::json::parse(ReadText(kFixtures + "granite-style.json"));
  config[nlohmann::json::json_pointer(pointer)] = value;
  return config.dump();
}

TEST(Tokenizer, RefusesWhatItDoesNotImplementByName) {
  auto refused = [](const std::string& json, const std::string& message) {
    return FailsWith(Tokenizer::FromJson(json, "t.json").status(), message);
  };
  EXPECT_TRUE(refused(WithField("/model/type", "Unigram"),
                      "t.json: model type Unigram is not supported (hybridcp reads byte-level BPE "
                      "tokenizers only)"));
  EXPECT_TRUE(refused(WithField("/model/type", "WordPiece"), "model type WordPiece"));
  EXPECT_TRUE(refused(WithField("/normalizer", {{"type", "NFC"}}),
                      "t.json: normalizer NFC is not supported"));
  EXPECT_TRUE(refused(WithField("/decoder", {{"type", "WordPiece"}}), "decoder WordPiece"));
  EXPECT_TRUE(refused(WithField("/model/dropout", 0.1), "BPE with dropout 0.1 is not supported"));
  EXPECT_TRUE(refused(WithField("/model/byte_fallback", true), "BPE with byte_fallback true"));
  EXPECT_TRUE(refused(WithField("/pre_tokenizer", {{"type", "Whitespace"}}),
                      "pre-tokenizer Whitespace is not supported"));
  EXPECT_TRUE(refused(WithField("/pre_tokenizer/pretokenizers/0/type", "Metaspace"),
                      "t.json: pre_tokenizer step 0: pre-tokenizer Metaspace"));
  EXPECT_TRUE(
      refused(WithField("/pre_tokenizer/pretokenizers/1/type", "Split"), "Split needs a pattern"));
  EXPECT_TRUE(refused(WithField("/pre_tokenizer/pretokenizers/0/behavior", "Sideways"),
                      "behavior \"Sideways\" is not one of"));
  EXPECT_TRUE(refused(WithField("/pre_tokenizer/pretokenizers/0/pattern/Regex", "(a"),
                      "does not compile at offset 2"));
  EXPECT_TRUE(refused(WithField("/pre_tokenizer", nullptr), "no pre_tokenizer"));
  EXPECT_TRUE(refused(WithField("/added_tokens/1/single_word", true),
                      "added_tokens[1] (<|start_of_role|>): single_word added tokens are not "
                      "supported"));
  EXPECT_TRUE(refused(WithField("/added_tokens/1/id", 0), "added_tokens[1] repeats id 0"));
  EXPECT_TRUE(refused(WithField("/model/merges/0", "Ġ"), "merge 0 \"Ġ\" is not two tokens"));
  EXPECT_TRUE(refused(WithField("/model/merges/0", {"Ġ", "nope"}), "\"nope\" is not in the vocab"));
  EXPECT_TRUE(refused(WithField("/model/vocab/x", 5), "id 5 is both"));
  EXPECT_TRUE(refused("{\"model\": ", "t.json: not valid JSON"));
  EXPECT_TRUE(refused("[1, 2]", "not a Hugging Face tokenizer.json"));
  EXPECT_TRUE(FailsWith(Tokenizer::Load("/no/such/tokenizer.json").status(),
                        "/no/such/tokenizer.json: cannot open the tokenizer file"));
}

// Random damage to a real tokenizer.json: each copy loads or is refused with a message, and a
// loaded one encodes (the sanitizer build checks the memory of both).
TEST(Tokenizer, CorruptedFilesLoadOrAreRefusedNeverCrash) {
  const std::string good = ReadText(kFixtures + "granite-style.json");
  std::mt19937 random(7);
  int loaded = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bad = good;
    int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = random() % bad.size();
      switch (random() % 3) {
        case 0:
          bad[at] = static_cast<char>(random() % 256);
          break;
        case 1:
          bad.erase(at, 1 + random() % 16);
          break;
        default:
          bad.resize(at);
          break;
      }
    }
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(bad, "bad.json");
    if (!tokenizer.ok()) {
      EXPECT_FALSE(tokenizer.status().message().empty());
      continue;
    }
    ++loaded;
    absl::StatusOr<std::vector<uint32_t>> ids =
        tokenizer->Encode("Hello<|end_of_text|> wörld 123 \r\n  x");
    if (ids.ok()) {
      for (uint32_t id : *ids) EXPECT_LT(id, tokenizer->vocab_size());
    }
  }
  EXPECT_LT(loaded, 300);
}

}  // namespace
}  // namespace hcp::data
