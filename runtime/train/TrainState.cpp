#include "runtime/train/TrainState.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Crc32c.h"
#include "runtime/support/Json.h"
#include "runtime/support/Status.h"

namespace hcp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Join(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

// Typed access to a field at a dotted path; errors name the file and the path.
class Fields {
 public:
  explicit Fields(std::string_view what) : what_(what) {}

  absl::StatusOr<const json*> Object(const json& parent, const char* key,
                                     const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end() || !it->is_object()) return Bad(path, "an object");
    return &*it;
  }
  absl::StatusOr<const json*> Array(const json& parent, const char* key,
                                    const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end() || !it->is_array() || it->empty()) return Bad(path, "a non-empty array");
    return &*it;
  }
  // Element i of an array, an object ("data.sources[1]").
  absl::StatusOr<const json*> Element(const json& array, size_t i, const std::string& path) const {
    if (!array.at(i).is_object()) return Bad(path, "an object");
    return &array.at(i);
  }
  absl::Status Int(const json& parent, const char* key, const std::string& path,
                   int64_t* out) const {
    auto it = parent.find(key);
    if (it != parent.end() && it->is_number_integer()) {
      if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
        return Bad(path, "an integer that fits int64");
      }
      *out = it->get<int64_t>();
      return absl::OkStatus();
    }
    return Bad(path, "an integer");
  }
  absl::Status UInt(const json& parent, const char* key, const std::string& path,
                    uint64_t* out) const {
    auto it = parent.find(key);
    if (it != parent.end() && it->is_number_unsigned()) {
      *out = it->get<uint64_t>();
      return absl::OkStatus();
    }
    return Bad(path, "a non-negative integer");
  }
  absl::Status Double(const json& parent, const char* key, const std::string& path,
                      double* out) const {
    auto it = parent.find(key);
    if (it != parent.end() && it->is_number()) {
      *out = it->get<double>();
      return absl::OkStatus();
    }
    return Bad(path, "a number");
  }

  absl::Status String(const json& parent, const char* key, const std::string& path,
                      std::string* out) const {
    auto it = parent.find(key);
    if (it != parent.end() && it->is_string()) {
      *out = it->get<std::string>();
      return absl::OkStatus();
    }
    return Bad(path, "a string");
  }

  absl::Status Bad(const std::string& path, std::string_view expected) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"%s\" is missing or not %s", what_, path, std::string(expected)));
  }

 private:
  std::string what_;
};

// Moments of parameter `name`: both tensors' elements [begin, begin + count).
absl::Status ReadRange(const CheckpointReader& tensors, std::string_view name, int64_t begin,
                       int64_t count, float* m, float* v) {
  HCP_RETURN_IF_ERROR(tensors.ReadF32Range(ExpAvgName(name), begin, count, m));
  return tensors.ReadF32Range(ExpAvgSqName(name), begin, count, v);
}

}  // namespace

namespace {

// A blend's data state fits its sources: one state per source, none negative; the weights are
// positive and add up to 1. One source's run has no blend state.
absl::Status ValidateBlend(const TrainState& s) {
  const std::vector<BlendPart>& parts = s.run.blend;
  const data::BlendState& state = s.blend_data;
  if (parts.size() != state.sources.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train state: the data state has %d sources, the run's blend %d",
                        state.sources.size(), parts.size()));
  }
  if (parts.empty()) {
    if (state.windows == 0) return absl::OkStatus();
    return absl::InvalidArgumentError("train state: a blend's windows without its sources");
  }
  if (state.windows < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train state: the blend's windows done, %d, must not be negative", state.windows));
  }
  double sum = 0;
  for (size_t d = 0; d < parts.size(); ++d) {
    const data::DataState& at = state.sources[d];
    if (at.epoch < 0 || at.position < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "train state: blend source %d's epoch %d and position %d must not be negative", d,
          at.epoch, at.position));
    }
    if (!std::isfinite(parts[d].weight) || !(parts[d].weight > 0) || parts[d].data.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("train state: blend source %d's weight %g and size %d must be positive",
                          d, parts[d].weight, parts[d].data.bytes));
    }
    sum += parts[d].weight;
  }
  if (std::abs(sum - 1) > 1e-9) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train state: the blend's weights add up to %.17g, not 1", sum));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrainState(const TrainState& s) {
  if (s.step < 0 || s.optimizer_updates < 0 || s.optimizer_updates > s.step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train state: need 0 <= optimizer updates (%d) <= step (%d)", s.optimizer_updates, s.step));
  }
  if (s.data.epoch < 0 || s.data.position < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train state: data epoch %d and position %d must not be negative",
                        s.data.epoch, s.data.position));
  }
  HCP_RETURN_IF_ERROR(ValidateBlend(s));
  HCP_RETURN_IF_ERROR(ValidateAdamWConfig(s.optimizer));
  HCP_RETURN_IF_ERROR(ValidateSchedule(s.schedule));
  const RunIdentity& r = s.run;
  if (r.seq <= 0 || r.micro_batch <= 0 || r.global_batch <= 0 || r.parameters <= 0 ||
      r.global_batch % r.micro_batch != 0 || r.data.bytes < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train state: the run's seq %d, micro-batch %d, global batch %d (a multiple of the "
        "micro-batch), parameter count %d and data size %d must be positive",
        r.seq, r.micro_batch, r.global_batch, r.parameters, r.data.bytes));
  }
  if (r.dtype != "f32" && r.dtype != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrFormat("train state: the run's dtype is \"%s\", not f32 or bf16", r.dtype));
  }
  return absl::OkStatus();
}

