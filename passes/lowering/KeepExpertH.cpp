// hcp-keep-expert-h: each moe_experts.backward reads its forward's first product instead of
// recomputing it.
#include "passes/lowering/KeepForBackward.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_KEEPEXPERTH
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using ForwardArgs = plan::MoeExpertsForwardArgs<Value>;
using BackwardArgs = plan::MoeExpertsBackwardArgs<Value>;

// Whether `backward` is of a forward with these arguments: the same ints and inputs.
bool sameExperts(const ForwardArgs& forward, const BackwardArgs& backward) {
  return !backward.keep_h && forward.tokens == backward.tokens &&
         forward.hidden == backward.hidden && forward.inner == backward.inner &&
         forward.experts == backward.experts && forward.k == backward.k &&
         forward.keep_h == backward.keep_h && sameBuffer(forward.x, backward.x) &&
         sameBuffer(forward.gates, backward.gates) &&
         sameBuffer(forward.expert_ids, backward.expert_ids) &&
         sameBuffer(forward.w_in, backward.w_in) && sameBuffer(forward.w_out, backward.w_out);
}

// What h depends on.
std::vector<Value> hInputs(const ForwardArgs& forward) {
  return {forward.x, forward.expert_ids, forward.w_in};
}

// [tokens, k, 2*inner], the activations' type.
MemRefType keptType(OpBuilder&, const ForwardArgs& forward) {
  auto outType = cast<MemRefType>(forward.out.getType());
  return MemRefType::get({forward.tokens, forward.k, 2 * forward.inner}, outType.getElementType());
}

struct KeepExpertHPass : impl::KeepExpertHBase<KeepExpertHPass> {
  void runOnOperation() override {
    const KeepForBackward<ForwardArgs, BackwardArgs> spec{
        .pairs = sameExperts,
        .inputs = hInputs,
        .type = keptType,
        .namedAfter = [](const ForwardArgs& forward) { return forward.out; },
        .suffix = ".kept_h",
        .keep =
            [](ForwardArgs& forward, BackwardArgs& backward, Value kept) {
              forward.keep_h = backward.keep_h = true;
              forward.kept_h = backward.kept_h = kept;
            },
    };
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      keptLayers +=
          keepForBackward<plan::MoeExpertsForwardArgs, plan::MoeExpertsBackwardArgs>(func, spec);
    }
  }
};

}  // namespace
}  // namespace hcp
