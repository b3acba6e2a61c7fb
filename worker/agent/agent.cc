#include "worker/agent/agent.h"

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
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/tls.h"
#include "proto/ablate.grpc.pb.h"
#include "proto/grpc_status.h"
#include "worker/agent/calls.h"
#include "worker/agent/reporter.h"
#include "config/durable_file.h"
#include "config/proto_yaml.h"
#include "worker/train/collective.h"
#include "worker/train/rank_processes.h"
#include "worker/train/trainer.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

using agent::Backoff;
using agent::ConnectionLog;
using agent::IsSet;
using agent::JobReporter;
using agent::LeaseLost;
using agent::kJournalFile;
using agent::LoadJournal;
using agent::Logger;
using agent::OutboxItem;
using agent::ReportingObserver;
using agent::SleepUnless;
using agent::Transient;

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
    devices_ = absl::StrSplit(options_.device, ',', absl::SkipEmpty());
    resources_ = DetectResources(devices_.empty() ? "" : devices_[0]);
    resources_.set_slots(options_.slots > 0 ? options_.slots
                                            : std::max<int>(1, static_cast<int>(devices_.size())));
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
                                     auth ? " (check --token-file or ABLATE_TOKEN: the coordinator's STATE_DIR/worker-token)" : ""));
  }
  grpc::Status CallAcquire(absl::Duration wait, AcquireJobResponse* response);
  std::string CheckpointDir(const Job& job) const;

  // Ranks 1..N-1 of a data-parallel job (Job.world_size N > 1; rank 0 trains in this process):
  // the rendezvous they meet at, their processes, and a watcher that ends the rendezvous when
  // one of them fails, so that rank 0 never waits for a rank that is gone. Nothing for N = 1.
  class OtherRanks {
   public:
    OtherRanks(Impl* agent, std::string run) : agent_(agent), run_(std::move(run)) {}
    ~OtherRanks() { StopWatching(); }
    // Starts the rendezvous and ranks 1..N-1 on `dir` with `config` (the job's, devices set).
    absl::Status Start(const Job& job, const RunConfig& config, const std::string& dir);
    const std::string& rendezvous() const { return address_; }
    // After rank 0 trained (or failed): waits for the others (stopping them when rank 0 failed)
    // and names a rank that failed in a failed *summary.
    void Finish(absl::StatusOr<RunSummary>* summary);

   private:
    void StopWatching();

    Impl* agent_;
    std::string run_;
    int world_ = 1;
    std::unique_ptr<RendezvousServer> server_;
    std::optional<RankProcesses> processes_;
    std::string address_;
    std::thread watcher_;
    std::atomic<bool> done_{false};
    std::optional<RankProcesses::Ending> failure_;  // the watcher's, read after it is joined
  };
  // Trains one job and finishes it, asking in the Finish for the next job (into *next) unless
  // the agent is to stop after it. Non-OK: the agent must stop (refused, aborted).
  absl::Status RunJob(const Job& job, AgentResult* result, std::optional<Job>* next);
  absl::Status SendFinish(const FinishRequest& request, const std::string& run,
                          std::optional<Job>* next = nullptr);

  // The device of rank `rank` of a job: the rank-th listed, else the first; "" when none.
  std::string DeviceOf(int rank) const {
    if (devices_.empty()) return "";
    return devices_[static_cast<size_t>(rank) < devices_.size() ? rank : 0];
  }

  // Constant after construction.
  AgentOptions options_;
  std::vector<std::string> devices_;  // options_.device, split at commas
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
            back.set_lease_secret(job->lease_secret());
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

