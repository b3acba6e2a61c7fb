// A job from its lease to its Finish (agent_internal.h): the job thread, the slots it waits for,
// its config and checkpoint dir, its reporter, and the three ways it runs: trained by a Trainer in
// this process (one slot), in a job process of its own (several slots side by side), or as a
// gang member's ranks whose rank 0 trains on another worker. Then its reports are flushed and its
// Finish sent, which may hand over the next job.
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/durable_file.h"
#include "config/program_snapshot.h"
#include "config/proto_yaml.h"
#include "proto/grpc_status.h"
#include "worker/agent/agent_internal.h"
#include "worker/agent/calls.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

using agent::Backoff;
using agent::JobReporter;
using agent::LeaseLost;
using agent::kJournalFile;
using agent::LoadJournal;
using agent::OutboxItem;
using agent::ReportingObserver;
using agent::SleepUnless;
using agent::Transient;

}  // namespace

void Agent::Impl::JobThread(Job first) {
  std::optional<Job> job = std::move(first);
  while (job.has_value()) {
    std::optional<Job> next;
    absl::Status status = RunJob(*job, &next);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (fatal_.ok()) fatal_ = status;
      interrupt_.store(true);
      break;
    }
    job = std::move(next);
    if (job.has_value() && Interrupted()) {
      // Handed over as the interrupt came: given back untouched, queued again at once.
      if (absl::Status s = GiveBack(*job, "the worker stopped before starting it"); !s.ok()) {
        absl::MutexLock lock(&mu_);
        if (fatal_.ok()) fatal_ = s;
      }
      absl::MutexLock lock(&mu_);
      Unclaim(*job);
      job.reset();
    }
  }
  absl::MutexLock lock(&mu_);
  --threads_running_;
  ++changes_;
  idle_since_ = absl::Now();
}

Agent::Impl::JobAttempt::JobAttempt(const Job& job, absl::Duration lease_timeout)
    : job(job),
      leased_at(MonotonicNow()),
      third_of_lease(lease_timeout > absl::ZeroDuration() ? lease_timeout / 3
                                                          : absl::Seconds(10)),
      run(absl::StrCat("run ", job.run_id(), " attempt ", job.attempt())),
      world(std::max(1, job.world_size())),
      local(LocalRanks(job)),
      member(job.rank_offset() > 0) {}

absl::Status Agent::Impl::RunJob(const Job& job, std::optional<Job>* next) {
  JobAttempt a(job, lease_timeout_);
  // The slots it trains on. The coordinator leases no more than the worker has, but a job of
  // ours may still be finishing: wait for it, not past a third of the lease (its slots are then
  // not coming: given back).
  if (a.local <= slots()) {
    std::optional<std::vector<int>> got = TakeSlots(a.local, a.third_of_lease);
    if (!got.has_value()) {
      absl::Status s = GiveBack(job, Interrupted() ? "the worker stopped before starting it"
                                                   : "the worker had no free slot for it");
      absl::MutexLock lock(&mu_);
      Unclaim(job);
      return s;
    }
    a.taken = *std::move(got);
  }
  a.own_process = slots() > 1 && !job.config().has_program();  // a program is its own process
  a.config = ConfigFor(a);
  a.dir = CheckpointDir(job);
  // A gang's members share the checkpoint dir: each its own config (its device and threads).
  a.config_path = (fs::path(a.dir) / (a.member
                                          ? absl::StrCat("job-config-ranks-", job.rank_offset(),
                                                         ".json")
                                          : std::string("job-config.json")))
                      .string();
  a.journal_path = (fs::path(a.dir) / kJournalFile).string();
  LogStart(a);

  JobReporter reporter(ReporterParams(a));
  OtherRanks ranks(this, a.run);
  Training t;
  Train(a, &reporter, &ranks, &t);
  ranks.WaitForOthers(&t.summary);
  t.process.reset();
  t.program.reset();
  if (t.trainer != nullptr) {
    // A job trained here kept its freed memory in the heap (KeepFreedMemoryInHeap): give it back
    // now that the job is done, not when the agent exits.
    t.trainer.reset();
    malloc_trim(0);
  }
  if (a.local <= slots()) FreeSlots(a.taken);

  if (std::optional<absl::Status> ended = FlushReports(a, &reporter, &t)) return *ended;
  std::error_code ec;
  if (!a.member) fs::remove(a.journal_path, ec);  // every point is acknowledged (rank 0's)
  return FinishJob(a, t, next);
}

