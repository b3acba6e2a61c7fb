#include "orchestrator/alerts/alerter.h"

#include <yaml-cpp/yaml.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/alerts/delivery.h"
#include "orchestrator/store/reader.h"

namespace ablate {

namespace {

using json = nlohmann::json;

// Rows read per poll; the rest come with the next.
constexpr int kReadLimit = 1000;
// Without a claim, the cursor is written at most this often: a restart reads again at most this
// much of the log, whose alerts, if any, were claimed already.
constexpr absl::Duration kCursorWriteInterval = absl::Seconds(10);

struct Item {
  int64_t alert_id = 0;
  int64_t sweep_id = 0;
  std::string payload;
  std::vector<std::pair<std::string, std::string>> env;
};

// One webhook or command: its queue and the thread that empties it.
struct Target {
  std::string name;  // for logs: the redacted URL or the command's start
  bool webhook = false;
  WebhookUrl url;
  std::string command;
  absl::Mutex mu;
  absl::CondVar cv;
  std::deque<Item> queue ABSL_GUARDED_BY(mu);
  bool busy ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

// An alert found in the log, before it is claimed.
struct Found {
  std::string kind;
  int64_t sweep_id = 0, run_id = 0;
  std::string reason;       // a spike's description; the run's reason is read with it
  int64_t step = -1;        // a spike's step (-1: the run's steps_done)
};

}  // namespace

struct Alerter::Impl {
  Store* store = nullptr;
  AlertOptions options;
  std::vector<std::unique_ptr<Target>> targets;
  std::thread poller;

  absl::Mutex mu;
  absl::CondVar cv;
  bool stop ABSL_GUARDED_BY(mu) = false;

  ChangeCursor cursor;  // the poller's alone
  absl::Time cursor_written = absl::InfinitePast();
  std::atomic<int64_t> claimed{0}, delivered{0}, failed{0}, dropped{0};

  void Log(const std::string& line) const {
    if (options.log) {
      options.log(line);
    } else {
      std::cerr << line + "\n" << std::flush;
    }
  }

  void PollLoop();
  void PollOnce();
  // The payload and the command's environment of `found`; NotFound when its run or sweep is gone.
  absl::StatusOr<Item> Describe(const Found& found) const;
  void Enqueue(const Item& item);
  void SendLoop(Target* target);
  void Outcome(int64_t alert_id, AlertOutcome outcome, const std::string& error) {
    (outcome == AlertOutcome::kDelivered ? delivered
     : outcome == AlertOutcome::kFailed  ? failed
                                         : dropped)
        .fetch_add(1);
    // The row's counts are for the operator's queries; a full store queue only loses them.
    store->EnqueueAlertOutcome(alert_id, outcome, error).IgnoreError();
  }
};

Alerter::Alerter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Alerter>> Alerter::Start(Store* store, AlertOptions options) {
  if (options.queue_capacity < 1 || options.attempts < 1 ||
      options.timeout <= absl::ZeroDuration() || options.poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "alerts: queue capacity, attempts, timeout and poll interval must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  for (const std::string& url : options.webhooks) {
    absl::StatusOr<WebhookUrl> parsed = ParseWebhookUrl(url);
    if (!parsed.ok()) return parsed.status();
    auto t = std::make_unique<Target>();
    t->webhook = true;
    t->url = *parsed;
    t->name = absl::StrCat("webhook ", parsed->Redacted());
    impl->targets.push_back(std::move(t));
  }
  for (const std::string& command : options.commands) {
    if (command.find_first_not_of(" \t") == std::string::npos) {
      return absl::InvalidArgumentError("alerts: an alert command is empty");
    }
    auto t = std::make_unique<Target>();
    t->command = command;
    t->name = absl::StrCat("command \"", command.substr(0, 40), command.size() > 40 ? "...\"" : "\"");
    impl->targets.push_back(std::move(t));
  }
  impl->options = std::move(options);

  absl::StatusOr<std::optional<ChangeCursor>> stored = store->reader().AlertCursorRow();
  if (!stored.ok()) return stored.status();
  if (stored->has_value()) {
    impl->cursor = **stored;
  } else {
    absl::StatusOr<ChangeCursor> latest = store->reader().LatestCursor();
    if (!latest.ok()) return latest.status();
    impl->cursor = *latest;
    absl::StatusOr<std::vector<int64_t>> first =
        store->ClaimAlerts({impl->cursor.event_id, impl->cursor.spike_id}, {});
    if (!first.ok()) return first.status();
    impl->cursor_written = absl::Now();
  }
  Impl* raw = impl.get();
  for (auto& t : impl->targets) t->thread = std::thread([raw, t = t.get()] { raw->SendLoop(t); });
  impl->poller = std::thread([raw] { raw->PollLoop(); });
  return std::unique_ptr<Alerter>(new Alerter(std::move(impl)));
}

Alerter::~Alerter() { Stop(); }

void Alerter::Stop() {
  Impl& s = *impl_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.stop) return;
    s.stop = true;
    s.cv.SignalAll();
  }
  if (s.poller.joinable()) s.poller.join();
  for (auto& t : s.targets) {
    absl::MutexLock lock(&t->mu);
    t->stop = true;
    t->cv.SignalAll();
  }
  for (auto& t : s.targets) {
    if (t->thread.joinable()) t->thread.join();
  }
}

