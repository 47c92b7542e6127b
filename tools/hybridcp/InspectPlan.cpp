// `hybridcp inspect FILE.plan`: what a plan holds and costs: memory per arena (the activation
// arena is the step's peak activation memory) and the optimizer state training adds, kernels,
// FLOPs per step.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_format.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/plan/CommVolume.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"
#include "tools/hybridcp/Commands.h"
#ifdef HYBRIDCP_HAVE_CUDA
#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/exec/CudaExecutor.h"
#endif

namespace hcp {
namespace {

// Bytes each rank sends per step, by collective kind: one row per rank, one column per kind.
// The plan's schedule: the collectives that run beside the compute stream, and the compute
// steps that run while they do.
void PrintSchedule(const plan::Plan& plan) {
  size_t beside = 0, overlapped = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].stream != plan::Stream::kBeside) continue;
    ++beside;
    overlapped += plan.steps[i].join_before - i - 1;
  }
  if (beside == 0) {
    std::printf("schedule: every step on the compute stream\n");
    return;
  }
  std::printf(
      "schedule: %zu collectives beside the compute stream, %zu compute steps run beside "
      "them\n",
      beside, overlapped);
}

void PrintCommunication(const plan::Plan& plan) {
  std::printf("ranks: cp %lld x dp %lld, %s layout\n", static_cast<long long>(plan.mesh.cp),
              static_cast<long long>(plan.mesh.dp),
              std::string(plan::SequenceLayoutName(plan.mesh.layout)).c_str());
  std::printf("bytes sent per step:\n");
  PrintBytesSent(plan::BytesSentPerRank(plan));
}

}  // namespace

void PrintBytesSent(const plan::CommVolume& volume) {
  std::map<std::string, bool> kinds;
  for (const auto& rank : volume) {
    for (const auto& [kind, bytes] : rank) kinds[kind] = true;
  }
  std::printf("  %-6s", "rank");
  for (const auto& [kind, unused] : kinds) std::printf(" %16s", kind.c_str());
  std::printf(" %16s\n", "total");
  for (size_t rank = 0; rank < volume.size(); ++rank) {
    uint64_t total = 0;
    std::printf("  %-6zu", rank);
    for (const auto& [kind, unused] : kinds) {
      auto it = volume[rank].find(kind);
      uint64_t bytes = it == volume[rank].end() ? 0 : it->second;
      total += bytes;
      std::printf(" %16llu", static_cast<unsigned long long>(bytes));
    }
    std::printf(" %16llu\n", static_cast<unsigned long long>(total));
  }
}

namespace {

// A JSON object, as a config is.
bool StartsLikeJson(std::string_view start) {
  const size_t text = start.find_first_not_of(" \t\r\n");
  return text != std::string_view::npos && start[text] == '{';
}

// What a file that is neither a plan nor a config is, from its first bytes and its size.
std::string WhatItIs(std::string_view start, uint64_t size) {
  if (size == 0) return "an empty file";
  if (StartsLikeJson(start)) return "JSON text; a model config is read from a .json file";
  // safetensors: an 8-byte little-endian header length, then the JSON header.
  if (start.size() > 8 && start[8] == '{') {
    uint64_t header = 0;
    for (int i = 0; i < 8; ++i) header |= uint64_t{static_cast<uint8_t>(start[i])} << (8 * i);
    if (header <= size - 8) return "a safetensors file";
  }
  return absl::StrFormat("%d bytes that do not start with the plan magic \"HCPPLAN\"", size);
}

}  // namespace

absl::StatusOr<bool> InspectsAsPlan(const std::string& path) {
  const std::string extension = std::filesystem::path(path).extension().string();
  std::error_code error;
  // What cannot be read here is left to the loader the name points to, which names the error.
  if (!std::filesystem::is_regular_file(path, error)) return extension == ".plan";
  std::ifstream file(path, std::ios::binary);
  if (!file) return extension == ".plan";
  std::string start(64, '\0');
  file.read(start.data(), static_cast<std::streamsize>(start.size()));
  start.resize(static_cast<size_t>(file.gcount()));
  if (start.starts_with(std::string_view(plan::kPlanMagic, sizeof(plan::kPlanMagic)))) return true;
  if (extension == ".json" || (extension != ".plan" && StartsLikeJson(start))) return false;
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is not a hybridcp plan (%s); inspect reads a plan (FILE.plan) or a model config "
      "(CONFIG.json, --model NAME)",
      path, WhatItIs(start, std::filesystem::file_size(path, error))));
}

// Where the plan runs: an f32 plan on CPU ranks (the reference backend), a bf16 plan on GPUs, one
// process each, if the CUDA backend takes it (and this build has it).
std::string RunsOn(const plan::Plan& plan) {
  const long long ranks = plan.mesh.world();
  if (!plan.StoresBf16()) return absl::StrFormat("%lld CPU rank(s) (an f32 plan)", ranks);
#ifdef HYBRIDCP_HAVE_CUDA
  if (absl::Status s = cuda_backend::CheckPlanRunsOnCuda(plan); !s.ok()) {
    return absl::StrFormat("nothing yet (a bf16 plan the CUDA backend does not take: %s)",
                           s.message());
  }
  return absl::StrFormat("%lld GPU(s), one process each (a bf16 plan)", ranks);
#else
  return absl::StrFormat("%lld GPU(s) (a bf16 plan), with a hybridcp built with CUDA", ranks);
#endif
}