RunConfig Agent::Impl::ConfigFor(const JobAttempt& a) const {
  RunConfig config = a.job.config();
  config.mutable_train()->set_device(DeviceOf(a.taken[0], config.train().device()));
  const bool on_cpu =
      config.train().device().empty() || absl::StartsWith(config.train().device(), "cpu");
  if (a.own_process && config.train().threads() == 0 && on_cpu) {
    // The cores split between the slots (each rank of a data-parallel job holds one): its
    // core group's, which its processes are pinned to.
    const std::vector<int> group = CoreGroup(a.taken[0]);
    config.mutable_train()->set_threads(
        group.empty() ? std::max(1, resources_.cores() / slots()) : static_cast<int>(group.size()));
  } else if (a.local < a.world && config.train().threads() == 0 && on_cpu) {
    // A gang's part: this worker's cores between its ranks (not the whole world's).
    config.mutable_train()->set_threads(std::max(1, resources_.cores() / slots()));
  }
  return config;
}

void Agent::Impl::LogStart(const JobAttempt& a) {
  const Job& job = a.job;
  log_(absl::StrCat(
      a.run, " (", job.sweep(), job.variant().empty() ? "" : "/", job.variant(),
      "): ", a.config.train().steps(), " steps on ", a.config.train().device(),
      a.world > 1 ? absl::StrCat(" x ", a.world, " ranks") : "",
      a.local < a.world ? absl::StrCat(" (ranks ", job.rank_offset(), "-",
                                       job.rank_offset() + a.local - 1, " here, rendezvous ",
                                       job.rendezvous(), ")")
                        : "",
      a.own_process ? absl::StrCat(" (slot", a.taken.size() > 1 ? "s " : " ",
                                   absl::StrJoin(a.taken, ","), ")")
                    : "",
      ", checkpoints in ", a.dir));
}

JobReporter::Params Agent::Impl::ReporterParams(const JobAttempt& a) {
  JobReporter::Params params;
  params.stub = stub_.get();
  params.options = &options_;
  params.connection = &connection_;
  params.log = &log_;
  params.worker_id = worker_id_;
  params.run_id = a.job.run_id();
  params.attempt = a.job.attempt();
  params.lease_secret = a.job.lease_secret();
  params.heartbeat = std::max(a.third_of_lease, options_.report_interval);
  params.lease_timeout = lease_timeout_;
  params.leased_at = a.leased_at;
  params.journal_path = a.journal_path;
  return params;
}

