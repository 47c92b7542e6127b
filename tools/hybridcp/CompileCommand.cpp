// `hybridcp compile`: config -> model IR (and, as the pipeline grows, the per-rank plan).
#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_format.h"
#include "compiler/Registration.h"
#include "compiler/cost/ModelCost.h"
#include "compiler/import/ModelImporter.h"
#include "compiler/pipeline/TrainingPipeline.h"
#include "compiler/plan/PlanWriter.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "runtime/plan/CudaRules.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Paths.h"
#include "runtime/support/Status.h"
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
  options.documents = args.Has("documents");
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

std::string Print(mlir::ModuleOp module) {
  std::string text;
  llvm::raw_string_ostream stream(text);
  module.print(stream);
  return text;
}

// The value of --NAME, one of the names `symbolize` knows (`fallback` when not given).
template <typename Enum>
absl::StatusOr<Enum> ReadEnum(const Args& args, const std::string& name, Enum fallback,
                              std::optional<Enum> (*symbolize)(llvm::StringRef),
                              std::string_view expected) {
  std::optional<std::string> value = args.Get(name);
  if (!value) return fallback;
  if (std::optional<Enum> parsed = symbolize(*value)) return *parsed;
  return absl::InvalidArgumentError(
      absl::StrFormat("--%s must be %s, got '%s'", name, expected, *value));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status Compile(const Args& args) {
  auto start = std::chrono::steady_clock::now();
  HCP_ASSIGN_OR_RETURN(GraniteConfig config, ResolveModelConfig(args));
  HCP_ASSIGN_OR_RETURN(ImportOptions options, ReadImportOptions(args));
  std::optional<double> aux;
  if (args.Has("router-aux-loss")) {
    HCP_ASSIGN_OR_RETURN(aux, args.GetDouble("router-aux-loss", 0));
  }
  HCP_ASSIGN_OR_RETURN(options.router_aux_loss, RouterAuxLossCoefficient(config, aux));
  HCP_ASSIGN_OR_RETURN(int64_t cp, args.GetInt("cp", 1));
  if (cp < 1) return absl::InvalidArgumentError("--cp must be at least 1");
  HCP_ASSIGN_OR_RETURN(int64_t dp, args.GetInt("dp", 1));
  if (dp < 1) return absl::InvalidArgumentError("--dp must be at least 1");
  HCP_ASSIGN_OR_RETURN(int64_t ep, args.GetInt("ep", 1));
  if (ep < 1) return absl::InvalidArgumentError("--ep must be at least 1");
  if ((cp * dp) % ep != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--ep %d does not divide the cp*dp = %d ranks: an ep group is ep consecutive ranks", ep,
        cp * dp));
  }
  if (ep > 1 && !config.has_experts()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--ep %d splits the experts of a mixture-of-experts model, but %s has none (it is "
        "dense): leave --ep at 1",
        ep, config.source));
  }
  if (ep > 1 && config.num_experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d experts cannot be split over ep=%d ranks", config.num_experts, ep));
  }
  TrainingPipelineOptions pipeline;
  pipeline.cp = cp;
  pipeline.dp = dp;
  pipeline.ep = ep;
  HCP_ASSIGN_OR_RETURN(pipeline.layout,
                       ReadEnum(args, "layout", dist::LayoutKind::Contiguous,
                                dist::symbolizeLayoutKind, "contiguous or zigzag"));
  HCP_ASSIGN_OR_RETURN(pipeline.stateScan,
                       ReadEnum(args, "state-scan", StateScanChoice::Auto, symbolizeStateScanChoice,
                                "allgather, chain or auto"));
  HCP_ASSIGN_OR_RETURN(pipeline.incomingState,
                       ReadEnum(args, "incoming-state", IncomingState::Correct,
                                symbolizeIncomingState, "correct or rescan"));
  pipeline.recompute = args.Has("recompute");
  pipeline.fuseConvSilu = args.Has("fuse-conv-silu");
  pipeline.recomputeExpertH = args.Has("recompute-expert-h");
  pipeline.recomputeSsdStates = args.Has("recompute-ssd-states");
  pipeline.recomputeAttention = args.Has("recompute-attention");
  if (pipeline.recomputeAttention && !pipeline.recompute) {
    return absl::InvalidArgumentError(
        "--recompute-attention chooses what --recompute recomputes: add --recompute");
  }
  std::optional<std::string> emit = args.Get("emit");
  std::optional<std::string> output = args.Get("o");
  if (emit && *emit != "model" && *emit != "dist" && *emit != "exec") {
    return absl::InvalidArgumentError("--emit must be model, dist or exec, got '" + *emit + "'");
  }
  if (!emit && !output) {
    return absl::InvalidArgumentError(
        "nothing to do: give -o FILE.plan, or --emit=model|dist|exec to print IR");
  }
  if (output && *output != "-" && !config.file.empty()) {
    HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", *output, {config.file}));
  }

  mlir::DialectRegistry registry;
  registerHybridcpDialects(registry);
  mlir::MLIRContext context(registry);
  HCP_ASSIGN_OR_RETURN(mlir::OwningOpRef<mlir::ModuleOp> module,
                       ImportModel(context, config, options));
  if (emit && *emit == "model") return WriteText(Print(*module), output);

  mlir::PassManager pm(&context);
  if (emit && *emit == "dist") {
    buildContextParallelPipeline(pm, pipeline);
  } else {
    buildTrainingPipeline(pm, pipeline);
  }
  if (mlir::failed(pm.run(*module))) {
    return absl::InternalError("compilation failed (the diagnostics above say where)");
  }
  if (emit) return WriteText(Print(*module), output);

  PlanInfo info;
  info.model = config.source;
  info.model_config = config.text;
  info.seq = options.seq;
  info.micro_batch = options.micro_batch;
  info.router_aux_loss = options.router_aux_loss;
  info.flops_per_step =
      TrainingFlopsPerToken(config, options.seq) * options.seq * options.micro_batch;
  HCP_ASSIGN_OR_RETURN(std::string bytes, WritePlan(*module, info));
  // Only the CUDA backend runs bf16 plans: one whose shapes its kernels do not take is no use.
  if (options.dtype == ActivationType::kBF16) {
    HCP_ASSIGN_OR_RETURN(plan::Plan plan, plan::ParsePlan(bytes, *output));
    if (absl::Status runs = cuda_backend::CheckPlanRunsOnCuda(plan); !runs.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s with --dtype bf16: the CUDA kernels cannot run it (%s); bf16 plans run only on "
          "the CUDA backend: change the model, or compile without --dtype bf16 for the CPU "
          "backend",
          config.source, runs.message()));
    }
  }
  HCP_RETURN_IF_ERROR(WriteFileAtomically(*output, bytes));
  std::string aux_note =
      options.router_aux_loss > 0
          ? absl::StrFormat(", the load-balancing loss x %g", options.router_aux_loss)
          : "";
  if (options.documents) aux_note += ", packed documents";
  std::fprintf(stderr, "wrote %s: %s, micro-batch %lld x seq %lld%s, %.1f MiB, in %.2f s\n",
               output->c_str(), config.source.c_str(), static_cast<long long>(options.micro_batch),
               static_cast<long long>(options.seq), aux_note.c_str(), bytes.size() / 1048576.0,
               SecondsSince(start));
  return absl::OkStatus();
}

}  // namespace

