// The results store over real SQLite files in a temporary directory.
#include "orchestrator/store/store.h"

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
#include "nlohmann/json.hpp"
#include "config/model_config.h"
#include "config/proto_yaml.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/sqlite.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/process_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("store_test").string();
    path_ = dir_ + "/ablate.db";
    Reopen();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Reopen(StoreOptions options = {}) {
    store_.reset();
    options.path = path_;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  // A sweep of `variants` x `seeds` runs of 1,000 steps, variant-major inside each seed.
  static SweepRecord MakeSweep(const std::string& name, const std::vector<std::string>& variants,
                               int seeds) {
    return testing::MakeSweep(name, variants, seeds, 1000);
  }

  SweepIds Submit(const std::string& name, const std::vector<std::string>& variants, int seeds) {
    absl::StatusOr<SweepIds> ids = store_->CreateSweep(MakeSweep(name, variants, seeds));
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : SweepIds();
  }

  int32_t Start(int64_t run_id, int64_t worker_id = 0) {
    RunTransition t = testing::MakeTransition(run_id, {PENDING}, RUNNING);
    t.worker_id = worker_id;
    absl::StatusOr<TransitionResult> r = store_->TransitionRun(t);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->attempt : 0;
  }

  // Reopens the store with `options` and failed writes retried within 20 to 50 ms (so that a test
  // of failing writes sees the writer retry promptly), then submits a one-run sweep and starts it.
  struct StartedRun {
    int64_t sweep_id;
    int64_t run;
    int32_t attempt;
  };
  StartedRun ReopenRetryingAndStartARun(StoreOptions options = {}) {
    options.retry_min = absl::Milliseconds(20);
    options.retry_max = absl::Milliseconds(50);
    Reopen(options);
    SweepIds ids = Submit("s", {"baseline"}, 1);
    const int64_t run = ids.run_ids[0];
    return {ids.sweep_id, run, Start(run)};
  }

  // Reopens the store with a WAL checkpoint limit of `pages` and one sweep of one run (id 1).
  void ReopenWithCheckpointLimit(int pages) {
    StoreOptions options;
    options.checkpoint_pages = pages;
    ASSERT_NO_FATAL_FAILURE(Reopen(options));
    ASSERT_EQ(Submit("s", {"baseline"}, 1).run_ids, std::vector<int64_t>{1});
  }

  // The status of opening a store on a file made with `sql` (a test that expects it to fail).
  absl::Status OpenStatusOfOldFile(const std::string& sql) {
    WriteOldFile(sql);
    StoreOptions options;
    options.path = path_;
    return Store::Open(options).status();
  }
  // Opening a file made with `sql` (VersionSixFile's, one run RUNNING) fails FailedPrecondition
  // naming `problem`, and leaves the file at user_version `version` with its run as it was.
  void ExpectOldFileRefusedAtVersion(const std::string& sql, const std::string& problem,
                                     int version) {
    const absl::Status open = OpenStatusOfOldFile(sql);
    EXPECT_TRUE(absl::IsFailedPrecondition(open)) << open;
    EXPECT_THAT(open.message(), ::testing::HasSubstr(problem));
    EXPECT_EQ(ReadFile("PRAGMA user_version"), version);
    EXPECT_EQ(ReadFile("SELECT count(*) FROM runs WHERE state = 'RUNNING'"), 1);
  }
  // The integer `sql` reads from the file, opened read-only on a connection of its own.
  int64_t ReadFile(const std::string& sql) {
    sqlite3* db = nullptr;
    int64_t value = -1;
    if (sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      absl::StatusOr<int64_t> read = QueryInt(db, sql);
      EXPECT_TRUE(read.ok()) << sql << ": " << read.status();
      if (read.ok()) value = *read;
    }
    sqlite3_close(db);
    return value;
  }
  // Replaces the store by a file made with `sql` (as an older build left it), then opens it:
  // migrated to this build's schema version.
  void OpenMigratedFile(const std::string& sql) {
    ASSERT_NO_FATAL_FAILURE(WriteOldFile(sql));
    ASSERT_NO_FATAL_FAILURE(Reopen());
    EXPECT_EQ(Count("PRAGMA user_version"), StoreSchemaVersion());
  }
  // Closes the store and replaces its file by one made with `sql`.
  void WriteOldFile(const std::string& sql) {
    store_.reset();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK) << error;
    sqlite3_close(db);
  }

  absl::Status Finish(int64_t run_id, RunState to, double val_loss, double gate, double m_act,
                      double f_attn, double spike_score) {
    RunTransition t = testing::MakeTransition(run_id, {RUNNING}, to);
    t.has_summary = true;
    t.summary.set_state(to);
    t.summary.set_steps_done(1000);
    t.summary.set_final_train_loss(val_loss - 0.1);
    t.summary.mutable_final_eval()->set_val_loss(val_loss);
    t.summary.mutable_final_eval()->set_val_ppl(std::exp(val_loss));
    if (!std::isnan(gate)) t.summary.mutable_final_eval()->mutable_probes()->set_gate_score_mean(gate);
    t.summary.mutable_final_eval()->mutable_probes()->set_m_act(m_act);
    t.summary.mutable_final_eval()->mutable_probes()->set_f_attn(f_attn);
    t.summary.set_spike_score(spike_score);
    return store_->TransitionRun(t).status();
  }

  // A FinishAttempt write without a batch: attempt 1 of `ended` ends SUCCEEDED, `next` starts.
  static FinishWrite SucceedAndStart(int64_t ended, int64_t next) {
    FinishWrite write;
    write.end = testing::MakeTransition(ended, {RUNNING}, SUCCEEDED);
    write.end.expected_attempt = 1;
    write.start = testing::MakeTransition(next, {PENDING}, RUNNING);
    return write;
  }

  static MetricBatch Batch(int64_t run_id, int32_t attempt, int64_t seq, int64_t first_step,
                           int count, double loss_offset = 0) {
    MetricBatch b;
    b.run_id = run_id;
    b.attempt = attempt;
    b.seq = seq;
    for (int i = 0; i < count; ++i) {
      StepMetrics& m = b.steps.emplace_back();
      m.set_step(first_step + i);
      m.set_loss(5.0 - 0.001 * (first_step + i) + loss_offset);
      m.set_grad_norm(1.0);
      m.set_lr(3e-3);
      m.set_tokens_per_s(1e5);
    }
    return b;
  }

  int64_t Count(const std::string& sql) {
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql);
    EXPECT_TRUE(r.ok()) << sql << ": " << r.status();
    if (!r.ok() || r->rows.empty()) return -1;
    return std::get<int64_t>(r->rows[0][0]);
  }

  // On a connection of the test's own: user queries may not run it.
  std::string IntegrityCheck() {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    std::string first;
    const int rc = sqlite3_exec(
        db, "PRAGMA integrity_check",
        [](void* out, int, char** values, char**) {
          auto* s = static_cast<std::string*>(out);
          if (s->empty() && values[0] != nullptr) *s = values[0];
          return 0;
        },
        &first, nullptr);
    EXPECT_EQ(rc, SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
    return first;
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<Store> store_;
};

// `select` over c(x), the integers 1 to `rows`: the rows the query tests generate.
std::string OverIntegers(int64_t rows, const std::string& select) {
  return absl::StrCat("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT ", rows,
                      ") ", select);
}

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
            std::string::npos) << open.status();
  std::filesystem::permissions(path_, std::filesystem::perms(0600));
  const std::string link = dir_ + "/link.db";
  std::filesystem::create_symlink(path_, link);
  options.path = link;
  open = Store::Open(options);
  EXPECT_NE(open.status().message().find("is a symbolic link"), std::string::npos)
      << open.status();
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
                                 "name = '", table, "'")), 1) << table;
  }
  for (const char* view : {"run_summary", "sweep_progress", "variant_table", "latest_metrics",
                           "spikes"}) {
    EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM sqlite_schema WHERE type = 'view' AND "
                                 "name = '", view, "'")), 1) << view;
  }
  Submit("s", {"baseline"}, 1);
  Reopen();  // migrations are not re-run on an up-to-date file
  EXPECT_EQ(Count("SELECT count(*) FROM runs"), 1);
}

TEST_F(StoreTest, RefusesADatabaseFromANewerBuild) {
  store_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, absl::StrCat("PRAGMA user_version = ", StoreSchemaVersion() + 1).c_str(),
                         nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  StoreOptions options;
  options.path = path_;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("newer"), std::string::npos);
}

TEST_F(StoreTest, MigratesAVersionOneDatabaseKeepingEachRunsConfig) {
  // A file as a version-1 build left it: the config inside each runs row.
  const std::string v1 = absl::StrCat(
      "PRAGMA journal_mode = WAL; BEGIN;", StoreMigrations()[0].sql,
      "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1);"
      "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0);"
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, config_json, "
      "created_at, state) VALUES (1, 1, 1, 0, 'k0', 0, '{\"train\":{\"steps\":7}}', 1, "
      "'SUCCEEDED'), (2, 1, 1, 1, 'k1', 1, '{\"train\":{\"steps\":8}}', 1, 'PENDING');"
      "PRAGMA user_version = 1; COMMIT;");
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(v1));
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs' AND "
                  "sql LIKE '%config_json%'"), 0);
  absl::StatusOr<RunInfo> run = store_->reader().GetRun(2);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->config_json, "{\"train\":{\"steps\":8}}");
  EXPECT_EQ(run->state, PENDING);
  EXPECT_EQ(Count("SELECT json_extract(c.config_json, '$.train.steps') FROM runs r "
                  "JOIN run_configs c ON c.run_id = r.id WHERE r.run_key = 'k0'"), 7);
  // The migrated file takes new sweeps as a fresh one does.
  SweepIds ids = Submit("new", {"baseline"}, 1);
  ASSERT_EQ(ids.run_ids.size(), 1u);
  EXPECT_EQ(Count("SELECT count(*) FROM run_configs"), 3);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

