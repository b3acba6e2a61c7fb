// The store's schema over real SQLite files: creation, refusals, every migration, the views
// defined once, and the indexes the writer and the scheduling reads rely on.
#include "tests/orchestrator/store/store_fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "config/model_config.h"
#include "config/proto_yaml.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/format.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/sqlite.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/process_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

// ---- Schema -------------------------------------------------------------------------------------

// A database that exists is opened only if it is this user's own, no one else can write it, and
// it is not a symbolic link. Before: its mode was never checked.
TEST_F(StoreTest, AnExistingDatabaseOthersCanWriteIsRefused) {
  store_.reset();
  StoreOptions options;
  options.path = path_;
  std::filesystem::permissions(path_, std::filesystem::perms(0664));
  absl::StatusOr<std::unique_ptr<Store>> open = Store::Open(options);
  EXPECT_TRUE(absl::IsFailedPrecondition(open.status())) << open.status();
  EXPECT_NE(open.status().message().find("is writable by group or others (mode 0664): chmod 600"),
            std::string::npos)
      << open.status();
  std::filesystem::permissions(path_, std::filesystem::perms(0600));
  const std::string link = dir_ + "/link.db";
  std::filesystem::create_symlink(path_, link);
  options.path = link;
  open = Store::Open(options);
  EXPECT_NE(open.status().message().find("is a symbolic link"), std::string::npos) << open.status();
  Reopen();  // 0600: as created
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(StoreTest, CreatesTheSchemaInWalModeAndReopens) {
  EXPECT_EQ(Count("PRAGMA user_version"), StoreSchemaVersion());
  EXPECT_TRUE(std::filesystem::exists(path_ + "-wal"));
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* mode = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &mode, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(mode), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(mode, 0)), "wal");
  sqlite3_finalize(mode);
  sqlite3_close(raw);
  for (const char* table : {"sweeps", "variants", "runs", "attempts", "workers", "step_metrics",
                            "eval_metrics", "eval_layer_probes", "spike_events", "events"}) {
    EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND "
                                 "name = '",
                                 table, "'")),
              1)
        << table;
  }
  for (const char* view :
       {"run_summary", "sweep_progress", "variant_table", "latest_metrics", "spikes"}) {
    EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM sqlite_schema WHERE type = 'view' AND "
                                 "name = '",
                                 view, "'")),
              1)
        << view;
  }
  Submit("s", {"baseline"}, 1);
  Reopen();  // migrations are not re-run on an up-to-date file
  EXPECT_EQ(Count("SELECT count(*) FROM runs"), 1);
}

TEST_F(StoreTest, RefusesADatabaseFromANewerBuild) {
  store_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, absl::StrCat("PRAGMA user_version = ", StoreSchemaVersion() + 1).c_str(),
                   nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  StoreOptions options;
  options.path = path_;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("newer"), std::string::npos);
}

// A file as a version-`version` build left it: that version's schema, then `sql`, in one
// transaction that ends by setting user_version.
std::string OldFile(int version, const std::string& sql) {
  std::string file = "PRAGMA journal_mode = WAL; BEGIN;";
  for (int v = 0; v < version; ++v) absl::StrAppend(&file, StoreMigrations()[v].sql);
  absl::StrAppend(&file, sql, "PRAGMA user_version = ", version, "; COMMIT;");
  return file;
}

TEST_F(StoreTest, MigratesAVersionOneDatabaseKeepingEachRunsConfig) {
  // A file as a version-1 build left it: the config inside each runs row.
  const std::string v1 =
      OldFile(1,
              "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1);"
              "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0);"
              "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, config_json, "
              "created_at, state) VALUES (1, 1, 1, 0, 'k0', 0, '{\"train\":{\"steps\":7}}', 1, "
              "'SUCCEEDED'), (2, 1, 1, 1, 'k1', 1, '{\"train\":{\"steps\":8}}', 1, 'PENDING');");
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(v1));
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs' AND "
                  "sql LIKE '%config_json%'"),
            0);
  absl::StatusOr<RunInfo> run = store_->reader().GetRun(2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->config_json, "{\"train\":{\"steps\":8}}");
  EXPECT_EQ(run->state, PENDING);
  EXPECT_EQ(Count("SELECT json_extract(c.config_json, '$.train.steps') FROM runs r "
                  "JOIN run_configs c ON c.run_id = r.id WHERE r.run_key = 'k0'"),
            7);
  // The migrated file takes new sweeps as a fresh one does.
  SweepIds ids = Submit("new", {"baseline"}, 1);
  ASSERT_EQ(ids.run_ids.size(), 1u);
  EXPECT_EQ(Count("SELECT count(*) FROM run_configs"), 3);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

