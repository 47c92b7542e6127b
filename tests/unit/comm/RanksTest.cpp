// The decisions that keep ranks from hanging or disagreeing silently, without MPI: the wait with
// a deadline and its message, the comparison of the ranks' command lines, and the launching
// mistakes (srun without PMI, ranks sharing a GPU).
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/Deadline.h"
#include "runtime/comm/Launch.h"

namespace hcp::comm {
namespace {

using namespace std::chrono;
using ::testing::HasSubstr;

TEST(Deadline, ReturnsAsSoonAsDone) {
  int polls = 0;
  const auto start = steady_clock::now();
  EXPECT_TRUE(PollUntil([&] { return ++polls == 3; }, seconds(10)));
  EXPECT_EQ(polls, 3);
  EXPECT_LT(steady_clock::now() - start, seconds(1));
}

// Never done: false after the timeout, neither much before nor much after it, and the wait
// sleeps between polls once it is long (a few thousand polls in 300 ms, not millions).
TEST(Deadline, GivesUpAfterTheTimeout) {
  int polls = 0;
  const auto start = steady_clock::now();
  EXPECT_FALSE(PollUntil([&] { return ++polls < 0; }, milliseconds(300)));
  const auto waited = steady_clock::now() - start;
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(1300));
  EXPECT_LT(polls, 200000);
}

StalledWait Wait(std::string_view kind, std::string_view group, std::vector<int> members, int self,
                 std::vector<int> silent, std::string_view during, int seconds) {
  StalledWait wait;
  wait.kind = kind;
  wait.group = group;
  wait.members = std::move(members);
  wait.self = self;
  wait.silent = std::move(silent);
  wait.during = during;
  wait.timeout = std::chrono::seconds(seconds);
  return wait;
}

TEST(Deadline, NamesTheRankThatDidNotAnswer) {
  // A group of two: the other rank is the one.
  EXPECT_EQ(DescribeStalledWait(Wait("all-reduce", "cp", {0, 1}, 0, {}, "state_scan", 5)),
            "the all-reduce over the cp group (ranks 0,1) did not finish within 5 s (in "
            "state_scan): rank 1 did not answer (stopped, hung or dead); ending the job (if a step "
            "may rightly take longer, raise --timeout)");
  // A larger group: one of the others, unknown which.
  EXPECT_THAT(DescribeStalledWait(Wait("barrier", "world", {0, 1, 2, 3}, 2, {}, "unlabelled", 300)),
              HasSubstr("the barrier over the world group (ranks 0-3) did not finish within 300 s: "
                        "one of ranks 0,1,3 did not answer"));
  // Messages: the peers whose messages are still open.
  EXPECT_THAT(DescribeStalledWait(Wait("all-to-all", "", {1, 2, 3, 3, 1}, 0, {3, 3}, "", 7)),
              HasSubstr("the all-to-all with ranks 1-3 did not finish within 7 s: rank 3 did not "
                        "answer"));
}

CommandLine Line(std::string command,
                 std::vector<std::pair<std::string, std::string>> options = {}) {
  return CommandLine{std::move(command), std::move(options)};
}

TEST(CommandLines, TheSameOnEveryRankAgree) {
  const CommandLine line = Line("train", {{"data", "d.bin"}, {"lr", "0.003"}, {"resume", ""}});
  EXPECT_TRUE(CompareCommandLines({line, line, line}).ok());
}

TEST(CommandLines, AnOptionWithTwoValues) {
  const CommandLine a = Line("train", {{"lr", "0.003"}, {"steps", "10"}});
  const CommandLine b = Line("train", {{"lr", "0.01"}, {"steps", "10"}});
  const absl::Status status = CompareCommandLines({a, a, b});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "ranks disagree on --lr: ranks 0,1 have 0.003, rank 2 has 0.01; start every rank with "
            "the same command");
}

