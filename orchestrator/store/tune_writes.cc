// The SQL of the tuning writes (store_internal.h): a tuned sweep's rows at submission, and the
// tuner's decisions on a group. Each runs on the writer's connection inside the flush
// transaction (writer.cc).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/proto_yaml.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store_internal.h"

namespace ablate {
namespace store_internal {

absl::Status InsertTune(StoreWriter& w, int64_t sweep_id, const TunePlan& plan) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("INSERT INTO tunes (sweep_id, axis, method, metric, mode, "
                                     "plan_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
  stmt->Bind(1, sweep_id).Bind(2, plan.axis()).Bind(3, plan.method()).Bind(4, plan.metric());
  stmt->Bind(5, plan.maximize() ? "max" : "min").Bind(6, PlainJson(plan));
  return stmt->Run();
}

absl::Status InsertTuneRun(StoreWriter& w, int64_t sweep_id, int64_t run_id, const TuneRun& run) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("INSERT INTO tune_runs (run_id, sweep_id, grp, value, "
                                     "stop_at_step, held) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
  stmt->Bind(1, run_id).Bind(2, sweep_id).Bind(3, run.group()).Bind(4, run.value());
  stmt->Bind(5, run.stop_at_step()).Bind(6, static_cast<int64_t>(run.held()));
  return stmt->Run();
}

namespace {

// Releases a held run to train on: PENDING, held no more, pausing next at `next_stop`, its
// retries counted from now. False when it is not a held PENDING run (nothing changes).
absl::StatusOr<bool> Release(StoreWriter& w, int64_t run_id, int64_t next_stop) {
  STORE_ASSIGN_OR_RETURN(release, w.Get("UPDATE tune_runs SET held = 0, stop_at_step = ?2 "
                                        "WHERE run_id = ?1 AND held = 1 AND (SELECT state FROM "
                                        "runs WHERE id = ?1) = 'PENDING'"));
  release->Bind(1, run_id).Bind(2, next_stop);
  STORE_RETURN_IF_ERROR(release->Run());
  if (sqlite3_changes(w.db()) == 0) return false;
  STORE_ASSIGN_OR_RETURN(rebase,
                         w.Get("UPDATE runs SET attempt_base = attempts WHERE id = ?1"));
  rebase->Bind(1, run_id);
  STORE_RETURN_IF_ERROR(rebase->Run());
  return true;
}

}  // namespace

absl::Status ApplyTuneDecisions(StoreWriter& w, const TuneDecisionWrite& write,
                                TuneDecisionResult* result) {
  STORE_ASSIGN_OR_RETURN(
      insert, w.Get("INSERT OR IGNORE INTO tune_decisions (sweep_id, grp, value, rung, kind, "
                    "metric, detail, time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  for (const TuneDecisionWrite::Decision& d : write.decisions) {
    insert->Bind(1, write.sweep_id).Bind(2, write.group).Bind(3, d.value);
    insert->Bind(4, static_cast<int64_t>(d.rung)).Bind(5, d.kind);
    if (std::isfinite(d.metric)) {
      insert->Bind(6, d.metric);
    } else {
      insert->BindNull(6);
    }
    insert->Bind(7, d.detail).Bind(8, w.Now());
    STORE_RETURN_IF_ERROR(insert->Run());
    if (sqlite3_changes(w.db()) == 0) {  // decided before
      ++result->skipped;
      continue;
    }
    for (int64_t run_id : d.runs) {
      if (d.kind == "stop") {
        RunTransition t;
        t.run_id = run_id;
        t.from = {PENDING};
        t.to = STOPPED;
        t.reason = d.detail;
        TransitionResult r;
        absl::Status s = ApplyTransition(w, t, &r);
        if (absl::IsFailedPrecondition(s)) continue;  // no longer PENDING: left alone
        STORE_RETURN_IF_ERROR(s);
        STORE_ASSIGN_OR_RETURN(unhold, w.Get("UPDATE tune_runs SET held = 0 WHERE run_id = ?1"));
        unhold->Bind(1, run_id);
        STORE_RETURN_IF_ERROR(unhold->Run());
        result->stopped.push_back(run_id);
        continue;
      }
      STORE_ASSIGN_OR_RETURN(released, Release(w, run_id, d.next_stop));
      if (released) result->released.push_back(run_id);
    }
    STORE_RETURN_IF_ERROR(InsertEvent(
        w, write.sweep_id, 0, "tune_decision",
        absl::StrCat(write.group, " at ", d.value, ": ", d.kind, ": ", d.detail)));
  }
  return absl::OkStatus();
}

}  // namespace store_internal
}  // namespace ablate
