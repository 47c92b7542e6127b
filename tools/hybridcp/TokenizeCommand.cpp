// `hybridcp tokenize`: text -> token data for `train`. With --tokenizer (a Hugging Face
// tokenizer.json), a Megatron indexed dataset PREFIX.bin + PREFIX.idx, one document per file, per
// line (--lines) or per JSON line of a .jsonl file, each ended by the end-of-document token
// (fine-tuning records, --format chat|prompt-completion or detected: a loss mask beside it);
// without it, the byte-level demo token file (runtime/data/ByteTokenizer.h).
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/data/ByteTokenizer.h"
#include "runtime/data/FineTuning.h"
#include "runtime/data/LossMask.h"
#include "runtime/data/TokenizeFiles.h"
#include "runtime/data/Tokenizer.h"
#include "runtime/support/Format.h"
#include "runtime/support/Paths.h"
#include "runtime/support/Status.h"
#include "tools/hybridcp/Commands.h"

namespace hcp {
namespace {

// The end-of-document tokens of the common tokenizers, in the order they are looked for.
constexpr const char* kEndOfTextNames[] = {"<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "</s>",
                                           "<eos>"};

absl::StatusOr<uint32_t> EndOfDocument(const data::Tokenizer& tokenizer, const Args& args,
                                       std::string& name) {
  if (std::optional<std::string> eos = args.Get("eos")) {
    std::optional<uint32_t> id = tokenizer.TokenId(*eos);
    if (!id) {
      return absl::InvalidArgumentError(
          absl::StrCat("--eos ", *eos, ": the tokenizer has no such token"));
    }
    name = *eos;
    return *id;
  }
  for (const char* candidate : kEndOfTextNames) {
    for (const data::AddedToken& added : tokenizer.added_tokens()) {
      if (added.special && added.content == candidate) {
        name = candidate;
        return added.id;
      }
    }
  }
  return absl::InvalidArgumentError(
      "the tokenizer has none of the usual end-of-text tokens (<|end_of_text|>, <|endoftext|>, "
      "...): name the token that ends each document with --eos TOKEN");
}

// Files of the inputs: a directory's regular files (sorted), a file as given.
std::vector<std::string> ListInputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    absl::StatusOr<std::vector<std::string>> listed = data::ListTextFiles(input);
    if (listed.ok()) {
      files.insert(files.end(), listed->begin(), listed->end());
    } else {
      files.push_back(input);  // a file (the reader says if it cannot be read)
    }
  }
  return files;
}

absl::Status TokenizeWithTokenizer(const Args& args, const std::vector<std::string>& files,
                                   const std::string& output) {
  HCP_ASSIGN_OR_RETURN(data::Tokenizer tokenizer, data::Tokenizer::Load(*args.Get("tokenizer")));
  std::string prefix = output;
  for (const char* extension : {".bin", ".idx"}) {
    if (absl::EndsWith(prefix, extension)) prefix.resize(prefix.size() - 4);
  }
  HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", prefix + ".bin", files));
  HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", prefix + ".idx", files));
  const std::string mask_prefix = data::LossMaskPrefix(prefix);
  HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", mask_prefix + ".bin", files));
  HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", mask_prefix + ".idx", files));

  data::TokenizeOptions options;
  std::string eos_name;
  HCP_ASSIGN_OR_RETURN(options.eos, EndOfDocument(tokenizer, args, eos_name));
  options.lines = args.Has("lines");
  if (std::optional<std::string> field = args.Get("json-field")) options.json_field = *field;
  std::optional<data::DocumentFormat> given;
  if (std::optional<std::string> format = args.Get("format")) {
    HCP_ASSIGN_OR_RETURN(given, data::ParseDocumentFormat(*format));
  }
  HCP_ASSIGN_OR_RETURN(options.format, data::ResolveDocumentFormat(files, given));
  if (options.format == data::DocumentFormat::kChat) {
    HCP_RETURN_IF_ERROR(data::CheckChatTokens(tokenizer, *args.Get("tokenizer")));
  }
  if (options.format != data::DocumentFormat::kText && options.lines) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lines is for text files; a ", std::string(data::DocumentFormatName(*options.format)),
        " .jsonl file has a record per line already"));
  }
  int64_t default_threads = std::max(1u, std::thread::hardware_concurrency());
  HCP_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", default_threads));
  if (threads < 1 || threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", threads, ": give 1 to 1024"));
  }
  options.threads = static_cast<int>(threads);
  options.progress = [](const data::TokenizeProgress& p) {
    std::fprintf(stderr, "tokenize: %s of %s, %s tokens, %.1f MB/s\n", FormatBytes(p.bytes).c_str(),
                 FormatBytes(p.total_bytes).c_str(), FormatCount(p.tokens).c_str(),
                 p.bytes / 1e6 / std::max(p.seconds, 1e-9));
  };
  std::printf("tokenizer %s: %s; end of document %s = %u\n", args.Get("tokenizer")->c_str(),
              tokenizer.Describe().c_str(), eos_name.c_str(), options.eos);
  if (options.format != data::DocumentFormat::kText) {
    std::printf("format %s: the loss counts %s\n",
                std::string(data::DocumentFormatName(*options.format)).c_str(),
                options.format == data::DocumentFormat::kChat
                    ? "the assistant turns (content and <|end_of_text|>)"
                    : "the completion and the end-of-document token");
  }
  HCP_ASSIGN_OR_RETURN(data::TokenizeProgress done,
                       data::TokenizeToIndexedDataset(tokenizer, files, options, prefix));
  std::printf(
      "%s.bin + %s.idx: %s tokens in %s documents from %zu files (%s empty skipped), %s of text "
      "in %.2f s on %d threads: %.1f MB/s\n",
      prefix.c_str(), prefix.c_str(), FormatCount(done.tokens).c_str(),
      FormatCount(done.documents).c_str(), files.size(), FormatCount(done.skipped).c_str(),
      FormatBytes(done.bytes).c_str(), done.seconds, options.threads,
      done.bytes / 1e6 / std::max(done.seconds, 1e-9));
  if (done.masked) {
    std::printf("%s.bin + %s.idx: the loss mask, %s of %s tokens count\n", mask_prefix.c_str(),
                mask_prefix.c_str(), FormatCount(done.counted).c_str(),
                FormatCount(done.tokens).c_str());
  }
  return absl::OkStatus();
}

