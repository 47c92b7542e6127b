// The generated kernel table (runtime/plan/KernelTable.txt -> KernelTable.gen.h): the typed
// argument structs put every field where the signature says, optional buffers follow their
// flags, and the signature table agrees with the structs.
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/KernelCheck.h"
#include "runtime/plan/Plan.h"

namespace hcp::plan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(KernelTable, NamesRoundTrip) {
  for (int i = 0; i < kNumKernels; ++i) {
    const std::string_view name = KernelName(KernelId(i));
    EXPECT_EQ(FindKernel(name), KernelId(i)) << name;
  }
  EXPECT_EQ(KernelName(KernelId::RmsNormForward), "rms_norm.forward");
  EXPECT_FALSE(FindKernel("nope").has_value());
  EXPECT_TRUE(IsCollective(KernelId::StateScanForward));
  EXPECT_FALSE(IsCollective(KernelId::SsdScanForward));
}

// Encode lays the fields out in the signature's order, optional buffers only with their flag;
// Decode reads them back by name.
TEST(KernelArgs, SsdScanBackwardRoundTrip) {
  SsdScanBackwardArgs<> k;
  k.batch = 2, k.seq = 8, k.heads = 4, k.head_dim = 3, k.groups = 2, k.state = 5, k.chunk = 4;
  k.has_init = false;
  k.has_dfinal = true;
  k.dy = 10, k.x = 11, k.dt = 12, k.A = 13, k.B = 14, k.C = 15, k.D = 16, k.dfinal_state = 17;
  k.dx = 20, k.ddt = 21, k.dA = 22, k.dB = 23, k.dC = 24, k.dD = 25;
  const Step step = EncodeStep(k);
  EXPECT_EQ(step.kernel, KernelId::SsdScanBackward);
  EXPECT_THAT(step.ints, ElementsAre(2, 8, 4, 3, 2, 5, 4, 0, 1, 0, 0));
  EXPECT_THAT(step.ins, ElementsAre(10, 11, 12, 13, 14, 15, 16, 17));  // no init_state
  EXPECT_THAT(step.outs, ElementsAre(20, 21, 22, 23, 24, 25));         // no dinit_state
  const auto back = DecodeStep<SsdScanBackwardArgs>(step);
  EXPECT_EQ(back.dfinal_state, 17u);
  EXPECT_EQ(back.chunk, 4);
  EXPECT_TRUE(back.has_dfinal);
  EXPECT_FALSE(back.has_init);
  // With has_init the state comes before dfinal_state, and dinit_state is the last output.
  k.has_init = true;
  k.init_state = 30;
  k.dinit_state = 31;
  const Step with_init = EncodeStep(k);
  EXPECT_THAT(with_init.ins, ElementsAre(10, 11, 12, 13, 14, 15, 16, 30, 17));
  EXPECT_THAT(with_init.outs, ElementsAre(20, 21, 22, 23, 24, 25, 31));
  EXPECT_EQ(DecodeStep<SsdScanBackwardArgs>(with_init).init_state, 30u);
  // Packed documents: the positions are the last input, after dfinal_state.
  k.documents = true;
  k.positions = 40;
  const Step with_positions = EncodeStep(k);
  EXPECT_THAT(with_positions.ints, ElementsAre(2, 8, 4, 3, 2, 5, 4, 1, 1, 1, 0));
  EXPECT_THAT(with_positions.ins, ElementsAre(10, 11, 12, 13, 14, 15, 16, 30, 17, 40));
  EXPECT_EQ(DecodeStep<SsdScanBackwardArgs>(with_positions).positions, 40u);
  // The forward's chunk states (keep_states) come last of all.
  k.keep_states = true;
  k.chunk_states = 50;
  const Step with_states = EncodeStep(k);
  EXPECT_THAT(with_states.ins, ElementsAre(10, 11, 12, 13, 14, 15, 16, 30, 17, 40, 50));
  EXPECT_EQ(DecodeStep<SsdScanBackwardArgs>(with_states).chunk_states, 50u);
}

// A buffer named like Encode's local (state_scan's `s`) is still the field.
TEST(KernelArgs, StateScanKeepsItsBufferNamedS) {
  StateScanForwardArgs<> k;
  k.batch = 1, k.segs = 2, k.heads = 3, k.head_dim = 4, k.state = 5, k.strategy = 1;
  k.g = 7, k.s = 8, k.s_in = 9;
  const Step step = EncodeStep(k);
  EXPECT_THAT(step.ins, ElementsAre(7, 8));
  EXPECT_THAT(step.outs, ElementsAre(9));
  EXPECT_EQ(DecodeStep<StateScanForwardArgs>(step).s, 8u);
}

