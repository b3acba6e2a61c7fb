// The worker agent against a test double of the coordinator: an in-process WorkerService on a
// real gRPC server (loopback, port 0) that records what it receives, deduplicates report batches
// by sequence number as the real one does, and misbehaves on request (refused calls, lost
// replies, a restart, stop directives, lost leases, a wrong token). A tiny model trains for real.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "config/model_config.h"
#include "config/presets.h"
#include "proto/ablate.grpc.pb.h"
#include "tests/process_util.h"
#include "tests/test_configs.h"
#include "tests/worker/corpus_fixture.h"
#include "tests/worker/tiny_run_config.h"
#include "worker/agent/agent.h"
#include "worker/train/trainer.h"

extern char** environ;

namespace ablate {
namespace {

namespace fs = std::filesystem;

// The other side of the protocol, as the tests need it. Thread-safe.
class FakeCoordinator {
 public:
  // ---- Behaviour (set before the agent starts) ----
  std::string token = "secret";
  std::set<int> refuse_report_calls;  // 1-based Report calls refused (UNAVAILABLE) unapplied
  std::set<int> lose_reply_calls;     // applied, then answered UNAVAILABLE (the reply is lost)
  std::atomic<bool> refuse_all_reports{false};
  int64_t stop_at_step = 0;        // DIRECTIVE_STOP once a step >= this was applied
  int64_t lease_lost_at_step = 0;  // FAILED_PRECONDITION once a step >= this arrives
  int32_t lease_timeout_s = 30;
  // Batches of more points than this are refused unapplied as too large (RESOURCE_EXHAUSTED, as
  // the coordinator's rows limit says it); -1: no limit.
  int report_point_limit = -1;
  std::atomic<bool>* interrupt_on_handover = nullptr;  // raised as a Finish hands over a job

  void AddJob(const Job& job) {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(job);
  }

  grpc::Status Register(grpc::ServerContext* ctx, const RegisterRequest* req,
                        RegisterResponse* resp) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    registrations.push_back(*req);
    resp->set_worker_id(100 + static_cast<int64_t>(registrations.size()));
    resp->set_worker_secret(SecretOf(resp->worker_id()));
    resp->set_lease_timeout_s(lease_timeout_s);
    return grpc::Status::OK;
  }
  // As the coordinator: AcquireJob and Deregister need the secret Register gave the worker id,
  // so every test checks that the agent sends it.
  static std::string SecretOf(int64_t worker_id) { return "secret-" + std::to_string(worker_id); }
  static grpc::Status CheckSecret(int64_t worker_id, const std::string& presented) {
    if (presented == SecretOf(worker_id)) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "wrong worker secret for worker " + std::to_string(worker_id));
  }

  grpc::Status Deregister(grpc::ServerContext* ctx, const DeregisterRequest* req,
                          DeregisterResponse*) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    if (grpc::Status s = CheckSecret(req->worker_id(), req->worker_secret()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    deregistrations.push_back(req->worker_id());
    return grpc::Status::OK;
  }

  grpc::Status AcquireJob(grpc::ServerContext* ctx, const AcquireJobRequest* req,
                          AcquireJobResponse* resp) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    if (grpc::Status s = CheckSecret(req->worker_id(), req->worker_secret()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    ++acquire_calls;
    auto has_job = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !jobs_.empty(); };
    // A short long poll keeps server shutdowns quick.
    mu_.AwaitWithTimeout(absl::Condition(&has_job),
                         std::min(absl::Seconds(req->wait_s()), absl::Milliseconds(200)));
    if (jobs_.empty()) return grpc::Status::OK;
    *resp->mutable_job() = jobs_.front();
    jobs_.pop_front();
    // Up to max_jobs, as the coordinator (which also counts the worker's free slots).
    for (int i = 1; i < req->max_jobs() && !jobs_.empty(); ++i) {
      *resp->add_more_jobs() = jobs_.front();
      jobs_.pop_front();
    }
    return grpc::Status::OK;
  }

  grpc::Status Report(grpc::ServerContext* ctx, const ReportRequest* req, ReportResponse* resp) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    received.push_back(*req);
    first_report_at.try_emplace({req->run_id(), req->attempt()}, absl::Now());
    const int call = static_cast<int>(received.size());
    if (refuse_all_reports.load() || refuse_report_calls.count(call)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused by the test");
    }
    const int points = req->steps_size() + req->evals_size() + req->spikes_size();
    if (report_point_limit >= 0 && points > report_point_limit) {
      ++refused_too_large;
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "report: the batch has " + std::to_string(points) +
                              " rows; the limit is " + std::to_string(report_point_limit) +
                              ": send smaller batches");
    }
    for (const StepMetrics& m : req->steps()) {
      if (lease_lost_at_step > 0 && m.step() >= lease_lost_at_step) lease_lost_ = true;
    }
    if (lease_lost_) {
      ++refused_stale;
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "attempt is not current");
    }
    const auto key = std::make_pair(req->run_id(), req->attempt());
    auto& applied_batches = applied[key];
    const int64_t last = static_cast<int64_t>(applied_batches.size());
    if (req->seq() == 0) {  // a heartbeat: renews the lease, carries nothing
      ++heartbeats;
      if (req->steps_size() + req->evals_size() + req->spikes_size() + req->notices_size() > 0 ||
          req->checkpoint_step() > 0) {
        errors.push_back("a heartbeat with points");
      }
    } else if (req->seq() <= last) {
      resp->set_duplicate(true);
      ++duplicates;
      if (applied_batches[req->seq() - 1].SerializeAsString() != req->SerializeAsString()) {
        errors.push_back("batch " + std::to_string(req->seq()) + " resent changed");
      }
    } else if (req->seq() != last + 1) {
      errors.push_back("seq " + std::to_string(req->seq()) + " after " + std::to_string(last));
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "sequence gap");
    } else {
      applied_batches.push_back(*req);
      for (const StepMetrics& m : req->steps()) {
        steps[key].push_back(m.step());
        max_step = std::max(max_step, m.step());
      }
      for (const EvalResult& e : req->evals()) evals[key].push_back(e.step());
      for (const SpikeEvent& e : req->spikes()) spikes[key].push_back(e);
      for (const std::string& n : req->notices()) notices[key].push_back(n);
      if (req->checkpoint_step() > 0) {
        checkpoints[key].push_back(req->checkpoint_step());
        checkpoint_paths[key] = req->checkpoint_path();
        // A checkpoint notice comes with or after every step it covers.
        if (steps[key].empty() ||
            req->checkpoint_step() > *std::max_element(steps[key].begin(), steps[key].end())) {
          errors.push_back("checkpoint " + std::to_string(req->checkpoint_step()) +
                           " before its steps");
        }
      }
    }
    if (stop_at_step > 0 && max_step >= stop_at_step) {
      if (stop_sent_at_step == 0) stop_sent_at_step = max_step;
      resp->set_directive(DIRECTIVE_STOP);
    }
    if (lose_reply_calls.count(call))
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "reply lost");
    return grpc::Status::OK;
  }

  grpc::Status Finish(grpc::ServerContext* ctx, const FinishRequest* req, FinishResponse* resp) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    finishes.push_back(*req);
    finished_at[{req->run_id(), req->attempt()}] = absl::Now();
    if (req->acquire_next() && !jobs_.empty()) {
      *resp->mutable_next_job() = jobs_.front();
      jobs_.pop_front();
      ++handed_over;
      if (interrupt_on_handover != nullptr) *interrupt_on_handover = true;  // SIGTERM, now
    }
    return grpc::Status::OK;
  }

  // Polls `done` (called under the lock) until it holds or `timeout` passes.
  bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      {
        absl::MutexLock lock(&mu_);
        if (done()) return true;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  absl::Mutex mu_;
  // ---- What arrived (guarded by mu_) ----
  using Key = std::pair<int64_t, int32_t>;  // (run, attempt)
  std::vector<RegisterRequest> registrations;
  std::vector<int64_t> deregistrations;  // worker ids
  std::vector<std::string> authorizations;
  std::vector<ReportRequest> received;                // every Report call, as received
  std::map<Key, std::vector<ReportRequest>> applied;  // batch seq-1 -> the batch
  std::map<Key, std::vector<int64_t>> steps, evals, checkpoints;
  std::map<Key, std::vector<SpikeEvent>> spikes;
  std::map<Key, std::vector<std::string>> notices;
  std::map<Key, std::string> checkpoint_paths;
  std::map<Key, absl::Time> first_report_at, finished_at;
  std::vector<FinishRequest> finishes;
  std::vector<std::string> errors;  // protocol violations
  int64_t max_step = 0, stop_sent_at_step = 0;
  int duplicates = 0, refused_stale = 0, acquire_calls = 0, heartbeats = 0, handed_over = 0;
  int refused_too_large = 0;

 private:
  grpc::Status Authorize(grpc::ServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string got = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    absl::MutexLock lock(&mu_);
    authorizations.push_back(got);
    if (got != "Bearer " + token)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid token");
    return grpc::Status::OK;
  }

  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool lease_lost_ ABSL_GUARDED_BY(mu_) = false;
};

