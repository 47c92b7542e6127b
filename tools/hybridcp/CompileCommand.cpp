// `hybridcp compile`: config -> model IR (and, as the pipeline grows, the per-rank plan).
#include <fstream>

#include "absl/strings/str_format.h"
#include "compiler/Registration.h"
#include "compiler/import/ModelImporter.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "tools/hybridcp/Commands.h"

namespace hcp {
namespace {

absl::StatusOr<ImportOptions> ReadImportOptions(const Args& args) {
  ImportOptions options;
  absl::StatusOr<int64_t> seq = args.GetInt("seq", std::nullopt);
  if (!seq.ok()) return seq.status();
  absl::StatusOr<int64_t> micro_batch = args.GetInt("micro-batch", 1);
  if (!micro_batch.ok()) return micro_batch.status();
  options.seq = *seq;
  options.micro_batch = *micro_batch;
  std::string dtype = args.Get("dtype").value_or("f32");
  if (dtype == "f32") {
    options.dtype = ActivationType::kF32;
  } else if (dtype == "bf16") {
    options.dtype = ActivationType::kBF16;
  } else {
    return absl::InvalidArgumentError("--dtype must be f32 or bf16, got '" + dtype + "'");
  }
  return options;
}

absl::Status WriteText(const std::string& text, const std::optional<std::string>& path) {
  if (!path || *path == "-") {
    llvm::outs() << text;
    return absl::OkStatus();
  }
  std::ofstream out(*path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrFormat("%s: cannot write the output file", *path));
  return absl::OkStatus();
}

absl::Status Compile(const Args& args) {
  absl::StatusOr<GraniteConfig> config = ResolveModelConfig(args);
  if (!config.ok()) return config.status();
  absl::StatusOr<ImportOptions> options = ReadImportOptions(args);
  if (!options.ok()) return options.status();
  std::string emit = args.Get("emit").value_or("model");
  if (emit != "model") {
    return absl::UnimplementedError(
        absl::StrFormat("--emit=%s is not available yet; this build emits --emit=model", emit));
  }

  mlir::DialectRegistry registry;
  registerHybridcpDialects(registry);
  mlir::MLIRContext context(registry);
  auto module = ImportModel(context, *config, *options);
  if (!module.ok()) return module.status();
  std::string text;
  llvm::raw_string_ostream stream(text);
  (*module)->print(stream);
  return WriteText(text, args.Get("o"));
}

}  // namespace

Command MakeCompileCommand() {
  return Command{
      "compile",
      "compile a model config into IR or a plan",
      "compile (CONFIG.json | --model NAME) --seq N [--micro-batch N] [--dtype f32|bf16] "
      "[--emit=model] [-o FILE]",
      {kModelOption,
       {"seq", "N", "tokens per sequence (required)"},
       {"micro-batch", "N", "sequences per micro-batch (default 1)"},
       {"dtype", "TYPE", "activation and parameter dtype: f32 (default) or bf16"},
       {"emit", "STAGE", "print the IR at this stage: model"},
       {"o", "FILE", "write the output here instead of stdout"}},
      Compile,
  };
}

}  // namespace hcp
