// CoordinatorCore's worker API, but for Finish (finish.cc): Register, AcquireJob (the long poll,
// the starts of the runs it picks and the jobs made of them), Report, Deregister; and the checks
// the background thread runs: CheckLeases (an expired lease ends its attempt LOST) and
// CheckWorkers (a silent worker is GONE).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/credentials.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/coordinator/core.h"
#include "orchestrator/coordinator/core_internal.h"
#include "orchestrator/coordinator/door.h"
#include "orchestrator/store/reader.h"

namespace ablate {

using core_internal::OfferFrom;
using core_internal::ResourcesOf;
using core_internal::StartOn;

namespace {

// The template of a run queued without one (ToQueued), from its stored config.
absl::StatusOr<std::shared_ptr<const JobTemplate>> TemplateOf(const RunInfo& run) {
  auto t = std::make_shared<JobTemplate>();
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(run.config_json, &t->config, parse);
  if (!parsed.ok()) {
    return absl::InternalError(absl::StrCat("run ", run.id, ": stored config does not parse: ",
                                            parsed.ToString()));
  }
  t->sweep = run.sweep;
  t->variant = run.variant;
  return t;
}

}  // namespace

std::string CoordinatorCore::WaitingForBuild(const WorkerOffer& offer) {
  const std::string needed = scheduler_.OtherBuildNeeded(offer);
  if (needed.empty()) return "";
  return absl::StrCat("built from ", offer.code_version, "; queued runs need ", needed);
}

absl::StatusOr<RegisterResponse> CoordinatorCore::Register(const RegisterRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("register: no worker name");
  if (request.ByteSizeLong() > kMaxRegisterBytes) {
    return absl::InvalidArgumentError(absl::StrCat("register: the request is ",
                                                   request.ByteSizeLong(), " bytes; the limit is ",
                                                   kMaxRegisterBytes));
  }
  // Its runs would be trained by code nobody can name: refused rather than trusted.
  if (request.resources().code_version().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "register: worker ", request.name(),
        " sends no code version: it was built before ablate matched workers to the build of "
        "their runs; rebuild it (cmake --build) from the sources of the sweeps it should train"));
  }
  {
    absl::MutexLock lock(&mu_);
    int live = registering_;
    for (const auto& [id, seen] : worker_seen_) live += seen.state != "GONE";
    if (live >= options_.max_workers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "register: the coordinator has ", live, " registered workers, its limit (a worker "
          "that leaves, or is silent for ",
          absl::FormatDuration(options_.scheduler.lease_timeout), ", frees its place)"));
    }
    ++registering_;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(request.resources(), &json, print);
  absl::StatusOr<int64_t> id = store_->RegisterWorker(request.name(), json);
  if (!id.ok()) {
    absl::MutexLock lock(&mu_);
    --registering_;
    return id.status();
  }
  const WorkerOffer offer = OfferFrom(request.resources());
  {
    absl::MutexLock lock(&mu_);
    --registering_;
    workers_[*id] = offer;
    scheduler_.AddWorker(*id, offer);
    worker_names_[*id] = request.name();
    const absl::Time now = options_.clock->Now();
    worker_seen_[*id] = WorkerSeen{"IDLE", now, now};  // as RegisterWorker wrote it
  }
  RegisterResponse response;
  response.set_worker_id(*id);
  response.set_worker_secret(WorkerSecret(lease_mac_, *id));
  response.set_lease_timeout_s(static_cast<int32_t>(
      std::max<int64_t>(1, absl::ToInt64Seconds(options_.scheduler.lease_timeout))));
  return response;
}

absl::StatusOr<WorkerOffer> CoordinatorCore::OfferOf(int64_t worker_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end()) return it->second;
  }
  // Registered before a coordinator restart: its resources are in the store.
  absl::StatusOr<std::vector<WorkerInfo>> workers = store_->scheduling_reader().ListWorkers();
  if (!workers.ok()) return workers.status();
  for (const WorkerInfo& w : *workers) {
    if (w.id != worker_id) continue;
    WorkerOffer offer = OfferFrom(ResourcesOf(w));
    absl::MutexLock lock(&mu_);
    workers_[worker_id] = offer;
    scheduler_.AddWorker(worker_id, offer);
    worker_names_[worker_id] = w.name;
    return offer;
  }
  return absl::NotFoundError(
      absl::StrCat("worker ", worker_id, " is not registered: register again"));
}