void Agent::Impl::Train(const JobAttempt& a, JobReporter* reporter, OtherRanks* ranks,
                        Training* t) {
  std::error_code ec;
  fs::create_directories(a.dir, ec);
  if (a.config.has_program() && !ec) {
    // A program's ranks are its own processes on this worker (ProgramProcess): never a gang's.
    const bool fits = a.local == a.world && a.job.rank_offset() == 0 && a.local <= slots();
    absl::StatusOr<int64_t> resumed =
        fits
            ? StartProgram(a, t)
            : absl::FailedPreconditionError(absl::StrCat(
                  "a program run's ranks must fit one worker: resources.devices is ", a.world,
                  ", this worker has ", slots(), " slot", slots() == 1 ? "" : "s",
                  a.local < a.world ? absl::StrCat(" (it was given ranks ", a.job.rank_offset(),
                                                   "-", a.job.rank_offset() + a.local - 1,
                                                   " of a gang: the coordinator gangs a run "
                                                   "across workers when none has enough slots)")
                                    : "",
                  "; start a worker with --slots ", a.world, " or ", a.world, " --device entries"));
    if (!resumed.ok()) {
      t->summary = resumed.status();
      if (!fits) t->permanent = true;
      reporter->Start({});
      return;
    }
    TrainFrom(*resumed, a, reporter, t);
    return;
  }
  absl::Status ready;
  if (ec) {
    ready = absl::InternalError(absl::StrCat("checkpoint dir ", a.dir, ": ", ec.message()));
  } else if (a.local > slots()) {
    ready = absl::FailedPreconditionError(absl::StrCat(
        "the job trains on ", a.local, " ranks", a.local < a.world ? " here" : "",
        "; this worker has ", slots(), " slots"));
  } else if (a.world > 1 || a.own_process) {
    ready = WriteFileAtomically(a.config_path, CanonicalJson(a.config) + "\n", 0600);
  }
  if (ready.ok()) ready = ranks->Start(a.job, a.config_path, a.dir, a.taken);
  if (!ready.ok()) {
    t->summary = ready;
    reporter->Start({});
    return;
  }
  if (a.member) {
    reporter->Start({});  // heartbeats: rank 0's worker reports the run
    t->summary = ranks->RunMember(reporter);
    return;
  }
  absl::StatusOr<int64_t> resumed =
      a.own_process ? StartProcess(a, *ranks, t) : StartTrainer(a, *ranks, t);
  if (!resumed.ok()) {
    t->summary = resumed.status();
    reporter->Start({});
    return;
  }
  TrainFrom(*resumed, a, reporter, t);
}

absl::StatusOr<int64_t> Agent::Impl::StartProcess(const JobAttempt& a, const OtherRanks& ranks,
                                                  Training* t) {
  JobProcessOptions p;
  p.config_path = a.config_path;
  p.checkpoint_dir = a.dir;
  p.world_size = a.world;
  p.rendezvous = ranks.rendezvous();
  p.collective_timeout_s = absl::ToDoubleSeconds(options_.collective_timeout);
  p.cpus = CoreGroup(a.taken[0]);
  p.stop_at_step = a.job.stop_at_step();
  absl::StatusOr<std::unique_ptr<JobProcess>> started = JobProcess::Start(options_.rank_binary, p);
  if (!started.ok()) return started.status();
  t->process = *std::move(started);
  return t->process->WaitStarted(&t->permanent);
}

absl::StatusOr<int64_t> Agent::Impl::StartTrainer(const JobAttempt& a, const OtherRanks& ranks,
                                                  Training* t) {
  TrainerOptions trainer_options;
  trainer_options.checkpoint_dir = a.dir;
  trainer_options.resume = true;  // continue a checkpoint that is already there
  trainer_options.interrupt = &interrupt_;
  trainer_options.stop_at_step = a.job.stop_at_step();  // a rung (tune: asha)
  if (a.world > 1) {
    trainer_options.world_size = a.world;
    trainer_options.rank = 0;
    trainer_options.rendezvous = ranks.rendezvous();
    trainer_options.collective_timeout = absl::ToChronoMilliseconds(options_.collective_timeout);
  }
  absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(a.config, trainer_options);
  if (!created.ok()) {
    // An invalid config or missing data fails the same way on every worker and attempt.
    t->permanent = absl::IsInvalidArgument(created.status()) || absl::IsNotFound(created.status());
    return created.status();
  }
  t->trainer = std::move(*created);
  return t->trainer->step();
}

