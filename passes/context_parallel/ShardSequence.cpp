// hcp-shard-sequence: the training step on global shapes becomes the per-rank program.
#include "dialects/dist/DistDialect.h"
#include "dialects/model/ModelOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/context_parallel/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_SHARDSEQUENCE
#include "passes/context_parallel/Passes.h.inc"

namespace {

using namespace mlir;

RankedTensorType tensorType(Value value) { return cast<RankedTensorType>(value.getType()); }

RankedTensorType withShape(Value like, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, tensorType(like).getElementType());
}

SmallVector<int64_t> withLastDim(Value value, int64_t last) {
  SmallVector<int64_t> shape(tensorType(value).getShape());
  shape.back() = last;
  return shape;
}

// New result types of one op, from its (already local) operands. The rules follow the ops'
// shape semantics in ModelOps.td; ops not listed keep their result types (parameters, the SSD
// final state, the loss scalars).
void retype(Operation* op, int64_t globalSeq, int64_t localSeq) {
  auto setFrom = [](Value result, RankedTensorType type) { result.setType(type); };
  llvm::TypeSwitch<Operation*, void>(op)
      .Case<model::RmsNormOp, model::SiluOp, model::SoftplusOp, model::NegExpOp, model::ScaleOp,
            model::AddOp, model::MulOp, model::DivOp, model::CausalConv1dOp, model::GatedRmsNormOp,
            model::MoeExpertsOp>(
          [&](Operation* op) { setFrom(op->getResult(0), tensorType(op->getOperand(0))); })
      .Case([&](model::CastOp op) {
        setFrom(op.getResult(), withShape(op.getResult(), tensorType(op.getX()).getShape()));
      })
      .Case([&](model::EmbeddingOp op) {
        SmallVector<int64_t> shape(tensorType(op.getIds()).getShape());
        shape.push_back(tensorType(op.getTable()).getShape()[1]);
        setFrom(op.getResult(), withShape(op.getTable(), shape));
      })
      .Case([&](model::LinearOp op) {
        setFrom(
            op.getResult(),
            withShape(op.getX(), withLastDim(op.getX(), tensorType(op.getWeight()).getShape()[0])));
      })
      .Case([&](model::SplitOp op) {
        for (auto [piece, size] : llvm::zip(op.getPieces(), op.getSizes()))
          setFrom(piece, withShape(op.getX(), withLastDim(op.getX(), size)));
      })
      .Case([&](model::SwigluOp op) {
        setFrom(op.getResult(),
                withShape(op.getX(),
                          withLastDim(op.getX(), tensorType(op.getX()).getShape().back() / 2)));
      })
      .Case([&](model::ReshapeOp op) {
        // Activations keep [batch, seq, ...] in front through every reshape of the model.
        SmallVector<int64_t> shape(tensorType(op.getResult()).getShape());
        if (shape.size() >= 2 && shape[1] == globalSeq &&
            tensorType(op.getX()).getShape()[1] == localSeq)
          shape[1] = localSeq;
        setFrom(op.getResult(), withShape(op.getX(), shape));
      })
      .Case([&](model::SsdScanOp op) { setFrom(op.getY(), tensorType(op.getX())); })
      .Case([&](model::AttentionOp op) {
        ArrayRef<int64_t> q = tensorType(op.getQ()).getShape();
        setFrom(op.getOut(), tensorType(op.getQ()));
        setFrom(op.getLse(), withShape(op.getLse(), {q[0], q[2], q[1]}));
      })
      .Case([&](model::MoeRouteOp op) {
        int64_t k = op.getTopK();
        setFrom(op.getGates(), withShape(op.getGates(), withLastDim(op.getLogits(), k)));
        setFrom(op.getExperts(), withShape(op.getExperts(), withLastDim(op.getLogits(), k)));
      });
}

struct ShardSequencePass : impl::ShardSequenceBase<ShardSequencePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext* context = &getContext();
    auto func = module.lookupSymbol<func::FuncOp>(function);
    if (!func) {
      module.emitError() << "no function '" << function << "' to shard";
      return signalPassFailure();
    }
    if (func.getNumArguments() == 0) {
      func.emitError() << "the training step takes no token ids";
      return signalPassFailure();
    }
    ArrayRef<int64_t> tokens = tensorType(func.getArgument(0)).getShape();
    if (tokens.size() != 2) {
      func.emitError() << "token ids must be [batch, seq]";
      return signalPassFailure();
    }
    int64_t seq = tokens[1];
    // The layout's verifier says, in the user's terms, when the sequence does not split.
    auto diagnose = [&]() { return module.emitError(); };
    if (failed(dist::SequenceLayoutAttr::verify(diagnose, layout, cp, seq)) ||
        failed(dist::MeshAttr::verify(diagnose, cp, 1, 1)))
      return signalPassFailure();
    // The mesh of hcp-set-mesh (with dp and ep), or cp ranks alone.
    auto mesh = module->getAttrOfType<dist::MeshAttr>(kMeshAttr);
    if (mesh && mesh.getCp() != cp) {
      module.emitError() << "the module's mesh has cp=" << mesh.getCp()
                         << ", but the sequence is split over cp=" << cp;
      return signalPassFailure();
    }
    auto sequence = dist::SequenceLayoutAttr::get(context, layout, cp, seq);
    if (!mesh) module->setAttr(kMeshAttr, dist::MeshAttr::get(context, cp, 1));
    module->setAttr(kSequenceAttr, sequence);

    int64_t local = sequence.localLength();
    SmallVector<Type> inputs;
    for (BlockArgument arg : func.getArguments()) {
      // Token ids and targets [batch, seq]; scalars (the loss scale) stay as they are.
      ArrayRef<int64_t> shape = tensorType(arg).getShape();
      if (shape.size() == 2 && shape[1] == seq) arg.setType(withShape(arg, {shape[0], local}));
      inputs.push_back(arg.getType());
    }
    func.setType(FunctionType::get(context, inputs, func.getResultTypes()));
    func.walk([&](Operation* op) { retype(op, seq, local); });
  }
};

}  // namespace
}  // namespace hcp
