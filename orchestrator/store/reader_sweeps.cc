// StoreReader's reads of sweeps and runs: sweeps with their progress (the sweep_progress view),
// a sweep's variants and source, runs by filter, id or run key, a run's attempts and the
// checkpoint a resumed attempt starts from, and a sweep's tags and notes.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/reader_internal.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {

using reader_internal::NoParameters;
using reader_internal::ReadColumns;

namespace {

constexpr char kSweepColumns[] =
    "sweep_id, sweep, state, priority, created_at, runs, pending, running, succeeded, failed, "
    "diverged, cancelled, interrupted, steps_done, steps_total, "
    "(SELECT description FROM sweeps WHERE id = sweep_id), stopped, "
    "coalesce((SELECT method FROM tunes WHERE tunes.sweep_id = sweep_progress.sweep_id), '')";

SweepInfo ReadSweep(const Stmt& s) {
  SweepInfo info;
  ReadColumns(s, 0, &info.id, &info.name, &info.state, &info.priority, &info.created_at, &info.runs,
              &info.pending, &info.running, &info.succeeded, &info.failed, &info.diverged,
              &info.cancelled, &info.interrupted, &info.steps_done, &info.steps_total,
              &info.description, &info.stopped, &info.tune_method);
  return info;
}

constexpr char kRunColumns[] =
    "r.id, r.sweep_id, s.name, v.name, r.run_index, r.run_key, r.seed, r.axes, c.config_json, "
    "r.state, r.attempts, r.worker_id, r.priority, r.device, r.memory_gb, r.threads, "
    "r.params_total, r.params_activated, r.params_added, r.created_at, r.started_at, "
    "r.finished_at, r.steps_total, r.steps_done, r.final_train_loss, r.val_loss, r.val_ppl, "
    "r.gate_score, r.m_act, r.f_attn, r.spike_score, r.spike_steps, r.tokens_per_s, r.wall_s, "
    "r.reason, r.reused_from, r.attempt_base, r.devices, s.code_version, "
    "tr.run_id IS NOT NULL, coalesce(tr.grp, ''), tr.value, coalesce(tr.stop_at_step, 0), "
    "coalesce(tr.held, 0), r.peak_memory_bytes, r.flops, (SELECT sum(e.eval_s) FROM "
    "eval_metrics e WHERE e.run_id = coalesce(r.reused_from, r.id)), r.sink_rate "
    "FROM runs r JOIN sweeps s ON s.id = r.sweep_id JOIN variants v ON v.id = r.variant_id "
    "JOIN run_configs c ON c.run_id = r.id LEFT JOIN tune_runs tr ON tr.run_id = r.id";

double ZeroIfNull(const Stmt& s, int i) { return s.ColumnIsNull(i) ? 0.0 : s.ColumnDouble(i); }

RunInfo ReadRun(const Stmt& s) {
  RunInfo r;
  ReadColumns(s, 0, &r.id, &r.sweep_id, &r.sweep, &r.variant, &r.run_index, &r.run_key);
  r.seed = static_cast<uint64_t>(s.ColumnInt(6));
  ReadColumns(s, 7, &r.axes, &r.config_json);
  r.state = ParseRunState(s.ColumnText(9));
  ReadColumns(s, 10, &r.attempts, &r.worker_id, &r.priority, &r.device, &r.memory_gb, &r.threads,
              &r.params_total, &r.params_activated, &r.params_added);
  // Times not yet reached are NULL; RunInfo says 0 for them.
  r.created_at = ZeroIfNull(s, 19);
  r.started_at = ZeroIfNull(s, 20);
  r.finished_at = ZeroIfNull(s, 21);
  // Metrics stay NaN when unset (NULL); reused_from reads 0 when it is NULL.
  ReadColumns(s, 22, &r.steps_total, &r.steps_done, &r.final_train_loss, &r.val_loss, &r.val_ppl,
              &r.gate_score, &r.m_act, &r.f_attn, &r.spike_score, &r.spike_steps, &r.tokens_per_s,
              &r.wall_s, &r.reason, &r.reused_from, &r.attempt_base);
  r.devices = std::max(1, static_cast<int>(s.ColumnInt(37)));
  r.code_version = s.ColumnText(38);
  ReadColumns(s, 39, &r.tuned, &r.tune_group, &r.tune_value, &r.stop_at_step, &r.held);
  r.peak_memory_bytes = s.ColumnIsNull(44) ? 0 : s.ColumnInt(44);
  r.flops = s.ColumnIsNull(45) ? kNaN : s.ColumnDouble(45);
  r.eval_s = s.ColumnIsNull(46) ? kNaN : s.ColumnDouble(46);
  r.sink_rate = s.ColumnIsNull(47) ? kNaN : s.ColumnDouble(47);
  return r;
}

constexpr char kAttemptColumns[] =
    "run_id, attempt, worker_id, state, started_at, ended_at, checkpoint_path, checkpoint_step, "
    "report_seq, reason FROM attempts";

AttemptInfo ReadAttempt(const Stmt& s) {
  AttemptInfo a;
  ReadColumns(s, 0, &a.run_id, &a.attempt, &a.worker_id, &a.state);
  a.started_at = ZeroIfNull(s, 4);
  a.ended_at = ZeroIfNull(s, 5);
  ReadColumns(s, 6, &a.checkpoint_path, &a.checkpoint_step, &a.report_seq, &a.reason);
  return a;
}

VariantInfo ReadVariant(const Stmt& s) {
  VariantInfo v;
  ReadColumns(s, 0, &v.name, &v.description, &v.diff, &v.budget, &v.params_total,
              &v.params_activated, &v.params_added);
  v.flops_per_token = ZeroIfNull(s, 7);
  return v;
}

}  // namespace

