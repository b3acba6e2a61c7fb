#include "orchestrator/coordinator/core.h"

#include <algorithm>
#include <cmath>
#include <variant>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "config/credentials.h"
#include "config/proto_yaml.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/coordinator/door.h"
#include "orchestrator/spec/expand.h"
#include "orchestrator/spec/spec.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/reader.h"

namespace ablate {

// The parts of a run's job that never change (a stored config is never rewritten). Submit makes
// one per run from the configs it expanded, and the scheduler carries it with the run: a dispatch
// then reads nothing from the store, where it read the run and parsed its JSON config.
struct JobTemplate {
  RunConfig config;
  std::string sweep;
  std::string variant;
};

namespace {

bool IsUnfinished(RunState s) { return s == PENDING || s == RUNNING || s == INTERRUPTED; }

// A worker's registered resources (unknown fields of a newer worker ignored).
WorkerResources ResourcesOf(const WorkerInfo& w) {
  WorkerResources resources;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;
  (void)google::protobuf::util::JsonStringToMessage(w.resources_json, &resources, parse);
  return resources;
}

// Where a worker serves a gang's rendezvous when it holds rank 0.
std::string RendezvousHostOf(const WorkerResources& r) {
  return !r.rendezvous_host().empty() ? r.rendezvous_host() : r.hostname();
}

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

// `job` null: MakeJob reads the stored config when the run is dispatched (runs queued again after
// a restart, a rerun or a retry), so a restart does not parse every queued run's config up front.
QueuedRun ToQueued(const RunInfo& run, absl::Time not_before,
                   std::shared_ptr<const JobTemplate> job = nullptr) {
  QueuedRun q;
  q.run_id = run.id;
  q.sweep_id = run.sweep_id;
  q.run_index = run.run_index;
  q.needs.device = run.device;
  q.needs.memory_gb = run.memory_gb;
  q.needs.threads = run.threads;
  q.needs.devices = run.devices;
  q.not_before = not_before;
  q.job = std::move(job);
  q.total_steps = run.steps_total;
  return q;
}

SweepStatus ToSweepStatus(const SweepInfo& s) {
  SweepStatus out;
  out.set_sweep_id(s.id);
  out.set_name(s.name);
  out.set_priority(s.priority);
  out.set_state(s.state);
  out.set_created_unix_ms(static_cast<int64_t>(s.created_at * 1000));
  auto& by_state = *out.mutable_runs_by_state();
  const std::pair<RunState, int64_t> counts[] = {
      {PENDING, s.pending},     {RUNNING, s.running},     {SUCCEEDED, s.succeeded},
      {FAILED, s.failed},       {DIVERGED, s.diverged},   {CANCELLED, s.cancelled},
      {INTERRUPTED, s.interrupted}};
  for (const auto& [state, n] : counts) {
    if (n > 0) by_state[RunStateName(state)] = static_cast<int32_t>(n);
  }
  out.set_total_runs(static_cast<int32_t>(s.runs));
  return out;
}

}  // namespace

CoordinatorCore::CoordinatorCore(Store* store, const CoordinatorOptions& options)
    : store_(store),
      options_(options),
      lease_mac_(options.lease_key),
      scheduler_(options.scheduler, options.clock) {}

absl::StatusOr<std::unique_ptr<CoordinatorCore>> CoordinatorCore::Create(
    Store* store, const CoordinatorOptions& options) {
  std::unique_ptr<CoordinatorCore> c(new CoordinatorCore(store, options));
  if (absl::Status s = c->Rebuild(); !s.ok()) return s;
  if (options.background_lease_checks) {
    c->lease_checker_ = std::thread([p = c.get()] { p->LeaseCheckerLoop(); });
  }
  return c;
}

CoordinatorCore::~CoordinatorCore() {
  Shutdown();
  if (lease_checker_.joinable()) lease_checker_.join();
}

void CoordinatorCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  work_cv_.SignalAll();
}

absl::Status CoordinatorCore::Rebuild() {
  const StoreReader& reader = store_->reader();
  absl::StatusOr<std::vector<SweepInfo>> sweeps = reader.ListSweeps();
  if (!sweeps.ok()) return sweeps.status();
  {
    absl::MutexLock lock(&mu_);
    for (const SweepInfo& s : *sweeps) {
      scheduler_.AddSweep(s.id, s.priority);
      if (s.state == "CANCELLED") scheduler_.CancelSweep(s.id);
    }
  }
  // A sweep cancelled by an older coordinator (which cancelled its runs one by one, after the
  // sweep) may have unstarted runs left: cancelled now.
  for (const SweepInfo& s : *sweeps) {
    if (s.state != "CANCELLED" || s.pending + s.interrupted == 0) continue;
    if (absl::StatusOr<SweepCancellation> c = store_->CancelSweep(s.id); !c.ok()) {
      return c.status();
    }
  }
  absl::StatusOr<std::vector<WorkerInfo>> workers = reader.ListWorkers();
  if (!workers.ok()) return workers.status();
  std::map<int64_t, int> slots_of;  // by worker
  for (const WorkerInfo& w : *workers) slots_of[w.id] = std::max(1, ResourcesOf(w).slots());
  RunFilter filter;
  filter.states = {PENDING, RUNNING, INTERRUPTED};
  absl::StatusOr<std::vector<RunInfo>> runs = reader.ListRuns(filter);
  if (!runs.ok()) return runs.status();
  for (RunInfo run : *runs) {
    // A gang's attempt (wider than its rank 0 worker): its members are not known any more, so
    // their heartbeats would be refused. Ended here, it resumes from its checkpoint.
    if (run.state == RUNNING && run.devices > slots_of[run.worker_id]) {
      RunTransition t;
      t.run_id = run.id;
      t.from = {RUNNING};
      t.expected_attempt = run.attempts;
      t.attempt_end = "LOST";
      t.to = PENDING;
      t.reason = "the coordinator restarted during this gang-scheduled attempt; it resumes from "
                 "its checkpoint";
      if (absl::StatusOr<TransitionResult> r = store_->TransitionRun(t); !r.ok()) {
        return r.status();
      }
      run.state = PENDING;
    }
    if (run.state == INTERRUPTED) {
      RunTransition t;
      t.run_id = run.id;
      t.from = {INTERRUPTED};
      t.to = PENDING;
      t.reason = "resumed after a coordinator restart";
      if (absl::StatusOr<TransitionResult> r = store_->TransitionRun(t); !r.ok()) {
        return r.status();
      }
    }
    absl::MutexLock lock(&mu_);
    if (run.attempt_base > 0) attempt_base_[run.id] = run.attempt_base;
    if (run.state == RUNNING) {
      scheduler_.RestoreLease(run.id, run.sweep_id, run.worker_id, run.attempts,
                              ToQueued(run, absl::InfinitePast()));
    } else {
      scheduler_.Enqueue(ToQueued(run, absl::InfinitePast()));
    }
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  for (const WorkerInfo& w : *workers) {
    worker_names_[w.id] = w.name;
    // Each gets a lease timeout from now to call again before CheckWorkers marks it GONE.
    if (w.state != "GONE") worker_seen_[w.id] = WorkerSeen{w.state, absl::InfinitePast(), now};
  }
  return absl::OkStatus();
}

void CoordinatorCore::LeaseCheckerLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + options_.lease_check_interval;
      while (!shutdown_ && absl::Now() < until) work_cv_.WaitWithDeadline(&mu_, until);
      if (shutdown_) return;
    }
    CheckLeases();
    CheckWorkers();
  }
}

