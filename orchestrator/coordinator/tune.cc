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
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orchestrator/coordinator/core.h"
#include "orchestrator/coordinator/core_internal.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/sweep/tune.h"

namespace ablate {

using core_internal::ToQueued;

absl::Status CoordinatorCore::TuneSweep(int64_t sweep_id) {
  absl::StatusOr<std::optional<TuneInfo>> tune = store_->reader().GetTune(sweep_id);
  if (!tune.ok()) return tune.status();
  if (!tune->has_value() || (*tune)->method != "asha") return absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> groups = store_->reader().TuneGroups(sweep_id);
  if (!groups.ok()) return groups.status();
  for (const std::string& group : *groups) {
    if (absl::Status s = TuneGroup(**tune, group); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void CoordinatorCore::TuneAfter(const std::vector<int64_t>& run_ids) {
  std::set<std::pair<int64_t, std::string>> groups;
  for (int64_t id : run_ids) {
    absl::StatusOr<RunInfo> run = store_->reader().GetRun(id);
    if (run.ok() && run->tuned) groups.insert({run->sweep_id, run->tune_group});
  }
  std::map<int64_t, std::optional<TuneInfo>> tunes;
  for (const auto& [sweep_id, group] : groups) {
    auto it = tunes.find(sweep_id);
    if (it == tunes.end()) {
      absl::StatusOr<std::optional<TuneInfo>> tune = store_->reader().GetTune(sweep_id);
      it = tunes.emplace(sweep_id, tune.ok() ? *tune : std::nullopt).first;
    }
    if (!it->second.has_value() || it->second->method != "asha") continue;
    // A failure here leaves the decision to the next end in the group, or to a restart
    // (Rebuild): the store holds everything it is made from.
    if (absl::Status s = TuneGroup(*it->second, group); !s.ok()) {
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
  const StoreReader& reader = store_->reader();
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

}  // namespace ablate
