// hybridcp: compile Granite 4.0-H models for context-parallel training, and run the plans.
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/support/Status.h"
#include "tools/hybridcp/Commands.h"

namespace {

std::vector<hcp::Command> AllCommands() {
  std::vector<hcp::Command> commands;
#ifdef HYBRIDCP_HAVE_COMPILER
  commands.push_back(hcp::MakeCompileCommand());
#endif
  commands.push_back(hcp::MakeInspectCommand());
  commands.push_back(hcp::MakeRunStepCommand());
  commands.push_back(hcp::MakeCompareStepCommand());
  commands.push_back(hcp::MakeTrainCommand());
  commands.push_back(hcp::MakeTokenizeCommand());
  commands.push_back(hcp::MakePlotCommand());
  commands.push_back(hcp::MakeBenchCommand());
  return commands;
}

void PrintUsage(const std::vector<hcp::Command>& commands) {
  std::printf("usage: hybridcp <command> [options]\n\ncommands:\n");
  for (const hcp::Command& c : commands)
    std::printf("  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n'hybridcp <command> --help' describes a command's options.\n");
}

void PrintCommandHelp(const hcp::Command& c) {
  std::printf("usage: hybridcp %s\n\n%s\n\noptions:\n%s", c.usage.c_str(), c.summary.c_str(),
              hcp::FormatOptions(c.options).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<hcp::Command> commands = AllCommands();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    PrintUsage(commands);
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  for (const hcp::Command& command : commands) {
    if (command.name != name) continue;
    std::vector<std::string> words(argv + 2, argv + argc);
    for (const std::string& word : words) {
      if (word == "--help" || word == "-h") {
        PrintCommandHelp(command);
        return 0;
      }
    }
    absl::StatusOr<hcp::Args> args = hcp::Args::Parse(words, command.options);
    absl::Status status = args.ok() ? command.run(*args) : args.status();
    if (!status.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "%s\n", hcp::FormatError(status).c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n", name.c_str());
  PrintUsage(commands);
  return 2;
}