// Version 3: the run a reused run took its results from, once only in its reason, is a column.
TEST_F(StoreTest, MigratingToVersionThreeFindsReusedRunsInTheirReasons) {
  const std::string v2 = absl::StrCat(
      "PRAGMA journal_mode = WAL; BEGIN;", StoreMigrations()[0].sql, StoreMigrations()[1].sql,
      "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1), (2, 'again', 2);"
      "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0), "
      "(2, 2, 'baseline', 0);"
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at, state, "
      "reason) VALUES (1, 1, 1, 0, 'k0', 0, 1, 'SUCCEEDED', ''), (2, 2, 2, 0, 'k0', 0, 2, "
      "'SUCCEEDED', 'reused run 1 (same run key k0)');"
      "INSERT INTO run_configs (run_id, config_json) VALUES (1, '{}'), (2, '{}');"
      "INSERT INTO step_metrics (run_id, step, attempt, loss) VALUES (1, 1, 1, 4.5);"
      "PRAGMA user_version = 2; COMMIT;");
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
  std::string sql = "PRAGMA journal_mode = WAL; BEGIN;";
  for (int v = 0; v < 6; ++v) absl::StrAppend(&sql, StoreMigrations()[v].sql);
  absl::StrAppend(
      &sql,
      "INSERT INTO sweeps (id, name, created_at) VALUES (1, 'old', 1);"
      "INSERT INTO variants (id, sweep_id, name, position) VALUES (1, 1, 'baseline', 0);"
      "INSERT INTO workers (id, name, registered_at, last_seen, state) VALUES (1, 'w', 1, 1, 'BUSY');"
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at, state, "
      "attempts, worker_id) VALUES (1, 1, 1, 0, 'k0', 0, 1, 'RUNNING', 1, 1);"
      "INSERT INTO run_configs (run_id, config_json) VALUES (1, '{}');"
      "INSERT INTO attempts (run_id, attempt, worker_id, state, started_at) "
      "VALUES (1, 1, 1, 'RUNNING', 1);",
      extra, "PRAGMA user_version = 6; COMMIT;");
  return sql;
}

// Column `column` of every row `explain` (EXPLAIN or EXPLAIN QUERY PLAN) gives for `sql` on the
// writer connection.
std::vector<std::string> Explain(Store& store, const std::string& explain, const std::string& sql,
                                 int column) {
  std::vector<std::string> values;
  EXPECT_TRUE(store.RunOnWriterForTesting([&](sqlite3* db) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, (explain + " " + sql).c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      return absl::InternalError(sqlite3_errmsg(db));
    }
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      values.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(stmt, column)));
    }
    sqlite3_finalize(stmt);
    return absl::OkStatus();
  }).ok()) << sql;
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
                  "state = ''INTERRUPTED'' OR state = ''STOPPED'')%'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'attempts' AND sql LIKE "
                  "'%state = ''LOST'')%'"), 1);
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
                  "'%REFERENCES workers%'"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'runs' AND sql LIKE "
                  "'%worker_id         INTEGER,%'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name = 'attempts' AND sql LIKE "
                  "'%worker_id        INTEGER REFERENCES workers(id)%'"), 1);
  // A start on a worker that does not exist is refused whole: no attempt, the run still queued.
  RunTransition start = testing::MakeTransition(2, {PENDING}, RUNNING);
  start.worker_id = 99;
  absl::StatusOr<TransitionResult> refused = store_->TransitionRun(start);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("FOREIGN KEY constraint failed"));
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE id = 2 AND state = 'PENDING' AND "
                  "worker_id IS NULL"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM attempts WHERE run_id = 2"), 0);
  start.worker_id = 1;
  ASSERT_TRUE(store_->TransitionRun(start).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE id = 2 AND state = 'RUNNING' AND "
                  "worker_id = 1"), 1);
  Reopen();
  EXPECT_EQ(IntegrityCheck(), "ok");
  EXPECT_EQ(ReadFile("SELECT count(*) FROM pragma_foreign_key_check"), 0);
}

// Version 10: a run may be STOPPED (by the tuner, from PENDING only), and the tuning tables
// are there. The old file's running run ends as any run does.
TEST_F(StoreTest, MigratingToVersionTenAcceptsStoppedRunsAndHoldsTheTuningTables) {
  ASSERT_NO_FATAL_FAILURE(OpenMigratedFile(VersionSixFile(
      "INSERT INTO runs (id, sweep_id, variant_id, run_index, run_key, seed, created_at) "
      "VALUES (2, 1, 1, 1, 'k1', 1, 1);")));
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema WHERE name IN ('tunes', 'tune_runs', "
                  "'tune_decisions') AND type = 'table'"), 3);
  // RUNNING -> STOPPED is not an edge: a run stops at a rung, where it is PENDING.
  RunTransition stop_running = testing::MakeTransition(1, {RUNNING}, STOPPED);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->TransitionRun(stop_running).status()));
  RunTransition stop = testing::MakeTransition(2, {PENDING}, STOPPED);
  stop.reason = "stopped at rung 0";
  ASSERT_TRUE(store_->TransitionRun(stop).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE id = 2 AND state = 'STOPPED' AND "
                  "finished_at IS NOT NULL"), 1);
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
                  "state = ''INTERRUPTED''%'"), 1);
  for (const char* sql :
       {"SELECT 1 FROM runs WHERE sweep_id = 1 AND state = 'PENDING'",
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
                  " AND state = 'CANCELLED'"), 2);
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

// ---- Ingestion ------------------------------------------------------------------------------------

// A batch's rows go in several to a statement: every row lands whole, in its own row, and a
// step a batch repeats keeps its last value, as one statement per row did.
TEST_F(StoreTest, EveryRowOfALongBatchIsStoredWithItsOwnValues) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  const int32_t attempt = Start(run);
  MetricBatch batch = Batch(run, attempt, 1, 1, 70);
  for (int i = 0; i < 70; ++i) {
    batch.steps[i].set_grad_norm(i);
    batch.steps[i].set_aux_loss(0.5 * i);
    batch.steps[i].set_skipped(i % 3 == 0);
  }
  StepMetrics again = batch.steps[40];  // step 41, reported again at the end with a new loss
  again.set_loss(-1);
  batch.steps.push_back(again);
  // Step 34 twice in the same statement (rows 32-63): the later row wins there too.
  StepMetrics twice = batch.steps[33];
  twice.set_loss(-2);
  batch.steps.insert(batch.steps.begin() + 35, twice);
  ASSERT_TRUE(store_->ReportMetrics(batch).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 70);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE grad_norm = step - 1 AND "
                  "aux_loss = 0.5 * (step - 1) AND skipped = ((step - 1) % 3 = 0) AND "
                  "attempt = 1 AND lr = 3e-3 AND tokens_per_s = 1e5"), 70);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step = 41 AND loss = -1"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step = 34 AND loss = -2"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step NOT IN (34, 41) AND "
                  "abs(loss - (5.0 - 0.001 * step)) < 1e-12"), 68);
}

int64_t FileSize(const std::string& path) {
  std::error_code error;
  const auto n = std::filesystem::file_size(path, error);
  return error ? 0 : static_cast<int64_t>(n);
}

// Pages in a WAL file of `bytes` (a 32-byte header, then 24 bytes and a 4 KB page a frame).
int64_t WalPages(int64_t bytes) { return bytes < 32 ? 0 : (bytes - 32) / (24 + 4096); }

// Between the limit and twice it, the checkpointer thread alone copies the WAL into the
// database: the writer goes on without checkpointing.
TEST_F(StoreTest, TheCheckpointerCopiesTheWalIntoTheDatabase) {
  ASSERT_NO_FATAL_FAILURE(ReopenWithCheckpointLimit(64));
  const int64_t run = 1;
  const int32_t attempt = Start(run);
  const int64_t db_before = FileSize(path_);
  // Small batches (a few pages each) until the WAL reaches the limit, far from twice it.
  int seq = 0;
  while (WalPages(FileSize(path_ + "-wal")) < 64) {
    ++seq;
    ASSERT_LT(seq, 1000);
    ASSERT_TRUE(store_->ReportMetrics(Batch(run, attempt, seq, (seq - 1) * 50 + 1, 50)).ok());
  }
  ASSERT_LT(WalPages(FileSize(path_ + "-wal")), 128);
  ASSERT_TRUE(testing::WaitFor([&] { return store_->Stats().checkpoints >= 1; },
                               std::chrono::seconds(30)));
  EXPECT_TRUE(store_->Stats().checkpoint_error.ok()) << store_->Stats().checkpoint_error;
  EXPECT_GT(FileSize(path_), db_before);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 50 * seq);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

// Written back to back, the WAL starts over instead of growing: past twice the limit the writer
// copies what the checkpointer has not, so the file never holds much more than twice the limit.
TEST_F(StoreTest, TheWalStartsOverUnderWritesBackToBack) {
  ASSERT_NO_FATAL_FAILURE(ReopenWithCheckpointLimit(64));
  const int64_t run = 1;
  const int32_t attempt = Start(run);
  int64_t wal_max = 0;
  for (int seq = 1; seq <= 40; ++seq) {  // ~700 KB of rows, ~10 times the limit
    ASSERT_TRUE(store_->ReportMetrics(Batch(run, attempt, seq, (seq - 1) * 500 + 1, 500)).ok());
    wal_max = std::max(wal_max, WalPages(FileSize(path_ + "-wal")));
  }
  // Twice the limit, and the transaction that crossed it (500 rows, a few pages).
  EXPECT_LT(wal_max, 2 * 64 + 32);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 20000);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

TEST_F(StoreTest, ACheckpointLimitOutOfRangeIsRefused) {
  for (int pages : {0, -1, (1 << 24) + 1}) {
    StoreOptions options;
    options.path = path_;
    options.checkpoint_pages = pages;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    ASSERT_FALSE(store.ok()) << pages;
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
    EXPECT_THAT(store.status().message(), ::testing::HasSubstr("checkpoint_pages"));
  }
}