absl::StatusOr<ReportShape> CoordinatorCore::ShapeOfLease(const Lease& lease) {
  std::optional<ReportShape> known;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = shapes_.find(lease.run_id); it != shapes_.end()) known = it->second;
  }
  if (!known.has_value()) {
    absl::StatusOr<RunInfo> info = store_->scheduling_reader().GetRun(lease.run_id);
    if (!info.ok()) return info.status();
    absl::StatusOr<std::shared_ptr<const JobTemplate>> parsed = TemplateOf(*info);
    if (!parsed.ok()) return parsed.status();
    known = ReportShapeOf((*parsed)->config);
    absl::MutexLock lock(&mu_);
    shapes_[lease.run_id] = *known;
  }
  known->total_steps = lease.total_steps;
  known->stop_at_step = lease.stop_at_step;
  return *known;
}

absl::StatusOr<Job> CoordinatorCore::MakeJob(const QueuedRun& run, int32_t attempt,
                                             int64_t worker_id, bool part) {
  std::shared_ptr<const JobTemplate> made = run.job;
  if (made == nullptr) {
    absl::StatusOr<RunInfo> info = store_->scheduling_reader().GetRun(run.run_id);
    if (!info.ok()) return info.status();
    absl::StatusOr<std::shared_ptr<const JobTemplate>> parsed = TemplateOf(*info);
    if (!parsed.ok()) return parsed.status();
    made = *std::move(parsed);
  }
  {
    absl::MutexLock lock(&mu_);
    shapes_[run.run_id] = ReportShapeOf(made->config);
  }
  Job job;
  job.set_run_id(run.run_id);
  job.set_attempt(attempt);
  *job.mutable_config() = made->config;
  job.set_checkpoint_dir(absl::StrCat(options_.checkpoint_root, "/run-", run.run_id));
  // A first attempt has no earlier one to resume from.
  if (attempt > 1) {
    absl::StatusOr<AttemptInfo> checkpoint =
        store_->scheduling_reader().LatestCheckpoint(run.run_id);
    if (!checkpoint.ok()) return checkpoint.status();
    job.set_resume_from_step(checkpoint->checkpoint_step);
  }
  job.set_sweep(made->sweep);
  job.set_variant(made->variant);
  if (made->config.has_program()) {
    const std::string& hash = made->config.program().code_hash();
    std::shared_ptr<const ProgramSnapshot> code;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = program_code_.find(hash); it != program_code_.end()) code = it->second;
    }
    if (code == nullptr) {
      absl::StatusOr<ProgramSnapshot> read = store_->scheduling_reader().GetProgramCode(hash);
      if (!read.ok()) return read.status();
      code = std::make_shared<const ProgramSnapshot>(*std::move(read));
      absl::MutexLock lock(&mu_);
      program_code_.emplace(hash, code);
    }
    *job.mutable_program() = *code;
  }
  job.set_lease_secret(LeaseSecret(lease_mac_, run.run_id, attempt, worker_id));
  job.set_world_size(std::max(1, run.needs.devices));
  job.set_stop_at_step(run.stop_at_step);
  std::optional<Lease> lease;
  std::optional<std::string> host;  // rank 0's worker's, while it is known
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(run.run_id);
    if (lease.has_value()) {
      if (auto it = workers_.find(lease->worker_id); it != workers_.end()) host = it->second.host;
    }
  }
  if (part && (!lease.has_value() || lease->members.empty())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run ", run.run_id, " attempt ", attempt, " ended before worker ", worker_id,
        " took its part"));
  }
  if (lease.has_value() && !lease->members.empty()) {
    const GangMember* mine = lease->MemberOf(worker_id);
    if (mine == nullptr || lease->attempt != attempt) {
      return absl::FailedPreconditionError(absl::StrCat(
          "run ", run.run_id, " attempt ", attempt, " has no part on worker ", worker_id));
    }
    if (!host.has_value() || host->empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "run ", run.run_id, ": rank 0's worker ", lease->worker_id,
          host.has_value() ? " registered no hostname or rendezvous_host" : " is gone"));
    }
    job.set_rank_offset(mine->rank_offset);
    job.set_local_ranks(mine->slots);
    job.set_rendezvous(absl::StrCat(*host, ":", RendezvousPort(run.run_id, attempt)));
  }
  return job;
}

