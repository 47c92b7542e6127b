// hcp-fuse-conv-silu: causal_conv1d -> silu becomes one conv launch with its silu flag, forward
// and backward, when nothing else sees the conv's output or its gradient.
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_FUSECONVSILU
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

// The conv kernels' ints: batch, seq, channels, width, has_halo, silu; their inputs: x, w, bias
// [, halo] (forward) and dy, x, w [, halo] (backward).
constexpr unsigned kHasHalo = 4, kSilu = 5;

// What folds: the conv forward, its SiLU, and (when there is one) the SiLU's backward and the
// conv backward it feeds.
struct Fold {
  exec::LaunchOp conv, silu, siluGrad, convGrad;
};

bool sameBuffer(Value a, Value b) { return rootOf(a) && rootOf(a) == rootOf(b); }

// The fold around the conv backward that silu_grad feeds, if that backward is the one of `conv`
// (same input, weight, halo and shape) and moving silu_grad's read of dy and the conv's reads
// of x, w, halo and bias to the backward's place changes nothing they see.
bool addBackward(Fold& fold, exec::LaunchOp siluGrad, const Accesses& accesses) {
  exec::LaunchOp convGrad = accesses.soleReader(siluGrad.getOuts()[0], siluGrad);
  if (!isKernel(convGrad, "causal_conv1d.backward")) return false;
  ArrayRef<int64_t> ints = fold.conv.getInts(), gradInts = convGrad.getInts();
  if (gradInts.size() != ints.size() || gradInts[kSilu] != 0) return false;
  for (unsigned i = 0; i <= kHasHalo; ++i) {
    if (gradInts[i] != ints[i]) return false;
  }
  ValueRange ins = fold.conv.getIns(), gradIns = convGrad.getIns();
  if (!sameBuffer(gradIns[0], siluGrad.getOuts()[0]) || !sameBuffer(gradIns[1], ins[0]) ||
      !sameBuffer(gradIns[2], ins[1])) {
    return false;
  }
  const bool hasHalo = ints[kHasHalo] != 0;
  if (hasHalo && !sameBuffer(gradIns[3], ins[3])) return false;
  const int64_t conv = accesses.position(fold.conv), grad = accesses.position(convGrad);
  // The backward recomputes the conv from x, w, the bias and the halo: none may change between.
  for (Value input : ins) {
    if (accesses.touchedBetween(input, conv + 1, grad, /*any=*/false)) return false;
  }
  Value dy = siluGrad.getIns()[0];
  if (accesses.touchedBetween(dy, accesses.position(siluGrad) + 1, grad, /*any=*/false)) {
    return false;
  }
  fold.siluGrad = siluGrad;
  fold.convGrad = convGrad;
  return true;
}

// The fold that starts at `conv`, if its output is an activation that only a silu.forward (and
// possibly a silu.backward, as its x) reads.
std::optional<Fold> foldFrom(exec::LaunchOp conv, const Accesses& accesses) {
  ArrayRef<int64_t> ints = conv.getInts();
  if (ints.size() != kSilu + 1 || ints[kSilu] != 0) return std::nullopt;
  Value out = conv.getOuts()[0];
  exec::BufferOp root = rootOf(out);
  if (!root || root.getArena() != exec::Arena::Activations) return std::nullopt;
  const std::vector<Accesses::Touch> touches = accesses.touches(out);
  if (touches.size() < 2 || touches[0].op != conv.getOperation() || !touches[0].write) {
    return std::nullopt;
  }
  const int64_t elements = cast<MemRefType>(out.getType()).getNumElements();
  Fold fold;
  fold.conv = conv;
  for (const Accesses::Touch& t : llvm::drop_begin(touches)) {
    auto launch = dyn_cast<exec::LaunchOp>(t.op);
    if (t.write || !launch || launch.getInts().empty() || launch.getInts()[0] != elements) {
      return std::nullopt;
    }
    if (isKernel(launch, "silu.forward") && !fold.silu) {
      fold.silu = launch;
    } else if (isKernel(launch, "silu.backward") && !fold.siluGrad &&
               sameBuffer(launch.getIns()[1], out) && !sameBuffer(launch.getIns()[0], out)) {
      if (!addBackward(fold, launch, accesses)) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!fold.silu) return std::nullopt;
  // The conv writes the SiLU's output at its own place: nothing may touch it before the SiLU did.
  if (accesses.touchedBetween(fold.silu.getOuts()[0], accesses.position(conv),
                              accesses.position(fold.silu), /*any=*/true)) {
    return std::nullopt;
  }
  return fold;
}

// `value` as a memref of `type` (a view when the shapes differ).
Value as(Value value, Type type, OpBuilder& b, Location loc) {
  if (value.getType() == type) return value;
  return exec::ViewOp::create(b, loc, type, value);
}

DenseI64ArrayAttr withSilu(exec::LaunchOp launch, OpBuilder& b) {
  SmallVector<int64_t> ints(launch.getInts());
  ints[kSilu] = 1;
  return b.getDenseI64ArrayAttr(ints);
}

struct FuseConvSiluPass : impl::FuseConvSiluBase<FuseConvSiluPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) fuseFunction(func);
  }

  void fuseFunction(func::FuncOp func) {
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      if (!isKernel(launch, "causal_conv1d.forward")) return false;
      std::optional<Fold> fold = foldFrom(launch, accesses);
      if (fold) apply(*fold, accesses);
      return fold.has_value();
    });
  }

  void apply(Fold fold, Accesses& accesses) {
    exec::LaunchOp conv = fold.conv;
    Value siluOut = fold.silu.getOuts()[0];
    accesses.defineBefore(siluOut, conv);
    OpBuilder b(conv);
    Value out = as(siluOut, conv.getOuts()[0].getType(), b, conv.getLoc());
    auto fused = exec::LaunchOp::create(b, conv.getLoc(), conv.getKernelAttr(), conv.getIns(),
                                        ValueRange{out}, withSilu(conv, b), conv.getFloatsAttr());
    accesses.replace(conv, fused);
    accesses.forget(fold.silu);
    ++fusedForwards;
    if (fold.convGrad) {
      exec::LaunchOp grad = fold.convGrad;
      b.setInsertionPoint(grad);
      SmallVector<Value> ins(grad.getIns());
      ins[0] = as(fold.siluGrad.getIns()[0], ins[0].getType(), b, grad.getLoc());
      ins.push_back(conv.getIns()[2]);  // the bias, after the halo
      auto fusedGrad =
          exec::LaunchOp::create(b, grad.getLoc(), grad.getKernelAttr(), ins, grad.getOuts(),
                                 withSilu(grad, b), grad.getFloatsAttr());
      accesses.replace(grad, fusedGrad);
      accesses.forget(fold.siluGrad);
      grad.erase();
      fold.siluGrad.erase();
      ++fusedBackwards;
    }
    fold.silu.erase();
    conv.erase();
  }
};

}  // namespace
}  // namespace hcp