absl::StatusOr<std::vector<SweepInfo>> StoreReader::ListSweeps() const {
  return ReadRows<SweepInfo>(
      absl::StrCat("SELECT ", kSweepColumns, " FROM sweep_progress ORDER BY sweep_id DESC"),
      NoParameters, ReadSweep);
}

absl::StatusOr<SweepInfo> StoreReader::GetSweep(const std::string& name_or_id) const {
  int64_t id = 0;
  if (!absl::SimpleAtoi(name_or_id, &id)) id = -1;
  // The name first (a name wins over an id that looks the same), then the view by its GROUP
  // BY column, which SQLite pushes into the aggregate: filtering the view by name would
  // aggregate every run of every sweep before it could filter.
  absl::StatusOr<int64_t> found = ReadFirstRow<int64_t>(
      "SELECT id FROM sweeps WHERE name = ?2 OR id = ?1 ORDER BY name = ?2 DESC LIMIT 1",
      [&](Stmt& q) { q.Bind(1, id).Bind(2, name_or_id); },
      [](const Stmt& s) { return s.ColumnInt(0); },
      absl::StrCat("store: no sweep named ", name_or_id));
  if (!found.ok()) return found.status();
  return GetSweepById(*found);
}

absl::StatusOr<SweepInfo> StoreReader::GetSweepById(int64_t sweep_id) const {
  return ReadFirstRow<SweepInfo>(
      absl::StrCat("SELECT ", kSweepColumns, " FROM sweep_progress WHERE sweep_id = ?1"),
      [&](Stmt& q) { q.Bind(1, sweep_id); }, ReadSweep, absl::StrCat("store: no sweep ", sweep_id));
}

absl::StatusOr<std::vector<RunInfo>> StoreReader::RunsOfSweep(int64_t sweep_id,
                                                              std::vector<RunState> states) const {
  RunFilter filter;
  filter.sweep_id = sweep_id;
  filter.states = std::move(states);
  return ListRuns(filter);
}

absl::StatusOr<SweepWithRuns> StoreReader::GetSweepWithRuns(const std::string& name_or_id) const {
  absl::StatusOr<SweepInfo> sweep = GetSweep(name_or_id);
  if (!sweep.ok()) return sweep.status();
  absl::StatusOr<std::vector<RunInfo>> runs = RunsOfSweep(sweep->id);
  if (!runs.ok()) return runs.status();
  return SweepWithRuns{*std::move(sweep), *std::move(runs)};
}

absl::StatusOr<std::vector<RunInfo>> StoreReader::ListRuns(const RunFilter& filter) const {
  std::vector<std::string> where;
  if (filter.sweep_id != 0) where.push_back("r.sweep_id = ?1");
  if (!filter.states.empty()) {
    std::vector<std::string> names;
    for (RunState s : filter.states) names.push_back(absl::StrCat("'", RunStateName(s), "'"));
    where.push_back(absl::StrCat("r.state IN (", absl::StrJoin(names, ", "), ")"));
  }
  std::string sql =
      absl::StrCat("SELECT ", kRunColumns, where.empty() ? "" : " WHERE ",
                   absl::StrJoin(where, " AND "), " ORDER BY r.sweep_id, r.run_index LIMIT ?2");
  return ReadRows<RunInfo>(
      sql,
      [&](Stmt& q) {
        if (filter.sweep_id != 0) q.Bind(1, filter.sweep_id);
        q.Bind(2, filter.limit > 0 ? filter.limit : int64_t{-1});
      },
      ReadRun);
}