absl::StatusOr<DataIdentity> IdentifyData(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code error;
  const uintmax_t bytes = fs::file_size(path, error);
  if (!in || error) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string head(static_cast<size_t>(std::min<uintmax_t>(bytes, kDataHeadBytes)), '\0');
  if (!in.read(head.data(), static_cast<std::streamsize>(head.size()))) {
    return absl::InternalError(absl::StrCat("cannot read the start of ", path));
  }
  std::error_code ignored;  // without an absolute path, the one given is as good for messages
  fs::path absolute = fs::absolute(path, ignored);
  return DataIdentity{absolute.empty() ? path : absolute.lexically_normal().string(),
                      static_cast<int64_t>(bytes), Crc32cHex(Crc32c(0, head.data(), head.size()))};
}

std::string TrainStateJson(const TrainState& s) {
  ordered_json j;
  j["format"] = kTrainStateFormat;
  j["version"] = kTrainStateVersion;
  j["step"] = s.step;
  if (s.run.blend.empty()) {
    j["data"] = {{"epoch", s.data.epoch}, {"position", s.data.position}};
  } else {
    ordered_json sources = ordered_json::array();
    for (const data::DataState& at : s.blend_data.sources) {
      sources.push_back({{"epoch", at.epoch}, {"position", at.position}});
    }
    j["data"] = {{"windows", s.blend_data.windows}, {"sources", sources}};
  }
  j["rng"] = {{"seed", s.rng.seed}, {"counter", s.rng.counter}};
  j["optimizer"] = {{"name", "adamw"},
                    {"updates", s.optimizer_updates},
                    {"beta1", s.optimizer.beta1},
                    {"beta2", s.optimizer.beta2},
                    {"eps", s.optimizer.eps},
                    {"weight_decay", s.optimizer.weight_decay},
                    {"max_grad_norm", s.optimizer.max_grad_norm}};
  j["schedule"] = {{"decay", std::string(LrDecayName(s.schedule.decay))},
                   {"max_lr", s.schedule.max_lr},
                   {"min_lr", s.schedule.min_lr},
                   {"warmup_steps", s.schedule.warmup_steps},
                   {"total_steps", s.schedule.total_steps}};
  const RunIdentity& r = s.run;
  j["run"] = {
      {"model", r.model},
      {"parameters", r.parameters},
      {"seq", r.seq},
      {"micro_batch", r.micro_batch},
      {"global_batch", r.global_batch},
      {"dtype", r.dtype},
      {"data",
       {{"path", r.data.path}, {"bytes", r.data.bytes}, {"head_crc32c", r.data.head_crc32c}}}};
  if (!r.blend.empty()) {
    ordered_json parts = ordered_json::array();
    for (const BlendPart& p : r.blend) {
      parts.push_back({{"weight", p.weight},
                       {"path", p.data.path},
                       {"bytes", p.data.bytes},
                       {"head_crc32c", p.data.head_crc32c}});
    }
    j["run"]["data"] = parts;
  }
  if (r.shuffle_seed) j["run"]["shuffle_seed"] = *r.shuffle_seed;
  return j.dump(2) + "\n";
}