// The gRPC face of a FakeCoordinator; one per server start, so the state outlives restarts.
class FakeService final : public WorkerService::Service {
 public:
  explicit FakeService(FakeCoordinator* c) : c_(c) {}
  grpc::Status Register(grpc::ServerContext* x, const RegisterRequest* q,
                        RegisterResponse* r) override {
    return c_->Register(x, q, r);
  }
  grpc::Status AcquireJob(grpc::ServerContext* x, const AcquireJobRequest* q,
                          AcquireJobResponse* r) override {
    return c_->AcquireJob(x, q, r);
  }
  grpc::Status Report(grpc::ServerContext* x, const ReportRequest* q, ReportResponse* r) override {
    return c_->Report(x, q, r);
  }
  grpc::Status Deregister(grpc::ServerContext* x, const DeregisterRequest* q,
                          DeregisterResponse* r) override {
    return c_->Deregister(x, q, r);
  }
  grpc::Status Finish(grpc::ServerContext* x, const FinishRequest* q, FinishResponse* r) override {
    return c_->Finish(x, q, r);
  }

 private:
  FakeCoordinator* const c_;
};

// A real gRPC server on loopback; Stop() and Start() again on the same port simulate a restart.
class TestServer {
 public:
  explicit TestServer(FakeCoordinator* c) : coordinator_(c) { Start(0); }
  ~TestServer() { Stop(); }
  void Start(int port) {
    service_ = std::make_unique<FakeService>(coordinator_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  FakeCoordinator* const coordinator_;
  std::unique_ptr<FakeService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// A loopback TCP proxy between the agent and a TestServer: Cut() cuts the worker off from a
// coordinator that stays up. kClose closes every connection and refuses new ones (each is accepted
// and closed at once); kBlackhole keeps them open but forwards nothing, so calls hang until their
// deadline, as across a network partition. Restore() forwards new connections again.
class CuttableProxy {
 public:
  enum class Cut { kNone, kClose, kBlackhole };

  explicit CuttableProxy(int target_port) : target_port_(target_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "proxy: cannot listen on loopback";
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~CuttableProxy() {
    closing_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    ::close(listener_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void SetCut(Cut cut) {
    cut_ = cut;
    ++generation_;
  }

 private:
  void Accept() {
    while (!closing_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const Cut cut = cut_;
      if (cut == Cut::kClose) {
        ::close(client);
        continue;
      }
      const int server = cut == Cut::kNone ? Connect() : -1;
      pumps_.emplace_back([this, client, server, generation = generation_.load()] {
        Pump(client, server, generation);
      });
    }
  }
  int Connect() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  // Copies bytes both ways until either side closes, the proxy closes, or the cut changes: a
  // kClose cut closes the connection, a kBlackhole cut stops forwarding (and reading), and the
  // Restore() after it closes it (the client connects again, as after a partition heals).
  void Pump(int client, int server, int generation) {
    char buffer[1 << 14];
    while (!closing_) {
      const bool current = generation_ == generation;
      if (!current && cut_ != Cut::kBlackhole) break;
      const bool forwarding = current && server >= 0;
      pollfd p[2] = {{client, static_cast<short>(forwarding ? POLLIN : 0), 0}, {server, POLLIN, 0}};
      if (::poll(p, forwarding ? 2 : 1, 20) <= 0) continue;
      if ((p[0].revents & (POLLHUP | POLLERR)) != 0 && !forwarding) break;
      if (!forwarding) continue;
      bool closed = false;
      for (int i = 0; i < 2 && !closed; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = ::read(p[i].fd, buffer, sizeof(buffer));
        closed = n <= 0 || ::send(p[1 - i].fd, buffer, n, MSG_NOSIGNAL) != n;
      }
      if (closed) break;
    }
    ::close(client);
    if (server >= 0) ::close(server);
  }

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> closing_{false};
  std::atomic<Cut> cut_{Cut::kNone};
  std::atomic<int> generation_{0};  // bumped by every SetCut: connections accepted before it
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // the acceptor's; joined by the destructor
};

FakeCoordinator::Key K(int64_t run, int32_t attempt) { return {run, attempt}; }

std::vector<int64_t> Range(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t i = first; i <= last; ++i) v.push_back(i);
  return v;
}

class AgentTest : public testing::CorpusTest {
 protected:
  AgentTest() : CorpusTest("ablate_agent_test") {}

  RunConfig Config(int steps) {
    RunConfig r = testing::TinyRunConfig(corpus_path(), steps);
    TrainConfig* t = r.mutable_train();
    // A statistical detector with a 2-value window and a tiny sigma records spikes often.
    t->mutable_spike()->set_stat_window(2);
    t->mutable_spike()->set_stat_sigmas(1e-6);
    return r;
  }
  RunConfig Config(int steps, int eval_every, int checkpoint_every) {
    RunConfig r = Config(steps);
    r.mutable_train()->set_eval_every(eval_every);
    r.mutable_train()->set_checkpoint_every(checkpoint_every);
    return r;
  }

  Job MakeJob(int64_t run_id, int32_t attempt, const RunConfig& config) {
    Job job;
    job.set_run_id(run_id);
    job.set_attempt(attempt);
    *job.mutable_config() = config;
    job.set_checkpoint_dir((dir_ / "ckpt" / ("run-" + std::to_string(run_id))).string());
    job.set_sweep("quick");
    job.set_variant("g1");
    return job;
  }

  // Options for an agent of `server`'s, quick to report and to retry, that takes up to `max_jobs`
  // jobs and offers `slots` slots (job processes of the worker binary when more than one).
  AgentOptions Options(const TestServer& server, int max_jobs = 1, int slots = 1) {
    AgentOptions o;
    o.coordinator = server.address();
    o.token = "secret";
    o.report_interval = absl::Milliseconds(20);
    o.acquire_wait = absl::Seconds(1);
    o.max_jobs = max_jobs;
    if (slots > 1) {
      o.slots = slots;
      o.rank_binary = ABLATE_WORKER_BIN;
    }
    o.call_deadline = absl::Seconds(2);
    o.backoff_min = absl::Milliseconds(20);
    o.backoff_max = absl::Milliseconds(300);
    o.interrupt = &interrupt_;
    o.abort = &abort_;
    o.log = [this](const std::string& line) {
      absl::MutexLock lock(&log_mu_);
      log_.push_back(line);
    };
    return o;
  }

  // Runs an agent to its end (at most two minutes).
  absl::StatusOr<AgentResult> RunAgent(AgentOptions options) {
    auto future = std::async(std::launch::async, [options] { return Agent(options).Run(); });
    if (future.wait_for(std::chrono::minutes(2)) != std::future_status::ready) {
      ADD_FAILURE() << "the agent did not return";
      interrupt_ = abort_ = true;
    }
    return future.get();
  }

  // Runs `job` to its end on an agent served by `c`.
  void RunOneJob(FakeCoordinator& c, const Job& job) {
    TestServer server(&c);
    c.AddJob(job);
    auto result = RunAgent(Options(server));
    ASSERT_TRUE(result.ok()) << result.status();
  }

  // Runs a 400-step job of `run_id`, reported every millisecond, on an agent of `slots` slots
  // (job processes of the worker binary when more than one) served by `c`.
  absl::StatusOr<AgentResult> RunLongJob(FakeCoordinator& c, int64_t run_id, int slots) {
    TestServer server(&c);
    c.AddJob(MakeJob(run_id, 1, Config(400, 200, 100)));
    AgentOptions o = Options(server, 1, slots);
    o.report_interval = absl::Milliseconds(1);
    return RunAgent(o);
  }

  // RunLongJob while `c` cancels it at step 5 (the stop directive).
  void RunJobCancelledAtStep5(FakeCoordinator& c, int64_t run_id, int slots) {
    c.stop_at_step = 5;
    auto result = RunLongJob(c, run_id, slots);
    ASSERT_TRUE(result.ok()) << result.status();
  }

  // After RunJobCancelledAtStep5: the run finished CANCELLED at most `slack` steps after the
  // stop was sent, every step it took reported.
  void ExpectCancelledAfterTheStop(FakeCoordinator& c, int64_t run_id, int slack) {
    absl::MutexLock lock(&c.mu_);
    ASSERT_EQ(c.finishes.size(), 1u);
    const RunSummary& s = c.finishes[0].summary();
    EXPECT_EQ(s.state(), CANCELLED);
    ASSERT_GT(c.stop_sent_at_step, 0);
    EXPECT_LE(s.steps_done(), c.stop_sent_at_step + slack)
        << "stop sent after step " << c.stop_sent_at_step;
    EXPECT_EQ(c.steps[K(run_id, 1)], Range(1, s.steps_done()));
  }

  int LogLines(const std::string& needle) {
    absl::MutexLock lock(&log_mu_);
    int n = 0;
    for (const std::string& line : log_) n += absl::StrContains(line, needle);
    return n;
  }
  std::string Log() {
    absl::MutexLock lock(&log_mu_);
    std::string all;
    for (const std::string& line : log_) all += line + "\n";
    return all;
  }

  std::atomic<bool> interrupt_{false}, abort_{false};
  absl::Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
};

TEST_F(AgentTest, RegistersTrainsReportsEveryStepOnceAndFinishes) {
  FakeCoordinator c;
  TestServer server(&c);
  c.AddJob(MakeJob(7, 1, Config(40)));
  auto result = RunAgent(Options(server));
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  EXPECT_EQ(result->jobs, 1);
  EXPECT_EQ(result->registrations, 1);

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  ASSERT_EQ(c.registrations.size(), 1u);
  const WorkerResources& r = c.registrations[0].resources();
  EXPECT_EQ(r.device(), "cpu");
  EXPECT_GE(r.cores(), 1);
  EXPECT_GT(r.memory_gb(), 0.1);
  EXPECT_FALSE(r.hostname().empty());
  EXPECT_TRUE(absl::StrContains(c.registrations[0].name(), ":" + std::to_string(getpid())));
  for (const std::string& a : c.authorizations) EXPECT_EQ(a, "Bearer secret");

  const FakeCoordinator::Key key{7, 1};
  EXPECT_EQ(c.steps[key], Range(1, 40));                // every step once, in order
  EXPECT_EQ(c.received.size(), c.applied[key].size());  // nothing was resent
  for (const ReportRequest& b : c.received) EXPECT_EQ(b.worker_id(), 101);
  EXPECT_EQ(c.evals[key], (std::vector<int64_t>{20, 40}));
  ASSERT_FALSE(c.spikes[key].empty());
  EXPECT_EQ(c.spikes[key].front().kind(), SPIKE_STATISTICAL);
  ASSERT_FALSE(c.checkpoints[key].empty());
  EXPECT_EQ(c.checkpoints[key].back(), 40);
  for (int64_t s : c.checkpoints[key]) EXPECT_EQ(s % 10, 0);
  EXPECT_TRUE(fs::exists(c.checkpoint_paths[key])) << c.checkpoint_paths[key];
  EXPECT_TRUE(absl::StartsWith(c.checkpoint_paths[key], (dir_ / "ckpt" / "run-7").string()));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "run-7" / "unreported.binpb"));  // all acknowledged

  ASSERT_EQ(c.finishes.size(), 1u);
  const FinishRequest& f = c.finishes[0];
  EXPECT_EQ(f.run_id(), 7);
  EXPECT_EQ(f.attempt(), 1);
  EXPECT_EQ(f.worker_id(), 101);
  EXPECT_EQ(f.summary().state(), SUCCEEDED);
  EXPECT_EQ(f.summary().steps_done(), 40);
  EXPECT_EQ(f.summary().final_eval().step(), 40);
  EXPECT_GT(f.summary().spike_steps(), 0);
}

// This process's children whose command line has `needle` (a job's other ranks).
std::vector<pid_t> ChildrenWith(const std::string& needle) {
  return ablate::testing::ChildrenWith(getpid(), needle);
}

// A job with world_size 2 on a worker with 2 slots (issue 17): rank 0 trains in the agent and
// reports, rank 1 is an `ablate-worker` process; every step is reported once and the results
// are one process's within float reassociation. A job wider than the worker fails, naming both.
TEST_F(AgentTest, ADataParallelJobTrainsOnTwoSlotsAndReportsOnce) {
  FakeCoordinator c;
  TestServer server(&c);
  Job single = MakeJob(60, 1, Config(40));
  Job pair = MakeJob(61, 1, Config(40));
  pair.set_world_size(2);
  Job wide = MakeJob(62, 1, Config(40));
  wide.set_world_size(3);
  for (const Job& j : {single, pair, wide}) c.AddJob(j);
  AgentOptions o = Options(server, 3, 2);
  auto result = RunAgent(o);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  EXPECT_EQ(c.registrations[0].resources().slots(), 2);
  EXPECT_EQ(c.steps[K(61, 1)], Range(1, 40));
  EXPECT_EQ(LogLines(" x 2 ranks"), 1) << Log();
  ASSERT_EQ(c.finishes.size(), 3u);
  std::map<int64_t, RunSummary> by_run;  // the jobs overlap: their Finishes come in any order
  for (const FinishRequest& f : c.finishes) by_run[f.run_id()] = f.summary();
  const RunSummary& one = by_run[60];
  const RunSummary& two = by_run[61];
  ASSERT_EQ(two.state(), SUCCEEDED) << two.reason();
  EXPECT_EQ(two.steps_done(), 40);
  EXPECT_NEAR(two.final_train_loss(), one.final_train_loss(), 1e-5 * one.final_train_loss());
  EXPECT_NEAR(two.final_eval().val_loss(), one.final_eval().val_loss(),
              1e-4 * one.final_eval().val_loss());
  EXPECT_EQ(by_run[62].state(), FAILED);
  EXPECT_TRUE(
      absl::StrContains(by_run[62].reason(), "the job trains on 3 ranks; this worker has 2 slots"))
      << by_run[62].reason();
  EXPECT_TRUE(ChildrenWith("--rank").empty());
}

// A rank that dies fails the attempt at once (its peer's collective breaks; not after the
// collective timeout), naming the rank; the coordinator's retry resumes from the checkpoint on
// the same slots and finishes with every step reported.
TEST_F(AgentTest, ARankThatDiesFailsTheAttemptAndTheRetryResumes) {
  FakeCoordinator c;
  TestServer server(&c);
  Job first = MakeJob(70, 1, Config(400));
  first.set_world_size(2);
  c.AddJob(first);
  AgentOptions o = Options(server, 1, 2);
  o.collective_timeout = absl::Seconds(600);
  std::thread killer([&] {
    for (int i = 0; i < 1200; ++i) {
      {
        absl::MutexLock lock(&c.mu_);
        if (c.steps[K(70, 1)].size() >= 25) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    for (pid_t pid : ChildrenWith("--rank 1 ")) kill(pid, SIGKILL);
  });
  const auto started = std::chrono::steady_clock::now();
  auto result = RunAgent(o);
  killer.join();
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  {
    absl::MutexLock lock(&c.mu_);
    ASSERT_EQ(c.finishes.size(), 1u);
    EXPECT_EQ(c.finishes[0].summary().state(), FAILED);
    EXPECT_TRUE(
        absl::StrContains(c.finishes[0].summary().reason(), "rank 1 of 2 ended with signal 9"))
        << c.finishes[0].summary().reason();
    EXPECT_FALSE(c.finishes[0].permanent());
  }
  EXPECT_LT(took_s, 120.0) << "the attempt waited for the collective timeout";

  Job retry = MakeJob(70, 2, Config(400));
  retry.set_world_size(2);
  c.AddJob(retry);
  auto again = RunAgent(o);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << Log();
  absl::MutexLock lock(&c.mu_);
  ASSERT_EQ(c.finishes.size(), 2u);
  EXPECT_EQ(c.finishes[1].summary().state(), SUCCEEDED) << c.finishes[1].summary().reason();
  EXPECT_EQ(c.finishes[1].summary().steps_done(), 400);
  EXPECT_EQ(c.steps[K(70, 2)].back(), 400);
  EXPECT_GT(c.steps[K(70, 2)].front(), 1);  // resumed from a checkpoint, not from step 0
  EXPECT_TRUE(ChildrenWith("--rank").empty());
}

// Two single-device jobs on a worker with two slots (issue 17): leased in one AcquireJob, they
// train side by side, each in a job process of its own, and come out bit for bit as they do one
// at a time in the agent's own process. A job process that dies fails its attempt, naming how.
TEST_F(AgentTest, TwoSlotsTrainTwoJobsSideBySideWithTheResultsOfOneAtATime) {
  RunConfig a = Config(200), b = Config(200);
  b.mutable_train()->set_seed(7);
  FakeCoordinator side;
  {
    TestServer server(&side);
    side.AddJob(MakeJob(80, 1, a));
    side.AddJob(MakeJob(81, 1, b));
    AgentOptions o = Options(server, 2, 2);
    // The job processes' CPUs, as the kernel has them, while they train.
    std::set<std::string> pinned;
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done.load()) {
        for (pid_t pid : ChildrenWith("job-process")) {
          const std::string status =
              ablate::testing::Slurp(fs::path("/proc") / std::to_string(pid) / "status");
          const size_t at = status.find("Cpus_allowed_list:");
          if (at == std::string::npos) continue;
          const size_t end = status.find('\n', at);
          pinned.insert(
              std::string(absl::StripAsciiWhitespace(status.substr(at + 18, end - at - 18))));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    auto result = RunAgent(o);
    done = true;
    sampler.join();
    ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
    EXPECT_EQ(result->jobs, 2);
    // Each on its slot's core group: one CPU each on a machine of two.
    const WorkerResources machine = Agent::DetectResources("");
    if (machine.cores() == 2) {
      EXPECT_EQ(pinned, (std::set<std::string>{"0", "1"}));
    } else if (machine.cores() > 2) {
      EXPECT_EQ(pinned.size(), 2u);
    }
  }
  FakeCoordinator one;
  {
    TestServer server(&one);
    one.AddJob(MakeJob(82, 1, a));
    one.AddJob(MakeJob(83, 1, b));
    AgentOptions o = Options(server, 2);
    auto result = RunAgent(o);
    ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  }
  EXPECT_EQ(LogLines("(slot 0)"), 1) << Log();
  EXPECT_EQ(LogLines("(slot 1)"), 1) << Log();
  absl::MutexLock lock(&side.mu_);
  absl::MutexLock lock_one(&one.mu_);
  EXPECT_TRUE(side.errors.empty()) << side.errors.front();
  EXPECT_EQ(side.acquire_calls, 1);  // both jobs in one call
  ASSERT_EQ(side.finishes.size(), 2u);
  ASSERT_EQ(one.finishes.size(), 2u);
  std::map<int64_t, RunSummary> by_run;
  for (const FinishRequest& f : side.finishes) by_run[f.run_id()] = f.summary();
  for (const FinishRequest& f : one.finishes) by_run[f.run_id()] = f.summary();
  for (int64_t run : {80, 81}) {
    const RunSummary& packed = by_run[run];
    const RunSummary& alone = by_run[run + 2];
    ASSERT_EQ(packed.state(), SUCCEEDED) << packed.reason();
    EXPECT_EQ(side.steps[K(run, 1)], Range(1, 200));
    EXPECT_EQ(packed.final_train_loss(), alone.final_train_loss()) << run;
    EXPECT_EQ(packed.final_eval().val_loss(), alone.final_eval().val_loss()) << run;
    EXPECT_EQ(packed.spike_steps(), alone.spike_steps()) << run;
  }
  EXPECT_NE(by_run[80].final_train_loss(), by_run[81].final_train_loss());
  // Side by side: each reported before the other finished.
  EXPECT_LT(side.first_report_at[K(81, 1)], side.finished_at[K(80, 1)]);
  EXPECT_LT(side.first_report_at[K(80, 1)], side.finished_at[K(81, 1)]);
  EXPECT_TRUE(ChildrenWith("job-process").empty());
}

TEST_F(AgentTest, AJobProcessThatDiesFailsTheAttemptNamingHowAndTheRetryResumes) {
  FakeCoordinator c;
  TestServer server(&c);
  c.AddJob(MakeJob(90, 1, Config(400)));
  AgentOptions o = Options(server, 1, 2);
  std::thread killer([&] {
    c.WaitUntil([&] { return c.steps[K(90, 1)].size() >= 25; });
    for (pid_t pid : ChildrenWith("job-process")) kill(pid, SIGKILL);
  });
  auto result = RunAgent(o);
  killer.join();
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  {
    absl::MutexLock lock(&c.mu_);
    ASSERT_EQ(c.finishes.size(), 1u);
    const FinishRequest& f = c.finishes[0];
    EXPECT_EQ(f.summary().state(), FAILED);
    EXPECT_TRUE(absl::StrContains(f.summary().reason(), "the job process ended with signal 9"))
        << f.summary().reason();
    EXPECT_FALSE(f.permanent());
  }
  c.AddJob(MakeJob(90, 2, Config(400)));
  auto again = RunAgent(o);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << Log();
  absl::MutexLock lock(&c.mu_);
  ASSERT_EQ(c.finishes.size(), 2u);
  EXPECT_EQ(c.finishes[1].summary().state(), SUCCEEDED) << c.finishes[1].summary().reason();
  EXPECT_EQ(c.steps[K(90, 2)].back(), 400);
  EXPECT_GT(c.steps[K(90, 2)].front(), 1);  // resumed from a checkpoint
}

TEST_F(AgentTest, EachFinishTakesTheNextJobWithoutAnotherAcquire) {
  FakeCoordinator c;
  TestServer server(&c);
  for (int64_t run : {41, 42, 43}) c.AddJob(MakeJob(run, 1, Config(10)));
  AgentOptions options = Options(server, 3);
  auto result = RunAgent(options);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  EXPECT_EQ(result->jobs, 3);

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  EXPECT_EQ(c.acquire_calls, 1);  // the first job only; the others came with a Finish
  EXPECT_EQ(c.handed_over, 2);
  ASSERT_EQ(c.finishes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.finishes[i].run_id(), 41 + i);
    EXPECT_EQ(c.finishes[i].summary().state(), SUCCEEDED);
    EXPECT_EQ(c.steps[FakeCoordinator::Key(41 + i, 1)], Range(1, 10));
    // The last Finish does not ask: --max-jobs is reached, a leased job would wait for its lease.
    EXPECT_EQ(c.finishes[i].acquire_next(), i < 2) << i;
  }
}

TEST_F(AgentTest, AJobHandedOverAsTheWorkerStopsIsGivenBackUntouched) {
  FakeCoordinator c;
  TestServer server(&c);
  c.AddJob(MakeJob(51, 1, Config(10)));
  c.AddJob(MakeJob(52, 1, Config(10)));
  c.interrupt_on_handover = &interrupt_;
  AgentOptions options = Options(server, 0);
  auto result = RunAgent(options);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  ASSERT_EQ(c.finishes.size(), 2u) << Log();
  EXPECT_EQ(c.finishes[0].run_id(), 51);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
  EXPECT_TRUE(c.finishes[0].acquire_next());
  // Run 52 came with that Finish as the interrupt arrived: finished INTERRUPTED at step 0, so
  // the coordinator queues it again at once, and never trained here.
  EXPECT_EQ(c.finishes[1].run_id(), 52);
  EXPECT_EQ(c.finishes[1].summary().state(), INTERRUPTED);
  EXPECT_EQ(c.finishes[1].summary().steps_done(), 0);
  EXPECT_FALSE(c.finishes[1].acquire_next());
  EXPECT_TRUE(c.steps[FakeCoordinator::Key(52, 1)].empty());
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "run-52"));
}

TEST_F(AgentTest, HeartbeatsRenewTheLeaseWhileNothingIsReported) {
  FakeCoordinator c;
  c.lease_timeout_s = 1;  // a heartbeat after a third of it without a report
  TestServer server(&c);
  RunConfig config = Config(10);
  config.mutable_train()->set_eval_every(10);
  // A long evaluation at the end (~2 s here; 600 batches took ~0.3 s once the kernels got faster,
  // under the 0.33 s between heartbeats): no steps, no reports.
  config.mutable_train()->set_eval_batches(4000);
  c.AddJob(MakeJob(4, 1, config));
  const absl::Time start = absl::Now();
  auto result = RunAgent(Options(server));
  ASSERT_TRUE(result.ok()) << result.status();
  const absl::Duration took = absl::Now() - start;

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  EXPECT_GE(c.heartbeats, 1) << "the run took " << took;
  EXPECT_EQ(c.steps[K(4, 1)], Range(1, 10));
  ASSERT_EQ(c.finishes.size(), 1u);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
}

TEST_F(AgentTest, ATrainerErrorFinishesFailedWithTheErrorAndTheAgentGoesOn) {
  FakeCoordinator c;
  TestServer server(&c);
  RunConfig broken = Config(40);
  broken.mutable_train()->mutable_data()->set_path((dir_ / "no_such_corpus.txt").string());
  c.AddJob(MakeJob(13, 1, broken));
  c.AddJob(MakeJob(14, 1, Config(20)));
  AgentOptions o = Options(server, 2);
  auto result = RunAgent(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->jobs, 2);

  absl::MutexLock lock(&c.mu_);
  ASSERT_EQ(c.finishes.size(), 2u);
  EXPECT_EQ(c.finishes[0].run_id(), 13);
  EXPECT_EQ(c.finishes[0].summary().state(), FAILED);
  EXPECT_TRUE(absl::StrContains(c.finishes[0].error(), "no_such_corpus.txt"))
      << c.finishes[0].error();
  EXPECT_TRUE(absl::StrContains(c.finishes[0].summary().reason(), "no_such_corpus.txt"));
  EXPECT_TRUE(c.finishes[0].permanent());  // missing data: no worker will do better
  EXPECT_EQ(c.finishes[1].run_id(), 14);
  EXPECT_EQ(c.finishes[1].summary().state(), SUCCEEDED);
  EXPECT_EQ(c.steps[K(14, 1)], Range(1, 20));
  EXPECT_EQ(c.registrations.size(), 1u);
  // Done (--max-jobs): it says it leaves.
  EXPECT_EQ(c.deregistrations, std::vector<int64_t>{101});
}

TEST_F(AgentTest, ResendsRefusedBatchesUnchangedAndLosesNothing) {
  FakeCoordinator c;
  c.refuse_report_calls = {2, 3, 9};
  c.lose_reply_calls = {5, 6};
  TestServer server(&c);
  c.AddJob(MakeJob(3, 2, Config(40)));
  AgentOptions o = Options(server);
  o.max_batch_points = 4;  // >= 10 batches
  auto result = RunAgent(o);
  ASSERT_TRUE(result.ok()) << result.status();

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  ASSERT_GE(c.received.size(), 12u);
  // A refused or unanswered batch is sent again, byte for byte, before the next one.
  for (int call : {2, 3, 5, 6, 9}) {
    EXPECT_EQ(c.received[call].SerializeAsString(), c.received[call - 1].SerializeAsString())
        << "call " << call + 1;
  }
  EXPECT_EQ(c.duplicates, 2);  // calls 6 and 7 resent the batch applied by call 5
  for (size_t i = 1; i < c.received.size(); ++i) {
    EXPECT_LE(c.received[i].seq(), c.received[i - 1].seq() + 1);
  }
  const FakeCoordinator::Key key{3, 2};
  EXPECT_EQ(c.steps[key], Range(1, 40));
  EXPECT_EQ(c.evals[key], (std::vector<int64_t>{20, 40}));
  ASSERT_EQ(c.finishes.size(), 1u);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
}

// A batch refused for its size is split (its number reused), until the coordinator takes it;
// a single point no batch can carry fails the attempt for good, with the reason, and the worker
// goes on. Before, a too-large batch was resent unchanged forever.
TEST_F(AgentTest, ATooLargeBatchIsSplitAndAPointNoBatchCarriesFailsTheAttempt) {
  FakeCoordinator c;
  c.report_point_limit = 3;
  TestServer server(&c);
  c.AddJob(MakeJob(21, 1, Config(40)));
  AgentOptions o = Options(server);
  o.report_interval = absl::Seconds(30);  // everything in one batch, at the end
  auto result = RunAgent(o);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << Log();
  {
    absl::MutexLock lock(&c.mu_);
    EXPECT_TRUE(c.errors.empty()) << c.errors.front();
    EXPECT_GE(c.refused_too_large, 1);
    EXPECT_EQ(c.steps[K(21, 1)], Range(1, 40));
    EXPECT_EQ(c.evals[K(21, 1)], (std::vector<int64_t>{20, 40}));
    ASSERT_EQ(c.finishes.size(), 1u);
    EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
  }
  EXPECT_TRUE(absl::StrContains(Log(), "was too large for the coordinator")) << Log();

  FakeCoordinator none;
  none.report_point_limit = 0;
  TestServer second(&none);
  none.AddJob(MakeJob(22, 1, Config(20)));
  none.AddJob(MakeJob(23, 1, Config(20)));
  AgentOptions two = Options(second, 2);
  auto after = RunAgent(two);
  ASSERT_TRUE(after.ok()) << after.status() << "\n" << Log();
  absl::MutexLock lock(&none.mu_);
  ASSERT_EQ(none.finishes.size(), 2u);
  EXPECT_EQ(none.finishes[0].summary().state(), FAILED);
  EXPECT_TRUE(none.finishes[0].permanent());
  EXPECT_TRUE(absl::StrContains(none.finishes[0].error(), "a single metric point of run 22"))
      << none.finishes[0].error();
}

TEST_F(AgentTest, ReconnectsWhenTheCoordinatorRestartsMidRun) {
  FakeCoordinator c;
  TestServer server(&c);
  c.AddJob(MakeJob(5, 1, Config(60)));
  AgentOptions o = Options(server);
  o.max_batch_points = 4;
  auto future = std::async(std::launch::async, [o] { return Agent(o).Run(); });
  ASSERT_TRUE(c.WaitUntil([&] { return c.max_step >= 8; }));
  const int port = server.port();
  server.Stop();  // training goes on; reports (and maybe Finish) wait
  absl::SleepFor(absl::Seconds(1));
  server.Start(port);
  ASSERT_EQ(future.wait_for(std::chrono::minutes(2)), std::future_status::ready);
  auto result = future.get();
  ASSERT_TRUE(result.ok()) << result.status();

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  const FakeCoordinator::Key key{5, 1};
  EXPECT_EQ(c.steps[key], Range(1, 60));
  EXPECT_EQ(c.evals[key], (std::vector<int64_t>{20, 40, 60}));
  ASSERT_EQ(c.finishes.size(), 1u);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
  EXPECT_EQ(c.finishes[0].summary().steps_done(), 60);
  EXPECT_EQ(c.registrations.size(), 1u);  // the job keeps its worker id
  // One line when the coordinator went away and one when it came back, not one per retry.
  EXPECT_EQ(LogLines("unreachable"), 1) << Log();
  EXPECT_EQ(LogLines("reachable again"), 1) << Log();
}

TEST_F(AgentTest, StopDirectiveCancelsWithinAStepOrTwo) {
  FakeCoordinator c;
  ASSERT_NO_FATAL_FAILURE(RunJobCancelledAtStep5(c, 11, 1));
  // The trainer runs on while the reply travels: a few steps of a ~ms model at most. The last
  // steps were reported too.
  ASSERT_NO_FATAL_FAILURE(ExpectCancelledAfterTheStop(c, 11, 5));
  EXPECT_EQ(LogLines("says stop"), 1);
}

TEST_F(AgentTest, LostLeaseAbandonsTheJobWithoutFinishing) {
  FakeCoordinator c;
  c.lease_lost_at_step = 5;
  const absl::Time start = absl::Now();
  auto result = RunLongJob(c, 12, 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->jobs, 1);
  EXPECT_EQ(result->jobs_abandoned, 1);

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.finishes.empty());
  EXPECT_EQ(c.refused_stale, 1);  // no resend of a stale attempt's batch
  EXPECT_LT(c.max_step, 5);
  EXPECT_EQ(LogLines("abandoned"), 1) << Log();
  // Stopped at once: no checkpoint of a later step overwrites the next owner's.
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "run-12" / "checkpoint.pt")) << Log();
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

// A worker cut off from a coordinator that stays up (a network partition): the coordinator gives
// the run away after the lease timeout, so the worker must stop training and writing checkpoints
// within that period, on its own, and abandon the job. A cut shorter than the lease is ridden out.
// Over both kinds of cut: connections closed and refused, and connections that hang.
TEST_F(AgentTest, ACutOffWorkerStopsTrainingWithinALeasePeriod) {
  using Cut = CuttableProxy::Cut;
  for (const Cut cut : {Cut::kClose, Cut::kBlackhole}) {
    const bool hang = cut == Cut::kBlackhole;
    SCOPED_TRACE(hang ? "connections hang" : "connections are closed");
    FakeCoordinator c;
    c.lease_timeout_s = 3;
    TestServer server(&c);
    CuttableProxy proxy(server.port());
    const int64_t run_id = hang ? 32 : 31;
    c.AddJob(MakeJob(run_id, 1, Config(1000000, 1000000, 10)));  // never ends by itself
    const fs::path ckpt = dir_ / "ckpt" / ("run-" + std::to_string(run_id));
    AgentOptions o = Options(server);
    o.coordinator = proxy.address();
    o.call_deadline = absl::Seconds(2);
    interrupt_ = abort_ = false;
    auto future = std::async(std::launch::async, [o] { return Agent(o).Run(); });
    // Should an assertion end the test early: stop the agent, or the future's destructor waits
    // for a million steps.
    struct StopAgent {
      std::atomic<bool>* flag;
      ~StopAgent() { *flag = true; }
    } stop_agent{&abort_}, interrupt_agent{&interrupt_};
    auto reported = [&] {
      absl::MutexLock lock(&c.mu_);
      return c.max_step;
    };
    ASSERT_TRUE(c.WaitUntil([&] { return c.max_step >= 20; }, absl::Seconds(30))) << Log();

    // A third of a lease without the coordinator: ridden out, training and reporting go on.
    proxy.SetCut(cut);
    absl::SleepFor(absl::Milliseconds(1000));
    proxy.SetCut(Cut::kNone);
    const int64_t before = reported();
    EXPECT_TRUE(c.WaitUntil([&] { return c.max_step >= before + 20; }, absl::Seconds(20))) << Log();
    EXPECT_EQ(future.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << Log();

    // For good: training stops within the lease timeout (3 s), the agent returns (max_jobs 1).
    proxy.SetCut(cut);
    const absl::Time cut_at = absl::Now();
    const auto cut_at_file_clock = fs::file_time_type::clock::now();
    const bool returned =
        future.wait_for(std::chrono::seconds(3 + 10)) == std::future_status::ready;
    const absl::Duration took = absl::Now() - cut_at;
    EXPECT_TRUE(returned) << "still training " << took << " after the cut\n" << Log();
    if (!returned) interrupt_ = abort_ = true;
    auto result = future.get();
    if (!returned) continue;
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->jobs, 1);
    EXPECT_EQ(result->jobs_abandoned, 1);
    EXPECT_EQ(LogLines("abandoned without finishing at step"), 1) << Log();
    EXPECT_EQ(LogLines("nothing acknowledged by coordinator"), 1) << Log();
    std::printf("[ measured ] %s: the agent returned %s after the cut\n",
                hang ? "hanging connections" : "closed connections",
                absl::FormatDuration(took).c_str());
    {
      absl::MutexLock lock(&log_mu_);
      for (const std::string& line : log_) {
        if (absl::StrContains(line, "abandoned")) std::printf("[ log line ] %s\n", line.c_str());
      }
      log_.clear();
    }
    // No checkpoint was written after the lease ran out (a second of slack for a step under way).
    for (const fs::directory_entry& e : fs::directory_iterator(ckpt)) {
      const auto written = fs::last_write_time(e.path());
      EXPECT_LT(written, cut_at_file_clock + std::chrono::seconds(3 + 1)) << e.path();
      std::printf("[ measured ] %s written %.2f s after the cut\n", e.path().filename().c_str(),
                  std::chrono::duration<double>(written - cut_at_file_clock).count());
    }
    absl::MutexLock lock(&c.mu_);
    EXPECT_TRUE(c.errors.empty()) << c.errors.front();
    EXPECT_TRUE(c.finishes.empty());
    EXPECT_EQ(c.registrations.size(), 1u);
  }
}

// A trainer observer that raises the interrupt at a step.
class InterruptAt : public TrainerObserver {
 public:
  InterruptAt(int64_t step, std::atomic<bool>* flag) : step_(step), flag_(flag) {}
  Directive OnStep(const StepMetrics& m) override {
    if (m.step() == step_) flag_->store(true);
    return Directive::kContinue;
  }