// The views of `store`'s file: each one's name and definition, by name.
std::vector<std::pair<std::string, std::string>> Views(Store& store) {
  absl::StatusOr<QueryResult> r = store.reader().ReadOnlyQuery(
      "SELECT name, sql FROM sqlite_schema WHERE type = 'view' ORDER BY name");
  EXPECT_TRUE(r.ok()) << r.status();
  std::vector<std::pair<std::string, std::string>> views;
  if (!r.ok()) return views;
  for (const std::vector<SqlValue>& row : r->rows) {
    views.emplace_back(std::get<std::string>(row[0]), std::get<std::string>(row[1]));
  }
  return views;
}

// The views are no migration's: a file at the oldest version, with the views version 1 wrote,
// ends with exactly the views of a fresh file, which read its runs.
TEST_F(StoreTest, AVersionOneFileGetsTheViewsOfAFreshOne) {
  const std::vector<std::pair<std::string, std::string>> fresh = Views(*store_);
  ASSERT_GE(fresh.size(), 7u);
  // Four of version 1's views as it wrote them (later versions changed three of them).
  const std::string v1 = OldFile(
      1,
      "CREATE VIEW run_summary AS SELECT r.id AS run_id, s.name AS sweep, v.name AS variant, "
      "r.state, r.val_loss FROM runs r JOIN sweeps s ON s.id = r.sweep_id "
      "JOIN variants v ON v.id = r.variant_id;"
      "CREATE VIEW sweep_progress AS SELECT s.id AS sweep_id, s.name AS sweep, count(r.id) AS "
      "runs, coalesce(sum(r.steps_done), 0) AS steps_done FROM sweeps s LEFT JOIN runs r ON "
      "r.sweep_id = s.id GROUP BY s.id;"
      "CREATE VIEW latest_metrics AS SELECT r.id AS run_id, m.step, m.loss FROM runs r "
      "LEFT JOIN step_metrics m ON m.run_id = r.id AND m.step = (SELECT max(step) FROM "
      "step_metrics WHERE run_id = r.id);"
      "CREATE VIEW spikes AS SELECT e.id, e.run_id, e.step FROM spike_events e;"
      "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1);"
      "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0);"
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, config_json, "
      "created_at, state) VALUES (1, 1, 1, 0, 'k0', 0, '{}', 1, 'SUCCEEDED');");
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(v1));
  EXPECT_EQ(Views(*store_), fresh);
  EXPECT_EQ(Count("SELECT count(*) FROM run_summary WHERE tags = '' AND reused_from IS NULL "
                  "AND train_seconds IS NULL"),
            1);
  EXPECT_EQ(Count("SELECT stopped FROM sweep_progress"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM variant_table"), 1);
  EXPECT_EQ(IntegrityCheck(), "ok");
  // Reopened at this version: nothing migrates, the views stay as they are.
  Reopen();
  EXPECT_EQ(Views(*store_), fresh);
}

// Version 3: the run a reused run took its results from, once only in its reason, is a column.
TEST_F(StoreTest, MigratingToVersionThreeFindsReusedRunsInTheirReasons) {
  const std::string v2 = OldFile(
      2,
      "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1), (2, 'again', 2);"
      "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0), "
      "(2, 2, 'baseline', 0);"
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at, state, "
      "reason) VALUES (1, 1, 1, 0, 'k0', 0, 1, 'SUCCEEDED', ''), (2, 2, 2, 0, 'k0', 0, 2, "
      "'SUCCEEDED', 'reused run 1 (same run key k0)');"
      "INSERT INTO run_configs (run_id, config_json) VALUES (1, '{}'), (2, '{}');"
      "INSERT INTO step_metrics (run_id, step, attempt, loss) VALUES (1, 1, 1, 4.5);");
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(v2));
  EXPECT_EQ(Count("SELECT reused_from FROM run_summary WHERE run_id = 2"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE reused_from IS NULL"), 1);
  // Its curve is its source's.
  absl::StatusOr<std::vector<StepMetrics>> series = store_->reader().MetricSeries(2);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->size(), 1u);
  EXPECT_DOUBLE_EQ(series->front().loss(), 4.5);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

// A file as a version-6 build left it: `extra` runs after the version-6 schema, before COMMIT.
std::string VersionSixFile(const std::string& extra) {
  return OldFile(
      6, absl::StrCat(
             "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1);"
             "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0);"
             "INSERT INTO workers (id, name, registered_at, last_seen, state) VALUES (1, 'w', 1, "
             "1, 'BUSY');"
             "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at, "
             "state, attempts, worker_id) VALUES (1, 1, 1, 0, 'k0', 0, 1, 'RUNNING', 1, 1);"
             "INSERT INTO run_configs (run_id, config_json) VALUES (1, '{}');"
             "INSERT INTO attempts (run_id, attempt, worker_id, state, started_at) "
             "VALUES (1, 1, 1, 'RUNNING', 1);",
             extra));
}

// Column `column` of every row `explain` (EXPLAIN or EXPLAIN QUERY PLAN) gives for `sql` on the
// writer connection.
std::vector<std::string> Explain(Store& store, const std::string& explain, const std::string& sql,
                                 int column) {
  std::vector<std::string> values;
  EXPECT_TRUE(store
                  .RunOnWriterForTesting([&](sqlite3* db) {
                    sqlite3_stmt* stmt = nullptr;
                    if (sqlite3_prepare_v2(db, (explain + " " + sql).c_str(), -1, &stmt, nullptr) !=
                        SQLITE_OK) {
                      return absl::InternalError(sqlite3_errmsg(db));
                    }
                    while (sqlite3_step(stmt) == SQLITE_ROW) {
                      values.emplace_back(
                          reinterpret_cast<const char*>(sqlite3_column_text(stmt, column)));
                    }
                    sqlite3_finalize(stmt);
                    return absl::OkStatus();
                  })
                  .ok())
      << sql;
  return values;
}

// The opcodes of `sql`'s program on the writer connection.
std::vector<std::string> Opcodes(Store& store, const std::string& sql) {
  return Explain(store, "EXPLAIN", sql, 1);
}

// Version 7: each state CHECK is a chain of equalities. SQLite built a temporary b-tree of an
// IN list on every row a start or an end wrote; the constraints themselves are unchanged.
TEST_F(StoreTest, MigratingToVersionSevenKeepsEveryStateCheckWithoutTemporaryTables) {
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(VersionSixFile("")));
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE sql LIKE '%CHECK (state IN%'"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs' AND sql LIKE "
                  "'%CHECK (state = ''PENDING'' OR state = ''RUNNING'' OR state = ''SUCCEEDED'' "
                  "OR state = ''FAILED'' OR state = ''DIVERGED'' OR state = ''CANCELLED'' OR "
                  "state = ''INTERRUPTED'' OR state = ''STOPPED'')%'"),
            1);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'attempts' AND sql LIKE "
                  "'%state = ''LOST'')%'"),
            1);
  // Each constraint still holds, on the writer's connection and on a fresh one.
  for (const char* bad : {"UPDATE runs SET state = 'DONE' WHERE id = 1",
                          "UPDATE attempts SET state = 'PENDING' WHERE run_id = 1",
                          "UPDATE workers SET state = 'LOST' WHERE id = 1",
                          "UPDATE sweeps SET state = 'RUNNING' WHERE id = 1"}) {
    absl::Status s = store_->RunOnWriterForTesting([&](sqlite3* db) { return Exec(db, bad); });
    EXPECT_THAT(s.message(), ::testing::HasSubstr("CHECK constraint failed")) << bad;
  }
  // The run the old build left running ends as any run does.
  ASSERT_TRUE(Finish(1, SUCCEEDED, 3.0, 0.1, 10, 0.1, 0).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM attempts WHERE state = 'SUCCEEDED'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE state = 'DONE'"), 1);
  Reopen();
  absl::Status s = store_->RunOnWriterForTesting(
      [](sqlite3* db) { return Exec(db, "UPDATE runs SET state = 'DONE' WHERE id = 1"); });
  EXPECT_THAT(s.message(), ::testing::HasSubstr("CHECK constraint failed"));
  EXPECT_EQ(IntegrityCheck(), "ok");
}

