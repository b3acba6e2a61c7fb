// How the agent calls the coordinator: which failures are worth a retry, the backoff between
// retries, the log, and whether the coordinator answers (logged once per change, not per retry).
// Shared by the agent loop (agent.cc) and the reporter of a job (reporter.h).
#ifndef ABLATE_WORKER_AGENT_CALLS_H_
#define ABLATE_WORKER_AGENT_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ablate {
namespace agent {

inline bool IsSet(const std::atomic<bool>* flag) { return flag != nullptr && flag->load(); }

// Codes after which a call is retried: the coordinator is away, restarting or overloaded.
bool Transient(grpc::StatusCode code);

// A stale attempt: the coordinator gave the run's lease away.
bool LeaseLost(grpc::StatusCode code);

// Doubles from min to max, with +-20% jitter so that many workers do not retry in step.
class Backoff {
 public:
  Backoff(absl::Duration min, absl::Duration max)
      : min_(min), max_(std::max(min, max)), next_(min), rng_(std::random_device{}()) {}
  absl::Duration Next();
  void Reset() { next_ = min_; }

 private:
  const absl::Duration min_, max_;
  absl::Duration next_;
  std::minstd_rand rng_;
};

// Sleeps for `d` unless `flag` is (or becomes) set; true when it slept the whole time.
bool SleepUnless(absl::Duration d, const std::atomic<bool>* flag);

// The log sink, called one line at a time from any thread: `sink`, else a timestamped line on
// stderr.
class Logger {
 public:
  explicit Logger(std::function<void(const std::string&)> sink) : sink_(std::move(sink)) {}
  void operator()(const std::string& line);

 private:
  absl::Mutex mu_;
  const std::function<void(const std::string&)> sink_ ABSL_GUARDED_BY(mu_);
};

// Whether the coordinator answers, logged once per change (not once per retry). Thread-safe.
class ConnectionLog {
 public:
  ConnectionLog(std::string coordinator, absl::Duration backoff_max, Logger* log)
      : coordinator_(std::move(coordinator)), backoff_max_(backoff_max), log_(log) {}

  void Reachable();
  void Unreachable(const char* call, const grpc::Status& status);

 private:
  const std::string coordinator_;
  const absl::Duration backoff_max_;
  Logger* const log_;

  absl::Mutex mu_;
  bool reachable_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace agent
}  // namespace ablate

#endif  // ABLATE_WORKER_AGENT_CALLS_H_
