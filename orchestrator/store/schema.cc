#include "orchestrator/store/schema.h"

#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {
namespace {

// The views, each defined once in its current form (docs/schema.md). No migration creates or
// changes one: MigrateStore drops them all in each migration's transaction, before its SQL, and
// creates them again in the last one's, so a database at this build's version has exactly these,
// whatever version it was migrated from. What a version changed in a view (its comment below
// says) is in these definitions. Dropped in reverse order: a view may read an earlier one.
struct View {
  const char* name;
  const char* select;  // what CREATE VIEW <name> AS runs
};
constexpr View kViews[] = {
    {"run_summary", R"sql(
SELECT r.id AS run_id, s.name AS sweep, v.name AS variant, r.run_index, r.seed, r.axes,
       r.state, r.attempts, w.name AS worker, r.steps_done, r.steps_total,
       r.final_train_loss, r.val_loss, r.val_ppl, r.gate_score, r.m_act, r.f_attn,
       r.spike_steps, r.spike_score, r.params_total, r.params_activated, r.params_added,
       r.tokens_per_s, r.wall_s, r.reason, r.run_key, r.created_at, r.started_at,
       r.finished_at, r.sweep_id, r.variant_id, r.reused_from,
       coalesce((SELECT group_concat(t.text, ',') FROM
                   (SELECT DISTINCT a.text FROM annotations a
                    WHERE a.sweep_id = r.sweep_id AND a.kind = 'tag'
                      AND (a.run_id IS NULL OR a.run_id = r.id)
                    ORDER BY a.text) t), '') AS tags,
       r.peak_memory_bytes, r.wall_s AS train_seconds, r.flops,
       (SELECT sum(e.eval_s) FROM eval_metrics e
        WHERE e.run_id = coalesce(r.reused_from, r.id)) AS eval_seconds,
       r.sink_rate
FROM runs r
JOIN sweeps s ON s.id = r.sweep_id
JOIN variants v ON v.id = r.variant_id
LEFT JOIN workers w ON w.id = r.worker_id
)sql"},
    {"sweep_progress", R"sql(
SELECT s.id AS sweep_id, s.name AS sweep, s.state, s.priority, s.created_at,
       count(r.id) AS runs,
       coalesce(sum(r.state = 'PENDING'), 0) AS pending,
       coalesce(sum(r.state = 'RUNNING'), 0) AS running,
       coalesce(sum(r.state = 'SUCCEEDED'), 0) AS succeeded,
       coalesce(sum(r.state = 'FAILED'), 0) AS failed,
       coalesce(sum(r.state = 'DIVERGED'), 0) AS diverged,
       coalesce(sum(r.state = 'CANCELLED'), 0) AS cancelled,
       coalesce(sum(r.state = 'INTERRUPTED'), 0) AS interrupted,
       CAST(min(max(total(r.steps_done), 0), 9.2e18) AS INTEGER) AS steps_done,
       CAST(min(max(total(r.steps_total), 0), 9.2e18) AS INTEGER) AS steps_total,
       coalesce(sum(r.state = 'STOPPED'), 0) AS stopped
FROM sweeps s LEFT JOIN runs r ON r.sweep_id = s.id
GROUP BY s.id
)sql"},
    {"variant_table", R"sql(
WITH grp AS (
  SELECT sweep_id, variant_id, axes, min(run_index) AS first_index, count(*) AS runs,
         sum(state = 'SUCCEEDED') AS n, sum(state = 'DIVERGED') AS diverged,
         sum(state = 'FAILED') AS failed,
         sum(state IN ('PENDING', 'RUNNING', 'INTERRUPTED')) AS unfinished,
         avg(params_total) AS params_total, avg(params_activated) AS params_activated,
         avg(params_added) AS params_added
  FROM runs GROUP BY sweep_id, variant_id, axes),
mean AS (
  SELECT sweep_id, variant_id, axes,
         avg(val_loss) AS val_loss, avg(val_ppl) AS val_ppl, avg(gate_score) AS gate_score,
         avg(m_act) AS m_act, avg(f_attn) AS f_attn, avg(spike_score) AS spike_score,
         avg(final_train_loss) AS train_loss, avg(sink_rate) AS sink_rate
  FROM runs WHERE state = 'SUCCEEDED' GROUP BY sweep_id, variant_id, axes),
dev AS (
  SELECT r.sweep_id, r.variant_id, r.axes,
         CASE WHEN count(r.val_loss) > 1 THEN sqrt(sum((r.val_loss - m.val_loss) * (r.val_loss - m.val_loss)) / (count(r.val_loss) - 1)) END AS val_loss,
         CASE WHEN count(r.val_ppl) > 1 THEN sqrt(sum((r.val_ppl - m.val_ppl) * (r.val_ppl - m.val_ppl)) / (count(r.val_ppl) - 1)) END AS val_ppl,
         CASE WHEN count(r.gate_score) > 1 THEN sqrt(sum((r.gate_score - m.gate_score) * (r.gate_score - m.gate_score)) / (count(r.gate_score) - 1)) END AS gate_score,
         CASE WHEN count(r.m_act) > 1 THEN sqrt(sum((r.m_act - m.m_act) * (r.m_act - m.m_act)) / (count(r.m_act) - 1)) END AS m_act,
         CASE WHEN count(r.f_attn) > 1 THEN sqrt(sum((r.f_attn - m.f_attn) * (r.f_attn - m.f_attn)) / (count(r.f_attn) - 1)) END AS f_attn,
         CASE WHEN count(r.spike_score) > 1 THEN sqrt(sum((r.spike_score - m.spike_score) * (r.spike_score - m.spike_score)) / (count(r.spike_score) - 1)) END AS spike_score,
         CASE WHEN count(r.final_train_loss) > 1 THEN sqrt(sum((r.final_train_loss - m.train_loss) * (r.final_train_loss - m.train_loss)) / (count(r.final_train_loss) - 1)) END AS train_loss,
         CASE WHEN count(r.sink_rate) > 1 THEN sqrt(sum((r.sink_rate - m.sink_rate) * (r.sink_rate - m.sink_rate)) / (count(r.sink_rate) - 1)) END AS sink_rate
  FROM runs r JOIN mean m USING (sweep_id, variant_id, axes)
  WHERE r.state = 'SUCCEEDED' GROUP BY r.sweep_id, r.variant_id, r.axes)
SELECT s.name AS sweep, v.name AS variant, g.axes, v.position, g.first_index, v.description,
       g.runs, g.n, g.diverged, g.failed, g.unfinished,
       m.val_loss AS val_loss_mean, d.val_loss AS val_loss_std,
       m.val_ppl AS val_ppl_mean, d.val_ppl AS val_ppl_std,
       m.gate_score AS gate_score_mean, d.gate_score AS gate_score_std,
       m.m_act AS m_act_mean, d.m_act AS m_act_std,
       m.f_attn AS f_attn_mean, d.f_attn AS f_attn_std,
       m.spike_score AS spike_score_mean, d.spike_score AS spike_score_std,
       m.train_loss AS train_loss_mean, d.train_loss AS train_loss_std,
       g.params_total, g.params_activated, g.params_added,
       g.sweep_id, g.variant_id,
       m.sink_rate AS sink_rate_mean, d.sink_rate AS sink_rate_std
FROM grp g
JOIN sweeps s ON s.id = g.sweep_id
JOIN variants v ON v.id = g.variant_id
LEFT JOIN mean m ON m.sweep_id = g.sweep_id AND m.variant_id = g.variant_id AND m.axes = g.axes
LEFT JOIN dev d ON d.sweep_id = g.sweep_id AND d.variant_id = g.variant_id AND d.axes = g.axes
)sql"},
    {"latest_metrics", R"sql(
SELECT r.id AS run_id, s.name AS sweep, v.name AS variant, r.seed, r.axes, r.state,
       r.steps_done, r.steps_total,
       m.step, m.loss, m.grad_norm, m.lr, m.tokens_per_s, m.aux_loss, m.skipped,
       e.step AS eval_step, e.val_loss, e.val_ppl, e.gate_score, e.m_act, e.f_attn,
       r.reused_from, e.sink_rate
FROM runs r
JOIN sweeps s ON s.id = r.sweep_id
JOIN variants v ON v.id = r.variant_id
LEFT JOIN step_metrics m
  ON m.run_id = coalesce(r.reused_from, r.id)
  AND m.step = (SELECT max(step) FROM step_metrics WHERE run_id = coalesce(r.reused_from, r.id))
LEFT JOIN eval_metrics e
  ON e.run_id = coalesce(r.reused_from, r.id)
  AND e.step = (SELECT max(step) FROM eval_metrics WHERE run_id = coalesce(r.reused_from, r.id))
)sql"},
    {"spikes", R"sql(
SELECT e.id, s.name AS sweep, v.name AS variant, r.seed, r.axes, e.run_id, e.attempt, e.step,
       e.signal, e.value, e.baseline, e.kind, e.action, e.rollback_to_step
FROM spike_events e
JOIN runs r ON r.id = e.run_id
JOIN sweeps s ON s.id = r.sweep_id
JOIN variants v ON v.id = r.variant_id
)sql"},
    {"length_results", R"sql(
SELECT r.id AS run_id, r.sweep_id, r.variant_id, r.axes, r.seed, r.state, l.step, l.seq_len,
       l.yarn, l.val_loss, l.val_ppl
FROM runs r
JOIN eval_lengths l
  ON l.run_id = coalesce(r.reused_from, r.id)
  AND l.step = (SELECT max(step) FROM eval_lengths WHERE run_id = coalesce(r.reused_from, r.id))
)sql"},
    {"length_table", R"sql(
WITH mean AS (
  SELECT sweep_id, variant_id, axes, seq_len, max(yarn) AS yarn, count(val_ppl) AS n,
         avg(val_loss) AS val_loss, avg(val_ppl) AS val_ppl
  FROM length_results WHERE state = 'SUCCEEDED' GROUP BY sweep_id, variant_id, axes, seq_len),
dev AS (
  SELECT l.sweep_id, l.variant_id, l.axes, l.seq_len,
         CASE WHEN count(l.val_loss) > 1 THEN sqrt(sum((l.val_loss - m.val_loss) * (l.val_loss - m.val_loss)) / (count(l.val_loss) - 1)) END AS val_loss,
         CASE WHEN count(l.val_ppl) > 1 THEN sqrt(sum((l.val_ppl - m.val_ppl) * (l.val_ppl - m.val_ppl)) / (count(l.val_ppl) - 1)) END AS val_ppl
  FROM length_results l JOIN mean m USING (sweep_id, variant_id, axes, seq_len)
  WHERE l.state = 'SUCCEEDED' GROUP BY l.sweep_id, l.variant_id, l.axes, l.seq_len)
SELECT s.name AS sweep, v.name AS variant, m.axes, m.seq_len, m.yarn, m.n,
       m.val_loss AS val_loss_mean, d.val_loss AS val_loss_std,
       m.val_ppl AS val_ppl_mean, d.val_ppl AS val_ppl_std, m.sweep_id, m.variant_id
FROM mean m
JOIN sweeps s ON s.id = m.sweep_id
JOIN variants v ON v.id = m.variant_id
LEFT JOIN dev d ON d.sweep_id = m.sweep_id AND d.variant_id = m.variant_id AND d.axes = m.axes
  AND d.seq_len = m.seq_len
)sql"},
    {"eval_results", R"sql(
SELECT r.id AS run_id, s.name AS sweep, v.name AS variant, r.seed, r.axes, r.state, e.name,
       e.value, e.step, r.sweep_id, r.variant_id
FROM runs r
JOIN sweeps s ON s.id = r.sweep_id
JOIN variants v ON v.id = r.variant_id
JOIN eval_values e
  ON e.run_id = coalesce(r.reused_from, r.id)
  AND e.step = (SELECT max(step) FROM eval_values
                WHERE run_id = coalesce(r.reused_from, r.id) AND name = e.name)
)sql"},
    {"eval_item_results", R"sql(
SELECT r.id AS run_id, s.name AS sweep, v.name AS variant, r.seed, r.axes, r.state, i.name,
       i.item, i.value, i.step, r.sweep_id, r.variant_id
FROM runs r
JOIN sweeps s ON s.id = r.sweep_id
JOIN variants v ON v.id = r.variant_id
JOIN eval_items i ON i.run_id = coalesce(r.reused_from, r.id)
)sql"},
};

// Version 1. Times are Unix seconds (REAL): datetime(t, 'unixepoch') reads them. States are the
// enum names of proto/ablate.proto. Non-finite metric values are stored as NULL.
constexpr char kSchemaV1[] = R"sql(
CREATE TABLE sweeps (
  id            INTEGER PRIMARY KEY,
  name          TEXT NOT NULL UNIQUE,
  description   TEXT NOT NULL DEFAULT '',
  spec_file     TEXT NOT NULL DEFAULT '',
  spec_yaml     TEXT NOT NULL DEFAULT '',
  spec_json     TEXT NOT NULL DEFAULT '',
  reference     TEXT NOT NULL DEFAULT '',
  code_version  TEXT NOT NULL DEFAULT '',
  priority      INTEGER NOT NULL DEFAULT 1,
  state         TEXT NOT NULL DEFAULT 'ACTIVE' CHECK (state IN ('ACTIVE', 'DONE', 'CANCELLED')),
  created_at    REAL NOT NULL,
  finished_at   REAL
);

CREATE TABLE variants (
  id                INTEGER PRIMARY KEY,
  sweep_id          INTEGER NOT NULL REFERENCES sweeps(id),
  name              TEXT NOT NULL,
  position          INTEGER NOT NULL,
  description       TEXT NOT NULL DEFAULT '',
  model_json        TEXT NOT NULL DEFAULT '',
  diff              TEXT NOT NULL DEFAULT '',
  params_total      INTEGER,
  params_activated  INTEGER,
  params_added      INTEGER,
  budget            TEXT NOT NULL DEFAULT '',
  flops_per_token   REAL,
  UNIQUE (sweep_id, name)
);

CREATE TABLE workers (
  id              INTEGER PRIMARY KEY,
  name            TEXT NOT NULL,
  resources_json  TEXT NOT NULL DEFAULT '{}',
  registered_at   REAL NOT NULL,
  last_seen       REAL NOT NULL,
  state           TEXT NOT NULL DEFAULT 'IDLE' CHECK (state IN ('IDLE', 'BUSY', 'GONE'))
);

CREATE TABLE runs (
  id                INTEGER PRIMARY KEY,
  sweep_id          INTEGER NOT NULL REFERENCES sweeps(id),
  variant_id        INTEGER NOT NULL REFERENCES variants(id),
  run_index         INTEGER NOT NULL,
  run_key           TEXT NOT NULL,
  seed              INTEGER NOT NULL,
  axes              TEXT NOT NULL DEFAULT '',
  config_json       TEXT NOT NULL,
  params_total      INTEGER,
  params_activated  INTEGER,
  params_added      INTEGER,
  flops_per_token   REAL,
  priority          INTEGER NOT NULL DEFAULT 1,
  device            TEXT NOT NULL DEFAULT 'cpu',
  memory_gb         REAL NOT NULL DEFAULT 0,
  threads           INTEGER NOT NULL DEFAULT 0,
  state             TEXT NOT NULL DEFAULT 'PENDING' CHECK (state IN
                      ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'DIVERGED', 'CANCELLED',
                       'INTERRUPTED')),
  attempts          INTEGER NOT NULL DEFAULT 0,
  worker_id         INTEGER REFERENCES workers(id),
  created_at        REAL NOT NULL,
  started_at        REAL,
  finished_at       REAL,
  steps_total       INTEGER NOT NULL DEFAULT 0,
  steps_done        INTEGER NOT NULL DEFAULT 0,
  final_train_loss  REAL,
  val_loss          REAL,
  val_ppl           REAL,
  gate_score        REAL,
  m_act             REAL,
  f_attn            REAL,
  spike_steps       INTEGER,
  spike_score       REAL,
  tokens_per_s      REAL,
  wall_s            REAL,
  reason            TEXT NOT NULL DEFAULT '',
  UNIQUE (sweep_id, run_index)
);
CREATE INDEX runs_by_sweep_state ON runs (sweep_id, state);
CREATE INDEX runs_by_state_priority ON runs (state, priority DESC, id);
CREATE INDEX runs_by_key ON runs (run_key);
CREATE INDEX runs_by_variant ON runs (variant_id);

