// A simulated worker for load tests and scheduler benchmarks: it speaks the real worker protocol
// (Register, AcquireJob long polls, Report, Finish over gRPC) but its jobs are no-ops: each job
// reports its step metrics (a fixed number, or the job's train.steps) in numbered batches and
// finishes SUCCEEDED at once. Dozens of them run in one process, where dozens of LibTorch
// workers would not fit.
//
// Three ways to speak it (SimProtocol): kCallPerStep, an AcquireJob, a Report per batch and a
// Finish per job; kFinishCarries, the last batch inside the Finish (final_report) and the next
// job in its reply (acquire_next), so a job of one batch costs one call; kSlots, a worker of
// `slots` slots that takes up to one job per slot in each AcquireJob (max_jobs) and ends all the
// jobs it holds in one Finish (more, each with its whole batch), taking the next ones in its
// reply (acquire_max): a job then costs 1/slots of a call.
//
// What it records (for the caller's checks): every job it was given, with the steady-clock time
// it arrived, and every call that failed.
//
// Thread safety: one SimWorker per thread; Run() blocks until `stop` is set and the current long
// poll returned, or until `max_jobs` were done. Its calls complete on gRPC's threads, one at a
// time; what it recorded is read after Run() returned.
#ifndef ABLATE_TESTS_SIM_WORKER_H_
#define ABLATE_TESTS_SIM_WORKER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/version.h"
#include "grpcpp/grpcpp.h"
#include "proto/ablate.grpc.pb.h"

