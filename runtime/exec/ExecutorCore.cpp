#include "runtime/exec/ExecutorCore.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/RankInputs.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp {
namespace {

std::vector<OptimizerSlice> WholeBuffers(const plan::Plan& plan) {
  std::vector<OptimizerSlice> slices;
  for (const plan::Parameter& p : plan.parameters) {
    slices.push_back(
        OptimizerSlice{.begin = 0, .count = static_cast<int64_t>(plan.buffers[p.buffer].elements)});
  }
  return slices;
}

}  // namespace

ExecutorCore::ExecutorCore(plan::Plan plan, comm::Communicator* comm,
                           std::vector<OptimizerSlice> slices)
    : plan_(std::move(plan)), slices_(std::move(slices)), comm_(comm) {
  if (comm_ == nullptr) {
    owned_comm_ = std::make_unique<comm::LocalCommunicator>();
    comm_ = owned_comm_.get();
  }
  if (slices_.empty()) slices_ = WholeBuffers(plan_);
}

std::byte* ExecutorCore::Address(uint32_t buffer) const {
  const plan::Buffer& b = plan_.buffers[buffer];
  return arena_bases_[static_cast<int>(b.arena)] + b.offset;
}

const plan::Parameter* ExecutorCore::FindParameter(std::string_view name) const {
  for (const plan::Parameter& p : plan_.parameters) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::StatusOr<const plan::Parameter*> ExecutorCore::FindParameterOrError(
    std::string_view name) const {
  const plan::Parameter* p = FindParameter(name);
  if (p == nullptr) {
    return absl::NotFoundError(absl::StrFormat("the plan has no parameter '%s'", name));
  }
  return p;
}

ExecutorCore::ShardRange ExecutorCore::ShardOf(const plan::Parameter& p) const {
  return hcp::ShardOf(plan_, p, comm_->ep_index());
}

const OptimizerSlice& ExecutorCore::SliceOf(const plan::Parameter& p) const {
  // By name: `p` may be a caller's copy of the plan's parameter.
  const plan::Parameter* mine = FindParameter(p.name);
  if (mine == nullptr) {
    comm_->Abort(absl::InternalError(
        absl::StrFormat("SliceOf '%s': not a parameter of the plan (a bug)", p.name)));
  }
  return slices_[mine - plan_.parameters.data()];
}

bool ExecutorCore::ReadsGather(const plan::Parameter& p) const {
  const plan::Parameter* mine = FindParameter(p.name);
  if (mine == nullptr) return false;
  return (mine->sharded() && comm_->world_size() > 1) ||
         slices_[mine - plan_.parameters.data()].split;
}

absl::StatusOr<std::vector<float>> ExecutorCore::GatherFull(
    const plan::Parameter& p, absl::StatusOr<std::vector<float>> local) const {
  if (!p.sharded() || comm_->world_size() == 1) return local;
  if (!local.ok()) comm_->Abort(local.status());
  const ShardRange range = ShardOf(p);
  if (static_cast<int64_t>(local->size()) != range.count) {
    comm_->Abort(absl::InternalError(
        absl::StrFormat("gathering '%s': %d local values, its shard has %d (a bug)", p.name,
                        local->size(), range.count)));
  }
  std::vector<float> full(range.full);
  // The ep group's ranks hold the row blocks in expert-index order = group rank order.
  comm_->AllGather(std::as_bytes(std::span(*local)), std::as_writable_bytes(std::span(full)),
                   comm::Group::kEp);
  return full;
}

absl::StatusOr<std::vector<float>> ExecutorCore::GatherSlices(
    const plan::Parameter& p, absl::StatusOr<std::vector<float>> slice) const {
  const OptimizerSlice& mine = SliceOf(p);
  if (!mine.split) return GatherFull(p, std::move(slice));
  if (!slice.ok()) comm_->Abort(slice.status());
  std::vector<float> whole(mine.count * comm_->world_size());
  comm_->AllGather(std::as_bytes(std::span(*slice)), std::as_writable_bytes(std::span(whole)),
                   comm::Group::kWorld);
  return whole;
}

absl::Status ExecutorCore::InitializeParameters(uint64_t seed) {
  absl::Status status;
  // One host buffer for every tensor: its pages are touched once, not once per tensor.
  std::vector<float> values;
  for (const plan::Parameter& p : plan_.parameters) {
    values.resize(plan_.buffers[p.buffer].elements);
    const std::span<float> value(values);
    FillInitialValues(p, seed, ShardOf(p).begin, value);
    status = WriteFloats(p.buffer, value);
    if (!status.ok()) break;
  }
  return comm::AgreeOnStatus(*comm_, status);
}

absl::Status ExecutorCore::LoadParameters(const CheckpointReader& checkpoint) {
  // Names, dtypes and shapes are checked first, so such a checkpoint leaves the parameters as
  // they were. A NaN or infinity is refused as it is read (CheckpointReader::OpenVerified finds
  // it before anything is loaded).
  absl::Status status = CheckCheckpointHasParameters(plan_, checkpoint);
  for (const plan::Parameter& p : plan_.parameters) {
    if (!status.ok()) break;
    const ShardRange range = ShardOf(p);  // the whole tensor, or this rank's rows
    std::vector<float> value(range.count);
    status = checkpoint.ReadF32Range(p.name, range.begin, range.count, value.data());
    if (status.ok()) {
      status = RefuseNonFinite(value, range.begin, range.full, p.name, checkpoint.dir());
    }
    if (status.ok()) status = WriteFloats(p.buffer, value);
  }
  return comm::AgreeOnStatus(*comm_, status);
}

absl::Status ExecutorCore::SetInputs(std::span<const int32_t> input_ids,
                                     std::span<const int32_t> targets,
                                     std::optional<float> loss_scale,
                                     std::optional<float> aux_scale) {
  absl::StatusOr<RankInputs> local =
      CutRankInputs(plan_, comm_->cp_index(), input_ids, targets, loss_scale);
  absl::Status status = local.status();
  if (status.ok()) status = WriteInts(plan_.input_ids, local->input_ids);
  if (status.ok()) status = WriteInts(plan_.targets, local->targets);
  if (status.ok()) status = WriteFloats(plan_.loss_scale, std::span(&local->loss_scale, 1));
  if (status.ok() && plan_.router_aux_loss) {
    const float scale = aux_scale.value_or(1.0f / static_cast<float>(plan_.mesh.dp));
    status = WriteFloats(plan_.router_aux_loss->scale, std::span(&scale, 1));
  }
  if (status.ok() && plan_.position_ids) {
    status = WriteInts(*plan_.position_ids,
                       CutRankTokens(plan_, comm_->cp_index(), OneDocumentPerRow(plan_)));
  }
  packs_documents_ = false;
  return comm::AgreeOnStatus(*comm_, status);
}

absl::Status ExecutorCore::SetPositions(std::span<const int32_t> position_ids) {
  absl::Status status = CheckPositionIds(plan_, position_ids);
  if (status.ok() && !plan_.position_ids) {
    status = absl::FailedPreconditionError(
        "position_ids given, but the plan treats every sequence as one document: compile it "
        "with --documents");
  }
  if (status.ok()) {
    status = WriteInts(*plan_.position_ids, CutRankTokens(plan_, comm_->cp_index(), position_ids));
  }
  // Every rank has the whole micro-batch's position_ids, so all decide alike.
  packs_documents_ = status.ok() && !IsOneDocumentPerRow(plan_, position_ids);
  return comm::AgreeOnStatus(*comm_, status);
}

namespace {
float FirstOrNaN(const absl::StatusOr<std::vector<float>>& values) {
  if (!values.ok() || values->empty()) return std::numeric_limits<float>::quiet_NaN();
  return values->front();
}
}  // namespace

float ExecutorCore::Loss() const { return FirstOrNaN(ReadFloats(plan_.loss)); }

std::optional<float> ExecutorCore::RouterAuxLoss() const {
  if (!plan_.router_aux_loss) return std::nullopt;
  return FirstOrNaN(ReadFloats(plan_.router_aux_loss->loss));
}

absl::StatusOr<double> ExecutorCore::GradientSquaredNorm() {
  HCP_ASSIGN_OR_RETURN(const std::vector<double> squares, GradientSquares());
  double replicated = 0, sharded = 0, sliced = 0;
  for (size_t i = 0; i < plan_.parameters.size(); ++i) {
    (slices_[i].split                ? sliced
     : plan_.parameters[i].sharded() ? sharded
                                     : replicated) += squares[i];
  }
  // Every rank has the same plan, so every rank makes the same calls.
  if (plan_.mesh.ep > 1) comm_->AllReduceSum(&sharded, 1, comm::Group::kEp);
  if (std::any_of(slices_.begin(), slices_.end(),
                  [](const OptimizerSlice& s) { return s.split; })) {
    comm_->AllReduceSum(&sliced, 1, comm::Group::kWorld);
  }
  return replicated + sharded + sliced;
}

absl::StatusOr<std::vector<float>> ExecutorCore::FullParameter(std::string_view name) {
  HCP_ASSIGN_OR_RETURN(const plan::Parameter* p, FindParameterOrError(name));
  return GatherFull(*p, ReadFloats(p->buffer));
}

absl::StatusOr<std::vector<float>> ExecutorCore::FullGradient(std::string_view name) {
  HCP_ASSIGN_OR_RETURN(const plan::Parameter* p, FindParameterOrError(name));
  const OptimizerSlice& slice = SliceOf(*p);
  if (!gradients_scattered_ || !slice.split) return GatherFull(*p, ReadFloats(p->gradient));
  // Reduce-scattered: only this rank's slice of the buffer holds the sum.
  absl::StatusOr<std::vector<float>> whole = ReadFloats(p->gradient);
  if (!whole.ok()) return GatherSlices(*p, whole.status());
  return GatherSlices(*p, std::vector<float>(whole->begin() + slice.begin,
                                             whole->begin() + slice.begin + slice.count));
}

}  // namespace hcp
