// A running sweep without LibTorch, for the browser test and the load benchmark: writes a results
// store through the real Store API (as the coordinator would from workers' reports) and serves it
// with a real DashboardServer reading the file read-only.
//
//   dashboard_sim --db DIR/ablate.db --token T --mode live   # runs appear, points grow, one run
//                                                            # spikes then DIVERGES (SIGUSR1)
//   dashboard_sim --db ... --mode bench --runs 40 --steps 10000  # a finished sweep to load (its
//                                                                # last run spiked and DIVERGED),
//                                                                # and two tuned ones: boundary
//                                                                # and halving (WriteTunedSweep)
//
// Evaluations carry validation losses at 64..1024 positions (YaRN beyond the training length
// 256), growing with length by variant and a little by seed. Live, they also carry 2 attention
// maps per layer, except the diverging run's (it stands for a run that stores none).
//
// Live, the second run is a program run (its config has a `program:` block): its first attempt
// was lost, its second trains a step a tick after its first (slower than the others: it is still
// RUNNING when the browser test reaches its page), and its output goes where a worker keeps it,
// CHECKPOINT_ROOT/run-<id>/logs/attempt-N.log (--checkpoint-root, default beside the database),
// a line per step and every 20 steps one of markup and bytes that are not UTF-8. The dashboard
// reads that checkpoint root.
//
// Prints one JSON line {"url", "port", "sweep", "diverging_run", "program_run"} once serving,
// then runs until SIGINT/SIGTERM or --duration seconds. SIGUSR1 (live): the third run spikes,
// then DIVERGES, soon.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "orchestrator/dashboard/server.h"
#include "tests/orchestrator/dashboard/dashboard_test_util.h"

