// CpuExecutor on the hand-built TinyLm plan: loss and gradients against the reference kernels
// composed directly (in double) and against finite differences of the executor's own loss;
// parameter initialisation and checkpoint loading; input and runtime errors.
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/exec/RankInputs.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/DType.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Init.h"
#include "tests/unit/plan/TinyLm.h"

namespace hcp {
namespace {

using hcp::testing::TinyLm;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr int64_t T = TinyLm::kTokens, V = TinyLm::kVocab, H = TinyLm::kHidden;

plan::Plan LoadTinyLm(const TinyLm& lm = TinyLm()) {
  absl::StatusOr<plan::Plan> plan = plan::ParsePlan(lm.Bytes(), "tiny");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

std::unique_ptr<CpuExecutor> MakeExecutor(const plan::Plan& plan) {
  CpuExecutor::Options options;
  options.poison_activations = true;
  absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CpuExecutor::Create(plan, options);
  EXPECT_TRUE(exec.ok()) << exec.status();
  return *std::move(exec);
}

// Token ids and targets for TinyLm, one target ignored.
struct Batch {
  std::vector<int32_t> ids, targets;
  Batch() {
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(static_cast<int32_t>((t * 7 + 3) % V));
      targets.push_back(static_cast<int32_t>((t * 5 + 1) % V));
    }
    targets[4] = static_cast<int32_t>(TinyLm::kIgnoreIndex);
  }
};

std::vector<float> Copy(std::span<const float> s) { return {s.begin(), s.end()}; }

// A directory removed with everything in it at the end of the test.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hcp_exec_XXXXXX").string();
    EXPECT_NE(mkdtemp(pattern.data()), nullptr);
    path = pattern;
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

// The TinyLm step written out with the reference kernels in double: the oracle.
struct Reference {
  double loss;
  std::vector<double> dtable, dnorm;
};

Reference ComputeReference(const std::vector<float>& table_f, const std::vector<float>& norm_f,
                           const Batch& batch) {
  using std::vector;
  const vector<double> table(table_f.begin(), table_f.end()), norm(norm_f.begin(), norm_f.end());
  vector<double> x(T * H), h(T * H), rstd(T), logits_raw(T * V), logits(T * V), lse(T);
  EXPECT_TRUE(cpu::embedding_forward<double>(x.data(), batch.ids.data(), table.data(), T, V, H,
                                             TinyLm::kEmbeddingMultiplier)
                  .ok());
  cpu::rms_norm_forward<double>(h.data(), rstd.data(), x.data(), norm.data(), T, H, TinyLm::kEps);
  cpu::gemm<double>(false, true, T, V, H, 1.0, h.data(), H, table.data(), H, 0.0, logits_raw.data(),
                    V);
  cpu::scale<double>(logits.data(), logits_raw.data(), TinyLm::kLogitScale, T * V);
  double loss_sum = 0, count = 0;
  EXPECT_TRUE(cpu::cross_entropy_forward<double>(&loss_sum, &count, lse.data(), logits.data(),
                                                 batch.targets.data(), T, V, TinyLm::kIgnoreIndex)
                  .ok());
  Reference ref;
  ref.loss = loss_sum / count;
  const double dloss_sum = 1.0 / count;
  vector<double> dlogits(T * V), dlogits_raw(T * V), dh(T * H), dtable_head(V * H), dx(T * H),
      dtable_embed(V * H);
  cpu::cross_entropy_backward<double>(dlogits.data(), &dloss_sum, logits.data(), lse.data(),
                                      batch.targets.data(), T, V, TinyLm::kIgnoreIndex);
  cpu::scale<double>(dlogits_raw.data(), dlogits.data(), TinyLm::kLogitScale, T * V);
  cpu::gemm<double>(false, false, T, H, V, 1.0, dlogits_raw.data(), V, table.data(), H, 0.0,
                    dh.data(), H);
  cpu::gemm<double>(true, false, V, H, T, 1.0, dlogits_raw.data(), V, h.data(), H, 0.0,
                    dtable_head.data(), H);
  ref.dnorm.resize(H);
  cpu::rms_norm_backward<double>(dx.data(), ref.dnorm.data(), dh.data(), x.data(), norm.data(),
                                 rstd.data(), T, H);
  cpu::embedding_backward<double>(dtable_embed.data(), dx.data(), batch.ids.data(), T, V, H,
                                  TinyLm::kEmbeddingMultiplier, -1);
  ref.dtable.resize(V * H);
  cpu::add<double>(ref.dtable.data(), dtable_head.data(), dtable_embed.data(), V * H);
  return ref;
}

void ExpectClose(std::span<const float> got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << "[" << i << "]";
  }
}

// Perturbs the norm away from all-ones so its gradient is not a special case.
void PerturbNorm(CpuExecutor& exec) {
  std::span<float> norm = *exec.Parameter(TinyLm::kNorm);
  for (size_t i = 0; i < norm.size(); ++i) norm[i] = 1.0f + 0.1f * static_cast<float>(i);
}

TEST(CpuExecutor, TinyLmMatchesReferenceKernels) {
  const plan::Plan plan = LoadTinyLm();
  auto exec = MakeExecutor(plan);
  EXPECT_TRUE(exec->InitializeParameters(42).ok());
  PerturbNorm(*exec);
  Batch batch;
  ASSERT_TRUE(exec->SetInputs(batch.ids, batch.targets).ok());
  ASSERT_TRUE(exec->RunStep().ok());

  const Reference ref = ComputeReference(Copy(*exec->Parameter(TinyLm::kTable)),
                                         Copy(*exec->Parameter(TinyLm::kNorm)), batch);
  EXPECT_NEAR(exec->Loss(), ref.loss, 1e-5 * ref.loss);
  // The loss of random logits is close to log(V).
  EXPECT_GT(exec->Loss(), 0.5 * std::log(double(V)));
  ExpectClose(*exec->Gradient(TinyLm::kTable), ref.dtable, 1e-5, "dtable");
  ExpectClose(*exec->Gradient(TinyLm::kNorm), ref.dnorm, 1e-5, "dnorm");

  // A second run with the same inputs gives bit-identical results: every kernel overwrites.
  const float loss = exec->Loss();
  const std::vector<float> dtable = Copy(*exec->Gradient(TinyLm::kTable));
  ASSERT_TRUE(exec->RunStep().ok());
  EXPECT_EQ(exec->Loss(), loss);
  EXPECT_EQ(Copy(*exec->Gradient(TinyLm::kTable)), dtable);
}

TEST(CpuExecutor, GradientsMatchFiniteDifferencesOfTheLoss) {
  const plan::Plan plan = LoadTinyLm();
  auto exec = MakeExecutor(plan);
  EXPECT_TRUE(exec->InitializeParameters(3).ok());
  PerturbNorm(*exec);
  Batch batch;
  ASSERT_TRUE(exec->SetInputs(batch.ids, batch.targets).ok());
  ASSERT_TRUE(exec->RunStep().ok());

  for (const char* name : {TinyLm::kTable, TinyLm::kNorm}) {
    const std::vector<float> analytic = Copy(*exec->Gradient(name));
    std::span<float> param = *exec->Parameter(name);
    bool any_nonzero = false;
    for (size_t i = 0; i < param.size(); ++i) {
      const float original = param[i];
      // The step actually taken in fp32, so the quotient uses the true difference.
      const float up = original + 1e-2f, down = original - 1e-2f;
      param[i] = up;
      ASSERT_TRUE(exec->RunStep().ok());
      const double loss_up = exec->Loss();
      param[i] = down;
      ASSERT_TRUE(exec->RunStep().ok());
      const double loss_down = exec->Loss();
      param[i] = original;
      const double fd = (loss_up - loss_down) / (double(up) - double(down));
      EXPECT_NEAR(fd, analytic[i], 2e-3 + 2e-2 * std::abs(analytic[i])) << name << "[" << i << "]";
      any_nonzero |= analytic[i] != 0.0f;
    }
    EXPECT_TRUE(any_nonzero) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// Initialisation.

std::vector<uint8_t> ParameterBytes(CpuExecutor& exec) {
  std::vector<uint8_t> bytes;
  for (const plan::Parameter& p : exec.parameters()) {
    std::span<float> v = *exec.Parameter(p.name);
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    bytes.insert(bytes.end(), b, b + v.size_bytes());
  }
  return bytes;
}

TEST(CpuExecutor, InitializationIsDeterministic) {
  const plan::Plan plan = LoadTinyLm();
  auto a = MakeExecutor(plan), b = MakeExecutor(plan), c = MakeExecutor(plan);
  EXPECT_TRUE(a->InitializeParameters(1234).ok());
  EXPECT_TRUE(b->InitializeParameters(1234).ok());
  EXPECT_TRUE(c->InitializeParameters(1235).ok());
  EXPECT_EQ(ParameterBytes(*a), ParameterBytes(*b));
  EXPECT_NE(Copy(*a->Parameter(TinyLm::kTable)), Copy(*c->Parameter(TinyLm::kTable)));
  // Ones does not depend on the seed.
  EXPECT_EQ(Copy(*c->Parameter(TinyLm::kNorm)), std::vector<float>(H, 1.0f));

  // Normal is FillNormal keyed by the parameter's name.
  std::vector<float> expected(V * H);
  FillNormal(expected.data(), 0, V * H, 1234, TinyLm::kTable, 0.5f);
  EXPECT_EQ(Copy(*a->Parameter(TinyLm::kTable)), expected);
}

TEST(CpuExecutor, InitializationFollowsNamesNotPlans) {
  // Plan 2: a parameter of the same shape under another name comes first, and the table sits at
  // another offset. The table's values are the same; the other parameter's differ.
  plan::PlanBuilder b;
  b.set_shape(1, 2);
  b.AllocateInputs();
  b.set_loss(b.Allocate("loss", plan::Arena::Activations, {1}));
  b.AddParameter("model.other.weight", {V, H}, plan::ParamInit::Normal, 0.5);
  b.AddParameter(TinyLm::kTable, {V, H}, plan::ParamInit::Normal, 0.5);
  b.AddParameter("model.layers.0.mamba.A_log", {4}, plan::ParamInit::LogArange);
  b.AddParameter("model.layers.0.mamba.D", {3}, plan::ParamInit::Zeros);
  absl::StatusOr<std::string> bytes = b.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<plan::Plan> other_plan = plan::ParsePlan(*bytes, "other");
  ASSERT_TRUE(other_plan.ok()) << other_plan.status();

  auto tiny = MakeExecutor(LoadTinyLm());
  auto other = MakeExecutor(*other_plan);
  EXPECT_TRUE(tiny->InitializeParameters(9).ok());
  EXPECT_TRUE(other->InitializeParameters(9).ok());
  EXPECT_EQ(Copy(*tiny->Parameter(TinyLm::kTable)), Copy(*other->Parameter(TinyLm::kTable)));
  EXPECT_NE(Copy(*other->Parameter("model.other.weight")), Copy(*other->Parameter(TinyLm::kTable)));
  EXPECT_EQ(Copy(*other->Parameter("model.layers.0.mamba.A_log")),
            (std::vector<float>{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)}));
  EXPECT_EQ(Copy(*other->Parameter("model.layers.0.mamba.D")), std::vector<float>(3, 0.0f));
}

TEST(CpuExecutor, ParameterAndGradientLookups) {
  auto exec = MakeExecutor(LoadTinyLm());
  ASSERT_EQ(exec->parameters().size(), 2u);
  EXPECT_EQ(exec->parameters()[1].name, TinyLm::kNorm);
  EXPECT_EQ(exec->Parameter(TinyLm::kTable)->size(), size_t(V * H));
  EXPECT_EQ(exec->Gradient(TinyLm::kNorm)->size(), size_t(H));
  absl::StatusOr<std::span<float>> missing = exec->Parameter("lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'lm_head.weight'"));
  EXPECT_TRUE(exec->F32Buffer(TinyLm().ids).empty());  // an i32 buffer
  EXPECT_EQ(exec->I32Buffer(TinyLm().ids).size(), size_t(T));
  EXPECT_TRUE(exec->F32Buffer(100000).empty());
}

// ---------------------------------------------------------------------------------------------
// Loading parameters from a checkpoint.

class LoadParametersTest : public ::testing::Test {
 protected:
  LoadParametersTest() : exec_(MakeExecutor(LoadTinyLm())) {
    table_.resize(V * H);
    for (size_t i = 0; i < table_.size(); ++i) table_[i] = 0.01f * static_cast<float>(i) - 0.3f;
    norm_ = {1.0f, 1.1f, 1.2f, 1.3f, 1.4f, 1.0009765625f + 1e-4f};  // the last one rounds in bf16
    EXPECT_TRUE(exec_->InitializeParameters(5).ok());
  }
  absl::Status Load(const std::vector<TensorToWrite>& tensors) {
    ScratchDir dir;
    HCP_RETURN_IF_ERROR(WriteCheckpoint(dir.path, tensors));
    HCP_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(dir.path));
    return exec_->LoadParameters(reader);
  }
  TensorToWrite Table() { return {TinyLm::kTable, DType::F32, {V, H}, table_, {}}; }
  TensorToWrite Norm(DType dtype = DType::BF16) { return {TinyLm::kNorm, dtype, {H}, norm_, {}}; }