Command MakeCompileCommand() {
  return Command{
      "compile",
      "compile a model config into a training-step plan (or print its IR)",
      "compile (CONFIG.json | CHECKPOINT_DIR | --model NAME) --seq N [--micro-batch N] [--dtype "
      "f32|bf16] "
      "[--cp N --layout contiguous|zigzag --state-scan allgather|chain|auto "
      "--incoming-state correct|rescan] [--dp N] [--ep N] "
      "[--recompute [--recompute-attention]] [--fuse-conv-silu] [--recompute-expert-h] "
      "[--recompute-ssd-states] "
      "[--router-aux-loss COEF] "
      "[--documents] "
      "(-o FILE.plan | "
      "--emit=model|dist|exec [-o FILE])",
      {kModelOption,
       {"seq", "N", "tokens per sequence (required)"},
       {"micro-batch", "N", "sequences per micro-batch (default 1)"},
       {"dtype", "TYPE", "activation and parameter dtype: f32 (default) or bf16"},
       {"cp", "N", "context-parallel ranks the sequence is split over (default 1)"},
       {"dp", "N",
        "data-parallel groups of cp ranks, each on its own micro-batch (default 1); the plan "
        "runs on cp*dp ranks"},
       {"ep", "N",
        "expert-parallel ranks: every ep consecutive ranks split each MoE layer's experts "
        "(divides cp*dp and the experts; default 1)"},
       {"layout", "KIND", "contiguous (default) or zigzag (2*cp pieces, balanced attention)"},
       {"state-scan", "HOW", "Mamba state passing: allgather, chain or auto (default)"},
       {"incoming-state", "HOW",
        "how a split Mamba scan's outputs get the incoming state: correct (default: scan once "
        "from zero, add the state's outputs) or rescan (a state-only summary, then the scan "
        "from the state)"},
       {"recompute", "",
        "keep only each layer's inputs from the forward and recompute the rest in the backward "
        "(lower peak memory, about one more forward); attention's output is kept (a few bytes "
        "a token) rather than recomputed"},
       {"recompute-attention", "",
        "with --recompute: recompute attention's output as well (one more attention forward "
        "per layer, 2 * heads * head_dim + 4 * heads bytes a token and attention layer less)"},
       {"fuse-conv-silu", "",
        "fold the SiLU after each Mamba conv into the conv's kernels: the conv output is not "
        "kept for the backward (tiny: 1.8 GiB less per 8192 tokens without --recompute), the "
        "backward recomputes it (on an H200 about 1% slower today); the same results"},
       {"recompute-expert-h", "",
        "recompute the MoE experts' first product (W_in x, per token and expert) in the "
        "backward instead of keeping it from the forward: k * 2 * moe_inner values per token "
        "and MoE layer less (tiny: 100 MiB per layer per 8192 tokens), one more expert GEMM"},
       {"recompute-ssd-states", "",
        "recompute the states entering each chunk of the Mamba scans in the backward instead of "
        "keeping them from the forward: heads * head_dim * state f32 values per 256 tokens and "
        "Mamba layer less (tiny: 48 MiB per layer per 8192 tokens)"},
       {"router-aux-loss", "COEF",
        "add the MoE load-balancing loss (transformers' load_balancing_loss_func over every MoE "
        "layer's routing of a micro-batch) times COEF to the objective; 0 turns it off. Default: "
        "the config's router_aux_loss_coef when its output_router_logits is true, else off"},
       {"documents", "",
        "packed documents: the step also takes position_ids (each token's position in its "
        "document, Hugging Face's padding-free convention; every row starts a document), and "
        "no layer reads across a document start, under every split"},
       {"emit", "STAGE",
        "print IR instead: model (imported), dist (per-rank forward), exec (lowered)"},
       {"o", "FILE", "the plan file to write (or where --emit writes; default stdout)"}},
      Compile,
  };
}

}  // namespace hcp
