// A simulated worker for load tests and scheduler benchmarks: it speaks the real worker protocol
// (Register, AcquireJob long polls, Report, Finish over gRPC) but its jobs are no-ops: each job
// reports its step metrics (a fixed number, or the job's train.steps) in numbered batches and
// finishes SUCCEEDED at once. Dozens of
// them run as threads of one process, where dozens of LibTorch workers would not fit.
//
// Two ways to speak it (SimProtocol): kCallPerStep, an AcquireJob, a Report per batch and a
// Finish per job; kFinishCarries, the last batch inside the Finish (final_report) and the next
// job in its reply (acquire_next), so a job of one batch costs one call.
//
// What it records (for the caller's checks): every job it was given, with the steady-clock time
// it arrived, and every call that failed.
//
// Thread safety: one SimWorker per thread; Run() blocks until `stop` is set and the current long
// poll returned, or until `max_jobs` were done.
#ifndef ABLATE_TESTS_SIM_WORKER_H_
#define ABLATE_TESTS_SIM_WORKER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/ablate.grpc.pb.h"

namespace ablate::testing {

enum class SimProtocol { kCallPerStep, kFinishCarries };

struct SimJob {
  int64_t run_id = 0;
  int32_t attempt = 0;
  std::string sweep;
  std::chrono::steady_clock::time_point received;
};

class SimWorker {
 public:
  // points_per_job 0: as many as the job's train.steps. batch_points 0: all in one report.
  SimWorker(std::shared_ptr<grpc::Channel> channel, std::string token, std::string name,
            int points_per_job, int batch_points = 0,
            SimProtocol protocol = SimProtocol::kCallPerStep)
      : stub_(WorkerService::NewStub(std::move(channel))),
        bearer_("Bearer " + std::move(token)),
        name_(std::move(name)),
        points_(points_per_job),
        batch_(batch_points),
        protocol_(protocol) {}

  // Registers; false (with the error in errors()) when that fails.
  bool Register() {
    RegisterRequest request;
    request.set_name(name_);
    request.mutable_resources()->set_device("cpu");
    request.mutable_resources()->set_cores(1);
    request.mutable_resources()->set_memory_gb(4);
    RegisterResponse response;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::seconds(30));
    grpc::Status s = stub_->Register(&ctx, request, &response);
    if (!s.ok()) return Failed("register", s);
    worker_id_ = response.worker_id();
    return true;
  }

  // Takes, reports and finishes jobs until `stop` is set (checked between long polls of
  // `wait_s` seconds) or `max_jobs` (0: no limit) were done.
  void Run(const std::atomic<bool>& stop, int wait_s = 1, int64_t max_jobs = 0) {
    const bool carries = protocol_ == SimProtocol::kFinishCarries;
    std::optional<Job> next;  // handed over by the last Finish
    while (!stop.load() && (max_jobs == 0 || static_cast<int64_t>(jobs_.size()) < max_jobs)) {
      if (!next.has_value()) {
        AcquireJobRequest acquire;
        acquire.set_worker_id(worker_id_);
        acquire.set_wait_s(wait_s);
        AcquireJobResponse offered;
        grpc::ClientContext ctx;
        Prepare(&ctx, std::chrono::seconds(wait_s + 30));
        grpc::Status s = stub_->AcquireJob(&ctx, acquire, &offered);
        if (!s.ok()) {
          if (!stop.load()) Failed("acquire", s);  // else the server's shutdown ended the poll
          continue;
        }
        if (!offered.has_job()) continue;
        next = offered.job();
      }
      const Job job = *std::move(next);
      next.reset();
      jobs_.push_back({job.run_id(), job.attempt(), job.sweep(), std::chrono::steady_clock::now()});
      const int points = points_ > 0 ? points_ : static_cast<int>(job.config().train().steps());
      const int batch = batch_ > 0 ? batch_ : std::max(points, 1);
      FinishRequest finish;
      bool reported = true;
      for (int first = 1, seq = 1; first <= points && reported; first += batch, ++seq) {
        const bool last = first + batch > points;
        ReportRequest* report = carries && last ? finish.mutable_final_report() : &report_;
        report->Clear();
        report->set_worker_id(worker_id_);
        report->set_run_id(job.run_id());
        report->set_attempt(job.attempt());
        report->set_seq(seq);
        for (int i = first; i < first + batch && i <= points; ++i) {
          StepMetrics* m = report->add_steps();
          m->set_step(i);
          m->set_loss(5.0 - 0.001 * i);
          m->set_grad_norm(1.0);
          m->set_lr(1e-3);
          m->set_tokens_per_s(1e5);
        }
        if (carries && last) break;
        reported = Call("report", [&](grpc::ClientContext* ctx) {
          ReportResponse r;
          return stub_->Report(ctx, report_, &r);
        });
      }
      if (!reported) continue;
      finish.set_worker_id(worker_id_);
      finish.set_run_id(job.run_id());
      finish.set_attempt(job.attempt());
      // The next job only when this worker will run it (a leased job nobody runs waits for
      // its lease to expire).
      finish.set_acquire_next(carries && !stop.load() &&
                              (max_jobs == 0 || static_cast<int64_t>(jobs_.size()) < max_jobs));
      RunSummary* summary = finish.mutable_summary();
      summary->set_state(SUCCEEDED);
      summary->set_steps_done(points);
      summary->set_final_train_loss(5.0 - 0.001 * points);
      FinishResponse finished;
      if (Call("finish", [&](grpc::ClientContext* ctx) {
            return stub_->Finish(ctx, finish, &finished);
          })) {
        if (finished_ != nullptr) finished_->fetch_add(1);
        if (finished.has_next_job()) next = finished.next_job();
      }
    }
  }

  // Counts acknowledged Finish calls in `*finished` too (shared by several workers).
  void CountFinishesIn(std::atomic<int64_t>* finished) { finished_ = finished; }

  int64_t worker_id() const { return worker_id_; }
  const std::vector<SimJob>& jobs() const { return jobs_; }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  void Prepare(grpc::ClientContext* ctx, std::chrono::seconds timeout) {
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    ctx->AddMetadata("authorization", bearer_);
  }
  bool Failed(const char* what, const grpc::Status& s) {
    errors_.push_back(std::string(what) + ": " + s.error_message());
    return false;
  }
  template <typename Fn>
  bool Call(const char* what, Fn fn) {
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::seconds(30));
    grpc::Status s = fn(&ctx);
    return s.ok() || Failed(what, s);
  }

  std::unique_ptr<WorkerService::Stub> stub_;
  const std::string bearer_;
  const std::string name_;
  const int points_;
  const int batch_;
  const SimProtocol protocol_;
  ReportRequest report_;  // reused between batches
  int64_t worker_id_ = 0;
  std::atomic<int64_t>* finished_ = nullptr;
  std::vector<SimJob> jobs_;
  std::vector<std::string> errors_;
};

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_SIM_WORKER_H_