// ---- Client API --------------------------------------------------------------------------------

absl::StatusOr<SubmitResponse> CoordinatorCore::Submit(const SubmitRequest& request) {
  if (static_cast<int64_t>(request.spec_yaml().size()) > options_.max_spec_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "submit: the spec is ", request.spec_yaml().size(), " bytes; the limit is ",
        options_.max_spec_bytes));
  }
  const std::string file = request.spec_file().empty() ? "<spec>" : request.spec_file();
  absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(request.spec_yaml(), file);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  std::vector<std::string> config_json;
  absl::StatusOr<ExpandedSweep> expanded = ExpandSweep(*spec, {}, &config_json);
  if (!expanded.ok()) return absl::InvalidArgumentError(expanded.status().message());
  if (expanded->runs_size() > options_.max_runs_per_sweep) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": sweep ", expanded->name(), " has ", expanded->runs_size(),
        " runs; the limit is ", options_.max_runs_per_sweep, " (split it into several sweeps)"));
  }
  if (expanded->runs_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": sweep ", expanded->name(), " has no runs (filters dropped all)"));
  }
  if (absl::Status s = ResolveInitFrom(file, &*expanded, &config_json); !s.ok()) return s;
  SubmitResponse response;
  response.set_sweep(expanded->name());
  response.set_runs(expanded->runs_size());
  if (request.dry_run()) {
    *response.mutable_expanded() = *std::move(expanded);
    return response;
  }

  const StoreReader& reader = store_->reader();
  // A resubmission of the same spec is deduplicated: the sweep exists with the same runs.
  if (absl::StatusOr<SweepInfo> existing = reader.GetSweep(expanded->name()); existing.ok()) {
    RunFilter filter;
    filter.sweep_id = existing->id;
    absl::StatusOr<std::vector<RunInfo>> runs = reader.ListRuns(filter);
    if (!runs.ok()) return runs.status();
    std::vector<std::string> have, want;
    for (const RunInfo& r : *runs) have.push_back(r.run_key);
    for (const RunSpec& r : expanded->runs()) want.push_back(r.run_key());
    std::sort(have.begin(), have.end());
    std::sort(want.begin(), want.end());
    if (have != want) {
      return absl::AlreadyExistsError(absl::StrCat(
          file, ": a sweep named ", expanded->name(),
          " exists with different runs; give this one another `sweep:` name"));
    }
    response.set_sweep_id(existing->id);
    response.set_already_exists(true);
    *response.mutable_expanded() = *std::move(expanded);
    return response;
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }

  SweepRecord record;
  record.expanded = *expanded;
  record.spec_yaml = request.spec_yaml();
  record.config_json = std::move(config_json);
  record.reuse = !request.force();
  absl::StatusOr<SweepIds> ids = store_->CreateSweep(record);
  if (!ids.ok()) return ids.status();
  response.set_sweep_id(ids->sweep_id);
  RunFilter stored_filter;
  stored_filter.sweep_id = ids->sweep_id;
  stored_filter.states = {PENDING};
  absl::StatusOr<std::vector<RunInfo>> stored = reader.ListRuns(stored_filter);
  if (!stored.ok()) return stored.status();
  std::map<int64_t, const RunInfo*> stored_by_id;
  for (const RunInfo& r : *stored) stored_by_id[r.id] = &r;
  int queued = 0, reused = 0;
  absl::MutexLock lock(&mu_);
  scheduler_.AddSweep(ids->sweep_id, expanded->priority());
  for (int i = 0; i < expanded->runs_size(); ++i) {
    if (ids->reused_from[i] != 0) {
      ++reused;
      continue;
    }
    const RunSpec& spec_run = expanded->runs(i);
    auto run = stored_by_id.find(ids->run_ids[i]);
    if (run == stored_by_id.end()) {
      return absl::InternalError(absl::StrCat("submit: run ", ids->run_ids[i], " was not stored"));
    }
    auto job = std::make_shared<JobTemplate>();
    job->config = spec_run.config();
    job->sweep = expanded->name();
    job->variant = spec_run.variant();
    scheduler_.Enqueue(ToQueued(*run->second, absl::InfinitePast(), std::move(job)));
    ++queued;
  }
  work_cv_.SignalAll();
  response.set_queued(queued);
  response.set_reused(reused);
  *response.mutable_expanded() = *std::move(expanded);
  return response;
}

