// hcp-keep-ssd-states: each ssd_scan.backward reads the chunk states its forward computed instead
// of recomputing them.
#include "passes/lowering/KeepForBackward.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_KEEPSSDSTATES
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using ForwardArgs = plan::SsdScanForwardArgs<Value>;
using BackwardArgs = plan::SsdScanBackwardArgs<Value>;

// Whether `backward` is of a forward with these arguments: the same ints and the inputs the
// states depend on (x, dt, A, B, the initial state, the documents' positions).
bool sameScan(const ForwardArgs& forward, const BackwardArgs& backward) {
  if (backward.keep_states || forward.keep_states || forward.batch != backward.batch ||
      forward.seq != backward.seq || forward.heads != backward.heads ||
      forward.head_dim != backward.head_dim || forward.groups != backward.groups ||
      forward.state != backward.state || forward.chunk != backward.chunk ||
      forward.has_init != backward.has_init || forward.documents != backward.documents) {
    return false;
  }
  if (forward.has_init && !sameBuffer(forward.init_state, backward.init_state)) return false;
  if (forward.documents && !sameBuffer(forward.positions, backward.positions)) return false;
  return sameBuffer(forward.x, backward.x) && sameBuffer(forward.dt, backward.dt) &&
         sameBuffer(forward.A, backward.A) && sameBuffer(forward.B, backward.B);
}

std::vector<Value> statesInputs(const ForwardArgs& forward) {
  std::vector<Value> inputs = {forward.x, forward.dt, forward.A, forward.B};
  if (forward.has_init) inputs.push_back(forward.init_state);
  if (forward.documents) inputs.push_back(forward.positions);
  return inputs;
}

// [batch, heads, chunks, head_dim, state] f32.
MemRefType statesType(OpBuilder& b, const ForwardArgs& forward) {
  const int64_t chunks = (forward.seq + forward.chunk - 1) / forward.chunk;
  return MemRefType::get({forward.batch, forward.heads, chunks, forward.head_dim, forward.state},
                         b.getF32Type());
}

struct KeepSsdStatesPass : impl::KeepSsdStatesBase<KeepSsdStatesPass> {
  void runOnOperation() override {
    const KeepForBackward<ForwardArgs, BackwardArgs> spec{
        .pairs = sameScan,
        .inputs = statesInputs,
        .type = statesType,
        .namedAfter = [](const ForwardArgs& forward) { return forward.y; },
        .suffix = ".chunk_states",
        .keep =
            [](ForwardArgs& forward, BackwardArgs& backward, Value kept) {
              forward.keep_states = backward.keep_states = true;
              forward.chunk_states = backward.chunk_states = kept;
            },
    };
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      keptLayers +=
          keepForBackward<plan::SsdScanForwardArgs, plan::SsdScanBackwardArgs>(func, spec);
    }
  }
};

}  // namespace
}  // namespace hcp
