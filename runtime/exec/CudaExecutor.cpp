#include "runtime/exec/CudaExecutor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/exec/RankInputs.h"
#include "runtime/kernels/cpu/Parallel.h"
#include "runtime/kernels/cuda/CollectiveKernels.h"
#include "runtime/support/DType.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp {
namespace {

using cuda_backend::FromCuda;

// The cuBLASLt context: its workspace (Kernels.h's default) and its lanes for the MoE experts'
// side-by-side GEMMs (gemm_group), each with a workspace too.
constexpr uint64_t kGemmWorkspaceBytes = uint64_t{32} << 20;
constexpr int kDefaultGemmLanes = 4;

// HCP_GEMM_LANES=N overrides the lane count (0: the experts' products one after another), for
// measuring; anything else than a number 0..16 keeps the default.
int GemmLanes() {
  const char* value = std::getenv("HCP_GEMM_LANES");
  if (value == nullptr || *value == '\0') return kDefaultGemmLanes;
  char* end = nullptr;
  const long lanes = std::strtol(value, &end, 10);
  return *end == '\0' && lanes >= 0 && lanes <= 16 ? static_cast<int>(lanes) : kDefaultGemmLanes;
}
// Every allocation and every carved piece is a multiple of this (cudaMalloc's alignment).
constexpr uint64_t kAlignment = 256;
constexpr int32_t kNoBadPosition = std::numeric_limits<int32_t>::max();
// join_before_ of a step that runs on the compute stream.
constexpr size_t kOnComputeStream = ~size_t{0};

// out[i] = convert(in[i]) over the host's cores: loading a model converts billions of values
// between fp32 and bf16 (granite-4.0-h-tiny: 6.9e9, about 20 s on one core).
template <typename From, typename To, typename Convert>
void ConvertOnHost(std::span<const From> in, To* out, Convert convert) {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::parallel_for(cpu::Threads{threads}, static_cast<int64_t>(in.size()), int64_t{1} << 20, 1,
                    [&](int64_t begin, int64_t end) {
                      std::transform(in.begin() + begin, in.begin() + end, out + begin, convert);
                    });
}

uint64_t RoundUp(uint64_t bytes) {
  return (std::max<uint64_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
}

// The optimizer state one parameter's slice needs: m and v, plus an fp32 master for a bf16
// parameter.
uint64_t OptimizerBytes(const plan::Plan& plan, const plan::Parameter& p, OptimizerSlice slice) {
  return OptimizerArrays(plan.buffers[p.buffer].dtype) * RoundUp(slice.count * sizeof(float));
}

// Per parameter, the slice of its buffer rank `rank`'s optimizer updates (ParameterValues.h).
std::vector<OptimizerSlice> OptimizerSlices(const plan::Plan& plan, bool shard_optimizer,
                                            int64_t rank) {
  std::vector<OptimizerSlice> slices;
  for (const plan::Parameter& p : plan.parameters) {
    const auto elements = static_cast<int64_t>(plan.buffers[p.buffer].elements);
    slices.push_back(OptimizerSliceOf(p, elements, shard_optimizer, rank, plan.mesh.world()));
  }
  return slices;
}

// The slices' element counts, which size the one-launch kernels' tables.
std::vector<int64_t> CountsOf(const std::vector<OptimizerSlice>& slices) {
  std::vector<int64_t> counts;
  for (const OptimizerSlice& slice : slices) counts.push_back(slice.count);
  return counts;
}

// The token ids or targets a step checks against its vocabulary (a bad one lowers
// bad_position): embedding.forward's ids, cross_entropy's targets (which may also be the ignore
// index).
struct CheckedIds {
  uint32_t buffer;
  int64_t tokens, vocab;
  std::optional<int64_t> ignore_index;  // targets only
};
std::optional<CheckedIds> CheckedIdsOf(const plan::Step& step) {
  switch (step.kernel) {
    case plan::KernelId::EmbeddingForward: {
      const auto k = plan::DecodeStep<plan::EmbeddingForwardArgs>(step);
      return CheckedIds{k.ids, k.tokens, k.vocab, std::nullopt};
    }
    case plan::KernelId::CrossEntropyForward: {
      const auto k = plan::DecodeStep<plan::CrossEntropyForwardArgs>(step);
      return CheckedIds{k.targets, k.tokens, k.vocab, k.ignore_index};
    }
    case plan::KernelId::CrossEntropyBackward: {
      const auto k = plan::DecodeStep<plan::CrossEntropyBackwardArgs>(step);
      return CheckedIds{k.targets, k.tokens, k.vocab, k.ignore_index};
    }
    default:
      return std::nullopt;
  }
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<uint64_t>::max() : sum;
}

ncclDataType_t NcclTypeOf(plan::DType dtype) {
  return dtype == plan::DType::BF16 ? ncclBfloat16 : ncclFloat32;
}

}  // namespace

uint64_t GpuMemory::total() const {
  uint64_t sum = 0;
  for (uint64_t part : {arenas, workspace, gemm, optimizer, other}) sum = SaturatingAdd(sum, part);
  return sum;
}

// Arena sizes come from the file: the sums saturate.
GpuMemory GpuMemoryOf(const plan::Plan& plan, bool with_optimizer, bool shard_optimizer,
                      int64_t rank) {
  GpuMemory memory;
  for (uint64_t bytes : plan.arena_bytes)
    memory.arenas = SaturatingAdd(memory.arenas, RoundUp(bytes));
  const std::vector<OptimizerSlice> slices = OptimizerSlices(plan, shard_optimizer, rank);
  uint64_t largest_parameter = 0;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const plan::Parameter& p = plan.parameters[i];
    if (with_optimizer) {
      memory.optimizer = SaturatingAdd(memory.optimizer, OptimizerBytes(plan, p, slices[i]));
    }
    largest_parameter = std::max(largest_parameter, plan.buffers[p.buffer].elements);
  }
  memory.workspace = RoundUp(std::max(cuda_backend::WorkspaceBytes(plan),
                                      cuda::sum_of_squares_workspace_bytes(largest_parameter)));
  // With several ranks the halo exchanges and state scans run beside the compute stream, their
  // scratch after the shared workspace.
  if (plan.mesh.world() > 1) {
    memory.workspace += RoundUp(cuda_backend::BesideComputeWorkspaceBytes(plan));
  }
  memory.gemm = cuda::gemm_context_bytes(kGemmWorkspaceBytes, GemmLanes());
  memory.other = 2 * kAlignment + RoundUp(sizeof(double) * plan.parameters.size());
  return memory;
}

