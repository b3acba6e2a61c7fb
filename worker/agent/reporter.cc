#include "worker/agent/reporter.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/durable_file.h"
#include "proto/grpc_status.h"

namespace ablate {
namespace agent {

namespace fs = std::filesystem;

JobReporter::JobReporter(Params params) : p_(std::move(params)) {
  const absl::Time leased_at = p_.leased_at == absl::InfinitePast() ? MonotonicNow() : p_.leased_at;
  acknowledged_sent_ns_.store(absl::ToUnixNanos(leased_at));
}

JobReporter::~JobReporter() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (call_ != nullptr) call_->TryCancel();  // a hanging call would delay the join
    cv_.SignalAll();
  }
  if (sender_.joinable()) sender_.join();
}

void JobReporter::Start(std::vector<OutboxItem> first) {
  {
    absl::MutexLock lock(&mu_);
    for (OutboxItem& item : first) Push(std::move(item));
    last_sent_ = MonotonicNow();
  }
  sender_ = std::thread([this] { SenderLoop(); });
}

void JobReporter::Add(OutboxItem item) {
  absl::MutexLock lock(&mu_);
  const bool was_empty = outbox_.empty();
  Push(std::move(item));
  // The sender sleeps until the next heartbeat while there is nothing to send, and until the
  // next report otherwise: wake it when that changes.
  if (was_empty || points_ >= p_.options->max_batch_points) cv_.SignalAll();
}

void JobReporter::AddNotice(const std::string& line) {
  (*p_.log)(absl::StrCat("run ", p_.run_id, " attempt ", p_.attempt, ": ", line));
  Add(Notice{line});
}

absl::Status JobReporter::Silence() const {
  if (p_.lease_timeout <= absl::ZeroDuration()) return absl::OkStatus();
  const absl::Time sent = absl::FromUnixNanos(acknowledged_sent_ns_.load());
  if (MonotonicNow() - sent < p_.lease_timeout) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "nothing acknowledged by coordinator ", p_.options->coordinator, " for ",
      absl::FormatDuration(p_.lease_timeout), " (the lease timeout): it has given the run to ",
      "another worker or will, so this one stopped training and writing checkpoints"));
}

bool JobReporter::ShouldStop() {
  if (stop_directive_.load() || gave_up_.load()) return true;
  if (absl::Status silent = Silence(); !silent.ok()) {
    GiveUp(std::move(silent));
    return true;
  }
  return false;
}

void JobReporter::WriteJournal(int64_t checkpoint_step) {
  ReportRequest journal;
  {
    absl::MutexLock lock(&mu_);
    if (inflight_.has_value()) {
      for (const StepMetrics& m : inflight_->steps()) *journal.add_steps() = m;
      for (const EvalResult& e : inflight_->evals()) *journal.add_evals() = e;
      for (const SpikeEvent& e : inflight_->spikes()) *journal.add_spikes() = e;
    }
    for (const OutboxItem& item : outbox_) {
      if (const auto* m = std::get_if<StepMetrics>(&item)) *journal.add_steps() = *m;
      if (const auto* e = std::get_if<EvalResult>(&item)) *journal.add_evals() = *e;
      if (const auto* e = std::get_if<SpikeEvent>(&item)) *journal.add_spikes() = *e;
    }
  }
  auto keep = [checkpoint_step](const auto& point) { return point.step() <= checkpoint_step; };
  ReportRequest kept;
  for (const StepMetrics& m : journal.steps()) if (keep(m)) *kept.add_steps() = m;
  for (const EvalResult& e : journal.evals()) if (keep(e)) *kept.add_evals() = e;
  for (const SpikeEvent& e : journal.spikes()) if (keep(e)) *kept.add_spikes() = e;
  std::error_code ec;
  if (kept.steps_size() + kept.evals_size() + kept.spikes_size() == 0) {
    fs::remove(p_.journal_path, ec);
    return;
  }
  if (absl::Status written = WriteFileAtomically(p_.journal_path, kept.SerializeAsString(), 0644);
      !written.ok()) {
    (*p_.log)(absl::StrCat("run ", p_.run_id, ": ", written.message(), ": unsent points are ",
                           "kept in memory only"));
  }
}

absl::Status JobReporter::Flush() {
  absl::MutexLock lock(&mu_);
  flush_requested_ = true;
  cv_.SignalAll();
  while (terminal_.ok() && (!outbox_.empty() || inflight_.has_value())) {
    // Woken now and then to give up on a silent coordinator, even while a call hangs.
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
    if (absl::Status silent = Silence(); !silent.ok()) GiveUpLocked(std::move(silent));
  }
  return terminal_;
}

