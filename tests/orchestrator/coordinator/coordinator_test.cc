// The coordinator over real gRPC (a server on port 0, loopback) and a real SQLite file; fake
// workers drive the WorkerService stubs in-process. Time is a fake clock: lease expiry and
// retry backoff are tested by advancing it, not by sleeping.
#include "tests/orchestrator/coordinator/coordinator_test_util.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "proto/grpc_status.h"
#include "tests/sim_worker.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;

class CoordinatorTest : public CoordinatorFixture {};

TEST_F(CoordinatorTest, WorkerRunsAJobReportsIdempotentlyAndFinishesOnce) {
  SubmitResponse submitted = SubmitQuick();
  EXPECT_EQ(submitted.runs(), 4);
  EXPECT_EQ(submitted.queued(), 4);
  EXPECT_EQ(submitted.reused(), 0);

  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  ASSERT_GT(job.run_id(), 0);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.resume_from_step(), 0);
  EXPECT_EQ(job.variant(), "baseline");  // run order
  EXPECT_THAT(job.checkpoint_dir(), HasSubstr("/checkpoints/run-"));
  EXPECT_EQ(job.config().train().steps(), 200);

  ReportRequest report = MakeReport(worker, job, 1, {1, 2, 3});
  ReportResponse reply;
  ASSERT_TRUE(CallReport(report, &reply).ok());
  EXPECT_FALSE(reply.duplicate());
  EXPECT_EQ(reply.directive(), DIRECTIVE_CONTINUE);
  // The same batch again (the worker missed the reply): acknowledged, stored once.
  ASSERT_TRUE(CallReport(report, &reply).ok());
  EXPECT_TRUE(reply.duplicate());
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + std::to_string(job.run_id())), 3);

  ASSERT_TRUE(CallFinish(worker, job, SUCCEEDED).ok());
  // A retried Finish (lost reply) is acknowledged; the run completed once.
  ASSERT_TRUE(CallFinish(worker, job, SUCCEEDED).ok());
  EXPECT_EQ(CountRows("attempts WHERE run_id = " + std::to_string(job.run_id())), 1);
  EXPECT_EQ(StateOf(job.run_id()), SUCCEEDED);
  // A different outcome for the finished attempt is refused.
  EXPECT_EQ(CallFinish(worker, job, FAILED).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // And reports after the finish are refused: the worker stops.
  report.set_seq(2);
  EXPECT_EQ(CallReport(report, &reply).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// A worker that found its checkpoint unreadable says so in a report: one event in the run's log,
// not one per resend of the batch.
TEST_F(CoordinatorTest, AWorkersNoticeIsStoredOnceAsARunEvent) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  ReportRequest report = MakeReport(worker, job, 1, {1, 2});
  report.add_notices("checkpoint.pt: unreadable checkpoint: moved aside; resumed from step 0");
  ReportResponse reply;
  ASSERT_TRUE(CallReport(report, &reply).ok());
  ASSERT_TRUE(CallReport(report, &reply).ok());
  EXPECT_TRUE(reply.duplicate());
  EXPECT_EQ(CountRows("events WHERE kind = 'worker_notice' AND run_id = " +
                      std::to_string(job.run_id()) + " AND message = 'run " +
                      std::to_string(job.run_id()) + " attempt 1: checkpoint.pt: unreadable " +
                      "checkpoint: moved aside; resumed from step 0' AND sweep_id IS NOT NULL"),
            1);
}

TEST_F(CoordinatorTest, FinishStoresTheLastBatchAndHandsOverTheNextJob) {
  SubmitQuick();  // 4 runs
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  ReportResponse reply;
  ASSERT_TRUE(CallReport(MakeReport(worker, job, 1, {1, 2}), &reply).ok());

  FinishRequest finish = MakeFinish(worker, job, SUCCEEDED);
  // The last batch rides in the Finish; its ids may be left 0 (they are the Finish's).
  *finish.mutable_final_report() = MakeReport(0, Job(), 2, {3, 4, 5});
  finish.set_acquire_next(true);
  FinishResponse response;
  ASSERT_TRUE(CallFinish(finish, &response).ok());
  const std::string run = std::to_string(job.run_id());
  EXPECT_EQ(StateOf(job.run_id()), SUCCEEDED);
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + run), 5);
  ASSERT_TRUE(response.has_next_job());
  const Job next = response.next_job();
  EXPECT_NE(next.run_id(), job.run_id());
  EXPECT_EQ(next.attempt(), 1);
  EXPECT_EQ(next.config().train().steps(), 200);
  EXPECT_EQ(StateOf(next.run_id()), RUNNING);
  EXPECT_EQ(
      Scalar("SELECT worker_id FROM attempts WHERE run_id = " + std::to_string(next.run_id())),
      std::to_string(worker));

  // The same Finish again (its reply was lost): acknowledged, nothing stored twice, and no
  // second job is leased.
  FinishResponse again;
  ASSERT_TRUE(CallFinish(finish, &again).ok());
  EXPECT_FALSE(again.has_next_job());
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + run), 5);
  EXPECT_EQ(CountRows("attempts WHERE run_id = " + run), 1);
  EXPECT_EQ(CountRows("runs WHERE state = 'RUNNING'"), 1);

  // The handed-over job holds a real lease: it reports, and the chain drains the sweep.
  ASSERT_TRUE(CallReport(MakeReport(worker, next, 1, {1}), &reply).ok());
  Job current = next;
  for (int i = 0; i < 3; ++i) {
    FinishRequest f = MakeFinish(worker, current, SUCCEEDED);
    f.set_acquire_next(true);
    FinishResponse r;
    ASSERT_TRUE(CallFinish(f, &r).ok());
    EXPECT_EQ(r.has_next_job(), i < 2) << i;  // the last Finish finds the queue empty
    if (r.has_next_job()) current = r.next_job();
  }
  EXPECT_EQ(CountRows("runs WHERE state = 'SUCCEEDED' AND attempts = 1"), 4);
  EXPECT_EQ(Scalar("SELECT state FROM sweeps WHERE name = 'quick'"), "DONE");
}

TEST_F(CoordinatorTest, FailedFinishAlsoHandsOverTheNextJob) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  FinishRequest finish = MakeFinish(worker, job, FAILED, "out of memory");
  *finish.mutable_final_report() = MakeReport(worker, job, 1, {1, 2});
  finish.set_acquire_next(true);
  FinishResponse response;
  ASSERT_TRUE(CallFinish(finish, &response).ok());
  EXPECT_EQ(StateOf(job.run_id()), PENDING);  // retried after its backoff
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + std::to_string(job.run_id())), 2);
  ASSERT_TRUE(response.has_next_job());
  EXPECT_NE(response.next_job().run_id(), job.run_id());
  EXPECT_EQ(StateOf(response.next_job().run_id()), RUNNING);
}

TEST_F(CoordinatorTest, FinishWithABadFinalReportIsRefusedAndChangesNothing) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  const std::string run = std::to_string(job.run_id());
  FinishResponse response;

  FinishRequest other_run = MakeFinish(worker, job, SUCCEEDED);
  *other_run.mutable_final_report() = MakeReport(worker, job, 1, {1});
  other_run.mutable_final_report()->set_run_id(job.run_id() + 1);
  other_run.set_acquire_next(true);
  grpc::Status s = CallFinish(other_run, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("final_report is of worker"));

  FinishRequest seq0 = MakeFinish(worker, job, SUCCEEDED);
  *seq0.mutable_final_report() = MakeReport(worker, job, 0, {1});
  s = CallFinish(seq0, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("final_report.seq must be >= 1"));

  // A batch the store refuses (seq 1 again, after batch 1 was applied) is a duplicate, not an
  // error: acknowledged, stored once, and the run finishes.
  ReportResponse reply;
  ASSERT_TRUE(CallReport(MakeReport(worker, job, 1, {1}), &reply).ok());
  EXPECT_EQ(StateOf(job.run_id()), RUNNING);
  EXPECT_EQ(CountRows("runs WHERE state = 'RUNNING'"), 1);  // no next job was leased
  FinishRequest dup = MakeFinish(worker, job, SUCCEEDED);
  *dup.mutable_final_report() = MakeReport(worker, job, 1, {1});
  ASSERT_TRUE(CallFinish(dup, &response).ok());
  EXPECT_FALSE(response.has_next_job());  // not asked for
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + run), 1);
  EXPECT_EQ(StateOf(job.run_id()), SUCCEEDED);
}