absl::StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(const plan::Plan& plan,
                                                                   Options options) {
  HCP_RETURN_IF_ERROR(plan::ValidatePlan(plan));
  HCP_RETURN_IF_ERROR(cuda_backend::CheckPlanRunsOnCuda(plan));
  const int64_t ranks = plan.mesh.cp * plan.mesh.dp;
  if (ranks > 1 && options.nccl == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan runs on cp=%d x dp=%d = %d GPUs: start one process per GPU (mpirun -np %d) and "
        "give each executor the ranks' NCCL communicator",
        plan.mesh.cp, plan.mesh.dp, ranks, ranks));
  }
  if (ranks > 1) {
    const comm::Communicator& host = options.nccl->host();
    if (!host.has_mesh() || host.mesh().cp != plan.mesh.cp || host.mesh().dp != plan.mesh.dp ||
        host.mesh().ep != plan.mesh.ep || host.mesh().layout != plan.mesh.layout) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the communicator's mesh is not the plan's (cp=%d x dp=%d, ep=%d, %d ranks): set it "
          "from the plan (Communicator::SetMesh) before creating the NCCL communicator",
          plan.mesh.cp, plan.mesh.dp, plan.mesh.ep, ranks));
    }
  }
  int devices = 0;
  if (cudaError_t error = cudaGetDeviceCount(&devices); error != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no CUDA device to run the plan on (%s)",
        error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount found none"));
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d does not exist: this machine has %d (0..%d)",
                        options.device, devices, devices - 1));
  }
  HCP_RETURN_IF_ERROR(FromCuda(cudaSetDevice(options.device), "cudaSetDevice"));

  // Refuse up front what cannot fit, rather than failing halfway through the allocations (or at
  // InitOptimizer).
  const int64_t rank = ranks > 1 ? options.nccl->host().world_rank() : 0;
  const std::vector<OptimizerSlice> slices = OptimizerSlices(plan, options.shard_optimizer, rank);
  const GpuMemory need =
      GpuMemoryOf(plan, options.reserve_optimizer_state, options.shard_optimizer, rank);
  const uint64_t needed = need.total();
  size_t free_bytes = 0, total_bytes = 0;
  HCP_RETURN_IF_ERROR(FromCuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  if (needed > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the plan needs %s on GPU %d (arenas %s, workspace %s, cuBLASLt %s, optimizer state %s), "
        "but only %s of its %s are free",
        FormatGiB(needed), options.device, FormatGiB(need.arenas), FormatGiB(need.workspace),
        FormatGiB(need.gemm), FormatGiB(need.optimizer), FormatGiB(free_bytes),
        FormatGiB(total_bytes)));
  }

  // From here on the destructor frees whatever has been allocated when an error returns.
  std::unique_ptr<CudaExecutor> exec(
      new CudaExecutor(plan, options.device, ranks > 1 ? options.nccl : nullptr, slices));
  HCP_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&exec->stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
  HCP_RETURN_IF_ERROR(FromCuda(
      cudaStreamCreateWithFlags(&exec->comm_stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  HCP_RETURN_IF_ERROR(FromCuda(
      cudaStreamCreateWithFlags(&exec->grad_stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  HCP_RETURN_IF_ERROR(FromCuda(
      cudaStreamCreateWithFlags(&exec->beside_stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  for (cudaEvent_t* event : {&exec->compute_done_, &exec->comm_done_, &exec->grads_ready_,
                             &exec->grads_summed_, &exec->beside_start_, &exec->beside_done_}) {
    HCP_RETURN_IF_ERROR(
        FromCuda(cudaEventCreateWithFlags(event, cudaEventDisableTiming), "cudaEventCreate"));
  }
  exec->OrderGradientsByReadiness();
  for (int a = 0; a < plan::kNumArenas; ++a) {
    const auto arena = plan::Arena(a);
    const uint64_t bytes = RoundUp(plan.arena_bytes[a]);  // never null, even when empty
    void* memory = nullptr;
    HCP_RETURN_IF_ERROR(
        exec->Allocate(&memory, bytes, absl::StrFormat("the %s arena", plan::ArenaName(arena))));
    exec->arena_bases_[a] = static_cast<std::byte*>(memory);
    const int fill = arena == plan::Arena::Activations && options.poison_activations ? 0xFF : 0;
    HCP_RETURN_IF_ERROR(
        FromCuda(cudaMemsetAsync(memory, fill, bytes, exec->stream_), "cudaMemsetAsync"));
  }
  HCP_RETURN_IF_ERROR(exec->Allocate(&exec->workspace_, need.workspace, "the workspace"));
  exec->workspace_bytes_ = need.workspace;
  exec->PlanBesideCompute();
  HCP_RETURN_IF_ERROR(exec->PrepareHostCopies());
  HCP_RETURN_IF_ERROR(cuda_backend::FromCuda(
      cuda::gemm_context_create(&exec->gemm_, kGemmWorkspaceBytes, GemmLanes())));
  exec->allocated_bytes_ += need.gemm;
  HCP_RETURN_IF_ERROR(exec->Allocate(reinterpret_cast<void**>(&exec->bad_position_),
                                     2 * sizeof(int32_t), "the bad-position flag"));
  HCP_RETURN_IF_ERROR(exec->ToDevice(exec->bad_position_ + 1, &kNoBadPosition, sizeof(int32_t)));
  HCP_RETURN_IF_ERROR(exec->Allocate(reinterpret_cast<void**>(&exec->squares_),
                                     sizeof(double) * std::max<size_t>(1, plan.parameters.size()),
                                     "the gradient norm's partial sums"));
  exec->squares_tables_.bytes = cuda::sum_of_squares_many_workspace_bytes(CountsOf(slices));
  HCP_RETURN_IF_ERROR(exec->Allocate(&exec->squares_tables_.ptr, exec->squares_tables_.bytes,
                                     "the gradient norm's tables"));
  HCP_RETURN_IF_ERROR(FromCuda(cudaStreamSynchronize(exec->stream_), "clearing the arenas"));
  exec->SampleMemory();
  return exec;
}

CudaExecutor::~CudaExecutor() {
  // Errors are ignored here: there is nobody to report them to, and freeing goes on regardless.
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  if (gemm_ != nullptr) cuda::gemm_context_destroy(gemm_);
  for (cudaGraphExec_t graph : step_graphs_) {
    if (graph != nullptr) cudaGraphExecDestroy(graph);
  }
  for (std::byte* arena : arena_bases_) cudaFree(arena);
  cudaFree(workspace_);
  cudaFree(bad_position_);
  cudaFree(squares_);
  cudaFree(squares_tables_.ptr);
  cudaFree(optimizer_memory_);
  cudaFree(optimizer_tables_.ptr);
  cudaFree(gradient_stash_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  if (beside_stream_ != nullptr) cudaStreamDestroy(beside_stream_);
  for (cudaEvent_t event : join_events_) cudaEventDestroy(event);
  if (grad_stream_ != nullptr) cudaStreamDestroy(grad_stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  for (cudaEvent_t event : {compute_done_, comm_done_, grads_ready_, grads_summed_, beside_start_,
                            beside_done_, copy_start_}) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  for (int32_t* data : host_copy_data_) cudaFreeHost(data);
  for (cudaEvent_t event : host_copy_done_) cudaEventDestroy(event);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
}

absl::Status CudaExecutor::Wait(const char* what) const {
  if (nccl_ == nullptr) return FromCuda(cudaStreamSynchronize(stream_), what);
  nccl_->Wait(stream_, what);  // does not return on failure: the job ends
  return absl::OkStatus();
}

absl::Status CudaExecutor::Activate() const {
  return FromCuda(cudaSetDevice(device_), "cudaSetDevice");
}

absl::Status CudaExecutor::Allocate(void** ptr, uint64_t bytes, std::string_view what) {
  if (cudaError_t error = cudaMalloc(ptr, bytes); error != cudaSuccess) {
    *ptr = nullptr;
    return absl::ResourceExhaustedError(absl::StrFormat("cannot allocate %s (%s) on GPU %d: %s",
                                                        what, FormatGiB(bytes), device_,
                                                        cudaGetErrorString(error)));
  }
  allocated_bytes_ += bytes;
  return absl::OkStatus();
}

void CudaExecutor::SampleMemory() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(device_) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    return;  // the numbers stay as they were: a statistic, not worth failing a run for
  }
  peak_used_bytes_ = std::max<uint64_t>(peak_used_bytes_, total_bytes - free_bytes);
  device_bytes_ = total_bytes;
}

CudaExecutor::Memory CudaExecutor::MemoryUse() const {
  SampleMemory();
  return Memory{.allocated_bytes = allocated_bytes_,
                .peak_bytes = peak_used_bytes_,
                .device_bytes = device_bytes_};
}

uint64_t CudaExecutor::ArenaBytes() const {
  uint64_t total = 0;
  for (uint64_t bytes : plan_.arena_bytes) total += bytes;
  return total;
}

// ---------------------------------------------------------------------------------------------
// Transfers. cudaMemcpy on the legacy default stream would not order against the non-blocking
// stream the steps run on: every copy goes through that stream instead, and waits.

absl::Status CudaExecutor::ToDevice(void* dst, const void* src, size_t bytes) const {
  HCP_RETURN_IF_ERROR(Activate());
  HCP_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                               "copying to the GPU"));
  return FromCuda(cudaStreamSynchronize(stream_), "copying to the GPU");
}

absl::Status CudaExecutor::ToHost(void* dst, const void* src, size_t bytes) const {
  HCP_RETURN_IF_ERROR(Activate());
  HCP_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                               "copying from the GPU"));
  return FromCuda(cudaStreamSynchronize(stream_), "copying from the GPU");
}

absl::Status CudaExecutor::WriteFloats(uint32_t buffer, std::span<const float> values) {
  const plan::Buffer& b = plan_.buffers[buffer];
  if (values.size() != b.elements || b.dtype == plan::DType::I32) {
    return absl::InternalError(
        absl::StrFormat("uploading %d floats into buffer '%s' (%s, %d elements): a bug",
                        values.size(), b.name, plan::DTypeName(b.dtype), b.elements));
  }
  if (b.dtype == plan::DType::F32) return ToDevice(Address(buffer), values.data(), b.bytes());
  std::vector<uint16_t> bits(values.size());
  ConvertOnHost(values, bits.data(), F32ToBf16);
  return ToDevice(Address(buffer), bits.data(), b.bytes());
}

absl::StatusOr<std::vector<int32_t>> CudaExecutor::I32Buffer(uint32_t index) const {
  if (index >= plan_.buffers.size() || plan_.buffers[index].dtype != plan::DType::I32) {
    return absl::InvalidArgumentError(
        absl::StrFormat("buffer %d is not an i32 buffer of the plan", index));
  }
  std::vector<int32_t> values(plan_.buffers[index].elements);
  HCP_RETURN_IF_ERROR(ToHost(values.data(), Address(index), plan_.buffers[index].bytes()));
  return values;
}

absl::StatusOr<std::vector<float>> CudaExecutor::ReadFloats(uint32_t buffer) const {
  const plan::Buffer& b = plan_.buffers[buffer];
  std::vector<float> values(b.elements);
  if (b.dtype == plan::DType::F32) {
    HCP_RETURN_IF_ERROR(ToHost(values.data(), Address(buffer), b.bytes()));
  } else if (b.dtype == plan::DType::BF16) {
    std::vector<uint16_t> bits(b.elements);
    HCP_RETURN_IF_ERROR(ToHost(bits.data(), Address(buffer), b.bytes()));
    ConvertOnHost(std::span<const uint16_t>(bits), values.data(), Bf16ToF32);
  } else {
    return absl::InternalError(
        absl::StrFormat("buffer '%s' is i32, not a float buffer (a bug)", b.name));
  }
  return values;
}

absl::StatusOr<std::vector<float>> CudaExecutor::DownloadF32(const float* device, int64_t n) const {
  std::vector<float> values(n);
  HCP_RETURN_IF_ERROR(ToHost(values.data(), device, sizeof(float) * n));
  return values;
}

// ---------------------------------------------------------------------------------------------
// Parameters and inputs.

absl::Status CudaExecutor::WriteInts(uint32_t buffer, std::span<const int32_t> values) {
  const plan::Buffer& b = plan_.buffers[buffer];
  if (values.size() != b.elements || b.dtype != plan::DType::I32) {
    return absl::InternalError(
        absl::StrFormat("writing %d ints into buffer '%s' (%s, %d elements): a bug", values.size(),
                        b.name, plan::DTypeName(b.dtype), b.elements));
  }
  return ToDevice(Address(buffer), values.data(), b.bytes());
}

// ---------------------------------------------------------------------------------------------
// Running the plan.

// With several ranks the steps the plan's schedule puts beside the compute stream (halo
// exchanges and state scans: Plan.h's Step::stream, checked by ValidatePlan) run there, their
// scratch the end of the workspace's allocation.
void CudaExecutor::PlanBesideCompute() {
  join_before_.assign(plan_.steps.size(), kOnComputeStream);
  if (nccl_ == nullptr) return;
  const size_t beside_bytes = RoundUp(cuda_backend::BesideComputeWorkspaceBytes(plan_));
  workspace_bytes_ -= beside_bytes;
  beside_workspace_ =
      cuda::Workspace{static_cast<std::byte*>(workspace_) + workspace_bytes_, beside_bytes};
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    if (plan_.steps[i].stream == plan::Stream::kBeside)
      join_before_[i] = plan_.steps[i].join_before;
  }
}

absl::Status CudaExecutor::PrepareHostCopies() {
  host_copies_ = cuda_backend::PlanHostCopies(plan_);
  if (host_copies_.copies.empty()) return absl::OkStatus();
  HCP_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                               "cudaStreamCreate"));
  HCP_RETURN_IF_ERROR(
      FromCuda(cudaEventCreateWithFlags(&copy_start_, cudaEventDisableTiming), "cudaEventCreate"));
  for (const cuda_backend::HostCopy& copy : host_copies_.copies) {
    void* data = nullptr;
    const size_t bytes = std::max<size_t>(plan_.buffers[copy.buffer].bytes(), sizeof(int32_t));
    HCP_RETURN_IF_ERROR(FromCuda(cudaMallocHost(&data, bytes), "cudaMallocHost (expert ids)"));
    host_copy_data_.push_back(static_cast<int32_t*>(data));
    cudaEvent_t done = nullptr;
    HCP_RETURN_IF_ERROR(
        FromCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"));
    host_copy_done_.push_back(done);
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::QueueHostCopies(size_t after_step, cudaStream_t producer) {
  bool started = false;
  for (size_t c = 0; c < host_copies_.copies.size(); ++c) {
    const cuda_backend::HostCopy& copy = host_copies_.copies[c];
    if (copy.after_step != after_step) continue;
    if (!started) {
      HCP_RETURN_IF_ERROR(FromCuda(cudaEventRecord(copy_start_, producer), "cudaEventRecord"));
      HCP_RETURN_IF_ERROR(
          FromCuda(cudaStreamWaitEvent(copy_stream_, copy_start_, 0), "cudaStreamWaitEvent"));
      started = true;
    }
    HCP_RETURN_IF_ERROR(FromCuda(
        cudaMemcpyAsync(host_copy_data_[c], Address(copy.buffer),
                        plan_.buffers[copy.buffer].bytes(), cudaMemcpyDeviceToHost, copy_stream_),
        "copying the expert ids to the host"));
    HCP_RETURN_IF_ERROR(
        FromCuda(cudaEventRecord(host_copy_done_[c], copy_stream_), "cudaEventRecord"));
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::WaitForHostCopy(size_t step) const {
  const cudaEvent_t done = host_copy_done_[host_copies_.copy_of_step[step]];
  if (nccl_ == nullptr) {
    return FromCuda(cudaEventSynchronize(done), "waiting for the expert ids' host copy");
  }
  nccl_->Wait(done, plan::StepLabel(plan_, step) + "'s expert ids");  // the job ends on failure
  return absl::OkStatus();
}

// A gradient can be summed once the last step that touches any byte of it (writes it, or reads
// it to add to it) has run; steps may use a gradient through a view: compare byte ranges in the
// Gradients arena.
void CudaExecutor::OrderGradientsByReadiness() {
  std::vector<std::pair<size_t, uint32_t>> ready;  // (last writing step, parameter)
  for (uint32_t i = 0; i < plan_.parameters.size(); ++i) {
    const plan::Buffer& g = plan_.buffers[plan_.parameters[i].gradient];
    size_t last = 0;
    for (size_t s = 0; s < plan_.steps.size(); ++s) {
      for (const std::vector<uint32_t>* list : {&plan_.steps[s].ins, &plan_.steps[s].outs}) {
        for (uint32_t index : *list) {
          if (plan_.buffers[index].Overlaps(g)) last = s;
        }
      }
    }
    ready.push_back({last, i});
  }
  std::stable_sort(ready.begin(), ready.end());
  for (const auto& [step, parameter] : ready) {
    ready_after_step_.push_back(step);
    ready_order_.push_back(parameter);
  }
}

// One NCCL launch for the lot. bf16 gradients are summed in bf16 (one rounding per addition, as
// a bf16 data-parallel all-reduce is); the f32 ones (dt_bias, A_log, D) in f32. With the
// optimizer sharded, a rank needs only its slice of the sum: reduce-scatter, half the bytes.
void CudaExecutor::QueueGradientSums(size_t first, size_t last, cudaStream_t stream) {
  nccl_->GroupStart();
  for (size_t r = first; r < last; ++r) {
    const uint32_t index = ready_order_[r];
    const uint32_t gradient = plan_.parameters[index].gradient;
    const plan::Buffer& g = plan_.buffers[gradient];
    std::byte* data = Address(gradient);
    const OptimizerSlice& slice = slices_[index];
    if (slice.split) {
      nccl_->ReduceScatterSum(data, data + slice.begin * plan::DTypeSize(g.dtype), slice.count,
                              NcclTypeOf(g.dtype), comm::Group::kWorld, stream);
      gradients_scattered_ = true;
      continue;
    }
    // A sharded (expert) gradient is summed over the ranks holding the same experts.
    const bool sharded = plan_.parameters[index].sharded();
    nccl_->AllReduceSum(data, data, g.elements, NcclTypeOf(g.dtype),
                        sharded ? comm::Group::kEpReplica : comm::Group::kWorld, stream);
  }
  nccl_->GroupEnd();
}

void CudaExecutor::StartGradientSums(size_t first, size_t last) {
  cudaEventRecord(grads_ready_, stream_);
  cudaStreamWaitEvent(grad_stream_, grads_ready_, 0);
  QueueGradientSums(first, last, grad_stream_);
}

absl::Status CudaExecutor::RunStepAndSumGradients() {
  absl::Status status = RunSteps(nullptr, /*sum_gradients=*/nccl_ != nullptr);
  if (nccl_ == nullptr) return status;
  return comm::AgreeOnStatus(communicator(), status);
}

absl::Status CudaExecutor::RunStep() {
  absl::Status status = RunSteps(nullptr);
  if (nccl_ == nullptr) return status;
  return comm::AgreeOnStatus(communicator(), status);
}

absl::Status CudaExecutor::RunStepProfiled(std::vector<double>* ms_per_kernel,
                                           double* gradient_sums_after_ms) {
  if (ms_per_kernel->size() < static_cast<size_t>(plan::kNumKernels)) {
    ms_per_kernel->resize(plan::kNumKernels, 0.0);
  }
  absl::Status status =
      RunSteps(ms_per_kernel, /*sum_gradients=*/nccl_ != nullptr, gradient_sums_after_ms);
  if (nccl_ == nullptr) return status;
  return comm::AgreeOnStatus(communicator(), status);
}

bool CudaExecutor::StepsCanBeGraphed(bool profile, bool sum_gradients) const {
  if (profile || sum_gradients || nccl_ != nullptr || graphs_off_) return false;
  if (!host_copies_.copies.empty()) return false;
  const char* setting = std::getenv("HCP_CUDA_GRAPHS");
  return setting == nullptr || std::string_view(setting) != "0";
}

absl::Status CudaExecutor::CaptureSteps(const std::function<absl::Status()>& queue) {
  cudaGraphExec_t& step_graph = step_graphs_[packs_documents_ ? 1 : 0];
  // Relaxed: the steps' one-time setup calls (cudaFuncSetAttribute, ...) are allowed meanwhile.
  HCP_RETURN_IF_ERROR(FromCuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed),
                               "cudaStreamBeginCapture"));
  const absl::Status queued = queue();
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  if (queued.ok() && err == cudaSuccess) err = cudaGraphInstantiate(&step_graph, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!queued.ok()) return queued;
  if (err != cudaSuccess) {
    // Something in the steps cannot be captured: they are queued one by one from now on.
    cudaGetLastError();
    step_graph = nullptr;
    graphs_off_ = true;
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::RunSteps(std::vector<double>* ms_per_kernel, bool sum_gradients,
                                    double* gradient_sums_after_ms) {
  HCP_RETURN_IF_ERROR(Activate());
  gradients_scattered_ = false;  // the steps write every gradient whole
  const bool profile = ms_per_kernel != nullptr;
  const size_t steps = plan_.steps.size();
  if (gradient_sums_after_ms != nullptr) *gradient_sums_after_ms = 0;
  if (profile && events_.size() != steps + 2) {
    for (std::vector<cudaEvent_t>* list : {&events_, &join_events_}) {
      for (cudaEvent_t event : *list) cudaEventDestroy(event);
      list->assign(steps + 2, nullptr);
      for (cudaEvent_t& event : *list) {
        HCP_RETURN_IF_ERROR(FromCuda(cudaEventCreate(&event), "cudaEventCreate"));
      }
    }
  }
  const cuda_backend::StepResources resources{
      .stream = stream_,
      .gemm = gemm_,
      .workspace = cuda::Workspace{workspace_, workspace_bytes_},
      .bad_position = bad_position_,
      .nccl = nccl_,
      .comm_stream = comm_stream_,
      .compute_done = compute_done_,
      .comm_done = comm_done_,
      .packs_documents = packs_documents_};
  cuda_backend::StepResources beside = resources;
  beside.stream = beside_stream_;
  beside.workspace = beside_workspace_;
  if (profile) {
    HCP_RETURN_IF_ERROR(FromCuda(cudaEventRecord(events_[0], stream_), "cudaEventRecord"));
  }
  std::vector<std::pair<size_t, size_t>> joins;  // profiled: (collective, step joined before)
  auto queue = [&]() -> absl::Status {
    // The kernels lower bad_position to the first bad token id / target they see.
    HCP_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(bad_position_, bad_position_ + 1, sizeof(int32_t),
                                                 cudaMemcpyDeviceToDevice, stream_),
                                 "resetting the bad-position flag"));
    size_t summed = 0;                    // gradient sums started, in ready_order_
    size_t in_flight = kOnComputeStream;  // the step running beside the compute stream
    auto join = [&](size_t before) {      // the compute stream waits for the step beside it
      cudaStreamWaitEvent(stream_, beside_done_, 0);
      if (profile) {
        cudaEventRecord(join_events_[before], stream_);
        joins.push_back({in_flight, before});
      }
      in_flight = kOnComputeStream;
    };
    HCP_RETURN_IF_ERROR(QueueHostCopies(cuda_backend::kBeforeTheSteps, stream_));
    for (size_t i = 0; i < steps; ++i) {
      if (sum_gradients) {  // the gradients complete before step i: sum them while it runs
        size_t ready = summed;
        while (ready < ready_order_.size() && ready_after_step_[ready] < i) ++ready;
        if (ready > summed) StartGradientSums(summed, ready);
        summed = ready;
      }
      if (in_flight != kOnComputeStream && join_before_[in_flight] == i) join(i);
      const bool is_beside = join_before_[i] != kOnComputeStream;
      if (is_beside) {  // starts after the work queued so far, runs beside what follows
        cudaEventRecord(beside_start_, stream_);
        cudaStreamWaitEvent(beside_stream_, beside_start_, 0);
      }
      cuda_backend::StepResources step_resources = is_beside ? beside : resources;
      absl::Status status;
      if (host_copies_.copy_of_step[i] >= 0) {
        status = WaitForHostCopy(i);
        step_resources.host_expert_ids = host_copy_data_[host_copies_.copy_of_step[i]];
      }
      if (status.ok()) status = cuda_backend::RunCudaStep(plan_, i, arena_bases_, step_resources);
      if (status.ok()) status = QueueHostCopies(i, step_resources.stream);
      if (is_beside) {
        cudaEventRecord(beside_done_, beside_stream_);
        in_flight = i;
      }
      if (!status.ok()) {
        // Let the queued steps finish before anyone reads buffers. With several ranks the others
        // now wait in a collective this rank will not join: their Wait times out and ends the job
        // (a refusal here is a bug CheckPlanRunsOnCuda should have caught, or a launch failure).
        cudaStreamSynchronize(stream_);
        cudaStreamSynchronize(beside_stream_);
        if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
        return status;
      }
      if (profile) {
        HCP_RETURN_IF_ERROR(FromCuda(cudaEventRecord(events_[i + 1], stream_), "cudaEventRecord"));
      }
    }
    if (in_flight != kOnComputeStream) join(steps);
    if (sum_gradients) {
      if (summed < ready_order_.size()) StartGradientSums(summed, ready_order_.size());
      if (profile) cudaEventRecord(events_[steps + 1], grad_stream_);
      cudaEventRecord(grads_summed_, grad_stream_);
      cudaStreamWaitEvent(stream_, grads_summed_, 0);
    }
    return absl::OkStatus();
  };
  cudaGraphExec_t& step_graph = step_graphs_[packs_documents_ ? 1 : 0];
  if (!StepsCanBeGraphed(profile, sum_gradients)) {
    HCP_RETURN_IF_ERROR(queue());
  } else if (step_graph == nullptr && runs_before_capture_ > 0) {
    --runs_before_capture_;
    HCP_RETURN_IF_ERROR(queue());
  } else {
    if (step_graph == nullptr) HCP_RETURN_IF_ERROR(CaptureSteps(queue));
    if (step_graph != nullptr) {
      HCP_RETURN_IF_ERROR(FromCuda(cudaGraphLaunch(step_graph, stream_), "cudaGraphLaunch"));
    } else {
      HCP_RETURN_IF_ERROR(queue());  // graphs are off now
    }
  }
  // A kernel that faults surfaces here; which step it was is not known without waiting after
  // every step (compute-sanitizer or CUDA_LAUNCH_BLOCKING=1 tell).
  HCP_RETURN_IF_ERROR(Wait("running the plan's steps"));
  int32_t bad_position = kNoBadPosition;
  HCP_RETURN_IF_ERROR(ToHost(&bad_position, bad_position_, sizeof(int32_t)));
  SampleMemory();
  if (bad_position != kNoBadPosition) return DescribeBadInput(bad_position);
  if (profile) {
    for (size_t i = 0; i < steps; ++i) {
      float ms = 0;
      HCP_RETURN_IF_ERROR(
          FromCuda(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]), "cudaEventElapsedTime"));
      (*ms_per_kernel)[static_cast<size_t>(plan_.steps[i].kernel)] += ms;
    }
    // A collective beside the compute stream counts the time the compute stream waited for it
    // (the wait sits at the start of the step it was joined before, whose time it leaves).
    for (const auto& [collective, before] : joins) {
      float ms = 0;
      HCP_RETURN_IF_ERROR(FromCuda(cudaEventElapsedTime(&ms, events_[before], join_events_[before]),
                                   "cudaEventElapsedTime"));
      (*ms_per_kernel)[static_cast<size_t>(plan_.steps[collective].kernel)] += ms;
      if (before < steps) (*ms_per_kernel)[static_cast<size_t>(plan_.steps[before].kernel)] -= ms;
    }
    if (sum_gradients && gradient_sums_after_ms != nullptr) {
      float ms = 0;
      HCP_RETURN_IF_ERROR(FromCuda(cudaEventElapsedTime(&ms, events_[steps], events_[steps + 1]),
                                   "cudaEventElapsedTime"));
      *gradient_sums_after_ms = std::max(0.0f, ms);
    }
  }
  return absl::OkStatus();
}

// The kernels only say that some position was bad: find the first step (in plan order) that has
// a bad token id or target, and its first bad position, to say what CpuExecutor would say.
absl::Status CudaExecutor::DescribeBadInput(int32_t position) const {
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    const std::optional<CheckedIds> ids = CheckedIdsOf(plan_.steps[i]);
    if (!ids) continue;
    std::vector<int32_t> values(ids->tokens);
    HCP_RETURN_IF_ERROR(ToHost(values.data(), Address(ids->buffer), sizeof(int32_t) * ids->tokens));
    for (int64_t t = 0; t < ids->tokens; ++t) {
      const int32_t v = values[t];
      const bool in_vocabulary = v >= 0 && v < ids->vocab;
      if (!ids->ignore_index && !in_vocabulary) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: embedding: token id %d at position %d is outside the vocabulary [0, %d)",
            plan::StepLabel(plan_, i), v, t, ids->vocab));
      }
      if (ids->ignore_index && v != *ids->ignore_index && !in_vocabulary) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: cross_entropy: target %d at position %d is neither the ignore index %d nor in "
            "[0, %d)",
            plan::StepLabel(plan_, i), v, t, *ids->ignore_index, ids->vocab));
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "a kernel reported a bad token id or target at position %d, but the plan's ids and targets "
      "are all in range now",
      position));
}

