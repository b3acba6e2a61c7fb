// What every ablate binary's main() does first (tests do not).
#ifndef ABLATE_COMMON_BINARY_INIT_H_
#define ABLATE_COMMON_BINARY_INIT_H_

#include "absl/synchronization/mutex.h"

namespace ablate {

// Debian builds Abseil without NDEBUG, which leaves Mutex deadlock detection on: every lock,
// gRPC's included, updates one global lock-order graph, a cost on every dispatched job. Tests
// keep it, to catch lock-order inversions.
inline void InitBinary() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace ablate

#endif  // ABLATE_COMMON_BINARY_INIT_H_
