// Semantic validation: each rule of ValidatePlan has a plan that breaks it, and the message
// names the right step, kernel, argument and buffer.
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"
#include "tests/unit/plan/TinyLm.h"

namespace hcp::plan {
namespace {

using hcp::testing::TinyLm;
using ::testing::HasSubstr;

constexpr int64_t T = TinyLm::kTokens, V = TinyLm::kVocab, H = TinyLm::kHidden;

// Breaks a fresh TinyLm with `edit`, loads it, and returns the error ("(loaded)" if it loads).
std::string ErrorAfter(const std::function<void(TinyLm&)>& edit) {
  TinyLm lm;
  edit(lm);
  absl::StatusOr<Plan> plan = ParsePlan(lm.Bytes(), "tiny.plan");
  if (plan.ok()) return "(loaded)";
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(plan.status().message());
}

TEST(Validate, TinyLmIsValid) {
  EXPECT_EQ(ErrorAfter([](TinyLm&) {}), "(loaded)");
}

// ---------------------------------------------------------------------------------------------
// Buffers and arenas.

TEST(Validate, ShapeMustMatchElements) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.buffer(lm.h).shape = {T, H + 1};
              }),
              HasSubstr("'act.h' has shape [10, 7] (70 elements) but says it has 60 elements"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.buffer(lm.h).shape = {-T, -H};
              }),
              HasSubstr("'act.h' has shape [-10, -6]: a negative dimension"));
}

TEST(Validate, BufferMustFitItsArena) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.SetArenaBytes(Arena::Activations,
                                         lm.builder.arena_bytes(Arena::Activations) - 4);
              }),
              HasSubstr("'act.dtable_embed' (offset"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.SetArenaBytes(Arena::Activations,
                                         lm.builder.arena_bytes(Arena::Activations) - 4);
              }),
              HasSubstr("does not fit in the activations arena"));
  // offset + bytes wrapping around 2^64 must not pass.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.buffer(lm.h).offset = ~uint64_t{0} - 63; }),
              HasSubstr("'act.h' (offset 18446744073709551552, 60 elements of f32) does not fit"));
}

TEST(Validate, ElementBytesOverflow) {
  // 2^31 * 2^31 elements * 4 bytes overflows 64 bits; the shape product itself still fits.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                Buffer& b = lm.builder.buffer(lm.h);
                b.shape = {int64_t{1} << 31, int64_t{1} << 31};
                b.elements = uint64_t{1} << 62;
              }),
              HasSubstr("4611686018427387904 elements of f32) does not fit"));
  // A shape whose product overflows int64.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.buffer(lm.h).shape = {int64_t{1} << 40, int64_t{1} << 40};
              }),
              HasSubstr("too many elements"));
}

TEST(Validate, OffsetAlignedToElementSize) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.buffer(lm.h).offset += 2; }),
              HasSubstr("'act.h': offset 258 is not a multiple of its f32 element size 4"));
}

// ---------------------------------------------------------------------------------------------
// Parameters, inputs, loss.

TEST(Validate, Parameters) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.parameter(1).buffer = lm.h; }),
              HasSubstr("parameter 1 'model.norm.weight': value buffer"));
  EXPECT_THAT(
      ErrorAfter([](TinyLm& lm) { lm.builder.parameter(1).buffer = lm.h; }),
      HasSubstr("is f32 in the activations arena, expected f32 or bf16 in the parameters arena"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.parameter(1).gradient = lm.norm; }),
              HasSubstr("gradient buffer 2 'model.norm.weight' is f32 in the parameters arena"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.parameter(1).gradient = lm.dtable; }),
              HasSubstr("has 6 elements but gradient buffer 1 'model.embed_tokens.weight.grad' "
                        "has 66"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.parameter(1).buffer = 999; }),
              HasSubstr("value is buffer 999, but the plan has"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.parameter(1).name = TinyLm::kTable; }),
              HasSubstr("parameter 1 'model.embed_tokens.weight' appears twice"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.parameter(0).std = std::numeric_limits<double>::quiet_NaN();
              }),
              HasSubstr("normal init with std nan"));
}

TEST(Validate, ParametersMustNotShareBytes) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.buffer(lm.norm).offset = lm.builder.buffer(lm.table).offset + 8;
              }),
              HasSubstr("parameter value buffer 2 'model.norm.weight' overlaps parameter value "
                        "buffer 0 'model.embed_tokens.weight'"));
}

TEST(Validate, InputsAndLoss) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_shape(3, TinyLm::kSeq); }),
              HasSubstr("input_ids buffer 4 'input_ids' is i32 [10 elements] in the inputs "
                        "arena, expected i32 [micro_batch*seq = 15]"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_targets(lm.h); }),
              HasSubstr("targets buffer"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_input_ids(500); }),
              HasSubstr("input_ids is buffer 500, but the plan has"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_loss(lm.h); }),
              HasSubstr("loss buffer 8 'act.h' is f32 [60 elements], expected f32 [1]"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_shape(0, TinyLm::kSeq); }),
              HasSubstr("seq 5 and micro_batch 0 must be positive"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_targets(lm.ids); }),
              HasSubstr("input_ids and targets overlap"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_loss_scale(lm.h); }),
              HasSubstr("loss_scale buffer 8 'act.h' is f32 [60 elements] in the activations "
                        "arena, expected f32 [1] in the inputs arena"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_loss_scale(400); }),
              HasSubstr("loss_scale is buffer 400, but the plan has"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.set_loss_scale(lm.ids); }),
              HasSubstr("loss_scale buffer 4 'input_ids' is i32"));
}