absl::Status Agent::Impl::OtherRanks::Start(const Job& job, const RunConfig& config,
                                            const std::string& dir) {
  world_ = std::max(1, job.world_size());
  if (world_ == 1) return absl::OkStatus();
  const int slots = agent_->resources_.slots();
  if (world_ > slots) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job trains on ", world_, " ranks; this worker has ", slots, " slots"));
  }
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", world_);
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  address_ = server_->address();
  const std::string config_path = (fs::path(dir) / "job-config.json").string();
  if (absl::Status written = WriteFileAtomically(config_path, CanonicalJson(config) + "\n", 0600);
      !written.ok()) {
    return written;
  }
  std::vector<std::vector<std::string>> args;
  std::vector<int> ranks;
  const std::string timeout_s =
      absl::StrCat(absl::ToDoubleSeconds(agent_->options_.collective_timeout));
  for (int rank = 1; rank < world_; ++rank) {
    std::vector<std::string> a = {"train", "--resume", dir, "--config", config_path,
                                  "--world-size", std::to_string(world_), "--rank",
                                  std::to_string(rank), "--rendezvous", address_,
                                  "--collective-timeout", timeout_s};
    if (const std::string device = agent_->DeviceOf(rank); !device.empty()) {
      a.insert(a.end(), {"--device", device});
    }
    args.push_back(std::move(a));
    ranks.push_back(rank);
  }
  absl::StatusOr<RankProcesses> processes =
      RankProcesses::Start(agent_->options_.rank_binary, args, ranks);
  if (!processes.ok()) return processes.status();
  processes_ = *std::move(processes);
  watcher_ = std::thread([this] {
    while (!done_.load()) {
      if (std::optional<RankProcesses::Ending> failed = processes_->Poll()) {
        failure_ = failed;
        agent_->log_(absl::StrCat(run_, ": rank ", failed->rank, " of ", world_, " ended with ",
                                     failed->Describe(), "; ending the attempt"));
        server_->Stop();  // a rendezvous still forming fails now instead of at the timeout
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  return absl::OkStatus();
}

void Agent::Impl::OtherRanks::StopWatching() {
  done_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

void Agent::Impl::OtherRanks::Finish(absl::StatusOr<RunSummary>* summary) {
  if (!processes_) return;
  StopWatching();
  if (!summary->ok()) processes_->Signal(SIGTERM);  // rank 0 failed: the others cannot go on
  std::optional<RankProcesses::Ending> failure;
  processes_->Wait(std::chrono::seconds(30), &failure);
  if (!failure) failure = failure_;
  if (!failure) return;
  const std::string what =
      absl::StrCat("rank ", failure->rank, " of ", world_, " ended with ", failure->Describe());
  if (summary->ok()) {  // after the last collective: rank 0's results are whole
    agent_->log_(absl::StrCat(run_, ": ", what, " after the run ended"));
    return;
  }
  *summary = absl::Status(summary->status().code(),
                          absl::StrCat(what, "; rank 0: ", summary->status().message()));
}

absl::Status Agent::Impl::RunJob(const Job& job, AgentResult* result, std::optional<Job>* next) {
  const absl::Time leased_at = absl::Now();  // the job just arrived: its lease starts about now
  const std::string run = absl::StrCat("run ", job.run_id(), " attempt ", job.attempt());
  RunConfig config = job.config();
  if (!devices_.empty()) config.mutable_train()->set_device(DeviceOf(0));
  const int world = std::max(1, job.world_size());
  const std::string dir = CheckpointDir(job);
  log_(absl::StrCat(run, " (", job.sweep(), job.variant().empty() ? "" : "/", job.variant(), "): ",
                    config.train().steps(), " steps on ", config.train().device(),
                    world > 1 ? absl::StrCat(" x ", world, " ranks") : "",
                    ", checkpoints in ", dir));

  JobReporter::Params params;
  params.stub = stub_.get();
  params.options = &options_;
  params.connection = &connection_;
  params.log = &log_;
  params.worker_id = worker_id_;
  params.run_id = job.run_id();
  params.attempt = job.attempt();
  params.lease_secret = job.lease_secret();
  const absl::Duration third_of_lease =
      lease_timeout_ > absl::ZeroDuration() ? lease_timeout_ / 3 : absl::Seconds(10);
  params.heartbeat = std::max(third_of_lease, options_.report_interval);
  params.lease_timeout = lease_timeout_;
  params.leased_at = leased_at;
  params.journal_path = (fs::path(dir) / kJournalFile).string();
  JobReporter reporter(params);
  OtherRanks ranks(this, run);

  std::unique_ptr<Trainer> trainer;
  absl::StatusOr<RunSummary> summary;
  bool permanent = false;  // a failure that retries cannot mend
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    summary = absl::InternalError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
    reporter.Start({});
  } else if (absl::Status started = ranks.Start(job, config, dir); !started.ok()) {
    summary = started;
    reporter.Start({});
  } else {
    TrainerOptions trainer_options;
    trainer_options.checkpoint_dir = dir;
    trainer_options.resume = true;  // continue a checkpoint that is already there
    trainer_options.interrupt = options_.interrupt;
    if (world > 1) {
      trainer_options.world_size = world;
      trainer_options.rank = 0;
      trainer_options.rendezvous = ranks.rendezvous();
      trainer_options.collective_timeout = absl::ToChronoMilliseconds(options_.collective_timeout);
    }
    absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(config, trainer_options);
    if (!created.ok()) {
      summary = created.status();
      // An invalid config or missing data fails the same way on every worker and every attempt.
      permanent = absl::IsInvalidArgument(created.status()) || absl::IsNotFound(created.status());
      reporter.Start({});
    } else {
      trainer = std::move(*created);
      if (trainer->step() > 0) {
        log_(absl::StrCat(run, ": resuming from the checkpoint of step ", trainer->step(),
                          trainer->step() < job.resume_from_step()
                              ? absl::StrCat(" (the coordinator knows one of step ",
                                             job.resume_from_step(), ")")
                              : ""));
      } else if (job.resume_from_step() > 0) {
        log_(absl::StrCat(run, ": no readable checkpoint in ", dir,
                          " (the coordinator knows one of step ",
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
  ranks.Finish(&summary);

  if (absl::Status flushed = reporter.Flush(); !flushed.ok()) {
    if (flushed.code() == absl::StatusCode::kFailedPrecondition) {
      ++result->jobs_abandoned;
      log_(absl::StrCat(run, ": abandoned without finishing at step ",
                        trainer != nullptr ? trainer->step() : 0, ": ", flushed.message()));
      return absl::OkStatus();
    }
    if (!absl::IsResourceExhausted(flushed)) return flushed;
    // A point no report can carry: the attempt fails with the reason, on every worker alike.
    summary = flushed;
    permanent = true;
  }
  fs::remove(params.journal_path, ec);  // every point is acknowledged

  FinishRequest finish;
  finish.set_worker_id(worker_id_);
  finish.set_run_id(job.run_id());
  finish.set_attempt(job.attempt());
  finish.set_lease_secret(job.lease_secret());
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
