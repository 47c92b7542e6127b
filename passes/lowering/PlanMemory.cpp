// hcp-plan-memory: static placement of every buffer; activations share one arena by liveness.
#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "llvm/ADT/DenseMap.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_PLANMEMORY
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

int64_t alignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// One activation buffer: its size and the range of launch indices during which it is live.
struct Lifetime {
  exec::BufferOp buffer;
  int64_t bytes = 0;
  int64_t first = -1, last = -1;
  int64_t offset = -1;
};

// The placed buffers in offset order, in chunks (an insertion shifts one chunk, not all), each
// with what its buffers span (in time and bytes) so that a search can pass over it whole.
class PlacedByOffset {
 public:
  struct Placed {
    int64_t begin, end, first, last;  // bytes [begin, end), live over launches [first, last]
  };

  void insert(const Placed& placed) {
    if (chunks_.empty()) chunks_.emplace_back();
    // The first chunk whose last buffer begins at or after this one, or the last chunk.
    auto chunk = std::partition_point(chunks_.begin(), chunks_.end() - 1, [&](const Chunk& c) {
      return c.placed.back().begin < placed.begin;
    });
    auto at =
        std::upper_bound(chunk->placed.begin(), chunk->placed.end(), placed.begin,
                         [](int64_t begin, const Placed& other) { return begin < other.begin; });
    chunk->placed.insert(at, placed);
    chunk->add(placed);
    if (chunk->placed.size() > 2 * kChunk) {
      Chunk upper;
      upper.placed.assign(chunk->placed.begin() + kChunk, chunk->placed.end());
      chunk->placed.resize(kChunk);
      chunk->summarize();
      upper.summarize();
      chunks_.insert(chunk + 1, std::move(upper));
    }
  }

  // The lowest offset where `bytes` fit beside every placed buffer live at some launch in
  // [first, last]: the first gap, in offset order, between those buffers that is large enough.
  int64_t lowestFit(int64_t bytes, int64_t first, int64_t last) const {
    int64_t offset = 0;
    for (const Chunk& chunk : chunks_) {
      // From here on every buffer begins after a gap large enough.
      if (chunk.placed.front().begin >= offset + bytes) break;
      // None of the chunk's buffers is live at the same time, or all end below `offset`.
      if (chunk.minFirst > last || chunk.maxLast < first || chunk.maxEnd <= offset) continue;
      for (const Placed& other : chunk.placed) {
        if (other.begin >= offset + bytes) return offset;
        if (other.first <= last && first <= other.last) offset = std::max(offset, other.end);
      }
    }
    return offset;
  }

 private:
  static constexpr size_t kChunk = 256;
  struct Chunk {
    std::vector<Placed> placed;
    int64_t minFirst = std::numeric_limits<int64_t>::max();
    int64_t maxLast = std::numeric_limits<int64_t>::min();
    int64_t maxEnd = 0;
    void add(const Placed& p) {
      minFirst = std::min(minFirst, p.first);
      maxLast = std::max(maxLast, p.last);
      maxEnd = std::max(maxEnd, p.end);
    }
    void summarize() {
      minFirst = std::numeric_limits<int64_t>::max();
      maxLast = std::numeric_limits<int64_t>::min();
      maxEnd = 0;
      for (const Placed& p : placed) add(p);
    }
  };
  std::vector<Chunk> chunks_;
};

// Places each buffer, largest first, at the lowest offset that does not collide with a placed
// buffer live at the same time. Returns the arena size.
int64_t placeActivations(std::vector<Lifetime>& lifetimes, int64_t alignment) {
  std::vector<Lifetime*> order;
  for (Lifetime& lifetime : lifetimes) order.push_back(&lifetime);
  std::stable_sort(order.begin(), order.end(), [](const Lifetime* a, const Lifetime* b) {
    return a->bytes != b->bytes ? a->bytes > b->bytes : a->first < b->first;
  });
  PlacedByOffset placed;
  int64_t arena = 0;
  for (Lifetime* current : order) {
    current->offset = placed.lowestFit(current->bytes, current->first, current->last);
    const int64_t end = current->offset + alignUp(current->bytes, alignment);
    arena = std::max(arena, end);
    placed.insert({current->offset, end, current->first, current->last});
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
    // The lifetimes a launch running beside the compute stream touches: they last until its
    // exec.join, since the launches in between run while it does.
    std::vector<size_t> beside;
    func.walk([&](Operation* op) {
      if (isa<exec::JoinOp>(op)) {
        for (size_t l : beside) lifetimes[l].last = std::max(lifetimes[l].last, index - 1);
        beside.clear();
        return;
      }
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
        if (auto launch = dyn_cast<exec::LaunchOp>(op); launch && launch.getBeside())
          beside.push_back(it->second);
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