TEST_F(StoreTest, TheSameBatchTwiceIsStoredOnce) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  const int32_t attempt = Start(run);
  MetricBatch batch = Batch(run, attempt, 1, 1, 100);
  SpikeEvent& spike = batch.spikes.emplace_back();
  spike.set_step(50);
  spike.set_signal("loss");
  spike.set_kind(SPIKE_STATISTICAL);
  EvalResult& eval = batch.evals.emplace_back();
  eval.set_step(100);
  eval.set_val_loss(4.5);
  LayerProbes* layer = eval.mutable_probes()->add_layers();
  layer->set_layer(0);
  layer->set_has_gate(true);
  layer->set_gate_mean(0.25);
  layer->mutable_gate_histogram()->set_lo(0);
  layer->mutable_gate_histogram()->set_hi(1);
  layer->mutable_gate_histogram()->add_counts(3);
  layer->mutable_gate_histogram()->add_counts(7);
  layer->mutable_sparsity()->set_after_gate_1e3(0.4);
  layer->mutable_sparsity()->set_mean_abs_before_gate(0.25);
  layer->mutable_sparsity()->set_mean_abs_after_gate(0.0625);

  absl::StatusOr<ReportResult> first = store_->ReportMetrics(batch);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->duplicate);
  absl::StatusOr<ReportResult> second = store_->ReportMetrics(batch);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->duplicate);

  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 100);
  EXPECT_EQ(Count("SELECT count(*) FROM spike_events"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM eval_metrics"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM eval_layer_probes"), 1);
  EXPECT_EQ(Count("SELECT report_seq FROM attempts"), 1);
  EXPECT_EQ(Count("SELECT steps_done FROM runs"), 100);

  // A new batch re-reporting the same steps (a rollback re-trains them) replaces, never adds.
  MetricBatch replay = Batch(run, attempt, 2, 51, 100, /*loss_offset=*/1.0);
  replay.spikes.push_back(spike);
  ASSERT_TRUE(store_->ReportMetrics(replay).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 150);
  EXPECT_EQ(Count("SELECT count(*) FROM spike_events"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step = 60 AND loss > 5"), 1);

  absl::StatusOr<std::vector<EvalResult>> evals = store_->reader().EvalSeries(run, true);
  ASSERT_TRUE(evals.ok()) << evals.status();
  ASSERT_EQ(evals->size(), 1u);
  ASSERT_EQ((*evals)[0].probes().layers_size(), 1);
  const LayerProbes& back = (*evals)[0].probes().layers(0);
  EXPECT_DOUBLE_EQ(back.gate_mean(), 0.25);
  EXPECT_EQ(back.gate_histogram().counts_size(), 2);
  EXPECT_EQ(back.gate_histogram().counts(1), 7);
  EXPECT_DOUBLE_EQ(back.sparsity().after_gate_1e3(), 0.4);
  EXPECT_DOUBLE_EQ(back.sparsity().mean_abs_before_gate(), 0.25);
  EXPECT_DOUBLE_EQ(back.sparsity().mean_abs_after_gate(), 0.0625);
  absl::StatusOr<std::vector<SpikeEvent>> spikes = store_->reader().SpikeEvents(run);
  ASSERT_TRUE(spikes.ok());
  ASSERT_EQ(spikes->size(), 1u);
  EXPECT_EQ((*spikes)[0].kind(), SPIKE_STATISTICAL);
}

TEST_F(StoreTest, AsynchronousBatchesAreDurableAfterFlush) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  const int32_t attempt = Start(run);
  std::atomic<int> acked{0};
  for (int seq = 1; seq <= 20; ++seq) {
    ASSERT_TRUE(store_
                    ->EnqueueMetrics(Batch(run, attempt, seq, (seq - 1) * 10 + 1, 10),
                                     [&acked](absl::StatusOr<ReportResult> r) {
                                       if (r.ok() && !r->duplicate) ++acked;
                                     })
                    .ok());
  }
  ASSERT_TRUE(store_->EnqueueHeartbeat(0, "IDLE").ok());
  ASSERT_TRUE(store_->EnqueueEvent(0, run, "note", "hello").ok());
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(acked.load(), 20);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 200);
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE kind = 'note'"), 1);
  // What was acknowledged survives closing and reopening.
  Reopen();
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 200);
}

TEST_F(StoreTest, ALostAttemptCannotReportAndItsResumeReplacesSteps) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  ASSERT_EQ(Start(run), 1);
  ASSERT_TRUE(store_->ReportMetrics(Batch(run, 1, 1, 1, 100)).ok());
  ASSERT_TRUE(store_->EnqueueCheckpoint(run, 1, "/ckpt/run1/step50", 50).ok());
  // The lease expires: attempt 1 is LOST, the run is queued again and resumes on attempt 2.
  RunTransition lost = testing::MakeTransition(run, {RUNNING}, PENDING);
  lost.attempt_end = "LOST";
  lost.reason = "lease expired";
  ASSERT_TRUE(store_->TransitionRun(lost).ok());
  ASSERT_EQ(Start(run), 2);
  absl::StatusOr<AttemptInfo> checkpoint = store_->reader().LatestCheckpoint(run);
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_EQ(checkpoint->checkpoint_step, 50);
  EXPECT_EQ(checkpoint->checkpoint_path, "/ckpt/run1/step50");

  absl::StatusOr<ReportResult> zombie = store_->ReportMetrics(Batch(run, 1, 2, 101, 10));
  EXPECT_TRUE(absl::IsFailedPrecondition(zombie.status())) << zombie.status();
  EXPECT_NE(zombie.status().message().find("LOST"), std::string::npos);
  absl::StatusOr<ReportResult> unknown = store_->ReportMetrics(Batch(run, 7, 1, 1, 1));
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();

  ASSERT_TRUE(store_->ReportMetrics(Batch(run, 2, 1, 51, 100, 1.0)).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 150);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE attempt = 2"), 100);
  EXPECT_EQ(Count("SELECT count(*) FROM attempts WHERE state = 'LOST'"), 1);
  // The zombie's attempt cannot finish the run either.
  RunTransition finish = testing::MakeTransition(run, {RUNNING}, SUCCEEDED);
  finish.expected_attempt = 1;
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->TransitionRun(finish).status()));
  finish.expected_attempt = 2;
  EXPECT_TRUE(store_->TransitionRun(finish).ok());
}

// Step rows go in OR FAIL, and again OR REPLACE only when a step was there: whatever the first
// try put in before it failed is rewritten, and the batch's values win as one OR REPLACE would.
TEST_F(StoreTest, RepeatedStepsReplaceTheirRowsWhereverTheyFallInABatch) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  ASSERT_EQ(Start(run), 1);
  ASSERT_TRUE(store_->ReportMetrics(Batch(run, 1, 1, 1, 10)).ok());
  // A rollback after a spike: steps 8-15 again, 8-10 repeated at the batch's start.
  ASSERT_TRUE(store_->ReportMetrics(Batch(run, 1, 2, 8, 8, 1.0)).ok());
  // New steps first, then a repeated one: the first try stored 20 and 21 before it failed.
  MetricBatch mixed = Batch(run, 1, 3, 20, 2, 2.0);
  mixed.steps.push_back(Batch(run, 1, 3, 5, 1, 2.0).steps[0]);
  // A step twice in one batch: the later row wins.
  mixed.steps.push_back(Batch(run, 1, 3, 30, 1, 2.0).steps[0]);
  mixed.steps.push_back(Batch(run, 1, 3, 30, 1, 3.0).steps[0]);
  ASSERT_TRUE(store_->ReportMetrics(mixed).ok());
  absl::StatusOr<std::vector<StepMetrics>> series = store_->reader().MetricSeries(run);
  ASSERT_TRUE(series.ok()) << series.status();
  std::map<int64_t, double> loss;
  for (const StepMetrics& m : *series) loss[m.step()] = m.loss();
  EXPECT_EQ(loss.size(), 18u);  // 1-15, 20, 21, 30
  EXPECT_DOUBLE_EQ(loss[7], 5.0 - 0.007);
  EXPECT_DOUBLE_EQ(loss[8], 6.0 - 0.008);
  EXPECT_DOUBLE_EQ(loss[15], 6.0 - 0.015);
  EXPECT_DOUBLE_EQ(loss[5], 7.0 - 0.005);
  EXPECT_DOUBLE_EQ(loss[20], 7.0 - 0.020);
  EXPECT_DOUBLE_EQ(loss[21], 7.0 - 0.021);
  EXPECT_DOUBLE_EQ(loss[30], 8.0 - 0.030);
  EXPECT_EQ(Count("SELECT max(steps_done) FROM runs"), 30);
}

// ---- Run state machine ---------------------------------------------------------------------------

TEST_F(StoreTest, ARunCompletesExactlyOnceUnderConcurrentFinishes) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  Start(run);
  std::atomic<int> succeeded{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      absl::Status s = Finish(run, i % 2 == 0 ? SUCCEEDED : FAILED, 3.0, 0.5, 10, 0.1, 0);
      if (s.ok()) {
        ++succeeded;
      } else if (absl::IsFailedPrecondition(s)) {
        ++refused;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(succeeded.load(), 1);
  EXPECT_EQ(refused.load(), 7);
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE kind = 'run_state' AND message LIKE "
                  "'%RUNNING -> %' OR message LIKE '%-> RUNNING%'"), 2);  // PENDING -> RUNNING and the one finish
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE state = 'DONE'"), 1);

  // Edges that do not exist are refused, whatever `from` says.
  RunTransition bad = testing::MakeTransition(run, {SUCCEEDED, FAILED}, RUNNING);
  absl::StatusOr<TransitionResult> r = store_->TransitionRun(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  bad.run_id = 12345;
  EXPECT_TRUE(absl::IsNotFound(store_->TransitionRun(bad).status()));
  // A rerun queues it again and reactivates the sweep.
  RunTransition rerun = testing::MakeTransition(run, {SUCCEEDED, FAILED}, PENDING);
  ASSERT_TRUE(store_->TransitionRun(rerun).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM sweeps WHERE state = 'ACTIVE'"), 1);
}

TEST_F(StoreTest, FinishAttemptWritesBatchEndAndNextStartInOneTransaction) {
  SweepIds ids = Submit("s", {"baseline", "g1"}, 2);  // 4 runs
  const int64_t a = ids.run_ids[0], b = ids.run_ids[1], c = ids.run_ids[2];
  ASSERT_EQ(Start(a, 0), 1);
  auto end_of = [](int64_t run) {
    RunTransition t = testing::MakeTransition(run, {RUNNING}, SUCCEEDED);
    t.expected_attempt = 1;
    t.has_summary = true;
    t.summary.set_state(SUCCEEDED);
    t.summary.set_steps_done(3);
    return t;
  };
  auto start_of = [](int64_t run) { return testing::MakeTransition(run, {PENDING}, RUNNING); };
  FinishWrite write;
  write.batch = Batch(a, 1, 1, 1, 3);
  write.end = end_of(a);
  write.start = start_of(b);
  absl::StatusOr<FinishWriteResult> r = store_->FinishAttempt(write);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->start_status.ok()) << r->start_status;
  EXPECT_EQ(r->start.attempt, 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM step_metrics WHERE run_id = ", a)), 3);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", a,
                               " AND state = 'SUCCEEDED'")), 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", b,
                               " AND state = 'RUNNING' AND attempts = 1")), 1);

  // The next run was cancelled meanwhile: its start is undone alone; the end commits.
  RunTransition cancel = testing::MakeTransition(c, {PENDING}, CANCELLED);
  ASSERT_TRUE(store_->TransitionRun(cancel).ok());
  write.batch = Batch(b, 1, 1, 1, 2);
  write.end = end_of(b);
  write.start = start_of(c);
  r = store_->FinishAttempt(write);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(r->start_status)) << r->start_status;
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", b,
                               " AND state = 'SUCCEEDED'")), 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", c,
                               " AND state = 'CANCELLED' AND attempts = 0")), 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM step_metrics WHERE run_id = ", b)), 2);

  // An end that cannot happen (b finished already) fails the whole write: its batch is not
  // stored and the next run does not start.
  write.batch = Batch(b, 1, 2, 3, 1);
  write.end = end_of(b);
  write.start = start_of(ids.run_ids[3]);
  r = store_->FinishAttempt(write);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM step_metrics WHERE run_id = ", b)), 2);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", ids.run_ids[3],
                               " AND state = 'PENDING'")), 1);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

