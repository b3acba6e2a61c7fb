// The rank processes of a data-parallel job on this worker (Agent::Impl::OtherRanks,
// agent_internal.h): the rendezvous rank 0 serves, ranks 1..N-1 (or a gang member's ranks)
// started pinned to their slots, the watcher that ends the rendezvous when one fails, and how
// their endings fold into the attempt's summary.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/agent/agent_internal.h"

namespace ablate {

absl::Status Agent::Impl::OtherRanks::Start(const Job& job, const std::string& config_path,
                                            const std::string& dir,
                                            const std::vector<int>& slots) {
  world_ = std::max(1, job.world_size());
  if (world_ == 1) return absl::OkStatus();
  const int offset = job.rank_offset(), local = LocalRanks(job);
  offset_ = offset;
  local_ = local;
  if (offset == 0) {
    // A gang's rank 0 serves at the address the coordinator chose; else a port of our own.
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        job.rendezvous().empty() ? RendezvousServer::Start("127.0.0.1", world_)
                                 : RendezvousServer::StartAt(job.rendezvous(), world_);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    address_ = job.rendezvous().empty() ? server_->address() : job.rendezvous();
  } else {
    address_ = job.rendezvous();
  }
  std::vector<std::vector<std::string>> args;
  std::vector<int> ranks;
  std::vector<std::vector<int>> cpus;  // each rank on its slot's core group
  const std::string timeout_s =
      absl::StrCat(absl::ToDoubleSeconds(agent_->options_.collective_timeout));
  for (int i = offset == 0 ? 1 : 0; i < local; ++i) {
    const int rank = offset + i;
    std::vector<std::string> a = {"train", "--resume", dir, "--config", config_path,
                                  "--world-size", std::to_string(world_), "--rank",
                                  std::to_string(rank), "--rendezvous", address_,
                                  "--collective-timeout", timeout_s};
    // Every rank pauses at the rung with rank 0, or the collectives after it would hang.
    if (job.stop_at_step() > 0) {
      a.insert(a.end(), {"--stop-at-step", std::to_string(job.stop_at_step())});
    }
    std::string device = agent_->DeviceOf(slots[i], job.config().train().device());
    if (device == "cuda") device = absl::StrCat("cuda:", slots[i]);  // this node's, not rank's
    if (!device.empty()) a.insert(a.end(), {"--device", device});
    args.push_back(std::move(a));
    ranks.push_back(rank);
    cpus.push_back(agent_->CoreGroup(slots[i]));
  }
  if (args.empty()) return absl::OkStatus();  // a gang's rank 0 alone on this worker
  absl::StatusOr<RankProcesses> processes =
      RankProcesses::Start(agent_->options_.rank_binary, args, ranks, cpus);
  if (!processes.ok()) return processes.status();
  processes_ = *std::move(processes);
  if (offset > 0) return absl::OkStatus();  // RunMember watches them
  Watch();
  return absl::OkStatus();
}

void Agent::Impl::OtherRanks::Watch() {
  watcher_ = std::thread([this] {
    while (!done_.load()) {
      if (std::optional<RankProcesses::Ending> failed = processes_->Poll()) {
        failure_ = failed;
        agent_->log_(absl::StrCat(run_, ": rank ", failed->rank, " of ", world_, " ended with ",
                                  failed->Describe(), "; ending the attempt"));
        if (server_) server_->Stop();  // a rendezvous still forming fails now, not at the timeout
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

RunSummary Agent::Impl::OtherRanks::RunMember(agent::JobReporter* reporter) {
  RunSummary summary;
  summary.set_state(SUCCEEDED);
  std::optional<absl::Time> signalled;
  while (processes_.has_value() && !processes_->AllEnded()) {
    if (std::optional<RankProcesses::Ending> failed = processes_->Poll()) {
      failure_ = failed;
      processes_->Signal(SIGTERM);  // the others cannot go on
      break;
    }
    const bool lost = reporter->ShouldStop() && !reporter->stop_directive();
    if (!signalled.has_value() && (agent_->Interrupted() || lost)) {
      // A cancellation (stop directive) reaches rank 0's worker, which stops every rank.
      processes_->Signal(SIGTERM);
      signalled = absl::Now();
      if (!lost) summary.set_state(INTERRUPTED);
    }
    // SIGTERM stops a rank at its next collective; one whose peers are gone may wait there until
    // the collective timeout, holding its device: not past a grace period.
    if (signalled.has_value() && absl::Now() - *signalled > kRankGrace) {
      agent_->log_(absl::StrCat(run_, ": ranks still running ", absl::FormatDuration(kRankGrace),
                                " after SIGTERM: killed"));
      processes_->Signal(SIGKILL);
      signalled = absl::InfiniteFuture();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  summary.set_reason(
      absl::StrCat("its ranks ", offset_, "-", offset_ + local_ - 1, " of ", world_));
  return summary;
}

void Agent::Impl::OtherRanks::StopWatching() {
  done_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

void Agent::Impl::OtherRanks::WaitForOthers(absl::StatusOr<RunSummary>* summary) {
  if (!processes_) return;
  StopWatching();
  if (!summary->ok()) processes_->Signal(SIGTERM);  // rank 0 failed: the others cannot go on
  std::optional<RankProcesses::Ending> failure;
  processes_->Wait(std::chrono::seconds(30), &failure);
  if (!failure) failure = failure_;
  if (!failure) return;
  const std::string what =
      absl::StrCat("rank ", failure->rank, " of ", world_, " ended with ", failure->Describe());
  if (offset_ > 0) {  // a gang member's rank: the attempt fails (rank 0's worker sees it too)
    *summary = absl::InternalError(what);
    return;
  }
  if (summary->ok()) {  // after the last collective: rank 0's results are whole
    agent_->log_(absl::StrCat(run_, ": ", what, " after the run ended"));
    return;
  }
  *summary = absl::Status(summary->status().code(),
                          absl::StrCat(what, "; rank 0: ", summary->status().message()));
}

}  // namespace ablate
