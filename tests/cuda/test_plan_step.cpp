// test_plan_step: one training step of a bf16 plan on the GPU (CudaExecutor) against the same
// model's f32 plan on the CPU reference (CpuExecutor): same initial parameters (seed), same
// pseudo-random tokens. Prints both losses and, per parameter, the relative RMS error of the
// gradient, rms(g_gpu - g_cpu) / rms(g_cpu); then exercises the GPU optimizer (one AdamW update,
// a second, profiled step) and prints the time per kind of kernel.
//   test_plan_step BF16.plan F32.plan [--seed N] [--device N] [--weights DIR] [--inputs FILE]
//                  [--reference FILE]
//   test_plan_step --tiny [--seed N] [--device N]
//   mpirun -np N test_plan_step BF16_CP.plan F32.plan ...     (a context-parallel bf16 plan)
// The two plans: `hybridcp compile CONFIG --seq S --micro-batch B --dtype bf16 -o BF16.plan` and
// the same without --dtype; --tiny builds a small hand-written pair instead (TinyPlan.h). The
// bf16 plan may be one of cp ranks (--cp N, the experts possibly split over them with --ep N):
// it then runs on N GPUs, one process each (started
// by mpirun; each takes its machine-local rank's GPU), through NCCL, and is held to the same
// tolerances against the same one-rank f32 reference, which rank 0 runs and reports. Exit status
// 0: within tolerance; 1: outside it; 2: an error.
//
// It needs a GPU, so it is not a ctest test.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/comm/World.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/exec/CudaExecutor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Status.h"
#include "runtime/train/AdamW.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tests/cuda/TinyPlan.h"

