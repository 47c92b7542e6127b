// hcp-fuse-gemm-epilogue: gemm -> [scale ->] add chains become one gemm_add launch, and a scale
// that only GEMMs (and the experts' backward, as its output gradient) read, or that alone reads a
// GEMM's product or a gemm_add's sum, goes into their alphas (and betas, dout_scales).
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/LaunchArgs.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_FUSEGEMMEPILOGUE
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using GemmArgs = plan::GemmArgs<Value>;
using GemmAddArgs = plan::GemmAddArgs<Value>;
using ExpertsBackwardArgs = plan::MoeExpertsBackwardArgs<Value>;

// Moving the GEMM from `from` to the add's place `to` keeps its activation operands live until
// there, where they may have died at the GEMM: their bytes that would live longer.
int64_t bytesLiveLonger(const GemmArgs& gemm, const Accesses& accesses, int64_t to) {
  int64_t bytes = 0;
  for (Value operand : {gemm.a, gemm.b}) {
    exec::BufferOp root = rootOf(operand);
    if (!root || root.getArena() != exec::Arena::Activations) continue;
    std::vector<Accesses::Touch> touches = accesses.touches(operand);
    if (!touches.empty() && touches.back().index < to) bytes += bytesOf(root);
  }
  return bytes;
}

// One chain to fold: the GEMM (with its arguments), its optional scale, the add, what the
// fused launch takes, and where it runs (the GEMM's place, or the add's).
struct Chain {
  exec::LaunchOp gemmLaunch, scale, add;
  GemmArgs gemm;
  Value addend, out;
  double alpha = 1.0;
  bool atAdd = false;
};

// The chain that starts at `launch`, if it is a GEMM that can take it in (see Passes.td).
std::optional<Chain> chainFrom(exec::LaunchOp launch, const Accesses& accesses) {
  std::optional<GemmArgs> gemm = decodeLaunch<plan::GemmArgs>(launch);
  if (!gemm) return std::nullopt;
  Chain chain;
  chain.gemmLaunch = launch;
  chain.gemm = *gemm;
  chain.alpha = gemm->alpha;
  const int64_t elements = gemm->m * gemm->n;
  Value product = gemm->c;
  if (elementsOf(product) != elements) return std::nullopt;
  exec::LaunchOp next = accesses.soleReader(product, launch);
  if (std::optional<plan::ScaleArgs<Value>> scale = decodeLaunch<plan::ScaleArgs>(next);
      scale && scale->n == elements) {
    chain.scale = next;
    chain.alpha *= scale->factor;
    product = scale->y;
    next = accesses.soleReader(product, next);
  }
  std::optional<plan::AddArgs<Value>> add = decodeLaunch<plan::AddArgs>(next);
  if (!add || add->n != elements || add->rhs_n != elements) return std::nullopt;
  chain.add = next;
  if (rootOf(add->a) == rootOf(add->b)) return std::nullopt;
  chain.addend = rootOf(add->a) == rootOf(product) ? add->b : add->a;
  chain.out = add->y;
  if (elementsOf(chain.addend) != elements || elementsOf(chain.out) != elements) {
    return std::nullopt;
  }
  // The fused launch runs at the GEMM's place when the addend already holds there what the add
  // read and the add's output is not read or written in between. Otherwise (the addend is
  // computed after the GEMM: the experts' output the shared MLP's product is added to) it runs
  // at the add's place, when the GEMM's operands still hold there what the GEMM read.
  const int64_t from = accesses.position(launch), to = accesses.position(next);
  if (!accesses.touchedBetween(chain.addend, from, to, /*any=*/false) &&
      !accesses.touchedBetween(chain.out, from, to, /*any=*/true)) {
    return chain;
  }
  if (accesses.touchedBetween(gemm->a, from + 1, to, /*any=*/false) ||
      accesses.touchedBetween(gemm->b, from + 1, to, /*any=*/false)) {
    return std::nullopt;
  }
  // Nor may the add write over what the GEMM reads: a GEMM's output is none of its operands.
  if (rootOf(chain.out) == rootOf(gemm->a) || rootOf(chain.out) == rootOf(gemm->b)) {
    return std::nullopt;
  }
  // The product was live over the same span and is gone: no more memory than before.
  if (bytesLiveLonger(*gemm, accesses, to) > bytesOf(rootOf(gemm->c))) {
    return std::nullopt;
  }
  chain.atAdd = true;
  return chain;
}

