// The dashboard's HTTP server (docs/dashboard.md): the web app of dashboard/ (embedded into the
// binary at build time), a JSON API over a read-only StoreReader, a server-sent-events stream of
// live points, state changes and spikes, and /metrics in Prometheus text format.
//
// Decoupled from the coordinator: it only reads the SQLite store (its own read-only connections,
// or a StoreReader the caller owns), so it can run inside `ablate serve` or on its own over a
// results file. Live updates come from polling the store every poll_interval: event rows after the
// last id seen, new step points of RUNNING runs, new spike events.
//
// Security: every /api/ path and /metrics need the token, as `Authorization: Bearer <token>` or
// `?token=<token>` (EventSource cannot set headers); anything else answers 401 with a JSON error.
// The static assets (the page itself) are public: they hold no results, and the page must load to
// tell a user without the token what to do. Malformed requests get 400/404/405 JSON errors; no
// input crashes the server.
//
// Threads: one accept thread, one thread per connection (at most max_connections; more get 503;
// an idle keep-alive connection is closed after 30 s).
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
  std::string token;               // required: the coordinator's bearer token
  // The store to read: `reader` when set (not owned, must outlive the server), otherwise the
  // database file `db_path`, opened read-only.
  const StoreReader* reader = nullptr;
  std::string db_path;
  // Live operator statistics added to /metrics (queue depth, workers, writer backlog...).
  // Called on the connection's thread for every scrape; may be empty.
  std::function<std::vector<DashboardMetric>()> operator_stats;
  absl::Duration poll_interval = absl::Milliseconds(200);  // the stream's store polling period
  int max_connections = 256;  // concurrent connections (a browser tab holds up to 6); more: 503
};

class DashboardServer {
 public:
  // Opens the store (unless a reader is given) and listens. InvalidArgument without a token;
  // the store's error when the file cannot be opened; Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(const DashboardOptions& options);
  ~DashboardServer();  // Stop()

  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  int port() const { return port_; }
  // "http://HOST:PORT/?token=TOKEN" (127.0.0.1 when listening on every interface).
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
