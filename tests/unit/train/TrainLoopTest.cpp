// The checkpoint directory protocol both training loops use (runtime/train/TrainLoop.h): a
// checkpoint appears whole or not at all, `latest` names the last complete one, the newest two
// are kept; and the step loop's cadence of steps and checkpoints.
#include "runtime/train/TrainLoop.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp::train {
namespace {

using hcp::testing::ScratchDir;

// A checkpoint writer that puts one file into the staging directory.
absl::Status WriteMarker(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / "marker") << "x";
  return absl::OkStatus();
}

std::string ReadLatest(const ScratchDir& dir) {
  std::ifstream in(dir / kLatestFileName);
  std::string name;
  in >> name;
  return name;
}

TEST(PublishCheckpoint, KeepsTheNewestTwoAndNamesTheLast) {
  ScratchDir dir;
  for (int64_t step : {3, 6, 9, 12}) {
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, WriteMarker).ok());
  }
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "step-000009", "step-000012"}));
  EXPECT_EQ(ReadLatest(dir), "step-000012");
  EXPECT_TRUE(std::filesystem::exists(dir / "step-000012/marker"));
  absl::StatusOr<std::string> latest = LatestCheckpoint(dir.path());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, dir / "step-000012");
}

TEST(PublishCheckpoint, AFailedWriteLeavesThePreviousCheckpointInCharge) {
  ScratchDir dir;
  ASSERT_TRUE(PublishCheckpoint(dir.path(), 4, WriteMarker).ok());
  absl::Status failed = PublishCheckpoint(dir.path(), 8, [](const std::string& staging) {
    WriteMarker(staging).IgnoreError();  // half written, then the disk is full
    return absl::ResourceExhaustedError("no space left on device");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  // No staging directory, no step-8 checkpoint, `latest` unchanged.
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "step-000004"}));
  EXPECT_EQ(ReadLatest(dir), "step-000004");
}

TEST(LatestCheckpoint, SaysThereIsNoneToResumeFrom) {
  ScratchDir dir;
  absl::StatusOr<std::string> latest = LatestCheckpoint(dir.path());
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(latest.status().message().find("no complete checkpoint to resume from"),
            std::string::npos);
}

TEST(RunTrainingSteps, RunsFromTheFirstStepAndCheckpointsOnSchedule) {
  TrainOptions options;
  options.steps = 10;
  options.stop_after = 8;
  options.checkpoint_dir = "unused";  // the save hook records instead of writing
  options.checkpoint_every = 3;
  options.log_every = 100;
  std::vector<int64_t> stepped, saved;
  LoopHooks hooks;
  hooks.step = [&](int64_t step, MetricsRecord& record) {
    stepped.push_back(step);
    record.step = step + 1;
    return absl::OkStatus();
  };
  hooks.save = [&](int64_t steps_done) {
    saved.push_back(steps_done);
    return absl::OkStatus();
  };
  // Resumed after step 2: steps 2..7 (0-based), checkpoints after 3 and 6 and at the stop (8).
  ASSERT_TRUE(RunTrainingSteps(options, /*root=*/false, /*first_step=*/2, /*tokens_per_step=*/64,
                               nullptr, hooks)
                  .ok());
  EXPECT_EQ(stepped, (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(saved, (std::vector<int64_t>{3, 6, 8}));
}

TEST(RunTrainingSteps, StopsAtTheFirstFailingStep) {
  TrainOptions options;
  options.steps = 5;
  int calls = 0;
  LoopHooks hooks;
  hooks.step = [&](int64_t step, MetricsRecord&) {
    ++calls;
    return step == 1 ? absl::InternalError("step failed") : absl::OkStatus();
  };
  hooks.save = [](int64_t) { return absl::OkStatus(); };
  EXPECT_EQ(RunTrainingSteps(options, false, 0, 1, nullptr, hooks).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace hcp::train