int CoordinatorCore::SlotsInUse(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  return scheduler_.SlotsInUse(worker_id);
}

int CoordinatorCore::RendezvousPort(int64_t run_id, int32_t attempt) const {
  const int lo = options_.rendezvous_ports.first, hi = options_.rendezvous_ports.second;
  const uint64_t mix = static_cast<uint64_t>(run_id) * 1000003u + static_cast<uint64_t>(attempt) * 7919u;
  return lo + static_cast<int>(mix % static_cast<uint64_t>(hi - lo + 1));
}

absl::Status CoordinatorCore::CheckWorkerSecret(absl::string_view what,
                                                absl::string_view presented,
                                                int64_t worker_id) const {
  if (LeaseSecretEquals(presented, WorkerSecret(lease_mac_, worker_id))) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": ", presented.empty() ? "no" : "a wrong", " worker secret for worker ", worker_id,
      " (only the worker that registered as it may act as it: send RegisterResponse's "
      "worker_secret)"));
}

absl::Status CoordinatorCore::CheckLeaseSecret(absl::string_view what, absl::string_view presented,
                                               int64_t run_id, int32_t attempt,
                                               int64_t worker_id) const {
  if (LeaseSecretEquals(presented, LeaseSecret(lease_mac_, run_id, attempt, worker_id))) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": wrong lease secret for run ", run_id, " attempt ", attempt, " on worker ",
      worker_id, " (only the worker the attempt was leased to may report or finish it)"));
}

void CoordinatorCore::NoteWorker(int64_t worker_id, const char* state) {
  const absl::Time now = options_.clock->Now();
  {
    absl::MutexLock lock(&mu_);
    WorkerSeen& seen = worker_seen_[worker_id];
    seen.contact = now;
    if (seen.state == state && now - seen.written < kWorkerSeenInterval) return;
    seen.state = state;
    seen.written = now;
  }
  (void)store_->EnqueueHeartbeat(worker_id, state);
}

void CoordinatorCore::NoteWorkerBySlots(int64_t worker_id) {
  NoteWorker(worker_id, SlotsInUse(worker_id) > 0 ? "BUSY" : "IDLE");
}