// The element of `scaled` at which `operand` (a value of the same buffer) starts.
int64_t offsetInside(Value operand, Value scaled) {
  return elementOffsetOf(operand) - elementOffsetOf(scaled);
}

// Whether `operand` reads only elements of `scaled` (not others of its buffer).
bool readsInside(Value operand, Value scaled) {
  const int64_t offset = offsetInside(operand, scaled);
  return offset >= 0 && offset + elementsOf(operand) <= elementsOf(scaled);
}

// The elements of `input` where `reader` read `operand` of `scaled` (= factor * input), as a
// view of the operand's type (and place) where they differ.
Value asOperand(exec::LaunchOp reader, Value operand, Value scaled, Value input) {
  const int64_t offset = offsetInside(operand, scaled);
  if (offset == 0 && operand.getType() == input.getType()) return input;
  OpBuilder b(reader);
  // A view of fewer elements names its offset, even 0.
  const bool whole = offset == 0 && elementsOf(operand) == elementsOf(input);
  return exec::ViewOp::create(b, reader.getLoc(), operand.getType(), input,
                              whole ? IntegerAttr() : b.getI64IntegerAttr(offset));
}

// Makes `product` read `input` where it read `scaled` (= factor * input) as its a or b, with
// alpha times the factor per operand replaced.
void readUnscaled(Product product, Value scaled, Value input, double factor) {
  for (Value* operand : {&product.args.a, &product.args.b}) {
    if (rootOf(*operand) != rootOf(scaled)) continue;
    *operand = asOperand(product.launch, *operand, scaled, input);
    product.args.alpha *= factor;
  }
  updateProduct(product);
}

// Whether the experts' backward `args` reads `scaled` as its output gradient dout and nowhere
// else, so that it can read the unscaled value with dout_scale instead.
bool readsOnlyAsDout(const ExpertsBackwardArgs& args, Value scaled) {
  if (rootOf(args.dout) != rootOf(scaled) || !readsInside(args.dout, scaled)) return false;
  for (Value other : {args.x, args.gates, args.expert_ids, args.w_in, args.w_out, args.kept_h})
    if (other && rootOf(other) == rootOf(scaled)) return false;
  return true;
}

// A scale whose result only GEMMs read, as their a or b operand, and the experts' backward as
// its dout (a gradient scaled by the residual multiplier before the projections' and the
// experts' backward): they read the scale's input instead, each GEMM with alpha times the factor
// per operand it was, the experts' backward with dout_scale times it. Returns whether it folded.
bool foldScaleIntoReaders(exec::LaunchOp launch, Accesses& accesses) {
  std::optional<plan::ScaleArgs<Value>> scale = decodeLaunch<plan::ScaleArgs>(launch);
  if (!scale) return false;
  Value input = scale->x, scaled = scale->y;
  if (elementsOf(input) != scale->n || elementsOf(scaled) != scale->n) return false;
  if (rootOf(input) == rootOf(scaled)) return false;
  std::vector<exec::LaunchOp> readers = accesses.onlyReaders(scaled, launch);
  if (readers.empty()) return false;
  // Each reader reads only the scaled elements (where the scale's buffer is larger), and only
  // where it can take the factor.
  auto operandsInside = [&](Value a, Value b) {
    for (Value operand : {a, b})
      if (rootOf(operand) == rootOf(scaled) && !readsInside(operand, scaled)) return false;
    return true;
  };
  for (exec::LaunchOp reader : readers) {
    if (std::optional<Product> product = productOf(reader)) {
      const GemmAddArgs& args = product->args;
      if (args.c && rootOf(args.c) == rootOf(scaled)) return false;
      if (!operandsInside(args.a, args.b)) return false;
      continue;
    }
    std::optional<ExpertsBackwardArgs> experts = decodeLaunch<plan::MoeExpertsBackwardArgs>(reader);
    if (!experts || !readsOnlyAsDout(*experts, scaled)) return false;
  }
  // The readers now read the input later than the scale did: nothing may change it meanwhile.
  const int64_t from = accesses.position(launch) + 1;
  const int64_t to = accesses.position(readers.back()) + 1;
  if (accesses.touchedBetween(input, from, to, /*any=*/false)) return false;
  // (A GEMM reading the scaled value as both operands is in `readers` twice: the second time
  // it reads nothing scaled any more and stays as it is.)
  for (exec::LaunchOp reader : readers) {
    if (std::optional<Product> product = productOf(reader)) {
      readUnscaled(*product, scaled, input, scale->factor);
    } else {
      ExpertsBackwardArgs experts = *decodeLaunch<plan::MoeExpertsBackwardArgs>(reader);
      experts.dout = asOperand(reader, experts.dout, scaled, input);
      experts.dout_scale *= scale->factor;
      updateLaunch(reader, experts);
    }
    accesses.replace(reader, reader);
  }
  accesses.forget(launch);
  launch.erase();
  return true;
}

