// Waiting with a deadline, as every collective of MpiCommunicator does (Communicator.h,
// "Failure"), and what a wait that ran out says: apart from MPI, so that both can be tested on
// their own.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace hcp::comm {

// Calls `done` until it returns true (then true) or until `timeout` has passed since the call
// (then false). Polls without pause for the first milliseconds, since most waits inside a step
// are short; then sleeps between polls, longer as the wait grows (at most 1 ms), so that a rank
// waiting for a slow peer leaves the core to it.
bool PollUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);

// A collective or message that did not complete in time.
struct StalledWait {
  std::string_view kind;     // "all-reduce", "send/receive", ...
  std::string_view group;    // "cp", "world", ...; empty for point-to-point messages
  std::vector<int> members;  // the world ranks taking part, this one included
  int self = 0;              // this world rank
  std::vector<int> silent;   // the world ranks known not to have answered (may be empty)
  std::string_view during;   // what the job was doing (the traffic label); may be empty
  std::chrono::seconds timeout{0};
};
// "the all-reduce over the cp group (ranks 0,1) did not finish within 5 s (in state_scan): rank
// 1 did not answer; ...". With several other members and none known silent: "one of ranks 1-3".
std::string DescribeStalledWait(const StalledWait& wait);

}  // namespace hcp::comm