absl::StatusOr<AcquireJobResponse> CoordinatorCore::AcquireJob(const AcquireJobRequest& request,
                                                           absl::Time deadline) {
  if (absl::Status s = CheckWorkerSecret("acquire", request.worker_secret(), request.worker_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<WorkerOffer> offer = OfferOf(request.worker_id());
  if (!offer.ok()) return offer.status();
  // A worker of several slots asks for more while some train: BUSY.
  NoteWorkerBySlots(request.worker_id());
  const absl::Duration wait =
      std::min(absl::Seconds(std::max(0, request.wait_s())), options_.max_acquire_wait);
  deadline = std::min(deadline, absl::Now() + wait);
  const int max_jobs = std::max(1, request.max_jobs());
  AcquireJobResponse response;
  for (;;) {
    std::vector<QueuedRun> runs;
    std::vector<GangPart> parts;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return response;
      // Gang parts first: their slots are held already.
      parts = scheduler_.TakeParts(request.worker_id());
      const int more = max_jobs - static_cast<int>(parts.size());
      if (more > 0) runs = scheduler_.AcquireUpTo(request.worker_id(), *offer, more);
      if (runs.empty() && parts.empty()) {
        if (absl::Now() >= deadline) {
          response.set_waiting(WaitingForBuild(*offer));
          return response;
        }
        // Wake on new work, or every second (a backoff may have ended).
        work_cv_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Seconds(1)));
        continue;
      }
    }
    // A gang's part for a member other than rank 0's worker: started already, by that worker.
    for (const GangPart& part : parts) {
      absl::StatusOr<Job> job =
          MakeJob(part.run, part.attempt, request.worker_id(), /*part=*/true);
      if (job.ok()) {
        NoteWorker(request.worker_id(), "BUSY");
        *(response.has_job() ? response.add_more_jobs() : response.mutable_job()) = *std::move(job);
        continue;
      }
      // Rank 0 would wait for this part until the lease expired: the attempt ends now.
      (void)EndAttemptAndRetry(part.run.run_id, part.run.sweep_id, part.attempt, "FAILED",
                               absl::StrCat("the part of worker ", request.worker_id(),
                                            " could not be made: ", job.status().message()));
    }
    if (runs.empty()) {
      if (response.has_job()) return response;
      continue;
    }
    std::vector<RunTransition> starts;
    for (const QueuedRun& run : runs) starts.push_back(StartOn(run.run_id, request.worker_id()));
    std::vector<absl::StatusOr<TransitionResult>> started = store_->TransitionRuns(starts);
    absl::Status first_error;  // returned when no job could be made
    for (size_t i = 0; i < runs.size(); ++i) {
      absl::StatusOr<std::optional<Job>> job =
          LeaseStarted(request.worker_id(), runs[i], started[i]);
      if (!job.ok()) {
        if (first_error.ok()) first_error = job.status();
        continue;
      }
      if (!job->has_value()) continue;
      if (!response.has_job()) {
        *response.mutable_job() = **std::move(job);
      } else {
        *response.add_more_jobs() = **std::move(job);
      }
    }
    if (response.has_job()) return response;
    if (!first_error.ok()) return first_error;
  }
}

absl::StatusOr<std::optional<Job>> CoordinatorCore::LeaseStarted(
    int64_t worker_id, const QueuedRun& run, const absl::StatusOr<TransitionResult>& started) {
  if (!started.ok()) {
    absl::MutexLock lock(&mu_);
    scheduler_.Release(run.run_id);
    // Cancelled meanwhile (FailedPrecondition): dropped. A store hiccup: queued again.
    if (!absl::IsFailedPrecondition(started.status())) scheduler_.Enqueue(run);
    if (absl::IsUnavailable(started.status())) return started.status();
    return std::nullopt;
  }
  std::string gang;  // who trains which ranks, for the run's event log
  {
    absl::MutexLock lock(&mu_);
    scheduler_.SetLeaseAttempt(run.run_id, started->attempt);
    // A gang's other members wait in their polls for the started attempt.
    if (std::optional<Lease> lease = scheduler_.GetLease(run.run_id);
        lease.has_value() && !lease->members.empty()) {
      work_cv_.SignalAll();
      std::vector<std::string> parts;
      for (const GangMember& m : lease->members) {
        auto it = worker_names_.find(m.worker_id);
        parts.push_back(absl::StrCat("ranks ", m.rank_offset, "-", m.rank_offset + m.slots - 1,
                                     " on ", it != worker_names_.end() ? it->second : "?",
                                     " (worker ", m.worker_id, ")"));
      }
      gang = absl::StrCat("run ", run.run_id, " attempt ", started->attempt, " is a gang of ",
                          lease->members.size(), " workers: ", absl::StrJoin(parts, ", "));
    }
  }
  absl::StatusOr<Job> job = MakeJob(run, started->attempt, worker_id);
  if (job.ok() && !gang.empty()) {
    absl::StrAppend(&gang, "; rendezvous ", job->rendezvous());
    (void)store_->EnqueueEvent(run.sweep_id, run.run_id, "gang", gang);
  }
  if (!job.ok()) {
    (void)EndAttemptAndRetry(run.run_id, run.sweep_id, started->attempt, "FAILED",
                             std::string(job.status().message()));
    return job.status();
  }
  NoteWorker(worker_id, "BUSY");
  return std::optional<Job>(*std::move(job));
}

