#include "orchestrator/cli/cli.h"

#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "orchestrator/cli/client_commands.h"
#include "orchestrator/cli/dashboard_command.h"
#include "orchestrator/cli/data_command.h"
#include "orchestrator/cli/expand_command.h"
#include "orchestrator/cli/logs_command.h"
#include "orchestrator/cli/program_command.h"
#include "orchestrator/cli/report_command.h"
#include "orchestrator/cli/serve_command.h"
#include "orchestrator/cli/up_command.h"
#include "orchestrator/cli/workers_command.h"

namespace ablate {

int RunAblateCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"ablate: model-architecture ablation sweeps (gated attention and friends)",
               "ablate"};
  app.set_version_flag("--version", VersionText());
  app.require_subcommand(1);
  if (argc >= 2 && std::string(argv[1]) == "data") {
    // Replaced by ablate-data before anything of ours starts (data_command.h).
    return RunCommandAction(
        "ablate data", [&] { return ExecDataCommand(argc, argv); }, err);
  }
  std::function<absl::Status()> action;
  AddExpandCommand(&app, &out, &err, &action);
  AddServeCommand(&app, &out, &action);
  AddUpCommand(&app, &out, &action);
  AddClientCommands(&app, &out, &err, &action);
  AddDashboardCommand(&app, &out, &action);
  AddWorkersCommand(&app, &out, &action);
  AddReportCommand(&app, &out, &action);
  AddLogsCommand(&app, &out, &action);
  AddProgramCommand(&app, &out, &action);
  AddDataCommand(&app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" of code 0; every other is a bad command line.
    return app.exit(e, out, err) == 0 ? 0 : kExitUsage;
  }
  if (!action) return 0;
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  return RunCommandAction(parsed.empty() ? "ablate" : "ablate " + parsed.front()->get_name(),
                          action, err);
}

namespace {

constexpr char kExitCodePayload[] = "type.ablate/exit-code";

}  // namespace

absl::Status WithExitCode(absl::Status status, int code) {
  status.SetPayload(kExitCodePayload, absl::Cord(absl::StrCat(code)));
  return status;
}

int ExitCodeOf(const absl::Status& status) {
  if (status.ok()) return 0;
  int code = kExitFailed;
  if (auto payload = status.GetPayload(kExitCodePayload)) {
    if (!absl::SimpleAtoi(std::string(*payload), &code) || code <= 0 || code > 125) {
      code = kExitFailed;
    }
  }
  return code;
}

int RunCommandAction(const std::string& command, const std::function<absl::Status()>& action,
                     std::ostream& err) {
  absl::Status status;
  try {
    status = action();
  } catch (const std::exception& e) {
    err << command << ": internal error: " << e.what() << " (a bug in ablate)\n";
    return 1;
  } catch (...) {
    err << command << ": internal error: unknown exception (a bug in ablate)\n";
    return 1;
  }
  if (!status.ok()) err << status.message() << "\n";
  return ExitCodeOf(status);
}

}  // namespace ablate
