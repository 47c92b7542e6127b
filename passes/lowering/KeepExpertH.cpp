// hcp-keep-expert-h: each moe_experts.backward reads its forward's first product instead of
// recomputing it.
#include <algorithm>
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_KEEPEXPERTH
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

// The experts kernels' ints: tokens, hidden, inner, experts, k, keep_h; the forward's inputs are
// x, gates, experts (ids), w_in, w_out; the backward's the same after dout.
constexpr unsigned kInner = 2, kK = 4, kKeepH = 5;
constexpr unsigned kX = 0, kIds = 2, kWIn = 3;

bool sameBuffer(Value a, Value b) { return rootOf(a) && rootOf(a) == rootOf(b); }

// The forward whose h `backward` would recompute, as an index into `forwards` (every
// moe_experts.forward, in step order): the last one before it on the same x, gates, ids and
// weights with the same ints, if x, the ids and w_in (what h depends on) are not written between
// the two. (A recomputed layer's backward pairs with the forward that recomputed it, not the
// first one.)
std::optional<size_t> forwardOf(exec::LaunchOp backward, ArrayRef<exec::LaunchOp> forwards,
                                const Accesses& accesses) {
  ArrayRef<int64_t> ints = backward.getInts();
  if (ints.size() != kKeepH + 1 || ints[kKeepH] != 0) return std::nullopt;
  ValueRange gradIns = backward.getIns().drop_front();  // after dout
  const int64_t to = accesses.position(backward);
  size_t index = std::partition_point(forwards.begin(), forwards.end(),
                                      [&](exec::LaunchOp f) { return accesses.position(f) < to; }) -
                 forwards.begin();
  while (index-- > 0) {
    exec::LaunchOp forward = forwards[index];
    if (forward.getInts() != ints) continue;
    ValueRange ins = forward.getIns();
    bool same = true;
    for (unsigned i = 0; i < ins.size(); ++i) same = same && sameBuffer(ins[i], gradIns[i]);
    if (!same) continue;
    const int64_t from = accesses.position(forward) + 1;
    for (unsigned i : {kX, kIds, kWIn}) {
      if (accesses.touchedBetween(ins[i], from, to, /*any=*/false)) return std::nullopt;
    }
    return index;
  }
  return std::nullopt;
}

DenseI64ArrayAttr withKeepH(exec::LaunchOp launch, OpBuilder& b) {
  SmallVector<int64_t> ints(launch.getInts());
  ints[kKeepH] = 1;
  return b.getDenseI64ArrayAttr(ints);
}

struct KeepExpertHPass : impl::KeepExpertHBase<KeepExpertHPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) keepInFunction(func);
  }

  void keepInFunction(func::FuncOp func) {
    // Where forwardOf looks, kept in step order as forwards are replaced (walking back over
    // every op from each backward would take time quadratic in the layers).
    std::vector<exec::LaunchOp> forwards;
    for (auto launch : func.getBody().front().getOps<exec::LaunchOp>()) {
      if (isKernel(launch, "moe_experts.forward")) forwards.push_back(launch);
    }
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      if (!isKernel(launch, "moe_experts.backward")) return false;
      std::optional<size_t> forward = forwardOf(launch, forwards, accesses);
      if (forward) forwards[*forward] = apply(forwards[*forward], launch, accesses);
      return forward.has_value();
    });
  }

  // The forward gets the kept h as a second output ([tokens, k, 2*inner], the activations' type,
  // named after the forward's output) and the backward as a last input. Returns the new forward.
  exec::LaunchOp apply(exec::LaunchOp forward, exec::LaunchOp backward, Accesses& accesses) {
    ArrayRef<int64_t> ints = forward.getInts();
    Value out = forward.getOuts()[0];
    auto outType = cast<MemRefType>(out.getType());
    auto type = MemRefType::get({ints[0], ints[kK], 2 * ints[kInner]}, outType.getElementType());
    OpBuilder b(forward);
    exec::BufferOp root = rootOf(out);
    std::string name = (root ? root.getName().str() : std::string("moe")) + ".kept_h";
    Value kept = exec::BufferOp::create(
        b, forward.getLoc(), type, exec::ArenaAttr::get(b.getContext(), exec::Arena::Activations),
        b.getStringAttr(name), IntegerAttr(), StringAttr(), FloatAttr(), IntegerAttr());
    auto keeping = exec::LaunchOp::create(b, forward.getLoc(), forward.getKernelAttr(),
                                          forward.getIns(), ValueRange{out, kept},
                                          withKeepH(forward, b), forward.getFloatsAttr());
    b.setInsertionPoint(backward);
    SmallVector<Value> ins(backward.getIns());
    ins.push_back(kept);
    auto reading = exec::LaunchOp::create(b, backward.getLoc(), backward.getKernelAttr(), ins,
                                          backward.getOuts(), withKeepH(backward, b),
                                          backward.getFloatsAttr());
    accesses.replace(forward, keeping);
    accesses.replace(backward, reading);
    forward.erase();
    backward.erase();
    ++keptLayers;
    return keeping;
  }
};

}  // namespace
}  // namespace hcp