 private:
  int64_t step_;
  std::atomic<bool>* flag_;
};

// Trains `config` in `job`'s checkpoint directory, as an earlier attempt of the job would, until
// an interrupt at `step` ends it INTERRUPTED with a checkpoint of that step.
void TrainUntilInterrupted(const RunConfig& config, const Job& job, int64_t step) {
  std::atomic<bool> stop{false};
  TrainerOptions t;
  t.checkpoint_dir = job.checkpoint_dir();
  t.interrupt = &stop;
  auto trainer = Trainer::Create(config, t);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  InterruptAt observer(step, &stop);
  auto summary = (*trainer)->Run(&observer);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->state(), INTERRUPTED);
}

TEST_F(AgentTest, ResumesFromTheCheckpointInTheJobsDirectory) {
  const RunConfig config = Config(40);
  Job job = MakeJob(9, 2, config);
  ASSERT_NO_FATAL_FAILURE(TrainUntilInterrupted(config, job, 15));
  job.set_resume_from_step(15);
  FakeCoordinator c;
  ASSERT_NO_FATAL_FAILURE(RunOneJob(c, job));

  absl::MutexLock lock(&c.mu_);
  EXPECT_EQ(c.steps[K(9, 2)], Range(16, 40));
  EXPECT_EQ(c.evals[K(9, 2)], (std::vector<int64_t>{20, 40}));
  ASSERT_EQ(c.finishes.size(), 1u);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
  EXPECT_EQ(c.finishes[0].summary().steps_done(), 40);
  EXPECT_EQ(LogLines("resuming from the checkpoint of step 15"), 1) << Log();
}

