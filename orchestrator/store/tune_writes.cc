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

absl::Status InsertBracket(StoreWriter& w, int64_t sweep_id, const RunSpec& run) {
  // The group is "VARIANT" or "VARIANT path=value ...": the bracket keeps both parts apart.
  const std::string& group = run.tune().group();
  const size_t space = group.find(' ');
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("INSERT OR IGNORE INTO tune_brackets (sweep_id, grp, "
                                     "variant, axes) VALUES (?1, ?2, ?3, ?4)"));
  stmt->Bind(1, sweep_id).Bind(2, group).Bind(3, run.variant());
  stmt->Bind(4, space == std::string::npos ? std::string() : group.substr(space + 1));
  return stmt->Run();
}

}  // namespace

absl::Status InsertTuneRows(StoreWriter& w, const ExpandedSweep& sweep, int64_t sweep_id,
                            int64_t run_id, const RunSpec& run) {
  STORE_RETURN_IF_ERROR(InsertTuneRun(w, sweep_id, run_id, run.tune()));
  if (sweep.tune().method() != "boundary") return absl::OkStatus();
  return InsertBracket(w, sweep_id, run);
}

absl::Status ApplyAddTuneProbe(StoreWriter& w, const TuneProbeWrite& write,
                               TuneProbeResult* result) {
  STORE_ASSIGN_OR_RETURN(
      decided, w.Get("INSERT OR IGNORE INTO tune_decisions (sweep_id, grp, value, rung, kind, "
                     "detail, time) VALUES (?1, ?2, ?3, 0, 'probe', ?4, ?5)"));
  decided->Bind(1, write.sweep_id).Bind(2, write.group).Bind(3, write.value);
  decided->Bind(4, write.detail).Bind(5, w.Now());
  STORE_RETURN_IF_ERROR(decided->Run());
  if (sqlite3_changes(w.db()) == 0) return absl::OkStatus();  // probed before
  STORE_ASSIGN_OR_RETURN(last, w.Get("SELECT coalesce(max(run_index), -1) FROM runs "
                                     "WHERE sweep_id = ?1"));
  last->Bind(1, write.sweep_id);
  STORE_ASSIGN_OR_RETURN(found, last->Step());
  int64_t index = found ? last->ColumnInt(0) + 1 : 0;
  last->Reset();
  STORE_ASSIGN_OR_RETURN(variant, w.Get("SELECT id FROM variants WHERE sweep_id = ?1 AND "
                                        "name = ?2"));
  const double now = w.Now();
  for (int i = 0; i < write.runs.runs_size(); ++i) {
    RunSpec run = write.runs.runs(i);
    run.set_index(static_cast<int32_t>(index++));
    variant->Bind(1, write.sweep_id).Bind(2, run.variant());
    STORE_ASSIGN_OR_RETURN(has_variant, variant->Step());
    const int64_t variant_id = has_variant ? variant->ColumnInt(0) : 0;
    variant->Reset();
    if (!has_variant) {
      return absl::NotFoundError(absl::StrCat("store: sweep ", write.sweep_id,
                                              " has no variant ", run.variant()));
    }
    STORE_ASSIGN_OR_RETURN(run_id, InsertRunRow(w, write.runs, run, write.sweep_id, variant_id,
                                                write.config_json[i], now));
    STORE_RETURN_IF_ERROR(InsertTuneRun(w, write.sweep_id, run_id, run.tune()));
    result->run_ids.push_back(run_id);
  }
  STORE_ASSIGN_OR_RETURN(count, w.Get("UPDATE tune_brackets SET probes = probes + 1 "
                                      "WHERE sweep_id = ?1 AND grp = ?2"));
  count->Bind(1, write.sweep_id).Bind(2, write.group);
  STORE_RETURN_IF_ERROR(count->Run());
  return InsertEvent(w, write.sweep_id, 0, "tune_decision",
                     absl::StrCat(write.group, " at ", write.value, ": probe: ", write.detail));
}

absl::Status ApplyCloseBracket(StoreWriter& w, const BracketWrite& write) {
  STORE_ASSIGN_OR_RETURN(
      close, w.Get("UPDATE tune_brackets SET state = 'DONE', stable = ?3, unstable = ?4, "
                   "note = ?5 WHERE sweep_id = ?1 AND grp = ?2 AND state = 'OPEN'"));
  close->Bind(1, write.sweep_id).Bind(2, write.group);
  if (std::isfinite(write.stable)) {
    close->Bind(3, write.stable);
  } else {
    close->BindNull(3);
  }
  if (std::isfinite(write.unstable)) {
    close->Bind(4, write.unstable);
  } else {
    close->BindNull(4);
  }
  close->Bind(5, write.note);
  STORE_RETURN_IF_ERROR(close->Run());
  if (sqlite3_changes(w.db()) == 0) {
    STORE_ASSIGN_OR_RETURN(exists, w.Get("SELECT 1 FROM tune_brackets WHERE sweep_id = ?1 AND "
                                         "grp = ?2"));
    exists->Bind(1, write.sweep_id).Bind(2, write.group);
    STORE_ASSIGN_OR_RETURN(found, exists->Step());
    exists->Reset();
    if (!found) {
      return absl::NotFoundError(absl::StrCat("store: sweep ", write.sweep_id, " has no bracket "
                                              "for ", write.group));
    }
    return absl::OkStatus();  // closed before
  }
  STORE_RETURN_IF_ERROR(InsertEvent(
      w, write.sweep_id, 0, "tune_bracket",
      absl::StrCat(write.group, ": stable ", write.stable, ", unstable ", write.unstable,
                   write.note.empty() ? "" : absl::StrCat(" (", write.note, ")"))));
  return SettleSweepState(w, write.sweep_id, w.Now());
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
        if (absl::IsFailedPrecondition(s)) {
          // Training through its rungs: the coordinator stops it. Ended meanwhile: left alone.
          STORE_ASSIGN_OR_RETURN(state, w.Get("SELECT state FROM runs WHERE id = ?1"));
          state->Bind(1, run_id);
          STORE_ASSIGN_OR_RETURN(found, state->Step());
          const bool running = found && state->ColumnText(0) == RunStateName(RUNNING);
          state->Reset();
          if (running) result->stopping.push_back({run_id, d.detail});
          continue;
        }
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
