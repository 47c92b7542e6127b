// hcp-keep-ssd-states: each ssd_scan.backward reads the chunk states its forward computed instead
// of recomputing them.
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

#define GEN_PASS_DEF_KEEPSSDSTATES
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using ForwardArgs = plan::SsdScanForwardArgs<Value>;
using BackwardArgs = plan::SsdScanBackwardArgs<Value>;

bool sameBuffer(Value a, Value b) { return rootOf(a) && rootOf(a) == rootOf(b); }

// Whether `backward` is of a forward with these arguments: the same ints and the inputs the
// states depend on (x, dt, A, B, the initial state, the documents' positions).
bool sameScan(const ForwardArgs& forward, const BackwardArgs& backward) {
  if (forward.batch != backward.batch || forward.seq != backward.seq ||
      forward.heads != backward.heads || forward.head_dim != backward.head_dim ||
      forward.groups != backward.groups || forward.state != backward.state ||
      forward.chunk != backward.chunk || forward.has_init != backward.has_init ||
      forward.documents != backward.documents || forward.keep_states != backward.keep_states) {
    return false;
  }
  if (forward.has_init && !sameBuffer(forward.init_state, backward.init_state)) return false;
  if (forward.documents && !sameBuffer(forward.positions, backward.positions)) return false;
  return sameBuffer(forward.x, backward.x) && sameBuffer(forward.dt, backward.dt) &&
         sameBuffer(forward.A, backward.A) && sameBuffer(forward.B, backward.B);
}

// The forward whose states `backward` would recompute, as an index into `forwards` (every
// ssd_scan.forward, in step order): the last one before it on the same inputs with the same
// ints, if none of those inputs is written between the two. (A recomputed layer's backward pairs
// with the forward that recomputed it.)
std::optional<size_t> forwardOf(exec::LaunchOp backwardLaunch, const BackwardArgs& backward,
                                ArrayRef<exec::LaunchOp> forwards, const Accesses& accesses) {
  if (backward.keep_states) return std::nullopt;
  const int64_t to = accesses.position(backwardLaunch);
  size_t index = std::partition_point(forwards.begin(), forwards.end(),
                                      [&](exec::LaunchOp f) { return accesses.position(f) < to; }) -
                 forwards.begin();
  while (index-- > 0) {
    ForwardArgs forward = *decodeLaunch<plan::SsdScanForwardArgs>(forwards[index]);
    if (!sameScan(forward, backward)) continue;
    const int64_t from = accesses.position(forwards[index]) + 1;
    std::vector<Value> inputs = {forward.x, forward.dt, forward.A, forward.B};
    if (forward.has_init) inputs.push_back(forward.init_state);
    if (forward.documents) inputs.push_back(forward.positions);
    for (Value input : inputs) {
      if (accesses.touchedBetween(input, from, to, /*any=*/false)) return std::nullopt;
    }
    return index;
  }
  return std::nullopt;
}

struct KeepSsdStatesPass : impl::KeepSsdStatesBase<KeepSsdStatesPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) keepInFunction(func);
  }

  void keepInFunction(func::FuncOp func) {
    // Where forwardOf looks, kept in step order as forwards are replaced.
    std::vector<exec::LaunchOp> forwards;
    for (auto launch : func.getBody().front().getOps<exec::LaunchOp>()) {
      if (isLaunchOf<plan::SsdScanForwardArgs>(launch)) forwards.push_back(launch);
    }
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      std::optional<BackwardArgs> backward = decodeLaunch<plan::SsdScanBackwardArgs>(launch);
      if (!backward) return false;
      std::optional<size_t> forward = forwardOf(launch, *backward, forwards, accesses);
      if (forward) forwards[*forward] = apply(forwards[*forward], launch, *backward, accesses);
      return forward.has_value();
    });
  }

  // The forward gets the states as a third output ([batch, heads, chunks, head_dim, state] f32,
  // named after the forward's y) and the backward as a last input. Returns the new forward.
  exec::LaunchOp apply(exec::LaunchOp forwardLaunch, exec::LaunchOp backwardLaunch,
                       BackwardArgs backward, Accesses& accesses) {
    ForwardArgs forward = *decodeLaunch<plan::SsdScanForwardArgs>(forwardLaunch);
    const int64_t chunks = (forward.seq + forward.chunk - 1) / forward.chunk;
    OpBuilder b(forwardLaunch);
    auto type = MemRefType::get(
        {forward.batch, forward.heads, chunks, forward.head_dim, forward.state}, b.getF32Type());
    exec::BufferOp root = rootOf(forward.y);
    std::string name = (root ? root.getName().str() : std::string("ssd")) + ".chunk_states";
    Value kept = exec::BufferOp::create(
        b, forwardLaunch.getLoc(), type,
        exec::ArenaAttr::get(b.getContext(), exec::Arena::Activations), b.getStringAttr(name),
        IntegerAttr(), exec::ParamInitAttr(), FloatAttr(), IntegerAttr());
    forward.keep_states = true;
    forward.chunk_states = kept;
    exec::LaunchOp keeping = createLaunch(b, forwardLaunch.getLoc(), forward);
    b.setInsertionPoint(backwardLaunch);
    backward.keep_states = true;
    backward.chunk_states = kept;
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
