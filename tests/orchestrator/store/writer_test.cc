// The store's batching writer over real SQLite files: ingestion (idempotent, durable, the WAL
// checkpointed), the run state machine (a run completes once), and failures (a locked database,
// a full disk, concurrent readers and reporters).
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

// ---- Ingestion ------------------------------------------------------------------------------------

// A batch's rows go in several to a statement: every row lands whole, in its own row, and a
// step a batch repeats keeps its last value, as one statement per row did.
TEST_F(StoreTest, EveryRowOfALongBatchIsStoredWithItsOwnValues) {
  const auto [sweep_id, run, attempt] = StartARun();
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
                  "attempt = 1 AND lr = 3e-3 AND tokens_per_s = 1e5"),
            70);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step = 41 AND loss = -1"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step = 34 AND loss = -2"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM step_metrics WHERE step NOT IN (34, 41) AND "
                  "abs(loss - (5.0 - 0.001 * step)) < 1e-12"),
            68);
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
  ASSERT_TRUE(
      testing::WaitFor([&] { return store_->Stats().checkpoints >= 1; }, std::chrono::seconds(30)));
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
  const auto [sweep_id, run, attempt] = StartARun();
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
  const auto [sweep_id, run, attempt] = StartARun();
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
                  "'%RUNNING -> %' OR message LIKE '%-> RUNNING%'"),
            2);  // PENDING -> RUNNING and the one finish
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
  EXPECT_EQ(CountWhere("step_metrics", "run_id", a), 3);
  EXPECT_EQ(CountWhere("runs", "id", a, "state = 'SUCCEEDED'"), 1);
  EXPECT_EQ(CountWhere("runs", "id", b, "state = 'RUNNING' AND attempts = 1"), 1);

  // The next run was cancelled meanwhile: its start is undone alone; the end commits.
  RunTransition cancel = testing::MakeTransition(c, {PENDING}, CANCELLED);
  ASSERT_TRUE(store_->TransitionRun(cancel).ok());
  write.batch = Batch(b, 1, 1, 1, 2);
  write.end = end_of(b);
  write.start = start_of(c);
  r = store_->FinishAttempt(write);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(r->start_status)) << r->start_status;
  EXPECT_EQ(CountWhere("runs", "id", b, "state = 'SUCCEEDED'"), 1);
  EXPECT_EQ(CountWhere("runs", "id", c, "state = 'CANCELLED' AND attempts = 0"), 1);
  EXPECT_EQ(CountWhere("step_metrics", "run_id", b), 2);

  // An end that cannot happen (b finished already) fails the whole write: its batch is not
  // stored and the next run does not start.
  write.batch = Batch(b, 1, 2, 3, 1);
  write.end = end_of(b);
  write.start = start_of(ids.run_ids[3]);
  r = store_->FinishAttempt(write);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_EQ(CountWhere("step_metrics", "run_id", b), 2);
  EXPECT_EQ(CountWhere("runs", "id", ids.run_ids[3], "state = 'PENDING'"), 1);
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
  EXPECT_EQ(CountWhere("step_metrics", "run_id", a), 10);
  EXPECT_EQ(CountWhere("step_metrics", "run_id", b), 3);
  EXPECT_EQ(CountWhere("runs", "id", b, "state = 'SUCCEEDED'"), 1);
  EXPECT_EQ(CountWhere("runs", "id", c, "state = 'CANCELLED' AND attempts = 0"), 1);
  EXPECT_EQ(CountWhere("attempts", "run_id", c), 0);
  // Applied twice, stored once: one event per transition of b (its start, its end).
  EXPECT_EQ(CountWhere("events", "run_id", b), 2);

  // A queued batch and a transition that cannot happen: the transition is refused alone.
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(a, 1, 3, 11, 5), nullptr).ok());
  RunTransition wrong = testing::MakeTransition(a, {PENDING}, RUNNING);
  absl::StatusOr<TransitionResult> refused = store_->TransitionRun(wrong);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  after = store_->Stats();
  EXPECT_EQ(after.reapplied_flushes, 2);
  EXPECT_EQ(after.dropped_writes - before.dropped_writes, 1);
  EXPECT_EQ(CountWhere("step_metrics", "run_id", a), 15);
  EXPECT_EQ(Count(absl::StrCat("SELECT attempts FROM runs WHERE id = ", a)), 1);

  // Writes that all succeed are applied once.
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(a, 1, 4, 16, 5), nullptr).ok());
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(store_->Stats().reapplied_flushes, 2);
  EXPECT_EQ(IntegrityCheck(), "ok");
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
  ASSERT_TRUE(
      store_->EnqueueEvent(started.sweep_id, run, "note", "queued while the disk was full").ok());
  ASSERT_TRUE(store_->EnqueueMetrics(Batch(run, attempt, seq++, step, 1000)).ok());
  step += 1000;
  EXPECT_TRUE(absl::IsResourceExhausted(store_->Flush()));
  // A synchronous transition fails clearly and is not applied later behind the caller's back.
  RunTransition t = testing::MakeTransition(run, {RUNNING}, SUCCEEDED);
  EXPECT_TRUE(absl::IsResourceExhausted(store_->TransitionRun(t).status()));

  // Space frees up.
  ASSERT_TRUE(store_
                  ->RunOnWriterForTesting(
                      [](sqlite3* db) { return Exec(db, "PRAGMA max_page_count = 1073741823"); })
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
