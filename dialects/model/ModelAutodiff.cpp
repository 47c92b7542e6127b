// The backward rule of every forward `model` op, attached to the ops as external models of
// DifferentiableOpInterface. Each rule reads top to bottom as the math: given the gradients of
// the op's results (null where the loss does not depend on a result), it builds the gradients of
// the operands at the builder's insertion point. Fused ops map onto one gradient op
// (ModelGradOps.td); the elementwise algebra maps back onto forward ops.
#include "dialects/model/ModelAutodiff.h"

#include "dialects/interfaces/DifferentiableOpInterface.h"
#include "dialects/model/ModelOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/MLIRContext.h"

using namespace mlir;

namespace hcp::model {
namespace {

using Grads = SmallVectorImpl<Value>;

Value zerosLike(OpBuilder& b, Location loc, Type type) {
  return FillOp::create(b, loc, type, b.getF64FloatAttr(0.0));
}

// The gradient of a result, or zeros of its type where the loss does not depend on it (for rules
// whose gradient op needs every result's gradient).
Value gradOrZeros(OpBuilder& b, Location loc, Value grad, Value result) {
  return grad ? grad : zerosLike(b, loc, result.getType());
}

// Reduces a gradient of lhs's shape to a broadcast rhs's shape: the backward of broadcasting.
Value unbroadcast(OpBuilder& b, Location loc, Value grad, Type rhsType) {
  if (grad.getType() == rhsType) return grad;
  return SumLeadingOp::create(b, loc, rhsType, grad);
}

// --- parameters and token-local ops ----------------------------------------------------------

LogicalResult backward(ParamOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& /*none*/) {
  ParamGradOp::create(b, op.getLoc(), op.getNameAttr(), dy[0]);
  return success();
}

LogicalResult backward(FillOp, OpBuilder&, ArrayRef<Value>, Grads&) { return success(); }

LogicalResult backward(EmbeddingOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  // ids (operand 1) are integers: no gradient.
  grads[0] = EmbeddingGradOp::create(b, op.getLoc(), op.getTable().getType(), dy[0], op.getIds(),
                                     op.getMultiplierAttr(), op.getPaddingIdxAttr());
  return success();
}

LogicalResult backward(LinearOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  Location loc = op.getLoc();
  grads[0] = LinearGradInputOp::create(b, loc, op.getX().getType(), dy[0], op.getWeight());
  grads[1] = LinearGradWeightOp::create(b, loc, op.getWeight().getType(), dy[0], op.getX());
  return success();
}

LogicalResult backward(RmsNormOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  auto grad = RmsNormGradOp::create(b, op.getLoc(), op.getX().getType(), op.getWeight().getType(),
                                    dy[0], op.getX(), op.getWeight(), op.getEpsAttr());
  grads[0] = grad.getDx();
  grads[1] = grad.getDw();
  return success();
}

LogicalResult backward(SiluOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = SiluGradOp::create(b, op.getLoc(), op.getX().getType(), dy[0], op.getX());
  return success();
}

LogicalResult backward(SoftplusOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = SoftplusGradOp::create(b, op.getLoc(), op.getX().getType(), dy[0], op.getX());
  return success();
}

// d(-exp(x)) = -exp(x) dx = y dx: the rule reads the forward result.
LogicalResult backward(NegExpOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = NegExpGradOp::create(b, op.getLoc(), op.getX().getType(), dy[0], op.getResult());
  return success();
}

// The gradient travels back in the input's type.
LogicalResult backward(CastOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = CastOp::create(b, op.getLoc(), op.getX().getType(), dy[0]);
  return success();
}

LogicalResult backward(SwigluOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = SwigluGradOp::create(b, op.getLoc(), op.getX().getType(), dy[0], op.getX());
  return success();
}

LogicalResult backward(ScaleOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = ScaleOp::create(b, op.getLoc(), op.getX().getType(), dy[0], op.getFactorAttr());
  return success();
}

// lhs + rhs, rhs broadcast over lhs's leading dims.
LogicalResult backward(AddOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = dy[0];
  grads[1] = unbroadcast(b, op.getLoc(), dy[0], op.getRhs().getType());
  return success();
}

// d(lhs * rhs) = dy * rhs for lhs, sum_leading(dy * lhs) for rhs.
LogicalResult backward(MulOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  Location loc = op.getLoc();
  Type lhsType = op.getLhs().getType();
  grads[0] = MulOp::create(b, loc, lhsType, dy[0], op.getRhs());
  Value full = MulOp::create(b, loc, lhsType, dy[0], op.getLhs());
  grads[1] = unbroadcast(b, loc, full, op.getRhs().getType());
  return success();
}

// d(lhs / rhs) = dy / rhs for lhs, -(dy * lhs / rhs) / rhs (summed over broadcasting) for rhs.
LogicalResult backward(DivOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  Location loc = op.getLoc();
  Type lhsType = op.getLhs().getType();
  Value rhs = op.getRhs();
  grads[0] = DivOp::create(b, loc, lhsType, dy[0], rhs);
  Value t = MulOp::create(b, loc, lhsType, dy[0], op.getLhs());
  t = DivOp::create(b, loc, lhsType, t, rhs);
  t = DivOp::create(b, loc, lhsType, t, rhs);
  t = ScaleOp::create(b, loc, lhsType, t, b.getF64FloatAttr(-1.0));
  grads[1] = unbroadcast(b, loc, t, rhs.getType());
  return success();
}

// The pieces' gradients side by side; zeros for a piece the loss does not read.
LogicalResult backward(SplitOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  Location loc = op.getLoc();
  SmallVector<Value> pieces;
  for (auto [grad, piece] : llvm::zip(dy, op.getPieces()))
    pieces.push_back(gradOrZeros(b, loc, grad, piece));
  grads[0] = ConcatOp::create(b, loc, op.getX().getType(), pieces);
  return success();
}

LogicalResult backward(ReshapeOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = ReshapeOp::create(b, op.getLoc(), op.getX().getType(), dy[0]);
  return success();
}

// --- Mamba2 mixer -------------------------------------------------------------------------------

LogicalResult backward(CausalConv1dOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  Type dhaloType = op.getHalo() ? op.getHalo().getType() : Type();
  auto grad = CausalConv1dGradOp::create(
      b, op.getLoc(), op.getX().getType(), op.getWeight().getType(), op.getBias().getType(),
      dhaloType, dy[0], op.getX(), op.getWeight(), op.getHalo(), op.getPositions());
  grads[0] = grad.getDx();
  grads[1] = grad.getDw();
  grads[2] = grad.getDbias();
  if (op.getHalo()) grads[3] = grad.getDhalo();
  return success();
}

LogicalResult backward(SsdLogDecayOp op, OpBuilder& b, ArrayRef<Value> dg, Grads& grads) {
  auto grad = SsdLogDecayGradOp::create(b, op.getLoc(), op.getDt().getType(), op.getA().getType(),
                                        dg[0], op.getDt(), op.getA());
  grads[0] = grad.getDdt();
  grads[1] = grad.getDA();
  return success();
}

// dfinal only when the final state has a gradient (a later CP shard reads it); dinit exactly
// when there is an initial state.
LogicalResult backward(SsdScanOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  Location loc = op.getLoc();
  Value init = op.getInitState();
  auto grad = SsdScanGradOp::create(
      b, loc, op.getX().getType(), op.getDt().getType(), op.getA().getType(), op.getB().getType(),
      op.getC().getType(), op.getD().getType(), init ? init.getType() : Type(),
      gradOrZeros(b, loc, dy[0], op.getY()), op.getX(), op.getDt(), op.getA(), op.getB(), op.getC(),
      op.getD(), init, /*dfinal=*/dy[1], op.getPositions(), op.getChunkSizeAttr());
  grads[0] = grad.getDx();
  grads[1] = grad.getDdt();
  grads[2] = grad.getDA();
  grads[3] = grad.getDB();
  grads[4] = grad.getDC();
  grads[5] = grad.getDD();
  if (init) grads[6] = grad.getDinit();
  return success();
}

// model.ssd_scan_grad's rule with dy = 0 and no initial state: only the state gradient flows.
LogicalResult backward(SsdFinalStateOp op, OpBuilder& b, ArrayRef<Value> dfinal, Grads& grads) {
  auto grad = SsdFinalStateGradOp::create(b, op.getLoc(), op.getX().getType(), op.getDt().getType(),
                                          op.getA().getType(), op.getB().getType(), dfinal[0],
                                          op.getX(), op.getDt(), op.getA(), op.getB(),
                                          op.getPositions(), op.getChunkSizeAttr());
  grads[0] = grad.getDx();
  grads[1] = grad.getDdt();
  grads[2] = grad.getDA();
  grads[3] = grad.getDB();
  return success();
}

// y's gradient is dresult itself; the rest from the correction's own gradient op.
LogicalResult backward(SsdAddInitialStateOp op, OpBuilder& b, ArrayRef<Value> dresult,
                       Grads& grads) {
  Value d = gradOrZeros(b, op.getLoc(), dresult[0], op.getResult());
  auto grad = SsdAddInitialStateGradOp::create(
      b, op.getLoc(), op.getDt().getType(), op.getA().getType(), op.getC().getType(),
      op.getInitState().getType(), d, op.getDt(), op.getA(), op.getC(), op.getInitState(),
      op.getPositions());
  grads[0] = d;
  grads[1] = grad.getDdt();
  grads[2] = grad.getDA();
  grads[3] = grad.getDC();
  grads[4] = grad.getDinit();
  return success();
}

LogicalResult backward(GatedRmsNormOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  auto grad = GatedRmsNormGradOp::create(b, op.getLoc(), op.getY().getType(),
                                         op.getGate().getType(), op.getWeight().getType(), dy[0],
                                         op.getY(), op.getGate(), op.getWeight(), op.getEpsAttr());
  grads[0] = grad.getDy();
  grads[1] = grad.getDgate();
  grads[2] = grad.getDw();
  return success();
}

// --- attention ----------------------------------------------------------------------------------

// lse is an output the loss never reads in a model function (ring attention reads it after CP
// sharding, and its dist op has its own rule): its gradient is ignored here.
LogicalResult backward(AttentionOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  if (!dy[0]) return success();
  auto grad = AttentionGradOp::create(b, op.getLoc(), op.getQ().getType(), op.getK().getType(),
                                      op.getV().getType(), dy[0], op.getQ(), op.getK(), op.getV(),
                                      op.getOut(), op.getLse(), op.getPositions(),
                                      op.getScaleAttr(), op.getCausalAttr());
  grads[0] = grad.getDq();
  grads[1] = grad.getDk();
  grads[2] = grad.getDv();
  return success();
}

// --- mixture of experts -------------------------------------------------------------------------

// Only the gates carry gradient; the expert indices are integers.
LogicalResult backward(MoeRouteOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  if (!dy[0]) return success();
  grads[0] = MoeRouteGradOp::create(b, op.getLoc(), op.getLogits().getType(), dy[0], op.getGates(),
                                    op.getExperts());
  return success();
}

LogicalResult backward(MoeExpertsOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  auto grad = MoeExpertsGradOp::create(
      b, op.getLoc(), op.getX().getType(), op.getGates().getType(), op.getInputWeight().getType(),
      op.getOutputWeight().getType(), dy[0], op.getX(), op.getGates(), op.getExperts(),
      op.getInputWeight(), op.getOutputWeight());
  grads[0] = grad.getDx();
  grads[1] = grad.getDgates();
  // experts (operand 2): integer indices, no gradient.
  grads[3] = grad.getDwIn();
  grads[4] = grad.getDwOut();
  return success();
}

// --- loss ---------------------------------------------------------------------------------------

// Only loss_sum carries gradient: valid_count is a count of targets.
LogicalResult backward(CrossEntropyOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  if (!dy[0]) return success();
  grads[0] = CrossEntropyGradOp::create(b, op.getLoc(), op.getLogits().getType(), dy[0],
                                        op.getLogits(), op.getTargets(), op.getIgnoreIndexAttr());
  return success();
}

// --- the load-balancing loss -----------------------------------------------------------------

// Only probs carries gradient: picks is a count of the top-k choices.
LogicalResult backward(RouterLoadOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  if (!dy[0]) return success();
  grads[0] =
      RouterLoadGradOp::create(b, op.getLoc(), op.getLogits().getType(), dy[0], op.getLogits());
  return success();
}

LogicalResult backward(RouterAuxLossOp op, OpBuilder& b, ArrayRef<Value> dy, Grads& grads) {
  grads[0] = RouterAuxLossGradOp::create(b, op.getLoc(), op.getProbs().getType(), dy[0],
                                         op.getPicks(), op.getScaleAttr());
  return success();
}

// Adapts the per-op `backward` functions above to the interface.
template <typename OpT>
struct Differentiable : DifferentiableOpInterface::ExternalModel<Differentiable<OpT>, OpT> {
  LogicalResult buildBackward(Operation* op, OpBuilder& builder, ArrayRef<Value> resultGrads,
                              SmallVectorImpl<Value>& operandGrads) const {
    return backward(cast<OpT>(op), builder, resultGrads, operandGrads);
  }
};

template <typename... OpTs>
void attach(MLIRContext* context) {
  (OpTs::template attachInterface<Differentiable<OpTs>>(*context), ...);
}

}  // namespace

void registerDifferentiableOpInterfaces(DialectRegistry& registry) {
  registry.addExtension(+[](MLIRContext* context, ModelDialect*) {
    attach<ParamOp, FillOp, EmbeddingOp, LinearOp, RmsNormOp, SiluOp, SoftplusOp, NegExpOp, CastOp,
           SwigluOp, ScaleOp, AddOp, MulOp, DivOp, SplitOp, ReshapeOp, CausalConv1dOp, SsdScanOp,
           SsdFinalStateOp, SsdAddInitialStateOp, SsdLogDecayOp, GatedRmsNormOp, AttentionOp,
           MoeRouteOp, MoeExpertsOp, CrossEntropyOp, RouterLoadOp, RouterAuxLossOp>(context);
  });
}

}  // namespace hcp::model