void JobReporter::Push(OutboxItem item) {
  if (!std::holds_alternative<CheckpointNotice>(item) && !std::holds_alternative<Notice>(item) &&
      !std::holds_alternative<ParamCount>(item)) {
    ++points_;
  }
  outbox_.push_back(std::move(item));
}

ReportRequest JobReporter::TakeBatch() {
  ReportRequest batch;
  batch.set_worker_id(p_.worker_id);
  batch.set_run_id(p_.run_id);
  batch.set_attempt(p_.attempt);
  batch.set_lease_secret(p_.lease_secret);
  if (outbox_.empty()) return batch;
  batch.set_seq(next_seq_++);
  int points = 0;
  while (!outbox_.empty() && points < std::min(p_.options->max_batch_points, batch_limit_)) {
    OutboxItem& item = outbox_.front();
    if (auto* m = std::get_if<StepMetrics>(&item)) {
      *batch.add_steps() = std::move(*m);
      ++points;
    } else if (auto* e = std::get_if<EvalResult>(&item)) {
      *batch.add_evals() = std::move(*e);
      ++points;
    } else if (auto* s = std::get_if<SpikeEvent>(&item)) {
      *batch.add_spikes() = std::move(*s);
      ++points;
    } else if (auto* c = std::get_if<CheckpointNotice>(&item)) {
      batch.set_checkpoint_step(c->step);
      batch.set_checkpoint_path(std::move(c->path));
    } else if (auto* n = std::get_if<Notice>(&item)) {
      batch.add_notices(std::move(n->line));
    } else if (auto* c = std::get_if<ParamCount>(&item)) {
      *batch.mutable_params() = std::move(*c);
    }
    outbox_.pop_front();
  }
  points_ -= points;
  return batch;
}

std::optional<ReportRequest> JobReporter::NextBatch() {
  absl::MutexLock lock(&mu_);
  while (!closing_) {
    if (inflight_.has_value()) return inflight_;
    const absl::Time now = MonotonicNow();
    const absl::Time report_at = last_sent_ + p_.options->report_interval;
    const absl::Time heartbeat_at = last_sent_ + p_.heartbeat;
    const bool pending = !outbox_.empty();
    if ((pending && (flush_requested_ || now >= report_at ||
                     points_ >= p_.options->max_batch_points)) ||
        now >= heartbeat_at) {
      inflight_ = TakeBatch();
      return inflight_;
    }
    cv_.WaitWithTimeout(&mu_, (pending ? std::min(report_at, heartbeat_at) : heartbeat_at) - now);
  }
  return std::nullopt;
}

bool JobReporter::TooLarge(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return false;
  // gRPC's message limit ("Received message larger than max"), or the coordinator's rows limit
  // ("report: the batch has N rows; the limit is M"). Other RESOURCE_EXHAUSTED (memory pressure)
  // is transient.
  return absl::StrContains(status.error_message(), "larger than max") ||
         absl::StrContains(status.error_message(), "rows; the limit is");
}

bool JobReporter::SplitInflight() {
  const ReportRequest batch = *std::move(inflight_);
  inflight_.reset();
  const int points = batch.steps_size() + batch.evals_size() + batch.spikes_size();
  // Its points back at the front of the outbox, in order within each kind; the checkpoint
  // notice after them all, so it still comes with or after every step it covers.
  std::deque<OutboxItem> back;
  for (const StepMetrics& m : batch.steps()) back.push_back(m);
  for (const EvalResult& e : batch.evals()) back.push_back(e);
  for (const SpikeEvent& s : batch.spikes()) back.push_back(s);
  for (const std::string& line : batch.notices()) back.push_back(Notice{line});
  if (batch.has_params()) back.push_back(batch.params());
  if (batch.checkpoint_step() > 0) {
    back.push_back(CheckpointNotice{batch.checkpoint_step(), batch.checkpoint_path()});
  }
  outbox_.insert(outbox_.begin(), back.begin(), back.end());
  points_ += points;
  // Refused whole: its number is free again.
  next_seq_ = batch.seq();
  if (points <= 1) return false;
  batch_limit_ = std::max(1, points / 2);
  cv_.SignalAll();
  return true;
}

void JobReporter::GiveUp(absl::Status why) {
  absl::MutexLock lock(&mu_);
  GiveUpLocked(std::move(why));
}

void JobReporter::GiveUpLocked(absl::Status why) {
  if (terminal_.ok()) terminal_ = std::move(why);
  gave_up_.store(true);
  if (call_ != nullptr) call_->TryCancel();
  cv_.SignalAll();
}