std::vector<std::string> Alerter::targets() const {
  std::vector<std::string> names;
  for (const auto& t : impl_->targets) names.push_back(t->name);
  return names;
}

AlertStats Alerter::Stats() const {
  AlertStats stats;
  stats.claimed = impl_->claimed.load();
  stats.delivered = impl_->delivered.load();
  stats.failed = impl_->failed.load();
  stats.dropped = impl_->dropped.load();
  for (const auto& t : impl_->targets) {
    absl::MutexLock lock(&t->mu);
    stats.queued += static_cast<int64_t>(t->queue.size()) + (t->busy ? 1 : 0);
  }
  return stats;
}

void Alerter::Impl::PollLoop() {
  for (;;) {
    PollOnce();
    absl::MutexLock lock(&mu);
    const absl::Time until = absl::Now() + options.poll_interval;
    while (!stop && absl::Now() < until) cv.WaitWithDeadline(&mu, until);
    if (stop) break;
  }
  // Where it stopped: a restart goes on from here.
  store->ClaimAlerts({cursor.event_id, cursor.spike_id}, {}).status().IgnoreError();
}

void Alerter::Impl::PollOnce() {
  const StoreReader& reader = store->reader();
  absl::StatusOr<std::vector<EventInfo>> events = reader.Events(0, cursor.event_id, kReadLimit);
  absl::StatusOr<std::vector<SweepSpike>> spikes = reader.SpikesSince(cursor.spike_id, kReadLimit);
  if (!events.ok() || !spikes.ok()) {
    Log(absl::StrCat("alerts: reading the event log: ",
                     (events.ok() ? spikes.status() : events.status()).message()));
    return;
  }
  ChangeCursor next = cursor;
  std::vector<Found> found;
  std::set<std::tuple<std::string, int64_t, int64_t>> seen;
  auto add = [&](Found f) {
    if (seen.insert({f.kind, f.sweep_id, f.run_id}).second) found.push_back(std::move(f));
  };
  for (const EventInfo& e : *events) {
    next.event_id = e.id;
    if (e.kind == "run_state" && e.run_id != 0 && (e.state == "DIVERGED" || e.state == "FAILED")) {
      add({e.state == "DIVERGED" ? kAlertDiverged : kAlertFailed, e.sweep_id, e.run_id, "", -1});
    } else if (e.kind == "sweep_state" && (e.state == "DONE" || e.state == "CANCELLED")) {
      add({e.state == "DONE" ? kAlertSweepDone : kAlertSweepCancelled, e.sweep_id, 0, "", -1});
    }
  }
  for (const SweepSpike& s : *spikes) {
    next.spike_id = s.id;
    // The divergence detector's event ends the run DIVERGED: that alert says it.
    if (s.event.kind() == SPIKE_DIVERGENCE) continue;
    const SpikeEvent& e = s.event;
    add({kAlertSpike, 0, s.run_id,
         fmt::format("{} {:.4g} against {:.4g} ({}, {})", e.signal(), e.value(), e.baseline(),
                     SpikeKind_Name(e.kind()), SpikeAction_Name(e.action())),
         e.step()});
  }
  if (next.event_id == cursor.event_id && next.spike_id == cursor.spike_id) return;

  std::vector<AlertClaim> claims;
  std::vector<Item> items;
  if (!targets.empty()) {
    for (const Found& f : found) {
      absl::StatusOr<Item> item = Describe(f);
      if (!item.ok()) continue;  // deleted meanwhile: nothing to say
      AlertClaim claim;
      claim.kind = f.kind;
      claim.run_id = f.run_id;
      claim.sweep_id = item->sweep_id;
      claim.payload = item->payload;
      claim.targets = static_cast<int>(targets.size());
      claims.push_back(std::move(claim));
      items.push_back(*std::move(item));
    }
  }
  if (claims.empty() && absl::Now() - cursor_written < kCursorWriteInterval) {
    cursor = next;  // written later, or at Stop
    return;
  }
  absl::StatusOr<std::vector<int64_t>> ids =
      store->ClaimAlerts({next.event_id, next.spike_id}, claims);
  if (!ids.ok()) {
    Log(absl::StrCat("alerts: claiming ", claims.size(), " alert(s): ", ids.status().message(),
                     " (tried again at the next poll)"));
    return;
  }
  cursor = next;
  cursor_written = absl::Now();
  for (size_t i = 0; i < ids->size(); ++i) {
    if ((*ids)[i] == 0) continue;  // claimed before: sent (or tried) already
    ++claimed;
    items[i].alert_id = (*ids)[i];
    Enqueue(items[i]);
  }
}