TEST_F(StoreTest, EventsOfOneTransactionKeepTheOrderOfItsWrites) {
  // The writer inserts a transaction's events together, before its COMMIT: their ids still
  // follow the writes, and a write refused alone leaves no event.
  SweepIds ids = Submit("s", {"baseline", "g1"}, 2);  // 4 runs
  const int64_t a = ids.run_ids[0], b = ids.run_ids[1], c = ids.run_ids[2], d = ids.run_ids[3];
  ASSERT_EQ(Start(a), 1);
  ASSERT_EQ(Start(b), 1);
  // The second write's end is wrong (a is not on attempt 2): it is refused alone.
  FinishWrite wrong = SucceedAndStart(a, d);
  wrong.end.expected_attempt = 2;
  const std::vector<absl::StatusOr<FinishWriteResult>> results =
      store_->FinishAttempts({SucceedAndStart(a, c), wrong, SucceedAndStart(b, d)});
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_TRUE(absl::IsFailedPrecondition(results[1].status())) << results[1].status();
  EXPECT_TRUE(results[2].ok()) << results[2].status();
  absl::StatusOr<QueryResult> order = store_->reader().ReadOnlyQuery(
      "SELECT group_concat(message, ' | ') FROM (SELECT message FROM events "
      "WHERE kind = 'run_state' ORDER BY id)");
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(std::get<std::string>(order->rows[0][0]),
            absl::StrCat("run ", a, ": PENDING -> RUNNING (attempt 1) | run ", b,
                         ": PENDING -> RUNNING (attempt 1) | run ", a,
                         ": RUNNING -> SUCCEEDED (attempt 1) | run ", c,
                         ": PENDING -> RUNNING (attempt 1) | run ", b,
                         ": RUNNING -> SUCCEEDED (attempt 1) | run ", d,
                         ": PENDING -> RUNNING (attempt 1)"));
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE time IS NULL OR sweep_id IS NULL"), 0);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

TEST_F(StoreTest, AWriteThatFailsInsideABatchIsUndoneAloneAndTheOthersCommit) {
  // Writes are applied without savepoints first; one that fails alone makes the transaction
  // roll back and the batch apply again, each write under its own savepoint.
  StoreOptions options;
  options.flush_interval = absl::Seconds(30);  // the queued writes wait for the synchronous one
  Reopen(options);
  SweepIds ids = Submit("s", {"baseline", "g1"}, 2);  // 4 runs
  const int64_t a = ids.run_ids[0], b = ids.run_ids[1], c = ids.run_ids[2];
  ASSERT_EQ(Start(a), 1);
  ASSERT_EQ(Start(b), 1);
  RunTransition cancel = testing::MakeTransition(c, {PENDING}, CANCELLED);
  ASSERT_TRUE(store_->TransitionRun(cancel).ok());
  const StoreStats before = store_->Stats();
  EXPECT_EQ(before.reapplied_flushes, 0);

  // Two queued report batches, then a finish whose next run (c) was cancelled: one batch.
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(a, 1, 1, 1, 5), nullptr).ok());
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(a, 1, 2, 6, 5), nullptr).ok());
  FinishWrite write = SucceedAndStart(b, c);
  write.batch = Batch(b, 1, 1, 1, 3);
  absl::StatusOr<FinishWriteResult> r = store_->FinishAttempt(write);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(r->start_status)) << r->start_status;
  StoreStats after = store_->Stats();
  EXPECT_EQ(after.flushes - before.flushes, 1);
  EXPECT_EQ(after.reapplied_flushes, 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM step_metrics WHERE run_id = ", a)), 10);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM step_metrics WHERE run_id = ", b)), 3);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", b,
                               " AND state = 'SUCCEEDED'")), 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM runs WHERE id = ", c,
                               " AND state = 'CANCELLED' AND attempts = 0")), 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM attempts WHERE run_id = ", c)), 0);
  // Applied twice, stored once: one event per transition of b (its start, its end).
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM events WHERE run_id = ", b)), 2);

  // A queued batch and a transition that cannot happen: the transition is refused alone.
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(a, 1, 3, 11, 5), nullptr).ok());
  RunTransition wrong = testing::MakeTransition(a, {PENDING}, RUNNING);
  absl::StatusOr<TransitionResult> refused = store_->TransitionRun(wrong);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  after = store_->Stats();
  EXPECT_EQ(after.reapplied_flushes, 2);
  EXPECT_EQ(after.dropped_writes - before.dropped_writes, 1);
  EXPECT_EQ(Count(absl::StrCat("SELECT count(*) FROM step_metrics WHERE run_id = ", a)), 15);
  EXPECT_EQ(Count(absl::StrCat("SELECT attempts FROM runs WHERE id = ", a)), 1);

  // Writes that all succeed are applied once.
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(a, 1, 4, 16, 5), nullptr).ok());
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(store_->Stats().reapplied_flushes, 2);
  EXPECT_EQ(IntegrityCheck(), "ok");
}

// ---- Read-only queries ------------------------------------------------------------------------------

TEST_F(StoreTest, QueriesCannotChangeTheDatabase) {
  Submit("s", {"baseline", "g1"}, 2);
  const int64_t runs = Count("SELECT count(*) FROM runs");
  struct Case {
    const char* sql;
    const char* refusal;
  };
  const Case cases[] = {
      {"INSERT INTO events (time, kind, message) VALUES (0, 'x', 'y')", "(INSERT)"},
      {"UPDATE runs SET state = 'FAILED'", "(UPDATE)"},
      {"DELETE FROM runs", "(DELETE)"},
      {"DROP TABLE runs", "(DROP"},
      {"DROP VIEW run_summary", "(DROP"},
      {"CREATE TABLE t (x)", "(CREATE"},
      {"CREATE TEMP TABLE t (x)", "(CREATE"},
      {"CREATE INDEX i ON runs (seed)", "(CREATE"},
      {"ALTER TABLE runs ADD COLUMN x", "(ALTER"},
      {"ATTACH DATABASE '/tmp/ablate_attack.db' AS x", "ATTACH"},
      {"PRAGMA user_version = 5", "PRAGMA user_version = 5"},
      {"PRAGMA journal_mode = DELETE", "PRAGMA journal_mode = DELETE"},
      {"PRAGMA writable_schema = 1", "PRAGMA writable_schema"},
      {"BEGIN", "(BEGIN/COMMIT/ROLLBACK)"},
      {"REINDEX", "(REINDEX)"},
      {"ANALYZE", "(ANALYZE)"},
      {"VACUUM", ""},
      {"WITH x AS (SELECT 1) DELETE FROM runs", "(DELETE)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(c.sql);
    ASSERT_FALSE(r.ok()) << c.sql;
    EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << c.sql << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.refusal), std::string::npos)
        << c.sql << ": " << r.status();
  }
  absl::StatusOr<QueryResult> two = store_->reader().ReadOnlyQuery("SELECT 1; DELETE FROM runs");
  EXPECT_TRUE(absl::IsInvalidArgument(two.status())) << two.status();
  absl::StatusOr<QueryResult> syntax = store_->reader().ReadOnlyQuery("SELEKT 1");
  EXPECT_TRUE(absl::IsInvalidArgument(syntax.status())) << syntax.status();
  // Errors found while the statement runs are the query's fault too, not the server's.
  for (const char* sql : {"SELECT json_extract('{', '$.a')",
                          "SELECT * FROM pragma_journal_mode('delete')",
                          "SELECT sum(x) FROM (SELECT 9223372036854775807 AS x UNION ALL "
                          "SELECT 1)"}) {
    absl::StatusOr<QueryResult> failed = store_->reader().ReadOnlyQuery(sql);
    EXPECT_TRUE(absl::IsInvalidArgument(failed.status())) << sql << ": " << failed.status();
    EXPECT_THAT(std::string(failed.status().message()), ::testing::StartsWith("query: ")) << sql;
  }
  absl::StatusOr<QueryResult> schema =
      store_->reader().ReadOnlyQuery("UPDATE sqlite_master SET sql = ''");
  EXPECT_FALSE(schema.ok());
  EXPECT_THAT(std::string(schema.status().message()), ::testing::HasSubstr("may not be modified"));

  // Nothing changed, and reading PRAGMAs still work.
  EXPECT_EQ(Count("SELECT count(*) FROM runs"), runs);
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE state = 'PENDING'"), runs);
  EXPECT_EQ(Count("PRAGMA user_version"), StoreSchemaVersion());
  EXPECT_FALSE(std::filesystem::exists("/tmp/ablate_attack.db"));
  absl::StatusOr<QueryResult> info = store_->reader().ReadOnlyQuery("PRAGMA table_info(runs)");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->rows.size(), 20u);
  // The table-valued form, which joins: it was refused as "(ALTER)".
  EXPECT_EQ(Count("SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'state'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM sqlite_schema s JOIN pragma_index_list(s.name) i "
                  "WHERE s.name = 'runs'"), 4);  // three indexes and UNIQUE (sweep_id, run_index)
  // The store's own writer is unaffected.
  Submit("t", {"baseline"}, 1);
  EXPECT_EQ(Count("SELECT count(*) FROM runs"), runs + 1);
}

TEST_F(StoreTest, ARunawayQueryHitsTheTimeLimitAndRowsAreCapped) {
  QueryLimits limits;
  limits.timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(
      "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
      limits);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("time limit"), std::string::npos);
  EXPECT_LT(took, absl::Seconds(2));
  // The connection is usable afterwards.
  EXPECT_EQ(Count("SELECT 42"), 42);

  limits.timeout = absl::Seconds(10);
  limits.max_rows = 5;
  absl::StatusOr<QueryResult> capped = store_->reader().ReadOnlyQuery(
      "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c", limits);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->rows.size(), 5u);
  EXPECT_TRUE(capped->truncated);
}

// SQLite allocates through ablate's counted allocator (SqliteMemoryUsed), with SQLite's own
// statistics off: every block is counted while it lives, and the hard limit refuses a block
// that would pass it, leaving what was allocated as it was.
TEST_F(StoreTest, SqlitesHeapIsCountedAndItsHardLimitHolds) {
  EXPECT_TRUE(SqliteCountedAllocator());
  const int64_t before = SqliteMemoryUsed();
  EXPECT_GT(before, 0);  // the store's connections and statements
  void* block = sqlite3_malloc(1 << 20);
  ASSERT_NE(block, nullptr);
  EXPECT_GE(SqliteMemoryUsed(), before + (1 << 20));
  block = sqlite3_realloc(block, 2 << 20);
  ASSERT_NE(block, nullptr);
  EXPECT_GE(SqliteMemoryUsed(), before + (2 << 20));
  EXPECT_GE(SqliteMemoryHighwater(false), SqliteMemoryUsed());
  const int64_t old_limit = SqliteHardHeapLimit(SqliteMemoryUsed() + (1 << 20));
  EXPECT_EQ(sqlite3_malloc(4 << 20), nullptr);
  EXPECT_EQ(sqlite3_realloc(block, 8 << 20), nullptr);  // refused: the block stays as it was
  EXPECT_GE(sqlite3_msize(block), 2u << 20);
  // A query past the limit fails "out of memory" and the store goes on once it is lifted.
  absl::StatusOr<QueryResult> big =
      store_->reader().ReadOnlyQuery("SELECT length(randomblob(8000000))");
  EXPECT_FALSE(big.ok());
  SqliteHardHeapLimit(old_limit);
  sqlite3_free(block);
  EXPECT_LT(SqliteMemoryUsed(), before + (1 << 20));
  EXPECT_EQ(Count("SELECT length(randomblob(8000000))"), 8000000);
}

