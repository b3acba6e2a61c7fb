// One attempt at a program run (docs/program.md): the command started in a process group of its
// own, in its code's snapshot directory, with the ABLATE_* environment; its output read line by
// line (OutputParser), kept in the attempt's log (capped, the oldest half dropped) and fed to the
// same TrainerObserver a built-in run feeds, after the spike detectors ran on what it reported.
//
// How an attempt ends (RunSummary state, or a failed status):
//   `end` reported and exit 0                       SUCCEEDED
//   exit 0 at a rung (ABLATE_STOP_AT_STEP) after a `ckpt` at or past it     INTERRUPTED (paused)
//   exit 3, or a divergence the detectors saw (the group is stopped)        DIVERGED
//   exit 2, or an `error` reported permanent        FAILED, permanent (never retried)
//   exit 0 without `end`                            FAILED, permanent
//   any other exit or a signal                      FAILED (retried from the last `ckpt`)
//   the agent's interrupt / the coordinator's stop  INTERRUPTED / CANCELLED (SIGTERM, then
//                                                   SIGKILL of the group after grace_s)
// With spike.policy ROLLBACK (the program declares `rollback`), a spike kills the group and
// relaunches the command from its last checkpoint with ABLATE_ROLLBACK=A-B (resume from step A,
// skip the batches of steps A+1..B), within the same attempt, at most kMaxRollbacks times.
// A failure's reason ends with the last 20 lines of output. When the program's own process ends,
// whatever it left in its group is killed, so a forked child cannot outlive its attempt.
//
// Several ranks (world_size N > 1, resources.devices): N processes of the same command, in one
// process group (rank 0's), each with torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT (a free loopback port, chosen afresh for every launch) and its own
// CUDA_VISIBLE_DEVICES; a world of 1 gets none of these, as before (a program such as nanoGPT
// takes RANK as the sign of a data-parallel run). Rank 0 alone is parsed and decides the ending;
// every other rank's output goes to its own log (LOG with ".rank-R" before ".log", same cap) and
// stays out of the failure's tail. A rank that exits non-zero or by a signal while rank 0 runs
// stops the group (SIGTERM, SIGKILL after grace_s; after an exit 2 or 3, a verdict all ranks
// reach together, only once rank 0 had grace_s to end likewise), and unless rank 0 then ends on
// its own terms (`end`, diverged, a permanent failure) the attempt fails naming that rank, how it
// ended and its last lines; an exit 2 is permanent, as rank 0's. Once rank 0 has exited the others
// get grace_s to exit (SIGTERM first when rank 0 failed), then the group is killed. A rollback
// relaunches all.
//
// Steps must increase within an attempt and stay within the run's length; a report that breaks
// that, or cannot be read, is dropped with a notice (the first few of each kind), never stored.
// No LibTorch, no gRPC. One thread uses a ProgramProcess (besides its reader threads, one a rank).
#ifndef ABLATE_WORKER_PROGRAM_PROGRAM_PROCESS_H_
#define ABLATE_WORKER_PROGRAM_PROGRAM_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ablate.pb.h"
#include "worker/program/output_parser.h"
#include "worker/train/trainer.h"

namespace ablate {

// Lines of output a failure's reason ends with.
inline constexpr int kProgramTailLines = 20;

struct ProgramAttempt {
  RunConfig config;  // config.program set; train.steps the length, train.spike
  int64_t run_id = 0;
  int32_t attempt = 1;
  std::string code_dir;          // the snapshot: the working directory
  std::string checkpoint_dir;    // ABLATE_CHECKPOINT_DIR, stable across attempts
  std::string log_path;          // this attempt's output (and LOG.1 once it was rotated)
  int64_t resume_from_step = 0;  // > 0: resume (resume_args, ABLATE_RESUME_FROM)
  int64_t stop_at_step = 0;      // a rung: ABLATE_STOP_AT_STEP
  std::string device;            // "cuda:N": CUDA_VISIBLE_DEVICES=N
  std::vector<std::string> env;  // NAME=VALUE set on top of the worker's environment
  // Ranks (resources.devices), all on this machine, and each rank's device by rank (as `device`,
  // which rank_devices[0] replaces; missing entries: `device`).
  int world_size = 1;
  std::vector<std::string> rank_devices;
};

class ProgramProcess {
 public:
  // Starts the attempt. A command that cannot be run (not found, not executable, a bad
  // placeholder) is an error with *permanent set.
  static absl::StatusOr<std::unique_ptr<ProgramProcess>> Start(const ProgramAttempt& attempt,
                                                               bool* permanent);
  ~ProgramProcess();  // kills (SIGKILL) and reaps a group still running

  ProgramProcess(const ProgramProcess&) = delete;
  ProgramProcess& operator=(const ProgramProcess&) = delete;