// ---------------------------------------------------------------------------------------------
// Steps.

TEST(Validate, IndexOutOfRange) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).ins[1] = 77; }),
              HasSubstr("step 1 (rms_norm.forward): input 1 is buffer 77, but the plan has 22 "
                        "buffers"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).outs[0] = 25; }),
              HasSubstr("step 1 (rms_norm.forward): output 0 is buffer 25"));
}

TEST(Validate, WrongArity) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).ins.push_back(lm.x); }),
              HasSubstr("step 1 (rms_norm.forward): takes 2 inputs, got 3"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).outs.clear(); }),
              HasSubstr("step 1 (rms_norm.forward): takes 1 outputs, got 0"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).ints.pop_back(); }),
              HasSubstr("step 1 (rms_norm.forward): takes 2 ints, got 1"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).floats.clear(); }),
              HasSubstr("step 1 (rms_norm.forward): takes 1 floats, got 0"));
}

TEST(Validate, WrongDType) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.embedding_step).ins[1] = lm.h; }),
              HasSubstr("step 0 (embedding.forward): input 1 'act.h' is f32, expected i32"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).ins[0] = lm.ids; }),
              HasSubstr("step 1 (rms_norm.forward): input 0 'input_ids' is i32, expected f32 or "
                        "bf16"));
  // Losses stay f32 in a bf16 plan.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.buffer(lm.loss_sum).dtype = DType::BF16; }),
              HasSubstr("step 4 (cross_entropy.forward): output 0 'act.loss_sum' is bf16, "
                        "expected f32"));
  // An elementwise kernel computes in one type.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.buffer(lm.logits).dtype = DType::BF16; }),
              HasSubstr("step 3 (scale): input 0 'act.logits_raw' is f32 but output 0 "
                        "'act.logits' is bf16 (an elementwise kernel computes in one type; "
                        "convert with a cast step)"));
  // A gradient is stored like its parameter.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.buffer(lm.dnorm).dtype = DType::BF16; }),
              HasSubstr("value buffer 2 'model.norm.weight' is f32 but gradient buffer 3 "
                        "'model.norm.weight.grad' is bf16"));
}

TEST(Validate, SizeMismatch) {
  // The example of the message format: rows*dim from the ints against the buffer.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.step(lm.norm_step).ints = {T, 7};
              }),
              HasSubstr("step 1 (rms_norm.forward): input 0 'act.x' has 60 elements, expected "
                        "rows*dim = 70"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).ins[1] = lm.table; }),
              HasSubstr("step 1 (rms_norm.forward): input 1 'model.embed_tokens.weight' has 66 "
                        "elements, expected dim = 6"));
  // gemm needs at least m*k, k*n, m*n.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.step(lm.head_gemm_step).ints = {0, 1, T, V + 1, H};
              }),
              HasSubstr("step 2 (gemm): input 1 'model.embed_tokens.weight' has 66 elements, "
                        "expected at least k*n = 72"));
  EXPECT_EQ(ErrorAfter([](TinyLm& lm) {  // smaller is fine: the leading rows
              lm.builder.step(lm.head_gemm_step).ints = {0, 1, T - 1, V, H};
            }),
            "(loaded)");
  // gemm_add's addend is exactly the output's m*n (the head GEMM made one, adding act.x).
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                PlanBuilder::StepSpec& step = lm.builder.step(lm.head_gemm_step);
                step.kernel = "gemm_add";
                step.ins.push_back(lm.x);
                step.floats.push_back(1.0);  // beta
              }),
              HasSubstr("step 2 (gemm_add): input 2 'act.x' has 60 elements, expected m*n = 110"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.ce_forward_step).outs[1] = lm.h; }),
              HasSubstr("step 4 (cross_entropy.forward): output 1 'act.h' has 60 elements, "
                        "expected 1"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.step(lm.add_step).ints = {V * H, 7};
              }),
              HasSubstr("step 14 (add): n = 66 is not divisible by rhs_n = 7"));
}

TEST(Validate, IntRanges) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.head_gemm_step).ints[0] = 2; }),
              HasSubstr("step 2 (gemm): int 0 (trans_a) is 2, expected 0 or 1"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.head_gemm_step).ints[2] = 0; }),
              HasSubstr("step 2 (gemm): int 2 (m) is 0, expected a positive size"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).ints[0] = -10; }),
              HasSubstr("int 0 (rows) is -10, expected a positive size"));
  // Extreme values must not overflow while the range is computed.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.step(13).ints[1] = std::numeric_limits<int64_t>::min();
              }),
              HasSubstr("int 1 (vocab) is -9223372036854775808, expected a positive size"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(13).ints[3] = V; }),
              HasSubstr("step 13 (embedding.backward): int 3 (padding_idx) is 11, expected "
                        "-1..vocab-1"));
  // Products of ints that overflow int64 are errors, not wrapped sizes.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.step(lm.norm_step).ints = {int64_t{1} << 40, int64_t{1} << 40};
              }),
              HasSubstr("input 0 'act.x': rows*dim overflows"));
}

