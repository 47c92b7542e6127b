// The plan as plain C++: what one rank executes for one training step. LoadPlan (PlanFile.h)
// produces it from a plan file after checking everything in it; the executors read it.
//
// The fields mirror plan.fbs one to one. Buffer, parameter and step lists are indexed the way
// the file indexes them, so "buffer 17" means the same thing in a message, in `inspect` and here.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "runtime/plan/KernelTable.h"
#include "runtime/support/DType.h"
#include "runtime/support/IgnoredTarget.h"

namespace hcp::plan {

// A buffer's element type: F32, BF16 or I32 of the one DType (runtime/support/DType.h).
using ::hcp::DType;
using ::hcp::DTypeName;
using ::hcp::DTypeSize;
// Same values as plan.fbs's enums (PlanFile.cpp checks that at compile time).
enum class Arena : uint8_t { Parameters = 0, Gradients = 1, Activations = 2, Inputs = 3 };
enum class ParamInit : uint8_t { Normal = 0, Zeros = 1, Ones = 2, LogArange = 3 };
enum class SequenceLayout : uint8_t { Contiguous = 0, Zigzag = 1 };

inline constexpr int kNumArenas = 4;
inline constexpr int kNumDTypes = 3;  // a plan's: F32, BF16, I32
inline constexpr int kNumParamInits = 4;
inline constexpr int kNumSequenceLayouts = 2;

// "parameters", "gradients", "activations", "inputs".
std::string_view ArenaName(Arena arena);
// "normal", "zeros", "ones", "log_arange".
std::string_view ParamInitName(ParamInit init);
// "contiguous", "zigzag".
std::string_view SequenceLayoutName(SequenceLayout layout);

// The ranks a plan runs on and how the global sequence is split over them (plan.fbs's Mesh).
// world = dp * cp ranks; world rank = dp_index * cp + cp_index. The cp ranks of one dp_index
// share one sequence: it is cut into segments() segments of seq / segments() tokens, and cp rank
// r holds segment r (contiguous) or segments r and 2*cp-1-r, in that order (zigzag). A rank's
// local tokens are its segments concatenated; its k-th segment is "local segment k".
//
// Expert parallelism cuts the world into world / ep groups of `ep` consecutive world ranks (the
// ep group of a rank is world_rank / ep). Within its group a rank has the expert index
// e_idx = world_rank % ep and holds experts [e_idx * E / ep, (e_idx + 1) * E / ep) of every MoE
// layer; the ranks with the same e_idx (one per ep group) hold copies of the same experts (the
// "ep replicas"). cp8 + ep8 on 8 ranks: the ep group is the cp group; cp1-dp4-ep4: it spans dp.
struct Mesh {
  int64_t cp = 1;
  int64_t dp = 1;
  SequenceLayout layout = SequenceLayout::Contiguous;
  int64_t ep = 1;

  int64_t world() const { return cp * dp; }
  // The expert index of a world rank, and its ep group.
  int64_t ExpertIndex(int64_t world_rank) const { return world_rank % ep; }
  int64_t EpGroup(int64_t world_rank) const { return world_rank / ep; }
  int64_t segments_per_rank() const { return layout == SequenceLayout::Zigzag ? 2 : 1; }
  // Segments of one sequence, over all cp ranks.
  int64_t segments() const { return cp * segments_per_rank(); }
  // The global index of local segment k (0 <= k < segments_per_rank()) of cp rank cp_index.
  int64_t GlobalSegment(int64_t cp_index, int64_t k) const {
    return k == 0 ? cp_index : 2 * cp - 1 - cp_index;
  }
  // Who holds global segment j (0 <= j < segments()): cp rank and local segment index.
  struct SegmentOwner {
    int64_t cp_index;
    int64_t k;
  };
  SegmentOwner OwnerOf(int64_t j) const {
    if (j < cp) return {j, 0};
    return {2 * cp - 1 - j, 1};  // zigzag only: segment j >= cp is rank 2cp-1-j's second
  }
  bool operator==(const Mesh&) const = default;
};

struct Buffer {
  std::string name;  // "model.layers.0.mamba.in_proj.weight", "act.123"
  Arena arena = Arena::Activations;
  uint64_t offset = 0;  // bytes from the start of the arena
  uint64_t elements = 0;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // product equals elements

  // Valid once ValidatePlan has passed (it rules out overflow).
  uint64_t bytes() const { return elements * DTypeSize(dtype); }
  // Whether the two share bytes: the same arena, intersecting [offset, offset + bytes()) (an
  // empty buffer shares nothing).
  bool Overlaps(const Buffer& other) const {
    if (arena != other.arena || elements == 0 || other.elements == 0) return false;
    return offset < other.offset + other.bytes() && other.offset < offset + bytes();
  }
};

struct Parameter {
  std::string name;       // Hugging Face checkpoint name
  uint32_t buffer = 0;    // in the Parameters arena
  uint32_t gradient = 0;  // in the Gradients arena, same element count
  ParamInit init = ParamInit::Normal;
  double std = 0.0;  // for Normal
  // Expert parallelism: the buffer holds rows [i * R / shards, (i + 1) * R / shards) along dim 0
  // of the checkpoint tensor of shape full_shape (R = full_shape[0]), i = the rank's expert index
  // (Mesh::ExpertIndex); shards is then the mesh's ep. 1: replicated, the whole tensor.
  int64_t shards = 1;
  // The checkpoint's shape; empty means the buffer's shape (only with shards = 1).
  std::vector<int64_t> full_shape;

