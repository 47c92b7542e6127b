// Corruption and mutation fuzzing of loading and validation:
//   - damage: every single-bit change of a small plan file, and every byte set to 0x00, 0xFF or
//     its complement, is refused (the checksum; the magic for its own bytes), exhaustively;
//   - bytes: random byte changes and truncations of a valid plan file, refused by the checksum
//     and then, resealed as a faulty writer would, by the header checks and the FlatBuffers
//     verifier;
//   - structure: random edits of a valid plan's ints, buffer indices, offsets, shapes, dtypes,
//     arena sizes, kernel names and mesh, written as a well-formed file, over a plan that uses
//     every kernel of the table (these reach the semantic checks of every kernel).
// Either way a mutated plan loads or fails with a message, and a plan that loads runs without
// crashing (an execution error such as a bad token id is fine); a plan for several ranks is
// refused by a one-rank executor. CI runs this under ASan + UBSan,
// where "without crashing" also means no out-of-bounds access and no undefined behaviour in
// loading, validation or any kernel: whatever validation accepts, the kernels must survive.
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"
#include "tests/unit/plan/TinyLm.h"

namespace hcp::plan {
namespace {

using hcp::testing::Reseal;
using hcp::testing::TinyLm;

// 3000 per test by default; HCP_FUZZ_MUTATIONS and HCP_FUZZ_SEED run longer or other
// campaigns by hand.
int NumMutations() {
  const char* env = std::getenv("HCP_FUZZ_MUTATIONS");
  return env ? std::atoi(env) : 3000;
}
uint64_t Seed(uint64_t fallback) {
  const char* env = std::getenv("HCP_FUZZ_SEED");
  return env ? std::strtoull(env, nullptr, 10) : fallback;
}
// Plans whose arenas grew past this by mutation are validated but not executed: allocating and
// poisoning gigabytes would only test the machine.
constexpr uint64_t kMaxExecutedArenaBytes = 64ull << 20;

struct Counts {
  int loaded = 0, executed = 0, ran_to_end = 0;
};

// Loads `bytes`; if that works, runs the plan once on token ids and targets within `vocab`.
void LoadAndMaybeRun(const std::string& bytes, int64_t vocab, int mutation, Counts& counts) {
  absl::StatusOr<Plan> plan = ParsePlan(bytes, "mutated");
  if (!plan.ok()) {
    EXPECT_FALSE(plan.status().message().empty());
    return;
  }
  ++counts.loaded;
  ASSERT_TRUE(ValidatePlan(*plan).ok()) << "mutation " << mutation;
  if (plan->mesh.world() != 1) {
    // A plan for several ranks: one rank alone must refuse it, cleanly.
    absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CpuExecutor::Create(*plan);
    ASSERT_FALSE(exec.ok()) << "mutation " << mutation;
    EXPECT_NE(exec.status().message().find("the communicator has cp=1 x dp=1"), std::string::npos)
        << exec.status();
    return;
  }
  if (plan->total_arena_bytes() > kMaxExecutedArenaBytes) return;
  // A valid mixed-precision plan (a buffer mutated to bf16): the CPU backend refuses it, cleanly.
  for (const plan::Buffer& b : plan->buffers) {
    if (b.dtype == DType::BF16) {
      absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CpuExecutor::Create(*plan);
      ASSERT_FALSE(exec.ok()) << "mutation " << mutation;
      EXPECT_NE(exec.status().message().find("the CPU backend runs f32 plans"), std::string::npos)
          << exec.status();
      return;
    }
  }

  absl::StatusOr<std::unique_ptr<CpuExecutor>> exec =
      CpuExecutor::Create(*plan, CpuExecutor::Options{.poison_activations = true});
  ASSERT_TRUE(exec.ok()) << "mutation " << mutation << ": " << exec.status();
  EXPECT_TRUE((*exec)->InitializeParameters(7).ok());
  // The token count may have been mutated too: feed what the plan asks for.
  std::vector<int32_t> ids(plan->tokens()), targets(plan->tokens());
  for (size_t t = 0; t < ids.size(); ++t) {
    ids[t] = static_cast<int32_t>(t % vocab);
    targets[t] = t % 5 == 4 ? -100 : static_cast<int32_t>((t * 3 + 1) % vocab);
  }
  ASSERT_TRUE((*exec)->SetInputs(ids, targets).ok());
  ++counts.executed;
  if ((*exec)->RunStep().ok()) ++counts.ran_to_end;
}

// Whether `bytes`, a damaged copy of a plan, is refused as such: for the magic's bytes as not a
// plan, anywhere else as damaged. Returns the message when it is not.
std::optional<std::string> NotRefusedAsDamaged(const std::string& bytes, size_t changed_at) {
  absl::StatusOr<Plan> plan = ParsePlan(bytes, "damaged");
  if (plan.ok()) return "loaded";
  const std::string expected = changed_at < sizeof(kPlanMagic)
                                   ? "damaged: not a hybridcp plan (bad magic)"
                                   : "damaged: checksum mismatch: the plan is damaged (";
  const std::string message(plan.status().message());
  if (message.rfind(expected, 0) == 0) return std::nullopt;
  return message;
}

TEST(PlanFuzz, EverySingleBitChangeIsRefused) {
  const std::string original = TinyLm().Bytes();
  int wrong = 0;
  for (size_t bit = 0; bit < original.size() * 8; ++bit) {
    std::string bytes = original;
    bytes[bit / 8] ^= static_cast<char>(1u << (bit % 8));
    if (std::optional<std::string> error = NotRefusedAsDamaged(bytes, bit / 8)) {
      if (++wrong <= 10) ADD_FAILURE() << "bit " << bit << " (byte " << bit / 8 << "): " << *error;
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << original.size() * 8 << " bits";
}

TEST(PlanFuzz, EveryByteSetToAnExtremeOrItsComplementIsRefused) {
  const std::string original = TinyLm().Bytes();
  int wrong = 0;
  for (size_t at = 0; at < original.size(); ++at) {
    for (const char value : {'\x00', '\xFF', static_cast<char>(~original[at])}) {
      if (value == original[at]) continue;
      std::string bytes = original;
      bytes[at] = value;
      if (std::optional<std::string> error = NotRefusedAsDamaged(bytes, at)) {
        if (++wrong <= 10) ADD_FAILURE() << "byte " << at << ": " << *error;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(PlanFuzz, ByteMutationsLoadOrFailCleanly) {
  const std::string original = TinyLm().Bytes();
  std::mt19937_64 rng(Seed(20261129));
  const int kMutations = NumMutations();
  Counts counts;
  for (int m = 0; m < kMutations; ++m) {
    std::string bytes = original;
    // Mostly a few bytes changed, sometimes a truncation as well; flips in the header are as
    // likely as anywhere (and are caught there).
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;  // any byte
        case 1:
          bytes[at] ^= static_cast<char>(1u << (rng() % 8));
          break;  // one bit
        case 2:
          bytes[at] = static_cast<char>(rng() % 2 ? 0x00 : 0xFF);
          break;  // extremes
      }
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    if (bytes != original) {
      EXPECT_FALSE(ParsePlan(bytes, "mutated").ok()) << "mutation " << m;
    }
    // Behind a correct checksum, the change reaches the checks that follow it.
    Reseal(bytes);
    LoadAndMaybeRun(bytes, TinyLm::kVocab, m, counts);
    if (HasFatalFailure()) return;
  }
  // Most mutations must be refused, but the loader should not be refusing everything either.
  EXPECT_GT(counts.loaded, 0);
  EXPECT_LT(counts.loaded, kMutations / 2);
  std::printf("byte mutations: %d of %d loaded, %d executed, %d ran to the end\n", counts.loaded,
              kMutations, counts.executed, counts.ran_to_end);
}

// ---------------------------------------------------------------------------------------------
// A valid plan with one step of every kernel (small sizes). Every f32 input is a parameter, so
// it holds Normal values; i32 inputs are the token ids, the targets, and the expert indices
// that moe_route.forward writes.
constexpr int64_t kVocab = 5;

PlanBuilder EveryKernelPlan() {
  const int64_t T = 4, V = kVocab, H = 4;
  PlanBuilder b;
  b.set_model("every-kernel").set_shape(1, T);
  auto [ids, targets, loss_scale] = b.AllocateInputs();
  int counter = 0;
  auto P = [&](std::vector<int64_t> shape) {
    return b
        .AddParameter(absl::StrFormat("p%d", counter++), std::move(shape), ParamInit::Normal, 0.5)
        .value;
  };
  auto A = [&](std::vector<int64_t> shape, DType dtype = DType::F32) {
    return b.Allocate(absl::StrFormat("act.%d", counter++), Arena::Activations, std::move(shape),
                      dtype);
  };
  const uint32_t x = P({T, H}), dy = P({T, H}), w = P({H});
  b.AddStep("gemm", {P({3, 4}), P({4, 2})}, {A({3, 2})}, {0, 0, 3, 2, 4}, {1.0});
  b.AddStep("gemm", {P({4, 3}), P({2, 4})}, {A({3, 2})}, {1, 1, 3, 2, 4}, {0.5});
  b.AddStep("gemm_add", {P({3, 4}), P({4, 2}), P({3, 2})}, {A({3, 2})}, {0, 0, 3, 2, 4},
            {0.5, 1.0});
  const uint32_t table = P({V, H});
  b.AddStep("embedding.forward", {table, ids}, {A({T, H})}, {T, V, H}, {2.0});
  b.AddStep("embedding.backward", {dy, ids}, {A({V, H})}, {T, V, H, 0}, {2.0});
  b.AddStep("rms_norm.forward", {x, w}, {A({T, H})}, {T, H}, {1e-5});
  b.AddStep("rms_norm.backward", {dy, x, w}, {A({T, H}), A({H})}, {T, H, 0}, {1e-5});
  const uint32_t z = P({T, H});
  b.AddStep("gated_rms_norm.forward", {x, z, w}, {A({T, H})}, {T, H}, {1e-5});
  b.AddStep("gated_rms_norm.backward", {dy, x, z, w}, {A({T, H}), A({T, H}), A({H})}, {T, H},
            {1e-5});
  for (const char* op : {"silu", "softplus", "neg_exp"}) {
    b.AddStep(absl::StrFormat("%s.forward", op), {x}, {A({T, H})}, {T * H});
    b.AddStep(absl::StrFormat("%s.backward", op), {dy, x}, {A({T, H})}, {T * H});
  }
  b.AddStep("swiglu.forward", {x}, {A({T, 2})}, {T, 2});
  b.AddStep("swiglu.backward", {P({T, 2}), x}, {A({T, H})}, {T, 2});
  b.AddStep("scale", {x}, {A({T, H})}, {T * H}, {0.5});
  for (const char* op : {"add", "mul", "div"}) b.AddStep(op, {x, w}, {A({T, H})}, {T * H, H});
  b.AddStep("sum_leading", {x}, {A({H})}, {T, H});
  b.AddStep("fill", {}, {A({3})}, {3}, {2.0});
  b.AddStep("slice_columns", {x}, {A({T, 2})}, {T, H, 1, 2});
  b.AddStep("insert_columns", {P({T, 2})}, {A({T, H})}, {T, H, 2, 2});
  b.AddStep("copy", {x}, {A({T, H})}, {T * H});
  b.AddStep("cast", {x}, {A({T, H})}, {T * H});
  const uint32_t conv_w = P({H, 3}), halo = P({1, 2, H});
  b.AddStep("causal_conv1d.forward", {x, conv_w, w}, {A({1, T, H})}, {1, T, H, 3, 0, 0, 0});
  b.AddStep("causal_conv1d.backward", {dy, x, conv_w}, {A({1, T, H}), A({H, 3}), A({H})},
            {1, T, H, 3, 0, 0, 0});
  b.AddStep("causal_conv1d.forward", {x, conv_w, w, halo}, {A({1, T, H})}, {1, T, H, 3, 1, 0, 0});
  b.AddStep("causal_conv1d.backward", {dy, x, conv_w, halo},
            {A({1, T, H}), A({H, 3}), A({H}), A({1, 2, H})}, {1, T, H, 3, 1, 0, 0});
  // With the SiLU folded in: the backward takes the bias too (after the halo).
  b.AddStep("causal_conv1d.forward", {x, conv_w, w}, {A({1, T, H})}, {1, T, H, 3, 0, 1, 0});
  b.AddStep("causal_conv1d.backward", {dy, x, conv_w, halo, w},
            {A({1, T, H}), A({H, 3}), A({H}), A({1, 2, H})}, {1, T, H, 3, 1, 1, 0});
  // SSD: batch 1, seq T, 2 heads of dim 2, 1 group, state 2, chunk 3.
  const uint32_t sx = P({1, T, 2, 2}), sdt = P({1, T, 2}), sa = P({2}), sb = P({1, T, 1, 2}),
                 sc = P({1, T, 1, 2}), sd = P({2}), sinit = P({1, 2, 2, 2});
  // The first scan keeps its chunk states (2 chunks of 3 over T = 4) for its backward.
  const uint32_t chunk_states = A({1, 2, 2, 2, 2});
  b.AddStep("ssd_scan.forward", {sx, sdt, sa, sb, sc, sd, sinit},
            {A({1, T, 2, 2}), A({1, 2, 2, 2}), chunk_states}, {1, T, 2, 2, 1, 2, 3, 1, 0, 1});
  b.AddStep("ssd_scan.backward",
            {P({1, T, 2, 2}), sx, sdt, sa, sb, sc, sd, sinit, P({1, 2, 2, 2}), chunk_states},
            {A({1, T, 2, 2}), A({1, T, 2}), A({2}), A({1, T, 1, 2}), A({1, T, 1, 2}), A({2}),
             A({1, 2, 2, 2})},
            {1, T, 2, 2, 1, 2, 3, 1, 1, 0, 1});
  b.AddStep("ssd_scan.forward", {sx, sdt, sa, sb, sc, sd}, {A({1, T, 2, 2}), A({1, 2, 2, 2})},
            {1, T, 2, 2, 1, 2, 8, 0, 0, 0});
  b.AddStep("ssd_final_state.forward", {sx, sdt, sa, sb}, {A({1, 2, 2, 2})},
            {1, T, 2, 2, 1, 2, 3, 0});
  b.AddStep("ssd_final_state.backward", {P({1, 2, 2, 2}), sx, sdt, sa, sb},
            {A({1, T, 2, 2}), A({1, T, 2}), A({2}), A({1, T, 1, 2})}, {1, T, 2, 2, 1, 2, 3, 0});
  b.AddStep("ssd_add_initial_state.forward", {A({1, T, 2, 2}), sdt, sa, sc, P({1, 2, 2, 2})},
            {A({1, T, 2, 2})}, {1, T, 2, 2, 1, 2, 0});
  b.AddStep("ssd_add_initial_state.backward", {A({1, T, 2, 2}), sdt, sa, sc, P({1, 2, 2, 2})},
            {A({1, T, 2}), A({2}), A({1, T, 1, 2}), A({1, 2, 2, 2})}, {1, T, 2, 2, 1, 2, 0});
  b.AddStep("ssd_log_decay.forward", {sdt, sa}, {A({1, 2})}, {1, T, 2, 0});
  b.AddStep("ssd_log_decay.backward", {P({1, 2}), sdt, sa}, {A({1, T, 2}), A({2})}, {1, T, 2});
  // The collectives, on the one rank of a plan without mesh (one segment of T tokens).
  b.AddStep("halo_exchange.forward", {x}, {A({1, 2, H})}, {1, 1, T, H, 2});
  b.AddStep("halo_exchange.backward", {halo}, {A({1, T, H})}, {1, 1, T, H, 2});
  const uint32_t g = P({1, 2}), state = P({1, 2, 2, 2});
  for (int64_t strategy : {0, 1}) {
    b.AddStep("state_scan.forward", {g, state}, {A({1, 2, 2, 2})}, {1, 1, 2, 2, 2, strategy});
    b.AddStep("state_scan.backward", {P({1, 2, 2, 2}), g, state}, {A({1, 2}), A({1, 2, 2, 2})},
              {1, 1, 2, 2, 2, strategy});
  }
  for (int64_t group : {0, 1, 2}) b.AddStep("all_reduce", {x}, {A({T, H})}, {T * H, group});
  // Attention: 2 query heads over 1 kv head of dim 2.
  const uint32_t q = P({1, T, 2, 2}), k = P({1, T, 1, 2}), v = P({1, T, 1, 2});
  const uint32_t att_out = A({1, T, 2, 2}), lse = A({1, 2, T});
  b.AddStep("attention.forward", {q, k, v}, {att_out, lse}, {1, T, 2, 1, 2, 1, 0}, {0.7});
  b.AddStep("attention.backward", {P({1, T, 2, 2}), q, k, v, att_out, lse},
            {A({1, T, 2, 2}), A({1, T, 1, 2}), A({1, T, 1, 2})}, {1, T, 2, 1, 2, 1, 0}, {0.7});
  const uint32_t ring_out = A({1, T, 2, 2}), ring_lse = A({1, 2, T});
  b.AddStep("ring_attention.forward", {q, k, v}, {ring_out, ring_lse}, {1, T, 2, 1, 2, 1, 0},
            {0.7});
  b.AddStep("ring_attention.backward", {P({1, T, 2, 2}), q, k, v, ring_out, ring_lse},
            {A({1, T, 2, 2}), A({1, T, 1, 2}), A({1, T, 1, 2})}, {1, T, 2, 1, 2, 1, 0}, {0.7});
  // MoE: 3 experts, top 2, inner 2.
  const uint32_t gates = A({T, 2}), experts = A({T, 2}, DType::I32);
  b.AddStep("moe_route.forward", {P({T, 3})}, {gates, experts}, {T, 3, 2});
  b.AddStep("moe_route.backward", {P({T, 2}), gates, experts}, {A({T, 3})}, {T, 3, 2});
  const uint32_t w_in = P({3, 4, H}), w_out = P({3, H, 2});
  b.AddStep("moe_experts.forward", {x, gates, experts, w_in, w_out}, {A({T, H})},
            {T, H, 2, 3, 2, 0});
  b.AddStep("moe_experts.backward", {dy, x, gates, experts, w_in, w_out},
            {A({T, H}), A({T, 2}), A({3, 4, H}), A({3, H, 2})}, {T, H, 2, 3, 2, 0}, {0.5});
  // The same with the experts' first product kept for the backward.
  const uint32_t kept_h = A({T, 2, 4});
  b.AddStep("moe_experts.forward", {x, gates, experts, w_in, w_out}, {A({T, H}), kept_h},
            {T, H, 2, 3, 2, 1});
  b.AddStep("moe_experts.backward", {dy, x, gates, experts, w_in, w_out, kept_h},
            {A({T, H}), A({T, 2}), A({3, 4, H}), A({3, H, 2})}, {T, H, 2, 3, 2, 1}, {1.0});
  // Expert parallelism on the one rank of a plan without mesh (ep = 1: all 3 experts here).
  b.AddStep("moe_experts_ep.forward", {x, gates, experts, w_in, w_out}, {A({T, H})},
            {T, H, 2, 3, 2, 1});
  b.AddStep("moe_experts_ep.backward", {dy, x, gates, experts, w_in, w_out},
            {A({T, H}), A({T, 2}), A({3, 4, H}), A({3, H, 2})}, {T, H, 2, 3, 2, 1});
  // The load-balancing loss (3 experts, top 2).
  const uint32_t probs = A({3}), picks = A({3});
  b.AddStep("router_load.forward", {P({T, 3}), experts}, {probs, picks}, {T, 3, 2});
  b.AddStep("router_load.backward", {A({3}), P({T, 3})}, {A({T, 3})}, {T, 3});
  b.AddStep("router_aux_loss.forward", {probs, picks}, {A({1})}, {3}, {0.25});
  b.AddStep("router_aux_loss.backward", {P({1}), picks}, {A({3})}, {3}, {0.25});
  // The loss.
  const uint32_t logits = P({T, V}), loss_sum = A({1}), count = A({1}), loss = A({1});
  b.AddStep("cross_entropy.forward", {logits, targets}, {loss_sum, count}, {T, V, -100});
  b.AddStep("cross_entropy.backward", {P({1}), logits, targets}, {A({T, V})}, {T, V, -100});
  b.AddStep("div", {loss_sum, count}, {loss}, {1, 1});
  b.set_loss(loss);
  return b;
}

TEST(PlanFuzz, EveryKernelPlanIsValidAndRuns) {
  PlanBuilder b = EveryKernelPlan();
  absl::StatusOr<std::string> bytes = b.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // Every kernel of the table appears.
  absl::StatusOr<Plan> plan = ParsePlan(*bytes, "every-kernel");
  ASSERT_TRUE(plan.ok());
  std::vector<bool> seen(kNumKernels);
  for (const Step& step : plan->steps) seen[static_cast<int>(step.kernel)] = true;
  for (int i = 0; i < kNumKernels; ++i) EXPECT_TRUE(seen[i]) << KernelName(KernelId(i));
  Counts counts;
  LoadAndMaybeRun(*bytes, kVocab, -1, counts);
  EXPECT_EQ(counts.ran_to_end, 1);
}

// A value an int argument might be mutated to: small, boundary, derived from the old value, or
// extreme.
int64_t InterestingInt(std::mt19937_64& rng, int64_t old) {
  // Wrapping arithmetic: the old value may already be extreme.
  const auto u = static_cast<uint64_t>(old);
  const int64_t choices[] = {0,
                             -1,
                             1,
                             static_cast<int64_t>(u + 1),
                             static_cast<int64_t>(u - 1),
                             static_cast<int64_t>(u * 2),
                             old / 2,
                             std::numeric_limits<int64_t>::max(),
                             std::numeric_limits<int64_t>::min(),
                             static_cast<int64_t>(rng() % 64)};
  return choices[rng() % std::size(choices)];
}

void MutateStructure(PlanBuilder& b, std::mt19937_64& rng) {
  const size_t num_steps = b.num_steps();
  const uint32_t num_buffers = static_cast<uint32_t>(b.num_buffers());
  PlanBuilder::StepSpec& step = b.step(rng() % num_steps);
  Buffer& buffer = b.buffer(static_cast<uint32_t>(rng() % num_buffers));
  switch (rng() % 11) {
    case 0:
    case 1:  // an int argument
      if (!step.ints.empty()) {
        int64_t& value = step.ints[rng() % step.ints.size()];
        value = InterestingInt(rng, value);
      }
      break;
    case 2: {  // a buffer argument pointing elsewhere (or nowhere)
      std::vector<uint32_t>& list = rng() % 2 ? step.ins : step.outs;
      if (!list.empty())
        list[rng() % list.size()] = static_cast<uint32_t>(rng() % (num_buffers + 2));
      break;
    }
    case 3:  // one argument too many or too few
      if (rng() % 2) {
        step.ins.push_back(static_cast<uint32_t>(rng() % num_buffers));
      } else if (!step.outs.empty()) {
        step.outs.pop_back();
      }
      break;
    case 4:  // another kernel with the same arguments
      step.kernel = std::string(KernelName(KernelId(rng() % kNumKernels)));
      break;
    case 5:  // a buffer moved
      buffer.offset = rng() % 2 ? buffer.offset + 4 * (rng() % 64) : (rng() % 256) * 4;
      break;
    case 6: {  // a buffer resized consistently (shape and elements agree)
      if (!buffer.shape.empty()) {
        int64_t& dim = buffer.shape[rng() % buffer.shape.size()];
        dim = rng() % 2 ? dim + 1 : std::max<int64_t>(dim - 1, 0);
        buffer.elements = 1;
        for (int64_t d : buffer.shape) buffer.elements *= static_cast<uint64_t>(d);
      }
      break;
    }
    case 7:  // another dtype
      buffer.dtype = DType(rng() % kNumDTypes);
      break;
    case 8:  // an arena cut short
      b.SetArenaBytes(Arena(rng() % kNumArenas),
                      b.arena_bytes(Arena(rng() % kNumArenas)) / (1 + rng() % 4));
      break;
    case 9:  // a scalar argument
      if (!step.floats.empty()) {
        const double choices[] = {0.0, -1.0, 1e30, 1e-30, 3.5e38, -2.0};
        step.floats[rng() % step.floats.size()] = choices[rng() % 6];
      }
      break;
    case 10: {  // another mesh (or none)
      if (rng() % 4 == 0) {
        b.clear_mesh();
        break;
      }
      const int64_t sizes[] = {1, 1, 2, 3, 0, -1, int64_t{1} << 40};
      b.set_mesh(Mesh{.cp = sizes[rng() % std::size(sizes)],
                      .dp = sizes[rng() % std::size(sizes)],
                      .layout = SequenceLayout(rng() % kNumSequenceLayouts),
                      .ep = sizes[rng() % std::size(sizes)]});
      break;
    }
  }
}

TEST(PlanFuzz, StructuralMutationsLoadOrFailCleanly) {
  const PlanBuilder original = EveryKernelPlan();
  std::mt19937_64 rng(Seed(7));
  const int kMutations = NumMutations();
  Counts counts;
  for (int m = 0; m < kMutations; ++m) {
    PlanBuilder b = original;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) MutateStructure(b, rng);
    LoadAndMaybeRun(b.FinishUnchecked(), kVocab, m, counts);
    if (HasFatalFailure()) return;
  }
  // Many edits are harmless (an offset into free space, a smaller gemm, another scalar), most
  // are not: both outcomes must occur in numbers.
  EXPECT_GT(counts.loaded, kMutations / 20);
  EXPECT_LT(counts.loaded, kMutations * 3 / 4);
  std::printf("structural mutations: %d of %d loaded, %d executed, %d ran to the end\n",
              counts.loaded, kMutations, counts.executed, counts.ran_to_end);
}

}  // namespace
}  // namespace hcp::plan