CREATE TABLE attempts (
  run_id           INTEGER NOT NULL REFERENCES runs(id),
  attempt          INTEGER NOT NULL,
  worker_id        INTEGER REFERENCES workers(id),
  state            TEXT NOT NULL CHECK (state IN
                     ('RUNNING', 'SUCCEEDED', 'FAILED', 'DIVERGED', 'CANCELLED', 'INTERRUPTED',
                      'LOST')),
  started_at       REAL NOT NULL,
  ended_at         REAL,
  checkpoint_path  TEXT NOT NULL DEFAULT '',
  checkpoint_step  INTEGER NOT NULL DEFAULT 0,
  report_seq       INTEGER NOT NULL DEFAULT 0,
  reason           TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;
CREATE INDEX attempts_by_worker ON attempts (worker_id, state);

CREATE TABLE step_metrics (
  run_id        INTEGER NOT NULL,
  step          INTEGER NOT NULL,
  attempt       INTEGER NOT NULL,
  loss          REAL,
  grad_norm     REAL,
  lr            REAL,
  tokens_per_s  REAL,
  aux_loss      REAL,
  skipped       INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE eval_metrics (
  run_id      INTEGER NOT NULL,
  step        INTEGER NOT NULL,
  attempt     INTEGER NOT NULL,
  val_loss    REAL,
  val_ppl     REAL,
  gate_score  REAL,
  m_act       REAL,
  f_attn      REAL,
  tokens      INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE eval_layer_probes (
  run_id                    INTEGER NOT NULL,
  step                      INTEGER NOT NULL,
  layer                     INTEGER NOT NULL,
  has_gate                  INTEGER NOT NULL DEFAULT 0,
  gate_mean                 REAL,
  gate_std                  REAL,
  gate_min                  REAL,
  gate_max                  REAL,
  gate_histogram            TEXT NOT NULL DEFAULT '',
  attn_out_max_abs          REAL,
  attn_residual_max_abs     REAL,
  ffn_out_max_abs           REAL,
  ffn_residual_max_abs      REAL,
  first_token_attention     REAL,
  sparsity_before_gate_1e2  REAL,
  sparsity_before_gate_1e3  REAL,
  sparsity_after_gate_1e2   REAL,
  sparsity_after_gate_1e3   REAL,
  sparsity_mean_scaled_1e2  REAL,
  sparsity_mean_scaled_1e3  REAL,
  PRIMARY KEY (run_id, step, layer)
) WITHOUT ROWID;

CREATE TABLE spike_events (
  id                INTEGER PRIMARY KEY,
  run_id            INTEGER NOT NULL,
  attempt           INTEGER NOT NULL,
  step              INTEGER NOT NULL,
  signal            TEXT NOT NULL,
  value             REAL,
  baseline          REAL,
  kind              TEXT NOT NULL,
  action            TEXT NOT NULL,
  rollback_to_step  INTEGER NOT NULL DEFAULT 0,
  UNIQUE (run_id, step, signal, kind)
);

CREATE TABLE events (
  id        INTEGER PRIMARY KEY,
  time      REAL NOT NULL,
  sweep_id  INTEGER,
  run_id    INTEGER,
  kind      TEXT NOT NULL,
  message   TEXT NOT NULL
);
CREATE INDEX events_by_sweep ON events (sweep_id, id);
CREATE INDEX events_by_run ON events (run_id, id);
)sql";

// Version 2, for the writer's cost per dispatched job (docs/benchmarks.md):
// - each run's config moves out of its runs row into run_configs. The config (about 1.5 KB of
//   JSON) made a runs row wide, and SQLite rewrites the whole row on every UPDATE: each run's
//   start and end copied it and dirtied a page per run, where narrow rows share pages;
// - runs_by_state_priority goes: the scheduler's queue is in memory, read once at start, and
//   every start and end moved the run in that index;
// - attempts_by_worker drops `state`, which every attempt's end moved.
constexpr char kSchemaV2[] = R"sql(
CREATE TABLE run_configs (
  run_id       INTEGER PRIMARY KEY REFERENCES runs(id),
  config_json  TEXT NOT NULL
);
INSERT INTO run_configs (run_id, config_json) SELECT id, config_json FROM runs ORDER BY id;
ALTER TABLE runs DROP COLUMN config_json;
DROP INDEX runs_by_state_priority;
DROP INDEX attempts_by_worker;
CREATE INDEX attempts_by_worker ON attempts (worker_id);
)sql";

// Version 3: a run that reused an identical run's results says which in a column, not only in its
// reason text; readers take its curves, evaluations and spikes from that run. run_summary and
// latest_metrics show it.
constexpr char kSchemaV3[] = R"sql(
ALTER TABLE runs ADD COLUMN reused_from INTEGER REFERENCES runs(id);
UPDATE runs SET reused_from = CAST(substr(reason, 12) AS INTEGER)
WHERE reason LIKE 'reused run %' AND CAST(substr(reason, 12) AS INTEGER) > 0;
)sql";

