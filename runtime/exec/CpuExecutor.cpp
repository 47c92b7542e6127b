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
#include "runtime/support/Bytes.h"
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
  auto local = std::make_unique<comm::LocalCommunicator>();
  HCP_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> exec, Create(plan, *local, options));
  exec->owned_comm_ = std::move(local);
  return exec;
}

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::Create(const plan::Plan& plan,
                                                                 comm::Communicator& comm,
                                                                 Options options) {
  absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CreateOnThisRank(plan, comm, options);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, exec.status()));
  return exec;
}

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::CreateOnThisRank(const plan::Plan& plan,
                                                                           comm::Communicator& comm,
                                                                           Options options) {
  HCP_RETURN_IF_ERROR(plan::ValidatePlan(plan));
  for (const plan::Buffer& b : plan.buffers) {
    if (b.dtype == plan::DType::BF16) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the plan stores '%s' in bf16 (it was compiled with --dtype bf16 for the CUDA "
          "backend); the CPU backend runs f32 plans: compile with --dtype f32",
          b.name));
    }
  }
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

  std::unique_ptr<CpuExecutor> exec(new CpuExecutor(plan, &comm));
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
    exec->bases_[a] = memory_block;
    if (plan::Arena(a) == plan::Arena::Activations && options.poison_activations) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::fill_n(reinterpret_cast<float*>(memory_block), rounded / sizeof(float), nan);
    } else {
      std::memset(memory_block, 0, rounded);
    }
  }
  return exec;
}

std::byte* CpuExecutor::Address(uint32_t buffer) const {
  const plan::Buffer& b = plan_.buffers[buffer];
  return bases_[static_cast<int>(b.arena)] + b.offset;
}