// Once docs/fuzzing.md's "known open" case: no value is over 8 MiB, but a statement holds every
// column's intermediate value until it ends, 800 of them about 10 GB. Between two memory checks
// it outgrows its 256 MiB budget; the process's SQLite heap limit stops it at 1 GiB, and the
// connection is usable afterwards.
TEST_F(StoreTest, AStatementHoldingGigabytesOfValuesIsStoppedAtItsMemoryBudget) {
  std::string sql = "SELECT ";
  for (int i = 0; i < 800; ++i) {
    absl::StrAppend(&sql, i ? ", " : "", "length(hex(zeroblob(4000000 + ", i, ")))");
  }
  QueryLimits limits;
  SqliteMemoryHighwater(/*reset=*/true);
  const absl::Time start = absl::Now();
  absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql, limits);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("out of memory"), std::string::npos) << r.status();
  EXPECT_LE(SqliteMemoryHighwater(false), kSqliteHeapLimit);
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_EQ(Count("SELECT 42"), 42);
  // The budget alone, where values pile up a few per check: a 12 MB value per row.
  limits.max_memory = int64_t{64} << 20;
  absl::StatusOr<QueryResult> piled = store_->reader().ReadOnlyQuery(
      OverIntegers(40, "SELECT max(length(hex(zeroblob(4000000 + x))) + x) FROM (SELECT x "
                       "FROM c ORDER BY hex(zeroblob(4000000 + x)))"),
      limits);
  EXPECT_TRUE(absl::IsResourceExhausted(piled.status())) << piled.status();
  EXPECT_EQ(Count("SELECT 42"), 42);
  // A budget (still 64 MiB) does not get in the way of ordinary large results.
  absl::StatusOr<QueryResult> small = store_->reader().ReadOnlyQuery(
      OverIntegers(100000, "SELECT x, hex(x) FROM c"), limits);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->rows.size(), 100000u);
}

// Found with tests/fuzz/query_fuzz: one function call allocated gigabytes or ran for seconds where
// the time limit could not interrupt it; the result and its formatting grew without bound.
TEST_F(StoreTest, NoQueryOutrunsItsLimitsInOneCall) {
  QueryLimits limits;
  limits.timeout = absl::Milliseconds(200);
  for (const char* sql : {"SELECT randomblob(900000000)", "SELECT zeroblob(900000000)",
                          "SELECT length(replace(hex(zeroblob(30000000)), '0', '00'))"}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql, limits);
    EXPECT_FALSE(r.ok()) << sql;
    EXPECT_NE(r.status().message().find("too big"), std::string::npos) << sql << r.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << sql;
  }
  absl::StatusOr<QueryResult> printf_call = store_->reader().ReadOnlyQuery(
      "SELECT printf('%.*c', 2000000000, 'x')", limits);
  EXPECT_TRUE(absl::IsPermissionDenied(printf_call.status())) << printf_call.status();
  EXPECT_NE(printf_call.status().message().find("printf() is not allowed"), std::string::npos);

  // One step the time limit cannot interrupt, whose time grows with the database; and a function
  // that leaks a library address (and registers any pointer with two arguments).
  for (const auto& [sql, why] :
       std::vector<std::pair<std::string, std::string>>{
           {"PRAGMA integrity_check", "PRAGMA integrity_check is not allowed"},
           {"SELECT * FROM pragma_quick_check", "not authorized"},  // SQLite's own words here
           {"SELECT hex(fts3_tokenizer('simple'))", "fts3_tokenizer() is not allowed"},
           {"SELECT fts3_tokenizer('x', x'0000000000000000')", "fts3_tokenizer() is not allowed"}}) {
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql, limits);
    EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << sql << ": " << r.status();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << sql << ": " << r.status();
  }
  // Sorts and subqueries too big for memory stay in memory, under the heap limit, rather than
  // spilling to temporary files: temp_store 2 is MEMORY.
  EXPECT_EQ(Count("PRAGMA temp_store"), 2);

  // Rows beyond max_bytes are dropped like rows beyond max_rows.
  limits.max_bytes = 3 << 20;
  absl::StatusOr<QueryResult> big = store_->reader().ReadOnlyQuery(
      OverIntegers(10, "SELECT x, zeroblob(1000000) FROM c"), limits);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->rows.size(), 3u);
  EXPECT_TRUE(big->truncated);

  // A table that padding would blow up is refused; CSV and JSON of the same rows are not. JSON
  // writes bytes that are not UTF-8 as U+FFFD instead of throwing.
  limits.max_bytes = QueryLimits().max_bytes;
  absl::StatusOr<QueryResult> wide = store_->reader().ReadOnlyQuery(
      OverIntegers(100, "SELECT CASE WHEN x = 1 THEN hex(zeroblob(1000000)) ELSE x'ff' END FROM c"),
      limits);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_TRUE(absl::IsResourceExhausted(FormatQueryResult(*wide, "table").status()));
  EXPECT_TRUE(FormatQueryResult(*wide, "csv").ok());
  absl::StatusOr<std::string> json = FormatQueryResult(*wide, "json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_NE(json->find("\xef\xbf\xbd"), std::string::npos);
}

// The functions whose one call costs the product of two lengths (like, glob, instr, replace, the
// trims with a character set) are SQLite's own behind a bound on that product and the deadline;
// only the functions of an allowlist may be called at all. Before: the LIKE below ran 41.6 s
// against a 10 s limit.
TEST_F(StoreTest, NoStringFunctionOutrunsTheTimeLimit) {
  QueryLimits limits;
  limits.timeout = absl::Milliseconds(300);
  const std::string h =
      "WITH h(s) AS (SELECT replace(hex(zeroblob(200000)), '0', 'a')) ";
  for (const std::string& sql :
       {h + "SELECT s LIKE '%' || substr(s, 1, 40000) || 'b' FROM h",
        h + "SELECT s GLOB '*' || substr(s, 1, 40000) || 'b' FROM h",
        h + "SELECT instr(s, substr(s, 1, 40000) || 'b') FROM h",
        h + "SELECT length(replace(s, substr(s, 1, 40000) || 'b', '')) FROM h",
        h + "SELECT length(trim(s, substr(s, 1, 40000) || 'b')) FROM h"}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql, limits);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << sql << ": " << r.status();
    EXPECT_NE(r.status().message().find("-byte argument is too much work for one call"),
              std::string::npos) << sql << ": " << r.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << sql;
  }
  // Calls within the bound, many of them: the deadline holds between two of them too.
  const absl::Time start = absl::Now();
  absl::StatusOr<QueryResult> many = store_->reader().ReadOnlyQuery(
      OverIntegers(100000, ", h(s) AS (SELECT replace(hex(zeroblob(150000)), '0', 'a')) "
                           "SELECT count(*) FROM c, h WHERE s LIKE '%' || substr(s, 1 + x % 7, 50) || 'b'"),
      limits);
  EXPECT_TRUE(absl::IsDeadlineExceeded(many.status())) << many.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Patterns are at most 1,000 bytes.
  absl::StatusOr<QueryResult> pattern = store_->reader().ReadOnlyQuery(
      "SELECT 'a' LIKE hex(zeroblob(600))", limits);
  EXPECT_NE(pattern.status().message().find("pattern too complex"), std::string::npos)
      << pattern.status();

  // The same answers as SQLite's own, ESCAPE and case folding included.
  absl::StatusOr<QueryResult> same = store_->reader().ReadOnlyQuery(
      "SELECT 'Abc' LIKE 'a%', 'a_c' LIKE 'a\\_c' ESCAPE '\\', 'abc' LIKE 'a\\_c' ESCAPE '\\', "
      "'abc' GLOB 'a[b-c]*', 'Abc' GLOB 'a*', instr('hello', 'll'), instr(x'0102', x'02'), "
      "replace('aXbX', 'X', '-'), trim('xxhixx', 'x'), ltrim('xxhi', 'x'), rtrim('hixx', 'x'), "
      "like('a%', 'abc'), 'gated' NOT LIKE 'g%'");
  ASSERT_TRUE(same.ok()) << same.status();
  const std::vector<SqlValue> expected = {int64_t{1}, int64_t{1}, int64_t{0}, int64_t{1},
                                          int64_t{0}, int64_t{3}, int64_t{2}, std::string("a-b-"),
                                          std::string("hi"), std::string("hi"), std::string("hi"),
                                          int64_t{1}, int64_t{0}};
  EXPECT_EQ(same->rows[0], expected);

  // Beyond the allowlist: refused by name.
  for (const char* sql : {"SELECT sqlite_compileoption_get(0)", "SELECT load_extension('x')",
                          "SELECT sqlite_source_id()", "SELECT last_insert_rowid()",
                          "SELECT subtype(1)"}) {
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql, limits);
    EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << sql << ": " << r.status();
    EXPECT_NE(r.status().message().find("() is not allowed"), std::string::npos) << r.status();
  }
  // What the store's own views call is on it: each of them reads.
  Submit("s", {"baseline", "gated"}, 2);
  absl::StatusOr<QueryResult> views = store_->reader().ReadOnlyQuery(
      "SELECT name FROM sqlite_master WHERE type = 'view' ORDER BY name");
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_GE(views->rows.size(), 7u);
  for (const std::vector<SqlValue>& row : views->rows) {
    const std::string& view = std::get<std::string>(row[0]);
    EXPECT_GE(Count(absl::StrCat("SELECT count(*) FROM ", view)), 0) << view;
  }
}

