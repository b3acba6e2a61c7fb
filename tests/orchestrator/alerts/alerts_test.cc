// The alerter (orchestrator/alerts) over a real SQLite store, against receivers on loopback: each
// kind of alert once, nothing twice after a restart, a command's stdin and environment, retries,
// a receiver that hangs, and the errors of bad targets and alert files.
#include "orchestrator/alerts/alerter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "orchestrator/alerts/delivery.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// An HTTP receiver on 127.0.0.1: records each POST's body and answers with the next status of
// `statuses` (the last one repeats), or never answers (`hang`).
class Receiver {
 public:
  explicit Receiver(std::vector<int> statuses = {200}, bool hang = false)
      : statuses_(std::move(statuses)), hang_(hang) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t size = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    ::listen(fd_, 64);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Receiver() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    Release();
  }

  // Closes the connections held so far (their senders see the end of the stream) and answers
  // from now on.
  void Release() {
    absl::MutexLock lock(&mu_);
    hang_ = false;
    for (int c : held_) ::close(c);
    held_.clear();
  }

  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_, "/hooks/secret"); }
  int connections() {
    absl::MutexLock lock(&mu_);
    return connections_;
  }
  std::vector<json> bodies() {
    absl::MutexLock lock(&mu_);
    return bodies_;
  }
  // Waits up to 20 s for `n` bodies.
  std::vector<json> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return bodies_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20));
    return bodies_;
  }

 private:
  void Serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      {
        absl::MutexLock lock(&mu_);
        ++connections_;
      }
      {
        absl::MutexLock lock(&mu_);
        if (hang_) {  // read nothing, answer nothing, keep it open
          held_.push_back(c);
          continue;
        }
      }
      std::string request;
      char buffer[4096];
      size_t body_at = std::string::npos, length = 0;
      while (body_at == std::string::npos || request.size() < body_at + length) {
        const ssize_t n = ::recv(c, buffer, sizeof(buffer), 0);
        if (n <= 0) break;
        request.append(buffer, n);
        if (body_at == std::string::npos &&
            (body_at = request.find("\r\n\r\n")) != std::string::npos) {
          body_at += 4;
          const size_t at = request.find("Content-Length: ");
          const size_t end = request.find("\r\n", at);
          absl::SimpleAtoi(request.substr(at + 16, end - at - 16), &length);
        }
      }
      int status = 200;
      {
        absl::MutexLock lock(&mu_);
        status = statuses_[std::min(answered_++, statuses_.size() - 1)];
        if (status == 200) bodies_.push_back(json::parse(request.substr(body_at)));
      }
      const std::string answer = absl::StrCat(
          "HTTP/1.1 ", status, " X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
      ::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }

  std::vector<int> statuses_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  bool hang_ ABSL_GUARDED_BY(mu_);
  std::vector<int> held_ ABSL_GUARDED_BY(mu_);
  size_t answered_ ABSL_GUARDED_BY(mu_) = 0;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<json> bodies_ ABSL_GUARDED_BY(mu_);
};

class AlertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("alerts_test").string();
    Reopen();
    worker_ = *store_->RegisterWorker("w", "{}");
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Reopen() {
    store_.reset();
    StoreOptions options;
    options.path = dir_ + "/ablate.db";
    options.synchronous_full = false;
    store_ = *Store::Open(options);
  }

  // Fast polls and retries, the log kept for Log(), delivered to `webhooks`.
  AlertOptions Options(std::vector<std::string> webhooks = {}) {
    AlertOptions o;
    o.webhooks = std::move(webhooks);
    o.poll_interval = absl::Milliseconds(20);
    o.retry_backoff = absl::Milliseconds(20);
    o.timeout = absl::Seconds(5);
    o.dashboard_url = "http://127.0.0.1:8080/";
    o.log = [this](const std::string& line) {
      absl::MutexLock lock(&log_mu_);
      log_ += line + "\n";
    };
    return o;
  }
  std::string Log() {
    absl::MutexLock lock(&log_mu_);
    return log_;
  }

  void Start(int64_t run) {
    RunTransition t = testing::MakeTransition(run, {PENDING}, RUNNING);
    t.worker_id = worker_;
    ASSERT_TRUE(store_->TransitionRun(t).ok());
  }
  void End(int64_t run, RunState to, const std::string& reason = "") {
    RunTransition t = testing::MakeTransition(run, {RUNNING}, to);
    t.reason = reason;
    ASSERT_TRUE(store_->TransitionRun(t).ok());
  }
  void Spike(int64_t run, int64_t step) {
    MetricBatch batch;
    batch.run_id = run;
    batch.attempt = 1;
    batch.seq = step;
    SpikeEvent spike;
    spike.set_step(step);
    spike.set_signal("loss");
    spike.set_value(9.5);
    spike.set_baseline(3.25);
    spike.set_kind(SPIKE_STATISTICAL);
    spike.set_action(SPIKE_ACTION_SKIPPED);
    batch.spikes.push_back(spike);
    ASSERT_TRUE(store_->ReportMetrics(batch).ok());
  }
  int64_t Count(const std::string& sql) {
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->rows.size() != 1) return -1;
    return std::get<int64_t>(r->rows[0][0]);
  }
  // The trained sweep "s" of 2 variants x 2 seeds: run 1 DIVERGED, run 2 FAILED, run 3 spiked
  // twice and SUCCEEDED, run 4 SUCCEEDED: the sweep DONE. Then sweep "c" cancelled.
  void TrainAndCancel() {
    SweepIds s = *store_->CreateSweep(testing::MakeSweep("s", {"baseline", "gated"}, 2, 100));
    runs_ = s.run_ids;
    for (int64_t r : runs_) Start(r);
    Spike(runs_[2], 40);
    Spike(runs_[2], 41);
    End(runs_[0], DIVERGED, "loss non-finite for 3 steps");
    End(runs_[1], FAILED, "out of memory");
    End(runs_[2], SUCCEEDED);
    End(runs_[3], SUCCEEDED);
    SweepIds c = *store_->CreateSweep(testing::MakeSweep("c", {"baseline"}, 1, 100));
    ASSERT_TRUE(store_->CancelSweep(c.sweep_id).ok());
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  int64_t worker_ = 0;
  std::vector<int64_t> runs_;
  absl::Mutex log_mu_;
  std::string log_;
};

std::map<std::string, json> ByKind(const std::vector<json>& bodies) {
  std::map<std::string, json> out;
  for (const json& b : bodies) out[b["kind"]] = b;
  return out;
}

TEST_F(AlertsTest, EachKindReachesTheWebhookOnceWithItsPayload) {
  Receiver receiver;
  AlertOptions o = Options({receiver.url()});
  std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
  TrainAndCancel();
  const std::vector<json> bodies = receiver.WaitFor(5);
  ASSERT_EQ(bodies.size(), 5u);
  std::map<std::string, json> by = ByKind(bodies);
  ASSERT_EQ(by.size(), 5u);  // one of each kind: the second spike of run 3 sent nothing

  const json& diverged = by["diverged"];
  EXPECT_EQ(diverged["sweep"], "s");
  EXPECT_EQ(diverged["run_id"], runs_[0]);
  EXPECT_EQ(diverged["variant"], "baseline");
  EXPECT_EQ(diverged["seed"], 0);
  EXPECT_EQ(diverged["step"], 0);
  EXPECT_EQ(diverged["url"], absl::StrCat("http://127.0.0.1:8080/#/run/", runs_[0]));
  EXPECT_THAT(diverged["text"].get<std::string>(),
              HasSubstr("DIVERGED at step 0 of 100: loss non-finite for 3 steps"));
  EXPECT_THAT(by["failed"]["text"].get<std::string>(), HasSubstr("FAILED"));
  EXPECT_EQ(by["failed"]["run_id"], runs_[1]);
  EXPECT_EQ(by["spike"]["run_id"], runs_[2]);
  EXPECT_EQ(by["spike"]["step"], 40);
  EXPECT_THAT(by["spike"]["text"].get<std::string>(),
              HasSubstr("spiked at step 40: loss 9.5 against 3.25 (SPIKE_STATISTICAL"));
  EXPECT_EQ(by["sweep_done"]["sweep"], "s");
  EXPECT_TRUE(by["sweep_done"]["run_id"].is_null());
  EXPECT_THAT(by["sweep_done"]["text"].get<std::string>(),
              HasSubstr("sweep s is DONE: 4 runs, 2 succeeded, 1 diverged, 1 failed"));
  EXPECT_EQ(by["sweep_done"]["url"], "http://127.0.0.1:8080/#/sweep/s");
  EXPECT_EQ(by["sweep_cancelled"]["sweep"], "c");
  for (const json& b : bodies) EXPECT_THAT(b["url"].get<std::string>(), Not(HasSubstr("token")));

  alerter->Stop();
  EXPECT_EQ(alerter->Stats().delivered, 5);
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM alerts WHERE delivered = 1 AND targets = 1"), 5);
}

