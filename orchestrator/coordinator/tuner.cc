#include "orchestrator/coordinator/tuner.h"

#include "config/program_config.h"
#include "google/protobuf/util/json_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "config/run_state.h"
#include "orchestrator/coordinator/asha.h"
#include "orchestrator/coordinator/bisection.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/spec.h"
#include "orchestrator/sweep/tune_value.h"

namespace ablate {

namespace {

// A group as DecideAsha reads it: its runs, and the decisions stored before.
AshaGroup AshaGroupOf(const TuneInfo& tune, const std::vector<TuneGroupRun>& runs,
                      const std::vector<TuneDecisionInfo>& stored) {
  AshaGroup g;
  for (const TuneGroupRun& r : runs) {
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
  }
  for (const TuneDecisionInfo& d : stored) g.decided.insert({d.value, d.rung, d.kind});
  return g;
}

// The tune's rule for a group whose runs train `steps` steps: a rung at the end is the end.
AshaRule AshaRuleOf(const TuneInfo& tune, const std::vector<int64_t>& rungs, int64_t steps) {
  AshaRule rule;
  for (int64_t rung : rungs) {
    if (rung < steps) rule.rungs.push_back(rung);
  }
  rule.reduction_factor = tune.plan.reduction_factor();
  rule.maximize = tune.maximize;
  rule.seeds_first = tune.plan.seeds() == "first";
  rule.metric = tune.metric;
  rule.trains_through = tune.plan.trains_through();
  return rule;
}

TuneDecisionWrite DecisionWriteOf(const TuneInfo& tune, const std::string& group,
                                  const std::vector<AshaDecision>& decisions) {
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
  return write;
}

// Each value of a group over its seeds: done when every run ended; stable when every one
// SUCCEEDED within the spike score.
std::vector<BoundaryProbe> ProbesOf(const std::vector<TuneGroupRun>& runs, double max_spike_score) {
  std::map<double, BoundaryProbe> by_value;
  for (const TuneGroupRun& r : runs) {
    auto [it, added] = by_value.try_emplace(r.value);
    BoundaryProbe& p = it->second;
    if (added) {
      p.value = r.value;
      p.done = true;
      p.stable = true;
    }
    p.done = p.done && RunEnded(r.state);
    p.failed = p.failed || r.state == FAILED || r.state == CANCELLED;
    p.stable = p.stable && r.state == SUCCEEDED && !(r.spike_score > max_spike_score);
  }
  std::vector<BoundaryProbe> probes;
  for (const auto& [value, p] : by_value) probes.push_back(p);
  return probes;
}

}  // namespace

absl::Status Tuner::TuneSweep(int64_t sweep_id) {
  absl::StatusOr<std::optional<TuneInfo>> tune = store_->scheduling_reader().GetTune(sweep_id);
  if (!tune.ok()) return tune.status();
  if (!tune->has_value() || (*tune)->method == "grid") return absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> groups =
      store_->scheduling_reader().TuneGroups(sweep_id);
  if (!groups.ok()) return groups.status();
  for (const std::string& group : *groups) {
    if (absl::Status s = DecideGroup(**tune, group); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Tuner::TuneAfterEval(int64_t run_id) {
  absl::StatusOr<RunInfo> run = store_->scheduling_reader().GetRun(run_id);
  if (!run.ok() || !run->tuned) return;
  absl::StatusOr<std::optional<TuneInfo>> tune = store_->scheduling_reader().GetTune(run->sweep_id);
  if (!tune.ok() || !tune->has_value() || !(*tune)->plan.trains_through()) return;
  if (const absl::Status s = DecideGroup(**tune, run->tune_group); !s.ok()) {
    (void)store_->EnqueueEvent(run->sweep_id, 0, "tune_error",
                               absl::StrCat("tuning ", run->tune_group, ": ", s.message()));
  }
}

void Tuner::TuneAfter(const std::vector<int64_t>& run_ids) {
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
    // (TuneSweep): the store holds everything it is made from.
    if (const absl::Status s = DecideGroup(*it->second, group); !s.ok()) {
      (void)store_->EnqueueEvent(sweep_id, 0, "tune_error",
                                 absl::StrCat("tuning ", group, ": ", s.message()));
    }
  }
}

absl::Status Tuner::DecideGroup(const TuneInfo& tune, const std::string& group) {
  return tune.method == "boundary" ? BisectGroup(tune, group) : TuneGroup(tune, group);
}

absl::Status Tuner::TuneGroup(const TuneInfo& tune, const std::string& group) {
  absl::MutexLock tuning(&mu_);
  if (port_->SweepCancelled(tune.sweep_id)) return absl::OkStatus();
  const StoreReader& reader = store_->scheduling_reader();
  const std::vector<int64_t> all_rungs(tune.plan.rungs().begin(), tune.plan.rungs().end());
  // Each pass's stops can complete a later rung: decide again until nothing is left.
  for (int pass = 0; pass < 2 * static_cast<int>(all_rungs.size()) + 4; ++pass) {
    absl::StatusOr<std::vector<TuneGroupRun>> runs = reader.ReadTuneGroup(tune, group, all_rungs);
    if (!runs.ok()) return runs.status();
    absl::StatusOr<std::vector<TuneDecisionInfo>> stored =
        reader.TuneDecisions(tune.sweep_id, group);
    if (!stored.ok()) return stored.status();
    int64_t steps = std::numeric_limits<int64_t>::max();
    for (const TuneGroupRun& r : *runs) steps = std::min(steps, r.steps_total);
    const std::vector<AshaDecision> decisions =
        DecideAsha(AshaGroupOf(tune, *runs, *stored), AshaRuleOf(tune, all_rungs, steps));
    if (decisions.empty()) return absl::OkStatus();
    absl::StatusOr<TuneDecisionResult> applied =
        store_->ApplyTuneDecisions(DecisionWriteOf(tune, group, decisions));
    if (!applied.ok()) return applied.status();
    for (int64_t id : applied->released) {
      absl::StatusOr<RunInfo> run = reader.GetRun(id);
      if (!run.ok()) return run.status();
      port_->EnqueueRun(*run, /*config=*/nullptr);
    }
    // Trains through: a stopped run may be queued (dropped), or training (stopped by its worker).
    for (int64_t id : applied->stopped) port_->StopRun(id, "");
    for (const auto& [id, why] : applied->stopping) port_->StopRun(id, why);
    if (applied->released.empty() && applied->stopped.empty()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status Tuner::BisectGroup(const TuneInfo& tune, const std::string& group) {
  absl::MutexLock tuning(&mu_);
  if (port_->SweepCancelled(tune.sweep_id)) return absl::OkStatus();
  const StoreReader& reader = store_->scheduling_reader();
  absl::StatusOr<std::vector<BracketInfo>> brackets = reader.TuneBrackets(tune.sweep_id);
  if (!brackets.ok()) return brackets.status();
  const auto bracket = std::find_if(brackets->begin(), brackets->end(),
                                    [&](const BracketInfo& b) { return b.group == group; });
  if (bracket == brackets->end() || bracket->state != "OPEN") return absl::OkStatus();
  absl::StatusOr<std::vector<TuneGroupRun>> runs = reader.ReadTuneGroup(tune, group, {});
  if (!runs.ok()) return runs.status();
  const BoundaryStep step =
      NextBoundaryStep(ProbesOf(*runs, tune.plan.max_spike_score()), tune.plan.min(),
                       tune.plan.max(), tune.plan.tolerance());
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
  return AddProbe(tune, group, step);
}

absl::Status Tuner::AddProbe(const TuneInfo& tune, const std::string& group,
                             const BoundaryStep& step) {
  const StoreReader& reader = store_->scheduling_reader();
  // The next probe's runs, expanded from the stored spec as the sweep's own were.
  absl::StatusOr<SweepSource> source = reader.GetSweepSource(tune.sweep_id);
  if (!source.ok()) return source.status();
  ExpandOptions options;
  options.code_version = source->code_version;
  if (IsProgramCodeVersion(source->code_version)) {
    // A program's probe is its code's, whatever builds this coordinator: the code hash is any
    // of the sweep's runs' (expand refuses a boundary over a program with count:).
    absl::StatusOr<std::vector<RunInfo>> runs = reader.RunsOfSweep(tune.sweep_id, {});
    if (!runs.ok()) return runs.status();
    RunConfig config;
    google::protobuf::util::JsonParseOptions parse;
    parse.ignore_unknown_fields = true;
    if (runs->empty() ||
        !google::protobuf::util::JsonStringToMessage(runs->front().config_json, &config, parse)
             .ok()) {
      return absl::InternalError(
          absl::StrCat("sweep ", tune.sweep_id, ": no run config to take the program's code from"));
    }
    options.program_code_hash = config.program().code_hash();
  } else if (source->code_version != CodeVersion()) {
    // Another build could expand the probe differently (its defaults, its budget matching).
    return absl::FailedPreconditionError(
        absl::StrCat("the next probe of ", group, " (", FormatTuneValue(step.next),
                     ") needs a coordinator built from ", source->code_version,
                     ", the sweep's code version; this one is ", CodeVersion()));
  }
  absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(source->spec_yaml, source->spec_file);
  if (!spec.ok()) return spec.status();
  TuneProbeWrite write;
  write.sweep_id = tune.sweep_id;
  write.group = group;
  write.value = step.next;
  write.detail =
      absl::StrCat("bisecting [", FormatTuneValue(*step.stable), ", ",
                   FormatTuneValue(*step.unstable), "]: next ", FormatTuneValue(step.next));
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
    port_->EnqueueRun(*run, &write.runs.runs(static_cast<int>(i)).config());
  }
  return absl::OkStatus();
}

}  // namespace ablate
