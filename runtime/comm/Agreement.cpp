#include "runtime/comm/Agreement.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Status.h"

namespace hcp::comm {
namespace {

// All-gathers one trivially copyable value per rank over the world.
template <typename T>
std::vector<T> GatherWorld(Communicator& comm, const T& mine) {
  std::vector<T> all(comm.world_size());
  comm.AllGather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)),
                 Group::kWorld);
  return all;
}

// Every rank's `text`, whose length on rank r is lengths[r] (known to all from a first gather):
// one all-gather of the texts padded to the longest.
std::vector<std::string> GatherTexts(Communicator& comm, const std::string& text,
                                     const std::vector<int64_t>& lengths) {
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::string padded = text;
  padded.resize(longest, '\0');
  std::string all(longest * comm.world_size(), '\0');
  comm.AllGather(std::as_bytes(std::span(padded)), std::as_writable_bytes(std::span(all)),
                 Group::kWorld);
  std::vector<std::string> texts;
  for (int r = 0; r < comm.world_size(); ++r) texts.push_back(all.substr(r * longest, lengths[r]));
  return texts;
}

// Ranks grouped by a key, groups in the order of their lowest rank.
template <typename Key>
std::vector<std::pair<Key, std::vector<int>>> GroupRanks(const std::vector<Key>& keys) {
  std::vector<std::pair<Key, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& group) { return group.first == keys[r]; });
    if (it == groups.end()) {
      groups.push_back({keys[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  return groups;
}

}  // namespace

std::string RankList(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrFormat("%d-%d", ranks[i], ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(absl::StrCat(ranks[k]));
    }
    i = j + 1;
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(parts, ","));
}

absl::Status CombineRankStatuses(const std::vector<absl::Status>& per_rank) {
  // Failing ranks grouped by message; the code is the lowest failing rank's.
  std::vector<std::string> messages;
  std::vector<int> ranks;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    if (per_rank[r].ok()) continue;
    if (code == absl::StatusCode::kOk) code = per_rank[r].code();
    messages.emplace_back(per_rank[r].message());
    ranks.push_back(r);
  }
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  std::vector<std::string> parts;
  for (const auto& [text, members] : GroupRanks(messages)) {
    std::vector<int> group;
    for (int i : members) group.push_back(ranks[i]);
    parts.push_back(absl::StrCat(RankList(group), ": ", text));
  }
  return absl::Status(code, absl::StrJoin(parts, "; "));
}

absl::Status AgreeOnStatus(Communicator& comm, const absl::Status& local) {
  if (comm.world_size() == 1) return local;
  struct Record {
    int64_t code;
    int64_t message_bytes;
  };
  const std::string message(local.message());
  const std::vector<Record> records = GatherWorld(
      comm, Record{static_cast<int64_t>(local.code()), static_cast<int64_t>(message.size())});
  std::vector<int64_t> lengths;
  bool all_ok = true;
  for (const Record& r : records) {
    all_ok = all_ok && r.code == 0;
    lengths.push_back(r.message_bytes);
  }
  if (all_ok) return absl::OkStatus();

  // Every rank knows now that the messages are needed: the second gather is joined by all.
  const std::vector<std::string> messages = GatherTexts(comm, message, lengths);
  std::vector<absl::Status> per_rank(comm.world_size());
  for (int r = 0; r < comm.world_size(); ++r) {
    if (records[r].code == 0) continue;
    per_rank[r] = absl::Status(static_cast<absl::StatusCode>(records[r].code), messages[r]);
  }
  return CombineRankStatuses(per_rank);
}