#ifdef HYBRIDCP_HAVE_CUDA
// What the CUDA executor allocates on each GPU (rank 0's optimizer slices): a step, and training.
void PrintGpuMemory(const plan::Plan& plan) {
  const GpuMemory step = GpuMemoryOf(plan, /*with_optimizer=*/false, /*shard_optimizer=*/false, 0);
  const GpuMemory whole = GpuMemoryOf(plan, true, false, 0);
  const GpuMemory sharded = GpuMemoryOf(plan, true, true, 0);
  auto gib = [](uint64_t bytes) { return absl::StrFormat("%.2f", bytes / 1073741824.0); };
  std::printf(
      "GPU memory per rank (the CUDA executor's allocations; the CUDA context and NCCL "
      "add 0.5-4 GiB):\n");
  std::printf("  %-12s %s GiB  (arenas %s, kernel workspace %s, cuBLASLt %s GiB)\n", "a step",
              gib(step.total()).c_str(), gib(step.arenas).c_str(), gib(step.workspace).c_str(),
              gib(step.gemm).c_str());
  std::printf("  %-12s %s GiB  (%s GiB with --shard-optimizer)\n", "training",
              gib(whole.total()).c_str(), gib(sharded.total()).c_str());
}
#endif

absl::Status InspectPlan(const std::string& path, bool list_buffers) {
  HCP_ASSIGN_OR_RETURN(plan::Plan plan, plan::LoadPlan(path));
  std::printf("plan: %s (%s)\n", path.c_str(), plan.producer.c_str());
  std::printf("model: %s, micro-batch %lld x seq %lld\n", plan.model.c_str(),
              static_cast<long long>(plan.micro_batch), static_cast<long long>(plan.seq));
  std::printf("runs on: %s\n", RunsOn(plan).c_str());
  if (plan.router_aux_loss) {
    std::printf("objective: the loss + %g x the MoE load-balancing loss\n",
                plan.router_aux_loss->coefficient);
  }
  if (plan.position_ids) {
    std::printf("documents: packed (the step takes position_ids; no layer reads across a "
                "document start)\n");
  }
  uint64_t parameters = 0;
  for (const plan::Parameter& p : plan.parameters) parameters += plan.buffers[p.buffer].elements;
  std::printf("parameters: %zu tensors, %llu values\n", plan.parameters.size(),
              static_cast<unsigned long long>(parameters));
  std::printf("memory per rank:\n");
  for (int arena = 0; arena < plan::kNumArenas; ++arena) {
    auto a = static_cast<plan::Arena>(arena);
    std::printf("  %-12s %s%s\n", std::string(plan::ArenaName(a)).c_str(),
                FormatBytes(plan.arena_size(a)).c_str(),
                a == plan::Arena::Activations ? "  (peak activation memory)" : "");
  }
  std::printf("  %-12s %s\n", "total", FormatBytes(plan.total_arena_bytes()).c_str());
  // Training adds the optimizer's state (train --shard-optimizer splits it over the ranks).
  std::printf("  %-12s %s  (training; %s with --shard-optimizer)\n", "AdamW state",
              FormatBytes(OptimizerStateBytes(plan, /*shard=*/false)).c_str(),
              FormatBytes(OptimizerStateBytes(plan, /*shard=*/true)).c_str());
#ifdef HYBRIDCP_HAVE_CUDA
  if (plan.StoresBf16() && cuda_backend::CheckPlanRunsOnCuda(plan).ok()) PrintGpuMemory(plan);
#endif
  std::map<std::string, int> kernels;
  for (const plan::Step& step : plan.steps) ++kernels[std::string(plan::KernelName(step.kernel))];
  std::printf("buffers: %zu; steps: %zu\n", plan.buffers.size(), plan.steps.size());
  for (const auto& [name, count] : kernels) std::printf("  %-26s %d\n", name.c_str(), count);
  PrintSchedule(plan);
  if (plan.mesh.world() > 1) PrintCommunication(plan);
  if (list_buffers) {
    std::printf("buffers (index, arena, offset, bytes, dtype, shape, name):\n");
    for (size_t i = 0; i < plan.buffers.size(); ++i) {
      const plan::Buffer& b = plan.buffers[i];
      std::string shape;
      for (int64_t dim : b.shape) {
        if (!shape.empty()) shape += 'x';
        shape += std::to_string(dim);
      }
      std::printf("  %5zu %-11s %14llu %14llu %-4s %-20s %s\n", i,
                  std::string(plan::ArenaName(b.arena)).c_str(),
                  static_cast<unsigned long long>(b.offset),
                  static_cast<unsigned long long>(b.bytes()),
                  std::string(plan::DTypeName(b.dtype)).c_str(), shape.c_str(), b.name.c_str());
    }
  }
  std::printf("training FLOPs per step: %.4g (%.3f GFLOP per token)\n", plan.flops_per_step,
              plan.flops_per_step / static_cast<double>(plan.tokens()) / 1e9);
  return absl::OkStatus();
}

}  // namespace hcp