// Version 4, hardening:
// - sweep_progress sums steps with total() (a float, which cannot overflow) capped to the int64
//   range: a run whose stored step count is absurd (written before the coordinator checked
//   reports at the door) made sum() fail with "integer overflow", and with it every read of
//   sweeps, the coordinator's own start-up included;
// - runs.attempt_base: the attempts a run had when a user last queued it again (rerun), so that
//   its retries count from there across a coordinator restart;
// - eval_layer_probes.sdpa_mean_abs_before_gate / _after_gate: mean |SDPA output| before the
//   gate and as W_O receives it (the paper's Figure 4).
constexpr char kSchemaV4[] = R"sql(
ALTER TABLE runs ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE eval_layer_probes ADD COLUMN sdpa_mean_abs_before_gate REAL;
ALTER TABLE eval_layer_probes ADD COLUMN sdpa_mean_abs_after_gate REAL;
)sql";

// Version 5, the paper's long-context table and Figure 2:
// - eval_lengths: validation loss at each TrainConfig.eval_seq_lens length of an evaluation, and
//   whether it was measured with YaRN scaling;
// - eval_attention_maps: a few heads' attention probabilities over the first positions of one
//   fixed validation window, size * size bytes (round(255 * p), row = query);
// - length_table: mean ± std over SUCCEEDED seeds of each variant's final PPL at each length,
//   the comparison table's long-context columns.
constexpr char kSchemaV5[] = R"sql(
CREATE TABLE eval_lengths (
  run_id    INTEGER NOT NULL,
  step      INTEGER NOT NULL,
  seq_len   INTEGER NOT NULL,
  yarn      INTEGER NOT NULL DEFAULT 0,
  val_loss  REAL,
  val_ppl   REAL,
  PRIMARY KEY (run_id, step, seq_len)
) WITHOUT ROWID;