absl::StatusOr<TrainState> ParseTrainStateJson(std::string_view text, std::string_view what) {
  HCP_ASSIGN_OR_RETURN(json j, ParseJsonStrict(text, what));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": not a JSON object"));
  }
  Fields f(what);
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || *format != kTrainStateFormat) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"format\" is not \"%s\": not a hybridcp train state",
                        std::string(what), kTrainStateFormat));
  }
  int64_t version = 0;
  HCP_RETURN_IF_ERROR(f.Int(j, "version", "version", &version));
  if (version == 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: version 1, written by an older hybridcp, without the run's identity and the tensor "
        "checksums that a resume checks; this build resumes version %d only: start the run "
        "again, or finish it with the hybridcp that wrote it",
        std::string(what), kTrainStateVersion));
  }
  if (version != kTrainStateVersion) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: version %d; this build reads version %d",
                                                      std::string(what), version,
                                                      kTrainStateVersion));
  }
  TrainState s;
  HCP_RETURN_IF_ERROR(f.Int(j, "step", "step", &s.step));
  HCP_ASSIGN_OR_RETURN(const json* data, f.Object(j, "data", "data"));
  // A blend's state counts windows (TrainState.h); one source's is an epoch and a position.
  const bool blend = data->contains("windows");
  if (blend) {
    HCP_RETURN_IF_ERROR(f.Int(*data, "windows", "data.windows", &s.blend_data.windows));
    HCP_ASSIGN_OR_RETURN(const json* sources, f.Array(*data, "sources", "data.sources"));
    for (size_t d = 0; d < sources->size(); ++d) {
      const std::string path = absl::StrFormat("data.sources[%d]", d);
      HCP_ASSIGN_OR_RETURN(const json* source, f.Element(*sources, d, path));
      data::DataState& at = s.blend_data.sources.emplace_back();
      HCP_RETURN_IF_ERROR(f.Int(*source, "epoch", path + ".epoch", &at.epoch));
      HCP_RETURN_IF_ERROR(f.Int(*source, "position", path + ".position", &at.position));
    }
  } else {
    HCP_RETURN_IF_ERROR(f.Int(*data, "epoch", "data.epoch", &s.data.epoch));
    HCP_RETURN_IF_ERROR(f.Int(*data, "position", "data.position", &s.data.position));
  }
  HCP_ASSIGN_OR_RETURN(const json* rng, f.Object(j, "rng", "rng"));
  HCP_RETURN_IF_ERROR(f.UInt(*rng, "seed", "rng.seed", &s.rng.seed));
  HCP_RETURN_IF_ERROR(f.UInt(*rng, "counter", "rng.counter", &s.rng.counter));
  HCP_ASSIGN_OR_RETURN(const json* opt, f.Object(j, "optimizer", "optimizer"));
  auto name = opt->find("name");
  if (name == opt->end() || !name->is_string() || *name != "adamw") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: \"optimizer.name\" is not \"adamw\" (the only optimizer this build has)",
        std::string(what)));
  }
  HCP_RETURN_IF_ERROR(f.Int(*opt, "updates", "optimizer.updates", &s.optimizer_updates));
  HCP_RETURN_IF_ERROR(f.Double(*opt, "beta1", "optimizer.beta1", &s.optimizer.beta1));
  HCP_RETURN_IF_ERROR(f.Double(*opt, "beta2", "optimizer.beta2", &s.optimizer.beta2));
  HCP_RETURN_IF_ERROR(f.Double(*opt, "eps", "optimizer.eps", &s.optimizer.eps));
  HCP_RETURN_IF_ERROR(
      f.Double(*opt, "weight_decay", "optimizer.weight_decay", &s.optimizer.weight_decay));
  HCP_RETURN_IF_ERROR(
      f.Double(*opt, "max_grad_norm", "optimizer.max_grad_norm", &s.optimizer.max_grad_norm));
  HCP_ASSIGN_OR_RETURN(const json* sched, f.Object(j, "schedule", "schedule"));
  // "decay" since the schedules became three; a state without it is a cosine run's.
  if (sched->contains("decay")) {
    std::string decay;
    HCP_RETURN_IF_ERROR(f.String(*sched, "decay", "schedule.decay", &decay));
    absl::StatusOr<LrDecay> parsed = ParseLrDecay(decay);
    if (!parsed.ok()) return f.Bad("schedule.decay", "cosine, linear or constant");
    s.schedule.decay = *parsed;
  }
  HCP_RETURN_IF_ERROR(f.Double(*sched, "max_lr", "schedule.max_lr", &s.schedule.max_lr));
  HCP_RETURN_IF_ERROR(f.Double(*sched, "min_lr", "schedule.min_lr", &s.schedule.min_lr));
  HCP_RETURN_IF_ERROR(
      f.Int(*sched, "warmup_steps", "schedule.warmup_steps", &s.schedule.warmup_steps));
  HCP_RETURN_IF_ERROR(
      f.Int(*sched, "total_steps", "schedule.total_steps", &s.schedule.total_steps));
  HCP_ASSIGN_OR_RETURN(const json* run, f.Object(j, "run", "run"));
  RunIdentity& r = s.run;
  HCP_RETURN_IF_ERROR(f.String(*run, "model", "run.model", &r.model));
  HCP_RETURN_IF_ERROR(f.Int(*run, "parameters", "run.parameters", &r.parameters));
  HCP_RETURN_IF_ERROR(f.Int(*run, "seq", "run.seq", &r.seq));
  HCP_RETURN_IF_ERROR(f.Int(*run, "micro_batch", "run.micro_batch", &r.micro_batch));
  HCP_RETURN_IF_ERROR(f.Int(*run, "global_batch", "run.global_batch", &r.global_batch));
  HCP_RETURN_IF_ERROR(f.String(*run, "dtype", "run.dtype", &r.dtype));
  if (blend) {
    // One part per source of the data state.
    auto parts = run->find("data");
    if (parts == run->end() || !parts->is_array() || parts->size() != s.blend_data.sources.size()) {
      return f.Bad("run.data", absl::StrFormat("an array of the %d sources \"data.sources\" has",
                                               s.blend_data.sources.size()));
    }
    for (size_t d = 0; d < parts->size(); ++d) {
      const std::string path = absl::StrFormat("run.data[%d]", d);
      HCP_ASSIGN_OR_RETURN(const json* part, f.Element(*parts, d, path));
      BlendPart& p = r.blend.emplace_back();
      HCP_RETURN_IF_ERROR(f.Double(*part, "weight", path + ".weight", &p.weight));
      HCP_RETURN_IF_ERROR(f.String(*part, "path", path + ".path", &p.data.path));
      HCP_RETURN_IF_ERROR(f.Int(*part, "bytes", path + ".bytes", &p.data.bytes));
      HCP_RETURN_IF_ERROR(
          f.String(*part, "head_crc32c", path + ".head_crc32c", &p.data.head_crc32c));
    }
  } else {
    HCP_ASSIGN_OR_RETURN(const json* data_id, f.Object(*run, "data", "run.data"));
    HCP_RETURN_IF_ERROR(f.String(*data_id, "path", "run.data.path", &r.data.path));
    HCP_RETURN_IF_ERROR(f.Int(*data_id, "bytes", "run.data.bytes", &r.data.bytes));
    HCP_RETURN_IF_ERROR(
        f.String(*data_id, "head_crc32c", "run.data.head_crc32c", &r.data.head_crc32c));
  }
  // Written since --shuffle-seed: a state without it read the documents as stored.
  if (run->contains("shuffle_seed")) {
    uint64_t shuffle = 0;
    HCP_RETURN_IF_ERROR(f.UInt(*run, "shuffle_seed", "run.shuffle_seed", &shuffle));
    r.shuffle_seed = shuffle;
  }
  absl::Status valid = ValidateTrainState(s);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": ", valid.message()));
  }
  return s;
}