namespace hcp {
namespace {

// Tolerances. bf16 keeps 8 significant bits: one rounding is off by up to half an ulp, 2^-9 ~
// 2e-3 relative. The bf16 plan rounds every activation and activation gradient at each kernel
// boundary, a few of those per layer, and independent rounding errors add up roughly as a random
// walk, so a gradient carries ~1e-2 relative RMS; a wrong kernel, dtype or missing step gives
// errors ~1. Each tolerance is twice the worst error measured by
// scripts/gpu/run_tolerance_survey.sh (nvidia-h200, 2026-12-01: the small plans 1 x 300 and
// 2 x 512, seeds 1-6, and the gpu-shapes fixture; 13 runs), per gradient family: parameters whose
// gradients come out of the same kernels carry errors of the same size.
// The loss: worst 1.04e-5 against the CPU and 1.69e-5 against transformers; 5e-5 allows three
// times that and still catches a wrong valid-target count (one target of the 600 is 1.7e-3).
constexpr double kLossTolerance = 5e-5;
// The MoE load-balancing loss (a plan compiled with it): every MoE layer's softmax of its bf16
// router logits summed over the tokens, against the f32 reference's. With the same routing (the
// reference takes the GPU's) the picks are equal and only the probabilities differ, each by the
// logits' bf16 error (2^-9 relative, ~2e-3 on a logit of size ~1) averaged over the tokens: 1e-3
// bounds it by one logit's rounding; a missing layer or a wrong scale is off by ~1e-1 or more.
constexpr double kAuxLossTolerance = 1e-3;

struct GradientFamily {
  const char* name;
  std::vector<const char*> patterns;  // any of them in the parameter's name
  double measured;                    // worst relative RMS of the survey
  double tolerance;                   // 2 x measured, rounded up
};
// In order: the first family with a matching pattern holds a parameter. A_log, D and dt_bias are
// one value per head summed over every token, with cancellation between tokens: their relative
// error is several times the others'.
const std::vector<GradientFamily>& GradientFamilies() {
  static const std::vector<GradientFamily> families = {
      {"embedding", {"embed_tokens"}, 7.85e-3, 1.6e-2},
      {"norms", {"layernorm", "model.norm.", "mamba.norm."}, 1.54e-2, 3.1e-2},
      {"attention", {"self_attn."}, 1.12e-2, 2.3e-2},
      {"mamba projections", {"mamba.in_proj", "mamba.out_proj"}, 1.06e-2, 2.2e-2},
      {"mamba conv", {"mamba.conv1d"}, 1.15e-2, 2.3e-2},
      {"mamba A, D, dt", {"mamba.A_log", "mamba.D", "mamba.dt_bias"}, 4.60e-2, 9.2e-2},
      {"router", {"router."}, 1.51e-2, 3.1e-2},
      {"experts",
       {"block_sparse_moe.input_linear", "block_sparse_moe.output_linear"},
       1.13e-2,
       2.3e-2},
      {"shared MLP", {"shared_mlp."}, 1.09e-2, 2.2e-2},
  };
  return families;
}

const GradientFamily& FamilyOf(const std::string& parameter) {
  for (const GradientFamily& family : GradientFamilies()) {
    for (const char* pattern : family.patterns) {
      if (parameter.find(pattern) != std::string::npos) return family;
    }
  }
  std::fprintf(stderr, "test_plan_step: no gradient family for '%s': add it to GradientFamilies\n",
               parameter.c_str());
  std::exit(2);
}

double GradientTolerance(const std::string& parameter) { return FamilyOf(parameter).tolerance; }

// The ranks' host communicator when the bf16 plan runs on several GPUs: a failing rank must end
// the whole job, not leave the others waiting in a collective.
comm::Communicator* g_ranks = nullptr;

[[noreturn]] void Fail(const absl::Status& status) {
  std::fflush(stdout);
  if (g_ranks != nullptr && g_ranks->world_size() > 1) g_ranks->Abort(status);
  std::fprintf(stderr, "test_plan_step: %s\n", FormatError(status).c_str());
  std::exit(2);
}

template <typename T>
T OrFail(absl::StatusOr<T> value) {
  if (!value.ok()) Fail(value.status());
  return *std::move(value);
}

// Top-k routing is discontinuous: where a token's router logits are nearly tied, the bf16 run may
// pick another expert than an fp32 run, and that token's whole gradient lands on a different
// expert (and the router's gradient changes with the choice). Against the CPU reference this
// does not arise: the reference takes the GPU's experts (CpuExecutor::RouteWith, its gates from
// its own logits), and every gradient is held to its family's tolerance. Against transformers,
// which routes on its own, MoE parameters (and the norm that feeds the router) get more: if a
// fraction f of the tokens routes differently and tokens contribute comparable, uncorrelated
// amounts, the relative RMS error of an expert-side gradient is about sqrt(2 f); the bound below
// allows twice that on top of the family's tolerance, with f measured between the GPU and the
// CPU's own routing. Measured (gpu-shapes fixture, 2026-12-01): f = 0.33%, sqrt(2 f) = 8.1e-2,
// worst MoE-side error 1.54e-1 = 1.9 sqrt(2 f), allowed 2.13e-1 (the router's 3.1e-2 family
// tolerance + 2 sqrt(2 f)); with no routing flips it is the family's tolerance itself.
// Since the reference follows the GPU's routing, the routing itself is held apart: bf16 logits
// differ from fp32 ones by ~1e-2 relative, so only tokens whose k-th and (k+1)-th logits are
// about that close may flip (measured 0.33% to 1.25% of the tokens over the survey's 13 runs); a
// router fed the wrong input or reading the wrong weights picks other experts for nearly every
// token. 5% is four times the worst measured.
constexpr double kRoutingFlipTolerance = 0.05;

double MoeTolerance(const std::string& parameter, double flip_fraction) {
  return GradientTolerance(parameter) + 2.0 * std::sqrt(2.0 * flip_fraction);
}

// The parameters held to MoeTolerance in a model with experts: the MoE block's, and the norm
// right before it (its gradient is the routed experts' input gradient, contracted over the
// tokens).
bool UnderMoeTolerance(const std::string& name) {
  return name.find(".block_sparse_moe.") != std::string::npos ||
         name.find(".post_attention_layernorm.") != std::string::npos;
}

// The indices of the moe_route.forward steps, in plan order.
std::vector<size_t> RoutingSteps(const plan::Plan& plan) {
  std::vector<size_t> steps;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].kernel == plan::KernelId::MoeRouteForward) steps.push_back(i);
  }
  return steps;
}

// The plan's steps up to and including `last`: still a valid plan (a step reads only what
// earlier steps wrote), after which `last`'s outputs are intact (after the whole step, memory
// planning may have reused them).
plan::Plan Prefix(const plan::Plan& plan, size_t last) {
  plan::Plan prefix = plan;
  prefix.steps.resize(last + 1);
  return prefix;
}

// Where both runs' parameters come from: a Hugging Face checkpoint (--weights), else the
// plans' initialisers with the seed.
struct Weights {
  std::optional<CheckpointReader> checkpoint;
  uint64_t seed = 0;

  void Set(CpuExecutor& cpu) const {
    absl::Status s = checkpoint ? cpu.LoadParameters(*checkpoint) : cpu.InitializeParameters(seed);
    if (!s.ok()) Fail(s);
  }
  void Set(CudaExecutor& gpu) const {
    absl::Status s = checkpoint ? gpu.LoadParameters(*checkpoint) : gpu.InitializeParameters(seed);
    if (!s.ok()) Fail(s);
  }
};

