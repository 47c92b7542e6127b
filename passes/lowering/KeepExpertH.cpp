// hcp-keep-expert-h: each moe_experts.backward reads its forward's first product instead of
// recomputing it.
#include <algorithm>
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/LaunchArgs.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_KEEPEXPERTH
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using ForwardArgs = plan::MoeExpertsForwardArgs<Value>;
using BackwardArgs = plan::MoeExpertsBackwardArgs<Value>;

bool sameBuffer(Value a, Value b) { return rootOf(a) && rootOf(a) == rootOf(b); }

// Whether `backward` is of a forward with these arguments: the same ints and inputs.
bool sameExperts(const ForwardArgs& forward, const BackwardArgs& backward) {
  return forward.tokens == backward.tokens && forward.hidden == backward.hidden &&
         forward.inner == backward.inner && forward.experts == backward.experts &&
         forward.k == backward.k && forward.keep_h == backward.keep_h &&
         sameBuffer(forward.x, backward.x) && sameBuffer(forward.gates, backward.gates) &&
         sameBuffer(forward.expert_ids, backward.expert_ids) &&
         sameBuffer(forward.w_in, backward.w_in) && sameBuffer(forward.w_out, backward.w_out);
}

// The forward whose h `backward` would recompute, as an index into `forwards` (every
// moe_experts.forward, in step order): the last one before it on the same x, gates, ids and
// weights with the same ints, if x, the ids and w_in (what h depends on) are not written between
// the two. (A recomputed layer's backward pairs with the forward that recomputed it, not the
// first one.)
std::optional<size_t> forwardOf(exec::LaunchOp backwardLaunch, const BackwardArgs& backward,
                                ArrayRef<exec::LaunchOp> forwards, const Accesses& accesses) {
  if (backward.keep_h) return std::nullopt;
  const int64_t to = accesses.position(backwardLaunch);
  size_t index = std::partition_point(forwards.begin(), forwards.end(),
                                      [&](exec::LaunchOp f) { return accesses.position(f) < to; }) -
                 forwards.begin();
  while (index-- > 0) {
    ForwardArgs forward = *decodeLaunch<plan::MoeExpertsForwardArgs>(forwards[index]);
    if (!sameExperts(forward, backward)) continue;
    const int64_t from = accesses.position(forwards[index]) + 1;
    for (Value input : {forward.x, forward.expert_ids, forward.w_in}) {
      if (accesses.touchedBetween(input, from, to, /*any=*/false)) return std::nullopt;
    }
    return index;
  }
  return std::nullopt;
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
      if (isLaunchOf<plan::MoeExpertsForwardArgs>(launch)) forwards.push_back(launch);
    }
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      std::optional<BackwardArgs> backward = decodeLaunch<plan::MoeExpertsBackwardArgs>(launch);
      if (!backward) return false;
      std::optional<size_t> forward = forwardOf(launch, *backward, forwards, accesses);
      if (forward) forwards[*forward] = apply(forwards[*forward], launch, *backward, accesses);
      return forward.has_value();
    });
  }

  // The forward gets the kept h as a second output ([tokens, k, 2*inner], the activations' type,
  // named after the forward's output) and the backward as a last input. Returns the new forward.
  exec::LaunchOp apply(exec::LaunchOp forwardLaunch, exec::LaunchOp backwardLaunch,
                       BackwardArgs backward, Accesses& accesses) {
    ForwardArgs forward = *decodeLaunch<plan::MoeExpertsForwardArgs>(forwardLaunch);
    auto outType = cast<MemRefType>(forward.out.getType());
    auto type =
        MemRefType::get({forward.tokens, forward.k, 2 * forward.inner}, outType.getElementType());
    OpBuilder b(forwardLaunch);
    exec::BufferOp root = rootOf(forward.out);
    std::string name = (root ? root.getName().str() : std::string("moe")) + ".kept_h";
    Value kept = exec::BufferOp::create(
        b, forwardLaunch.getLoc(), type,
        exec::ArenaAttr::get(b.getContext(), exec::Arena::Activations), b.getStringAttr(name),
        IntegerAttr(), exec::ParamInitAttr(), FloatAttr(), IntegerAttr());
    forward.keep_h = true;
    forward.kept_h = kept;
    exec::LaunchOp keeping = createLaunch(b, forwardLaunch.getLoc(), forward);
    b.setInsertionPoint(backwardLaunch);
    backward.keep_h = true;
    backward.kept_h = kept;
    exec::LaunchOp reading = createLaunch(b, backwardLaunch.getLoc(), backward);
    accesses.replace(forwardLaunch, keeping);
    accesses.replace(backwardLaunch, reading);
    forwardLaunch.erase();
    backwardLaunch.erase();
    ++keptLayers;
    return keeping;
  }
};

}  // namespace
}  // namespace hcp
