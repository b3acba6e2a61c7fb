// The coordinator against hostile or careless callers (issue 20): reports checked at the door,
// a store that survives what older coordinators let in, credentials with roles, lease secrets,
// an atomic cancel, and state that survives a restart.
#include <sqlite3.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "config/program_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "orchestrator/coordinator/door.h"
#include "tests/orchestrator/coordinator/coordinator_test_util.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;

class HardeningTest : public CoordinatorFixture {
 protected:
  // A context carrying `credential` instead of the admin one.
  std::unique_ptr<grpc::ClientContext> ContextWith(const std::string& credential) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx->AddMetadata("authorization", "Bearer " + credential);
    return ctx;
  }
  // Runs `sql` on the coordinator's own writer connection (what an older coordinator wrote).
  void WriteBehindTheDoor(const std::string& sql) {
    ASSERT_TRUE(server_->store()
                    ->RunOnWriterForTesting([&](sqlite3* db) {
                      char* error = nullptr;
                      const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
                      EXPECT_EQ(rc, SQLITE_OK) << (error != nullptr ? error : "");
                      sqlite3_free(error);
                      return absl::OkStatus();
                    })
                    .ok());
  }
  grpc::Status ListSweeps(ListSweepsResponse* out) {
    auto ctx = Context();
    return client_->ListSweeps(ctx.get(), ListSweepsRequest(), out);
  }
};

// Each of these reports was stored before, and the first one bricked the coordinator: the
// sweep_progress view's sum() overflowed on every read of sweeps, start-up included.
// A run's worker notices are stored up to kMaxNoticesPerRun, then dropped with one event saying
// so: a worker cannot fill the event log 16 lines of 4 KiB a batch. Before: every one was stored.
TEST_F(HardeningTest, AWorkersNoticesAreCappedPerRun) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  const Job job = Acquire(worker);
  for (int64_t seq = 1; seq <= 70; ++seq) {
    ReportRequest report = MakeReport(worker, job, seq, {seq});
    report.add_notices(std::string(100, 'n'));
    ReportResponse reply;
    ASSERT_TRUE(CallReport(report, &reply).ok()) << seq;
  }
  const std::string run = std::to_string(job.run_id());
  EXPECT_EQ(CountRows("events WHERE kind = 'worker_notice' AND run_id = " + run), 65);
  EXPECT_EQ(CountRows("events WHERE kind = 'worker_notice' AND message = 'run " + run +
                      ": further worker notices are dropped (64 a run)'"),
            1);
}