TEST(Validate, FloatsMustBeFinite) {
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                lm.builder.step(lm.norm_step).floats[0] = std::numeric_limits<double>::infinity();
              }),
              HasSubstr("step 1 (rms_norm.forward): float 0 (eps) is inf, expected a finite fp32 "
                        "value"));
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).floats[0] = 1e300; }),
              HasSubstr("float 0 (eps) is 1e+300, expected a finite fp32 value"));
}

TEST(Validate, OverlappingInputAndOutput) {
  // rms_norm writing its output over its own input.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.norm_step).outs[0] = lm.x; }),
              HasSubstr("step 1 (rms_norm.forward): output 0 'act.x' overlaps input 0 'act.x' "
                        "(activations arena bytes"));
  // Partial overlap through a second buffer over the same bytes.
  EXPECT_THAT(ErrorAfter([](TinyLm& lm) {
                const Buffer& x = lm.builder.buffer(lm.x);
                lm.builder.buffer(lm.h).offset = x.offset + x.bytes() - 4;
              }),
              HasSubstr("output 0 'act.h' overlaps input 0 'act.x'"));
  // Two outputs of one step sharing bytes.
  EXPECT_THAT(
      ErrorAfter([](TinyLm& lm) { lm.builder.step(lm.ce_forward_step).outs[1] = lm.loss_sum; }),
      HasSubstr("step 4 (cross_entropy.forward): output 1 'act.loss_sum' overlaps output "
                "0 'act.loss_sum'"));
  // Same offsets in different arenas do not overlap.
  EXPECT_EQ(ErrorAfter([](TinyLm& lm) {
              lm.builder.buffer(lm.h).offset = 0;
              lm.builder.buffer(lm.x).offset = 0;
              lm.builder.buffer(lm.x).arena = Arena::Gradients;
            }),
            "(loaded)");
}

// ---------------------------------------------------------------------------------------------
// Kernels with flag-dependent arity and more involved rules, on one-step plans.

struct OneStepPlan {
  PlanBuilder b;
  OneStepPlan() : OneStepPlan(1, std::nullopt) {}
  OneStepPlan(int64_t seq, std::optional<Mesh> mesh) {
    b.set_shape(1, seq);
    if (mesh) b.set_mesh(*mesh);
    b.AllocateInputs();
    b.set_loss(b.Allocate("loss", Arena::Activations, {1}));
  }
  uint32_t Act(std::vector<int64_t> shape, DType dtype = DType::F32) {
    return b.Allocate(absl::StrFormat("t%d", b.num_buffers()), Arena::Activations, std::move(shape),
                      dtype);
  }
  std::string Error() const {
    absl::StatusOr<Plan> plan = ParsePlan(b.FinishUnchecked(), "one.plan");
    return plan.ok() ? "(loaded)" : std::string(plan.status().message());
  }
};

TEST(Validate, CastConvertsEitherWay) {
  for (auto [from, to] : {std::pair{DType::F32, DType::BF16}, std::pair{DType::BF16, DType::F32},
                          std::pair{DType::BF16, DType::BF16}}) {
    OneStepPlan p;
    p.b.AddStep("cast", {p.Act({4, 2}, from)}, {p.Act({4, 2}, to)}, {8});
    EXPECT_EQ(p.Error(), "(loaded)");
  }
  OneStepPlan p;
  p.b.AddStep("cast", {p.Act({4, 2}, DType::BF16)}, {p.Act({4}, DType::F32)}, {8});
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (cast): output 0 't4' has 4 elements, expected n = 8"));
}

TEST(Validate, SsdScanArityFollowsFlags) {
  const int64_t B = 1, S = 4, Hd = 2, P = 3, G = 1, N = 2;
  auto build = [&](int64_t has_init, bool give_init) {
    OneStepPlan p;
    std::vector<uint32_t> ins = {p.Act({B, S, Hd, P}), p.Act({B, S, Hd}),   p.Act({Hd}),
                                 p.Act({B, S, G, N}),  p.Act({B, S, G, N}), p.Act({Hd})};
    if (give_init) ins.push_back(p.Act({B, Hd, P, N}));
    std::vector<uint32_t> outs = {p.Act({B, S, Hd, P}), p.Act({B, Hd, P, N})};
    p.b.AddStep("ssd_scan.forward", ins, outs, {B, S, Hd, P, G, N, 2, has_init, 0, 0});
    return p.Error();
  };
  EXPECT_EQ(build(0, false), "(loaded)");
  EXPECT_EQ(build(1, true), "(loaded)");
  EXPECT_THAT(build(1, false), HasSubstr("step 0 (ssd_scan.forward): takes 7 inputs, got 6"));
  EXPECT_THAT(build(0, true), HasSubstr("takes 6 inputs, got 7"));
  EXPECT_THAT(build(2, true), HasSubstr("int 7 (has_init) is 2, expected 0 or 1"));
}

