// `ablate serve`: the gRPC server of the coordinator. Hosts the Coordinator (client API) and
// WorkerService (worker API) services of proto/ablate.proto over a CoordinatorCore and a Store,
// plus the standard gRPC health service and server reflection.
//
// State dir (default ./.ablate): ablate.db (the results store), token (the bearer token, 64 hex
// digits, mode 0600, generated on first start), address (host:port clients dial, written once
// the server listens), checkpoints/ (the default checkpoint root), coordinator.lock.
//
// One coordinator per state dir and per port. The coordinator holds an exclusive flock on
// coordinator.lock (which names its pid) from Start until it is destroyed; a second one in the
// same state dir fails to start, naming the holder. Readers (`ablate dashboard`, sqlite3) take
// no lock. The port is bound without SO_REUSEPORT, so a port in use is an error too.
//
// Security: every method of both services needs `authorization: Bearer <token>` metadata and
// answers UNAUTHENTICATED otherwise (health and reflection are open: they reveal nothing of the
// results). Limits: messages over max_message_bytes are refused by gRPC (RESOURCE_EXHAUSTED);
// spec size, runs per sweep and metric batch size are checked by CoordinatorCore.
//
// Shutdown: health goes NOT_SERVING, long polls and watches are woken, in-flight calls get up to
// shutdown_grace to finish, then the store is flushed and closed.
//
// Thread safety: Shutdown may be called from any thread, more than once.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_SERVER_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "orchestrator/coordinator/core.h"
#include "orchestrator/store/store.h"
#include "config/state_dir.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace ablate {

struct ServerOptions {
  std::string state_dir = ".ablate";
  std::string host = "127.0.0.1";  // 0.0.0.0 to accept workers from other machines
  int port = 50051;                // 0 = any free port (tests)
  // "" = the token file of the state dir (created on first start).
  std::string token;
  // "" = <state_dir>/checkpoints.
  std::string checkpoint_root;
  // TLS (proto/tls.h): PEM certificate and key, both or neither ("" = plaintext).
  std::string tls_cert_file;
  std::string tls_key_file;
  int max_message_bytes = 64 << 20;
  absl::Duration shutdown_grace = absl::Seconds(5);
  CoordinatorOptions coordinator;  // checkpoint_root is overwritten from the above
  bool synchronous_full = true;    // the store's fsync per flush
};

class CoordinatorServer {
 public:
  // Opens the store, rebuilds the scheduler, listens, writes the address file.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const ServerOptions& options);
  ~CoordinatorServer();  // Shutdown()

  int port() const { return port_; }
  // "host:port" clients dial (127.0.0.1 when listening on every interface).
  const std::string& address() const { return address_; }
  const std::string& token() const { return token_; }
  CoordinatorCore* core() { return core_.get(); }
  Store* store() { return store_.get(); }

  // NOT_SERVING, wake blocked calls, Shutdown(now + grace), close the store. Idempotent.
  void Shutdown();

 private:
  CoordinatorServer() = default;

  // Constant after Start.
  int port_ = 0;
  std::string address_;
  std::string token_;
  absl::Duration grace_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<grpc::Service> client_service_;
  std::unique_ptr<grpc::Service> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  int lock_fd_ = -1;  // coordinator.lock, flocked; closed (released) by the destructor

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_SERVER_H_
