// hcp-fuse-conv-silu: causal_conv1d -> silu becomes one conv launch with its silu flag, forward
// and backward, when nothing else sees the conv's output or its gradient.
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/LaunchArgs.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_FUSECONVSILU
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using ConvArgs = plan::CausalConv1dForwardArgs<Value>;
using ConvGradArgs = plan::CausalConv1dBackwardArgs<Value>;
using SiluArgs = plan::SiluForwardArgs<Value>;
using SiluGradArgs = plan::SiluBackwardArgs<Value>;

// What folds: the conv forward, its SiLU, and (when there is one) the SiLU's backward and the
// conv backward it feeds; each launch with its arguments.
struct Fold {
  exec::LaunchOp convLaunch, siluLaunch, siluGradLaunch, convGradLaunch;
  ConvArgs conv;
  SiluArgs silu;
  SiluGradArgs siluGrad;
  ConvGradArgs convGrad;
};

bool sameBuffer(Value a, Value b) { return rootOf(a) && rootOf(a) == rootOf(b); }

// Whether a conv backward's shape and halo are those of the conv forward.
bool sameConv(const ConvArgs& conv, const ConvGradArgs& grad) {
  return grad.batch == conv.batch && grad.seq == conv.seq && grad.channels == conv.channels &&
         grad.width == conv.width && grad.has_halo == conv.has_halo &&
         grad.documents == conv.documents;
}

// The fold around the conv backward that silu_grad feeds, if that backward is the one of the
// fold's conv (same input, weight, halo and shape) and moving silu_grad's read of dy and the
// conv's reads of x, w, halo and bias to the backward's place changes nothing they see.
bool addBackward(Fold& fold, exec::LaunchOp siluGradLaunch, const SiluGradArgs& siluGrad,
                 const Accesses& accesses) {
  exec::LaunchOp convGradLaunch = accesses.soleReader(siluGrad.dx, siluGradLaunch);
  std::optional<ConvGradArgs> convGrad =
      decodeLaunch<plan::CausalConv1dBackwardArgs>(convGradLaunch);
  if (!convGrad || convGrad->silu || !sameConv(fold.conv, *convGrad)) return false;
  if (!sameBuffer(convGrad->dy, siluGrad.dx) || !sameBuffer(convGrad->x, fold.conv.x) ||
      !sameBuffer(convGrad->w, fold.conv.w)) {
    return false;
  }
  if (fold.conv.has_halo && !sameBuffer(convGrad->halo, fold.conv.halo)) return false;
  if (fold.conv.documents && !sameBuffer(convGrad->positions, fold.conv.positions)) return false;
  const int64_t conv = accesses.position(fold.convLaunch);
  const int64_t grad = accesses.position(convGradLaunch);
  // The backward recomputes the conv from x, w, the bias and the halo: none may change between.
  for (Value input : fold.convLaunch.getIns()) {
    if (accesses.touchedBetween(input, conv + 1, grad, /*any=*/false)) return false;
  }
  if (accesses.touchedBetween(siluGrad.dy, accesses.position(siluGradLaunch) + 1, grad,
                              /*any=*/false)) {
    return false;
  }
  fold.siluGradLaunch = siluGradLaunch;
  fold.siluGrad = siluGrad;
  fold.convGradLaunch = convGradLaunch;
  fold.convGrad = *convGrad;
  return true;
}

// The fold that starts at `launch`, if it is a conv forward without its SiLU whose output is an
// activation that only a silu.forward (and possibly a silu.backward, as its x) reads.
std::optional<Fold> foldFrom(exec::LaunchOp launch, const Accesses& accesses) {
  std::optional<ConvArgs> conv = decodeLaunch<plan::CausalConv1dForwardArgs>(launch);
  if (!conv || conv->silu) return std::nullopt;
  exec::BufferOp root = rootOf(conv->y);
  if (!root || root.getArena() != exec::Arena::Activations) return std::nullopt;
  const std::vector<Accesses::Touch> touches = accesses.touches(conv->y);
  if (touches.size() < 2 || touches[0].op != launch.getOperation() || !touches[0].write) {
    return std::nullopt;
  }
  const int64_t elements = cast<MemRefType>(conv->y.getType()).getNumElements();
  Fold fold;
  fold.convLaunch = launch;
  fold.conv = *conv;
  for (const Accesses::Touch& t : llvm::drop_begin(touches)) {
    auto reader = dyn_cast<exec::LaunchOp>(t.op);
    if (t.write || !reader) return std::nullopt;
    std::optional<SiluArgs> silu = decodeLaunch<plan::SiluForwardArgs>(reader);
    std::optional<SiluGradArgs> siluGrad = decodeLaunch<plan::SiluBackwardArgs>(reader);
    if (silu && silu->n == elements && !fold.siluLaunch) {
      fold.siluLaunch = reader;
      fold.silu = *silu;
    } else if (siluGrad && siluGrad->n == elements && !fold.siluGradLaunch &&
               sameBuffer(siluGrad->x, conv->y) && !sameBuffer(siluGrad->dy, conv->y)) {
      if (!addBackward(fold, reader, *siluGrad, accesses)) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!fold.siluLaunch) return std::nullopt;
  // The conv writes the SiLU's output at its own place: nothing may touch it before the SiLU did.
  if (accesses.touchedBetween(fold.silu.y, accesses.position(launch),
                              accesses.position(fold.siluLaunch), /*any=*/true)) {
    return std::nullopt;
  }
  return fold;
}

// `value` as a memref of `type` (a view when the shapes differ).
Value as(Value value, Type type, OpBuilder& b, Location loc) {
  if (value.getType() == type) return value;
  return exec::ViewOp::create(b, loc, type, value);
}

struct FuseConvSiluPass : impl::FuseConvSiluBase<FuseConvSiluPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) fuseFunction(func);
  }

  void fuseFunction(func::FuncOp func) {
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      std::optional<Fold> fold = foldFrom(launch, accesses);
      if (fold) apply(*fold, accesses);
      return fold.has_value();
    });
  }

  // The conv writes silu(conv) where the SiLU wrote; its backward takes the SiLU output's
  // gradient where the SiLU backward took it, and the bias.
  void apply(Fold fold, Accesses& accesses) {
    exec::LaunchOp convLaunch = fold.convLaunch;
    accesses.defineBefore(fold.silu.y, convLaunch);
    OpBuilder b(convLaunch);
    ConvArgs conv = fold.conv;
    conv.silu = true;
    conv.y = as(fold.silu.y, conv.y.getType(), b, convLaunch.getLoc());
    accesses.replace(convLaunch, createLaunch(b, convLaunch.getLoc(), conv));
    accesses.forget(fold.siluLaunch);
    ++fusedForwards;
    if (fold.convGradLaunch) {
      exec::LaunchOp gradLaunch = fold.convGradLaunch;
      b.setInsertionPoint(gradLaunch);
      ConvGradArgs grad = fold.convGrad;
      grad.silu = true;
      grad.dy = as(fold.siluGrad.dy, grad.dy.getType(), b, gradLaunch.getLoc());
      grad.bias = conv.bias;
      accesses.replace(gradLaunch, createLaunch(b, gradLaunch.getLoc(), grad));
      accesses.forget(fold.siluGradLaunch);
      gradLaunch.erase();
      fold.siluGradLaunch.erase();
      ++fusedBackwards;
    }
    fold.siluLaunch.erase();
    convLaunch.erase();
  }
};

}  // namespace
}  // namespace hcp
