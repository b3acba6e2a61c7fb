// StoreReader's reads of what happens in the store as a whole: the event log, the live streams
// of a sweep (where one starts, and what changed since its cursor: what `ablate watch` and the
// dashboard's event stream send), the workers with their load, and the counts /metrics exports.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/run_state.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/reader_internal.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {

using reader_internal::kSpikeColumns;
using reader_internal::NoParameters;
using reader_internal::ReadColumns;
using reader_internal::ReadSweepSpike;

namespace {

WorkerInfo ReadWorker(const Stmt& s) {
  WorkerInfo w;
  ReadColumns(s, 0, &w.id, &w.name, &w.resources_json, &w.registered_at, &w.last_seen, &w.state,
              &w.slots_in_use, &w.running);
  return w;
}

EventInfo ReadEvent(const Stmt& s) {
  EventInfo e;
  ReadColumns(s, 0, &e.id, &e.time, &e.sweep_id, &e.run_id, &e.kind, &e.message, &e.state);
  return e;
}

}  // namespace

absl::StatusOr<ChangeCursor> StoreReader::LatestCursor() const {
  ChangeCursor cursor;
  absl::Status read = ForEachRow(
      "SELECT (SELECT coalesce(max(id), 0) FROM events), "
      "(SELECT coalesce(max(id), 0) FROM spike_events)",
      NoParameters, [&](const Stmt& r) {
        cursor.event_id = r.ColumnInt(0);
        cursor.spike_id = r.ColumnInt(1);
      });
  if (!read.ok()) return read;
  return cursor;
}

absl::StatusOr<SweepChanges> StoreReader::ChangesSince(
    int64_t sweep_id, const ChangeCursor& cursor, int limit,
    const std::vector<RunState>& run_states) const {
  SweepChanges changes;
  changes.next = cursor;
  absl::StatusOr<std::vector<EventInfo>> events = Events(sweep_id, cursor.event_id, limit);
  if (!events.ok()) return events.status();
  changes.events = *std::move(events);
  if (!changes.events.empty()) changes.next.event_id = changes.events.back().id;
  absl::StatusOr<std::vector<SweepSpike>> spikes = ReadRows<SweepSpike>(
      absl::StrCat("SELECT s.id, s.run_id, ", kSpikeColumns,
                   " FROM spike_events s JOIN runs r ON "
                   "r.id = s.run_id WHERE r.sweep_id = ?1 AND s.id > ?2 ORDER BY s.id LIMIT ?3"),
      [&](Stmt& q) {
        q.Bind(1, sweep_id).Bind(2, cursor.spike_id).Bind(3, static_cast<int64_t>(limit));
      },
      ReadSweepSpike);
  if (!spikes.ok()) return spikes.status();
  changes.spikes = *std::move(spikes);
  if (!changes.spikes.empty()) changes.next.spike_id = changes.spikes.back().id;
  absl::StatusOr<std::vector<RunInfo>> runs = RunsOfSweep(sweep_id, run_states);
  if (!runs.ok()) return runs.status();
  changes.runs = *std::move(runs);
  return changes;
}

absl::StatusOr<StoreCounts> StoreReader::Counts() const {
  StoreCounts counts;
  for (const std::string& state : RunStateNames()) counts.runs_by_state[state] = 0;
  struct Table {
    const char* sql;
    std::map<std::string, int64_t>* by_state;
  };
  const Table tables[] = {
      // sum() of steps is taken in REAL: a huge steps_done cannot overflow it.
      {"SELECT state, count(*), coalesce(total(steps_done), 0) FROM runs GROUP BY state",
       &counts.runs_by_state},
      {"SELECT state, count(*), 0 FROM sweeps GROUP BY state", &counts.sweeps_by_state},
      {"SELECT state, count(*), 0 FROM workers GROUP BY state", &counts.workers_by_state}};
  for (const Table& t : tables) {
    absl::Status read = ForEachRow(t.sql, NoParameters, [&](const Stmt& r) {
      (*t.by_state)[r.ColumnText(0)] = r.ColumnInt(1);
      counts.steps_done += r.ColumnDouble(2);
    });
    if (!read.ok()) return read;
  }
  return counts;
}

absl::StatusOr<std::vector<WorkerInfo>> StoreReader::ListWorkers() const {
  return ReadRows<WorkerInfo>(
      "SELECT w.id, w.name, w.resources_json, w.registered_at, w.last_seen, w.state, "
      "COALESCE(SUM(MAX(r.devices, 1)), 0), COUNT(r.id) FROM workers w "
      "LEFT JOIN runs r ON r.worker_id = w.id AND r.state = 'RUNNING' "
      "GROUP BY w.id ORDER BY w.id",
      NoParameters, ReadWorker);
}

absl::StatusOr<std::vector<EventInfo>> StoreReader::Events(int64_t sweep_id, int64_t after_id,
                                                           int limit) const {
  return ReadRows<EventInfo>(
      absl::StrCat("SELECT id, time, sweep_id, run_id, kind, message, coalesce(state, '') "
                   "FROM events WHERE id > ?2 ",
                   sweep_id != 0 ? "AND sweep_id = ?1 " : "", "ORDER BY id LIMIT ?3"),
      [&](Stmt& q) {
        if (sweep_id != 0) q.Bind(1, sweep_id);
        q.Bind(2, after_id).Bind(3, static_cast<int64_t>(limit));
      },
      ReadEvent);
}

absl::StatusOr<std::vector<SweepSpike>> StoreReader::SpikesSince(int64_t after_id,
                                                                 int limit) const {
  return ReadRows<SweepSpike>(
      absl::StrCat("SELECT s.id, s.run_id, ", kSpikeColumns,
                   " FROM spike_events s WHERE s.id > ?1 ORDER BY s.id LIMIT ?2"),
      [&](Stmt& q) { q.Bind(1, after_id).Bind(2, static_cast<int64_t>(limit)); }, ReadSweepSpike);
}

absl::StatusOr<std::optional<ChangeCursor>> StoreReader::AlertCursorRow() const {
  std::optional<ChangeCursor> cursor;
  absl::Status read = ForEachRow("SELECT event_id, spike_id FROM alert_cursor WHERE id = 1",
                                 NoParameters, [&](const Stmt& r) {
                                   cursor = ChangeCursor{r.ColumnInt(0), r.ColumnInt(1)};
                                 });
  if (!read.ok()) return read;
  return cursor;
}

}  // namespace ablate
