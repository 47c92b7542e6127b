#include "tools/hybridcp/Ranks.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/support/Status.h"

namespace hcp {
namespace {

// Thirty days: far beyond any step, and far from the clock's overflow.
constexpr int64_t kMaxTimeoutSeconds = 30 * 24 * 3600;

}  // namespace

const OptionSpec kTimeoutOption{
    "timeout", "SECONDS",
    absl::StrFormat("end the whole job when a rank waits longer than this for the others in one "
                    "collective or message: one of them stopped, hung or died (default %d)",
                    static_cast<int>(comm::kDefaultTimeout.count()))};

absl::StatusOr<World> JoinRanks(std::string_view command, const Args& args) {
  HCP_ASSIGN_OR_RETURN(int64_t timeout, args.GetInt("timeout", comm::kDefaultTimeout.count()));
  if (timeout < 1 || timeout > kMaxTimeoutSeconds) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--timeout %d: give seconds from 1 to %d (30 days)", timeout, kMaxTimeoutSeconds));
  }
  HCP_ASSIGN_OR_RETURN(World world, World::Join(std::chrono::seconds(timeout)));
  comm::CommandLine mine;
  mine.command = command;
  for (const auto& [name, value] : args.values()) mine.options.emplace_back(name, value);
  HCP_RETURN_IF_ERROR(comm::CheckCommandsAgree(world.comm(), mine));
  return world;
}

}  // namespace hcp