absl::Status CoordinatorCore::ResolveInitFrom(const std::string& file, ExpandedSweep* sweep,
                                             std::vector<std::string>* config_json) {
  const StoreReader& reader = store_->reader();
  for (int i = 0; i < sweep->runs_size(); ++i) {
    RunSpec* run = sweep->mutable_runs(i);
    InitFrom* from = run->mutable_config()->mutable_train()->mutable_init_from();
    if (from->sweep().empty()) continue;
    const std::string where =
        absl::StrCat(file, ": run ", i, " (", run->variant(), ", seed ", run->seed(),
                     "): train.init_from");
    if (!from->checkpoint().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give a checkpoint or a sweep, variant and seed, not both"));
    }
    // Without a variant, each run continues its own counterpart: same variant, same seed.
    if (from->variant().empty() && from->seed() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a seed without a variant; name the variant, or leave both out to continue "
                 "each run's own variant and seed"));
    }
    const std::string variant = from->variant().empty() ? run->variant() : from->variant();
    const uint64_t seed = from->variant().empty() ? run->seed() : from->seed();
    absl::StatusOr<SweepInfo> source = reader.GetSweep(from->sweep());
    if (absl::IsNotFound(source.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no sweep named \"", from->sweep(), "\""));
    }
    if (!source.ok()) return source.status();
    RunFilter filter;
    filter.sweep_id = source->id;
    absl::StatusOr<std::vector<RunInfo>> runs = reader.ListRuns(filter);
    if (!runs.ok()) return runs.status();
    auto found = std::find_if(runs->begin(), runs->end(), [&](const RunInfo& r) {
      return r.variant == variant && r.seed == seed;
    });
    if (found == runs->end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": sweep ", from->sweep(),
                                                     " has no run of variant \"", variant,
                                                     "\" with seed ", seed));
    }
    if (found->state != SUCCEEDED) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": run ", found->id, " is ", RunStateName(found->state),
          "; continued training starts from a SUCCEEDED run's final weights (submit after it)"));
    }
    absl::StatusOr<AttemptInfo> checkpoint = reader.LatestCheckpoint(found->id);
    if (!checkpoint.ok()) return checkpoint.status();
    if (checkpoint->checkpoint_path.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": run ", found->id, " reported no checkpoint"));
    }
    from->set_checkpoint(checkpoint->checkpoint_path);
    (*config_json)[i] = CanonicalJson(run->config());
  }
  return absl::OkStatus();
}

absl::StatusOr<ListSweepsResponse> CoordinatorCore::ListSweeps() {
  absl::StatusOr<std::vector<SweepInfo>> sweeps = store_->reader().ListSweeps();
  if (!sweeps.ok()) return sweeps.status();
  ListSweepsResponse response;
  for (const SweepInfo& s : *sweeps) *response.add_sweeps() = ToSweepStatus(s);
  absl::StatusOr<std::vector<WorkerInfo>> workers = store_->reader().ListWorkers();
  if (!workers.ok()) return workers.status();
  for (const WorkerInfo& w : *workers) {
    if (w.state == "GONE") continue;
    const WorkerResources resources = ResourcesOf(w);
    WorkerStatus* out = response.add_workers();
    out->set_worker_id(w.id);
    out->set_name(w.name);
    out->set_state(w.state);
    out->set_device(resources.device().empty() ? "cpu" : resources.device());
    out->set_slots(std::max(1, resources.slots()));
    // Live: the leases' slots (a gang member's part included) and forming gangs' reservations.
    out->set_slots_in_use(SlotsInUse(w.id));
    out->set_running(w.running);
    out->set_hostname(resources.hostname());
  }
  return response;
}

RunStatus CoordinatorCore::ToRunStatus(const RunInfo& run) {
  RunStatus out;
  out.set_run_id(run.id);
  out.set_sweep(run.sweep);
  out.set_variant(run.variant);
  out.set_seed(run.seed);
  out.set_run_key(run.run_key);
  out.set_state(run.state);
  out.set_attempts(run.attempts);
  out.set_step(run.steps_done);
  out.set_total_steps(run.steps_total);
  if (!std::isnan(run.final_train_loss)) out.set_last_loss(run.final_train_loss);
  out.set_spike_count(run.spike_steps);
  if (run.state == RUNNING && run.worker_id != 0) {
    absl::MutexLock lock(&mu_);
    const auto name = [&](int64_t id) {
      auto it = worker_names_.find(id);
      return it != worker_names_.end() ? it->second : absl::StrCat("#", id);
    };
    // A gang's: every member, rank 0's worker first ("a+b").
    std::optional<Lease> lease = scheduler_.GetLease(run.id);
    if (lease.has_value() && lease->members.size() > 1) {
      std::vector<std::string> names;
      for (const GangMember& m : lease->members) names.push_back(name(m.worker_id));
      out.set_worker(absl::StrJoin(names, "+"));
    } else {
      out.set_worker(name(run.worker_id));
    }
  }
  out.set_reason(run.reason);
  out.set_params_total(run.params_total);
  if (!std::isnan(run.val_loss)) out.set_val_loss(run.val_loss);
  out.set_reused_from(run.reused_from);
  out.set_devices(run.devices);
  return out;
}

