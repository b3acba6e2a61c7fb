// The results store against the targets, measured side by side in one run:
//   1. ingestion: metric points per second end to end through the Store's writer API
//      (N simulated runs, each reporting batches of B points and waiting for the ack, as the
//      gRPC handlers do; then the same through the asynchronous path). Target >= 200,000/s.
//   2. `ablate table` (GetComparisonTable + markdown) over 1,000 runs with 10,000 steps each
//      (10M step rows, generated first with one INSERT ... SELECT). Target < 200 ms.
//
//   3. dispatch writes: the store's share of dispatching a no-op job, as the coordinator writes
//      it for a Finish that carries the last batch and takes the next job (FinishAttempt: 10
//      step rows, the end of one run, the start of the next), from 64 threads over 10,000 runs.
//      The gRPC share is what bench_scheduler adds.
//
//   bench_store [--dir DIR] [--runs 1000] [--steps 10000] [--ingest_runs 64]
//               [--ingest_batches 100] [--batch 100] [--dispatch_jobs 10000]
//               [--phases ingest,table,dispatch]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/binary_init.h"
#include "config/model_config.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/store.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/process_util.h"

namespace ablate {
namespace {

struct Args {
  std::string dir;
  int runs = 1000;
  int steps = 10000;
  int ingest_runs = 64;
  int ingest_batches = 100;
  int batch = 100;
  int dispatch_jobs = 10000;
  std::string phases = "ingest,table,dispatch";  // which of the three to run
  bool Runs(const std::string& phase) const {
    for (absl::string_view p : absl::StrSplit(phases, ',')) {
      if (p == phase) return true;
    }
    return false;
  }
};

SweepRecord MakeSweep(const std::string& name, int variants, int seeds, int steps) {
  SweepRecord record;
  ExpandedSweep& sweep = record.expanded;
  sweep.set_name(name);
  sweep.set_priority(1);
  for (int v = 0; v < variants; ++v) sweep.add_variants(absl::StrCat("variant_", v));
  RunConfig config = DefaultRunConfig();
  config.mutable_train()->set_steps(steps);
  int index = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    for (int v = 0; v < variants; ++v) {
      RunSpec* run = sweep.add_runs();
      run->set_variant(absl::StrCat("variant_", v));
      run->set_index(index++);
      run->set_seed(seed);
      *run->mutable_config() = config;
      run->mutable_config()->mutable_train()->set_seed(seed);
      run->set_run_key(absl::StrCat(name, v, "-", seed));
      run->mutable_params()->set_total(1100000 + 16384 * v);
      run->set_added_params(16384 * v);
    }
  }
  return record;
}

MetricBatch MakeBatch(int64_t run, int64_t seq, int64_t first_step, int points) {
  MetricBatch b;
  b.run_id = run;
  b.attempt = 1;
  b.seq = seq;
  b.steps.reserve(points);
  for (int i = 0; i < points; ++i) {
    StepMetrics& m = b.steps.emplace_back();
    m.set_step(first_step + i);
    m.set_loss(2.0 + 3.0 / (1.0 + 0.01 * (first_step + i)));
    m.set_grad_norm(0.5);
    m.set_lr(3e-3);
    m.set_tokens_per_s(120000);
  }
  return b;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

void Die(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "bench_store: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& path, bool fsync = true) {
  StoreOptions options;
  options.path = path;
  options.synchronous_full = fsync;
  return Store::Open(options);
}

std::vector<int64_t> SubmitAndStart(Store& store, const SweepRecord& record, bool finish) {
  absl::StatusOr<SweepIds> ids = store.CreateSweep(record);
  Die(ids.status(), "create sweep");
  // Several scheduler threads at once, as the coordinator would: transitions group-commit.
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  std::mt19937_64 seed_rng(1);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::normal_distribution<double> noise(0, 0.02);
      for (size_t i = next++; i < ids->run_ids.size(); i = next++) {
        RunTransition start;
        start.run_id = ids->run_ids[i];
        start.from = {PENDING};
        start.to = RUNNING;
        Die(store.TransitionRun(start).status(), "start run");
        if (!finish) continue;
        const double v = static_cast<double>(i % 10);
        RunTransition done;
        done.run_id = ids->run_ids[i];
        done.from = {RUNNING};
        done.to = i % 97 == 0 ? DIVERGED : SUCCEEDED;
        done.has_summary = true;
        RunSummary& s = done.summary;
        s.set_steps_done(record.expanded.runs(0).config().train().steps());
        s.set_final_train_loss(3.0 - 0.01 * v + noise(rng));
        s.mutable_final_eval()->set_val_loss(3.1 - 0.01 * v + noise(rng));
        s.mutable_final_eval()->set_val_ppl(22.0 - 0.2 * v + noise(rng));
        s.mutable_final_eval()->mutable_probes()->set_gate_score_mean(0.1 * v);
        s.mutable_final_eval()->mutable_probes()->set_m_act(300 - 10 * v + noise(rng) * 100);
        s.mutable_final_eval()->mutable_probes()->set_f_attn(0.3 - 0.02 * v);
        s.set_spike_score(0.001 * v);
        Die(store.TransitionRun(done).status(), "finish run");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return ids->run_ids;
}

}  // namespace
}  // namespace ablate

int main(int argc, char** argv) {
  ablate::InitBinary();
  using namespace ablate;
  Args args;
  CLI::App app{
      "bench_store: the results store's ingestion rate, comparison-table latency and "
      "dispatch writes, against their targets"};
  app.add_option("--dir", args.dir, "where the databases go (default: a fresh temp dir)");
  app.add_option("--phases", args.phases, "the phases to run, comma-separated")
      ->capture_default_str()
      ->check([](const std::string& v) -> std::string {
        for (absl::string_view p : absl::StrSplit(v, ',')) {
          if (p != "ingest" && p != "table" && p != "dispatch") {
            return absl::StrCat("unknown phase '", p, "' (ingest, table, dispatch)");
          }
        }
        return "";
      });
  // The table sweep has 10 variants and the ingestion sweep 8: fewer runs would be no runs.
  app.add_option("--runs", args.runs, "runs of the table sweep (10 variants x runs/10 seeds)")
      ->capture_default_str()
      ->check(CLI::Range(10, 1 << 30));
  app.add_option("--steps", args.steps, "steps per run of the table sweep")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ingest_runs", args.ingest_runs,
                 "runs reporting at once (8 variants x "
                 "ingest_runs/8 seeds)")
      ->capture_default_str()
      ->check(CLI::Range(8, 1 << 20));
  app.add_option("--ingest_batches", args.ingest_batches, "batches per ingesting run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", args.batch, "steps per batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dispatch_jobs", args.dispatch_jobs, "jobs of the dispatch measurement")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  bool own_dir = false;
  if (args.dir.empty()) {
    char templ[] = "/tmp/bench_store.XXXXXX";
    if (mkdtemp(templ) == nullptr) return 1;
    args.dir = templ;
    own_dir = true;
  }
  std::printf("bench_store: SQLite %s, %u hardware threads, dir %s\n", sqlite3_libversion(),
              std::thread::hardware_concurrency(), args.dir.c_str());