std::string ExpAvgName(std::string_view param) { return absl::StrCat(ToAbsl(param), ".exp_avg"); }
std::string ExpAvgSqName(std::string_view param) {
  return absl::StrCat(ToAbsl(param), ".exp_avg_sq");
}

absl::StatusOr<std::vector<MomentsToWrite>> MomentsOf(const AdamW& optimizer) {
  if (!optimizer.owns_all()) {
    return absl::FailedPreconditionError(
        "the optimizer owns only part of the parameters: gather each parameter's moments and "
        "pass them to SaveTrainState");
  }
  std::vector<MomentsToWrite> moments;
  const FlatLayout& layout = optimizer.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamSpec& p = layout.param(i);
    HCP_ASSIGN_OR_RETURN(std::span<const float> m, optimizer.ExpAvgOf(p.name));
    HCP_ASSIGN_OR_RETURN(std::span<const float> v, optimizer.ExpAvgSqOf(p.name));
    moments.push_back({p.name, p.shape, m, v});
  }
  return moments;
}

absl::Status SaveTrainState(const std::string& dir, const TrainState& state,
                            const std::vector<MomentsToWrite>& moments, int64_t max_shard_bytes) {
  HCP_RETURN_IF_ERROR(ValidateTrainState(state));
  std::vector<TensorToWrite> tensors;
  tensors.reserve(3 * moments.size());
  const bool masters = !moments.empty() && !moments.front().master.empty();
  for (const MomentsToWrite& p : moments) {
    if (p.master.empty() == masters) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SaveTrainState: parameter %s %s a master weight where the first parameter %s", p.name,
          masters ? "lacks" : "has", masters ? "has one" : "has none"));
    }
    tensors.push_back({ExpAvgName(p.name), DType::F32, p.shape, p.exp_avg, {}});
    tensors.push_back({ExpAvgSqName(p.name), DType::F32, p.shape, p.exp_avg_sq, {}});
    if (masters) tensors.push_back({p.name, DType::F32, p.shape, p.master, {}});
  }
  const std::string text = TrainStateJson(state);
  HCP_RETURN_IF_ERROR(
      WriteCheckpoint(Join(dir, kOptimizerDirName), tensors, max_shard_bytes,
                      {{kOptimizerStepKey, absl::StrCat(state.step)},
                       {kTrainStateCrcKey, Crc32cHex(Crc32c(0, text.data(), text.size()))}}));
  return WriteFileAtomically(Join(dir, kTrainStateFileName), text);
}

