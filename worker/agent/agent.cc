#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>
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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/tls.h"
#include "proto/ablate.grpc.pb.h"
#include "proto/grpc_status.h"
#include "worker/agent/calls.h"
#include "worker/agent/job_process.h"
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
    cpu_set_t affinity;
    CPU_ZERO(&affinity);
    if (sched_getaffinity(0, sizeof(affinity), &affinity) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &affinity)) cpus_.push_back(cpu);
      }
    }
    resources_ = DetectResources(devices_.empty() ? "" : devices_[0]);
    resources_.set_slots(options_.slots > 0 ? options_.slots
                                            : std::max<int>(1, static_cast<int>(devices_.size())));
    resources_.set_rendezvous_host(options_.rendezvous_host);
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
  // A long poll for up to max_jobs jobs; cancelled (CANCELLED) by an interrupt.
  grpc::Status CallAcquire(absl::Duration wait, int max_jobs, AcquireJobResponse* response);
  std::string CheckpointDir(const Job& job) const;

  // The rank processes of a data-parallel job (Job.world_size N > 1) on this worker: ranks
  // 1..N-1 when rank 0 trains in this process, the rendezvous they meet at (served here, at
  // Job.rendezvous for a gang), and a watcher that ends the rendezvous when one of them fails,
  // so that rank 0 never waits for a rank that is gone. For a gang member (Job.rank_offset > 0)
  // all of its ranks, at rank 0's worker's rendezvous (RunMember watches them). Nothing for
  // N = 1.
  class OtherRanks {
   public:
    OtherRanks(Impl* agent, std::string run) : agent_(agent), run_(std::move(run)) {}
    ~OtherRanks() { StopWatching(); }
    // Starts the rendezvous and the ranks on `dir` with the config in `config_path` (the job's,
    // device and threads set), the i-th of this worker's ranks on slot slots[i].
    absl::Status Start(const Job& job, const std::string& config_path, const std::string& dir,
                       const std::vector<int>& slots);
    const std::string& rendezvous() const { return address_; }
    // A gang member's part: waits until its ranks end, renewing its lease (the reporter's
    // heartbeats). An interrupt or a lost lease passes SIGTERM on (an interrupt: every rank
    // checkpoints at the same step, rank 0's worker writes it). The summary says how it ended.
    RunSummary RunMember(JobReporter* reporter);
    // After rank 0 trained (or failed): waits for the others (stopping them when rank 0 failed)
    // and names a rank that failed in a failed *summary.
    void Finish(absl::StatusOr<RunSummary>* summary);

   private:
    void StopWatching();

    Impl* agent_;
    std::string run_;
    int world_ = 1;
    int offset_ = 0, local_ = 1;  // this worker's ranks: [offset_, offset_ + local_)
    // How long a gang member's ranks may take to stop after SIGTERM (RunMember).
    static constexpr absl::Duration kRankGrace = absl::Seconds(30);
    std::unique_ptr<RendezvousServer> server_;
    std::optional<RankProcesses> processes_;
    std::string address_;
    std::thread watcher_;
    std::atomic<bool> done_{false};
    std::optional<RankProcesses::Ending> failure_;  // the watcher's, read after it is joined
  };
  // Trains one job and finishes it, asking in the Finish for the next job (into *next, claimed)
  // unless the agent is to stop after it. Non-OK: the agent must stop (refused, aborted).
  absl::Status RunJob(const Job& job, std::optional<Job>* next);
  // A job thread: runs `job` and each job its Finish hands over, then ends.
  void JobThread(Job job);
  absl::Status SendFinish(const FinishRequest& request, const std::string& run,
                          std::optional<Job>* next = nullptr);
  // Gives a job back untouched (INTERRUPTED: queued again at once), saying why.
  absl::Status GiveBack(const Job& job, const std::string& why);

  // The device a job (or rank) on slot `slot` trains on: the slot-th of `--device` (the first
  // when fewer are listed), else the job's own `device`; a plain "cuda" on a worker of several
  // slots is cuda:<slot>.
  std::string DeviceOf(int slot, const std::string& device) const {
    std::string d = device;
    if (!devices_.empty()) d = devices_[static_cast<size_t>(slot) < devices_.size() ? slot : 0];
    if (d == "cuda" && slots() > 1) d = absl::StrCat("cuda:", slot);
    return d;
  }
  int slots() const { return resources_.slots(); }
  // The CPUs of slot `slot`'s core group: its share of this process's CPU affinity, contiguous.
  // Empty (not pinned) with one slot, or fewer CPUs than slots.
  std::vector<int> CoreGroup(int slot) const {
    const int n = static_cast<int>(cpus_.size()), k = slots();
    if (k <= 1 || n < k) return {};
    return std::vector<int>(cpus_.begin() + slot * n / k, cpus_.begin() + (slot + 1) * n / k);
  }
  // The ranks a job trains on this worker: all of its world, or a gang's part.
  static int LocalRanks(const Job& job) {
    return job.local_ranks() > 0 ? job.local_ranks() : std::max(1, job.world_size());
  }
  // Slots a job holds: its ranks here (a job wider than the worker fails at once: 1).
  int SlotsOf(const Job& job) const {
    const int local = LocalRanks(job);
    return local > slots() ? 1 : local;
  }
  // Marks a job this agent was leased: its slots are the coordinator's until it finishes.
  void Claim(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    claimed_ += SlotsOf(job);
    ++result_.jobs;
  }
  // The job's slots go back, just before its Finish (the coordinator may lease them at once).
  void Unclaim(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    claimed_ -= SlotsOf(job);
    ++changes_;
  }
  // Waits until `n` slots are free and takes them (their indices), or nullopt after `timeout`
  // or an interrupt.
  std::optional<std::vector<int>> TakeSlots(int n, absl::Duration timeout);
  void FreeSlots(const std::vector<int>& taken);
  // interrupt_, or a signal the loop has not passed on yet.
  bool Interrupted() const { return interrupt_.load() || IsSet(options_.interrupt); }
  // Whether the agent may take another job (max_jobs counts every job taken or asked for).
  bool MayTakeMore() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !Interrupted() &&
           (options_.max_jobs == 0 || result_.jobs + asking_ < options_.max_jobs);
  }
  // Waits for every job thread to end.
  void JoinJobs();

  // Constant after construction.
  AgentOptions options_;
  std::vector<std::string> devices_;  // options_.device, split at commas
  std::vector<int> cpus_;             // this process's CPU affinity at start
  WorkerResources resources_;
  Logger log_;
  ConnectionLog connection_;
  absl::Status credentials_;  // why no channel could be made (an unreadable --tls-ca)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> stub_;

  // Set by Register (Run()'s thread) before any job thread starts; read by job threads.
  std::atomic<int64_t> worker_id_{0};
  absl::Duration lease_timeout_ = absl::ZeroDuration();
  // options_.interrupt, or a job thread's fatal error: every job checkpoints and finishes
  // INTERRUPTED, and the agent returns. What trainers and job processes watch.
  std::atomic<bool> interrupt_{false};

  // Slots and job threads.
  absl::Mutex mu_;
  int claimed_ ABSL_GUARDED_BY(mu_) = 0;        // slots of the jobs held (the coordinator's view)
  std::vector<bool> slot_busy_ ABSL_GUARDED_BY(mu_);  // by slot: a job trains on it
  int asking_ ABSL_GUARDED_BY(mu_) = 0;         // Finishes out asking for a next job
  int64_t changes_ ABSL_GUARDED_BY(mu_) = 0;    // bumped whenever slots come free
  int threads_running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time idle_since_ ABSL_GUARDED_BY(mu_) = absl::Now();
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);     // the first job thread's error
  AgentResult result_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;            // Run()'s thread only
};

