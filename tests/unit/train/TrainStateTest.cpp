// Optimizer-state checkpoints: round trips (whole and sharded), and every corruption giving a
// clear message.
#include "runtime/train/TrainState.h"

#include <filesystem>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

using testing::FailsWith;
using testing::ReadFileBytes;
using testing::ScratchDir;
using testing::WriteFileBytes;

TrainState SomeState() {
  TrainState s;
  s.step = 12;
  s.data = {2, 49164};
  s.rng = {std::numeric_limits<uint64_t>::max(), 77};
  s.optimizer_updates = 11;
  s.optimizer = {
      .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_grad_norm = 1.0};
  s.schedule = {.max_lr = 3e-4, .min_lr = 3e-5, .warmup_steps = 100, .total_steps = 1000};
  s.run = {.model = "5d1c0a7e",
           .parameters = 3,
           .seq = 64,
           .micro_batch = 2,
           .global_batch = 8,
           .dtype = "bf16",
           .data = {.path = "/data/corpus.bin", .bytes = 123456, .head_crc32c = "0b6f3c21"},
           .shuffle_seed = std::nullopt};
  return s;
}

void ExpectSameState(const TrainState& a, const TrainState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(a.blend_data, b.blend_data);
  EXPECT_EQ(a.rng, b.rng);
  EXPECT_EQ(a.optimizer_updates, b.optimizer_updates);
  EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_EQ(a.optimizer.eps, b.optimizer.eps);
  EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_EQ(a.optimizer.max_grad_norm, b.optimizer.max_grad_norm);
  EXPECT_EQ(a.schedule.decay, b.schedule.decay);
  EXPECT_EQ(a.schedule.max_lr, b.schedule.max_lr);
  EXPECT_EQ(a.schedule.min_lr, b.schedule.min_lr);
  EXPECT_EQ(a.schedule.warmup_steps, b.schedule.warmup_steps);
  EXPECT_EQ(a.schedule.total_steps, b.schedule.total_steps);
  EXPECT_EQ(a.run, b.run);
}

std::vector<float> ToVector(std::span<const float> s) { return {s.begin(), s.end()}; }

// Three parameters and an optimizer that has taken two steps, so its moments are not zero.
class TrainStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    specs_ = {ParamSpec::WithDefaultDecay("model.embed_tokens.weight", {4, 3}),
              ParamSpec::WithDefaultDecay("model.norm.weight", {3}),
              ParamSpec::WithDefaultDecay("lm_head.weight", {2, 3})};
    absl::StatusOr<FlatLayout> layout = FlatLayout::Create(specs_);
    ASSERT_TRUE(layout.ok());
    layout_ = *layout;
    absl::StatusOr<AdamW> opt = AdamW::Create(layout_, SomeState().optimizer);
    ASSERT_TRUE(opt.ok());
    params_.resize(layout_.total());
    std::vector<float> grads(layout_.total());
    for (int64_t i = 0; i < layout_.total(); ++i) {
      params_[i] = 0.1f * static_cast<float>(i);
      grads[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
    }
    std::vector<ParamGrad> tensors;
    for (size_t i = 0; i < layout_.size(); ++i) {
      tensors.push_back({params_.data() + layout_.offset(i), grads.data() + layout_.offset(i)});
    }
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(opt->Step(1e-3, 1.0, tensors).ok());
    opt_.emplace(*std::move(opt));
    state_ = SomeState();
    state_.optimizer_updates = opt_->updates();
  }

  absl::Status Save(const TrainState& state) {
    absl::StatusOr<std::vector<MomentsToWrite>> moments = MomentsOf(*opt_);
    if (!moments.ok()) return moments.status();
    return SaveTrainState(dir_.path(), state, *moments);
  }
  std::string OptimizerFile() const { return dir_ / "optimizer/model.safetensors"; }

  ScratchDir dir_;
  std::vector<ParamSpec> specs_;
  FlatLayout layout_;
  std::vector<float> params_;
  std::optional<AdamW> opt_;
  TrainState state_;
};

