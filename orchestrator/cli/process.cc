#include "orchestrator/cli/process.h"

#include <pthread.h>

#include <algorithm>

namespace ablate {

BlockedSignals::BlockedSignals(std::initializer_list<int> signals) {
  sigemptyset(&set_);
  for (int s : signals) sigaddset(&set_, s);
  pthread_sigmask(SIG_BLOCK, &set_, &previous_);
}

BlockedSignals::~BlockedSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

int BlockedSignals::Wait() const {
  int signal = 0;
  sigwait(&set_, &signal);
  return signal;
}

int BlockedSignals::WaitFor(absl::Duration timeout) const {
  const timespec wait = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  const int got = sigtimedwait(&set_, nullptr, &wait);
  return got > 0 ? got : 0;
}

}  // namespace ablate