bool JobReporter::WaitBeforeResend(absl::Duration d) {
  const absl::Time end = MonotonicNow() + d;
  absl::MutexLock lock(&mu_);
  for (absl::Time now = MonotonicNow();
       !closing_ && terminal_.ok() && !IsSet(p_.options->abort) && now < end; now = MonotonicNow()) {
    cv_.WaitWithTimeout(&mu_, std::min(end - now, absl::Milliseconds(50)));
  }
  return !closing_ && terminal_.ok() && !IsSet(p_.options->abort);
}

void JobReporter::SenderLoop() {
  // Several resends within a lease, so that a coordinator back in time is seen in time.
  const absl::Duration backoff_max = p_.lease_timeout > absl::ZeroDuration()
                                         ? std::min(p_.options->backoff_max, p_.lease_timeout / 4)
                                         : p_.options->backoff_max;
  Backoff backoff(p_.options->backoff_min, backoff_max);
  while (std::optional<ReportRequest> batch = NextBatch()) {
    grpc::ClientContext context;
    const absl::Time sent = MonotonicNow();  // intervals: common/clock.h
    context.set_deadline(absl::ToChronoTime(absl::Now() + p_.options->call_deadline));
    if (!p_.options->token.empty()) {
      context.AddMetadata("authorization", "Bearer " + p_.options->token);
    }
    {
      absl::MutexLock lock(&mu_);
      if (!terminal_.ok() || closing_) return;
      call_ = &context;
    }
    ReportResponse response;
    const grpc::Status status = p_.stub->Report(&context, *batch, &response);
    {
      absl::MutexLock lock(&mu_);
      call_ = nullptr;
      if (!terminal_.ok() || closing_) return;  // gave up or closing (and cancelled the call)
    }
    if (status.ok()) {
      acknowledged_sent_ns_.store(absl::ToUnixNanos(sent));
      p_.connection->Reachable();
      backoff.Reset();
      if (response.directive() == DIRECTIVE_STOP && !stop_directive_.exchange(true)) {
        (*p_.log)(absl::StrCat("run ", p_.run_id, " attempt ", p_.attempt,
                               ": the coordinator says stop (cancelled)"));
      }
      absl::MutexLock lock(&mu_);
      inflight_.reset();
      last_sent_ = MonotonicNow();
      cv_.SignalAll();
      continue;
    }
    if (TooLarge(status)) {
      absl::MutexLock lock(&mu_);
      if (!SplitInflight()) {
        GiveUpLocked(absl::ResourceExhaustedError(absl::StrCat(
            "a single metric point of run ", p_.run_id, " is larger than coordinator ",
            p_.options->coordinator, " takes in one report (",
            FromGrpcStatus(status).message(), ")")));
        return;
      }
      (*p_.log)(absl::StrCat("run ", p_.run_id, " attempt ", p_.attempt, ": report ",
                             batch->seq(), " was too large for the coordinator (",
                             FromGrpcStatus(status).message(), "): sent in batches of at most ",
                             batch_limit_, " points"));
      continue;
    }
    if (LeaseLost(status.error_code())) {
      GiveUp(absl::FailedPreconditionError(absl::StrCat(
          "the coordinator refused report ", batch->seq(), " (", FromGrpcStatus(status).ToString(),
          "): the lease was lost")));
      return;
    }
    if (!Transient(status.error_code())) {
      GiveUp(absl::Status(FromGrpcStatus(status).code(),
                          absl::StrCat("coordinator ", p_.options->coordinator,
                                       " refused a report of run ", p_.run_id, ": ",
                                       FromGrpcStatus(status).ToString())));
      return;
    }
    p_.connection->Unreachable("Report", status);
    if (absl::Status silent = Silence(); !silent.ok()) {
      GiveUp(std::move(silent));
      return;
    }
    if (!WaitBeforeResend(backoff.Next())) {
      if (IsSet(p_.options->abort)) {
        GiveUp(absl::AbortedError(absl::StrCat(
            "gave up reporting run ", p_.run_id, ": coordinator ", p_.options->coordinator,
            " is unreachable; unsent points up to the last checkpoint are in ",
            p_.journal_path)));
      }
      return;
    }
  }
}

// The journalled points of an earlier attempt up to `resumed_step` (later ones are trained again).
std::vector<OutboxItem> LoadJournal(const std::string& path, int64_t resumed_step) {
  std::vector<OutboxItem> items;
  std::ifstream in(path, std::ios::binary);
  ReportRequest journal;
  if (!in || !journal.ParseFromIstream(&in)) return items;
  for (const StepMetrics& m : journal.steps()) if (m.step() <= resumed_step) items.push_back(m);
  for (const EvalResult& e : journal.evals()) if (e.step() <= resumed_step) items.push_back(e);
  for (const SpikeEvent& e : journal.spikes()) if (e.step() <= resumed_step) items.push_back(e);
  return items;
}

}  // namespace agent
}  // namespace ablate