  // ---- 1. Ingestion ----
  double sync_rate = 0, async_rate = 0;
  if (args.Runs("ingest")) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(args.dir + "/ingest.db");
    Die(store.status(), "open");
    std::vector<int64_t> runs =
        SubmitAndStart(**store, MakeSweep("ingest", 8, args.ingest_runs / 8, 1 << 30), false);
    const int64_t points = static_cast<int64_t>(runs.size()) * args.ingest_batches * args.batch;

    // 1a. One reporter thread per run, each waiting for every ack (group commit).
    absl::Time start = absl::Now();
    std::vector<std::thread> reporters;
    for (int64_t run : runs) {
      reporters.emplace_back([&, run] {
        for (int b = 0; b < args.ingest_batches; ++b) {
          Die((*store)
                  ->ReportMetrics(MakeBatch(run, b + 1, 1 + int64_t{b} * args.batch, args.batch))
                  .status(),
              "report");
        }
      });
    }
    for (std::thread& t : reporters) t.join();
    double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    sync_rate = points / seconds;
    std::printf(
        "ingest (ack per batch): %zu runs x %d batches x %d points = %ld points in "
        "%.3f s: %.0f points/s\n",
        runs.size(), args.ingest_batches, args.batch, static_cast<long>(points), seconds,
        sync_rate);

