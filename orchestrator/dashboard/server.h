// The dashboard's HTTP server (docs/dashboard.md): the web app of dashboard/ (embedded into the
// binary at build time), a JSON API over a read-only StoreReader, a server-sent-events stream of
// live points, state changes and spikes, and /metrics in Prometheus text format.
//
// Decoupled from the coordinator: it only reads the SQLite store (its own read-only connections,
// or a StoreReader the caller owns), so it can run inside `ablate serve` or on its own over a
// results file. Live updates come from polling the store every poll_interval: event rows after the
// last id seen, new step points of RUNNING runs, new spike events.
//
// Security: every /api/ path and /metrics need a credential as `Authorization: Bearer <token>`:
// `token` or one of `also_accepted`. The event stream (/api/stream) also takes `?token=<token>`
// (EventSource cannot set headers), and only there; nowhere else does a query token count, so
// the URL credential cannot leak into other URLs' logs. Anything else answers 401 with a JSON
// error. Credentials are compared in constant time (SHA-256 digests, every one compared). The
// static assets (the page itself) and /healthz are public: they hold no results, and the page
// must load to tell a user without the token what to do. With tls_cert_file/tls_key_file the
// server speaks HTTPS only (a plain-HTTP request gets a 400 telling it so, never data).
// Malformed requests get 400/404/405 JSON errors; no input crashes the server.
//
// Threads: one accept thread, one thread per connection. Limits, each answered with a 503 JSON
// error that names it: max_connections in all, max_connections_per_client per remote address,
// max_streams event streams (over TLS a connection refused at accept is closed without an answer:
// the handshake has not happened). A slow or silent client cannot hold a thread: a connection's
// first request (TLS handshake included) must arrive whole within request_timeout of the accept;
// a later one within request_timeout of its first byte, which must come within 30 s of the
// previous response (keep-alive idle); every response, and every write of an event stream, must
// be written within write_timeout. Past a deadline the connection is closed.
// Stop() closes the listener and every connection (streams included) and joins the threads.
//
// Thread safety: Start/Stop/port may be called from any thread; Stop is idempotent.
#ifndef ABLATE_ORCHESTRATOR_DASHBOARD_SERVER_H_
#define ABLATE_ORCHESTRATOR_DASHBOARD_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "orchestrator/store/reader.h"

namespace ablate {

// One sample of an operator metric for /metrics (e.g. the scheduler's queue depth).
struct DashboardMetric {
  std::string name;  // Prometheus name: [a-zA-Z_:][a-zA-Z0-9_:]*
  std::string help;
  std::string type = "gauge";  // gauge or counter
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

struct DashboardOptions {
  std::string host = "127.0.0.1";  // 0.0.0.0: every interface
  int port = 8080;                 // 0 = any free port (tests); see DashboardServer::port()
  // Required: the credential the printed URL carries (Url()), accepted as a bearer header
  // everywhere and as ?token= on /api/stream.
  std::string token;
  // Other credentials accepted, as a bearer header only (e.g. an admin token for curl users).
  // None may be empty.
  std::vector<std::string> also_accepted;
  // HTTPS with this PEM certificate (chain) and private key: both or neither ("": plain HTTP).
  std::string tls_cert_file;
  std::string tls_key_file;
  // The store to read: `reader` when set (not owned, must outlive the server), otherwise the
  // database file `db_path`, opened read-only.
  const StoreReader* reader = nullptr;
  std::string db_path;
  // Where runs' checkpoints live on this machine (`ablate serve`'s CHECKPOINT_ROOT): a program
  // run's output is read from CHECKPOINT_ROOT/run-<id>/logs (GET /api/runs/ID/log,
  // common/run_logs.h). "": no run has a log here (404).
  std::string checkpoint_root;
  // Live operator statistics added to /metrics (queue depth, workers, writer backlog...).
  // Called on the connection's thread for every scrape; may be empty.
  std::function<std::vector<DashboardMetric>()> operator_stats;
  // The slots a worker has in use now, as the coordinator counts them: its leases, a gang's parts
  // on it, a forming gang's reservations. Empty (a dashboard on a database file): /api/workers
  // counts the devices of the RUNNING runs the store records on it, which for a gang is all of
  // them on rank 0's worker and none on the others.
  std::function<int(int64_t worker_id)> live_slots_in_use;
  absl::Duration poll_interval = absl::Milliseconds(200);  // the stream's store polling period
  int max_connections = 256;  // concurrent connections (a browser tab holds up to 6); more: 503
  int max_connections_per_client = 32;  // concurrent connections from one remote address
  int max_streams = 64;                 // concurrent event streams (/api/stream), all clients
  // Points of one /api/sweeps/NAME/curves answer, all runs together: a sweep of many runs gets
  // fewer points per run (at least 2), so that one request cannot build gigabytes.
  int64_t max_curve_values = 2'000'000;
  // Heavy answers (curves, figures, tables, comparisons, a run's metrics, probes and maps) built
  // or being written at once, all clients: each can take a store connection and tens of MB. One
  // more waits up to heavy_wait for a place, then gets 503. Light ones (lists, a run's row,
  // events, /metrics) are never held back, and keep the store connections these leave free.
  int max_heavy_requests = 2;
  absl::Duration heavy_wait = absl::Seconds(10);
  // A request (headers and body; on a new connection the TLS handshake too) must arrive within
  // this; a slower client is disconnected, so a trickle of bytes cannot hold a thread.
  absl::Duration request_timeout = absl::Seconds(10);
  // A response, and each write of an event stream, must be written within this: a client that
  // stops reading is disconnected.
  absl::Duration write_timeout = absl::Seconds(30);
};

// "http://HOST:PORT/" of a dashboard listening at `host` (https:// with TLS; 127.0.0.1 when
// listening on every interface; an IPv6 address bracketed): the pages' address, without the
// credential.
std::string DashboardBaseUrl(const std::string& host, int port, bool tls);

class DashboardServer {
 public:
  // Opens the store (unless a reader is given) and listens. InvalidArgument without a token, with
  // an empty also_accepted entry, a non-positive limit or timeout, or a TLS file given without its
  // partner, unreadable or not a matching PEM certificate and key (naming the file); the store's
  // error when the file cannot be opened; Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(const DashboardOptions& options);
  ~DashboardServer();  // Stop()

  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  int port() const { return port_; }
  // DashboardBaseUrl(...) + "?token=TOKEN".
  std::string Url() const;

  // Closes the listener and every open connection, joins every thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit DashboardServer(std::unique_ptr<Impl> impl);

  // Constant after Start.
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DASHBOARD_SERVER_H_