// Closing the store interrupts the users' queries in flight, and refuses new ones: a shutdown does
// not wait out their time limits. Before: SIGTERM during a long query took 32 s.
TEST_F(StoreTest, InterruptQueriesEndsTheRunningOnes) {
  QueryLimits limits;
  limits.timeout = absl::Seconds(60);
  absl::StatusOr<QueryResult> result;
  const absl::Time start = absl::Now();
  std::thread query([&] {
    result = store_->reader().ReadOnlyQuery(
        OverIntegers(int64_t{1} << 40, "SELECT count(*) FROM c"), limits);
  });
  absl::SleepFor(absl::Milliseconds(300));
  store_->reader().InterruptQueries();
  query.join();
  EXPECT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_NE(result.status().message().find("the store is closing"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(store_->reader().ReadOnlyQuery("SELECT 1").status()));
  // Typed reads go on.
  EXPECT_TRUE(store_->reader().ListSweeps().ok());
}

// Users' SQL has a pool of its own: runaway queries make the next one wait a bounded time and
// fail "busy", while the typed reads scheduling and the dashboard depend on, and the writer, go on.
TEST_F(StoreTest, RunawayQueriesCannotStallTypedReadsOrTheWriter) {
  const SweepIds ids = Submit("s", {"baseline", "gated"}, 1);
  ReaderOptions ro;
  ro.path = path_;
  ro.max_query_connections = 2;
  ro.query_wait = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<StoreReader>> reader = StoreReader::Open(ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  QueryLimits runaway;
  runaway.timeout = absl::Seconds(3);
  constexpr char kForever[] =
      "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
  std::vector<std::thread> running;
  std::atomic<int> timed_out{0};
  for (int i = 0; i < 2; ++i) {
    running.emplace_back([&] {
      if (absl::IsDeadlineExceeded((*reader)->ReadOnlyQuery(kForever, runaway).status())) {
        ++timed_out;
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // both hold their connections now
  absl::StatusOr<QueryResult> third = (*reader)->ReadOnlyQuery("SELECT 1");
  EXPECT_TRUE(absl::IsUnavailable(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("busy"), std::string::npos) << third.status();
  // Meanwhile the typed reads and the writer are served.
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<std::vector<SweepInfo>> sweeps = (*reader)->ListSweeps();
    ASSERT_TRUE(sweeps.ok()) << sweeps.status();
    EXPECT_EQ(sweeps->size(), 1u);
  }
  EXPECT_GT(Start(ids.run_ids[0]), 0);
  for (std::thread& t : running) t.join();
  EXPECT_EQ(timed_out.load(), 2);
  EXPECT_TRUE((*reader)->ReadOnlyQuery("SELECT 1").ok());
}

// WAL pressure: a user's query holding an old snapshot during steady ingestion is interrupted once
// a checkpoint pass leaves a WAL of kWalPressure times its checkpoint size, so the WAL is copied
// back instead of growing without bound. Before: only PASSIVE checkpoints ran, and the WAL grew
// with every batch until the query's time limit.
TEST_F(StoreTest, AQueryHoldingTheWalBackIsPausedUnderPressure) {
  StoreOptions options;
  options.checkpoint_pages = 64;
  options.synchronous_full = false;
  Reopen(options);
  const SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  const int32_t attempt = Start(run);
  QueryLimits limits;
  limits.timeout = absl::Seconds(60);
  absl::StatusOr<QueryResult> held;
  std::atomic<bool> done{false};
  std::thread query([&] {
    held = store_->reader().ReadOnlyQuery(
        "WITH RECURSIVE c(x) AS (SELECT (SELECT count(*) FROM step_metrics) UNION ALL "
        "SELECT x + 1 FROM c) SELECT count(*) FROM c",
        limits);
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(200));  // it reads: its snapshot is taken
  int64_t largest = 0;
  const std::string wal = path_ + "-wal";
  const absl::Time give_up = absl::Now() + absl::Seconds(40);
  for (int64_t seq = 1; !done.load() && absl::Now() < give_up; ++seq) {
    ASSERT_TRUE(store_->ReportMetrics(Batch(run, attempt, seq, (seq - 1) * 200 + 1, 200)).ok());
    ASSERT_TRUE(store_->Flush().ok());
    std::error_code ec;
    largest = std::max<int64_t>(largest, std::filesystem::file_size(wal, ec));
  }
  query.join();
  EXPECT_TRUE(absl::IsUnavailable(held.status())) << held.status();
  EXPECT_NE(held.status().message().find("copying its write-ahead log back"), std::string::npos)
      << held.status();
  EXPECT_GE(store_->Stats().query_pauses, 1);
  std::printf("the WAL grew to at most %lld bytes (checkpoints every %d pages)\n",
              static_cast<long long>(largest), options.checkpoint_pages);
  // The pause ends once the WAL is copied back.
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    served = store_->reader().ReadOnlyQuery("SELECT 1").ok();
    if (!served) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(served);
}

// The worker path's reads (the job, its checkpoint, the run a Finish ends) have connections of
// their own, Store::scheduling_reader: the typed reads of the dashboard, watch streams and
// `ablate status` go through reader() and cannot hold them. Before: one pool of 4 served both.
TEST_F(StoreTest, SchedulingReadsHaveAPoolOfTheirOwn) {
  const SweepIds ids = Submit("s", {"baseline"}, 1);
  ASSERT_NE(&store_->scheduling_reader(), &store_->reader());
  const int reads = store_->reader().OpenConnections();
  ASSERT_TRUE(store_->scheduling_reader().GetRun(ids.run_ids[0]).ok());
  EXPECT_EQ(store_->reader().OpenConnections(), reads);
  EXPECT_GE(store_->scheduling_reader().OpenConnections(), 1);
  EXPECT_LE(store_->scheduling_reader().OpenConnections(), StoreOptions().scheduling_connections);
}

// CSV and JSON are capped like the aligned table (an answer must fit one gRPC message); JSON is
// written row by row in nlohmann's two-space layout.
TEST_F(StoreTest, QueryOutputInEveryFormatIsCapped) {
  absl::StatusOr<QueryResult> two = store_->reader().ReadOnlyQuery(
      "SELECT 1 AS a, 'x\ny' AS b UNION ALL SELECT 2, NULL");
  ASSERT_TRUE(two.ok()) << two.status();
  absl::StatusOr<std::string> json = FormatQueryResult(*two, "json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(*json, nlohmann::json::parse(*json).dump(2) + "\n");
  EXPECT_EQ(*json, "[\n  {\n    \"a\": 1,\n    \"b\": \"x\\ny\"\n  },\n  {\n    \"a\": 2,\n"
                   "    \"b\": null\n  }\n]\n");
  absl::StatusOr<QueryResult> none = store_->reader().ReadOnlyQuery("SELECT 1 AS a WHERE 0");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*FormatQueryResult(*none, "json"), "[]\n");

  absl::StatusOr<QueryResult> big = store_->reader().ReadOnlyQuery(
      OverIntegers(20, "SELECT x, hex(zeroblob(500000)) AS h FROM c"));
  ASSERT_TRUE(big.ok()) << big.status();
  for (const char* format : {"csv", "json"}) {
    absl::StatusOr<std::string> out = FormatQueryResult(*big, format);
    EXPECT_TRUE(absl::IsResourceExhausted(out.status())) << format << out.status();
    EXPECT_NE(out.status().message().find("the limit is 12582912"), std::string::npos)
        << out.status();
  }
}

TEST_F(StoreTest, QueryResultsFormatAsTableCsvAndJson) {
  absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(
      "SELECT 1 AS a, 2.5 AS b, 'x,\"y\"' AS c, NULL AS d");
  ASSERT_TRUE(r.ok()) << r.status();
  std::map<std::string, std::string> formatted;
  for (const char* format : {"csv", "json", "table"}) {
    absl::StatusOr<std::string> out = FormatQueryResult(*r, format);
    ASSERT_TRUE(out.ok()) << format;
    formatted[format] = *std::move(out);
  }
  EXPECT_EQ(formatted["csv"], "a,b,c,d\n1,2.5,\"x,\"\"y\"\"\",\n");
  nlohmann::json j = nlohmann::json::parse(formatted["json"]);
  EXPECT_EQ(j[0]["a"], 1);
  EXPECT_EQ(j[0]["b"], 2.5);
  EXPECT_TRUE(j[0]["d"].is_null());
  EXPECT_NE(formatted["table"].find("(1 row)"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(FormatQueryResult(*r, "xml").status()));
}

// ---- Series -------------------------------------------------------------------------------------

TEST_F(StoreTest, DownsamplingKeepsTheLastPointAndSpikes) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  const int64_t run = ids.run_ids[0];
  const int32_t attempt = Start(run);
  MetricBatch batch = Batch(run, attempt, 1, 1, 1000);
  batch.steps[499].set_loss(50.0);  // step 500: the maximum
  for (int64_t step : {333, 777}) {
    SpikeEvent& s = batch.spikes.emplace_back();
    s.set_step(step);
    s.set_signal("grad_norm");
    s.set_kind(SPIKE_CATASTROPHIC);
  }
  ASSERT_TRUE(store_->ReportMetrics(batch).ok());

  for (Downsample mode : {Downsample::kStride, Downsample::kMinMax}) {
    SeriesOptions options;
    options.mode = mode;
    options.max_points = 50;
    absl::StatusOr<std::vector<StepMetrics>> series = store_->reader().MetricSeries(run, options);
    ASSERT_TRUE(series.ok()) << series.status();
    std::set<int64_t> steps;
    for (const StepMetrics& m : *series) steps.insert(m.step());
    EXPECT_EQ(steps.size(), series->size());  // sorted, no duplicates
    EXPECT_LE(series->size(), 53u);
    EXPECT_GE(series->size(), 40u);
    EXPECT_EQ(series->back().step(), 1000);
    EXPECT_EQ(steps.count(333), 1u);
    EXPECT_EQ(steps.count(777), 1u);
    EXPECT_TRUE(std::is_sorted(series->begin(), series->end(),
                               [](const StepMetrics& a, const StepMetrics& b) {
                                 return a.step() < b.step();
                               }));
    if (mode == Downsample::kMinMax) {
      EXPECT_EQ(steps.count(500), 1u);  // the peak survives
    }
  }
  SeriesOptions all;
  all.mode = Downsample::kNone;
  EXPECT_EQ(store_->reader().MetricSeries(run, all)->size(), 1000u);
  SeriesOptions window;
  window.from_step = 101;
  window.to_step = 200;
  window.max_points = 10;
  window.mode = Downsample::kStride;
  absl::StatusOr<std::vector<StepMetrics>> part = store_->reader().MetricSeries(run, window);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->front().step(), 101);
  EXPECT_EQ(part->back().step(), 200);
  EXPECT_LE(part->size(), 11u);
}

// ---- Comparison table -----------------------------------------------------------------------------

// Expects `row` to be `variant`'s, over `runs` runs: `n` of them averaged, `diverged` diverged.
void ExpectRowCounts(const ComparisonRow& row, const std::string& variant, int runs, int n,
                     int diverged) {
  EXPECT_EQ(row.variant, variant);
  EXPECT_EQ(row.runs, runs);
  EXPECT_EQ(row.n, n);
  EXPECT_EQ(row.diverged, diverged);
}

TEST_F(StoreTest, ComparisonTableMatchesHandComputedMeanAndStd) {
  SweepIds ids = Submit("table", {"baseline", "g1"}, 3);  // runs: b0 g0 b1 g1 b2 g2
  const double base_loss[] = {3.0, 3.1, 3.2};            // mean 3.1, std 0.1
  const double base_mact[] = {100, 110, 150};            // mean 120, std sqrt(700)
  for (int seed = 0; seed < 3; ++seed) {
    const int64_t b = ids.run_ids[2 * seed];
    Start(b);
    // No gate: no gate score.
    ASSERT_TRUE(Finish(b, SUCCEEDED, base_loss[seed], kNaN, base_mact[seed], 0.3, 0.01 * seed).ok());
  }
  // g1: two succeed (2.9, 3.0), one diverges (its loss is not averaged).
  const double g1_loss[] = {2.9, 3.0};
  for (int seed = 0; seed < 2; ++seed) {
    const int64_t g = ids.run_ids[2 * seed + 1];
    Start(g);
    ASSERT_TRUE(Finish(g, SUCCEEDED, g1_loss[seed], 0.2 + 0.1 * seed, 50, 0.1, 0).ok());
  }
  Start(ids.run_ids[5]);
  ASSERT_TRUE(Finish(ids.run_ids[5], DIVERGED, 99.0, 0.9, 900, 0.9, 0.5).ok());

  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("table");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->rows.size(), 2u);
  const ComparisonRow& base = table->rows[0];
  ExpectRowCounts(base, "baseline", 3, 3, 0);
  EXPECT_NEAR(base.val_loss.mean, 3.1, 1e-12);
  EXPECT_NEAR(base.val_loss.std, 0.1, 1e-12);
  EXPECT_NEAR(base.val_ppl.mean, (std::exp(3.0) + std::exp(3.1) + std::exp(3.2)) / 3, 1e-9);
  EXPECT_TRUE(std::isnan(base.gate_score.mean));
  EXPECT_NEAR(base.m_act.mean, 120, 1e-9);
  EXPECT_NEAR(base.m_act.std, std::sqrt(700.0), 1e-9);
  EXPECT_NEAR(base.f_attn.mean, 0.3, 1e-12);
  EXPECT_NEAR(base.f_attn.std, 0.0, 1e-12);
  EXPECT_NEAR(base.spike_score.mean, 0.01, 1e-12);
  EXPECT_NEAR(base.spike_score.std, 0.01, 1e-12);
  EXPECT_NEAR(base.train_loss.mean, 3.0, 1e-12);
  EXPECT_EQ(base.params_total, 1000000);
  EXPECT_EQ(base.params_added, 0);
  const ComparisonRow& g1 = table->rows[1];
  ExpectRowCounts(g1, "g1", 3, 2, 1);
  EXPECT_NEAR(g1.val_loss.mean, 2.95, 1e-12);
  EXPECT_NEAR(g1.val_loss.std, std::sqrt(0.005), 1e-12);
  EXPECT_NEAR(g1.gate_score.mean, 0.25, 1e-12);
  EXPECT_NEAR(g1.gate_score.std, std::sqrt(0.005), 1e-12);
  EXPECT_EQ(g1.params_added, 1000);

  absl::StatusOr<std::string> markdown = FormatComparisonTable(*table, "markdown");
  ASSERT_TRUE(markdown.ok());
  EXPECT_NE(markdown->find("| baseline | 3 | 3.100 ± 0.100 |"), std::string::npos) << *markdown;
  EXPECT_NE(markdown->find("| 22.27 ± 2.22 | — |"), std::string::npos) << *markdown;  // no gate score
  EXPECT_NE(markdown->find("+1.0K"), std::string::npos) << *markdown;
  absl::StatusOr<std::string> csv = FormatComparisonTable(*table, "csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_NE(csv->find("table,g1,,3,2,1,0,0,2.95"), std::string::npos) << *csv;
  absl::StatusOr<std::string> json = FormatComparisonTable(*table, "json");
  ASSERT_TRUE(json.ok());
  nlohmann::json j = nlohmann::json::parse(*json);
  EXPECT_NEAR(j["rows"][0]["val_loss"]["std"].get<double>(), 0.1, 1e-12);
  EXPECT_EQ(j["rows"][1]["diverged"], 1);

  // The view answers the same one-line question.
  absl::StatusOr<QueryResult> view = store_->reader().ReadOnlyQuery(
      "SELECT val_loss_mean FROM variant_table WHERE sweep = 'table' AND variant = 'g1'");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_NEAR(std::get<double>(view->rows[0][0]), 2.95, 1e-12);
  EXPECT_TRUE(absl::IsNotFound(store_->reader().GetComparisonTable("nope").status()));
}

// Several sweeps of one study make one set of runs, matched by variant, seed and axis point: a
// run with a result stands over one without, and between two alike the later sweep's.
TEST_F(StoreTest, SeveralSweepsMatchRunsByVariantSeedAndAxes) {
  SweepIds one = Submit("phase1", {"baseline", "g1"}, 2);  // b0 g0 b1 g1
  SweepIds two = Submit("phase2", {"g1", "g2"}, 2);        // g0 h0 g1 h1
  const auto finish = [&](int64_t run, double loss) {
    Start(run);
    ASSERT_TRUE(Finish(run, SUCCEEDED, loss, 0.2, 10, 0.1, 0).ok());
  };
  finish(one.run_ids[0], 3.0);
  finish(one.run_ids[1], 2.9);
  finish(one.run_ids[2], 3.1);  // phase1's g1 at seed 1 never trains
  finish(two.run_ids[0], 2.8);
  finish(two.run_ids[1], 3.05);
  finish(two.run_ids[2], 2.85);  // phase2's g2 at seed 1 never trains

  absl::StatusOr<ResultSet> both = store_->reader().ReadResults({{"phase1", "phase2"}, {}});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->label, "phase1+phase2");
  EXPECT_EQ(both->runs.size(), 6u);
  EXPECT_EQ(both->replaced, 2);
  ComparisonTable table = ComparisonTableOf(*both);
  ASSERT_EQ(table.rows.size(), 3u);
  EXPECT_EQ(table.sweep, "phase1+phase2");
  EXPECT_EQ(table.rows[1].variant, "g1");
  EXPECT_EQ(table.rows[1].n, 2);
  EXPECT_NEAR(table.rows[1].val_loss.mean, 2.825, 1e-12);  // phase2's two runs
  EXPECT_EQ(table.rows[2].variant, "g2");
  EXPECT_EQ(table.rows[2].unfinished, 1);

  // Named the other way round, phase1's g1 at seed 0 is the later; its PENDING one at seed 1
  // does not stand over phase2's result.
  absl::StatusOr<ComparisonTable> reversed =
      store_->reader().GetComparisonTable(ResultSelection{{"phase2", "phase1"}, {}});
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_EQ(reversed->rows[0].variant, "g1");
  EXPECT_NEAR(reversed->rows[0].val_loss.mean, 2.875, 1e-12);

  // The same sweep as one table: the variant_table view's numbers.
  absl::StatusOr<ComparisonTable> alone = store_->reader().GetComparisonTable("phase1");
  ASSERT_TRUE(alone.ok());
  absl::StatusOr<QueryResult> view = store_->reader().ReadOnlyQuery(
      "SELECT val_loss_mean, n, unfinished FROM variant_table WHERE sweep = 'phase1' ORDER BY "
      "first_index");
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->rows.size(), alone->rows.size());
  for (size_t i = 0; i < alone->rows.size(); ++i) {
    EXPECT_NEAR(std::get<double>(view->rows[i][0]), alone->rows[i].val_loss.mean, 1e-12);
    EXPECT_EQ(std::get<int64_t>(view->rows[i][1]), alone->rows[i].n);
    EXPECT_EQ(std::get<int64_t>(view->rows[i][2]), alone->rows[i].unfinished);
  }

  // Runs tagged to leave out: one run of phase1, then the whole of phase2 through its sweep.
  AnnotationEdit bugged;
  bugged.sweep_id = one.sweep_id;
  bugged.run_id = one.run_ids[0];  // the baseline at seed 0
  bugged.texts = {"bugged"};
  ASSERT_TRUE(store_->Annotate(bugged).ok());
  absl::StatusOr<ResultSet> kept =
      store_->reader().ReadResults({{"phase1", "phase2"}, {"bugged", "other"}});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->excluded, 1);
  EXPECT_EQ(kept->runs.size(), 5u);
  table = ComparisonTableOf(*kept);
  ASSERT_EQ(table.rows.size(), 3u);
  EXPECT_EQ(table.rows[1].variant, "baseline");  // its first run now is seed 1's, after g1's
  EXPECT_EQ(table.rows[1].n, 1);
  EXPECT_NEAR(table.rows[1].val_loss.mean, 3.1, 1e-12);
  bugged.run_id = 0;
  bugged.sweep_id = two.sweep_id;
  ASSERT_TRUE(store_->Annotate(bugged).ok());
  kept = store_->reader().ReadResults({{"phase1", "phase2"}, {"bugged"}});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->excluded, 5);
  EXPECT_EQ(kept->runs.size(), 3u);  // phase1's but its tagged baseline
  EXPECT_EQ(kept->replaced, 0);

  EXPECT_THAT(store_->reader().ReadResults({{"phase1", "phase1"}, {}}).status().message(),
              ::testing::HasSubstr("sweep phase1 is named twice"));
  EXPECT_TRUE(absl::IsNotFound(store_->reader().ReadResults({{"phase1", "nope"}, {}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->reader().ReadResults({}).status()));
}

// PPL against evaluation length (TrainConfig.eval_seq_lens): each run's last evaluation counts,
// mean ± std over SUCCEEDED seeds per length; the table gains a PPL@L column per length, marked
// when measured with YaRN. Attention maps come back byte for byte.
TEST_F(StoreTest, LengthTableAveragesEachRunsLastEvaluationPerLength) {
  SweepIds ids = Submit("long", {"baseline", "g1"}, 2);  // runs: b0 g0 b1 g1
  auto finish = [&](int64_t run_id, RunState to, double ppl_at_64, double ppl_at_256) {
    Start(run_id);
    MetricBatch early;  // an earlier evaluation with other numbers: not the final one
    early.run_id = run_id;
    early.attempt = 1;
    early.seq = 1;
    EvalResult& e = early.evals.emplace_back();
    e.set_step(500);
    LengthEval* l = e.add_lengths();
    l->set_seq_len(64);
    l->set_val_ppl(1000);
    AttentionMap* m = e.add_attention_maps();
    m->set_layer(1);
    m->set_head(0);
    m->set_size(2);
    m->set_probs(std::string("\xff\x00\x80\x7f", 4));
    ASSERT_TRUE(store_->ReportMetrics(early).ok());
    RunTransition t = testing::MakeTransition(run_id, {RUNNING}, to);
    t.has_summary = true;
    t.summary.set_state(to);
    t.summary.set_steps_done(1000);
    EvalResult* f = t.summary.mutable_final_eval();
    f->set_step(1000);
    f->set_val_loss(1.0);
    f->set_val_ppl(std::exp(1.0));
    for (const auto& [len, ppl] : {std::pair{64, ppl_at_64}, {256, ppl_at_256}}) {
      LengthEval* fl = f->add_lengths();
      fl->set_seq_len(len);
      fl->set_yarn(len > 128);
      fl->set_val_ppl(ppl);
      fl->set_val_loss(std::log(ppl));
    }
    ASSERT_TRUE(store_->TransitionRun(t).ok());
  };
  finish(ids.run_ids[0], SUCCEEDED, 4.0, 6.0);
  finish(ids.run_ids[2], SUCCEEDED, 5.0, 8.0);   // baseline: 4.5 ± 0.7071, 7 ± 1.4142
  finish(ids.run_ids[1], SUCCEEDED, 3.0, 5.0);
  finish(ids.run_ids[3], DIVERGED, 90.0, 90.0);  // not averaged
  ASSERT_TRUE(store_->Flush().ok());

  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("long");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->rows.size(), 2u);
  const std::vector<LengthStat>& base = table->rows[0].lengths;
  ASSERT_EQ(base.size(), 2u);
  EXPECT_EQ(base[0].seq_len, 64);
  EXPECT_FALSE(base[0].yarn);
  EXPECT_EQ(base[0].n, 2);
  EXPECT_NEAR(base[0].val_ppl.mean, 4.5, 1e-12);
  EXPECT_NEAR(base[0].val_ppl.std, std::sqrt(0.5), 1e-12);
  EXPECT_EQ(base[1].seq_len, 256);
  EXPECT_TRUE(base[1].yarn);
  EXPECT_NEAR(base[1].val_ppl.mean, 7.0, 1e-12);
  EXPECT_NEAR(base[1].val_ppl.std, std::sqrt(2.0), 1e-12);
  const std::vector<LengthStat>& g1 = table->rows[1].lengths;
  ASSERT_EQ(g1.size(), 2u);
  EXPECT_EQ(g1[0].n, 1);
  EXPECT_NEAR(g1[0].val_ppl.mean, 3.0, 1e-12);
  EXPECT_TRUE(std::isnan(g1[0].val_ppl.std));

  absl::StatusOr<std::string> markdown = FormatComparisonTable(*table, "markdown");
  ASSERT_TRUE(markdown.ok());
  EXPECT_NE(markdown->find("| PPL@64 | PPL@256 (YaRN) |"), std::string::npos) << *markdown;
  EXPECT_NE(markdown->find("| 4.500 ± 0.707 | 7.000 ± 1.414 |"), std::string::npos) << *markdown;
  EXPECT_NE(markdown->find("| 3.000 | 5.000 |"), std::string::npos) << *markdown;
  absl::StatusOr<std::string> csv = FormatComparisonTable(*table, "csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_NE(csv->find("val_ppl_at_64_mean,val_ppl_at_64_std,val_ppl_at_256_mean"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(*FormatComparisonTable(*table, "json"));
  EXPECT_EQ(j["rows"][0]["lengths"][1]["seq_len"], 256);
  EXPECT_EQ(j["rows"][0]["lengths"][1]["yarn"], true);
  EXPECT_NEAR(j["rows"][0]["lengths"][1]["val_ppl"]["mean"].get<double>(), 7.0, 1e-12);

  // A run's evaluations carry their lengths; the maps come back as stored.
  absl::StatusOr<std::vector<EvalResult>> evals = store_->reader().EvalSeries(ids.run_ids[0], false);
  ASSERT_TRUE(evals.ok()) << evals.status();
  ASSERT_EQ(evals->size(), 2u);
  ASSERT_EQ((*evals)[0].lengths_size(), 1);
  EXPECT_EQ((*evals)[0].lengths(0).val_ppl(), 1000);
  ASSERT_EQ((*evals)[1].lengths_size(), 2);
  EXPECT_EQ((*evals)[1].lengths(1).seq_len(), 256);
  absl::StatusOr<std::vector<AttentionMap>> maps =
      store_->reader().AttentionMapsAt(ids.run_ids[0], 500);
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_EQ(maps->size(), 1u);
  EXPECT_EQ((*maps)[0].layer(), 1);
  EXPECT_EQ((*maps)[0].size(), 2);
  EXPECT_EQ((*maps)[0].probs(), std::string("\xff\x00\x80\x7f", 4));
  EXPECT_TRUE(store_->reader().AttentionMapsAt(ids.run_ids[0], 1000)->empty());
  EXPECT_EQ(Count("SELECT typeof(probs) = 'blob' FROM eval_attention_maps LIMIT 1"), 1);
}

// ---- Failures -----------------------------------------------------------------------------------

TEST_F(StoreTest, ALockedDatabaseFailsClearlyAndRecoversWithoutLoss) {
  StoreOptions options;
  options.busy_timeout = absl::Milliseconds(50);
  const StartedRun started = ReopenRetryingAndStartARun(options);
  const int64_t run = started.run;
  const int32_t attempt = started.attempt;

  // Another process-like connection holds the write lock.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);

  MetricBatch batch = Batch(run, attempt, 1, 1, 500);
  absl::StatusOr<ReportResult> r = store_->ReportMetrics(batch);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("locked"), std::string::npos) << r.status();
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(run, attempt, 2, 501, 500)).ok());
  absl::Status flush = store_->Flush();
  EXPECT_TRUE(absl::IsUnavailable(flush)) << flush;
  EXPECT_GT(store_->Stats().queued_rows, 0);
  EXPECT_FALSE(store_->Stats().last_error.ok());
  // Readers still read while the file is locked.
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 0);

  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  // The writer retries by itself; Flush just waits for it.
  absl::Status ok = absl::UnknownError("not flushed");
  for (int i = 0; i < 100 && !ok.ok(); ++i) ok = store_->Flush();
  ASSERT_TRUE(ok.ok()) << ok;
  // The worker resends the batch it was not acknowledged: a duplicate, stored once.
  absl::StatusOr<ReportResult> resent = store_->ReportMetrics(batch);
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_TRUE(resent->duplicate);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 1000);
  EXPECT_EQ(Count("SELECT count(DISTINCT step) FROM step_metrics"), 1000);
  EXPECT_TRUE(store_->Stats().last_error.ok());
  EXPECT_EQ(IntegrityCheck(), "ok");
}

