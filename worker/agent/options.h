// AgentOptions: how `ablate-worker --coordinator` reaches its coordinator, what it offers it
// (device, slots, cores), how it reports and retries, and when it stops. Its own header so that
// the parts of the agent that only read options (the reporter) need not see the Agent itself
// (worker/agent/agent.h says what the agent does with them).
#ifndef ABLATE_WORKER_AGENT_OPTIONS_H_
#define ABLATE_WORKER_AGENT_OPTIONS_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/time/time.h"

namespace ablate {

struct AgentOptions {
  // The coordinator's WorkerService, HOST:PORT. Required.
  std::string coordinator;
  // Sent as `authorization: Bearer <token>` on every call. "" sends no authorization.
  std::string token;
  // PEM CA bundle to verify a TLS coordinator (proto/tls.h). "" = plaintext.
  std::string tls_ca;
  // This worker's name, stable across reconnects. "" = hostname:pid.
  std::string name;
  // Overrides train.device of every job ("cpu", "cuda", "cuda:1") and is the device advertised
  // at registration. "" = each job's own device; "cpu" is advertised. A list ("cuda:0,cuda:1")
  // offers that many slots: rank r of a data-parallel job trains on the r-th.
  std::string device;
  // Slots advertised (WorkerResources.slots): 0 = the number of devices listed in `device`
  // (1 when none). The agent holds up to one job per free slot, side by side, leasing them in
  // one AcquireJob; a job with world_size N <= slots trains data-parallel on N of them, all at
  // once. With one slot the job trains in this process. With several, each job trains in a
  // process of its own (`rank_binary job-process`, worker/agent/job_process.h: LibTorch's seed
  // and thread pool are per process) whose results this agent reports and finishes; ranks
  // 1..N-1 of a data-parallel job are processes of `rank_binary` too, and one that fails fails
  // the attempt, which the coordinator retries from the last checkpoint. Slot i owns the i-th
  // of `slots` contiguous shares of this process's CPUs (its core group): the processes of a
  // job on it are pinned there, and a job whose train.threads is 0 gets that many threads per
  // rank. With `--device cuda:0,cuda:1` slot i is the i-th device.
  int slots = 0;
  // The binary of job processes and of ranks 1..N-1 (`ablate-worker`). "" = this process's own.
  std::string rank_binary;
  // A data-parallel collective that waits longer than this fails the attempt.
  absl::Duration collective_timeout = absl::Minutes(10);
  // Where other workers reach this one when it holds rank 0 of a gang-scheduled run (a run
  // wider than any one worker; it serves the rendezvous): WorkerResources.rendezvous_host.
  // "" = the hostname.
  std::string rendezvous_host;
  // When not empty, every job's checkpoints live in `<checkpoint_root>/run-<run_id>` instead of
  // the job's checkpoint_dir (for a worker that mounts the shared checkpoint path elsewhere).
  std::string checkpoint_root;
  // How often the outbox is shipped (a batch goes sooner when max_batch_points are waiting).
  absl::Duration report_interval = absl::Seconds(1);
  // Most points (steps + evaluations + spike events) in one report batch. >= 1.
  int max_batch_points = 1000;
  // Long poll: how long one AcquireJob waits for a job on the coordinator (it may cap it).
  absl::Duration acquire_wait = absl::Seconds(30);
  // Exit (Run() returns OK) after this long without a job, reachable coordinator or not.
  // Zero = never. SLURM pilots use it to give their allocation back.
  absl::Duration idle_exit = absl::ZeroDuration();
  // Exit after this many jobs (finished or abandoned). 0 = no limit.
  int max_jobs = 0;
  // Deadline of every call (AcquireJob: acquire_wait plus this).
  absl::Duration call_deadline = absl::Seconds(10);
  // Retry backoff while the coordinator is unreachable: doubles from min to max.
  absl::Duration backoff_min = absl::Milliseconds(200);
  absl::Duration backoff_max = absl::Seconds(15);
  // Set (from a signal handler) to interrupt: checkpoint, flush, finish INTERRUPTED, return OK.
  // May be null.
  const std::atomic<bool>* interrupt = nullptr;
  // Set to stop waiting for an unreachable coordinator (a second signal). May be null.
  const std::atomic<bool>* abort = nullptr;
  // Receives one line per event (registration, job start and end, connection state changes).
  // Null = stderr with a timestamp. Called from the agent's threads, one call at a time.
  std::function<void(const std::string&)> log;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_AGENT_OPTIONS_H_
