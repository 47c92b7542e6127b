#include "dialects/model/ModelOps.h"

#include <cmath>

#include "dialects/model/VerifyHelpers.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;

namespace hcp::model {

using namespace checks;

LogicalResult ParamOp::verify() {
  if (getName().empty()) return emitOpError() << "parameter needs a checkpoint name";
  if (!getResult().getType().hasStaticShape())
    return emitOpError() << "parameter '" << getName() << "' must have a static shape";
  if (getInit() == ParamInit::Normal && (!getStd() || getStd()->convertToDouble() <= 0.0))
    return emitOpError() << "parameter '" << getName()
                         << "' is initialised from a normal distribution and needs a positive std";
  if (getInit() != ParamInit::Normal && getStd())
    return emitOpError() << "parameter '" << getName() << "': std only applies to normal init";
  if (getInit() == ParamInit::LogArange && getResult().getType().getRank() != 1)
    return emitOpError() << "parameter '" << getName() << "': log_arange init needs rank 1";
  if (std::optional<uint64_t> shards = getShards()) {
    if (static_cast<int64_t>(*shards) < 1)
      return emitOpError() << "parameter '" << getName() << "' must have at least 1 shard, got "
                           << static_cast<int64_t>(*shards);
    if (getResult().getType().getRank() == 0)
      return emitOpError() << "parameter '" << getName()
                           << "' is a scalar: only a tensor splits into shards (along dim 0)";
  }
  return success();
}

LogicalResult EmbeddingOp::verify() {
  if (failed(expectRank(*this, getTable(), 2, "embedding table")) ||
      failed(expectRank(*this, getIds(), 2, "token ids")))
    return failure();
  ArrayRef<int64_t> table = shapeOf(getTable()), ids = shapeOf(getIds());
  if (failed(expectShape(*this, getResult(), {ids[0], ids[1], table[1]}, "embedding output")))
    return failure();
  if (IntegerAttr pad = getPaddingIdxAttr(); pad && (pad.getInt() < 0 || pad.getInt() >= table[0]))
    return emitOpError() << "padding_idx " << pad.getInt() << " is outside the vocabulary of "
                         << table[0] << " tokens";
  return expectSameElementType(*this, getTable(), getResult(), "embedding table", "output");
}

LogicalResult RmsNormOp::verify() {
  if (failed(expectRank(*this, getWeight(), 1, "norm weight"))) return failure();
  int64_t hidden = shapeOf(getX()).back();
  if (shapeOf(getWeight())[0] != hidden)
    return emitOpError() << "norm weight has " << shapeOf(getWeight())[0]
                         << " entries but the normalised dim has " << hidden;
  if (getEps().convertToDouble() <= 0.0) return emitOpError() << "eps must be positive";
  return success();
}

LogicalResult LinearOp::verify() {
  if (failed(expectRank(*this, getWeight(), 2, "linear weight"))) return failure();
  ArrayRef<int64_t> x = shapeOf(getX()), w = shapeOf(getWeight());
  if (x.empty()) return emitOpError() << "input must have at least one dim";
  if (w[1] != x.back())
    return emitOpError() << "weight " << formatShape(w) << " expects inputs of size " << w[1]
                         << " but the input's last dim is " << x.back();
  return expectShape(*this, getResult(), withLastDim(x, w[0]), "linear output");
}

template <typename BinaryOp>
static LogicalResult verifyBroadcast(BinaryOp op) {
  ArrayRef<int64_t> lhs = shapeOf(op.getLhs()), rhs = shapeOf(op.getRhs());
  if (rhs.size() > lhs.size() || lhs.take_back(rhs.size()) != rhs)
    return op.emitOpError() << "rhs shape " << formatShape(rhs)
                            << " must equal the trailing dims of lhs shape " << formatShape(lhs);
  return expectSameElementType(op, op.getLhs(), op.getRhs(), "lhs", "rhs");
}

LogicalResult AddOp::verify() { return verifyBroadcast(*this); }
LogicalResult MulOp::verify() { return verifyBroadcast(*this); }
LogicalResult DivOp::verify() { return verifyBroadcast(*this); }

LogicalResult SplitOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX());
  if (x.empty()) return emitOpError() << "cannot split a scalar";
  if (getSizes().size() != getPieces().size())
    return emitOpError() << getSizes().size() << " sizes given for " << getPieces().size()
                         << " results";
  int64_t total = 0;
  for (auto [size, piece] : llvm::zip(getSizes(), getPieces())) {
    if (size <= 0) return emitOpError() << "split sizes must be positive, got " << size;
    total += size;
    if (failed(expectShape(*this, piece, withLastDim(x, size), "split piece"))) return failure();
  }
  if (total != x.back())
    return emitOpError() << "split sizes add up to " << total << " but the last dim is "
                         << x.back();
  return success();
}