// A checkpoint torn on disk before the next attempt: the worker moves it aside, resumes from the
// previous one (an earlier step than the coordinator knows of), tells the coordinator in a notice
// for the run's event log, and reports the steps after that again.
TEST_F(AgentTest, ATornCheckpointIsMovedAsideAndTheRunResumesFromThePreviousOne) {
  const RunConfig config = Config(40);
  Job job = MakeJob(19, 2, config);
  // Checkpoints of steps 10, 20 and 25.
  ASSERT_NO_FATAL_FAILURE(TrainUntilInterrupted(config, job, 25));
  const fs::path checkpoint = fs::path(job.checkpoint_dir()) / "checkpoint.pt";
  fs::resize_file(checkpoint, fs::file_size(checkpoint) / 2);
  job.set_resume_from_step(25);
  FakeCoordinator c;
  ASSERT_NO_FATAL_FAILURE(RunOneJob(c, job));

  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.errors.empty()) << c.errors.front();
  EXPECT_EQ(c.steps[K(19, 2)], Range(21, 40));
  ASSERT_EQ(c.finishes.size(), 1u);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
  EXPECT_EQ(c.finishes[0].summary().steps_done(), 40);
  ASSERT_EQ(c.notices[K(19, 2)].size(), 1u) << Log();
  const std::string& notice = c.notices[K(19, 2)][0];
  EXPECT_TRUE(absl::StrContains(notice, "checkpoint.pt: unreadable checkpoint")) << notice;
  EXPECT_TRUE(absl::StrContains(notice, "moved aside to " + checkpoint.string() + ".corrupt-"))
      << notice;
  EXPECT_TRUE(absl::StrContains(notice, "resumed from checkpoint.prev.pt at step 20")) << notice;
  EXPECT_EQ(LogLines("resuming from the checkpoint of step 20 (the coordinator knows one of "
                     "step 25)"),
            1)
      << Log();
  EXPECT_EQ(LogLines("moved aside to"), 1) << Log();
}

