// Alerts: what a researcher who is not watching the dashboard must hear about. A run DIVERGED, a
// run FAILED after its last attempt, a run's first spike, a sweep DONE or CANCELLED, each sent
// once as one JSON object to every target: webhooks (an HTTP(S) POST, which Slack and Mattermost
// incoming webhooks show as their `text`) and commands (the JSON on stdin, ABLATE_ALERT_* in the
// environment). docs/operations.md, "Alerts".
//
// How. A thread reads the store's event log (run_state and sweep_state events, with the state
// entered) and its spikes from a cursor, every poll_interval: the writes that ingest and schedule
// never wait for it, and nothing is lost while it is slow. Each alert is claimed in the store
// (alerts UNIQUE (kind, sweep, run)) in the transaction that moves the cursor (alert_cursor)
// before anything is sent: one alert per (run, kind), and a restarted coordinator neither
// sends one again nor alerts on what it had read. It is at most once: an alert claimed but not
// delivered when the coordinator died (or that every try failed) stays in the alerts table with
// its counts, and is not resent.
//
// Each target has its own sender thread and a bounded queue (queue_capacity): one target that
// hangs delays nobody else, and past the bound new alerts for it are dropped, counted
// (Stats().dropped, /metrics ablate_alerts_total{outcome="dropped"}, alerts.dropped) and logged.
// A try is bounded by `timeout`; a failed one that may succeed later (delivery.h) is tried again
// after retry_backoff, doubling, up to `attempts` tries.
//
// Started with no target, it still moves the cursor (so that alerts switched on later start
// from then, not from the start of the store) and sends nothing.
//
// Thread safety: every method is thread-safe. Stop() (and the destructor) ends the threads: the
// try in progress finishes (within `timeout`), what is still queued is counted as dropped.
#ifndef ABLATE_ORCHESTRATOR_ALERTS_ALERTER_H_
#define ABLATE_ORCHESTRATOR_ALERTS_ALERTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "orchestrator/store/store.h"

namespace ablate {

struct AlertOptions {
  std::vector<std::string> webhooks;  // http:// or https:// URLs
  std::vector<std::string> commands;  // shell commands (/bin/sh -c)
  // The dashboard's address without a credential ("http://host:port/"): the payload's `url` is
  // its run or sweep page. "" (no dashboard): no url.
  std::string dashboard_url;
  absl::Duration poll_interval = absl::Seconds(1);
  int queue_capacity = 256;                     // alerts waiting per target
  absl::Duration timeout = absl::Seconds(10);   // per try, everything included
  int attempts = 3;                             // tries per alert and target
  absl::Duration retry_backoff = absl::Seconds(1);
  std::string ca_file;  // more CAs for https webhooks (PEM); the system's are always trusted
  // A line for the operator: drops and failed deliveries. Default: stderr.
  std::function<void(const std::string&)> log;
};

// The kinds of alert, as the payload's `kind` and ABLATE_ALERT_KIND.
inline constexpr char kAlertDiverged[] = "diverged";
inline constexpr char kAlertFailed[] = "failed";
inline constexpr char kAlertSpike[] = "spike";
inline constexpr char kAlertSweepDone[] = "sweep_done";
inline constexpr char kAlertSweepCancelled[] = "sweep_cancelled";

struct AlertStats {
  int64_t claimed = 0;    // alerts found and claimed (each to every target)
  int64_t delivered = 0;  // deliveries (alert x target) that succeeded
  int64_t failed = 0;     // ... that failed every try
  int64_t dropped = 0;    // ... dropped: the target's queue was full, or the alerter stopped
  int64_t queued = 0;     // waiting or being tried now
};

class Alerter {
 public:
  // InvalidArgument naming a webhook that is not an http(s) URL or an empty command. Reads the
  // cursor (the newest event and spike when this store never had one) and starts polling.
  static absl::StatusOr<std::unique_ptr<Alerter>> Start(Store* store, AlertOptions options);
  ~Alerter();  // Stop()

  Alerter(const Alerter&) = delete;
  Alerter& operator=(const Alerter&) = delete;

  AlertStats Stats() const;
  // Where alerts go, for logs: "webhook https://host/..." (redacted), "command \"...\"".
  std::vector<std::string> targets() const;
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Alerter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The operator's alert settings in STATE_DIR/alerts.yaml, when the file exists:
//   webhooks: [URL, ...]
//   commands: [COMMAND, ...]
// added to `options`. InvalidArgument naming the file and what is wrong (not YAML, an unknown key,
// a value that is not a list of strings).
absl::Status ReadAlertsFile(const std::string& path, AlertOptions* options);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_ALERTS_ALERTER_H_