absl::StatusOr<GetSweepResponse> CoordinatorCore::GetSweep(const GetSweepRequest& request) {
  if (request.sweep().empty()) return absl::InvalidArgumentError("get: no sweep given");
  absl::StatusOr<SweepInfo> sweep = store_->reader().GetSweep(request.sweep());
  if (!sweep.ok()) return sweep.status();
  RunFilter filter;
  filter.sweep_id = sweep->id;
  absl::StatusOr<std::vector<RunInfo>> runs = store_->reader().ListRuns(filter);
  if (!runs.ok()) return runs.status();
  // The LOSS a user sees is the latest reported one, while a run trains and after.
  absl::StatusOr<std::map<int64_t, LatestStep>> latest = store_->reader().LatestSteps(sweep->id);
  if (!latest.ok()) return latest.status();
  GetSweepResponse response;
  *response.mutable_sweep() = ToSweepStatus(*sweep);
  for (const RunInfo& r : *runs) {
    RunStatus* status = response.add_runs();
    *status = ToRunStatus(r);
    if (auto it = latest->find(r.id); it != latest->end() && std::isfinite(it->second.loss)) {
      status->set_last_loss(it->second.loss);
    }
  }
  return response;
}

absl::StatusOr<CancelResponse> CoordinatorCore::Cancel(const CancelRequest& request) {
  if (request.sweep().empty()) return absl::InvalidArgumentError("cancel: no sweep given");
  absl::StatusOr<SweepInfo> sweep = store_->reader().GetSweep(request.sweep());
  if (!sweep.ok()) return sweep.status();
  // The sweep and its unstarted runs in one transaction: a crash cannot leave a cancelled sweep
  // with runs to start.
  absl::StatusOr<SweepCancellation> cancelled = store_->CancelSweep(sweep->id);
  if (!cancelled.ok()) return cancelled.status();
  CancelResponse response;
  response.set_cancelled(static_cast<int32_t>(cancelled->cancelled.size()));
  absl::MutexLock lock(&mu_);
  scheduler_.CancelSweep(sweep->id);
  // RUNNING (maybe just dispatched): its worker is told to stop at its next report.
  for (int64_t run_id : cancelled->running) {
    if (scheduler_.Stop(run_id)) response.set_cancelled(response.cancelled() + 1);
  }
  return response;
}

absl::StatusOr<RerunResponse> CoordinatorCore::Rerun(const RerunRequest& request) {
  if (request.sweep().empty()) return absl::InvalidArgumentError("rerun: no sweep given");
  absl::StatusOr<SweepInfo> sweep = store_->reader().GetSweep(request.sweep());
  if (!sweep.ok()) return sweep.status();
  RunFilter filter;
  filter.sweep_id = sweep->id;
  // DIVERGED is a result, not a failure: only a full rerun repeats it.
  filter.states = {FAILED, CANCELLED};
  if (!request.failed_only()) filter.states = {FAILED, CANCELLED, SUCCEEDED, DIVERGED};
  absl::StatusOr<std::vector<RunInfo>> runs = store_->reader().ListRuns(filter);
  if (!runs.ok()) return runs.status();
  RerunResponse response;
  if (runs->empty()) return response;
  if (sweep->state == "CANCELLED") {
    if (absl::Status s = store_->SetSweepState(sweep->id, "ACTIVE"); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    scheduler_.UncancelSweep(sweep->id);
  }
  for (const RunInfo& run : *runs) {
    RunTransition t;
    t.run_id = run.id;
    t.from = filter.states;
    t.to = PENDING;
    t.reason = "rerun";
    t.rebase_attempts = true;
    absl::StatusOr<TransitionResult> r = store_->TransitionRun(t);
    if (absl::IsFailedPrecondition(r.status())) continue;  // changed meanwhile
    if (!r.ok()) return r.status();
    absl::MutexLock lock(&mu_);
    attempt_base_[run.id] = run.attempts;
    if (scheduler_.Enqueue(ToQueued(run, absl::InfinitePast()))) {
      response.set_queued(response.queued() + 1);
    }
  }
  absl::MutexLock lock(&mu_);
  work_cv_.SignalAll();
  return response;
}

absl::Status CoordinatorCore::Watch(const WatchRequest& request,
                                const std::function<bool(const WatchEvent&)>& write,
                                const std::function<bool()>& cancelled) {
  const StoreReader& reader = store_->reader();
  absl::StatusOr<SweepInfo> sweep = reader.GetSweep(request.sweep());
  if (!sweep.ok()) return sweep.status();
  struct Seen {
    RunState state;
    int attempts;
    int64_t step;
  };
  std::map<int64_t, Seen> seen;
  std::map<int64_t, std::string> variant_of;
  std::map<int64_t, int64_t> spike_counts;
  // From the start: a watch replays the sweep's spikes, then follows.
  ChangeCursor cursor;
  for (;;) {
    absl::StatusOr<SweepChanges> changes = reader.ChangesSince(sweep->id, cursor, 10000);
    if (!changes.ok()) return changes.status();
    cursor = changes->next;
    for (const RunInfo& r : changes->runs) variant_of[r.id] = r.variant;
    // Spikes first (a run that diverged shows its spike before its state change).
    for (const SweepSpike& spike : changes->spikes) {
      WatchEvent event;
      *event.mutable_spike() = spike.event;
      event.set_run_id(spike.run_id);
      event.set_variant(variant_of[spike.run_id]);
      ++spike_counts[spike.run_id];
      if (!write(event)) return absl::CancelledError("watch: the client went away");
    }
    bool unfinished = false;
    std::vector<const RunInfo*> changed;
    for (const RunInfo& r : changes->runs) {
      unfinished = unfinished || IsUnfinished(r.state);
      auto it = seen.find(r.id);
      if (it == seen.end() || it->second.state != r.state || it->second.attempts != r.attempts ||
          (request.include_steps() && it->second.step != r.steps_done)) {
        seen[r.id] = Seen{r.state, r.attempts, r.steps_done};
        changed.push_back(&r);
      }
    }
    // Latest losses, for progress lines: read only on a tick where some run moved.
    std::map<int64_t, LatestStep> latest;
    if (request.include_steps() && !changed.empty()) {
      absl::StatusOr<std::map<int64_t, LatestStep>> read = reader.LatestSteps(sweep->id);
      if (!read.ok()) return read.status();
      latest = *std::move(read);
    }
    for (const RunInfo* r : changed) {
      WatchEvent event;
      RunStatus status = ToRunStatus(*r);
      if (auto l = latest.find(r->id); l != latest.end() && std::isfinite(l->second.loss)) {
        status.set_last_loss(l->second.loss);
      }
      status.set_spike_count(std::max<int64_t>(status.spike_count(), spike_counts[r->id]));
      *event.mutable_run() = std::move(status);
      event.set_run_id(r->id);
      event.set_variant(r->variant);
      if (!write(event)) return absl::CancelledError("watch: the client went away");
    }
    if (!unfinished) {
      absl::StatusOr<SweepInfo> final_sweep = reader.GetSweepById(sweep->id);
      if (!final_sweep.ok()) return final_sweep.status();
      WatchEvent event;
      *event.mutable_sweep_done() = ToSweepStatus(*final_sweep);
      write(event);
      return absl::OkStatus();
    }
    absl::MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + options_.watch_interval;
    while (!shutdown_ && absl::Now() < until) work_cv_.WaitWithDeadline(&mu_, until);
    if (shutdown_) return absl::UnavailableError("watch: the coordinator is shutting down");
    if (cancelled()) return absl::CancelledError("watch: the client went away");
  }
}

absl::StatusOr<QueryResponse> CoordinatorCore::Query(const QueryRequest& request) {
  const std::string format = request.format().empty() ? "table" : request.format();
  if (format != "table" && format != "csv" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("query: format must be table, csv or json, got \"", format, "\""));
  }
  QueryLimits limits;
  limits.timeout = options_.query_timeout;
  limits.max_rows = request.max_rows() > 0
                        ? std::min<int64_t>(request.max_rows(), options_.max_query_rows)
                        : options_.default_query_rows;
  // Rows past this are dropped (`truncated`): the formatted answer must fit one gRPC message.
  limits.max_bytes = int64_t{8} << 20;
  if (request.sql().size() > kMaxSqlBytes) {
    return absl::InvalidArgumentError(absl::StrCat("query: the statement is ", request.sql().size(),
                                                   " bytes; the limit is ", kMaxSqlBytes));
  }
  absl::StatusOr<QueryResult> result = store_->reader().ReadOnlyQuery(request.sql(), limits);
  if (!result.ok()) return result.status();
  absl::StatusOr<std::string> formatted = FormatQueryResult(*result, format);
  if (!formatted.ok()) return formatted.status();
  QueryResponse response;
  for (const std::string& c : result->columns) response.add_columns(c);
  response.set_rows(static_cast<int64_t>(result->rows.size()));
  response.set_truncated(result->truncated);
  response.set_formatted(*std::move(formatted));
  return response;
}