TEST(Validate, SsdScanBackwardShapes) {
  const int64_t B = 2, S = 4, Hd = 2, P = 3, G = 1, N = 2;
  OneStepPlan p;
  const uint32_t state = p.Act({B, Hd, P, N});
  std::vector<uint32_t> ins = {
      p.Act({B, S, Hd, P}), p.Act({B, S, Hd, P}), p.Act({B, S, Hd}), p.Act({Hd}),
      p.Act({B, S, G, N}),  p.Act({B, S, G, N}),  p.Act({Hd}),       state,
      p.Act({B, Hd, P, N})};
  std::vector<uint32_t> outs = {p.Act({B, S, Hd, P}), p.Act({B, S, Hd}),   p.Act({Hd}),
                                p.Act({B, S, G, N}),  p.Act({B, S, G, N}), p.Act({Hd}),
                                p.Act({B, Hd, P, N})};
  p.b.AddStep("ssd_scan.backward", ins, outs, {B, S, Hd, P, G, N, 4, 1, 1, 0, 0});
  EXPECT_EQ(p.Error(), "(loaded)");
  p.b.step(0).ints[4] = 3;  // groups = 3 does not divide heads = 2
  EXPECT_THAT(p.Error(), HasSubstr("heads = 2 is not divisible by groups = 3"));
  p.b.step(0).ints[4] = 1;
  p.b.step(0).outs[6] = p.Act({B, Hd, P, N + 1});
  EXPECT_THAT(p.Error(), HasSubstr("output 6 't20' has 36 elements, expected "
                                   "batch*heads*head_dim*state = 24"));
}

// The correction's kernels: y (or its gradient), dt, A, C and the state; six shape ints; the
// state and dt are f32 in a bf16 plan too.
TEST(Validate, SsdAddInitialStateShapes) {
  const int64_t B = 2, S = 4, Hd = 2, P = 3, G = 1, N = 2;
  OneStepPlan p;
  const uint32_t y = p.Act({B, S, Hd, P}, DType::BF16), dt = p.Act({B, S, Hd}), A = p.Act({Hd}),
                 Cm = p.Act({B, S, G, N}, DType::BF16), init = p.Act({B, Hd, P, N});
  p.b.AddStep("ssd_add_initial_state.forward", {y, dt, A, Cm, init},
              {p.Act({B, S, Hd, P}, DType::BF16)}, {B, S, Hd, P, G, N, 0});
  p.b.AddStep(
      "ssd_add_initial_state.backward", {y, dt, A, Cm, init},
      {p.Act({B, S, Hd}), p.Act({Hd}), p.Act({B, S, G, N}, DType::BF16), p.Act({B, Hd, P, N})},
      {B, S, Hd, P, G, N, 0});
  EXPECT_EQ(p.Error(), "(loaded)");
  p.b.step(0).ins[4] = p.Act({B, Hd, P, N}, DType::BF16);
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (ssd_add_initial_state.forward): input 4"));
  EXPECT_THAT(p.Error(), HasSubstr("expected f32"));
  p.b.step(0).ins[4] = init;
  p.b.step(1).outs[3] = p.Act({B, Hd, P, N + 1});
  EXPECT_THAT(p.Error(), HasSubstr("step 1 (ssd_add_initial_state.backward): output 3"));
  EXPECT_THAT(p.Error(), HasSubstr("expected batch*heads*head_dim*state = 24"));
  p.b.step(1).outs[3] = p.Act({B, Hd, P, N});
  p.b.step(1).ints.push_back(4);  // a chunk: the correction takes none
  EXPECT_THAT(p.Error(), HasSubstr("step 1 (ssd_add_initial_state.backward): takes 7 ints, got 8"));
}

