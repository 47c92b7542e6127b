#include "runtime/exec/CpuExecutor.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/exec/RankInputs.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/plan/CommVolume.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp {
namespace {

constexpr size_t kArenaAlignment = 64;

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace

void CpuExecutor::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::Create(const plan::Plan& plan,
                                                                 Options options) {
  return CreateOnThisRank(plan, nullptr, options);
}

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::Create(const plan::Plan& plan,
                                                                 comm::Communicator& comm,
                                                                 Options options) {
  absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CreateOnThisRank(plan, &comm, options);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, exec.status()));
  return exec;
}

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::CreateOnThisRank(
    const plan::Plan& plan, comm::Communicator* ranks, Options options) {
  HCP_RETURN_IF_ERROR(plan::ValidatePlan(plan));
  for (const plan::Buffer& b : plan.buffers) {
    if (b.dtype == plan::DType::BF16) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the plan stores '%s' in bf16 (it was compiled with --dtype bf16 for the CUDA "
          "backend); the CPU backend runs f32 plans: compile with --dtype f32",
          b.name));
    }
  }
  std::unique_ptr<CpuExecutor> exec(new CpuExecutor(plan, ranks));
  const comm::Communicator& comm = exec->communicator();
  const plan::Mesh& mesh = plan.mesh;
  if (!comm.has_mesh()) {
    return absl::FailedPreconditionError(
        "the communicator has no mesh yet: run comm::CheckRanksAgree with this plan first");
  }
  if (comm.mesh().cp != mesh.cp || comm.mesh().dp != mesh.dp) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan runs on cp=%d x dp=%d ranks, the communicator has cp=%d x dp=%d (%d rank%s)",
        mesh.cp, mesh.dp, comm.mesh().cp, comm.mesh().dp, comm.world_size(),
        comm.world_size() == 1 ? "" : "s"));
  }
  if (comm.mesh().ep != mesh.ep) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the plan splits its experts over ep=%d ranks, the communicator has ep=%d",
                        mesh.ep, comm.mesh().ep));
  }
  // Refuse up front what cannot fit, rather than letting an allocation (or the page faults of
  // filling it) fail halfway. Summed with overflow checks: arena sizes come from the file.
  uint64_t total = 0;
  for (uint64_t bytes : plan.arena_bytes) {
    if (__builtin_add_overflow(total, bytes, &total)) total = std::numeric_limits<uint64_t>::max();
  }
  const uint64_t memory = PhysicalMemoryBytes();
  if (total > memory) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("the plan's arenas need %s, more than this machine's %s of memory",
                        FormatGiB(total), FormatGiB(memory)));
  }

  exec->threads_ = cpu::Threads{std::max(1, options.threads)};
  for (int a = 0; a < plan::kNumArenas; ++a) {
    // At least one aligned block, so no base pointer is null; aligned_alloc wants a multiple of
    // the alignment.
    const uint64_t bytes = plan.arena_bytes[a];
    const uint64_t rounded =
        (std::max<uint64_t>(bytes, 1) + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    auto* memory_block = static_cast<std::byte*>(std::aligned_alloc(kArenaAlignment, rounded));
    if (memory_block == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot allocate the %s arena (%s)", plan::ArenaName(plan::Arena(a)), FormatGiB(bytes)));
    }
    exec->arenas_[a].reset(memory_block);
    exec->arena_bases_[a] = memory_block;
    if (plan::Arena(a) == plan::Arena::Activations && options.poison_activations) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::fill_n(reinterpret_cast<float*>(memory_block), rounded / sizeof(float), nan);
    } else {
      std::memset(memory_block, 0, rounded);
    }
  }
  return exec;
}