// Floats travel as doubles; resolve maps every present buffer.
TEST(KernelArgs, FloatsAndResolve) {
  AttentionForwardArgs<> k;
  k.batch = 1, k.seq = 4, k.q_heads = 2, k.kv_heads = 1, k.head_dim = 8, k.causal = true;
  k.scale = 0.125;
  k.q = 1, k.k = 2, k.v = 3, k.out = 4, k.lse = 5;
  const Step step = EncodeStep(k);
  EXPECT_THAT(step.floats, ElementsAre(0.125));
  const auto named = DecodeStep<AttentionForwardArgs>(step, [](uint32_t b) { return b * 10; });
  EXPECT_EQ(named.v, 30u);
  EXPECT_EQ(named.lse, 50u);
  EXPECT_TRUE(named.causal);
}

// The arity follows the flags; a missing flag counts as 0.
TEST(KernelSignatures, ArityFollowsFlags) {
  const std::vector<int64_t> halo_and_silu = {1, 8, 4, 4, 1, 1};
  EXPECT_EQ(ExpectedArity(KernelId::CausalConv1dBackward, halo_and_silu).ins, 5);
  EXPECT_EQ(ExpectedArity(KernelId::CausalConv1dBackward, halo_and_silu).outs, 4);
  const std::vector<int64_t> plain = {1, 8, 4, 4, 0, 0};
  EXPECT_EQ(ExpectedArity(KernelId::CausalConv1dBackward, plain).ins, 3);
  EXPECT_EQ(ExpectedArity(KernelId::CausalConv1dBackward, {}).outs, 3);
}

// Every kernel's signature is well-formed: flags gate optional buffers, shape factors name
// existing ints, and each float has a name.
TEST(KernelSignatures, EveryFactorNamesAnInt) {
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelSignature& s = GetKernelSignature(KernelId(i));
    for (const auto* list : {&s.ins, &s.outs}) {
      for (const BufferSpec& b : *list) {
        EXPECT_FALSE(b.shape.empty()) << s.name << " " << b.name;
        if (b.present_if >= 0) {
          ASSERT_LT(static_cast<size_t>(b.present_if), s.ints.size()) << s.name;
          EXPECT_EQ(s.ints[b.present_if].kind, IntKind::Flag) << s.name << " " << b.name;
        }
        for (const Factor& f : b.shape) {
          EXPECT_LT(f.index, static_cast<int>(s.ints.size())) << s.name << " " << b.name;
          EXPECT_LT(f.divisor, static_cast<int>(s.ints.size())) << s.name << " " << b.name;
        }
      }
    }
  }
}

// The generic check names the argument by the signature's name.
TEST(KernelCheck, NamesTheArgument) {
  const std::vector<int64_t> ints = {0};
  const std::vector<double> floats = {1.0};
  const std::vector<BufferFacts> outs = {{4, DType::F32, "y"}};
  const absl::Status s =
      CheckKernelArguments({KernelId::Fill, ints, floats, {}, outs}, /*context=*/nullptr);
  EXPECT_THAT(std::string(s.message()), HasSubstr("int 0 (n) is 0, expected a positive size"));
  const std::vector<int64_t> four = {4};
  const std::vector<BufferFacts> i32 = {{4, DType::I32, "y"}};
  EXPECT_THAT(
      std::string(CheckKernelArguments({KernelId::Fill, four, floats, {}, i32}, nullptr).message()),
      HasSubstr("output 0 'y' is i32, expected f32 or bf16"));
  EXPECT_TRUE(CheckKernelArguments({KernelId::Fill, four, floats, {}, outs}, nullptr).ok());
}

// A ceil(a/b) factor rounds up: a sequence of 9 in chunks of 4 has 3 chunks of kept states.
TEST(KernelCheck, CeilQuotientRoundsUp) {
  SsdScanForwardArgs<> k;
  k.batch = 1, k.seq = 9, k.heads = 2, k.head_dim = 3, k.groups = 1, k.state = 5, k.chunk = 4;
  k.keep_states = true;
  const Step step = EncodeStep(k);
  auto check = [&](uint64_t state_elements) {
    const std::vector<BufferFacts> ins = {{9 * 2 * 3, DType::F32, "x"}, {9 * 2, DType::F32, "dt"},
                                          {2, DType::F32, "A"},         {9 * 5, DType::F32, "B"},
                                          {9 * 5, DType::F32, "C"},     {2, DType::F32, "D"}};
    const std::vector<BufferFacts> outs = {{9 * 2 * 3, DType::F32, "y"},
                                           {2 * 3 * 5, DType::F32, "final_state"},
                                           {state_elements, DType::F32, "chunk_states"}};
    return CheckKernelArguments({step.kernel, step.ints, step.floats, ins, outs}, nullptr);
  };
  EXPECT_TRUE(check(2 * 3 * 3 * 5).ok());
  EXPECT_THAT(std::string(check(2 * 2 * 3 * 5).message()),
              HasSubstr("'chunk_states' has 60 elements, expected "
                        "batch*heads*ceil(seq/chunk)*head_dim*state = 90"));
}

}  // namespace
}  // namespace hcp::plan
