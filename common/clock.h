// Where the time comes from, for measuring intervals: leases, heartbeats, backoff, silence.
//
// MonotonicClock reads the wall clock once, then advances it by the monotonic clock
// (std::chrono::steady_clock): an interval between two readings is what elapsed, whatever the
// wall clock did meanwhile (stepped back by an operator or NTP, forward after a VM resumed),
// while a reading stays near the wall time for logs. A wall clock stepped back would otherwise let
// a cut-off worker train on and write checkpoints past its lease, and one stepped forward on the
// coordinator would lose every lease at once. Thread-safe.
#ifndef ABLATE_COMMON_CLOCK_H_
#define ABLATE_COMMON_CLOCK_H_

#include <functional>

#include "absl/time/time.h"

namespace ablate {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class MonotonicClock : public Clock {
 public:
  // `monotonic` reads a clock that never steps (steady_clock's time since any fixed point); the
  // reading it gives now is anchored at `wall`.
  MonotonicClock(absl::Time wall, std::function<absl::Duration()> monotonic);
  absl::Time Now() const override;
  // The process-wide one: absl::Now() at its first use, steady_clock since (never destroyed).
  static const Clock* Get();

 private:
  const absl::Time wall_;
  const std::function<absl::Duration()> monotonic_;
  const absl::Duration anchor_;
};

// MonotonicClock::Get()->Now().
absl::Time MonotonicNow();

}  // namespace ablate

#endif  // ABLATE_COMMON_CLOCK_H_
