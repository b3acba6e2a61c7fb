// The worker agent: `ablate-worker --coordinator HOST:PORT`. It registers this machine's
// resources with the coordinator, long-polls for jobs, trains each with the Trainer, streams what
// the trainer produces as numbered report batches, and finishes the job with its summary
// (docs/worker.md; the contract is `WorkerService` in proto/ablate.proto).
//
// Reports. Steps, evaluations, spike events, checkpoint notices and the trainer's notices (an
// unreadable checkpoint moved aside, and the step resumed from instead: logged too, and stored in
// the run's event log) go to an in-memory outbox in the order the trainer produced them. A sender
// thread ships the outbox every report_interval (sooner when max_batch_points are waiting) as
// ReportRequest batches numbered 1, 2, 3... per (run, attempt). It sends the next batch only
// after the previous one was acknowledged and resends an unacknowledged batch unchanged, with
// capped exponential backoff (at most a quarter of the lease timeout), while the coordinator is
// unreachable; training goes on meanwhile (the outbox is bounded only by memory), for at most a
// lease timeout (below). A checkpoint notice travels in the same batch as, or after, every step
// it covers, so the coordinator never resumes a run from a checkpoint whose earlier steps it has
// not stored. When nothing was reported for a third of the lease timeout a heartbeat (a report
// with seq 0 and nothing in it) renews the lease. A batch refused as too large (gRPC's message
// limit, the coordinator's rows limit) goes back to the outbox and is sent again, under the same
// number, in batches half as large; a single point that no batch carries fails the attempt
// (permanent: FAILED with the reason).
//
// Cut off. The coordinator renews the lease when it receives a report, so the lease holds at
// least a lease timeout (RegisterResponse.lease_timeout_s) past the sending of the last report
// it acknowledged. Once that much time passed without another acknowledgement, the coordinator
// has given the run to another worker or will: training stops (checked every step, before every
// checkpoint, and while the agent waits for acknowledgements, a hanging call cancelled), no
// further checkpoint is written, and the job is abandoned without Finish, as after a lost lease,
// with one log line. A coordinator that answers again within that time (a restart) keeps the job
// going as before.
//
// Crash safety. Each time the trainer writes a checkpoint the agent also writes the points not yet
// acknowledged to `<checkpoint_dir>/unreported.binpb` (WriteFileAtomically: own temporary file,
// fsynced). A later attempt at the same run (after this worker was killed and the lease expired)
// resends the journalled points up to the step it resumes from before anything else; points after
// that step are trained and reported again. Ingestion is idempotent (steps and evals are keyed by
// run and step), so resending is harmless and a killed worker loses no metric point.
//
// Directives and endings. DIRECTIVE_STOP ends the run after the current step; it finishes as
// CANCELLED. FAILED_PRECONDITION or NOT_FOUND on a report (a stale attempt: the lease was lost and
// the run may already be running elsewhere) stops training at once, and the job is abandoned
// without Finish, as does a lease timeout without an acknowledgement (above). Otherwise, when the
// trainer returns, the agent waits until every batch was acknowledged, then sends Finish with the
// RunSummary (a trainer error becomes FAILED with the error text) and retries it until
// acknowledged. When `interrupt` becomes true (SIGTERM) the trainer writes a checkpoint, the agent
// flushes and finishes the job as INTERRUPTED (the coordinator requeues it to resume elsewhere) and
// Run() returns OK. `abort` (a second signal) stops waiting for an unreachable coordinator: Run()
// returns Aborted at once, and the journal of the last checkpoint keeps the unsent points for the
// next attempt.
//
// Connection. Every call carries `authorization: Bearer <token>` and a deadline, over TLS when
// tls_ca is set. While the coordinator is unreachable the agent retries with capped exponential
// backoff and registers again once it answers, logging one line per change of state (not one per
// retry). Transient codes (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
// UNKNOWN, CANCELLED) are retried; NOT_FOUND from AcquireJob (a coordinator that forgot this
// worker) registers again; any other code (UNAUTHENTICATED: a wrong token, UNIMPLEMENTED, ...) from
// Register, AcquireJob, Report or Finish ends Run() with that error, naming the coordinator.
//
// Thread safety: an Agent is driven by one thread (Run); it starts and joins a thread per job it
// holds (each with its reporter's sender thread).
// `interrupt` and `abort` may be set from any thread or a signal handler.
#ifndef ABLATE_WORKER_AGENT_AGENT_H_
#define ABLATE_WORKER_AGENT_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"
#include "worker/agent/options.h"

namespace ablate {

// What Run() did, for the caller's final line and for tests.
struct AgentResult {
  int64_t jobs = 0;            // jobs taken (finished or abandoned)
  int64_t jobs_abandoned = 0;  // of which abandoned after a lost lease
  int64_t registrations = 0;   // successful Register calls (1 + reconnects)
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Registers, then takes and trains jobs until max_jobs, idle_exit or `interrupt`: OK. Errors:
  // InvalidArgument for bad options, the coordinator's refusal (Unauthenticated, ...) with a
  // message naming the coordinator, Aborted when `abort` ended a wait for the coordinator.
  absl::StatusOr<AgentResult> Run();

  // This machine as registration describes it: `device` ("" = "cpu"), usable cores (the CPU
  // affinity mask), host memory from /proc/meminfo, hostname, and the SLURM job as squeue names
  // it ("<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>" in an array, else "<SLURM_JOB_ID>").
  static WorkerResources DetectResources(const std::string& device);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// `ablate-worker --coordinator`: installs SIGINT/SIGTERM handlers (first: interrupt, second:
// abort), runs an Agent and prints one line on failure. Exit code: 0 done (max jobs, idle exit,
// interrupted), 1 an error (printed to stderr as one line naming what is wrong).
int RunAgentCommand(AgentOptions options);

}  // namespace ablate

#endif  // ABLATE_WORKER_AGENT_AGENT_H_
