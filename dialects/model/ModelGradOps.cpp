// Verifiers of the `model` gradient ops (ModelGradOps.td). A gradient has exactly the type of the
// value it is the gradient of; the messages name the forward quantity ("dw must have the type of
// the weight ...") so that a wrong backward rule or hand-written test reads clearly.
#include "dialects/model/ModelOps.h"

#include "dialects/model/VerifyHelpers.h"
#include "llvm/ADT/STLExtras.h"
#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;

namespace hcp::model {
namespace {

using namespace checks;

// "tensor<2x5x4xf32>" for messages.
std::string formatType(Type type) {
  std::string text;
  llvm::raw_string_ostream stream(text);
  stream << type;
  return text;
}

// A gradient has its value's type: shape and element type.
LogicalResult expectTypeOf(Operation* op, Value grad, Value of, StringRef gradName,
                           StringRef ofName) {
  if (grad.getType() != of.getType()) {
    return op->emitOpError() << gradName << " must have the type of " << ofName << " ("
                             << formatType(of.getType()) << "), got " << formatType(grad.getType());
  }
  return success();
}

}  // namespace

LogicalResult FillOp::verify() {
  if (!getResult().getType().hasStaticShape()) return emitOpError() << "fill needs a static shape";
  return success();
}

LogicalResult SumLeadingOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX()), result = shapeOf(getResult());
  if (result.size() > x.size() || x.take_back(result.size()) != result)
    return emitOpError() << "result shape " << formatShape(result)
                         << " must equal the trailing dims of input shape " << formatShape(x);
  return expectSameElementType(*this, getX(), getResult(), "input", "result");
}

LogicalResult ConcatOp::verify() {
  if (getPieces().empty()) return emitOpError() << "needs at least one piece";
  ArrayRef<int64_t> result = shapeOf(getResult());
  if (result.empty()) return emitOpError() << "cannot concatenate scalars";
  int64_t total = 0;
  for (auto [i, piece] : llvm::enumerate(getPieces())) {
    ArrayRef<int64_t> shape = shapeOf(piece);
    if (shape.size() != result.size() || shape.drop_back() != result.drop_back())
      return emitOpError() << "piece " << i << " has shape " << formatShape(shape)
                           << " but every piece must match the result " << formatShape(result)
                           << " in all dims but the last";
    if (failed(expectSameElementType(*this, piece, getResult(), "pieces", "result")))
      return failure();
    total += shape.back();
  }
  if (total != result.back())
    return emitOpError() << "pieces add up to " << total
                         << " along the last dim but the result has " << result.back();
  return success();
}

LogicalResult LinearGradInputOp::verify() {
  if (failed(expectRank(*this, getW(), 2, "linear weight"))) return failure();
  ArrayRef<int64_t> dy = shapeOf(getDy()), w = shapeOf(getW());
  if (dy.empty()) return emitOpError() << "output gradient must have at least one dim";
  if (dy.back() != w[0])
    return emitOpError() << "weight " << formatShape(w) << " has " << w[0]
                         << " outputs but the output gradient's last dim is " << dy.back();
  if (failed(expectShape(*this, getDx(), withLastDim(dy, w[1]), "input gradient")))
    return failure();
  if (failed(expectSameElementType(*this, getDy(), getW(), "output gradient", "weight")))
    return failure();
  return expectSameElementType(*this, getDy(), getDx(), "output gradient", "input gradient");
}

LogicalResult LinearGradWeightOp::verify() {
  if (failed(expectRank(*this, getDw(), 2, "weight gradient"))) return failure();
  ArrayRef<int64_t> dy = shapeOf(getDy()), x = shapeOf(getX());
  if (dy.empty() || x.size() != dy.size() || x.drop_back() != dy.drop_back())
    return emitOpError() << "output gradient " << formatShape(dy) << " and input " << formatShape(x)
                         << " must agree in every dim but the last";
  if (failed(expectShape(*this, getDw(), {dy.back(), x.back()}, "weight gradient")))
    return failure();
  if (failed(expectSameElementType(*this, getDy(), getX(), "output gradient", "input")))
    return failure();
  return expectSameElementType(*this, getDy(), getDw(), "output gradient", "weight gradient");
}

LogicalResult EmbeddingGradOp::verify() {
  if (failed(expectRank(*this, getDy(), 3, "output gradient [batch, seq, hidden]")) ||
      failed(expectRank(*this, getIds(), 2, "token ids")) ||
      failed(expectRank(*this, getDtable(), 2, "table gradient [vocab, hidden]")))
    return failure();
  ArrayRef<int64_t> dy = shapeOf(getDy()), table = shapeOf(getDtable());
  if (failed(expectShape(*this, getIds(), dy.take_front(2), "token ids"))) return failure();
  if (table[1] != dy[2])
    return emitOpError() << "table gradient " << formatShape(table) << " must have the hidden size "
                         << dy[2] << " of the output gradient";
  if (IntegerAttr attr = getPaddingIdxAttr()) {
    int64_t pad = attr.getInt();
    if (pad < 0 || pad >= table[0])
      return emitOpError() << "padding_idx " << pad << " is outside the vocabulary of " << table[0]
                           << " tokens";
  }
  return expectSameElementType(*this, getDy(), getDtable(), "output gradient", "table gradient");
}