TEST_F(CoordinatorTest, LostLeaseRequeuesWithBackoffAndResumesFromCheckpoint) {
  SubmitQuick();
  const int64_t w1 = RegisterWorker("w1");
  Job job = Acquire(w1);
  ReportRequest report = MakeReport(w1, job, 1, {49, 50});
  report.set_checkpoint_step(50);
  report.set_checkpoint_path(job.checkpoint_dir() + "/step-50.pt");
  ReportResponse reply;
  ASSERT_TRUE(CallReport(report, &reply).ok());

  clock_.Advance(absl::Seconds(20));
  EXPECT_EQ(server_->core()->CheckLeases(), 0);  // renewed by the report
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(server_->core()->CheckLeases(), 1);
  EXPECT_EQ(StateOf(job.run_id()), PENDING);
  EXPECT_EQ(Scalar("SELECT state FROM attempts WHERE run_id = " + std::to_string(job.run_id()) +
                   " AND attempt = 1"),
            "LOST");
  // The lost worker's late report is refused, and stored nothing.
  report.set_seq(2);
  report.clear_steps();
  *report.add_steps() = StepMetrics();
  report.mutable_steps(0)->set_step(51);
  EXPECT_EQ(CallReport(report, &reply).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + std::to_string(job.run_id())), 2);

  // Backoff: 5 s before the run is handed out again; meanwhile the next run goes first.
  const int64_t w2 = RegisterWorker("w2");
  Job other = Acquire(w2);
  EXPECT_NE(other.run_id(), job.run_id());
  ASSERT_TRUE(CallFinish(w2, other, SUCCEEDED).ok());  // w2 has one slot
  clock_.Advance(absl::Seconds(5));
  Job again = Acquire(w2);
  EXPECT_EQ(again.run_id(), job.run_id());
  EXPECT_EQ(again.attempt(), 2);
  EXPECT_EQ(again.resume_from_step(), 50);
  EXPECT_EQ(again.checkpoint_dir(), job.checkpoint_dir());
}

TEST_F(CoordinatorTest, HeartbeatRenewsTheLeaseAndCarriesNoMetrics) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  ReportResponse reply;
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(25));
    ASSERT_TRUE(CallReport(MakeReport(worker, job, 0, {}), &reply).ok());
    EXPECT_EQ(server_->core()->CheckLeases(), 0);
  }
  EXPECT_EQ(CallReport(MakeReport(worker, job, 0, {1}), &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(StateOf(job.run_id()), RUNNING);
}

TEST_F(CoordinatorTest, CancelMidRunStopsTheWorker) {
  SubmitResponse submitted = SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  CancelResponse cancelled;
  ASSERT_TRUE(CallCancel("quick", &cancelled).ok());
  EXPECT_EQ(cancelled.cancelled(), 4);  // 3 pending + the running one (stopping)
  ReportResponse reply;
  ASSERT_TRUE(CallReport(MakeReport(worker, job, 1, {1}), &reply).ok());
  EXPECT_EQ(reply.directive(), DIRECTIVE_STOP);
  ASSERT_TRUE(CallFinish(worker, job, CANCELLED).ok());
  EXPECT_EQ(StateOf(job.run_id()), CANCELLED);
  EXPECT_EQ(CountRows("runs WHERE state = 'CANCELLED'"), 4);
  EXPECT_EQ(Scalar("SELECT state FROM sweeps"), "CANCELLED");
  EXPECT_FALSE(TryAcquire(worker).has_job());
}

TEST_F(CoordinatorTest, RerunFailedRequeuesFailedAndCancelledNeverDiverged) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job diverged = Acquire(worker);
  ASSERT_TRUE(CallFinish(worker, diverged, DIVERGED).ok());
  // The next run fails three times (max_attempts): FAILED. DIVERGED was never retried.
  Job failing = Acquire(worker);
  const int64_t failing_id = failing.run_id();
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_EQ(failing.attempt(), attempt);
    ASSERT_TRUE(CallFinish(worker, failing, FAILED, "out of memory").ok());
    if (attempt < 3) {
      EXPECT_EQ(StateOf(failing.run_id()), PENDING);
      clock_.Advance(absl::Seconds(5 << (attempt - 1)));
      failing = Acquire(worker);
      ASSERT_EQ(failing.run_id(), failing_id);
    }
  }
  EXPECT_EQ(StateOf(failing.run_id()), FAILED);
  EXPECT_EQ(StateOf(diverged.run_id()), DIVERGED);
  CancelResponse cancelled;
  ASSERT_TRUE(CallCancel("quick", &cancelled).ok());
  EXPECT_EQ(cancelled.cancelled(), 2);

  RerunResponse rerun_reply;
  ASSERT_TRUE(CallRerunFailed("quick", &rerun_reply).ok());
  EXPECT_EQ(rerun_reply.queued(), 3);  // FAILED + 2 CANCELLED
  EXPECT_EQ(StateOf(diverged.run_id()), DIVERGED);
  EXPECT_EQ(StateOf(failing.run_id()), PENDING);
  EXPECT_EQ(Scalar("SELECT state FROM sweeps"), "ACTIVE");
  // The rerun run gets fresh retries: attempt 4 failing is queued again, not FAILED.
  Job retried = Acquire(worker);
  EXPECT_EQ(retried.run_id(), failing.run_id());
  EXPECT_EQ(retried.attempt(), 4);
  ASSERT_TRUE(CallFinish(worker, retried, FAILED, "again").ok());
  EXPECT_EQ(StateOf(failing.run_id()), PENDING);
}

TEST_F(CoordinatorTest, DuplicateSubmissionIsDeduplicated) {
  SubmitResponse first = SubmitQuick();
  SubmitResponse again = SubmitQuick();
  EXPECT_EQ(again.sweep_id(), first.sweep_id());
  EXPECT_EQ(again.queued(), 0);
  EXPECT_EQ(again.reused(), 0);  // nothing was reused: the sweep is the same one
  EXPECT_TRUE(again.already_exists());
  EXPECT_FALSE(first.already_exists());
  EXPECT_EQ(CountRows("runs"), 4);
  EXPECT_EQ(CountRows("sweeps"), 1);

  // Train them all; a new sweep with the same runs reuses the results.
  const int64_t worker = RegisterWorker("w1");
  for (int i = 0; i < 4; ++i) {
    Job job = Acquire(worker);
    ReportResponse reply;
    ASSERT_TRUE(CallReport(MakeReport(worker, job, 1, {1, 2, 3}), &reply).ok());
    ASSERT_TRUE(CallFinish(worker, job, SUCCEEDED).ok());
  }
  SubmitResponse renamed = Submit(QuickSpec("quick_again"), "again.yaml", false);
  EXPECT_EQ(renamed.queued(), 0);
  EXPECT_EQ(renamed.reused(), 4);
  GetSweepResponse sweep = GetSweep("quick_again");
  ASSERT_EQ(sweep.runs_size(), 4);
  for (const RunStatus& run : sweep.runs()) {
    EXPECT_EQ(run.state(), SUCCEEDED);
    EXPECT_GT(run.reused_from(), 0);
    EXPECT_DOUBLE_EQ(run.val_loss(), 2.5);
  }
  EXPECT_EQ(sweep.sweep().state(), "DONE");
  EXPECT_FALSE(TryAcquire(worker).has_job());
  // A reused run shows its source's curve, and its latest loss.
  const RunStatus& reused = sweep.runs(0);
  absl::StatusOr<std::vector<StepMetrics>> curve =
      server_->store()->reader().MetricSeries(reused.run_id());
  ASSERT_TRUE(curve.ok()) << curve.status();
  EXPECT_EQ(curve->size(), 3u);
  EXPECT_GT(reused.last_loss(), 0);
  EXPECT_EQ(CountRows(absl::StrCat("runs WHERE id = ", reused.run_id(),
                                   " AND reused_from = ", reused.reused_from())),
            1);
  // --force trains them again.
  SubmitResponse forced = Submit(QuickSpec("quick_forced"), "forced.yaml", true);
  EXPECT_EQ(forced.queued(), 4);
  EXPECT_EQ(forced.reused(), 0);
}