namespace ablate::testing {

enum class SimProtocol { kCallPerStep, kFinishCarries, kSlots };

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
            SimProtocol protocol = SimProtocol::kCallPerStep, int slots = 1)
      : stub_(WorkerService::NewStub(std::move(channel))),
        bearer_("Bearer " + std::move(token)),
        name_(std::move(name)),
        points_(points_per_job),
        batch_(batch_points),
        protocol_(protocol),
        slots_(protocol == SimProtocol::kSlots ? std::max(slots, 1) : 1) {}

  // Registers; false (with the error in errors()) when that fails.
  bool Register() {
    RegisterRequest request;
    request.set_name(name_);
    request.mutable_resources()->set_device("cpu");
    request.mutable_resources()->set_cores(1);
    request.mutable_resources()->set_memory_gb(4);
    request.mutable_resources()->set_slots(slots_);
    // The coordinator's build is this one (the same build tree): it leases us its runs.
    request.mutable_resources()->set_code_version(CodeVersion());
    RegisterResponse response;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::seconds(30));
    grpc::Status s = stub_->Register(&ctx, request, &response);
    if (!s.ok()) return Failed("register", s);
    worker_id_ = response.worker_id();
    worker_secret_ = response.worker_secret();
    return true;
  }

  // Takes, reports and finishes jobs until `stop` is set (checked between long polls of
  // `wait_s` seconds) or `max_jobs` (0: no limit) were done. The calls go through gRPC's
  // callback API, each issued from the completion of the one before: the thread that calls Run
  // only waits. Dozens of threads each blocked in a synchronous call cost the benchmark's machine
  // about twice the CPU per call, which the coordinator under measurement then lacked.
  void Run(const std::atomic<bool>& stop, int wait_s = 1, int64_t max_jobs = 0) {
    Begin(stop, wait_s, max_jobs);
    Wait();
  }

  // Run() in two halves, for a caller that drives many workers from one thread: Begin() issues
  // the first call and returns; Wait() blocks until the run is over.
  void Begin(const std::atomic<bool>& stop, int wait_s = 1, int64_t max_jobs = 0) {
    stop_ = &stop;
    wait_s_ = wait_s;
    max_jobs_ = max_jobs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = true;
    }
    Next(std::nullopt);
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return !running_; });
  }

  // Counts acknowledged Finish calls in `*finished` too (shared by several workers).
  void CountFinishesIn(std::atomic<int64_t>* finished) { finished_ = finished; }

  int64_t worker_id() const { return worker_id_; }
  // The last job it was given, as the coordinator sent it (after Run() returned).
  const Job& last_job() const { return job_; }
  const std::vector<SimJob>& jobs() const { return jobs_; }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  bool WantsMore() const {
    return !stop_->load() && (max_jobs_ == 0 || static_cast<int64_t>(jobs_.size()) < max_jobs_);
  }

  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    done_cv_.notify_all();
  }

  // Runs `job` when given (handed over by the last Finish), else long-polls for one; or ends
  // Run() when no more are wanted.
  void Next(std::optional<Job> job) {
    if (job.has_value()) return Start(*std::move(job));
    if (protocol_ == SimProtocol::kSlots && !held_.empty()) return FinishHeld();
    if (!WantsMore()) return Done();
    acquire_.Clear();
    acquire_.set_worker_id(worker_id_);
    acquire_.set_worker_secret(worker_secret_);
    acquire_.set_wait_s(wait_s_);
    // Only as many jobs as this worker will still run.
    acquire_.set_max_jobs(static_cast<int32_t>(std::clamp<int64_t>(
        max_jobs_ == 0 ? slots_ : max_jobs_ - static_cast<int64_t>(jobs_.size()), 1, slots_)));
    offered_.Clear();
    NewContext(std::chrono::seconds(wait_s_ + 30));
    stub_->async()->AcquireJob(ctx_.get(), &acquire_, &offered_, [this](grpc::Status s) {
      if (!s.ok()) {
        if (!stop_->load()) Failed("acquire", s);  // else the server's shutdown ended the poll
        return Next(std::nullopt);
      }
      if (!offered_.has_job()) return Next(std::nullopt);
      if (protocol_ == SimProtocol::kSlots) {
        Hold(std::move(*offered_.mutable_job()));
        for (Job& more : *offered_.mutable_more_jobs()) Hold(std::move(more));
        return Next(std::nullopt);
      }
      Next(std::move(*offered_.mutable_job()));
    });
  }

  // The no-op job's step metrics first..last.
  static void AddSteps(ReportRequest* report, int first, int last) {
    for (int i = first; i <= last; ++i) {
      StepMetrics* m = report->add_steps();
      m->set_step(i);
      m->set_loss(5.0 - 0.001 * i);
      m->set_grad_norm(1.0);
      m->set_lr(1e-3);
      m->set_tokens_per_s(1e5);
    }
  }

  // kSlots: a job taken, to be ended with the others held in the next Finish.
  void Hold(Job job) {
    jobs_.push_back({job.run_id(), job.attempt(), job.sweep(), std::chrono::steady_clock::now()});
    held_.push_back(std::move(job));
  }

  // kSlots: one Finish for every held job, each with its whole batch, taking the next ones.
  void FinishHeld() {
    finish_.Clear();
    for (size_t i = 0; i < held_.size(); ++i) {
      const Job& job = held_[i];
      FinishRequest* f = i == 0 ? &finish_ : finish_.add_more();
      const int points = points_ > 0 ? points_ : static_cast<int>(job.config().train().steps());
      f->set_worker_id(worker_id_);
      f->set_run_id(job.run_id());
      f->set_attempt(job.attempt());
      f->set_lease_secret(job.lease_secret());
      ReportRequest* report = f->mutable_final_report();
      report->set_seq(1);
      AddSteps(report, 1, points);
      RunSummary* summary = f->mutable_summary();
      summary->set_state(SUCCEEDED);
      summary->set_steps_done(points);
      summary->set_final_train_loss(5.0 - 0.001 * points);
    }
    // Only as many next jobs as this worker will still run.
    const int64_t left =
        max_jobs_ == 0 ? slots_ : max_jobs_ - static_cast<int64_t>(jobs_.size());
    finish_.set_acquire_next(WantsMore());
    finish_.set_acquire_max(static_cast<int32_t>(std::clamp<int64_t>(left, 1, slots_)));
    finished_reply_.Clear();
    NewContext(std::chrono::seconds(30));
    stub_->async()->Finish(ctx_.get(), &finish_, &finished_reply_, [this](grpc::Status s) {
      const size_t ended = held_.size();
      held_.clear();
      if (!s.ok()) {
        Failed("finish", s);
        return Next(std::nullopt);
      }
      int64_t ok = 1;
      for (const std::string& e : finished_reply_.more_errors()) {
        if (e.empty()) {
          ++ok;
        } else {
          errors_.push_back("finish (more): " + e);
        }
      }
      if (finished_ != nullptr) finished_->fetch_add(std::min<int64_t>(ok, ended));
      if (finished_reply_.has_next_job()) Hold(std::move(*finished_reply_.mutable_next_job()));
      for (Job& more : *finished_reply_.mutable_more_next_jobs()) Hold(std::move(more));
      Next(std::nullopt);
    });
  }

  void Start(Job job) {
    job_ = std::move(job);
    jobs_.push_back(
        {job_.run_id(), job_.attempt(), job_.sweep(), std::chrono::steady_clock::now()});
    points_now_ = points_ > 0 ? points_ : static_cast<int>(job_.config().train().steps());
    batch_now_ = batch_ > 0 ? batch_ : std::max(points_now_, 1);
    finish_.Clear();
    Report(1, 1);
  }

  // Sends the batch of steps from `first` on (numbered `seq`); the last one rides in the Finish
  // when the protocol carries it.
  void Report(int first, int64_t seq) {
    const bool carries = protocol_ == SimProtocol::kFinishCarries;
    if (first > points_now_) return Finish();
    const bool last = first + batch_now_ > points_now_;
    ReportRequest* report = carries && last ? finish_.mutable_final_report() : &report_;
    report->Clear();
    report->set_worker_id(worker_id_);
    report->set_run_id(job_.run_id());
    report->set_attempt(job_.attempt());
    report->set_lease_secret(job_.lease_secret());
    report->set_seq(seq);
    AddSteps(report, first, std::min(first + batch_now_ - 1, points_now_));
    if (carries && last) return Finish();
    reported_.Clear();
    NewContext(std::chrono::seconds(30));
    stub_->async()->Report(ctx_.get(), &report_, &reported_, [this, first, seq](grpc::Status s) {
      if (!s.ok()) {
        Failed("report", s);
        return Next(std::nullopt);  // the job is dropped; its lease expires
      }
      Report(first + batch_now_, seq + 1);
    });
  }

  void Finish() {
    finish_.set_worker_id(worker_id_);
    finish_.set_run_id(job_.run_id());
    finish_.set_attempt(job_.attempt());
    finish_.set_lease_secret(job_.lease_secret());
    // The next job only when this worker will run it (a leased job nobody runs waits for its
    // lease to expire).
    finish_.set_acquire_next(protocol_ == SimProtocol::kFinishCarries && WantsMore());
    RunSummary* summary = finish_.mutable_summary();
    summary->set_state(SUCCEEDED);
    summary->set_steps_done(points_now_);
    summary->set_final_train_loss(5.0 - 0.001 * points_now_);
    finished_reply_.Clear();
    NewContext(std::chrono::seconds(30));
    stub_->async()->Finish(ctx_.get(), &finish_, &finished_reply_, [this](grpc::Status s) {
      if (!s.ok()) {
        Failed("finish", s);
        return Next(std::nullopt);
      }
      if (finished_ != nullptr) finished_->fetch_add(1);
      if (!finished_reply_.has_next_job()) return Next(std::nullopt);
      Next(std::move(*finished_reply_.mutable_next_job()));
    });
  }

  // A fresh context for the next call (one call is outstanding at a time). The last call's is
  // kept one call longer: the next call starts inside its completion.
  void NewContext(std::chrono::seconds timeout) {
    last_ctx_ = std::move(ctx_);
    ctx_ = std::make_unique<grpc::ClientContext>();
    Prepare(ctx_.get(), timeout);
  }

  void Prepare(grpc::ClientContext* ctx, std::chrono::seconds timeout) {
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    ctx->AddMetadata("authorization", bearer_);
  }
  bool Failed(const char* what, const grpc::Status& s) {
    errors_.push_back(std::string(what) + ": " + s.error_message());
    return false;
  }
  std::unique_ptr<WorkerService::Stub> stub_;
  const std::string bearer_;
  const std::string name_;
  const int points_;
  const int batch_;
  const SimProtocol protocol_;
  const int slots_;
  int64_t worker_id_ = 0;
  std::string worker_secret_;  // RegisterResponse.worker_secret
  std::atomic<int64_t>* finished_ = nullptr;
  std::vector<SimJob> jobs_;
  std::vector<std::string> errors_;

  // Run()'s state, touched by one call's completion at a time.
  const std::atomic<bool>* stop_ = nullptr;
  int wait_s_ = 1;
  int64_t max_jobs_ = 0;
  std::unique_ptr<grpc::ClientContext> ctx_, last_ctx_;
  AcquireJobRequest acquire_;
  AcquireJobResponse offered_;
  Job job_;
  std::vector<Job> held_;  // kSlots: jobs taken and not yet ended
  int points_now_ = 0, batch_now_ = 0;
  ReportRequest report_;
  ReportResponse reported_;
  FinishRequest finish_;
  FinishResponse finished_reply_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool running_ = false;
};

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_SIM_WORKER_H_