// ---------------------------------------------------------------------------------------------
// The optimizer.

absl::Status CudaExecutor::InitOptimizer() {
  HCP_RETURN_IF_ERROR(Activate());
  if (optimizer_memory_ == nullptr) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < plan_.parameters.size(); ++i) {
      bytes += OptimizerBytes(plan_, plan_.parameters[i], slices_[i]);
    }
    HCP_RETURN_IF_ERROR(Allocate(&optimizer_memory_, bytes, "the optimizer state"));
    optimizer_tables_.bytes = cuda::adamw_update_many_workspace_bytes(CountsOf(slices_));
    HCP_RETURN_IF_ERROR(
        Allocate(&optimizer_tables_.ptr, optimizer_tables_.bytes, "the optimizer's tables"));
  }
  optimizer_.assign(plan_.parameters.size(), OptimizerSlot{});
  auto* next = static_cast<std::byte*>(optimizer_memory_);
  auto take = [&next](uint64_t elements) {
    auto* piece = reinterpret_cast<float*>(next);
    next += RoundUp(elements * sizeof(float));
    return piece;
  };
  for (size_t i = 0; i < plan_.parameters.size(); ++i) {
    const plan::Parameter& p = plan_.parameters[i];
    const plan::Buffer& value = plan_.buffers[p.buffer];
    const OptimizerSlice& slice = slices_[i];
    OptimizerSlot& slot = optimizer_[i];
    if (value.dtype == plan::DType::BF16) {
      slot.master = take(slice.count);
      HCP_RETURN_IF_ERROR(cuda_backend::FromCuda(cuda::cast(
          stream_, slot.master,
          reinterpret_cast<const cuda::bf16*>(Address(p.buffer)) + slice.begin, slice.count)));
    } else {
      slot.master = reinterpret_cast<float*>(Address(p.buffer)) + slice.begin;
    }
    slot.m = take(slice.count);
    slot.v = take(slice.count);
    HCP_RETURN_IF_ERROR(FromCuda(cudaMemsetAsync(slot.m, 0, slice.count * sizeof(float), stream_),
                                 "cudaMemsetAsync"));
    HCP_RETURN_IF_ERROR(FromCuda(cudaMemsetAsync(slot.v, 0, slice.count * sizeof(float), stream_),
                                 "cudaMemsetAsync"));
  }
  HCP_RETURN_IF_ERROR(FromCuda(cudaStreamSynchronize(stream_), "initialising the optimizer state"));
  SampleMemory();
  return absl::OkStatus();
}

