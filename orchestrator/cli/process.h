// The termination signals a long-running `ablate` command waits for (serve, up, dashboard). The
// processes ablate starts (ablate-worker, sbatch...) are orchestrator/cluster/process.h's.
#ifndef ABLATE_ORCHESTRATOR_CLI_PROCESS_H_
#define ABLATE_ORCHESTRATOR_CLI_PROCESS_H_

#include <signal.h>

#include <initializer_list>

#include "absl/time/time.h"

namespace ablate {

// Blocks `signals` in the calling thread for its life (restoring the mask after), so that they
// are taken with Wait (sigwait) instead of an async handler. Construct it before any thread
// starts: threads inherit the mask, and so the signals reach only Wait.
class BlockedSignals {
 public:
  explicit BlockedSignals(std::initializer_list<int> signals);
  ~BlockedSignals();
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;

  // The next of the signals (blocks until one comes).
  int Wait() const;
  // The next of the signals within `timeout`; 0 when none came.
  int WaitFor(absl::Duration timeout) const;

 private:
  sigset_t set_;
  sigset_t previous_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_PROCESS_H_