TEST_F(StoreTest, AFullDiskFailsClearlyKeepsQueuedWritesAndRecovers) {
  const StartedRun started = ReopenRetryingAndStartARun();
  const int64_t run = started.run;
  const int32_t attempt = started.attempt;
  ASSERT_TRUE(store_->ReportMetrics(Batch(run, attempt, 1, 1, 100)).ok());

  // The disk is "full": the database may not grow past its current size.
  ASSERT_TRUE(store_
                  ->RunOnWriterForTesting([](sqlite3* db) {
                    return Exec(db, "PRAGMA max_page_count = 1");  // clamps to the page count
                  })
                  .ok());
  int64_t seq = 2, step = 101;
  absl::Status full;
  for (int i = 0; i < 50 && full.ok(); ++i) {
    absl::StatusOr<ReportResult> r = store_->ReportMetrics(Batch(run, attempt, seq++, step, 1000));
    step += 1000;
    full = r.status();
  }
  ASSERT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("full"), std::string::npos) << full;
  // More writes are still accepted into the queue meanwhile.
  ASSERT_TRUE(store_->EnqueueEvent(started.sweep_id, run, "note",
                                   "queued while the disk was full").ok());
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(run, attempt, seq++, step, 1000)).ok());
  step += 1000;
  EXPECT_TRUE(absl::IsResourceExhausted(store_->Flush()));
  // A synchronous transition fails clearly and is not applied later behind the caller's back.
  RunTransition t = testing::MakeTransition(run, {RUNNING}, SUCCEEDED);
  EXPECT_TRUE(absl::IsResourceExhausted(store_->TransitionRun(t).status()));

  // Space frees up.
  ASSERT_TRUE(store_
                  ->RunOnWriterForTesting([](sqlite3* db) {
                    return Exec(db, "PRAGMA max_page_count = 1073741823");
                  })
                  .ok());
  absl::Status ok = absl::UnknownError("not flushed");
  for (int i = 0; i < 100 && !ok.ok(); ++i) ok = store_->Flush();
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), step - 1);
  EXPECT_EQ(Count("SELECT max(step) FROM step_metrics"), step - 1);
  EXPECT_EQ(Count("SELECT report_seq FROM attempts"), seq - 1);
  EXPECT_EQ(Count("SELECT count(*) FROM runs WHERE state = 'RUNNING'"), 1);
  // The queued event went in once; the refused transition left none.
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE kind = 'note'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE message LIKE '%RUNNING -> SUCCEEDED%'"), 0);
  EXPECT_EQ(IntegrityCheck(), "ok");
  ASSERT_TRUE(store_->TransitionRun(t).ok());
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE message LIKE '%RUNNING -> SUCCEEDED%'"), 1);
}