absl::Status CudaExecutor::StashGradients(bool first) {
  HCP_RETURN_IF_ERROR(Activate());
  if (gradient_stash_ == nullptr) {
    // Every byte offset doubled: a bf16 gradient's fp32 sum takes twice its bytes, an f32 one's
    // its own, and no two gradients' sums meet.
    const uint64_t bytes = 2 * RoundUp(plan_.arena_bytes[static_cast<int>(plan::Arena::Gradients)]);
    void* memory = nullptr;
    HCP_RETURN_IF_ERROR(Allocate(&memory, bytes, "the gradient accumulation stash"));
    gradient_stash_ = static_cast<std::byte*>(memory);
  }
  return AddGradients(first ? GradientSum::kStart : GradientSum::kIntoStash);
}

absl::Status CudaExecutor::AddStashedGradients() {
  if (gradient_stash_ == nullptr) {
    return absl::FailedPreconditionError("AddStashedGradients before StashGradients");
  }
  HCP_RETURN_IF_ERROR(Activate());
  return AddGradients(GradientSum::kIntoGradients);
}

// Parameter by parameter, in fp32: the stash = the gradients (kStart), the stash += the
// gradients (kIntoStash), or the gradients = the stash + the gradients, rounded to the
// gradient's dtype once (kIntoGradients).
absl::Status CudaExecutor::AddGradients(GradientSum what) {
  for (const plan::Parameter& p : plan_.parameters) {
    const plan::Buffer& g = plan_.buffers[p.gradient];
    std::byte* gradient = Address(p.gradient);
    auto* sum = reinterpret_cast<float*>(gradient_stash_ + 2 * g.offset);
    const auto n = static_cast<int64_t>(g.elements);
    cuda::Status s;
    if (g.dtype == plan::DType::BF16) {
      auto* bf16_gradient = reinterpret_cast<cuda::bf16*>(gradient);
      if (what == GradientSum::kStart) {
        s = cuda::cast(stream_, sum, bf16_gradient, n);
      } else {
        s = cuda::accumulate(stream_, sum, bf16_gradient, n);
        if (s.ok() && what == GradientSum::kIntoGradients) {
          s = cuda::cast(stream_, bf16_gradient, sum, n);
        }
      }
    } else {
      auto* f32_gradient = reinterpret_cast<float*>(gradient);
      float* out = what == GradientSum::kIntoGradients ? f32_gradient : sum;
      s = what == GradientSum::kStart
              ? cuda::copy(stream_, sum, f32_gradient, n)
              : cuda::binary(stream_, cuda::BinaryOp::kAdd, out, sum, f32_gradient, n, n);
    }
    HCP_RETURN_IF_ERROR(cuda_backend::FromCuda(s));
  }
  return FromCuda(cudaStreamSynchronize(stream_), "accumulating the gradients");
}