absl::StatusOr<TableResponse> CoordinatorCore::Table(const TableRequest& request) {
  if (request.sweep().empty()) return absl::InvalidArgumentError("table: no sweep given");
  const std::string format = request.format().empty() ? "markdown" : request.format();
  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable(request.sweep());
  if (!table.ok()) return table.status();
  absl::StatusOr<std::string> formatted = FormatComparisonTable(*table, format);
  if (!formatted.ok()) return formatted.status();
  TableResponse response;
  response.set_formatted(*std::move(formatted));
  return response;
}

// ---- Worker API --------------------------------------------------------------------------------

absl::StatusOr<RegisterResponse> CoordinatorCore::Register(const RegisterRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("register: no worker name");
  if (request.ByteSizeLong() > kMaxRegisterBytes) {
    return absl::InvalidArgumentError(absl::StrCat("register: the request is ",
                                                   request.ByteSizeLong(), " bytes; the limit is ",
                                                   kMaxRegisterBytes));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(request.resources(), &json, print);
  absl::StatusOr<int64_t> id = store_->RegisterWorker(request.name(), json);
  if (!id.ok()) return id.status();
  WorkerOffer offer;
  offer.device = request.resources().device().empty() ? "cpu" : request.resources().device();
  offer.memory_gb = request.resources().memory_gb();
  offer.cores = request.resources().cores();
  offer.slots = std::max(1, request.resources().slots());
  offer.host = RendezvousHostOf(request.resources());
  {
    absl::MutexLock lock(&mu_);
    workers_[*id] = offer;
    scheduler_.AddWorker(*id, offer);
    worker_names_[*id] = request.name();
    const absl::Time now = options_.clock->Now();
    worker_seen_[*id] = WorkerSeen{"IDLE", now, now};  // as RegisterWorker wrote it
  }
  RegisterResponse response;
  response.set_worker_id(*id);
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
  absl::StatusOr<std::vector<WorkerInfo>> workers = store_->reader().ListWorkers();
  if (!workers.ok()) return workers.status();
  for (const WorkerInfo& w : *workers) {
    if (w.id != worker_id) continue;
    const WorkerResources resources = ResourcesOf(w);
    WorkerOffer offer;
    offer.device = resources.device().empty() ? "cpu" : resources.device();
    offer.memory_gb = resources.memory_gb();
    offer.cores = resources.cores();
    offer.slots = std::max(1, resources.slots());
    offer.host = RendezvousHostOf(resources);
    absl::MutexLock lock(&mu_);
    workers_[worker_id] = offer;
    scheduler_.AddWorker(worker_id, offer);
    worker_names_[worker_id] = w.name;
    return offer;
  }
  return absl::NotFoundError(
      absl::StrCat("worker ", worker_id, " is not registered: register again"));
}

absl::StatusOr<Job> CoordinatorCore::MakeJob(const QueuedRun& run, int32_t attempt,
                                             int64_t worker_id, bool part) {
  std::shared_ptr<const JobTemplate> made = run.job;
  if (made == nullptr) {
    absl::StatusOr<RunInfo> info = store_->reader().GetRun(run.run_id);
    if (!info.ok()) return info.status();
    absl::StatusOr<std::shared_ptr<const JobTemplate>> parsed = TemplateOf(*info);
    if (!parsed.ok()) return parsed.status();
    made = *std::move(parsed);
  }
  Job job;
  job.set_run_id(run.run_id);
  job.set_attempt(attempt);
  *job.mutable_config() = made->config;
  job.set_checkpoint_dir(absl::StrCat(options_.checkpoint_root, "/run-", run.run_id));
  // A first attempt has no earlier one to resume from.
  if (attempt > 1) {
    absl::StatusOr<AttemptInfo> checkpoint = store_->reader().LatestCheckpoint(run.run_id);
    if (!checkpoint.ok()) return checkpoint.status();
    job.set_resume_from_step(checkpoint->checkpoint_step);
  }
  job.set_sweep(made->sweep);
  job.set_variant(made->variant);
  job.set_lease_secret(LeaseSecret(lease_mac_, run.run_id, attempt, worker_id));
  job.set_world_size(std::max(1, run.needs.devices));
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

absl::StatusOr<AcquireJobResponse> CoordinatorCore::AcquireJob(const AcquireJobRequest& request,
                                                           absl::Time deadline) {
  absl::StatusOr<WorkerOffer> offer = OfferOf(request.worker_id());
  if (!offer.ok()) return offer.status();
  bool busy = false;  // a worker of several slots asks for more while some train
  {
    absl::MutexLock lock(&mu_);
    busy = scheduler_.SlotsInUse(request.worker_id()) > 0;
  }
  NoteWorker(request.worker_id(), busy ? "BUSY" : "IDLE");
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
        if (absl::Now() >= deadline) return response;
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
    for (const QueuedRun& run : runs) {
      RunTransition& start = starts.emplace_back();
      start.run_id = run.run_id;
      start.from = {PENDING};
      start.to = RUNNING;
      start.worker_id = request.worker_id();
    }
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
  if (absl::Status s = CheckReportAtDoor(request, lease->total_steps, "report"); !s.ok()) return s;
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
  // The worker's notices (an unreadable checkpoint moved aside...) go to the event log once: not
  // again with a duplicate batch, never from a heartbeat.
  if (request.seq() > 0 && !response.duplicate()) {
    for (const std::string& line : request.notices()) {
      (void)store_->EnqueueEvent(lease.has_value() ? lease->sweep_id : 0, request.run_id(),
                                 "worker_notice",
                                 absl::StrCat("run ", request.run_id(), " attempt ",
                                              request.attempt(), ": ", line));
    }
  }
  return response;
}

absl::Status CoordinatorCore::EndAttemptAndRetry(int64_t run_id, int64_t sweep_id, int32_t attempt,
                                             const std::string& attempt_end,
                                             const std::string& reason, bool retry) {
  RetryDecision decision;
  bool cancelled = false;
  std::optional<QueuedRun> queued;
  {
    absl::MutexLock lock(&mu_);
    cancelled = scheduler_.IsCancelled(sweep_id);
    auto base = attempt_base_.find(run_id);
    const int before_rerun = base == attempt_base_.end() ? 0 : base->second;
    if (retry) decision = scheduler_.RetryAfterLoss(attempt - before_rerun);
    queued = scheduler_.LeasedRun(run_id);
  }
  RunTransition t;
  t.run_id = run_id;
  t.from = {RUNNING};
  t.expected_attempt = attempt;
  t.attempt_end = attempt_end;
  t.to = cancelled ? CANCELLED : decision.retry ? PENDING : FAILED;
  t.reason = reason;
  if (t.to == FAILED) {
    absl::StrAppend(&t.reason, retry ? absl::StrCat(" (gave up after ", attempt, " attempts)")
                                     : " (not retried: it would fail again on any worker)");
  }
  absl::StatusOr<TransitionResult> r = store_->TransitionRun(t);
  if (!r.ok()) return r.status();
  if (t.to == PENDING && !queued.has_value()) {
    absl::StatusOr<RunInfo> run = store_->reader().GetRun(run_id);
    if (!run.ok()) return run.status();
    queued = ToQueued(*run, absl::InfinitePast());
  }
  absl::MutexLock lock(&mu_);
  scheduler_.Release(run_id);
  if (t.to == PENDING) {
    queued->not_before = decision.not_before;
    scheduler_.Enqueue(*queued);
    work_cv_.SignalAll();
  }
  return absl::OkStatus();
}

absl::StatusOr<CoordinatorCore::PreparedFinish> CoordinatorCore::PrepareFinish(
    const FinishRequest& request, int64_t worker_id) {
  PreparedFinish p;
  p.request = &request;
  const RunState state = request.summary().state();
  if (state != SUCCEEDED && state != DIVERGED && state != FAILED && state != CANCELLED &&
      state != INTERRUPTED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "finish: state must be SUCCEEDED, DIVERGED, FAILED, CANCELLED or INTERRUPTED, got ",
        RunStateName(state)));
  }
  if (absl::Status s = CheckLeaseSecret("finish", request.lease_secret(), request.run_id(),
                                        request.attempt(), worker_id);
      !s.ok()) {
    return s;
  }
  if (request.has_final_report()) {
    const ReportRequest& r = request.final_report();
    if ((r.worker_id() != 0 && r.worker_id() != worker_id) ||
        (r.run_id() != 0 && r.run_id() != request.run_id()) ||
        (r.attempt() != 0 && r.attempt() != request.attempt())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "finish: final_report is of worker ", r.worker_id(), " run ", r.run_id(), " attempt ",
          r.attempt(), ", not of the finished worker ", worker_id, " run ",
          request.run_id(), " attempt ", request.attempt()));
    }
    if (r.seq() < 1) {
      return absl::InvalidArgumentError(
          "finish: final_report.seq must be >= 1 (the batch after the last acknowledged one)");
    }
    absl::StatusOr<MetricBatch> converted =
        BatchOf(r, request.run_id(), request.attempt(), "finish: final_report has",
                "send the rest with Report first");
    if (!converted.ok()) return converted.status();
    p.batch = *std::move(converted);
  }
  std::optional<Lease> lease;
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
  }
  if (!lease.has_value() || lease->attempt != request.attempt() ||
      lease->worker_id != worker_id) {
    // A retried Finish whose first try was applied is acknowledged again (without a next job:
    // one leased by the first try comes back when its lease expires).
    absl::StatusOr<RunInfo> run = store_->reader().GetRun(request.run_id());
    if (!run.ok()) return run.status();
    if (run->attempts == request.attempt() && run->state == state) {
      p.applied_before = true;
      return p;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("finish: run ", request.run_id(), " attempt ", request.attempt(),
                     " is not leased to worker ", worker_id, " (it is ",
                     RunStateName(run->state), ", attempt ", run->attempts, ")"));
  }
  p.lease = *lease;
  if (request.has_final_report()) {
    if (absl::Status s = CheckReportAtDoor(request.final_report(), lease->total_steps,
                                           "finish: final_report");
        !s.ok()) {
      return s;
    }
  }
  if (state != FAILED && state != INTERRUPTED) {
    if (absl::Status s = CheckSummaryAtDoor(request.summary(), lease->total_steps); !s.ok()) {
      return s;
    }
  }
  if (p.batch.has_value() && request.final_report().checkpoint_step() > 0) {
    // Queued before the finish: committed with it or earlier.
    if (absl::Status s = store_->EnqueueCheckpoint(request.run_id(), request.attempt(),
                                                   request.final_report().checkpoint_path(),
                                                   request.final_report().checkpoint_step());
        !s.ok()) {
      return s;
    }
  }
  p.reason =
      BoundedText(!request.error().empty() ? request.error() : request.summary().reason());
  return p;
}