CREATE TABLE eval_attention_maps (
  run_id  INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  layer   INTEGER NOT NULL,
  head    INTEGER NOT NULL,
  size    INTEGER NOT NULL,
  probs   BLOB NOT NULL,
  PRIMARY KEY (run_id, step, layer, head)
) WITHOUT ROWID;
)sql";

// Version 6: runs.devices, the ranks a run trains on (Resources.devices), which the scheduler
// matches against a worker's slots.
constexpr char kSchemaV6[] = R"sql(
ALTER TABLE runs ADD COLUMN devices INTEGER NOT NULL DEFAULT 1;
)sql";

// Version 7: the state CHECKs of sweeps, workers, runs and attempts as chains of equalities,
// the same constraints. SQLite evaluates a CHECK `state IN ('A', 'B', 'C')` (three names or more)
// by building a temporary b-tree of the names on every row it writes (OpenEphemeral, a 4 KB page
// allocated and zeroed). Every start and end of a run wrote two such rows, so this was a large
// part of the store writer's work per dispatched job (docs/benchmarks.md).
//
// A CHECK cannot be altered, and rebuilding the tables would copy every run. The constraints are
// equivalent and the stored rows do not change, so each table's CREATE text is rewritten in
// place (RewriteTables).
constexpr const char* kStateTables[] = {"sweeps", "workers", "runs", "attempts"};

