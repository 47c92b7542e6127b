// hcp-plan-memory: static placement of every buffer; activations share one arena by liveness.
#include <algorithm>
#include <array>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "llvm/ADT/DenseMap.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_PLANMEMORY
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

int64_t bytesOf(exec::BufferOp buffer) {
  MemRefType type = buffer.getType();
  return type.getNumElements() * ((type.getElementTypeBitWidth() + 7) / 8);
}

int64_t alignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// One activation buffer: its size and the range of launch indices during which it is live.
struct Lifetime {
  exec::BufferOp buffer;
  int64_t bytes = 0;
  int64_t first = -1, last = -1;
  int64_t offset = -1;
  bool overlapsInTime(const Lifetime& other) const {
    return first <= other.last && other.first <= last;
  }
};

// Places each buffer, largest first, at the lowest offset that does not collide with a placed
// buffer live at the same time. Returns the arena size.
int64_t placeActivations(std::vector<Lifetime>& lifetimes, int64_t alignment) {
  std::vector<Lifetime*> order;
  for (Lifetime& lifetime : lifetimes) order.push_back(&lifetime);
  std::stable_sort(order.begin(), order.end(), [](const Lifetime* a, const Lifetime* b) {
    return a->bytes != b->bytes ? a->bytes > b->bytes : a->first < b->first;
  });
  std::vector<const Lifetime*> placed;
  int64_t arena = 0;
  for (Lifetime* current : order) {
    // Byte ranges of the placed buffers live at the same time, by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Lifetime* other : placed) {
      if (current->overlapsInTime(*other))
        busy.emplace_back(other->offset, other->offset + alignUp(other->bytes, alignment));
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [begin, end] : busy) {
      if (offset + current->bytes <= begin) break;
      offset = std::max(offset, end);
    }
    current->offset = offset;
    arena = std::max(arena, offset + alignUp(current->bytes, alignment));
    placed.push_back(current);
  }
  return arena;
}

struct PlanMemoryPass : impl::PlanMemoryBase<PlanMemoryPass> {
  using Base::Base;

  void runOnOperation() override {
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
      getOperation().emitError() << "alignment must be a power of two, got " << alignment;
      return signalPassFailure();
    }
    std::array<int64_t, 4> arenaBytes = {0, 0, 0, 0};
    for (auto func : getOperation().getOps<func::FuncOp>()) planFunction(func, arenaBytes);
    Builder builder(&getContext());
    getOperation()->setAttr(kArenaBytesAttr, builder.getDenseI64ArrayAttr(arenaBytes));
    activationBytes = arenaBytes[static_cast<int>(exec::Arena::Activations)];
  }

  void planFunction(func::FuncOp func, std::array<int64_t, 4>& arenaBytes) {
    Builder builder(&getContext());
    std::vector<Lifetime> lifetimes;
    DenseMap<Value, size_t> lifetimeOf;  // activation buffer (or a view of one) -> lifetime
    std::vector<exec::BufferOp> persistent, sharded;
    int64_t index = 0;
    func.walk([&](Operation* op) {
      if (auto buffer = dyn_cast<exec::BufferOp>(op)) {
        if (buffer.getArena() != exec::Arena::Activations) {
          (buffer.getShards() ? sharded : persistent).push_back(buffer);
          return;
        }
        lifetimeOf[buffer.getResult()] = lifetimes.size();
        lifetimes.push_back({buffer, bytesOf(buffer)});
        return;
      }
      if (auto view = dyn_cast<exec::ViewOp>(op)) {
        auto root = lifetimeOf.find(view.getSource());
        if (root != lifetimeOf.end()) lifetimeOf[view.getResult()] = root->second;
        return;
      }
      // A launch or a result: it touches its operands at this point of the step.
      for (Value operand : op->getOperands()) {
        auto it = lifetimeOf.find(operand);
        if (it == lifetimeOf.end()) continue;
        Lifetime& lifetime = lifetimes[it->second];
        if (lifetime.first < 0) lifetime.first = index;
        lifetime.last = index;
      }
      ++index;
    });
    // Persistent arenas: one buffer after another, in program order, the expert-parallel
    // (sharded) parameters and gradients after all others. The runtime sums replicated gradients
    // over every rank and sharded ones over the ranks holding the same experts: this way each
    // sum is one all-reduce of a contiguous range of the gradients arena.
    persistent.insert(persistent.end(), sharded.begin(), sharded.end());
    for (exec::BufferOp buffer : persistent) {
      int64_t& size = arenaBytes[static_cast<int>(buffer.getArena())];
      buffer.setOffsetAttr(builder.getI64IntegerAttr(size));
      size += alignUp(bytesOf(buffer), alignment);
    }
    for (Lifetime& lifetime : lifetimes) {
      if (lifetime.first < 0) lifetime.first = lifetime.last = 0;  // never touched: any place
    }
    int64_t arena = placeActivations(lifetimes, alignment);
    for (Lifetime& lifetime : lifetimes)
      lifetime.buffer.setOffsetAttr(builder.getI64IntegerAttr(lifetime.offset));
    int64_t& activations = arenaBytes[static_cast<int>(exec::Arena::Activations)];
    activations = std::max(activations, arena);
    activationBuffers += lifetimes.size();
  }
};

}  // namespace
}  // namespace hcp
