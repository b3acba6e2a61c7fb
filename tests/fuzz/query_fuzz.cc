// libFuzzer target: bytes as the SQL of `ablate query`, through the path the coordinator serves
// it with (CoordinatorCore::Query: Store::reader().ReadOnlyQuery, then FormatQueryResult as a
// table, CSV and JSON), against a small real store: a sweep expanded from a spec, runs started
// and finished, metric points, evaluations with per-layer probes, spike events, a worker and
// events, all written through the Store API into a WAL-mode file in a temporary directory
// (created once, removed at exit). The Store stays open, as in the coordinator.
//
// What counts as a finding (abort, recorded by libFuzzer as a crash):
//   - a crash, sanitizer report, uncaught exception, leak or allocation past -rss_limit_mb;
//   - the database changed: another connection's `PRAGMA data_version` or `schema_version`
//     moved, a table's row count changed, a file appeared in or vanished from its directory, or
//     a file named in the query (ATTACH 'x.db', VACUUM INTO 'x.db') appeared;
//   - the reader connection no longer refuses a write afterwards (state left behind);
//   - a query ran more than kOverrun past its time limit (the progress handler did not stop it);
//   - a result with more rows than max_rows, a row of the wrong width, or DataLoss;
//   - a result that cannot be formatted (only a table too large to pad may be refused).
// Refusals and SQL errors are the expected outcome of most inputs.
#include <sqlite3.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/store.h"
#include "tests/fuzz/fuzz_util.h"

namespace ablate {
namespace {

constexpr absl::Duration kTimeLimit = absl::Milliseconds(100);
// How far past kTimeLimit a query may run before it is a finding: one SQLite VM step between
// two progress-handler calls may be slow (a large sort, randomblob), but not seconds.
constexpr absl::Duration kOverrun = absl::Seconds(2);
constexpr int64_t kMaxRows = 1000;
// Below the coordinator's 64 MiB: formatting that much under ASan takes seconds (libFuzzer's
// -timeout), and truncating by bytes works the same at any size.
constexpr int64_t kMaxBytes = 4 << 20;

// A small sweep with a real expansion: two variants x two seeds.
constexpr char kSpec[] = R"(sweep: fuzz
description: the store the query fuzzer reads
base:
  model: {d_model: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2, head_dim: 16,
          ffn_dim: 64, max_seq_len: 64}
  train: {steps: 50, batch_size: 2, seq_len: 64}
variants: [baseline, g1_elementwise]
budget: {match: ffn, reference: baseline, tolerance: 0.05}
seeds: [0, 1]
)";

constexpr char kTarget[] = "query_fuzz";

[[noreturn]] void Fail(const std::string& what) { fuzz::Fail(kTarget, what); }

void Check(const absl::Status& status, const char* what) {
  fuzz::CheckSetup(kTarget, status, what);
}

// What must not change: read through a connection of its own.
struct Fingerprint {
  int64_t data_version = 0;
  int64_t schema_version = 0;
  std::vector<int64_t> row_counts;  // one per table, in `tables` order
  std::set<std::string> files;      // the directory's entries

  bool operator==(const Fingerprint& o) const {
    return data_version == o.data_version && schema_version == o.schema_version &&
           row_counts == o.row_counts && files == o.files;
  }
};

struct Fixture : fuzz::TempStore {
  sqlite3* checker = nullptr;
  std::vector<std::string> tables;
  Fingerprint before;

  int64_t Int(const std::string& sql) const {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(checker, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK ||
        sqlite3_step(stmt) != SQLITE_ROW) {
      Fail(absl::StrCat("checker: ", sql, ": ", sqlite3_errmsg(checker)));
    }
    const int64_t v = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return v;
  }

  Fingerprint Take() const {
    Fingerprint f;
    f.data_version = Int("PRAGMA data_version");
    f.schema_version = Int("PRAGMA schema_version");
    for (const std::string& t : tables) f.row_counts.push_back(Int("SELECT count(*) FROM " + t));
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      f.files.insert(entry.path().filename().string());
    }
    return f;
  }
};

Fixture* fixture = nullptr;

// The quoted strings of `sql` ('x.db', "x.db", `x.db`, [x.db]) that could name a file: where a
// write that got through would leave one (relative to the working directory).
std::vector<std::string> QuotedNames(const std::string& sql) {
  std::vector<std::string> names;
  for (size_t i = 0; i < sql.size() && names.size() < 16; ++i) {
    const char open = sql[i];
    const char close = open == '[' ? ']' : open;
    if (open != '\'' && open != '"' && open != '`' && open != '[') continue;
    const size_t end = sql.find(close, i + 1);
    if (end == std::string::npos) break;
    const std::string name = sql.substr(i + 1, end - i - 1);
    if (!name.empty() && name.size() < 256 && name.find('\0') == std::string::npos) {
      names.push_back(name);
    }
    i = end;
  }
  return names;
}

bool Exists(const std::string& name) {
  std::error_code ignored;
  return std::filesystem::exists(name, ignored);
}

