// When the CUDA executor waits for a collective it runs beside the compute stream
// (runtime/backends/cuda/BesideCompute.h): before the first later step that touches any byte of
// the collective's buffers, in any arena, through any buffer, or that communicates; never for a
// step that is not such a collective.
#include "runtime/backends/cuda/BesideCompute.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels_cuda/PlanSketch.h"

namespace hcp::cuda_backend {
namespace {

using plan::Arena;
using plan::KernelId;
using testing::PlanSketch;

TEST(BesideCompute, OnlyHalosAndStateScansRunBeside) {
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

TEST(BesideCompute, JoinsBeforeTheFirstReaderOfItsOutput) {
  PlanSketch p;
  const uint32_t x = p.Buffer(Arena::Activations, 0), halo = p.Buffer(Arena::Activations, 256);
  const uint32_t other = p.Buffer(Arena::Activations, 512), out = p.Buffer(Arena::Activations, 768);
  const uint32_t w = p.Buffer(Arena::Parameters, 0);
  p.Step(KernelId::HaloExchangeForward, {x}, {halo});             // 0
  p.Step(KernelId::SiluForward, {w}, {other});                    // 1: free of it
  p.Step(KernelId::CausalConv1dForward, {x, w, w, halo}, {out});  // 2: reads the halo
  EXPECT_EQ(BesideComputeJoins(p.plan()),
            (std::vector<size_t>{2, kOnComputeStream, kOnComputeStream}));
}

TEST(BesideCompute, JoinsBeforeAStepThatOverwritesWhatItReads) {
  PlanSketch p;
  const uint32_t g = p.Buffer(Arena::Activations, 0), s = p.Buffer(Arena::Activations, 256);
  const uint32_t s_in = p.Buffer(Arena::Activations, 512), w = p.Buffer(Arena::Parameters, 0);
  const uint32_t later = p.Buffer(Arena::Activations, 300);  // reuses part of s's bytes
  p.Step(KernelId::StateScanForward, {g, s}, {s_in});
  p.Step(KernelId::SiluForward, {w}, {later});
  EXPECT_EQ(BesideComputeJoins(p.plan())[0], 1u);
}

TEST(BesideCompute, BytesCountPerArena) {
  PlanSketch p;
  const uint32_t x = p.Buffer(Arena::Activations, 0), halo = p.Buffer(Arena::Activations, 256);
  // The same offsets in other arenas are other bytes.
  const uint32_t grad = p.Buffer(Arena::Gradients, 0), w = p.Buffer(Arena::Parameters, 256);
  p.Step(KernelId::HaloExchangeBackward, {halo}, {x});
  p.Step(KernelId::SiluForward, {w}, {grad});
  EXPECT_EQ(BesideComputeJoins(p.plan())[0], 2u);  // the end of the step list
}

TEST(BesideCompute, JoinsBeforeTheNextCollective) {
  PlanSketch p;
  const uint32_t a = p.Buffer(Arena::Activations, 0), b = p.Buffer(Arena::Activations, 256);
  const uint32_t c = p.Buffer(Arena::Activations, 512), d = p.Buffer(Arena::Activations, 768);
  p.Step(KernelId::HaloExchangeForward, {a}, {b});
  p.Step(KernelId::AllReduce, {c}, {d});  // shares nothing, but communicates
  p.Step(KernelId::HaloExchangeForward, {c}, {d});
  EXPECT_EQ(BesideComputeJoins(p.plan()), (std::vector<size_t>{1, kOnComputeStream, 3}));
}

}  // namespace
}  // namespace hcp::cuda_backend
