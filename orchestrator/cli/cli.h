// The `ablate` command line: one CLI11 app. Each command that runs something here has its file
// (expand_command.h, serve_command.h, up_command.h, workers_command.h, dashboard_command.h,
// report_command.h); the eight that are calls to a running coordinator (submit, status, watch,
// cancel, rerun, query, table, export) share client_commands.h.
//
// main() only forwards to RunAblateCli, so tests drive the real command line in-process.
// Every subcommand has --help; success exits 0; a failure prints its message (each line a
// complete "FILE:LINE: field: what" for spec problems) to `err` and exits non-zero:
// 1 for a failed command, 2 for a bad command line (CLI11's code for parse errors is kept).
// An exception that escapes a command is caught here too: one line, exit 1.
#ifndef ABLATE_ORCHESTRATOR_CLI_CLI_H_
#define ABLATE_ORCHESTRATOR_CLI_CLI_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace ablate {

int RunAblateCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// Runs one command's action: 0 when it succeeds; its message on `err` and 1 when it fails. An
// exception escaping the action (a bug: commands report errors as statuses) is one line on `err`
// naming `command`, and 1, never an abort.
int RunCommandAction(const std::string& command, const std::function<absl::Status()>& action,
                     std::ostream& err);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_CLI_H_