LogicalResult RmsNormGradOp::verify() {
  if (failed(expectRank(*this, getW(), 1, "norm weight"))) return failure();
  int64_t dim = shapeOf(getX()).empty() ? 0 : shapeOf(getX()).back();
  if (shapeOf(getW())[0] != dim)
    return emitOpError() << "norm weight has " << shapeOf(getW())[0]
                         << " entries but the normalised dim has " << dim;
  if (getEps().convertToDouble() <= 0.0) return emitOpError() << "eps must be positive";
  if (failed(expectTypeOf(*this, getDy(), getX(), "output gradient", "the input")) ||
      failed(expectTypeOf(*this, getDx(), getX(), "input gradient", "the input")) ||
      failed(expectTypeOf(*this, getDw(), getW(), "weight gradient", "the weight")))
    return failure();
  return success();
}

LogicalResult GatedRmsNormGradOp::verify() {
  if (failed(expectRank(*this, getW(), 1, "norm weight"))) return failure();
  int64_t dim = shapeOf(getY()).empty() ? 0 : shapeOf(getY()).back();
  if (shapeOf(getW())[0] != dim)
    return emitOpError() << "norm weight has " << shapeOf(getW())[0]
                         << " entries but the normalised dim has " << dim;
  if (getEps().convertToDouble() <= 0.0) return emitOpError() << "eps must be positive";
  if (failed(expectTypeOf(*this, getGate(), getY(), "gate", "y")) ||
      failed(expectTypeOf(*this, getDout(), getY(), "output gradient", "y")) ||
      failed(expectTypeOf(*this, getDy(), getY(), "y gradient", "y")) ||
      failed(expectTypeOf(*this, getDgate(), getGate(), "gate gradient", "the gate")) ||
      failed(expectTypeOf(*this, getDw(), getW(), "weight gradient", "the weight")))
    return failure();
  return success();
}

LogicalResult SwigluGradOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX());
  if (x.empty() || x.back() % 2 != 0)
    return emitOpError() << "the packed gate|up dim must be even, got shape " << formatShape(x);
  if (failed(expectShape(*this, getDy(), withLastDim(x, x.back() / 2), "output gradient")) ||
      failed(expectTypeOf(*this, getDx(), getX(), "input gradient", "the packed input")))
    return failure();
  return expectSameElementType(*this, getDy(), getX(), "output gradient", "input");
}

LogicalResult CausalConv1dGradOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getX()))) return failure();
  if (failed(expectRank(*this, getX(), 3, "conv input [batch, seq, channels]")) ||
      failed(expectRank(*this, getW(), 3, "conv weight [channels, 1, width]")))
    return failure();
  int64_t channels = shapeOf(getX())[2];
  ArrayRef<int64_t> w = shapeOf(getW());
  if (w[0] != channels || w[1] != 1)
    return emitOpError() << "depthwise conv weight must be [" << channels << ", 1, width], got "
                         << formatShape(w);
  if (failed(expectTypeOf(*this, getDy(), getX(), "output gradient", "the input")) ||
      failed(expectTypeOf(*this, getDx(), getX(), "input gradient", "the input")) ||
      failed(expectTypeOf(*this, getDw(), getW(), "weight gradient", "the weight")) ||
      failed(expectShape(*this, getDbias(), {channels}, "bias gradient")))
    return failure();
  if (static_cast<bool>(getHalo()) != static_cast<bool>(getDhalo()))
    return emitOpError() << "a halo gradient goes with a halo, and only with one";
  if (getHalo() &&
      (failed(expectShape(*this, getHalo(), {shapeOf(getX())[0], w[2] - 1, channels},
                          "conv halo [batch, width-1, channels]")) ||
       failed(expectTypeOf(*this, getDhalo(), getHalo(), "halo gradient", "the halo"))))
    return failure();
  return expectSameElementType(*this, getDbias(), getX(), "bias gradient", "input");
}

LogicalResult SsdLogDecayGradOp::verify() {
  if (failed(expectRank(*this, getDt(), 3, "dt [batch, seq, heads]"))) return failure();
  ArrayRef<int64_t> dt = shapeOf(getDt());
  if (failed(expectShape(*this, getDg(), {dt[0], dt[2]}, "log-decay gradient")) ||
      failed(expectTypeOf(*this, getDdt(), getDt(), "dt gradient", "dt")) ||
      failed(expectTypeOf(*this, getDA(), getA(), "A gradient", "A")))
    return failure();
  return success();
}

