// The agent's slot accounting (agent_internal.h): how many slots a job holds in the coordinator's
// view (claimed from its lease until just before its Finish), which slots it trains on (taken
// while it trains), and each slot's device and core group.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/agent/agent_internal.h"

namespace ablate {

std::string Agent::Impl::DeviceOf(int slot, const std::string& device) const {
  std::string d = device;
  if (!devices_.empty()) d = devices_[static_cast<size_t>(slot) < devices_.size() ? slot : 0];
  if (d == "cuda" && slots() > 1) d = absl::StrCat("cuda:", slot);
  return d;
}

std::vector<int> Agent::Impl::CoreGroup(int slot) const {
  const int n = static_cast<int>(cpus_.size()), k = slots();
  if (k <= 1 || n < k) return {};
  return std::vector<int>(cpus_.begin() + slot * n / k, cpus_.begin() + (slot + 1) * n / k);
}

int Agent::Impl::LocalRanks(const Job& job) {
  return job.local_ranks() > 0 ? job.local_ranks() : std::max(1, job.world_size());
}

int Agent::Impl::SlotsOf(const Job& job) const {
  const int local = LocalRanks(job);
  return local > slots() ? 1 : local;
}

void Agent::Impl::Claim(const Job& job) {
  claimed_ += SlotsOf(job);
  ++result_.jobs;
}

void Agent::Impl::Unclaim(const Job& job) {
  claimed_ -= SlotsOf(job);
  ++changes_;
}

bool Agent::Impl::MayTakeMore() const {
  return !Interrupted() && (options_.max_jobs == 0 || result_.jobs + asking_ < options_.max_jobs);
}

std::optional<std::vector<int>> Agent::Impl::TakeSlots(int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      std::vector<int> free;
      for (int i = 0; i < static_cast<int>(slot_busy_.size()); ++i) {
        if (!slot_busy_[i]) free.push_back(i);
      }
      if (static_cast<int>(free.size()) >= n) {
        free.resize(n);
        for (int i : free) slot_busy_[i] = true;
        return free;
      }
    }
    if (Interrupted() || absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Agent::Impl::FreeSlots(const std::vector<int>& taken) {
  absl::MutexLock lock(&mu_);
  for (int i : taken) slot_busy_[i] = false;
}

}  // namespace ablate
