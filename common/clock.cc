#include "common/clock.h"

#include <chrono>
#include <utility>

#include "absl/time/clock.h"

namespace ablate {

MonotonicClock::MonotonicClock(absl::Time wall, std::function<absl::Duration()> monotonic)
    : wall_(wall), monotonic_(std::move(monotonic)), anchor_(monotonic_()) {}

absl::Time MonotonicClock::Now() const { return wall_ + (monotonic_() - anchor_); }

const Clock* MonotonicClock::Get() {
  static const MonotonicClock* clock = new MonotonicClock(absl::Now(), [] {
    return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  });
  return clock;
}

absl::Time MonotonicNow() { return MonotonicClock::Get()->Now(); }

}  // namespace ablate
