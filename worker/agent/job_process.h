// A job trained in a process of its own, for a worker that runs several jobs side by side (one
// per slot, docs/worker.md "Slots"): LibTorch's seed, default generator and intra-op thread count
// are per process, so two runs sharing one would no longer be pure functions of their configs.
//
// The job process (`ablate-worker job-process`, hidden) creates the Trainer for rank 0 of the
// job and writes what it produces as length-delimited JobProcessEvents (proto/ablate.proto) to
// fd 3; its agent reads them and feeds them to the same TrainerObserver an in-process trainer
// would call (the ReportingObserver: the agent reports and finishes for it, and journals the
// unacknowledged points at each checkpoint). The agent answers on the process's stdin, one byte
// each: 'S' (stop after this step: a stop directive or a lost lease), 'I' (interrupt: checkpoint
// and return INTERRUPTED), and for each before_checkpoint event 'C' (write it) or 'X' (skip it:
// the lease may be lost). Asking before a checkpoint keeps the in-process rule that a worker
// that may have lost its lease never replaces the checkpoint of the run's next owner.
//
// A process that ends without a summary or error event (killed, out of memory) fails the
// attempt, naming how it ended; the coordinator's retry resumes from the last checkpoint. The
// process dies with its agent (SIGTERM when the agent ends).
//
// No LibTorch in this header.
#ifndef ABLATE_WORKER_AGENT_JOB_PROCESS_H_
#define ABLATE_WORKER_AGENT_JOB_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/ablate.pb.h"
#include "worker/train/trainer.h"

namespace ablate {

// `ablate-worker job-process`'s arguments.
struct JobProcessOptions {
  std::string config_path;     // the job's RunConfig (JSON or YAML), its device set
  std::string checkpoint_dir;  // the job's checkpoint directory (resumed when one is there)
  int world_size = 1;          // > 1: rank 0 of a data-parallel job meeting its ranks at...
  std::string rendezvous;      // ...this HOST:PORT
  double collective_timeout_s = 600;
  int64_t stop_at_step = 0;    // Job.stop_at_step: pause at this rung (0: train to the end)
  // The agent's side only: CPUs the process is pinned to (its slot's core group); empty: not
  // pinned.
  std::vector<int> cpus;
};

// The job process's main: trains and writes the events to fd 3. Exit code 0 once its last
// event (summary or error) is written, 1 when it could not be.
int RunJobProcess(const JobProcessOptions& options);

// The agent's side of one job process. One thread uses it at a time.
class JobProcess {
 public:
  // Starts `binary job-process` with `options` (binary "": this process's own).
  static absl::StatusOr<std::unique_ptr<JobProcess>> Start(std::string binary,
                                                          const JobProcessOptions& options);
  ~JobProcess();  // kills (SIGKILL) and reaps a process still running

  JobProcess(const JobProcess&) = delete;
  JobProcess& operator=(const JobProcess&) = delete;

  // Waits for the trainer: the step it resumed after, or why it could not be created
  // (*permanent: an invalid config or missing data).
  absl::StatusOr<int64_t> WaitStarted(bool* permanent);
  // Feeds the events to `observer` until the run ends, and returns its summary or error. Tells
  // the process to stop when the observer says so or `should_stop` returns true (asked at least
  // every 50 ms), and to interrupt when `interrupt` is set.
  absl::StatusOr<RunSummary> Run(TrainerObserver* observer, const std::atomic<bool>* interrupt,
                                 const std::function<bool()>& should_stop);
  // The last step it reported (or resumed after).
  int64_t step() const { return step_; }
  pid_t pid() const { return pid_; }

 private:
  JobProcess() = default;
  void ReadEvents();
  // The next event; nullopt when the process closed its pipe (or after `timeout`, *timed_out).
  std::optional<JobProcessEvent> Next(absl::Duration timeout, bool* timed_out);
  void Send(char byte);
  // Reaps the process (waiting up to `grace`, then SIGKILL) and describes how it ended.
  std::string Reap(absl::Duration grace);

  pid_t pid_ = -1;
  int events_fd_ = -1;   // read end of the process's fd 3
  int control_fd_ = -1;  // write end of its stdin
  int64_t step_ = 0;
  std::thread reader_;

  absl::Mutex mu_;
  std::deque<JobProcessEvent> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string read_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ablate

#endif  // ABLATE_WORKER_AGENT_JOB_PROCESS_H_