TEST_F(TrainStateTest, JsonRoundTrips) {
  const TrainState s = SomeState();
  absl::StatusOr<TrainState> back = ParseTrainStateJson(TrainStateJson(s), "x.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameState(*back, s);
  EXPECT_NE(TrainStateJson(s).find("\"format\": \"hybridcp.train_state\""), std::string::npos);
}

// --shuffle-seed's seed is saved in the run (any uint64); a run without one writes no field, and a
// state without the field (written before there was one) read the documents as stored.
TEST_F(TrainStateTest, TheShuffleSeedRoundTripsAndIsAbsentWithoutOne) {
  TrainState s = SomeState();
  EXPECT_EQ(TrainStateJson(s).find("shuffle_seed"), std::string::npos);
  absl::StatusOr<TrainState> back = ParseTrainStateJson(TrainStateJson(s), "x.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->run.shuffle_seed, std::nullopt);
  s.run.shuffle_seed = (uint64_t{1} << 63) + 5;  // beyond int64
  back = ParseTrainStateJson(TrainStateJson(s), "x.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->run.shuffle_seed, (uint64_t{1} << 63) + 5);
  std::string negative = TrainStateJson(s);
  const std::string field = "\"shuffle_seed\": 9223372036854775813";
  ASSERT_NE(negative.find(field), std::string::npos) << negative;
  negative.replace(negative.find(field), field.size(), "\"shuffle_seed\": -1");
  EXPECT_TRUE(FailsWith(ParseTrainStateJson(negative, "x.json").status(), "run.shuffle_seed"));
}

// The schedule's decay is saved; a state written before there were three reads as cosine, and a
// decay of another name is refused.
TEST_F(TrainStateTest, TheScheduleKindRoundTripsAndDefaultsToCosine) {
  TrainState s = SomeState();
  s.schedule.decay = LrDecay::kLinear;
  absl::StatusOr<TrainState> back = ParseTrainStateJson(TrainStateJson(s), "x.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->schedule.decay, LrDecay::kLinear);
  std::string old = TrainStateJson(s);
  const std::string field = "\"decay\": \"linear\",";
  ASSERT_NE(old.find(field), std::string::npos);
  std::string without = old;
  without.erase(without.find(field), field.size());
  back = ParseTrainStateJson(without, "x.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->schedule.decay, LrDecay::kCosine);
  std::string other = old;
  other.replace(other.find("linear"), 6, "square");
  EXPECT_TRUE(FailsWith(ParseTrainStateJson(other, "x.json").status(),
                        "\"schedule.decay\" is missing or not cosine, linear or constant"));
}

TEST_F(TrainStateTest, SavesAndLoadsExactly) {
  ASSERT_TRUE(Save(state_).ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ / kTrainStateFileName));
  EXPECT_TRUE(std::filesystem::exists(OptimizerFile()));
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), specs_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ExpectSameState(reader->state(), state_);

  absl::StatusOr<AdamW> fresh = AdamW::Create(layout_, reader->state().optimizer);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(reader->LoadInto(*fresh).ok());
  EXPECT_EQ(fresh->updates(), 2);
  EXPECT_EQ(ToVector(fresh->exp_avg()), ToVector(opt_->exp_avg()));
  EXPECT_EQ(ToVector(fresh->exp_avg_sq()), ToVector(opt_->exp_avg_sq()));

  std::vector<float> m(6), v(6);
  ASSERT_TRUE(reader->ReadMoments("lm_head.weight", m, v).ok());
  EXPECT_EQ(m, ToVector(*opt_->ExpAvgOf("lm_head.weight")));
  EXPECT_EQ(v, ToVector(*opt_->ExpAvgSqOf("lm_head.weight")));
  std::vector<float> wrong(5);
  EXPECT_TRUE(FailsWith(reader->ReadMoments("lm_head.weight", wrong, v),
                        "have 6 elements; buffers of 5 and 6 given"));
  float one_m = 0, one_v = 0;
  ASSERT_TRUE(reader->ReadMomentsRange("model.norm.weight", 2, 1, &one_m, &one_v).ok());
  EXPECT_EQ(one_m, (*opt_->ExpAvgOf("model.norm.weight"))[2]);
}

// Moments saved whole load into any sharding of the optimizer (another cp/dp split).
TEST_F(TrainStateTest, LoadsIntoAnotherSharding) {
  ASSERT_TRUE(Save(state_).ok());
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), specs_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (int64_t parts : {2, 3, 5}) {
    std::vector<float> m, v;
    for (int64_t k = 0; k < parts; ++k) {
      absl::StatusOr<AdamW> shard =
          AdamW::Create(layout_, state_.optimizer, ShardRange(layout_.total(), k, parts));
      ASSERT_TRUE(shard.ok());
      ASSERT_TRUE(reader->LoadInto(*shard).ok());
      EXPECT_EQ(shard->updates(), 2);
      m.insert(m.end(), shard->exp_avg().begin(), shard->exp_avg().end());
      v.insert(v.end(), shard->exp_avg_sq().begin(), shard->exp_avg_sq().end());
    }
    EXPECT_EQ(m, ToVector(opt_->exp_avg())) << parts;
    EXPECT_EQ(v, ToVector(opt_->exp_avg_sq())) << parts;
  }
}

TEST_F(TrainStateTest, ShardedFilesLoadToo) {
  absl::StatusOr<std::vector<MomentsToWrite>> moments = MomentsOf(*opt_);
  ASSERT_TRUE(moments.ok());
  ASSERT_TRUE(SaveTrainState(dir_.path(), state_, *moments, /*max_shard_bytes=*/64).ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ / "optimizer/model.safetensors.index.json"));
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), specs_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<AdamW> fresh = AdamW::Create(layout_, state_.optimizer);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(reader->LoadInto(*fresh).ok());
  EXPECT_EQ(ToVector(fresh->exp_avg_sq()), ToVector(opt_->exp_avg_sq()));
}

