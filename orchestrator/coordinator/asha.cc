#include "orchestrator/coordinator/asha.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/run_state.h"
#include "orchestrator/sweep/tune_value.h"

namespace ablate {

const char* AshaKindName(AshaDecision::Kind kind) {
  switch (kind) {
    case AshaDecision::Kind::kPromote:
      return "promote";
    case AshaDecision::Kind::kStop:
      return "stop";
    case AshaDecision::Kind::kChoose:
      return "choose";
  }
  return "";
}

namespace {

constexpr double kNaNValue = std::numeric_limits<double>::quiet_NaN();

bool DroppedOut(RunState s) { return s == FAILED || s == CANCELLED; }

// One value of a group, over its deciding runs (every seed, or the first alone).
struct Trial {
  double value = 0;
  std::vector<const AshaRun*> seeds;  // deciding runs that did not fail
  bool diverged = false;
  int reached = 0;                // rungs [0, reached) reached by every seed
  bool alive = false;             // some seed can still train (not ended)
  double MetricAt(int k) const {  // NaN when any seed lacks a finite value
    double sum = 0;
    for (const AshaRun* r : seeds) {
      auto it = r->at.find(k);
      if (it == r->at.end() || !std::isfinite(it->second)) return kNaNValue;
      sum += it->second;
    }
    return sum / static_cast<double>(seeds.size());
  }
  std::vector<int64_t> Live() const {  // runs that can still train: PENDING or RUNNING
    std::vector<int64_t> ids;
    for (const AshaRun* r : seeds) {
      if (r->state == PENDING || r->state == RUNNING) ids.push_back(r->run_id);
    }
    return ids;
  }
  std::vector<int64_t> Held() const {
    std::vector<int64_t> ids;
    for (const AshaRun* r : seeds) {
      if (r->held && r->state == PENDING) ids.push_back(r->run_id);
    }
    return ids;
  }
};

// A group's trials by value (a trial with no seed left is left out) and, with seeds first, the
// runs of the other seeds by value. Points into the runs it was made from.
struct Trials {
  std::map<double, Trial> by_value;
  std::map<double, std::vector<const AshaRun*>> followers;
};

// The trials at one rung, best first: (metric there, trial); NaN ranks last.
struct Standing {
  std::vector<std::pair<double, const Trial*>> ranked;
  bool complete = true;  // no other trial can still arrive at the rung
};

std::string MetricText(double v) {
  return std::isfinite(v) ? FormatTuneValue(v) : std::string("none");
}

bool Decided(const AshaGroup& group, double value, int rung, AshaDecision::Kind kind) {
  return group.decided.count({value, rung, AshaKindName(kind)}) > 0;
}

// The group's runs with each one's metric keyed by rung index (k for rungs[k]) instead of step.
std::vector<AshaRun> KeyedByRung(const std::vector<AshaRun>& runs,
                                 const std::vector<int64_t>& rungs) {
  std::vector<AshaRun> keyed = runs;
  for (AshaRun& r : keyed) {
    std::map<int64_t, double> by_rung;
    for (int k = 0; k < static_cast<int>(rungs.size()); ++k) {
      if (auto it = r.at.find(rungs[k]); it != r.at.end()) by_rung[k] = it->second;
    }
    r.at = std::move(by_rung);
  }
  return keyed;
}

// The trials of `runs` (keyed by rung), each with the rungs every seed of it reached of `levels`.
Trials TrialsOf(const std::vector<AshaRun>& runs, int levels) {
  Trials trials;
  for (const AshaRun& r : runs) {
    if (r.follower) {
      trials.followers[r.value].push_back(&r);
      continue;
    }
    Trial& t = trials.by_value[r.value];
    t.value = r.value;
    if (DroppedOut(r.state)) continue;
    t.seeds.push_back(&r);
    t.diverged = t.diverged || r.state == DIVERGED;
    t.alive = t.alive || !RunEnded(r.state);
  }
  for (auto it = trials.by_value.begin(); it != trials.by_value.end();) {
    if (it->second.seeds.empty()) {
      it = trials.by_value.erase(it);
      continue;
    }
    Trial& t = it->second;
    while (t.reached < levels && std::all_of(t.seeds.begin(), t.seeds.end(), [&](const AshaRun* r) {
             return r->at.count(t.reached) > 0;
           })) {
      ++t.reached;
    }
    ++it;
  }
  return trials;
}

// The trials at rung k: those that reached it, and those that diverged on the way.
Standing StandingAt(const std::map<double, Trial>& trials, int k, bool maximize) {
  Standing standing;
  for (const auto& [value, t] : trials) {
    if (t.reached > k) {
      standing.ranked.push_back({t.MetricAt(k), &t});
    } else if (t.diverged && t.reached == k) {
      standing.ranked.push_back({kNaNValue, &t});  // diverged on the way: ranks last
    } else if (t.alive && !t.diverged) {
      // Below rung k, it may still get there: some seed trains, or waits at an earlier rung.
      standing.complete = false;
    }
  }
  // A diverged trial that got past rung k still reached it; it ranks by its metric there
  // (it was promoted, or not, then), and last only at the rung it did not reach.
  std::stable_sort(standing.ranked.begin(), standing.ranked.end(),
                   [&](const auto& a, const auto& b) {
                     const bool fa = std::isfinite(a.first), fb = std::isfinite(b.first);
                     if (fa != fb) return fa;
                     if (!fa) return a.second->value < b.second->value;
                     if (a.first != b.first)
                       return maximize ? a.first > b.first : a.first < b.first;
                     return a.second->value < b.second->value;
                   });
  return standing;
}

// A decision on the trial's held runs at rung k, into `out` (none held: nothing to decide on).
void Decide(const Trial& t, AshaDecision::Kind kind, int k, double metric, int64_t next_stop,
            std::string detail, std::vector<AshaDecision>* out) {
  AshaDecision d;
  d.kind = kind;
  d.value = t.value;
  d.rung = k;
  d.metric = metric;
  d.runs = t.Held();
  d.next_stop = next_stop;
  d.detail = std::move(detail);
  if (!d.runs.empty()) out->push_back(std::move(d));
}

// Rung k's decisions: the top trials there go on; once complete, the others stop.
void DecideRung(const AshaGroup& group, const AshaRule& rule, int k, const Standing& standing,
                std::vector<AshaDecision>* out) {
  const int64_t n = static_cast<int64_t>(standing.ranked.size());
  int64_t top = static_cast<int64_t>(std::floor(static_cast<double>(n) / rule.reduction_factor));
  if (standing.complete && n > 0) top = std::max<int64_t>(top, 1);
  const int levels = static_cast<int>(rule.rungs.size());
  const int64_t next_stop = k + 1 < levels ? rule.rungs[k + 1] : 0;
  for (int64_t i = 0; i < n; ++i) {
    const Trial& t = *standing.ranked[i].second;
    const double metric = standing.ranked[i].first;
    const bool promotable = i < top && std::isfinite(metric) && !t.diverged;
    // Promoted before: decided, or already past this rung (a seed evaluated further).
    const bool promoted =
        Decided(group, t.value, k, AshaDecision::Kind::kPromote) || t.reached > k + 1;
    const std::string rank =
        absl::StrCat(rule.metric, " ", MetricText(metric), t.diverged ? " (diverged)" : "", " is ",
                     i + 1, " of ", n);
    if (promotable && !promoted && t.reached == k + 1) {
      Decide(t, AshaDecision::Kind::kPromote, k, metric, next_stop,
             absl::StrCat("rung ", k, " (step ", rule.rungs[k], "): ", rank, ", in the top ", top,
                          ": goes on to ",
                          next_stop > 0 ? absl::StrCat("step ", next_stop) : "the end"),
             out);
      continue;
    }
    if (!standing.complete || promotable || promoted) continue;
    if (Decided(group, t.value, k, AshaDecision::Kind::kStop)) continue;
    Decide(t, AshaDecision::Kind::kStop, k, metric, 0,
           absl::StrCat("stopped at rung ", k, " (step ", rule.rungs[k], "): ", rank,
                        ", not in the top ", top),
           out);
  }
}

// Rung k's decisions for runs that train through it: each trial that arrived there is judged
// once, against the trials there so far.
void DecideArrivals(const AshaGroup& group, const AshaRule& rule, int k, const Standing& standing,
                    std::vector<AshaDecision>* out) {
  const int64_t n = static_cast<int64_t>(standing.ranked.size());
  const int64_t top = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(static_cast<double>(n) / rule.reduction_factor)));
  for (int64_t i = 0; i < n; ++i) {
    const Trial& t = *standing.ranked[i].second;
    if (t.reached <= k || Decided(group, t.value, k, AshaDecision::Kind::kPromote) ||
        Decided(group, t.value, k, AshaDecision::Kind::kStop)) {
      continue;  // diverged on the way (its runs ended), or judged before
    }
    const double metric = standing.ranked[i].first;
    const std::string rank =
        absl::StrCat(rule.metric, " ", MetricText(metric), t.diverged ? " (diverged)" : "", " is ",
                     i + 1, " of ", n, " at rung ", k, " (step ", rule.rungs[k], ")");
    AshaDecision d;
    d.value = t.value;
    d.rung = k;
    d.metric = metric;
    if (i < top && std::isfinite(metric) && !t.diverged) {
      d.kind = AshaDecision::Kind::kPromote;
      d.detail = absl::StrCat(rank, ", in the top ", top, ": trains on");
      out->push_back(std::move(d));
      continue;
    }
    d.runs = t.Live();
    if (d.runs.empty()) continue;  // ended already: nothing to stop
    d.kind = AshaDecision::Kind::kStop;
    d.detail = absl::StrCat("stopped while training: ", rank, ", not in the top ", top);
    out->push_back(std::move(d));
  }
}