// The summary's kernels: ssd_scan's shapes without C, D and flags; the state and its gradient
// are f32 in a bf16 plan too.
TEST(Validate, SsdFinalStateShapes) {
  const int64_t B = 2, S = 4, Hd = 2, P = 3, G = 1, N = 2;
  OneStepPlan p;
  const uint32_t x = p.Act({B, S, Hd, P}, DType::BF16), dt = p.Act({B, S, Hd}), A = p.Act({Hd}),
                 Bm = p.Act({B, S, G, N}, DType::BF16);
  p.b.AddStep("ssd_final_state.forward", {x, dt, A, Bm}, {p.Act({B, Hd, P, N})},
              {B, S, Hd, P, G, N, 4, 0});
  const uint32_t dfinal = p.Act({B, Hd, P, N});
  p.b.AddStep("ssd_final_state.backward", {dfinal, x, dt, A, Bm},
              {p.Act({B, S, Hd, P}, DType::BF16), p.Act({B, S, Hd}), p.Act({Hd}),
               p.Act({B, S, G, N}, DType::BF16)},
              {B, S, Hd, P, G, N, 4, 0});
  EXPECT_EQ(p.Error(), "(loaded)");
  p.b.step(0).outs[0] = p.Act({B, Hd, P, N}, DType::BF16);
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (ssd_final_state.forward): output 0 't14' is bf16, "
                                   "expected f32"));
  p.b.step(0).outs[0] = p.Act({B, Hd, P, N});
  p.b.step(1).ins[0] = p.Act({B, Hd, P, N + 1});
  EXPECT_THAT(p.Error(), HasSubstr("step 1 (ssd_final_state.backward): input 0 't16' has 36 "
                                   "elements, expected batch*heads*head_dim*state = 24"));
  p.b.step(1).ins[0] = dfinal;
  p.b.step(1).ints[4] = 3;  // groups = 3 does not divide heads = 2
  EXPECT_THAT(p.Error(), HasSubstr("heads = 2 is not divisible by groups = 3"));
  p.b.step(1).ints[4] = 1;
  p.b.step(1).ints.push_back(0);  // no flags: a step with an eighth int is malformed
  EXPECT_THAT(p.Error(), HasSubstr("step 1 (ssd_final_state.backward): takes 8 ints, got 9"));
}

TEST(Validate, AttentionHeads) {
  OneStepPlan p;
  const int64_t B = 1, S = 3, Hq = 4, Hkv = 3, D = 2;
  p.b.AddStep("attention.forward",
              {p.Act({B, S, Hq, D}), p.Act({B, S, Hkv, D}), p.Act({B, S, Hkv, D})},
              {p.Act({B, S, Hq, D}), p.Act({B, Hq, S})}, {B, S, Hq, Hkv, D, 1, 0}, {0.5});
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (attention.forward): q_heads = 4 is not divisible by "
                                   "kv_heads = 3"));
}

TEST(Validate, MoeRoutingK) {
  OneStepPlan p;
  p.b.AddStep("moe_route.forward", {p.Act({4, 3})}, {p.Act({4, 4}), p.Act({4, 4}, DType::I32)},
              {4, 3, 4});
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (moe_route.forward): int 2 (k) is 4, expected "
                                   "1..experts"));
  p.b.step(0).ints[2] = 2;
  EXPECT_THAT(p.Error(), HasSubstr("output 0 't4' has 16 elements, expected tokens*k = 8"));
}

TEST(Validate, SliceColumnsRange) {
  OneStepPlan p;
  p.b.AddStep("slice_columns", {p.Act({2, 5})}, {p.Act({2, 3})}, {2, 5, 3, 3});
  EXPECT_THAT(p.Error(), HasSubstr("int 2 (offset) is 3, expected 0..in_cols-width"));
  p.b.step(0).ints[2] = 2;
  EXPECT_EQ(p.Error(), "(loaded)");
}

TEST(Validate, FillHasNoInputs) {
  OneStepPlan p;
  p.b.AddStep("fill", {}, {p.Act({3})}, {3}, {0.0});
  EXPECT_EQ(p.Error(), "(loaded)");
  p.b.step(0).ins = {p.Act({3})};
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (fill): takes 0 inputs, got 1"));
}

// ---------------------------------------------------------------------------------------------
// The mesh and the collectives of context parallelism.

TEST(Validate, Mesh) {
  auto error = [](int64_t seq, Mesh mesh) {
    OneStepPlan p(seq, mesh);
    return p.Error();
  };
  EXPECT_EQ(error(8, Mesh{.cp = 2, .dp = 3}), "(loaded)");
  EXPECT_EQ(error(8, Mesh{.cp = 2, .layout = SequenceLayout::Zigzag}), "(loaded)");
  EXPECT_THAT(error(8, Mesh{.cp = 0}), HasSubstr("mesh cp=0 x dp=1: both must be positive"));
  EXPECT_THAT(error(8, Mesh{.cp = 2, .dp = -1}), HasSubstr("mesh cp=2 x dp=-1"));
  EXPECT_THAT(error(8, Mesh{.cp = int64_t{1} << 20, .dp = int64_t{1} << 20}),
              HasSubstr("is more ranks than MPI can number"));
  // The style guide's example: segments, not ranks, must divide the sequence.
  EXPECT_THAT(error(1000, Mesh{.cp = 8, .layout = SequenceLayout::Zigzag}),
              HasSubstr("sequence length 1000 cannot be split into 16 pieces for cp=8 (zigzag "
                        "layout)"));
  EXPECT_THAT(error(6, Mesh{.cp = 4}),
              HasSubstr("sequence length 6 cannot be split into 4 pieces for cp=4"));
}

TEST(Validate, InputsHoldTheRanksTokens) {
  // Inputs sized for the whole sequence on a plan whose ranks hold half of it each.
  PlanBuilder b;
  b.set_shape(2, 8);
  b.AllocateInputs();
  b.set_loss(b.Allocate("loss", Arena::Activations, {1}));
  b.set_mesh(Mesh{.cp = 2});
  absl::StatusOr<Plan> plan = ParsePlan(b.FinishUnchecked(), "cp.plan");
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("input_ids buffer 0 'input_ids' is i32 [16 elements] in the inputs arena, "
                        "expected i32 [micro_batch*seq/cp = 2*8/2 = 8]"));
}

