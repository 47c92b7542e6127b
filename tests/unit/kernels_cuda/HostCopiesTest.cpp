// Which expert ids the CUDA executor copies to the host, and after which step
// (runtime/backends/cuda/HostCopies.h): right after the last step that writes any of their bytes
// before the MoE step that reads them; one copy for a forward and a backward reading the same
// ids of the same writer.
#include "runtime/backends/cuda/HostCopies.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/plan/PlanSketch.h"

namespace hcp::cuda_backend {
namespace {

using plan::Arena;
using plan::KernelId;
using plan::testing::PlanSketch;

TEST(HostCopies, OnlyTheMoeExpertsReadOnTheHost) {
  EXPECT_EQ(HostReadInput(KernelId::MoeExpertsForward), 2);
  EXPECT_EQ(HostReadInput(KernelId::MoeExpertsEpForward), 2);
  EXPECT_EQ(HostReadInput(KernelId::MoeExpertsBackward), 3);
  EXPECT_EQ(HostReadInput(KernelId::MoeExpertsEpBackward), 3);
  EXPECT_EQ(HostReadInput(KernelId::MoeRouteForward), -1);
  EXPECT_EQ(HostReadInput(KernelId::Gemm), -1);
}

// The router writes the ids; the forward and the backward read them: one copy, after the
// router, whatever runs in between.
TEST(HostCopies, ForwardAndBackwardShareTheCopyAfterTheRouter) {
  PlanSketch p;
  const uint32_t logits = p.Buffer(Arena::Activations, 0),
                 gates = p.Buffer(Arena::Activations, 256);
  const uint32_t ids = p.Buffer(Arena::Activations, 512), x = p.Buffer(Arena::Activations, 768);
  const uint32_t y = p.Buffer(Arena::Activations, 1024), w = p.Buffer(Arena::Parameters, 0);
  const uint32_t dw = p.Buffer(Arena::Gradients, 0), dgates = p.Buffer(Arena::Activations, 1280);
  p.Step(KernelId::Gemm, {x, w}, {logits});                                             // 0
  p.Step(KernelId::MoeRouteForward, {logits}, {gates, ids});                            // 1
  p.Step(KernelId::Gemm, {x, w}, {y});                                                  // 2
  p.Step(KernelId::MoeExpertsForward, {x, gates, ids, w, w}, {y});                      // 3
  p.Step(KernelId::MoeExpertsBackward, {y, x, gates, ids, w, w}, {x, dgates, dw, dw});  // 4
  const HostCopyPlan plan = PlanHostCopies(p.plan());
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.copies[0].buffer, ids);
  EXPECT_EQ(plan.copies[0].after_step, 1u);
  EXPECT_EQ(plan.copy_of_step, (std::vector<int>{-1, -1, -1, 0, 0}));
}

// The last writer counts, through any buffer over the same bytes: recomputed ids (a second
// router) get a copy of their own, and a view that overwrites part of the ids moves the copy
// after it.
TEST(HostCopies, TheLastWriterOfAnyByteDecides) {
  PlanSketch p;
  const uint32_t logits = p.Buffer(Arena::Activations, 0),
                 gates = p.Buffer(Arena::Activations, 256);
  const uint32_t ids = p.Buffer(Arena::Activations, 512), x = p.Buffer(Arena::Activations, 768);
  const uint32_t half = p.Buffer(Arena::Activations, 640, 32);  // ids' upper half
  const uint32_t w = p.Buffer(Arena::Parameters, 0);
  p.Step(KernelId::MoeRouteForward, {logits}, {gates, ids});        // 0
  p.Step(KernelId::MoeExpertsForward, {x, gates, ids, w, w}, {x});  // 1
  p.Step(KernelId::MoeRouteForward, {logits}, {gates, ids});        // 2: recomputed
  p.Step(KernelId::Fill, {}, {half});                               // 3: overwrites a part
  p.Step(KernelId::MoeExpertsForward, {x, gates, ids, w, w}, {x});  // 4
  const HostCopyPlan plan = PlanHostCopies(p.plan());
  ASSERT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(plan.copies[0].after_step, 0u);
  EXPECT_EQ(plan.copies[1].after_step, 3u);
  EXPECT_EQ(plan.copy_of_step[1], 0);
  EXPECT_EQ(plan.copy_of_step[4], 1);
}

// Ids no step writes (a plan input) are copied before the steps start.
TEST(HostCopies, IdsNoStepWritesAreCopiedFirst) {
  PlanSketch p;
  const uint32_t ids = p.Buffer(Arena::Inputs, 0), x = p.Buffer(Arena::Activations, 0);
  const uint32_t gates = p.Buffer(Arena::Activations, 256), w = p.Buffer(Arena::Parameters, 0);
  p.Step(KernelId::MoeExpertsForward, {x, gates, ids, w, w}, {x});
  const HostCopyPlan plan = PlanHostCopies(p.plan());
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.copies[0].after_step, kBeforeTheSteps);
}

}  // namespace
}  // namespace hcp::cuda_backend