// Version 8: runs.worker_id has no foreign key (its UPDATE gave every start a statement
// journal); attempts.worker_id keeps its own, and a start writes both, so a run still names only
// a worker that exists.
TEST_F(StoreTest, MigratingToVersionEightKeepsTheWorkerCheckOnTheAttempt) {
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(VersionSixFile(
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at) "
      "VALUES (2, 1, 1, 1, 'k1', 1, 1);")));
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs' AND sql LIKE "
                  "'%REFERENCES workers%'"),
            0);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs' AND sql LIKE "
                  "'%worker_id         INTEGER,%'"),
            1);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'attempts' AND sql LIKE "
                  "'%worker_id        INTEGER REFERENCES workers(id)%'"),
            1);
  // A start on a worker that does not exist is refused whole: no attempt, the run still queued.
  RunTransition start = testing::MakeTransition(2, {PENDING}, RUNNING);
  start.worker_id = 99;
  absl::StatusOr<TransitionResult> refused = store_->TransitionRun(start);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("FOREIGN KEY constraint failed"));
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE id = 2 AND state = 'PENDING' AND "
                  "worker_id IS NULL"),
            1);
  EXPECT_EQ(Count("SELECT count(*) FROM attempts WHERE run_id = 2"), 0);
  start.worker_id = 1;
  ASSERT_TRUE(store_->TransitionRun(start).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE id = 2 AND state = 'RUNNING' AND "
                  "worker_id = 1"),
            1);
  Reopen();
  EXPECT_EQ(IntegrityCheck(), "ok");
  EXPECT_EQ(ReadFile("SELECT count(*) FROM pragma_foreign_key_check"), 0);
}

