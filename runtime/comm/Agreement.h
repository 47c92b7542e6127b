// Agreeing before acting: the checks every rank runs together so that an error on one rank stops
// every rank with the same message instead of leaving the others waiting in a collective.
//
// The startup sequence of a multi-rank tool, before any other communication:
//   HCP_RETURN_IF_ERROR(comm::CheckCommandsAgree(world, {"train", options}));  // the first
//   plan::RankPlan mine = plan::LoadPlanForRank(path);   // never fails by itself
//   HCP_RETURN_IF_ERROR(comm::CheckRanksAgree(world, mine.plan, mine.hash));
// A rank whose plan failed to load still calls CheckRanksAgree (with its error), so every rank
// joins the same collectives and every rank returns the same error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/plan/Plan.h"
#include "runtime/plan/PlanFile.h"

namespace hcp::comm {

// Collective over the world: every rank passes its own status, every rank gets back the same
// one. OK if every rank passed OK. Otherwise an error with the code of the lowest failing rank
// and every failing rank's message, ranks with the same message listed together:
//   "rank 2: step 3 (embedding.forward): token id 99 at position 4 is outside [0, 11)"
//   "ranks 0-3: cannot open 'data.bin': No such file or directory"
// With one rank the status comes back unchanged. Costs one small all-gather when all is well and
// a second (of the messages) when not.
absl::Status AgreeOnStatus(Communicator& comm, const absl::Status& local);

// The combination AgreeOnStatus returns, from every rank's status (index = world rank).
absl::Status CombineRankStatuses(const std::vector<absl::Status>& per_rank);
// "rank 2", "ranks 0,1", "ranks 0-3,6": sorted world ranks, runs of three or more as ranges.
std::string RankList(const std::vector<int>& ranks);

// Collective over the world, and the first communication a tool does. In order, with the same
// error on every rank:
//   1. every rank loaded its plan ("the plan did not load on every rank: rank 2: ...");
//   2. every rank has the same plan ("ranks 0,1 run plan a1b2..., rank 2 runs 77ff...: start
//      every rank with the same plan");
//   3. the world has cp * dp ranks ("the plan was compiled for cp=4 x dp=1 = 4 ranks, but 2
//      ranks were started");
// then splits the world into the plan's cp and dp groups (comm.SetMesh). Only then may the plan
// run on `comm`.
absl::Status CheckRanksAgree(Communicator& comm, const absl::StatusOr<plan::Plan>& plan,
                             uint64_t plan_hash);

// What a rank is about to do: its command and options as given on its command line (name
// without dashes -> value, "" for a flag). Option values are compared as text, so paths are
// compared as given, not resolved: ranks on other nodes may see other files at one path, and one
// file under other paths; the plan itself is compared by content (CheckRanksAgree).
struct CommandLine {
  std::string command;
  std::vector<std::pair<std::string, std::string>> options;  // sorted by name
};

// Collective over the world, and the first communication a command does, so that ranks started
// with different commands still meet here: OK if every rank runs the same command with the same
// options; otherwise the same error on every rank, naming what differs and the ranks' values:
//   "ranks disagree on --lr: ranks 0,1 have 0.003, rank 2 has 0.01; start every rank with the
//    same command"
//   "ranks disagree on the command: rank 0 runs train, rank 1 runs run-step; start every rank
//    with the same command"
// One small all-gather when all agree; a second (of the command lines) when not.
absl::Status CheckCommandsAgree(Communicator& comm, const CommandLine& mine);

// The comparison CheckCommandsAgree makes, of every rank's command line (index = world rank).
absl::Status CompareCommandLines(const std::vector<CommandLine>& per_rank);

}  // namespace hcp::comm