  std::unique_ptr<CpuExecutor> exec_;
  std::vector<float> table_, norm_;
};

TEST_F(LoadParametersTest, LoadsAndConvertsBf16) {
  // An extra tensor (optimizer state, say) is ignored.
  std::vector<float> extra(3, 7.0f);
  ASSERT_TRUE(Load({Table(), Norm(), {"extra", DType::F32, {3}, extra, {}}}).ok());
  EXPECT_EQ(Copy(*exec_->Parameter(TinyLm::kTable)), table_);
  std::vector<float> norm_bf16;
  for (float v : norm_) norm_bf16.push_back(Bf16ToF32(F32ToBf16(v)));
  EXPECT_EQ(Copy(*exec_->Parameter(TinyLm::kNorm)), norm_bf16);
  EXPECT_NE(norm_bf16.back(), norm_.back());  // the conversion really happened

  ASSERT_TRUE(Load({Table(), Norm(DType::F16)}).ok());
  EXPECT_EQ((*exec_->Parameter(TinyLm::kNorm))[1], F16ToF32(F32ToF16(1.1f)));
}

TEST_F(LoadParametersTest, MissingTensor) {
  const std::vector<uint8_t> before = ParameterBytes(*exec_);
  absl::Status status = Load({Table()});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("has no tensor 'model.norm.weight' (the plan's parameter of shape [6])"));
  // Nothing was read: the table is as it was.
  EXPECT_EQ(ParameterBytes(*exec_), before);
}

