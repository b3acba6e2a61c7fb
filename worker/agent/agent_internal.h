// What the files of the worker agent share (not for use outside worker/agent/): the agent's state
// (Agent::Impl), the rank processes of a data-parallel job (Agent::Impl::OtherRanks) and what one
// job's run carries through its steps (JobAttempt, Training). agent.cc is the construction and the
// RPC loop (Register, AcquireJob, Deregister, the job threads it starts), slots.cc the slot
// accounting (which slots a job holds, its device and core group), ranks.cc the gang rank
// processes, job_runners.cc a job from its lease to its Finish (trained in this process, in a
// process of its own, or as a gang's part). Thread safety as in agent.h: Run()'s thread drives
// the loop, each job runs on a thread of its own, and mu_ guards what they share.
#ifndef ABLATE_WORKER_AGENT_AGENT_INTERNAL_H_
#define ABLATE_WORKER_AGENT_AGENT_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ablate.grpc.pb.h"
#include "worker/agent/agent.h"
#include "worker/agent/calls.h"
#include "worker/agent/job_process.h"
#include "worker/agent/reporter.h"
#include "worker/program/program_process.h"
#include "worker/train/collective.h"
#include "worker/train/rank_processes.h"
#include "worker/train/trainer.h"

namespace ablate {

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options);

  // Loop(), then Leave() when the agent registered.
  absl::StatusOr<AgentResult> Run();

 private:
  class OtherRanks;
  struct JobAttempt;
  struct Training;

  // What the loop does next (NextTurn).
  struct Turn {
    enum Action { kStop, kWaited, kCall };
    Action action = kCall;
    int want = 0;                                   // jobs to ask for (kCall)
    absl::Duration idle = absl::ZeroDuration();     // without a job so far (kCall)
  };

  // agent.cc: construction and the RPC loop.

  // Registers, pulls and trains jobs until the agent is to stop.
  absl::StatusOr<AgentResult> Loop();
  // The options Loop() cannot run with (and a channel that could not be made).
  absl::Status CheckOptions() const;
  // Whether the loop stops, waited (for a job thread or a free slot: go round again), or calls
  // the coordinator, asking for how many jobs.
  Turn NextTurn(bool registered);
  // One Register call; on success *registered becomes true and the backoff starts over.
  grpc::Status TryRegister(bool* registered, agent::Backoff* backoff);
  // One AcquireJob for `want` jobs, starting a thread for each it leases. OK also when its
  // failure was handled (an interrupt cancelled it; a coordinator that forgot this worker:
  // *registered becomes false); otherwise the failure to back off from or stop at.
  grpc::Status TryAcquire(int want, absl::Duration idle, bool* registered, agent::Backoff* backoff);
  // A long poll for up to max_jobs jobs; cancelled (CANCELLED) by an interrupt.
  grpc::Status CallAcquire(absl::Duration wait, int max_jobs, AcquireJobResponse* response);
  // How the loop ends: every job thread joined first (they end soon once interrupt_ is set),
  // then the first job thread's error, else `r`'s error, else the result.
  absl::StatusOr<AgentResult> EndLoop(absl::StatusOr<AgentResult> r);
  // Waits for every job thread to end.
  void JoinJobs();
  // Tells the coordinator this worker is gone (best effort: a coordinator that cannot be reached
  // marks it GONE after a lease timeout of silence).
  void Leave();
  // A call's deadline and authorization.
  void Prepare(grpc::ClientContext* context, absl::Duration deadline) const;
  // A call's non-transient failure as Run() returns it, naming the coordinator.
  absl::Status Refused(const char* call, const grpc::Status& status) const;
  // interrupt_, or a signal the loop has not passed on yet.
  bool Interrupted() const { return interrupt_.load() || agent::IsSet(options_.interrupt); }

  // slots.cc: slot accounting.

  int slots() const { return resources_.slots(); }
  // The device a job (or rank) on slot `slot` trains on: the slot-th of `--device` (the first
  // when fewer are listed), else the job's own `device`; a plain "cuda" on a worker of several
  // slots is cuda:<slot>.
  std::string DeviceOf(int slot, const std::string& device) const;
  // The CPUs of slot `slot`'s core group: its share of this process's CPU affinity, contiguous.
  // Empty (not pinned) with one slot, or fewer CPUs than slots.
  std::vector<int> CoreGroup(int slot) const;
  // The ranks a job trains on this worker: all of its world, or a gang's part.
  static int LocalRanks(const Job& job);
  // Slots a job holds: its ranks here (a job wider than the worker fails at once: 1).
  int SlotsOf(const Job& job) const;
  // Marks a job this agent was leased: its slots are the coordinator's until it finishes.
  void Claim(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's slots go back, just before its Finish (the coordinator may lease them at once).
  void Unclaim(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the agent may take another job (max_jobs counts every job taken or asked for).
  bool MayTakeMore() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `n` slots are free and takes them (their indices), or nullopt after `timeout`
  // or an interrupt.
  std::optional<std::vector<int>> TakeSlots(int n, absl::Duration timeout);
  void FreeSlots(const std::vector<int>& taken);

  // job_runners.cc: a job from its lease to its Finish.

  // A job thread: runs `job` and each job its Finish hands over, then ends.
  void JobThread(Job job);
  // Trains one job and finishes it, asking in the Finish for the next job (into *next, claimed)
  // unless the agent is to stop after it. Non-OK: the agent must stop (refused, aborted).
  absl::Status RunJob(const Job& job, std::optional<Job>* next);
  // The job's config as it trains here: the device of its first slot, and its threads when the
  // job leaves them to the worker.
  RunConfig ConfigFor(const JobAttempt& a) const;
  // The job's line in the log: what trains where, and where its checkpoints go.
  void LogStart(const JobAttempt& a);
  agent::JobReporter::Params ReporterParams(const JobAttempt& a);
  // Everything before the job trains (its checkpoint dir, its config file, its other ranks),
  // then one of the three ways a job runs; leaves the outcome in *t, the reporter started.
  void Train(const JobAttempt& a, agent::JobReporter* reporter, OtherRanks* ranks, Training* t);
  // Starts the job in a process of its own (several slots) or a Trainer here: the step it
  // resumes from.
  absl::StatusOr<int64_t> StartProcess(const JobAttempt& a, const OtherRanks& ranks, Training* t);
  absl::StatusOr<int64_t> StartTrainer(const JobAttempt& a, const OtherRanks& ranks, Training* t);
  // A program run's command, from its code's snapshot: the step it resumes from.
  absl::StatusOr<int64_t> StartProgram(const JobAttempt& a, Training* t);
  // Resends what an earlier attempt left unacknowledged, then trains to the end.
  void TrainFrom(int64_t step, const JobAttempt& a, agent::JobReporter* reporter, Training* t);
  // Waits until every report was acknowledged. nullopt: on to the Finish (a point no report can
  // carry has failed the attempt in *t). Else what RunJob returns: OK when the lease was lost
  // and the job is abandoned, an error when the agent must stop.
  std::optional<absl::Status> FlushReports(const JobAttempt& a, agent::JobReporter* reporter,
                                           Training* t);
  // Sends the job's Finish with its summary and claims the next job it hands over.
  absl::Status FinishJob(const JobAttempt& a, const Training& t, std::optional<Job>* next);
  // A Finish for `job`'s attempt, its summary still to fill in.
  FinishRequest FinishFor(const Job& job) const;
  absl::Status SendFinish(const FinishRequest& request, const std::string& run,
                          std::optional<Job>* next = nullptr);
  // Gives a job back untouched (INTERRUPTED: queued again at once), saying why.
  absl::Status GiveBack(const Job& job, const std::string& why);
  std::string CheckpointDir(const Job& job) const;

  // Constant after construction.
  AgentOptions options_;
  std::vector<std::string> devices_;  // options_.device, split at commas
  std::vector<int> cpus_;             // this process's CPU affinity at start
  WorkerResources resources_;
  agent::Logger log_;
  agent::ConnectionLog connection_;
  absl::Status credentials_;  // why no channel could be made (an unreadable --tls-ca)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> stub_;

  // Set by Register (Run()'s thread) before any job thread starts; read by job threads.
  std::atomic<int64_t> worker_id_{0};
  std::string worker_secret_;  // RegisterResponse.worker_secret, Run()'s thread only
  absl::Duration lease_timeout_ = absl::ZeroDuration();
  // Run()'s thread only: the coordinator's last AcquireJobResponse.waiting, logged when it changes.
  std::string waiting_;
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

// The rank processes of a data-parallel job (Job.world_size N > 1) on this worker: ranks
// 1..N-1 when rank 0 trains in this process, the rendezvous they meet at (served here, at
// Job.rendezvous for a gang), and a watcher that ends the rendezvous when one of them fails,
// so that rank 0 never waits for a rank that is gone. For a gang member (Job.rank_offset > 0)
// all of its ranks, at rank 0's worker's rendezvous (RunMember watches them). Nothing for
// N = 1.
class Agent::Impl::OtherRanks {
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
  RunSummary RunMember(agent::JobReporter* reporter);
  // After rank 0 trained (or failed): waits for the others (stopping them when rank 0 failed)
  // and names a rank that failed in a failed *summary.
  void WaitForOthers(absl::StatusOr<RunSummary>* summary);

 private:
  // Starts the thread that ends the rendezvous when one of the ranks fails.
  void Watch();
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

// One job's attempt as RunJob carries it through its steps: filled in before it trains, then
// constant.
struct Agent::Impl::JobAttempt {
  // A job that just arrived, under leases of `lease_timeout` (zero: not known yet).
  JobAttempt(const Job& job, absl::Duration lease_timeout);

  const Job& job;
  absl::Time leased_at;          // about when the job arrived: its lease starts then
  // What the lease allows for waiting on slots and between heartbeats.
  absl::Duration third_of_lease;
  std::string run;               // "run <id> attempt <n>", for the log
  int world = 1;                 // ranks of the run
  int local = 1;                 // of them on this worker (a gang's part: fewer)
  bool member = false;           // a gang's part without rank 0
  bool own_process = false;      // several jobs side by side: one process each
  std::vector<int> taken = {0};  // the slots it trains on
  RunConfig config;              // ConfigFor
  std::string dir;               // its checkpoint dir
  std::string config_path;       // where its ranks and job process read the config
  std::string journal_path;      // the points not acknowledged at its last checkpoint
};

// How the job trained: in this process or in one of its own, and what came of it.
struct Agent::Impl::Training {
  std::unique_ptr<Trainer> trainer;     // in this process
  std::unique_ptr<JobProcess> process;  // or in one of its own
  std::unique_ptr<ProgramProcess> program;  // or a program run's command (docs/program.md)
  int64_t step = 0;                     // the trainer's, for the log and a failed summary
  absl::StatusOr<RunSummary> summary;
  bool permanent = false;  // a failure that retries cannot mend
};

}  // namespace ablate

#endif  // ABLATE_WORKER_AGENT_AGENT_INTERNAL_H_
