// Optimizer-state checkpoints: everything beyond the model weights that exact resume needs.
//
// In a checkpoint directory DIR (the model weights, written by runtime/weights/Checkpoint.h,
// live beside them; this file does not touch model.safetensors):
//   DIR/optimizer/         the AdamW moments as a checkpoint directory (Checkpoint.h: one
//                          model.safetensors, or shards + index above max_shard_bytes), F32,
//                          full tensors under "<HF name>.exp_avg" and "<HF name>.exp_avg_sq";
//                          when DIR/model.safetensors holds the weights in a lower precision
//                          (train --save-dtype bf16), also the fp32 master of every parameter
//                          under its own name, so that a resume continues exactly: this
//                          directory is then itself a checkpoint of the model, which a resume
//                          loads instead of the weights beside it.
//                          Every file's metadata holds "hybridcp.step" = the state's step and
//                          "hybridcp.train_state.crc32c" = the CRC32C of train_state.json.
//   DIR/train_state.json   {"format": "hybridcp.train_state", "version": 2, "step": 12,
//                           "data": {"epoch": 0, "position": 49164},
//                           "rng": {"seed": 1234, "counter": 0},
//                           "optimizer": {"name": "adamw", "updates": 11, "beta1": 0.9,
//                                         "beta2": 0.95, "eps": 1e-08, "weight_decay": 0.1,
//                                         "max_grad_norm": 1.0},
//                           "schedule": {"max_lr": 0.0003, "min_lr": 3e-05,
//                                        "warmup_steps": 100, "total_steps": 1000},
//                           "run": {"model": "5d1c0a7e", "parameters": 26, "seq": 64,
//                                   "micro_batch": 2, "global_batch": 4, "dtype": "f32",
//                                   "data": {"path": "corpus.bin", "bytes": 123456,
//                                            "head_crc32c": "0b6f3c21"}}}
// A blend's run (train --data W1 PATH1 W2 PATH2 ..., runtime/data/Blend.h) writes its data state
// and its sources in place of "data" and "run.data":
//                           "data": {"windows": 24, "sources": [{"epoch": 0, "position": 520},
//                                                               {"epoch": 1, "position": 65}]},
//                           "run": {..., "data": [{"weight": 0.3, "path": "a.bin", "bytes": 4096,
//                                                  "head_crc32c": "..."}, {"weight": 0.7, ...}]}
// (the weights normalised; a state's form is told by "data.windows").
// "run" says what produced the checkpoint (RunIdentity), so that a resume with another model,
// batch shape, dtype or data is refused rather than silently trained. Version 1 files, written
// before it existed (and before the tensor checksums), are refused: their runs cannot be
// checked.
// Every file is written atomically, the JSON last: a present train_state.json names tensors
// that are complete, and the step in the tensor metadata catches a directory whose tensors were
// rewritten by a later save that did not get to write its JSON; the JSON's CRC32C there catches a
// train_state.json changed or damaged after it was written.
// The moments are stored whole, by parameter name, so a run with another cp/dp split (another
// sharding of the optimizer) can load them: a sharded writer gathers each tensor first and
// hands SaveTrainState full per-parameter arrays; a sharded reader reads its slices
// (ReadMomentsRange, or LoadInto for an AdamW that owns a flat range).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/Blend.h"
#include "runtime/data/TokenData.h"
#include "runtime/train/AdamW.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp::train {

inline constexpr char kTrainStateFileName[] = "train_state.json";
inline constexpr char kOptimizerDirName[] = "optimizer";
inline constexpr char kTrainStateFormat[] = "hybridcp.train_state";
inline constexpr int kTrainStateVersion = 2;
inline constexpr char kOptimizerStepKey[] = "hybridcp.step";
// The CRC32C of train_state.json's text, in the optimizer files' metadata too: the JSON has no
// room for its own checksum, and the two are written by one save.
inline constexpr char kTrainStateCrcKey[] = "hybridcp.train_state.crc32c";

// The runtime's random-number state: the seed and the next counter of its counter-based streams
// (runtime/weights/Init.h).
struct RngState {
  uint64_t seed = 0;
  uint64_t counter = 0;
  bool operator==(const RngState&) const = default;
};

// The token file a run reads: its size and the CRC32C of its first kDataHeadBytes bytes (all of
// it when shorter) identify it wherever it is moved; its absolute path is kept for messages.
inline constexpr int64_t kDataHeadBytes = int64_t{1} << 20;
struct DataIdentity {
  std::string path;
  int64_t bytes = 0;
  std::string head_crc32c;  // Crc32cHex
  bool operator==(const DataIdentity&) const = default;
};
// Reads the file's size and first MiB.
absl::StatusOr<DataIdentity> IdentifyData(const std::string& path);

// One source of a blend: its weight (normalised: a blend's add up to 1) and its token file.
struct BlendPart {
  double weight = 0;
  DataIdentity data;
  bool operator==(const BlendPart&) const = default;
};

// What a checkpoint's training run was: which model (the CRC32C of its parameters' names and
// full shapes, which name every layer's kind: TrainLoop.h's IdentifyRun), the batch shape, the
// dtype and the data. Another cp, dp or ep split of the same global batch is the same run.
struct RunIdentity {
  std::string model;       // Crc32cHex
  int64_t parameters = 0;  // how many (for messages)
  int64_t seq = 0;
  int64_t micro_batch = 0;
  int64_t global_batch = 0;  // sequences per step: micro_batch * dp * grad_accum
  std::string dtype;         // "f32" or "bf16"
  DataIdentity data;         // one source's (--data PATH); empty for a blend
  // A blend's sources in --data's order (--data W1 PATH1 W2 PATH2 ...); empty for one source.
  std::vector<BlendPart> blend = {};
  // --shuffle-seed's: the order the documents were read in; none: as stored. In the JSON as
  // "run": {..., "shuffle_seed": N} only when set (a file without it read as stored).
  std::optional<uint64_t> shuffle_seed;
  bool operator==(const RunIdentity&) const = default;
};