  // Feeds what the program reports to `observer` until it ends (above). Stops it when the
  // observer or `should_stop` says so (asked every 50 ms), interrupts it when `interrupt` is set.
  // A failure is an error status with *permanent saying whether a retry could help.
  absl::StatusOr<RunSummary> Run(TrainerObserver* observer, const std::atomic<bool>* interrupt,
                                 const std::function<bool()>& should_stop, bool* permanent);

  int64_t step() const { return last_step_; }
  // Rank 0's process (the group's leader), and every rank's by rank; -1 once it was reaped.
  pid_t pid() const { return pid_; }
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  explicit ProgramProcess(const ProgramAttempt& attempt);

  // One rank's output: its log (kept for the attempt, across rollbacks) and this launch's pipe.
  struct Output {
    std::string log_path;
    int log_fd = -1;
    int64_t log_bytes = 0;
    int fd = -1;  // the read end of the rank's stdout and stderr
    std::thread reader;
  };

  // Starts the command's ranks (resumed from `resume_from` > 0; ABLATE_ROLLBACK=`rollback` when
  // not empty) and their reader threads. *permanent as Start's.
  absl::Status Launch(int64_t resume_from, const std::string& rollback, bool* permanent);
  // Kills the group and reaps every rank still running, then joins the readers.
  void KillAndReap();
  void ReadOutput(int rank);                    // a reader thread
  void Line(int rank, absl::string_view line);  // one line: tail, and rank 0's parsed
  void WriteLog(Output* out, absl::string_view bytes);
  // Reaps the ranks that exited (WNOHANG), the others before rank 0, and acts on each (Run).
  void ReapRanks(TrainerObserver* observer);
  // What the run loop does with one event; false once the run must end (set *ending).
  void Handle(const ProgramEvent& e, TrainerObserver* observer);
  void Notice(TrainerObserver* observer, const std::string& kind, const std::string& line);
  // SIGTERM to the group now, SIGKILL once grace_s passed (KillIfDue).
  void Terminate();
  void KillIfDue();
  // The tail of rank `rank`'s output, for a failure's reason.
  std::string Tail(int rank = 0);
  // How the attempt ends, from how rank 0 ended (`status`) and what it reported.
  absl::StatusOr<RunSummary> Ending(int status, bool* permanent);
  RunSummary Summary(RunState state, const std::string& reason) const;

  const ProgramAttempt a_;
  const absl::Duration grace_;
  OutputParser parser_;
  const int world_;
  pid_t pid_ = -1;           // rank 0's, the process group's id while any rank may run
  std::vector<pid_t> pids_;  // by rank, this launch's; -1 once reaped
  std::vector<int> status_;  // by rank: how it ended (waitpid), once reaped
  std::vector<Output> out_;  // by rank
  int64_t log_limit_ = 0;
  absl::Time started_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<ProgramEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<std::string>> tails_ ABSL_GUARDED_BY(mu_);  // by rank
  int open_outputs_ ABSL_GUARDED_BY(mu_) = 0;  // readers not at the end of their output yet
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the destructor runs: no reader waits for room

  // The run loop's (one thread).
  int64_t last_step_ = 0;
  int64_t last_checkpoint_ = 0;
  absl::Time last_step_time_;
  std::deque<double> recent_losses_;
  EvalResult last_eval_;
  bool has_eval_ = false;
  ParamCount params_;
  int64_t tokens_ = 0;
  bool saw_end_ = false;
  bool error_permanent_ = false;
  std::string error_message_;
  std::string diverged_;  // why the detectors stopped it
  enum class Stop {
    kNone,
    kCancel,
    kInterrupt,
    kDiverged,
    kRollback,
    kRankFailed  // another rank failed while rank 0 ran (failed_rank_)
  } stop_ = Stop::kNone;
  int failed_rank_ = 0;  // kRankFailed: which rank (how it ended: status_)
  absl::Time terminate_at_ = absl::InfiniteFuture();  // kRankFailed: when the group is stopped
  // Once rank 0 exited (world > 1): when the other ranks are killed if still running.
  absl::Time others_kill_at_ = absl::InfiniteFuture();
  // spike.policy ROLLBACK with capabilities [rollback]: relaunched from rollback_from_ (the last
  // checkpoint), skipping the batches up to rollback_to_; at most kMaxRollbacks times.
  int64_t rollbacks_ = 0;
  int64_t rollback_from_ = 0, rollback_to_ = 0;
  absl::Time kill_at_ = absl::InfiniteFuture();
  std::map<std::string, int> notices_;  // by kind: how many were sent
  std::unique_ptr<class SpikeMonitor> spikes_;
};

// The Python helper's directory (python/ablate_report.py) for PYTHONPATH: beside the sources of
// this build, or below an install prefix (lib/ablate/python); "" when neither exists.
std::string ProgramHelperDir();

}  // namespace ablate

#endif  // ABLATE_WORKER_PROGRAM_PROGRAM_PROCESS_H_
