#include "dialects/exec/ExecOps.h"

#include "llvm/ADT/SmallVector.h"
#include "runtime/plan/KernelCheck.h"

using namespace mlir;

namespace hcp::exec {
namespace {

// How the kernel checks see a memref: its element count and element type (bf16, f32, i32).
plan::BufferFacts factsOf(Value buffer) {
  auto type = cast<MemRefType>(buffer.getType());
  std::optional<plan::DType> dtype;
  Type element = type.getElementType();
  if (element.isF32()) dtype = plan::DType::F32;
  if (element.isBF16()) dtype = plan::DType::BF16;
  if (element.isInteger(32)) dtype = plan::DType::I32;
  // The buffer's name when it is one (views and block arguments are named by their type).
  std::string_view name = "(a view)";
  if (auto root = buffer.getDefiningOp<BufferOp>()) name = root.getName();
  return {static_cast<uint64_t>(type.getNumElements()), dtype, name};
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
  if (std::optional<model::ParamInit> init = getInit();
      init && (*init == model::ParamInit::Normal) != getStd().has_value())
    return emitOpError() << "parameter '" << getName() << "': std goes with normal init only";
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
  if (!getOffset()) {
    if (from.getElementType() != to.getElementType() ||
        from.getNumElements() != to.getNumElements())
      return emitOpError() << "a view keeps the element type and count: " << from << " vs " << to;
    return success();
  }
  if (from.getElementType() != to.getElementType())
    return emitOpError() << "a view keeps the element type: " << from << " vs " << to;
  const int64_t offset = getOffsetAttr().getInt();  // signed, to see a sign
  if (offset < 0 || offset + to.getNumElements() > from.getNumElements()) {
    return emitOpError() << "a view of elements [" << offset << ", " << offset + to.getNumElements()
                         << ") lies outside its source of " << from.getNumElements();
  }
  return success();
}

// The kernel's signature (runtime/plan/KernelTable.txt) checked here as the runtime checks a
// plan's step, less the rules that need the plan's mesh: a lowering that writes wrong sizes fails
// in the pass that wrote them.
LogicalResult LaunchOp::verify() {
  std::optional<plan::KernelId> kernel = plan::FindKernel(getKernel().str());
  if (!kernel) return emitOpError() << "unknown kernel '" << getKernel() << "'";
  SmallVector<plan::BufferFacts> ins, outs;
  for (Value in : getIns()) ins.push_back(factsOf(in));
  for (Value out : getOuts()) outs.push_back(factsOf(out));
  const absl::Status status =
      plan::CheckKernelArguments({*kernel, getInts(), getFloats(), ins, outs}, /*context=*/nullptr);
  if (!status.ok())
    return emitOpError() << "kernel '" << getKernel() << "': " << std::string(status.message());
  if (!getBeside()) return success();
  if (!plan::RunsBesideCompute(*kernel)) {
    return emitOpError() << "kernel '" << getKernel()
                         << "' may not run beside the compute stream (only the `beside` kernels "
                            "of KernelTable.txt may)";
  }
  // Joined before the next launch that communicates, and before the step ends.
  for (Operation* op = getOperation()->getNextNode(); op != nullptr; op = op->getNextNode()) {
    if (isa<JoinOp>(op)) return success();
    auto launch = dyn_cast<LaunchOp>(op);
    if (!launch) continue;
    std::optional<plan::KernelId> next = plan::FindKernel(launch.getKernel().str());
    if (next && plan::IsCollective(*next)) {
      return emitOpError() << "runs beside the compute stream but is not joined (exec.join) "
                              "before the next collective, '"
                           << launch.getKernel() << "'";
    }
  }
  return emitOpError() << "runs beside the compute stream but is not joined (exec.join) before "
                          "the step ends";
}

LogicalResult JoinOp::verify() {
  for (Operation* op = getOperation()->getPrevNode(); op != nullptr; op = op->getPrevNode()) {
    if (isa<JoinOp>(op)) break;
    if (auto launch = dyn_cast<LaunchOp>(op); launch && launch.getBeside()) return success();
  }
  return emitOpError() << "waits for no launch: none runs beside the compute stream since the "
                          "previous exec.join";
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
