// libFuzzer target: bytes as a worker's ReportRequest (protobuf wire format), through the path the
// coordinator serves it with (CoordinatorCore::Report): the checks at the door
// (orchestrator/coordinator/door.h), then, for a report they let in, the store's ingestion into a
// leased attempt of a real sweep (a WAL-mode file in a temporary directory, created once, removed
// at exit), then every read the coordinator and the dashboard make of that sweep.
//
// What counts as a finding (abort, recorded by libFuzzer as a crash):
//   - a crash, sanitizer report, uncaught exception, leak or allocation past -rss_limit_mb;
//   - a report the door let in that the store refuses or cannot store (the door must refuse
//     whatever the store cannot take);
//   - after it, any read of the sweep failing: its progress (the view whose sum() an absurd step
//     count once overflowed, bricking the coordinator), its runs, latest steps, curves on the
//     dashboard's grid, a run's series, the comparison table.
// Refusals at the door are the expected outcome of most inputs. Inputs accumulate in the store,
// as reports do in a coordinator.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "orchestrator/coordinator/door.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store.h"
#include "tests/fuzz/fuzz_util.h"

namespace ablate {
namespace {

constexpr int64_t kSteps = 50;          // train.steps of the spec below
constexpr int64_t kMaxBatchRows = 200000;  // CoordinatorOptions::max_batch_rows
constexpr int kCurvePoints = 100;

constexpr char kSpec[] = R"(sweep: fuzz
base:
  model: {d_model: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2, head_dim: 16,
          ffn_dim: 64, max_seq_len: 64}
  train: {steps: 50, batch_size: 2, seq_len: 64}
variants: [baseline, g1_elementwise]
seeds: [0]
)";

constexpr char kTarget[] = "report_fuzz";

[[noreturn]] void Fail(const std::string& what) { fuzz::Fail(kTarget, what); }

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Fail(absl::StrCat(what, ": ", status.ToString()));
}

struct Fixture : fuzz::TempStore {
  int64_t sweep_id = 0;
  int64_t run_id = 0;  // RUNNING, attempt 1: the reports' run
  int64_t seq = 0;     // the last batch number stored
};

Fixture* fixture = nullptr;

void Cleanup() {
  if (fixture == nullptr) return;
  fuzz::RemoveTempStore(fixture);
}

}  // namespace
}  // namespace ablate

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace ablate;
  // A string field that is not UTF-8 fails the parse (as gRPC refuses it) and protobuf logs each:
  // millions of lines in a search.
  google::protobuf::SetLogHandler(nullptr);
  fixture = new Fixture;  // lives until exit
  StoreOptions options;
  options.synchronous_full = false;
  fuzz::OpenTempStore(kTarget, options, fixture);
  const SweepIds ids = fuzz::CreateSweepFromSpec(kTarget, *fixture->store, kSpec);
  fixture->sweep_id = ids.sweep_id;
  fixture->run_id = ids.run_ids[0];
  fuzz::StartRun(kTarget, *fixture->store, fixture->run_id);
  std::atexit(Cleanup);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ablate;
  ReportRequest report;
  if (!report.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!CheckReportAtDoor(report, kSteps, "report").ok()) return 0;  // refused whole
  MetricBatch batch;
  batch.run_id = fixture->run_id;
  batch.attempt = 1;
  batch.seq = fixture->seq + 1;
  batch.steps.assign(report.steps().begin(), report.steps().end());
  batch.evals.assign(report.evals().begin(), report.evals().end());
  batch.spikes.assign(report.spikes().begin(), report.spikes().end());
  if (batch.Rows() > kMaxBatchRows) return 0;  // refused by BatchOf
  Store& store = *fixture->store;
  if (report.checkpoint_step() > 0) {
    Check(store.EnqueueCheckpoint(fixture->run_id, 1, report.checkpoint_path(),
                                  report.checkpoint_step()),
          "a checkpoint the door let in");
  }
  absl::StatusOr<ReportResult> stored = store.ReportMetrics(batch);
  Check(stored.status(), "a report the door let in");
  fixture->seq = batch.seq;

  const StoreReader& reader = store.reader();
  absl::StatusOr<SweepInfo> sweep = reader.GetSweepById(fixture->sweep_id);
  Check(sweep.status(), "the sweep's progress");
  if (sweep->steps_done < 0) Fail("negative steps_done in sweep_progress");
  Check(reader.ListSweeps().status(), "the sweeps");
  RunFilter filter;
  filter.sweep_id = fixture->sweep_id;
  absl::StatusOr<std::vector<RunInfo>> runs = reader.ListRuns(filter);
  Check(runs.status(), "the sweep's runs");
  int64_t longest = 0;
  for (const RunInfo& run : *runs) {
    if (run.steps_done > kSteps) Fail(absl::StrCat("steps_done ", run.steps_done, " > train.steps"));
    longest = std::max(longest, run.steps_done);
  }
  Check(reader.LatestSteps(fixture->sweep_id).status(), "the latest steps");
  const int64_t every = std::max<int64_t>(1, longest / kCurvePoints + (longest % kCurvePoints != 0));
  Check(reader.SweepCurves(fixture->sweep_id, CurveMetric::kLoss, every).status(), "the curves");
  SeriesOptions series;
  Check(reader.MetricSeries(fixture->run_id, series).status(), "the run's series");
  Check(reader.GetComparisonTable("fuzz").status(), "the comparison table");
  return 0;
}
