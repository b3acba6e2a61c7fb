// StoreReader's reads of results: the runs of one or more sweeps matched by variant, seed and
// axis point (ReadResults), and the comparison table computed over them (ComparisonTableOf), the
// numbers the variant_table and length_table views give for one sweep.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/param_count.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/reader_internal.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {
namespace {

bool HasResult(RunState s) { return s == SUCCEEDED || s == DIVERGED; }

// Whether a run of a later sweep takes the place of `held` at the same (variant, seed, axes).
bool Replaces(const RunInfo& later, const RunInfo& held) {
  return HasResult(later.state) || !HasResult(held.state);
}

// The finite values of one metric over a group's runs.
class Moments {
 public:
  void Add(double v) {
    if (std::isfinite(v)) values_.push_back(v);
  }
  int64_t n() const { return static_cast<int64_t>(values_.size()); }
  MeanStd Get() const { return MeanAndStd(values_); }

 private:
  std::vector<double> values_;
};

// One (variant, axes) group of the table while its runs are read.
struct Group {
  ComparisonRow row;
  Moments val_loss, val_ppl, gate_score, m_act, f_attn, spike_score, train_loss, sink_rate;
  Moments peak_memory_bytes, train_seconds, eval_seconds, tokens_per_s, flops;
  double params_total = 0, params_activated = 0, params_added = 0;
  struct Length {
    bool yarn = false;
    Moments val_loss, val_ppl;
  };
  std::map<int64_t, Length> lengths;  // by seq_len
  std::map<std::string, Moments> metrics;  // by name
};

void AddRun(const ResultRun& result, Group* g) {
  const RunInfo& r = result.run;
  ++g->row.runs;
  g->params_total += static_cast<double>(r.params_total);
  g->params_activated += static_cast<double>(r.params_activated);
  g->params_added += static_cast<double>(r.params_added);
  if (r.state == DIVERGED) ++g->row.diverged;
  if (r.state == FAILED) ++g->row.failed;
  if (r.state == STOPPED) ++g->row.stopped;
  if (r.state == PENDING || r.state == RUNNING || r.state == INTERRUPTED) ++g->row.unfinished;
  if (r.state != SUCCEEDED) return;
  ++g->row.n;
  g->val_loss.Add(r.val_loss);
  g->val_ppl.Add(r.val_ppl);
  g->gate_score.Add(r.gate_score);
  g->m_act.Add(r.m_act);
  g->f_attn.Add(r.f_attn);
  g->sink_rate.Add(r.sink_rate);
  g->spike_score.Add(r.spike_score);
  g->train_loss.Add(r.final_train_loss);
  g->peak_memory_bytes.Add(r.peak_memory_bytes > 0 ? static_cast<double>(r.peak_memory_bytes)
                                                   : kNaN);
  g->train_seconds.Add(r.wall_s);
  g->eval_seconds.Add(r.eval_s);
  g->tokens_per_s.Add(r.tokens_per_s);
  g->flops.Add(r.flops);
  for (const auto& [name, value] : result.metrics) g->metrics[name].Add(value);
  for (const RunLength& l : result.lengths) {
    Group::Length& length = g->lengths[l.seq_len];
    length.yarn = length.yarn || l.yarn;
    length.val_loss.Add(l.val_loss);
    length.val_ppl.Add(l.val_ppl);
  }
}

ComparisonRow RowOf(const Group& g) {
  ComparisonRow row = g.row;
  row.val_loss = g.val_loss.Get();
  row.val_ppl = g.val_ppl.Get();
  row.gate_score = g.gate_score.Get();
  row.m_act = g.m_act.Get();
  row.f_attn = g.f_attn.Get();
  row.sink_rate = g.sink_rate.Get();
  row.spike_score = g.spike_score.Get();
  row.train_loss = g.train_loss.Get();
  row.peak_memory_bytes = g.peak_memory_bytes.Get();
  row.train_seconds = g.train_seconds.Get();
  row.eval_seconds = g.eval_seconds.Get();
  row.tokens_per_s = g.tokens_per_s.Get();
  row.flops = g.flops.Get();
  const double runs = static_cast<double>(row.runs);
  row.params_total = g.params_total / runs;
  row.params_activated = g.params_activated / runs;
  row.params_added = g.params_added / runs;
  for (const auto& [name, m] : g.metrics) row.metrics[name] = m.Get();
  for (const auto& [seq_len, l] : g.lengths) {
    if (l.val_ppl.n() == 0 && l.val_loss.n() == 0) continue;
    LengthStat& stat = row.lengths.emplace_back();
    stat.seq_len = seq_len;
    stat.yarn = l.yarn;
    stat.n = l.val_ppl.n();
    stat.val_loss = l.val_loss.Get();
    stat.val_ppl = l.val_ppl.Get();
  }
  return row;
}

}  // namespace