// A cp rank's local rows [micro_batch * segs * len, width] back in global token order, gathered
// from every rank of the cp group (collective; the identity with one rank).
std::vector<int32_t> GatherTokenRows(comm::Communicator& ranks, const plan::Plan& plan,
                                     const std::vector<int32_t>& local, int64_t width) {
  if (ranks.world_size() == 1) return local;
  std::vector<int32_t> all(local.size() * ranks.world_size());
  ranks.AllGather(std::as_bytes(std::span(local)), std::as_writable_bytes(std::span(all)),
                  comm::Group::kWorld);
  const plan::Mesh& mesh = plan.mesh;
  const int64_t segs = mesh.segments_per_rank(), len = plan.seq / mesh.segments();
  std::vector<int32_t> global(all.size());
  for (int rank = 0; rank < ranks.world_size(); ++rank) {
    for (int64_t b = 0; b < plan.micro_batch; ++b) {
      for (int64_t k = 0; k < segs; ++k) {
        const int64_t from = rank * local.size() + (b * segs + k) * len * width;
        const int64_t to = (b * plan.seq + mesh.GlobalSegment(rank, k) * len) * width;
        std::copy_n(all.begin() + from, len * width, global.begin() + to);
      }
    }
  }
  return global;
}

// How the GPU routes, against the f32 run on the CPU: each MoE layer's expert ids on the GPU(s)
// (global token order) by the f32 plan's routing step, and the fraction of tokens whose set of k
// experts differs from the CPU's own choice, over all MoE layers (compared as sets: the order may
// differ on ties). Each layer's choices are read from a run of the plans' prefixes ending at its
// routing step. Collective over the ranks (every rank runs the CPU side too).
struct Routing {
  std::vector<std::pair<size_t, std::vector<int32_t>>> gpu_experts;
  double flip_fraction = 0;
};

// The step's inputs: tokens, targets and (plans compiled with --documents) position_ids.
struct StepInputs {
  std::vector<int32_t> ids, targets, positions;
};
// Sets them on an executor.
absl::Status SetStepInputs(Executor& executor, const StepInputs& in) {
  absl::Status status = executor.SetInputs(in.ids, in.targets);
  if (status.ok() && !in.positions.empty()) status = executor.SetPositions(in.positions);
  return status;
}

Routing CompareRouting(const plan::Plan& f32_plan, const plan::Plan& bf16_plan,
                       const Weights& weights, int device, comm::NcclCommunicator* nccl,
                       const StepInputs& inputs) {
  comm::Communicator* ranks = nccl == nullptr ? nullptr : &nccl->host();
  const std::vector<size_t> cpu_steps = RoutingSteps(f32_plan);
  const std::vector<size_t> gpu_steps = RoutingSteps(bf16_plan);
  if (cpu_steps.size() != gpu_steps.size()) {
    Fail(absl::InvalidArgumentError("the plans have different numbers of MoE layers"));
  }
  Routing routing;
  int64_t flipped = 0, tokens = 0;
  for (size_t layer = 0; layer < cpu_steps.size(); ++layer) {
    const plan::Plan gpu_prefix = Prefix(bf16_plan, gpu_steps[layer]);
    CudaExecutor::Options options;
    options.device = device;
    options.reserve_optimizer_state = false;
    options.nccl = nccl;
    auto gpu = OrFail(CudaExecutor::Create(gpu_prefix, options));
    weights.Set(*gpu);
    for (absl::Status s : {SetStepInputs(*gpu, inputs), gpu->RunStep()}) {
      if (!s.ok()) Fail(s);
    }
    const uint32_t gpu_buffer = gpu_prefix.steps.back().outs[1];
    const size_t k = static_cast<size_t>(bf16_plan.buffers[gpu_buffer].shape.back());
    std::vector<int32_t> gpu_choice =
        ranks == nullptr ? OrFail(gpu->I32Buffer(gpu_buffer))
                         : GatherTokenRows(*ranks, bf16_plan, OrFail(gpu->I32Buffer(gpu_buffer)),
                                           static_cast<int64_t>(k));
    const plan::Plan cpu_prefix = Prefix(f32_plan, cpu_steps[layer]);
    CpuExecutor::Options cpu_options;
    cpu_options.threads = CpuExecutor::ThreadsPerRank(ranks == nullptr ? 1 : ranks->world_size());
    auto cpu = OrFail(CpuExecutor::Create(cpu_prefix, cpu_options));
    weights.Set(*cpu);
    for (absl::Status s : {SetStepInputs(*cpu, inputs), cpu->RunStep()}) {
      if (!s.ok()) Fail(s);
    }
    const std::span<int32_t> cpu_choice = cpu->I32Buffer(cpu_prefix.steps.back().outs[1]);
    for (size_t t = 0; t + k <= gpu_choice.size(); t += k) {
      std::vector<int32_t> a(cpu_choice.begin() + t, cpu_choice.begin() + t + k);
      std::vector<int32_t> b(gpu_choice.begin() + t, gpu_choice.begin() + t + k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      flipped += a != b;
      ++tokens;
    }
    routing.gpu_experts.emplace_back(cpu_steps[layer], std::move(gpu_choice));
  }
  routing.flip_fraction = tokens == 0 ? 0.0 : static_cast<double>(flipped) / tokens;
  return routing;
}

// A step's error without its "step N (kernel): " prefix: the two plans number their steps
// differently (the bf16 plan has cast steps).
std::string WithoutStepLabel(const absl::Status& status) {
  const std::string message(status.message());
  const size_t colon = message.find("): ");
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                      colon == std::string::npos ? message : message.substr(colon + 3));
}