absl::Status CpuExecutor::SumGradientsOverRanks() {
  if (communicator().world_size() == 1) return absl::OkStatus();
  // Gradient buffers fill the arena apart from alignment padding, which stays zero (the arena
  // is zeroed at creation and no kernel writes outside its buffers): one collective for the
  // replicated gradients, [0, boundary), over the world, and one for the sharded ones,
  // [boundary, end), over the ranks holding the same experts. Every rank has the same plan,
  // so every rank makes the same calls.
  float* gradients = GradientsArena().data();
  const uint64_t end = plan_.arena_size(plan::Arena::Gradients);
  const uint64_t boundary = plan_.ShardedGradientsOffset();
  communicator().SetTrafficLabel(plan::kGradientSumTraffic);
  communicator().AllReduceSum(gradients, static_cast<int64_t>(boundary / sizeof(float)),
                              comm::Group::kWorld);
  if (boundary < end) {
    communicator().AllReduceSum(gradients + boundary / sizeof(float),
                                static_cast<int64_t>((end - boundary) / sizeof(float)),
                                comm::Group::kEpReplica);
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::RunStepAndSumGradients() {
  HCP_RETURN_IF_ERROR(RunStep());
  return SumGradientsOverRanks();
}

std::span<const float> CpuExecutor::LocalPart(const plan::Parameter& p,
                                              std::span<const float> full) const {
  const ShardRange range = ShardOf(p);
  if (static_cast<int64_t>(full.size()) != range.full) {
    communicator().Abort(absl::InternalError(
        absl::StrFormat("LocalPart of '%s': %d values given, its checkpoint tensor has %d (a bug)",
                        p.name, full.size(), range.full)));
  }
  return full.subspan(range.begin, range.count);
}

std::vector<float> CpuExecutor::GatherFull(const plan::Parameter& p, std::span<const float> local) {
  if (static_cast<int64_t>(local.size()) != ShardOf(p).count) {
    communicator().Abort(absl::InternalError(
        absl::StrFormat("GatherFull of '%s': %d local values, its part has %d (a bug)", p.name,
                        local.size(), ShardOf(p).count)));
  }
  // Host memory cannot fail to read.
  return *ExecutorCore::GatherFull(p, std::vector<float>(local.begin(), local.end()));
}

std::span<float> CpuExecutor::F32Buffer(uint32_t index) const {
  if (index >= plan_.buffers.size() || plan_.buffers[index].dtype != plan::DType::F32) return {};
  return {reinterpret_cast<float*>(Address(index)), plan_.buffers[index].elements};
}

std::span<int32_t> CpuExecutor::I32Buffer(uint32_t index) const {
  if (index >= plan_.buffers.size() || plan_.buffers[index].dtype != plan::DType::I32) return {};
  return {reinterpret_cast<int32_t*>(Address(index)), plan_.buffers[index].elements};
}

absl::StatusOr<std::span<float>> CpuExecutor::Parameter(std::string_view name) {
  const plan::Parameter* p = FindParameter(name);
  if (p == nullptr) {
    return absl::NotFoundError(absl::StrFormat("the plan has no parameter '%s'", name));
  }
  return F32Buffer(p->buffer);
}

absl::StatusOr<std::span<float>> CpuExecutor::Gradient(std::string_view name) {
  const plan::Parameter* p = FindParameter(name);
  if (p == nullptr) {
    return absl::NotFoundError(absl::StrFormat("the plan has no parameter '%s'", name));
  }
  return F32Buffer(p->gradient);
}

absl::Status CpuExecutor::RunStep() {
  if (communicator().world_size() == 1) return RunStepOnThisRank();
  absl::Status status = RunStepOnThisRank();
  communicator().SetTrafficLabel(plan::kControlTraffic);
  return comm::AgreeOnStatus(communicator(), status);
}

absl::Status CpuExecutor::RunStepOnThisRank() {
  absl::Status first_error;
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    // After an error only the collectives run, so that the other ranks are not left waiting.
    if (!first_error.ok() && !plan::IsCollective(plan_.steps[i].kernel)) continue;
    if (plan::IsCollective(plan_.steps[i].kernel)) {
      communicator().SetTrafficLabel(plan::TrafficKind(plan_.steps[i].kernel));
    }
    absl::Status status = cpu::RunCpuStep(plan_, i, arena_bases_, communicator(), threads_);
    if (auto route = routes_.find(i); status.ok() && route != routes_.end()) {
      // moe_route.forward: RouteWith checked it
      const auto r = plan::DecodeStep<plan::MoeRouteForwardArgs>(plan_.steps[i]);
      std::span<int32_t> ids = I32Buffer(r.expert_ids);
      std::copy(route->second.begin(), route->second.end(), ids.begin());
      cpu::selected_softmax_forward(F32Buffer(r.gates).data(), ids.data(),
                                    F32Buffer(r.logits).data(), r.tokens, r.experts, r.k);
    }
    if (status.ok()) continue;
    if (communicator().world_size() == 1) return status;
    if (first_error.ok()) first_error = status;
  }
  return first_error;
}

int CpuExecutor::ThreadsPerRank(int ranks) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  // A rank bound to fewer cores than its share (mpirun binds each of a few ranks to one core by
  // default) gets those cores.
  int usable = cores;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) usable = CPU_COUNT(&allowed);
  return std::max(1, std::min(usable, cores / std::max(1, ranks)));
}

