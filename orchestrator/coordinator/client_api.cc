// CoordinatorCore's client API: Submit (with train.init_from resolved against the store),
// ListSweeps, GetSweep, Cancel, Rerun, Annotate, Watch, Query and Table. Each answers from the
// store; the scheduler learns of queued, cancelled and rerun runs under mu_.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "config/program_snapshot.h"
#include "config/proto_yaml.h"
#include "orchestrator/coordinator/core.h"
#include "orchestrator/coordinator/core_internal.h"
#include "orchestrator/coordinator/door.h"
#include "orchestrator/store/compare.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/tune_results.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/spec.h"

namespace ablate {

using core_internal::OfferFrom;
using core_internal::ResourcesOf;
using core_internal::ToQueued;

namespace {

bool IsUnfinished(RunState s) { return s == PENDING || s == RUNNING || s == INTERRUPTED; }

SweepStatus ToSweepStatus(const SweepInfo& s) {
  SweepStatus out;
  out.set_sweep_id(s.id);
  out.set_name(s.name);
  out.set_priority(s.priority);
  out.set_state(s.state);
  out.set_created_unix_ms(static_cast<int64_t>(s.created_at * 1000));
  auto& by_state = *out.mutable_runs_by_state();
  const std::pair<RunState, int64_t> counts[] = {
      {PENDING, s.pending},         {RUNNING, s.running},   {SUCCEEDED, s.succeeded},
      {FAILED, s.failed},           {DIVERGED, s.diverged}, {CANCELLED, s.cancelled},
      {INTERRUPTED, s.interrupted}, {STOPPED, s.stopped}};
  for (const auto& [state, n] : counts) {
    if (n > 0) by_state[RunStateName(state)] = static_cast<int32_t>(n);
  }
  out.set_total_runs(static_cast<int32_t>(s.runs));
  out.set_tune_method(s.tune_method);
  return out;
}

// The tags of a target (the sweep: run_id 0), oldest first.
std::vector<std::string> TagsOf(const std::vector<Annotation>& annotations, int64_t run_id) {
  std::vector<std::string> tags;
  for (const Annotation& a : annotations) {
    if (a.kind == "tag" && a.run_id == run_id) tags.push_back(a.text);
  }
  return tags;
}

// A tag is what a shell passes unquoted and a comma-joined list (run_summary.tags) or a CSV
// cell holds unescaped: 1 to kMaxTagLength of A-Z a-z 0-9 _ . : -.
constexpr size_t kMaxTagLength = 64;
constexpr size_t kMaxNoteBytes = 4096;

absl::Status CheckTag(absl::string_view verb, const std::string& tag) {
  const bool ok = !tag.empty() && tag.size() <= kMaxTagLength &&
                  std::all_of(tag.begin(), tag.end(), [](char c) {
                    return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == ':' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(verb, ": \"", absl::CHexEscape(tag.substr(0, kMaxTagLength + 1)),
                   tag.size() > kMaxTagLength + 1 ? "..." : "", "\" is not a tag (1 to ",
                   kMaxTagLength, " of A-Z a-z 0-9 _ . : -)"));
}

// The tune of a selection's first sweep; FailedPrecondition naming `verb` when it has none.
absl::StatusOr<TuneInfo> TuneOfResults(const StoreReader& reader, const ResultSet& results,
                                       absl::string_view verb) {
  if (results.sweeps.empty()) return absl::InvalidArgumentError(absl::StrCat(verb, ": no sweep"));
  absl::StatusOr<std::optional<TuneInfo>> tune = reader.GetTune(results.sweeps.front().id);
  if (!tune.ok()) return tune.status();
  if (!tune->has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        verb, ": sweep ", results.sweeps.front().name,
        " has no tune: block (docs/spec.md, \"Tuning\"); its table is the same-config one"));
  }
  return **tune;
}

// The sweep a Get, Cancel or Rerun names; InvalidArgument "<verb>: no sweep given" for none.
absl::StatusOr<SweepInfo> NamedSweep(const StoreReader& reader, absl::string_view verb,
                                     const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(verb, ": no sweep given"));
  return reader.GetSweep(name);
}