namespace ablate {
namespace {

using namespace dashboard_test;

std::atomic<bool> g_stop{false};
std::atomic<bool> g_diverge_now{false};

void OnSignal(int) { g_stop = true; }
void OnDivergeSignal(int) { g_diverge_now = true; }

struct LiveRun {
  int64_t id = 0;
  int32_t attempt = 1;
  int64_t step = 0;
  int64_t seq = 0;
};

absl::Status Check(const absl::Status& s) {
  if (!s.ok()) std::cerr << "dashboard_sim: " << s << "\n";
  return s;
}

// Validation losses at 64..1024 positions for run `run_id` of variant `variant` (its index),
// trained at 256: each variant's loss grows at its own rate past it, each seed a little
// differently.
void AddSimLengths(EvalResult* e, int64_t run_id, size_t variant) {
  const double growth[] = {0.45, 0.18, 0.25, 0.3};
  AddLengths(e, {64, 128, 256, 512, 1024}, 256,
             growth[variant % 4] + 0.02 * static_cast<double>(run_id % 3));
  // An evaluation task's accuracy with its 40 items (docs/evals.md): each variant right on a
  // few more of them, the same items at every seed.
  EvalItemScores* items = e->add_items();
  items->set_metric("cloze_acc@40");
  double right = 0;
  for (int i = 0; i < 40; ++i) {
    const bool hit = (i * 7 + static_cast<int>(run_id % 3)) % 10 < 3 + static_cast<int>(variant);
    items->add_values(hit ? 1.0f : 0.0f);
    right += hit ? 1 : 0;
  }
  (*e->mutable_metrics())["cloze_acc@40"] = right / 40;
}

// A finished sweep of `runs` runs x `steps` steps (4 variants), evaluations every steps/10. The
// last run stands for an unstable one: its loss spikes at 60% of the steps (a catastrophic spike,
// recorded), goes non-finite at 70% and it DIVERGES 2 steps later.
absl::Status WriteBench(Store* store, int runs, int64_t steps) {
  const std::vector<std::string> variants = {"baseline", "g1_elementwise", "g1_headwise",
                                             "g2_elementwise"};
  const int seeds = (runs + 3) / 4;
  absl::StatusOr<SweepIds> ids = store->CreateSweep(MakeSweep("bench", variants, seeds, steps));
  if (!ids.ok()) return ids.status();
  const int64_t spike_step = steps * 6 / 10, nonfinite_step = steps * 7 / 10;
  for (size_t i = 0; i < ids->run_ids.size() && static_cast<int>(i) < runs; ++i) {
    const int64_t id = ids->run_ids[i];
    const bool diverges = runs >= 4 && static_cast<int>(i) == runs - 1 && nonfinite_step > spike_step;
    const int64_t last = diverges ? nonfinite_step + 2 : steps;
    if (absl::StatusOr<TransitionResult> r = StartRun(store, id); !r.ok()) return r.status();
    const int64_t chunk = 5000;
    for (int64_t first = 1, seq = 1; first <= last; first += chunk, ++seq) {
      MetricBatch b = StepBatch(id, 1, seq, first, std::min(chunk, last - first + 1));
      for (int64_t e = first; e < first + chunk && e <= last; ++e) {
        if (e % std::max<int64_t>(1, steps / 10) != 0) continue;
        AddSimLengths(&b.evals.emplace_back(Eval(e, 4, true)), id, i % variants.size());
      }
      for (StepMetrics& m : b.steps) {
        if (!diverges) break;
        if (m.step() >= spike_step && m.step() < spike_step + 3) m.set_loss(m.loss() * 6);
        if (m.step() >= nonfinite_step) m.set_loss(std::numeric_limits<double>::quiet_NaN());
        if (m.step() != spike_step && m.step() != last) continue;
        SpikeEvent& s = b.spikes.emplace_back();
        s.set_step(m.step());
        s.set_signal("loss");
        s.set_value(m.loss());
        s.set_baseline(3);
        s.set_kind(m.step() == spike_step ? SPIKE_CATASTROPHIC : SPIKE_NONFINITE);
        s.set_action(m.step() == spike_step ? SPIKE_ACTION_RECORDED : SPIKE_ACTION_STOPPED);
      }
      if (absl::StatusOr<ReportResult> r = store->ReportMetrics(b); !r.ok()) return r.status();
    }
    if (diverges) {
      if (auto r = FinishRun(store, id, DIVERGED, last, "loss non-finite for 3 steps", 2); !r.ok()) {
        return r.status();
      }
      continue;
    }
    if (auto r = FinishRun(store, id, SUCCEEDED, steps, ""); !r.ok()) return r.status();
  }
  return store->Flush();
}

// One tick of the live sweep: every RUNNING run advances `per_tick` steps; the diverging run
// spikes at spike_step and goes non-finite at diverge_step; finished runs make room for pending
// ones (at most `parallel` running).
class LiveSweep {
 public:
  LiveSweep(Store* store, std::vector<int64_t> ids, size_t variants, int64_t steps, int parallel,
            int64_t spike_step, int64_t diverge_step)
      : store_(store), pending_(std::move(ids)), variants_(variants), steps_(steps),
        parallel_(parallel), spike_step_(spike_step), diverge_step_(diverge_step) {
    diverging_ = pending_.size() > 2 ? pending_[2] : pending_.back();
    for (size_t i = 0; i < pending_.size(); ++i) variant_of_[pending_[i]] = i % variants_;
  }
  int64_t diverging() const { return diverging_; }
  int64_t program_run() const { return program_run_; }
  // The worker its runs are started on (0: none).
  void set_worker(int64_t worker) { worker_ = worker; }
  // The program run, and the directory its worker keeps its output in.
  void set_program_run(int64_t id, std::filesystem::path logs) {
    program_run_ = id;
    program_logs_ = std::move(logs);
  }

  // SIGUSR1: the diverging run spikes 10 steps from now and goes non-finite 60 steps from now.
  void DivergeSoon() {
    auto it = running_.find(diverging_);
    const int64_t at = it == running_.end() ? 0 : it->second.step;
    spike_step_ = at + 10;
    diverge_step_ = at + 60;
  }

