#include "worker/agent.h"

#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "orchestrator/tls.h"
#include "proto/ablate.grpc.pb.h"
#include "proto/grpc_status.h"
#include "worker/trainer.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

// Where the points not yet acknowledged at the last checkpoint are kept (a ReportRequest holding
// only steps, evals and spikes).
constexpr char kJournalFile[] = "unreported.binpb";

bool IsSet(const std::atomic<bool>* flag) { return flag != nullptr && flag->load(); }

// Codes after which a call is retried: the coordinator is away, restarting or overloaded.
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

// A stale attempt: the coordinator gave the run's lease away.
bool LeaseLost(grpc::StatusCode code) {
  return code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::NOT_FOUND;
}

// Doubles from min to max, with +-20% jitter so that many workers do not retry in step.
class Backoff {
 public:
  Backoff(absl::Duration min, absl::Duration max)
      : min_(min), max_(std::max(min, max)), next_(min), rng_(std::random_device{}()) {}
  absl::Duration Next() {
    const absl::Duration d = next_;
    next_ = std::min(next_ * 2, max_);
    return d * std::uniform_real_distribution<double>(0.8, 1.2)(rng_);
  }
  void Reset() { next_ = min_; }

 private:
  const absl::Duration min_, max_;
  absl::Duration next_;
  std::minstd_rand rng_;
};

// Sleeps for `d` unless `flag` is (or becomes) set; true when it slept the whole time.
bool SleepUnless(absl::Duration d, const std::atomic<bool>* flag) {
  const absl::Time end = absl::Now() + d;
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    if (IsSet(flag)) return false;
    absl::SleepFor(std::min(end - now, absl::Milliseconds(50)));
  }
  return !IsSet(flag);
}

// The log sink, called one line at a time from any thread.
class Logger {
 public:
  explicit Logger(std::function<void(const std::string&)> sink) : sink_(std::move(sink)) {}
  void operator()(const std::string& line) {
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

 private:
  absl::Mutex mu_;
  const std::function<void(const std::string&)> sink_ ABSL_GUARDED_BY(mu_);
};

// Whether the coordinator answers, logged once per change (not once per retry). Thread-safe.
class ConnectionLog {
 public:
  ConnectionLog(std::string coordinator, absl::Duration backoff_max, Logger* log)
      : coordinator_(std::move(coordinator)), backoff_max_(backoff_max), log_(log) {}

  void Reachable() {
    absl::MutexLock lock(&mu_);
    if (reachable_) return;
    reachable_ = true;
    (*log_)(absl::StrCat("coordinator ", coordinator_, " is reachable again"));
  }
  void Unreachable(const char* call, const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!reachable_) return;
    reachable_ = false;
    (*log_)(absl::StrCat("coordinator ", coordinator_, " unreachable (", call, ": ",
                         FromGrpcStatus(status).ToString(), "); retrying with backoff up to ",
                         absl::FormatDuration(backoff_max_)));
  }

 private:
  const std::string coordinator_;
  const absl::Duration backoff_max_;
  Logger* const log_;

  absl::Mutex mu_;
  bool reachable_ ABSL_GUARDED_BY(mu_) = true;
};

// "A checkpoint of `step` was written to `path`", queued behind the steps it covers.
struct CheckpointNotice {
  int64_t step = 0;
  std::string path;
};
using OutboxItem = std::variant<StepMetrics, EvalResult, SpikeEvent, CheckpointNotice>;

