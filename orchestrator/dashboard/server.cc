#include "orchestrator/dashboard/server.h"

#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "orchestrator/assets/assets.h"
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

Connection::Connection(tcp::socket* socket, asio::ssl::context* tls) : socket_(socket) {
  if (tls != nullptr) tls_ = std::make_unique<asio::ssl::stream<DeadlineSocket&>>(socket_, *tls);
}

std::string RawErrorResponse(int status, const std::string& message) {
  const std::string body = Dump(json{{"error", message}, {"status", status}});
  const char* reason = status == 400   ? "Bad Request"
                       : status == 404 ? "Not Found"
                       : status == 503 ? "Service Unavailable"
                                       : "Error";
  return absl::StrCat("HTTP/1.1 ", status, " ", reason,
                      "\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
                      "Content-Length: ",
                      body.size(), "\r\nConnection: close\r\n\r\n", body);
}

bool Connection::Handshake() {
  if (tls_ == nullptr) return true;
  // A TLS connection opens with a handshake record (content type 22); anything else is, in
  // practice, a browser or curl speaking plain HTTP to an https:// server.
  if (!socket_.Wait(POLLIN)) return false;
  unsigned char first = 0;
  const ssize_t n = ::recv(socket_.native_handle(), &first, 1, MSG_PEEK);
  if (n <= 0) return false;
  if (first != 22) {
    // Read what came (closing with unread data would reset the connection before the client
    // reads the answer), then answer in clear text.
    char discard[16 << 10];
    while (::recv(socket_.native_handle(), discard, sizeof(discard), MSG_DONTWAIT) > 0) {
    }
    const std::string answer = RawErrorResponse(
        400, "this dashboard serves HTTPS only: open the https:// URL ablate printed");
    error_code ec;
    asio::write(socket_, asio::buffer(answer), ec);
    return false;
  }
  error_code ec;
  tls_->handshake(asio::ssl::stream_base::server, ec);
  return !ec;
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

// Errors of the HTTP parser (a malformed request: worth a 400), as opposed to the transport's
// (closed, reset, timed out, a TLS failure: nothing to answer).
bool IsParseError(const boost::system::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_target).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

// The TLS context for `cert_file` and `key_file` (PEM), or why not.
absl::StatusOr<std::unique_ptr<asio::ssl::context>> MakeTlsContext(const std::string& cert_file,
                                                                   const std::string& key_file) {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dashboard: cannot load the TLS certificate ", cert_file, ": ", ec.message()));
  }
  ctx->use_private_key_file(key_file, asio::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dashboard: cannot load the TLS private key ", key_file, ": ", ec.message()));
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("dashboard: the TLS private key ", key_file,
                                                   " does not match the certificate ", cert_file));
  }
  return ctx;
}