absl::StatusOr<Item> Alerter::Impl::Describe(const Found& f) const {
  const StoreReader& reader = store->reader();
  json payload;
  payload["kind"] = f.kind;
  std::string text, page;
  if (f.run_id != 0) {
    absl::StatusOr<RunInfo> run = reader.GetRun(f.run_id);
    if (!run.ok()) return run.status();
    const int64_t step = f.step >= 0 ? f.step : run->steps_done;
    payload["sweep"] = run->sweep;
    payload["sweep_id"] = run->sweep_id;
    payload["run_id"] = run->id;
    payload["variant"] = run->variant;
    payload["seed"] = run->seed;
    payload["step"] = step;
    const std::string who =
        fmt::format("run {} ({} / {}, seed {})", run->id, run->sweep, run->variant, run->seed);
    if (f.kind == kAlertSpike) {
      text = fmt::format("ablate: {} spiked at step {}: {}", who, step, f.reason);
    } else {
      text = fmt::format("ablate: {} {} at step {} of {}{}{}", who,
                         f.kind == kAlertDiverged ? "DIVERGED" : "FAILED", step,
                         run->steps_total, run->reason.empty() ? "" : ": ", run->reason);
    }
    page = absl::StrCat("#/run/", run->id);
  } else {
    absl::StatusOr<SweepInfo> sweep = reader.GetSweepById(f.sweep_id);
    if (!sweep.ok()) return sweep.status();
    payload["sweep"] = sweep->name;
    payload["sweep_id"] = sweep->id;
    payload["run_id"] = nullptr;
    payload["variant"] = nullptr;
    payload["seed"] = nullptr;
    payload["step"] = nullptr;
    text = fmt::format(
        "ablate: sweep {} is {}: {} runs, {} succeeded, {} diverged, {} failed, {} cancelled",
        sweep->name, f.kind == kAlertSweepDone ? "DONE" : "CANCELLED", sweep->runs,
        sweep->succeeded, sweep->diverged, sweep->failed, sweep->cancelled);
    page = absl::StrCat("#/sweep/", sweep->name);
  }
  // Slack's and Mattermost's incoming webhooks show `text` as is: one line, bounded.
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (text.size() > 1000) text = text.substr(0, 997) + "...";
  payload["text"] = text;
  payload["url"] = options.dashboard_url.empty() ? json(nullptr)
                                                  : json(options.dashboard_url + page);
  payload["time"] = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());

  Item item;
  item.sweep_id = payload["sweep_id"].get<int64_t>();
  item.payload = payload.dump(-1, ' ', false, json::error_handler_t::replace);
  auto field = [&](const char* key) -> std::string {
    const json& v = payload[key];
    return v.is_null() ? "" : v.is_string() ? v.get<std::string>() : v.dump();
  };
  item.env = {{"ABLATE_ALERT_KIND", f.kind},
              {"ABLATE_ALERT_SWEEP", field("sweep")},
              {"ABLATE_ALERT_RUN_ID", field("run_id")},
              {"ABLATE_ALERT_VARIANT", field("variant")},
              {"ABLATE_ALERT_SEED", field("seed")},
              {"ABLATE_ALERT_STEP", field("step")},
              {"ABLATE_ALERT_TEXT", text},
              {"ABLATE_ALERT_URL", field("url")}};
  return item;
}