// Everything the coordinator is told about one attempt: the outbox and its sender thread.
//
// Add*/WriteJournal are called on the training thread, Flush and the destructor on the agent's
// thread; ShouldStop from either. The sender thread is the only one that calls Report.
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
    absl::Duration heartbeat;  // an empty batch renews the lease after this long without one
    std::string journal_path;
  };

  explicit JobReporter(Params params) : p_(std::move(params)) {}

  // Stops the sender; whatever was not acknowledged stays unsent (call Flush first).
  ~JobReporter() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      cv_.SignalAll();
    }
    if (sender_.joinable()) sender_.join();
  }

  // Queues `first` (journalled points of an earlier attempt) and starts the sender. Once.
  void Start(std::vector<OutboxItem> first) {
    {
      absl::MutexLock lock(&mu_);
      for (OutboxItem& item : first) Push(std::move(item));
      last_sent_ = absl::Now();
    }
    sender_ = std::thread([this] { SenderLoop(); });
  }

  void Add(OutboxItem item) {
    absl::MutexLock lock(&mu_);
    const bool was_empty = outbox_.empty();
    Push(std::move(item));
    // The sender sleeps until the next heartbeat while there is nothing to send, and until the
    // next report otherwise: wake it when that changes.
    if (was_empty || points_ >= p_.options->max_batch_points) cv_.SignalAll();
  }

  // Training must end now: the coordinator said stop, or the reporter gave up (lease lost).
  bool ShouldStop() const { return stop_directive_.load() || gave_up_.load(); }
  bool stop_directive() const { return stop_directive_.load(); }

  // Journals the points not acknowledged yet, up to `checkpoint_step` (the checkpoint written
  // just now), for a later attempt should this process die before they are.
  void WriteJournal(int64_t checkpoint_step) {
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
    const std::string tmp = p_.journal_path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out || !kept.SerializeToOstream(&out)) {
        (*p_.log)(absl::StrCat("run ", p_.run_id, ": cannot write ", tmp, ": unsent points are ",
                               "kept in memory only"));
        return;
      }
    }
    fs::rename(tmp, p_.journal_path, ec);
  }

  // Ships everything queued and waits until all of it is acknowledged. Returns why not
  // otherwise: FailedPrecondition (the lease was lost), Aborted (`abort` was set while the
  // coordinator was unreachable), or the coordinator's refusal.
  absl::Status Flush() {
    absl::MutexLock lock(&mu_);
    flush_requested_ = true;
    cv_.SignalAll();
    while (terminal_.ok() && (!outbox_.empty() || inflight_.has_value())) cv_.Wait(&mu_);
    return terminal_;
  }

 private:
  void Push(OutboxItem item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!std::holds_alternative<CheckpointNotice>(item)) ++points_;
    outbox_.push_back(std::move(item));
  }

  // The next batch: up to max_batch_points from the front of the outbox, in order. With the
  // outbox empty, a heartbeat: seq 0 renews the lease and stores nothing.
  ReportRequest TakeBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ReportRequest batch;
    batch.set_worker_id(p_.worker_id);
    batch.set_run_id(p_.run_id);
    batch.set_attempt(p_.attempt);
    if (outbox_.empty()) return batch;
    batch.set_seq(next_seq_++);
    int points = 0;
    while (!outbox_.empty() && points < p_.options->max_batch_points) {
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
      }
      outbox_.pop_front();
    }
    points_ -= points;
    return batch;
  }

  // Waits until a batch is due (or the one in flight needs resending) and returns it; nullopt
  // when closing.
  std::optional<ReportRequest> NextBatch() {
    absl::MutexLock lock(&mu_);
    while (!closing_) {
      if (inflight_.has_value()) return inflight_;
      const absl::Time now = absl::Now();
      const absl::Time report_at = last_sent_ + p_.options->report_interval;
      const absl::Time heartbeat_at = last_sent_ + p_.heartbeat;
      const bool pending = !outbox_.empty();
      if ((pending && (flush_requested_ || now >= report_at ||
                       points_ >= p_.options->max_batch_points)) ||
          now >= heartbeat_at) {
        inflight_ = TakeBatch();
        return inflight_;
      }
      cv_.WaitWithDeadline(&mu_, pending ? std::min(report_at, heartbeat_at) : heartbeat_at);
    }
    return std::nullopt;
  }

  void GiveUp(absl::Status why) {
    absl::MutexLock lock(&mu_);
    if (terminal_.ok()) terminal_ = std::move(why);
    gave_up_.store(true);
    cv_.SignalAll();
  }

  // Waits `d` before a resend; false when closing or `abort` was set meanwhile.
  bool WaitBeforeResend(absl::Duration d) {
    const absl::Time end = absl::Now() + d;
    absl::MutexLock lock(&mu_);
    while (!closing_ && !IsSet(p_.options->abort) && absl::Now() < end) {
      cv_.WaitWithDeadline(&mu_, std::min(end, absl::Now() + absl::Milliseconds(50)));
    }
    return !closing_ && !IsSet(p_.options->abort);
  }

  void SenderLoop() {
    Backoff backoff(p_.options->backoff_min, p_.options->backoff_max);
    while (std::optional<ReportRequest> batch = NextBatch()) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + p_.options->call_deadline));
      if (!p_.options->token.empty()) {
        context.AddMetadata("authorization", "Bearer " + p_.options->token);
      }
      ReportResponse response;
      const grpc::Status status = p_.stub->Report(&context, *batch, &response);
      if (status.ok()) {
        p_.connection->Reachable();
        backoff.Reset();
        if (response.directive() == DIRECTIVE_STOP && !stop_directive_.exchange(true)) {
          (*p_.log)(absl::StrCat("run ", p_.run_id, " attempt ", p_.attempt,
                                 ": the coordinator says stop (cancelled)"));
        }
        absl::MutexLock lock(&mu_);
        inflight_.reset();
        last_sent_ = absl::Now();
        cv_.SignalAll();
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

  // Constant after construction.
  const Params p_;

  // Set by the sender thread, read by the training thread.
  std::atomic<bool> stop_directive_{false};
  std::atomic<bool> gave_up_{false};

  absl::Mutex mu_;
  absl::CondVar cv_;  // outbox, inflight_, closing_, terminal_ changed
  std::deque<OutboxItem> outbox_ ABSL_GUARDED_BY(mu_);
  int64_t points_ ABSL_GUARDED_BY(mu_) = 0;  // non-checkpoint items in outbox_
  // The batch sent and not acknowledged yet: resent unchanged.
  std::optional<ReportRequest> inflight_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_);  // last acknowledgement (or the start)
  bool flush_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status terminal_ ABSL_GUARDED_BY(mu_);  // why the sender gave up

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
  void OnCheckpoint(int64_t step, const std::string& path) override {
    reporter_->WriteJournal(step);
    reporter_->Add(CheckpointNotice{step, path});
  }

 private:
  JobReporter* const reporter_;
};

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