// Whether the stored sweep `existing` has the runs of `expanded` (by run key): a resubmission.
absl::StatusOr<bool> SameRuns(const StoreReader& reader, const SweepInfo& existing,
                              const ExpandedSweep& expanded) {
  absl::StatusOr<std::vector<RunInfo>> runs = reader.RunsOfSweep(existing.id);
  if (!runs.ok()) return runs.status();
  std::vector<std::string> have, want;
  for (const RunInfo& r : *runs) have.push_back(r.run_key);
  for (const RunSpec& r : expanded.runs()) want.push_back(r.run_key());
  std::sort(have.begin(), have.end());
  std::sort(want.begin(), want.end());
  // A boundary sweep adds its probes' runs after submission: the spec's own are among them.
  return existing.tune_method == "boundary"
             ? std::includes(have.begin(), have.end(), want.begin(), want.end())
             : have == want;
}

}  // namespace

absl::StatusOr<SubmitResponse> CoordinatorCore::Submit(const SubmitRequest& request) {
  if (static_cast<int64_t>(request.spec_yaml().size()) > options_.max_spec_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("submit: the spec is ", request.spec_yaml().size(), " bytes; the limit is ",
                     options_.max_spec_bytes));
  }
  const std::string file = request.spec_file().empty() ? "<spec>" : request.spec_file();
  absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(request.spec_yaml(), file);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  std::vector<std::string> config_json;
  ExpandOptions expand;
  expand.max_runs = options_.max_runs_per_sweep;  // counted before any run is built
  if (spec->base.has_program()) {
    // The code as the client read it: checked against its hash, kept with the sweep.
    if (request.program().code_hash().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": program: the request carries no code; submit with the ablate CLI, which "
                "reads program.code from the spec's directory"));
    }
    if (absl::Status s = CheckSnapshot(request.program()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", s.message()));
    }
    expand.program_code_hash = request.program().code_hash();
    if (!spec->base.program().count().empty()) {
      // The counts the client's run of program.count answered: the coordinator runs no code.
      auto known = std::make_shared<std::map<std::string, ParamCount>>();
      for (const ProgramCount& c : request.program_counts()) {
        ParamCount& count = (*known)[c.params_json()];
        count.set_total(c.total());
        count.set_activated(c.activated());
      }
      expand.program_count = RecordedCounter(known);
    }
  }
  absl::StatusOr<ExpandedSweep> expanded = ExpandSweep(*spec, expand, &config_json);
  if (!expanded.ok()) return absl::InvalidArgumentError(expanded.status().message());
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
    absl::StatusOr<bool> same = SameRuns(reader, *existing, *expanded);
    if (!same.ok()) return same.status();
    if (!*same) {
      return absl::AlreadyExistsError(
          absl::StrCat(file, ": a sweep named ", expanded->name(),
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
  if (spec->base.has_program()) record.program = request.program();
  // A tuned sweep compares runs at rung steps: a reused run has no evaluation there.
  record.reuse = !request.force() && !(expanded->has_tune() && expanded->tune().method() == "asha");
  absl::StatusOr<SweepIds> ids = store_->CreateSweep(record);
  if (!ids.ok()) return ids.status();
  response.set_sweep_id(ids->sweep_id);
  absl::StatusOr<std::vector<RunInfo>> stored = reader.RunsOfSweep(ids->sweep_id, {PENDING});
  if (!stored.ok()) return stored.status();
  std::map<int64_t, const RunInfo*> stored_by_id;
  for (const RunInfo& r : *stored) stored_by_id[r.id] = &r;
  int queued = 0, reused = 0;
  {
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
        return absl::InternalError(
            absl::StrCat("submit: run ", ids->run_ids[i], " was not stored"));
      }
      if (run->second->held) continue;  // waits for the first seed's decision (seeds first)
      auto job = std::make_shared<JobTemplate>();
      job->config = spec_run.config();
      job->sweep = expanded->name();
      job->variant = spec_run.variant();
      scheduler_.Enqueue(ToQueued(*run->second, absl::InfinitePast(), std::move(job)));
      ++queued;
    }
    work_cv_.SignalAll();
  }
  // Runs reused at submission end no attempt: what they decide (a boundary's next probe) is due
  // now.
  if (expanded->has_tune()) {
    if (absl::Status s = tuner_.TuneSweep(ids->sweep_id); !s.ok()) {
      (void)store_->EnqueueEvent(ids->sweep_id, 0, "tune_error",
                                 absl::StrCat("tuning: ", s.message()));
    }
  }
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
    const std::string where = absl::StrCat(file, ": run ", i, " (", run->variant(), ", seed ",
                                           run->seed(), "): train.init_from");
    if (!from->checkpoint().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give a checkpoint or a sweep, variant and seed, not both"));
    }
    // Without a variant, each run continues its own counterpart: same variant, same seed; with a
    // variant and no seed, that variant's run of its own seed.
    if (from->variant().empty() && from->has_seed()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": a seed without a variant; name the variant, or leave both out to continue "
          "each run's own variant and seed"));
    }
    const std::string variant = from->variant().empty() ? run->variant() : from->variant();
    const uint64_t seed = from->has_seed() ? from->seed() : run->seed();
    absl::StatusOr<SweepInfo> source = reader.GetSweep(from->sweep());
    if (absl::IsNotFound(source.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no sweep named \"", from->sweep(), "\""));
    }
    if (!source.ok()) return source.status();
    absl::StatusOr<std::vector<RunInfo>> runs = reader.RunsOfSweep(source->id);
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
  for (const SweepInfo& s : *sweeps) {
    SweepStatus* status = response.add_sweeps();
    *status = ToSweepStatus(s);
    absl::StatusOr<std::vector<Annotation>> annotations = store_->reader().Annotations(s.id);
    if (!annotations.ok()) return annotations.status();
    for (std::string& tag : TagsOf(*annotations, 0)) status->add_tags(std::move(tag));
  }
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
    out->set_code_version(resources.code_version());
    out->set_build(resources.build());
    absl::MutexLock lock(&mu_);
    out->set_waiting(WaitingForBuild(OfferFrom(resources)));
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
  out.set_stop_at_step(run.stop_at_step);
  out.set_held(run.held);
  if (!std::isnan(run.final_train_loss)) out.set_last_loss(run.final_train_loss);
  out.set_spike_count(run.spike_steps);
  if (run.state == RUNNING && run.worker_id != 0) {
    absl::MutexLock lock(&mu_);
    // A gang's: every member, rank 0's worker first ("a+b").
    std::optional<Lease> lease = scheduler_.GetLease(run.id);
    if (lease.has_value() && lease->members.size() > 1) {
      std::vector<std::string> names;
      for (const GangMember& m : lease->members) names.push_back(WorkerName(m.worker_id));
      out.set_worker(absl::StrJoin(names, "+"));
    } else {
      out.set_worker(WorkerName(run.worker_id));
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
  absl::StatusOr<SweepInfo> sweep = NamedSweep(store_->reader(), "get", request.sweep());
  if (!sweep.ok()) return sweep.status();
  absl::StatusOr<std::vector<RunInfo>> runs = store_->reader().RunsOfSweep(sweep->id);
  if (!runs.ok()) return runs.status();
  // The LOSS a user sees is the latest reported one, while a run trains and after.
  absl::StatusOr<std::map<int64_t, LatestStep>> latest = store_->reader().LatestSteps(sweep->id);
  if (!latest.ok()) return latest.status();
  absl::StatusOr<std::vector<Annotation>> annotations = store_->reader().Annotations(sweep->id);
  if (!annotations.ok()) return annotations.status();
  GetSweepResponse response;
  *response.mutable_sweep() = ToSweepStatus(*sweep);
  for (std::string& tag : TagsOf(*annotations, 0)) {
    response.mutable_sweep()->add_tags(std::move(tag));
  }
  for (const Annotation& a : *annotations) {
    AnnotationStatus* out = response.add_annotations();
    out->set_id(a.id);
    out->set_run_id(a.run_id);
    out->set_kind(a.kind);
    out->set_text(a.text);
    out->set_created_unix_ms(static_cast<int64_t>(a.created_at * 1000));
  }
  for (const RunInfo& r : *runs) {
    RunStatus* status = response.add_runs();
    *status = ToRunStatus(r);
    for (std::string& tag : TagsOf(*annotations, r.id)) status->add_tags(std::move(tag));
    if (auto it = latest->find(r.id); it != latest->end() && std::isfinite(it->second.loss)) {
      status->set_last_loss(it->second.loss);
    }
  }
  return response;
}

absl::StatusOr<CancelResponse> CoordinatorCore::Cancel(const CancelRequest& request) {
  absl::StatusOr<SweepInfo> sweep = NamedSweep(store_->reader(), "cancel", request.sweep());
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
  absl::StatusOr<SweepInfo> sweep = NamedSweep(store_->reader(), "rerun", request.sweep());
  if (!sweep.ok()) return sweep.status();
  // DIVERGED is a result, not a failure: only a full rerun repeats it. STOPPED is the tuner's
  // decision: never rerun.
  if (!request.failed_only()) {
    absl::StatusOr<std::optional<TuneInfo>> tune = store_->reader().GetTune(sweep->id);
    if (!tune.ok()) return tune.status();
    if (tune->has_value() && (*tune)->method != "grid") {
      return absl::FailedPreconditionError(absl::StrCat(
          "rerun: sweep ", sweep->name, " is tuned (", (*tune)->method,
          "): its decisions are "
          "not redone; rerun its failed runs with --failed, or submit the spec under another "
          "name"));
    }
  }
  std::vector<RunState> states = {FAILED, CANCELLED};
  if (!request.failed_only()) states = {FAILED, CANCELLED, SUCCEEDED, DIVERGED};
  absl::StatusOr<std::vector<RunInfo>> runs = store_->reader().RunsOfSweep(sweep->id, states);
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
    t.from = states;
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

absl::StatusOr<AnnotateResponse> CoordinatorCore::Annotate(const AnnotateRequest& request) {
  const char* verb = request.action() == AnnotateRequest::UNTAG  ? "untag"
                     : request.action() == AnnotateRequest::NOTE ? "note"
                                                                 : "tag";
  AnnotationEdit edit;
  switch (request.action()) {
    case AnnotateRequest::TAG:
    case AnnotateRequest::UNTAG:
      edit.action = request.action() == AnnotateRequest::TAG ? AnnotationEdit::Action::kTag
                                                             : AnnotationEdit::Action::kUntag;
      if (request.tags().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(verb, ": no tag given"));
      }
      if (!request.note().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(verb, ": a note is given with `note`"));
      }
      for (const std::string& tag : request.tags()) {
        if (absl::Status s = CheckTag(verb, tag); !s.ok()) return s;
        edit.texts.push_back(tag);
      }
      break;
    case AnnotateRequest::NOTE:
      if (!request.tags().empty()) {
        return absl::InvalidArgumentError("note: tags are given with `tag`");
      }
      if (absl::StripAsciiWhitespace(request.note()).empty()) {
        return absl::InvalidArgumentError("note: the note is empty");
      }
      if (request.note().size() > kMaxNoteBytes) {
        return absl::InvalidArgumentError(absl::StrCat("note: the note is ", request.note().size(),
                                                       " bytes; the limit is ", kMaxNoteBytes));
      }
      edit.action = AnnotationEdit::Action::kNote;
      edit.texts.push_back(request.note());
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "annotate: action must be TAG, UNTAG or NOTE, not ", static_cast<int>(request.action())));
  }
  if (request.run_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(verb, ": run id ", request.run_id(), " is negative"));
  }
  absl::StatusOr<SweepInfo> sweep = NamedSweep(store_->reader(), verb, request.sweep());
  if (!sweep.ok()) return sweep.status();
  edit.sweep_id = sweep->id;
  edit.run_id = request.run_id();
  absl::StatusOr<AnnotationResult> result = store_->Annotate(edit);
  if (!result.ok()) return result.status();
  AnnotateResponse response;
  response.set_target(request.run_id() == 0
                          ? absl::StrCat("sweep ", sweep->name)
                          : absl::StrCat("run ", request.run_id(), " of sweep ", sweep->name));
  if (edit.action != AnnotationEdit::Action::kNote) {
    for (const std::string& tag : result->changed) response.add_changed(tag);
    for (const std::string& tag : result->unchanged) response.add_unchanged(tag);
  }
  response.set_note_id(result->note_id);
  return response;
}

