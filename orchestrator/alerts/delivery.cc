#include "orchestrator/alerts/delivery.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "orchestrator/net/deadline_socket.h"

extern char** environ;

namespace ablate {

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

// What a receiver may answer, at most: a webhook's answer is "ok" or a short error.
constexpr uint64_t kMaxAnswerBytes = 64 << 10;

// The request and its answer over `stream` (plain or TLS), before the stream's deadline.
template <class Stream>
DeliveryResult Exchange(Stream& stream, const http::request<http::string_body>& request,
                        const std::string& where) {
  error_code ec;
  http::write(stream, request, ec);
  if (ec) {
    return {absl::UnavailableError(absl::StrCat(where, ": sending: ", ec.message())), true};
  }
  boost::beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxAnswerBytes);
  http::read(stream, buffer, parser, ec);
  if (ec) {
    const bool late = ec == asio::error::timed_out;
    return {late ? absl::DeadlineExceededError(absl::StrCat(where, ": no answer in time"))
                 : absl::UnavailableError(absl::StrCat(where, ": reading: ", ec.message())),
            true};
  }
  const unsigned status = parser.get().result_int();
  if (status >= 200 && status < 300) return {absl::OkStatus(), false};
  std::string answer = parser.get().body().substr(0, 200);
  absl::StrReplaceAll({{"\n", " "}, {"\r", " "}}, &answer);
  return {absl::UnavailableError(absl::StrCat(where, ": HTTP ", status,
                                              answer.empty() ? "" : ": ", answer)),
          status == 408 || status == 429 || status >= 500};
}

}  // namespace

std::string WebhookUrl::Redacted() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return absl::StrCat(tls ? "https://" : "http://", ipv6 ? "[" : "", host, ipv6 ? "]" : "",
                      port == (tls ? 443 : 80) ? "" : absl::StrCat(":", port), "/...");
}

absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url) {
  WebhookUrl out;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    out.tls = true;
  } else if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("webhook \"", url.substr(0, 80), "\": expected an http:// or https:// URL"));
  }
  const size_t slash = rest.find_first_of("/?");
  absl::string_view authority = rest.substr(0, slash);
  out.target = slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (out.target[0] == '?') out.target = absl::StrCat("/", out.target);
  if (absl::StrContains(authority, '@')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "webhook ", out.tls ? "https" : "http", "://...: credentials in the URL (user@host) are "
        "not supported; put the secret in the path, as Slack and Mattermost do"));
  }
  absl::string_view port_text;
  if (absl::ConsumePrefix(&authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("webhook \"", url.substr(0, 80), "\": unclosed [ in the host"));
    }
    out.host = std::string(authority.substr(0, close));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) {
      return absl::InvalidArgumentError(
          absl::StrCat("webhook \"", url.substr(0, 80), "\": expected :PORT after ]"));
    }
    port_text = after;
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (out.host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("webhook \"", url.substr(0, 80), "\": no host"));
  }
  out.port = out.tls ? 443 : 80;
  if (!port_text.empty() && (!absl::SimpleAtoi(port_text, &out.port) || out.port < 1 ||
                             out.port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("webhook ", out.Redacted(), ": port \"",
                                                   port_text, "\" is not 1 to 65535"));
  }
  return out;
}

DeliveryResult PostWebhook(const WebhookUrl& url, const std::string& body, absl::Duration timeout,
                           const std::string& ca_file) {
  const std::string where = absl::StrCat("webhook ", url.Redacted());
  const absl::Time deadline = absl::Now() + timeout;
  asio::io_context io;
  tcp::socket socket(io);
  if (absl::Status s = ConnectBefore(&socket, url.host, url.port, deadline); !s.ok()) {
    return {absl::Status(s.code(), absl::StrCat(where, ": ", s.message())), true};
  }
  DeadlineSocket timed(&socket);
  timed.set_deadline(deadline);

  http::request<http::string_body> request{http::verb::post, url.target, 11};
  const bool default_port = url.port == (url.tls ? 443 : 80);
  const bool ipv6 = url.host.find(':') != std::string::npos;
  request.set(http::field::host,
              absl::StrCat(ipv6 ? "[" : "", url.host, ipv6 ? "]" : "",
                           default_port ? "" : absl::StrCat(":", url.port)));
  request.set(http::field::user_agent, "ablate-alerts");
  request.set(http::field::content_type, "application/json");
  request.set(http::field::connection, "close");
  request.body() = body;
  request.prepare_payload();
  if (!url.tls) return Exchange(timed, request, where);

  asio::ssl::context context(asio::ssl::context::tls_client);
  error_code ec;
  context.set_default_verify_paths(ec);
  if (!ca_file.empty()) context.load_verify_file(ca_file, ec);
  if (ec) return {absl::FailedPreconditionError(absl::StrCat(where, ": CAs: ", ec.message())),
                  false};
  asio::ssl::stream<DeadlineSocket&> tls(timed, context);
  tls.set_verify_mode(asio::ssl::verify_peer);
  tls.set_verify_callback(asio::ssl::host_name_verification(url.host));
  SSL_set_tlsext_host_name(tls.native_handle(), url.host.c_str());
  tls.handshake(asio::ssl::stream_base::client, ec);
  if (ec) {
    return {absl::UnavailableError(absl::StrCat(where, ": TLS handshake: ", ec.message())), true};
  }
  return Exchange(tls, request, where);
}

DeliveryResult RunAlertCommand(const std::string& command, const std::string& body,
                               const std::vector<std::pair<std::string, std::string>>& env,
                               absl::Duration timeout) {
  const std::string where = absl::StrCat("command \"", command.substr(0, 60),
                                         command.size() > 60 ? "...\"" : "\"");
  // Its stdin is one end of a socket pair, not a pipe: a command that exits without reading
  // makes the send fail with EPIPE (MSG_NOSIGNAL) instead of raising SIGPIPE in the coordinator.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return {absl::InternalError(absl::StrCat(where, ": socketpair: ", std::strerror(errno))),
            true};
  }
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "ABLATE_ALERT_")) environment.emplace_back(*e);
  }
  for (const auto& [name, value] : env) environment.push_back(absl::StrCat(name, "=", value));
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", text = command;
  char* argv[] = {sh.data(), dash_c.data(), text.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDIN_FILENO);  // dup2 drops CLOEXEC
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attributes, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    return {absl::InternalError(absl::StrCat(where, ": cannot start /bin/sh: ",
                                             std::strerror(spawned))),
            false};
  }
  // The payload is a few kB, less than the socket's buffer: the send does not wait for a
  // command that never reads.
  ::send(fds[0], body.data(), body.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fds[0], SHUT_WR);

  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      ::close(fds[0]);
      return {absl::InternalError(absl::StrCat(where, ": its exit status was lost: ",
                                               std::strerror(errno))),
              false};
    }
    if (absl::Now() >= deadline) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      ::close(fds[0]);
      return {absl::DeadlineExceededError(absl::StrCat(
                  where, ": still running after ", absl::FormatDuration(timeout), "; killed")),
              true};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(fds[0]);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {absl::OkStatus(), false};
  const std::string how = WIFEXITED(status)
                              ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                              : absl::StrCat("killed by signal ", WTERMSIG(status));
  return {absl::UnavailableError(absl::StrCat(where, ": ", how)), true};
}

}  // namespace ablate