std::string Hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

}  // namespace

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options)
      : options_(std::move(options)),
        log_(options_.log),
        connection_(options_.coordinator, options_.backoff_max, &log_) {
    if (options_.name.empty()) options_.name = absl::StrCat(Hostname(), ":", getpid());
    resources_ = DetectResources(options_.device);
    grpc::ChannelArguments args;
    // The channel reconnects by itself; keep its backoff within ours so a coordinator that
    // comes back is seen within backoff_max.
    const int min_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.backoff_min));
    const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.backoff_max));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(1, min_ms));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(1, min_ms));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(1, max_ms));
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        MakeChannelCredentials(options_.tls_ca);
    if (!credentials.ok()) {
      credentials_ = credentials.status();  // Run() reports it
      return;
    }
    channel_ = grpc::CreateCustomChannel(options_.coordinator, *credentials, args);
    stub_ = WorkerService::NewStub(channel_);
  }

  // Loop(), then Leave() when the agent registered.
  absl::StatusOr<AgentResult> Run();

 private:
  // Registers, pulls and trains jobs until the agent is to stop.
  absl::StatusOr<AgentResult> Loop();
  // Tells the coordinator this worker is gone (best effort: a coordinator that cannot be reached
  // marks it GONE after a lease timeout of silence).
  void Leave();
  void Prepare(grpc::ClientContext* context, absl::Duration deadline) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
  }
  absl::Status Refused(const char* call, const grpc::Status& status) const {
    const bool auth = status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                      status.error_code() == grpc::StatusCode::PERMISSION_DENIED;
    return absl::Status(FromGrpcStatus(status).code(),
                        absl::StrCat("coordinator ", options_.coordinator, " refused ", call, ": ",
                                     FromGrpcStatus(status).ToString(),
                                     auth ? " (check --token, --token-file or ABLATE_TOKEN)" : ""));
  }
  grpc::Status CallAcquire(absl::Duration wait, AcquireJobResponse* response);
  std::string CheckpointDir(const Job& job) const;
  // Trains one job and finishes it, asking in the Finish for the next job (into *next) unless
  // the agent is to stop after it. Non-OK: the agent must stop (refused, aborted).
  absl::Status RunJob(const Job& job, AgentResult* result, std::optional<Job>* next);
  absl::Status SendFinish(const FinishRequest& request, const std::string& run,
                          std::optional<Job>* next = nullptr);

  // Constant after construction.
  AgentOptions options_;
  WorkerResources resources_;
  Logger log_;
  ConnectionLog connection_;
  absl::Status credentials_;  // why no channel could be made (an unreadable --tls-ca)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> stub_;

  // Run()'s thread only.
  int64_t worker_id_ = 0;
  absl::Duration lease_timeout_ = absl::ZeroDuration();
};