// The first-seed run that trained to its end with the best final metric, or null.
const AshaRun* BestFirstSeed(const std::vector<AshaRun>& runs, bool maximize) {
  const AshaRun* best = nullptr;
  for (const AshaRun& r : runs) {
    if (r.follower || r.state != SUCCEEDED || !std::isfinite(r.final_metric)) continue;
    if (best == nullptr ||
        (maximize ? r.final_metric > best->final_metric : r.final_metric < best->final_metric)) {
      best = &r;
    }
  }
  return best;
}

// Seeds first, once no first-seed run can train: the best finished trial's other seeds train
// straight through (kChoose), every other trial's are stopped.
void DecideFollowers(const AshaGroup& group, const AshaRule& rule, const std::vector<AshaRun>& runs,
                     const Trials& trials, std::vector<AshaDecision>* out) {
  for (const auto& [value, t] : trials.by_value) {
    if (t.alive) return;
  }
  const AshaRun* best = BestFirstSeed(runs, rule.maximize);
  for (const auto& [value, list] : trials.followers) {
    std::vector<int64_t> held;
    for (const AshaRun* r : list) {
      if (r->held && r->state == PENDING) held.push_back(r->run_id);
    }
    const bool chosen = best != nullptr && value == best->value;
    const AshaDecision::Kind kind =
        chosen ? AshaDecision::Kind::kChoose : AshaDecision::Kind::kStop;
    if (held.empty() || Decided(group, value, -1, kind)) continue;
    AshaDecision d;
    d.kind = kind;
    d.value = value;
    d.rung = -1;
    d.metric = best != nullptr ? best->final_metric : kNaNValue;
    d.runs = std::move(held);
    d.detail =
        best == nullptr ? std::string("stopped: no value trained to the end at the first seed")
        : chosen ? absl::StrCat("the first seed chose ", FormatTuneValue(value), " (", rule.metric,
                                " ", MetricText(best->final_metric), "): trains every seed")
                 : absl::StrCat("stopped: the first seed chose ", FormatTuneValue(best->value),
                                " (", rule.metric, " ", MetricText(best->final_metric), ")");
    out->push_back(std::move(d));
  }
}

}  // namespace

std::vector<AshaDecision> DecideAsha(const AshaGroup& group, const AshaRule& rule) {
  const int levels = static_cast<int>(rule.rungs.size());
  const std::vector<AshaRun> runs = KeyedByRung(group.runs, rule.rungs);
  const Trials trials = TrialsOf(runs, levels);
  std::vector<AshaDecision> out;
  for (int k = 0; k < levels; ++k) {
    const Standing standing = StandingAt(trials.by_value, k, rule.maximize);
    if (rule.trains_through) {
      DecideArrivals(group, rule, k, standing, &out);
    } else {
      DecideRung(group, rule, k, standing, &out);
    }
  }
  if (rule.seeds_first && !trials.followers.empty()) {
    DecideFollowers(group, rule, runs, trials, &out);
  }
  return out;
}

}  // namespace ablate
