// `ablate expand SPEC [--format table|json|csv]`: the dry run of a sweep. No LibTorch, no
// coordinator: parses and expands the spec and prints one row per run (variant, what differs
// from the reference, axis values, total / activated / added parameters, the budget solution,
// training FLOPs per token, seed, run key) and the sweep's total FLOPs and device-hours.
#ifndef ABLATE_ORCHESTRATOR_CLI_EXPAND_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_EXPAND_COMMAND_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "orchestrator/cli/cost.h"
#include "proto/ablate.pb.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// The three renderings of an expanded sweep.
std::string FormatExpandTable(const ExpandedSweep& sweep);
std::string FormatExpandCsv(const ExpandedSweep& sweep);
// The ExpandedSweep message as JSON, every field printed, proto field names.
std::string FormatExpandJson(const ExpandedSweep& sweep);

// Expands `spec_path` and writes it to `out` in `format` ("table", "json" or "csv"), then the
// sweep's cost line (orchestrator/cli/cost.h): after the table on `out`; on `err` after JSON or
// CSV, which stay parseable.
absl::Status RunExpand(const std::string& spec_path, const std::string& format,
                       const CostFlags& cost, std::ostream& out, std::ostream& err);

// Registers `expand` on `app`. When the subcommand is given, *action is set to run it (writing
// to `out` and `err`) after parsing. The streams must outlive the call of *action.
void AddExpandCommand(CLI::App* app, std::ostream* out, std::ostream* err,
                      std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_EXPAND_COMMAND_H_