  bool sharded() const { return shards > 1; }
};

// One kernel launch: ins/outs are buffer indices; ints/floats are the kernel's scalar
// arguments in the order of its signature (KernelTable.txt). Read and write steps through the
// kernel's argument struct: DecodeStep<SsdScanForwardArgs>(step), EncodeStep(args).
// Where a step runs: the plan's schedule, decided by the compiler (hcp-overlap-collectives) and
// checked by ValidatePlan. kCompute: on the compute stream, in step order. kBeside: a collective
// the kernel table marks `beside` (RunsBesideCompute), started after every step before it and
// run beside the steps that follow, until the compute stream waits for it before step
// join_before (steps.size(): the end). No step before the join touches what it reads or writes
// or communicates. A backend may run every step on one stream (the CPU does): the same result.
enum class Stream : uint8_t { kCompute = 0, kBeside = 1 };

struct Step {
  KernelId kernel = KernelId::Gemm;
  std::vector<uint32_t> ins;
  std::vector<uint32_t> outs;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  Stream stream = Stream::kCompute;
  uint32_t join_before = 0;  // kBeside only
};

// A step's arguments by name, for a step of kernel Args<>::kId that ValidatePlan has checked:
// buffers as resolve(buffer index) returns them (the indices themselves by default).
struct BufferIndex {
  uint32_t operator()(uint32_t index) const { return index; }
};
template <template <typename> class Args, typename Resolve = BufferIndex>
auto DecodeStep(const Step& step, Resolve&& resolve = {}) {
  using Buffer = decltype(resolve(uint32_t{}));
  return Args<Buffer>::Decode(step.ints, step.floats, step.ins, step.outs, resolve);
}
// The step that runs a kernel with these arguments.
template <typename Args>
Step EncodeStep(const Args& args) {
  EncodedStep<uint32_t> lists = args.Encode();
  return Step{Args::kId, std::move(lists.ins), std::move(lists.outs), std::move(lists.ints),
              std::move(lists.floats)};
}

using ::hcp::kIgnoredTarget;  // runtime/support/IgnoredTarget.h

struct Plan {
  std::string producer;      // "hybridcp 0.1.0"
  std::string model;         // config source (file or preset name)
  std::string model_config;  // the config.json text (empty in hand-built test plans)
  int64_t seq = 0;           // tokens per sequence (global)
  int64_t micro_batch = 0;   // sequences per micro-batch
  std::array<uint64_t, kNumArenas> arena_bytes{};  // indexed by Arena
  std::vector<Buffer> buffers;
  std::vector<Parameter> parameters;
  uint32_t input_ids = 0;   // I32 [micro_batch, seq / cp] in Inputs: this rank's tokens
  uint32_t targets = 0;     // I32 [micro_batch, seq / cp] in Inputs; -100 = ignored
  uint32_t loss = 0;        // F32 [1]: the micro-batch's scaled loss, summed over its cp group
  uint32_t loss_scale = 0;  // F32 [1] in Inputs: 1 / (valid tokens of the whole step)
  std::vector<Step> steps;
  double flops_per_step = 0.0;  // one micro-batch (the cp ranks of one dp replica together)
  Mesh mesh;                    // absent in the file: one rank
  // The MoE load-balancing loss, when the plan was compiled with it: the step differentiates
  // loss + coefficient * buffers[aux.loss], where the runtime sets buffers[aux.scale] (F32 [1],
  // Inputs) to 1 / (micro-batches of the optimizer step over every dp rank) and aux.loss (F32
  // [1]) is the micro-batch's load-balancing loss times it, summed over its cp group.
  struct RouterAuxLoss {
    double coefficient = 0;
    uint32_t scale = 0;
    uint32_t loss = 0;
  };
  std::optional<RouterAuxLoss> router_aux_loss;
  // Packed documents: I32 [micro_batch, seq / cp] in Inputs, this rank's share of position_ids
  // (each token's position in its document); the sequence kernels' `positions`. None: every
  // sequence is one document.
  std::optional<uint32_t> position_ids;

  uint64_t arena_size(Arena arena) const { return arena_bytes[static_cast<int>(arena)]; }
  // A parameter's checkpoint shape (its full_shape, or its buffer's).
  const std::vector<int64_t>& FullShape(const Parameter& p) const {
    return p.full_shape.empty() ? buffers[p.buffer].shape : p.full_shape;
  }
  // Where the gradients of sharded parameters start in the Gradients arena: every replicated
  // parameter's gradient lies before it, every sharded one's after it (ValidatePlan checks
  // this). The arena size when no parameter is sharded.
  uint64_t ShardedGradientsOffset() const;
  uint64_t total_arena_bytes() const;
  // Whether any buffer is bf16: a plan compiled with --dtype bf16, which the CUDA backend runs
  // (the CPU backend runs f32 plans).
  bool StoresBf16() const;
  // Tokens of one global micro-batch: micro_batch * seq (what CpuExecutor::SetInputs takes).
  int64_t tokens() const { return micro_batch * seq; }
  // Tokens per sequence on one rank, and of the rank's micro-batch (input_ids' size).
  int64_t local_seq() const { return seq / mesh.cp; }
  int64_t local_tokens() const { return micro_batch * local_seq(); }
};

// "step 12 (rms_norm.forward)": how every message about a step starts.
std::string StepLabel(const Plan& plan, size_t step_index);

// Every semantic rule a plan must satisfy before it runs: the mesh, arena sizes, buffer extents
// (no overflow), shapes, parameters, inputs and loss, and for each step the kernel's arity, buffer
// indices, dtypes, element counts implied by its ints, int ranges and in/out aliasing.
// The error names the step, kernel and argument:
//   "step 12 (rms_norm.forward): input 0 'act.7' has 100 elements, expected rows*dim = 128".
// LoadPlan runs this; executors run it again on the Plan they are given (it is cheap), so a
// Plan assembled in memory can never reach a kernel unchecked.
absl::Status ValidatePlan(const Plan& plan);

}  // namespace hcp::plan
