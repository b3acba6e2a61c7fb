#include "orchestrator/dashboard_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "orchestrator/dashboard_assets.h"

namespace ablate {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
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

// ---- Requests and responses -----------------------------------------------------------------

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  bool cacheable = false;  // static assets
};

// Names echoed in errors come from the request and stored text need not be UTF-8 either:
// such bytes become U+FFFD, where a plain dump() would throw.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

Response JsonResponse(int status, const json& body) {
  Response r;
  r.status = status;
  r.body = Dump(body);
  return r;
}

Response Error(int status, const std::string& message) {
  return JsonResponse(status, json{{"error", message}, {"status", status}});
}

Response FromStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return Error(404, std::string(status.message()));
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return Error(400, std::string(status.message()));
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnavailable:
      return Error(503, std::string(status.message()));
    default:
      return Error(500, std::string(status.message()));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding ('+' is a space in queries). nullopt for a malformed escape.
std::optional<std::string> UrlDecode(absl::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%') {
      if (i + 2 >= in.size()) return std::nullopt;
      const int hi = HexDigit(in[i + 1]), lo = HexDigit(in[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (in[i] == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

struct Request {
  std::string path;                           // decoded per segment below
  std::vector<std::string> segments;          // "/api/runs/7" -> {"api", "runs", "7"}
  std::map<std::string, std::string> query;   // decoded
  std::string authorization;                  // the Authorization header
};

// nullopt for a target that cannot be decoded.
std::optional<Request> ParseTarget(absl::string_view target) {
  Request r;
  const size_t q = target.find('?');
  const absl::string_view raw_path = target.substr(0, q);
  if (raw_path.empty() || raw_path[0] != '/') return std::nullopt;
  r.path = std::string(raw_path);
  for (absl::string_view part : absl::StrSplit(raw_path.substr(1), '/', absl::SkipEmpty())) {
    std::optional<std::string> seg = UrlDecode(part, false);
    if (!seg) return std::nullopt;
    r.segments.push_back(*seg);
  }
  if (q != absl::string_view::npos) {
    for (absl::string_view pair : absl::StrSplit(target.substr(q + 1), '&', absl::SkipEmpty())) {
      const size_t eq = pair.find('=');
      std::optional<std::string> key = UrlDecode(pair.substr(0, eq), true);
      std::optional<std::string> value =
          UrlDecode(eq == absl::string_view::npos ? "" : pair.substr(eq + 1), true);
      if (!key || !value) return std::nullopt;
      r.query[*key] = *value;
    }
  }
  return r;
}

// Compares without an early exit, so the time taken does not reveal a matching prefix.
bool TokenEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// An integer query parameter: `fallback` when absent, nullopt (-> 400) when malformed.
std::optional<int64_t> IntParam(const Request& r, const std::string& name, int64_t fallback,
                                std::string* error) {
  auto it = r.query.find(name);
  if (it == r.query.end() || it->second.empty()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    *error = absl::StrCat("parameter '", name, "' is not an integer: '",
                          it->second.substr(0, 40), "'");
    return std::nullopt;
  }
  return v;
}

std::string MimeType(absl::string_view path) {
  if (absl::EndsWith(path, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(path, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(path, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(path, ".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

const EmbeddedAsset* FindAsset(absl::string_view path) {
  for (const EmbeddedAsset* a = kDashboardAssets; a->path != nullptr; ++a) {
    if (path == a->path) return a;
  }
  return nullptr;
}

// ---- JSON renderings of store rows ----------------------------------------------------------

// NaN stays NaN here: nlohmann writes it as null.
json SweepJson(const SweepInfo& s, double now) {
  json j{{"id", s.id},
         {"name", s.name},
         {"description", s.description},
         {"state", s.state},
         {"priority", s.priority},
         {"created_at", s.created_at},
         {"runs", s.runs},
         {"by_state",
          {{"PENDING", s.pending},
           {"RUNNING", s.running},
           {"SUCCEEDED", s.succeeded},
           {"FAILED", s.failed},
           {"DIVERGED", s.diverged},
           {"CANCELLED", s.cancelled},
           {"INTERRUPTED", s.interrupted}}},
         {"steps_done", s.steps_done},
         {"steps_total", s.steps_total}};
  // ETA: the rate so far over the steps left (runs that end early, diverged ones, make it an
  // overestimate, which is the safe side).
  json eta = nullptr;
  const int64_t left = s.steps_total - s.steps_done;
  if (s.state == "ACTIVE" && s.steps_done > 0 && left > 0 && now > s.created_at) {
    eta = (now - s.created_at) * static_cast<double>(left) / static_cast<double>(s.steps_done);
  } else if (s.state != "ACTIVE") {
    eta = 0;
  }
  j["eta_s"] = eta;
  return j;
}

json RunJson(const RunInfo& r) {
  return json{{"id", r.id},
              {"sweep_id", r.sweep_id},
              {"sweep", r.sweep},
              {"variant", r.variant},
              {"run_index", r.run_index},
              {"seed", r.seed},
              {"axes", r.axes},
              {"state", RunStateName(r.state)},
              {"reused_from", r.reused_from == 0 ? json(nullptr) : json(r.reused_from)},
              {"attempts", r.attempts},
              {"worker_id", r.worker_id},
              {"device", r.device},
              {"params_total", r.params_total},
              {"params_activated", r.params_activated},
              {"params_added", r.params_added},
              {"created_at", r.created_at},
              {"started_at", r.started_at},
              {"finished_at", r.finished_at},
              {"steps_total", r.steps_total},
              {"steps_done", r.steps_done},
              {"final_train_loss", r.final_train_loss},
              {"val_loss", r.val_loss},
              {"val_ppl", r.val_ppl},
              {"gate_score", r.gate_score},
              {"m_act", r.m_act},
              {"f_attn", r.f_attn},
              {"spike_steps", r.spike_steps},
              {"spike_score", r.spike_score},
              {"tokens_per_s", r.tokens_per_s},
              {"wall_s", r.wall_s},
              {"reason", r.reason}};
}

json SpikeJson(int64_t run_id, const SpikeEvent& s) {
  return json{{"run", run_id},
              {"step", s.step()},
              {"signal", s.signal()},
              {"value", s.value()},
              {"baseline", s.baseline()},
              {"kind", SpikeKind_Name(s.kind())},
              {"action", SpikeAction_Name(s.action())},
              {"rollback_to_step", s.rollback_to_step()}};
}

json EventJson(const EventInfo& e) {
  return json{{"id", e.id},       {"time", e.time},       {"sweep_id", e.sweep_id},
              {"run", e.run_id},  {"kind", e.kind},       {"message", e.message}};
}

json LayerJson(const LayerProbes& p) {
  json j{{"layer", p.layer()},
         {"has_gate", p.has_gate()},
         {"attn_out_max_abs", p.attn_out_max_abs()},
         {"attn_residual_max_abs", p.attn_residual_max_abs()},
         {"ffn_out_max_abs", p.ffn_out_max_abs()},
         {"ffn_residual_max_abs", p.ffn_residual_max_abs()},
         {"m_act", p.ffn_residual_max_abs()},
         {"f_attn", p.first_token_attention()},
         {"sparsity",
          {{"before_gate_1e2", p.sparsity().before_gate_1e2()},
           {"before_gate_1e3", p.sparsity().before_gate_1e3()},
           {"after_gate_1e2", p.sparsity().after_gate_1e2()},
           {"after_gate_1e3", p.sparsity().after_gate_1e3()},
           {"mean_scaled_1e2", p.sparsity().mean_scaled_1e2()},
           {"mean_scaled_1e3", p.sparsity().mean_scaled_1e3()}}}};
  if (p.has_gate()) {
    j["gate"] = {{"mean", p.gate_mean()}, {"std", p.gate_std()}, {"min", p.gate_min()},
                 {"max", p.gate_max()}};
    const Histogram& h = p.gate_histogram();
    j["gate_histogram"] = {{"lo", h.lo()}, {"hi", h.hi()},
                           {"counts", std::vector<int64_t>(h.counts().begin(), h.counts().end())}};
  } else {
    j["gate"] = nullptr;
    j["gate_histogram"] = nullptr;
  }
  return j;
}

json MeanStdJson(const MeanStd& m) { return json{{"mean", m.mean}, {"std", m.std}}; }

json TableJson(const ComparisonTable& t) {
  json rows = json::array();
  for (const ComparisonRow& r : t.rows) {
    rows.push_back(json{{"variant", r.variant},
                        {"description", r.description},
                        {"axes", r.axes},
                        {"runs", r.runs},
                        {"n", r.n},
                        {"diverged", r.diverged},
                        {"failed", r.failed},
                        {"unfinished", r.unfinished},
                        {"val_loss", MeanStdJson(r.val_loss)},
                        {"val_ppl", MeanStdJson(r.val_ppl)},
                        {"gate_score", MeanStdJson(r.gate_score)},
                        {"m_act", MeanStdJson(r.m_act)},
                        {"f_attn", MeanStdJson(r.f_attn)},
                        {"spike_score", MeanStdJson(r.spike_score)},
                        {"train_loss", MeanStdJson(r.train_loss)},
                        {"params_total", r.params_total},
                        {"params_activated", r.params_activated},
                        {"params_added", r.params_added}});
  }
  return json{{"sweep", t.sweep}, {"rows", rows}};
}

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// "id = 7": integers interpolated into read-only SQL (never text from a request).
int64_t AsInt(const SqlValue& v) {
  if (const int64_t* i = std::get_if<int64_t>(&v)) return *i;
  if (const double* d = std::get_if<double>(&v)) return static_cast<int64_t>(*d);
  return 0;
}
double AsDouble(const SqlValue& v) {
  if (const double* d = std::get_if<double>(&v)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return kNaN;
}
std::string AsString(const SqlValue& v) {
  if (const std::string* s = std::get_if<std::string>(&v)) return *s;
  return "";
}

// 7 significant digits: what a chart can show, and half the JSON of a double's 17.
double Significant7(double v) {
  if (!std::isfinite(v) || v == 0) return v;
  const double scale = std::pow(10.0, 6 - std::floor(std::log10(std::fabs(v))));
  return std::isfinite(scale) && scale > 0 ? std::round(v * scale) / scale : v;
}

std::string PromEscape(absl::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string PromNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

}  // namespace

// ---- The server ---------------------------------------------------------------------------------

struct DashboardServer::Impl {
  explicit Impl(const DashboardOptions& o) : options(o), acceptor(io) {}

  // Constant after Start.
  const DashboardOptions options;
  std::unique_ptr<StoreReader> owned_reader;
  const StoreReader* reader = nullptr;
  asio::io_context io;  // only to own the sockets: every operation on them is synchronous
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

absl::StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(
    const DashboardOptions& options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError("dashboard: a token is required");
  }
  auto impl = std::make_unique<Impl>(options);
  if (options.reader != nullptr) {
    impl->reader = options.reader;
  } else {
    ReaderOptions ro;
    ro.path = options.db_path;
    absl::StatusOr<std::unique_ptr<StoreReader>> reader = StoreReader::Open(ro);
    if (!reader.ok()) return reader.status();
    impl->owned_reader = std::move(*reader);
    impl->reader = impl->owned_reader.get();
  }
  boost::system::error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("dashboard: bad host '", options.host, "'"));
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("dashboard: bad port ", options.port));
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(options.port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("dashboard: cannot listen on ", options.host, ":",
                                               options.port, ": ", ec.message()));
  }
  const int port = impl->acceptor.local_endpoint().port();
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  std::unique_ptr<DashboardServer> server(new DashboardServer(std::move(impl)));
  server->port_ = port;
  return server;
}

DashboardServer::DashboardServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DashboardServer::~DashboardServer() { Stop(); }

std::string DashboardServer::Url() const {
  std::string host = impl_->options.host;
  if (host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  return absl::StrCat("http://", host, ":", port_, "/?token=", impl_->options.token);
}

void DashboardServer::Stop() {
  Impl& s = *impl_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.stopping) return;
    s.stopping = true;
    // Unblocks accept() and every blocking read: shutdown(2) on the descriptors (thread-safe,
    // unlike closing the asio objects under another thread's feet).
    ::shutdown(s.acceptor.native_handle(), SHUT_RDWR);
    for (tcp::socket* socket : s.sockets) ::shutdown(socket->native_handle(), SHUT_RDWR);
  }
  if (s.accept_thread.joinable()) s.accept_thread.join();
  std::list<std::thread> threads;
  {
    absl::MutexLock lock(&s.mu);
    threads.swap(s.threads);
  }
  for (std::thread& t : threads) t.join();
  boost::system::error_code ec;
  s.acceptor.close(ec);
}

void DashboardServer::Impl::ReapFinished() {
  for (std::thread::id id : finished) {
    for (auto it = threads.begin(); it != threads.end(); ++it) {
      if (it->get_id() == id) {
        it->join();  // it has returned from Serve: joining does not wait
        threads.erase(it);
        break;
      }
    }
  }
  finished.clear();
}

void DashboardServer::Impl::AcceptLoop() {
  while (true) {
    auto socket = std::make_unique<tcp::socket>(io);
    boost::system::error_code ec;
    acceptor.accept(*socket, ec);
    absl::MutexLock lock(&mu);
    ReapFinished();
    if (stopping) return;
    if (ec) {
      if (ec == asio::error::invalid_argument || ec == asio::error::bad_descriptor) return;
      // EMFILE, a connection reset before accept: keep serving, without spinning.
      mu.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(20));
      continue;
    }
    if (active >= options.max_connections) {
      static constexpr char kBusy[] =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          "Content-Length: 51\r\nConnection: close\r\n\r\n"
          "{\"error\":\"too many connections\",\"status\":503}\n   ";
      asio::write(*socket, asio::buffer(kBusy, sizeof(kBusy) - 1), ec);
      socket->close(ec);
      continue;
    }
    ++active;
    tcp::socket* raw = socket.release();
    sockets.insert(raw);
    threads.emplace_back([this, raw] {
      Serve(raw);
      absl::MutexLock lock(&mu);
      sockets.erase(raw);
      delete raw;
      --active;
      finished.push_back(std::this_thread::get_id());
    });
  }
}

bool DashboardServer::Impl::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu);
  const absl::Time until = absl::Now() + d;
  while (!stopping && absl::Now() < until) {
    mu.AwaitWithDeadline(absl::Condition(&stopping), until);
  }
  return !stopping;
}

void DashboardServer::Impl::Serve(tcp::socket* socket) {
  beast::flat_buffer buffer;
  while (true) {
    // An idle keep-alive connection is closed after kIdleTimeout: it holds a thread and a slot.
    if (buffer.size() == 0) {
      pollfd p{socket->native_handle(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kIdleTimeout))) <= 0) break;
    }
    http::request_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(64 << 10);
    boost::system::error_code ec;
    http::read(*socket, buffer, parser, ec);
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      break;
    }
    Response res;
    bool keep_alive = false;
    unsigned version = 11;
    if (ec) {
      res = Error(400, absl::StrCat("bad request: ", ec.message()));
    } else {
      const http::request<http::string_body>& req = parser.get();
      keep_alive = req.keep_alive();
      version = req.version();
      std::optional<Request> r = ParseTarget(absl::string_view(req.target().data(),
                                                              req.target().size()));
      if (req.method() != http::verb::get && req.method() != http::verb::head) {
        res = Error(405, "only GET is served");
        keep_alive = false;
      } else if (!r) {
        res = Error(400, "bad request target (malformed path or percent-escape)");
      } else {
        r->authorization = std::string(req[http::field::authorization]);
        if (r->path == "/api/stream") {
          if (!Authorized(*r)) {
            res = Error(401, "not authorized: a valid token is required");
          } else {
            Stream(socket, *r);
            break;
          }
        } else {
          res = Handle(*r);
        }
      }
      if (req.method() == http::verb::head) res.body.clear();
    }
    http::response<http::string_body> out(static_cast<http::status>(res.status), version);
    out.set(http::field::server, "ablate-dashboard");
    out.set(http::field::content_type, res.content_type);
    out.set(http::field::cache_control, res.cacheable ? "no-cache" : "no-store");
    out.set("X-Content-Type-Options", "nosniff");
    if (res.status == 401) out.set(http::field::www_authenticate, "Bearer");
    out.keep_alive(keep_alive);
    out.body() = std::move(res.body);
    out.prepare_payload();
    http::write(*socket, out, ec);
    if (ec || !keep_alive) break;
  }
  boost::system::error_code ignored;
  socket->shutdown(tcp::socket::shutdown_both, ignored);
  socket->close(ignored);
}

bool DashboardServer::Impl::Authorized(const Request& r) const {
  constexpr absl::string_view kBearer = "Bearer ";
  if (absl::StartsWith(r.authorization, kBearer) &&
      TokenEquals(absl::string_view(r.authorization).substr(kBearer.size()), options.token)) {
    return true;
  }
  auto it = r.query.find("token");
  return it != r.query.end() && TokenEquals(it->second, options.token);
}

Response DashboardServer::Impl::Handle(const Request& r) {
  const std::vector<std::string>& seg = r.segments;
  const bool api = !seg.empty() && seg[0] == "api";
  if (api || r.path == "/metrics") {
    if (!Authorized(r)) {
      return Error(401, "not authorized: open the URL ablate printed (it carries the token)");
    }
    try {
      return api ? HandleApi(r) : Metrics();
    } catch (const std::exception& e) {  // bad_alloc, a nlohmann type error
      return Error(500, absl::StrCat("internal error: ", e.what()));
    }
  }
  if (r.path == "/healthz") return JsonResponse(200, json{{"ok", true}});
  const std::string path = (r.path == "/" || r.path.empty()) ? "/index.html" : r.path;
  const EmbeddedAsset* asset = FindAsset(path);
  if (asset == nullptr) return Error(404, absl::StrCat("no such page: ", r.path.substr(0, 200)));
  Response res;
  res.content_type = MimeType(path);
  res.body.assign(reinterpret_cast<const char*>(asset->data), asset->size);
  res.cacheable = true;
  return res;
}

Response DashboardServer::Impl::HandleApi(const Request& r) {
  const std::vector<std::string>& seg = r.segments;  // seg[0] == "api"
  if (seg.size() == 2 && seg[1] == "sweeps") return Sweeps();
  if (seg.size() >= 3 && seg[1] == "sweeps") {
    if (seg.size() == 3) return Sweep(seg[2]);
    if (seg.size() == 4 && seg[3] == "curves") return SweepCurves(seg[2], r);
    if (seg.size() == 4 && seg[3] == "table") {
      absl::StatusOr<ComparisonTable> table = reader->GetComparisonTable(seg[2]);
      if (!table.ok()) return FromStatus(table.status());
      return JsonResponse(200, TableJson(*table));
    }
    if (seg.size() == 4 && seg[3] == "events") return Events(seg[2], r);
  }
  if (seg.size() >= 3 && seg[1] == "runs") {
    int64_t id = 0;
    if (!absl::SimpleAtoi(seg[2], &id) || id <= 0) {
      return Error(400, absl::StrCat("bad run id '", seg[2].substr(0, 40),
                                     "': a positive integer is expected"));
    }
    if (seg.size() == 3) return Run(id);
    if (seg.size() == 4) {
      if (seg[3] == "metrics") return RunMetrics(id, r);
      if (seg[3] == "evals") return RunEvals(id);
      if (seg[3] == "probes") return RunProbes(id, r);
      if (seg[3] == "spikes") return RunSpikes(id);
    }
  }
  if (seg.size() == 2 && seg[1] == "workers") return Workers();
  return Error(404, absl::StrCat("no such API endpoint: ", r.path.substr(0, 200)));
}

Response DashboardServer::Impl::Sweeps() {
  absl::StatusOr<std::vector<SweepInfo>> sweeps = reader->ListSweeps();
  if (!sweeps.ok()) return FromStatus(sweeps.status());
  const double now = NowSeconds();
  json list = json::array();
  for (const SweepInfo& s : *sweeps) list.push_back(SweepJson(s, now));
  return JsonResponse(200, json{{"sweeps", list}, {"time", now}});
}

Response DashboardServer::Impl::Sweep(const std::string& name) {
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(name);
  if (!sweep.ok()) return FromStatus(sweep.status());
  RunFilter filter;
  filter.sweep_id = sweep->id;
  absl::StatusOr<std::vector<RunInfo>> runs = reader->ListRuns(filter);
  if (!runs.ok()) return FromStatus(runs.status());
  // The variants (budget solutions) and each run's latest loss, in two indexed queries.
  absl::StatusOr<QueryResult> variants = reader->ReadOnlyQuery(absl::StrCat(
      "SELECT name, description, diff, budget, params_total, params_activated, params_added, "
      "flops_per_token FROM variants WHERE sweep_id = ", sweep->id, " ORDER BY position"));
  if (!variants.ok()) return FromStatus(variants.status());
  absl::StatusOr<std::map<int64_t, LatestStep>> last = reader->LatestSteps(sweep->id);
  if (!last.ok()) return FromStatus(last.status());
  std::map<std::string, std::string> budget_of;
  json variant_list = json::array();
  for (const std::vector<SqlValue>& row : variants->rows) {
    budget_of[AsString(row[0])] = AsString(row[3]);
    variant_list.push_back(json{{"name", AsString(row[0])},
                                {"description", AsString(row[1])},
                                {"diff", AsString(row[2])},
                                {"budget", AsString(row[3])},
                                {"params_total", AsInt(row[4])},
                                {"params_activated", AsInt(row[5])},
                                {"params_added", AsInt(row[6])},
                                {"flops_per_token", AsDouble(row[7])}});
  }
  json run_list = json::array();
  for (const RunInfo& run : *runs) {
    json j = RunJson(run);
    j["budget"] = budget_of[run.variant];
    auto it = last->find(run.id);
    j["last_step"] = it == last->end() ? 0 : it->second.step;
    j["last_loss"] = it == last->end() ? kNaN : it->second.loss;
    run_list.push_back(std::move(j));
  }
  return JsonResponse(200, json{{"sweep", SweepJson(*sweep, NowSeconds())},
                                {"variants", variant_list},
                                {"runs", run_list}});
}

Response DashboardServer::Impl::SweepCurves(const std::string& name, const Request& r) {
  std::string error;
  std::optional<int64_t> points = IntParam(r, "points", kDefaultCurvePoints, &error);
  if (!points) return Error(400, error);
  if (*points < 2) return Error(400, "parameter 'points' must be at least 2");
  const auto metric_it = r.query.find("metric");
  const std::string metric = metric_it == r.query.end() ? "loss" : metric_it->second;
  if (metric != "loss" && metric != "grad_norm" && metric != "lr") {
    return Error(400, "parameter 'metric' must be loss, grad_norm or lr");
  }
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(name);
  if (!sweep.ok()) return FromStatus(sweep.status());
  RunFilter filter;
  filter.sweep_id = sweep->id;
  absl::StatusOr<std::vector<RunInfo>> runs = reader->ListRuns(filter);
  if (!runs.ok()) return FromStatus(runs.status());
  absl::StatusOr<QueryResult> spikes = reader->ReadOnlyQuery(absl::StrCat(
      "SELECT r.id, s.step, s.signal, s.kind, s.value FROM runs r JOIN spike_events s ON "
      "s.run_id = coalesce(r.reused_from, r.id) WHERE r.sweep_id = ", sweep->id,
      " ORDER BY r.id, s.step"));
  if (!spikes.ok()) return FromStatus(spikes.status());
  std::map<int64_t, json> spikes_of;
  for (const std::vector<SqlValue>& row : spikes->rows) {
    json& list = spikes_of[AsInt(row[0])];
    if (list.is_null()) list = json::array();
    list.push_back(json{{"step", AsInt(row[1])}, {"signal", AsString(row[2])},
                        {"kind", AsString(row[3])}, {"value", AsDouble(row[4])}});
  }
  // One shared grid of steps for every run (every k-th step, k from the longest run), plus each
  // run's last step and its spike steps: PK seeks instead of scanning every run's rows, and
  // overlaid curves that share their x values (the browser joins them cheaply).
  const int max_points = static_cast<int>(std::min<int64_t>(*points, kMaxCurvePoints));
  int64_t longest = 0;
  for (const RunInfo& run : *runs) longest = std::max(longest, run.steps_done);
  const int64_t k = std::max<int64_t>(1, (longest + max_points - 1) / max_points);
  std::string grid = "0";
  for (int64_t s = k; s <= longest; s += k) absl::StrAppend(&grid, ",", s);
  const std::string column = metric;  // one of three fixed names, checked above
  QueryLimits limits;
  limits.max_rows = std::numeric_limits<int64_t>::max();
  absl::StatusOr<QueryResult> rows = reader->ReadOnlyQuery(
      absl::StrCat(
          // A reused run's rows are its source's (coalesce(reused_from, id)).
          "SELECT r.id, m.step, m.", column, " FROM runs r JOIN step_metrics m ON m.run_id = "
          "coalesce(r.reused_from, r.id) WHERE r.sweep_id = ", sweep->id, " AND m.step IN (",
          grid, ") "
          "UNION SELECT r.id, m.step, m.", column, " FROM runs r JOIN step_metrics m ON "
          "m.run_id = coalesce(r.reused_from, r.id) AND m.step = r.steps_done WHERE r.sweep_id = ",
          sweep->id,
          " UNION SELECT r.id, m.step, m.", column, " FROM runs r JOIN spike_events e ON "
          "e.run_id = coalesce(r.reused_from, r.id) JOIN step_metrics m ON m.run_id = e.run_id "
          "AND m.step = e.step WHERE r.sweep_id = ", sweep->id, " ORDER BY 1, 2"),
      limits);
  if (!rows.ok()) return FromStatus(rows.status());
  std::map<int64_t, std::pair<json, json>> series_of;  // run -> (steps, values)
  for (const std::vector<SqlValue>& row : rows->rows) {
    auto& [steps, values] = series_of[AsInt(row[0])];
    if (steps.is_null()) {
      steps = json::array();
      values = json::array();
    }
    steps.push_back(AsInt(row[1]));
    values.push_back(Significant7(AsDouble(row[2])));
  }
  json out = json::array();
  for (const RunInfo& run : *runs) {
    auto& [steps, values] = series_of[run.id];
    json& sp = spikes_of[run.id];
    out.push_back(json{{"id", run.id},
                       {"variant", run.variant},
                       {"seed", run.seed},
                       {"state", RunStateName(run.state)},
                       {"step", steps.is_null() ? json::array() : std::move(steps)},
                       {"value", values.is_null() ? json::array() : std::move(values)},
                       {"spikes", sp.is_null() ? json::array() : sp}});
  }
  return JsonResponse(200, json{{"sweep", sweep->name}, {"metric", metric},
                                {"points", max_points}, {"stride", k}, {"runs", out}});
}

Response DashboardServer::Impl::Events(const std::string& name, const Request& r) {
  std::string error;
  std::optional<int64_t> after = IntParam(r, "after", 0, &error);
  std::optional<int64_t> limit = after ? IntParam(r, "limit", 200, &error) : std::nullopt;
  if (!after || !limit) return Error(400, error);
  if (*after < 0 || *limit < 1) return Error(400, "'after' must be >= 0 and 'limit' >= 1");
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(name);
  if (!sweep.ok()) return FromStatus(sweep.status());
  absl::StatusOr<std::vector<EventInfo>> events = reader->Events(
      sweep->id, *after, static_cast<int>(std::min<int64_t>(*limit, kMaxEventsPerPage)));
  if (!events.ok()) return FromStatus(events.status());
  json list = json::array();
  for (const EventInfo& e : *events) list.push_back(EventJson(e));
  return JsonResponse(200, json{{"events", list}});
}

Response DashboardServer::Impl::Run(int64_t id) {
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<AttemptInfo>> attempts = reader->Attempts(id);
  if (!attempts.ok()) return FromStatus(attempts.status());
  json j = RunJson(*run);
  j["run_key"] = run->run_key;
  json config = json::parse(run->config_json, nullptr, /*allow_exceptions=*/false);
  j["config"] = config.is_discarded() ? json(run->config_json) : config;
  json list = json::array();
  for (const AttemptInfo& a : *attempts) {
    list.push_back(json{{"attempt", a.attempt},     {"worker_id", a.worker_id},
                        {"state", a.state},         {"started_at", a.started_at},
                        {"ended_at", a.ended_at},   {"checkpoint_step", a.checkpoint_step},
                        {"reason", a.reason}});
  }
  j["attempt_list"] = list;
  return JsonResponse(200, json{{"run", j}});
}

Response DashboardServer::Impl::RunMetrics(int64_t id, const Request& r) {
  std::string error;
  std::optional<int64_t> from = IntParam(r, "from", 0, &error);
  std::optional<int64_t> to =
      from ? IntParam(r, "to", std::numeric_limits<int64_t>::max(), &error) : std::nullopt;
  std::optional<int64_t> points = to ? IntParam(r, "points", kDefaultRunPoints, &error)
                                     : std::nullopt;
  if (!from || !to || !points) return Error(400, error);
  if (*from < 0 || *to < *from) return Error(400, "need 0 <= from <= to");
  if (*points < 2) return Error(400, "parameter 'points' must be at least 2");
  SeriesOptions series;
  series.from_step = *from;
  series.to_step = *to;
  series.max_points = static_cast<int>(std::min<int64_t>(*points, kMaxSeriesPoints));
  auto mode = r.query.find("mode");
  if (mode != r.query.end()) {
    if (mode->second == "minmax") {
      series.mode = Downsample::kMinMax;
    } else if (mode->second == "stride") {
      series.mode = Downsample::kStride;
    } else {
      return Error(400, "parameter 'mode' must be minmax or stride");
    }
  }
  absl::StatusOr<RunInfo> run = reader->GetRun(id);  // 404 for an unknown run, not []
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<StepMetrics>> m = reader->MetricSeries(id, series);
  if (!m.ok()) return FromStatus(m.status());
  json step = json::array(), loss = json::array(), grad = json::array(), lr = json::array(),
       tps = json::array(), skipped = json::array();
  for (const StepMetrics& p : *m) {
    step.push_back(p.step());
    loss.push_back(p.loss());
    grad.push_back(p.grad_norm());
    lr.push_back(p.lr());
    tps.push_back(p.tokens_per_s());
    skipped.push_back(p.skipped() ? 1 : 0);
  }
  return JsonResponse(200, json{{"run", id},
                                {"points", series.max_points},
                                {"mode", series.mode == Downsample::kStride ? "stride" : "minmax"},
                                {"step", step},
                                {"loss", loss},
                                {"grad_norm", grad},
                                {"lr", lr},
                                {"tokens_per_s", tps},
                                {"skipped", skipped}});
}

Response DashboardServer::Impl::RunEvals(int64_t id) {
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<EvalResult>> evals = reader->EvalSeries(id, false);
  if (!evals.ok()) return FromStatus(evals.status());
  json list = json::array();
  for (const EvalResult& e : *evals) {
    list.push_back(json{{"step", e.step()},
                        {"val_loss", e.val_loss()},
                        {"val_ppl", e.val_ppl()},
                        {"gate_score", e.probes().has_gate_score_mean()
                                           ? json(e.probes().gate_score_mean())
                                           : json(nullptr)},
                        {"m_act", e.probes().m_act()},
                        {"f_attn", e.probes().f_attn()},
                        {"tokens", e.probes().tokens()}});
  }
  return JsonResponse(200, json{{"run", id}, {"evals", list}});
}

Response DashboardServer::Impl::RunProbes(int64_t id, const Request& r) {
  std::string error;
  std::optional<int64_t> step = IntParam(r, "step", -1, &error);
  if (!step) return Error(400, error);
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  if (*step < 0) {  // the latest evaluation
    absl::StatusOr<std::vector<EvalResult>> evals = reader->EvalSeries(id, false);
    if (!evals.ok()) return FromStatus(evals.status());
    if (evals->empty()) return JsonResponse(200, json{{"run", id}, {"step", nullptr},
                                                      {"layers", json::array()}});
    *step = evals->back().step();
  }
  absl::StatusOr<std::vector<LayerProbes>> layers = reader->LayerProbesAt(id, *step);
  if (!layers.ok()) return FromStatus(layers.status());
  if (layers->empty()) {
    return Error(404, absl::StrCat("run ", id, " has no evaluation at step ", *step));
  }
  json list = json::array();
  for (const LayerProbes& p : *layers) list.push_back(LayerJson(p));
  return JsonResponse(200, json{{"run", id}, {"step", *step}, {"layers", list}});
}

Response DashboardServer::Impl::RunSpikes(int64_t id) {
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<SpikeEvent>> spikes = reader->SpikeEvents(id);
  if (!spikes.ok()) return FromStatus(spikes.status());
  json list = json::array();
  for (const SpikeEvent& s : *spikes) list.push_back(SpikeJson(id, s));
  return JsonResponse(200, json{{"run", id}, {"spikes", list}});
}

Response DashboardServer::Impl::Workers() {
  absl::StatusOr<std::vector<WorkerInfo>> workers = reader->ListWorkers();
  if (!workers.ok()) return FromStatus(workers.status());
  json list = json::array();
  for (const WorkerInfo& w : *workers) {
    list.push_back(json{{"id", w.id}, {"name", w.name}, {"resources", w.resources_json},
                        {"registered_at", w.registered_at}, {"last_seen", w.last_seen},
                        {"state", w.state}});
  }
  return JsonResponse(200, json{{"workers", list}});
}

Response DashboardServer::Impl::Metrics() {
  std::vector<DashboardMetric> samples;
  auto add = [&samples](std::string name, std::string help, std::string type,
                        std::vector<std::pair<std::string, std::string>> labels, double value) {
    samples.push_back(DashboardMetric{std::move(name), std::move(help), std::move(type),
                                      std::move(labels), value});
  };
  absl::StatusOr<QueryResult> runs = reader->ReadOnlyQuery(
      "SELECT state, count(*), COALESCE(sum(steps_done), 0) FROM runs GROUP BY state");
  if (!runs.ok()) return FromStatus(runs.status());
  std::map<std::string, int64_t> by_state;
  for (const char* s : {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "DIVERGED", "CANCELLED",
                        "INTERRUPTED"}) {
    by_state[s] = 0;
  }
  int64_t steps = 0;
  for (const std::vector<SqlValue>& row : runs->rows) {
    by_state[AsString(row[0])] = AsInt(row[1]);
    steps += AsInt(row[2]);
  }
  for (const auto& [state, n] : by_state) {
    add("ablate_runs", "Runs by state.", "gauge", {{"state", state}}, static_cast<double>(n));
  }
  add("ablate_queue_depth", "Runs waiting for a worker (PENDING and INTERRUPTED).", "gauge", {},
      static_cast<double>(by_state["PENDING"] + by_state["INTERRUPTED"]));
  absl::StatusOr<QueryResult> sweeps =
      reader->ReadOnlyQuery("SELECT state, count(*) FROM sweeps GROUP BY state");
  if (!sweeps.ok()) return FromStatus(sweeps.status());
  for (const std::vector<SqlValue>& row : sweeps->rows) {
    add("ablate_sweeps", "Sweeps by state.", "gauge", {{"state", AsString(row[0])}},
        static_cast<double>(AsInt(row[1])));
  }
  absl::StatusOr<QueryResult> workers =
      reader->ReadOnlyQuery("SELECT state, count(*) FROM workers GROUP BY state");
  if (!workers.ok()) return FromStatus(workers.status());
  for (const std::vector<SqlValue>& row : workers->rows) {
    add("ablate_workers", "Registered workers by state.", "gauge", {{"state", AsString(row[0])}},
        static_cast<double>(AsInt(row[1])));
  }
  add("ablate_steps_ingested_total",
      "Training steps stored over every run (sum of runs.steps_done): rate() it.", "counter", {},
      static_cast<double>(steps));
  double rate = 0;
  {
    absl::MutexLock lock(&mu);
    const absl::Time now = absl::Now();
    if (last_steps < 0) {
      last_steps = steps;
      last_steps_at = now;
    } else if (now - last_steps_at >= absl::Milliseconds(500)) {
      last_rate = std::max<double>(0, static_cast<double>(steps - last_steps)) /
                  absl::ToDoubleSeconds(now - last_steps_at);
      last_steps = steps;
      last_steps_at = now;
    }
    rate = last_rate;
  }
  add("ablate_points_ingested_per_second",
      "Step points stored per second, between this scrape and the previous one (0.5 s apart at "
      "least).", "gauge", {}, rate);
  if (options.operator_stats) {
    std::vector<DashboardMetric> extra = options.operator_stats();
    samples.insert(samples.end(), extra.begin(), extra.end());
  }
  std::string text;
  std::set<std::string> described;
  for (const DashboardMetric& m : samples) {
    if (described.insert(m.name).second) {
      absl::StrAppend(&text, "# HELP ", m.name, " ", m.help, "\n# TYPE ", m.name, " ", m.type,
                      "\n");
    }
    absl::StrAppend(&text, m.name);
    if (!m.labels.empty()) {
      text += "{";
      for (size_t i = 0; i < m.labels.size(); ++i) {
        absl::StrAppend(&text, i > 0 ? "," : "", m.labels[i].first, "=\"",
                        PromEscape(m.labels[i].second), "\"");
      }
      text += "}";
    }
    absl::StrAppend(&text, " ", PromNumber(m.value), "\n");
  }
  Response res;
  res.content_type = "text/plain; version=0.0.4; charset=utf-8";
  res.body = std::move(text);
  return res;
}

// ---- The live stream ----------------------------------------------------------------------------

namespace {

std::string SseEvent(absl::string_view name, const json& data) {
  return absl::StrCat("event: ", name, "\ndata: ", Dump(data), "\n\n");
}

}  // namespace

void DashboardServer::Impl::Stream(tcp::socket* socket, const Request& r) {
  boost::system::error_code ec;
  auto send = [&](absl::string_view text) {
    asio::write(*socket, asio::buffer(text.data(), text.size()), ec);
    return !ec;
  };
  auto fail = [&](int status, const std::string& message) {
    const std::string body = Dump(json{{"error", message}, {"status", status}});
    send(absl::StrCat("HTTP/1.1 ", status, status == 404 ? " Not Found" : " Bad Request",
                      "\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
                      "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body));
  };
  auto it = r.query.find("sweep");
  if (it == r.query.end() || it->second.empty()) return fail(400, "parameter 'sweep' is required");
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(it->second);
  if (!sweep.ok()) {
    return fail(sweep.status().code() == absl::StatusCode::kNotFound ? 404 : 400,
                std::string(sweep.status().message()));
  }
  const int64_t sweep_id = sweep->id;

  // Cursors: the last event id, the last spike id, and per tracked run the last step sent. The
  // client opens the stream, waits for `hello`, then loads the curves: every point after a
  // run's cursor comes on the stream, the rest with the curves (the client drops duplicates).
  int64_t last_event = 0, last_spike = 0;
  std::map<int64_t, int64_t> cursor;  // RUNNING runs (and those that just stopped)
  {
    absl::StatusOr<QueryResult> top = reader->ReadOnlyQuery(absl::StrCat(
        "SELECT (SELECT COALESCE(max(id), 0) FROM events), (SELECT COALESCE(max(id), 0) FROM "
        "spike_events)"));
    if (!top.ok()) return fail(400, std::string(top.status().message()));
    last_event = AsInt(top->rows[0][0]);
    last_spike = AsInt(top->rows[0][1]);
    RunFilter running;
    running.sweep_id = sweep_id;
    running.states = {RUNNING};
    absl::StatusOr<std::vector<RunInfo>> runs = reader->ListRuns(running);
    if (runs.ok()) {
      for (const RunInfo& run : *runs) cursor[run.id] = run.steps_done;
    }
  }
  if (!send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
            "X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 1000\n\n")) {
    return;
  }
  if (!send(SseEvent("hello", json{{"sweep", sweep->name}, {"sweep_id", sweep_id},
                                   {"time", NowSeconds()}}))) {
    return;
  }
  absl::Time last_write = absl::Now();
  SeriesOptions series;
  series.max_points = 500;  // per run per tick: a long stall is still one bounded message
  while (Sleep(options.poll_interval)) {
    std::string out;
    bool changed = false;
    // 1. The event log: state changes (run_state carries DIVERGED), sweep state, workers.
    absl::StatusOr<std::vector<EventInfo>> events = reader->Events(sweep_id, last_event, 500);
    if (events.ok()) {
      for (const EventInfo& e : *events) {
        last_event = e.id;
        out += SseEvent("event", EventJson(e));
        if (e.run_id > 0 && e.kind == "run_state") {
          absl::StatusOr<RunInfo> run = reader->GetRun(e.run_id);
          if (run.ok()) {
            out += SseEvent("run", RunJson(*run));
            if (run->state == RUNNING) cursor.emplace(run->id, 0);
          }
        }
        changed = true;
      }
    }
    // Runs that became RUNNING without an event we saw yet (the event is in the next tick).
    RunFilter running;
    running.sweep_id = sweep_id;
    running.states = {RUNNING};
    absl::StatusOr<std::vector<RunInfo>> runs = reader->ListRuns(running);
    std::set<int64_t> still_running;
    if (runs.ok()) {
      for (const RunInfo& run : *runs) {
        still_running.insert(run.id);
        cursor.emplace(run.id, 0);
      }
    }
    // 2. New points of tracked runs (a run that stopped gets one last poll, then is dropped).
    for (auto c = cursor.begin(); c != cursor.end();) {
      series.from_step = c->second + 1;
      absl::StatusOr<std::vector<StepMetrics>> m = reader->MetricSeries(c->first, series);
      if (m.ok() && !m->empty()) {
        json steps = json::array(), loss = json::array(), grad = json::array();
        for (const StepMetrics& p : *m) {
          steps.push_back(p.step());
          loss.push_back(p.loss());
          grad.push_back(p.grad_norm());
        }
        c->second = m->back().step();
        out += SseEvent("points", json{{"run", c->first}, {"step", steps}, {"loss", loss},
                                       {"grad_norm", grad}});
      }
      if (runs.ok() && still_running.count(c->first) == 0) {
        c = cursor.erase(c);
      } else {
        ++c;
      }
    }
    // 3. New spike events of the sweep.
    absl::StatusOr<QueryResult> spikes = reader->ReadOnlyQuery(absl::StrCat(
        "SELECT s.id, s.run_id, s.step, s.signal, s.value, s.baseline, s.kind, s.action, "
        "s.rollback_to_step FROM spike_events s JOIN runs r ON r.id = s.run_id WHERE s.id > ",
        last_spike, " AND r.sweep_id = ", sweep_id, " ORDER BY s.id LIMIT 500"));
    if (spikes.ok()) {
      for (const std::vector<SqlValue>& row : spikes->rows) {
        last_spike = AsInt(row[0]);
        out += SseEvent("spike", json{{"run", AsInt(row[1])},
                                      {"step", AsInt(row[2])},
                                      {"signal", AsString(row[3])},
                                      {"value", AsDouble(row[4])},
                                      {"baseline", AsDouble(row[5])},
                                      {"kind", AsString(row[6])},
                                      {"action", AsString(row[7])},
                                      {"rollback_to_step", AsInt(row[8])}});
        changed = true;
      }
    }
    // 4. The sweep's progress after any change.
    if (changed) {
      absl::StatusOr<SweepInfo> now = reader->GetSweep(absl::StrCat(sweep_id));
      if (now.ok()) out += SseEvent("sweep", SweepJson(*now, NowSeconds()));
    }
    // A comment now and then: proxies keep the connection, and a gone client is noticed.
    if (out.empty() && absl::Now() - last_write > absl::Seconds(10)) out = ": ping\n\n";
    if (!out.empty()) {
      if (!send(out)) return;
      last_write = absl::Now();
    }
  }
}

}  // namespace ablate