// Every option that differs, in one message; given on some ranks only; a flag.
TEST(CommandLines, SeveralOptionsDiffer) {
  const CommandLine a = Line("train", {{"resume", ""}, {"steps", "10"}});
  const CommandLine b = Line("train", {{"seed", "1"}, {"steps", "12"}});
  EXPECT_EQ(
      CompareCommandLines({a, b, b, b}).message(),
      "ranks disagree on --resume: rank 0 gives it, ranks 1-3 do not give it; on --seed: rank "
      "0 does not give it, ranks 1-3 have 1; on --steps: rank 0 has 10, ranks 1-3 have 12; "
      "start every rank with the same command");
}

// Another command on a rank: named alone (its options mean something else).
TEST(CommandLines, AnotherCommand) {
  EXPECT_EQ(CompareCommandLines({Line("train", {{"steps", "3"}}), Line("run-step")}).message(),
            "ranks disagree on the command: rank 0 runs train, rank 1 runs run-step; start every "
            "rank with the same command");
}

// What the launcher's environment says: srun's tasks, mpirun's processes, PMI's size.
LaunchEnv Env(std::optional<int> srun, std::optional<int> mpirun, std::optional<int> pmi) {
  return LaunchEnv{srun, mpirun, pmi};
}

TEST(Launch, SrunWithoutPmiIsRefused) {
  const absl::Status status = CheckLaunch(Env(4, {}, {}), 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "srun started 4 tasks but MPI sees 1 rank in each: srun was run without PMI; use srun "
            "--mpi=pmix (or --mpi=pmi2), or mpirun");
  // srun with PMI: MPI sees them all.
  EXPECT_TRUE(CheckLaunch(Env(4, {}, 4), 4).ok());
  EXPECT_TRUE(CheckLaunch(Env(1, {}, {}), 1).ok());
}

TEST(Launch, AnotherMpisLauncherIsRefused) {
  EXPECT_THAT(std::string(CheckLaunch(Env({}, 2, {}), 1).message()),
              HasSubstr("mpirun started 2 processes but MPI sees 1 rank in each"));
  EXPECT_THAT(std::string(CheckLaunch(Env({}, {}, 3), 1).message()),
              HasSubstr("the launcher started 3 processes but MPI sees 1 rank in each"));
}

// A batch script (no srun step) and mpirun inside a Slurm allocation run as they are.
TEST(Launch, OneRankOrMpirunInsideAnAllocationRun) {
  EXPECT_TRUE(CheckLaunch(Env({}, {}, {}), 1).ok());
  // mpirun -np 2 inside srun's step of 8 daemons' tasks: mpirun's count decides.
  EXPECT_TRUE(CheckLaunch(Env(8, 2, {}), 2).ok());
}

TEST(Launch, RanksSharingAGpuAreRefused) {
  // Node a: 2 GPUs, 4 ranks (the local rank modulo the GPUs: 0,2 and 1,3 share); node b: fine.
  const std::vector<RankGpu> ranks = {{"a", "0000:1b:00.0", 2}, {"a", "0000:2c:00.0", 2},
                                      {"a", "0000:1b:00.0", 2}, {"a", "0000:2c:00.0", 2},
                                      {"b", "0000:1b:00.0", 2}, {"b", "0000:2c:00.0", 2}};
  const absl::Status status = CheckOneRankPerGpu(ranks);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "node a has 2 GPUs but ranks 0-3 were started on it (ranks 0,2 share GPU 0000:1b:00.0, "
            "ranks 1,3 share GPU 0000:2c:00.0): start at most one rank per GPU (mpirun -npernode "
            "GPUS_PER_NODE, or srun --ntasks-per-node=GPUS_PER_NODE)");
}

TEST(Launch, OneRankPerGpuRuns) {
  // The same bus id on two nodes is two GPUs; one GPU visible to each rank (Slurm's
  // --gpus-per-task) is each rank's own.
  EXPECT_TRUE(CheckOneRankPerGpu({{"a", "0000:1b:00.0", 2},
                                  {"a", "0000:2c:00.0", 2},
                                  {"b", "0000:1b:00.0", 2},
                                  {"c", "0000:1b:00.0", 1},
                                  {"c", "0000:2c:00.0", 1}})
                  .ok());
}

}  // namespace
}  // namespace hcp::comm