TEST_F(AlertsTest, ARestartedAlerterSendsNothingTwiceAndGoesOn) {
  Receiver receiver;
  AlertOptions o = Options({receiver.url()});
  {
    std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
    TrainAndCancel();
    ASSERT_EQ(receiver.WaitFor(5).size(), 5u);
  }
  // The coordinator restarts: the same store file, a new alerter. A rerun run that diverges
  // again is the same (run, kind): not sent again. A new sweep's divergence is.
  Reopen();
  std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
  ASSERT_TRUE(store_->TransitionRun(testing::MakeTransition(runs_[0], {DIVERGED}, PENDING)).ok());
  Start(runs_[0]);
  End(runs_[0], DIVERGED, "again");
  SweepIds t = *store_->CreateSweep(testing::MakeSweep("t", {"baseline"}, 1, 100));
  Start(t.run_ids[0]);
  End(t.run_ids[0], DIVERGED, "new");
  const std::vector<json> bodies = receiver.WaitFor(7);
  ASSERT_EQ(bodies.size(), 7u);
  EXPECT_EQ(bodies[5]["sweep"], "t");
  EXPECT_EQ(bodies[5]["kind"], "diverged");
  EXPECT_EQ(bodies[6]["sweep"], "t");
  EXPECT_EQ(bodies[6]["kind"], "sweep_done");
  // ... and nothing else comes: not s's DONE again after its rerun either.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(receiver.bodies().size(), 7u);
  EXPECT_EQ(alerter->Stats().claimed, 2);
}

TEST_F(AlertsTest, ACommandGetsThePayloadOnStdinAndTheFieldsInItsEnvironment) {
  AlertOptions o = Options();
  o.commands = {absl::StrCat("cat > ", dir_,
                             "/$ABLATE_ALERT_KIND.json; env | grep ^ABLATE_ALERT_ | sort > ", dir_,
                             "/$ABLATE_ALERT_KIND.env")};
  std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
  SweepIds s = *store_->CreateSweep(testing::MakeSweep("s", {"baseline", "gated"}, 1, 100));
  Start(s.run_ids[1]);
  End(s.run_ids[1], DIVERGED, "nan");
  for (int i = 0; i < 1000 && alerter->Stats().delivered < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(alerter->Stats().delivered, 1) << Log();
  std::ifstream in(dir_ + "/diverged.json");
  const json payload = json::parse(in);
  EXPECT_EQ(payload["run_id"], s.run_ids[1]);
  EXPECT_EQ(payload["variant"], "gated");
  std::stringstream env;
  env << std::ifstream(dir_ + "/diverged.env").rdbuf();
  EXPECT_THAT(env.str(), HasSubstr("ABLATE_ALERT_KIND=diverged\n"));
  EXPECT_THAT(env.str(), HasSubstr(absl::StrCat("ABLATE_ALERT_RUN_ID=", s.run_ids[1], "\n")));
  EXPECT_THAT(env.str(), HasSubstr("ABLATE_ALERT_SWEEP=s\n"));
  EXPECT_THAT(env.str(), HasSubstr("ABLATE_ALERT_VARIANT=gated\n"));
  EXPECT_THAT(env.str(), HasSubstr("ABLATE_ALERT_SEED=0\n"));
  EXPECT_THAT(env.str(), HasSubstr(absl::StrCat("ABLATE_ALERT_URL=http://127.0.0.1:8080/#/run/",
                                                s.run_ids[1], "\n")));
  EXPECT_THAT(env.str(), HasSubstr("ABLATE_ALERT_TEXT=ablate: run "));
}

TEST_F(AlertsTest, FailedTriesAreRetriedAndCountedWhenTheyAllFail) {
  Receiver flaky({503, 200});  // one 503, then fine
  Receiver gone({404});        // a wrong URL: not retried
  AlertOptions o = Options({flaky.url(), gone.url()});
  o.commands = {"exit 3"};
  o.attempts = 3;
  std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
  SweepIds s = *store_->CreateSweep(testing::MakeSweep("s", {"baseline"}, 1, 100));
  Start(s.run_ids[0]);
  End(s.run_ids[0], FAILED, "boom");
  ASSERT_EQ(flaky.WaitFor(2).size(), 2u);  // the failure and the sweep's end
  for (int i = 0; i < 1000 && alerter->Stats().queued > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  alerter->Stop();
  const AlertStats stats = alerter->Stats();
  EXPECT_EQ(stats.claimed, 2);
  EXPECT_EQ(stats.delivered, 2);  // flaky's, after a retry each... of which the first
  EXPECT_EQ(stats.failed, 4);     // gone's 2 (one try each) and the command's 2 (three each)
  EXPECT_EQ(gone.connections(), 2);
  EXPECT_EQ(flaky.connections(), 3);
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM alerts WHERE targets = 3 AND delivered = 1 AND "
                  "failed = 2 AND last_error != ''"),
            2);
  EXPECT_THAT(Log(), HasSubstr("HTTP 404"));
  EXPECT_THAT(Log(), HasSubstr("exited with status 3"));
  EXPECT_THAT(Log(), Not(HasSubstr("secret")));  // webhook paths are secrets: never logged
}

