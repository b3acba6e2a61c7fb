// /metrics in Prometheus text format: runs, sweeps and workers by state from the store
// (StoreReader::Counts), the step ingestion rate between scrapes, and the operator statistics the
// embedding process adds (StoreMetrics: the coordinator's store writer).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "orchestrator/dashboard/internal.h"
#include "orchestrator/dashboard/metrics.h"

namespace ablate {
namespace {

std::string PromEscape(absl::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string PromNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

}  // namespace

std::vector<DashboardMetric> StoreMetrics(const StoreStats& s) {
  return std::vector<DashboardMetric>{
      {"ablate_store_queued_rows", "Rows waiting for the store's writer.", "gauge", {},
       static_cast<double>(s.queued_rows)},
      {"ablate_store_queued_writes", "Writes waiting for the store's writer.", "gauge", {},
       static_cast<double>(s.queued_writes)},
      {"ablate_store_rows_committed_total", "Rows the store's writer committed.", "counter", {},
       static_cast<double>(s.rows_committed)},
      {"ablate_store_flushes_total", "Store transactions committed.", "counter", {},
       static_cast<double>(s.flushes)},
      {"ablate_store_failed_flushes_total", "Store transactions rolled back and retried.",
       "counter", {}, static_cast<double>(s.failed_flushes)},
      {"ablate_store_dropped_writes_total",
       "Store writes refused alone inside a transaction (a stale finish, a cancelled run).",
       "counter", {}, static_cast<double>(s.dropped_writes)},
      {"ablate_store_reapplied_flushes_total",
       "Store transactions applied again, a savepoint per write, because a write failed alone.",
       "counter", {}, static_cast<double>(s.reapplied_flushes)},
      {"ablate_store_longest_transaction_seconds",
       "The longest committed store transaction; writes queued meanwhile waited that long.",
       "gauge", {}, absl::ToDoubleSeconds(s.longest_flush)},
      {"ablate_store_checkpoints_total",
       "WAL checkpoints that copied pages into the database (the checkpointer thread's).",
       "counter", {}, static_cast<double>(s.checkpoints)},
      {"ablate_store_checkpoint_failing",
       "1 while the last WAL checkpoint failed (the WAL then grows until one succeeds).", "gauge",
       {}, s.checkpoint_error.ok() ? 0.0 : 1.0}};
}

Response DashboardServer::Impl::Metrics() {
  std::vector<DashboardMetric> samples;
  auto add = [&samples](std::string name, std::string help, std::string type,
                        std::vector<std::pair<std::string, std::string>> labels, double value) {
    samples.push_back(DashboardMetric{std::move(name), std::move(help), std::move(type),
                                      std::move(labels), value});
  };
  absl::StatusOr<StoreCounts> counts = reader->Counts();
  if (!counts.ok()) return FromStatus(counts.status());
  std::map<std::string, int64_t>& by_state = counts->runs_by_state;
  for (const auto& [state, n] : by_state) {
    add("ablate_runs", "Runs by state.", "gauge", {{"state", state}}, static_cast<double>(n));
  }
  add("ablate_queue_depth", "Runs waiting for a worker (PENDING and INTERRUPTED).", "gauge", {},
      static_cast<double>(by_state["PENDING"] + by_state["INTERRUPTED"]));
  for (const auto& [state, n] : counts->sweeps_by_state) {
    add("ablate_sweeps", "Sweeps by state.", "gauge", {{"state", state}}, static_cast<double>(n));
  }
  for (const auto& [state, n] : counts->workers_by_state) {
    add("ablate_workers", "Registered workers by state.", "gauge", {{"state", state}},
        static_cast<double>(n));
  }
  const double steps = counts->steps_done;
  add("ablate_steps_ingested_total",
      "Training steps stored over every run (sum of runs.steps_done): rate() it.", "counter", {},
      steps);
  double rate = 0;
  {
    absl::MutexLock lock(&mu);
    const absl::Time now = absl::Now();
    if (last_steps < 0) {
      last_steps = steps;
      last_steps_at = now;
    } else if (now - last_steps_at >= absl::Milliseconds(500)) {
      last_rate = std::max(0.0, steps - last_steps) / absl::ToDoubleSeconds(now - last_steps_at);
      last_steps = steps;
      last_steps_at = now;
    }
    rate = last_rate;
    add("ablate_dashboard_heavy_in_flight",
        "Heavy dashboard answers (curves, figures, tables) being built or written.", "gauge", {},
        heavy);
    add("ablate_dashboard_heavy_refused_total",
        "Heavy dashboard requests answered 503 after waiting for a place.", "counter", {},
        static_cast<double>(heavy_refused));
  }
  add("ablate_points_ingested_per_second",
      "Step points stored per second, between this scrape and the previous one (0.5 s apart at "
      "least).", "gauge", {}, rate);
  if (options.operator_stats) {
    std::vector<DashboardMetric> extra = options.operator_stats();
    samples.insert(samples.end(), extra.begin(), extra.end());
  }
  std::string text;
  std::set<std::string> described;
  for (const DashboardMetric& m : samples) {
    if (described.insert(m.name).second) {
      absl::StrAppend(&text, "# HELP ", m.name, " ", m.help, "\n# TYPE ", m.name, " ", m.type,
                      "\n");
    }
    absl::StrAppend(&text, m.name);
    if (!m.labels.empty()) {
      text += "{";
      for (size_t i = 0; i < m.labels.size(); ++i) {
        absl::StrAppend(&text, i > 0 ? "," : "", m.labels[i].first, "=\"",
                        PromEscape(m.labels[i].second), "\"");
      }
      text += "}";
    }
    absl::StrAppend(&text, " ", PromNumber(m.value), "\n");
  }
  Response res;
  res.content_type = "text/plain; version=0.0.4; charset=utf-8";
  res.body = std::move(text);
  return res;
}

}  // namespace ablate
