// The CLI commands that talk to a running coordinator (orchestrator/cli/client.h resolves where it
// is and the token; every call has a deadline, --timeout):
//   ablate submit SPEC [--watch [--plain]] [--force] [--device-peak D] [--mfu F]
//                                             queue a sweep (identical finished runs are reused);
//                                             its cost line (cost.h); --watch as `ablate watch`
//   ablate status [SWEEP]                     sweeps with run counts, or one sweep's runs
//   ablate watch SWEEP [--plain]              live progress per run, spikes and divergences as
//                                             they happen; exits when the sweep ends, 0, 3 or
//                                             4 by how its runs ended (cli.h)
//   ablate cancel SWEEP                       cancel queued runs, stop running ones
//   ablate rerun SWEEP --failed               queue FAILED and CANCELLED runs again (not DIVERGED)
//   ablate tag|untag SWEEP[/RUN_ID] TAG...    add or remove tags on a sweep or one of its runs
//   ablate note SWEEP[/RUN_ID] "TEXT"         add a note to a sweep or one of its runs
//   ablate query "SQL" [--format table|csv|json]   read-only SQL on the results database
//   ablate table SWEEP [--format markdown|csv|json] the paper-style comparison table
//   ablate export SWEEP --format csv|json [--steps] runs with final metrics, or step metrics
// Output goes to `out`; a failure is returned as a Status (printed by cli.cc as one line).
#ifndef ABLATE_ORCHESTRATOR_CLI_CLIENT_COMMANDS_H_
#define ABLATE_ORCHESTRATOR_CLI_CLIENT_COMMANDS_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "orchestrator/cli/client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Streams a sweep's events to `out` until it ends. `live`: redraw progress bars in place (a
// terminal); otherwise print a line per state change, spike and 10% of progress. OK when every
// run SUCCEEDED; else a status naming the count, WithExitCode (cli.h) kExitRunsFailed when some
// run FAILED or was CANCELLED, kExitDiverged when some DIVERGED and none FAILED.
absl::Status RunWatch(CoordinatorClient& client, const std::string& sweep, bool live,
                      absl::Duration timeout, std::ostream& out);

// Registers every command above on `app`; the chosen one sets *action. `out` (results) and `err`
// (warnings) must outlive it.
void AddClientCommands(CLI::App* app, std::ostream* out, std::ostream* err,
                       std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_CLIENT_COMMANDS_H_