std::string MimeType(absl::string_view path) {
  if (absl::EndsWith(path, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(path, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(path, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(path, ".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

}  // namespace

absl::StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(
    const DashboardOptions& options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError("dashboard: a token is required");
  }
  for (const std::string& other : options.also_accepted) {
    if (other.empty()) return absl::InvalidArgumentError("dashboard: an accepted token is empty");
  }
  if (options.max_connections <= 0 || options.max_connections_per_client <= 0 ||
      options.max_streams <= 0 || options.max_heavy_requests <= 0 ||
      options.heavy_wait < absl::ZeroDuration() || options.request_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("dashboard: connection limits and timeouts must be > 0");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("dashboard: TLS needs both a certificate and a key file");
  }
  auto impl = std::make_unique<Impl>(options);
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::unique_ptr<asio::ssl::context>> tls =
        MakeTlsContext(options.tls_cert_file, options.tls_key_file);
    if (!tls.ok()) return tls.status();
    impl->tls = *std::move(tls);
  }
  impl->credentials.push_back(DigestOf(options.token));
  for (const std::string& other : options.also_accepted) {
    impl->credentials.push_back(DigestOf(other));
  }
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

std::string DashboardBaseUrl(const std::string& host, int port, bool tls) {
  std::string shown = host == "0.0.0.0" || host == "::" ? "127.0.0.1" : host;
  if (shown.find(':') != std::string::npos) shown = absl::StrCat("[", shown, "]");
  return absl::StrCat(tls ? "https://" : "http://", shown, ":", port, "/");
}

std::string DashboardServer::Url() const {
  return absl::StrCat(DashboardBaseUrl(impl_->options.host, port_, impl_->tls != nullptr),
                      "?token=", impl_->options.token);
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
    const absl::Time accepted = absl::Now();
    const asio::ip::address client = socket->remote_endpoint(ec).address();
    if (ec) continue;  // gone already
    std::string busy;
    if (active >= options.max_connections) {
      busy = absl::StrCat("too many connections (the limit is ", options.max_connections, ")");
    } else if (auto it = per_client.find(client);
               it != per_client.end() && it->second >= options.max_connections_per_client) {
      busy = absl::StrCat("too many connections from ", client.to_string(), " (the limit is ",
                          options.max_connections_per_client, " per client)");
    }
    if (!busy.empty()) {
      // Over TLS there is no answering before a handshake, which is work this thread must not
      // wait for: the connection is just closed.
      if (tls == nullptr) {
        // A fresh socket's send buffer is empty: this small write does not block.
        asio::write(*socket, asio::buffer(dashboard::RawErrorResponse(503, busy)), ec);
        socket->shutdown(tcp::socket::shutdown_send, ec);
      }
      socket->close(ec);
      continue;
    }
    ++active;
    ++per_client[client];
    tcp::socket* raw = socket.release();
    sockets.insert(raw);
    threads.emplace_back([this, raw, client, accepted] {
      Serve(raw, accepted);
      absl::MutexLock lock(&mu);
      sockets.erase(raw);
      delete raw;
      --active;
      if (--per_client[client] == 0) per_client.erase(client);
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

void DashboardServer::Impl::Serve(tcp::socket* socket, absl::Time accepted) {
  Connection connection(socket, tls.get());
  // The first request, TLS handshake included, within request_timeout of the accept: a client
  // that connects and sends nothing, or a byte now and then, is dropped at that deadline.
  connection.set_deadline(accepted + options.request_timeout);
  beast::flat_buffer buffer;
  bool first = connection.Handshake();
  bool open = first;
  while (open) {
    boost::system::error_code ec;
    if (!first) {
      // Keep-alive: the next request's first byte within kIdleTimeout (an idle connection holds a
      // thread and a slot), then the whole request within request_timeout.
      if (buffer.size() == 0) {
        connection.set_deadline(absl::Now() + kIdleTimeout);
        const size_t n = connection.read_some(buffer.prepare(4096), ec);
        if (ec) break;
        buffer.commit(n);
      }
      connection.set_deadline(absl::Now() + options.request_timeout);
    }
    first = false;
    http::request_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(64 << 10);
    http::read(connection, buffer, parser, ec);
    if (ec && !IsParseError(ec)) break;  // closed, reset, timed out: nothing to answer
    Response res;
    bool keep_alive = false;
    bool heavy = false;  // holds a heavy place until its answer is written
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
          if (!Authorized(*r, /*query_token=*/true)) {
            res = Error(401, "not authorized: a valid token is required");
          } else if (!AcquireStream()) {
            res = Error(503, absl::StrCat("too many event streams (the limit is ",
                                          options.max_streams, ")"));
          } else {
            Stream(&connection, *r);
            absl::MutexLock lock(&mu);
            --streams;
            break;
          }
        } else if (dashboard::IsHeavy(*r) && Authorized(*r, /*query_token=*/false)) {
          heavy = AcquireHeavy();
          res = heavy ? Handle(*r)
                      : Error(503, absl::StrCat("busy: ", options.max_heavy_requests,
                                                " curves, figures or tables are being answered, "
                                                "the most at once; try again in a moment"));
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
    // Scripts, styles and data from the dashboard itself only; no other page may frame it, and
    // no Referer tells another site its URLs (the event stream's carry the token). Styles may be
    // inline: uPlot sizes its elements through style attributes.
    out.set("Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'");
    out.set("X-Frame-Options", "DENY");
    out.set("Referrer-Policy", "no-referrer");
    if (res.status == 401) out.set(http::field::www_authenticate, "Bearer");
    out.keep_alive(keep_alive);
    out.body() = std::move(res.body);
    out.prepare_payload();
    connection.set_deadline(absl::Now() + options.write_timeout);
    http::write(connection, out, ec);
    if (heavy) ReleaseHeavy();
    open = !ec && keep_alive;
  }
  // No TLS close_notify: it would wait for the client's; every response has a length, and a
  // truncated event stream is reconnected by the browser.
  boost::system::error_code ignored;
  socket->shutdown(tcp::socket::shutdown_both, ignored);
  socket->close(ignored);
}

bool DashboardServer::Impl::AcquireHeavy() {
  absl::MutexLock lock(&mu);
  const auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return stopping || heavy < options.max_heavy_requests;
  };
  if (!mu.AwaitWithTimeout(absl::Condition(&free), options.heavy_wait) || stopping) {
    ++heavy_refused;
    return false;
  }
  ++heavy;
  return true;
}

void DashboardServer::Impl::ReleaseHeavy() {
  absl::MutexLock lock(&mu);
  --heavy;
}

bool DashboardServer::Impl::AcquireStream() {
  absl::MutexLock lock(&mu);
  if (streams >= options.max_streams) return false;
  ++streams;
  return true;
}

bool DashboardServer::Impl::Authorized(const Request& r, bool query_token) const {
  constexpr absl::string_view kBearer = "Bearer ";
  bool ok = false;
  if (absl::StartsWith(r.authorization, kBearer)) {
    const CredentialDigest given = DigestOf(absl::string_view(r.authorization).substr(kBearer.size()));
    for (const CredentialDigest& credential : credentials) ok |= DigestEquals(given, credential);  // all
  }
  if (query_token) {
    auto it = r.query.find("token");
    if (it != r.query.end()) ok |= DigestEquals(DigestOf(it->second), credentials[0]);
  }
  return ok;
}

Response DashboardServer::Impl::Handle(const Request& r) {
  const std::vector<std::string>& seg = r.segments;
  const bool api = !seg.empty() && seg[0] == "api";
  if (api || r.path == "/metrics") {
    if (!Authorized(r, /*query_token=*/false)) {
      if (r.query.count("token") != 0 && r.authorization.empty()) {
        return Error(401, "not authorized: send the token as `Authorization: Bearer TOKEN` "
                          "(?token= is accepted on /api/stream only)");
      }
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
  res.body.assign(asset->text());
  res.cacheable = true;
  return res;
}

}  // namespace ablate