// Version 10: a run may be STOPPED (by the tuner: from PENDING at a rung, from RUNNING when it
// trains through its rungs), and the tuning tables are there.
TEST_F(StoreTest, MigratingToVersionTenAcceptsStoppedRunsAndHoldsTheTuningTables) {
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(VersionSixFile(
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at) "
      "VALUES (2, 1, 1, 1, 'k1', 1, 1);")));
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name IN ('tunes', 'tune_runs', "
                  "'tune_decisions') AND type = 'table'"),
            3);
  RunTransition stop = testing::MakeTransition(2, {PENDING}, STOPPED);
  stop.reason = "stopped at rung 0";
  ASSERT_TRUE(store_->TransitionRun(stop).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE id = 2 AND state = 'STOPPED' AND "
                  "finished_at IS NOT NULL"),
            1);
  // STOPPED is terminal: nothing moves it again, and the sweep is done once the other ends.
  RunTransition again = testing::MakeTransition(2, {STOPPED}, PENDING);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->TransitionRun(again).status()));
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE state = 'DONE'"), 0);
  ASSERT_TRUE(Finish(1, SUCCEEDED, 3.0, 0.1, 10, 0.1, 0).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE state = 'DONE'"), 1);
  EXPECT_EQ(Count("SELECT stopped FROM sweep_progress"), 1);
  absl::Status s = store_->RunOnWriterForTesting(
      [](sqlite3* db) { return Exec(db, "UPDATE runs SET state = 'HALTED' WHERE id = 2"); });
  EXPECT_THAT(s.message(), ::testing::HasSubstr("CHECK constraint failed"));
  Reopen();
  EXPECT_EQ(IntegrityCheck(), "ok");
}