absl::Status CpuExecutor::RouteWith(size_t step, std::vector<int32_t> experts) {
  if (step >= plan_.steps.size() || plan_.steps[step].kernel != plan::KernelId::MoeRouteForward) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RouteWith: step %d is not an MoE layer's routing (moe_route.forward)", step));
  }
  const auto route = plan::DecodeStep<plan::MoeRouteForwardArgs>(plan_.steps[step]);
  const int64_t tokens = route.tokens, count = route.experts, k = route.k;
  if (static_cast<int64_t>(experts.size()) != tokens * k) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RouteWith: step %d routes %d tokens to %d experts each (%d ids), not %d",
                        step, tokens, k, tokens * k, experts.size()));
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (experts[i] < 0 || experts[i] >= count) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "RouteWith: expert id %d (token %d, slot %d) is not one of the %d experts", experts[i],
          i / k, i % k, count));
    }
  }
  routes_[step] = std::move(experts);
  return absl::OkStatus();
}

std::span<float> CpuExecutor::GradientsArena() const {
  return {reinterpret_cast<float*>(arena_bases_[static_cast<int>(plan::Arena::Gradients)]),
          plan_.arena_size(plan::Arena::Gradients) / sizeof(float)};
}

absl::Status CpuExecutor::CheckFloatBuffer(uint32_t buffer, size_t count) const {
  if (buffer >= plan_.buffers.size() || plan_.buffers[buffer].dtype != plan::DType::F32 ||
      plan_.buffers[buffer].elements != count) {
    return absl::InternalError(absl::StrFormat(
        "%d floats for buffer %d, which is not an f32 buffer of as many (a bug)", count, buffer));
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::WriteFloats(uint32_t buffer, std::span<const float> values) {
  HCP_RETURN_IF_ERROR(CheckFloatBuffer(buffer, values.size()));
  std::copy(values.begin(), values.end(), F32Buffer(buffer).begin());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CpuExecutor::ReadFloats(uint32_t buffer) const {
  std::span<const float> values = F32Buffer(buffer);  // empty unless an f32 buffer
  HCP_RETURN_IF_ERROR(CheckFloatBuffer(buffer, values.size()));
  return std::vector<float>(values.begin(), values.end());
}

absl::Status CpuExecutor::WriteInts(uint32_t buffer, std::span<const int32_t> values) {
  std::span<int32_t> to = I32Buffer(buffer);
  if (to.size() != values.size()) {
    return absl::InternalError(
        absl::StrFormat("%d ints for buffer %d, which is not an i32 buffer of as many (a bug)",
                        values.size(), buffer));
  }
  std::copy(values.begin(), values.end(), to.begin());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> CpuExecutor::GradientSquares() {
  std::vector<double> squares;
  for (const plan::Parameter& p : plan_.parameters) {
    double sum = 0;
    for (float g : F32Buffer(p.gradient)) sum += static_cast<double>(g) * g;
    squares.push_back(sum);
  }
  return squares;
}

// The gradients arena is f32 throughout: the stash mirrors it, element for element.
absl::Status CpuExecutor::StashGradients(bool first) {
  std::span<float> gradients = GradientsArena();
  if (first) {
    gradient_stash_.assign(gradients.begin(), gradients.end());
    return absl::OkStatus();
  }
  if (gradient_stash_.size() != gradients.size()) {
    return absl::FailedPreconditionError("StashGradients(first=false) before StashGradients(true)");
  }
  for (size_t k = 0; k < gradients.size(); ++k) gradient_stash_[k] += gradients[k];
  return absl::OkStatus();
}

absl::Status CpuExecutor::AddStashedGradients() {
  std::span<float> gradients = GradientsArena();
  if (gradient_stash_.size() != gradients.size()) {
    return absl::FailedPreconditionError("AddStashedGradients before StashGradients");
  }
  for (size_t k = 0; k < gradients.size(); ++k) gradients[k] = gradient_stash_[k] + gradients[k];
  return absl::OkStatus();
}

}  // namespace hcp