LogicalResult ReshapeOp::verify() {
  RankedTensorType in = tensorType(getX()), out = tensorType(getResult());
  if (!in.hasStaticShape() || !out.hasStaticShape())
    return emitOpError() << "reshape needs static shapes";
  if (in.getNumElements() != out.getNumElements())
    return emitOpError() << "cannot reshape " << formatShape(in.getShape()) << " ("
                         << in.getNumElements() << " elements) to " << formatShape(out.getShape())
                         << " (" << out.getNumElements() << " elements)";
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "reshape cannot change the element type";
  return success();
}

LogicalResult CastOp::verify() {
  return expectShape(*this, getResult(), shapeOf(getX()), "cast result");
}

LogicalResult SwigluOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX());
  if (x.empty() || x.back() % 2 != 0)
    return emitOpError() << "the packed gate|up dim must be even, got shape " << formatShape(x);
  return expectShape(*this, getResult(), withLastDim(x, x.back() / 2), "swiglu output");
}

LogicalResult CausalConv1dOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getX()))) return failure();
  if (failed(expectRank(*this, getX(), 3, "conv input [batch, seq, channels]")) ||
      failed(expectRank(*this, getWeight(), 3, "conv weight [channels, 1, width]")) ||
      failed(expectRank(*this, getBias(), 1, "conv bias")))
    return failure();
  int64_t channels = shapeOf(getX())[2];
  ArrayRef<int64_t> w = shapeOf(getWeight());
  if (w[0] != channels || w[1] != 1)
    return emitOpError() << "depthwise conv weight must be [" << channels << ", 1, width], got "
                         << formatShape(w);
  if (w[2] < 1) return emitOpError() << "conv width must be at least 1";
  if (getHalo() && failed(expectShape(*this, getHalo(), {shapeOf(getX())[0], w[2] - 1, channels},
                                      "conv halo [batch, width-1, channels]")))
    return failure();
  return expectShape(*this, getBias(), {channels}, "conv bias");
}

LogicalResult SsdLogDecayOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getDt()))) return failure();
  if (failed(expectRank(*this, getDt(), 3, "dt [batch, seq, heads]"))) return failure();
  ArrayRef<int64_t> dt = shapeOf(getDt());
  if (failed(expectShape(*this, getA(), {dt[2]}, "A")) ||
      failed(expectShape(*this, getG(), {dt[0], dt[2]}, "log-decay")))
    return failure();
  if (tensorType(getG()).getElementType() != Float32Type::get(getContext()))
    return emitOpError() << "log-decay must be f32";
  return success();
}

LogicalResult SsdScanOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getX()))) return failure();
  FailureOr<SsdDims> d = verifySsdOperands(*this, getX(), getDt(), getA(), getB());
  if (failed(d)) return failure();
  if (failed(expectShape(*this, getC(), shapeOf(getB()), "C")) ||
      failed(expectShape(*this, getD(), {d->heads}, "D")) ||
      failed(expectShape(*this, getY(), shapeOf(getX()), "y")) ||
      failed(expectShape(*this, getFinalState(), d->stateShape(), "final state")))
    return failure();
  if (getInitState() &&
      failed(expectShape(*this, getInitState(), d->stateShape(), "initial state")))
    return failure();
  if (getChunkSize() <= 0) return emitOpError() << "chunk size must be positive";
  return success();
}

LogicalResult SsdFinalStateOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getX()))) return failure();
  FailureOr<SsdDims> d = verifySsdOperands(*this, getX(), getDt(), getA(), getB());
  if (failed(d) || failed(expectShape(*this, getFinalState(), d->stateShape(), "final state")))
    return failure();
  // The states of the SSD are f32 whatever the activation type (model.ssd_scan's final state,
  // dist.state_scan's operands).
  if (tensorType(getFinalState()).getElementType() != Float32Type::get(getContext()))
    return emitOpError() << "final state must be f32";
  if (getChunkSize() <= 0) return emitOpError() << "chunk size must be positive";
  return success();
}

LogicalResult SsdAddInitialStateOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getY()))) return failure();
  return verifyInitialStateOperands(*this, getY(), getDt(), getA(), getC(), getInitState());
}