absl::Status CudaExecutor::SumGradientsOverRanks() {
  if (nccl_ == nullptr) return absl::OkStatus();
  HCP_RETURN_IF_ERROR(Activate());
  QueueGradientSums(0, ready_order_.size(), stream_);
  return Wait("summing the gradients over the ranks");
}

absl::StatusOr<std::vector<double>> CudaExecutor::GradientSquares() {
  HCP_RETURN_IF_ERROR(Activate());
  const size_t count = plan_.parameters.size();
  std::vector<cuda::SquaresTensor> tensors;
  for (size_t i = 0; i < count; ++i) {
    const plan::Buffer& g = plan_.buffers[plan_.parameters[i].gradient];
    // A sliced gradient: this rank's slice (all a reduce-scatter leaves summed here).
    cuda::SquaresTensor t;
    t.x = Address(plan_.parameters[i].gradient) + slices_[i].begin * plan::DTypeSize(g.dtype);
    t.is_bf16 = g.dtype == plan::DType::BF16;
    t.n = slices_[i].count;
    tensors.push_back(t);
  }
  HCP_RETURN_IF_ERROR(cuda_backend::FromCuda(
      cuda::sum_of_squares_many(stream_, squares_, tensors, squares_tables_)));
  std::vector<double> squares(count);
  HCP_RETURN_IF_ERROR(ToHost(squares.data(), squares_, sizeof(double) * count));
  return squares;
}

