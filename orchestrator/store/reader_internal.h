// What the files of StoreReader share (not for use outside them): a pooled connection and its
// lease, the templates every typed read runs its statement through (ForEachRow, ReadRows,
// ReadFirstRow), ReadColumns (a row's columns into fields, by their types), and the row mappers
// more than one file reads with. reader.cc opens the store and holds the pools and the users'
// SQL; reader_sweeps.cc reads sweeps, their variants, runs, attempts and the comparison table;
// reader_metrics.cc a run's and a sweep's step metrics, evaluations and spikes; reader_events.cc
// the event log, the live streams, workers and counts.
#ifndef ABLATE_ORCHESTRATOR_STORE_READER_INTERNAL_H_
#define ABLATE_ORCHESTRATOR_STORE_READER_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "orchestrator/store/query.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/sqlite.h"
#include "proto/ablate.pb.h"

namespace ablate {

// One read-only connection, guarded by the users' SQL sandbox (query.h), with its statements.
struct StoreReader::Connection {
  SqliteDb db;
  std::unique_ptr<StmtCache> cache;
  QueryGuard guard;
};

// A connection taken from a pool, given back to it when the lease ends.
class StoreReader::Lease {
 public:
  Lease(const StoreReader* owner, Pool* pool, std::unique_ptr<Connection> connection)
      : owner_(owner), pool_(pool), connection_(std::move(connection)) {}
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&&) = delete;
  ~Lease() {
    if (connection_ != nullptr) owner_->Release(pool_, std::move(connection_));
  }
  Connection* operator->() const { return connection_.get(); }
  Connection& operator*() const { return *connection_; }

 private:
  const StoreReader* owner_;
  Pool* pool_;
  std::unique_ptr<Connection> connection_;
};

template <typename Bind, typename Read>
absl::Status StoreReader::ForEachRow(const std::string& sql, Bind bind, Read read) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(sql);
  if (!stmt.ok()) return stmt.status();
  bind(**stmt);
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) {
      (*stmt)->Reset();
      return row.status();
    }
    if (!*row) break;
    read(static_cast<const Stmt&>(**stmt));
  }
  (*stmt)->Reset();
  return absl::OkStatus();
}

template <typename T, typename Bind, typename Map>
absl::StatusOr<std::vector<T>> StoreReader::ReadRows(const std::string& sql, Bind bind,
                                                     Map map) const {
  std::vector<T> rows;
  if (absl::Status read = ForEachRow(sql, bind, [&](const Stmt& s) { rows.push_back(map(s)); });
      !read.ok()) {
    return read;
  }
  return rows;
}

template <typename T, typename Bind, typename Map>
absl::StatusOr<T> StoreReader::ReadFirstRow(const std::string& sql, Bind bind, Map map,
                                            const std::string& not_found) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(sql);
  if (!stmt.ok()) return stmt.status();
  bind(**stmt);
  absl::StatusOr<bool> row = (*stmt)->Step();
  std::optional<T> first;
  if (row.ok() && *row) first = map(static_cast<const Stmt&>(**stmt));
  (*stmt)->Reset();
  if (!row.ok()) return row.status();
  if (!first) return absl::NotFoundError(not_found);
  return *std::move(first);
}

namespace reader_internal {

// The bind of a statement without parameters.
inline void NoParameters(Stmt&) {}

// Column `i` of the current row into `out`, read as out's type: NULL reads as 0, "" or NaN.
inline void ReadColumn(const Stmt& s, int i, int64_t* out) { *out = s.ColumnInt(i); }
inline void ReadColumn(const Stmt& s, int i, int* out) { *out = static_cast<int>(s.ColumnInt(i)); }
inline void ReadColumn(const Stmt& s, int i, double* out) { *out = s.ColumnDouble(i); }
inline void ReadColumn(const Stmt& s, int i, std::string* out) { *out = s.ColumnText(i); }
inline void ReadColumn(const Stmt& s, int i, bool* out) { *out = s.ColumnInt(i) != 0; }

// Columns first, first + 1, ... of the current row into `fields`, in order: a row mapper names
// its fields in its SELECT's column order, and a field of a type with no ReadColumn (one that
// wants a conversion) does not compile.
template <typename... Fields>
void ReadColumns(const Stmt& s, int first, Fields*... fields) {
  int i = first;
  (ReadColumn(s, i++, fields), ...);
}

// The columns ReadSpike reads, of spike_events aliased `s`.
inline constexpr char kSpikeColumns[] =
    "s.step, s.signal, s.value, s.baseline, s.kind, s.action, s.rollback_to_step";

// A spike_events row's kSpikeColumns, from column `first` on.
SpikeEvent ReadSpike(const Stmt& s, int first);
// A spike of a sweep's run: its row id, the run's id, then kSpikeColumns.
SweepSpike ReadSweepSpike(const Stmt& s);

}  // namespace reader_internal
}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_READER_INTERNAL_H_
