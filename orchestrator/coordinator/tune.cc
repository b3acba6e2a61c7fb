// CoordinatorCore's tuner: after a tuned run pauses at a rung or ends, the decisions due in its
// group (orchestrator/sweep/tune.h, DecideAsha) are computed from what the store holds and
// written in one transaction; the runs they promote are queued. Stateless: a restarted
// coordinator re-derives the same decisions (Rebuild calls TuneSweep), and the store applies a
// decision once (tune_decisions is unique per group, value, rung and kind).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orchestrator/coordinator/core.h"
#include "orchestrator/coordinator/core_internal.h"
#include "common/version.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/spec.h"
#include "orchestrator/sweep/tune.h"

namespace ablate {

using core_internal::ToQueued;

absl::Status CoordinatorCore::TuneSweep(int64_t sweep_id) {
  absl::StatusOr<std::optional<TuneInfo>> tune = store_->scheduling_reader().GetTune(sweep_id);
  if (!tune.ok()) return tune.status();
  if (!tune->has_value() || (*tune)->method == "grid") return absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> groups = store_->scheduling_reader().TuneGroups(sweep_id);
  if (!groups.ok()) return groups.status();
  for (const std::string& group : *groups) {
    const absl::Status s = (*tune)->method == "boundary" ? BisectGroup(**tune, group)
                                                         : TuneGroup(**tune, group);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void CoordinatorCore::TuneAfter(const std::vector<int64_t>& run_ids) {
  std::set<std::pair<int64_t, std::string>> groups;
  for (int64_t id : run_ids) {
    absl::StatusOr<RunInfo> run = store_->scheduling_reader().GetRun(id);
    if (run.ok() && run->tuned) groups.insert({run->sweep_id, run->tune_group});
  }
  std::map<int64_t, std::optional<TuneInfo>> tunes;
  for (const auto& [sweep_id, group] : groups) {
    auto it = tunes.find(sweep_id);
    if (it == tunes.end()) {
      absl::StatusOr<std::optional<TuneInfo>> tune = store_->scheduling_reader().GetTune(sweep_id);
      it = tunes.emplace(sweep_id, tune.ok() ? *tune : std::nullopt).first;
    }
    if (!it->second.has_value() || it->second->method == "grid") continue;
    // A failure here leaves the decision to the next end in the group, or to a restart
    // (Rebuild): the store holds everything it is made from.
    const absl::Status s = it->second->method == "boundary" ? BisectGroup(*it->second, group)
                                                            : TuneGroup(*it->second, group);
    if (!s.ok()) {
      (void)store_->EnqueueEvent(sweep_id, 0, "tune_error",
                                 absl::StrCat("tuning ", group, ": ", s.message()));
    }
  }
}

absl::Status CoordinatorCore::TuneGroup(const TuneInfo& tune, const std::string& group) {
  absl::MutexLock tuning(&tune_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (scheduler_.IsCancelled(tune.sweep_id)) return absl::OkStatus();
  }
  const StoreReader& reader = store_->scheduling_reader();
  const std::vector<int64_t> all_rungs(tune.plan.rungs().begin(), tune.plan.rungs().end());
  // Each pass's stops can complete a later rung: decide again until nothing is left.
  for (int pass = 0; pass < 2 * static_cast<int>(all_rungs.size()) + 4; ++pass) {
    absl::StatusOr<std::vector<TuneGroupRun>> runs = reader.ReadTuneGroup(tune, group, all_rungs);
    if (!runs.ok()) return runs.status();
    absl::StatusOr<std::vector<TuneDecisionInfo>> stored = reader.TuneDecisions(tune.sweep_id, group);
    if (!stored.ok()) return stored.status();
    int64_t steps = std::numeric_limits<int64_t>::max();
    AshaGroup g;
    for (const TuneGroupRun& r : *runs) {
      AshaRun a;
      a.run_id = r.run_id;
      a.value = r.value;
      a.seed = r.seed;
      a.state = r.state;
      a.held = r.held;
      a.follower = tune.plan.seeds() == "first" && r.seed != tune.plan.first_seed();
      a.steps_done = r.steps_done;
      a.final_metric = r.final_metric;
      a.at = r.at;
      g.runs.push_back(std::move(a));
      steps = std::min(steps, r.steps_total);
    }
    for (const TuneDecisionInfo& d : *stored) g.decided.insert({d.value, d.rung, d.kind});
    AshaRule rule;
    for (int64_t rung : all_rungs) {
      if (rung < steps) rule.rungs.push_back(rung);  // a rung at the end is the end
    }
    rule.reduction_factor = tune.plan.reduction_factor();
    rule.maximize = tune.maximize;
    rule.seeds_first = tune.plan.seeds() == "first";
    rule.metric = tune.metric;
    const std::vector<AshaDecision> decisions = DecideAsha(g, rule);
    if (decisions.empty()) return absl::OkStatus();
    TuneDecisionWrite write;
    write.sweep_id = tune.sweep_id;
    write.group = group;
    for (const AshaDecision& d : decisions) {
      TuneDecisionWrite::Decision& w = write.decisions.emplace_back();
      w.kind = AshaKindName(d.kind);
      w.value = d.value;
      w.rung = d.rung;
      w.metric = d.metric;
      w.detail = d.detail;
      w.runs = d.runs;
      w.next_stop = d.next_stop;
    }
    absl::StatusOr<TuneDecisionResult> applied = store_->ApplyTuneDecisions(write);
    if (!applied.ok()) return applied.status();
    for (int64_t id : applied->released) {
      absl::StatusOr<RunInfo> run = reader.GetRun(id);
      if (!run.ok()) return run.status();
      absl::MutexLock lock(&mu_);
      attempt_base_[id] = run->attempts;  // rung pauses do not use up retries
      scheduler_.Enqueue(ToQueued(*run, absl::InfinitePast()));
      work_cv_.SignalAll();
    }
    if (applied->released.empty() && applied->stopped.empty()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status CoordinatorCore::BisectGroup(const TuneInfo& tune, const std::string& group) {
  absl::MutexLock tuning(&tune_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (scheduler_.IsCancelled(tune.sweep_id)) return absl::OkStatus();
  }
  const StoreReader& reader = store_->scheduling_reader();
  absl::StatusOr<std::vector<BracketInfo>> brackets = reader.TuneBrackets(tune.sweep_id);
  if (!brackets.ok()) return brackets.status();
  const auto bracket = std::find_if(brackets->begin(), brackets->end(),
                                    [&](const BracketInfo& b) { return b.group == group; });
  if (bracket == brackets->end() || bracket->state != "OPEN") return absl::OkStatus();
  absl::StatusOr<std::vector<TuneGroupRun>> runs = reader.ReadTuneGroup(tune, group, {});
  if (!runs.ok()) return runs.status();
  // Each value over its seeds: done when every run ended; stable when every one SUCCEEDED
  // within the spike score.
  std::map<double, BoundaryProbe> by_value;
  for (const TuneGroupRun& r : *runs) {
    auto [it, added] = by_value.try_emplace(r.value);
    BoundaryProbe& p = it->second;
    if (added) {
      p.value = r.value;
      p.done = true;
      p.stable = true;
    }
    const bool ended = r.state == SUCCEEDED || r.state == DIVERGED || r.state == FAILED ||
                       r.state == CANCELLED || r.state == STOPPED;
    p.done = p.done && ended;
    p.failed = p.failed || r.state == FAILED || r.state == CANCELLED;
    p.stable = p.stable && r.state == SUCCEEDED &&
               !(r.spike_score > tune.plan.max_spike_score());
  }
  std::vector<BoundaryProbe> probes;
  for (const auto& [value, p] : by_value) probes.push_back(p);
  const BoundaryStep step =
      NextBoundaryStep(probes, tune.plan.min(), tune.plan.max(), tune.plan.tolerance());
  if (step.kind == BoundaryStep::Kind::kWait) return absl::OkStatus();
  if (step.kind == BoundaryStep::Kind::kDone) {
    BracketWrite done;
    done.sweep_id = tune.sweep_id;
    done.group = group;
    done.stable = step.stable.value_or(std::nan(""));
    done.unstable = step.unstable.value_or(std::nan(""));
    done.note = step.note;
    return store_->CloseBracket(done);
  }
  // The next probe's runs, expanded from the stored spec as the sweep's own were.
  absl::StatusOr<SweepSource> source = reader.GetSweepSource(tune.sweep_id);
  if (!source.ok()) return source.status();
  if (source->code_version != CodeVersion()) {
    // Another build could expand the probe differently (its defaults, its budget matching).
    return absl::FailedPreconditionError(absl::StrCat(
        "the next probe of ", group, " (", FormatTuneValue(step.next), ") needs a coordinator "
        "built from ", source->code_version, ", the sweep's code version; this one is ",
        CodeVersion()));
  }
  absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(source->spec_yaml, source->spec_file);
  if (!spec.ok()) return spec.status();
  TuneProbeWrite write;
  write.sweep_id = tune.sweep_id;
  write.group = group;
  write.value = step.next;
  write.detail = absl::StrCat("bisecting [", FormatTuneValue(*step.stable), ", ",
                              FormatTuneValue(*step.unstable), "]: next ",
                              FormatTuneValue(step.next));
  ExpandOptions options;
  options.code_version = source->code_version;
  absl::StatusOr<std::vector<RunSpec>> made =
      ExpandTuneProbe(*spec, group, step.next, options, &write.config_json);
  if (!made.ok()) return made.status();
  for (RunSpec& run : *made) *write.runs.add_runs() = std::move(run);
  write.runs.set_name(spec->name);
  write.runs.set_priority(spec->priority);
  absl::StatusOr<TuneProbeResult> added = store_->AddTuneProbe(write);
  if (!added.ok()) return added.status();
  for (size_t i = 0; i < added->run_ids.size(); ++i) {
    absl::StatusOr<RunInfo> run = reader.GetRun(added->run_ids[i]);
    if (!run.ok()) return run.status();
    auto job = std::make_shared<JobTemplate>();
    job->config = write.runs.runs(static_cast<int>(i)).config();
    job->sweep = spec->name;
    job->variant = run->variant;
    absl::MutexLock lock(&mu_);
    scheduler_.Enqueue(ToQueued(*run, absl::InfinitePast(), std::move(job)));
    work_cv_.SignalAll();
  }
  return absl::OkStatus();
}

}  // namespace ablate