// `create` with its one "CHECK (state IN ('A', 'B'))" as "CHECK (state = 'A' OR state = 'B')".
absl::StatusOr<std::string> StateCheckAsEqualities(const std::string& table,
                                                   const std::string& create) {
  const std::string kCheck = "CHECK (state IN";
  const size_t at = create.find(kCheck);
  if (at == std::string::npos || create.find(kCheck, at + 1) != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store: migration 7: table ", table, " has no single \"", kCheck, "\" constraint"));
  }
  const size_t open = create.find('(', at + kCheck.size());
  const size_t close = create.find(')', open);
  const size_t end = close == std::string::npos ? close : create.find(')', close + 1);
  if (open == std::string::npos || end == std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: migration 7: cannot read the state CHECK of table ", table));
  }
  std::vector<std::string> equalities;
  for (size_t q = create.find('\'', open); q < close; q = create.find('\'', q)) {
    const size_t q_end = create.find('\'', q + 1);
    if (q_end > close) break;
    equalities.push_back(absl::StrCat("state = ", create.substr(q, q_end - q + 1)));
    q = q_end + 1;
  }
  if (equalities.size() < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: migration 7: the state CHECK of table ", table, " names no states"));
  }
  return absl::StrCat(create.substr(0, at), "CHECK (", absl::StrJoin(equalities, " OR "), ")",
                      create.substr(end + 1));
}

// The writable_schema steps of RewriteTables: each table's new CREATE text, the schema version
// past `version`, and this connection's schema reloaded.
absl::Status WriteTableTexts(sqlite3* db,
                             const std::vector<std::pair<std::string, std::string>>& rewritten,
                             int64_t version) {
  if (absl::Status s = Exec(db, "PRAGMA writable_schema = ON"); !s.ok()) return s;
  for (const auto& [table, sql] : rewritten) {
    absl::StatusOr<Stmt> write =
        Stmt::Prepare(db, "UPDATE sqlite_schema SET sql = ?2 WHERE type = 'table' AND name = ?1");
    absl::Status s = write.status();
    if (s.ok()) s = write->Bind(1, table).Bind(2, sql).Run();
    if (!s.ok()) {
      Exec(db, "PRAGMA writable_schema = RESET").IgnoreError();
      return s;
    }
  }
  absl::Status s = Exec(db, absl::StrCat("PRAGMA schema_version = ", version + 1));
  if (absl::Status reset = Exec(db, "PRAGMA writable_schema = RESET"); s.ok()) s = reset;
  return s;
}

// The CREATE text of `table`; FailedPrecondition naming `migration` when there is no such table.
absl::StatusOr<std::string> TableText(sqlite3* db, const char* table, const char* migration) {
  absl::StatusOr<Stmt> read =
      Stmt::Prepare(db, "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1");
  if (!read.ok()) return read.status();
  read->Bind(1, table);
  absl::StatusOr<bool> row = read->Step();
  if (!row.ok()) return row.status();
  if (!*row) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: ", migration, ": the database has no table ", table));
  }
  return read->ColumnText(0);
}