  absl::Status Tick(int64_t per_tick) {
    while (static_cast<int>(running_.size()) < parallel_ && !pending_.empty()) {
      const int64_t id = pending_.front();
      pending_.erase(pending_.begin());
      if (auto r = StartRun(store_, id, worker_); !r.ok()) return r.status();
      running_[id] = LiveRun{id, 1, 0, 0};
      if (id == program_run_) {
        if (absl::Status s = StartProgramRun(&running_[id]); !s.ok()) return s;
      }
    }
    for (auto it = running_.begin(); it != running_.end();) {
      LiveRun& run = it->second;
      // The program run, after its first tick: a step a tick.
      const int64_t stride = run.id == program_run_ && run.step > 0 ? 1 : per_tick;
      const int64_t n = std::min(stride, steps_ - run.step);
      MetricBatch b = StepBatch(run.id, run.attempt, ++run.seq, run.step + 1, n);
      if (run.id == program_run_) {
        std::ofstream log(program_logs_ / "attempt-2.log", std::ios::app | std::ios::binary);
        for (const StepMetrics& m : b.steps) {
          log << "step " << m.step() << ": loss " << m.loss() << "\n";
          if (m.step() % 20 == 0) {
            log << "step " << m.step() << ": <b>markup stays text</b>, not UTF-8: \xff\xfe\n";
          }
        }
      }
      bool diverged = false;
      for (StepMetrics& m : b.steps) {
        if (m.step() % 100 == 0) {
          EvalResult& e = b.evals.emplace_back(Eval(m.step(), 4, true));
          AddSimLengths(&e, run.id, variant_of_[run.id]);
          if (run.id != diverging_) AddAttentionMaps(&e, 4, 2, 64);
        }
        if (run.id != diverging_) continue;
        if (m.step() >= spike_step_ && m.step() < spike_step_ + 3) m.set_loss(m.loss() * 8);
        if (m.step() == spike_step_) {
          SpikeEvent& s = b.spikes.emplace_back();
          s.set_step(m.step());
          s.set_signal("loss");
          s.set_value(m.loss());
          s.set_baseline(m.loss() / 8 * 1.2);
          s.set_kind(SPIKE_CATASTROPHIC);
          s.set_action(SPIKE_ACTION_RECORDED);
        }
        if (m.step() >= diverge_step_) {
          m.set_loss(std::numeric_limits<double>::quiet_NaN());
          m.set_skipped(true);
          if (m.step() == diverge_step_ + 2) {
            SpikeEvent& s = b.spikes.emplace_back();
            s.set_step(m.step());
            s.set_signal("loss");
            s.set_value(std::numeric_limits<double>::quiet_NaN());
            s.set_baseline(3);
            s.set_kind(SPIKE_NONFINITE);
            s.set_action(SPIKE_ACTION_STOPPED);
            diverged = true;
            b.steps.resize(m.step() - b.steps.front().step() + 1);
            break;
          }
        }
      }
      if (absl::StatusOr<ReportResult> r = store_->ReportMetrics(b); !r.ok()) return r.status();
      run.step = b.steps.back().step();
      if (diverged) {
        if (auto r = FinishRun(store_, run.id, DIVERGED, run.step, "loss non-finite for 3 steps", 2);
            !r.ok()) {
          return r.status();
        }
        it = running_.erase(it);
      } else if (run.step >= steps_) {
        if (auto r = FinishRun(store_, run.id, SUCCEEDED, run.step, ""); !r.ok()) {
          return r.status();
        }
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    return absl::OkStatus();
  }

 private:
  // The program run's first attempt, lost with its worker after a few lines of output, then its
  // second.
  absl::Status StartProgramRun(LiveRun* run) {
    std::filesystem::create_directories(program_logs_);
    std::ofstream(program_logs_ / "attempt-1.log", std::ios::binary)
        << "attempt 1: training from step 0\nstep 1: loss 5.1\n";
    RunTransition lost = testing::MakeTransition(run->id, {RUNNING}, PENDING);
    lost.attempt_end = "LOST";
    lost.reason = "worker lost (simulated)";
    if (auto r = store_->TransitionRun(lost); !r.ok()) return r.status();
    if (auto r = StartRun(store_, run->id, worker_); !r.ok()) return r.status();
    run->attempt = 2;
    std::ofstream(program_logs_ / "attempt-2.log", std::ios::binary)
        << "attempt 2: resuming from step 1\n";
    return absl::OkStatus();
  }

  Store* store_;
  std::vector<int64_t> pending_;
  const size_t variants_;
  std::map<int64_t, size_t> variant_of_;  // run id -> variant index (runs are seed-major)
  std::map<int64_t, LiveRun> running_;
  const int64_t steps_;
  const int parallel_;
  int64_t worker_ = 0;
  int64_t program_run_ = 0;
  std::filesystem::path program_logs_;
  int64_t spike_step_, diverge_step_;
  int64_t diverging_ = 0;
};

int Main(int argc, char** argv) {
  CLI::App app("Simulated sweep + dashboard server for the dashboard's browser test and bench");
  std::string db, token = "dashboard-sim-token", mode = "live", checkpoint_root;
  int runs = 40, parallel = 4, port = 0;
  int64_t steps = 10000, per_tick = 5;
  int64_t spike_step = std::numeric_limits<int64_t>::max() / 2, diverge_step = spike_step;
  double duration_s = 300, tick_s = 0.1;
  app.add_option("--db", db, "database file (created)")->required();
  app.add_option("--token", token);
  app.add_option("--port", port);
  app.add_option("--mode", mode, "live | bench")->check(CLI::IsMember({"live", "bench"}));
  app.add_option("--runs", runs, "bench: runs");
  app.add_option("--steps", steps, "steps per run");
  app.add_option("--parallel", parallel, "live: runs training at once");
  app.add_option("--spike-step", spike_step, "live: the diverging run spikes here (or on SIGUSR1)");
  app.add_option("--diverge-step", diverge_step, "live: ... and goes non-finite here");
  app.add_option("--steps-per-tick", per_tick);
  app.add_option("--tick", tick_s, "live: seconds between reports");
  app.add_option("--duration", duration_s, "seconds before exiting by itself");
  app.add_option(
      "--checkpoint-root", checkpoint_root,
      "live: where the program run's output is kept (default DB's directory/checkpoints)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGUSR1, OnDivergeSignal);

  if (checkpoint_root.empty()) {
    checkpoint_root = (std::filesystem::path(db).parent_path() / "checkpoints").string();
  }
  StoreOptions so;
  so.path = db;
  so.synchronous_full = false;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(so);
  if (!Check(store.status()).ok()) return 1;
  std::unique_ptr<LiveSweep> live;
  std::string sweep;
  if (mode == "bench") {
    sweep = "bench";
    if (!Check(WriteBench(store->get(), runs, steps)).ok()) return 1;
    // Beside it, two finished tuned sweeps for the compare page's tuning chart.
    if (!Check(WriteTunedSweep(store->get(), "boundary", "boundary").status()).ok()) return 1;
    if (!Check(WriteTunedSweep(store->get(), "halving", "asha").status()).ok()) return 1;
  } else {
    sweep = "quick";
    if (mode == "live" && steps == 10000) steps = 600;
    const std::vector<std::string> variants = {"baseline", "g1_elementwise", "g1_headwise"};
    SweepRecord record = MakeSweep(sweep, variants, 2, steps);
    ProgramConfig* program = record.expanded.mutable_runs(1)->mutable_config()->mutable_program();
    program->set_command("python3 train.py {args}");
    program->set_steps("max_iters");
    absl::StatusOr<SweepIds> ids = (*store)->CreateSweep(record);
    if (!Check(ids.status()).ok()) return 1;
    live = std::make_unique<LiveSweep>(store->get(), ids->run_ids, variants.size(), steps, parallel,
                                       spike_step, diverge_step);
    live->set_program_run(ids->run_ids[1], std::filesystem::path(checkpoint_root) /
                                               absl::StrCat("run-", ids->run_ids[1]) / "logs");
    // One worker of `parallel` slots trains them (the sweeps page lists its slots in use).
    absl::StatusOr<int64_t> worker = (*store)->RegisterWorker(
        "sim-worker", absl::StrCat("{\"device\":\"cpu\",\"slots\":", parallel, "}"));
    if (!Check(worker.status()).ok()) return 1;
    live->set_worker(*worker);
    // Runs already under way when the page opens, each with a first evaluation.
    if (!Check(live->Tick(100)).ok()) return 1;
    if (!Check((*store)->Flush()).ok()) return 1;
  }

  DashboardOptions o;
  o.port = port;
  o.token = token;
  o.db_path = db;
  o.checkpoint_root = checkpoint_root;
  absl::StatusOr<std::unique_ptr<DashboardServer>> server = DashboardServer::Start(o);
  if (!Check(server.status()).ok()) return 1;
  std::cout << nlohmann::json{{"url", (*server)->Url()},
                              {"port", (*server)->port()},
                              {"sweep", sweep},
                              {"diverging_run", live ? live->diverging() : 0},
                              {"program_run", live ? live->program_run() : 0}}
                   .dump()
            << std::endl;

  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(duration_s * 1000));
  while (!g_stop && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(tick_s * 1000)));
    if (live && g_diverge_now.exchange(false)) live->DivergeSoon();
    if (live && !Check(live->Tick(per_tick)).ok()) return 1;
  }
  (*server)->Stop();
  return 0;
}

}  // namespace
}  // namespace ablate

int main(int argc, char** argv) { return ablate::Main(argc, argv); }
