// A run's states (RunState, proto/ablate.proto) as every part reads them: which of them end a
// run, and their names in the enum's order, as the store writes them and `ablate status` lists
// them. Pure functions; thread-safe.
#ifndef ABLATE_CONFIG_RUN_STATE_H_
#define ABLATE_CONFIG_RUN_STATE_H_

#include <string>
#include <vector>

#include "proto/ablate.pb.h"

namespace ablate {

// Whether a run in `state` has ended: SUCCEEDED, FAILED, DIVERGED, CANCELLED or STOPPED. PENDING,
// RUNNING and INTERRUPTED (resumable) have not, nor has RUN_STATE_UNSPECIFIED.
bool RunEnded(RunState state);

// The name of every state but RUN_STATE_UNSPECIFIED, in the enum's order: PENDING, RUNNING,
// SUCCEEDED, FAILED, DIVERGED, CANCELLED, INTERRUPTED, STOPPED.
const std::vector<std::string>& RunStateNames();

}  // namespace ablate

#endif  // ABLATE_CONFIG_RUN_STATE_H_