// Replaces tables' CREATE texts (table, text) with SQLite's procedure for changing constraints in
// place (https://www.sqlite.org/lang_altertable.html#otheralter): the texts are rewritten in
// sqlite_schema, the schema version bumped so that every connection reloads it, and this
// connection's schema reloaded (writable_schema = RESET). The migration's transaction rolls all
// of it back if any step fails, a text SQLite cannot parse included.
absl::Status RewriteTables(sqlite3* db,
                           const std::vector<std::pair<std::string, std::string>>& rewritten) {
  absl::StatusOr<int64_t> version = QueryInt(db, "PRAGMA schema_version");
  if (!version.ok()) return version.status();
  // A library built defensive by default would refuse the rewrite: off for this connection,
  // for the migration only.
  int defensive = 0;
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, -1, &defensive);
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 0, nullptr);
  const absl::Status s = WriteTableTexts(db, rewritten, *version);
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, defensive, nullptr);
  if (!s.ok()) return s;
  // The reloaded schema parses and the tables read.
  for (const auto& [table, sql] : rewritten) {
    absl::StatusOr<Stmt> probe =
        Stmt::Prepare(db, absl::StrCat("SELECT * FROM ", table, " LIMIT 0"));
    if (!probe.ok()) return probe.status();
  }
  return absl::OkStatus();
}

absl::Status RewriteStateChecks(sqlite3* db) {
  std::vector<std::pair<std::string, std::string>> rewritten;  // table, CREATE text
  for (const char* table : kStateTables) {
    absl::StatusOr<std::string> create = TableText(db, table, "migration 7");
    if (!create.ok()) return create.status();
    absl::StatusOr<std::string> sql = StateCheckAsEqualities(table, *create);
    if (!sql.ok()) return sql.status();
    rewritten.emplace_back(table, *std::move(sql));
  }
  return RewriteTables(db, rewritten);
}

// Version 8, for the store writer's work per dispatched job (docs/benchmarks.md):
// - runs_by_sweep_state holds the unfinished runs only (PENDING, RUNNING, INTERRUPTED: what the
//   sweep-done probe and a sweep's cancel look for). A run's end moved its entry within the
//   index; now it only removes it. Finished runs of a sweep are read through the UNIQUE
//   (sweep_id, run_index) index, as every other read by sweep already was. The state test is a
//   chain of equalities, as the CHECKs of version 7 are (an IN list builds a temporary table per
//   row written);
// - runs.worker_id loses its REFERENCES workers(id) (DropRunsWorkerReference).
constexpr char kSchemaV8[] = R"sql(
DROP INDEX runs_by_sweep_state;
CREATE INDEX runs_by_sweep_state ON runs (sweep_id, state)
  WHERE state = 'PENDING' OR state = 'RUNNING' OR state = 'INTERRUPTED';
)sql";

// Version 8: runs.worker_id without its REFERENCES workers(id). A run's start sets it in the
// UPDATE that marks the run RUNNING, and SQLite checks a foreign key that an UPDATE changes by
// giving the statement a statement journal: every page the UPDATE touched was copied (in memory)
// first, and the parent row looked up, on the path of every dispatched job. Nothing is lost: the
// same start inserts the attempt with the same worker_id first, and attempts.worker_id keeps its
// foreign key, so a run still names only a worker that exists (workers are never deleted).
// Rewritten in place as version 7 was: rebuilding runs would copy every run.
constexpr char kRunsWorkerReference[] = " REFERENCES workers(id)";

// Whether `text` ends with `word` once trailing spaces are dropped; `text` loses both.
bool ConsumeTrailingWord(absl::string_view& text, absl::string_view word) {
  text = absl::StripTrailingAsciiWhitespace(text);
  return absl::ConsumeSuffix(&text, word);
}

absl::Status DropRunsWorkerReference(sqlite3* db) {
  absl::StatusOr<std::string> create = TableText(db, "runs", "migration 8");
  if (!create.ok()) return create.status();
  const size_t at = create->find(kRunsWorkerReference);
  absl::string_view before = absl::string_view(*create).substr(0, at);
  if (at == std::string::npos || create->find(kRunsWorkerReference, at + 1) != std::string::npos ||
      !ConsumeTrailingWord(before, "INTEGER") || !ConsumeTrailingWord(before, "worker_id")) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: migration 8: table runs has no single \"worker_id INTEGER",
                     kRunsWorkerReference, "\" column"));
  }
  std::string sql = *create;
  sql.erase(at, sizeof(kRunsWorkerReference) - 1);
  return RewriteTables(db, {{"runs", sql}});
}

// Version 9: tags and notes (`ablate tag`, `untag`, `note`) on a sweep (run_id NULL) or on one
// run of it. A tag is stored once per target; the unique index reads a NULL run_id as 0, since
// SQLite's UNIQUE treats every NULL as distinct. run_summary gains `tags`: the run's own tags and
// its sweep's, sorted and comma-separated (what `ablate export` shows, and --exclude-tag reads).
constexpr char kSchemaV9[] = R"sql(
CREATE TABLE annotations (
  id          INTEGER PRIMARY KEY,
  sweep_id    INTEGER NOT NULL REFERENCES sweeps(id),
  run_id      INTEGER REFERENCES runs(id),
  kind        TEXT NOT NULL CHECK (kind = 'tag' OR kind = 'note'),
  text        TEXT NOT NULL,
  created_at  REAL NOT NULL
);
CREATE UNIQUE INDEX annotations_tag_once ON annotations (sweep_id, coalesce(run_id, 0), text)
  WHERE kind = 'tag';
CREATE INDEX annotations_by_sweep ON annotations (sweep_id, id);
)sql";

