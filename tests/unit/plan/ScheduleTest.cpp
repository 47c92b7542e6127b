// The plan's schedule (runtime/plan/Schedule.h). LatestJoins: a collective that may run beside the
// compute stream may be joined no later than before the first later step that communicates or
// that writes or reads what it writes, or writes what it reads, byte for byte in its arena;
// never for a step that is not such a collective. CheckSchedule refuses a schedule that waits
// later than that, naming the steps.
#include "runtime/plan/Schedule.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/KernelTable.h"
#include "tests/unit/plan/PlanSketch.h"

namespace hcp::plan {
namespace {

using ::testing::HasSubstr;
using testing::PlanSketch;

TEST(Schedule, OnlyHalosAndStateScansRunBeside) {
  EXPECT_TRUE(RunsBesideCompute(KernelId::HaloExchangeForward));
  EXPECT_TRUE(RunsBesideCompute(KernelId::HaloExchangeBackward));
  EXPECT_TRUE(RunsBesideCompute(KernelId::StateScanForward));
  EXPECT_TRUE(RunsBesideCompute(KernelId::StateScanBackward));
  // Ring attention uses a second stream and events of its own; the all-reduce and the expert
  // all-to-alls wait for the host.
  EXPECT_FALSE(RunsBesideCompute(KernelId::RingAttentionForward));
  EXPECT_FALSE(RunsBesideCompute(KernelId::AllReduce));
  EXPECT_FALSE(RunsBesideCompute(KernelId::MoeExpertsEpForward));
  EXPECT_FALSE(RunsBesideCompute(KernelId::Gemm));
}

TEST(Schedule, JoinsBeforeTheFirstReaderOfItsOutput) {
  PlanSketch p;
  const uint32_t x = p.Buffer(Arena::Activations, 0), halo = p.Buffer(Arena::Activations, 256);
  const uint32_t other = p.Buffer(Arena::Activations, 512), out = p.Buffer(Arena::Activations, 768);
  const uint32_t w = p.Buffer(Arena::Parameters, 0);
  p.Step(KernelId::HaloExchangeForward, {x}, {halo});             // 0
  p.Step(KernelId::SiluForward, {w}, {other});                    // 1: free of it
  p.Step(KernelId::CausalConv1dForward, {x, w, w, halo}, {out});  // 2: reads the halo
  EXPECT_EQ(LatestJoins(p.plan()), (std::vector<size_t>{2, kNotBeside, kNotBeside}));
}

TEST(Schedule, JoinsBeforeAStepThatOverwritesWhatItReads) {
  PlanSketch p;
  const uint32_t g = p.Buffer(Arena::Activations, 0), s = p.Buffer(Arena::Activations, 256);
  const uint32_t s_in = p.Buffer(Arena::Activations, 512), w = p.Buffer(Arena::Parameters, 0);
  const uint32_t later = p.Buffer(Arena::Activations, 300);  // reuses part of s's bytes
  p.Step(KernelId::StateScanForward, {g, s}, {s_in});
  p.Step(KernelId::SiluForward, {w}, {later});
  EXPECT_EQ(LatestJoins(p.plan())[0], 1u);
}

TEST(Schedule, ReadersOfWhatItReadsRunBesideIt) {
  PlanSketch p;
  const uint32_t x = p.Buffer(Arena::Activations, 0), halo = p.Buffer(Arena::Activations, 256);
  const uint32_t y = p.Buffer(Arena::Activations, 512);
  p.Step(KernelId::HaloExchangeForward, {x}, {halo});
  p.Step(KernelId::SiluForward, {x}, {y});  // reads the exchange's input too: no hazard
  EXPECT_EQ(LatestJoins(p.plan())[0], 2u);
}

TEST(Schedule, BytesCountPerArena) {
  PlanSketch p;
  const uint32_t x = p.Buffer(Arena::Activations, 0), halo = p.Buffer(Arena::Activations, 256);
  // The same offsets in other arenas are other bytes.
  const uint32_t grad = p.Buffer(Arena::Gradients, 0), w = p.Buffer(Arena::Parameters, 256);
  p.Step(KernelId::HaloExchangeBackward, {halo}, {x});
  p.Step(KernelId::SiluForward, {w}, {grad});
  EXPECT_EQ(LatestJoins(p.plan())[0], 2u);  // the end of the step list
}

TEST(Schedule, JoinsBeforeTheNextCollective) {
  PlanSketch p;
  const uint32_t a = p.Buffer(Arena::Activations, 0), b = p.Buffer(Arena::Activations, 256);
  const uint32_t c = p.Buffer(Arena::Activations, 512), d = p.Buffer(Arena::Activations, 768);
  p.Step(KernelId::HaloExchangeForward, {a}, {b});
  p.Step(KernelId::AllReduce, {c}, {d});  // shares nothing, but communicates
  p.Step(KernelId::HaloExchangeForward, {c}, {d});
  EXPECT_EQ(LatestJoins(p.plan()), (std::vector<size_t>{1, kNotBeside, 3}));
}

// Halo exchange, a free step, the conv that reads the halo.
PlanSketch HaloThenConv() {
  PlanSketch p;
  const uint32_t x = p.Buffer(Arena::Activations, 0), halo = p.Buffer(Arena::Activations, 256);
  const uint32_t other = p.Buffer(Arena::Activations, 512), out = p.Buffer(Arena::Activations, 768);
  const uint32_t w = p.Buffer(Arena::Parameters, 0);
  p.Step(KernelId::HaloExchangeForward, {x}, {halo});
  p.Step(KernelId::SiluForward, {w}, {other});
  p.Step(KernelId::CausalConv1dForward, {x, w, w, halo}, {out});
  return p;
}

TEST(Schedule, AcceptsJoinsNoLaterThanAllowed) {
  for (uint32_t join : {1u, 2u}) {
    PlanSketch p = HaloThenConv();
    p.Beside(0, join);
    EXPECT_TRUE(CheckSchedule(p.plan()).ok()) << "joined before step " << join;
  }
  EXPECT_TRUE(CheckSchedule(HaloThenConv().plan()).ok());  // everything on the compute stream
}

TEST(Schedule, RefusesAJoinAfterAHazard) {
  PlanSketch p = HaloThenConv();
  p.Beside(0, 3);  // the conv would read the halo while the exchange writes it
  EXPECT_EQ(CheckSchedule(p.plan()).message(),
            "step 0 (halo_exchange.forward) runs beside the compute stream until step 3, but "
            "step 2 (causal_conv1d.forward) before then reads bytes it writes: the schedule is "
            "unsafe (compile the plan again)");
}

TEST(Schedule, RefusesJoinsOutsideTheSteps) {
  for (uint32_t join : {0u, 4u}) {
    PlanSketch p = HaloThenConv();
    p.Beside(0, join);
    EXPECT_THAT(CheckSchedule(p.plan()).message(),
                HasSubstr("is joined before step " + std::to_string(join) +
                          ", which is not a later step (1..3, 3: the end)"));
  }
}

TEST(Schedule, RefusesKernelsThatMayNotRunBeside) {
  PlanSketch p = HaloThenConv();
  p.Beside(1, 2);
  EXPECT_THAT(CheckSchedule(p.plan()).message(),
              HasSubstr("step 1 (silu.forward) is scheduled beside the compute stream, but its "
                        "kernel may not run there"));
}

TEST(Schedule, RefusesAJoinOnTheComputeStream) {
  Plan plan = HaloThenConv().plan();
  plan.steps[1].join_before = 2;  // a compute step naming a join
  EXPECT_THAT(CheckSchedule(plan).message(),
              HasSubstr("step 1 (silu.forward) runs on the compute stream but names a join"));
}

}  // namespace
}  // namespace hcp::plan