absl::Status CoordinatorCore::Watch(const WatchRequest& request,
                                    const std::function<bool(const WatchEvent&)>& write,
                                    const std::function<bool()>& cancelled) {
  {
    absl::MutexLock lock(&mu_);
    if (watches_ >= options_.max_watches) {
      return absl::ResourceExhaustedError(
          absl::StrCat("watch: ", watches_,
                       " watches are open, the most this coordinator serves at once; "
                       "try again when one ends"));
    }
    ++watches_;
  }
  struct Closed {
    CoordinatorCore* core;
    ~Closed() {
      absl::MutexLock lock(&core->mu_);
      --core->watches_;
    }
  } closed{this};
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

namespace {

// The metric columns `table --evals` asks for: the names given, or every name a row has for
// "all". InvalidArgument naming one no run reports, with those they do.
absl::StatusOr<std::vector<std::string>> TableEvals(const TableRequest& request,
                                                    const ComparisonTable& table) {
  std::set<std::string> reported;
  for (const ComparisonRow& r : table.rows) {
    for (const auto& [name, m] : r.metrics) reported.insert(name);
  }
  std::vector<std::string> evals;
  for (const std::string& name : request.evals()) {
    if (name == "all") {
      evals.insert(evals.end(), reported.begin(), reported.end());
    } else if (reported.count(name) > 0) {
      evals.push_back(name);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "table --evals: no run reports \"", name, "\"",
          reported.empty() ? " (these runs report no metric by name: see docs/evals.md)"
                           : absl::StrCat(" (they report ", absl::StrJoin(reported, ", "), ")")));
    }
  }
  return evals;
}

}  // namespace

