// The subcommands of `hybridcp`. Each command parses its own options and returns a Status; main
// turns a failed Status into one "error: ..." line and a non-zero exit.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/import/GraniteConfig.h"
#include "runtime/plan/CommVolume.h"
#include "tools/hybridcp/Args.h"

namespace hcp {

struct Command {
  std::string name;
  std::string summary;
  std::string usage;  // the line after "usage: hybridcp "
  std::vector<OptionSpec> options;
  std::function<absl::Status(const Args&)> run;
};

// The model a command works on: a config.json path as the first positional, or --model NAME
// (one of the built-in presets); a positional that names a preset works too.
absl::StatusOr<GraniteConfig> ResolveModelConfig(const Args& args);
inline const OptionSpec kModelOption{"model", "NAME",
                                     "a built-in Granite 4.0-H config, e.g. granite-4.0-h-tiny"};

Command MakeInspectCommand();
Command MakeRunStepCommand();
Command MakeCompareStepCommand();
Command MakeTrainCommand();
Command MakeTokenizeCommand();
Command MakePlotCommand();

// Plans: inspected without MLIR. Whether `inspect PATH` reads PATH as a plan (true) or a model
// config (false), by content and name: the plan magic makes a plan (a damaged one reports the
// plan's error); otherwise a .json name or a text opening with '{' is a config, and any other
// regular file is refused, saying what it is. Other paths go to the plan loader when named .plan
// (a missing plan), else to the config (a preset name, a directory).
absl::StatusOr<bool> InspectsAsPlan(const std::string& path);
absl::Status InspectPlan(const std::string& path, bool list_buffers);
// The bytes each rank sends per step, one row per rank, one column per kind, and a total:
// what `inspect` predicts and `run-step --traffic` measures, in one format.
void PrintBytesSent(const plan::CommVolume& volume);
#ifdef HYBRIDCP_HAVE_COMPILER
Command MakeCompileCommand();
#endif
Command MakeBenchCommand();

}  // namespace hcp
