#include "runtime/weights/Checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/support/Status.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Json.h"

namespace hcp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Join(const std::string& dir, std::string_view file) {
  return (fs::path(dir) / fs::path(file)).string();
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// Hugging Face's shard names: model-00001-of-00003.safetensors.
std::string ShardName(size_t index, size_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

// Whether `name` has the shape of ShardName's output.
bool IsShardName(std::string_view name) {
  const std::string_view pattern = "model-#####-of-#####.safetensors";
  if (name.size() != pattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    bool ok = pattern[i] == '#' ? (name[i] >= '0' && name[i] <= '9') : name[i] == pattern[i];
    if (!ok) return false;
  }
  return true;
}

// A shard named by the index must be a plain file name inside the checkpoint directory.
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::error_code ec;
  uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (size > kMaxSafetensorsHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size, " bytes is too large for an index"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
  return text.str();
}

// The index's weight_map as tensor name -> shard file name, validated.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  HCP_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  absl::StatusOr<json> index = ParseJsonStrict(text, path);
  if (!index.ok()) return absl::DataLossError(index.status().message());
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  if (!index->is_object()) return bad("not a JSON object");
  if (auto metadata = index->find("metadata");
      metadata != index->end() && !metadata->is_object() && !metadata->is_null()) {
    return bad("\"metadata\" is not an object");
  }
  auto weight_map = index->find("weight_map");
  if (weight_map == index->end() || !weight_map->is_object()) {
    return bad("\"weight_map\" is missing or not an object");
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : weight_map->items()) {
    if (!file.is_string() || !IsPlainFileName(file.get_ref<const std::string&>())) {
      return bad(absl::StrCat("tensor ", Quote(name), " maps to ", Quote(file.dump()),
                              ", not a file name in the checkpoint directory"));
    }
    out[name] = file.get<std::string>();
  }
  return out;
}

}  // namespace

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir,
                                            " does not exist or is "
                                            "not a directory"));
  }
  CheckpointReader reader;
  reader.dir_ = dir;
  const std::string index_path = Join(dir, kCheckpointIndexName);
  if (Exists(index_path)) {
    HCP_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index_path));
    std::map<std::string, std::vector<std::string>> names_by_file;
    for (const auto& [name, file] : weight_map) names_by_file[file].push_back(name);
    for (const auto& [file, names] : names_by_file) {
      const std::string shard_path = Join(dir, file);
      absl::StatusOr<SafetensorsFile> shard = SafetensorsFile::Open(shard_path);
      if (!shard.ok()) {
        return absl::Status(shard.status().code(), absl::StrCat(index_path, " names shard ", file,
                                                                ": ", shard.status().message()));
      }
      for (const std::string& name : names) {
        if (shard->Find(name) == nullptr) {
          return absl::DataLossError(absl::StrCat(index_path, " says tensor ", Quote(name),
                                                  " is in ", file, ", but it is not there"));
        }
        reader.file_of_[name] = reader.files_.size();
      }
      reader.files_.push_back(*std::move(shard));
    }
    return reader;
  }
  const std::string single_path = Join(dir, kCheckpointFileName);
  if (!Exists(single_path)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " holds neither ",
                                            kCheckpointFileName, " nor ", kCheckpointIndexName));
  }
  HCP_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(single_path));
  for (const std::string& name : file.names()) reader.file_of_[name] = 0;
  reader.files_.push_back(std::move(file));
  return reader;
}

absl::StatusOr<CheckpointReader> CheckpointReader::OpenVerified(const std::string& dir) {
  HCP_ASSIGN_OR_RETURN(CheckpointReader reader, Open(dir));
  HCP_RETURN_IF_ERROR(reader.Verify());
  return reader;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  out.reserve(file_of_.size());
  for (const auto& [name, file] : file_of_) out.push_back(name);
  return out;
}

absl::StatusOr<const SafetensorsFile*> CheckpointReader::FileOf(std::string_view name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) {
    return absl::NotFoundError(absl::StrFormat("tensor %s is not in checkpoint %s (%d tensors)",
                                               Quote(name), dir_, file_of_.size()));
  }
  return &files_[it->second];
}

absl::StatusOr<TensorInfo> CheckpointReader::Info(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return *file->Find(name);
}

absl::StatusOr<std::vector<float>> CheckpointReader::ReadF32(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->ReadF32(name);
}

absl::Status CheckpointReader::ReadF32Range(std::string_view name, int64_t begin, int64_t count,
                                            float* out) const {
  HCP_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->ReadF32Range(name, begin, count, out);
}

absl::StatusOr<std::vector<int64_t>> CheckpointReader::ReadInt(std::string_view name) const {
  HCP_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->ReadInt(name);
}

absl::Status CheckpointReader::Verify() const {
  for (const SafetensorsFile& file : files_) HCP_RETURN_IF_ERROR(file.Verify());
  return absl::OkStatus();
}

const std::map<std::string, std::string>& CheckpointReader::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return files_.empty() ? kEmpty : files_.front().metadata();
}

// ------------------------------------------------------------------------------------------------

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                             int64_t max_shard_bytes,
                             const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  // Plan the shards: tensors in name order, a new shard whenever the next would overflow.
  std::vector<const TensorToWrite*> sorted;
  for (const TensorToWrite& tensor : tensors) sorted.push_back(&tensor);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  std::vector<std::vector<TensorToWrite>> shards(1);
  int64_t shard_bytes = 0;
  int64_t total_bytes = 0;
  for (const TensorToWrite* tensor : sorted) {
    absl::StatusOr<int64_t> bytes = TensorBytesToWrite(*tensor);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("writing checkpoint ", dir, ": ", bytes.status().message()));
    }
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + *bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(*tensor);
    shard_bytes += *bytes;
    total_bytes += *bytes;
  }

  std::set<std::string> keep;  // shard files the new checkpoint consists of
  if (shards.size() == 1) {
    HCP_RETURN_IF_ERROR(WriteSafetensors(Join(dir, kCheckpointFileName), shards[0], metadata));
    // The old index (if any) still names a complete old set until this point.
    fs::remove(Join(dir, kCheckpointIndexName), ec);
  } else {
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string file = ShardName(i, shards.size());
      HCP_RETURN_IF_ERROR(WriteSafetensors(Join(dir, file), shards[i], metadata));
      for (const TensorToWrite& tensor : shards[i]) weight_map[tensor.name] = file;
      keep.insert(file);
    }
    json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    HCP_RETURN_IF_ERROR(WriteFileAtomically(Join(dir, kCheckpointIndexName), index.dump(2) + "\n"));
    fs::remove(Join(dir, kCheckpointFileName), ec);
  }
  // Shards of an earlier checkpoint with another shard count would otherwise linger.
  // (Error-code forms throughout: a failed cleanup is not worth failing the write for.)
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (IsShardName(name) && !keep.count(name)) stale.push_back(it->path());
  }
  for (const fs::path& path : stale) fs::remove(path, ec);
  return absl::OkStatus();
}

}  // namespace hcp