// A GEMM whose product only a scale reads (the logits divided by logits_scaling, read by the
// cross entropy), or a gemm_add whose sum only a scale reads (the experts' and the shared MLP's
// outputs times the residual multiplier): the product takes the factor into its alpha (and a
// gemm_add's beta) and writes the scale's output, unless anything looks at that output in
// between or it is one of the product's operands. Returns whether it folded.
bool foldScaleIntoProduct(exec::LaunchOp launch, Accesses& accesses) {
  std::optional<Product> product = productOf(launch);
  if (!product) return false;
  GemmAddArgs& args = product->args;
  const int64_t elements = args.m * args.n;
  if (elementsOf(args.out) != elements) return false;
  exec::LaunchOp next = accesses.soleReader(args.out, launch);
  std::optional<plan::ScaleArgs<Value>> scale = decodeLaunch<plan::ScaleArgs>(next);
  if (!scale || scale->n != elements || elementsOf(scale->y) != scale->n) return false;
  if (accesses.touchedBetween(scale->y, accesses.position(launch), accesses.position(next),
                              /*any=*/true)) {
    return false;
  }
  for (Value operand : {args.a, args.b, args.c})
    if (operand && rootOf(scale->y) == rootOf(operand)) return false;
  accesses.defineBefore(scale->y, launch);
  args.alpha *= scale->factor;
  args.beta *= scale->factor;
  args.out = scale->y;
  updateProduct(*product);
  accesses.replace(launch, launch);
  accesses.forget(next);
  next.erase();
  return true;
}

struct FuseGemmEpiloguePass : impl::FuseGemmEpilogueBase<FuseGemmEpiloguePass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) fuseFunction(func);
  }

  void fuseFunction(func::FuncOp func) {
    foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
      if (std::optional<Chain> chain = chainFrom(launch, accesses)) {
        fold(*chain, accesses);
        return true;
      }
      if (foldScaleIntoReaders(launch, accesses) || foldScaleIntoProduct(launch, accesses)) {
        ++fusedScales;
        return true;
      }
      return false;
    });
  }

  void fold(Chain chain, Accesses& accesses) {
    exec::LaunchOp place = chain.atAdd ? chain.add : chain.gemmLaunch;
    accesses.defineBefore(chain.addend, place);
    accesses.defineBefore(chain.out, place);
    GemmAddArgs fused = withAddend(chain.gemm, chain.addend, chain.out);
    fused.alpha = chain.alpha;
    OpBuilder b(place);
    accesses.replace(place, createLaunch(b, chain.gemmLaunch.getLoc(), fused));
    accesses.forget(chain.atAdd ? chain.gemmLaunch : chain.add);
    if (chain.scale) accesses.forget(chain.scale);
    chain.add.erase();
    if (chain.scale) {
      chain.scale.erase();
      ++fusedScales;
    }
    chain.gemmLaunch.erase();
    ++fusedAdds;
  }
};

}  // namespace
}  // namespace hcp
