// Budget matching for program runs (docs/program.md, "Budgets"): the program's `count:` command
// counts parameters, and a variant's `match: params.NAME` is solved by searching that integer
// param until the count equals the reference's (within the rule's tolerance). The count must be
// monotone (non-decreasing) in the param; every value the search asks about is checked.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_PROGRAM_BUDGET_H_
#define ABLATE_ORCHESTRATOR_SWEEP_PROGRAM_BUDGET_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/ablate.pb.h"

namespace ablate {

// Counts the parameters of each params object (ProgramParamsJson), in order: one answer each.
using ProgramCounter =
    std::function<absl::StatusOr<std::vector<ParamCount>>(const std::vector<std::string>&)>;

// A counter that runs `command` (split into words; a bare name searched on PATH) in `dir` with
// the objects on stdin, one JSON line each, and reads one JSON line `{"total": N,
// "activated": M}` per object from its stdout, within `timeout`. Answers are cached (a search
// asks about the same object again) and, when `record` is not null, kept there by params JSON.
// InvalidArgument naming the command when it fails, hangs past the timeout (it is killed),
// answers fewer or more lines than it was asked, or a line that is not a count.
ProgramCounter CommandCounter(const std::string& command, const std::string& dir,
                              absl::Duration timeout,
                              std::shared_ptr<std::map<std::string, ParamCount>> record);

// A counter that answers from `known` only (the coordinator's: what the client's command
// answered at submit); InvalidArgument for an object it does not know.
ProgramCounter RecordedCounter(std::shared_ptr<const std::map<std::string, ParamCount>> known);

// A counter that asks `inner` about every object together with its siblings: the same object
// with each entry of `siblings` (param name -> JSON value) set on it, the other axis points of a
// sweep. A counter that caches (CommandCounter) then answers the other points from one call
// instead of a call each: a budget's search at every point asks about the same values. Answers
// `objects` only; when the call with the siblings fails, asks about `objects` alone (its error is
// then theirs). With no siblings (or no inner counter), `inner` itself.
ProgramCounter SiblingCounter(ProgramCounter inner,
                              std::vector<std::map<std::string, std::string>> siblings);

// Solves `rule.param()` of *program (an integer param) so that its count matches
// `anchor_total` (the count of `anchor`), a multiple of rule.multiple() >= that multiple, and
// sets it. InvalidArgument when the param is not an integer, the count is not monotone in it
// (naming two values that show it), or no value comes within the tolerance.
absl::StatusOr<BudgetSolution> SolveProgramBudget(const BudgetRule& rule, int64_t anchor_total,
                                                  const std::string& anchor,
                                                  const ProgramCounter& count,
                                                  ProgramConfig* program);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_PROGRAM_BUDGET_H_
