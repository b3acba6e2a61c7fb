// What the files of the dashboard's HTTP server share (not for use outside it): the request and
// response types, the JSON error helpers, the JSON renderings of store rows, and the server's
// state (DashboardServer::Impl), a connection's byte stream (Connection: plain or TLS, every read
// and write under a deadline). server.cc is the transport (listening, connections, deadlines,
// TLS, parsing, authorization, static assets), api.cc the JSON API, stream.cc the live event
// stream, metrics.cc /metrics.
#ifndef ABLATE_ORCHESTRATOR_DASHBOARD_INTERNAL_H_
#define ABLATE_ORCHESTRATOR_DASHBOARD_INTERNAL_H_

#include <poll.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/system/system_error.hpp>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "nlohmann/json.hpp"
#include "orchestrator/dashboard/server.h"
#include "orchestrator/net/deadline_socket.h"
#include "orchestrator/report/figures.h"
#include "orchestrator/store/reader.h"

namespace ablate {
namespace dashboard {

namespace asio = boost::asio;
using tcp = boost::asio::ip::tcp;
using json = nlohmann::json;
using error_code = boost::system::error_code;

// Series sizes a client may ask for: more would only cost memory and bandwidth.
constexpr int kMaxSeriesPoints = 20000;
constexpr int kDefaultRunPoints = 2000;
constexpr int kDefaultCurvePoints = 600;
constexpr int kMaxCurvePoints = 5000;  // per run, on the sweep overlay
constexpr int kMaxEventsPerPage = 1000;
// A program run's log (/api/runs/ID/log): its last lines, at most so many lines and bytes.
constexpr int kDefaultLogLines = 200;
constexpr int kMaxLogLines = 5000;
constexpr int64_t kMaxLogBytes = 2 << 20;
constexpr size_t kMaxHeaderBytes = 16 << 10;
constexpr absl::Duration kIdleTimeout = absl::Seconds(30);  // between keep-alive requests

// One connection's byte stream: plain HTTP, or TLS over the same DeadlineSocket. What
// http::read/http::write and the event stream read and write; set_deadline bounds every
// operation that follows. Not movable: the TLS stream refers to the socket.
class Connection : public ThrowingOverloads<Connection> {
 public:
  using ThrowingOverloads::read_some;
  using ThrowingOverloads::write_some;
  // `socket` is not owned; `tls` (not owned) is the server's context, nullptr for plain HTTP.
  Connection(tcp::socket* socket, asio::ssl::context* tls);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void set_deadline(absl::Time deadline) { socket_.set_deadline(deadline); }
  // For TLS: the handshake, before the deadline. A client that speaks plain HTTP instead gets a
  // 400 that says the server speaks HTTPS, in clear text (it holds nothing but that). False when
  // the connection is of no further use. Plain HTTP: true.
  bool Handshake();
  bool PeerClosed() { return socket_.PeerClosed(); }

  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, error_code& ec) {
    return tls_ != nullptr ? tls_->read_some(buffers, ec) : socket_.read_some(buffers, ec);
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers, error_code& ec) {
    return tls_ != nullptr ? tls_->write_some(buffers, ec) : socket_.write_some(buffers, ec);
  }

 private:
  DeadlineSocket socket_;
  std::unique_ptr<asio::ssl::stream<DeadlineSocket&>> tls_;
};

// "HTTP/1.1 STATUS ...": a whole JSON error response with Connection: close, for the places that
// answer without Beast (the accept thread's 503s, plain HTTP on a TLS port, the stream's errors).
std::string RawErrorResponse(int status, const std::string& message);

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  bool cacheable = false;  // static assets
};

struct Request {
  std::string path;                           // decoded per segment below
  std::vector<std::string> segments;          // "/api/runs/7" -> {"api", "runs", "7"}
  std::map<std::string, std::string> query;   // decoded
  std::string authorization;                  // the Authorization header
};

// Names echoed in errors come from the request and stored text need not be UTF-8 either:
// such bytes become U+FFFD, where a plain dump() would throw.
std::string Dump(const json& value);
Response JsonResponse(int status, const json& body);
Response Error(int status, const std::string& message);
// 404, 400, 503 or 500 by the status's code, with its message.
Response FromStatus(const absl::Status& status);
// An integer query parameter: `fallback` when absent, nullopt (-> 400, *error says why) when
// malformed.
std::optional<int64_t> IntParam(const Request& r, const std::string& name, int64_t fallback,
                                std::string* error);

double NowSeconds();

// Whether `r` is an API request whose answer is heavy (DashboardOptions::max_heavy_requests).
bool IsHeavy(const Request& r);

// JSON renderings of store rows (NaN stays NaN: nlohmann writes it as null).
json SweepJson(const SweepInfo& s, double now);
json RunJson(const RunInfo& r);
json SpikeJson(int64_t run_id, const SpikeEvent& s);
json EventJson(const EventInfo& e);
json LayerJson(const LayerProbes& p);
json LengthEvalJson(const LengthEval& l);
json AttentionMapJson(const AttentionMap& m);  // probs as numbers 0..255

}  // namespace dashboard