absl::Status CheckRanksAgree(Communicator& comm, const absl::StatusOr<plan::Plan>& plan,
                             uint64_t plan_hash) {
  // 1. Everyone loaded a plan.
  if (absl::Status loaded = AgreeOnStatus(comm, plan.status()); !loaded.ok()) {
    if (comm.world_size() == 1) return loaded;
    return absl::Status(loaded.code(),
                        absl::StrCat("the plan did not load on every rank: ", loaded.message()));
  }
  // 2. Everyone loaded the same plan.
  const std::vector<uint64_t> hashes = GatherWorld(comm, plan_hash);
  const auto groups = GroupRanks(hashes);
  if (groups.size() > 1) {
    std::vector<std::string> parts;
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto& [hash, ranks] = groups[i];
      const char* verb = ranks.size() == 1 ? "runs" : "run";
      parts.push_back(absl::StrFormat("%s %s %s%s", RankList(ranks), verb, i == 0 ? "plan " : "",
                                      plan::HashString(hash)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(absl::StrJoin(parts, ", "), ": start every rank with the same plan"));
  }
  // 3. The world is the plan's mesh; then its groups. Every rank holds the same plan, so every
  // rank takes the same branch.
  return comm.SetMesh(plan->mesh);
}

namespace {

// NUL-separated: command, then name and value of each option (argv holds no NUL).
std::string Encode(const CommandLine& line) {
  std::string text = line.command;
  text.push_back('\0');
  for (const auto& [name, value] : line.options) {
    text += name;
    text.push_back('\0');
    text += value;
    text.push_back('\0');
  }
  return text;
}

CommandLine Decode(std::string_view text) {
  std::vector<std::string> words;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\0', at), text.size());
    words.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  CommandLine line;
  if (!words.empty()) line.command = words[0];
  for (size_t i = 1; i + 1 < words.size(); i += 2)
    line.options.emplace_back(words[i], words[i + 1]);
  return line;
}

// "ranks 0,1 have 0.003", "rank 2 gives it", "rank 3 does not give it".
std::string DescribeValue(const std::optional<std::string>& value, const std::vector<int>& ranks) {
  const bool one = ranks.size() == 1;
  if (!value) return absl::StrCat(RankList(ranks), one ? " does not give it" : " do not give it");
  if (value->empty()) return absl::StrCat(RankList(ranks), one ? " gives it" : " give it");
  return absl::StrCat(RankList(ranks), one ? " has " : " have ", *value);
}

}  // namespace

absl::Status CompareCommandLines(const std::vector<CommandLine>& per_rank) {
  constexpr std::string_view kFix = "start every rank with the same command";
  std::vector<std::string> commands;
  for (const CommandLine& line : per_rank) commands.push_back(line.command);
  if (const auto groups = GroupRanks(commands); groups.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [command, ranks] : groups) {
      parts.push_back(
          absl::StrCat(RankList(ranks), ranks.size() == 1 ? " runs " : " run ", command));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks disagree on the command: ", absl::StrJoin(parts, ", "), "; ", std::string(kFix)));
  }
  // Every option any rank gives, in name order, with each rank's value (or none).
  std::map<std::string, std::vector<std::optional<std::string>>> values;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (const auto& [name, value] : per_rank[r].options) {
      auto& of_ranks = values[name];
      of_ranks.resize(per_rank.size());
      of_ranks[r] = value;
    }
  }
  std::vector<std::string> differences;
  for (const auto& [name, of_ranks] : values) {
    const auto groups = GroupRanks(of_ranks);
    if (groups.size() == 1) continue;
    std::vector<std::string> parts;
    for (const auto& [value, ranks] : groups) parts.push_back(DescribeValue(value, ranks));
    differences.push_back(
        absl::StrCat(name.size() == 1 ? "-" : "--", name, ": ", absl::StrJoin(parts, ", ")));
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "ranks disagree on ", absl::StrJoin(differences, "; on "), "; ", std::string(kFix)));
}

absl::Status CheckCommandsAgree(Communicator& comm, const CommandLine& mine) {
  if (comm.world_size() == 1) return absl::OkStatus();
  // Fixed-size records first, the same size whatever the command: ranks running different
  // commands join the same all-gather.
  struct Record {
    uint64_t hash;
    int64_t bytes;
  };
  const std::string text = Encode(mine);
  const std::vector<Record> records =
      GatherWorld(comm, Record{plan::PlanBytesHash(text), static_cast<int64_t>(text.size())});
  std::vector<int64_t> lengths;
  bool same = true;
  for (const Record& r : records) {
    same = same && r.hash == records[0].hash && r.bytes == records[0].bytes;
    lengths.push_back(r.bytes);
  }
  if (same) return absl::OkStatus();
  // Every rank saw the difference: all join the second gather, of the command lines.
  std::vector<CommandLine> per_rank;
  for (const std::string& line : GatherTexts(comm, text, lengths)) per_rank.push_back(Decode(line));
  return CompareCommandLines(per_rank);
}

}  // namespace hcp::comm