TEST_F(HardeningTest, AHostileReportIsRefusedAtTheDoorAndNothingIsStored) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  const Job job = Acquire(worker);
  const std::string before = DatabaseDigest();
  struct Case {
    const char* name;
    std::function<void(ReportRequest*)> spoil;
    const char* says;
  };
  const Case cases[] = {
      {"step near 2^63",
       [](ReportRequest* r) { r->mutable_steps(0)->set_step(std::numeric_limits<int64_t>::max()); },
       "steps[0].step is 9223372036854775807; it must be in [1, 200]"},
      {"step past train.steps", [](ReportRequest* r) { r->mutable_steps(1)->set_step(201); },
       "steps[1].step"},
      {"negative step", [](ReportRequest* r) { r->mutable_steps(0)->set_step(-5); },
       "steps[0].step"},
      {"NaN learning rate",
       [](ReportRequest* r) {
         r->mutable_steps(0)->set_lr(std::numeric_limits<double>::quiet_NaN());
       },
       "steps[0].lr"},
      {"eval past the end", [](ReportRequest* r) { r->add_evals()->set_step(1'000'000); },
       "evals[0].step"},
      {"a histogram of a million bins",
       [](ReportRequest* r) {
         Histogram* h =
             r->add_evals()->mutable_probes()->add_layers()->mutable_gate_histogram();
         h->set_hi(1);
         for (int i = 0; i < 1'000'000; ++i) h->add_counts(1);
       },
       "gate_histogram.counts has 1000000 bins"},
      {"rollback ahead of its spike",
       [](ReportRequest* r) {
         SpikeEvent* s = r->add_spikes();
         s->set_step(2);
         s->set_rollback_to_step(50);
       },
       "spikes[0].rollback_to_step"},
      {"checkpoint past the end", [](ReportRequest* r) { r->set_checkpoint_step(1 << 30); },
       "checkpoint_step"},
      {"an attention map shorter than its size",
       [](ReportRequest* r) {
         AttentionMap* m = r->add_evals()->add_attention_maps();
         m->set_size(64);
         m->set_probs(std::string(100, '\0'));
       },
       "evals[0].attention_maps[0].probs is 100 bytes; a map of size 64 has 4096"},
      {"an attention map of a million positions",
       [](ReportRequest* r) { r->add_evals()->add_attention_maps()->set_size(1'000'000); },
       "evals[0].attention_maps[0].size is 1000000; it must be in [1, 64]"},
      {"a first-token attention per head that is not a share",
       [](ReportRequest* r) {
         r->add_evals()->mutable_probes()->add_layers()->add_first_token_attention_by_head(7.5);
       },
       "evals[0].probes.layers[0].first_token_attention_by_head is 7.5; it must be a share of "
       "attention in [0, 1]"},
      {"a sink rate of NaN",
       [](ReportRequest* r) {
         r->add_evals()->mutable_probes()->set_sink_rate(std::numeric_limits<double>::quiet_NaN());
       },
       "evals[0].probes.sink_rate is nan"},
      {"a query class with markup for a name",
       [](ReportRequest* r) {
         r->add_evals()->mutable_probes()->add_classes()->set_name("<b>trigger</b>");
       },
       "evals[0].probes.classes[0].name must be 1 to 32 letters, digits or '_'"},
      {"a negative evaluation length",
       [](ReportRequest* r) { r->add_evals()->add_lengths()->set_seq_len(-1); },
       "evals[0].lengths[0].seq_len is -1"},
      {"a hundred evaluation lengths",
       [](ReportRequest* r) {
         EvalResult* e = r->add_evals();
         for (int i = 1; i <= 100; ++i) e->add_lengths()->set_seq_len(i);
       },
       "evals[0].lengths has 100 entries; the limit is 16"},
      // The run's config decides what an evaluation may hold (quick: 4 layers of 4 heads, 2 maps
      // a layer, evaluations every 250 steps and at its last, 200): anything else could fill the
      // coordinator's disk, at most 16 MiB an evaluation at every step.
      {"an evaluation at a step the run does not evaluate at",
       [](ReportRequest* r) { r->add_evals()->set_step(7); },
       "evals[0].step is 7; this run evaluates every 250 steps and at step 200"},
      {"probes of more layers than the model has",
       [](ReportRequest* r) {
         Probes* p = r->add_evals()->mutable_probes();
         for (int i = 0; i < 5; ++i) p->add_layers()->set_layer(i);
       },
       "evals[0].probes.layers has 5 entries; the model has 4 layers"},
      {"more attention maps than the run asks for",
       [](ReportRequest* r) {
         EvalResult* e = r->add_evals();
         for (int i = 0; i < 13; ++i) e->add_attention_maps();
       },
       // 2 heads and their layer's mean
       "evals[0].attention_maps has 13 maps; the run asks for 3 per layer of 4"},
      {"an attention map of a head below the mean's -1",
       [](ReportRequest* r) { r->add_evals()->add_attention_maps()->set_head(-2); },
       "evals[0].attention_maps[0].head is -2; it must be in [-1, 1023]"},
      {"an attention map of a head the model lacks",
       [](ReportRequest* r) { r->add_evals()->add_attention_maps()->set_head(7); },
       "evals[0].attention_maps[0] is of layer 0 head 7; the model has 4 layers of 4 heads"},
      // Spikes are unique per (run, step, signal): a signal of the worker's choosing would let
      // it store any number of them.
      {"a spike signal that is not loss or grad_norm",
       [](ReportRequest* r) {
         SpikeEvent* s = r->add_spikes();
         s->set_step(2);
         s->set_signal("loss#1");
       },
       "spikes[0].signal is \"loss#1\"; it must be loss or grad_norm"},
  };
  for (const Case& c : cases) {
    ReportRequest report = MakeReport(worker, job, 1, {1, 2});
    c.spoil(&report);
    ReportResponse reply;
    const grpc::Status s = CallReport(report, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(s.error_message(), HasSubstr(c.says)) << c.name;
  }
  // A non-finite loss is a divergence signal, not bad input: it is stored.
  ReportRequest nan_loss = MakeReport(worker, job, 1, {1});
  nan_loss.mutable_steps(0)->set_loss(std::numeric_limits<double>::quiet_NaN());
  FinishRequest absurd = MakeFinish(worker, job, SUCCEEDED);
  absurd.mutable_summary()->set_steps_done(std::numeric_limits<int64_t>::max());
  FinishResponse finish_reply;
  const grpc::Status finished = CallFinish(absurd, &finish_reply);
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(finished.error_message(), HasSubstr("summary.steps_done"));
  EXPECT_EQ(DatabaseDigest(), before);
  ReportResponse reply;
  ASSERT_TRUE(CallReport(nan_loss, &reply).ok());
  // A long error text is cut, not refused: the run keeps its result.
  ASSERT_TRUE(CallFinish(worker, job, FAILED, std::string(100'000, 'x')).ok());
  EXPECT_LT(Scalar("SELECT reason FROM runs WHERE id = " + std::to_string(job.run_id())).size(),
            kMaxTextBytes + 200);
}

// A database an older coordinator let absurd step counts into still serves every read and lets
// the coordinator start.
TEST_F(HardeningTest, TheCoordinatorRestartsOverStepCountsThatWouldOverflow) {
  SubmitQuick();
  WriteBehindTheDoor("UPDATE runs SET steps_done = 9223372036854775807");
  ListSweepsResponse sweeps;
  ASSERT_TRUE(ListSweeps(&sweeps).ok());
  Restart();
  ASSERT_TRUE(ListSweeps(&sweeps).ok());
  ASSERT_EQ(sweeps.sweeps_size(), 1);
  EXPECT_EQ(GetSweep("quick").runs_size(), 4);
  QueryRequest q;
  q.set_sql("SELECT steps_done FROM sweep_progress");
  QueryResponse out;
  auto ctx = Context();
  ASSERT_TRUE(client_->Query(ctx.get(), q, &out).ok());
  EXPECT_THAT(out.formatted(), HasSubstr("9200000000000000000"));
}

TEST_F(HardeningTest, EachCredentialHasItsRole) {
  const Credentials& c = server_->credentials();
  EXPECT_NE(c.worker, c.admin);
  EXPECT_NE(c.read, c.admin);
  for (const std::string file : {"token", kWorkerTokenFile, kReadTokenFile, "ablate.db"}) {
    struct stat st;
    ASSERT_EQ(::stat((state_dir_ + "/" + file).c_str(), &st), 0) << file;
    EXPECT_EQ(st.st_mode & 0777, 0600) << file;
  }
  EXPECT_EQ(ReadFirstLine(state_dir_ + "/" + kWorkerTokenFile), c.worker);
  EXPECT_EQ(ReadFirstLine(state_dir_ + "/" + kReadTokenFile), c.read);

  SubmitRequest submit;
  submit.set_spec_yaml(QuickSpec("quick"));
  SubmitResponse submitted;
  ListSweepsResponse sweeps;
  RegisterRequest reg;
  reg.set_name("w");
  reg.mutable_resources()->set_code_version(CodeVersion());
  RegisterResponse registered;
  QueryRequest q;
  q.set_sql("SELECT 1");
  QueryResponse answer;
  // The read credential (the dashboard URL's) reads, and nothing else.
  auto ctx = ContextWith(c.read);
  const grpc::Status read_submit = client_->Submit(ctx.get(), submit, &submitted);
  EXPECT_EQ(read_submit.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(read_submit.error_message(),
              HasSubstr("Coordinator.Submit needs the admin credential; this is the read one"));
  ctx = ContextWith(c.read);
  EXPECT_EQ(worker_->Register(ctx.get(), reg, &registered).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ctx = ContextWith(c.read);
  EXPECT_TRUE(client_->ListSweeps(ctx.get(), ListSweepsRequest(), &sweeps).ok());
  ctx = ContextWith(c.read);
  EXPECT_TRUE(client_->Query(ctx.get(), q, &answer).ok());
  // The worker credential (a SLURM pilot's) works, and does nothing else.
  ctx = ContextWith(c.worker);
  EXPECT_EQ(client_->Submit(ctx.get(), submit, &submitted).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ctx = ContextWith(c.worker);
  EXPECT_EQ(client_->Query(ctx.get(), q, &answer).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ctx = ContextWith(c.worker);
  EXPECT_TRUE(worker_->Register(ctx.get(), reg, &registered).ok());
  EXPECT_EQ(CountRows("sweeps"), 0);
  // The same secret gives the same credentials after a restart.
  const Credentials before = c;
  Restart();
  EXPECT_EQ(server_->credentials().worker, before.worker);
  EXPECT_EQ(server_->credentials().read, before.read);
}

// A worker credential holder who is not the attempt's worker cannot report for it or finish it,
// even knowing (worker_id, run_id, attempt), which `ablate query` shows.
TEST_F(HardeningTest, ReportAndFinishNeedTheAttemptsLeaseSecret) {
  SubmitQuick();
  const int64_t w1 = RegisterWorker("w1");
  const int64_t w2 = RegisterWorker("w2");
  const Job job = Acquire(w1);
  EXPECT_EQ(job.lease_secret().size(), 64u);
  const Job other = Acquire(w2);
  EXPECT_NE(other.lease_secret(), job.lease_secret());
  const std::string before = DatabaseDigest();

  Job forged = job;
  forged.clear_lease_secret();
  ReportResponse reply;
  grpc::Status s = CallReport(MakeReport(w1, forged, 1, {1, 2}), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("wrong lease secret"));
  forged.set_lease_secret(other.lease_secret());  // w2's own secret, for w1's run
  EXPECT_EQ(CallReport(MakeReport(w1, forged, 1, {1, 2}), &reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CallFinish(w2, forged, SUCCEEDED).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CallFinish(w1, forged, SUCCEEDED).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(DatabaseDigest(), before);
  EXPECT_EQ(StateOf(job.run_id()), RUNNING);

  // The worker's own secret works, before and after a coordinator restart.
  ASSERT_TRUE(CallReport(MakeReport(w1, job, 1, {1, 2}), &reply).ok());
  Restart();
  ASSERT_TRUE(CallReport(MakeReport(w1, job, 2, {3}), &reply).ok());
  ASSERT_TRUE(CallFinish(w1, job, SUCCEEDED).ok());
  EXPECT_EQ(StateOf(job.run_id()), SUCCEEDED);
}

// A worker id is usable only with the secret its Register returned. Before, any holder of the
// worker credential could pass a victim's worker_id: AcquireJob took the victim's jobs and gang
// parts, and Deregister marked it GONE.
TEST_F(HardeningTest, AWorkerIdIsUsableOnlyWithItsSecret) {
  SubmitQuick();
  RegisterRequest reg;
  reg.set_name("victim");
  reg.mutable_resources()->set_code_version(CodeVersion());
  reg.mutable_resources()->set_device("cpu");
  reg.mutable_resources()->set_cores(4);
  RegisterResponse victim;
  auto ctx = Context();
  ASSERT_TRUE(worker_->Register(ctx.get(), reg, &victim).ok());
  EXPECT_EQ(victim.worker_secret().size(), 64u);
  EXPECT_EQ(victim.worker_secret(), SecretOf(victim.worker_id()));
  const int64_t attacker = RegisterWorker("attacker");
  EXPECT_NE(SecretOf(attacker), victim.worker_secret());
  const std::string before = DatabaseDigest();

  for (const std::string& secret : {std::string(), SecretOf(attacker), std::string(64, '0')}) {
    AcquireJobRequest acquire;
    acquire.set_worker_id(victim.worker_id());
    acquire.set_worker_secret(secret);
    AcquireJobResponse got;
    ctx = Context();
    const grpc::Status s = worker_->AcquireJob(ctx.get(), acquire, &got);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << secret;
    EXPECT_THAT(s.error_message(),
                HasSubstr(absl::StrCat("worker secret for worker ", victim.worker_id())));
    EXPECT_FALSE(got.has_job());
    DeregisterRequest leave;
    leave.set_worker_id(victim.worker_id());
    leave.set_worker_secret(secret);
    DeregisterResponse left;
    ctx = Context();
    EXPECT_EQ(worker_->Deregister(ctx.get(), leave, &left).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(DatabaseDigest(), before);  // nothing leased, nobody GONE

  // The victim's own secret works, and still does after a coordinator restart.
  Restart();
  const Job job = Acquire(victim.worker_id());
  EXPECT_EQ(StateOf(job.run_id()), RUNNING);
  DeregisterRequest leave;
  leave.set_worker_id(victim.worker_id());
  leave.set_worker_secret(victim.worker_secret());
  DeregisterResponse left;
  ctx = Context();
  EXPECT_TRUE(worker_->Deregister(ctx.get(), leave, &left).ok());
}

// Registered workers that are not GONE are capped, so Register cannot grow the workers table and
// /api/workers without bound; one that leaves frees its place. Before: no limit.
TEST_F(HardeningTest, RegistrationsPastTheLiveWorkerCapAreRefused) {
  max_workers_ = 3;
  Restart();
  std::vector<int64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(RegisterWorker(absl::StrCat("w", i)));
  RegisterRequest reg;
  reg.set_name("one-too-many");
  reg.mutable_resources()->set_code_version(CodeVersion());
  RegisterResponse refused;
  auto ctx = Context();
  grpc::Status s = worker_->Register(ctx.get(), reg, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("the coordinator has 3 registered workers, its limit"));
  EXPECT_EQ(CountRows("workers"), 3);
  // Still 3 after a restart, which counts the workers the store has not seen leave.
  Restart();
  ctx = Context();
  EXPECT_EQ(worker_->Register(ctx.get(), reg, &refused).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  DeregisterRequest leave;
  leave.set_worker_id(ids[0]);
  leave.set_worker_secret(SecretOf(ids[0]));
  DeregisterResponse left;
  ctx = Context();
  ASSERT_TRUE(worker_->Deregister(ctx.get(), leave, &left).ok());
  EXPECT_NE(RegisterWorker("in-its-place"), 0);
  // A silent one frees its place after a lease period.
  clock_.Advance(absl::Seconds(31));
  EXPECT_EQ(server_->core()->CheckWorkers(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NE(RegisterWorker(absl::StrCat("after", i)), 0);
}

TEST_F(HardeningTest, CancelIsOneTransactionAndRestartRepairsAnOlderOne) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  const Job running = Acquire(worker);
  CancelResponse cancelled;
  ASSERT_TRUE(CallCancel("quick", &cancelled).ok());
  EXPECT_EQ(cancelled.cancelled(), 4);
  EXPECT_EQ(CountRows("runs WHERE state = 'CANCELLED'"), 3);
  EXPECT_EQ(StateOf(running.run_id()), RUNNING);  // stopped at its next report

  // What a crash between the sweep's update and its runs' left behind in an older coordinator.
  Submit(QuickSpec("torn"), "torn.yaml", false);
  WriteBehindTheDoor("UPDATE sweeps SET state = 'CANCELLED' WHERE name = 'torn'");
  Restart();
  EXPECT_EQ(CountRows("runs r JOIN sweeps s ON s.id = r.sweep_id WHERE s.name = 'torn' AND "
                      "r.state = 'CANCELLED'"),
            4);
  EXPECT_FALSE(TryAcquire(worker).has_job());
}

// Retries count from the attempts a run had when it was rerun, also after a restart (the base
// was kept in memory only, so a restarted coordinator failed a rerun run at once).
TEST_F(HardeningTest, ARerunsAttemptBaseSurvivesARestart) {
  SubmitQuick();
  const int64_t worker = RegisterWorker("w1");
  Job failing = Acquire(worker);
  const int64_t run_id = failing.run_id();
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_TRUE(CallFinish(worker, failing, FAILED, "out of memory").ok());
    if (attempt < 3) {
      clock_.Advance(absl::Seconds(5 << (attempt - 1)));
      failing = Acquire(worker);
      ASSERT_EQ(failing.run_id(), run_id);
    }
  }
  ASSERT_EQ(StateOf(run_id), FAILED);
  RerunResponse rerun_reply;
  ASSERT_TRUE(CallRerunFailed("quick", &rerun_reply).ok());
  Restart();
  const int64_t again = RegisterWorker("w2");
  Job retried = Acquire(again);
  while (retried.run_id() != run_id) {
    ASSERT_TRUE(CallFinish(again, retried, SUCCEEDED).ok());
    retried = Acquire(again);
  }
  EXPECT_EQ(retried.attempt(), 4);
  ASSERT_TRUE(CallFinish(again, retried, FAILED, "again").ok());
  EXPECT_EQ(StateOf(run_id), PENDING);  // attempt 1 of 3 since the rerun: retried
}

// A sweep named like another sweep's id: Watch ends with its own sweep, not the one whose name
// is its id.
TEST_F(HardeningTest, ASweepNamedLikeAnIdIsNotConfusedWithIt) {
  Submit(QuickSpec("2"), "two.yaml", false);       // id 1, named "2"
  Submit(QuickSpec("quick"), "quick.yaml", false);  // id 2
  CancelResponse cancelled;
  ASSERT_TRUE(CallCancel("quick", &cancelled).ok());
  auto ctx = Context();
  WatchRequest request;
  request.set_sweep("quick");
  auto reader = client_->Watch(ctx.get(), request);
  WatchEvent e, last;
  while (reader->Read(&e)) last = e;
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(last.has_sweep_done());
  EXPECT_EQ(last.sweep_done().name(), "quick");
  EXPECT_EQ(last.sweep_done().state(), "CANCELLED");
}

// What gRPC receives is bounded per message (16 MiB), and each method bounds its own.
TEST_F(HardeningTest, EachMethodBoundsWhatItTakes) {
  RegisterRequest reg;
  reg.set_name(std::string(100'000, 'w'));
  RegisterResponse registered;
  auto ctx = Context();
  grpc::Status s = worker_->Register(ctx.get(), reg, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("the limit is 65536"));
  QueryRequest q;
  q.set_sql("SELECT 1 -- " + std::string(100'000, 'x'));
  QueryResponse answer;
  ctx = Context();
  s = client_->Query(ctx.get(), q, &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("query: the statement is"));
  SubmitResponse submitted;
  EXPECT_EQ(TrySubmit(std::string(17 << 20, '#'), "", &submitted).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(CountRows("workers"), 0);
}

TEST(CredentialsTest, DerivedCredentialsAndLeaseSecretsAreStableAndDistinct) {
  const Credentials a = Credentials::Derive("secret-a");
  const Credentials b = Credentials::Derive("secret-b");
  EXPECT_EQ(a.worker, Credentials::Derive("secret-a").worker);
  EXPECT_NE(a.worker, b.worker);
  EXPECT_NE(a.read, b.read);
  EXPECT_EQ(a.RoleOf("secret-a"), Role::kAdmin);
  EXPECT_EQ(a.RoleOf(a.worker), Role::kWorker);
  EXPECT_EQ(a.RoleOf(a.read), Role::kRead);
  EXPECT_EQ(a.RoleOf(b.read), Role::kNone);
  EXPECT_EQ(a.RoleOf(""), Role::kNone);
  EXPECT_EQ(a.RoleOf(a.read.substr(0, a.read.size() - 1)), Role::kNone);
  EXPECT_EQ(LeaseSecret("k", 1, 2, 3), LeaseSecret("k", 1, 2, 3));
  EXPECT_NE(LeaseSecret("k", 1, 2, 3), LeaseSecret("k", 1, 3, 3));
  EXPECT_NE(LeaseSecret("k", 1, 2, 3), LeaseSecret("k", 1, 2, 4));
  EXPECT_NE(LeaseSecret("k", 12, 2, 3), LeaseSecret("k", 1, 22, 3));
}

// The keyed HMAC the coordinator signs leases with is HMAC-SHA256 (RFC 4231 case 2), the same
// as the one-shot derivation it replaced (values from Python's hmac), from any number of threads.
TEST(CredentialsTest, TheKeyedHmacIsHmacSha256FromEveryThread) {
  EXPECT_EQ(HmacSha256("Jefe").Hex("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(LeaseSecret("k", 1, 2, 3),
            "4e6d99b2d579bce9e263d8bfd0e6cd028c36fb8a1b36684d616d6c837399d672");
  EXPECT_EQ(LeaseSecret("", 1, 2, 3),
            "b0934ed1dcd998c80d24759be6a3024333b4d745e53457b0652952641f7fee1c");
  const HmacSha256 key("k");
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        wrong += LeaseSecret(key, 1, 2, 3) !=
                 "4e6d99b2d579bce9e263d8bfd0e6cd028c36fb8a1b36684d616d6c837399d672";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const std::string secret = LeaseSecret(key, 1, 2, 3);
  EXPECT_TRUE(LeaseSecretEquals(secret, secret));
  EXPECT_FALSE(LeaseSecretEquals(LeaseSecret(key, 1, 2, 4), secret));
  EXPECT_FALSE(LeaseSecretEquals(secret.substr(1), secret));
  EXPECT_FALSE(LeaseSecretEquals("", secret));
}

}  // namespace
}  // namespace ablate

namespace ablate {
namespace {

// Per-item scores (EvalResult.items) reach the store only for metrics the evaluation reports,
// once each, bounded and finite; an evaluation's time is a finite count of seconds.
TEST(DoorTest, EvalItemsAreCheckedAtTheDoor) {
  const auto summary_with = [](const std::function<void(EvalResult*)>& edit) {
    RunSummary s;
    s.set_state(SUCCEEDED);
    s.set_steps_done(10);
    EvalResult* e = s.mutable_final_eval();
    e->set_step(10);
    (*e->mutable_metrics())["kjv_cloze"] = 0.5;
    EvalItemScores* items = e->add_items();
    items->set_metric("kjv_cloze");
    items->add_values(1);
    items->add_values(0);
    e->set_eval_seconds(0.25);
    edit(e);
    return CheckSummaryAtDoor(s, 10);
  };
  EXPECT_TRUE(summary_with([](EvalResult*) {}).ok());
  const absl::Status unknown =
      summary_with([](EvalResult* e) { e->mutable_items(0)->set_metric("passkey@64"); });
  EXPECT_THAT(std::string(unknown.message()),
              ::testing::HasSubstr("items[0].metric names passkey@64, which is not one of the "
                                   "evaluation's metrics"));
  const absl::Status twice = summary_with([](EvalResult* e) { *e->add_items() = e->items(0); });
  EXPECT_THAT(std::string(twice.message()), ::testing::HasSubstr("a second time"));
  const absl::Status nan = summary_with([](EvalResult* e) {
    e->mutable_items(0)->add_values(std::numeric_limits<float>::quiet_NaN());
  });
  EXPECT_THAT(std::string(nan.message()), ::testing::HasSubstr("not finite"));
  const absl::Status many = summary_with([](EvalResult* e) {
    e->mutable_items(0)->mutable_values()->Resize(kMaxEvalItems + 1, 1.0f);
  });
  EXPECT_THAT(std::string(many.message()), ::testing::HasSubstr("the limit is 65536"));
  const absl::Status time = summary_with([](EvalResult* e) { e->set_eval_seconds(-1); });
  EXPECT_THAT(std::string(time.message()), ::testing::HasSubstr("eval_seconds"));
}

}  // namespace
}  // namespace ablate
