// Building a plan file from C++: what the compiler's plan writer and the tests use.
//
//   PlanBuilder b;
//   b.set_shape(/*micro_batch=*/2, /*seq=*/8);
//   auto [ids, targets] = b.AllocateInputs();
//   auto [embed, dembed] = b.AddParameter("model.embed_tokens.weight", {vocab, hidden},
//                                         ParamInit::Normal, 0.02);
//   uint32_t x = b.Allocate("act.x", Arena::Activations, {16, hidden});
//   b.AddStep("embedding.forward", {embed, ids}, {x}, {16, vocab, hidden}, {1.0});
//   ...
//   b.set_loss(loss);
//   absl::StatusOr<std::string> bytes = b.Finish();  // the file, validated by loading it back
//
// The builder itself checks nothing: it writes what it is told, so tests can write broken plans
// with FinishUnchecked(). Finish() and Write() refuse a plan that LoadPlan would refuse, with
// LoadPlan's message.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/plan/Plan.h"

namespace hcp::plan {

// Allocate() places buffers at multiples of this many bytes.
inline constexpr uint64_t kBufferAlignment = 64;

class PlanBuilder {
 public:
  // A step as written to the file: the kernel by name, so a test can name one that is unknown.
  struct StepSpec {
    std::string kernel;
    std::vector<uint32_t> ins;
    std::vector<uint32_t> outs;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    Stream stream = Stream::kCompute;
    uint32_t join_before = 0;
  };
  struct ParameterBuffers {
    uint32_t value;     // in Parameters
    uint32_t gradient;  // in Gradients
  };

  PlanBuilder& set_producer(std::string producer);
  PlanBuilder& set_model(std::string model);
  PlanBuilder& set_model_config(std::string config_json);
  // seq is the GLOBAL sequence length; with a mesh each rank holds seq / cp tokens of it.
  PlanBuilder& set_shape(int64_t micro_batch, int64_t seq);
  // The ranks the plan runs on. Without this call the file has no mesh (one rank).
  PlanBuilder& set_mesh(Mesh mesh);
  // Drops the mesh again (a file without one).
  PlanBuilder& clear_mesh();
  // The mesh as set, or one rank.
  Mesh mesh() const { return mesh_.value_or(Mesh{}); }
  PlanBuilder& set_flops_per_step(double flops);

  // A buffer at the end of `arena` (rounded up to kBufferAlignment); elements = product(shape).
  uint32_t Allocate(std::string name, Arena arena, std::vector<int64_t> shape,
                    DType dtype = DType::F32);
  // A buffer at an explicit byte offset (the compiler's memory planner chooses offsets, and two
  // buffers may share bytes when their lifetimes do not overlap); elements = product(shape).
  uint32_t AddBuffer(std::string name, Arena arena, uint64_t offset, std::vector<int64_t> shape,
                     DType dtype = DType::F32);
  // A buffer exactly as given, `elements` included.
  uint32_t AddBuffer(Buffer buffer);

  // A trainable parameter: its value in Parameters and its gradient (named "<name>.grad") in
  // Gradients, both allocated at the end of their arena.
  ParameterBuffers AddParameter(std::string name, std::vector<int64_t> shape, ParamInit init,
                                double std = 0.0);
  // An expert-parallel parameter: this rank's rows of a checkpoint tensor of `full_shape`, split
  // along dim 0 into `shards` parts (the mesh's ep): buffers of [full_shape[0] / shards, ...].
  // Add sharded parameters after the replicated ones (their gradients must come last).
  ParameterBuffers AddShardedParameter(std::string name, std::vector<int64_t> full_shape,
                                       int64_t shards, ParamInit init, double std = 0.0);
  // A parameter over buffers that already exist.
  void AddParameter(Parameter parameter);

  // Allocates input_ids and targets, I32 [micro_batch, seq / cp] in Inputs (this rank's
  // tokens; set_shape and set_mesh first), and makes them the plan's inputs.
  struct InputBuffers {
    uint32_t input_ids;
    uint32_t targets;
    uint32_t loss_scale;
  };
  InputBuffers AllocateInputs();
  PlanBuilder& set_input_ids(uint32_t buffer);
  PlanBuilder& set_targets(uint32_t buffer);
  PlanBuilder& set_loss(uint32_t buffer);
  PlanBuilder& set_loss_scale(uint32_t buffer);
  // The MoE load-balancing loss's coefficient, scale input and result (Plan::RouterAuxLoss).
  PlanBuilder& set_router_aux_loss(Plan::RouterAuxLoss aux);
  // Packed documents: the position_ids input (Plan::position_ids).
  PlanBuilder& set_position_ids(uint32_t buffer);

  // Arenas are sized to end at their last buffer unless set here (then exactly as given).
  PlanBuilder& SetArenaBytes(Arena arena, uint64_t bytes);

  // Returns the step's index.
  size_t AddStep(std::string kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs,
                 std::vector<int64_t> ints = {}, std::vector<double> floats = {});
  size_t AddStep(KernelId kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs,
                 std::vector<int64_t> ints = {}, std::vector<double> floats = {});

  // What has been added so far, for callers that patch a plan before writing it.
  size_t num_buffers() const { return buffers_.size(); }
  Buffer& buffer(uint32_t index) { return buffers_.at(index); }
  const Buffer& buffer(uint32_t index) const { return buffers_.at(index); }
  Parameter& parameter(size_t index) { return parameters_.at(index); }
  StepSpec& step(size_t index) { return steps_.at(index); }
  size_t num_steps() const { return steps_.size(); }
  uint64_t arena_bytes(Arena arena) const;

  // The plan file's bytes, header included, without any check (empty names are written as
  // absent fields).
  std::string FinishUnchecked() const;
  // The plan file's bytes, after loading them back with ParsePlan.
  absl::StatusOr<std::string> Finish() const;
  // Finish(), then write `path` atomically (readers see the old file or the whole new one).
  absl::Status Write(const std::string& path) const;

 private:
  uint64_t UsedBytes(Arena arena) const;

  std::string producer_ = "hybridcp";
  std::string model_;
  std::string model_config_;
  int64_t seq_ = 0;
  int64_t micro_batch_ = 0;
  double flops_per_step_ = 0.0;
  std::optional<Mesh> mesh_;
  std::array<std::optional<uint64_t>, kNumArenas> arena_bytes_{};
  std::vector<Buffer> buffers_;
  std::vector<Parameter> parameters_;
  uint32_t input_ids_ = 0;
  uint32_t targets_ = 0;
  uint32_t loss_ = 0;
  uint32_t loss_scale_ = 0;
  std::optional<Plan::RouterAuxLoss> router_aux_loss_;
  std::optional<uint32_t> position_ids_;
  std::vector<StepSpec> steps_;
};

}  // namespace hcp::plan