TEST_F(TrainStateTest, SavingRefusesWhatCouldNotBeLoaded) {
  TrainState bad = state_;
  bad.optimizer_updates = bad.step + 1;
  EXPECT_TRUE(FailsWith(Save(bad), "need 0 <= optimizer updates (13) <= step (12)"));
  bad = state_;
  bad.data.position = -1;
  EXPECT_TRUE(FailsWith(Save(bad), "must not be negative"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / kTrainStateFileName));
  absl::StatusOr<AdamW> shard = AdamW::Create(layout_, state_.optimizer, FlatRange{0, 5});
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(FailsWith(MomentsOf(*shard).status(), "gather each parameter's moments"));
}

TEST_F(TrainStateTest, MissingTensorIsNamed) {
  absl::StatusOr<std::vector<MomentsToWrite>> moments = MomentsOf(*opt_);
  ASSERT_TRUE(moments.ok());
  moments->pop_back();  // lm_head.weight
  ASSERT_TRUE(SaveTrainState(dir_.path(), state_, *moments).ok());
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), specs_);
  EXPECT_TRUE(FailsWith(reader.status(),
                        "does not match the model: missing "
                        "'lm_head.weight.exp_avg'; missing "
                        "'lm_head.weight.exp_avg_sq'"));
}

TEST_F(TrainStateTest, WrongShapeAndExtraTensorsAreNamed) {
  ASSERT_TRUE(Save(state_).ok());
  std::vector<ParamSpec> other = specs_;
  other[2].shape = {3, 2};
  other.erase(other.begin() + 1);  // the model has no norm weight
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), other);
  EXPECT_TRUE(FailsWith(reader.status(),
                        "'lm_head.weight.exp_avg' has shape [2, 3], the parameter [3, 2]"));
  EXPECT_TRUE(
      FailsWith(reader.status(), "unexpected 'model.norm.weight.exp_avg' (no model parameter"));
  // LoadInto checks the optimizer's own layout too.
  absl::StatusOr<TrainStateReader> good = TrainStateReader::Open(dir_.path(), specs_);
  ASSERT_TRUE(good.ok());
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create(other);
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<AdamW> opt = AdamW::Create(*layout, state_.optimizer);
  ASSERT_TRUE(opt.ok());
  EXPECT_TRUE(FailsWith(good->LoadInto(*opt), "has shape [2, 3], the parameter [3, 2]"));
}