void Alerter::Impl::Enqueue(const Item& item) {
  for (auto& t : targets) {
    bool full = false;
    {
      absl::MutexLock lock(&t->mu);
      full = static_cast<int>(t->queue.size()) >= options.queue_capacity;
      if (!full) {
        t->queue.push_back(item);
        t->cv.Signal();
      }
    }
    if (full) {
      const std::string why =
          absl::StrCat(t->name, ": ", options.queue_capacity, " alerts queued already");
      Log(absl::StrCat("alerts: dropped alert ", item.alert_id, " for ", why));
      Outcome(item.alert_id, AlertOutcome::kDropped, why);
    }
  }
}

void Alerter::Impl::SendLoop(Target* t) {
  for (;;) {
    Item item;
    {
      absl::MutexLock lock(&t->mu);
      t->busy = false;
      while (!t->stop && t->queue.empty()) t->cv.Wait(&t->mu);
      if (t->stop) break;
      item = std::move(t->queue.front());
      t->queue.pop_front();
      t->busy = true;
    }
    absl::Duration backoff = options.retry_backoff;
    DeliveryResult result;
    for (int attempt = 1;; ++attempt) {
      result = t->webhook ? PostWebhook(t->url, item.payload, options.timeout, options.ca_file)
                          : RunAlertCommand(t->command, item.payload, item.env, options.timeout);
      if (result.status.ok() || !result.retry || attempt >= options.attempts) break;
      absl::MutexLock lock(&t->mu);
      const absl::Time until = absl::Now() + backoff;
      while (!t->stop && absl::Now() < until) t->cv.WaitWithDeadline(&t->mu, until);
      if (t->stop) break;
      backoff *= 2;
    }
    if (result.status.ok()) {
      Outcome(item.alert_id, AlertOutcome::kDelivered, "");
    } else {
      Log(absl::StrCat("alerts: alert ", item.alert_id, " not delivered: ",
                       result.status.message()));
      Outcome(item.alert_id, AlertOutcome::kFailed, std::string(result.status.message()));
    }
  }
  // Stopped: what is left is not sent.
  absl::MutexLock lock(&t->mu);
  t->busy = false;
  for (const Item& item : t->queue) {
    Outcome(item.alert_id, AlertOutcome::kDropped, "the coordinator stopped first");
  }
  if (!t->queue.empty()) {
    Log(absl::StrCat("alerts: ", t->queue.size(), " alert(s) for ", t->name,
                     " not sent: the coordinator stopped"));
  }
  t->queue.clear();
}

absl::Status ReadAlertsFile(const std::string& path, AlertOptions* options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::OkStatus();
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a map with `webhooks:` and/or `commands:`"));
  }
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>("");
    std::vector<std::string>* into = key == "webhooks"   ? &options->webhooks
                                     : key == "commands" ? &options->commands
                                                         : nullptr;
    if (into == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": unknown key \"", key.substr(0, 40), "\" (expected webhooks, commands)"));
    }
    const YAML::Node& list = entry.second;
    if (list.IsNull()) continue;
    if (!list.IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": expected a list"));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", key, "[", i, "]: expected a string"));
      }
      into->push_back(list[i].as<std::string>());
    }
  }
  return absl::OkStatus();
}

}  // namespace ablate