TEST_F(CoordinatorTest, BadInputIsAClearErrorAndChangesNothing) {
  SubmitQuick();
  const std::string before = DatabaseDigest();

  SubmitResponse reply;
  grpc::Status s = TrySubmit(
      "sweep: bad\nbase:\n  model: {d_model: 64, num_heads: 5}\nvariants:\n"
      "  - baseline\n  - no_such_preset\n",
      "bad.yaml", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("bad.yaml:6"));

  s = TrySubmit(std::string(2 << 20, '#'), "bad.yaml", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Another spec under an existing sweep's name.
  std::string text = QuickSpec("quick");
  text.replace(text.find("seeds: [0]"), 10, "seeds: [7]");
  s = TrySubmit(text, "clash.yaml", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);

  for (const char* method : {"get", "cancel", "rerun", "table", "watch"}) {
    EXPECT_EQ(CallWithSweep(method, "no_such_sweep").error_code(), grpc::StatusCode::NOT_FOUND)
        << method;
  }

  for (const char* sql : {"DELETE FROM runs", "UPDATE runs SET state = 'FAILED'", "DROP TABLE runs",
                          "INSERT INTO sweeps (name, created_at) VALUES "
                          "('x', 0)",
                          "SELECT 1; DELETE FROM runs", "PRAGMA user_version = 9"}) {
    QueryRequest q;
    q.set_sql(sql);
    QueryResponse out;
    auto ctx = Context();
    s = client_->Query(ctx.get(), q, &out);
    EXPECT_FALSE(s.ok()) << sql;
    EXPECT_FALSE(s.error_message().empty()) << sql;
  }
  QueryRequest q;
  q.set_sql("DELETE FROM runs");
  QueryResponse out;
  auto ctx = Context();
  s = client_->Query(ctx.get(), q, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("not allowed"));
  EXPECT_EQ(DatabaseDigest(), before);

  // A worker's oversized batch and a bad finish state.
  const int64_t worker = RegisterWorker("w1");
  Job job = Acquire(worker);
  ReportRequest huge = MakeReport(worker, job, 1, {});
  for (int i = 1; i <= 300000; ++i) huge.add_steps()->set_step(i);
  ReportResponse r;
  EXPECT_EQ(CallReport(huge, &r).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(CallFinish(worker, job, PENDING).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Nothing above changed the results (the acquire started an attempt: compare the rest).
  EXPECT_EQ(CountRows("step_metrics"), 0);
  EXPECT_EQ(CountRows("sweeps"), 1);
  EXPECT_EQ(CountRows("runs"), 4);
}

TEST_F(CoordinatorTest, EveryMethodNeedsTheToken) {
  struct stat st;
  ASSERT_EQ(::stat((state_dir_ + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(server_->credentials().admin.size(), 64u);

  for (const std::string& token : {std::string(), std::string("wrong")}) {
    grpc::ClientContext c1, c2, c3;
    for (grpc::ClientContext* c : {&c1, &c2, &c3}) {
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    }
    ListSweepsResponse sweeps;
    EXPECT_EQ(client_->ListSweeps(&c1, ListSweepsRequest(), &sweeps).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    RegisterRequest reg;
    reg.set_name("intruder");
    RegisterResponse reg_reply;
    EXPECT_EQ(worker_->Register(&c2, reg, &reg_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    QueryRequest q;
    q.set_sql("SELECT 1");
    QueryResponse out;
    EXPECT_EQ(client_->Query(&c3, q, &out).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(CountRows("workers"), 0);
}

TEST_F(CoordinatorTest, RestartKeepsReportingWorkersAndNeverCompletesTwice) {
  SubmitQuick();
  const int64_t w1 = RegisterWorker("w1");
  const int64_t w2 = RegisterWorker("w2");
  Job kept = Acquire(w1);
  Job dropped = Acquire(w2);
  ReportResponse reply;
  ASSERT_TRUE(CallReport(MakeReport(w1, kept, 1, {1, 2}), &reply).ok());
  ASSERT_TRUE(CallReport(MakeReport(w2, dropped, 1, {1}), &reply).ok());

  Restart();  // same state dir and token, new port
  // w1 keeps reporting on the new coordinator and keeps its job; its resent batch is a duplicate.
  ASSERT_TRUE(CallReport(MakeReport(w1, kept, 1, {1, 2}), &reply).ok());
  EXPECT_TRUE(reply.duplicate());
  clock_.Advance(absl::Seconds(20));
  ASSERT_TRUE(CallReport(MakeReport(w1, kept, 2, {3}), &reply).ok());
  clock_.Advance(absl::Seconds(11));
  // w2 went silent: its lease (fresh from the restart) is lost and the run queued again.
  EXPECT_EQ(server_->core()->CheckLeases(), 1);
  EXPECT_EQ(StateOf(dropped.run_id()), PENDING);
  EXPECT_EQ(StateOf(kept.run_id()), RUNNING);
  ASSERT_TRUE(CallFinish(w1, kept, SUCCEEDED).ok());
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + std::to_string(kept.run_id())), 3);

  Restart();
  // Nothing completes twice: the finished run stays finished with one attempt.
  ASSERT_TRUE(CallFinish(w1, kept, SUCCEEDED).ok());  // an idempotent retry
  EXPECT_EQ(CountRows("attempts WHERE run_id = " + std::to_string(kept.run_id())), 1);
  EXPECT_EQ(CountRows("events WHERE kind = 'run_state' AND run_id = " +
                      std::to_string(kept.run_id()) + " AND message LIKE '%-> SUCCEEDED%'"),
            1);
  // The requeued run and the two never started are all dispatched, each once.
  clock_.Advance(absl::Seconds(10));
  std::set<int64_t> handed_out;
  for (int i = 0; i < 3; ++i) {
    const Job job = Acquire(w1);
    handed_out.insert(job.run_id());
    ASSERT_TRUE(CallFinish(w1, job, SUCCEEDED).ok());  // w1 has one slot
  }
  EXPECT_EQ(handed_out.size(), 3u);
  EXPECT_TRUE(handed_out.count(dropped.run_id()));
  EXPECT_FALSE(TryAcquire(w1).has_job());
}

TEST_F(CoordinatorTest, WatchStreamsProgressSpikesAndEndsWithTheSweep) {
  SubmitQuick();
  std::vector<WatchEvent> events;
  grpc::Status watch_status;
  std::thread watcher([&] {
    auto ctx = Context(std::chrono::seconds(30));
    WatchRequest request;
    request.set_sweep("quick");
    request.set_include_steps(true);
    auto reader = client_->Watch(ctx.get(), request);
    WatchEvent e;
    while (reader->Read(&e)) events.push_back(e);
    watch_status = reader->Finish();
  });
  const int64_t worker = RegisterWorker("w1");
  for (int i = 0; i < 4; ++i) {
    Job job = Acquire(worker);
    ReportRequest report = MakeReport(worker, job, 1, {1, 2});
    if (i == 1) AddLossSpike(&report, 2, 40, 3, SPIKE_CATASTROPHIC);
    ReportResponse reply;
    ASSERT_TRUE(CallReport(report, &reply).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // let the watch see it
    ASSERT_TRUE(CallFinish(worker, job, i == 1 ? DIVERGED : SUCCEEDED).ok());
  }
  watcher.join();
  ASSERT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().has_sweep_done());
  EXPECT_EQ(events.back().sweep_done().state(), "DONE");
  int spikes = 0, progress = 0, diverged = 0;
  for (const WatchEvent& e : events) {
    if (e.has_spike()) {
      ++spikes;
      EXPECT_EQ(e.spike().kind(), SPIKE_CATASTROPHIC);
      EXPECT_FALSE(e.variant().empty());
    }
    if (e.has_run() && e.run().state() == RUNNING && e.run().step() == 2) ++progress;
    if (e.has_run() && e.run().state() == DIVERGED) ++diverged;
  }
  EXPECT_EQ(spikes, 1);
  EXPECT_GE(progress, 1);
  EXPECT_EQ(diverged, 1);
}

// Watch streams are capped, all clients together: each holds a gRPC thread and polls the store.
// Before: any number could be opened.
TEST_F(CoordinatorTest, WatchStreamsBeyondTheCapAreRefused) {
  max_watches_ = 1;
  Restart();
  SubmitQuick();
  auto first_ctx = Context(std::chrono::seconds(30));
  WatchRequest request;
  request.set_sweep("quick");
  auto first = client_->Watch(first_ctx.get(), request);
  WatchEvent e;
  ASSERT_TRUE(first->Read(&e));  // open, and replaying the sweep
  auto second_ctx = Context();
  auto second = client_->Watch(second_ctx.get(), request);
  while (second->Read(&e)) {
  }
  const grpc::Status refused = second->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("1 watches are open, the most this coordinator"));
  first_ctx->TryCancel();
  while (first->Read(&e)) {
  }
  (void)first->Finish();
  // The slot is free again.
  bool opened = false;
  for (int i = 0; i < 50 && !opened; ++i) {
    auto ctx = Context();
    auto again = client_->Watch(ctx.get(), request);
    opened = again->Read(&e);
    ctx->TryCancel();
    while (again->Read(&e)) {
    }
    (void)again->Finish();
    if (!opened) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(opened);
}

// grpc.health.v1.Health/Check over a generic stub (the health proto's C++ stubs are not
// installed): request {} -> response {status: SERVING (1)} = bytes 08 01.
TEST_F(CoordinatorTest, StandardHealthServiceIsServing) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(ok);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(CoordinatorTest, LongPollWakesWhenWorkArrives) {
  const int64_t worker = RegisterWorker("w1");
  AcquireJobResponse got;
  std::thread poller([&] {
    const AcquireJobRequest request = AcquireRequest(worker, 20);
    auto ctx = Context(std::chrono::seconds(25));
    ASSERT_TRUE(worker_->AcquireJob(ctx.get(), request, &got).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  SubmitQuick();
  poller.join();
  EXPECT_TRUE(got.has_job());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Dispatch over gRPC with 2,000 queued runs in two sweeps of priorities 1 and 3: fair share holds
// end to end. The time is printed, not asserted (bench_scheduler measures dispatch).
TEST_F(CoordinatorTest, DispatchWithThousandsQueued) {
  std::string seeds = "seeds: [0";
  for (int i = 1; i < 250; ++i) seeds += ", " + std::to_string(i);
  seeds += "]";
  for (const char* name : {"low", "high"}) {
    std::string text = QuickSpec(name);
    text.replace(text.find("seeds: [0]"), 10, seeds);
    if (std::string(name) == "high") text += "priority: 3\n";
    const auto start = std::chrono::steady_clock::now();
    SubmitResponse r = Submit(text, std::string(name) + ".yaml", false);
    ASSERT_EQ(r.queued(), 1000);
    std::printf("submit of 1,000 runs: %.0f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  const int64_t worker = RegisterWorker("fast");
  std::map<std::string, int> served;
  const auto start = std::chrono::steady_clock::now();
  constexpr int kJobs = 200;
  for (int i = 0; i < kJobs; ++i) {
    Job job = Acquire(worker);
    ++served[job.sweep()];
    ASSERT_TRUE(CallFinish(worker, job, SUCCEEDED).ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "coordinator: %d acquire+finish cycles over gRPC with ~2,000 queued: %.2f s "
      "(%.0f jobs/s)\n",
      kJobs, seconds, kJobs / seconds);
  EXPECT_NEAR(served["high"], 150, 2);
  EXPECT_NEAR(served["low"], 50, 2);
}

// Load: 64 simulated workers (each its own connection, the real protocol, no-op jobs that report
// 10 steps and finish at once) drain 10,000 queued runs. None is lost, none runs twice, every
// metric point is stored. bench/scheduler_bench.cc measures the same setup for speed.
TEST_F(CoordinatorTest, SixtyFourWorkersDrainTenThousandJobsExactlyOnce) {
  constexpr int kWorkers = 64, kPoints = 10;
  std::string seeds = "seeds: [0";
  for (int i = 1; i < 2500; ++i) seeds += ", " + std::to_string(i);
  seeds += "]";
  std::string text = QuickSpec("load");
  text.replace(text.find("seeds: [0]"), 10, seeds);
  ASSERT_EQ(Submit(text, "load.yaml", false).queued(), 10000);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> finished{0};
  std::vector<std::unique_ptr<testing::SimWorker>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("ablate.test.connection", i);
    // Half of them finish with their metrics and take the next job in one call, half make a
    // call of each kind: both paths of the protocol race each other.
    workers.push_back(std::make_unique<testing::SimWorker>(
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args),
        token_, "sim-" + std::to_string(i), kPoints, /*batch_points=*/0,
        i % 2 == 0 ? testing::SimProtocol::kFinishCarries : testing::SimProtocol::kCallPerStep));
    ASSERT_TRUE(workers.back()->Register());
    workers.back()->CountFinishesIn(&finished);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&stop, w = w.get()] { w->Run(stop); });
  const auto limit = start + std::chrono::minutes(3);
  while (finished.load() < 10000 && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stop = true;
  for (std::thread& t : threads) t.join();
  std::printf("64 simulated workers drained %lld jobs in %.1f s (%.0f jobs/s)\n",
              static_cast<long long>(finished.load()), seconds, finished.load() / seconds);

  std::map<int64_t, int> starts;
  int busy_workers = 0;
  for (const auto& w : workers) {
    EXPECT_THAT(w->errors(), ::testing::IsEmpty()) << "worker " << w->worker_id();
    busy_workers += !w->jobs().empty();
    for (const testing::SimJob& job : w->jobs()) ++starts[job.run_id];
  }
  EXPECT_EQ(finished.load(), 10000);
  EXPECT_EQ(starts.size(), 10000u);
  int twice = 0;
  for (const auto& [run, n] : starts) twice += n > 1;
  EXPECT_EQ(twice, 0);
  EXPECT_GT(busy_workers, kWorkers / 2);  // the queue was shared, not drained by a few
  EXPECT_EQ(CountRows("runs WHERE state = 'SUCCEEDED' AND attempts = 1"), 10000);
  EXPECT_EQ(CountRows("attempts"), 10000);
  EXPECT_EQ(CountRows("step_metrics"), 10000 * kPoints);
  EXPECT_EQ(Scalar("SELECT state FROM sweeps WHERE name = 'load'"), "DONE");
}

TEST_F(CoordinatorTest, ResourcesDecideWhoGetsAJob) {
  SubmitQuick();  // threads: 1 on cpu
  RegisterRequest gpu;
  gpu.set_name("gpu");
  gpu.mutable_resources()->set_device("cuda:0");
  gpu.mutable_resources()->set_cores(8);
  gpu.mutable_resources()->set_memory_gb(80);
  gpu.mutable_resources()->set_code_version(CodeVersion());
  RegisterResponse reply;
  auto ctx = Context();
  ASSERT_TRUE(worker_->Register(ctx.get(), gpu, &reply).ok());
  EXPECT_FALSE(TryAcquire(reply.worker_id()).has_job());
  EXPECT_TRUE(TryAcquire(RegisterWorker("cpu")).has_job());
}

// A worker built from other sources would train runs keyed to this build's: it is never given
// one, and it is told, as `ablate status` shows it, which build the queued runs need.
TEST_F(CoordinatorTest, AWorkerOfAnotherBuildIsNeverGivenARun) {
  SubmitQuick();
  const std::string other_build = "0.1.0+src-0123456789abcdef";
  const int64_t other = RegisterWorker("other-build", 1, other_build);
  const std::string waiting =
      absl::StrCat("built from ", other_build, "; queued runs need ", CodeVersion());
  AcquireJobResponse none = TryAcquire(other);
  EXPECT_FALSE(none.has_job());
  EXPECT_EQ(none.waiting(), waiting);
  auto status_of = [&](int64_t worker_id) {
    ListSweepsResponse listed;
    auto ctx = Context();
    EXPECT_TRUE(client_->ListSweeps(ctx.get(), ListSweepsRequest(), &listed).ok());
    for (const WorkerStatus& w : listed.workers()) {
      if (w.worker_id() == worker_id) return w;
    }
    ADD_FAILURE() << "no worker " << worker_id;
    return WorkerStatus();
  };
  EXPECT_EQ(status_of(other).code_version(), other_build);
  EXPECT_EQ(status_of(other).waiting(), waiting);
  // This build's worker takes every run, one at a time, while the other still gets none.
  const int64_t same = RegisterWorker("same-build", 1);
  EXPECT_EQ(status_of(same).waiting(), "");
  for (int i = 0; i < 4; ++i) {
    const Job job = Acquire(same);
    EXPECT_FALSE(TryAcquire(other).has_job());
    ASSERT_TRUE(CallFinish(same, job, SUCCEEDED).ok());
  }
  EXPECT_EQ(CountRows("runs WHERE state = 'SUCCEEDED'"), 4);
  EXPECT_EQ(CountRows(absl::StrCat("attempts WHERE worker_id = ", other)), 0);
  // Nothing queued: nothing to wait for.
  EXPECT_EQ(TryAcquire(other).waiting(), "");
  EXPECT_EQ(status_of(other).waiting(), "");
}

// A worker that says nothing of its build (built before builds were matched) is refused.
TEST_F(CoordinatorTest, AWorkerWithoutACodeVersionIsRefusedAtRegister) {
  RegisterRequest request;
  request.set_name("old");
  request.mutable_resources()->set_device("cpu");
  RegisterResponse response;
  auto ctx = Context();
  const grpc::Status s = worker_->Register(ctx.get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("worker old sends no code version"));
  EXPECT_EQ(CountRows("workers"), 0);
}

// Two coordinators must never share a state dir (one queue, two dispatchers, two writers) or a
// port (clients landing on either at random).
TEST_F(CoordinatorTest, ASecondCoordinatorOnTheSameStateDirFailsNamingTheHolder) {
  ServerOptions second = Options();  // the same state dir, another port
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> other = CoordinatorServer::Start(second);
  ASSERT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
  EXPECT_THAT(other.status().message(),
              HasSubstr(absl::StrCat("another coordinator (pid ", getpid(), ")")));
  EXPECT_THAT(other.status().message(), HasSubstr(state_dir_));
  // The first one still serves, with its own token.
  EXPECT_EQ(SubmitQuick().runs(), 4);
  // Once it stops, the state dir is free again.
  server_.reset();
  other = CoordinatorServer::Start(second);
  EXPECT_TRUE(other.ok()) << other.status();
}

TEST_F(CoordinatorTest, ASecondCoordinatorOnAServedPortFailsToStart) {
  ServerOptions second = Options();
  second.state_dir = state_dir_ + "-second";
  second.port = server_->port();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> other = CoordinatorServer::Start(second);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", server_->port())));
  std::filesystem::remove_all(second.state_dir);
}

// Workers leave the workers table's IDLE/BUSY states: at once when they say so, after a lease
// timeout of silence otherwise; a worker that calls again is back.
TEST_F(CoordinatorTest, WorkersThatLeaveOrFallSilentAreGone) {
  const int64_t leaving = RegisterWorker("leaving");
  const int64_t silent = RegisterWorker("silent");
  const int64_t polling = RegisterWorker("polling");
  const auto state = [&](int64_t id) {
    (void)server_->store()->Flush();
    return Scalar(absl::StrCat("SELECT state FROM workers WHERE id = ", id));
  };
  DeregisterRequest request;
  request.set_worker_id(leaving);
  request.set_worker_secret(SecretOf(leaving));
  DeregisterResponse response;
  auto ctx = Context();
  ASSERT_TRUE(worker_->Deregister(ctx.get(), request, &response).ok());
  EXPECT_EQ(state(leaving), "GONE");
  EXPECT_EQ(state(silent), "IDLE");

  clock_.Advance(absl::Seconds(20));
  EXPECT_FALSE(TryAcquire(polling).has_job());
  EXPECT_EQ(server_->core()->CheckWorkers(), 0);  // 20 s of silence: within the 30 s lease
  clock_.Advance(absl::Seconds(20));
  EXPECT_EQ(server_->core()->CheckWorkers(), 1);
  EXPECT_EQ(state(silent), "GONE");
  EXPECT_EQ(state(polling), "IDLE");
  EXPECT_EQ(server_->core()->CheckWorkers(), 0);  // once

  // Calling again brings a worker back; a restarted coordinator gives every known worker a
  // lease timeout to call before it is GONE.
  EXPECT_FALSE(TryAcquire(silent).has_job());
  EXPECT_EQ(state(silent), "IDLE");
  Restart();
  EXPECT_EQ(server_->core()->CheckWorkers(), 0);
  clock_.Advance(absl::Seconds(31));
  EXPECT_EQ(server_->core()->CheckWorkers(), 2);  // silent and polling; leaving was GONE already
  EXPECT_EQ(CountRows("workers WHERE state = 'GONE'"), 3);

  request.set_worker_id(12345);
  request.set_worker_secret(SecretOf(12345));
  auto ctx2 = Context();
  EXPECT_EQ(worker_->Deregister(ctx2.get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// A failure that would recur anywhere (an invalid config, missing data) is not retried.
TEST_F(CoordinatorTest, APermanentFailureFailsTheRunAtOnce) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w");
  const Job first = Acquire(worker);
  FinishRequest permanent =
      MakeFinish(worker, first, FAILED, "NOT_FOUND: data/kjv.txt: no such file");
  permanent.set_permanent(true);
  FinishResponse response;
  ASSERT_TRUE(CallFinish(permanent, &response).ok());
  EXPECT_EQ(StateOf(first.run_id()), FAILED);
  EXPECT_THAT(Scalar(absl::StrCat("SELECT reason FROM runs WHERE id = ", first.run_id())),
              HasSubstr("data/kjv.txt: no such file (not retried"));

  const Job second = Acquire(worker);
  ASSERT_TRUE(
      CallFinish(MakeFinish(worker, second, FAILED, "INTERNAL: out of memory"), &response).ok());
  EXPECT_EQ(StateOf(second.run_id()), PENDING);  // retried after backoff
}

// The spec of issue 15 (regressions/spec_fuzz/variant_budget_null.yaml, scaled down): Submit
// got gRPC's "Unexpected error in RPC handling" from an exception in expansion.
// Continued training (appendix A.7): `init_from: {sweep, variant, seed}` is resolved at submit to
// that SUCCEEDED run's last checkpoint, which the job carries; refused, naming the run, while the
// source has not succeeded or does not exist.
TEST_F(CoordinatorTest, InitFromResolvesASucceededRunsCheckpointAtSubmit) {
  SubmitQuick();
  std::string continued = QuickSpec("continued");
  const std::string marker = "threads: 1}";
  continued.replace(continued.find(marker), marker.size(),
                    "threads: 1, init_from: {sweep: quick, variant: baseline, seed: 0}}");
  SubmitResponse response;
  grpc::Status early = TrySubmit(continued, "continued.yaml", &response);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(early.error_message(), HasSubstr("is PENDING; continued training starts from"));

  const int64_t worker = RegisterWorker("w1");
  Job baseline = Acquire(worker);
  ASSERT_EQ(baseline.variant(), "baseline");
  ReportRequest report = MakeReport(worker, baseline, 1, {1, 2});
  report.set_checkpoint_step(2);
  report.set_checkpoint_path("/shared/ckpt/run-1/checkpoint.pt");
  ReportResponse reply;
  ASSERT_TRUE(CallReport(report, &reply).ok());
  ASSERT_TRUE(CallFinish(worker, baseline, SUCCEEDED).ok());

  ASSERT_TRUE(TrySubmit(continued, "continued.yaml", &response).ok());
  EXPECT_EQ(response.expanded().runs(0).config().train().init_from().checkpoint(),
            "/shared/ckpt/run-1/checkpoint.pt");
  // The stored config carries it too: a job made from the store after a restart.
  Restart();
  const int64_t again = RegisterWorker("w2");
  bool seen = false;
  for (AcquireJobResponse r = TryAcquire(again); r.has_job(); r = TryAcquire(again)) {
    if (r.job().sweep() == "continued") {
      EXPECT_EQ(r.job().config().train().init_from().checkpoint(),
                "/shared/ckpt/run-1/checkpoint.pt");
      seen = true;
    }
    ASSERT_TRUE(CallFinish(again, r.job(), SUCCEEDED).ok());
  }
  EXPECT_TRUE(seen);

  std::string unknown = continued;
  unknown.replace(unknown.find("variant: baseline"), 17, "variant: nonesuch");
  grpc::Status missing = TrySubmit(unknown, "continued.yaml", &response);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(missing.error_message(),
              HasSubstr("train.init_from: sweep quick has no run of variant \"nonesuch\""));
}

// `init_from: {sweep}` alone continues each run from its own counterpart (same variant, same
// seed): the long-context continuation of a whole sweep in one line. A seed without a variant
// is refused.
TEST_F(CoordinatorTest, InitFromASweepAloneContinuesEachRunsOwnVariantAndSeed) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  std::map<std::string, std::string> checkpoint_of;  // variant -> its reported checkpoint
  for (AcquireJobResponse r = TryAcquire(worker); r.has_job(); r = TryAcquire(worker)) {
    ReportRequest report = MakeReport(worker, r.job(), 1, {1});
    report.set_checkpoint_step(1);
    report.set_checkpoint_path("/shared/ckpt/" + r.job().variant() + "/checkpoint.pt");
    ReportResponse reply;
    ASSERT_TRUE(CallReport(report, &reply).ok());
    ASSERT_TRUE(CallFinish(worker, r.job(), SUCCEEDED).ok());
    checkpoint_of[r.job().variant()] = report.checkpoint_path();
  }
  ASSERT_EQ(checkpoint_of.size(), 4u);
  std::string longer = QuickSpec("longer");
  const std::string marker = "threads: 1}";
  longer.replace(longer.find(marker), marker.size(), "threads: 1, init_from: {sweep: quick}}");
  const SubmitResponse response = Submit(longer, "longer.yaml", true);
  ASSERT_EQ(response.expanded().runs_size(), 4);
  for (const RunSpec& run : response.expanded().runs()) {
    EXPECT_EQ(run.config().train().init_from().checkpoint(), checkpoint_of[run.variant()])
        << run.variant();
  }
  std::string seed_only = longer;
  seed_only.replace(seed_only.find("{sweep: quick}"), 14, "{sweep: quick, seed: 3}");
  SubmitResponse refused;
  grpc::Status s = TrySubmit(seed_only, "seed_only.yaml", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("train.init_from: a seed without a variant"));
}

// `init_from: {sweep, variant}` without a seed continues each run from that variant's run of its
// own seed: a gate added to every seed of a trained baseline (appendix A.7,
// experiments/small/continued_gate.yaml). A seed given picks that one for every run.
TEST_F(CoordinatorTest, InitFromAVariantWithoutASeedContinuesThatVariantsRunOfEachSeed) {
  std::string two = QuickSpec("two");
  two.replace(two.find("seeds: [0]"), 10, "seeds: [0, 1]");
  Submit(two, "two.yaml", true);
  const int64_t worker = RegisterWorker("w1");
  std::map<std::pair<std::string, uint64_t>, std::string> checkpoint_of;
  for (AcquireJobResponse r = TryAcquire(worker); r.has_job(); r = TryAcquire(worker)) {
    ReportRequest report = MakeReport(worker, r.job(), 1, {1});
    report.set_checkpoint_step(1);
    report.set_checkpoint_path(absl::StrCat("/shared/", r.job().variant(), "-",
                                            r.job().config().train().seed(), "/checkpoint.pt"));
    ReportResponse reply;
    ASSERT_TRUE(CallReport(report, &reply).ok());
    ASSERT_TRUE(CallFinish(worker, r.job(), SUCCEEDED).ok());
    checkpoint_of[{r.job().variant(), r.job().config().train().seed()}] = report.checkpoint_path();
  }
  ASSERT_EQ(checkpoint_of.size(), 8u);
  std::string added = QuickSpec("added");
  added.replace(added.find("seeds: [0]"), 10, "seeds: [0, 1]");
  const std::string marker = "threads: 1}";
  added.replace(added.find(marker), marker.size(),
                "threads: 1, init_from: {sweep: two, variant: baseline}}");
  added.replace(added.find("budget: {match: ffn"), 19, "budget: {match: none");
  const SubmitResponse response = Submit(added, "added.yaml", true);
  ASSERT_EQ(response.expanded().runs_size(), 8);
  for (const RunSpec& run : response.expanded().runs()) {
    EXPECT_EQ(run.config().train().init_from().checkpoint(),
              checkpoint_of[std::make_pair(std::string("baseline"), run.seed())])
        << run.variant() << " seed " << run.seed();
  }
  std::string pinned = added;
  pinned.replace(pinned.find("variant: baseline}"), 18, "variant: baseline, seed: 1}");
  pinned.replace(pinned.find("sweep: added"), 12, "sweep: pinned");
  const SubmitResponse one = Submit(pinned, "pinned.yaml", true);
  for (const RunSpec& run : one.expanded().runs()) {
    EXPECT_EQ(run.config().train().init_from().checkpoint(),
              checkpoint_of[std::make_pair(std::string("baseline"), uint64_t{1})]);
  }
}

// A run with resources.devices N goes only to a worker with at least N slots, as a job of
// world size N; a batch the ranks cannot split is refused at submit (issue 17).
TEST_F(CoordinatorTest, ARunOfTwoDevicesGoesToAWorkerWithTwoSlots) {
  std::string spec = QuickSpec("pairs");
  spec.replace(spec.find("resources: {device: cpu, threads: 1}"), 37,
               "resources: {device: cpu, threads: 1, devices: 2}");
  const SubmitResponse submitted = Submit(spec, "pairs.yaml", false);
  ASSERT_EQ(submitted.runs(), 4);
  const int64_t one_slot = RegisterWorker("one", 1);
  EXPECT_FALSE(TryAcquire(one_slot).has_job());
  const int64_t two_slots = RegisterWorker("two", 2);
  AcquireJobResponse got = TryAcquire(two_slots);
  ASSERT_TRUE(got.has_job());
  EXPECT_EQ(got.job().world_size(), 2);
  const GetSweepResponse pairs = GetSweep("pairs");
  for (const RunStatus& run : pairs.runs()) EXPECT_EQ(run.devices(), 2);
  EXPECT_EQ(Scalar("SELECT devices FROM runs WHERE id = " + std::to_string(got.job().run_id())),
            "2");
  // Restarted, the coordinator still knows what the queued runs need and what workers offer.
  Restart();
  EXPECT_FALSE(TryAcquire(RegisterWorker("one-again", 1)).has_job());
  AcquireJobResponse after = TryAcquire(RegisterWorker("two-again", 2));
  ASSERT_TRUE(after.has_job());
  EXPECT_EQ(after.job().world_size(), 2);

  std::string odd = QuickSpec("triples");
  odd.replace(odd.find("resources: {device: cpu, threads: 1}"), 37,
              "resources: {device: cpu, threads: 1, devices: 3}");
  SubmitResponse refused;
  grpc::Status s = TrySubmit(odd, "triples.yaml", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("8 windows cannot be split evenly over 3 ranks (resources.devices)"));
}

// A worker with four slots fills them in one AcquireJob, and ends four attempts and takes the
// next jobs in one Finish. One of them refused (a wrong secret) stays leased and is named.
TEST_F(CoordinatorTest, AWorkerWithFourSlotsTakesAndEndsSeveralJobsPerCall) {
  Submit(QuickSpec("first"), "first.yaml", false);
  Submit(QuickSpec("second"), "second.yaml", false);  // 8 runs in all
  const int64_t worker = RegisterWorker("four", 4);
  AcquireJobRequest acquire = AcquireRequest(worker);
  acquire.set_max_jobs(8);
  AcquireJobResponse got;
  {
    auto ctx = Context();
    ASSERT_TRUE(worker_->AcquireJob(ctx.get(), acquire, &got).ok());
  }
  ASSERT_TRUE(got.has_job());
  ASSERT_EQ(got.more_jobs_size(), 3);  // one per slot
  std::vector<Job> jobs = {got.job()};
  for (const Job& j : got.more_jobs()) jobs.push_back(j);
  EXPECT_EQ(CountRows("runs WHERE state = 'RUNNING'"), 4);
  EXPECT_EQ(CountRows("attempts WHERE worker_id = " + std::to_string(worker)), 4);
  EXPECT_FALSE(TryAcquire(worker).has_job());  // every slot is taken
  {
    ListSweepsResponse listed;
    auto ctx = Context();
    ASSERT_TRUE(client_->ListSweeps(ctx.get(), ListSweepsRequest(), &listed).ok());
    ASSERT_EQ(listed.workers_size(), 1);
    EXPECT_EQ(listed.workers(0).name(), "four");
    EXPECT_EQ(listed.workers(0).slots(), 4);
    EXPECT_EQ(listed.workers(0).slots_in_use(), 4);
    EXPECT_EQ(listed.workers(0).running(), 4);
  }

  FinishRequest finish = MakeFinish(worker, jobs[0], SUCCEEDED);
  *finish.mutable_final_report() = MakeReport(0, Job(), 1, {1, 2});
  for (int i = 1; i < 4; ++i) {
    FinishRequest* more = finish.add_more();
    *more = MakeFinish(i == 1 ? 0 : worker, jobs[i], SUCCEEDED);
    *more->mutable_final_report() = MakeReport(0, Job(), 1, {1, 2, 3});
  }
  finish.mutable_more(1)->set_lease_secret("wrong");  // jobs[2]
  finish.set_acquire_next(true);
  finish.set_acquire_max(4);
  FinishResponse response;
  ASSERT_TRUE(CallFinish(finish, &response).ok());
  ASSERT_EQ(response.more_errors_size(), 3);
  EXPECT_EQ(response.more_errors(0), "");
  EXPECT_THAT(response.more_errors(1), HasSubstr("PERMISSION_DENIED: finish: wrong lease secret"));
  EXPECT_EQ(response.more_errors(2), "");
  for (int i : {0, 1, 3}) EXPECT_EQ(StateOf(jobs[i].run_id()), SUCCEEDED) << i;
  EXPECT_EQ(StateOf(jobs[2].run_id()), RUNNING);
  EXPECT_EQ(CountRows("step_metrics WHERE run_id = " + std::to_string(jobs[3].run_id())), 3);
  // Three slots came free: three next jobs, started in the same call.
  ASSERT_TRUE(response.has_next_job());
  ASSERT_EQ(response.more_next_jobs_size(), 2);
  EXPECT_EQ(CountRows("runs WHERE state = 'RUNNING'"), 4);

  // The rest, the refused one included, end in one more call; the sweep drains.
  std::vector<Job> running = {jobs[2], response.next_job()};
  for (const Job& j : response.more_next_jobs()) running.push_back(j);
  FinishRequest rest = MakeFinish(worker, running[0], SUCCEEDED);
  for (size_t i = 1; i < running.size(); ++i)
    *rest.add_more() = MakeFinish(0, running[i], SUCCEEDED);
  rest.set_acquire_next(true);
  rest.set_acquire_max(4);
  FinishResponse last;
  ASSERT_TRUE(CallFinish(rest, &last).ok());
  for (const std::string& e : last.more_errors()) EXPECT_EQ(e, "");
  ASSERT_TRUE(last.has_next_job());  // the eighth run
  EXPECT_EQ(last.more_next_jobs_size(), 0);
  ASSERT_TRUE(CallFinish(worker, last.next_job(), SUCCEEDED).ok());
  EXPECT_EQ(CountRows("runs WHERE state = 'SUCCEEDED' AND attempts = 1"), 8);
  EXPECT_EQ(Scalar("SELECT state FROM sweeps WHERE name = 'second'"), "DONE");

  // A Finish whose own attempt is refused applies none of its more.
  FinishRequest stale = MakeFinish(worker, jobs[0], FAILED);
  stale.set_lease_secret("wrong");
  EXPECT_EQ(CallFinish(stale, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// Issue 17: runs of 2 devices and two one-slot workers. Each run is leased to both at once, the
// worker completing the gang holding rank 0; the other gets its part at its next poll. A member
// sends heartbeats only; its FAILED finish, or its silence, ends the whole attempt.
class GangTest : public CoordinatorFixture {
 protected:
  // The quick spec with resources.devices 2: 4 runs wider than a one-slot worker.
  void SubmitGangSweep() {
    std::string spec = QuickSpec("gang");
    const size_t resources = spec.find("resources: {device: cpu, threads: 1}");
    ASSERT_NE(resources, std::string::npos);
    spec.replace(resources, 36, "resources: {device: cpu, threads: 1, devices: 2}");
    Submit(spec, "gang.yaml", false);
  }
  // A one-slot worker whose rendezvous host is `host` ("": its hostname, NAME.cluster).
  int64_t RegisterAt(const std::string& name, const std::string& host) {
    RegisterRequest request;
    request.set_name(name);
    request.mutable_resources()->set_device("cpu");
    request.mutable_resources()->set_cores(4);
    request.mutable_resources()->set_hostname(name + ".cluster");
    request.mutable_resources()->set_rendezvous_host(host);
    request.mutable_resources()->set_code_version(CodeVersion());
    RegisterResponse response;
    auto ctx = Context();
    EXPECT_TRUE(worker_->Register(ctx.get(), request, &response).ok());
    return response.worker_id();
  }
};

TEST_F(GangTest, ARunWiderThanEveryWorkerIsLeasedToAGangOfThem) {
  SubmitGangSweep();
  const int64_t a = RegisterAt("a", ""), b = RegisterAt("b", "10.0.0.7");
  EXPECT_FALSE(TryAcquire(a).has_job());  // its slot waits for a partner
  const Job primary = Acquire(b);
  EXPECT_EQ(primary.world_size(), 2);
  EXPECT_EQ(primary.rank_offset(), 0);
  EXPECT_EQ(primary.local_ranks(), 1);
  EXPECT_THAT(primary.rendezvous(), ::testing::StartsWith("10.0.0.7:"));
  const int port = std::stoi(primary.rendezvous().substr(9));
  EXPECT_GE(port, 29500);
  EXPECT_LE(port, 29999);
  const Job part = Acquire(a);
  EXPECT_EQ(part.run_id(), primary.run_id());
  EXPECT_EQ(part.attempt(), primary.attempt());
  EXPECT_EQ(part.rank_offset(), 1);
  EXPECT_EQ(part.local_ranks(), 1);
  EXPECT_EQ(part.rendezvous(), primary.rendezvous());
  EXPECT_NE(part.lease_secret(), primary.lease_secret());
  EXPECT_EQ(CountRows("attempts"), 1);
  EXPECT_THAT(
      Scalar("SELECT message FROM events WHERE kind = 'gang'"),
      HasSubstr(" attempt 1 is a gang of 2 workers: ranks 0-0 on b (worker " + std::to_string(b) +
                "), ranks 1-1 on a (worker " + std::to_string(a) + "); rendezvous 10.0.0.7:"));
  const GetSweepResponse sweep = GetSweep("gang");
  for (const RunStatus& run : sweep.runs()) {
    if (run.run_id() == primary.run_id()) {
      EXPECT_EQ(run.worker(), "b+a");
    }
  }

  // A member renews its part with heartbeats; metrics are rank 0's worker's to send.
  ReportResponse reply;
  EXPECT_TRUE(CallReport(MakeReport(a, part, 0, {}), &reply).ok());
  grpc::Status refused = CallReport(MakeReport(a, part, 1, {1}), &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("only rank 0's worker reports metrics"));
  EXPECT_TRUE(CallReport(MakeReport(b, primary, 1, {1, 2}), &reply).ok());
  // The member's part ends: the run goes on under rank 0's worker until it finishes.
  FinishRequest done = MakeFinish(a, part, SUCCEEDED);
  done.set_member(true);
  FinishResponse response;
  ASSERT_TRUE(CallFinish(done, &response).ok());
  EXPECT_EQ(StateOf(primary.run_id()), RUNNING);
  ASSERT_TRUE(CallFinish(b, primary, SUCCEEDED).ok());
  EXPECT_EQ(StateOf(primary.run_id()), SUCCEEDED);
  ASSERT_TRUE(CallFinish(done, &response).ok());  // resent after the attempt ended: acknowledged

  // A member's FAILED part fails the attempt; rank 0's worker's finish of it comes too late.
  EXPECT_FALSE(TryAcquire(a).has_job());
  const Job primary2 = Acquire(b);
  const Job part2 = Acquire(a);
  FinishRequest failed = MakeFinish(a, part2, FAILED, "rank 1 of 2 ended with signal 9");
  failed.set_member(true);
  ASSERT_TRUE(CallFinish(failed, &response).ok());
  EXPECT_EQ(StateOf(primary2.run_id()), PENDING);  // retried after its backoff
  EXPECT_THAT(
      Scalar("SELECT reason FROM attempts WHERE run_id = " + std::to_string(primary2.run_id())),
      HasSubstr("ranks from 1 on worker a: rank 1 of 2 ended with signal 9"));
  EXPECT_EQ(CallFinish(b, primary2, FAILED).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // A member that goes silent loses the attempt for all of its gang.
  EXPECT_FALSE(TryAcquire(a).has_job());
  const Job primary3 = Acquire(b);
  ASSERT_TRUE(Acquire(a).has_config());
  clock_.Advance(absl::Seconds(20));
  ASSERT_TRUE(CallReport(MakeReport(b, primary3, 1, {1}), &reply).ok());
  clock_.Advance(absl::Seconds(15));
  EXPECT_EQ(server_->core()->CheckLeases(), 1);
  EXPECT_EQ(StateOf(primary3.run_id()), PENDING);
  EXPECT_THAT(Scalar("SELECT reason FROM attempts WHERE run_id = " +
                     std::to_string(primary3.run_id()) + " AND state = 'LOST'"),
              HasSubstr("no report from worker a for 30s (it trained ranks from 1"));
  EXPECT_EQ(CallReport(MakeReport(b, primary3, 2, {2}), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// The members of a running gang are not in the store: a restarted coordinator ends the attempt
// (LOST) rather than leave members whose heartbeats it would refuse; the run resumes.
TEST_F(GangTest, ACoordinatorRestartEndsARunningGangAttemptToResumeIt) {
  SubmitGangSweep();
  const int64_t a = RegisterAt("a", ""), b = RegisterAt("b", "");
  EXPECT_FALSE(TryAcquire(a).has_job());
  const Job primary = Acquire(b);
  const Job part = Acquire(a);
  EXPECT_EQ(part.rendezvous().substr(0, 10), "b.cluster:");  // b's hostname
  Restart();
  EXPECT_EQ(StateOf(primary.run_id()), PENDING);
  EXPECT_THAT(Scalar("SELECT state || ': ' || reason FROM attempts WHERE run_id = " +
                     std::to_string(primary.run_id())),
              HasSubstr("LOST: the coordinator restarted during this gang-scheduled attempt"));
  ReportResponse reply;
  EXPECT_EQ(CallReport(MakeReport(a, part, 0, {}), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(CallReport(MakeReport(b, primary, 1, {1}), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorTest, SubmitOfAVariantWithAnEmptyBudgetIsAnOrdinarySweep) {
  const SubmitResponse submitted = Submit(
      "sweep: empty-budget\n"
      "base:\n  model: {d_model: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, head_dim: 16,\n"
      "          ffn_dim: 64}\n"
      "  train: {steps: 10, batch_size: 2, seq_len: 16}\n"
      "variants:\n  - baseline\n  - name: more_kv\n    budget: #{match: heads}\n",
      "empty-budget.yaml", false);
  EXPECT_EQ(submitted.runs(), 2);
}

// An exception escaping a handler's body is INTERNAL naming the method, not gRPC's
// "Unexpected error in RPC handling", and not a dead process.
TEST(GrpcStatusTest, AnEscapedExceptionIsInternalNamingTheMethod) {
  const grpc::Status s = GuardHandler("Coordinator.Submit",
                                      []() -> grpc::Status { throw std::out_of_range("map::at"); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(s.error_message(), "Coordinator.Submit: internal error: map::at (a bug in ablate)");
  EXPECT_TRUE(GuardHandler("m", [] { return grpc::Status::OK; }).ok());
  EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(absl::NotFoundError("x"))), absl::NotFoundError("x"));
}

}  // namespace
}  // namespace ablate
