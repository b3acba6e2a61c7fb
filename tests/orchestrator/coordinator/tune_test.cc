// The tuner against a real coordinator: fake workers finish each job at the rung it names with
// fixed metric values, in the scheduler's order, so that ASHA's decisions can be worked by hand;
// a restart in the middle decides nothing twice. And `table --best`, `compare --best`.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "config/program_config.h"
#include "config/program_snapshot.h"
#include "gmock/gmock.h"
#include "tests/orchestrator/coordinator/coordinator_test_util.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;

class TuneTest : public CoordinatorFixture {
 protected:
  // One variant, nine learning rates (k x 1e-4, k = 1..9), rungs at steps 10 and 30 of 90.
  static std::string AshaSpec() {
    return R"(sweep: asha
base:
  model: {d_model: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,
          ffn_dim: 256, max_seq_len: 64}
  train: {steps: 90, batch_size: 4, seq_len: 64, threads: 1, optimizer: {warmup_steps: 10}}
variants: [baseline]
seeds: [0]
resources: {device: cpu, threads: 1}
tune:
  axis: train.optimizer.lr
  values: [1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4, 7e-4, 8e-4, 9e-4]
  method: asha
  rungs: [10, 30]
  reduction_factor: 3
)";
  }
  // The value's k, and its validation loss at `step`: best at k = 5, ties at equal |k - 5|.
  static int K(const Job& job) {
    return static_cast<int>(std::lround(job.config().train().optimizer().lr() / 1e-4));
  }
  static double Loss(int k, int64_t step) {
    return std::fabs(k - 5.0) + 1.0 - static_cast<double>(step) / 1000.0;
  }

  // Takes jobs one at a time and ends each where it says: INTERRUPTED at its rung with the
  // rung's evaluation and a checkpoint, else SUCCEEDED at step 90. "k@stop" per job, in order;
  // stops after `max_jobs` jobs or when none is left.
  std::vector<std::string> Drive(int64_t worker, int max_jobs, int64_t* steps,
                                 const std::string& named = "") {
    std::vector<std::string> log;
    for (int i = 0; i < max_jobs; ++i) {
      AcquireJobResponse r = TryAcquire(worker);
      if (!r.has_job()) break;
      const Job& job = r.job();
      const int64_t stop = job.stop_at_step();
      const int64_t end = stop > 0 ? stop : 90;
      log.push_back(absl::StrCat(K(job), "@", stop));
      // A promoted run resumes from its rung's checkpoint: it trains only the steps after it.
      *steps += end - job.resume_from_step();
      FinishRequest f = MakeFinish(worker, job, stop > 0 ? INTERRUPTED : SUCCEEDED);
      f.mutable_summary()->set_steps_done(end);
      f.mutable_summary()->mutable_final_eval()->set_step(end);
      if (named.empty()) {
        f.mutable_summary()->mutable_final_eval()->set_val_loss(Loss(K(job), end));
      } else {
        // Ranked by a metric by name, better higher; val_loss says the opposite (best at k=1).
        f.mutable_summary()->mutable_final_eval()->set_val_loss(K(job));
        (*f.mutable_summary()->mutable_final_eval()->mutable_metrics())[named] =
            10.0 - Loss(K(job), end);
      }
      ReportRequest* last = f.mutable_final_report();
      last->set_seq(1);
      last->set_checkpoint_step(end);
      last->set_checkpoint_path(absl::StrCat(root_, "/ckpt-", job.run_id(), "-", end));
      FinishResponse response;
      grpc::Status s = CallFinish(f, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return log;
  }

  std::string Query(const std::string& sql) {
    QueryRequest q;
    q.set_sql(sql);
    q.set_format("csv");
    QueryResponse out;
    grpc::Status s = Call(client_.get(), &Coordinator::Stub::Query, q, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.formatted();
  }
};

// The same tune ranked by an eval metric (mqar@8, better higher, docs/evals.md): the tuner reads
// it from eval_values at each rung and makes the same decisions.
TEST_F(TuneTest, AshaRanksByAMetricOfTheEvals) {
  std::string spec = absl::StrReplaceAll(AshaSpec(), {{"  reduction_factor: 3\n",
                                                       "  reduction_factor: 3\n  metric: mqar@8\n"
                                                       "  mode: max\n"}});
  spec += "evals:\n  - {task: mqar, pairs: 8, samples: 4}\n";
  SubmitResponse submitted = Submit(spec, "asha.yaml", false);
  ASSERT_EQ(submitted.runs(), 9);
  int64_t steps = 0;
  const int64_t worker = RegisterWorker("w");
  std::vector<std::string> log = Drive(worker, 30, &steps, "mqar@8");
  EXPECT_EQ(absl::StrJoin(log, " "),
            "1@10 2@10 3@10 3@30 4@10 4@30 5@10 5@30 5@0 6@10 7@10 8@10 9@10 6@30");
  EXPECT_EQ(steps, 230);
  EXPECT_EQ(Query("SELECT r.state, t.value FROM runs r JOIN tune_runs t ON t.run_id = r.id "
                  "WHERE r.state = 'SUCCEEDED'"),
            "state,value\nSUCCEEDED,0.0005\n");
}

TEST_F(TuneTest, AshaPromotesTheTopThirdAtEachRungAndStopsTheRestEvenAcrossARestart) {
  SubmitResponse submitted = Submit(AshaSpec(), "asha.yaml", false);
  ASSERT_EQ(submitted.runs(), 9);
  EXPECT_EQ(submitted.queued(), 9);
  int64_t steps = 0;
  const int64_t worker = RegisterWorker("w");
  // Worked by hand (runs go in run order, k = 1, 2, ...; a promoted run is taken before later
  // ones): at 3 arrivals at rung 0 the best of them (k=3) goes on; k=4 and k=5 each lead rung 0
  // when they arrive; k=5 then leads rung 1 of 3 and trains to the end.
  std::vector<std::string> log = Drive(worker, 9, &steps);
  EXPECT_EQ(absl::StrJoin(log, " "), "1@10 2@10 3@10 3@30 4@10 4@30 5@10 5@30 5@0");

  // A restart while k=1, 2 wait at rung 0 and k=3, 4 at rung 1: they stay held, nothing is
  // decided again, and the rest is dealt the same.
  Restart();
  GetSweepResponse held = GetSweep("asha");
  int waiting = 0;
  for (const RunStatus& r : held.runs()) waiting += r.held() ? 1 : 0;
  EXPECT_EQ(waiting, 4);
  const int64_t again = RegisterWorker("w2");
  // k = 6..9 reach rung 0; with all nine there its top 3 are k = 5, 4, 6: k=6 goes on (k=3,
  // promoted early, stands), the rest stop. At rung 1, k=5 was the one: k = 3, 4, 6 stop.
  log = Drive(again, 20, &steps);
  EXPECT_EQ(absl::StrJoin(log, " "), "6@10 7@10 8@10 9@10 6@30");
  EXPECT_FALSE(TryAcquire(again).has_job());

  // 9 x 10 steps to rung 0, 4 x 20 to rung 1, 60 to the end: 230 of the grid's 810.
  EXPECT_EQ(steps, 230);
  GetSweepResponse done = GetSweep("asha");
  EXPECT_EQ(done.sweep().state(), "DONE");
  std::map<int, std::string> states;
  for (const RunStatus& r : done.runs()) {
    states[r.run_id()] = RunStateName(r.state());
    if (r.state() == STOPPED) {
      EXPECT_THAT(r.reason(), HasSubstr("stopped at rung")) << r.run_id();
      EXPECT_GT(r.val_loss(), 0) << "the rung's evaluation is kept";
      EXPECT_FALSE(r.held());
    }
  }
  EXPECT_EQ(done.sweep().runs_by_state().at("STOPPED"), 8);
  EXPECT_EQ(done.sweep().runs_by_state().at("SUCCEEDED"), 1);
  EXPECT_EQ(Query("SELECT kind, rung, group_concat(CAST(round(value * 1e4) AS INTEGER), ' ') "
                  "AS k FROM (SELECT * FROM tune_decisions ORDER BY value) GROUP BY kind, rung "
                  "ORDER BY kind, rung"),
            "kind,rung,k\n"
            "promote,0,3 4 5 6\npromote,1,5\nstop,0,1 2 7 8 9\nstop,1,3 4 6\n");
  // The winner's rung pauses did not count against its retries: attempts 3, base 2.
  EXPECT_EQ(Query("SELECT attempts, attempt_base FROM runs r JOIN tune_runs t ON t.run_id = r.id "
                  "WHERE r.state = 'SUCCEEDED'"),
            "attempts,attempt_base\n3,2\n");

  // Each variant at its best value; the plan line says what it costs.
  TableRequest table;
  table.set_sweep("asha");
  table.set_best(true);
  table.set_format("csv");
  TableResponse best;
  ASSERT_TRUE(Call(client_.get(), &Coordinator::Stub::Table, table, &best).ok());
  // The tuned column after every other, then the costs (kept last: older tables keep their shape).
  EXPECT_THAT(best.formatted(), HasSubstr(",best,peak_memory_bytes_mean,"));
  EXPECT_THAT(best.formatted(), HasSubstr("train.optimizer.lr=5e-4"));
}

TEST_F(TuneTest, AFullRerunOfATunedSweepIsRefusedAndAnUntunedOneHasNoBestTable) {
  Submit(AshaSpec(), "asha.yaml", false);
  RerunRequest rerun;
  rerun.set_sweep("asha");
  RerunResponse response;
  grpc::Status s = Call(client_.get(), &Coordinator::Stub::Rerun, rerun, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("its decisions are not redone"));

  SubmitQuick();
  CompareRequest compare;
  compare.add_sweeps("quick");
  compare.set_best(true);
  CompareResponse out;
  s = Call(client_.get(), &Coordinator::Stub::Compare, compare, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("sweep quick has no tune: block"));
}

// A boundary sweep against a stability function: runs above lr 0.0123 diverge. Probes are added
// one after the other, the sweep is not DONE between them, a restart keeps the bracket going,
// and resubmitting the spec is still the same sweep.
TEST_F(TuneTest, BoundaryBisectsWithProbesAddedAfterSubmitUntilTheBracketIsNarrow) {
  const std::string spec = R"(sweep: boundary
base:
  model: {d_model: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,
          ffn_dim: 256, max_seq_len: 64}
  train: {steps: 90, batch_size: 4, seq_len: 64, threads: 1, optimizer: {warmup_steps: 10}}
variants: [baseline]
seeds: [0, 1]
resources: {device: cpu, threads: 1}
tune:
  axis: train.optimizer.lr
  range: {min: 1e-3, max: 1e-1}
  method: boundary
  tolerance: 1.25
)";
  SubmitResponse submitted = Submit(spec, "boundary.yaml", false);
  ASSERT_EQ(submitted.runs(), 4);
  std::vector<std::string> tried;
  const auto drive = [&](int64_t worker, int max_jobs) {
    for (int i = 0; i < max_jobs; ++i) {
      AcquireJobResponse r = TryAcquire(worker);
      if (!r.has_job()) return;
      const double lr = r.job().config().train().optimizer().lr();
      if (r.job().config().train().seed() == 0) tried.push_back(absl::StrCat(lr));
      const bool diverges = lr > 0.0123;
      FinishRequest f = MakeFinish(worker, r.job(), diverges ? DIVERGED : SUCCEEDED);
      f.mutable_summary()->set_steps_done(diverges ? 40 : 90);
      f.mutable_summary()->mutable_final_eval()->set_step(diverges ? 0 : 90);
      FinishResponse response;
      ASSERT_TRUE(CallFinish(f, &response).ok());
    }
  };
  drive(RegisterWorker("w"), 4);  // min and max, both seeds
  // The next probe is there, and the sweep waits for it.
  GetSweepResponse between = GetSweep("boundary");
  EXPECT_EQ(between.sweep().state(), "ACTIVE");
  EXPECT_EQ(between.runs_size(), 6);
  EXPECT_EQ(between.sweep().tune_method(), "boundary");
  drive(RegisterWorker("w1"), 4);  // 0.01 and 0.0316228
  Restart();
  SubmitResponse again = Submit(spec, "boundary.yaml", false);
  EXPECT_TRUE(again.already_exists());
  drive(RegisterWorker("w2"), 40);
  EXPECT_EQ(absl::StrJoin(tried, " "), "0.001 0.1 0.01 0.0316228 0.0177828 0.0133352 0.0115478");
  GetSweepResponse done = GetSweep("boundary");
  EXPECT_EQ(done.sweep().state(), "DONE");
  EXPECT_EQ(done.runs_size(), 14);

  TableRequest table;
  table.set_sweep("boundary");
  table.set_stability(true);
  table.set_format("csv");
  TableResponse csv;
  ASSERT_TRUE(Call(client_.get(), &Coordinator::Stub::Table, table, &csv).ok());
  EXPECT_EQ(csv.formatted(),
            "variant,axes,stable,unstable,probes\nbaseline,,0.0115478,0.0133352,5\n");
  table.set_format("markdown");
  TableResponse markdown;
  ASSERT_TRUE(Call(client_.get(), &Coordinator::Stub::Table, table, &markdown).ok());
  EXPECT_THAT(markdown.formatted(),
              HasSubstr("| baseline | 0.0115478 | 0.0133352 | 5 | stable up to 0.0115478, "
                        "unstable from 0.0133352 |"));
}

// A grid tune of two variants: each at its own best learning rate, compared at it.
TEST_F(TuneTest, EachVariantIsComparedAtItsOwnBestValue) {
  Submit(R"(sweep: grid
base:
  model: {d_model: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,
          ffn_dim: 256, max_seq_len: 64}
  train: {steps: 90, batch_size: 4, seq_len: 64, threads: 1, optimizer: {warmup_steps: 10}}
variants: [baseline, g1_elementwise]
budget: {match: ffn, reference: baseline, tolerance: 0.01}
seeds: [0, 1, 2]
resources: {device: cpu, threads: 1}
tune:
  axis: train.optimizer.lr
  values: [1e-3, 2e-3]
)",
         "grid.yaml", false);
  const int64_t worker = RegisterWorker("w");
  for (int i = 0; i < 12; ++i) {
    AcquireJobResponse r = TryAcquire(worker);
    ASSERT_TRUE(r.has_job());
    const Job& job = r.job();
    const bool low = job.config().train().optimizer().lr() < 1.5e-3;
    const bool gated = job.variant() == "g1_elementwise";
    const uint64_t seed = job.config().train().seed();
    // The baseline is best at 1e-3 (2.0), the gated model at 2e-3 (1.9); seeds add 0.01 x seed.
    const double loss = (gated ? (low ? 2.1 : 1.9) : (low ? 2.0 : 2.2)) + 0.01 * seed +
                        (gated ? 0.001 * seed * seed : 0);
    FinishRequest f = MakeFinish(worker, job, SUCCEEDED);
    f.mutable_summary()->set_steps_done(90);
    f.mutable_summary()->mutable_final_eval()->set_step(90);
    f.mutable_summary()->mutable_final_eval()->set_val_loss(loss);
    FinishResponse response;
    ASSERT_TRUE(CallFinish(f, &response).ok());
  }
  CompareRequest compare;
  compare.add_sweeps("grid");
  compare.set_best(true);
  compare.set_format("csv");
  CompareResponse out;
  grpc::Status s = Call(client_.get(), &Coordinator::Stub::Compare, compare, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::vector<std::string> lines = absl::StrSplit(out.formatted(), '\n');
  ASSERT_GE(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr(",min_detectable,value,reference_value"));
  // g1 at 2e-3 against the baseline at 1e-3: 3 pairs, Δ = -0.1 + 0.001 s² on average.
  EXPECT_THAT(lines[1], HasSubstr("g1_elementwise,,val_loss,3,"));
  EXPECT_THAT(lines[1], HasSubstr(",better,"));
  EXPECT_THAT(lines[1], HasSubstr(",2e-3,1e-3"));

  TableRequest table;
  table.set_sweep("grid");
  table.set_best(true);
  TableResponse markdown;
  ASSERT_TRUE(Call(client_.get(), &Coordinator::Stub::Table, table, &markdown).ok());
  EXPECT_THAT(markdown.formatted(), HasSubstr("Same config (every value of train.optimizer.lr)"));
  EXPECT_THAT(markdown.formatted(), HasSubstr("| g1_elementwise | train.optimizer.lr=2e-3 | 3 |"));
  EXPECT_THAT(markdown.formatted(), HasSubstr("| baseline | train.optimizer.lr=1e-3 | 3 |"));
}

// The same bisection over a program's param: the coordinator expands each probe from the stored
// spec with the program's code hash (not its own build's), every probe's job carries the code,
// and a program with count: is refused for boundary (the coordinator cannot run it).
TEST_F(TuneTest, BoundaryProbesAProgramsParamWithItsCode) {
  const std::string spec = R"(sweep: program-boundary
program: {code: ["*.py"], command: "python3 train.py", args: none, steps: steps}
base:
  params: {steps: 90, lr: 0.001}
variants: [{name: mine}]
seeds: [0, 1]
tune:
  axis: params.lr
  range: {min: 1e-3, max: 1e-1}
  method: boundary
  tolerance: 1.25
)";
  SubmitRequest request;
  request.set_spec_yaml(spec);
  request.set_spec_file("program-boundary.yaml");
  ProgramFile* file = request.mutable_program()->add_files();
  file->set_path("train.py");
  file->set_content("print('training')\n");
  request.mutable_program()->set_code_hash(SnapshotHash(request.program()));
  SubmitResponse submitted;
  ASSERT_TRUE(Call(client_.get(), &Coordinator::Stub::Submit, request, &submitted).ok());
  ASSERT_EQ(submitted.runs(), 4);
  std::vector<std::string> tried;
  const auto drive = [&](int64_t worker, int max_jobs) {
    for (int i = 0; i < max_jobs; ++i) {
      AcquireJobResponse r = TryAcquire(worker);
      if (!r.has_job()) return;
      ASSERT_EQ(r.job().program().code_hash(), request.program().code_hash());
      ASSERT_EQ(r.job().program().files(0).content(), "print('training')\n");
      const double lr = *ProgramParamNumber(r.job().config().program(), "lr");
      if (r.job().config().train().seed() == 0) tried.push_back(absl::StrCat(lr));
      const bool diverges = lr > 0.0123;
      FinishRequest f = MakeFinish(worker, r.job(), diverges ? DIVERGED : SUCCEEDED);
      f.mutable_summary()->set_steps_done(diverges ? 40 : 90);
      f.mutable_summary()->mutable_final_eval()->set_step(diverges ? 0 : 90);
      FinishResponse response;
      ASSERT_TRUE(CallFinish(f, &response).ok());
    }
  };
  drive(RegisterWorker("w"), 4);
  Restart();
  drive(RegisterWorker("w2"), 40);
  EXPECT_EQ(absl::StrJoin(tried, " "), "0.001 0.1 0.01 0.0316228 0.0177828 0.0133352 0.0115478");
  EXPECT_EQ(GetSweep("program-boundary").sweep().state(), "DONE");

  std::string with_count = spec;
  with_count.replace(with_count.find("args: none"), 10, "args: none, count: python3 count.py");
  request.set_spec_yaml(absl::StrReplaceAll(with_count, {{"program-boundary", "counted"}}));
  grpc::Status refused = Call(client_.get(), &Coordinator::Stub::Submit, request, &submitted);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("cannot run program.count"));
}

}  // namespace
}  // namespace ablate
