#include "passes/lowering/ExecBuffers.h"

namespace hcp {

using namespace mlir;

Accesses::Accesses(func::FuncOp func) {
  int64_t index = 0;
  for (Operation& op : func.getBody().front()) {
    if (isa<exec::BufferOp, exec::ViewOp>(op)) continue;
    position_[&op] = index;
    auto note = [&](Value value, bool write) {
      if (exec::BufferOp root = rootOf(value)) touches_[root].push_back({index, write, &op});
    };
    if (auto launch = dyn_cast<exec::LaunchOp>(op)) {
      for (Value in : launch.getIns()) note(in, false);
      for (Value out : launch.getOuts()) note(out, true);
    } else {
      for (Value operand : op.getOperands()) note(operand, false);
    }
    ++index;
  }
}

std::vector<Accesses::Touch> Accesses::touches(Value value) const {
  exec::BufferOp root = rootOf(value);
  if (!root) return {};
  auto it = touches_.find(root);
  return it == touches_.end() ? std::vector<Touch>{} : it->second;
}

exec::LaunchOp Accesses::soleReader(Value value, exec::LaunchOp writer) const {
  exec::BufferOp root = rootOf(value);
  if (!root || root.getArena() != exec::Arena::Activations) return {};
  auto it = touches_.find(root);
  if (it == touches_.end() || it->second.size() != 2) return {};
  const Touch& first = it->second[0];
  const Touch& second = it->second[1];
  if (first.op != writer.getOperation() || !first.write || second.write) return {};
  return dyn_cast<exec::LaunchOp>(second.op);
}

std::vector<exec::LaunchOp> Accesses::onlyReaders(Value value, exec::LaunchOp writer) const {
  exec::BufferOp root = rootOf(value);
  if (!root || root.getArena() != exec::Arena::Activations) return {};
  auto it = touches_.find(root);
  if (it == touches_.end() || it->second.size() < 2) return {};
  if (it->second[0].op != writer.getOperation() || !it->second[0].write) return {};
  std::vector<exec::LaunchOp> readers;
  for (const Touch& t : llvm::drop_begin(it->second)) {
    auto launch = dyn_cast<exec::LaunchOp>(t.op);
    if (t.write || !launch) return {};
    readers.push_back(launch);
  }
  return readers;
}

bool Accesses::touchedBetween(Value value, int64_t from, int64_t to, bool any) const {
  exec::BufferOp root = rootOf(value);
  if (!root) return true;
  auto it = touches_.find(root);
  if (it == touches_.end()) return false;
  for (const Touch& t : it->second) {
    if (t.index >= from && t.index < to && (any || t.write)) return true;
  }
  return false;
}

void defineBefore(Value value, Operation* op) {
  Operation* def = value.getDefiningOp();
  if (def == nullptr || def->isBeforeInBlock(op)) return;
  if (auto view = dyn_cast<exec::ViewOp>(def)) defineBefore(view.getSource(), op);
  def->moveBefore(op);
}

void eraseDeadBuffers(func::FuncOp func) {
  bool erased = true;
  while (erased) {
    erased = false;
    for (Operation& op : llvm::make_early_inc_range(func.getBody().front())) {
      if (isa<exec::BufferOp, exec::ViewOp>(op) && op.use_empty()) {
        op.erase();
        erased = true;
      }
    }
  }
}

void foldUntilDone(func::FuncOp func,
                   llvm::function_ref<bool(exec::LaunchOp, const Accesses&)> tryFold) {
  bool folded = true;
  while (folded) {
    folded = false;
    Accesses accesses(func);
    for (auto launch : func.getBody().front().getOps<exec::LaunchOp>()) {
      if (tryFold(launch, accesses)) {
        folded = true;
        break;
      }
    }
  }
  eraseDeadBuffers(func);
}

}  // namespace hcp