grpc::Status Agent::Impl::CallAcquire(absl::Duration wait, int max_jobs,
                                      AcquireJobResponse* response) {
  AcquireJobRequest request;
  request.set_worker_id(worker_id_);
  request.set_max_jobs(max_jobs);
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
  // Only an interrupt cancels it: a poll cancelled as the coordinator leased its jobs would lose
  // them until their leases expired. Slots that come free meanwhile are filled by the Finish that
  // freed them (acquire_next) or by the next poll.
  while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
    if (!cancelled && Interrupted()) {
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
    log_(absl::StrCat("left the coordinator (worker ", worker_id_.load(), " is GONE)"));
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
  {
    absl::MutexLock lock(&mu_);
    slot_busy_.assign(slots(), false);
    idle_since_ = absl::Now();
  }
  // Every return joins the job threads first (they end soon once interrupt_ is set).
  const auto finish = [this](absl::StatusOr<AgentResult> r) -> absl::StatusOr<AgentResult> {
    interrupt_.store(true);  // jobs still training checkpoint and finish INTERRUPTED
    JoinJobs();
    absl::MutexLock lock(&mu_);
    if (!fatal_.ok()) return fatal_;
    if (!r.ok()) return r;
    return result_;
  };
  Backoff backoff(options_.backoff_min, options_.backoff_max);
  bool registered = false;
  while (true) {
    if (IsSet(options_.interrupt)) interrupt_.store(true);
    int want = 0;  // jobs to ask for now
    absl::Duration idle = absl::ZeroDuration();
    {
      absl::MutexLock lock(&mu_);
      if (!fatal_.ok()) interrupt_.store(true);
      if (Interrupted()) {
        if (fatal_.ok()) log_("interrupted: exiting");
        break;
      }
      if (options_.max_jobs > 0 && result_.jobs >= options_.max_jobs && asking_ == 0) {
        if (threads_running_ > 0) {
          mu_.AwaitWithTimeout(absl::Condition(
                                   +[](int* running) { return *running == 0; }, &threads_running_),
                               absl::Milliseconds(50));
          continue;
        }
        log_(absl::StrCat("done: ", result_.jobs, " job", result_.jobs == 1 ? "" : "s"));
        break;
      }
      if (threads_running_ == 0) idle = absl::Now() - idle_since_;
      // A Finish asking for a next job keeps a slot for it.
      want = MayTakeMore() ? slots() - claimed_ - asking_ : 0;
      if (options_.max_jobs > 0) {
        want = std::min<int64_t>(want, options_.max_jobs - result_.jobs - asking_);
      }
      if (registered && want <= 0) {
        // Every slot is held: wait for one to come free.
        const int64_t seen = changes_;
        struct Seen {
          int64_t* changes;
          int64_t seen;
        } arg{&changes_, seen};
        mu_.AwaitWithTimeout(
            absl::Condition(+[](Seen* a) { return *a->changes != a->seen; }, &arg),
            absl::Milliseconds(50));
        continue;
      }
    }
    if (options_.idle_exit > absl::ZeroDuration() && idle >= options_.idle_exit) {
      log_(absl::StrCat("no job for ", absl::FormatDuration(options_.idle_exit), ": exiting"));
      break;
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
        {
          absl::MutexLock lock(&mu_);
          ++result_.registrations;
        }
        worker_id_ = response.worker_id();
        lease_timeout_ = absl::Seconds(response.lease_timeout_s());
        log_(absl::StrFormat("registered with %s as worker %d (%s: %s%s, %d cores, %.1f GB%s)",
                             options_.coordinator, worker_id_.load(), options_.name,
                             resources_.device(),
                             slots() > 1 ? absl::StrCat(" x ", slots(), " slots") : "",
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
      status = CallAcquire(wait, want, &response);
      if (status.ok()) {
        connection_.Reachable();
        backoff.Reset();
        if (!response.has_job()) continue;
        std::vector<Job> jobs = {response.job()};
        for (const Job& more : response.more_jobs()) jobs.push_back(more);
        for (Job& job : jobs) {
          {
            absl::MutexLock lock(&mu_);
            Claim(job);
            ++threads_running_;
          }
          // Each Finish may hand over the next job: no AcquireJob between back-to-back jobs.
          threads_.emplace_back([this, job = std::move(job)] { JobThread(job); });
        }
        continue;
      }
      if (status.error_code() == grpc::StatusCode::CANCELLED) continue;  // an interrupt
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        log_(absl::StrCat("the coordinator does not know worker ", worker_id_.load(),
                          ": registering again"));
        registered = false;
        continue;
      }
    }
    if (!Transient(status.error_code())) return finish(Refused(call, status));
    connection_.Unreachable(call, status);
    registered = false;  // a restarted coordinator may not know us
    SleepUnless(backoff.Next(), options_.interrupt);
  }
  return finish(AgentResult());
}

void Agent::Impl::JoinJobs() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (threads_running_ == 0) break;
    }
    if (IsSet(options_.interrupt)) interrupt_.store(true);  // a signal while we wait
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void Agent::Impl::JobThread(Job first) {
  std::optional<Job> job = std::move(first);
  while (job.has_value()) {
    std::optional<Job> next;
    absl::Status status = RunJob(*job, &next);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (fatal_.ok()) fatal_ = status;
      interrupt_.store(true);
      break;
    }
    job = std::move(next);
    if (job.has_value() && Interrupted()) {
      // Handed over as the interrupt came: given back untouched, queued again at once.
      if (absl::Status s = GiveBack(*job, "the worker stopped before starting it"); !s.ok()) {
        absl::MutexLock lock(&mu_);
        if (fatal_.ok()) fatal_ = s;
      }
      absl::MutexLock lock(&mu_);
      Unclaim(*job);
      job.reset();
    }
  }
  absl::MutexLock lock(&mu_);
  --threads_running_;
  ++changes_;
  idle_since_ = absl::Now();
}