absl::Status CudaExecutor::OptimizerStep(const cuda::AdamWStep& step,
                                         const std::function<bool(const plan::Parameter&)>& decay) {
  HCP_RETURN_IF_ERROR(Activate());
  if (optimizer_.size() != plan_.parameters.size()) {
    return absl::FailedPreconditionError("OptimizerStep before InitOptimizer");
  }
  // Every parameter's slice in one launch.
  std::vector<cuda::AdamWTensor> tensors;
  for (size_t i = 0; i < plan_.parameters.size(); ++i) {
    const plan::Parameter& p = plan_.parameters[i];
    const plan::Buffer& value = plan_.buffers[p.buffer];
    const plan::Buffer& gradient = plan_.buffers[p.gradient];
    const OptimizerSlot& slot = optimizer_[i];
    const OptimizerSlice& slice = slices_[i];
    cuda::AdamWTensor t;
    t.master = slot.master;
    // A bf16 parameter is the compute copy of its master; an f32 one is its own master.
    t.param = value.dtype == plan::DType::BF16
                  ? reinterpret_cast<cuda::bf16*>(Address(p.buffer)) + slice.begin
                  : nullptr;
    t.grad = Address(p.gradient) + slice.begin * plan::DTypeSize(gradient.dtype);
    t.grad_is_bf16 = gradient.dtype == plan::DType::BF16;
    t.m = slot.m;
    t.v = slot.v;
    t.n = slice.count;
    t.decay = decay ? decay(p) : step.decay;
    tensors.push_back(t);
  }
  HCP_RETURN_IF_ERROR(FromCuda(cuda::adamw_update_many(stream_, tensors, step, optimizer_tables_)));
  if (nccl_ == nullptr) return FromCuda(cudaStreamSynchronize(stream_), "the optimizer step");
  // Every rank updated its slices: all of them gather the updated values, in place.
  nccl_->GroupStart();
  for (size_t i = 0; i < plan_.parameters.size(); ++i) {
    const OptimizerSlice& slice = slices_[i];
    if (!slice.split) continue;
    const plan::Buffer& value = plan_.buffers[plan_.parameters[i].buffer];
    std::byte* data = Address(plan_.parameters[i].buffer);
    nccl_->AllGather(data + slice.begin * plan::DTypeSize(value.dtype), data, slice.count,
                     NcclTypeOf(value.dtype), comm::Group::kWorld, stream_);
  }
  nccl_->GroupEnd();
  return Wait("the optimizer step");
}

