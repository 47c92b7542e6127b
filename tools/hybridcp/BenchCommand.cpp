// `hybridcp bench`: runs a bf16 plan on one GPU, or on cp x dp GPUs (one process each, started
// by mpirun, NCCL between them), and reports what a user plans a cluster with: tokens/s/GPU for
// forward + backward (with the gradients' all-reduce over the ranks) and for a full step with the
// optimizer, MFU, peak GPU memory and where the time goes, per kernel kind. An f32 plan runs on
// CPU ranks the same way (forward + backward, tokens/s per rank: the reference's speed). With
// --data it trains on real tokens (an indexed dataset, a token file or a raw one: DataSource.h;
// the loss should go down); otherwise the tokens are random.
// Rank 0 reports.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/World.h"
#include "runtime/data/DataSource.h"
#include "runtime/data/TokenData.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/RankExecutor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"
#include "runtime/train/AdamW.h"
#include "runtime/train/Optimizer.h"
#include "runtime/train/TrainLoop.h"
#include "tools/hybridcp/Commands.h"
#include "tools/hybridcp/Ranks.h"
#ifdef HYBRIDCP_HAVE_CUDA
#include "runtime/exec/CudaExecutor.h"
#endif

namespace hcp {
namespace {

// H200 (and H100 SXM) dense bf16 tensor-core peak, the MFU denominator of anchors.md.
constexpr double kPeakFlops = 989e12;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct BenchOptions {
  std::string plan_path;
  std::string data_path;                       // empty: random tokens
  std::optional<data::TokenDType> data_dtype;  // a raw --data file's tokens
  int64_t steps = 10;
  int64_t warmup = 2;
  bool optimizer = false;
  bool shard_optimizer = false;
  bool profile = false;
  double lr = 3e-4;
  int64_t seed = 0;
  int device = 0;
  int64_t document_length = 0;  // packed documents of this many tokens; 0: one per row
};

absl::StatusOr<BenchOptions> ParseBenchOptions(const Args& args) {
  BenchOptions o;
  if (args.positionals().size() != 1) {
    return absl::InvalidArgumentError(
        "bench takes one plan file (bf16: runs on GPUs; f32: on CPU ranks)");
  }
  o.plan_path = args.positionals()[0];
  o.data_path = args.Get("data").value_or("");
  if (std::optional<std::string> dtype = args.Get("data-dtype")) {
    absl::StatusOr<data::TokenDType> parsed = data::ParseTokenDType(*dtype);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--data-dtype: ", parsed.status().message()));
    }
    if (o.data_path.empty()) {
      return absl::InvalidArgumentError("--data-dtype says what --data holds: add --data");
    }
    o.data_dtype = *parsed;
  }
  HCP_ASSIGN_OR_RETURN(o.steps, args.GetInt("steps", o.steps));
  HCP_ASSIGN_OR_RETURN(o.warmup, args.GetInt("warmup", o.warmup));
  HCP_ASSIGN_OR_RETURN(o.lr, args.GetDouble("lr", o.lr));
  HCP_ASSIGN_OR_RETURN(o.seed, args.GetInt("seed", o.seed));
  HCP_ASSIGN_OR_RETURN(int64_t device, args.GetInt("device", 0));
  o.device = static_cast<int>(device);
  o.optimizer = args.Has("optimizer");
  o.shard_optimizer = args.Has("shard-optimizer");
  if (o.shard_optimizer && !o.optimizer) {
    return absl::InvalidArgumentError("--shard-optimizer shards the optimizer: add --optimizer");
  }
  o.profile = args.Has("profile");
  HCP_ASSIGN_OR_RETURN(o.document_length, args.GetInt("document-length", 0));
  if (o.document_length < 0) {
    return absl::InvalidArgumentError("--document-length must not be negative");
  }
  if (o.steps < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("--steps must be at least 1 and --warmup at least 0");
  }
  return o;
}

// The micro-batches the bench feeds: from --data (consecutive steps of the batching rule) or
// uniformly random ids (a fixed seed).
class Batches {
 public:
  // Ranks of one cp group get the same micro-batches; each dp index its own.
  static absl::StatusOr<Batches> Create(const BenchOptions& o, const plan::Plan& plan,
                                        int64_t vocab, int dp_index) {
    Batches b;
    b.tokens_ = plan.tokens();
    b.vocab_ = vocab;
    b.dp_index_ = dp_index;
    b.rng_.seed(12345 + dp_index);
    if (o.data_path.empty()) return b;
    HCP_ASSIGN_OR_RETURN(data::DataSource source,
                         data::DataSource::Open(o.data_path, o.data_dtype));
    // Every rank checks: the bench's ranks fail alike on the same file without agreeing.
    HCP_RETURN_IF_ERROR(source.CheckVocab(vocab));
    b.source_ = std::make_unique<data::DataSource>(std::move(source));
    data::BatchConfig config{.seq = plan.seq, .micro_batch = plan.micro_batch, .vocab = vocab};
    HCP_ASSIGN_OR_RETURN(
        data::TokenBatcher batcher,
        data::TokenBatcher::Create(b.source_->tokens(), config, b.source_->loss_mask()));
    b.batcher_ = std::make_unique<data::TokenBatcher>(std::move(batcher));
    return b;
  }