TEST_F(LoadParametersTest, WrongShape) {
  std::vector<float> norm7(7, 1.0f);
  absl::Status status = Load({Table(), {TinyLm::kNorm, DType::F32, {7}, norm7, {}}});
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor 'model.norm.weight' has shape [7], the plan expects [6]"));
  // Same element count, other shape: still refused.
  status = Load({{TinyLm::kTable, DType::F32, {H, V}, table_, {}}, Norm()});
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor 'model.embed_tokens.weight' has shape [6, 11], the plan expects "
                        "[11, 6]"));
}

TEST_F(LoadParametersTest, IntegerTensor) {
  std::vector<int64_t> ints(H, 1);
  absl::Status status = Load({Table(), {TinyLm::kNorm, DType::I32, {H}, {}, ints}});
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor 'model.norm.weight' is I32, expected a float tensor"));
}

TEST_F(LoadParametersTest, NonFiniteValueIsRefusedByName) {
  // Weights that are not finite would make every loss NaN: refused, naming tensor and element.
  norm_[4] = -std::numeric_limits<float>::infinity();
  absl::Status status = Load({Table(), Norm(DType::F32)});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor 'model.norm.weight' holds -inf at element 4 (of 6): refusing to "
                        "train from it"));
}

// ---------------------------------------------------------------------------------------------
// Inputs and runtime errors.