grpc::Status Agent::Impl::CallAcquire(absl::Duration wait, AcquireJobResponse* response) {
  AcquireJobRequest request;
  request.set_worker_id(worker_id_);
  request.set_wait_s(static_cast<int32_t>(
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(wait, absl::Seconds(1))))));
  grpc::ClientContext context;
  Prepare(&context, absl::Seconds(request.wait_s()) + options_.call_deadline);
  // Asynchronous, so that an interrupt need not wait out the long poll.
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub_->async()->AcquireJob(&context, &request, response, [&](grpc::Status s) {
    absl::MutexLock lock(&mu);
    status = std::move(s);
    done = true;
  });
  absl::MutexLock lock(&mu);
  bool cancelled = false;
  while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
    if (!cancelled && IsSet(options_.interrupt)) {
      context.TryCancel();
      cancelled = true;
    }
  }
  return status;
}

std::string Agent::Impl::CheckpointDir(const Job& job) const {
  const std::string run_dir = absl::StrCat("run-", job.run_id());
  if (!options_.checkpoint_root.empty()) return (fs::path(options_.checkpoint_root) / run_dir).string();
  if (!job.checkpoint_dir().empty()) return job.checkpoint_dir();
  return (fs::path("checkpoints") / run_dir).string();
}

absl::StatusOr<AgentResult> Agent::Impl::Run() {
  absl::StatusOr<AgentResult> result = Loop();
  if (worker_id_ != 0) Leave();
  return result;
}

void Agent::Impl::Leave() {
  DeregisterRequest request;
  request.set_worker_id(worker_id_);
  DeregisterResponse response;
  grpc::ClientContext context;
  Prepare(&context, std::min(options_.call_deadline, absl::Seconds(2)));
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  if (status.ok()) {
    log_(absl::StrCat("left the coordinator (worker ", worker_id_, " is GONE)"));
  } else {
    log_(absl::StrCat("could not tell the coordinator this worker leaves: ",
                      FromGrpcStatus(status).ToString()));
  }
}

absl::StatusOr<AgentResult> Agent::Impl::Loop() {
  if (options_.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator HOST:PORT (or ABLATE_COORDINATOR) is required");
  }
  if (options_.max_batch_points < 1) return absl::InvalidArgumentError("max_batch_points must be >= 1");
  if (!credentials_.ok()) return credentials_;
  AgentResult result;
  Backoff backoff(options_.backoff_min, options_.backoff_max);
  bool registered = false;
  absl::Time idle_since = absl::Now();
  while (true) {
    if (IsSet(options_.interrupt)) {
      log_("interrupted: exiting");
      return result;
    }
    const absl::Duration idle = absl::Now() - idle_since;
    if (options_.idle_exit > absl::ZeroDuration() && idle >= options_.idle_exit) {
      log_(absl::StrCat("no job for ", absl::FormatDuration(options_.idle_exit), ": exiting"));
      return result;
    }
    grpc::Status status;
    const char* call = registered ? "AcquireJob" : "Register";
    if (!registered) {
      RegisterRequest request;
      request.set_name(options_.name);
      *request.mutable_resources() = resources_;
      RegisterResponse response;
      grpc::ClientContext context;
      Prepare(&context, options_.call_deadline);
      status = stub_->Register(&context, request, &response);
      if (status.ok()) {
        connection_.Reachable();
        backoff.Reset();
        registered = true;
        ++result.registrations;
        worker_id_ = response.worker_id();
        lease_timeout_ = absl::Seconds(response.lease_timeout_s());
        log_(absl::StrFormat("registered with %s as worker %d (%s: %s, %d cores, %.1f GB%s)",
                             options_.coordinator, worker_id_, options_.name, resources_.device(),
                             resources_.cores(), resources_.memory_gb(),
                             resources_.slurm_job().empty()
                                 ? ""
                                 : absl::StrCat(", SLURM job ", resources_.slurm_job())));
        continue;
      }
    } else {
      absl::Duration wait = options_.acquire_wait;
      if (options_.idle_exit > absl::ZeroDuration()) wait = std::min(wait, options_.idle_exit - idle);
      AcquireJobResponse response;
      status = CallAcquire(wait, &response);
      if (status.ok()) {
        connection_.Reachable();
        backoff.Reset();
        if (!response.has_job()) continue;
        // Each Finish may hand over the next job: no AcquireJob between back-to-back jobs.
        std::optional<Job> job = response.job();
        while (job.has_value()) {
          ++result.jobs;
          std::optional<Job> next;
          absl::Status job_status = RunJob(*job, &result, &next);
          idle_since = absl::Now();
          if (!job_status.ok()) return job_status;
          if (options_.max_jobs > 0 && result.jobs >= options_.max_jobs) {
            log_(absl::StrCat("done: ", result.jobs, " job", result.jobs == 1 ? "" : "s"));
            return result;
          }
          job = std::move(next);
          if (job.has_value() && IsSet(options_.interrupt)) {
            // Handed over as the interrupt came: given back untouched, queued again at once.
            FinishRequest back;
            back.set_worker_id(worker_id_);
            back.set_run_id(job->run_id());
            back.set_attempt(job->attempt());
            back.mutable_summary()->set_state(INTERRUPTED);
            back.mutable_summary()->set_reason("the worker stopped before starting it");
            if (absl::Status s = SendFinish(
                    back, absl::StrCat("run ", job->run_id(), " attempt ", job->attempt()));
                !s.ok()) {
              return s;
            }
            job.reset();
          }
        }
        continue;
      }
      if (status.error_code() == grpc::StatusCode::CANCELLED && IsSet(options_.interrupt)) continue;
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        log_(absl::StrCat("the coordinator does not know worker ", worker_id_, ": registering again"));
        registered = false;
        continue;
      }
    }
    if (!Transient(status.error_code())) return Refused(call, status);
    connection_.Unreachable(call, status);
    registered = false;  // a restarted coordinator may not know us
    SleepUnless(backoff.Next(), options_.interrupt);
  }
}

