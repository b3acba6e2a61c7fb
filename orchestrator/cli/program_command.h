// `ablate program check SPEC`: runs a program spec's first variant at its first seed on this
// machine, a few times, and says item by item whether the program does what ablate relies on
// (docs/program.md, "Checking a program"): it reports steps and its end, the same seed gives the
// same losses and another seed others, SIGTERM makes it checkpoint and exit within grace_s, it
// resumes from that checkpoint to the losses of an uninterrupted run (within a tolerance it
// prints), and, when it declares `pause`, it pauses at a rung. Each attempt runs as a worker
// runs it (worker/program/program_process.h), from a snapshot of its code, in a temp dir.
#ifndef ABLATE_ORCHESTRATOR_CLI_PROGRAM_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_PROGRAM_COMMAND_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

struct ProgramCheckOptions {
  std::string spec;
  int64_t steps = 20;       // the run's length for the check (the steps param is set to it)
  double tolerance = 1e-4;  // largest relative difference of a resumed loss
  std::string keep;         // "": a temp dir, removed after; else this dir, kept
};

// Prints one line per item ("ok", "FAILED" or "skipped", and why) and returns FailedPrecondition
// naming the failed items when any failed.
absl::Status CheckProgram(const ProgramCheckOptions& options, std::ostream& out);

// Registers `program check` on `app`.
void AddProgramCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_PROGRAM_COMMAND_H_