absl::StatusOr<int64_t> Agent::Impl::StartProgram(const JobAttempt& a, Training* t) {
  const Job& job = a.job;
  if (job.program().code_hash() != a.config.program().code_hash()) {
    t->permanent = true;
    return absl::FailedPreconditionError(absl::StrCat(
        "the job carries program code ", job.program().code_hash().substr(0, 16),
        ", its config names ", a.config.program().code_hash().substr(0, 16)));
  }
  // Snapshots beside the checkpoint dirs, one per code hash, shared by the runs of that code.
  absl::StatusOr<std::string> code =
      MaterializeSnapshot(job.program(), (fs::path(a.dir).parent_path() / "programs").string());
  if (!code.ok()) {
    t->permanent = absl::IsInvalidArgument(code.status());
    return code.status();
  }
  ProgramAttempt p;
  p.config = a.config;
  p.run_id = job.run_id();
  p.attempt = job.attempt();
  p.code_dir = *code;
  p.checkpoint_dir = a.dir;
  p.log_path = (fs::path(a.dir) / "logs" / absl::StrCat("attempt-", job.attempt(), ".log")).string();
  p.resume_from_step = job.resume_from_step();
  p.stop_at_step = job.stop_at_step();
  p.device = a.config.train().device();
  p.world_size = a.world;
  if (a.world > 1) {
    // Each rank on its slot's device: CUDA_VISIBLE_DEVICES of its own.
    for (int slot : a.taken) {
      p.rank_devices.push_back(DeviceOf(slot, job.config().train().device()));
    }
  }
  absl::StatusOr<std::unique_ptr<ProgramProcess>> started = ProgramProcess::Start(p, &t->permanent);
  if (!started.ok()) return started.status();
  log_(absl::StrCat(a.run, ": program ", a.config.program().command(),
                    a.world > 1 ? absl::StrCat(" (", a.world, " ranks, pids ",
                                               absl::StrJoin((*started)->pids(), ", "))
                                : absl::StrCat(" (pid ", (*started)->pid()),
                    ", code ", *code, "), output in ", p.log_path,
                    a.world > 1 ? " (rank R's in attempt-N.rank-R.log)" : ""));
  t->program = *std::move(started);
  return p.resume_from_step;
}

void Agent::Impl::TrainFrom(int64_t step, const JobAttempt& a, JobReporter* reporter,
                            Training* t) {
  const Job& job = a.job;
  t->step = step;
  if (step > 0) {
    log_(absl::StrCat(a.run, ": resuming from the checkpoint of step ", step,
                      step < job.resume_from_step()
                          ? absl::StrCat(" (the coordinator knows one of step ",
                                         job.resume_from_step(), ")")
                          : ""));
  } else if (job.resume_from_step() > 0) {
    log_(absl::StrCat(a.run, ": no readable checkpoint in ", a.dir,
                      " (the coordinator knows one of step ", job.resume_from_step(),
                      "): starting from step 0"));
  }
  std::vector<OutboxItem> journalled = LoadJournal(a.journal_path, step);
  if (!journalled.empty()) {
    log_(absl::StrCat(a.run, ": resending ", journalled.size(),
                      " points an earlier attempt left unacknowledged"));
  }
  reporter->Start(std::move(journalled));
  ReportingObserver observer(reporter);
  if (t->program != nullptr) {
    t->summary = t->program->Run(
        &observer, &interrupt_, [reporter] { return reporter->ShouldStop(); }, &t->permanent);
    t->step = t->program->step();
  } else if (t->process != nullptr) {
    t->summary =
        t->process->Run(&observer, &interrupt_, [reporter] { return reporter->ShouldStop(); });
    t->step = t->process->step();
  } else {
    t->summary = t->trainer->Run(&observer);
    t->step = t->trainer->step();
  }
}

std::optional<absl::Status> Agent::Impl::FlushReports(const JobAttempt& a, JobReporter* reporter,
                                                      Training* t) {
  absl::Status flushed = reporter->Flush();
  if (flushed.ok()) return std::nullopt;
  if (flushed.code() == absl::StatusCode::kFailedPrecondition) {
    log_(absl::StrCat(a.run, ": abandoned without finishing at step ", t->step, ": ",
                      flushed.message()));
    absl::MutexLock lock(&mu_);
    ++result_.jobs_abandoned;
    Unclaim(a.job);
    return absl::OkStatus();
  }
  if (!absl::IsResourceExhausted(flushed)) {
    absl::MutexLock lock(&mu_);
    Unclaim(a.job);
    return flushed;
  }
  // A point no report can carry: the attempt fails with the reason, on every worker alike.
  t->summary = flushed;
  t->permanent = true;
  return std::nullopt;
}