absl::Status Agent::Impl::RunJob(const Job& job, AgentResult* result, std::optional<Job>* next) {
  const std::string run = absl::StrCat("run ", job.run_id(), " attempt ", job.attempt());
  RunConfig config = job.config();
  if (!options_.device.empty()) config.mutable_train()->set_device(options_.device);
  const std::string dir = CheckpointDir(job);
  log_(absl::StrCat(run, " (", job.sweep(), job.variant().empty() ? "" : "/", job.variant(), "): ",
                    config.train().steps(), " steps on ", config.train().device(),
                    ", checkpoints in ", dir));

  JobReporter::Params params;
  params.stub = stub_.get();
  params.options = &options_;
  params.connection = &connection_;
  params.log = &log_;
  params.worker_id = worker_id_;
  params.run_id = job.run_id();
  params.attempt = job.attempt();
  const absl::Duration third_of_lease =
      lease_timeout_ > absl::ZeroDuration() ? lease_timeout_ / 3 : absl::Seconds(10);
  params.heartbeat = std::max(third_of_lease, options_.report_interval);
  params.journal_path = (fs::path(dir) / kJournalFile).string();
  JobReporter reporter(params);

  std::unique_ptr<Trainer> trainer;
  absl::StatusOr<RunSummary> summary;
  bool permanent = false;  // a failure that retries cannot mend
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    summary = absl::InternalError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
    reporter.Start({});
  } else {
    TrainerOptions trainer_options;
    trainer_options.checkpoint_dir = dir;
    trainer_options.resume = true;  // continue a checkpoint that is already there
    trainer_options.interrupt = options_.interrupt;
    absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(config, trainer_options);
    if (!created.ok()) {
      summary = created.status();
      // An invalid config or missing data fails the same way on every worker and every attempt.
      permanent = absl::IsInvalidArgument(created.status()) || absl::IsNotFound(created.status());
      reporter.Start({});
    } else {
      trainer = std::move(*created);
      if (trainer->step() > 0) {
        log_(absl::StrCat(run, ": resuming from the checkpoint of step ", trainer->step()));
      } else if (job.resume_from_step() > 0) {
        log_(absl::StrCat(run, ": no checkpoint in ", dir, " (the coordinator knows one of step ",
                          job.resume_from_step(), "): starting from step 0"));
      }
      std::vector<OutboxItem> journalled = LoadJournal(params.journal_path, trainer->step());
      if (!journalled.empty()) {
        log_(absl::StrCat(run, ": resending ", journalled.size(),
                          " points an earlier attempt left unacknowledged"));
      }
      reporter.Start(std::move(journalled));
      ReportingObserver observer(&reporter);
      summary = trainer->Run(&observer);
    }
  }

  if (absl::Status flushed = reporter.Flush(); !flushed.ok()) {
    if (flushed.code() == absl::StatusCode::kFailedPrecondition) {
      ++result->jobs_abandoned;
      log_(absl::StrCat(run, ": abandoned without finishing: ", flushed.message()));
      return absl::OkStatus();
    }
    return flushed;
  }
  fs::remove(params.journal_path, ec);  // every point is acknowledged

  FinishRequest finish;
  finish.set_worker_id(worker_id_);
  finish.set_run_id(job.run_id());
  finish.set_attempt(job.attempt());
  if (summary.ok()) {
    *finish.mutable_summary() = *summary;
  } else {
    RunSummary* s = finish.mutable_summary();
    s->set_state(FAILED);
    s->set_reason(std::string(summary.status().message()));
    s->set_steps_done(trainer != nullptr ? trainer->step() : 0);
    finish.set_error(summary.status().ToString());
    finish.set_permanent(permanent);
  }
  finish.set_acquire_next(!IsSet(options_.interrupt) &&
                          (options_.max_jobs == 0 || result->jobs < options_.max_jobs));
  return SendFinish(finish, run, next);
}