absl::Status Tokenize(const Args& args) {
  std::optional<std::string> output = args.Get("o");
  if (!output || args.positionals().empty()) {
    return absl::InvalidArgumentError("give text files or directories and -o FILE");
  }
  std::vector<std::string> files = ListInputs(args.positionals());
  if (args.Has("tokenizer")) return TokenizeWithTokenizer(args, files, *output);
  for (const char* option : {"eos", "lines", "json-field", "format", "threads"}) {
    if (args.Has(option)) {
      return absl::InvalidArgumentError(absl::StrCat("--", option, " needs --tokenizer"));
    }
  }
  HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", *output, files));
  HCP_ASSIGN_OR_RETURN(int64_t tokens, data::TokenizeTextFiles(files, *output));
  std::printf("%s: %lld tokens from %zu files (bytes 0-255, BOS %d, EOS %d)\n", output->c_str(),
              static_cast<long long>(tokens), files.size(), data::kByteBos, data::kByteEos);
  return absl::OkStatus();
}

}  // namespace

Command MakeTokenizeCommand() {
  return Command{
      "tokenize",
      "turn text into token data for `train`: a Megatron indexed dataset through a Hugging Face "
      "tokenizer.json, or byte-level tokens",
      "tokenize [--tokenizer tokenizer.json [--lines] [--json-field NAME] "
      "[--format text|chat|prompt-completion] [--eos TOKEN] [--threads N]] TEXT_FILE_OR_DIR... "
      "-o OUT",
      {{"o", "OUT",
        "with --tokenizer, the dataset's prefix (OUT.bin and OUT.idx; a .bin or .idx ending is "
        "dropped); without, the byte-level token file"},
       {"tokenizer", "FILE", "a Hugging Face tokenizer.json (byte-level BPE)"},
       {"lines", "", "a document per line of a text file (default: a document per file)"},
       {"json-field", "NAME", "the field of each .jsonl line that holds its text (default text)"},
       {"format", "FORMAT",
        "text, chat or prompt-completion: what a .jsonl record is, its text field or a "
        "fine-tuning record ({\"messages\": "
        "[...]} or {\"prompt\", \"completion\"}) whose loss mask goes to OUT.lossmask.bin/.idx "
        "(default: detected from the first record)"},
       {"eos", "TOKEN",
        "the token after each document (default: the tokenizer's <|end_of_text|>, "
        "<|endoftext|>, ...)"},
       {"threads", "N", "encoding threads (default: one per core)"}},
      Tokenize,
  };
}

}  // namespace hcp
