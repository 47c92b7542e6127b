// hcp-insert-expert-parallel: each rank keeps 1/ep of every MoE layer's experts and exchanges
// tokens with the rest of its ep group.
#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "llvm/ADT/DenseMap.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "passes/context_parallel/Passes.h"
#include "passes/expert_parallel/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_INSERTEXPERTPARALLEL
#include "passes/expert_parallel/Passes.h.inc"

namespace {

using namespace mlir;

struct InsertExpertParallelPass : impl::InsertExpertParallelBase<InsertExpertParallelPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (ep < 1) {
      module.emitError() << "ep must be at least 1, got " << int64_t(ep);
      return signalPassFailure();
    }
    SmallVector<model::MoeExpertsOp> layers;
    module.walk([&](model::MoeExpertsOp op) { layers.push_back(op); });
    if (ep == 1) return;
    if (layers.empty()) {
      module.emitError() << "ep=" << int64_t(ep)
                         << " splits the experts of a mixture-of-experts model, but this model "
                            "has no experts (it is dense): leave ep at 1";
      return signalPassFailure();
    }
    auto mesh = module->getAttrOfType<dist::MeshAttr>(kMeshAttr);
    if (!mesh) {
      module.emitError() << "expert parallelism needs the module's mesh: run hcp-set-mesh with ep="
                         << int64_t(ep) << " first";
      return signalPassFailure();
    }
    if (mesh.getEp() != ep) {
      module.emitError() << "the module's mesh has ep=" << mesh.getEp()
                         << ", but the experts are to be split over ep=" << int64_t(ep);
      return signalPassFailure();
    }
    // Every layer first: nothing changes when one of them cannot be split.
    for (model::MoeExpertsOp layer : layers) {
      if (failed(check(layer))) return signalPassFailure();
    }
    DenseMap<Operation*, Value> sharded;  // original weight param -> this rank's part
    for (model::MoeExpertsOp layer : layers) {
      OpBuilder b(layer);
      Value win = shard(b, layer.getInputWeight(), sharded);
      Value wout = shard(b, layer.getOutputWeight(), sharded);
      const int64_t experts = cast<ShapedType>(layer.getInputWeight().getType()).getShape()[0];
      auto split = dist::MoeExpertsOp::create(
          b, layer.getLoc(), layer.getResult().getType(), layer.getX(), layer.getGates(),
          layer.getExperts(), win, wout, b.getI64IntegerAttr(experts), b.getI64IntegerAttr(ep));
      if (failed(mlir::verify(split))) return signalPassFailure();
      layer.getResult().replaceAllUsesWith(split.getResult());
      layer.erase();
      ++numLayers;
    }
    for (auto& [param, replacement] : sharded) param->erase();
  }

  // The layer's experts split evenly, and its weights are whole parameters that only MoE layers
  // read (their shards replace them everywhere).
  LogicalResult check(model::MoeExpertsOp layer) {
    const int64_t experts = cast<ShapedType>(layer.getInputWeight().getType()).getShape()[0];
    if (experts % ep != 0)
      return layer.emitError() << experts << " experts cannot be split over ep=" << int64_t(ep)
                               << " ranks";
    for (Value weight : {layer.getInputWeight(), layer.getOutputWeight()}) {
      auto param = weight.getDefiningOp<model::ParamOp>();
      if (!param)
        return layer.emitError() << "expert parallelism splits expert weights that are parameters";
      if (param.numShards() != 1)
        return param.emitError() << "parameter '" << param.getName() << "' is already split into "
                                 << param.numShards() << " shards";
      for (OpOperand& use : weight.getUses()) {
        auto user = dyn_cast<model::MoeExpertsOp>(use.getOwner());
        if (!user || use.getOperandNumber() < 3)
          return param.emitError() << "parameter '" << param.getName()
                                   << "' is read by something other than an MoE layer's weights: "
                                      "it cannot be split over the experts";
      }
    }
    return success();
  }

  // This rank's rows of a weight parameter: the same checkpoint name and init, dim 0 / ep.
  Value shard(OpBuilder& b, Value weight, DenseMap<Operation*, Value>& sharded) {
    auto param = weight.getDefiningOp<model::ParamOp>();
    auto [it, inserted] = sharded.try_emplace(param, Value());
    if (!inserted) return it->second;
    OpBuilder at(param);
    auto type = cast<RankedTensorType>(param.getType());
    SmallVector<int64_t> shape(type.getShape());
    shape[0] /= ep;
    auto part =
        model::ParamOp::create(at, param.getLoc(), type.clone(shape), param.getNameAttr(),
                               param.getInitAttr(), param.getStdAttr(), at.getI64IntegerAttr(ep));
    it->second = part.getResult();
    return part.getResult();
  }
};

}  // namespace
}  // namespace hcp
