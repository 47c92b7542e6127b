#include "compiler/plan/PlanWriter.h"

#include <map>
#include <optional>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dialects/dist/DistDialect.h"
#include "dialects/exec/ExecOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/context_parallel/Passes.h"
#include "passes/lowering/Passes.h"
#include "runtime/plan/PlanBuilder.h"

namespace hcp {
namespace {

using namespace mlir;

absl::StatusOr<plan::DType> dtypeOf(MemRefType type) {
  Type element = type.getElementType();
  if (element.isF32()) return plan::DType::F32;
  if (element.isBF16()) return plan::DType::BF16;
  if (element.isInteger(32)) return plan::DType::I32;
  return absl::InvalidArgumentError("a buffer has an element type the plan cannot hold");
}

plan::ParamInit initOf(model::ParamInit init) {
  switch (init) {
    case model::ParamInit::Normal:
      return plan::ParamInit::Normal;
    case model::ParamInit::Zeros:
      return plan::ParamInit::Zeros;
    case model::ParamInit::Ones:
      return plan::ParamInit::Ones;
    case model::ParamInit::LogArange:
      return plan::ParamInit::LogArange;
  }
  llvm_unreachable("every ParamInit is a plan's");
}

// Translates the one function of an exec module, buffer by buffer and launch by launch.
class Writer {
 public:
  explicit Writer(const PlanInfo& info) {
    // The project version of CMakeLists.txt: plans say which compiler wrote them.
    builder_.set_producer("hybridcp " HYBRIDCP_VERSION).set_model(info.model);
    builder_.set_model_config(info.model_config);
    builder_.set_shape(info.micro_batch, info.seq).set_flops_per_step(info.flops_per_step);
    routerAuxCoefficient_ = info.router_aux_loss;
  }

  absl::StatusOr<std::string> Write(ModuleOp module) {
    auto arenaBytes = module->getAttrOfType<DenseI64ArrayAttr>(kArenaBytesAttr);
    if (!arenaBytes || arenaBytes.size() != plan::kNumArenas)
      return absl::FailedPreconditionError("run hcp-plan-memory before writing the plan");
    // A program for several ranks (or with its experts split) records its mesh; every rank
    // runs the same plan. Without a sequence layout the sequence is whole on each rank.
    auto mesh = module->getAttrOfType<dist::MeshAttr>(kMeshAttr);
    auto sequence = module->getAttrOfType<dist::SequenceLayoutAttr>(kSequenceAttr);
    if (mesh) {
      bool zigzag = sequence && sequence.getKind() == dist::LayoutKind::Zigzag;
      builder_.set_mesh(plan::Mesh{
          .cp = mesh.getCp(),
          .dp = mesh.getDp(),
          .layout = zigzag ? plan::SequenceLayout::Zigzag : plan::SequenceLayout::Contiguous,
          .ep = mesh.getEp()});
    }
    for (int arena = 0; arena < plan::kNumArenas; ++arena)
      builder_.SetArenaBytes(static_cast<plan::Arena>(arena), arenaBytes[arena]);
    auto funcs = module.getOps<func::FuncOp>();
    if (std::distance(funcs.begin(), funcs.end()) != 1)
      return absl::FailedPreconditionError("the exec module must hold exactly one function");
    for (Operation& op : (*funcs.begin()).getBody().front()) {
      absl::Status status = Translate(&op);
      if (!status.ok()) return status;
    }
    for (auto& [name, value] : parameters_) {
      auto gradient = gradients_.find(name);
      if (gradient == gradients_.end())
        return absl::FailedPreconditionError(
            absl::StrCat("parameter '", name.str(), "' has no gradient"));
      // The checkpoint shape: the buffer's, with dim 0 times the shards.
      const int64_t shards = shardsOf_.lookup(name);
      std::vector<int64_t> full = builder_.buffer(value.first).shape;
      if (shards > 1) full[0] *= shards;
      builder_.AddParameter(plan::Parameter{.name = name.str(),
                                            .buffer = value.first,
                                            .gradient = gradient->second,
                                            .init = value.second.first,
                                            .std = value.second.second,
                                            .shards = shards > 1 ? shards : 1,
                                            .full_shape = std::move(full)});
    }
    for (const char* input : {"input_ids", "targets"}) {
      if (!inputs_.count(input))
        return absl::FailedPreconditionError(absl::StrCat("the step has no '", input, "' input"));
    }
    if (!inputs_.count("loss_scale"))
      return absl::FailedPreconditionError("the step has no 'loss_scale' input");
    builder_.set_input_ids(inputs_["input_ids"]).set_targets(inputs_["targets"]);
    builder_.set_loss_scale(inputs_["loss_scale"]);
    if (inputs_.count("position_ids")) builder_.set_position_ids(inputs_["position_ids"]);
    // The load-balancing loss: its scale input and its result come with it, or neither does.
    const bool has_scale = inputs_.count("aux_loss_scale") > 0;
    if (has_scale != routerAuxLoss_.has_value() || has_scale != (routerAuxCoefficient_ > 0))
      return absl::FailedPreconditionError(
          "the load-balancing loss needs its coefficient, its aux_loss_scale input and its "
          "router_aux_loss result together");
    if (has_scale) {
      builder_.set_router_aux_loss(plan::Plan::RouterAuxLoss{.coefficient = routerAuxCoefficient_,
                                                             .scale = inputs_["aux_loss_scale"],
                                                             .loss = *routerAuxLoss_});
    }
    return builder_.Finish();
  }