absl::Status Agent::Impl::SendFinish(const FinishRequest& request, const std::string& run,
                                     std::optional<Job>* next) {
  Backoff backoff(options_.backoff_min, options_.backoff_max);
  while (true) {
    grpc::ClientContext context;
    Prepare(&context, options_.call_deadline);
    FinishResponse response;
    const grpc::Status status = stub_->Finish(&context, request, &response);
    if (status.ok()) {
      connection_.Reachable();
      const RunSummary& s = request.summary();
      log_(absl::StrCat(run, ": ", RunState_Name(s.state()), " after ", s.steps_done(), " steps",
                        s.reason().empty() ? "" : absl::StrCat(" (", s.reason(), ")")));
      if (next != nullptr && response.has_next_job()) *next = response.next_job();
      return absl::OkStatus();
    }
    if (LeaseLost(status.error_code())) {
      log_(absl::StrCat(run, ": the coordinator refused the finish (", FromGrpcStatus(status).ToString(),
                        "): the lease was lost"));
      return absl::OkStatus();
    }
    if (!Transient(status.error_code())) return Refused("Finish", status);
    connection_.Unreachable("Finish", status);
    if (!SleepUnless(backoff.Next(), options_.abort)) {
      return absl::AbortedError(absl::StrCat("gave up finishing ", run, " as ",
                                             RunState_Name(request.summary().state()),
                                             ": coordinator ", options_.coordinator,
                                             " is unreachable"));
    }
  }
}

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() = default;

absl::StatusOr<AgentResult> Agent::Run() { return impl_->Run(); }

WorkerResources Agent::DetectResources(const std::string& device) {
  WorkerResources r;
  r.set_device(device.empty() ? "cpu" : device);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  r.set_cores(affinity > 0 ? affinity : static_cast<int>(std::thread::hardware_concurrency()));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemTotal:") {
      r.set_memory_gb(static_cast<double>(kb) / (1024.0 * 1024.0));
      break;
    }
    meminfo.ignore(256, '\n');
  }
  r.set_hostname(Hostname());
  // An array task has a job id of its own; squeue and scancel name it <array job>_<task>.
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  const std::string array_job = env("SLURM_ARRAY_JOB_ID"), task = env("SLURM_ARRAY_TASK_ID");
  if (!array_job.empty() && !task.empty()) {
    r.set_slurm_job(absl::StrCat(array_job, "_", task));
  } else if (const std::string job = env("SLURM_JOB_ID"); !job.empty()) {
    r.set_slurm_job(job);
  }
  return r;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("token file ", path, ": cannot be read"));
  std::string line;
  std::getline(in, line);
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

namespace {

std::atomic<bool> g_interrupt{false};
std::atomic<bool> g_abort{false};

// First signal: interrupt (checkpoint, flush, finish INTERRUPTED). Second: stop waiting.
extern "C" void OnAgentSignal(int) {
  if (g_interrupt.exchange(true)) g_abort.store(true);
}

}  // namespace

int RunAgentCommand(AgentOptions options) {
  options.interrupt = &g_interrupt;
  options.abort = &g_abort;
  Agent agent(std::move(options));
  std::signal(SIGINT, OnAgentSignal);
  std::signal(SIGTERM, OnAgentSignal);
  absl::StatusOr<AgentResult> result = agent.Run();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!result.ok()) {
    std::fprintf(stderr, "ablate-worker: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace ablate
