#include "orchestrator/sweep/version.h"

#ifndef ABLATE_CODE_VERSION
#error "ABLATE_CODE_VERSION is defined by CMakeLists.txt"
#endif

namespace ablate {

const char* CodeVersion() { return ABLATE_CODE_VERSION; }

}  // namespace ablate