absl::Status CoordinatorCore::FinishFailed(PreparedFinish& p) {
  // Retries and backoff have their own path; the batch takes its own transaction (a failed
  // attempt is not the hot path).
  const FinishRequest& request = *p.request;
  if (p.batch.has_value()) {
    if (absl::StatusOr<ReportResult> r = store_->ReportMetrics(*p.batch); !r.ok()) return r.status();
  }
  return EndAttemptAndRetry(request.run_id(), p.lease.sweep_id, request.attempt(), "FAILED",
                            p.reason, !request.permanent());
}

FinishWrite CoordinatorCore::FinishWriteOf(PreparedFinish& p) {
  const FinishRequest& request = *p.request;
  FinishWrite write;
  write.batch = std::move(p.batch);
  RunTransition& t = write.end;
  t.run_id = request.run_id();
  t.from = {RUNNING};
  t.expected_attempt = request.attempt();
  t.reason = p.reason;
  if (request.summary().state() == INTERRUPTED) {
    // Resumable: queued again at once (or cancelled with its sweep).
    t.attempt_end = "INTERRUPTED";
    t.to = p.lease.stop ? CANCELLED : PENDING;
  } else {
    t.to = request.summary().state();
    t.has_summary = true;
    t.summary = request.summary();
    t.summary.set_reason(BoundedText(t.summary.reason()));
  }
  return write;
}