// A worker that dies with points unacknowledged: the next attempt resends them from the journal
// written with the checkpoint, so every step of the run is stored once.
TEST_F(AgentTest, NextAttemptResendsWhatADeadWorkerLeftUnacknowledged) {
  FakeCoordinator c;
  c.refuse_all_reports = true;
  TestServer server(&c);
  RunConfig config = Config(40);
  c.AddJob(MakeJob(21, 1, config));
  AgentOptions o = Options(server);
  auto first = std::async(std::launch::async, [o] { return Agent(o).Run(); });
  const fs::path journal = dir_ / "ckpt" / "run-21" / "unreported.binpb";
  ASSERT_TRUE(c.WaitUntil([&] { return fs::exists(journal); }));
  interrupt_ = true;  // checkpoint now; the flush cannot complete
  absl::SleepFor(absl::Milliseconds(500));
  abort_ = true;  // the second signal: give up waiting
  ASSERT_EQ(first.wait_for(std::chrono::minutes(1)), std::future_status::ready);
  auto aborted = first.get();
  ASSERT_FALSE(aborted.ok());
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kAborted) << aborted.status();
  EXPECT_TRUE(absl::StrContains(aborted.status().message(), "unreported.binpb"));
  ASSERT_TRUE(fs::exists(journal));
  {
    absl::MutexLock lock(&c.mu_);
    EXPECT_TRUE(c.finishes.empty());
    EXPECT_TRUE(c.steps[K(21, 1)].empty());
  }

  // The lease expired; the coordinator gives the run to another worker as attempt 2.
  interrupt_ = abort_ = false;
  c.refuse_all_reports = false;
  c.AddJob(MakeJob(21, 2, config));
  auto second = RunAgent(Options(server));
  ASSERT_TRUE(second.ok()) << second.status();
  absl::MutexLock lock(&c.mu_);
  std::vector<int64_t> steps = c.steps[K(21, 2)];
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, Range(1, 40));
  EXPECT_EQ(c.evals[K(21, 2)], (std::vector<int64_t>{20, 40}));
  ASSERT_EQ(c.finishes.size(), 1u);
  EXPECT_EQ(c.finishes[0].summary().state(), SUCCEEDED);
  EXPECT_EQ(LogLines("points an earlier attempt left unacknowledged"), 1) << Log();
  EXPECT_FALSE(fs::exists(journal));
}