namespace {

// DIR/train_state.json, parsed, and the headers of DIR/optimizer/, which must record the JSON's
// step and its CRC32C.
struct CheckedState {
  TrainState state;
  CheckpointReader tensors;  // DIR/optimizer/, headers read
};
absl::StatusOr<CheckedState> ReadCheckedState(const std::string& dir) {
  const std::string json_path = Join(dir, kTrainStateFileName);
  std::ifstream in(json_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(json_path,
                     ": no train state (not a training checkpoint, or one whose save did not "
                     "finish)"));
  }
  std::string text(std::istreambuf_iterator<char>(in), {});
  HCP_ASSIGN_OR_RETURN(TrainState state, ParseTrainStateJson(text, json_path));

  const std::string tensor_dir = Join(dir, kOptimizerDirName);
  HCP_ASSIGN_OR_RETURN(CheckpointReader tensors, CheckpointReader::Open(tensor_dir));
  const std::map<std::string, std::string>& metadata = tensors.metadata();
  auto step = metadata.find(kOptimizerStepKey);
  const std::string want_step = absl::StrCat(state.step);
  if (step == metadata.end() || step->second != want_step) {
    return absl::DataLossError(absl::StrFormat(
        "%s holds the optimizer state of step %s, but %s is for step %s (a later save that did "
        "not finish?)",
        tensor_dir, step == metadata.end() ? "(unknown)" : step->second, json_path, want_step));
  }
  auto crc = metadata.find(kTrainStateCrcKey);
  const std::string read_crc = Crc32cHex(Crc32c(0, text.data(), text.size()));
  if (crc == metadata.end() || crc->second != read_crc) {
    return absl::DataLossError(absl::StrFormat(
        "%s does not match the checksum its save recorded in %s (crc32c %s recorded, %s read): "
        "it was changed or damaged after it was written",
        json_path, tensor_dir, crc == metadata.end() ? "(none)" : crc->second, read_crc));
  }
  return CheckedState{std::move(state), std::move(tensors)};
}

}  // namespace

absl::StatusOr<TrainState> ReadTrainState(const std::string& dir) {
  HCP_ASSIGN_OR_RETURN(CheckedState checked, ReadCheckedState(dir));
  return std::move(checked.state);
}

absl::Status CheckTrainStateIntact(const std::string& dir) {
  HCP_ASSIGN_OR_RETURN(CheckedState checked, ReadCheckedState(dir));
  return checked.tensors.Verify();
}

