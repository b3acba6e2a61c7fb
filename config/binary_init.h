// What every ablate binary's main() does first (tests do not).
#ifndef ABLATE_CONFIG_BINARY_INIT_H_
#define ABLATE_CONFIG_BINARY_INIT_H_

#include "absl/synchronization/mutex.h"

namespace ablate {

// Debian builds Abseil without NDEBUG, which leaves Mutex deadlock detection on: every lock,
// gRPC's included, updates one global lock-order graph. It cost the coordinator about a tenth of
// its CPU per dispatched job (bench_scheduler). Tests keep it, to catch lock-order inversions.
inline void InitBinary() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace ablate

#endif  // ABLATE_CONFIG_BINARY_INIT_H_