TEST(CpuExecutor, SetInputsChecksSizes) {
  auto exec = MakeExecutor(LoadTinyLm());
  std::vector<int32_t> short_ids(T - 1), targets(T);
  absl::Status status = exec->SetInputs(short_ids, targets);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(
      std::string(status.message()),
      HasSubstr("got 9 input ids and 10 targets, the plan takes micro_batch*seq = 2*5 = 10"));
}

TEST(CpuExecutor, DataErrorsNameTheStep) {
  auto exec = MakeExecutor(LoadTinyLm());
  EXPECT_TRUE(exec->InitializeParameters(1).ok());
  Batch batch;
  batch.ids[3] = static_cast<int32_t>(V);
  ASSERT_TRUE(exec->SetInputs(batch.ids, batch.targets).ok());
  absl::Status status = exec->RunStep();
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("step 0 (embedding.forward): embedding: token id 11 at position 3"));

  batch = Batch();
  batch.targets[2] = -5;
  ASSERT_TRUE(exec->SetInputs(batch.ids, batch.targets).ok());
  status = exec->RunStep();
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("step 4 (cross_entropy.forward): cross_entropy: target -5 at position 2"));
}

TEST(CpuExecutor, UnwrittenActivationsReadAsNaN) {
  // A plan whose only step reads an activation nothing wrote.
  plan::PlanBuilder b;
  b.set_shape(1, 1);
  b.AllocateInputs();
  const uint32_t loss = b.Allocate("loss", plan::Arena::Activations, {1});
  const uint32_t never_written = b.Allocate("act.never_written", plan::Arena::Activations, {1});
  b.set_loss(loss);
  b.AddStep("scale", {never_written}, {loss}, {1}, {2.0});
  absl::StatusOr<std::string> bytes = b.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<plan::Plan> plan = plan::ParsePlan(*bytes, "poison");
  ASSERT_TRUE(plan.ok());

  auto poisoned = MakeExecutor(*plan);
  ASSERT_TRUE(poisoned->RunStep().ok());
  EXPECT_TRUE(std::isnan(poisoned->Loss()));

  absl::StatusOr<std::unique_ptr<CpuExecutor>> zeroed =
      CpuExecutor::Create(*plan, CpuExecutor::Options{.poison_activations = false});
  ASSERT_TRUE(zeroed.ok());
  ASSERT_TRUE((*zeroed)->RunStep().ok());
  EXPECT_EQ((*zeroed)->Loss(), 0.0f);
}