// The dashboard's files (the only ones that include this header) use these unqualified.
using dashboard::AttentionMapJson;
using dashboard::Connection;
using dashboard::Dump;
using dashboard::Error;
using dashboard::EventJson;
using dashboard::FromStatus;
using dashboard::IntParam;
using dashboard::json;
using dashboard::JsonResponse;
using dashboard::kDefaultCurvePoints;
using dashboard::kDefaultLogLines;
using dashboard::kDefaultRunPoints;
using dashboard::kIdleTimeout;
using dashboard::kMaxCurvePoints;
using dashboard::kMaxEventsPerPage;
using dashboard::kMaxHeaderBytes;
using dashboard::kMaxLogBytes;
using dashboard::kMaxLogLines;
using dashboard::kMaxSeriesPoints;
using dashboard::LayerJson;
using dashboard::LengthEvalJson;
using dashboard::NowSeconds;
using dashboard::Request;
using dashboard::Response;
using dashboard::RunJson;
using dashboard::SpikeJson;
using dashboard::SweepJson;
using dashboard::tcp;

// The server's state. The methods are defined in server.cc (transport), api.cc, stream.cc and
// metrics.cc.
struct DashboardServer::Impl {
  using Request = dashboard::Request;
  using Response = dashboard::Response;
  using tcp = dashboard::tcp;

  explicit Impl(const DashboardOptions& o) : options(o), acceptor(io) {}

  // Constant after Start.
  const DashboardOptions options;
  std::unique_ptr<StoreReader> owned_reader;
  const StoreReader* reader = nullptr;
  dashboard::asio::io_context io;  // only to own the sockets: every operation on them is synchronous
  tcp::acceptor acceptor;
  std::unique_ptr<dashboard::asio::ssl::context> tls;  // nullptr: plain HTTP
  // SHA-256 of every accepted credential: [0] options.token, then options.also_accepted.
  std::vector<CredentialDigest> credentials;
  std::thread accept_thread;

  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  int active ABSL_GUARDED_BY(mu) = 0;
  std::map<dashboard::asio::ip::address, int> per_client ABSL_GUARDED_BY(mu);  // > 0 only
  int streams ABSL_GUARDED_BY(mu) = 0;
  int heavy ABSL_GUARDED_BY(mu) = 0;              // heavy answers built or being written
  int64_t heavy_refused ABSL_GUARDED_BY(mu) = 0;  // 503s for want of a place (/metrics)
  std::set<tcp::socket*> sockets ABSL_GUARDED_BY(mu);
  std::list<std::thread> threads ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> finished ABSL_GUARDED_BY(mu);
  // /metrics: the previous scrape's step total, for the ingestion rate.
  int64_t last_steps ABSL_GUARDED_BY(mu) = -1;
  absl::Time last_steps_at ABSL_GUARDED_BY(mu);
  double last_rate ABSL_GUARDED_BY(mu) = 0;

  void AcceptLoop();
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Serves the connection accepted at `accepted` until it closes, fails, times out, or Stop.
  void Serve(tcp::socket* socket, absl::Time accepted);
  // The bearer header against every credential; `query_token`: ?token= against options.token too.
  bool Authorized(const Request& r, bool query_token) const;
  // A slot for an event stream (give it back with --streams under mu); false when all are taken.
  bool AcquireStream();
  // A place for a heavy answer, waiting up to options.heavy_wait; false (counted) when none came
  // free or the server is stopping. Give it back with ReleaseHeavy once the answer is written.
  bool AcquireHeavy();
  void ReleaseHeavy();
  Response Handle(const Request& r);
  Response HandleApi(const Request& r);
  Response Sweeps();
  Response Sweep(const std::string& name);
  Response SweepCurves(const std::string& name, const Request& r);
  Response SweepFigures(const std::string& name, const Request& r);
  Response SweepTune(const std::string& name);
  Response Events(const std::string& name, const Request& r);
  Response Run(int64_t id);
  Response RunMetrics(int64_t id, const Request& r);
  Response RunEvals(int64_t id);
  std::optional<Response> FindEvaluation(int64_t id, const Request& r, const char* list_key,
                                         int64_t* step);
  Response RunProbes(int64_t id, const Request& r);
  Response RunAttention(int64_t id, const Request& r);
  Response RunSpikes(int64_t id);
  Response RunLogLines(int64_t id, const Request& r);
  Response Workers();
  Response Table(const Request& r);
  Response Compare(const Request& r);
  Response Metrics();
  // Serves the SSE stream until the client leaves or the server stops.
  // Each write must finish within options.write_timeout.
  void Stream(Connection* connection, const Request& r);
  // Sleeps `d` unless Stop comes first; false when stopping.
  bool Sleep(absl::Duration d);
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DASHBOARD_INTERNAL_H_
