#include "dialects/dist/DistOps.h"

using namespace mlir;

namespace hcp::dist {
namespace {

ArrayRef<int64_t> shapeOf(Value value) { return cast<ShapedType>(value.getType()).getShape(); }

// The rows of a segment-row tensor are (batch row, local segment) pairs.
LogicalResult checkSegmentRows(Operation* op, SequenceLayoutAttr layout, Value value,
                               StringRef what) {
  ArrayRef<int64_t> shape = shapeOf(value);
  if (shape.empty() || shape[0] % layout.segmentsPerRank() != 0)
    return op->emitOpError() << what << " must have one row per batch row and local segment ("
                             << layout.segmentsPerRank() << " per batch row), got " << shape.size()
                             << "-d shape with " << (shape.empty() ? 0 : shape[0]) << " rows";
  return success();
}

// [rows, len, channels] with len = the layout's segment length.
LogicalResult checkSegments(Operation* op, SequenceLayoutAttr layout, Value x, StringRef what) {
  ArrayRef<int64_t> shape = shapeOf(x);
  if (shape.size() != 3)
    return op->emitOpError() << what << " must be [rows, segment length, channels]";
  if (shape[1] != layout.segmentLength())
    return op->emitOpError() << what << " has segments of " << shape[1] << " tokens, but "
                             << layout.getSeq() << " tokens in " << layout.segments()
                             << " pieces make segments of " << layout.segmentLength();
  return checkSegmentRows(op, layout, x, what);
}

// Packed documents: the local queries' positions [batch, local_seq] of q [batch, local_seq, ...].
LogicalResult expectPositions(Operation* op, Value positions, Value q) {
  if (!positions) return success();
  ArrayRef<int64_t> p = shapeOf(positions), x = shapeOf(q);
  if (p.size() != 2 || x.size() < 2 || p[0] != x[0] || p[1] != x[1])
    return op->emitOpError() << "document positions must be [batch, local_seq] = [" << x[0] << ", "
                             << x[1] << "], the queries'";
  return success();
}

LogicalResult checkSameShape(Operation* op, Value a, Value b, StringRef whatA, StringRef whatB) {
  if (shapeOf(a) != shapeOf(b))
    return op->emitOpError() << whatA << " and " << whatB << " must have the same shape";
  return success();
}

}  // namespace

LogicalResult HaloExchangeOp::verify() {
  if (failed(checkSegments(*this, getLayout(), getX(), "conv input"))) return failure();
  int64_t width = getWidth(), len = shapeOf(getX())[1];
  if (width < 0) return emitOpError() << "halo width must not be negative";
  if (width > len)
    return emitOpError() << "pieces of " << len << " tokens are shorter than the conv halo of "
                         << width << " tokens (d_conv - 1): use fewer pieces or a longer sequence";
  ArrayRef<int64_t> x = shapeOf(getX());
  if (shapeOf(getHalo()) != ArrayRef<int64_t>({x[0], width, x[2]}))
    return emitOpError() << "halo must be [" << x[0] << ", " << width << ", " << x[2] << "]";
  return success();
}

LogicalResult HaloExchangeGradOp::verify() {
  if (failed(checkSegments(*this, getLayout(), getDx(), "conv input gradient"))) return failure();
  ArrayRef<int64_t> dx = shapeOf(getDx()), dhalo = shapeOf(getDhalo());
  if (dhalo.size() != 3 || dhalo[0] != dx[0] || dhalo[2] != dx[2] || dhalo[1] > dx[1])
    return emitOpError() << "halo gradient must be [" << dx[0] << ", width <= " << dx[1] << ", "
                         << dx[2] << "]";
  return success();
}

LogicalResult StateScanOp::verify() {
  if (failed(checkSegmentRows(*this, getLayout(), getS(), "states"))) return failure();
  ArrayRef<int64_t> s = shapeOf(getS());
  if (s.size() != 4) return emitOpError() << "states must be [rows, heads, head_dim, state]";
  if (shapeOf(getG()) != s.take_front(2))
    return emitOpError() << "log-decays must be [rows, heads] = [" << s[0] << ", " << s[1] << "]";
  return checkSameShape(*this, getS(), getSIn(), "states", "incoming states");
}

LogicalResult StateScanGradOp::verify() {
  if (failed(checkSegmentRows(*this, getLayout(), getSIn(), "incoming states"))) return failure();
  if (failed(checkSameShape(*this, getDsIn(), getSIn(), "incoming-state gradient", "states")) ||
      failed(checkSameShape(*this, getDs(), getSIn(), "state gradient", "states")) ||
      failed(checkSameShape(*this, getDg(), getG(), "log-decay gradient", "log-decays")))
    return failure();
  return success();
}

static LogicalResult verifyRingAttention(Operation* op, SequenceLayoutAttr layout, Value q,
                                         Value k) {
  ArrayRef<int64_t> qs = shapeOf(q), ks = shapeOf(k);
  if (qs.size() != 4 || ks.size() != 4)
    return op->emitOpError() << "q and k must be [batch, local_seq, heads, head_dim]";
  if (qs[1] != layout.localLength())
    return op->emitOpError() << "local sequence of " << qs[1] << " tokens, but the layout gives "
                             << layout.localLength() << " per rank";
  if (ks[0] != qs[0] || ks[1] != qs[1] || ks[3] != qs[3])
    return op->emitOpError() << "k does not match q in batch, sequence or head_dim";
  if (qs[2] % ks[2] != 0)
    return op->emitOpError() << ks[2] << " kv heads do not divide " << qs[2] << " query heads";
  return success();
}

LogicalResult RingAttentionOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getQ()))) return failure();
  return verifyRingAttention(*this, getLayout(), getQ(), getK());
}