TEST(CpuExecutor, ThreadsPerRankSharesTheCoresThisProcessMayUse) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_GE(CpuExecutor::ThreadsPerRank(1), 1);
  EXPECT_LE(CpuExecutor::ThreadsPerRank(1), cores);
  EXPECT_EQ(CpuExecutor::ThreadsPerRank(cores + 1), 1);
  // Bound to one core (as mpirun binds a rank by default): one thread, whatever the share.
  cpu_set_t before, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &before)) {
      CPU_SET(c, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int bound = CpuExecutor::ThreadsPerRank(1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(bound, 1);
}

// One MoE routing step: 3 tokens' router logits (a parameter) -> gates and expert ids, top 2 of
// 4 experts.
plan::Plan RoutingPlan() {
  plan::PlanBuilder b;
  b.set_shape(1, 3);
  b.AllocateInputs();
  const auto logits = b.AddParameter("router.logits", {3, 4}, plan::ParamInit::Normal, 1.0);
  const uint32_t gates = b.Allocate("act.gates", plan::Arena::Activations, {3, 2});
  const uint32_t ids = b.Allocate("act.ids", plan::Arena::Activations, {3, 2}, plan::DType::I32);
  const uint32_t loss = b.Allocate("loss", plan::Arena::Activations, {1});
  b.set_loss(loss);
  b.AddStep("moe_route.forward", {logits.value}, {gates, ids}, {3, 4, 2});
  b.AddStep("fill", {}, {loss}, {1}, {0.0});
  absl::StatusOr<std::string> bytes = b.Finish();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<plan::Plan> plan = plan::ParsePlan(*bytes, "routing");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

TEST(CpuExecutor, RouteWithTakesTheGivenExpertsAndTheirGates) {
  const plan::Plan plan = RoutingPlan();
  auto exec = MakeExecutor(plan);
  EXPECT_TRUE(exec->InitializeParameters(5).ok());
  const std::vector<float> logits = Copy(*exec->Parameter("router.logits"));
  const uint32_t gates = plan.steps[0].outs[0], ids = plan.steps[0].outs[1];

  // Its own choice first: the top 2, as the kernel picks them.
  ASSERT_TRUE(exec->RunStep().ok());
  std::vector<int32_t> top(6);
  std::vector<float> top_gates(6);
  cpu::topk_softmax_forward<float>(top_gates.data(), top.data(), logits.data(), 3, 4, 2);
  EXPECT_EQ(std::vector<int32_t>(exec->I32Buffer(ids).begin(), exec->I32Buffer(ids).end()), top);

  // Then experts chosen elsewhere: token 0 the two it did not pick, token 1 its own two in the
  // other order. The gates are the softmax of the logits at those experts, in the given order.
  std::vector<int32_t> chosen = top;
  int slot = 0;
  for (int32_t e = 0; e < 4; ++e) {
    if (e != top[0] && e != top[1]) chosen[slot++] = e;
  }
  std::swap(chosen[2], chosen[3]);
  ASSERT_TRUE(exec->RouteWith(0, chosen).ok());
  ASSERT_TRUE(exec->RunStep().ok());
  EXPECT_EQ(std::vector<int32_t>(exec->I32Buffer(ids).begin(), exec->I32Buffer(ids).end()), chosen);
  for (int t = 0; t < 3; ++t) {
    const double a = logits[t * 4 + chosen[2 * t]], b = logits[t * 4 + chosen[2 * t + 1]];
    EXPECT_NEAR(exec->F32Buffer(gates)[2 * t], 1.0 / (1.0 + std::exp(b - a)), 1e-6) << t;
    EXPECT_NEAR(exec->F32Buffer(gates)[2 * t + 1], 1.0 / (1.0 + std::exp(a - b)), 1e-6) << t;
  }

  // What does not fit is refused, naming it.
  EXPECT_THAT(exec->RouteWith(1, chosen).message(), HasSubstr("step 1 is not an MoE layer's"));
  EXPECT_THAT(exec->RouteWith(0, {0, 1}).message(), HasSubstr("(6 ids), not 2"));
  chosen[5] = 4;
  EXPECT_THAT(exec->RouteWith(0, chosen).message(),
              HasSubstr("expert id 4 (token 2, slot 1) is not one of the 4 experts"));
}

// ---------------------------------------------------------------------------------------------
// Ranks.

// One rank of a larger world, alone in this process: every rank is assumed to say what this one
// says (an all-gather repeats its contribution), and nothing may be sent.
class PretendRank final : public comm::Communicator {
 public:
  PretendRank(int world_rank, int world_size) : Communicator(world_rank, world_size) {}
  [[noreturn]] void Abort(const absl::Status& status) override {
    ADD_FAILURE() << status;
    std::abort();
  }

 protected:
  absl::Status DoSetMesh(const plan::Mesh&) override { return absl::OkStatus(); }
  void DoAllReduceSum(float*, int64_t, comm::Group) override {}
  void DoAllReduceSum(double*, int64_t, comm::Group) override {}
  void DoAllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                   comm::Group) override {
    for (size_t at = 0; at < recv.size(); at += send.size()) {
      std::copy(send.begin(), send.end(), recv.begin() + at);
    }
  }
  void DoSendRecv(std::span<const std::byte>, int, std::span<std::byte>, int) override {
    Misuse("PretendRank cannot send");
  }
  void DoAllToAllV(std::span<const std::byte>, std::span<const int64_t>, std::span<std::byte>,
                   std::span<const int64_t>, std::span<const int>) override {
    Misuse("PretendRank cannot send");
  }
  void DoBarrier(comm::Group) override {}
};

plan::Plan InputsOnlyPlan(int64_t micro_batch, int64_t seq, plan::Mesh mesh) {
  plan::PlanBuilder b;
  b.set_shape(micro_batch, seq).set_mesh(mesh);
  b.AllocateInputs();
  b.set_loss(b.Allocate("loss", plan::Arena::Activations, {1}));
  absl::StatusOr<plan::Plan> plan = plan::ParsePlan(b.FinishUnchecked(), "inputs");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

TEST(CpuExecutor, SetInputsKeepsThisRanksSegments) {
  // Sequences of 16 tokens over cp=4 (zigzag: 8 segments of 2) x dp=2. Every rank is given the
  // whole micro-batch of its dp index and keeps segments r and 7-r of each sequence.
  const plan::Mesh mesh{.cp = 4, .dp = 2, .layout = plan::SequenceLayout::Zigzag};
  const plan::Plan plan = InputsOnlyPlan(2, 16, mesh);
  std::vector<int32_t> ids(32), targets(32);
  for (int i = 0; i < 32; ++i) {
    ids[i] = i;
    targets[i] = 1000 + i;
  }
  for (int world_rank = 0; world_rank < 8; ++world_rank) {
    PretendRank rank(world_rank, 8);
    ASSERT_TRUE(rank.SetMesh(mesh).ok());
    auto exec = CpuExecutor::Create(plan, rank);
    ASSERT_TRUE(exec.ok()) << exec.status();
    ASSERT_TRUE((*exec)->SetInputs(ids, targets).ok());
    const int r = world_rank % 4;
    std::vector<int32_t> want;
    for (int b = 0; b < 2; ++b) {
      for (int segment : {r, 7 - r}) {
        want.push_back(b * 16 + 2 * segment);
        want.push_back(b * 16 + 2 * segment + 1);
      }
    }
    std::span<int32_t> got = (*exec)->I32Buffer(plan.input_ids);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want) << "rank " << world_rank;
    std::span<int32_t> got_targets = (*exec)->I32Buffer(plan.targets);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got_targets[i], 1000 + want[i]);
  }
  // Contiguous: rank r keeps tokens [4r, 4r+4) of each sequence.
  const plan::Mesh contiguous{.cp = 4};
  const plan::Plan plan_c = InputsOnlyPlan(2, 16, contiguous);
  PretendRank rank2(2, 4);
  ASSERT_TRUE(rank2.SetMesh(contiguous).ok());
  auto exec = CpuExecutor::Create(plan_c, rank2);
  ASSERT_TRUE(exec.ok()) << exec.status();
  ASSERT_TRUE((*exec)->SetInputs(ids, targets).ok());
  std::span<int32_t> got = (*exec)->I32Buffer(plan_c.input_ids);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()),
            (std::vector<int32_t>{8, 9, 10, 11, 24, 25, 26, 27}));
}

