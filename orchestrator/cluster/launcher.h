// Pilot workers on a cluster (docs/cluster.md): ablate-workers a cluster's scheduler starts, which
// dial the coordinator, pull runs until none comes for a while and then give their allocation
// back. Each scheduler is a back end behind ClusterLauncher (slurm.h: SLURM job arrays).
// `ablate workers launch | status | stop` (orchestrator/cli/workers_command.h) knows the back ends
// only through this header: a second one (Kubernetes Indexed Jobs, say) is a class in a file beside
// slurm.cc and a line in ClusterLaunchers(), with no change to the command.
//
// What every back end needs before it starts pilots is resolved here, once (ResolvePilotRequest):
// the coordinator's address, the pilots' credential, the worker binary and the paths the compute
// nodes read.
#ifndef ABLATE_ORCHESTRATOR_CLUSTER_LAUNCHER_H_
#define ABLATE_ORCHESTRATOR_CLUSTER_LAUNCHER_H_

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// What `ablate workers` is given, whatever the back end (the flags of workers_command.cc).
struct WorkersOptions {
  std::string state_dir = ".ablate";
  // The coordinator's address and the pilots' credential: flag (--coordinator, --token-file),
  // else $ABLATE_COORDINATOR / $ABLATE_TOKEN, else STATE_DIR/address and STATE_DIR/worker-token
  // (the order of orchestrator/cli/client.h, without its fallbacks: a pilot must not dial a
  // guessed address or go without a token).
  std::string coordinator, token_file;
  // The CA bundle of a TLS coordinator: flag, else $ABLATE_TLS_CA, else STATE_DIR/tls-ca.pem when
  // it exists (proto/tls.h); the pilots get its absolute path. "" everywhere: plaintext.
  std::string tls_ca;
  // "" = ablate-worker beside the running ablate (/proc/self/exe's directory).
  std::string worker_bin;
  std::string format = "table";  // status: table, or json for programs
  // launch: the pilots.
  int count = 1;                // pilots to start (>= 1)
  std::string device;           // --device for every job ("" = the back end's choice, else cpu)
  int slots = 0;                // --slots: devices a pilot trains one run on (0 = the worker's: 1)
  std::string checkpoint_root;  // --checkpoint-root ("" = each job's checkpoint dir)
  std::string log_dir;          // the pilots' logs ("" = the back end's, in STATE_DIR)
  int idle_exit_s = 120;        // --idle-exit: give the allocation back after this long idle
};

// The pilots of WorkersOptions resolved, as a back end starts them.
struct PilotRequest {
  std::string state_dir;  // absolute
  int count = 1;
  std::string coordinator;  // HOST:PORT
  // The worker credential, with which a pilot cannot submit, cancel or read results. A back end
  // hands it to the pilots in their environment: never on a command line, in a script or a log.
  std::string token;
  std::string worker_bin;  // absolute
  std::string tls_ca;      // absolute; "" = plaintext
  std::string device;      // as given ("" = the back end's choice)
  int slots = 0;
  std::string checkpoint_root;  // absolute; "" = each job's checkpoint dir
  std::string log_dir;          // absolute; "" = the back end's default
  int idle_exit_s = 120;
};

// `options` resolved for launch, in this order: the coordinator, the token, the worker binary,
// the TLS CA. FailedPrecondition, one line starting "workers launch: ", when there is no
// coordinator address or no token, no executable ablate-worker, or an unreadable TLS CA file.
absl::StatusOr<PilotRequest> ResolvePilotRequest(const WorkersOptions& options);

// One cluster scheduler that starts pilots. A launcher keeps the values of the flags it adds.
class ClusterLauncher {
 public:
  virtual ~ClusterLauncher() = default;

  // Its name, which is its `workers launch` flag (--slurm), and that flag's help.
  virtual std::string name() const = 0;
  virtual std::string help() const = 0;
  // Adds its own `workers launch` options to `launch` (SLURM's: --partition, --gres...).
  virtual void AddLaunchFlags(CLI::App* launch) = 0;

  // Starts request.count pilots; prints what it submitted and where the pilots log.
  virtual absl::Status Launch(const PilotRequest& request, std::ostream& out) = 0;
  // Prints a line per pilot it launched from options.state_dir and a summary line
  // (options.format: "table", or "json").
  virtual absl::Status Status(const WorkersOptions& options, std::ostream& out) = 0;
  // Cancels every pilot it launched from options.state_dir that is still pending or running
  // (each running one checkpoints its run and hands it back); prints which.
  virtual absl::Status Stop(const WorkersOptions& options, std::ostream& out) = 0;
};

// Every back end, in the order `workers launch` lists their flags and `status` and `stop` ask them.
std::vector<std::unique_ptr<ClusterLauncher>> ClusterLaunchers();

// What `workers launch` says when no back end's flag was given.
absl::Status NoBackEndNamed();

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLUSTER_LAUNCHER_H_
