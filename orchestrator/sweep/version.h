// The code version that goes into every run key: the project version plus the git commit the
// build was configured at ("0.1.0+4a82449"; "0.1.0" outside a git checkout). CMake records the
// commit at configure time and re-configures when HEAD moves.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_VERSION_H_
#define ABLATE_ORCHESTRATOR_SWEEP_VERSION_H_

namespace ablate {

const char* CodeVersion();

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_VERSION_H_