LogicalResult RingAttentionGradOp::verify() {
  if (failed(expectPositions(*this, getPositions(), getQ()))) return failure();
  return verifyRingAttention(*this, getLayout(), getQ(), getK());
}

// The experts split: weights of this rank's E/ep experts, tokens routed among all E.
static LogicalResult verifyMoeExperts(Operation* op, Value x, Value gates, Value experts, Value win,
                                      Value wout, int64_t numExperts, int64_t ep) {
  if (ep < 1) return op->emitOpError() << "ep must be at least 1, got " << ep;
  if (numExperts < 1 || numExperts % ep != 0)
    return op->emitOpError() << numExperts << " experts cannot be split over ep=" << ep << " ranks";
  const int64_t local = numExperts / ep;
  ArrayRef<int64_t> xs = shapeOf(x), w = shapeOf(win), g = shapeOf(gates);
  if (xs.empty()) return op->emitOpError() << "x must be [tokens..., hidden]";
  const int64_t hidden = xs.back();
  if (w.size() != 3 || w[0] != local || w[1] % 2 != 0 || w[2] != hidden)
    return op->emitOpError() << "expert input weight must be [" << local << ", 2*width, " << hidden
                             << "]: this rank's " << numExperts << "/" << ep << " experts";
  if (shapeOf(wout) != ArrayRef<int64_t>({local, hidden, w[1] / 2}))
    return op->emitOpError() << "expert output weight must be [" << local << ", " << hidden << ", "
                             << w[1] / 2 << "]";
  if (g.size() != xs.size() || g.drop_back() != xs.drop_back())
    return op->emitOpError() << "gates must be [tokens..., k] for the tokens of x";
  if (g.back() < 1 || g.back() > numExperts)
    return op->emitOpError() << "each token picks " << g.back() << " experts but there are "
                             << numExperts;
  if (shapeOf(experts) != g)
    return op->emitOpError() << "expert indices must have the shape of the gates";
  return success();
}

LogicalResult MoeExpertsOp::verify() {
  if (failed(verifyMoeExperts(*this, getX(), getGates(), getExperts(), getInputWeight(),
                              getOutputWeight(), getNumExperts(), getEp())))
    return failure();
  return checkSameShape(*this, getResult(), getX(), "expert output", "x");
}

LogicalResult MoeExpertsGradOp::verify() {
  if (failed(verifyMoeExperts(*this, getX(), getGates(), getExperts(), getWIn(), getWOut(),
                              getNumExperts(), getEp())) ||
      failed(checkSameShape(*this, getDout(), getX(), "output gradient", "x")) ||
      failed(checkSameShape(*this, getDx(), getX(), "x gradient", "x")) ||
      failed(checkSameShape(*this, getDgates(), getGates(), "gates gradient", "gates")) ||
      failed(checkSameShape(*this, getDwIn(), getWIn(), "input weight gradient", "input weight")) ||
      failed(
          checkSameShape(*this, getDwOut(), getWOut(), "output weight gradient", "output weight")))
    return failure();
  return success();
}

// --- transposes --------------------------------------------------------------------------------

LogicalResult HaloExchangeOp::buildBackward(OpBuilder& b, ArrayRef<Value> dy,
                                            SmallVectorImpl<Value>& grads) {
  grads[0] = HaloExchangeGradOp::create(b, getLoc(), getX().getType(), dy[0], getLayoutAttr());
  return success();
}

LogicalResult StateScanOp::buildBackward(OpBuilder& b, ArrayRef<Value> dy,
                                         SmallVectorImpl<Value>& grads) {
  auto grad = StateScanGradOp::create(b, getLoc(), getG().getType(), getS().getType(), dy[0],
                                      getG(), getSIn(), getLayoutAttr(), getStrategyAttr());
  grads[0] = grad.getDg();
  grads[1] = grad.getDs();
  return success();
}

LogicalResult RingAttentionOp::buildBackward(OpBuilder& b, ArrayRef<Value> dy,
                                             SmallVectorImpl<Value>& grads) {
  // The loss reaches attention through `out` only; lse feeds nothing in the model.
  if (!dy[0]) return emitOpError() << "only the attention output can carry a gradient";
  auto grad = RingAttentionGradOp::create(
      b, getLoc(), getQ().getType(), getK().getType(), getV().getType(), dy[0], getQ(), getK(),
      getV(), getOut(), getLse(), getPositions(), getLayoutAttr(), getScaleAttr(), getCausalAttr());
  grads[0] = grad.getDq();
  grads[1] = grad.getDk();
  grads[2] = grad.getDv();
  return success();
}

LogicalResult MoeExpertsOp::buildBackward(OpBuilder& b, ArrayRef<Value> dy,
                                          SmallVectorImpl<Value>& grads) {
  auto grad = MoeExpertsGradOp::create(b, getLoc(), getX().getType(), getGates().getType(),
                                       getInputWeight().getType(), getOutputWeight().getType(),
                                       dy[0], getX(), getGates(), getExperts(), getInputWeight(),
                                       getOutputWeight(), getNumExpertsAttr(), getEpAttr());
  grads[0] = grad.getDx();
  grads[1] = grad.getDgates();
  // experts (operand 2): integer indices, no gradient.
  grads[3] = grad.getDwIn();
  grads[4] = grad.getDwOut();
  return success();
}

LogicalResult AllReduceOp::buildBackward(OpBuilder&, ArrayRef<Value> dy,
                                         SmallVectorImpl<Value>& grads) {
  grads[0] = dy[0];  // see the op's description: the result is replicated
  return success();
}

}  // namespace hcp::dist

#define GET_OP_CLASSES
#include "dialects/dist/DistOps.cpp.inc"