absl::StatusOr<TrainStateReader> TrainStateReader::Open(const std::string& dir,
                                                        const std::vector<ParamSpec>& expected) {
  HCP_ASSIGN_OR_RETURN(CheckedState checked, ReadCheckedState(dir));
  TrainState& state = checked.state;
  CheckpointReader& tensors = checked.tensors;
  // Every moment the model needs, with its shape, and every master or none; nothing else.
  const bool has_masters = !expected.empty() && tensors.Has(expected.front().name);
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const ParamSpec& p : expected) {
    std::vector<std::string> names = {ExpAvgName(p.name), ExpAvgSqName(p.name)};
    if (has_masters) names.push_back(p.name);
    for (const std::string& name : names) {
      wanted.insert(name);
      if (!tensors.Has(name)) {
        problems.push_back(absl::StrCat("missing ", Quote(name)));
        continue;
      }
      HCP_ASSIGN_OR_RETURN(TensorInfo info, tensors.Info(name));
      if (info.dtype != DType::F32) {
        problems.push_back(
            absl::StrCat(Quote(name), " is ", ToAbsl(SafetensorsName(info.dtype)), ", not F32"));
      } else if (info.shape != p.shape) {
        problems.push_back(absl::StrCat(Quote(name), " has shape ", ShapeString(info.shape),
                                        ", the parameter ", ShapeString(p.shape)));
      }
    }
  }
  for (const std::string& name : tensors.names()) {
    if (!wanted.count(name)) {
      problems.push_back(
          absl::StrCat("unexpected ", Quote(name), " (no model parameter of that name)"));
    }
  }
  if (!problems.empty()) {
    constexpr size_t kShown = 8;
    std::string listed =
        absl::StrJoin(problems.begin(), problems.begin() + std::min(problems.size(), kShown), "; ");
    if (problems.size() > kShown)
      absl::StrAppend(&listed, "; and ", problems.size() - kShown, " more");
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer state in ", dir, " does not match the model: ", listed));
  }
  HCP_RETURN_IF_ERROR(tensors.Verify());
  return TrainStateReader(dir, std::move(tensors), std::move(state), has_masters);
}

absl::Status TrainStateReader::ReadMoments(std::string_view name, std::span<float> exp_avg,
                                           std::span<float> exp_avg_sq) const {
  HCP_ASSIGN_OR_RETURN(TensorInfo info, tensors_.Info(ExpAvgName(name)));
  if (static_cast<int64_t>(exp_avg.size()) != info.numel ||
      static_cast<int64_t>(exp_avg_sq.size()) != info.numel) {
    return absl::InvalidArgumentError(
        absl::StrFormat("moments of %s have %d elements; buffers of %d and %d given", Quote(name),
                        info.numel, exp_avg.size(), exp_avg_sq.size()));
  }
  return ReadRange(tensors_, name, 0, info.numel, exp_avg.data(), exp_avg_sq.data());
}

absl::Status TrainStateReader::ReadMomentsRange(std::string_view name, int64_t begin, int64_t count,
                                                float* exp_avg, float* exp_avg_sq) const {
  return ReadRange(tensors_, name, begin, count, exp_avg, exp_avg_sq);
}

absl::Status TrainStateReader::LoadInto(AdamW& optimizer) const {
  const FlatLayout& layout = optimizer.layout();
  const FlatRange owned = optimizer.owned();
  std::span<float> m = optimizer.exp_avg(), v = optimizer.exp_avg_sq();
  for (size_t i = 0; i < layout.size(); ++i) {
    const FlatRange r = layout.range(i);
    const int64_t begin = std::max(r.begin, owned.begin), end = std::min(r.end, owned.end);
    if (begin >= end) continue;
    const ParamSpec& p = layout.param(i);
    HCP_ASSIGN_OR_RETURN(TensorInfo info, tensors_.Info(ExpAvgName(p.name)));
    if (info.shape != p.shape) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer state in ", dir_, ": ", Quote(ExpAvgName(p.name)), " has shape ",
                       ShapeString(info.shape), ", the parameter ", ShapeString(p.shape)));
    }
    HCP_RETURN_IF_ERROR(ReadRange(tensors_, p.name, begin - r.begin, end - begin,
                                  m.data() + (begin - owned.begin),
                                  v.data() + (begin - owned.begin)));
  }
  optimizer.set_updates(state_.optimizer_updates);
  return absl::OkStatus();
}

}  // namespace hcp::train
