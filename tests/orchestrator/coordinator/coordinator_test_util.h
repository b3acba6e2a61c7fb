// Shared fixture of the coordinator tests: a real CoordinatorServer on 127.0.0.1:0 over a state
// dir in a fresh temp dir, a fake clock, stubs of both services with the token set, and helpers
// that act as a worker.
#ifndef ABLATE_TESTS_ORCHESTRATOR_COORDINATOR_COORDINATOR_TEST_UTIL_H_
#define ABLATE_TESTS_ORCHESTRATOR_COORDINATOR_COORDINATOR_TEST_UTIL_H_

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/credentials.h"
#include "common/version.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "orchestrator/coordinator/scheduler.h"
#include "orchestrator/coordinator/server.h"
#include "orchestrator/store/reader.h"
#include "proto/ablate.grpc.pb.h"
#include "tests/test_dir.h"

namespace ablate {

// Time stands still until a test advances it. Thread-safe.
class FakeClock : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
};

// The demo spec, 4 runs (one per variant), under another sweep name.
inline std::string QuickSpec(const std::string& name) {
  return "sweep: " + name + R"(
description: test sweep
base:
  model: {d_model: 64, num_layers: 4, num_heads: 4, num_kv_heads: 4, head_dim: 16,
          ffn_dim: 256, max_seq_len: 128}
  train: {steps: 200, batch_size: 8, seq_len: 128, threads: 1}
variants:
  - baseline
  - g1_elementwise
  - g1_headwise
  - g1_ns_sigmoid
budget: {match: ffn, reference: baseline, tolerance: 0.01}
seeds: [0]
resources: {device: cpu, threads: 1}
)";
}

class CoordinatorFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::FreshTestDir("ablate_coord").string();
    state_dir_ = root_ + "/state";
    StartServer();
  }
  void TearDown() override {
    client_.reset();
    worker_.reset();
    server_.reset();
    std::filesystem::remove_all(root_);
  }

  ServerOptions Options() {
    ServerOptions o;
    o.state_dir = state_dir_;
    o.port = 0;
    o.synchronous_full = false;
    o.shutdown_grace = absl::Seconds(1);
    o.coordinator.clock = &clock_;
    o.coordinator.background_lease_checks = false;
    o.coordinator.max_acquire_wait = absl::Seconds(20);
    o.coordinator.watch_interval = absl::Milliseconds(50);
    o.coordinator.max_watches = max_watches_;
    o.coordinator.max_workers = max_workers_;
    o.coordinator.scheduler.lease_timeout = absl::Seconds(30);
    o.coordinator.scheduler.retry_base = absl::Seconds(5);
    o.coordinator.scheduler.retry_cap = absl::Seconds(60);
    o.coordinator.scheduler.max_attempts = 3;
    return o;
  }

  void StartServer() {
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(Options());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    token_ = server_->credentials().admin;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);  // as the CLI: a 10,000-run expansion is ~5 MB
    auto channel =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
    client_ = ablate::Coordinator::NewStub(channel);
    worker_ = WorkerService::NewStub(channel);
  }

  // Stops the coordinator and starts a new one on the same state dir.
  void Restart() {
    client_.reset();
    worker_.reset();
    server_.reset();
    StartServer();
  }

  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::seconds timeout = std::chrono::seconds(10)) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    ctx->AddMetadata("authorization", "Bearer " + token_);
    return ctx;
  }
  // `method` of `stub` (client_ or worker_) with `request` under a fresh Context(): its status,
  // the answer in *response.
  template <typename Stub, typename Request, typename Response>
  grpc::Status Call(Stub* stub,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) {
    auto ctx = Context();
    return (stub->*method)(ctx.get(), request, response);
  }

  // Submit of `spec` as the file `file`, its status (a test that expects a refusal).
  grpc::Status TrySubmit(const std::string& spec, const std::string& file, SubmitResponse* response,
                         bool force = false) {
    SubmitRequest request;
    request.set_spec_yaml(spec);
    request.set_spec_file(file);
    request.set_force(force);
    auto ctx = Context();
    return client_->Submit(ctx.get(), request, response);
  }
  SubmitResponse Submit(const std::string& spec, const std::string& file, bool force) {
    SubmitResponse response;
    grpc::Status s = TrySubmit(spec, file, &response, force);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }
  SubmitResponse SubmitQuick() { return Submit(QuickSpec("quick"), "quick.yaml", false); }

  GetSweepResponse GetSweep(const std::string& sweep) {
    GetSweepRequest request;
    request.set_sweep(sweep);
    GetSweepResponse response;
    auto ctx = Context();
    grpc::Status s = client_->GetSweep(ctx.get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  // A worker of this build (whose runs the coordinator of this build keys) unless `code_version`.
  int64_t RegisterWorker(const std::string& name, int slots = 0,
                         const std::string& code_version = CodeVersion()) {
    RegisterRequest request;
    request.set_name(name);
    request.mutable_resources()->set_code_version(code_version);
    request.mutable_resources()->set_device("cpu");
    request.mutable_resources()->set_slots(slots);
    request.mutable_resources()->set_cores(4);
    request.mutable_resources()->set_memory_gb(16);
    RegisterResponse response;
    auto ctx = Context();
    grpc::Status s = worker_->Register(ctx.get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.lease_timeout_s(), 30);
    return response.worker_id();
  }

  // What RegisterResponse.worker_secret gave worker_id: an HMAC under the coordinator's secret,
  // which is the admin credential.
  std::string SecretOf(int64_t worker_id) const {
    return WorkerSecret(HmacSha256(token_), worker_id);
  }

  // An AcquireJob call of worker_id's, with its secret, that waits up to `wait_s` for a job.
  AcquireJobRequest AcquireRequest(int64_t worker_id, int32_t wait_s = 0) const {
    AcquireJobRequest request;
    request.set_worker_id(worker_id);
    request.set_worker_secret(SecretOf(worker_id));
    request.set_wait_s(wait_s);
    return request;
  }
  AcquireJobResponse TryAcquire(int64_t worker_id) {
    const AcquireJobRequest request = AcquireRequest(worker_id);
    AcquireJobResponse response;
    auto ctx = Context();
    grpc::Status s = worker_->AcquireJob(ctx.get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }
  Job Acquire(int64_t worker_id) {
    AcquireJobResponse response = TryAcquire(worker_id);
    EXPECT_TRUE(response.has_job()) << "no job for worker " << worker_id;
    return response.job();
  }

  // Sets what names `job`'s attempt on `worker_id` in a worker's request (a Report, a Finish).
  template <typename Request>
  static void NameTheAttempt(int64_t worker_id, const Job& job, Request* request) {
    request->set_worker_id(worker_id);
    request->set_run_id(job.run_id());
    request->set_attempt(job.attempt());
    request->set_lease_secret(job.lease_secret());
  }
  // Adds to `report` a spike of the loss at `step`: `value` against `baseline`, of `kind`.
  static SpikeEvent* AddLossSpike(ReportRequest* report, int64_t step, double value,
                                  double baseline, SpikeKind kind) {
    SpikeEvent* spike = report->add_spikes();
    spike->set_step(step);
    spike->set_signal("loss");
    spike->set_value(value);
    spike->set_baseline(baseline);
    spike->set_kind(kind);
    return spike;
  }
  ReportRequest MakeReport(int64_t worker_id, const Job& job, int64_t seq,
                           const std::vector<int64_t>& steps) {
    ReportRequest r;
    NameTheAttempt(worker_id, job, &r);
    r.set_seq(seq);
    for (int64_t step : steps) {
      StepMetrics* m = r.add_steps();
      m->set_step(step);
      m->set_loss(5.0 - 0.01 * static_cast<double>(step));
      m->set_grad_norm(1.0);
      m->set_lr(1e-3);
    }
    return r;
  }
  grpc::Status CallReport(const ReportRequest& request, ReportResponse* response) {
    auto ctx = Context();
    return worker_->Report(ctx.get(), request, response);
  }
  grpc::Status CallFinish(int64_t worker_id, const Job& job, RunState state,
                          const std::string& error = "") {
    FinishResponse response;
    return CallFinish(MakeFinish(worker_id, job, state, error), &response);
  }
  grpc::Status CallFinish(const FinishRequest& request, FinishResponse* response) {
    auto ctx = Context();
    return worker_->Finish(ctx.get(), request, response);
  }
  FinishRequest MakeFinish(int64_t worker_id, const Job& job, RunState state,
                           const std::string& error = "") {
    FinishRequest request;
    NameTheAttempt(worker_id, job, &request);
    request.set_error(error);
    RunSummary* s = request.mutable_summary();
    s->set_state(state);
    s->set_steps_done(200);
    s->set_final_train_loss(2.4);
    s->mutable_final_eval()->set_step(200);
    s->mutable_final_eval()->set_val_loss(2.5);
    s->mutable_final_eval()->set_val_ppl(12.18);
    return request;
  }

  grpc::Status CallCancel(const std::string& sweep, CancelResponse* response) {
    CancelRequest request;
    request.set_sweep(sweep);
    auto ctx = Context();
    return client_->Cancel(ctx.get(), request, response);
  }
  // Rerun of the sweep's failed and cancelled runs (failed_only).
  grpc::Status CallRerunFailed(const std::string& sweep, RerunResponse* response) {
    RerunRequest request;
    request.set_sweep(sweep);
    request.set_failed_only(true);
    auto ctx = Context();
    return client_->Rerun(ctx.get(), request, response);
  }

  // A client-API call naming a sweep, by method name.
  grpc::Status CallWithSweep(const std::string& method, const std::string& sweep) {
    if (method == "cancel") {
      CancelResponse o;
      return CallCancel(sweep, &o);
    }
    if (method == "rerun") {
      RerunResponse o;
      return CallRerunFailed(sweep, &o);
    }
    auto ctx = Context();
    if (method == "get") {
      GetSweepRequest r;
      r.set_sweep(sweep);
      GetSweepResponse o;
      return client_->GetSweep(ctx.get(), r, &o);
    }
    if (method == "table") {
      TableRequest r;
      r.set_sweep(sweep);
      TableResponse o;
      return client_->Table(ctx.get(), r, &o);
    }
    WatchRequest r;
    r.set_sweep(sweep);
    auto reader = client_->Watch(ctx.get(), r);
    WatchEvent e;
    while (reader->Read(&e)) {
    }
    return reader->Finish();
  }

  // One value of a read-only query on the store (as text), "" for none.
  std::string Scalar(const std::string& sql) {
    absl::StatusOr<QueryResult> r = server_->store()->reader().ReadOnlyQuery(sql);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->rows.empty()) return "";
    const SqlValue& v = r->rows[0][0];
    if (auto* s = std::get_if<std::string>(&v)) return *s;
    if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
    if (auto* d = std::get_if<double>(&v)) return std::to_string(*d);
    return "";
  }
  int64_t CountRows(const std::string& from_where) {
    (void)server_->store()->Flush();
    return std::stoll(Scalar("SELECT count(*) FROM " + from_where));
  }
  RunState StateOf(int64_t run_id) {
    return ParseRunState(Scalar("SELECT state FROM runs WHERE id = " + std::to_string(run_id)));
  }
  // Everything the results tables hold, as one string.
  std::string DatabaseDigest() {
    (void)server_->store()->Flush();
    return Scalar(
        "SELECT (SELECT count(*) FROM sweeps) || '/' || (SELECT count(*) FROM variants) || '/' || "
        "(SELECT group_concat(id || state || attempts, ',') FROM runs) || '/' || "
        "(SELECT count(*) FROM attempts) || '/' || (SELECT count(*) FROM step_metrics) || '/' || "
        "(SELECT count(*) FROM workers)");
  }

  FakeClock clock_;
  int max_watches_ = 64;    // Options(): a test that lowers it restarts
  int max_workers_ = 4096;  // likewise
  std::string root_, state_dir_, token_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<ablate::Coordinator::Stub> client_;
  std::unique_ptr<WorkerService::Stub> worker_;
};

}  // namespace ablate

#endif  // ABLATE_TESTS_ORCHESTRATOR_COORDINATOR_COORDINATOR_TEST_UTIL_H_
