// What hcp-keep-expert-h and hcp-keep-ssd-states share: a kernel's backward that recomputes part
// of its forward reads it from a buffer the forward writes instead. Each backward launch is paired
// with the last forward launch before it on the same inputs, unless one of those inputs is
// written between the two; the pair's flag is set, the forward writes the kept buffer (a new
// activation) and the backward reads it.
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/LaunchArgs.h"

namespace hcp {

// The kernel pair's specifics. Forward / Backward: the argument structs over mlir::Value.
template <typename Forward, typename Backward>
struct KeepForBackward {
  // Whether the backward is of a forward with these arguments (ints and the buffers the kept
  // values depend on), and is not yet reading a kept buffer.
  std::function<bool(const Forward&, const Backward&)> pairs;
  // The forward's inputs the kept values depend on (none may be written in between).
  std::function<std::vector<mlir::Value>(const Forward&)> inputs;
  // The kept buffer's type, and the forward output whose buffer name it extends.
  std::function<mlir::MemRefType(mlir::OpBuilder&, const Forward&)> type;
  std::function<mlir::Value(const Forward&)> namedAfter;
  llvm::StringRef suffix;  // ".kept_h"
  // Sets the flag and the kept buffer in both launches' arguments.
  std::function<void(Forward&, Backward&, mlir::Value kept)> keep;
};

inline bool sameBuffer(mlir::Value a, mlir::Value b) { return rootOf(a) && rootOf(a) == rootOf(b); }

// Rewrites every pair in `func`; returns how many. A recomputed layer's backward pairs with the
// forward that recomputed it (the last one before it), not the first one.
template <template <typename> class ForwardArgs, template <typename> class BackwardArgs>
int64_t keepForBackward(
    mlir::func::FuncOp func,
    const KeepForBackward<ForwardArgs<mlir::Value>, BackwardArgs<mlir::Value>>& spec) {
  using Forward = ForwardArgs<mlir::Value>;
  using Backward = BackwardArgs<mlir::Value>;
  // Every forward launch in step order, kept current as forwards are replaced (walking back over
  // every op from each backward would take time quadratic in the layers).
  std::vector<exec::LaunchOp> forwards;
  for (auto launch : func.getBody().front().getOps<exec::LaunchOp>()) {
    if (isLaunchOf<ForwardArgs>(launch)) forwards.push_back(launch);
  }
  auto forwardOf = [&](exec::LaunchOp backwardLaunch, const Backward& backward,
                       const Accesses& accesses) -> std::optional<size_t> {
    const int64_t to = accesses.position(backwardLaunch);
    size_t index =
        std::partition_point(forwards.begin(), forwards.end(),
                             [&](exec::LaunchOp f) { return accesses.position(f) < to; }) -
        forwards.begin();
    while (index-- > 0) {
      Forward forward = *decodeLaunch<ForwardArgs>(forwards[index]);
      if (!spec.pairs(forward, backward)) continue;
      const int64_t from = accesses.position(forwards[index]) + 1;
      for (mlir::Value input : spec.inputs(forward)) {
        if (accesses.touchedBetween(input, from, to, /*any=*/false)) return std::nullopt;
      }
      return index;
    }
    return std::nullopt;
  };
  int64_t kept = 0;
  foldUntilDone(func, [&](exec::LaunchOp backwardLaunch, Accesses& accesses) {
    std::optional<Backward> backward = decodeLaunch<BackwardArgs>(backwardLaunch);
    if (!backward) return false;
    std::optional<size_t> index = forwardOf(backwardLaunch, *backward, accesses);
    if (!index) return false;
    exec::LaunchOp forwardLaunch = forwards[*index];
    Forward forward = *decodeLaunch<ForwardArgs>(forwardLaunch);
    mlir::OpBuilder b(forwardLaunch);
    exec::BufferOp root = rootOf(spec.namedAfter(forward));
    std::string name = (root ? root.getName().str() : std::string("kept")) + spec.suffix.str();
    mlir::Value buffer = exec::BufferOp::create(
        b, forwardLaunch.getLoc(), spec.type(b, forward),
        exec::ArenaAttr::get(b.getContext(), exec::Arena::Activations), b.getStringAttr(name),
        mlir::IntegerAttr(), exec::ParamInitAttr(), mlir::FloatAttr(), mlir::IntegerAttr());
    spec.keep(forward, *backward, buffer);
    exec::LaunchOp keeping = createLaunch(b, forwardLaunch.getLoc(), forward);
    b.setInsertionPoint(backwardLaunch);
    exec::LaunchOp reading = createLaunch(b, backwardLaunch.getLoc(), *backward);
    accesses.replace(forwardLaunch, keeping);
    accesses.replace(backwardLaunch, reading);
    forwardLaunch.erase();
    backwardLaunch.erase();
    forwards[*index] = keeping;
    ++kept;
    return true;
  });
  return kept;
}

}  // namespace hcp