TEST(Validate, ConvHaloFollowsFlag) {
  const int64_t B = 2, S = 5, C = 3, W = 4;
  auto build = [&](int64_t has_halo, bool give_halo, int64_t halo_rows) {
    OneStepPlan p;
    std::vector<uint32_t> ins = {p.Act({B, S, C}), p.Act({C, W}), p.Act({C})};
    if (give_halo) ins.push_back(p.Act({B, halo_rows, C}));
    p.b.AddStep("causal_conv1d.forward", ins, {p.Act({B, S, C})}, {B, S, C, W, has_halo, 0, 0});
    return p.Error();
  };
  EXPECT_EQ(build(0, false, 0), "(loaded)");
  EXPECT_EQ(build(1, true, W - 1), "(loaded)");
  EXPECT_THAT(build(1, false, 0), HasSubstr("takes 4 inputs, got 3"));
  EXPECT_THAT(build(0, true, W - 1), HasSubstr("takes 3 inputs, got 4"));
  EXPECT_THAT(build(1, true, W), HasSubstr("input 3 't7' has 24 elements, expected "
                                           "batch*(width-1)*channels = 18"));
  EXPECT_THAT(build(2, true, W - 1), HasSubstr("int 4 (has_halo) is 2, expected 0 or 1"));
  // The backward's dhalo output comes with the flag too.
  OneStepPlan p;
  p.b.AddStep("causal_conv1d.backward",
              {p.Act({B, S, C}), p.Act({B, S, C}), p.Act({C, W}), p.Act({B, W - 1, C})},
              {p.Act({B, S, C}), p.Act({C, W}), p.Act({C})}, {B, S, C, W, 1, 0, 0});
  EXPECT_THAT(p.Error(), HasSubstr("step 0 (causal_conv1d.backward): takes 4 outputs, got 3"));
  // With silu the backward recomputes the conv: it takes the bias, after the halo.
  auto backward = [&](int64_t has_halo, int64_t silu, bool give_bias) {
    OneStepPlan q;
    std::vector<uint32_t> ins = {q.Act({B, S, C}), q.Act({B, S, C}), q.Act({C, W})};
    std::vector<uint32_t> outs = {q.Act({B, S, C}), q.Act({C, W}), q.Act({C})};
    if (has_halo) {
      ins.push_back(q.Act({B, W - 1, C}));
      outs.push_back(q.Act({B, W - 1, C}));
    }
    if (give_bias) ins.push_back(q.Act({C}));
    q.b.AddStep("causal_conv1d.backward", ins, outs, {B, S, C, W, has_halo, silu, 0});
    return q.Error();
  };
  EXPECT_EQ(backward(0, 1, true), "(loaded)");
  EXPECT_EQ(backward(1, 1, true), "(loaded)");
  EXPECT_THAT(backward(1, 1, false), HasSubstr("takes 5 inputs, got 4"));
  EXPECT_THAT(backward(0, 0, true), HasSubstr("takes 3 inputs, got 4"));
  EXPECT_THAT(backward(0, 2, true), HasSubstr("int 5 (silu) is 2, expected 0 or 1"));
}

TEST(Validate, HaloExchange) {
  // seq 12 on cp=2 zigzag: 4 segments of 3, 2 per rank.
  const Mesh zigzag{.cp = 2, .layout = SequenceLayout::Zigzag};
  const int64_t B = 2, segs = 2, len = 3, C = 4, W = 2;
  auto build = [&](std::vector<int64_t> ints, int64_t out_rows) {
    OneStepPlan p(12, zigzag);
    const uint32_t out = p.Act({B * segs, out_rows, C}), x = p.Act({B * segs, len, C});
    p.b.AddStep("halo_exchange.forward", {x}, {out}, std::move(ints));
    return p.Error();
  };
  EXPECT_EQ(build({B, segs, len, C, W}, W), "(loaded)");
  EXPECT_THAT(build({B, 1, len, C, W}, W),
              HasSubstr("step 0 (halo_exchange.forward): int 1 (segs) is 1, but the plan's zigzag "
                        "layout puts 2 segments on each rank"));
  EXPECT_THAT(build({B * 3, segs, len / 3, C, W}, W),
              HasSubstr("int 2 (len) is 1, but the plan's sequence of 12 tokens in 4 segments "
                        "(cp=2, zigzag) makes segments of 3"));
  EXPECT_THAT(build({B, segs, len, C, 4}, 4), HasSubstr("int 4 (width) is 4, expected 1..len"));
  EXPECT_THAT(build({B, segs, len, C, W}, W + 1),
              HasSubstr("output 0 't4' has 48 elements, expected batch*segs*width*channels = 32"));
}