absl::StatusOr<FinishResponse> CoordinatorCore::FinishMember(const FinishRequest& request) {
  const int64_t worker_id = request.worker_id();
  if (absl::Status s = CheckLeaseSecret("finish", request.lease_secret(), request.run_id(),
                                        request.attempt(), worker_id);
      !s.ok()) {
    return s;
  }
  if (request.more_size() > 0 || request.has_final_report()) {
    return absl::InvalidArgumentError(
        "finish: a member's finish ends its part alone: no `more`, no final_report (rank 0's "
        "worker reports the metrics)");
  }
  std::optional<Lease> lease;
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
  }
  const bool holds = lease.has_value() && lease->attempt == request.attempt() &&
                     lease->worker_id != worker_id && lease->MemberOf(worker_id) != nullptr;
  if (holds && request.summary().state() == FAILED) {
    std::string worker = absl::StrCat("#", worker_id);
    {
      absl::MutexLock lock(&mu_);
      if (auto it = worker_names_.find(worker_id); it != worker_names_.end()) worker = it->second;
    }
    const std::string reason = BoundedText(absl::StrCat(
        "ranks from ", lease->MemberOf(worker_id)->rank_offset, " on worker ", worker, ": ",
        !request.error().empty() ? request.error() : request.summary().reason()));
    if (absl::Status s = EndAttemptAndRetry(request.run_id(), lease->sweep_id, request.attempt(),
                                            "FAILED", reason, !request.permanent());
        !s.ok() && !absl::IsFailedPrecondition(s)) {
      return s;
    }
  } else if (holds) {
    absl::MutexLock lock(&mu_);
    scheduler_.ReleaseMember(request.run_id(), request.attempt(), worker_id);
  }
  // Not held (the attempt is over, rank 0's worker finished it first): acknowledged.
  FinishResponse response;
  if (request.acquire_next()) {
    AcquireJobRequest acquire;
    acquire.set_worker_id(worker_id);
    acquire.set_max_jobs(std::max(1, request.acquire_max()));
    absl::StatusOr<AcquireJobResponse> next = AcquireJob(acquire);
    if (next.ok() && next->has_job()) {
      *response.mutable_next_job() = next->job();
      for (const Job& job : next->more_jobs()) *response.add_more_next_jobs() = job;
    }
  }
  bool busy = false;
  {
    absl::MutexLock lock(&mu_);
    busy = scheduler_.SlotsInUse(worker_id) > 0;
  }
  NoteWorker(worker_id, busy ? "BUSY" : "IDLE");
  return response;
}

