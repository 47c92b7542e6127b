#include "runtime/comm/Agreement.h"

#include <algorithm>
#include <cstring>
#include <map>
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
  int64_t longest = 0;
  bool all_ok = true;
  for (const Record& r : records) {
    all_ok = all_ok && r.code == 0;
    longest = std::max(longest, r.message_bytes);
  }
  if (all_ok) return absl::OkStatus();

  // Every rank knows now that the messages are needed: the second gather is joined by all.
  std::string padded = message;
  padded.resize(longest, '\0');
  std::string all(longest * comm.world_size(), '\0');
  comm.AllGather(std::as_bytes(std::span(padded)), std::as_writable_bytes(std::span(all)),
                 Group::kWorld);
  std::vector<absl::Status> per_rank(comm.world_size());
  for (int r = 0; r < comm.world_size(); ++r) {
    if (records[r].code == 0) continue;
    per_rank[r] = absl::Status(static_cast<absl::StatusCode>(records[r].code),
                               all.substr(r * longest, records[r].message_bytes));
  }
  return CombineRankStatuses(per_rank);
}

uint64_t PlanBytesHash(std::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string HashString(uint64_t hash) { return absl::StrFormat("%016x", hash); }

RankPlan ParsePlanForRank(std::string_view bytes, std::string_view source) {
  return RankPlan{.plan = plan::ParsePlan(bytes, source), .hash = PlanBytesHash(bytes)};
}

RankPlan LoadPlanForRank(const std::string& path) {
  absl::StatusOr<std::string> bytes = plan::ReadPlanFile(path);
  if (!bytes.ok()) return RankPlan{.plan = bytes.status(), .hash = 0};
  return ParsePlanForRank(*bytes, path);
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
                                      HashString(hash)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(absl::StrJoin(parts, ", "), ": start every rank with the same plan"));
  }
  // 3. The world is the plan's mesh; then its groups. Every rank holds the same plan, so every
  // rank takes the same branch.
  return comm.SetMesh(plan->mesh);
}

}  // namespace hcp::comm