ComparisonTable ComparisonTableOf(const ResultSet& results) {
  std::vector<Group> groups;
  std::map<std::pair<std::string, std::string>, size_t> index;  // (variant, axes) -> group
  for (const ResultRun& r : results.runs) {
    auto [it, added] = index.try_emplace({r.run.variant, r.run.axes}, groups.size());
    if (added) {
      Group& g = groups.emplace_back();
      g.row.variant = r.run.variant;
      g.row.axes = r.run.axes;
      auto description = results.descriptions.find(r.run.variant);
      if (description != results.descriptions.end()) g.row.description = description->second;
    }
    AddRun(r, &groups[it->second]);
  }
  ComparisonTable table;
  table.sweep = results.label;
  for (const Group& g : groups) table.rows.push_back(RowOf(g));
  return table;
}

absl::StatusOr<ComparisonTable> StoreReader::GetComparisonTable(
    const ResultSelection& selection) const {
  absl::StatusOr<ResultSet> results = ReadResults(selection);
  if (!results.ok()) return results.status();
  return ComparisonTableOf(*results);
}

absl::StatusOr<ResultSet> StoreReader::ReadResults(const ResultSelection& selection) const {
  if (selection.sweeps.empty()) return absl::InvalidArgumentError("results: no sweep named");
  ResultSet set;
  std::vector<std::string> names;
  std::set<int64_t> ids;
  for (const std::string& name : selection.sweeps) {
    absl::StatusOr<SweepInfo> sweep = GetSweep(name);
    if (!sweep.ok()) return sweep.status();
    if (!ids.insert(sweep->id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("results: sweep ", sweep->name, " is named twice"));
    }
    names.push_back(sweep->name);
    set.sweeps.push_back(*std::move(sweep));
  }
  set.label = absl::StrJoin(names, "+");
  absl::StatusOr<SweepSource> source = GetSweepSource(set.sweeps.front().id);
  if (!source.ok()) return source.status();
  set.reference = source->reference;

  // (variant, seed, axes) -> index in set.runs.
  std::map<std::tuple<std::string, uint64_t, std::string>, size_t> held;
  for (const SweepInfo& sweep : set.sweeps) {
    absl::StatusOr<std::vector<VariantInfo>> variants = ListVariants(sweep.id);
    if (!variants.ok()) return variants.status();
    for (const VariantInfo& v : *variants) set.descriptions.try_emplace(v.name, v.description);
    absl::StatusOr<std::vector<RunInfo>> runs = RunsOfSweep(sweep.id);
    if (!runs.ok()) return runs.status();
    std::set<int64_t> excluded;
    if (!selection.exclude_tags.empty()) {
      absl::StatusOr<std::set<int64_t>> tagged = RunsTagged(sweep.id, selection.exclude_tags);
      if (!tagged.ok()) return tagged.status();
      excluded = *std::move(tagged);
    }
    std::map<int64_t, std::vector<RunLength>> lengths;
    if (absl::Status read = ForEachRow(
            "SELECT run_id, seq_len, yarn, val_loss, val_ppl FROM length_results "
            "WHERE sweep_id = ?1 ORDER BY run_id, seq_len",
            [&](Stmt& q) { q.Bind(1, sweep.id); },
            [&](const Stmt& s) {
              RunLength& l = lengths[s.ColumnInt(0)].emplace_back();
              l.seq_len = s.ColumnInt(1);
              l.yarn = s.ColumnInt(2) != 0;
              l.val_loss = s.ColumnDouble(3);
              l.val_ppl = s.ColumnDouble(4);
            });
        !read.ok()) {
      return read;
    }
    std::map<int64_t, std::map<std::string, double>> named;
    if (absl::Status read = ForEachRow(
            "SELECT run_id, name, value FROM eval_results WHERE sweep_id = ?1 AND value IS NOT "
            "NULL",
            [&](Stmt& q) { q.Bind(1, sweep.id); },
            [&](const Stmt& s) { named[s.ColumnInt(0)][s.ColumnText(1)] = s.ColumnDouble(2); });
        !read.ok()) {
      return read;
    }
    std::map<int64_t, std::vector<double>> items;
    if (!selection.items_metric.empty() && selection.at_tokens <= 0 && selection.at_flops <= 0) {
      if (absl::Status read = ForEachRow(
              "SELECT run_id, value FROM eval_item_results WHERE sweep_id = ?1 AND name = ?2 "
              "ORDER BY run_id, item",
              [&](Stmt& q) { q.Bind(1, sweep.id).Bind(2, selection.items_metric); },
              [&](const Stmt& s) {
                items[s.ColumnInt(0)].push_back(s.ColumnIsNull(1) ? kNaN : s.ColumnDouble(1));
              });
          !read.ok()) {
        return read;
      }
    }
    for (RunInfo& run : *runs) {
      if (excluded.count(run.id) > 0) {
        ++set.excluded;
        continue;
      }
      ResultRun result{std::move(run), {}, {}, {}};
      auto l = lengths.find(result.run.id);
      if (l != lengths.end()) result.lengths = std::move(l->second);
      auto n = named.find(result.run.id);
      if (n != named.end()) result.metrics = std::move(n->second);
      if (auto i = items.find(result.run.id); i != items.end()) result.items = std::move(i->second);
      auto [it, added] =
          held.try_emplace({result.run.variant, result.run.seed, result.run.axes}, set.runs.size());
      if (added) {
        set.runs.push_back(std::move(result));
      } else {
        ++set.replaced;
        if (Replaces(result.run, set.runs[it->second].run))
          set.runs[it->second] = std::move(result);
      }
    }
  }
  if (selection.at_tokens > 0 || selection.at_flops > 0) {
    for (ResultRun& result : set.runs) {
      if (absl::Status s = AtBudget(selection, &result); !s.ok()) return s;
    }
  }
  return set;
}

