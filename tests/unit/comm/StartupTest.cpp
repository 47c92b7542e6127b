// Agreement between the ranks on N MPI ranks: the startup checks (world size, the same plan on
// every rank, a rank that could not load its plan) and errors of one rank during a step. In each
// case every rank returns the same error, and nobody waits for anybody (ctest's time limit
// would catch a hang).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/Launch.h"
#include "tests/unit/comm/MpiTestUtil.h"

namespace hcp::testing {
namespace {

using plan::Mesh;
using ::testing::HasSubstr;

// A plan file for `mesh` with nothing to run (the checks are about the file, not the steps).
std::string PlanBytes(const Mesh& mesh, const std::string& model) {
  plan::PlanBuilder b;
  b.set_model(model).set_shape(1, 2 * mesh.segments()).set_mesh(mesh);
  b.AllocateInputs();
  b.set_loss(b.Allocate("loss", plan::Arena::Activations, {1}));
  absl::StatusOr<std::string> bytes = b.Finish();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

// "rank 0", "ranks 0,1", "ranks 0-2": the first n ranks, as the messages list them.
std::string FirstRanks(int n) {
  if (n == 1) return "rank 0";
  if (n == 2) return "ranks 0,1";
  return absl::StrFormat("ranks 0-%d", n - 1);
}

TEST(Startup, RanksWithTheSamePlanGetItsMesh) {
  const int world = World().world_size();
  const Mesh mesh{.cp = world, .dp = 1, .layout = plan::SequenceLayout::Zigzag};
  auto comm = NewWorldCommunicator();
  const plan::RankPlan mine = plan::ParsePlanForRank(PlanBytes(mesh, "same"), "same.plan");
  const absl::Status status = comm::CheckRanksAgree(*comm, mine.plan, mine.hash);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(comm->has_mesh());
  EXPECT_EQ(comm->mesh().cp, world);
  EXPECT_EQ(comm->cp_index(), comm->world_rank());
}

TEST(Startup, WrongWorldSize) {
  const int world = World().world_size();
  const Mesh mesh{.cp = 2 * world, .dp = 1};
  auto comm = NewWorldCommunicator();
  const plan::RankPlan mine = plan::ParsePlanForRank(PlanBytes(mesh, "big"), "big.plan");
  const absl::Status status = comm::CheckRanksAgree(*comm, mine.plan, mine.hash);
  EXPECT_EQ(status.message(),
            absl::StrFormat("the plan was compiled for cp=%d x dp=1 = %d ranks, but %d %s started",
                            2 * world, 2 * world, world, world == 1 ? "rank was" : "ranks were"));
  EXPECT_FALSE(comm->has_mesh());
  // And with dp: cp=world x dp=2.
  const plan::RankPlan dp2 =
      plan::ParsePlanForRank(PlanBytes(Mesh{.cp = world, .dp = 2}, "dp2"), "dp2.plan");
  EXPECT_THAT(std::string(comm::CheckRanksAgree(*comm, dp2.plan, dp2.hash).message()),
              HasSubstr(absl::StrFormat("compiled for cp=%d x dp=2 = %d ranks", world, 2 * world)));
}

TEST(Startup, OneRankRunsAnotherPlan) {
  const int world = World().world_size();
  if (world < 2) GTEST_SKIP() << "needs two ranks";
  const Mesh mesh{.cp = world, .dp = 1};
  const std::string ours = PlanBytes(mesh, "ours"), theirs = PlanBytes(mesh, "theirs");
  auto comm = NewWorldCommunicator();
  const bool odd_one = comm->world_rank() == world - 1;
  const plan::RankPlan mine = plan::ParsePlanForRank(odd_one ? theirs : ours, "model.plan");
  ASSERT_TRUE(mine.plan.ok());
  const absl::Status status = comm::CheckRanksAgree(*comm, mine.plan, mine.hash);
  EXPECT_EQ(status.message(),
            absl::StrFormat("%s %s plan %s, rank %d runs %s: start every rank with the same plan",
                            FirstRanks(world - 1), world - 1 == 1 ? "runs" : "run",
                            plan::HashString(plan::PlanBytesHash(ours)), world - 1,
                            plan::HashString(plan::PlanBytesHash(theirs))));
  EXPECT_FALSE(comm->has_mesh());
}

TEST(Startup, OneRankFailsToLoad) {
  const int world = World().world_size();
  const Mesh mesh{.cp = world, .dp = 1};
  std::string bytes = PlanBytes(mesh, "ok");
  auto comm = NewWorldCommunicator();
  const int last = world - 1;
  if (comm->world_rank() == last) bytes[2] = 'X';  // bad magic on the last rank only
  const plan::RankPlan mine = plan::ParsePlanForRank(bytes, "rank.plan");
  const absl::Status status = comm::CheckRanksAgree(*comm, mine.plan, mine.hash);
  EXPECT_EQ(status.message(), world == 1 ? std::string("rank.plan: not a hybridcp plan (bad magic)")
                                         : absl::StrFormat("the plan did not load on every rank: "
                                                           "rank %d: rank.plan: not a hybridcp "
                                                           "plan (bad magic)",
                                                           last));
  EXPECT_FALSE(comm->has_mesh());

  // A file that is not there on rank 0, the plan everywhere else.
  const std::string missing = "/nonexistent/hybridcp/test.plan";
  const plan::RankPlan from_file = comm->world_rank() == 0
                                       ? plan::LoadPlanForRank(missing)
                                       : plan::ParsePlanForRank(PlanBytes(mesh, "ok"), "test.plan");
  const absl::Status missing_status = comm::CheckRanksAgree(*comm, from_file.plan, from_file.hash);
  EXPECT_THAT(std::string(missing_status.message()),
              HasSubstr("cannot open plan '/nonexistent/hybridcp/test.plan': No such file"));
  if (world > 1) {
    EXPECT_THAT(std::string(missing_status.message()),
                HasSubstr("the plan did not load on every rank: rank 0: cannot open plan"));
  }
}

// The command agreement, the first collective of every command: the same line everywhere
// passes; another --lr on the last rank, or another command there, stops every rank with the
// same message (and the ranks keep talking afterwards: nobody was left in a collective).
TEST(Startup, RanksAgreeOnTheCommandLine) {
  const int world = World().world_size();
  auto comm = NewWorldCommunicator();
  const bool last = comm->world_rank() == world - 1;
  const comm::CommandLine same{"train", {{"data", "d.bin"}, {"lr", "0.003"}, {"steps", "12"}}};
  const absl::Status agreed = comm::CheckCommandsAgree(*comm, same);
  EXPECT_TRUE(agreed.ok()) << agreed;

  const comm::CommandLine other_lr{
      "train", {{"data", "d.bin"}, {"lr", last ? "0.01" : "0.003"}, {"steps", "12"}}};
  const absl::Status lr = comm::CheckCommandsAgree(*comm, other_lr);
  if (world == 1) {
    EXPECT_TRUE(lr.ok());
  } else {
    EXPECT_EQ(lr.message(),
              absl::StrFormat("ranks disagree on --lr: %s %s 0.003, rank %d has 0.01; start every "
                              "rank with the same command",
                              FirstRanks(world - 1), world == 2 ? "has" : "have", world - 1));
  }

  // run-step (a shorter line) on the last rank: the first gather is the same size anyway.
  const comm::CommandLine command = last ? comm::CommandLine{"run-step", {{"inputs", "i"}}} : same;
  const absl::Status commands = comm::CheckCommandsAgree(*comm, command);
  if (world > 1) {
    EXPECT_EQ(commands.message(),
              absl::StrFormat("ranks disagree on the command: %s %s train, rank %d runs run-step; "
                              "start every rank with the same command",
                              FirstRanks(world - 1), world == 2 ? "runs" : "run", world - 1));
  }
  EXPECT_TRUE(comm::AgreeOnStatus(*comm, absl::OkStatus()).ok());
}

// What NcclCommunicator::Create gathers before NCCL starts: every rank's node and GPU, in rank
// order. The ranks of this test share a machine; given one GPU id, they would share it.
TEST(Startup, RanksSharingAGpuAreSeenByEveryRank) {
  const int world = World().world_size();
  auto comm = NewWorldCommunicator();
  comm::RankGpu mine;
  mine.node = comm::HostName();
  mine.gpu = absl::StrFormat("bus-%d", comm->world_rank());
  mine.visible = world;
  const std::vector<comm::RankGpu> own = comm::GatherRankGpus(*comm, mine);
  ASSERT_EQ(static_cast<int>(own.size()), world);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(own[r].node, mine.node);
    EXPECT_EQ(own[r].gpu, absl::StrFormat("bus-%d", r));
  }
  EXPECT_TRUE(comm::CheckOneRankPerGpu(own).ok());

  mine.gpu = "bus-0";
  mine.visible = 1;
  const absl::Status shared = comm::CheckOneRankPerGpu(comm::GatherRankGpus(*comm, mine));
  if (world == 1) {
    EXPECT_TRUE(shared.ok());
  } else {
    EXPECT_THAT(std::string(shared.message()),
                HasSubstr(absl::StrFormat("node %s has 1 GPU but %s were started on it (%s share "
                                          "GPU bus-0)",
                                          mine.node, FirstRanks(world), FirstRanks(world))));
  }
}

// A token id outside the vocabulary on cp rank 0 only: the embedding fails there, the
// all_reduce after it still runs everywhere, and every rank reports rank 0's error.
TEST(RunStep, ADataErrorOnOneRankStopsEveryRank) {
  const int world = World().world_size();
  const Mesh mesh{.cp = world, .dp = 1};
  auto comm = NewCommunicator(mesh);
  const int64_t V = 5, Hd = 3, len = 2, seq = world * len;
  std::mt19937 rng(5);
  DistPlan p(1, seq, mesh);
  const uint32_t table = p.Input("table", {V, Hd}, RandomVec(rng, V * Hd));
  const uint32_t x = p.Buffer("x", {len, Hd}), y = p.Buffer("y", {len, Hd});
  p.Step("embedding.forward", {table, p.input_ids()}, {x}, {len, V, Hd}, {1.0});
  p.Step("all_reduce", {x}, {y}, {len * Hd, 1});
  ASSERT_TRUE(p.Create(*comm).ok());

  std::vector<int32_t> ids(seq), targets(seq, -100);
  for (int64_t t = 0; t < seq; ++t) ids[t] = static_cast<int32_t>(t % V);
  ids[1] = 99;  // position 1 of the sequence: cp rank 0's segment
  ASSERT_TRUE(p.executor().SetInputs(ids, targets).ok());
  const absl::Status status = p.RunStep();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(std::string(world == 1 ? "" : "rank 0: ") +
                        "step 0 (embedding.forward): embedding: token id 99 at position 1"));

  // The same plan runs once the data is right.
  ids[1] = 1;
  ASSERT_TRUE(p.executor().SetInputs(ids, targets).ok());
  const absl::Status again = p.RunStep();
  EXPECT_TRUE(again.ok()) << again;

  // Wrong input sizes on every rank: one message for all of them.
  const absl::Status sizes = p.executor().SetInputs(std::vector<int32_t>(3), targets);
  const std::string what = absl::StrFormat("got 3 input ids and %d targets", seq);
  EXPECT_THAT(std::string(sizes.message()),
              HasSubstr(world == 1 ? what : FirstRanks(world) + ": " + what));
}

}  // namespace
}  // namespace hcp::testing
