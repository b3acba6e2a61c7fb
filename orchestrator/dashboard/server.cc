#include "orchestrator/dashboard/server.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "orchestrator/dashboard/assets.h"
#include "orchestrator/dashboard/internal.h"

namespace ablate {
namespace dashboard {

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

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// 7 significant digits: what a chart can show, and half the JSON of a double's 17.
double Significant7(double v) {
  if (!std::isfinite(v) || v == 0) return v;
  const double scale = std::pow(10.0, 6 - std::floor(std::log10(std::fabs(v))));
  return std::isfinite(scale) && scale > 0 ? std::round(v * scale) / scale : v;
}

}  // namespace dashboard

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;

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

}  // namespace

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

}  // namespace ablate