absl::Status StoreReader::AtBudget(const ResultSelection& selection, ResultRun* result) const {
  RunInfo& run = result->run;
  result->lengths.clear();
  result->metrics.clear();
  for (double* v :
       {&run.val_loss, &run.val_ppl, &run.gate_score, &run.m_act, &run.f_attn, &run.sink_rate}) {
    *v = kNaN;
  }
  RunConfig config;
  if (!google::protobuf::util::JsonStringToMessage(run.config_json, &config).ok()) {
    return absl::OkStatus();  // no config to count by: no value
  }
  const TrainConfig& t = config.train();
  const double tokens_per_step = TokensPerStep(t);
  const double per_step =
      selection.at_tokens > 0
          ? tokens_per_step
          : tokens_per_step * TrainingFlopsPerToken(config.model(), t.seq_len());
  const double budget = selection.at_tokens > 0 ? selection.at_tokens : selection.at_flops;
  if (!(per_step > 0)) return absl::OkStatus();
  const auto last_step = static_cast<int64_t>(std::min(9.0e18, std::floor(budget / per_step)));
  // The metrics by name of the same evaluation (its last at or below the budget).
  if (absl::Status read = ForEachRow(
          "SELECT name, value FROM eval_values WHERE run_id = (SELECT coalesce(reused_from, id) "
          "FROM runs WHERE id = ?1) AND value IS NOT NULL AND step = (SELECT max(step) FROM "
          "eval_metrics WHERE run_id = (SELECT coalesce(reused_from, id) FROM runs WHERE id = ?1) "
          "AND step > 0 AND step <= ?2)",
          [&](Stmt& q) { q.Bind(1, run.id).Bind(2, last_step); },
          [&](const Stmt& s) { result->metrics[s.ColumnText(0)] = s.ColumnDouble(1); });
      !read.ok()) {
    return read;
  }
  return ForEachRow(
      absl::StrCat(
          "SELECT val_loss, val_ppl, gate_score, m_act, f_attn, sink_rate FROM eval_metrics "
          "WHERE run_id = (SELECT coalesce(reused_from, id) FROM runs WHERE id = ?1) AND step > 0 "
          "AND step <= ?2 ORDER BY step DESC LIMIT 1"),
      [&](Stmt& q) { q.Bind(1, run.id).Bind(2, last_step); },
      [&](const Stmt& s) {
        double* v[] = {&run.val_loss, &run.val_ppl, &run.gate_score,
                       &run.m_act,    &run.f_attn,  &run.sink_rate};
        for (int i = 0; i < 6; ++i) *v[i] = s.ColumnIsNull(i) ? kNaN : s.ColumnDouble(i);
      });
}

}  // namespace ablate
