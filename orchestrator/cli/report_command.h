// `ablate report SWEEP --out DIR`: a sweep's results as files that open from disk (index.html,
// report.md, SVG figures, CSVs; orchestrator/report/report.h), read from the results database
// read-only, with or without a coordinator running.
#ifndef ABLATE_ORCHESTRATOR_CLI_REPORT_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_REPORT_COMMAND_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Registers `report` on `app`; when chosen, *action writes the report and prints where.
void AddReportCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_REPORT_COMMAND_H_