TEST_F(AgentTest, ExitsWhenIdleAndWhenTheCoordinatorStaysAway) {
  FakeCoordinator c;
  TestServer server(&c);
  AgentOptions o = Options(server, 0);
  o.idle_exit = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto idle = RunAgent(o);
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(idle->jobs, 0);
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(LogLines("no job for 1s"), 1) << Log();

  server.Stop();  // nobody listens: the idle clock runs while the agent retries
  auto away = RunAgent(o);
  ASSERT_TRUE(away.ok()) << away.status();
  EXPECT_EQ(away->registrations, 0);
  EXPECT_EQ(LogLines("unreachable"), 1) << Log();
}

TEST(AgentResourcesTest, DescribesThisMachineAndItsSlurmJob) {
  // Task 3 of array job 4242 has its own job id, 4245: squeue shows it as 4242_3.
  ::setenv("SLURM_JOB_ID", "4245", 1);
  ::setenv("SLURM_ARRAY_JOB_ID", "4242", 1);
  ::setenv("SLURM_ARRAY_TASK_ID", "3", 1);
  WorkerResources r = Agent::DetectResources("cuda:1");
  ::unsetenv("SLURM_ARRAY_JOB_ID");
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  EXPECT_EQ(Agent::DetectResources("").slurm_job(), "4245");  // a plain batch job
  ::unsetenv("SLURM_JOB_ID");
  EXPECT_EQ(r.device(), "cuda:1");
  EXPECT_EQ(r.slurm_job(), "4242_3");
  EXPECT_GE(r.cores(), 1);
  EXPECT_GT(r.memory_gb(), 0.1);
  EXPECT_EQ(Agent::DetectResources("").device(), "cpu");
  EXPECT_EQ(Agent::DetectResources("").slurm_job(), "");
}

