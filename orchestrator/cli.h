// The `ablate` command line: one CLI11 app, one subcommand per file (expand_command.h, ...).
//
// main() only forwards to RunAblateCli, so tests drive the real command line in-process.
// Every subcommand has --help; success exits 0; a failure prints its message (each line a
// complete "FILE:LINE: field: what" for spec problems) to `err` and exits non-zero:
// 1 for a failed command, 2 for a bad command line (CLI11's code for parse errors is kept).
#ifndef ABLATE_ORCHESTRATOR_CLI_H_
#define ABLATE_ORCHESTRATOR_CLI_H_

#include <ostream>

namespace ablate {

int RunAblateCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_H_