TEST_F(StoreTest, AVersionSevenFileWhoseRunsNameNoWorkerReferenceIsRefusedAtVersionSeven) {
  // A runs table someone edited by hand: migration 8 cannot find the column it rewrites.
  const std::string sql = VersionSixFile(
      "PRAGMA writable_schema = ON; UPDATE sqlite_schema SET sql = replace(sql, "
      "' REFERENCES workers(id)', '') WHERE name = 'runs'; PRAGMA writable_schema = OFF;");
  ExpectOldFileRefusedAtVersion(sql, "migration 8: table runs", 7);
}

// The details of `sql`'s query plan on the writer connection (EXPLAIN QUERY PLAN), joined.
std::string QueryPlan(Store& store, const std::string& sql) {
  std::string plan;
  for (const std::string& detail : Explain(store, "EXPLAIN QUERY PLAN", sql, 3)) {
    absl::StrAppend(&plan, detail, "; ");
  }
  return plan;
}

// Version 8: runs_by_sweep_state holds only unfinished runs, and what looks for them by sweep
// (the sweep-done probe, a sweep's cancel) still finds them through it.
TEST_F(StoreTest, UnfinishedRunsOfASweepAreFoundThroughTheirPartialIndex) {
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs_by_sweep_state' AND sql "
                  "LIKE '%WHERE state = ''PENDING'' OR state = ''RUNNING'' OR "
                  "state = ''INTERRUPTED''%'"),
            1);
  for (const char* sql : {"SELECT 1 FROM runs WHERE sweep_id = 1 AND state = 'PENDING'",
                          "SELECT 1 FROM runs WHERE sweep_id = 1 AND state = 'RUNNING'",
                          "SELECT 1 FROM runs WHERE sweep_id = 1 AND state = 'INTERRUPTED'",
                          "SELECT id, state FROM runs WHERE sweep_id = 1 AND (state = 'PENDING' OR "
                          "state = 'RUNNING' OR state = 'INTERRUPTED') ORDER BY id"}) {
    EXPECT_THAT(QueryPlan(*store_, sql), ::testing::HasSubstr("INDEX runs_by_sweep_state")) << sql;
  }
  // A sweep's runs end and it is DONE; cancelling a sweep finds its queued and running runs.
  SweepIds done = Submit("done", {"baseline"}, 2);
  for (int64_t run : done.run_ids) {
    ASSERT_EQ(Start(run), 1);
    ASSERT_TRUE(Finish(run, SUCCEEDED, 3.0, 0.1, 10, 0.1, 0).ok());
  }
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE name = 'done' AND state = 'DONE'"), 1);
  SweepIds open = Submit("open", {"baseline"}, 3);
  ASSERT_EQ(Start(open.run_ids[0]), 1);
  absl::StatusOr<SweepCancellation> cancelled = store_->CancelSweep(open.sweep_id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->running, std::vector<int64_t>{open.run_ids[0]});
  EXPECT_EQ(cancelled->cancelled, (std::vector<int64_t>{open.run_ids[1], open.run_ids[2]}));
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE sweep_id = " + std::to_string(open.sweep_id) +
                  " AND state = 'CANCELLED'"),
            2);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

TEST_F(StoreTest, TheWritersStatementsBuildNoTemporaryTables) {
  for (const char* sql :
       {"UPDATE runs SET state = 'RUNNING', attempts = 1 WHERE id = 1",
        "INSERT INTO attempts (run_id, attempt, state, started_at) VALUES (1, 1, 'RUNNING', 1)",
        "UPDATE attempts SET state = 'LOST' WHERE run_id = 1 AND attempt = 1",
        "UPDATE workers SET state = 'BUSY', last_seen = 2 WHERE id = 1",
        "UPDATE sweeps SET state = 'DONE' WHERE id = 1",
        "SELECT EXISTS (SELECT 1 FROM runs WHERE sweep_id = 1 AND state = 'PENDING') OR EXISTS "
        "(SELECT 1 FROM runs WHERE sweep_id = 1 AND state = 'RUNNING')"}) {
    const std::vector<std::string> ops = Opcodes(*store_, sql);
    EXPECT_FALSE(ops.empty()) << sql;
    EXPECT_THAT(ops, ::testing::Not(::testing::Contains("OpenEphemeral"))) << sql;
  }
}