absl::Status Agent::Impl::FinishJob(const JobAttempt& a, const Training& t,
                                    std::optional<Job>* next) {
  FinishRequest finish = FinishFor(a.job);
  finish.set_member(a.member);
  if (t.summary.ok()) {
    *finish.mutable_summary() = *t.summary;
  } else {
    RunSummary* s = finish.mutable_summary();
    s->set_state(FAILED);
    s->set_reason(std::string(t.summary.status().message()));
    s->set_steps_done(t.step);
    finish.set_error(t.summary.status().ToString());
    finish.set_permanent(t.permanent);
  }
  {
    absl::MutexLock lock(&mu_);
    Unclaim(a.job);  // the coordinator may lease its slots as soon as it reads the Finish
    finish.set_acquire_next(MayTakeMore());
    if (finish.acquire_next()) ++asking_;
  }
  absl::Status sent = SendFinish(finish, a.run, next);
  absl::MutexLock lock(&mu_);
  if (finish.acquire_next()) --asking_;
  if (next->has_value()) Claim(**next);
  return sent;
}

FinishRequest Agent::Impl::FinishFor(const Job& job) const {
  FinishRequest finish;
  finish.set_worker_id(worker_id_);
  finish.set_run_id(job.run_id());
  finish.set_attempt(job.attempt());
  finish.set_lease_secret(job.lease_secret());
  return finish;
}

absl::Status Agent::Impl::SendFinish(const FinishRequest& request, const std::string& run,
                                     std::optional<Job>* next) {
  Backoff backoff(options_.backoff_min, options_.backoff_max);
  while (true) {
    grpc::ClientContext context;
    Prepare(&context, options_.call_deadline);
    FinishResponse response;
    const grpc::Status status = stub_->Finish(&context, request, &response);
    if (status.ok()) {
      connection_.Reachable();
      const RunSummary& s = request.summary();
      if (request.member()) {  // rank 0's worker knows the steps
        log_(absl::StrCat(run, ": ", s.reason(), " ended (", RunState_Name(s.state()), ")"));
      } else {
        log_(absl::StrCat(run, ": ", RunState_Name(s.state()), " after ", s.steps_done(), " steps",
                          s.reason().empty() ? "" : absl::StrCat(" (", s.reason(), ")")));
      }
      if (next != nullptr && response.has_next_job()) *next = response.next_job();
      return absl::OkStatus();
    }
    if (LeaseLost(status.error_code())) {
      log_(absl::StrCat(run, ": the coordinator refused the finish (",
                        FromGrpcStatus(status).ToString(), "): the lease was lost"));
      return absl::OkStatus();
    }
    if (!Transient(status.error_code())) return Refused("Finish", status);
    connection_.Unreachable("Finish", status);
    if (!SleepUnless(backoff.Next(), options_.abort)) {
      return absl::AbortedError(absl::StrCat("gave up finishing ", run, " as ",
                                             RunState_Name(request.summary().state()),
                                             ": coordinator ", options_.coordinator,
                                             " is unreachable"));
    }
  }
}

absl::Status Agent::Impl::GiveBack(const Job& job, const std::string& why) {
  FinishRequest back = FinishFor(job);
  back.mutable_summary()->set_state(INTERRUPTED);
  back.mutable_summary()->set_reason(why);
  return SendFinish(back, absl::StrCat("run ", job.run_id(), " attempt ", job.attempt()));
}

std::string Agent::Impl::CheckpointDir(const Job& job) const {
  const std::string run_dir = absl::StrCat("run-", job.run_id());
  if (!options_.checkpoint_root.empty()) {
    return (fs::path(options_.checkpoint_root) / run_dir).string();
  }
  if (!job.checkpoint_dir().empty()) return job.checkpoint_dir();
  return (fs::path("checkpoints") / run_dir).string();
}

}  // namespace ablate