  std::string Describe() const {
    return source_ == nullptr ? "random tokens" : source_->Describe();
  }

  absl::Status Next(std::vector<int32_t>& ids, std::vector<int32_t>& targets) {
    ids.resize(tokens_);
    targets.resize(tokens_);
    if (batcher_ == nullptr) {
      std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab_ - 1));
      for (int32_t& id : ids) id = token(rng_);
      for (int32_t& t : targets) t = token(rng_);
      return absl::OkStatus();
    }
    HCP_ASSIGN_OR_RETURN(data::StepBatch step, batcher_->NextStep(dp_index_));
    ids = std::move(step.inputs);
    targets = std::move(step.targets);
    return absl::OkStatus();
  }

 private:
  int64_t tokens_ = 0, vocab_ = 0;
  int dp_index_ = 0;
  std::mt19937 rng_;
  std::unique_ptr<data::DataSource> source_;
  std::unique_ptr<data::TokenBatcher> batcher_;
};

// A plan that packs documents: --document-length's documents in every row (the last one
// shorter), or one document per row (SetInputs's default).
absl::Status SetBenchPositions(Executor& exec, const BenchOptions& o) {
  const plan::Plan& plan = exec.plan();
  if (!plan.position_ids) {
    if (o.document_length == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--document-length packs documents: compile the plan with --documents");
  }
  if (o.document_length == 0) return absl::OkStatus();
  std::vector<int32_t> positions(plan.tokens());
  for (int64_t i = 0; i < plan.tokens(); ++i) {
    positions[i] = static_cast<int32_t>((i % plan.seq) % o.document_length);
  }
  return exec.SetPositions(positions);
}

void PrintBreakdown(const std::vector<double>& ms_per_kernel) {
  std::vector<std::pair<double, int>> rows;
  double total = 0;
  for (size_t k = 0; k < ms_per_kernel.size(); ++k) {
    if (ms_per_kernel[k] > 0) rows.push_back({ms_per_kernel[k], static_cast<int>(k)});
    total += ms_per_kernel[k];
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("time per kernel kind (one profiled step, %.1f ms in kernels):\n", total);
  for (const auto& [ms, kernel] : rows) {
    std::printf("  %-24s %9.2f ms  %5.1f%%\n",
                std::string(plan::KernelName(static_cast<plan::KernelId>(kernel))).c_str(), ms,
                100.0 * ms / total);
  }
}

// What only the GPUs measure: the time per kernel launch. Refused for a plan that runs on the
// CPU.
absl::Status CheckGpuOnlyOptions(const BenchOptions& o, const RankExecutor& rank) {
  if (rank.on_gpu() || !o.profile) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--profile times the GPUs' kernels: this plan is f32 and runs on the CPU (compile it with "
      "--dtype bf16 for GPUs)");
}

// One AdamW update from the summed gradients, by the trainer's policy (DecideStep: clipped to the
// default max norm, skipped when the loss or the norm is not finite). Returns its seconds, and
// those of the gradient norm alone.
struct OptimizerSeconds {
  double total = 0;
  double norm = 0;
};
absl::StatusOr<OptimizerSeconds> OptimizerStep(Executor& exec, train::Optimizer& optimizer,
                                               double lr, double loss) {
  const auto start = std::chrono::steady_clock::now();
  HCP_ASSIGN_OR_RETURN(double squared_norm, exec.GradientSquaredNorm());
  OptimizerSeconds seconds;
  seconds.norm = Seconds(start);
  const train::StepDecision decision =
      train::DecideStep(loss, std::sqrt(squared_norm), train::AdamWConfig{}.max_grad_norm);
  if (decision.applied()) HCP_RETURN_IF_ERROR(optimizer.Update(lr, decision.clip_coef));
  seconds.total = Seconds(start);
  return seconds;
}

#ifdef HYBRIDCP_HAVE_CUDA
void PrintGpuMemory(const CudaExecutor& exec) {
  const CudaExecutor::Memory memory = exec.MemoryUse();
  std::printf("GPU memory: %.2f GiB peak of %.2f GiB (%.0f%%)\n", memory.peak_bytes / 1073741824.0,
              memory.device_bytes / 1073741824.0, 100.0 * memory.peak_bytes / memory.device_bytes);
}

absl::Status Profile(CudaExecutor& exec, Batches& batches, const BenchOptions& o,
                     bool several_ranks) {
  std::vector<int32_t> ids, targets;
  HCP_RETURN_IF_ERROR(batches.Next(ids, targets));
  HCP_RETURN_IF_ERROR(exec.SetInputs(ids, targets));
  HCP_RETURN_IF_ERROR(SetBenchPositions(exec, o));
  std::vector<double> ms_per_kernel;
  double sums_after_ms = 0;
  HCP_RETURN_IF_ERROR(exec.RunStepProfiled(&ms_per_kernel, &sums_after_ms));
  PrintBreakdown(ms_per_kernel);
  if (several_ranks) {
    std::printf("the gradient sums over the ranks ran on %.2f ms after the last kernel\n",
                sums_after_ms);
    std::printf(
        "halo_exchange and state_scan run beside the compute stream: their times are the "
        "compute stream's waits for them\n");
  }
  return absl::OkStatus();
}
#endif

absl::Status RunBench(const Args& args) {
  HCP_ASSIGN_OR_RETURN(BenchOptions o, ParseBenchOptions(args));
  HCP_ASSIGN_OR_RETURN(World world, JoinRanks("bench", args));
  comm::Communicator& ranks = world.comm();
  // Every rank loads the plan; all must have the same one, and as many ranks as it was compiled
  // for (the same error on every rank otherwise).
  plan::RankPlan mine = plan::LoadPlanForRank(o.plan_path);
  if (ranks.world_size() > 1) {
    HCP_RETURN_IF_ERROR(comm::CheckRanksAgree(ranks, mine.plan, mine.hash));
  }
  HCP_RETURN_IF_ERROR(mine.plan.status());
  const plan::Plan& plan = *mine.plan;
  if (ranks.world_size() != plan.mesh.world()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan was compiled for cp=%d x dp=%d = %d ranks: run it with mpirun -np %d",
        plan.mesh.cp, plan.mesh.dp, plan.mesh.world(), plan.mesh.world()));
  }
  ExecutorOptions executor_options{
      .device = o.device, .optimizer_state = o.optimizer, .shard_optimizer = o.shard_optimizer};
  HCP_ASSIGN_OR_RETURN(RankExecutor rank, RankExecutor::Create(plan, ranks, executor_options));
  HCP_RETURN_IF_ERROR(CheckGpuOnlyOptions(o, rank));
  // Rank 0 reports; the others would print the same lines.
  if (ranks.world_size() > 1 && !world.is_root() &&
      std::freopen("/dev/null", "w", stdout) == nullptr) {
    return absl::InternalError("cannot silence the output of ranks other than 0");
  }
  HCP_ASSIGN_OR_RETURN(int64_t vocab, train::VocabularyOf(plan));
  HCP_ASSIGN_OR_RETURN(Batches batches, Batches::Create(o, plan, vocab, ranks.dp_index()));

  std::printf("plan: %s (%s), micro-batch %lld x seq %lld, %zu steps\n", o.plan_path.c_str(),
              plan.model.c_str(), static_cast<long long>(plan.micro_batch),
              static_cast<long long>(plan.seq), plan.steps.size());
  std::printf("data: %s\n", batches.Describe().c_str());
  std::printf("ranks: %lld (cp=%lld x dp=%lld, %s layout, experts split over ep=%lld) on %s\n",
              static_cast<long long>(plan.mesh.world()), static_cast<long long>(plan.mesh.cp),
              static_cast<long long>(plan.mesh.dp),
              plan.mesh.layout == plan::SequenceLayout::Zigzag ? "zigzag" : "contiguous",
              static_cast<long long>(plan.mesh.ep), rank.where().c_str());
  std::fflush(stdout);

  Executor& exec = rank.executor();
  const auto init_start = std::chrono::steady_clock::now();
  HCP_RETURN_IF_ERROR(exec.InitializeParameters(static_cast<uint64_t>(o.seed)));
  // A large model's random start takes a while on the host: say how long, apart from the steps.
  std::printf("parameters: initialised in %.1f s\n", Seconds(init_start));
  std::fflush(stdout);
  std::unique_ptr<train::Optimizer> optimizer;
  if (o.optimizer) {
    HCP_ASSIGN_OR_RETURN(optimizer,
                         train::CreateOptimizer(rank, train::AdamWConfig{}, o.shard_optimizer));
    HCP_RETURN_IF_ERROR(optimizer->Start());
  }

  // Tokens per rank per step: a cp group shares one micro-batch; each dp index has its own.
  const int64_t tokens = plan.local_tokens();
  std::vector<int32_t> ids, targets;
  double fwd_bwd_seconds = 0, optimizer_seconds = 0, norm_seconds = 0;
  std::vector<float> losses;
  for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
    HCP_RETURN_IF_ERROR(batches.Next(ids, targets));
    HCP_RETURN_IF_ERROR(exec.SetInputs(ids, targets));
    HCP_RETURN_IF_ERROR(SetBenchPositions(exec, o));
    auto start = std::chrono::steady_clock::now();
    HCP_RETURN_IF_ERROR(exec.RunStepAndSumGradients());
    const double step_seconds = Seconds(start);
    const float loss = exec.Loss();
    OptimizerSeconds opt;
    if (optimizer) {
      HCP_ASSIGN_OR_RETURN(opt, OptimizerStep(exec, *optimizer, o.lr, loss));
    }
    const bool timed = step >= o.warmup;
    if (timed) {
      fwd_bwd_seconds += step_seconds;
      optimizer_seconds += opt.total;
      norm_seconds += opt.norm;
    }
    losses.push_back(loss);
    std::printf("step %3lld%s  loss %.4f  fwd+bwd %8.1f ms  %s%s tokens/s\n",
                static_cast<long long>(step), timed ? "" : " (warmup)", loss, 1e3 * step_seconds,
                o.optimizer ? absl::StrFormat("optimizer %6.1f ms  ", 1e3 * opt.total).c_str() : "",
                FormatCount(static_cast<int64_t>(tokens / step_seconds)).c_str());
    std::fflush(stdout);
  }

  const double per_step = fwd_bwd_seconds / o.steps;
  const char* per = rank.on_gpu() ? "GPU" : "rank";
  std::printf("\nforward + backward: %s tokens/s/%s, %.1f ms per step",
              FormatCount(static_cast<int64_t>(tokens / per_step)).c_str(), per, 1e3 * per_step);
  if (rank.on_gpu()) {
    // flops_per_step counts one micro-batch, which the cp ranks of a dp replica share.
    const double flops = plan.flops_per_step / static_cast<double>(plan.mesh.cp);
    std::printf(", MFU %.1f%%", 100.0 * flops / per_step / kPeakFlops);
  }
  std::printf("\n");
  if (o.optimizer) {
    const double full = (fwd_bwd_seconds + optimizer_seconds) / o.steps;
    std::printf(
        "with the optimizer: %s tokens/s/%s, %.1f ms per step (AdamW %.1f ms, of which the "
        "gradient norm %.1f ms)\n",
        FormatCount(static_cast<int64_t>(tokens / full)).c_str(), per, 1e3 * full,
        1e3 * optimizer_seconds / o.steps, 1e3 * norm_seconds / o.steps);
  }