absl::StatusOr<MetricBatch> CoordinatorCore::BatchOf(const ReportRequest& r, int64_t run_id,
                                                     int32_t attempt, absl::string_view what,
                                                     absl::string_view advice) const {
  MetricBatch batch;
  batch.run_id = run_id;
  batch.attempt = attempt;
  batch.seq = r.seq();
  batch.steps.assign(r.steps().begin(), r.steps().end());
  batch.evals.assign(r.evals().begin(), r.evals().end());
  batch.spikes.assign(r.spikes().begin(), r.spikes().end());
  if (r.has_params()) batch.params = r.params();
  if (batch.Rows() > options_.max_batch_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " ", batch.Rows(),
                                                     " rows; the limit is ",
                                                     options_.max_batch_rows, ": ", advice));
  }
  return batch;
}

absl::StatusOr<ReportResponse> CoordinatorCore::Report(const ReportRequest& request) {
  if (absl::Status s = CheckLeaseSecret("report", request.lease_secret(), request.run_id(),
                                        request.attempt(), request.worker_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<MetricBatch> converted =
      BatchOf(request, request.run_id(), request.attempt(), "report: the batch has",
              "send smaller batches");
  if (!converted.ok()) return converted.status();
  const MetricBatch& batch = *converted;
  if (request.seq() < 0) return absl::InvalidArgumentError("report: seq must be >= 0");
  if (request.seq() == 0 && batch.Rows() > 2) {
    return absl::InvalidArgumentError(
        "report: seq 0 is a heartbeat; number metric batches 1, 2, 3...");
  }
  const auto not_leased = [&] {
    return absl::FailedPreconditionError(
        absl::StrCat("report: run ", request.run_id(), " attempt ", request.attempt(),
                     " is not leased to worker ", request.worker_id(),
                     " (lease lost, finished or cancelled): stop this attempt"));
  };
  std::optional<Lease> lease;
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
  }
  if (!lease.has_value() || lease->attempt != request.attempt() ||
      !lease->Holds(request.worker_id())) {
    return not_leased();
  }
  if (lease->worker_id != request.worker_id() &&
      (request.seq() != 0 || request.checkpoint_step() != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "report: worker ", request.worker_id(), " trains ranks from ",
        lease->MemberOf(request.worker_id())->rank_offset, " of run ", request.run_id(),
        ": only rank 0's worker reports metrics and checkpoints; send heartbeats (seq 0)"));
  }
  // Checked before it renews anything: a refused batch is not progress.
  absl::StatusOr<ReportShape> shape = ShapeOfLease(*lease);
  if (!shape.ok()) return shape.status();
  if (absl::Status s = CheckReportAtDoor(request, *shape, "report"); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (!scheduler_.Renew(request.run_id(), request.attempt(), request.worker_id())) {
      return not_leased();
    }
  }
  NoteWorker(request.worker_id(), "BUSY");
  // Queued before the batch: committed by the time the batch is acknowledged.
  if (request.checkpoint_step() > 0) {
    if (absl::Status s = store_->EnqueueCheckpoint(request.run_id(), request.attempt(),
                                                   request.checkpoint_path(),
                                                   request.checkpoint_step());
        !s.ok()) {
      return s;
    }
  }
  ReportResponse response;
  if (request.seq() > 0) {
    absl::StatusOr<ReportResult> result = store_->ReportMetrics(batch);
    if (!result.ok()) return result.status();
    response.set_duplicate(result->duplicate);
  } else if (request.checkpoint_step() > 0) {
    if (absl::Status s = store_->Flush(); !s.ok()) return s;
  }
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
  }
  if (lease.has_value() && lease->stop) response.set_directive(DIRECTIVE_STOP);
  // A tuned run that trains through its rungs is decided on as its evaluations arrive. One that
  // pauses at a rung (stop_at_step) is decided when it pauses: no store read per report here.
  if (lease.has_value() && lease->tuned && lease->stop_at_step == 0 && !lease->stop &&
      !batch.evals.empty() && !response.duplicate()) {
    tuner_.TuneAfterEval(request.run_id());
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
    if (lease.has_value() && lease->stop) response.set_directive(DIRECTIVE_STOP);
  }
  // The worker's notices (an unreadable checkpoint moved aside...) go to the event log once: not
  // again with a duplicate batch, never from a heartbeat.
  if (request.seq() > 0 && !response.duplicate() && request.notices_size() > 0) {
    int stored = 0;
    {
      absl::MutexLock lock(&mu_);
      stored = notices_of_[request.run_id()];
      notices_of_[request.run_id()] += request.notices_size();
    }
    const int64_t sweep_id = lease.has_value() ? lease->sweep_id : 0;
    for (const std::string& line : request.notices()) {
      if (stored == kMaxNoticesPerRun) {
        (void)store_->EnqueueEvent(
            sweep_id, request.run_id(), "worker_notice",
            absl::StrCat("run ", request.run_id(), ": further worker notices are dropped (",
                         kMaxNoticesPerRun, " a run)"));
      }
      if (stored++ >= kMaxNoticesPerRun) continue;
      (void)store_->EnqueueEvent(sweep_id, request.run_id(), "worker_notice",
                                 absl::StrCat("run ", request.run_id(), " attempt ",
                                              request.attempt(), ": ", line));
    }
  }
  return response;
}

