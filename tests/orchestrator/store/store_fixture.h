// The store tests' fixtures, each a fresh store of its own (FreshTestDir(name)/ablate.db) removed
// after the test: StoreFixture, for the tests that fill it through the Store API
// (tests/orchestrator/store/test_sweeps.h); StoreTest, one with the helpers the store's own tests
// share (sweeps, runs started, batches, old files to migrate, counts), for schema_test.cc,
// writer_test.cc, query_test.cc and reader_test.cc.
#ifndef ABLATE_TESTS_ORCHESTRATOR_STORE_STORE_FIXTURE_H_
#define ABLATE_TESTS_ORCHESTRATOR_STORE_STORE_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/store.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/test_dir.h"

namespace ablate {
namespace testing {

class StoreFixture : public ::testing::Test {
 protected:
  // Opens a fresh store, FreshTestDir(name)/ablate.db; call first in SetUp (a failure ends the
  // test there).
  void OpenFreshStore(const std::string& name) {
    dir_ = FreshTestDir(name).string();
    path_ = dir_ + "/ablate.db";
    Reopen();
  }
  // OpenFreshStore(name), then creates `sweep` in it, its ids in `ids`.
  void OpenStore(const std::string& name, const SweepRecord& sweep, SweepIds* ids) {
    OpenFreshStore(name);
    if (HasFatalFailure()) return;
    CreateSweep(sweep, ids);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Closes the store and opens its file again with `options`.
  void Reopen(StoreOptions options = {}) {
    store_.reset();
    options.path = path_;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  // Creates `sweep` in the store, its ids in `ids` (a failure ends the test there).
  void CreateSweep(const SweepRecord& sweep, SweepIds* ids) {
    absl::StatusOr<SweepIds> created = store_->CreateSweep(sweep);
    ASSERT_TRUE(created.ok()) << created.status();
    *ids = *created;
  }

  std::string dir_;
  std::string path_;  // dir_/ablate.db
  std::unique_ptr<Store> store_;
};

}  // namespace testing

class StoreTest : public testing::StoreFixture {
 protected:
  void SetUp() override { OpenFreshStore("store_test"); }

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

  // Submits a sweep "s" of one run and starts it: the sweep, the run and its attempt.
  struct StartedRun {
    int64_t sweep_id;
    int64_t run;
    int32_t attempt;
  };
  StartedRun StartARun() {
    SweepIds ids = Submit("s", {"baseline"}, 1);
    const int64_t run = ids.run_ids[0];
    return {ids.sweep_id, run, Start(run)};
  }

  // Reopens the store with `options` and failed writes retried within 20 to 50 ms (so that a test
  // of failing writes sees the writer retry promptly), then StartARun().
  StartedRun ReopenRetryingAndStartARun(StoreOptions options = {}) {
    options.retry_min = absl::Milliseconds(20);
    options.retry_max = absl::Milliseconds(50);
    Reopen(options);
    return StartARun();
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
    if (!std::isnan(gate))
      t.summary.mutable_final_eval()->mutable_probes()->set_gate_score_mean(gate);
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
  // Count() of the rows of `table` whose `column` is `id` and, unless empty, that meet `also`.
  int64_t CountWhere(const std::string& table, const std::string& column, int64_t id,
                     const std::string& also = "") {
    return Count(absl::StrCat("SELECT count(*) FROM ", table, " WHERE ", column, " = ", id,
                              also.empty() ? "" : " AND ", also));
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
};

}  // namespace ablate

#endif  // ABLATE_TESTS_ORCHESTRATOR_STORE_STORE_FIXTURE_H_