absl::StatusOr<TableResponse> CoordinatorCore::Table(const TableRequest& request) {
  if (request.sweep().empty()) return absl::InvalidArgumentError("table: no sweep given");
  const std::string format = request.format().empty() ? "markdown" : request.format();
  ResultSelection selection;
  selection.sweeps.push_back(request.sweep());
  selection.sweeps.insert(selection.sweeps.end(), request.more_sweeps().begin(),
                          request.more_sweeps().end());
  selection.exclude_tags.assign(request.exclude_tags().begin(), request.exclude_tags().end());
  if (request.at_tokens() < 0 || request.at_flops() < 0 ||
      (request.at_tokens() > 0 && request.at_flops() > 0) || !std::isfinite(request.at_tokens()) ||
      !std::isfinite(request.at_flops())) {
    return absl::InvalidArgumentError(
        "table: give at most one of --at-tokens and --at-flops, a positive number");
  }
  if ((request.at_tokens() > 0 || request.at_flops() > 0) &&
      (request.best() || request.stability())) {
    return absl::InvalidArgumentError(
        "table: --at-tokens and --at-flops go with the plain table, not --best or --stability");
  }
  selection.at_tokens = request.at_tokens();
  selection.at_flops = request.at_flops();
  absl::StatusOr<ResultSet> results = store_->reader().ReadResults(selection);
  if (!results.ok()) return results.status();
  ComparisonTable table = ComparisonTableOf(*results);
  absl::StatusOr<std::vector<std::string>> evals = TableEvals(request, table);
  if (!evals.ok()) return evals.status();
  table.evals = *evals;
  TableResponse response;
  if (request.stability()) {
    if (results->sweeps.size() != 1) {
      return absl::InvalidArgumentError("table --stability: name one sweep");
    }
    absl::StatusOr<TuneInfo> tune = TuneOfResults(store_->reader(), *results, "table --stability");
    if (!tune.ok()) return tune.status();
    if (tune->method != "boundary") {
      return absl::FailedPreconditionError(
          absl::StrCat("table --stability: sweep ", results->sweeps.front().name, " tunes by ",
                       tune->method, ", not boundary: it has no stability brackets"));
    }
    absl::StatusOr<std::vector<BracketInfo>> brackets =
        store_->reader().TuneBrackets(results->sweeps.front().id);
    if (!brackets.ok()) return brackets.status();
    absl::StatusOr<std::string> formatted = FormatStability(*brackets, format);
    if (!formatted.ok()) return formatted.status();
    response.set_formatted(*std::move(formatted));
    return response;
  }
  if (request.best()) {
    absl::StatusOr<TuneInfo> tune = TuneOfResults(store_->reader(), *results, "table --best");
    if (!tune.ok()) return tune.status();
    ComparisonTable best = BestTable(BestOf(*results, *tune), *tune);
    best.evals = *evals;
    absl::StatusOr<std::string> formatted = FormatComparisonTable(best, format);
    if (!formatted.ok()) return formatted.status();
    if (format != "markdown") {  // one table per answer for machines
      response.set_formatted(*std::move(formatted));
      return response;
    }
    absl::StatusOr<std::string> same = FormatComparisonTable(table, format);
    if (!same.ok()) return same.status();
    response.set_formatted(absl::StrCat("Same config (every value of ", tune->axis, "):\n\n", *same,
                                        "\nEach variant at its own best ", tune->axis, " (by ",
                                        tune->maximize ? "highest" : "lowest", " mean ",
                                        tune->metric, " over seeds):\n\n", *formatted));
    return response;
  }
  absl::StatusOr<std::string> formatted = FormatComparisonTable(table, format);
  if (!formatted.ok()) return formatted.status();
  response.set_formatted(*std::move(formatted));
  return response;
}