absl::Status CpuExecutor::SumGradientsOverRanks() {
  if (comm_->world_size() == 1) return absl::OkStatus();
  // Gradient buffers fill the arena apart from alignment padding, which stays zero (the arena
  // is zeroed at creation and no kernel writes outside its buffers): one collective for the
  // replicated gradients, [0, boundary), over the world, and one for the sharded ones,
  // [boundary, end), over the ranks holding the same experts. Every rank has the same plan,
  // so every rank makes the same calls.
  auto* gradients =
      reinterpret_cast<float*>(arenas_[static_cast<int>(plan::Arena::Gradients)].get());
  const uint64_t end = plan_.arena_size(plan::Arena::Gradients);
  const uint64_t boundary = plan_.ShardedGradientsOffset();
  comm_->SetTrafficLabel(plan::kGradientSumTraffic);
  comm_->AllReduceSum(gradients, static_cast<int64_t>(boundary / sizeof(float)),
                      comm::Group::kWorld);
  if (boundary < end) {
    comm_->AllReduceSum(gradients + boundary / sizeof(float),
                        static_cast<int64_t>((end - boundary) / sizeof(float)),
                        comm::Group::kEpReplica);
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::RunStepAndSumGradients() {
  HCP_RETURN_IF_ERROR(RunStep());
  return SumGradientsOverRanks();
}

absl::StatusOr<double> CpuExecutor::GradientSquaredNorm() {
  double replicated = 0, sharded = 0;
  for (const plan::Parameter& p : plan_.parameters) {
    double sum = 0;
    for (float g : F32Buffer(p.gradient)) sum += static_cast<double>(g) * g;
    (p.sharded() ? sharded : replicated) += sum;
  }
  // Every rank calls this, whether or not it holds sharded parameters (the plan is the same).
  comm_->AllReduceSum(&sharded, 1, comm::Group::kEp);
  return replicated + sharded;
}

CpuExecutor::ShardRange CpuExecutor::ShardOf(const plan::Parameter& p) const {
  return hcp::ShardOf(plan_, p, comm_->ep_index());
}

std::span<const float> CpuExecutor::LocalPart(const plan::Parameter& p,
                                              std::span<const float> full) const {
  const ShardRange range = ShardOf(p);
  if (static_cast<int64_t>(full.size()) != range.full) {
    comm_->Abort(absl::InternalError(
        absl::StrFormat("LocalPart of '%s': %d values given, its checkpoint tensor has %d (a bug)",
                        p.name, full.size(), range.full)));
  }
  return full.subspan(range.begin, range.count);
}

void CpuExecutor::GatherFull(const plan::Parameter& p, std::span<const float> local,
                             std::span<float> full) {
  const ShardRange range = ShardOf(p);
  if (static_cast<int64_t>(local.size()) != range.count ||
      static_cast<int64_t>(full.size()) != range.full) {
    comm_->Abort(absl::InternalError(absl::StrFormat(
        "GatherFull of '%s': %d local and %d full values, expected %d and %d (a bug)", p.name,
        local.size(), full.size(), range.count, range.full)));
  }
  if (!p.sharded()) {
    std::copy(local.begin(), local.end(), full.begin());
    return;
  }
  // The ep group's ranks hold the row blocks in expert-index order = group rank order.
  comm_->AllGather(std::as_bytes(local), std::as_writable_bytes(full), comm::Group::kEp);
}

std::vector<float> CpuExecutor::GatherFull(const plan::Parameter& p, std::span<const float> local) {
  std::vector<float> full(ShardOf(p).full);
  GatherFull(p, local, full);
  return full;
}

absl::StatusOr<std::vector<float>> CpuExecutor::FullParameter(std::string_view name) {
  const plan::Parameter* p = FindParameter(name);
  if (p == nullptr) {
    return absl::NotFoundError(absl::StrFormat("the plan has no parameter '%s'", name));
  }
  return GatherFull(*p, F32Buffer(p->buffer));
}

absl::StatusOr<std::vector<float>> CpuExecutor::FullGradient(std::string_view name) {
  const plan::Parameter* p = FindParameter(name);
  if (p == nullptr) {
    return absl::NotFoundError(absl::StrFormat("the plan has no parameter '%s'", name));
  }
  return GatherFull(*p, F32Buffer(p->gradient));
}

std::span<float> CpuExecutor::F32Buffer(uint32_t index) {
  if (index >= plan_.buffers.size() || plan_.buffers[index].dtype != plan::DType::F32) return {};
  return {reinterpret_cast<float*>(Address(index)), plan_.buffers[index].elements};
}

std::span<int32_t> CpuExecutor::I32Buffer(uint32_t index) {
  if (index >= plan_.buffers.size() || plan_.buffers[index].dtype != plan::DType::I32) return {};
  return {reinterpret_cast<int32_t*>(Address(index)), plan_.buffers[index].elements};
}

const plan::Parameter* CpuExecutor::FindParameter(std::string_view name) const {
  for (const plan::Parameter& p : plan_.parameters) {
    if (p.name == name) return &p;
  }
  return nullptr;
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

absl::Status CpuExecutor::InitializeParameters(uint64_t seed) {
  // This rank's elements of each whole tensor: a sharded parameter's rows start at ShardOf.
  for (const plan::Parameter& p : plan_.parameters) {
    FillInitialValues(p, seed, ShardOf(p).begin, F32Buffer(p.buffer));
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::LoadParameters(const CheckpointReader& checkpoint) {
  return comm::AgreeOnStatus(*comm_, LoadParametersOnThisRank(checkpoint));
}

absl::Status CpuExecutor::LoadParametersOnThisRank(const CheckpointReader& checkpoint) {
  // Names, dtypes and shapes are checked first, so such a checkpoint leaves the parameters as
  // they were. A NaN or infinity is refused as it is read (CheckpointReader::OpenVerified finds
  // it before anything is loaded).
  HCP_RETURN_IF_ERROR(CheckCheckpointHasParameters(plan_, checkpoint));
  for (const plan::Parameter& p : plan_.parameters) {
    std::span<float> value = F32Buffer(p.buffer);
    const ShardRange range = ShardOf(p);  // the whole tensor, or this rank's rows
    HCP_RETURN_IF_ERROR(checkpoint.ReadF32Range(p.name, range.begin, range.count, value.data()));
    HCP_RETURN_IF_ERROR(RefuseNonFinite(value.first(range.count), range.begin, range.full, p.name,
                                        checkpoint.dir()));
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::SetInputs(std::span<const int32_t> input_ids,
                                    std::span<const int32_t> targets,
                                    std::optional<float> loss_scale) {
  return comm::AgreeOnStatus(*comm_, SetInputsOnThisRank(input_ids, targets, loss_scale));
}

absl::Status CpuExecutor::SetInputsOnThisRank(std::span<const int32_t> input_ids,
                                              std::span<const int32_t> targets,
                                              std::optional<float> loss_scale) {
  HCP_ASSIGN_OR_RETURN(RankInputs local,
                       CutRankInputs(plan_, comm_->cp_index(), input_ids, targets, loss_scale));
  std::copy(local.input_ids.begin(), local.input_ids.end(), I32Buffer(plan_.input_ids).begin());
  std::copy(local.targets.begin(), local.targets.end(), I32Buffer(plan_.targets).begin());
  F32Buffer(plan_.loss_scale)[0] = local.loss_scale;
  return absl::OkStatus();
}

absl::Status CpuExecutor::RunStep() {
  if (comm_->world_size() == 1) return RunStepOnThisRank();
  absl::Status status = RunStepOnThisRank();
  comm_->SetTrafficLabel(plan::kControlTraffic);
  return comm::AgreeOnStatus(*comm_, status);
}

absl::Status CpuExecutor::RunStepOnThisRank() {
  absl::Status first_error;
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    // After an error only the collectives run, so that the other ranks are not left waiting.
    if (!first_error.ok() && !plan::IsCollective(plan_.steps[i].kernel)) continue;
    if (plan::IsCollective(plan_.steps[i].kernel)) {
      comm_->SetTrafficLabel(plan::TrafficKind(plan_.steps[i].kernel));
    }
    absl::Status status = cpu::RunCpuStep(plan_, i, bases_, *comm_, threads_);
    if (auto route = routes_.find(i); status.ok() && route != routes_.end()) {
      // moe_route.forward: RouteWith checked it
      const auto r = plan::DecodeStep<plan::MoeRouteForwardArgs>(plan_.steps[i]);
      std::span<int32_t> ids = I32Buffer(r.expert_ids);
      std::copy(route->second.begin(), route->second.end(), ids.begin());
      cpu::selected_softmax_forward(F32Buffer(r.gates).data(), ids.data(),
                                    F32Buffer(r.logits).data(), r.tokens, r.experts, r.k);
    }
    if (status.ok()) continue;
    if (comm_->world_size() == 1) return status;
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

float CpuExecutor::Loss() const { return *reinterpret_cast<const float*>(Address(plan_.loss)); }

}  // namespace hcp