LogicalResult SsdScanGradOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getX()))) return failure();
  FailureOr<SsdDims> d = verifySsdOperands(*this, getX(), getDt(), getA(), getB());
  if (failed(d)) return failure();
  SmallVector<int64_t> stateShape = d->stateShape();
  if (failed(expectShape(*this, getC(), shapeOf(getB()), "C")) ||
      failed(expectShape(*this, getD(), {d->heads}, "D")))
    return failure();
  if (getInitState() && failed(expectShape(*this, getInitState(), stateShape, "initial state")))
    return failure();
  if (getDfinal()) {
    if (failed(expectShape(*this, getDfinal(), stateShape, "final state gradient")))
      return failure();
    if (tensorType(getDfinal()).getElementType() != Float32Type::get(getContext()))
      return emitOpError() << "final state gradient must be f32, like the final state";
  }
  if (failed(expectTypeOf(*this, getDy(), getX(), "y gradient", "x")) ||
      failed(expectTypeOf(*this, getDx(), getX(), "x gradient", "x")) ||
      failed(expectTypeOf(*this, getDdt(), getDt(), "dt gradient", "dt")) ||
      failed(expectTypeOf(*this, getDA(), getA(), "A gradient", "A")) ||
      failed(expectTypeOf(*this, getDB(), getB(), "B gradient", "B")) ||
      failed(expectTypeOf(*this, getDC(), getC(), "C gradient", "C")) ||
      failed(expectTypeOf(*this, getDD(), getD(), "D gradient", "D")))
    return failure();
  if (bool(getInitState()) != bool(getDinit()))
    return emitOpError() << (getInitState()
                                 ? "an initial state needs an initial state gradient result"
                                 : "an initial state gradient result needs an initial state");
  if (getInitState() && failed(expectTypeOf(*this, getDinit(), getInitState(),
                                            "initial state gradient", "the initial state")))
    return failure();
  if (getChunkSize() <= 0) return emitOpError() << "chunk size must be positive";
  return success();
}

LogicalResult SsdAddInitialStateGradOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getDresult()))) return failure();
  if (failed(verifyInitialStateOperands(*this, getDresult(), getDt(), getA(), getC(),
                                        getInitState())) ||
      failed(expectTypeOf(*this, getDdt(), getDt(), "dt gradient", "dt")) ||
      failed(expectTypeOf(*this, getDA(), getA(), "A gradient", "A")) ||
      failed(expectTypeOf(*this, getDC(), getC(), "C gradient", "C")) ||
      failed(expectTypeOf(*this, getDinit(), getInitState(), "initial state gradient",
                          "the initial state")))
    return failure();
  return success();
}

LogicalResult SsdFinalStateGradOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getX()))) return failure();
  FailureOr<SsdDims> d = verifySsdOperands(*this, getX(), getDt(), getA(), getB());
  if (failed(d) || failed(expectShape(*this, getDfinal(), d->stateShape(), "final state gradient")))
    return failure();
  if (tensorType(getDfinal()).getElementType() != Float32Type::get(getContext()))
    return emitOpError() << "final state gradient must be f32, like the final state";
  if (failed(expectTypeOf(*this, getDx(), getX(), "x gradient", "x")) ||
      failed(expectTypeOf(*this, getDdt(), getDt(), "dt gradient", "dt")) ||
      failed(expectTypeOf(*this, getDA(), getA(), "A gradient", "A")) ||
      failed(expectTypeOf(*this, getDB(), getB(), "B gradient", "B")))
    return failure();
  if (getChunkSize() <= 0) return emitOpError() << "chunk size must be positive";
  return success();
}

LogicalResult AttentionGradOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getQ()))) return failure();
  if (failed(expectRank(*this, getQ(), 4, "q [batch, seq, heads, head_dim]")) ||
      failed(expectRank(*this, getK(), 4, "k [batch, seq, kv_heads, head_dim]")))
    return failure();
  ArrayRef<int64_t> q = shapeOf(getQ()), k = shapeOf(getK());
  if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
    return emitOpError() << "k " << formatShape(k) << " does not match q " << formatShape(q)
                         << " in batch, sequence or head_dim";
  if (q[2] % k[2] != 0)
    return emitOpError() << k[2] << " kv heads do not divide " << q[2] << " query heads";
  if (failed(expectTypeOf(*this, getV(), getK(), "v", "k")) ||
      failed(expectTypeOf(*this, getOut(), getQ(), "attention output", "q")) ||
      failed(expectTypeOf(*this, getDout(), getQ(), "output gradient", "q")) ||
      failed(expectShape(*this, getLse(), {q[0], q[2], q[1]}, "log-sum-exp")))
    return failure();
  if (tensorType(getLse()).getElementType() != Float32Type::get(getContext()))
    return emitOpError() << "log-sum-exp must be f32";
  if (failed(expectTypeOf(*this, getDq(), getQ(), "q gradient", "q")) ||
      failed(expectTypeOf(*this, getDk(), getK(), "k gradient", "k")) ||
      failed(expectTypeOf(*this, getDv(), getV(), "v gradient", "v")))
    return failure();
  return success();
}