// ---- The real binary: `ablate-worker --coordinator` ----

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Starts ablate-worker with `args` and `env` added to this environment; stdout/stderr to files.
pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
            const fs::path& out, const fs::path& err) {
  std::vector<char*> argv = {const_cast<char*>(ABLATE_WORKER_BIN)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, ABLATE_WORKER_BIN, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(AgentTest, SigtermFinishesInterruptedWithACheckpointAndExitsZero) {
  FakeCoordinator c;
  TestServer server(&c);
  const RunConfig config = Config(5000, 5000, 0);  // only the interrupt writes a checkpoint
  c.AddJob(MakeJob(31, 1, config));
  const pid_t pid =
      Spawn({"--coordinator", server.address(), "--max-jobs", "1", "--report-interval", "0.05",
             "--checkpoint-root", (dir_ / "root").string(), "--name", "w1"},
            {"ABLATE_TOKEN=secret"}, dir_ / "out", dir_ / "err");
  ASSERT_GT(pid, 0);
  const bool training = c.WaitUntil([&] { return c.max_step >= 5; });
  kill(pid, SIGTERM);
  const int code = WaitExit(pid);
  ASSERT_TRUE(training) << Slurp(dir_ / "err");
  EXPECT_EQ(code, 0) << Slurp(dir_ / "err");

  absl::MutexLock lock(&c.mu_);
  ASSERT_EQ(c.registrations.size(), 1u);
  EXPECT_EQ(c.registrations[0].name(), "w1");
  ASSERT_EQ(c.finishes.size(), 1u) << Slurp(dir_ / "err");
  const RunSummary& s = c.finishes[0].summary();
  EXPECT_EQ(s.state(), INTERRUPTED);
  EXPECT_GE(s.steps_done(), 5);
  EXPECT_LT(s.steps_done(), 5000);
  EXPECT_EQ(c.steps[K(31, 1)], Range(1, s.steps_done()));
  ASSERT_FALSE(c.checkpoints[K(31, 1)].empty());
  EXPECT_EQ(c.checkpoints[K(31, 1)].back(), s.steps_done());
  EXPECT_TRUE(fs::exists(dir_ / "root" / "run-31" / "checkpoint.pt"));
  EXPECT_EQ(c.checkpoint_paths[K(31, 1)], (dir_ / "root" / "run-31" / "checkpoint.pt").string());
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "err"), "INTERRUPTED")) << Slurp(dir_ / "err");
}