absl::StatusOr<RunInfo> StoreReader::GetRun(int64_t run_id) const {
  return ReadFirstRow<RunInfo>(
      absl::StrCat("SELECT ", kRunColumns, " WHERE r.id = ?1"), [&](Stmt& q) { q.Bind(1, run_id); },
      ReadRun, absl::StrCat("store: no run ", run_id));
}

absl::StatusOr<std::vector<AttemptInfo>> StoreReader::Attempts(int64_t run_id) const {
  return ReadRows<AttemptInfo>(
      absl::StrCat("SELECT ", kAttemptColumns, " WHERE run_id = ?1 ORDER BY attempt"),
      [&](Stmt& q) { q.Bind(1, run_id); }, ReadAttempt);
}

absl::StatusOr<AttemptInfo> StoreReader::LatestCheckpoint(int64_t run_id) const {
  absl::StatusOr<std::vector<AttemptInfo>> attempts = Attempts(run_id);
  if (!attempts.ok()) return attempts.status();
  AttemptInfo best;
  best.run_id = run_id;
  for (const AttemptInfo& a : *attempts) {
    if (!a.checkpoint_path.empty() && a.checkpoint_step >= best.checkpoint_step) best = a;
  }
  return best;
}

absl::StatusOr<std::vector<VariantInfo>> StoreReader::ListVariants(int64_t sweep_id) const {
  return ReadRows<VariantInfo>(
      "SELECT name, description, diff, budget, params_total, params_activated, params_added, "
      "flops_per_token FROM variants WHERE sweep_id = ?1 ORDER BY position",
      [&](Stmt& q) { q.Bind(1, sweep_id); }, ReadVariant);
}

absl::StatusOr<SweepSource> StoreReader::GetSweepSource(int64_t sweep_id) const {
  return ReadFirstRow<SweepSource>(
      "SELECT spec_file, spec_yaml, reference, code_version, created_at, finished_at FROM sweeps "
      "WHERE id = ?1",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [&](const Stmt& r) {
        SweepSource s;
        s.sweep_id = sweep_id;
        ReadColumns(r, 0, &s.spec_file, &s.spec_yaml, &s.reference, &s.code_version);
        s.created_at = ZeroIfNull(r, 4);
        s.finished_at = ZeroIfNull(r, 5);
        return s;
      },
      absl::StrCat("store: no sweep ", sweep_id));
}

absl::StatusOr<ProgramSnapshot> StoreReader::GetProgramCode(const std::string& code_hash) const {
  absl::StatusOr<std::string> bytes = ReadFirstRow<std::string>(
      "SELECT snapshot FROM program_code WHERE code_hash = ?1",
      [&](Stmt& q) { q.Bind(1, code_hash); }, [](const Stmt& r) { return r.ColumnBlob(0); },
      absl::StrCat("store: no program code ", code_hash));
  if (!bytes.ok()) return bytes.status();
  ProgramSnapshot snapshot;
  if (!snapshot.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat("store: program code ", code_hash, " does not parse"));
  }
  return snapshot;
}

absl::StatusOr<std::vector<Annotation>> StoreReader::Annotations(int64_t sweep_id) const {
  return ReadRows<Annotation>(
      "SELECT id, sweep_id, coalesce(run_id, 0), kind, text, created_at FROM annotations "
      "WHERE sweep_id = ?1 ORDER BY id",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [](const Stmt& s) {
        Annotation a;
        ReadColumns(s, 0, &a.id, &a.sweep_id, &a.run_id, &a.kind, &a.text, &a.created_at);
        return a;
      });
}

absl::StatusOr<std::set<int64_t>> StoreReader::RunsTagged(
    int64_t sweep_id, const std::vector<std::string>& tags) const {
  std::set<int64_t> runs;
  if (tags.empty()) return runs;
  // The tags as one bound JSON array: one cached statement whatever their number.
  const std::string wanted = nlohmann::json(tags).dump();
  absl::Status read = ForEachRow(
      "SELECT r.id FROM runs r WHERE r.sweep_id = ?1 AND EXISTS (SELECT 1 FROM annotations a "
      "WHERE a.sweep_id = ?1 AND a.kind = 'tag' AND (a.run_id IS NULL OR a.run_id = r.id) "
      "AND a.text IN (SELECT value FROM json_each(?2)))",
      [&](Stmt& q) { q.Bind(1, sweep_id).Bind(2, wanted); },
      [&](const Stmt& s) { runs.insert(s.ColumnInt(0)); });
  if (!read.ok()) return read;
  return runs;
}

absl::StatusOr<ComparisonTable> StoreReader::GetComparisonTable(const std::string& sweep) const {
  return GetComparisonTable(ResultSelection{{sweep}, {}});
}

}  // namespace ablate
