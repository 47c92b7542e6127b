#include "runtime/comm/Deadline.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"

namespace hcp::comm {

bool PollUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto start = steady_clock::now(), deadline = start + timeout;
  while (true) {
    if (done()) return true;
    const auto now = steady_clock::now();
    if (now >= deadline) return false;
    const auto waited = now - start;
    if (waited < milliseconds(10)) {
      std::this_thread::yield();  // oversubscribed ranks: the peer we wait for may need the core
    } else {
      std::this_thread::sleep_for(
          std::clamp<nanoseconds>(waited / 16, microseconds(50), milliseconds(1)));
    }
  }
}

namespace {

// Sorted, each rank once (a message in pieces lists its peer once per piece).
std::vector<int> Ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace

std::string DescribeStalledWait(const StalledWait& wait) {
  const std::vector<int> members = Ranks(wait.members), silent = Ranks(wait.silent);
  std::vector<int> others;
  for (int rank : members) {
    if (rank != wait.self) others.push_back(rank);
  }
  const std::string what =
      wait.group.empty()
          ? absl::StrCat("the ", std::string(wait.kind), " with ", RankList(others))
          : absl::StrCat("the ", std::string(wait.kind), " over the ", std::string(wait.group),
                         " group (", RankList(members), ")");
  const std::string who = !silent.empty()      ? RankList(silent)
                          : others.size() == 1 ? RankList(others)
                                               : absl::StrCat("one of ", RankList(others));
  const std::string during = wait.during.empty() || wait.during == "unlabelled"
                                 ? ""
                                 : absl::StrCat(" (in ", std::string(wait.during), ")");
  return absl::StrFormat(
      "%s did not finish within %d s%s: %s did not answer (stopped, hung or dead); ending the "
      "job (if a step may rightly take longer, raise --timeout)",
      what, static_cast<int64_t>(wait.timeout.count()), during, who);
}

}  // namespace hcp::comm