absl::StatusOr<const CudaExecutor::OptimizerSlot*> CudaExecutor::SlotOf(
    std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const plan::Parameter* p, FindParameterOrError(name));
  if (optimizer_.size() != plan_.parameters.size()) {
    return absl::FailedPreconditionError("no optimizer state before InitOptimizer");
  }
  return &optimizer_[p - plan_.parameters.data()];
}

absl::StatusOr<std::vector<float>> CudaExecutor::OptimizerArray(
    std::string_view name, float* OptimizerSlot::*array) const {
  HCP_ASSIGN_OR_RETURN(const OptimizerSlot* slot, SlotOf(name));
  const plan::Parameter& p = *FindParameter(name);
  return GatherSlices(p, DownloadF32(slot->*array, slices_[&p - plan_.parameters.data()].count));
}
absl::StatusOr<std::vector<float>> CudaExecutor::Master(std::string_view name) const {
  return OptimizerArray(name, &OptimizerSlot::master);
}
absl::StatusOr<std::vector<float>> CudaExecutor::ExpAvg(std::string_view name) const {
  return OptimizerArray(name, &OptimizerSlot::m);
}
absl::StatusOr<std::vector<float>> CudaExecutor::ExpAvgSq(std::string_view name) const {
  return OptimizerArray(name, &OptimizerSlot::v);
}

