#include "runtime/comm/Launch.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/Agreement.h"

namespace hcp::comm {
namespace {

std::optional<int> IntFromEnvironment(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  int value = 0;
  const std::string_view view(text);
  auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (error != std::errc() || end != view.data() + view.size()) return std::nullopt;
  return value;
}

// "1 rank", "4 tasks", "2 processes".
std::string Count(int n, std::string_view what) {
  const std::string plural = what == "process" ? "es" : "s";
  return absl::StrFormat("%d %s%s", n, std::string(what), n == 1 ? "" : plural);
}

}  // namespace

LaunchEnv LaunchEnv::FromEnvironment() {
  return LaunchEnv{IntFromEnvironment("SLURM_STEP_NUM_TASKS"),
                   IntFromEnvironment("OMPI_COMM_WORLD_SIZE"), IntFromEnvironment("PMI_SIZE")};
}

absl::Status CheckLaunch(const LaunchEnv& env, int world_size) {
  const std::string sees = absl::StrFormat("MPI sees %s in each", Count(world_size, "rank"));
  // mpirun's own count comes first: under mpirun inside a Slurm allocation, the ranks also
  // inherit the step variables of the daemons that srun started for mpirun.
  if (env.mpirun_size) {
    if (*env.mpirun_size <= world_size) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "mpirun started %s but %s: this hybridcp was built with another MPI than this mpirun's; "
        "use the mpirun of the MPI it was built with",
        Count(*env.mpirun_size, "process"), sees));
  }
  if (env.srun_tasks && *env.srun_tasks > world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("srun started %s but %s: srun was run without PMI; use srun --mpi=pmix (or "
                        "--mpi=pmi2), or mpirun",
                        Count(*env.srun_tasks, "task"), sees));
  }
  if (env.pmi_size && *env.pmi_size > world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the launcher started %s but %s: this hybridcp's MPI does not speak the launcher's PMI; "
        "use the mpirun of the MPI it was built with, or srun --mpi=pmix",
        Count(*env.pmi_size, "process"), sees));
  }
  return absl::OkStatus();
}

absl::Status CheckOneRankPerGpu(const std::vector<RankGpu>& ranks) {
  // Per node (in the order of its lowest rank): its ranks, and the ranks of each GPU.
  std::vector<std::string> nodes;
  std::map<std::string, std::vector<int>> node_ranks;
  std::map<std::pair<std::string, std::string>, std::vector<int>> gpu_ranks;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const RankGpu& rank = ranks[r];
    if (node_ranks[rank.node].empty()) nodes.push_back(rank.node);
    node_ranks[rank.node].push_back(r);
    if (!rank.gpu.empty()) gpu_ranks[{rank.node, rank.gpu}].push_back(r);
  }
  std::vector<std::string> problems;
  for (const std::string& node : nodes) {
    std::vector<std::string> shared;
    int visible = 0;
    for (int r : node_ranks[node]) visible = std::max(visible, ranks[r].visible);
    for (const auto& [key, members] : gpu_ranks) {
      if (key.first == node && members.size() > 1) {
        shared.push_back(absl::StrCat(RankList(members), " share GPU ", key.second));
      }
    }
    if (shared.empty()) continue;
    // Sharing needs two ranks on the node: "ranks ... were".
    problems.push_back(absl::StrFormat("node %s has %s but %s were started on it (%s)", node,
                                       Count(visible, "GPU"), RankList(node_ranks[node]),
                                       absl::StrJoin(shared, ", ")));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(absl::StrJoin(problems, "; "),
                   ": start at most one rank per GPU (mpirun -npernode GPUS_PER_NODE, or srun "
                   "--ntasks-per-node=GPUS_PER_NODE)"));
}

std::vector<RankGpu> GatherRankGpus(Communicator& comm, const RankGpu& mine) {
  // Fixed-size records (names cut to fit), so that one all-gather carries them.
  struct Record {
    char node[256];
    char gpu[64];
    int32_t visible;
  };
  Record record{};
  std::strncpy(record.node, mine.node.c_str(), sizeof(record.node) - 1);
  std::strncpy(record.gpu, mine.gpu.c_str(), sizeof(record.gpu) - 1);
  record.visible = mine.visible;
  std::vector<Record> all(comm.world_size());
  comm.AllGather(std::as_bytes(std::span(&record, 1)), std::as_writable_bytes(std::span(all)),
                 Group::kWorld);
  std::vector<RankGpu> ranks;
  for (const Record& r : all) ranks.push_back(RankGpu{r.node, r.gpu, r.visible});
  return ranks;
}

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace hcp::comm
