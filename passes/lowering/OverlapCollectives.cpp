// hcp-overlap-collectives: around each halo exchange and state scan, the launches that do not
// need it go right after it and those that do after them; then the schedule: the collective
// runs `beside` the compute stream, joined (exec.join) before the first later launch that needs
// it, communicates, or the step's end. The plan records it (Step::stream, join_before) and the
// CUDA executor runs it so.
#include <algorithm>
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/Passes.h"
#include "runtime/plan/KernelTable.h"

namespace hcp {

#define GEN_PASS_DEF_OVERLAPCOLLECTIVES
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

// The collectives that may run beside the compute stream (`beside` in KernelTable.txt).
bool overlappable(exec::LaunchOp launch) {
  std::optional<plan::KernelId> kernel = plan::FindKernel(launch.getKernel());
  return kernel && plan::RunsBesideCompute(*kernel);
}

// Every launch that talks to other ranks (a `collective` kernel of runtime/plan/KernelTable.txt):
// no launch is moved across one, so every rank still issues its collectives in the same order.
bool communicates(exec::LaunchOp launch) {
  std::optional<plan::KernelId> kernel = plan::FindKernel(launch.getKernel());
  return kernel && plan::IsCollective(*kernel);
}

// The buffers a launch reads and writes (through views).
struct Footprint {
  llvm::SmallDenseSet<Operation*, 8> reads, writes;

  explicit Footprint(exec::LaunchOp launch) {
    for (Value in : launch.getIns()) reads.insert(rootOf(in).getOperation());
    for (Value out : launch.getOuts()) writes.insert(rootOf(out).getOperation());
  }
  // Whether the two must keep their order: one writes a buffer the other touches.
  bool conflictsWith(const Footprint& other) const {
    for (Operation* w : writes) {
      if (other.reads.contains(w) || other.writes.contains(w)) return true;
    }
    for (Operation* w : other.writes) {
      if (reads.contains(w)) return true;
    }
    return false;
  }
};

// The launches between the communicating launches (or results, or the block's ends) on either
// side of `collective`, in order.
void windowAround(exec::LaunchOp collective, std::vector<exec::LaunchOp>& before,
                  std::vector<exec::LaunchOp>& after) {
  auto isBarrier = [](Operation* op) {
    auto launch = dyn_cast<exec::LaunchOp>(op);
    if (launch) return communicates(launch);
    return !isa<exec::BufferOp, exec::ViewOp>(op);  // a result, the return
  };
  for (Operation* op = collective->getPrevNode(); op != nullptr && !isBarrier(op);
       op = op->getPrevNode()) {
    if (auto launch = dyn_cast<exec::LaunchOp>(op)) before.push_back(launch);
  }
  std::reverse(before.begin(), before.end());
  for (Operation* op = collective->getNextNode(); op != nullptr && !isBarrier(op);
       op = op->getNextNode()) {
    if (auto launch = dyn_cast<exec::LaunchOp>(op)) after.push_back(launch);
  }
}

struct OverlapCollectivesPass : impl::OverlapCollectivesBase<OverlapCollectivesPass> {
  void runOnOperation() override {
    placed.clear();  // a pass instance may run on several modules
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      std::vector<exec::LaunchOp> collectives;
      for (auto launch : func.getBody().front().getOps<exec::LaunchOp>()) {
        if (overlappable(launch)) collectives.push_back(launch);
      }
      for (exec::LaunchOp collective : collectives) reorderAround(collective);
      for (exec::LaunchOp collective : collectives) scheduleBeside(collective);
    }
  }

  // The collective runs beside the compute stream until the first later launch that conflicts
  // with it (either writes a buffer the other touches) or communicates, or the step's end:
  // exec.join goes before that. (hcp-plan-memory keeps the collective's buffers live until
  // the join, so no launch in between may reuse their bytes.)
  void scheduleBeside(exec::LaunchOp collective) {
    const Footprint footprint(collective);
    Operation* joinBefore = collective->getBlock()->getTerminator();
    for (Operation* op = collective->getNextNode(); op != joinBefore; op = op->getNextNode()) {
      auto launch = dyn_cast<exec::LaunchOp>(op);
      if (launch && (communicates(launch) || Footprint(launch).conflictsWith(footprint))) {
        joinBefore = launch;
        break;
      }
    }
    collective.setBeside(true);
    OpBuilder builder(joinBefore);
    exec::JoinOp::create(builder, collective.getLoc());
    ++scheduledBeside;
  }

  // The launches already placed beside a collective: those moved after it and those found free
  // of it after it.
  llvm::DenseSet<Operation*> placed;

  // New order of the window: what the collective needs, the collective, what needs neither it
  // nor anything after it, then what needs it. Launches only move later, past launches they do
  // not conflict with: every buffer sees its reads and writes in the same order as before.
  void reorderAround(exec::LaunchOp collective) {
    std::vector<exec::LaunchOp> before, after;
    windowAround(collective, before, after);
    const Footprint collectiveFootprint(collective);

    // Before: the launches the collective depends on, directly or through later ones.
    std::vector<Footprint> needed;
    std::vector<exec::LaunchOp> independent;  // in reverse order
    for (auto it = before.rbegin(); it != before.rend(); ++it) {
      Footprint footprint(*it);
      // A launch placed beside an earlier collective stays there (else the weight gradients
      // would slide down to the end of the step, past every collective), and so do the launches
      // it needs.
      bool needs = placed.contains(*it) || footprint.conflictsWith(collectiveFootprint);
      for (size_t i = 0; i < needed.size() && !needs; ++i)
        needs = footprint.conflictsWith(needed[i]);
      if (needs) {
        needed.push_back(std::move(footprint));
      } else {
        independent.push_back(*it);
      }
    }
    // After: the launches that depend on the collective, directly or through earlier ones.
    std::vector<Footprint> dependentFootprints;
    std::vector<size_t> dependent;  // indices into `after`
    Operation* lastFree = nullptr;  // the last launch after the collective that is free of it
    size_t lastFreeAt = 0;
    for (size_t at = 0; at < after.size(); ++at) {
      exec::LaunchOp launch = after[at];
      Footprint footprint(launch);
      bool needs = footprint.conflictsWith(collectiveFootprint);
      for (size_t i = 0; i < dependentFootprints.size() && !needs; ++i)
        needs = footprint.conflictsWith(dependentFootprints[i]);
      if (needs) {
        dependentFootprints.push_back(std::move(footprint));
        dependent.push_back(at);
      } else {
        lastFree = launch;
        lastFreeAt = at;
        placed.insert(launch);
      }
    }

    Operation* cursor = collective;
    for (auto it = independent.rbegin(); it != independent.rend(); ++it) {
      (*it)->moveAfter(cursor);
      cursor = *it;
      placed.insert(*it);
      ++movedAfter;
    }
    if (lastFree == nullptr) return;
    // Moves keep the order of the launches they do not move, so `after` still says which
    // come before lastFree (asking the block would recompute its order after every move).
    cursor = lastFree;
    for (size_t at : dependent) {
      if (at > lastFreeAt) break;  // the rest already follow
      after[at]->moveAfter(cursor);
      cursor = after[at];
      ++movedPast;
    }
  }
};

}  // namespace
}  // namespace hcp