TEST_F(StoreTest, AVersionSixFileWithoutAStateCheckIsRefusedAndLeftAsItWas) {
  // A workers table someone rebuilt by hand, without its CHECK: the migration cannot rewrite it.
  const std::string sql = VersionSixFile(
      "DROP TABLE workers; CREATE TABLE workers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
      "resources_json TEXT NOT NULL DEFAULT '{}', registered_at REAL NOT NULL, "
      "last_seen REAL NOT NULL, state TEXT NOT NULL DEFAULT 'IDLE');");
  // Nothing changed: still version 6, the other tables' constraints as they were.
  ExpectOldFileRefusedAtVersion(sql, "table workers", 6);
  EXPECT_EQ(ReadFile("SELECT count(*) FROM sqlite_schema WHERE sql LIKE '%CHECK (state IN%'"), 3);
}

TEST_F(StoreTest, CreateSweepStoresVariantsAndRunsAndRefusesADuplicateName) {
  SweepIds ids = Submit("gates", {"baseline", "g1"}, 3);
  ASSERT_EQ(ids.run_ids.size(), 6u);
  EXPECT_EQ(Count("SELECT count(*) FROM variants"), 2);
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE state = 'PENDING'"), 6);
  EXPECT_EQ(Count("SELECT params_added FROM variants WHERE name = 'g1'"), 1000);
  absl::StatusOr<SweepIds> again = store_->CreateSweep(MakeSweep("gates", {"baseline"}, 1));
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  EXPECT_EQ(Count("SELECT count(*) FROM runs"), 6);

  absl::StatusOr<std::vector<SweepInfo>> sweeps = store_->reader().ListSweeps();
  ASSERT_TRUE(sweeps.ok()) << sweeps.status();
  ASSERT_EQ(sweeps->size(), 1u);
  EXPECT_EQ((*sweeps)[0].pending, 6);
  Start(ids.run_ids[0]);
  absl::StatusOr<SweepInfo> info = store_->reader().GetSweep("gates");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->running, 1);
  EXPECT_EQ(info->pending, 5);
  absl::StatusOr<RunInfo> run = store_->reader().GetRun(ids.run_ids[1]);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->variant, "g1");
  EXPECT_EQ(run->state, PENDING);
  EXPECT_EQ(run->steps_total, 1000);
}

// The runs' JSON is printed before the write is queued (off the writer thread): each run must
// still get its own.
TEST_F(StoreTest, EachRunStoresItsOwnConfigAndStatsKeepTheLongestTransaction) {
  EXPECT_EQ(store_->Stats().longest_flush, absl::ZeroDuration());
  SweepRecord record = MakeSweep("configs", {"baseline", "g1"}, 3);
  for (int i = 0; i < record.expanded.runs_size(); ++i) {
    record.expanded.mutable_runs(i)->mutable_config()->mutable_train()->set_steps(100 + i);
  }
  const absl::Time before = absl::Now();
  absl::StatusOr<SweepIds> ids = store_->CreateSweep(record);
  const absl::Duration took = absl::Now() - before;
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->run_ids.size(), 6u);
  for (int i = 0; i < record.expanded.runs_size(); ++i) {
    absl::StatusOr<RunInfo> run = store_->reader().GetRun(ids->run_ids[i]);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->config_json, CanonicalJson(record.expanded.runs(i).config())) << "run " << i;
  }
  const absl::Duration longest = store_->Stats().longest_flush;
  EXPECT_GT(longest, absl::ZeroDuration());
  EXPECT_LE(longest, took);

  // JSON the expansion printed is stored as given; a count that does not match is refused.
  SweepRecord given = MakeSweep("given", {"baseline"}, 2);
  given.config_json = {"{\"a\":1}", "{\"a\":2}"};
  absl::StatusOr<SweepIds> stored = store_->CreateSweep(given);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(store_->reader().GetRun(stored->run_ids[1])->config_json, "{\"a\":2}");
  SweepRecord short_by_one = MakeSweep("short", {"baseline"}, 2);
  short_by_one.config_json = {"{}"};
  absl::StatusOr<SweepIds> refused = store_->CreateSweep(short_by_one);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("2 runs but 1"));
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE name = 'short'"), 0);
}

}  // namespace
}  // namespace ablate
