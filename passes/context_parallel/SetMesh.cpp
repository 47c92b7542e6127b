// hcp-set-mesh: the module records the ranks it runs on.
#include "dialects/dist/DistDialect.h"
#include "passes/context_parallel/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_SETMESH
#include "passes/context_parallel/Passes.h.inc"

namespace {

struct SetMeshPass : impl::SetMeshBase<SetMeshPass> {
  using Base::Base;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    // The attribute's verifier says what is wrong in the user's terms.
    auto diagnose = [&]() { return module.emitError(); };
    if (mlir::failed(dist::MeshAttr::verify(diagnose, cp, dp, ep))) return signalPassFailure();
    module->setAttr(kMeshAttr, dist::MeshAttr::get(&getContext(), cp, dp, ep));
  }
};

}  // namespace
}  // namespace hcp