TEST(RankInputs, OneDocumentPerRowIsToldApart) {
  // A backend runs a micro-batch of one document per row as a plan without --documents: only
  // rows that restart nowhere but at their first token are.
  const plan::Plan plan = InputsOnlyPlan(2, 4, plan::Mesh{});
  EXPECT_TRUE(IsOneDocumentPerRow(plan, OneDocumentPerRow(plan)));
  EXPECT_FALSE(IsOneDocumentPerRow(plan, std::vector<int32_t>{0, 1, 2, 3, 0, 1, 0, 1}));
  EXPECT_FALSE(IsOneDocumentPerRow(plan, std::vector<int32_t>{0, 0, 1, 2, 0, 1, 2, 3}));
  EXPECT_TRUE(CheckPositionIds(plan, std::vector<int32_t>{0, 1, 0, 1, 0, 1, 2, 3}).ok());
  EXPECT_FALSE(IsOneDocumentPerRow(plan, std::vector<int32_t>{0, 1, 0, 1, 0, 1, 2, 3}));
}

TEST(CpuExecutor, CreateNeedsThePlansRanks) {
  const plan::Plan plan = InputsOnlyPlan(1, 8, plan::Mesh{.cp = 2, .dp = 2});
  absl::StatusOr<std::unique_ptr<CpuExecutor>> alone = CpuExecutor::Create(plan);
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(std::string(alone.status().message()),
              HasSubstr("the plan runs on cp=2 x dp=2 ranks, the communicator has cp=1 x dp=1 "
                        "(1 rank)"));
  PretendRank no_mesh(0, 4);
  absl::StatusOr<std::unique_ptr<CpuExecutor>> early = CpuExecutor::Create(plan, no_mesh);
  ASSERT_FALSE(early.ok());
  // With several ranks every message names the ranks it comes from.
  EXPECT_EQ(early.status().message(),
            "ranks 0-3: the communicator has no mesh yet: run comm::CheckRanksAgree with this "
            "plan first");
}

// ---------------------------------------------------------------------------------------------
// Expert parallelism: a sharded parameter holds its rank's rows of the whole tensor, whether
// initialised or loaded, and equals that slice of the unsharded run's values.