absl::Status Agent::Impl::GiveBack(const Job& job, const std::string& why) {
  FinishRequest back;
  back.set_worker_id(worker_id_);
  back.set_run_id(job.run_id());
  back.set_attempt(job.attempt());
  back.set_lease_secret(job.lease_secret());
  back.mutable_summary()->set_state(INTERRUPTED);
  back.mutable_summary()->set_reason(why);
  return SendFinish(back, absl::StrCat("run ", job.run_id(), " attempt ", job.attempt()));
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
  return absl::OkStatus();
}

RunSummary Agent::Impl::OtherRanks::RunMember(JobReporter* reporter) {
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
  summary.set_reason(absl::StrCat("its ranks ", offset_, "-", offset_ + local_ - 1, " of ", world_));
  return summary;
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

absl::Status Agent::Impl::RunJob(const Job& job, std::optional<Job>* next) {
  const absl::Time leased_at = absl::Now();  // the job just arrived: its lease starts about now
  const std::string run = absl::StrCat("run ", job.run_id(), " attempt ", job.attempt());
  const int world = std::max(1, job.world_size());
  const int local = LocalRanks(job);       // of them on this worker (a gang's part: fewer)
  const bool member = job.rank_offset() > 0;  // a gang's part without rank 0
  const absl::Duration third_of_lease =
      lease_timeout_ > absl::ZeroDuration() ? lease_timeout_ / 3 : absl::Seconds(10);
  // The slots it trains on. The coordinator leases no more than the worker has, but a job of
  // ours may still be finishing: wait for it, not past a third of the lease (its slots are then
  // not coming: given back).
  std::vector<int> taken = {0};
  if (local <= slots()) {
    std::optional<std::vector<int>> got = TakeSlots(local, third_of_lease);
    if (!got.has_value()) {
      absl::Status s = GiveBack(job, Interrupted() ? "the worker stopped before starting it"
                                                   : "the worker had no free slot for it");
      absl::MutexLock lock(&mu_);
      Unclaim(job);
      return s;
    }
    taken = *std::move(got);
  }
  const bool own_process = slots() > 1;  // several jobs side by side: one process each
  RunConfig config = job.config();
  config.mutable_train()->set_device(DeviceOf(taken[0], config.train().device()));
  if (own_process && config.train().threads() == 0 &&
      (config.train().device().empty() || absl::StartsWith(config.train().device(), "cpu"))) {
    // The cores split between the slots (each rank of a data-parallel job holds one): its
    // core group's, which its processes are pinned to.
    const std::vector<int> group = CoreGroup(taken[0]);
    config.mutable_train()->set_threads(
        group.empty() ? std::max(1, resources_.cores() / slots()) : static_cast<int>(group.size()));
  } else if (local < world && config.train().threads() == 0 &&
             (config.train().device().empty() || absl::StartsWith(config.train().device(), "cpu"))) {
    // A gang's part: this worker's cores between its ranks (not the whole world's).
    config.mutable_train()->set_threads(std::max(1, resources_.cores() / slots()));
  }
  const std::string dir = CheckpointDir(job);
  log_(absl::StrCat(run, " (", job.sweep(), job.variant().empty() ? "" : "/", job.variant(), "): ",
                    config.train().steps(), " steps on ", config.train().device(),
                    world > 1 ? absl::StrCat(" x ", world, " ranks") : "",
                    local < world ? absl::StrCat(" (ranks ", job.rank_offset(), "-",
                                                 job.rank_offset() + local - 1, " here, rendezvous ",
                                                 job.rendezvous(), ")")
                                  : "",
                    own_process ? absl::StrCat(" (slot", taken.size() > 1 ? "s " : " ",
                                               absl::StrJoin(taken, ","), ")")
                                : "",
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
  params.heartbeat = std::max(third_of_lease, options_.report_interval);
  params.lease_timeout = lease_timeout_;
  params.leased_at = leased_at;
  params.journal_path = (fs::path(dir) / kJournalFile).string();
  JobReporter reporter(params);
  OtherRanks ranks(this, run);

  std::unique_ptr<Trainer> trainer;        // in this process
  std::unique_ptr<JobProcess> process;     // or in one of its own
  int64_t step = 0;                        // the trainer's, for the log and a failed summary
  absl::StatusOr<RunSummary> summary;
  bool permanent = false;  // a failure that retries cannot mend
  std::error_code ec;
  fs::create_directories(dir, ec);
  // A gang's members share the checkpoint dir: each its own config (its device and threads).
  const std::string config_path =
      (fs::path(dir) / (member ? absl::StrCat("job-config-ranks-", job.rank_offset(), ".json")
                               : std::string("job-config.json")))
          .string();
  if (ec) {
    summary = absl::InternalError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
    reporter.Start({});
  } else if (local > slots()) {
    summary = absl::FailedPreconditionError(absl::StrCat(
        "the job trains on ", local, " ranks", local < world ? " here" : "", "; this worker has ",
        slots(), " slots"));
    reporter.Start({});
  } else if (absl::Status written = (world > 1 || own_process)
                                        ? WriteFileAtomically(config_path,
                                                              CanonicalJson(config) + "\n", 0600)
                                        : absl::OkStatus();
             !written.ok()) {
    summary = written;
    reporter.Start({});
  } else if (absl::Status started = ranks.Start(job, config_path, dir, taken); !started.ok()) {
    summary = started;
    reporter.Start({});
  } else if (member) {
    reporter.Start({});  // heartbeats: rank 0's worker reports the run
    summary = ranks.RunMember(&reporter);
  } else {
    absl::StatusOr<int64_t> resumed;
    if (own_process) {
      JobProcessOptions p;
      p.config_path = config_path;
      p.checkpoint_dir = dir;
      p.world_size = world;
      p.rendezvous = ranks.rendezvous();
      p.collective_timeout_s = absl::ToDoubleSeconds(options_.collective_timeout);
      p.cpus = CoreGroup(taken[0]);
      absl::StatusOr<std::unique_ptr<JobProcess>> started =
          JobProcess::Start(options_.rank_binary, p);
      if (!started.ok()) {
        resumed = started.status();
      } else {
        process = *std::move(started);
        resumed = process->WaitStarted(&permanent);
      }
    } else {
      TrainerOptions trainer_options;
      trainer_options.checkpoint_dir = dir;
      trainer_options.resume = true;  // continue a checkpoint that is already there
      trainer_options.interrupt = &interrupt_;
      if (world > 1) {
        trainer_options.world_size = world;
        trainer_options.rank = 0;
        trainer_options.rendezvous = ranks.rendezvous();
        trainer_options.collective_timeout =
            absl::ToChronoMilliseconds(options_.collective_timeout);
      }
      absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(config, trainer_options);
      if (!created.ok()) {
        resumed = created.status();
        // An invalid config or missing data fails the same way on every worker and attempt.
        permanent = absl::IsInvalidArgument(created.status()) || absl::IsNotFound(created.status());
      } else {
        trainer = std::move(*created);
        resumed = trainer->step();
      }
    }
    if (!resumed.ok()) {
      summary = resumed.status();
      reporter.Start({});
    } else {
      step = *resumed;
      if (step > 0) {
        log_(absl::StrCat(run, ": resuming from the checkpoint of step ", step,
                          step < job.resume_from_step()
                              ? absl::StrCat(" (the coordinator knows one of step ",
                                             job.resume_from_step(), ")")
                              : ""));
      } else if (job.resume_from_step() > 0) {
        log_(absl::StrCat(run, ": no readable checkpoint in ", dir,
                          " (the coordinator knows one of step ",
                          job.resume_from_step(), "): starting from step 0"));
      }
      std::vector<OutboxItem> journalled = LoadJournal(params.journal_path, step);
      if (!journalled.empty()) {
        log_(absl::StrCat(run, ": resending ", journalled.size(),
                          " points an earlier attempt left unacknowledged"));
      }
      reporter.Start(std::move(journalled));
      ReportingObserver observer(&reporter);
      if (process != nullptr) {
        summary = process->Run(&observer, &interrupt_, [&reporter] { return reporter.ShouldStop(); });
        step = process->step();
      } else {
        summary = trainer->Run(&observer);
        step = trainer->step();
      }
    }
  }
  ranks.Finish(&summary);
  process.reset();
  if (trainer != nullptr) {
    // A job trained here kept its freed memory in the heap (KeepFreedMemoryInHeap): give it back
    // now that the job is done, not when the agent exits.
    trainer.reset();
    malloc_trim(0);
  }
  if (local <= slots()) FreeSlots(taken);

  if (absl::Status flushed = reporter.Flush(); !flushed.ok()) {
    if (flushed.code() == absl::StatusCode::kFailedPrecondition) {
      log_(absl::StrCat(run, ": abandoned without finishing at step ", step, ": ",
                        flushed.message()));
      absl::MutexLock lock(&mu_);
      ++result_.jobs_abandoned;
      Unclaim(job);
      return absl::OkStatus();
    }
    if (!absl::IsResourceExhausted(flushed)) {
      absl::MutexLock lock(&mu_);
      Unclaim(job);
      return flushed;
    }
    // A point no report can carry: the attempt fails with the reason, on every worker alike.
    summary = flushed;
    permanent = true;
  }
  if (!member) fs::remove(params.journal_path, ec);  // every point is acknowledged (rank 0's)

  FinishRequest finish;
  finish.set_worker_id(worker_id_);
  finish.set_run_id(job.run_id());
  finish.set_attempt(job.attempt());
  finish.set_lease_secret(job.lease_secret());
  finish.set_member(member);
  if (summary.ok()) {
    *finish.mutable_summary() = *summary;
  } else {
    RunSummary* s = finish.mutable_summary();
    s->set_state(FAILED);
    s->set_reason(std::string(summary.status().message()));
    s->set_steps_done(step);
    finish.set_error(summary.status().ToString());
    finish.set_permanent(permanent);
  }
  {
    absl::MutexLock lock(&mu_);
    Unclaim(job);  // the coordinator may lease its slots as soon as it reads the Finish
    finish.set_acquire_next(MayTakeMore());
    if (finish.acquire_next()) ++asking_;
  }
  absl::Status sent = SendFinish(finish, run, next);
  absl::MutexLock lock(&mu_);
  if (finish.acquire_next()) --asking_;
  if (next->has_value()) Claim(**next);
  return sent;
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
      if (request.member()) {  // rank 0's worker knows the steps
        log_(absl::StrCat(run, ": ", s.reason(), " ended (", RunState_Name(s.state()), ")"));
      } else {
        log_(absl::StrCat(run, ": ", RunState_Name(s.state()), " after ", s.steps_done(), " steps",
                          s.reason().empty() ? "" : absl::StrCat(" (", s.reason(), ")")));
      }
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
