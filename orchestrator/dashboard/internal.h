// What the files of the dashboard's HTTP server share (not for use outside it): the request and
// response types, the JSON error helpers, the JSON renderings of store rows, and the server's
// state (DashboardServer::Impl). server.cc is the transport (listening, connections, parsing,
// authorization, static assets), api.cc the JSON API, stream.cc the live event stream,
// metrics.cc /metrics.
#ifndef ABLATE_ORCHESTRATOR_DASHBOARD_INTERNAL_H_
#define ABLATE_ORCHESTRATOR_DASHBOARD_INTERNAL_H_

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
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
#include "nlohmann/json.hpp"
#include "orchestrator/dashboard/server.h"
#include "orchestrator/store/reader.h"

namespace ablate {
namespace dashboard {

namespace asio = boost::asio;
using tcp = boost::asio::ip::tcp;
using json = nlohmann::json;

// Series sizes a client may ask for: more would only cost memory and bandwidth.
constexpr int kMaxSeriesPoints = 20000;
constexpr int kDefaultRunPoints = 2000;
constexpr int kDefaultCurvePoints = 600;
constexpr int kMaxCurvePoints = 5000;  // per run, on the sweep overlay
constexpr int kMaxEventsPerPage = 1000;
constexpr size_t kMaxHeaderBytes = 16 << 10;
constexpr absl::Duration kIdleTimeout = absl::Seconds(30);

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
// 7 significant digits: what a chart can show, and half the JSON of a double's 17.
double Significant7(double v);

// JSON renderings of store rows (NaN stays NaN: nlohmann writes it as null).
json SweepJson(const SweepInfo& s, double now);
json RunJson(const RunInfo& r);
json SpikeJson(int64_t run_id, const SpikeEvent& s);
json EventJson(const EventInfo& e);
json LayerJson(const LayerProbes& p);
json TableJson(const ComparisonTable& t);

}  // namespace dashboard

// The dashboard's files (the only ones that include this header) use these unqualified.
using dashboard::Dump;
using dashboard::Error;
using dashboard::EventJson;
using dashboard::FromStatus;
using dashboard::IntParam;
using dashboard::json;
using dashboard::JsonResponse;
using dashboard::kDefaultCurvePoints;
using dashboard::kDefaultRunPoints;
using dashboard::kIdleTimeout;
using dashboard::kMaxCurvePoints;
using dashboard::kMaxEventsPerPage;
using dashboard::kMaxHeaderBytes;
using dashboard::kMaxSeriesPoints;
using dashboard::LayerJson;
using dashboard::NowSeconds;
using dashboard::Request;
using dashboard::Response;
using dashboard::RunJson;
using dashboard::Significant7;
using dashboard::SpikeJson;
using dashboard::SweepJson;
using dashboard::TableJson;
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
  std::thread accept_thread;

  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  int active ABSL_GUARDED_BY(mu) = 0;
  std::set<tcp::socket*> sockets ABSL_GUARDED_BY(mu);
  std::list<std::thread> threads ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> finished ABSL_GUARDED_BY(mu);
  // /metrics: the previous scrape's step total, for the ingestion rate.
  int64_t last_steps ABSL_GUARDED_BY(mu) = -1;
  absl::Time last_steps_at ABSL_GUARDED_BY(mu);
  double last_rate ABSL_GUARDED_BY(mu) = 0;

  void AcceptLoop();
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Serve(tcp::socket* socket);
  bool Authorized(const Request& r) const;
  Response Handle(const Request& r);
  Response HandleApi(const Request& r);
  Response Sweeps();
  Response Sweep(const std::string& name);
  Response SweepCurves(const std::string& name, const Request& r);
  Response Events(const std::string& name, const Request& r);
  Response Run(int64_t id);
  Response RunMetrics(int64_t id, const Request& r);
  Response RunEvals(int64_t id);
  Response RunProbes(int64_t id, const Request& r);
  Response RunSpikes(int64_t id);
  Response Workers();
  Response Metrics();
  // Serves the SSE stream until the client leaves or the server stops.
  void Stream(tcp::socket* socket, const Request& r);
  // Sleeps `d` unless Stop comes first; false when stopping.
  bool Sleep(absl::Duration d);
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DASHBOARD_INTERNAL_H_