    // 1b. Asynchronous: everything enqueued from one thread, then one Flush.
    start = absl::Now();
    for (int b = 0; b < args.ingest_batches; ++b) {
      for (int64_t run : runs) {
        const int64_t first = 1 + int64_t{args.ingest_batches + b} * args.batch;
        absl::Status s;
        while (true) {
          s = (*store)->EnqueueMetrics(
              MakeBatch(run, args.ingest_batches + b + 1, first, args.batch));
          if (!absl::IsResourceExhausted(s)) break;
          absl::SleepFor(absl::Milliseconds(1));
        }
        Die(s, "enqueue");
      }
    }
    Die((*store)->Flush(), "flush");
    seconds = absl::ToDoubleSeconds(absl::Now() - start);
    async_rate = points / seconds;
    StoreStats stats = (*store)->Stats();
    std::printf(
        "ingest (async + Flush):  %ld points in %.3f s: %.0f points/s (%ld flushes in "
        "all)\n",
        static_cast<long>(points), seconds, async_rate, static_cast<long>(stats.flushes));
    absl::StatusOr<QueryResult> count =
        (*store)->reader().ReadOnlyQuery("SELECT count(*) FROM step_metrics");
    Die(count.status(), "count");
    std::printf("  stored step rows: %ld (expected %ld)\n",
                static_cast<long>(std::get<int64_t>(count->rows[0][0])),
                static_cast<long>(2 * points));
  }

  // ---- 2. The comparison table over runs x steps ----
  double table_ms = 0;
  if (args.Runs("table")) {
    const std::string path = args.dir + "/table.db";
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(path);
    Die(store.status(), "open");
    const int variants = 10;
    absl::Time start = absl::Now();
    std::vector<int64_t> runs = SubmitAndStart(
        **store, MakeSweep("table", variants, args.runs / variants, args.steps), true);
    const double submit_s = absl::ToDoubleSeconds(absl::Now() - start);
    // The fastest path for 10M rows: one INSERT ... SELECT on the writer connection, in key order.
    start = absl::Now();
    Die((*store)->RunOnWriterForTesting([&](sqlite3* db) {
      return Exec(
          db, absl::StrCat(
                  "BEGIN; WITH RECURSIVE s(step) AS (SELECT 1 UNION ALL SELECT step + 1 FROM s "
                  "WHERE step < ",
                  args.steps,
                  ") "
                  "INSERT INTO step_metrics (run_id, step, attempt, loss, grad_norm, lr, "
                  "tokens_per_s, aux_loss, skipped) "
                  "SELECT r.id, s.step, 1, 2.0 + 3.0 / (1.0 + 0.01 * s.step) + (r.id % 7) * 0.001, "
                  "0.5, 0.003, 120000.0, 0.0, 0 FROM runs r CROSS JOIN s ORDER BY r.id, s.step; "
                  "COMMIT; PRAGMA wal_checkpoint(TRUNCATE);"));
    }),
        "generate steps");
    const double generate_s = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf(
        "table data: %zu runs (submitted, started, finished in %.2f s), %ld step rows "
        "generated in %.2f s, database %.1f MB\n",
        runs.size(), submit_s, static_cast<long>(runs.size()) * args.steps, generate_s,
        (FileSize(path) + FileSize(path + "-wal")) / 1e6);

    // A fresh reader, as `ablate table` opens one.
    ReaderOptions reader_options;
    reader_options.path = path;
    absl::StatusOr<std::unique_ptr<StoreReader>> reader = StoreReader::Open(reader_options);
    Die(reader.status(), "open reader");
    std::vector<double> ms;
    std::string markdown;
    for (int i = 0; i < 21; ++i) {
      start = absl::Now();
      absl::StatusOr<ComparisonTable> table = (*reader)->GetComparisonTable("table");
      Die(table.status(), "table");
      absl::StatusOr<std::string> text = FormatComparisonTable(*table, "markdown");
      Die(text.status(), "format");
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      markdown = *text;
    }
    const double first = ms[0];
    std::sort(ms.begin(), ms.end());
    table_ms = ms[ms.size() / 2];
    std::printf("ablate table (%zu rows): first %.2f ms, median %.2f ms, max %.2f ms\n",
                static_cast<size_t>(std::count(markdown.begin(), markdown.end(), '\n') - 2), first,
                table_ms, ms.back());
    std::printf("%s", markdown.c_str());

    // Related reads the dashboard makes over the same data.
    start = absl::Now();
    SeriesOptions series;
    series.max_points = 1000;
    absl::StatusOr<std::vector<StepMetrics>> points = (*reader)->MetricSeries(runs[0], series);
    Die(points.status(), "series");
    std::printf("metric series of one run (%d steps -> %zu points, min/max): %.2f ms\n", args.steps,
                points->size(), absl::ToDoubleMilliseconds(absl::Now() - start));
    start = absl::Now();
    absl::StatusOr<QueryResult> latest = (*reader)->ReadOnlyQuery(
        "SELECT run_id, step, loss FROM latest_metrics WHERE sweep = 'table'");
    Die(latest.status(), "latest");
    std::printf("latest_metrics over %zu runs: %.2f ms\n", latest->rows.size(),
                absl::ToDoubleMilliseconds(absl::Now() - start));
  }

  // ---- 3. Dispatch writes ----
  double dispatch_rate = 0;
  for (bool fsync : {true, false}) {
    if (!args.Runs("dispatch")) break;
    absl::StatusOr<std::unique_ptr<Store>> store =
        OpenStore(args.dir + (fsync ? "/dispatch.db" : "/dispatch-no-fsync.db"), fsync);
    Die(store.status(), "open");
    constexpr int kWorkers = 64;
    const int jobs = std::max(args.dispatch_jobs / 10, kWorkers) * 10;
    absl::StatusOr<SweepIds> ids = (*store)->CreateSweep(MakeSweep("dispatch", 10, jobs / 10, 10));
    Die(ids.status(), "create sweep");
    const std::vector<int64_t>& runs = ids->run_ids;
    // Each worker thread starts its first run, then ends each run while starting its next one
    // (the worker's runs are every 64th).
    for (int w = 0; w < kWorkers; ++w) {
      Die((*store)->TransitionRun(testing::MakeTransition(runs[w], {PENDING}, RUNNING)).status(),
          "start run");
    }
    const int64_t flushes_before = (*store)->Stats().flushes;
    const absl::Time start = absl::Now();
    const double cpu_start = static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
    const double writer_start = testing::CpuSeconds(getpid(), kWriterThreadName);
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&, w] {
        for (size_t i = w; i < runs.size(); i += kWorkers) {
          FinishWrite write;
          write.batch = MakeBatch(runs[i], 1, 1, 10);
          write.end = testing::MakeTransition(runs[i], {RUNNING}, SUCCEEDED);
          write.end.expected_attempt = 1;
          write.end.has_summary = true;
          write.end.summary.set_state(SUCCEEDED);
          write.end.summary.set_steps_done(10);
          if (i + kWorkers < runs.size()) {
            write.start = testing::MakeTransition(runs[i + kWorkers], {PENDING}, RUNNING);
          }
          absl::StatusOr<FinishWriteResult> r = (*store)->FinishAttempt(write);
          Die(r.status(), "finish attempt");
          Die(r->start_status, "start next");
        }
      });
    }
    for (std::thread& t : workers) t.join();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double cpu = static_cast<double>(std::clock()) / CLOCKS_PER_SEC - cpu_start;
    const double writer_cpu = testing::CpuSeconds(getpid(), kWriterThreadName) - writer_start;
    if (fsync) dispatch_rate = runs.size() / seconds;
    const int64_t flushes = (*store)->Stats().flushes - flushes_before;
    std::printf(
        "dispatch writes, %s (FinishAttempt: 10 points + end + next start, 64 threads): "
        "%zu jobs in %.2f s = %.0f jobs/s, %.0f us of CPU per job (the writer thread "
        "%.0f us), %.1f jobs per transaction\n",
        fsync ? "fsync" : "no fsync", runs.size(), seconds, runs.size() / seconds,
        1e6 * cpu / runs.size(), 1e6 * writer_cpu / runs.size(),
        static_cast<double>(runs.size()) / std::max<int64_t>(flushes, 1));
  }

  std::printf("\nsummary (target ratio > 1 is better):\n");
  if (args.Runs("ingest")) {
    std::printf("  ingestion, ack per batch: %.0f points/s = %.2fx the 200,000/s target\n",
                sync_rate, sync_rate / 200000);
    std::printf("  ingestion, async:         %.0f points/s = %.2fx the 200,000/s target\n",
                async_rate, async_rate / 200000);
  }
  if (args.Runs("table")) {
    std::printf("  ablate table:             %.2f ms = %.1fx under the 200 ms target\n", table_ms,
                200 / table_ms);
  }
  if (args.Runs("dispatch")) {
    std::printf("  dispatch writes (fsync):  %.0f jobs/s = %.2fx the 5,000/s dispatch target\n",
                dispatch_rate, dispatch_rate / 5000);
  }
  if (own_dir) std::filesystem::remove_all(args.dir);
  return 0;
}