struct TrainState {
  int64_t step = 0;             // steps completed, skipped ones included: the next step's index
  data::DataState data;         // where the next step's data begins (one source)
  data::BlendState blend_data;  // where a blend's next step begins (run.blend not empty)
  RngState rng;
  int64_t optimizer_updates = 0;  // AdamW updates applied (its t); step minus the skipped steps
  AdamWConfig optimizer;
  LrSchedule schedule;
  RunIdentity run;
};

// Every value in range: step >= 0, 0 <= optimizer_updates <= step, data state non-negative (a
// blend's: one per source of run.blend, whose weights are positive and add up to 1),
// ValidateAdamWConfig and ValidateSchedule, a run identity with positive batch dimensions (the
// global batch a multiple of the micro-batch) and a known dtype.
absl::Status ValidateTrainState(const TrainState& state);

// train_state.json's text, and back. Parsing is strict: every field present with its type, a
// known format and a version this build reads; the message names the file and the field.
std::string TrainStateJson(const TrainState& state);
absl::StatusOr<TrainState> ParseTrainStateJson(std::string_view text, std::string_view what);

// "<param>.exp_avg" and "<param>.exp_avg_sq".
std::string ExpAvgName(std::string_view param);
std::string ExpAvgSqName(std::string_view param);

// The full moments of one parameter; both spans hold numel(shape) values. `master` is empty, or
// the fp32 master weight to keep beside them (also numel(shape) values; every parameter of one
// save has one, or none has).
struct MomentsToWrite {
  std::string name;  // the parameter's Hugging Face name
  std::vector<int64_t> shape;
  std::span<const float> exp_avg;
  std::span<const float> exp_avg_sq;
  std::span<const float> master = {};
};

// The moments of every parameter of an optimizer that owns them all (views into `optimizer`).
absl::StatusOr<std::vector<MomentsToWrite>> MomentsOf(const AdamW& optimizer);

// DIR/train_state.json, parsed (ParseTrainStateJson) and checked against the headers of
// DIR/optimizer/ (the step and the JSON's CRC32C they record); what TrainStateReader::Open reads
// first, for a caller that checks the run before it reads any tensor.
absl::StatusOr<TrainState> ReadTrainState(const std::string& dir);
// Whether DIR's train state is whole and undamaged, whichever model wrote it: the JSON parses and
// matches the checksum its save recorded, and every moment matches its checksum and is finite.
// (Whether it fits this run is the resume's question: TrainStateReader::Open, AdoptSavedRun.)
absl::Status CheckTrainStateIntact(const std::string& dir);

// Writes DIR/optimizer/ then DIR/train_state.json (see above). `state` must validate.
absl::Status SaveTrainState(const std::string& dir, const TrainState& state,
                            const std::vector<MomentsToWrite>& moments,
                            int64_t max_shard_bytes = kDefaultMaxShardBytes);

class TrainStateReader {
 public:
  // Reads DIR/train_state.json, opens DIR/optimizer/ and checks it against the model's
  // parameters `expected`: for each one both moments present, F32, with the parameter's shape,
  // and no other tensors; every problem is listed in one message ("optimizer state in DIR does
  // not match the model: 'w.exp_avg' has shape [3, 2], the parameter [2, 3]; missing
  // 'b.exp_avg_sq'; ..."). Also checks the tensors were written for the JSON's step, and
  // verifies them (CheckpointReader::Verify: their checksums, and every value finite). The
  // masters (under the parameters' own names) are optional, but all or none: F32 with the
  // parameter's shape.
  static absl::StatusOr<TrainStateReader> Open(const std::string& dir,
                                               const std::vector<ParamSpec>& expected);

  const TrainState& state() const { return state_; }
  const std::string& dir() const { return dir_; }
  // Whether DIR/optimizer/ holds the fp32 masters (the weights beside are in a lower precision):
  // a resume then loads the parameters from that directory (OpenResume in TrainLoop.h).
  bool has_masters() const { return has_masters_; }

  // Both moments of parameter `name`, whole: the spans must hold its numel values.
  absl::Status ReadMoments(std::string_view name, std::span<float> exp_avg,
                           std::span<float> exp_avg_sq) const;
  // Elements [begin, begin + count) of both flattened moments (a shard of the parameter).
  absl::Status ReadMomentsRange(std::string_view name, int64_t begin, int64_t count, float* exp_avg,
                                float* exp_avg_sq) const;
  // Fills the moments of the optimizer's owned range, whichever range that is, and sets its
  // update count to the state's optimizer_updates.
  absl::Status LoadInto(AdamW& optimizer) const;

 private:
  TrainStateReader(std::string dir, CheckpointReader tensors, TrainState state, bool has_masters)
      : dir_(std::move(dir)),
        tensors_(std::move(tensors)),
        state_(std::move(state)),
        has_masters_(has_masters) {}

  std::string dir_;
  CheckpointReader tensors_;
  TrainState state_;
  bool has_masters_ = false;
};

}  // namespace hcp::train