TEST_F(AlertsTest, AReceiverThatHangsDelaysNoOtherTargetAndItsQueueStaysBounded) {
  Receiver hanging({200}, /*hang=*/true);
  Receiver fine;
  AlertOptions o = Options({hanging.url(), fine.url()});
  o.timeout = absl::Seconds(60);  // the hang ends when the test releases it
  o.attempts = 1;
  o.queue_capacity = 3;
  std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
  // Six divergences and the sweep's end, one after the other: each reaches the target that
  // answers while the hanging one holds its first. The store's writes never wait for either.
  SweepIds s = *store_->CreateSweep(testing::MakeSweep("s", {"a", "b", "c"}, 2, 100));
  for (int64_t r : s.run_ids) Start(r);
  for (size_t i = 0; i < s.run_ids.size(); ++i) {
    End(s.run_ids[i], DIVERGED, "nan");
    // The last run's end also ends the sweep: its alert may already be there (i + 2).
    ASSERT_GE(fine.WaitFor(i + 1).size(), i + 1) << Log();
  }
  ASSERT_EQ(fine.WaitFor(7).size(), 7u) << Log();
  EXPECT_EQ(hanging.connections(), 1);
  // (The answer is read after the receiver has the body: the count follows a moment later.)
  for (int i = 0; i < 1000 && alerter->Stats().delivered < 7; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  // The hanging target: one being tried, three queued (its bound), three dropped and logged.
  AlertStats stats = alerter->Stats();
  EXPECT_EQ(stats.claimed, 7);
  EXPECT_EQ(stats.delivered, 7);
  EXPECT_EQ(stats.dropped, 3);
  EXPECT_EQ(stats.queued, 4);
  EXPECT_THAT(Log(), HasSubstr("3 alerts queued already"));
  // It closes the connection: that try fails (attempts 1), the queued three go through.
  hanging.Release();
  ASSERT_EQ(hanging.WaitFor(3).size(), 3u) << Log();
  for (int i = 0; i < 1000 && alerter->Stats().queued > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  stats = alerter->Stats();
  EXPECT_EQ(stats.delivered, 10);
  EXPECT_EQ(stats.failed, 1);
  EXPECT_EQ(stats.dropped, 3);
  alerter->Stop();
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT sum(delivered) * 100 + sum(failed) * 10 + sum(dropped) FROM alerts"),
            1013);
}

TEST_F(AlertsTest, AlertsSwitchedOnLaterStartFromThenAndWithoutTargetsNothingIsClaimed) {
  {
    std::unique_ptr<Alerter> quiet = *Alerter::Start(store_.get(), Options());
    EXPECT_TRUE(quiet->targets().empty());
    TrainAndCancel();
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM alerts"), 0);
  Receiver receiver;
  AlertOptions o = Options({receiver.url()});
  std::unique_ptr<Alerter> alerter = *Alerter::Start(store_.get(), o);
  SweepIds t = *store_->CreateSweep(testing::MakeSweep("t", {"baseline"}, 1, 100));
  ASSERT_TRUE(store_->CancelSweep(t.sweep_id).ok());
  const std::vector<json> bodies = receiver.WaitFor(1);
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_EQ(receiver.bodies().size(), 1u);  // not the earlier sweeps' five
  EXPECT_EQ(bodies[0]["kind"], "sweep_cancelled");
  EXPECT_EQ(bodies[0]["sweep"], "t");
}

TEST(AlertTargetsTest, BadTargetsAndFilesAreRefusedNamingTheProblem) {
  EXPECT_THAT(std::string(ParseWebhookUrl("ftp://x/y").status().message()),
              HasSubstr("expected an http:// or https:// URL"));
  EXPECT_THAT(std::string(ParseWebhookUrl("http://:80/x").status().message()),
              HasSubstr("no host"));
  EXPECT_THAT(std::string(ParseWebhookUrl("https://h:99999/secret").status().message()),
              HasSubstr("port \"99999\" is not 1 to 65535"));
  EXPECT_THAT(std::string(ParseWebhookUrl("https://u:p@h/x").status().message()),
              HasSubstr("credentials in the URL"));
  absl::StatusOr<WebhookUrl> ok = ParseWebhookUrl("https://[::1]:8443/hooks/T0/B1?x=1");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->host, "::1");
  EXPECT_EQ(ok->port, 8443);
  EXPECT_EQ(ok->target, "/hooks/T0/B1?x=1");
  EXPECT_EQ(ok->Redacted(), "https://[::1]:8443/...");
  EXPECT_EQ(ParseWebhookUrl("http://h")->target, "/");

  const std::string dir = testing::FreshTestDir("alerts_file_test").string();
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/alerts.yaml") << text;
    AlertOptions o;
    return ReadAlertsFile(dir + "/alerts.yaml", &o);
  };
  EXPECT_THAT(std::string(write("webhook: [http://x/]\n").message()),
              HasSubstr("unknown key \"webhook\" (expected webhooks, commands)"));
  EXPECT_THAT(std::string(write("webhooks: http://x/\n").message()),
              HasSubstr("webhooks: expected a list"));
  EXPECT_THAT(std::string(write("commands: [[a]]\n").message()),
              HasSubstr("commands[0]: expected a string"));
  EXPECT_THAT(std::string(write("webhooks: [\n").message()), HasSubstr("not YAML"));
  AlertOptions o;
  std::ofstream(dir + "/alerts.yaml") << "webhooks: [http://127.0.0.1:9/a]\ncommands: ['true']\n";
  ASSERT_TRUE(ReadAlertsFile(dir + "/alerts.yaml", &o).ok());
  EXPECT_THAT(o.webhooks, UnorderedElementsAre("http://127.0.0.1:9/a"));
  EXPECT_THAT(o.commands, UnorderedElementsAre("true"));
  EXPECT_TRUE(ReadAlertsFile(dir + "/missing.yaml", &o).ok());
  std::filesystem::remove_all(dir);

  StoreOptions so;
  so.path = testing::FreshTestDir("alerts_start_test").string() + "/ablate.db";
  std::unique_ptr<Store> store = *Store::Open(so);
  AlertOptions bad;
  bad.commands = {"  "};
  EXPECT_THAT(std::string(Alerter::Start(store.get(), bad).status().message()),
              HasSubstr("an alert command is empty"));
  bad.commands.clear();
  bad.webhooks = {"hooks.slack.com/x"};
  EXPECT_THAT(std::string(Alerter::Start(store.get(), bad).status().message()),
              HasSubstr("expected an http:// or https:// URL"));
}

}  // namespace
}  // namespace ablate