#ifdef HYBRIDCP_HAVE_CUDA
  if (rank.on_gpu()) PrintGpuMemory(*rank.gpu());
#endif
  if (losses.size() >= 2) {
    std::printf("loss: first %.4f, last %.4f\n", losses.front(), losses.back());
  }
#ifdef HYBRIDCP_HAVE_CUDA
  if (o.profile) HCP_RETURN_IF_ERROR(Profile(*rank.gpu(), batches, o, ranks.world_size() > 1));
#endif
  return absl::OkStatus();
}

}  // namespace

Command MakeBenchCommand() {
  return Command{
      "bench",
      "time a plan on its ranks: a bf16 plan on GPUs (tokens/s/GPU, MFU, peak memory, time per "
      "kernel kind), an f32 plan on CPU ranks (tokens/s per rank)",
      "bench PLAN [--data PATH [--data-dtype TYPE]] [--steps N] [--warmup N]\n"
      "       [--optimizer [--shard-optimizer]] [--profile] [--document-length N]\n"
      "       (a plan of cp x dp ranks: mpirun -np cp*dp hybridcp bench PLAN ...)",
      {{"data", "PATH",
        "data to train on, as train's --data (default: random tokens): an indexed dataset, a "
        "token file or a raw one"},
       {"data-dtype", "TYPE", "the tokens of a raw --data file: uint16, uint32 or int32"},
       {"steps", "N", "timed steps (default 10)"},
       {"document-length", "N",
        "a plan compiled with --documents: documents of N tokens packed into every row "
        "(default: one per row)"},
       {"warmup", "N", "untimed steps first (default 2)"},
       {"optimizer", "",
        "also run AdamW (fp32 master weights and moments where the plan runs: the GPU or the "
        "host)"},
       {"shard-optimizer", "",
        "each rank keeps and updates its slice of the AdamW state (on GPUs the gradients "
        "reduce-scattered; the updated parameters all-gathered)"},
       {"lr", "X", "AdamW learning rate (default 3e-4)"},
       {"seed", "N", "parameter initialisation seed (default 0)"},
       {"device", "N", "CUDA device (default 0; under mpirun each rank takes its local rank's)"},
       {"profile", "",
        "one more step with a timer per kernel launch: time per kernel kind, and how long the "
        "gradient sums over the ranks ran on after the last kernel"},
       kTimeoutOption},
      RunBench};
}

}  // namespace hcp
