// exec.launch ops as the kernels' typed argument structs (runtime/plan/KernelTable.txt): the
// lowering passes read and write a launch's arguments by name, with its buffers as the values
// the launch takes.
#pragma once

#include <optional>

#include "dialects/exec/ExecOps.h"
#include "mlir/IR/Builders.h"
#include "runtime/plan/KernelTable.h"

namespace hcp {

// Whether `launch` (possibly null) launches Args' kernel.
template <template <typename> class Args>
bool isLaunchOf(exec::LaunchOp launch) {
  return launch && launch.getKernel() == llvm::StringRef(Args<mlir::Value>::kName);
}

// The arguments of `launch` if it launches Args' kernel (a verified launch: its lists match the
// kernel's signature), e.g. decodeLaunch<plan::CausalConv1dForwardArgs>(launch).
template <template <typename> class Args>
std::optional<Args<mlir::Value>> decodeLaunch(exec::LaunchOp launch) {
  if (!isLaunchOf<Args>(launch)) return std::nullopt;
  return Args<mlir::Value>::Decode(launch.getInts(), launch.getFloats(), launch.getIns(),
                                   launch.getOuts(), [](mlir::Value value) { return value; });
}

// A launch of Args' kernel with these arguments, at `builder`'s insertion point.
template <typename Args>
exec::LaunchOp createLaunch(mlir::OpBuilder& builder, mlir::Location loc, const Args& args) {
  plan::EncodedStep<mlir::Value> lists = args.Encode();
  return exec::LaunchOp::create(builder, loc, builder.getStringAttr(Args::kName), lists.ins,
                                lists.outs, builder.getDenseI64ArrayAttr(lists.ints),
                                builder.getDenseF64ArrayAttr(lists.floats));
}

// A gemm's arguments as a gemm_add's that adds `addend` and writes `out`.
inline plan::GemmAddArgs<mlir::Value> withAddend(const plan::GemmArgs<mlir::Value>& gemm,
                                                 mlir::Value addend, mlir::Value out) {
  plan::GemmAddArgs<mlir::Value> args;
  args.trans_a = gemm.trans_a;
  args.trans_b = gemm.trans_b;
  args.m = gemm.m;
  args.n = gemm.n;
  args.k = gemm.k;
  args.alpha = gemm.alpha;
  args.beta = 1.0;
  args.a = gemm.a;
  args.b = gemm.b;
  args.c = addend;
  args.out = out;
  return args;
}

// A gemm_add's arguments without the addend: the gemm that writes its out.
inline plan::GemmArgs<mlir::Value> withoutAddend(const plan::GemmAddArgs<mlir::Value>& args) {
  plan::GemmArgs<mlir::Value> gemm;
  gemm.trans_a = args.trans_a;
  gemm.trans_b = args.trans_b;
  gemm.m = args.m;
  gemm.n = args.n;
  gemm.k = args.k;
  gemm.alpha = args.alpha;
  gemm.a = args.a;
  gemm.b = args.b;
  gemm.c = args.out;
  return gemm;
}

// Writes `args` into `launch`, a launch of Args' kernel, in place (the op stays the same op).
template <typename Args>
void updateLaunch(exec::LaunchOp launch, const Args& args) {
  plan::EncodedStep<mlir::Value> lists = args.Encode();
  mlir::Builder builder(launch.getContext());
  launch.getInsMutable().assign(lists.ins);
  launch.getOutsMutable().assign(lists.outs);
  launch.setIntsAttr(builder.getDenseI64ArrayAttr(lists.ints));
  launch.setFloatsAttr(builder.getDenseF64ArrayAttr(lists.floats));
}

// A gemm or gemm_add launch's arguments, as a gemm_add's: a gemm's with no addend (c null).
struct Product {
  exec::LaunchOp launch;
  plan::GemmAddArgs<mlir::Value> args;
};

inline std::optional<Product> productOf(exec::LaunchOp launch) {
  if (std::optional<plan::GemmArgs<mlir::Value>> gemm = decodeLaunch<plan::GemmArgs>(launch))
    return Product{launch, withAddend(*gemm, /*addend=*/mlir::Value(), gemm->c)};
  if (std::optional<plan::GemmAddArgs<mlir::Value>> sum = decodeLaunch<plan::GemmAddArgs>(launch))
    return Product{launch, *sum};
  return std::nullopt;
}

// Launches `args` at `builder`'s place: a gemm when it has no addend, else a gemm_add.
inline exec::LaunchOp launchProduct(mlir::OpBuilder& builder, mlir::Location loc,
                                    const plan::GemmAddArgs<mlir::Value>& args) {
  if (args.c) return createLaunch(builder, loc, args);
  return createLaunch(builder, loc, withoutAddend(args));
}

// Writes a product's arguments back into its launch (a gemm's when it has no addend).
inline void updateProduct(const Product& product) {
  if (product.args.c) {
    updateLaunch(product.launch, product.args);
  } else {
    updateLaunch(product.launch, withoutAddend(product.args));
  }
}

}  // namespace hcp