absl::Status CudaExecutor::SetOptimizerState(std::string_view name, std::span<const float> master,
                                             std::span<const float> m, std::span<const float> v) {
  HCP_ASSIGN_OR_RETURN(const OptimizerSlot* slot, SlotOf(name));
  const plan::Parameter& p = *FindParameter(name);
  const uint64_t n = plan_.buffers[p.buffer].elements;
  if (master.size() != n || m.size() != n || v.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("optimizer state of '%s': %d / %d / %d values for a parameter of %d", name,
                        master.size(), m.size(), v.size(), n));
  }
  // This rank's slice of the state (all of it unless the optimizer is sharded).
  const OptimizerSlice& slice = slices_[&p - plan_.parameters.data()];
  const size_t bytes = sizeof(float) * slice.count;
  HCP_RETURN_IF_ERROR(ToDevice(slot->m, m.data() + slice.begin, bytes));
  HCP_RETURN_IF_ERROR(ToDevice(slot->v, v.data() + slice.begin, bytes));
  HCP_RETURN_IF_ERROR(ToDevice(slot->master, master.data() + slice.begin, bytes));
  // The compute copy, whole, rounded from the master (an f32 parameter is its own master: its
  // slice is set above, the rest of it here).
  if (plan_.buffers[p.buffer].dtype == plan::DType::BF16 || slice.split) {
    HCP_RETURN_IF_ERROR(WriteFloats(p.buffer, master));
  }
  return absl::OkStatus();
}

}  // namespace hcp