absl::StatusOr<DeregisterResponse> CoordinatorCore::Deregister(const DeregisterRequest& request) {
  if (absl::Status s =
          CheckWorkerSecret("deregister", request.worker_secret(), request.worker_id());
      !s.ok()) {
    return s;
  }
  if (absl::StatusOr<WorkerOffer> offer = OfferOf(request.worker_id()); !offer.ok()) {
    return offer.status();
  }
  {
    absl::MutexLock lock(&mu_);
    WorkerSeen& seen = worker_seen_[request.worker_id()];
    seen.state = "GONE";
    seen.written = options_.clock->Now();
    workers_.erase(request.worker_id());
    scheduler_.RemoveWorker(request.worker_id());
  }
  if (absl::Status s = store_->EnqueueWorkerGone(request.worker_id()); !s.ok()) return s;
  return DeregisterResponse();
}

int CoordinatorCore::CheckWorkers() {
  std::vector<int64_t> silent;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    for (auto& [id, seen] : worker_seen_) {
      if (seen.state == "GONE" || now - seen.contact <= options_.scheduler.lease_timeout) continue;
      seen.state = "GONE";
      seen.written = now;
      silent.push_back(id);
      workers_.erase(id);
      scheduler_.RemoveWorker(id);
    }
  }
  for (int64_t id : silent) (void)store_->EnqueueWorkerGone(id);
  return static_cast<int>(silent.size());
}

int CoordinatorCore::CheckLeases() {
  std::vector<Lease> expired;
  {
    absl::MutexLock lock(&mu_);
    expired = scheduler_.ExpireLeases();
  }
  int lost = 0;
  for (const Lease& lease : expired) {
    // A gang's: the member whose part expired first (the silent one).
    int64_t silent = lease.worker_id;
    for (const GangMember& m : lease.members) {
      if (!m.done && m.expiry <= lease.expiry) silent = m.worker_id;
    }
    std::string worker = absl::StrCat("#", silent);
    {
      absl::MutexLock lock(&mu_);
      if (auto it = worker_names_.find(silent); it != worker_names_.end()) worker = it->second;
    }
    const std::string reason = absl::StrCat(
        "lease lost: no report from worker ", worker, " for ",
        absl::FormatDuration(options_.scheduler.lease_timeout),
        lease.members.empty()
            ? ""
            : absl::StrCat(" (it trained ranks from ", lease.MemberOf(silent)->rank_offset,
                           " of ", lease.members.size(), " workers' gang)"));
    absl::Status s =
        EndAttemptAndRetry(lease.run_id, lease.sweep_id, lease.attempt, "LOST", reason);
    if (s.ok()) {
      ++lost;
    } else if (absl::IsUnavailable(s) || absl::IsResourceExhausted(s)) {
      // The store cannot write now: keep the lease so the next check tries again.
      absl::MutexLock relock(&mu_);
      scheduler_.Reinstate(lease);
    } else {
      // FailedPrecondition: the attempt finished meanwhile; nothing to do.
      absl::MutexLock relock(&mu_);
      scheduler_.Release(lease.run_id);
    }
  }
  return lost;
}

}  // namespace ablate