// The same on a worker of two slots: a stop directive reaches the job process (CANCELLED within
// a few steps), and SIGTERM makes every job process checkpoint and finish INTERRUPTED.
TEST_F(AgentTest, JobProcessesStopOnTheDirectiveAndCheckpointOnSigterm) {
  {
    FakeCoordinator c;
    ASSERT_NO_FATAL_FAILURE(RunJobCancelledAtStep5(c, 12, 2));
    // The process learns it a pipe later than a trainer in the agent would.
    ASSERT_NO_FATAL_FAILURE(ExpectCancelledAfterTheStop(c, 12, 20));
  }
  FakeCoordinator c;
  TestServer server(&c);
  const RunConfig config = Config(5000, 5000, 0);  // only the interrupt writes a checkpoint
  c.AddJob(MakeJob(32, 1, config));
  c.AddJob(MakeJob(33, 1, config));
  const pid_t pid = Spawn(
      {"--coordinator", server.address(), "--max-jobs", "2", "--slots", "2", "--report-interval",
       "0.05", "--checkpoint-root", (dir_ / "root").string(), "--name", "w2"},
      {"ABLATE_TOKEN=secret"}, dir_ / "out", dir_ / "err");
  ASSERT_GT(pid, 0);
  const bool training =
      c.WaitUntil([&] { return c.steps[K(32, 1)].size() >= 5 && c.steps[K(33, 1)].size() >= 5; });
  kill(pid, SIGTERM);
  const int code = WaitExit(pid);
  ASSERT_TRUE(training) << Slurp(dir_ / "err");
  EXPECT_EQ(code, 0) << Slurp(dir_ / "err");
  absl::MutexLock lock(&c.mu_);
  ASSERT_EQ(c.finishes.size(), 2u) << Slurp(dir_ / "err");
  for (const FinishRequest& f : c.finishes) {
    const RunSummary& s = f.summary();
    EXPECT_EQ(s.state(), INTERRUPTED) << f.run_id();
    EXPECT_LT(s.steps_done(), 5000);
    EXPECT_EQ(c.steps[K(f.run_id(), 1)], Range(1, s.steps_done()));
    ASSERT_FALSE(c.checkpoints[K(f.run_id(), 1)].empty());
    EXPECT_EQ(c.checkpoints[K(f.run_id(), 1)].back(), s.steps_done());
  }
  // The worker reaped its job processes before it exited: none is left, anywhere.
  for (const auto& proc : fs::directory_iterator("/proc")) {
    std::string cmdline = Slurp(proc.path() / "cmdline");
    for (char& ch : cmdline) {
      if (ch == '\0') ch = ' ';
    }
    EXPECT_EQ(cmdline.find((dir_ / "root").string() + "/run-3"), std::string::npos) << cmdline;
  }
}

TEST_F(AgentTest, WrongTokenExitsNonZeroWithAClearMessage) {
  FakeCoordinator c;
  TestServer server(&c);
  std::ofstream(dir_ / "token") << "not-the-secret\n";
  const pid_t pid =
      Spawn({"--coordinator", server.address(), "--token-file", (dir_ / "token").string()}, {},
            dir_ / "out", dir_ / "err");
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid), 1);
  const std::string err = Slurp(dir_ / "err");
  EXPECT_TRUE(absl::StrContains(err, "refused Register: UNAUTHENTICATED: invalid token")) << err;
  EXPECT_TRUE(absl::StrContains(err, "--token")) << err;
  absl::MutexLock lock(&c.mu_);
  EXPECT_TRUE(c.registrations.empty());

  // No coordinator at all is a usage error, not a hang.
  const pid_t none = Spawn({}, {}, dir_ / "out", dir_ / "err");
  EXPECT_EQ(WaitExit(none), 2);  // as getopt tools exit on a usage error
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "err"), "--coordinator HOST:PORT"))
      << Slurp(dir_ / "err");
}

}  // namespace
}  // namespace ablate
