// The start of every command that runs on ranks (train, run-step, bench): one call before the
// command's own work, so that every rank refuses a wrong launch the same way.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/comm/World.h"
#include "tools/hybridcp/Args.h"

namespace hcp {

// --timeout SECONDS: how long a rank waits for the others in one collective.
extern const OptionSpec kTimeoutOption;

// Reads --timeout, joins the world (World::Join refuses a launch whose processes each see a
// world of their own), then, as the world's first collective, checks that every rank runs
// `command` with the same options (comm::CheckCommandsAgree). The plan (the positional) is
// compared by content afterwards, by comm::CheckRanksAgree.
absl::StatusOr<World> JoinRanks(std::string_view command, const Args& args);

}  // namespace hcp