void Populate(Store& store) {
  const SweepIds ids = fuzz::CreateSweepFromSpec(kTarget, store, kSpec);
  absl::StatusOr<int64_t> worker = store.RegisterWorker("fuzz-worker", R"({"device":"cpu"})");
  Check(worker.status(), "register");
  // Runs 0 and 1 train: 0 finishes, 1 diverges; 2 and 3 stay PENDING.
  for (int r = 0; r < 2; ++r) {
    const int64_t run_id = ids.run_ids[r];
    fuzz::StartRun(kTarget, store, run_id, *worker);
    MetricBatch batch;
    batch.run_id = run_id;
    batch.attempt = 1;
    batch.seq = 1;
    for (int step = 1; step <= 50; ++step) {
      StepMetrics m;
      m.set_step(step);
      m.set_loss(5.0 - 0.05 * step + (r == 1 && step > 40 ? 10.0 * (step - 40) : 0));
      m.set_grad_norm(1.0 + 0.01 * step);
      m.set_lr(3e-3);
      m.set_tokens_per_s(1000);
      batch.steps.push_back(m);
    }
    EvalResult eval;
    eval.set_step(25);
    eval.set_val_loss(3.9);
    eval.set_val_ppl(49.4);
    for (int layer = 0; layer < 2; ++layer) {
      LayerProbes* probes = eval.mutable_probes()->add_layers();
      probes->set_layer(layer);
      probes->set_has_gate(r == 1);
      probes->set_gate_mean(0.3);
      probes->set_ffn_residual_max_abs(12.5 + layer);
      probes->set_first_token_attention(0.4);
    }
    batch.evals.push_back(eval);
    SpikeEvent spike;
    spike.set_step(42);
    spike.set_signal("loss");
    spike.set_value(15.0);
    spike.set_baseline(3.0);
    spike.set_kind(SPIKE_CATASTROPHIC);
    batch.spikes.push_back(spike);
    Check(store.ReportMetrics(batch).status(), "report");
    RunTransition finish;
    finish.run_id = run_id;
    finish.from = {RUNNING};
    finish.to = r == 0 ? SUCCEEDED : DIVERGED;
    finish.has_summary = true;
    finish.summary.set_state(finish.to);
    finish.summary.set_steps_done(50);
    finish.summary.set_final_train_loss(2.6);
    *finish.summary.mutable_final_eval() = eval;
    finish.summary.set_spike_steps(1);
    finish.summary.set_spike_score(0.02);
    Check(store.TransitionRun(finish).status(), "finish");
  }
  Check(store.EnqueueEvent(ids.sweep_id, 0, "note", "populated for fuzzing"), "event");
  Check(store.Flush(), "flush");
}

void Cleanup() {
  if (fixture == nullptr) return;
  sqlite3_close_v2(fixture->checker);
  fuzz::RemoveTempStore(fixture);
}

}  // namespace
}  // namespace ablate

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace ablate;
  fixture = new Fixture;  // lives until exit
  fuzz::OpenTempStore(kTarget, StoreOptions(), fixture);
  Populate(*fixture->store);
  if (sqlite3_open_v2(fixture->path.c_str(), &fixture->checker, SQLITE_OPEN_READONLY, nullptr) !=
      SQLITE_OK) {
    Fail("checker: cannot open the database");
  }
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(fixture->checker,
                     "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", -1,
                     &stmt, nullptr);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    fixture->tables.push_back(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
  }
  sqlite3_finalize(stmt);
  if (fixture->tables.size() < 5) Fail("checker: the schema has too few tables");
  fixture->before = fixture->Take();
  std::atexit(Cleanup);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ablate;
  const std::string sql(reinterpret_cast<const char*>(data), size);
  const StoreReader& reader = fixture->store->reader();
  std::vector<std::string> absent;
  for (const std::string& name : QuotedNames(sql)) {
    if (!Exists(name)) absent.push_back(name);
  }
  QueryLimits limits;
  limits.timeout = kTimeLimit;
  limits.max_rows = kMaxRows;
  limits.max_bytes = kMaxBytes;
  const absl::Time start = absl::Now();
  absl::StatusOr<QueryResult> result = reader.ReadOnlyQuery(sql, limits);
  const absl::Duration took = absl::Now() - start;

  if (took > kTimeLimit + kOverrun) {
    Fail(absl::StrCat("the query ran ", absl::FormatDuration(took), " with a time limit of ",
                      absl::FormatDuration(kTimeLimit), " (", result.status().ToString(), ")"));
  }
  if (result.ok()) {
    if (static_cast<int64_t>(result->rows.size()) > kMaxRows) {
      Fail(absl::StrCat(result->rows.size(), " rows returned, max_rows is ", kMaxRows));
    }
    for (const std::vector<SqlValue>& row : result->rows) {
      if (row.size() != result->columns.size()) Fail("a row of the wrong width");
    }
    for (const char* format : {"table", "csv", "json"}) {
      absl::StatusOr<std::string> text = FormatQueryResult(*result, format);
      if (!text.ok() && !(absl::IsResourceExhausted(text.status()) && format[0] == 't')) {
        Fail(absl::StrCat("formatting as ", format, ": ", text.status().ToString()));
      }
    }
  } else if (absl::IsDataLoss(result.status())) {
    Fail(absl::StrCat("the database reads as damaged: ", result.status().ToString()));
  }

  const Fingerprint after = fixture->Take();
  if (!(after == fixture->before)) {
    Fail(absl::StrCat("the database or its directory changed (data_version ",
                      fixture->before.data_version, " -> ", after.data_version,
                      ", schema_version ", fixture->before.schema_version, " -> ",
                      after.schema_version, ", ", fixture->before.files.size(), " -> ",
                      after.files.size(), " files)"));
  }
  for (const std::string& name : absent) {
    if (Exists(name)) Fail(absl::StrCat("the query created the file \"", name, "\""));
  }
  absl::StatusOr<QueryResult> write = reader.ReadOnlyQuery("DELETE FROM events", limits);
  if (!absl::IsPermissionDenied(write.status())) {
    Fail(absl::StrCat("after this input a DELETE is no longer refused: ",
                      write.status().ToString()));
  }
  return 0;
}
