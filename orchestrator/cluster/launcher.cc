#include "orchestrator/cluster/launcher.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "common/state_dir.h"
#include "orchestrator/cluster/process.h"
#include "orchestrator/cluster/slurm.h"
#include "proto/tls.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

// Where the pilots dial (see WorkersOptions): --coordinator, else $ABLATE_COORDINATOR, else the
// address file of the state dir `state`.
absl::StatusOr<std::string> PilotCoordinator(const WorkersOptions& options, const fs::path& state) {
  std::string coordinator = options.coordinator;
  if (coordinator.empty()) coordinator = EnvOrEmpty("ABLATE_COORDINATOR");
  if (coordinator.empty()) coordinator = ReadFirstLine(state / "address");
  if (coordinator.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "workers launch: no coordinator address: pass --coordinator HOST:PORT, or start `ablate "
        "serve --host 0.0.0.0` with this state dir (it writes ",
        (state / "address").string(), ")"));
  }
  return coordinator;
}

// The token the pilots present: the worker credential, with which a pilot cannot submit, cancel
// or read results. --token-file, else $ABLATE_TOKEN, else the state dir's worker-token file.
absl::StatusOr<std::string> PilotToken(const WorkersOptions& options, const fs::path& state) {
  std::string token;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(options.token_file);
    if (!read.ok()) return read.status();
    token = *read;
  }
  if (token.empty()) token = EnvOrEmpty("ABLATE_TOKEN");
  if (token.empty()) token = ReadFirstLine(state / kWorkerTokenFile);
  if (token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "workers launch: no token for the pilots: pass --token-file, set ABLATE_TOKEN, or point "
        "--state-dir at the coordinator's state dir (",
        (state / kWorkerTokenFile).string(), ")"));
  }
  return token;
}

}  // namespace

absl::StatusOr<PilotRequest> ResolvePilotRequest(const WorkersOptions& options) {
  PilotRequest request;
  const fs::path state = fs::absolute(options.state_dir);
  request.state_dir = state.string();
  absl::StatusOr<std::string> coordinator = PilotCoordinator(options, state);
  if (!coordinator.ok()) return coordinator.status();
  request.coordinator = *coordinator;
  absl::StatusOr<std::string> token = PilotToken(options, state);
  if (!token.ok()) return token.status();
  request.token = *token;
  // What the compute nodes run and read: the worker binary, and the other paths, absolute.
  absl::StatusOr<std::string> worker = FindWorkerBinary(options.worker_bin);
  if (!worker.ok()) {
    return absl::Status(worker.status().code(),
                        absl::StrCat("workers launch: ", worker.status().message(),
                                     " (a path the compute nodes see)"));
  }
  request.worker_bin = *worker;
  if (!options.log_dir.empty()) request.log_dir = fs::absolute(options.log_dir).string();
  if (!options.checkpoint_root.empty()) {
    request.checkpoint_root = fs::absolute(options.checkpoint_root).string();
  }
  request.tls_ca = ResolveTlsCa(options.tls_ca, state.string());
  if (!request.tls_ca.empty()) {
    if (::access(request.tls_ca.c_str(), R_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "workers launch: cannot read the TLS CA file ", request.tls_ca, " (--tls-ca)"));
    }
    request.tls_ca = fs::absolute(request.tls_ca).string();
  }
  request.count = options.count;
  request.device = options.device;
  request.slots = options.slots;
  request.idle_exit_s = options.idle_exit_s;
  return request;
}

std::vector<std::unique_ptr<ClusterLauncher>> ClusterLaunchers() {
  std::vector<std::unique_ptr<ClusterLauncher>> launchers;
  launchers.push_back(MakeSlurmLauncher());
  return launchers;
}

absl::Status NoBackEndNamed() {
  return absl::InvalidArgumentError(
      "workers launch: name the back end with --slurm (the only one so far; for Kubernetes see "
      "the Indexed Job in docs/cluster.md)");
}

}  // namespace ablate
