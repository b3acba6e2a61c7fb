// How one alert reaches one target: a webhook (an HTTP or HTTPS POST of the JSON payload) or a
// command (run by /bin/sh with the payload on stdin and ABLATE_ALERT_* in its environment). Each
// try is bounded by a timeout: a receiver that hangs costs its sender at most that.
#ifndef ABLATE_ORCHESTRATOR_ALERTS_DELIVERY_H_
#define ABLATE_ORCHESTRATOR_ALERTS_DELIVERY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ablate {

// A webhook URL, taken apart: http://HOST[:PORT]/PATH or https://..., HOST a name, an IPv4
// address or a bracketed IPv6 one.
struct WebhookUrl {
  bool tls = false;
  std::string host;    // without brackets
  int port = 0;        // 80 / 443 when the URL has none
  std::string target;  // path and query, "/" at least
  // For logs and errors: scheme://host[:port]/... without the path, which for Slack, Mattermost
  // and Discord is the secret.
  std::string Redacted() const;
};

// InvalidArgument naming the URL's problem (scheme, host, port) when it is not one.
absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url);

// How a try ended: OK, or why not and whether another try may do better: a timeout, a connection
// refused or reset, HTTP 408, 429 or 5xx, a command's non-zero exit may; any other HTTP status
// (a wrong URL, a revoked hook) will not.
struct DeliveryResult {
  absl::Status status;
  bool retry = false;
};

// POSTs `body` (Content-Type: application/json) to `url`, all of it (connect, TLS handshake,
// request, response) within `timeout`. OK for a 2xx answer. HTTPS verifies the server's
// certificate against the system's CAs (and `ca_file` when not empty) and its name.
DeliveryResult PostWebhook(const WebhookUrl& url, const std::string& body, absl::Duration timeout,
                           const std::string& ca_file = "");

// Runs `/bin/sh -c command` in a process group of its own with `body` on stdin, this process's
// environment plus `env`, and the default signal mask; killed (the whole group) when it has not
// exited within `timeout`. OK for exit status 0; another status is retried.
DeliveryResult RunAlertCommand(const std::string& command, const std::string& body,
                               const std::vector<std::pair<std::string, std::string>>& env,
                               absl::Duration timeout);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_ALERTS_DELIVERY_H_