// splitmix64: the tokens only need to be the same on both sides and spread over the vocabulary.
uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The vocabulary: the embedding's row count (the plan does not store it otherwise).
int64_t VocabOf(const plan::Plan& plan) {
  for (const plan::Step& step : plan.steps) {
    if (step.kernel == plan::KernelId::EmbeddingForward) return step.ints[1];
  }
  Fail(absl::InvalidArgumentError("the plan has no embedding.forward step: no vocabulary"));
}

// rms(a - b) / rms(b); 0 when both are zero, +inf when anything is not finite.
double RelativeRms(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (ref == 0) return diff == 0 ? 0.0 : INFINITY;
  return std::sqrt(diff / ref);
}

struct GradientError {
  std::string name;
  int64_t elements;
  double error;
};

int Main(int argc, char** argv) {
  std::vector<std::string> paths;
  uint64_t seed = 1234;
  int device = 0;
  bool tiny = false;
  std::string weights_dir, inputs_path, reference_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tiny") {
      tiny = true;
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--device" && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else if (arg == "--weights" && i + 1 < argc) {
      weights_dir = argv[++i];
    } else if (arg == "--inputs" && i + 1 < argc) {
      inputs_path = argv[++i];
    } else if (arg == "--reference" && i + 1 < argc) {
      reference_path = argv[++i];
    } else if (!arg.starts_with("--")) {
      paths.push_back(arg);
    } else {
      paths.clear();
      break;
    }
  }
  if (paths.size() != (tiny ? 0 : 2)) {
    std::fprintf(stderr,
                 "usage: test_plan_step BF16.plan F32.plan [--seed N] [--device N]\n"
                 "         [--weights CHECKPOINT_DIR] [--inputs FILE.safetensors]\n"
                 "         [--reference FIXTURE/reference.safetensors]\n"
                 "       test_plan_step --tiny [--seed N] [--device N]\n");
    return 2;
  }
  if (tiny) paths = {"<tiny bf16 plan>", "<tiny f32 plan>"};
  World world = OrFail(World::Join());
  comm::Communicator& ranks = world.comm();
  g_ranks = &ranks;
  // Every rank runs the whole test (the CPU reference too) and checks the same figures; rank 0
  // reports.
  if (ranks.world_rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) {
    Fail(absl::InternalError("cannot silence the output of ranks other than 0"));
  }
  const plan::Plan bf16_plan =
      OrFail(tiny ? test::TinyPlan(plan::DType::BF16) : plan::LoadPlan(paths[0]));
  const plan::Plan f32_plan =
      OrFail(tiny ? test::TinyPlan(plan::DType::F32) : plan::LoadPlan(paths[1]));
  const int64_t gpus = bf16_plan.mesh.cp * bf16_plan.mesh.dp;
  if (f32_plan.mesh.cp * f32_plan.mesh.dp != 1 || bf16_plan.mesh.dp != 1) {
    Fail(absl::InvalidArgumentError(
        "the f32 reference must be a one-rank plan and the bf16 plan one of cp ranks (dp = 1; "
        "the experts may be split over them)"));
  }
  if (ranks.world_size() != gpus) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "the bf16 plan runs on cp=%d GPUs: start %d processes (mpirun -np %d), not %d", gpus, gpus,
        gpus, ranks.world_size())));
  }
  std::unique_ptr<comm::NcclCommunicator> nccl;
  if (gpus > 1) {
    if (absl::Status s = ranks.SetMesh(bf16_plan.mesh); !s.ok()) Fail(s);
    device = comm::NcclCommunicator::LocalDevice(ranks);
    nccl = OrFail(comm::NcclCommunicator::Create(ranks, device, std::chrono::seconds(300)));
  }
  if (bf16_plan.seq != f32_plan.seq || bf16_plan.micro_batch != f32_plan.micro_batch ||
      bf16_plan.parameters.size() != f32_plan.parameters.size()) {
    Fail(absl::InvalidArgumentError(
        absl::StrFormat("the plans differ: seq %d / %d, micro_batch %d / %d, %d / %d parameters",
                        bf16_plan.seq, f32_plan.seq, bf16_plan.micro_batch, f32_plan.micro_batch,
                        bf16_plan.parameters.size(), f32_plan.parameters.size())));
  }
  // Before the (slow) CPU reference: the GPU must be able to run the bf16 plan at all.
  if (absl::Status s = cuda_backend::CheckPlanRunsOnCuda(bf16_plan); !s.ok()) Fail(s);
  const int64_t vocab = VocabOf(f32_plan);
  std::printf(
      "test_plan_step: %s (bf16, %d GPU(s), cp=%d, ep=%d) vs %s (f32, CPU): %s, %d x %d tokens, "
      "seed %llu\n",
      paths[0].c_str(), static_cast<int>(gpus), static_cast<int>(bf16_plan.mesh.cp),
      static_cast<int>(bf16_plan.mesh.ep), paths[1].c_str(), f32_plan.model.c_str(),
      static_cast<int>(f32_plan.micro_batch), static_cast<int>(f32_plan.seq),
      static_cast<unsigned long long>(seed));

  // Tokens: from --inputs (input_ids and targets, as the transformers fixtures hold them), else
  // pseudo-random ids with targets = the next token (the last of each sequence ignored). Plans
  // compiled with --documents also take position_ids: the file's, else rows packed with
  // documents of 1, 2, 3, 40, 9, 200, 1, 44, ... tokens (starting anew in each row).
  const int64_t seq = f32_plan.seq, tokens = f32_plan.tokens();
  if (f32_plan.position_ids.has_value() != bf16_plan.position_ids.has_value()) {
    Fail(absl::InvalidArgumentError("one plan packs documents (--documents), the other not"));
  }
  StepInputs inputs_of_step;
  std::vector<int32_t>& ids = inputs_of_step.ids;
  std::vector<int32_t>& targets = inputs_of_step.targets;
  ids.resize(tokens);
  targets.resize(tokens);
  if (f32_plan.position_ids) {
    static constexpr int32_t kLengths[] = {1, 2, 3, 40, 9, 200, 1, 44};
    std::vector<int32_t>& positions = inputs_of_step.positions;
    for (int64_t row = 0; row < tokens / seq; ++row) {
      size_t next = 0;
      int32_t left = 0, position = 0;
      for (int64_t t = 0; t < seq; ++t) {
        if (left == 0) {
          left = kLengths[next++ % std::size(kLengths)];
          position = 0;
        }
        positions.push_back(position++);
        --left;
      }
    }
  }
  if (!inputs_path.empty()) {
    const SafetensorsFile inputs = OrFail(SafetensorsFile::Open(inputs_path));
    if (f32_plan.position_ids && inputs.Find("position_ids") != nullptr) {
      const std::vector<int64_t> file_positions = OrFail(inputs.ReadInt("position_ids"));
      inputs_of_step.positions.assign(file_positions.begin(), file_positions.end());
    }
    const std::vector<int64_t> file_ids = OrFail(inputs.ReadInt("input_ids"));
    const std::vector<int64_t> file_targets = OrFail(inputs.ReadInt("targets"));
    if (file_ids.size() != ids.size() || file_targets.size() != targets.size()) {
      Fail(absl::InvalidArgumentError(
          absl::StrFormat("%s holds %d input ids and %d targets, the plans take %d", inputs_path,
                          file_ids.size(), file_targets.size(), tokens)));
    }
    std::copy(file_ids.begin(), file_ids.end(), ids.begin());
    std::copy(file_targets.begin(), file_targets.end(), targets.begin());
  } else {
    uint64_t state = seed;
    for (int32_t& id : ids) id = static_cast<int32_t>(Next(state) % static_cast<uint64_t>(vocab));
    for (int64_t t = 0; t < tokens; ++t) {
      targets[t] = (t + 1) % seq == 0 ? plan::kIgnoredTarget : ids[t + 1];
    }
  }
  Weights weights;
  weights.seed = seed;
  if (!weights_dir.empty()) weights.checkpoint = OrFail(CheckpointReader::Open(weights_dir));

  // The reference, routed as the GPU routes.
  const Routing routing =
      CompareRouting(f32_plan, bf16_plan, weights, device, nccl.get(), inputs_of_step);
  const double flips = routing.flip_fraction;
  CpuExecutor::Options cpu_options;
  cpu_options.poison_activations = true;
  cpu_options.threads = CpuExecutor::ThreadsPerRank(ranks.world_size());
  auto cpu = OrFail(CpuExecutor::Create(f32_plan, cpu_options));
  weights.Set(*cpu);
  for (const auto& [step, experts] : routing.gpu_experts) {
    if (absl::Status s = cpu->RouteWith(step, experts); !s.ok()) Fail(s);
  }
  if (absl::Status s = SetStepInputs(*cpu, inputs_of_step); !s.ok()) Fail(s);
  if (absl::Status s = cpu->RunStep(); !s.ok()) Fail(s);
  const double cpu_loss = cpu->Loss();

  // The GPU.
  CudaExecutor::Options gpu_options;
  gpu_options.device = device;
  gpu_options.poison_activations = true;
  gpu_options.nccl = nccl.get();
  auto gpu = OrFail(CudaExecutor::Create(bf16_plan, gpu_options));
  weights.Set(*gpu);
  if (absl::Status s = SetStepInputs(*gpu, inputs_of_step); !s.ok()) Fail(s);
  if (absl::Status s = gpu->RunStepAndSumGradients(); !s.ok()) Fail(s);
  const double gpu_loss = gpu->Loss();
  const CudaExecutor::Memory memory = gpu->MemoryUse();
  std::printf(
      "GPU memory: arenas %.2f GiB, all allocations %.2f GiB, device peak %.2f of %.2f GiB\n",
      gpu->ArenaBytes() / 1073741824.0, memory.allocated_bytes / 1073741824.0,
      memory.peak_bytes / 1073741824.0, memory.device_bytes / 1073741824.0);

  bool ok = true;
  const double loss_error = std::isfinite(gpu_loss) && std::isfinite(cpu_loss)
                                ? std::abs(gpu_loss - cpu_loss) / std::abs(cpu_loss)
                                : INFINITY;
  ok &= loss_error <= kLossTolerance;
  std::printf("%s loss: gpu %.6f, cpu %.6f, relative difference %.2e (tolerance %.0e)\n",
              loss_error <= kLossTolerance ? "PASS" : "FAIL", gpu_loss, cpu_loss, loss_error,
              kLossTolerance);
  if (const std::optional<float> gpu_aux = gpu->RouterAuxLoss()) {
    const double cpu_aux = cpu->RouterAuxLoss().value_or(NAN);
    const double aux_error = std::isfinite(*gpu_aux) && std::isfinite(cpu_aux)
                                 ? std::abs(*gpu_aux - cpu_aux) / std::abs(cpu_aux)
                                 : INFINITY;
    ok &= aux_error <= kAuxLossTolerance;
    std::printf(
        "%s load-balancing loss: gpu %.6f, cpu %.6f, relative difference %.2e (tolerance %.0e)\n",
        aux_error <= kAuxLossTolerance ? "PASS" : "FAIL", *gpu_aux, cpu_aux, aux_error,
        kAuxLossTolerance);
  }

  // Gradients, parameter by parameter in the bf16 plan's order.
  const bool has_experts = !routing.gpu_experts.empty();
  if (has_experts) {
    const bool routing_ok = flips <= kRoutingFlipTolerance;
    ok &= routing_ok;
    std::printf(
        "%s MoE routing: %.2f%% of the tokens pick other experts than the f32 run would "
        "(tolerance %.0f%%); the f32 reference takes the GPU's\n",
        routing_ok ? "PASS" : "FAIL", 100.0 * flips, 100.0 * kRoutingFlipTolerance);
  }
  std::vector<GradientError> errors;
  for (const plan::Parameter& p : bf16_plan.parameters) {
    const std::vector<float> g_gpu = OrFail(gpu->FullGradient(p.name));
    const std::span<float> g_cpu_span = OrFail(cpu->Gradient(p.name));
    const std::vector<float> g_cpu(g_cpu_span.begin(), g_cpu_span.end());
    if (g_gpu.size() != g_cpu.size()) {
      Fail(absl::InvalidArgumentError(
          absl::StrFormat("parameter '%s' has %d elements in the bf16 plan, %d in the f32 plan",
                          p.name, g_gpu.size(), g_cpu.size())));
    }
    const double error = RelativeRms(g_gpu, g_cpu);
    errors.push_back({p.name, static_cast<int64_t>(g_gpu.size()), error});
    const double tolerance = GradientTolerance(p.name);
    ok &= error <= tolerance;
    std::printf("%s grad %-60s %10lld  rel rms %.2e (tolerance %.1e)\n",
                error <= tolerance ? "PASS" : "FAIL", p.name.c_str(),
                static_cast<long long>(g_gpu.size()), error, tolerance);
  }
  // The other route to the same gradients: RunStep, then SumGradientsOverRanks (what gradient
  // accumulation uses) instead of the sums overlapped with the backward. The sums themselves
  // agree bit for bit (with two ranks each element is one commutative addition), but the step
  // does not quite: the default attention backward adds dq's pieces in a varying order, which
  // reaches a bf16 gradient as a rare one-ulp difference (~1e-4 relative RMS at most). A sum
  // started before its gradient was complete would miss whole contributions (errors ~1e-1 and
  // up); 1e-3 tells the two apart.
  constexpr double kSameSumTolerance = 1e-3;
  if (gpus > 1) {
    std::vector<std::vector<float>> overlapped;
    for (const plan::Parameter& p : bf16_plan.parameters) {
      overlapped.push_back(OrFail(gpu->FullGradient(p.name)));
    }
    for (absl::Status s :
         {gpu->SetInputs(ids, targets), gpu->RunStep(), gpu->SumGradientsOverRanks()}) {
      if (!s.ok()) Fail(s);
    }
    double worst_difference = 0;
    for (size_t i = 0; i < bf16_plan.parameters.size(); ++i) {
      worst_difference = std::max(
          worst_difference,
          RelativeRms(OrFail(gpu->FullGradient(bf16_plan.parameters[i].name)), overlapped[i]));
    }
    const bool same = worst_difference <= kSameSumTolerance;
    ok &= same;
    std::printf(
        "%s gradients summed after the step vs during it: worst rel rms %.2e (tolerance %.0e)\n",
        same ? "PASS" : "FAIL", worst_difference, kSameSumTolerance);
  }
  // Against transformers itself: the fixture's fp32 loss and gradients.
  if (!reference_path.empty()) {
    const SafetensorsFile reference = OrFail(SafetensorsFile::Open(reference_path));
    const double ref_loss = OrFail(reference.ReadF32("loss")).at(0);
    const double error = std::abs(gpu_loss - ref_loss) / std::abs(ref_loss);
    const bool loss_ok = error <= kLossTolerance;
    ok &= loss_ok;
    std::printf("%s loss vs transformers: gpu %.6f, transformers %.6f, relative difference %.2e\n",
                loss_ok ? "PASS" : "FAIL", gpu_loss, ref_loss, error);
    // The worst error relative to its own tolerance, for the plain and the MoE-side parameters.
    struct Worst {
      double error = 0, tolerance = 0;
      std::string name;
    } worst_plain, worst_moe;
    bool grads_ok = true;
    for (const plan::Parameter& p : bf16_plan.parameters) {
      const std::vector<float> g_ref = OrFail(reference.ReadF32("grad." + p.name));
      const double e = RelativeRms(OrFail(gpu->FullGradient(p.name)), g_ref);
      const bool moe = has_experts && UnderMoeTolerance(p.name);
      const double tolerance = moe ? MoeTolerance(p.name, flips) : GradientTolerance(p.name);
      grads_ok &= e <= tolerance;
      Worst& worst = moe ? worst_moe : worst_plain;
      if (worst.name.empty() || e / tolerance > worst.error / worst.tolerance) {
        worst = {e, tolerance, p.name};
      }
    }
    ok &= grads_ok;
    std::printf(
        "%s gradients vs transformers: closest to its tolerance %.2e (tolerance %.2e, %s), MoE "
        "%.2e (tolerance %.2e, %s)\n",
        grads_ok ? "PASS" : "FAIL", worst_plain.error, worst_plain.tolerance,
        worst_plain.name.c_str(), worst_moe.error, worst_moe.tolerance, worst_moe.name.c_str());
  }
  // Gradient accumulation sums in fp32 and rounds once: four micro-batches of the same tokens
  // give four times one micro-batch's gradients, exactly (x4 is exact in bf16) but for the rare
  // one-ulp differences of the attention backward between runs. A bf16 running sum would round
  // 3 g before adding the fourth g: most elements would differ.
  if (gpus == 1) {
    std::vector<std::vector<float>> one;
    for (const plan::Parameter& p : bf16_plan.parameters)
      one.push_back(OrFail(gpu->FullGradient(p.name)));
    for (int m = 0; m < 4; ++m) {
      if (absl::Status s = gpu->RunStep(); !s.ok()) Fail(s);
      absl::Status kept =
          m < 3 ? gpu->StashGradients(/*first=*/m == 0) : gpu->AddStashedGradients();
      if (!kept.ok()) Fail(kept);
    }
    int64_t exact = 0, total = 0;
    for (size_t i = 0; i < bf16_plan.parameters.size(); ++i) {
      const std::vector<float> four = OrFail(gpu->FullGradient(bf16_plan.parameters[i].name));
      for (size_t j = 0; j < four.size(); ++j) {
        if (one[i][j] == 0.0f) continue;  // exact either way
        exact += four[j] == 4.0f * one[i][j];
        ++total;
      }
    }
    const double fraction = total == 0 ? 1.0 : static_cast<double>(exact) / total;
    const bool exact_ok = fraction >= 0.99;
    ok &= exact_ok;
    std::printf(
        "%s four accumulated micro-batches = 4 x one: %.4f of %lld nonzero elements exact (at "
        "least 0.99)\n",
        exact_ok ? "PASS" : "FAIL", fraction, static_cast<long long>(total));
    if (absl::Status s = gpu->RunStep(); !s.ok()) Fail(s);  // one micro-batch's gradients again
  }
  std::vector<GradientError> worst = errors;
  std::sort(worst.begin(), worst.end(),
            [](const GradientError& a, const GradientError& b) { return a.error > b.error; });
  std::printf("worst gradients:\n");
  for (size_t i = 0; i < std::min<size_t>(5, worst.size()); ++i) {
    std::printf("  %.2e  %s (%s, tolerance %.1e)\n", worst[i].error, worst[i].name.c_str(),
                FamilyOf(worst[i].name).name, GradientTolerance(worst[i].name));
  }

  // The whole gradient's norm, as the trainer's clipping sees it (informational).
  const double norm_cpu = std::sqrt(OrFail(cpu->GradientSquaredNorm()));
  const double norm_gpu = std::sqrt(OrFail(gpu->GradientSquaredNorm()));
  std::printf("gradient norm: gpu %.6e, cpu %.6e, relative difference %.2e\n", norm_gpu, norm_cpu,
              std::abs(norm_gpu - norm_cpu) / norm_cpu);

  // The optimizer on the GPU: one update, then a second step (profiled). Only a smoke test: the
  // loss must stay finite.
  if (absl::Status s = gpu->InitOptimizer(); !s.ok()) Fail(s);
  cuda::AdamWStep step;
  step.lr = 1e-4;
  step.clip_coef = train::ClipCoefficient(norm_gpu, 1.0);
  step.t = 1;
  auto decay = [&](const plan::Parameter& p) {
    return train::DefaultDecay(p.name, bf16_plan.FullShape(p));
  };
  if (absl::Status s = gpu->OptimizerStep(step, decay); !s.ok()) Fail(s);
  std::vector<double> ms_per_kernel;
  if (absl::Status s = gpu->RunStepProfiled(&ms_per_kernel); !s.ok()) Fail(s);
  const double loss_after = gpu->Loss();
  const bool finite_after = std::isfinite(loss_after);
  ok &= finite_after;
  std::printf("%s loss after one AdamW update on the GPU (lr %.0e): %.6f (before %.6f)\n",
              finite_after ? "PASS" : "FAIL", step.lr, loss_after, gpu_loss);

  // Bad data: a token id outside the vocabulary, then a target outside it. Both executors must
  // refuse the step with the same message (the GPU finds the position through bad_position).
  struct BadCase {
    const char* what;
    std::vector<int32_t> ids, targets;
  };
  std::vector<BadCase> bad_cases = {{"token id", ids, targets}, {"target", ids, targets}};
  const int64_t bad_at = std::min<int64_t>(tokens - 1, 5);
  bad_cases[0].ids[bad_at] = static_cast<int32_t>(vocab);
  bad_cases[1].targets[bad_at] = static_cast<int32_t>(vocab + 3);
  for (const BadCase& bad : bad_cases) {
    absl::Status cpu_status = cpu->SetInputs(bad.ids, bad.targets);
    if (cpu_status.ok()) cpu_status = cpu->RunStep();
    absl::Status gpu_status = gpu->SetInputs(bad.ids, bad.targets);
    if (gpu_status.ok()) gpu_status = gpu->RunStep();
    const bool same =
        !gpu_status.ok() && WithoutStepLabel(gpu_status) == WithoutStepLabel(cpu_status);
    ok &= same;
    std::printf("%s bad %s at position %lld: gpu \"%s\"%s\n", same ? "PASS" : "FAIL", bad.what,
                static_cast<long long>(bad_at), gpu_status.ToString().c_str(),
                same ? "" : (", cpu \"" + cpu_status.ToString() + "\"").c_str());
  }

  double total_ms = 0;
  std::vector<std::pair<double, int>> by_kernel;
  for (int k = 0; k < static_cast<int>(ms_per_kernel.size()); ++k) {
    total_ms += ms_per_kernel[k];
    if (ms_per_kernel[k] > 0) by_kernel.push_back({ms_per_kernel[k], k});
  }
  std::sort(by_kernel.rbegin(), by_kernel.rend());
  std::printf("second step: %.2f ms on the GPU, by kernel:\n", total_ms);
  for (const auto& [ms, k] : by_kernel) {
    const std::string_view name = plan::KernelName(static_cast<plan::KernelId>(k));
    std::printf("  %-24.*s %9.3f ms  %5.1f%%\n", static_cast<int>(name.size()), name.data(), ms,
                100.0 * ms / total_ms);
  }
  std::printf("test_plan_step: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace hcp

int main(int argc, char** argv) { return hcp::Main(argc, argv); }
