#include "worker/agent/calls.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/grpc_status.h"

namespace ablate {
namespace agent {

bool Transient(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::CANCELLED:
      return true;
    default:
      return false;
  }
}

bool LeaseLost(grpc::StatusCode code) {
  return code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::NOT_FOUND;
}

absl::Duration Backoff::Next() {
  const absl::Duration d = next_;
  next_ = std::min(next_ * 2, max_);
  return d * std::uniform_real_distribution<double>(0.8, 1.2)(rng_);
}

bool SleepUnless(absl::Duration d, const std::atomic<bool>* flag) {
  const absl::Time end = absl::Now() + d;
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    if (IsSet(flag)) return false;
    absl::SleepFor(std::min(end - now, absl::Milliseconds(50)));
  }
  return !IsSet(flag);
}

void Logger::operator()(const std::string& line) {
  absl::MutexLock lock(&mu_);
  if (sink_) {
    sink_(line);
    return;
  }
  std::fprintf(stderr, "%s %s\n",
               absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
               line.c_str());
  std::fflush(stderr);
}

void ConnectionLog::Reachable() {
  absl::MutexLock lock(&mu_);
  if (reachable_) return;
  reachable_ = true;
  (*log_)(absl::StrCat("coordinator ", coordinator_, " is reachable again"));
}

void ConnectionLog::Unreachable(const char* call, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!reachable_) return;
  reachable_ = false;
  (*log_)(absl::StrCat("coordinator ", coordinator_, " unreachable (", call, ": ",
                       FromGrpcStatus(status).ToString(), "); retrying with backoff up to ",
                       absl::FormatDuration(backoff_max_)));
}

}  // namespace agent
}  // namespace ablate
