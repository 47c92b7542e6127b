#include "passes/lowering/ExecBuffers.h"

#include <algorithm>

namespace hcp {

using namespace mlir;

Accesses::Accesses(func::FuncOp func) {
  std::vector<Operation*> pending;  // buffers and views before the next other op
  for (Operation& op : func.getBody().front()) {
    if (isa<exec::BufferOp, exec::ViewOp>(op)) {
      pending.push_back(&op);
      continue;
    }
    opAt_.push_back(nullptr);
    record(&op, size() - 1);
    for (Operation* def : pending) slot_[def] = size() - 1;
    pending.clear();
  }
  for (Operation* def : pending) slot_[def] = size();
}

int64_t Accesses::slotOf(Operation* def) {
  if (auto it = slot_.find(def); it != slot_.end()) return it->second;
  // A view a rewrite created: what follows it says.
  int64_t slot = size();
  for (Operation* next = def->getNextNode(); next != nullptr; next = next->getNextNode()) {
    if (isa<exec::BufferOp, exec::ViewOp>(next)) {
      if (auto it = slot_.find(next); it != slot_.end()) {
        slot = it->second;
        break;
      }
    } else if (auto it = position_.find(next); it != position_.end()) {
      slot = it->second;
      break;
    }
  }
  slot_[def] = slot;
  return slot;
}

void Accesses::defineBefore(Value value, Operation* op) {
  Operation* def = value.getDefiningOp();
  const int64_t at = position(op);
  if (def == nullptr || slotOf(def) <= at) return;
  if (auto view = dyn_cast<exec::ViewOp>(def)) defineBefore(view.getSource(), op);
  def->moveBefore(op);
  slot_[def] = at;
}

void Accesses::forget(Operation* op) {
  auto position = position_.find(op);
  if (position == position_.end()) return;
  opAt_[position->second] = nullptr;
  position_.erase(position);
  for (Operation* root : buffersOf_.lookup(op)) {
    std::vector<Touch>& list = touches_[root];
    llvm::erase_if(list, [op](const Touch& t) { return t.op == op; });
  }
  buffersOf_.erase(op);
}

void Accesses::replace(Operation* op, Operation* replacement) {
  const int64_t index = position(op);
  forget(op);
  record(replacement, index);
}

void Accesses::record(Operation* op, int64_t index) {
  position_[op] = index;
  opAt_[index] = op;
  llvm::SmallVector<Operation*, 4>& roots = buffersOf_[op];
  auto note = [&](Value value, bool write) {
    exec::BufferOp root = rootOf(value);
    if (!root) return;
    // After the touches of earlier positions (and of this op's earlier operands).
    std::vector<Touch>& list = touches_[root];
    auto at = std::upper_bound(list.begin(), list.end(), index,
                               [](int64_t i, const Touch& t) { return i < t.index; });
    list.insert(at, {index, write, op});
    if (!llvm::is_contained(roots, root.getOperation())) roots.push_back(root);
  };
  if (auto launch = dyn_cast<exec::LaunchOp>(op)) {
    for (Value in : launch.getIns()) note(in, false);
    for (Value out : launch.getOuts()) note(out, true);
  } else {
    for (Value operand : op->getOperands()) note(operand, false);
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

void foldUntilDone(func::FuncOp func, llvm::function_ref<bool(exec::LaunchOp, Accesses&)> tryFold) {
  Accesses accesses(func);
  bool folded = true;
  while (folded) {
    folded = false;
    for (int64_t index = 0; index < accesses.size(); ++index) {
      auto launch = dyn_cast_or_null<exec::LaunchOp>(accesses.at(index));
      if (launch && tryFold(launch, accesses)) folded = true;
    }
  }
  eraseDeadBuffers(func);
}

}  // namespace hcp