LogicalResult MoeRouteGradOp::verify() {
  ArrayRef<int64_t> gates = shapeOf(getGates()), dlogits = shapeOf(getDlogits());
  if (gates.empty()) return emitOpError() << "gates need a top-k dim";
  if (failed(expectTypeOf(*this, getDgates(), getGates(), "gates gradient", "the gates")) ||
      failed(expectShape(*this, getExperts(), gates, "expert indices")))
    return failure();
  if (dlogits.size() != gates.size() || dlogits.drop_back() != gates.drop_back())
    return emitOpError() << "router logits gradient " << formatShape(dlogits)
                         << " must be [tokens..., experts] for gates " << formatShape(gates);
  if (gates.back() > dlogits.back())
    return emitOpError() << "each token picks " << gates.back() << " experts but there are only "
                         << dlogits.back();
  return success();
}

LogicalResult MoeExpertsGradOp::verify() {
  if (failed(expectRank(*this, getWIn(), 3, "expert input weight [experts, 2*width, hidden]")) ||
      failed(expectRank(*this, getWOut(), 3, "expert output weight [experts, hidden, width]")))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getX()), win = shapeOf(getWIn()), gates = shapeOf(getGates());
  if (x.empty()) return emitOpError() << "input must have a hidden dim";
  int64_t hidden = x.back(), experts = win[0];
  if (win[2] != hidden || win[1] % 2 != 0)
    return emitOpError() << "expert input weight must be [experts, 2*width, " << hidden << "], got "
                         << formatShape(win);
  if (failed(expectShape(*this, getWOut(), {experts, hidden, win[1] / 2}, "expert output weight")))
    return failure();
  if (gates.size() != x.size() || gates.drop_back() != x.drop_back())
    return emitOpError() << "gates " << formatShape(gates) << " must be [tokens..., k] for input "
                         << formatShape(x);
  if (gates.back() > experts)
    return emitOpError() << "each token picks " << gates.back() << " experts but there are only "
                         << experts;
  if (failed(expectShape(*this, getExperts(), gates, "expert indices")) ||
      failed(expectTypeOf(*this, getDout(), getX(), "output gradient", "the input")) ||
      failed(expectTypeOf(*this, getDx(), getX(), "input gradient", "the input")) ||
      failed(expectTypeOf(*this, getDgates(), getGates(), "gates gradient", "the gates")) ||
      failed(expectTypeOf(*this, getDwIn(), getWIn(), "input weight gradient",
                          "the expert input weight")) ||
      failed(expectTypeOf(*this, getDwOut(), getWOut(), "output weight gradient",
                          "the expert output weight")))
    return failure();
  return success();
}

LogicalResult RouterLoadGradOp::verify() {
  ArrayRef<int64_t> logits = shapeOf(getLogits());
  if (logits.empty()) return emitOpError() << "router logits need an experts dim";
  if (failed(expectShape(*this, getDprobs(), {logits.back()}, "summed probabilities gradient")))
    return failure();
  return expectTypeOf(*this, getDlogits(), getLogits(), "router logits gradient",
                      "the router logits");
}

LogicalResult RouterAuxLossGradOp::verify() {
  if (failed(expectShape(*this, getDprobs(), shapeOf(getPicks()), "summed probabilities gradient")))
    return failure();
  if (!(getScale().convertToDouble() > 0))
    return emitOpError() << "scale must be positive, got " << getScale().convertToDouble();
  return success();
}

LogicalResult CrossEntropyGradOp::verify() {
  if (failed(expectRank(*this, getLogits(), 3, "logits [batch, seq, vocab]")) ||
      failed(expectRank(*this, getTargets(), 2, "targets [batch, seq]")))
    return failure();
  if (failed(expectShape(*this, getTargets(), shapeOf(getLogits()).drop_back(), "targets")))
    return failure();
  return expectTypeOf(*this, getDlogits(), getLogits(), "logits gradient", "the logits");
}

LogicalResult ParamGradOp::verify() {
  if (getName().empty()) return emitOpError() << "parameter gradient needs a checkpoint name";
  if (!getGrad().getType().hasStaticShape())
    return emitOpError() << "gradient of parameter '" << getName() << "' must have a static shape";
  return success();
}

}  // namespace hcp::model
