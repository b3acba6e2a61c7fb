// `ablate serve`: the gRPC server of the coordinator. Hosts the Coordinator (client API) and
// WorkerService (worker API) services of proto/ablate.proto over a CoordinatorCore and a Store,
// plus the standard gRPC health service and server reflection.
//
// State dir (default ./.ablate): ablate.db (the results store, mode 0600), token (the secret and
// admin credential, 64 hex digits, mode 0600, generated on first start), worker-token and
// read-token (the credentials derived from it: common/credentials.h), address (host:port clients
// dial, written once the server listens), checkpoints/ (the default checkpoint root),
// coordinator.lock.
//
// One coordinator per state dir and per port. The coordinator holds an exclusive flock on
// coordinator.lock (which names its pid) from Start until it is destroyed; a second one in the
// same state dir fails to start, naming the holder. Readers (`ablate dashboard`, sqlite3) take
// no lock. The port is bound without SO_REUSEPORT, so a port in use is an error too.
//
// Security: every method of both services needs `authorization: Bearer <credential>` metadata:
// UNAUTHENTICATED without a known one, PERMISSION_DENIED with one of the wrong role (admin: all;
// worker: WorkerService; read: ListSweeps, GetSweep, Watch, Query, Table, Compare). Health and reflection
// are open: they reveal nothing of the results. Report and Finish also need the attempt's lease
// secret (CoordinatorCore). Limits: gRPC refuses messages over max_message_bytes
// (RESOURCE_EXHAUSTED), holds at most max_concurrent_streams calls per connection, and keeps its
// buffers within memory_quota_bytes; spec size, runs per sweep, metric batch size and every
// reported field are checked by CoordinatorCore.
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
#include "common/credentials.h"
#include "common/state_dir.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace ablate {

struct ServerOptions {
  std::string state_dir = ".ablate";
  std::string host = "127.0.0.1";  // 0.0.0.0 to accept workers from other machines
  int port = 50051;                // 0 = any free port (tests)
  // The secret the credentials derive from. "" = the token file of the state dir (created on
  // first start).
  std::string token;
  // "" = <state_dir>/checkpoints.
  std::string checkpoint_root;
  // TLS (proto/tls.h): PEM certificate and key, both or neither ("" = plaintext).
  std::string tls_cert_file;
  std::string tls_key_file;
  // The largest message: a metric batch (a spec is capped at 1 MiB by CoordinatorCore).
  int max_message_bytes = 16 << 20;
  int max_concurrent_streams = 64;        // per connection
  int64_t memory_quota_bytes = 512 << 20;  // gRPC's buffers, all connections together
  // Threads gRPC runs calls on (each call holds one; a worker's long poll too): past this, new
  // calls fail RESOURCE_EXHAUSTED and callers retry, rather than the process running out.
  int max_server_threads = 2048;
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
  // credentials().admin is the secret; worker and read are derived from it.
  const Credentials& credentials() const { return credentials_; }
  CoordinatorCore* core() { return core_.get(); }
  Store* store() { return store_.get(); }

  // NOT_SERVING, wake blocked calls, Shutdown(now + grace), close the store. Idempotent.
  void Shutdown();

 private:
  CoordinatorServer() = default;

  // Constant after Start.
  int port_ = 0;
  std::string address_;
  Credentials credentials_;
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