absl::StatusOr<CompareResponse> CoordinatorCore::Compare(const CompareRequest& request) {
  if (request.sweeps().empty()) return absl::InvalidArgumentError("compare: no sweep given");
  ResultSelection selection;
  selection.sweeps.assign(request.sweeps().begin(), request.sweeps().end());
  selection.exclude_tags.assign(request.exclude_tags().begin(), request.exclude_tags().end());
  selection.items_metric = request.metric();  // its per-item scores, for the test over items
  absl::StatusOr<ResultSet> results = store_->reader().ReadResults(selection);
  if (!results.ok()) return results.status();
  std::optional<BestResults> best;
  std::optional<TuneInfo> tune;
  if (request.best()) {
    absl::StatusOr<TuneInfo> found = TuneOfResults(store_->reader(), *results, "compare --best");
    if (!found.ok()) return found.status();
    tune = *std::move(found);
    best = BestOf(*results, *tune);
    *results = best->results;
  }
  CompareOptions options;
  if (!request.metric().empty()) options.metric = request.metric();
  options.reference = request.reference();
  if (request.alpha() != 0) options.alpha = request.alpha();
  if (!request.correction().empty()) options.correction = request.correction();
  absl::StatusOr<Comparison> comparison = CompareResults(*results, options);
  if (!comparison.ok()) return comparison.status();
  if (best.has_value()) NameBestValues(*best, *tune, &*comparison);
  absl::StatusOr<std::string> formatted =
      FormatComparison(*comparison, request.format().empty() ? "markdown" : request.format());
  if (!formatted.ok()) return formatted.status();
  CompareResponse response;
  response.set_formatted(*std::move(formatted));
  return response;
}

}  // namespace ablate