TEST(Validate, StateScan) {
  const int64_t B = 1, segs = 1, Hd = 2, P = 3, N = 2;
  auto build = [&](int64_t strategy, int64_t segs_int) {
    OneStepPlan p(4, Mesh{.cp = 2});
    p.b.AddStep("state_scan.forward", {p.Act({B * segs, Hd}), p.Act({B * segs, Hd, P, N})},
                {p.Act({B * segs, Hd, P, N})}, {B, segs_int, Hd, P, N, strategy});
    return p.Error();
  };
  EXPECT_EQ(build(0, segs), "(loaded)");
  EXPECT_EQ(build(1, segs), "(loaded)");
  EXPECT_THAT(build(2, segs), HasSubstr("int 5 (strategy) is 2, expected 0..1"));
  EXPECT_THAT(build(0, 2), HasSubstr("int 1 (segs) is 2, but the plan's contiguous layout puts 1 "
                                     "segment on each rank"));
}

TEST(Validate, RingAttentionIsOverTheRanksShare) {
  const int64_t B = 1, Hq = 2, Hkv = 1, D = 2;
  auto build = [&](int64_t seq) {
    OneStepPlan p(8, Mesh{.cp = 2});
    p.b.AddStep("ring_attention.forward",
                {p.Act({B, seq, Hq, D}), p.Act({B, seq, Hkv, D}), p.Act({B, seq, Hkv, D})},
                {p.Act({B, seq, Hq, D}), p.Act({B, Hq, seq})}, {B, seq, Hq, Hkv, D, 1, 0}, {0.5});
    return p.Error();
  };
  EXPECT_EQ(build(4), "(loaded)");
  EXPECT_THAT(build(8), HasSubstr("step 0 (ring_attention.forward): int 1 (seq) is 8, but each "
                                  "rank holds 8 / cp 2 = 4 tokens of the sequence"));
}

TEST(Validate, AllReduceGroup) {
  OneStepPlan p;
  p.b.AddStep("all_reduce", {p.Act({5})}, {p.Act({5})}, {5, 3});
  EXPECT_THAT(p.Error(), HasSubstr("int 1 (group) is 3, expected 0..2 (0 world, 1 cp, 2 dp)"));
  p.b.step(0).ints[1] = 2;
  EXPECT_EQ(p.Error(), "(loaded)");
}

// ---------------------------------------------------------------------------------------------
// Expert parallelism.

TEST(Validate, MeshEp) {
  auto error = [](Mesh mesh) { return OneStepPlan(8, mesh).Error(); };
  EXPECT_EQ(error(Mesh{.cp = 2, .dp = 2, .ep = 4}), "(loaded)");
  EXPECT_EQ(error(Mesh{.cp = 1, .dp = 4, .ep = 2}), "(loaded)");
  EXPECT_THAT(error(Mesh{.cp = 2, .dp = 2, .ep = 3}),
              HasSubstr("mesh ep=3 must be positive and divide the cp*dp = 4 ranks"));
  EXPECT_THAT(error(Mesh{.cp = 2, .ep = 0}), HasSubstr("mesh ep=0 must be positive"));
}

TEST(Validate, ShardedParameters) {
  // Two ranks splitting 4 experts: this rank's [2, 3] of a [4, 3] checkpoint tensor.
  auto build = [](const std::function<void(PlanBuilder&)>& edit) {
    OneStepPlan p(8, Mesh{.cp = 2, .ep = 2});
    p.b.AddParameter("norm", {3}, ParamInit::Ones);
    p.b.AddShardedParameter("experts", {4, 3}, 2, ParamInit::Normal, 0.1);
    edit(p.b);
    return p.Error();
  };
  EXPECT_EQ(build([](PlanBuilder&) {}), "(loaded)");
  EXPECT_THAT(build([](PlanBuilder& b) { b.parameter(1).shards = 4; }),
              HasSubstr("parameter 1 'experts' is split into 4 shards, but the mesh has ep=2"));
  EXPECT_THAT(build([](PlanBuilder& b) {
                b.parameter(1).full_shape = {6, 3};
              }),
              HasSubstr("parameter 1 'experts': value buffer 6 'experts' has shape [2, 3], but 2 "
                        "shards of checkpoint shape [6, 3] are [3, 3]"));
  EXPECT_THAT(build([](PlanBuilder& b) {
                b.parameter(1).full_shape = {5, 3};
              }),
              HasSubstr("5 rows of its checkpoint shape [5, 3] cannot be split into 2 shards"));
  EXPECT_THAT(build([](PlanBuilder& b) { b.parameter(1).full_shape.clear(); }),
              HasSubstr("is split into 2 shards but has no checkpoint shape"));
  EXPECT_THAT(build([](PlanBuilder& b) { b.parameter(1).shards = 0; }),
              HasSubstr("has 0 shards, expected at least 1"));
  // A replicated parameter's checkpoint shape is its buffer's.
  EXPECT_THAT(build([](PlanBuilder& b) { b.parameter(0).full_shape = {4}; }),
              HasSubstr("value buffer 4 'norm' has shape [3], but 1 shard of checkpoint shape [4] "
                        "is [4]"));
}

