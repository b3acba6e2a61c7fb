// The `ablate` command line: one CLI11 app. Each command that runs something here has its file
// (expand_command.h, serve_command.h, up_command.h, workers_command.h, dashboard_command.h,
// report_command.h); those that are calls to a running coordinator (submit, status, watch,
// cancel, rerun, tag, untag, note, query, table, compare, export) share client_commands.h.
//
// main() only forwards to RunAblateCli, so tests drive the real command line in-process.
// Every subcommand has --help; success (and --help, --version) exits 0; a failure prints its
// message (each line a complete "FILE:LINE: field: what" for spec problems) to `err` and exits
// non-zero (docs/cli.md, "Exit codes"): 1 for a failed command, 2 for a bad command line (an
// unknown flag or subcommand, a bad value, a missing argument: CLI11's own codes, 105 and the
// like, become 2, as getopt and argparse tools exit), and the codes below (kExit*) that
// a command sets on its status with WithExitCode. An exception that escapes a command is
// caught here too: one line, exit 1.
#ifndef ABLATE_ORCHESTRATOR_CLI_CLI_H_
#define ABLATE_ORCHESTRATOR_CLI_CLI_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace ablate {

int RunAblateCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// The exit codes of `ablate` beside 0.
inline constexpr int kExitFailed = 1;        // the command failed
inline constexpr int kExitUsage = 2;         // a bad command line
inline constexpr int kExitDiverged = 3;      // watch: some run DIVERGED and none FAILED
inline constexpr int kExitRunsFailed = 4;    // watch: some run FAILED or was CANCELLED

// `status` (not OK) that exits with `code` instead of kExitFailed: a command whose outcome is
// not a failure of the command itself (a watched sweep whose runs failed) says so with its
// message and its own code. The code travels as a payload of the status.
absl::Status WithExitCode(absl::Status status, int code);
// The exit code of an action's status: 0 when OK, WithExitCode's code, else kExitFailed.
int ExitCodeOf(const absl::Status& status);

// Runs one command's action: 0 when it succeeds; its message on `err` and ExitCodeOf its
// status when it fails. An
// exception escaping the action (a bug: commands report errors as statuses) is one line on `err`
// naming `command`, and 1, never an abort.
int RunCommandAction(const std::string& command, const std::function<absl::Status()>& action,
                     std::ostream& err);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_CLI_H_