// A plan on `mesh` with a replicated norm [6] and two sharded expert weights (checkpoint
// shapes [8, 3, 2] and [8, 2]) split into mesh.ep shards; with ep = 1 they are whole.
plan::Plan ShardedPlan(plan::Mesh mesh) {
  plan::PlanBuilder b;
  b.set_shape(1, 8).set_mesh(mesh);
  b.AllocateInputs();
  b.set_loss(b.Allocate("loss", plan::Arena::Activations, {1}));
  b.AddParameter("model.norm.weight", {6}, plan::ParamInit::Ones);
  if (mesh.ep == 1) {
    b.AddParameter("experts.w_in", {8, 3, 2}, plan::ParamInit::Normal, 0.5);
    b.AddParameter("experts.a_log", {8, 2}, plan::ParamInit::LogArange);
  } else {
    b.AddShardedParameter("experts.w_in", {8, 3, 2}, mesh.ep, plan::ParamInit::Normal, 0.5);
    b.AddShardedParameter("experts.a_log", {8, 2}, mesh.ep, plan::ParamInit::LogArange);
  }
  absl::StatusOr<std::string> bytes = b.Finish();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<plan::Plan> plan = plan::ParsePlan(*bytes, "sharded");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

TEST(CpuExecutor, ShardedParametersHoldTheirRowsOfTheWholeTensor) {
  const plan::Plan whole = ShardedPlan(plan::Mesh{});
  auto one = MakeExecutor(whole);
  EXPECT_TRUE(one->InitializeParameters(77).ok());
  const std::vector<float> w_in = Copy(*one->Parameter("experts.w_in"));
  const std::vector<float> a_log = Copy(*one->Parameter("experts.a_log"));

  // cp2 x dp2 with ep4: world rank r holds rows [2r, 2r + 2) of both expert tensors.
  const plan::Mesh mesh{.cp = 2, .dp = 2, .ep = 4};
  const plan::Plan sharded = ShardedPlan(mesh);
  ASSERT_EQ(sharded.parameters[1].shards, 4);
  EXPECT_EQ(sharded.FullShape(sharded.parameters[1]), (std::vector<int64_t>{8, 3, 2}));
  EXPECT_EQ(sharded.buffers[sharded.parameters[1].buffer].shape, (std::vector<int64_t>{2, 3, 2}));

  // A checkpoint of other values, for loading.
  std::vector<float> w_in_ckpt(w_in.size()), a_log_ckpt(a_log.size()), norm_ckpt(6, 2.0f);
  for (size_t i = 0; i < w_in_ckpt.size(); ++i) w_in_ckpt[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < a_log_ckpt.size(); ++i) a_log_ckpt[i] = -static_cast<float>(i);
  ScratchDir dir;
  ASSERT_TRUE(WriteCheckpoint(dir.path, {{"model.norm.weight", DType::F32, {6}, norm_ckpt, {}},
                                         {"experts.w_in", DType::F32, {8, 3, 2}, w_in_ckpt, {}},
                                         {"experts.a_log", DType::F32, {8, 2}, a_log_ckpt, {}}})
                  .ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir.path);
  ASSERT_TRUE(reader.ok()) << reader.status();

  for (int world_rank = 0; world_rank < 4; ++world_rank) {
    SCOPED_TRACE(world_rank);
    PretendRank rank(world_rank, 4);
    ASSERT_TRUE(rank.SetMesh(mesh).ok());
    EXPECT_EQ(rank.ep_index(), world_rank);
    auto exec = CpuExecutor::Create(sharded, rank);
    ASSERT_TRUE(exec.ok()) << exec.status();
    const plan::Parameter& p = (*exec)->parameters()[1];
    const CpuExecutor::ShardRange range = (*exec)->ShardOf(p);
    EXPECT_EQ(range.begin, world_rank * 12);
    EXPECT_EQ(range.count, 12);
    EXPECT_EQ(range.full, 48);
    EXPECT_EQ((*exec)->ShardOf((*exec)->parameters()[0]).count, 6);

    EXPECT_TRUE((*exec)->InitializeParameters(77).ok());
    auto rows = [&](const std::vector<float>& full, int64_t per_rank) {
      return std::vector<float>(full.begin() + world_rank * per_rank,
                                full.begin() + (world_rank + 1) * per_rank);
    };
    EXPECT_EQ(Copy(*(*exec)->Parameter("experts.w_in")), rows(w_in, 12));
    EXPECT_EQ(Copy(*(*exec)->Parameter("experts.a_log")), rows(a_log, 4));
    const std::vector<float> local_part = Copy((*exec)->LocalPart(p, w_in));
    EXPECT_EQ(local_part, rows(w_in, 12));

    ASSERT_TRUE((*exec)->LoadParameters(*reader).ok());
    EXPECT_EQ(Copy(*(*exec)->Parameter("experts.w_in")), rows(w_in_ckpt, 12));
    EXPECT_EQ(Copy(*(*exec)->Parameter("experts.a_log")), rows(a_log_ckpt, 4));
    EXPECT_EQ(Copy(*(*exec)->Parameter("model.norm.weight")), norm_ckpt);
  }
}

TEST(CpuExecutor, ShardedParametersLoadTheCheckpointShape) {
  const plan::Mesh mesh{.cp = 1, .dp = 2, .ep = 2};
  const plan::Plan sharded = ShardedPlan(mesh);
  std::vector<float> local(24, 1.0f), norm(6, 1.0f), a_log(16, 1.0f);
  ScratchDir dir;
  // The rank's [4, 3, 2] slice is not the checkpoint tensor: the whole [8, 3, 2] is expected.
  ASSERT_TRUE(WriteCheckpoint(dir.path, {{"model.norm.weight", DType::F32, {6}, norm, {}},
                                         {"experts.w_in", DType::F32, {4, 3, 2}, local, {}},
                                         {"experts.a_log", DType::F32, {8, 2}, a_log, {}}})
                  .ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir.path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  PretendRank rank(1, 2);
  ASSERT_TRUE(rank.SetMesh(mesh).ok());
  auto exec = CpuExecutor::Create(sharded, rank);
  ASSERT_TRUE(exec.ok()) << exec.status();
  absl::Status status = (*exec)->LoadParameters(*reader);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor 'experts.w_in' has shape [4, 3, 2], the plan expects [8, 3, 2]"));
}

// The sharded optimizer's slices (CudaExecutor's ZeRO-1): equal slices of each replicated
// parameter, in rank order, covering it exactly once; an expert shard, a size that does not
// divide, one rank, or no sharding: the whole buffer on every rank.
TEST(OptimizerSlice, EqualSlicesOfReplicatedParameters) {
  const plan::Plan sharded = ShardedPlan(plan::Mesh{.cp = 1, .dp = 2, .ep = 2});
  const plan::Parameter& norm = sharded.parameters[0];     // [6], replicated
  const plan::Parameter& experts = sharded.parameters[1];  // ep-sharded
  for (int64_t ranks : {2, 3, 6}) {
    int64_t next = 0;
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const OptimizerSlice slice = OptimizerSliceOf(norm, 6, /*shard=*/true, rank, ranks);
      EXPECT_TRUE(slice.split);
      EXPECT_EQ(slice.begin, next) << ranks << " ranks, rank " << rank;
      EXPECT_EQ(slice.count, 6 / ranks);
      next += slice.count;
    }
    EXPECT_EQ(next, 6);
  }
  auto whole = [](OptimizerSlice slice, int64_t elements) {
    return !slice.split && slice.begin == 0 && slice.count == elements;
  };
  EXPECT_TRUE(whole(OptimizerSliceOf(norm, 6, /*shard=*/true, 1, 4), 6));  // 6 % 4 != 0
  EXPECT_TRUE(whole(OptimizerSliceOf(norm, 6, /*shard=*/false, 1, 2), 6));
  EXPECT_TRUE(whole(OptimizerSliceOf(norm, 6, /*shard=*/true, 0, 1), 6));
  EXPECT_TRUE(whole(OptimizerSliceOf(experts, 24, /*shard=*/true, 1, 2), 24));
}

// inspect's AdamW figure: m and v per held value of an f32 parameter; sharded, the replicated
// [6] norm weight splits over the two ranks while the ep-split experts stay whole.
TEST(OptimizerSlice, StateBytesPerRank) {
  const plan::Plan sharded = ShardedPlan(plan::Mesh{.cp = 1, .dp = 2, .ep = 2});
  // norm 6 values, experts.w_in 4 x 3 x 2 = 24 and experts.a_log 4 x 2 = 8 held per rank.
  EXPECT_EQ(OptimizerStateBytes(sharded, /*shard=*/false), 2 * 4 * (6 + 24 + 8));
  EXPECT_EQ(OptimizerStateBytes(sharded, /*shard=*/true), 2 * 4 * (3 + 24 + 8));
}

TEST(CpuExecutor, CreateValidatesThePlanAgain) {
  plan::Plan plan = LoadTinyLm();
  plan.steps[1].ints[1] = H + 1;  // rms_norm dim
  absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CpuExecutor::Create(plan);
  ASSERT_FALSE(exec.ok());
  EXPECT_THAT(std::string(exec.status().message()), HasSubstr("step 1 (rms_norm.forward)"));
}

TEST(CpuExecutor, CreateRefusesArenasLargerThanMemory) {
  TinyLm lm;
  lm.builder.SetArenaBytes(plan::Arena::Activations, uint64_t{1} << 60);
  absl::StatusOr<plan::Plan> plan = plan::ParsePlan(lm.Bytes(), "huge");
  ASSERT_TRUE(plan.ok()) << plan.status();  // valid: every buffer fits
  absl::StatusOr<std::unique_ptr<CpuExecutor>> exec = CpuExecutor::Create(*plan);
  ASSERT_FALSE(exec.ok());
  EXPECT_EQ(exec.status().code(), absl::StatusCode::kResourceExhausted);
  // In GiB, both figures (2^60 bytes and the few of the tiny plan).
  EXPECT_THAT(std::string(exec.status().message()),
              MatchesRegex("the plan's arenas need 1073741824\\.00 GiB, more than this machine's "
                           "[0-9]+\\.[0-9][0-9] GiB of memory"));
}

}  // namespace
}  // namespace hcp