 private:
  absl::Status Translate(Operation* op) {
    if (auto buffer = dyn_cast<exec::BufferOp>(op)) return AddBuffer(buffer);
    if (auto view = dyn_cast<exec::ViewOp>(op)) {
      // The same bytes under another shape, or a part of them: a plan buffer aliasing the
      // source.
      plan::Buffer alias = builder_.buffer(indexOf_[view.getSource()]);
      alias.name += ".view";
      alias.shape.assign(view.getType().getShape().begin(), view.getType().getShape().end());
      alias.elements = view.getType().getNumElements();
      if (std::optional<uint64_t> offset = view.getOffset()) {
        alias.offset += *offset * plan::DTypeSize(alias.dtype);
        absl::StrAppend(&alias.name, "@", *offset);
      }
      indexOf_[view.getResult()] = builder_.AddBuffer(std::move(alias));
      return absl::OkStatus();
    }
    if (auto launch = dyn_cast<exec::LaunchOp>(op)) {
      std::vector<uint32_t> ins, outs;
      for (Value value : launch.getIns()) ins.push_back(indexOf_[value]);
      for (Value value : launch.getOuts()) outs.push_back(indexOf_[value]);
      const size_t step = builder_.AddStep(
          launch.getKernel().str(), ins, outs,
          std::vector<int64_t>(launch.getInts().begin(), launch.getInts().end()),
          std::vector<double>(launch.getFloats().begin(), launch.getFloats().end()));
      if (launch.getBeside()) {
        builder_.step(step).stream = plan::Stream::kBeside;
        besideStep_ = step;
      }
      return absl::OkStatus();
    }
    if (isa<exec::JoinOp>(op)) {
      // The verifier saw a beside launch before it: the compute stream waits for it before the
      // next step.
      if (!besideStep_) return absl::InternalError("exec.join without a launch beside it (a bug)");
      builder_.step(*besideStep_).join_before = static_cast<uint32_t>(builder_.num_steps());
      besideStep_.reset();
      return absl::OkStatus();
    }
    if (auto result = dyn_cast<exec::ResultOp>(op)) {
      if (result.getName() == "loss") {
        builder_.set_loss(indexOf_[result.getValue()]);
      } else if (result.getName() == "router_aux_loss") {
        routerAuxLoss_ = indexOf_[result.getValue()];
      } else {
        return absl::UnimplementedError(
            absl::StrCat("unknown step result '", result.getName().str(), "'"));
      }
      return absl::OkStatus();
    }
    if (isa<func::ReturnOp>(op)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", op->getName().getStringRef().str(), "' into a plan"));
  }

  absl::Status AddBuffer(exec::BufferOp buffer) {
    if (!buffer.getOffset())
      return absl::FailedPreconditionError("run hcp-plan-memory before writing the plan");
    absl::StatusOr<plan::DType> dtype = dtypeOf(buffer.getType());
    if (!dtype.ok()) return dtype.status();
    auto arena = static_cast<plan::Arena>(buffer.getArena());
    std::vector<int64_t> shape(buffer.getType().getShape().begin(),
                               buffer.getType().getShape().end());
    std::string name = buffer.getName().str();
    uint32_t index = builder_.AddBuffer(name, arena, *buffer.getOffset(), shape, *dtype);
    indexOf_[buffer.getResult()] = index;
    if (arena == plan::Arena::Parameters) {
      double std = buffer.getStd() ? buffer.getStd()->convertToDouble() : 0.0;
      parameters_[buffer.getName()] = {index, {initOf(*buffer.getInit()), std}};
      if (std::optional<uint64_t> shards = buffer.getShards())
        shardsOf_[buffer.getName()] = static_cast<int64_t>(*shards);
    } else if (arena == plan::Arena::Gradients) {
      gradients_[name] = index;
    } else if (arena == plan::Arena::Inputs) {
      inputs_[name] = index;
    }
    return absl::OkStatus();
  }

  plan::PlanBuilder builder_;
  llvm::DenseMap<Value, uint32_t> indexOf_;
  std::optional<size_t> besideStep_;  // the step running beside the compute stream, not yet joined
  // name -> (buffer, (init, std)), in program order of first appearance.
  llvm::MapVector<StringRef, std::pair<uint32_t, std::pair<plan::ParamInit, double>>> parameters_;
  llvm::StringMap<uint32_t> gradients_;
  llvm::StringMap<int64_t> shardsOf_;  // expert-parallel parameters
  std::map<std::string, uint32_t> inputs_;
  double routerAuxCoefficient_ = 0.0;
  std::optional<uint32_t> routerAuxLoss_;  // the "router_aux_loss" result's buffer
};

}  // namespace

absl::StatusOr<std::string> WritePlan(ModuleOp module, const PlanInfo& info) {
  return Writer(info).Write(module);
}

}  // namespace hcp
