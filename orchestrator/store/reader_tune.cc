// StoreReader's reads of tuning: a sweep's `tune:` block, its groups, a group's runs with the
// tuned metric at the rung steps, and the decisions stored (the tunes, tune_runs and
// tune_decisions tables, schema version 10).
#include <algorithm>
#include <limits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/reader_internal.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {

using reader_internal::ReadColumns;

namespace {

// The metrics a tune ranks by are columns of both runs and eval_metrics; the name is checked
// against this list before it goes into SQL.
bool IsTuneMetric(const std::string& m) {
  return m == "val_loss" || m == "val_ppl" || m == "gate_score" || m == "m_act" || m == "f_attn" ||
         m == "sink_rate";
}

}  // namespace

absl::StatusOr<std::optional<TuneInfo>> StoreReader::GetTune(int64_t sweep_id) const {
  absl::StatusOr<std::vector<TuneInfo>> rows = ReadRows<TuneInfo>(
      "SELECT axis, method, metric, mode, plan_json FROM tunes WHERE sweep_id = ?1",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [&](const Stmt& s) {
        TuneInfo t;
        t.sweep_id = sweep_id;
        std::string mode, plan;
        ReadColumns(s, 0, &t.axis, &t.method, &t.metric, &mode, &plan);
        t.maximize = mode == "max";
        google::protobuf::util::JsonParseOptions options;
        options.ignore_unknown_fields = true;
        (void)google::protobuf::util::JsonStringToMessage(plan, &t.plan, options);
        return t;
      });
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::optional<TuneInfo>();
  return std::optional<TuneInfo>(std::move(rows->front()));
}

absl::StatusOr<std::vector<std::string>> StoreReader::TuneGroups(int64_t sweep_id) const {
  return ReadRows<std::string>(
      "SELECT DISTINCT grp FROM tune_runs WHERE sweep_id = ?1 ORDER BY grp",
      [&](Stmt& q) { q.Bind(1, sweep_id); }, [](const Stmt& s) { return s.ColumnText(0); });
}

absl::StatusOr<std::vector<TuneGroupRun>> StoreReader::ReadTuneGroup(
    const TuneInfo& tune, const std::string& group, const std::vector<int64_t>& rungs) const {
  // A column of runs and eval_metrics, spliced (checked against the list), or a metric by name
  // (train.evals', a program's), bound as ?3 and read from eval_values.
  const bool column = IsTuneMetric(tune.metric);
  absl::StatusOr<std::vector<TuneGroupRun>> runs = ReadRows<TuneGroupRun>(
      absl::StrCat(
          "SELECT t.run_id, t.value, r.seed, r.state, t.held, r.steps_done, r.steps_total, "
          "r.spike_score, ",
          column ? absl::StrCat("r.", tune.metric)
                 : "(SELECT e.value FROM eval_values e WHERE e.run_id = "
                   "coalesce(r.reused_from, r.id) AND e.name = ?3 ORDER BY e.step DESC "
                   "LIMIT 1)",
          " FROM tune_runs t JOIN runs r ON r.id = t.run_id WHERE t.sweep_id = ?1 AND "
          "t.grp = ?2 AND ?3 = ?3 ORDER BY r.run_index"),
      [&](Stmt& q) { q.Bind(1, tune.sweep_id).Bind(2, group).Bind(3, tune.metric); },
      [](const Stmt& s) {
        TuneGroupRun r;
        ReadColumns(s, 0, &r.run_id, &r.value);
        r.seed = static_cast<uint64_t>(s.ColumnInt(2));
        r.state = ParseRunState(s.ColumnText(3));
        r.held = s.ColumnInt(4) != 0;
        ReadColumns(s, 5, &r.steps_done, &r.steps_total, &r.spike_score, &r.final_metric);
        return r;
      });
  if (!runs.ok() || rungs.empty()) return runs;
  std::map<int64_t, TuneGroupRun*> by_id;
  for (TuneGroupRun& r : *runs) by_id[r.run_id] = &r;
  const int64_t first = *std::min_element(rungs.begin(), rungs.end());
  const bool through = tune.plan.trains_through();
  const int64_t last =
      through ? std::numeric_limits<int64_t>::max() : *std::max_element(rungs.begin(), rungs.end());
  // Trains through: each rung's value is the run's first evaluation at or after it (ascending
  // steps: the first one seen for a rung wins).
  absl::Status read = ForEachRow(
      column ? absl::StrCat("SELECT e.run_id, e.step, e.", tune.metric,
                            " FROM tune_runs t JOIN eval_metrics e ON e.run_id = t.run_id "
                            "WHERE t.sweep_id = ?1 AND t.grp = ?2 AND e.step BETWEEN ?3 AND ?4 "
                            "AND ?5 = ?5 ORDER BY e.run_id, e.step")
             : std::string("SELECT e.run_id, e.step, e.value FROM tune_runs t JOIN eval_values e "
                           "ON e.run_id = t.run_id WHERE t.sweep_id = ?1 AND t.grp = ?2 AND "
                           "e.step BETWEEN ?3 AND ?4 AND e.name = ?5 ORDER BY e.run_id, e.step"),
      [&](Stmt& q) {
        q.Bind(1, tune.sweep_id).Bind(2, group).Bind(3, first).Bind(4, last).Bind(5, tune.metric);
      },
      [&](const Stmt& s) {
        const int64_t step = s.ColumnInt(1);
        auto it = by_id.find(s.ColumnInt(0));
        if (it == by_id.end()) return;
        for (int64_t rung : rungs) {
          if (through ? rung <= step : rung == step)
            it->second->at.emplace(rung, s.ColumnDouble(2));
        }
      });
  if (!read.ok()) return read;
  return runs;
}

absl::StatusOr<std::vector<TuneDecisionInfo>> StoreReader::TuneDecisions(
    int64_t sweep_id, const std::string& group) const {
  return ReadRows<TuneDecisionInfo>(
      "SELECT grp, value, rung, kind, metric, detail FROM tune_decisions WHERE sweep_id = ?1 "
      "AND (?2 = '' OR grp = ?2) ORDER BY id",
      [&](Stmt& q) { q.Bind(1, sweep_id).Bind(2, group); },
      [](const Stmt& s) {
        TuneDecisionInfo d;
        ReadColumns(s, 0, &d.group, &d.value, &d.rung, &d.kind, &d.metric, &d.detail);
        return d;
      });
}

absl::StatusOr<std::vector<BracketInfo>> StoreReader::TuneBrackets(int64_t sweep_id) const {
  return ReadRows<BracketInfo>(
      "SELECT b.grp, b.variant, b.axes, b.state, b.stable, b.unstable, b.probes, b.note "
      "FROM tune_brackets b WHERE b.sweep_id = ?1 ORDER BY (SELECT min(r.run_index) FROM "
      "tune_runs t JOIN runs r ON r.id = t.run_id WHERE t.sweep_id = ?1 AND t.grp = b.grp)",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [](const Stmt& s) {
        BracketInfo b;
        ReadColumns(s, 0, &b.group, &b.variant, &b.axes, &b.state, &b.stable, &b.unstable,
                    &b.probes, &b.note);
        return b;
      });
}

}  // namespace ablate