// Version 10, tuning (docs/spec.md, "Tuning"):
// - runs.state may be STOPPED: ended by the tuner at a rung (AddStoppedToRunsCheck, in place as
//   in version 7);
// - tunes: a tuned sweep's `tune:` block (the TunePlan as JSON, the axis, method, metric, mode);
// - tune_runs: each tuned run's group, value, the step it pauses at next (0 = its end) and
//   whether it waits for a decision (held: PENDING but not queued);
// - tune_decisions: every decision (promote, stop, choose, probe) once per (sweep, group, value,
//   rung, kind): the tuner inserts with INSERT OR IGNORE, so one decided before, by this
//   coordinator or one before a restart, is never applied twice;
// - tune_brackets: a boundary sweep's bracket per group, OPEN while it bisects (the sweep is not
//   DONE meanwhile), then DONE with [stable, unstable];
// - sweep_progress gains `stopped`.
constexpr char kSchemaV10[] = R"sql(
CREATE TABLE tunes (
  sweep_id    INTEGER PRIMARY KEY REFERENCES sweeps(id),
  axis        TEXT NOT NULL,
  method      TEXT NOT NULL CHECK (method = 'grid' OR method = 'asha' OR method = 'boundary'),
  metric      TEXT NOT NULL DEFAULT 'val_loss',
  mode        TEXT NOT NULL DEFAULT 'min' CHECK (mode = 'min' OR mode = 'max'),
  plan_json   TEXT NOT NULL
);
CREATE TABLE tune_runs (
  run_id        INTEGER PRIMARY KEY REFERENCES runs(id),
  sweep_id      INTEGER NOT NULL REFERENCES sweeps(id),
  grp           TEXT NOT NULL,
  value         REAL NOT NULL,
  stop_at_step  INTEGER NOT NULL DEFAULT 0,
  held          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tune_runs_by_group ON tune_runs (sweep_id, grp);
CREATE TABLE tune_brackets (
  sweep_id  INTEGER NOT NULL REFERENCES sweeps(id),
  grp       TEXT NOT NULL,
  variant   TEXT NOT NULL,
  axes      TEXT NOT NULL DEFAULT '',
  state     TEXT NOT NULL DEFAULT 'OPEN' CHECK (state = 'OPEN' OR state = 'DONE'),
  stable    REAL,
  unstable  REAL,
  probes    INTEGER NOT NULL DEFAULT 0,
  note      TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (sweep_id, grp)
) WITHOUT ROWID;
CREATE TABLE tune_decisions (
  id        INTEGER PRIMARY KEY,
  sweep_id  INTEGER NOT NULL REFERENCES sweeps(id),
  grp       TEXT NOT NULL,
  value     REAL NOT NULL,
  rung      INTEGER NOT NULL,
  kind      TEXT NOT NULL CHECK (kind = 'promote' OR kind = 'stop' OR kind = 'choose' OR
                                 kind = 'probe'),
  metric    REAL,
  detail    TEXT NOT NULL DEFAULT '',
  time      REAL NOT NULL,
  UNIQUE (sweep_id, grp, value, rung, kind)
);
)sql";

// Version 11, what runs cost (issue 44):
// - runs.peak_memory_bytes (the peak of tensor memory of its last attempt: RunSummary's) and
//   runs.flops (the training FLOPs of every step it took); run_summary shows them with wall_s
//   as train_seconds (training seconds over all its attempts);
// - step_metrics.elapsed_s: training seconds from the run's first step to the end of this one,
//   over its attempts (NULL for rows written before), for curves against wall time.
constexpr char kSchemaV11[] = R"sql(
ALTER TABLE runs ADD COLUMN peak_memory_bytes INTEGER;
ALTER TABLE runs ADD COLUMN flops REAL;
ALTER TABLE step_metrics ADD COLUMN elapsed_s REAL;
)sql";

// Version 12: alerts (orchestrator/alerts): the state an event's run or sweep entered, each alert
// claimed once per (kind, sweep, run) before it is sent, with how its deliveries went, and how far
// the alerter has read the event log and the spikes.
constexpr char kSchemaV12[] = R"sql(
ALTER TABLE events ADD COLUMN state TEXT;
CREATE TABLE alerts (
  id          INTEGER PRIMARY KEY,
  kind        TEXT NOT NULL,
  sweep_id    INTEGER NOT NULL,
  run_id      INTEGER NOT NULL DEFAULT 0,
  created_at  REAL NOT NULL,
  payload     TEXT NOT NULL,
  targets     INTEGER NOT NULL DEFAULT 0,
  delivered   INTEGER NOT NULL DEFAULT 0,
  failed      INTEGER NOT NULL DEFAULT 0,
  dropped     INTEGER NOT NULL DEFAULT 0,
  last_error  TEXT NOT NULL DEFAULT '',
  UNIQUE (kind, sweep_id, run_id)
);
CREATE TABLE alert_cursor (
  id        INTEGER PRIMARY KEY CHECK (id = 1),
  event_id  INTEGER NOT NULL,
  spike_id  INTEGER NOT NULL
);
)sql";

// Version 13: program runs (docs/program.md): each program's code as submitted, once per code
// hash (a ProgramSnapshot, binary), which every job of its runs carries to its worker.
constexpr char kSchemaV13[] = R"sql(
CREATE TABLE program_code (
  code_hash   TEXT PRIMARY KEY,
  snapshot    BLOB NOT NULL,
  files       INTEGER NOT NULL,
  bytes       INTEGER NOT NULL,
  created_at  REAL NOT NULL
);
)sql";

