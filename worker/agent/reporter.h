// What the coordinator is told about one attempt at a run (docs/worker.md): every step, evaluation,
// spike, checkpoint and notice, in order, in numbered batches a sender thread ships and resends
// unchanged until acknowledged, with heartbeats in between; the points not acknowledged at a
// checkpoint are journalled beside it, so a later attempt resends them should this process die.
// When nothing was acknowledged for a lease timeout the reporter gives up: the coordinator has
// given the run away, or will, so training must stop before it writes another checkpoint.
#ifndef ABLATE_WORKER_AGENT_REPORTER_H_
#define ABLATE_WORKER_AGENT_REPORTER_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ablate.grpc.pb.h"
#include "worker/agent/calls.h"
#include "worker/agent/options.h"
#include "worker/train/trainer.h"

namespace ablate {
namespace agent {

// Where the points not yet acknowledged at the last checkpoint are kept (a ReportRequest holding
// only steps, evals and spikes), beside the checkpoint.
inline constexpr char kJournalFile[] = "unreported.binpb";

// "A checkpoint of `step` was written to `path`", queued behind the steps it covers.
struct CheckpointNotice {
  int64_t step = 0;
  std::string path;
};
// A line for the run's event log (ReportRequest.notices).
struct Notice {
  std::string line;
};
using OutboxItem =
    std::variant<StepMetrics, EvalResult, SpikeEvent, CheckpointNotice, Notice, ParamCount>;

// Everything the coordinator is told about one attempt: the outbox and its sender thread.
//
// Add/AddNotice/WriteJournal are called on the training thread, Flush and the destructor on the
// agent's thread; ShouldStop from either. The sender thread is the only one that calls Report.
class JobReporter {
 public:
  struct Params {
    WorkerService::Stub* stub = nullptr;
    const AgentOptions* options = nullptr;
    ConnectionLog* connection = nullptr;
    Logger* log = nullptr;
    int64_t worker_id = 0;
    int64_t run_id = 0;
    int32_t attempt = 0;
    std::string lease_secret;  // the Job's: every report presents it
    absl::Duration heartbeat;  // an empty batch renews the lease after this long without one
    // Give up when no report sent after `leased_at` was acknowledged for this long (the lease
    // timeout). Zero: never.
    absl::Duration lease_timeout;
    absl::Time leased_at;  // when the job was received
    std::string journal_path;
  };

  explicit JobReporter(Params params);

  // Stops the sender; whatever was not acknowledged stays unsent (call Flush first).
  ~JobReporter();

  // Queues `first` (journalled points of an earlier attempt) and starts the sender. Once.
  void Start(std::vector<OutboxItem> first);

  void Add(OutboxItem item);
  // Logs `line` (naming the run) and queues it for the run's event log.
  void AddNotice(const std::string& line);

  // Training must end now: the coordinator said stop, or the reporter gave up (the lease was
  // lost, or nothing was acknowledged for a lease timeout: checked here too, so that training
  // stops in time even while a call hangs).
  bool ShouldStop();
  bool stop_directive() const { return stop_directive_.load(); }

  // Journals the points not acknowledged yet, up to `checkpoint_step` (the checkpoint written
  // just now), for a later attempt should this process die before they are.
  void WriteJournal(int64_t checkpoint_step);

  // Ships everything queued and waits until all of it is acknowledged. Returns why not
  // otherwise: FailedPrecondition (the lease was lost, or nothing was acknowledged for a lease
  // timeout), Aborted (`abort` was set while the coordinator was unreachable), or the
  // coordinator's refusal.
  absl::Status Flush();

 private:
  void Push(OutboxItem item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The next batch: up to max_batch_points from the front of the outbox, in order. With the
  // outbox empty, a heartbeat: seq 0 renews the lease and stores nothing.
  ReportRequest TakeBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Waits until a batch is due (or the one in flight needs resending) and returns it; nullopt
  // when closing.
  std::optional<ReportRequest> NextBatch();

  // A report refused for its size (gRPC's message limit, the coordinator's rows limit).
  static bool TooLarge(const grpc::Status& status);
  // Puts the batch in flight back into the outbox and halves the batch size: false when it held
  // a single point (no batch can carry it).
  bool SplitInflight() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Records why the sender stops (the first reason wins) and cancels the call in flight.
  void GiveUp(absl::Status why);
  void GiveUpLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // FailedPrecondition once no report was acknowledged for the lease timeout, else OK.
  absl::Status Silence() const;

  // Waits `d` before a resend; false when closing or `abort` was set meanwhile.
  bool WaitBeforeResend(absl::Duration d);

  void SenderLoop();

  // Constant after construction.
  const Params p_;

  // Set by the sender thread, read by the training thread.
  std::atomic<bool> stop_directive_{false};
  std::atomic<bool> gave_up_{false};
  // When the last acknowledged report was sent (absl::ToUnixNanos): the coordinator renewed the
  // lease after that, so it holds until this plus the lease timeout at least.
  std::atomic<int64_t> acknowledged_sent_ns_{0};

  absl::Mutex mu_;
  absl::CondVar cv_;  // outbox, inflight_, closing_, terminal_ changed
  std::deque<OutboxItem> outbox_ ABSL_GUARDED_BY(mu_);
  int64_t points_ ABSL_GUARDED_BY(mu_) = 0;  // non-checkpoint items in outbox_
  // The batch sent and not acknowledged yet: resent unchanged.
  std::optional<ReportRequest> inflight_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // Points per batch after a batch was refused for its size (halved each time).
  int batch_limit_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int>::max();
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_);  // last acknowledgement (or the start)
  bool flush_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status terminal_ ABSL_GUARDED_BY(mu_);  // why the sender gave up
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // the Report in flight

  std::thread sender_;  // touched by the agent's thread only
};

// Feeds the trainer's output to the reporter and relays its stop.
class ReportingObserver : public TrainerObserver {
 public:
  explicit ReportingObserver(JobReporter* reporter) : reporter_(reporter) {}
  Directive OnStep(const StepMetrics& m) override {
    reporter_->Add(m);
    return reporter_->ShouldStop() ? Directive::kStop : Directive::kContinue;
  }
  void OnEval(const EvalResult& e) override { reporter_->Add(e); }
  void OnSpike(const SpikeEvent& e) override { reporter_->Add(e); }
  Directive BeforeCheckpoint(int64_t) override {
    return reporter_->ShouldStop() ? Directive::kStop : Directive::kContinue;
  }
  void OnCheckpoint(int64_t step, const std::string& path) override {
    reporter_->WriteJournal(step);
    reporter_->Add(CheckpointNotice{step, path});
  }
  void OnNotice(const std::string& line) override { reporter_->AddNotice(line); }
  void OnParams(const ParamCount& params) override { reporter_->Add(params); }

 private:
  JobReporter* const reporter_;
};

// The journalled points of an earlier attempt up to `resumed_step` (later ones are trained again).
std::vector<OutboxItem> LoadJournal(const std::string& path, int64_t resumed_step);

}  // namespace agent
}  // namespace ablate

#endif  // ABLATE_WORKER_AGENT_REPORTER_H_
