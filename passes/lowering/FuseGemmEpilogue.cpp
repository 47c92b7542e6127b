// hcp-fuse-gemm-epilogue: gemm -> [scale ->] add chains become one gemm_add launch, and a scale
// that only GEMMs read goes into their alphas.
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_FUSEGEMMEPILOGUE
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

int64_t elementsOf(Value value) { return cast<MemRefType>(value.getType()).getNumElements(); }

// One chain to fold: the GEMM, its optional scale, the add, and what the fused launch takes.
struct Chain {
  exec::LaunchOp gemm, scale, add;
  Value addend, out;
  double alpha = 1.0;
};

// The chain that starts at `gemm`, if it can be folded into it (see Passes.td).
std::optional<Chain> chainFrom(exec::LaunchOp gemm, const Accesses& accesses) {
  Chain chain;
  chain.gemm = gemm;
  chain.alpha = gemm.getFloats()[0];
  ArrayRef<int64_t> ints = gemm.getInts();
  const int64_t elements = ints[2] * ints[3];  // m * n
  Value product = gemm.getOuts()[0];
  if (elementsOf(product) != elements) return std::nullopt;
  exec::LaunchOp next = accesses.soleReader(product, gemm);
  if (isKernel(next, "scale") && next.getInts()[0] == elements) {
    chain.scale = next;
    chain.alpha *= next.getFloats()[0];
    product = next.getOuts()[0];
    next = accesses.soleReader(product, next);
  }
  if (!isKernel(next, "add") || next.getInts()[0] != elements || next.getInts()[1] != elements) {
    return std::nullopt;
  }
  chain.add = next;
  Value lhs = next.getIns()[0], rhs = next.getIns()[1];
  if (rootOf(lhs) == rootOf(rhs)) return std::nullopt;
  chain.addend = rootOf(lhs) == rootOf(product) ? rhs : lhs;
  chain.out = next.getOuts()[0];
  if (elementsOf(chain.addend) != elements || elementsOf(chain.out) != elements) {
    return std::nullopt;
  }
  // The fused launch runs at the GEMM's place: the addend must already hold what the add read,
  // and the add's output must not be read or written in between.
  const int64_t from = accesses.position(gemm), to = accesses.position(next);
  if (accesses.touchedBetween(chain.addend, from, to, /*any=*/false)) return std::nullopt;
  if (accesses.touchedBetween(chain.out, from, to, /*any=*/true)) return std::nullopt;
  return chain;
}

// A scale whose result only GEMMs read, as their a or b operand (a gradient scaled by the
// residual multiplier before the projections' backward): the GEMMs read the scale's input
// instead, each with alpha times the factor per operand it was. Returns whether it folded.
bool foldScaleIntoReaders(exec::LaunchOp scale, Accesses& accesses) {
  Value input = scale.getIns()[0], scaled = scale.getOuts()[0];
  const int64_t elements = scale.getInts()[0];
  if (elementsOf(input) != elements || elementsOf(scaled) != elements) return false;
  if (rootOf(input) == rootOf(scaled)) return false;
  std::vector<exec::LaunchOp> readers = accesses.onlyReaders(scaled, scale);
  if (readers.empty()) return false;
  for (exec::LaunchOp reader : readers) {
    if (!isKernel(reader, "gemm") && !isKernel(reader, "gemm_add")) return false;
    if (isKernel(reader, "gemm_add") && rootOf(reader.getIns()[2]) == rootOf(scaled)) return false;
  }
  // The readers now read the input later than the scale did: nothing may change it meanwhile.
  const int64_t from = accesses.position(scale) + 1;
  const int64_t to = accesses.position(readers.back()) + 1;
  if (accesses.touchedBetween(input, from, to, /*any=*/false)) return false;
  const double factor = scale.getFloats()[0];
  for (exec::LaunchOp reader : readers) {
    double alpha = reader.getFloats()[0];
    for (unsigned i = 0; i < 2; ++i) {
      Value operand = reader.getIns()[i];
      if (rootOf(operand) != rootOf(scaled)) continue;
      Value replacement = input;
      if (operand.getType() != input.getType()) {
        OpBuilder b(reader);
        replacement = exec::ViewOp::create(b, reader.getLoc(), operand.getType(), input);
      }
      reader->setOperand(i, replacement);
      alpha *= factor;
    }
    OpBuilder b(reader);
    reader.setFloatsAttr(b.getDenseF64ArrayAttr({alpha}));
    accesses.replace(reader, reader);
  }
  accesses.forget(scale);
  scale.erase();
  return true;
}

struct FuseGemmEpiloguePass : impl::FuseGemmEpilogueBase<FuseGemmEpiloguePass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) fuseFunction(func);
  }

  void fuseFunction(func::FuncOp func) {
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      if (launch.getKernel() == "gemm") {
        std::optional<Chain> chain = chainFrom(launch, accesses);
        if (chain) fold(*chain, accesses);
        return chain.has_value();
      }
      if (launch.getKernel() == "scale" && foldScaleIntoReaders(launch, accesses)) {
        ++fusedScales;
        return true;
      }
      return false;
    });
  }

  void fold(Chain chain, Accesses& accesses) {
    accesses.defineBefore(chain.addend, chain.gemm);
    accesses.defineBefore(chain.out, chain.gemm);
    OpBuilder b(chain.gemm);
    auto fused = exec::LaunchOp::create(
        b, chain.gemm.getLoc(), b.getStringAttr("gemm_add"),
        ValueRange{chain.gemm.getIns()[0], chain.gemm.getIns()[1], chain.addend},
        ValueRange{chain.out}, chain.gemm.getIntsAttr(), b.getDenseF64ArrayAttr({chain.alpha}));
    accesses.replace(chain.gemm, fused);
    accesses.forget(chain.add);
    if (chain.scale) accesses.forget(chain.scale);
    chain.add.erase();
    if (chain.scale) {
      chain.scale.erase();
      ++fusedScales;
    }
    chain.gemm.erase();
    ++fusedAdds;
  }
};

}  // namespace
}  // namespace hcp
