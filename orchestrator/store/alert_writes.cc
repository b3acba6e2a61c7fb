// The SQL of the alerter's writes (store_internal.h): claiming alerts once per (kind, sweep, run)
// with the cursor that found them, and counting how each target's delivery ended. Each runs on
// the writer's connection inside the flush transaction (writer.cc).
#include <cstdint>
#include <string>
#include <vector>

#include "orchestrator/store/store_internal.h"

namespace ablate {
namespace store_internal {

absl::Status ApplyClaimAlerts(StoreWriter& w, const AlertCursor& cursor,
                              const std::vector<AlertClaim>& claims, std::vector<int64_t>* ids) {
  STORE_ASSIGN_OR_RETURN(
      insert, w.Get("INSERT INTO alerts (kind, sweep_id, run_id, created_at, payload, targets) "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (kind, sweep_id, run_id) "
                    "DO NOTHING RETURNING id"));
  for (const AlertClaim& c : claims) {
    insert->Bind(1, c.kind).Bind(2, c.sweep_id).Bind(3, c.run_id).Bind(4, w.Now());
    insert->Bind(5, c.payload).Bind(6, static_cast<int64_t>(c.targets));
    absl::StatusOr<bool> row = insert->Step();
    const int64_t id = row.ok() && *row ? insert->ColumnInt(0) : 0;
    insert->Reset();
    if (!row.ok()) return row.status();
    ids->push_back(id);
  }
  STORE_ASSIGN_OR_RETURN(
      move, w.Get("INSERT INTO alert_cursor (id, event_id, spike_id) VALUES (1, ?1, ?2) "
                  "ON CONFLICT (id) DO UPDATE SET event_id = max(event_id, excluded.event_id), "
                  "spike_id = max(spike_id, excluded.spike_id)"));
  move->Bind(1, cursor.event_id).Bind(2, cursor.spike_id);
  return move->Run();
}

absl::Status ApplyAlertOutcome(StoreWriter& w, int64_t alert_id, AlertOutcome outcome,
                               const std::string& error) {
  const char* sql =
      outcome == AlertOutcome::kDelivered
          ? "UPDATE alerts SET delivered = delivered + 1 WHERE id = ?1"
          : outcome == AlertOutcome::kFailed
                ? "UPDATE alerts SET failed = failed + 1, last_error = ?2 WHERE id = ?1"
                : "UPDATE alerts SET dropped = dropped + 1, last_error = ?2 WHERE id = ?1";
  STORE_ASSIGN_OR_RETURN(stmt, w.Get(sql));
  stmt->Bind(1, alert_id);
  if (outcome != AlertOutcome::kDelivered) stmt->Bind(2, error);
  return stmt->Run();
}

}  // namespace store_internal
}  // namespace ablate
