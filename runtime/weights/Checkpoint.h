// Checkpoint directories as Hugging Face lays them out: either one `model.safetensors`, or
// shards `model-00001-of-00003.safetensors`... listed by `model.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {tensor name: shard file}}).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/weights/Safetensors.h"

namespace hcp {

inline constexpr char kCheckpointFileName[] = "model.safetensors";
inline constexpr char kCheckpointIndexName[] = "model.safetensors.index.json";
// transformers' default max_shard_size, "5GB".
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

class CheckpointReader {
 public:
  // Opens `dir`. Where both forms are present the index wins: WriteCheckpoint writes the index
  // last and removes the other form after it, so a present index always names a complete set.
  // Every shard is opened (headers validated) and checked to hold the tensors the index says.
  static absl::StatusOr<CheckpointReader> Open(const std::string& dir);
  // Open, then Verify: how a checkpoint that is trained from is opened (every tensor read once
  // more, to know it is intact before any of it is used).
  static absl::StatusOr<CheckpointReader> OpenVerified(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  bool Has(std::string_view name) const { return file_of_.count(name) != 0; }
  // dtype and shape (and the byte range within its file); NotFound names tensor and directory.
  absl::StatusOr<TensorInfo> Info(std::string_view name) const;
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name) const;
  absl::Status ReadF32Range(std::string_view name, int64_t begin, int64_t count, float* out) const;
  absl::StatusOr<std::vector<int64_t>> ReadInt(std::string_view name) const;
  // SafetensorsFile::Verify on every file: the tensors match their checksums and the float ones
  // are finite. Reads the whole checkpoint.
  absl::Status Verify() const;
  // The "__metadata__" of the first file (WriteCheckpoint puts the same metadata in every shard).
  const std::map<std::string, std::string>& metadata() const;
  size_t num_files() const { return files_.size(); }

 private:
  CheckpointReader() = default;
  absl::StatusOr<const SafetensorsFile*> FileOf(std::string_view name) const;

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> file_of_;  // tensor name -> index into files_
};

// Writes `tensors` into `dir` (created if missing). If they fit in max_shard_bytes (<= 0: no
// limit) the result is one model.safetensors; otherwise shards of at most max_shard_bytes each
// (a tensor larger than that gets a shard of its own), filled in name order, plus the index.
// `metadata` goes into every file's "__metadata__". Each file is written atomically and the
// index last; afterwards the other form and shard files the new index does not name are
// removed. Rewriting a sharded checkpoint in place is therefore atomic per file, not as a whole:
// for that, write each checkpoint into a fresh directory.
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                             int64_t max_shard_bytes = kDefaultMaxShardBytes,
                             const std::map<std::string, std::string>& metadata = {});

}  // namespace hcp
