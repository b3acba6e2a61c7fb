// The SLURM back end of pilot workers (launcher.h, docs/cluster.md): what `ablate workers launch
// --slurm | status | stop` (orchestrator/cli/workers_command.h) do on a SLURM cluster.
//
// launch writes an sbatch script and submits it as a job array of N pilots (`--array=0-(N-1)`).
// Each array task `exec`s one `ablate-worker --coordinator HOST:PORT` that pulls runs until none
// came for --idle-exit seconds, then gives its allocation back. The script asks SLURM for
// `--signal=B:TERM@<seconds>` before the time limit; because the batch shell *is* the worker
// (exec), the worker receives it, checkpoints its run, finishes it INTERRUPTED (the coordinator
// requeues it at once) and exits 0. `scancel` sends the same SIGTERM first.
//
// The token (the coordinator's worker credential, STATE_DIR/worker-token: a pilot cannot submit,
// cancel or read results) never appears in the script, in a log or on a command line: sbatch runs
// with ABLATE_TOKEN in its environment and `--export=ABLATE_TOKEN,PATH,...` (kPilotEnvironment,
// not the whole environment of the submitting shell) hands it to the batch shell and the worker
// (which reads ABLATE_TOKEN); the script refuses to start the worker without it and never traces
// (`set -x`). The coordinator's address is on the worker's command line (it is not a secret).
//
// Which SLURM jobs are ablate's: every array job id launch submitted is appended to
// STATE_DIR/slurm/jobs (one line each: job id, pilot count, submit time), and every pilot job is
// named `ablate-pilot`. status and stop look only at jobs both named so and listed there, so two
// coordinators with different state dirs never see or cancel each other's pilots. The submitted
// script is kept as STATE_DIR/slurm/pilots-<job id>.sbatch; pilots log to
// LOG_DIR/pilot-<job id>_<task>.log (LOG_DIR defaults to STATE_DIR/slurm).
//
// status asks `squeue --states=all` (pending, running, and recently ended pilots), then `sacct`
// for listed jobs squeue no longer knows; without SLURM accounting those are reported as ended,
// final state unknown. stop `scancel`s every pilot that is still pending or running.
//
// Errors are one line naming what is wrong (a bad flag value, a missing ablate-worker, sbatch not
// installed, sbatch's own complaint). The pure parts (script, parsers) are exposed for tests.
#ifndef ABLATE_ORCHESTRATOR_CLUSTER_SLURM_H_
#define ABLATE_ORCHESTRATOR_CLUSTER_SLURM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "orchestrator/cluster/launcher.h"

namespace ablate {

// The SLURM job name of every pilot (sbatch --job-name).
inline constexpr char kPilotJobName[] = "ablate-pilot";
// What sbatch hands the pilots of the submitting shell's environment (--export); SLURM adds its
// own SLURM_* variables. Unset ones are skipped.
inline constexpr char kPilotEnvironment[] =
    "ABLATE_TOKEN,PATH,HOME,USER,LANG,LC_ALL,TMPDIR,LD_LIBRARY_PATH,OMP_NUM_THREADS";

// Everything the pilot script says: what each pilot asks SLURM for and how it runs the worker.
struct PilotScriptOptions {
  // Pilots in the array (>= 1): tasks 0..count-1.
  int count = 1;
  // sbatch directives; "" leaves the cluster's default. No whitespace inside a value.
  std::string partition;
  std::string gres;  // e.g. "gpu:1"
  std::string time;  // SLURM's time format: "60", "4:00:00", "1-00:00:00"
  int cpus_per_task = 1;
  std::string mem;  // e.g. "16G"
  // Seconds before the time limit at which SLURM sends SIGTERM to the worker (--signal=B:TERM@).
  int signal_before_s = 120;
  // Absolute directory of the pilots' logs (sbatch --output, one file per task).
  std::string log_dir;
  // The worker: its absolute path on the compute nodes, the coordinator it dials, and its flags.
  std::string worker_bin;
  std::string coordinator;      // HOST:PORT
  std::string device;           // --device for every job ("" = the worker's default: cpu)
  std::string checkpoint_root;  // --checkpoint-root ("" = each job's checkpoint dir)
  std::string tls_ca;           // --tls-ca: the CA of a TLS coordinator ("" = plaintext)
  int idle_exit_s = 120;        // --idle-exit: give the allocation back after this long idle
  int slots = 0;                // --slots: devices a pilot trains one run on (0 = the worker's: 1)
};

// The sbatch script (bash). InvalidArgument names the field when a value cannot be written safely
// (count < 1, whitespace in a directive, a relative path...).
absl::StatusOr<std::string> PilotScript(const PilotScriptOptions& options);

// `sbatch --parsable` output ("123" or "123;cluster") -> "123".
absl::StatusOr<std::string> ParseSbatchJobId(absl::string_view out);

// One pilot (an array task) as squeue or sacct reports it.
struct PilotState {
  std::string job;        // "<array job id>_<task>", e.g. "123_0" (sacct: "123_[2-5]" if pending)
  std::string array_job;  // "123"
  std::string name;       // the job name
  std::string state;      // RUNNING, PENDING, COMPLETED, CANCELLED ... (sacct's "by UID" dropped)
  std::string time;       // elapsed
  std::string time_limit;
  std::string nodes;
  std::string reason;  // why pending ("" or "None" when there is none)
};

// The squeue format ParseSqueue reads (pass to `squeue --noheader --array --format=`).
inline constexpr char kSqueueFormat[] = "%i|%F|%j|%T|%M|%l|%N|%r";
// The sacct fields ParseSacct reads (`sacct --noheader --parsable2 --allocations --format=`).
inline constexpr char kSacctFormat[] = "JobID,JobName,State,Elapsed,Timelimit,NodeList";

absl::StatusOr<std::vector<PilotState>> ParseSqueue(absl::string_view out);
absl::StatusOr<std::vector<PilotState>> ParseSacct(absl::string_view out);

// True for a pilot that is not over yet (pending, running, suspended, requeued...): one `stop`
// cancels. COMPLETING counts as over: SLURM is already ending it.
bool PilotActive(const PilotState& pilot);

// The array job ids launch recorded in `state_dir`/slurm/jobs, oldest first (none: empty).
std::vector<std::string> ReadPilotJobs(const std::string& state_dir);

// The SLURM back end: --slurm, sbatch's options (--partition, --gres, --time, --cpus-per-task,
// --mem, --extra, --signal-before), the pilots' script and jobs in STATE_DIR/slurm.
std::unique_ptr<ClusterLauncher> MakeSlurmLauncher();

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLUSTER_SLURM_H_
