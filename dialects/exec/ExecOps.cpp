#include "dialects/exec/ExecOps.h"

#include "llvm/ADT/StringRef.h"

using namespace mlir;

namespace hcp::exec {
namespace {

struct KernelArity {
  llvm::StringRef name;
  int ins, outs, ints, floats;  // -1: depends on the kernel's flags
};

// The same table the runtime validates plans against.
constexpr KernelArity kKernels[] = {
#define HCP_KERNEL(id, name, ins, outs, ints, floats) {name, ins, outs, ints, floats},
#include "runtime/plan/KernelTable.def"
#undef HCP_KERNEL
};

const KernelArity* findKernel(llvm::StringRef name) {
  for (const KernelArity& kernel : kKernels) {
    if (kernel.name == name) return &kernel;
  }
  return nullptr;
}

LogicalResult checkCount(Operation* op, llvm::StringRef kernel, llvm::StringRef what, int expected,
                         size_t actual) {
  if (expected >= 0 && static_cast<size_t>(expected) != actual) {
    return op->emitOpError() << "kernel '" << kernel << "' takes " << expected << " " << what
                             << ", got " << actual;
  }
  return success();
}

}  // namespace

LogicalResult BufferOp::verify() {
  MemRefType type = getResult().getType();
  if (!type.hasStaticShape() || !type.getLayout().isIdentity())
    return emitOpError() << "buffer '" << getName() << "' must be a dense, static memref";
  bool isParameter = getArena() == Arena::Parameters;
  if (isParameter != getInit().has_value())
    return emitOpError() << "buffer '" << getName()
                         << "': parameters and only parameters carry an init";
  if (auto init = getInit()) {
    if (*init != "normal" && *init != "zeros" && *init != "ones" && *init != "log_arange")
      return emitOpError() << "unknown init '" << *init << "' for parameter '" << getName() << "'";
    if ((*init == "normal") != getStd().has_value())
      return emitOpError() << "parameter '" << getName() << "': std goes with normal init only";
  }
  if (std::optional<uint64_t> shards = getShards()) {
    if (getArena() != Arena::Parameters && getArena() != Arena::Gradients)
      return emitOpError() << "buffer '" << getName()
                           << "': only parameters and their gradients are split into shards";
    if (static_cast<int64_t>(*shards) < 1 || type.getRank() == 0)
      return emitOpError() << "buffer '" << getName()
                           << "' needs at least 1 shard along a first dimension";
  }
  // I64Attr's accessor reads the value unsigned: the attribute's signed value, to see a sign.
  if (IntegerAttr offset = getOffsetAttr(); offset && offset.getInt() < 0)
    return emitOpError() << "buffer '" << getName() << "' has a negative offset";
  return success();
}

LogicalResult ViewOp::verify() {
  MemRefType from = getSource().getType(), to = getResult().getType();
  if (from.getElementType() != to.getElementType() || from.getNumElements() != to.getNumElements())
    return emitOpError() << "a view keeps the element type and count: " << from << " vs " << to;
  return success();
}

LogicalResult LaunchOp::verify() {
  const KernelArity* kernel = findKernel(getKernel());
  if (kernel == nullptr) return emitOpError() << "unknown kernel '" << getKernel() << "'";
  if (failed(checkCount(*this, getKernel(), "inputs", kernel->ins, getIns().size())) ||
      failed(checkCount(*this, getKernel(), "outputs", kernel->outs, getOuts().size())) ||
      failed(checkCount(*this, getKernel(), "int arguments", kernel->ints, getInts().size())) ||
      failed(checkCount(*this, getKernel(), "float arguments", kernel->floats, getFloats().size())))
    return failure();
  return success();
}

void LaunchOp::getEffects(
    SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>& effects) {
  for (OpOperand& operand : getInsMutable())
    effects.emplace_back(MemoryEffects::Read::get(), &operand);
  for (OpOperand& operand : getOutsMutable())
    effects.emplace_back(MemoryEffects::Write::get(), &operand);
}

}  // namespace hcp::exec

#define GET_OP_CLASSES
#include "dialects/exec/ExecOps.cpp.inc"