TEST(Validate, ShardedGradientsComeLast) {
  OneStepPlan p(8, Mesh{.cp = 2, .ep = 2});
  p.b.AddShardedParameter("experts", {4, 3}, 2, ParamInit::Normal, 0.1);
  p.b.AddParameter("norm", {3}, ParamInit::Ones);
  EXPECT_THAT(p.Error(), HasSubstr("parameter 1 'norm': its gradient buffer 7 'norm.grad' ends at "
                                   "byte 76, after the sharded parameters' gradients start (byte "
                                   "0): replicated gradients must come first"));
}

TEST(Validate, MoeExpertsEp) {
  // 4 tokens of hidden 3, top 2 of 4 experts over ep = 2: 2 experts of width 2 on this rank.
  const int64_t T = 4, Hd = 3, I = 2, E = 4, K = 2;
  auto build = [&](int64_t ep_int, int64_t local_experts, int64_t experts_int) {
    OneStepPlan p(8, Mesh{.cp = 2, .ep = 2});
    p.b.AddStep("moe_experts_ep.forward",
                {p.Act({T, Hd}), p.Act({T, K}), p.Act({T, K}, DType::I32),
                 p.Act({local_experts, 2 * I, Hd}), p.Act({local_experts, Hd, I})},
                {p.Act({T, Hd})}, {T, Hd, I, experts_int, K, ep_int});
    return p.Error();
  };
  EXPECT_EQ(build(2, 2, E), "(loaded)");
  EXPECT_THAT(build(4, 1, E), HasSubstr("step 0 (moe_experts_ep.forward): int 5 (ep) is 4, but "
                                        "the plan's mesh has ep=2"));
  EXPECT_THAT(build(2, 2, 5), HasSubstr("5 experts cannot be split over ep=2 ranks"));
  // The weights are this rank's experts only.
  EXPECT_THAT(build(2, 4, E),
              HasSubstr("input 3 't8' has 48 elements, expected experts/ep*2*inner*hidden "
                        "= 24"));
}

TEST(Validate, MoeExpertsKeptHFollowsFlag) {
  // 4 tokens of hidden 3, top 2 of 4 experts of width 2: the kept h is [4, 2, 2*2].
  const int64_t T = 4, Hd = 3, I = 2, E = 4, K = 2;
  auto forward = [&](int64_t keep_h, int64_t kept_elements) {
    OneStepPlan p;
    std::vector<uint32_t> outs = {p.Act({T, Hd})};
    if (kept_elements > 0) outs.push_back(p.Act({kept_elements}));
    p.b.AddStep("moe_experts.forward",
                {p.Act({T, Hd}), p.Act({T, K}), p.Act({T, K}, DType::I32), p.Act({E, 2 * I, Hd}),
                 p.Act({E, Hd, I})},
                outs, {T, Hd, I, E, K, keep_h});
    return p.Error();
  };
  EXPECT_EQ(forward(0, 0), "(loaded)");
  EXPECT_EQ(forward(1, T * K * 2 * I), "(loaded)");
  EXPECT_THAT(forward(1, 0), HasSubstr("step 0 (moe_experts.forward): takes 2 outputs, got 1"));
  EXPECT_THAT(forward(0, T * K * 2 * I), HasSubstr("takes 1 outputs, got 2"));
  EXPECT_THAT(forward(1, T * 2 * I), HasSubstr("has 16 elements, expected tokens*k*2*inner = 32"));
  EXPECT_THAT(forward(2, T * K * 2 * I), HasSubstr("int 5 (keep_h) is 2, expected 0 or 1"));
  // The backward reads it after w_out.
  auto backward = [&](int64_t keep_h, bool give_kept) {
    OneStepPlan p;
    std::vector<uint32_t> ins = {p.Act({T, Hd}),        p.Act({T, Hd}),
                                 p.Act({T, K}),         p.Act({T, K}, DType::I32),
                                 p.Act({E, 2 * I, Hd}), p.Act({E, Hd, I})};
    if (give_kept) ins.push_back(p.Act({T, K, 2 * I}));
    p.b.AddStep("moe_experts.backward", ins,
                {p.Act({T, Hd}), p.Act({T, K}), p.Act({E, 2 * I, Hd}), p.Act({E, Hd, I})},
                {T, Hd, I, E, K, keep_h}, {1.0});
    return p.Error();
  };
  EXPECT_EQ(backward(1, true), "(loaded)");
  EXPECT_THAT(backward(1, false), HasSubstr("takes 7 inputs, got 6"));
  EXPECT_THAT(backward(0, true), HasSubstr("takes 6 inputs, got 7"));
}

TEST(Validate, PlanBuiltInMemoryIsCheckedToo) {
  TinyLm lm;
  absl::StatusOr<Plan> plan = ParsePlan(lm.Bytes(), "tiny");
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(ValidatePlan(*plan).ok());
  plan->steps[1].kernel = KernelId(200);
  EXPECT_THAT(std::string(ValidatePlan(*plan).message()),
              HasSubstr("step 1 (kernel id 200) is unknown"));
}

}  // namespace
}  // namespace hcp::plan
