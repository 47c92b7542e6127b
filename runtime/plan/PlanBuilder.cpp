#include "runtime/plan/PlanBuilder.h"

#include <algorithm>

#include "flatbuffers/flatbuffers.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/plan/plan_generated.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Status.h"

namespace hcp::plan {
namespace {

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

uint64_t ShapeElements(const std::vector<int64_t>& shape) {
  uint64_t elements = 1;
  for (int64_t dim : shape) elements *= static_cast<uint64_t>(dim);
  return elements;
}

// Empty strings become absent fields, so tests can write a plan whose names are missing.
flatbuffers::Offset<flatbuffers::String> StringOrAbsent(flatbuffers::FlatBufferBuilder& fbb,
                                                        const std::string& s) {
  return s.empty() ? 0 : fbb.CreateString(s);
}

}  // namespace

PlanBuilder& PlanBuilder::set_producer(std::string producer) {
  producer_ = std::move(producer);
  return *this;
}
PlanBuilder& PlanBuilder::set_model_config(std::string config_json) {
  model_config_ = std::move(config_json);
  return *this;
}

PlanBuilder& PlanBuilder::set_model(std::string model) {
  model_ = std::move(model);
  return *this;
}
PlanBuilder& PlanBuilder::set_shape(int64_t micro_batch, int64_t seq) {
  micro_batch_ = micro_batch;
  seq_ = seq;
  return *this;
}
PlanBuilder& PlanBuilder::set_mesh(Mesh mesh) {
  mesh_ = mesh;
  return *this;
}
PlanBuilder& PlanBuilder::clear_mesh() {
  mesh_.reset();
  return *this;
}
PlanBuilder& PlanBuilder::set_flops_per_step(double flops) {
  flops_per_step_ = flops;
  return *this;
}
PlanBuilder& PlanBuilder::set_input_ids(uint32_t buffer) {
  input_ids_ = buffer;
  return *this;
}
PlanBuilder& PlanBuilder::set_loss_scale(uint32_t buffer) {
  loss_scale_ = buffer;
  return *this;
}

PlanBuilder& PlanBuilder::set_targets(uint32_t buffer) {
  targets_ = buffer;
  return *this;
}
PlanBuilder& PlanBuilder::set_loss(uint32_t buffer) {
  loss_ = buffer;
  return *this;
}
PlanBuilder& PlanBuilder::set_router_aux_loss(Plan::RouterAuxLoss aux) {
  router_aux_loss_ = aux;
  return *this;
}
PlanBuilder& PlanBuilder::set_position_ids(uint32_t buffer) {
  position_ids_ = buffer;
  return *this;
}
PlanBuilder& PlanBuilder::SetArenaBytes(Arena arena, uint64_t bytes) {
  arena_bytes_[static_cast<int>(arena)] = bytes;
  return *this;
}

uint64_t PlanBuilder::UsedBytes(Arena arena) const {
  uint64_t end = 0;
  for (const Buffer& b : buffers_) {
    if (b.arena == arena) end = std::max(end, b.offset + b.elements * DTypeSize(b.dtype));
  }
  return end;
}

uint64_t PlanBuilder::arena_bytes(Arena arena) const {
  const std::optional<uint64_t>& set = arena_bytes_[static_cast<int>(arena)];
  return set ? *set : UsedBytes(arena);
}

uint32_t PlanBuilder::Allocate(std::string name, Arena arena, std::vector<int64_t> shape,
                               DType dtype) {
  const uint64_t offset = RoundUp(UsedBytes(arena), kBufferAlignment);
  return AddBuffer(std::move(name), arena, offset, std::move(shape), dtype);
}

uint32_t PlanBuilder::AddBuffer(std::string name, Arena arena, uint64_t offset,
                                std::vector<int64_t> shape, DType dtype) {
  const uint64_t elements = ShapeElements(shape);
  return AddBuffer(Buffer{.name = std::move(name),
                          .arena = arena,
                          .offset = offset,
                          .elements = elements,
                          .dtype = dtype,
                          .shape = std::move(shape)});
}

uint32_t PlanBuilder::AddBuffer(Buffer buffer) {
  buffers_.push_back(std::move(buffer));
  return static_cast<uint32_t>(buffers_.size() - 1);
}

PlanBuilder::ParameterBuffers PlanBuilder::AddParameter(std::string name,
                                                        std::vector<int64_t> shape, ParamInit init,
                                                        double std) {
  ParameterBuffers buffers;
  buffers.value = Allocate(name, Arena::Parameters, shape);
  buffers.gradient = Allocate(name + ".grad", Arena::Gradients, shape);
  AddParameter(Parameter{.name = std::move(name),
                         .buffer = buffers.value,
                         .gradient = buffers.gradient,
                         .init = init,
                         .std = std,
                         .shards = 1,
                         .full_shape = {}});
  return buffers;
}

PlanBuilder::ParameterBuffers PlanBuilder::AddShardedParameter(std::string name,
                                                               std::vector<int64_t> full_shape,
                                                               int64_t shards, ParamInit init,
                                                               double std) {
  std::vector<int64_t> shape = full_shape;
  if (!shape.empty() && shards > 0) shape[0] /= shards;
  ParameterBuffers buffers;
  buffers.value = Allocate(name, Arena::Parameters, shape);
  buffers.gradient = Allocate(name + ".grad", Arena::Gradients, shape);
  AddParameter(Parameter{.name = std::move(name),
                         .buffer = buffers.value,
                         .gradient = buffers.gradient,
                         .init = init,
                         .std = std,
                         .shards = shards,
                         .full_shape = std::move(full_shape)});
  return buffers;
}

void PlanBuilder::AddParameter(Parameter parameter) { parameters_.push_back(std::move(parameter)); }

PlanBuilder::InputBuffers PlanBuilder::AllocateInputs() {
  const int64_t cp = mesh().cp;
  const int64_t local_seq = cp > 0 ? seq_ / cp : seq_;
  input_ids_ = Allocate("input_ids", Arena::Inputs, {micro_batch_, local_seq}, DType::I32);
  targets_ = Allocate("targets", Arena::Inputs, {micro_batch_, local_seq}, DType::I32);
  loss_scale_ = Allocate("loss_scale", Arena::Inputs, {1}, DType::F32);
  return {input_ids_, targets_, loss_scale_};
}

size_t PlanBuilder::AddStep(std::string kernel, std::vector<uint32_t> ins,
                            std::vector<uint32_t> outs, std::vector<int64_t> ints,
                            std::vector<double> floats) {
  steps_.push_back(StepSpec{.kernel = std::move(kernel),
                            .ins = std::move(ins),
                            .outs = std::move(outs),
                            .ints = std::move(ints),
                            .floats = std::move(floats)});
  return steps_.size() - 1;
}

size_t PlanBuilder::AddStep(KernelId kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs,
                            std::vector<int64_t> ints, std::vector<double> floats) {
  return AddStep(std::string(KernelName(kernel)), std::move(ins), std::move(outs), std::move(ints),
                 std::move(floats));
}

std::string PlanBuilder::FinishUnchecked() const {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  for (const Buffer& b : buffers_) {
    auto name = StringOrAbsent(fbb, b.name);
    auto shape = fbb.CreateVector(b.shape);
    buffers.push_back(fb::CreateBuffer(fbb, name, static_cast<fb::Arena>(b.arena), b.offset,
                                       b.elements, static_cast<fb::DType>(b.dtype), shape));
  }
  std::vector<flatbuffers::Offset<fb::Parameter>> parameters;
  for (const Parameter& p : parameters_) {
    auto name = StringOrAbsent(fbb, p.name);
    auto full_shape = p.full_shape.empty() ? 0 : fbb.CreateVector(p.full_shape);
    parameters.push_back(fb::CreateParameter(fbb, name, p.buffer, p.gradient,
                                             static_cast<fb::ParamInit>(p.init), p.std, p.shards,
                                             full_shape));
  }
  std::vector<flatbuffers::Offset<fb::Step>> steps;
  for (const StepSpec& s : steps_) {
    steps.push_back(fb::CreateStepDirect(fbb, s.kernel.empty() ? nullptr : s.kernel.c_str(), &s.ins,
                                         &s.outs, &s.ints, &s.floats,
                                         static_cast<fb::Stream>(s.stream), s.join_before));
  }
  std::vector<uint64_t> arena_bytes;
  for (int a = 0; a < kNumArenas; ++a) arena_bytes.push_back(this->arena_bytes(Arena(a)));

  flatbuffers::Offset<fb::Mesh> mesh = 0;
  if (mesh_) {
    mesh = fb::CreateMesh(fbb, mesh_->cp, mesh_->dp, static_cast<fb::SequenceLayout>(mesh_->layout),
                          mesh_->ep);
  }
  flatbuffers::Offset<fb::RouterAuxLoss> aux = 0;
  if (router_aux_loss_) {
    aux = fb::CreateRouterAuxLoss(fbb, router_aux_loss_->coefficient, router_aux_loss_->scale,
                                  router_aux_loss_->loss);
  }
  auto root = fb::CreatePlan(
      fbb, StringOrAbsent(fbb, producer_), StringOrAbsent(fbb, model_), seq_, micro_batch_,
      fbb.CreateVector(arena_bytes), fbb.CreateVector(buffers), fbb.CreateVector(parameters),
      input_ids_, targets_, loss_, fbb.CreateVector(steps), flops_per_step_, mesh, loss_scale_,
      StringOrAbsent(fbb, model_config_), aux,
      position_ids_ ? flatbuffers::Optional<uint32_t>(*position_ids_) : flatbuffers::nullopt);
  fb::FinishPlanBuffer(fbb, root);

  return EncodePlanFile(
      std::string_view(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize()));
}

absl::StatusOr<std::string> PlanBuilder::Finish() const {
  std::string file = FinishUnchecked();
  HCP_RETURN_IF_ERROR(ParsePlan(file, "plan being written").status());
  return file;
}

absl::Status PlanBuilder::Write(const std::string& path) const {
  HCP_ASSIGN_OR_RETURN(std::string file, Finish());
  return WriteFileAtomically(path, file);
}

}  // namespace hcp::plan