TEST_F(TrainStateTest, TruncatedTensorFileIsRefused) {
  ASSERT_TRUE(Save(state_).ok());
  const std::string bytes = ReadFileBytes(OptimizerFile());
  WriteFileBytes(OptimizerFile(), bytes.substr(0, bytes.size() - 10));
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), specs_);
  EXPECT_FALSE(reader.ok());
  EXPECT_TRUE(FailsWith(reader.status(), "model.safetensors"));
  WriteFileBytes(OptimizerFile(), bytes.substr(0, 5));
  EXPECT_TRUE(FailsWith(TrainStateReader::Open(dir_.path(), specs_).status(), "model.safetensors"));
  std::filesystem::remove(OptimizerFile());
  EXPECT_TRUE(FailsWith(TrainStateReader::Open(dir_.path(), specs_).status(),
                        "holds neither model.safetensors"));
}

TEST_F(TrainStateTest, BadJsonIsRefused) {
  ASSERT_TRUE(Save(state_).ok());
  const std::string path = dir_ / kTrainStateFileName;
  const std::string good = ReadFileBytes(path);
  auto open_with = [&](const std::string& text) {
    WriteFileBytes(path, text);
    return TrainStateReader::Open(dir_.path(), specs_).status();
  };
  EXPECT_TRUE(FailsWith(open_with(good.substr(0, good.size() / 2)), "not valid JSON"));
  EXPECT_TRUE(FailsWith(open_with("[]"), "not a JSON object"));
  EXPECT_TRUE(FailsWith(open_with(R"({"format": "other"})"), "not a hybridcp train state"));
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    size_t pos = text.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    return text.replace(pos, from.size(), to);
  };
  EXPECT_TRUE(FailsWith(open_with(replaced("\"version\": 2", "\"version\": 3")),
                        "version 3; this build reads version 2"));
  // A checkpoint of an older hybridcp: its run cannot be checked.
  EXPECT_TRUE(FailsWith(open_with(replaced("\"version\": 2", "\"version\": 1")),
                        "version 1, written by an older hybridcp, without the run's identity"));
  EXPECT_TRUE(
      FailsWith(open_with(replaced("\"run\"", "\"ran\"")), "\"run\" is missing or not an object"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"head_crc32c\": \"0b6f3c21\"", "\"head_crc32c\": 7")),
                        "\"run.data.head_crc32c\" is missing or not a string"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"global_batch\": 8", "\"global_batch\": 7")),
                        "global batch 7 (a multiple of the micro-batch)"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"dtype\": \"bf16\"", "\"dtype\": \"f16\"")),
                        "dtype is \"f16\", not f32 or bf16"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"position\": 49164", "\"position\": \"x\"")),
                        "\"data.position\" is missing or not an integer"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"seed\"", "\"sead\"")),
                        "\"rng.seed\" is missing or not a non-negative integer"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"adamw\"", "\"sgd\"")), "\"optimizer.name\""));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"beta2\": 0.95", "\"beta2\": 1.5")),
                        "beta2 must be in [0, 1)"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"total_steps\": 1000", "\"total_steps\": 0")),
                        "total_steps must be at least 1"));
  EXPECT_TRUE(FailsWith(open_with(replaced("\"step\": 12", "\"step\": 12, \"step\": 13")),
                        "duplicate key"));
  // Intact again: loads.
  EXPECT_TRUE(open_with(good).ok());
  std::filesystem::remove(path);
  absl::Status missing = TrainStateReader::Open(dir_.path(), specs_).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(FailsWith(missing, "no train state"));
}