// Version 14: evaluation metrics by name (EvalResult.metrics): what a program reports that has
// no column of eval_metrics, one row per (run, step, name).
constexpr char kSchemaV14[] = R"sql(
CREATE TABLE eval_values (
  run_id  INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  name    TEXT NOT NULL,
  value   REAL,
  PRIMARY KEY (run_id, step, name)
) WITHOUT ROWID;
)sql";

// Version 15, evaluations per item and their cost (issue 57):
// - eval_items: the per-item scores of a run's last evaluation that reported them
//   (EvalResult.items: 1 or 0 per item answered, a log-probability per multiple-choice
//   document), one row per (run, metric, item), for paired tests over items;
// - eval_metrics.eval_s: the seconds an evaluation took; run_summary sums them (eval_seconds).
constexpr char kSchemaV15[] = R"sql(
ALTER TABLE eval_metrics ADD COLUMN eval_s REAL;
CREATE TABLE eval_items (
  run_id  INTEGER NOT NULL,
  name    TEXT NOT NULL,
  item    INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  value   REAL,
  PRIMARY KEY (run_id, name, item)
) WITHOUT ROWID;
)sql";

// Version 16, the attention sink as the literature measures it (issue 58): the sink rate of
// Gu et al. (Probes.sink_rate) per evaluation and per run, and per layer the first-token
// attention of each head, the sink-rate window's, and the split by query class, as JSON arrays.
constexpr char kSchemaV16[] = R"sql(
ALTER TABLE runs ADD COLUMN sink_rate REAL;
ALTER TABLE eval_metrics ADD COLUMN sink_rate REAL;
ALTER TABLE eval_layer_probes ADD COLUMN first_token_by_head TEXT;
ALTER TABLE eval_layer_probes ADD COLUMN sink_window_by_head TEXT;
ALTER TABLE eval_layer_probes ADD COLUMN query_classes TEXT;
)sql";

// Version 10: STOPPED joins the runs state CHECK, the last of its chain of equalities.
constexpr char kLastRunState[] = "state = 'INTERRUPTED')";

absl::Status AddStoppedToRunsCheck(sqlite3* db) {
  absl::StatusOr<std::string> create = TableText(db, "runs", "migration 10");
  if (!create.ok()) return create.status();
  const size_t at = create->find(kLastRunState);
  if (at == std::string::npos || create->find(kLastRunState, at + 1) != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store: migration 10: table runs has no single \"", kLastRunState, "\" in its CHECK"));
  }
  std::string sql = *create;
  sql.replace(at, sizeof(kLastRunState) - 1, "state = 'INTERRUPTED' OR state = 'STOPPED')");
  return RewriteTables(db, {{"runs", sql}});
}

// Drops every view of kViews the database has (a view of an older version included: none was
// ever renamed or retired), the last first.
absl::Status DropViews(sqlite3* db) {
  for (auto view = std::rbegin(kViews); view != std::rend(kViews); ++view) {
    if (absl::Status s = Exec(db, absl::StrCat("DROP VIEW IF EXISTS ", view->name)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CreateViews(sqlite3* db) {
  for (const View& view : kViews) {
    absl::Status s = Exec(db, absl::StrCat("CREATE VIEW ", view.name, " AS",
                                           absl::StripTrailingAsciiWhitespace(view.select)));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<Migration>& StoreMigrations() {
  static const std::vector<Migration>* migrations =
      new std::vector<Migration>{{kSchemaV1},
                                 {kSchemaV2},
                                 {kSchemaV3},
                                 {kSchemaV4},
                                 {kSchemaV5},
                                 {kSchemaV6},
                                 {"", RewriteStateChecks},
                                 {kSchemaV8, DropRunsWorkerReference},
                                 {kSchemaV9},
                                 {kSchemaV10, AddStoppedToRunsCheck},
                                 {kSchemaV11},
                                 {kSchemaV12},
                                 {kSchemaV13},
                                 {kSchemaV14},
                                 {kSchemaV15},
                                 {kSchemaV16}};
  return *migrations;
}

int StoreSchemaVersion() { return static_cast<int>(StoreMigrations().size()); }

absl::Status MigrateStore(sqlite3* db) {
  absl::StatusOr<int64_t> version = QueryInt(db, "PRAGMA user_version");
  if (!version.ok()) return version.status();
  const int64_t target = StoreSchemaVersion();
  if (*version > target) {
    return absl::FailedPreconditionError(absl::StrCat("store: the database has schema version ",
                                                      *version, ", newer than this build's ",
                                                      target, " (written by a newer ablate)"));
  }
  for (int64_t v = *version; v < target; ++v) {
    if (absl::Status s = Exec(db, "BEGIN IMMEDIATE"); !s.ok()) return s;
    // Re-read inside the write lock: another process may have migrated meanwhile.
    absl::StatusOr<int64_t> now = QueryInt(db, "PRAGMA user_version");
    absl::Status s = now.status();
    if (s.ok() && *now == v) {
      const Migration& m = StoreMigrations()[v];
      s = DropViews(db);
      if (s.ok()) s = Exec(db, m.sql);
      if (s.ok() && m.code != nullptr) s = m.code(db);
      if (s.ok() && v + 1 == target) s = CreateViews(db);
      if (s.ok()) s = Exec(db, absl::StrCat("PRAGMA user_version = ", v + 1));
    }
    if (!s.ok()) {
      Exec(db, "ROLLBACK").IgnoreError();
      return s;
    }
    if (absl::Status c = Exec(db, "COMMIT"); !c.ok()) {
      Exec(db, "ROLLBACK").IgnoreError();
      return c;
    }
    if (*now > v) v = *now - 1;
  }
  return absl::OkStatus();
}

}  // namespace ablate