TEST_F(StoreTest, ReadersAreNotBlockedByALongWriteTransaction) {
  SweepIds ids = Submit("s", {"baseline"}, 1);
  absl::Notification in_transaction, release;
  std::thread writer([&] {
    absl::Status s = store_->RunOnWriterForTesting([&](sqlite3* db) {
      absl::Status status = Exec(db, "BEGIN IMMEDIATE");
      if (!status.ok()) return status;
      status = Exec(db, "INSERT INTO events (time, kind, message) VALUES (0, 'x', 'uncommitted')");
      in_transaction.Notify();
      release.WaitForNotification();
      Exec(db, "COMMIT").IgnoreError();
      return status;
    });
    EXPECT_TRUE(s.ok()) << s;
  });
  in_transaction.WaitForNotification();
  const absl::Time start = absl::Now();
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE kind = 'x'"), 0);  // the last snapshot
  EXPECT_EQ(Count("SELECT count(*) FROM runs"), 1);
  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("s");
  EXPECT_TRUE(table.ok()) << table.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  release.Notify();
  writer.join();
  EXPECT_EQ(Count("SELECT count(*) FROM events WHERE kind = 'x'"), 1);
}

TEST_F(StoreTest, ManyConcurrentReportersLoseNothing) {
  SweepIds ids = Submit("s", {"baseline", "g1"}, 4);
  std::vector<std::thread> threads;
  for (int64_t run : ids.run_ids) {
    const int32_t attempt = Start(run);
    threads.emplace_back([this, run, attempt] {
      for (int seq = 1; seq <= 10; ++seq) {
        absl::StatusOr<ReportResult> r =
            store_->ReportMetrics(Batch(run, attempt, seq, (seq - 1) * 100 + 1, 100));
        EXPECT_TRUE(r.ok()) << r.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics"), 8 * 1000);
  EXPECT_EQ(Count("SELECT count(*) FROM latest_metrics WHERE step = 1000"), 8);
  EXPECT_EQ(Count("SELECT sum(steps_done) FROM sweep_progress"), 8000);
}

}  // namespace
}  // namespace ablate