absl::StatusOr<FinishResponse> CoordinatorCore::Finish(const FinishRequest& request) {
  if (request.member()) return FinishMember(request);
  const int64_t worker_id = request.worker_id();
  absl::StatusOr<PreparedFinish> first = PrepareFinish(request, worker_id);
  // This request refused: none of `more` is applied either (the worker resends them all).
  if (!first.ok()) return first.status();
  // Every attempt this call ends, this request's first; errors of those in `more` are theirs.
  std::vector<PreparedFinish> items = {*std::move(first)};
  std::vector<absl::Status> errors(request.more_size() + 1);
  for (int i = 0; i < request.more_size(); ++i) {
    const FinishRequest& more = request.more(i);
    if (more.worker_id() != 0 && more.worker_id() != worker_id) {
      errors[i + 1] = absl::InvalidArgumentError(
          absl::StrCat("finish: more[", i, "] is of worker ", more.worker_id(), ", not ",
                       worker_id));
      continue;
    }
    if (more.more_size() > 0) {
      errors[i + 1] = absl::InvalidArgumentError(
          absl::StrCat("finish: more[", i, "] has more of its own; list every attempt in the "
                       "outer request's more"));
      continue;
    }
    absl::StatusOr<PreparedFinish> p = PrepareFinish(more, worker_id);
    if (!p.ok()) {
      errors[i + 1] = p.status();
      continue;
    }
    p->index = i + 1;
    items.push_back(*std::move(p));
  }
  // Failed attempts first, on their own path; the rest end in one store transaction with the
  // starts of the next jobs.
  std::vector<PreparedFinish*> ending;
  int freeing = 0;  // slots the ending attempts hold
  for (PreparedFinish& p : items) {
    if (p.applied_before) continue;
    if (p.request->summary().state() == FAILED) {
      errors[p.index] = FinishFailed(p);
      continue;
    }
    ending.push_back(&p);
    freeing += p.lease.slots;
  }
  if (!errors[0].ok()) return errors[0];
  const int max_next = request.acquire_next() ? std::max(1, request.acquire_max()) : 0;
  FinishResponse response;
  const auto add_next = [&response](Job job) {
    if (!response.has_next_job()) {
      *response.mutable_next_job() = std::move(job);
    } else {
      *response.add_more_next_jobs() = std::move(job);
    }
  };
  if (ending.empty()) {
    if (max_next > 0) {
      AcquireJobRequest acquire;
      acquire.set_worker_id(worker_id);
      acquire.set_max_jobs(max_next);
      absl::StatusOr<AcquireJobResponse> next = AcquireJob(acquire);
      if (next.ok() && next->has_job()) {
        add_next(next->job());
        for (const Job& job : next->more_jobs()) add_next(job);
      }
    }
  } else {
    std::vector<FinishWrite> writes;
    for (PreparedFinish* p : ending) writes.push_back(FinishWriteOf(*p));
    // The next runs are picked now and started in the transaction of the first write.
    std::vector<QueuedRun> next;
    if (max_next > 0) {
      absl::StatusOr<WorkerOffer> offer = OfferOf(worker_id);
      absl::MutexLock lock(&mu_);
      if (offer.ok() && !shutdown_) {
        next = scheduler_.AcquireUpTo(worker_id, *offer, max_next, freeing);
      }
    }
    for (size_t i = 0; i < next.size(); ++i) {
      RunTransition start;
      start.run_id = next[i].run_id;
      start.from = {PENDING};
      start.to = RUNNING;
      start.worker_id = worker_id;
      if (i == 0) {
        writes[0].start = std::move(start);
      } else {
        writes[0].more_starts.push_back(std::move(start));
      }
    }
    std::vector<absl::StatusOr<FinishWriteResult>> results = store_->FinishAttempts(writes);
    {
      absl::MutexLock lock(&mu_);
      if (!results[0].ok()) {
        // The starts rode on the first write: back to the queue.
        for (const QueuedRun& run : next) {
          scheduler_.Release(run.run_id);
          scheduler_.Enqueue(run);
        }
        if (!next.empty()) work_cv_.SignalAll();
      }
      for (size_t i = 0; i < ending.size(); ++i) {
        if (!results[i].ok()) {
          errors[ending[i]->index] = results[i].status();
          continue;
        }
        const int64_t run_id = ending[i]->request->run_id();
        std::optional<QueuedRun> queued = scheduler_.LeasedRun(run_id);
        scheduler_.Release(run_id);
        if (writes[i].end.to == PENDING && queued.has_value()) {
          queued->not_before = absl::InfinitePast();
          scheduler_.Enqueue(*queued);
          work_cv_.SignalAll();
        }
      }
    }
    if (results[0].ok()) {
      // A next job that cannot be made is not this Finish's failure: the worker asks again.
      const FinishWriteResult& r = *results[0];
      for (size_t i = 0; i < next.size(); ++i) {
        const absl::Status& status = i == 0 ? r.start_status : r.more_start_status[i - 1];
        const TransitionResult& started = i == 0 ? r.start : r.more_starts[i - 1];
        absl::StatusOr<std::optional<Job>> job =
            LeaseStarted(worker_id, next[i],
                         status.ok() ? absl::StatusOr<TransitionResult>(started)
                                     : absl::StatusOr<TransitionResult>(status));
        if (job.ok() && job->has_value()) add_next(**std::move(job));
      }
    }
    if (!errors[0].ok()) return errors[0];
  }
  // BUSY while it holds a job (a next one, or another slot's), else IDLE: written when it
  // changed (a job handed over was noted BUSY as it started: one write, not two, per job).
  bool busy = false;
  {
    absl::MutexLock lock(&mu_);
    busy = scheduler_.SlotsInUse(worker_id) > 0;
  }
  NoteWorker(worker_id, busy ? "BUSY" : "IDLE");
  for (size_t i = 1; i < errors.size(); ++i) {
    const absl::Status& e = errors[i];
    response.add_more_errors(
        e.ok() ? "" : absl::StrCat(absl::StatusCodeToString(e.code()), ": ", e.message()));
  }
  return response;
}

absl::StatusOr<DeregisterResponse> CoordinatorCore::Deregister(const DeregisterRequest& request) {
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