LogicalResult GatedRmsNormOp::verify() {
  if (failed(expectRank(*this, getWeight(), 1, "norm weight"))) return failure();
  int64_t dim = shapeOf(getY()).back();
  if (shapeOf(getWeight())[0] != dim)
    return emitOpError() << "norm weight has " << shapeOf(getWeight())[0]
                         << " entries but the normalised dim has " << dim;
  return success();
}

LogicalResult AttentionOp::verify() {
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
  if (failed(expectShape(*this, getV(), k, "v")) ||
      failed(expectShape(*this, getOut(), q, "attention output")) ||
      failed(expectShape(*this, getLse(), {q[0], q[2], q[1]}, "log-sum-exp")))
    return failure();
  if (tensorType(getLse()).getElementType() != Float32Type::get(getContext()))
    return emitOpError() << "log-sum-exp must be f32";
  return success();
}

LogicalResult MoeRouteOp::verify() {
  ArrayRef<int64_t> logits = shapeOf(getLogits());
  if (logits.empty()) return emitOpError() << "router logits need an experts dim";
  int64_t experts = logits.back(), k = getTopK();
  if (k < 1 || k > experts)
    return emitOpError() << "top_k " << k << " must be between 1 and the " << experts << " experts";
  if (failed(expectShape(*this, getGates(), withLastDim(logits, k), "gates")) ||
      failed(expectShape(*this, getExperts(), withLastDim(logits, k), "expert indices")))
    return failure();
  return success();
}

LogicalResult MoeExpertsOp::verify() {
  if (failed(expectRank(*this, getInputWeight(), 3,
                        "expert input weight [experts, 2*width, hidden]")) ||
      failed(
          expectRank(*this, getOutputWeight(), 3, "expert output weight [experts, hidden, width]")))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getX()), win = shapeOf(getInputWeight()),
                    gates = shapeOf(getGates());
  int64_t hidden = x.back(), experts = win[0];
  if (win[2] != hidden || win[1] % 2 != 0)
    return emitOpError() << "expert input weight must be [experts, 2*width, " << hidden << "], got "
                         << formatShape(win);
  if (failed(expectShape(*this, getOutputWeight(), {experts, hidden, win[1] / 2},
                         "expert output weight")))
    return failure();
  if (gates.size() != x.size() || gates.drop_back() != x.drop_back())
    return emitOpError() << "gates " << formatShape(gates) << " must be [tokens..., k] for input "
                         << formatShape(x);
  if (gates.back() > experts)
    return emitOpError() << "each token picks " << gates.back() << " experts but there are only "
                         << experts;
  if (failed(expectShape(*this, getExperts(), gates, "expert indices")) ||
      failed(expectShape(*this, getResult(), x, "expert output")))
    return failure();
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  if (failed(expectRank(*this, getLogits(), 3, "logits [batch, seq, vocab]")) ||
      failed(expectRank(*this, getTargets(), 2, "targets [batch, seq]")))
    return failure();
  ArrayRef<int64_t> logits = shapeOf(getLogits());
  return expectShape(*this, getTargets(), logits.drop_back(), "targets");
}

LogicalResult RouterLoadOp::verify() {
  ArrayRef<int64_t> logits = shapeOf(getLogits()), experts = shapeOf(getExperts());
  if (logits.empty() || experts.size() != logits.size() ||
      experts.drop_back() != logits.drop_back())
    return emitOpError() << "expert indices " << formatShape(experts)
                         << " must be [tokens..., k] for router logits " << formatShape(logits);
  if (experts.back() > logits.back())
    return emitOpError() << "each token picks " << experts.back() << " experts but there are only "
                         << logits.back();
  if (failed(expectShape(*this, getProbs(), {logits.back()}, "summed probabilities")) ||
      failed(expectShape(*this, getPicks(), {logits.back()}, "expert picks")))
    return failure();
  return success();
}

LogicalResult RouterAuxLossOp::verify() {
  if (failed(expectShape(*this, getPicks(), shapeOf(getProbs()), "expert picks"))) return failure();
  if (!(getScale().convertToDouble() > 0) || !std::isfinite(getScale().convertToDouble()))
    return emitOpError() << "scale (experts / rows^2) must be a positive number, got "
                         << getScale().convertToDouble();
  return success();
}

LogicalResult ReportOp::verify() {
  if (getName().empty()) return emitOpError() << "a reported value needs a name";
  return success();
}

}  // namespace hcp::model

#define GET_OP_CLASSES }  // namespace hcp::model

#define GET_OP_CLASSES
#include "dialects/model/ModelOps.cpp.inc"