// A train_state.json changed after it was written (a value edited, a flipped bit) no longer
// matches the CRC32C its save recorded in the optimizer files.
TEST_F(TrainStateTest, ChangedJsonIsRefused) {
  ASSERT_TRUE(Save(state_).ok());
  const std::string path = dir_ / kTrainStateFileName;
  std::string text = ReadFileBytes(path);
  const size_t at = text.find("\"position\": 49164");
  ASSERT_NE(at, std::string::npos);
  text[at + 13] = '5';  // 49164 -> 49165: still a valid state
  WriteFileBytes(path, text);
  absl::Status status = TrainStateReader::Open(dir_.path(), specs_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(FailsWith(status, "train_state.json does not match the checksum its save recorded"));
  EXPECT_TRUE(FailsWith(ReadTrainState(dir_.path()).status(), "does not match the checksum"));
}

// The tensors of a later save whose JSON never got written do not pass for the older state.
TEST_F(TrainStateTest, TensorsFromAnotherStepAreRefused) {
  ASSERT_TRUE(Save(state_).ok());
  const std::string old_json = ReadFileBytes(dir_ / kTrainStateFileName);
  TrainState later = state_;
  later.step = 13;
  ASSERT_TRUE(Save(later).ok());
  WriteFileBytes(dir_ / kTrainStateFileName, old_json);
  EXPECT_TRUE(FailsWith(TrainStateReader::Open(dir_.path(), specs_).status(),
                        "holds the optimizer state of step 13, but"));
}

// Open verifies the moments: a flipped bit (DataLoss, naming the file and the tensor) or a NaN
// stored with its checksum (naming the tensor and the element) is refused.
TEST_F(TrainStateTest, DamagedOrNonFiniteMomentsAreRefused) {
  ASSERT_TRUE(Save(state_).ok());
  const std::string good = ReadFileBytes(OptimizerFile());
  std::string flipped = good;
  flipped[flipped.size() - 3] = static_cast<char>(flipped[flipped.size() - 3] ^ 0x10);
  WriteFileBytes(OptimizerFile(), flipped);
  absl::Status status = TrainStateReader::Open(dir_.path(), specs_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  // Tensors are stored by name: the last bytes are model.norm.weight.exp_avg_sq's.
  EXPECT_TRUE(FailsWith(status,
                        "optimizer/model.safetensors: tensor "
                        "'model.norm.weight.exp_avg_sq' does not match its checksum"));

  std::vector<float> m(3, 0.0f), v(3, 0.0f);
  v[1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<MomentsToWrite> moments = *MomentsOf(*opt_);
  moments[1] = {"model.norm.weight", {3}, m, v};
  ASSERT_TRUE(SaveTrainState(dir_.path(), state_, moments).ok());
  EXPECT_TRUE(FailsWith(TrainStateReader::Open(dir_.path(), specs_).status(),
                        "tensor 'model.norm.weight.exp_avg_sq' holds NaN at element 1 (of 3): "
                        "refusing to train from it"));
}

// A blend's run saves each source's weight and identity, and its data state each source's
// position and the windows done; a state whose parts do not fit together is refused.
TEST_F(TrainStateTest, ABlendsStateRoundTripsAndMustFitItsSources) {
  TrainState s = SomeState();
  s.data = {};
  s.run.data = {};
  s.run.blend = {{0.25, {.path = "/data/a.bin", .bytes = 4096, .head_crc32c = "00000001"}},
                 {0.75, {.path = "/data/b.bin", .bytes = 8192, .head_crc32c = "00000002"}}};
  s.blend_data = {.windows = 24, .sources = {{0, 520}, {1, 65}}};
  const std::string text = TrainStateJson(s);
  EXPECT_NE(text.find("\"windows\": 24"), std::string::npos) << text;
  absl::StatusOr<TrainState> back = ParseTrainStateJson(text, "x.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameState(*back, s);

  TrainState bad = s;
  bad.run.blend[1].weight = 0.5;
  EXPECT_TRUE(FailsWith(ValidateTrainState(bad), "the blend's weights add up to 0.75"));
  bad = s;
  bad.blend_data.sources.pop_back();
  EXPECT_TRUE(
      FailsWith(ValidateTrainState(bad), "the data state has 1 sources, the run's blend 2"));
  bad = s;
  bad.blend_data.sources[0].position = -1;
  EXPECT_TRUE(FailsWith(ValidateTrainState(bad), "blend source 0's epoch 0 and position -1"));
  bad = s;
  bad.run.blend[0].weight = -0.25;
  bad.run.blend[1].weight = 1.25;
  EXPECT_TRUE(FailsWith(ValidateTrainState(bad), "weight -0.25 and size 4096 must be positive"));
  // The JSON's parts must be one per source of the data state.
  std::string fewer = text;
  const size_t second = fewer.find(",\n      {\n        \"weight\": 0.75");
  ASSERT_NE(second, std::string::npos) << text;
  fewer.erase(second, fewer.find('}', second) + 1 - second);
  EXPECT_TRUE(FailsWith(ParseTrainStateJson(fewer, "x.json").status(),
                        "\"run.data\" is missing or not an array of the 2 sources"));
}

// Weights saved in a lower precision keep their fp32 masters with the moments: every parameter's
// or none, read back exactly, and a resume can tell (has_masters).
TEST_F(TrainStateTest, MastersAreKeptWithTheMomentsAllOrNone) {
  std::vector<MomentsToWrite> moments = *MomentsOf(*opt_);
  for (size_t i = 0; i < moments.size(); ++i) {
    moments[i].master =
        std::span<const float>(params_).subspan(layout_.offset(i), layout_.numel(i));
  }
  ASSERT_TRUE(SaveTrainState(dir_.path(), state_, moments).ok());
  absl::StatusOr<TrainStateReader> reader = TrainStateReader::Open(dir_.path(), specs_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE(reader->has_masters());
  absl::StatusOr<CheckpointReader> masters = CheckpointReader::Open(dir_ / "optimizer");
  ASSERT_TRUE(masters.ok()) << masters.status();
  absl::StatusOr<std::vector<float>> head = masters->ReadF32("lm_head.weight");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(*head, std::vector<float>(params_.begin() + layout_.offset(2), params_.end()));

  moments[1].master = {};
  EXPECT_TRUE(FailsWith(SaveTrainState(dir_.path(), state_, moments),
                        "parameter model.norm.weight lacks a master weight"));
  ASSERT_TRUE(Save(state_).ok());
  reader = TrainStateReader::Open(dir_.path(), specs_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE(reader->has_masters());
}

TEST(DataIdentity, SizeAndTheStartIdentifyTheFileWhereverItIs) {
  ScratchDir dir;
  std::string bytes(kDataHeadBytes + 100, 'a');
  WriteFileBytes(dir / "a.bin", bytes);
  WriteFileBytes(dir / "moved.bin", bytes);
  bytes.back() = 'b';  // past the first MiB: the same identity
  WriteFileBytes(dir / "tail.bin", bytes);
  bytes[10] = 'b';
  WriteFileBytes(dir / "head.bin", bytes);
  WriteFileBytes(dir / "short.bin", bytes.substr(0, 1000));
  absl::StatusOr<DataIdentity> a = IdentifyData(dir / "a.bin");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->path, dir / "a.bin");
  EXPECT_EQ(a->bytes, kDataHeadBytes + 100);
  auto same = [&](const std::string& name) {
    absl::StatusOr<DataIdentity> other = IdentifyData(dir / name);
    return other.ok() && other->bytes == a->bytes && other->head_crc32c == a->head_crc32c;
  };
  EXPECT_TRUE(same("moved.bin"));
  EXPECT_TRUE(same("tail.bin"));
  EXPECT_FALSE(same("head.bin"));
  EXPECT_FALSE(same("short.bin"));
  EXPECT_EQ(IdentifyData(dir / "none.bin").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hcp::train
