// The SQLite schema of the results store, and its forward-only migrations.
//
// The schema version is PRAGMA user_version. Migration i (0-based) takes a database's tables and
// indexes from version i to i + 1; a new database runs them all. Migrations only ever append: a
// released migration's table changes are never edited, so every database at version N has the
// same tables. The views are no migration's: each is defined once, in its current form, and
// MigrateStore drops them all before every migration and creates them again with the last, so a
// database at this build's version has this build's views whatever version it started from (one
// an interrupted migration left at an older version has none until it is migrated).
// docs/schema.md documents the current version table by table. Thread-safe (pure functions over a
// connection the caller owns).
#ifndef ABLATE_ORCHESTRATOR_STORE_SCHEMA_H_
#define ABLATE_ORCHESTRATOR_STORE_SCHEMA_H_

#include <sqlite3.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ablate {

// The schema version this build writes (the number of migrations).
int StoreSchemaVersion();

// One migration: its SQL, then its code (when it has any), in one transaction.
struct Migration {
  const char* sql = "";
  absl::Status (*code)(sqlite3* db) = nullptr;
};

// Each migration, in order.
const std::vector<Migration>& StoreMigrations();

// Brings the database open on `db` (a read-write connection) to StoreSchemaVersion(), each
// migration in its own IMMEDIATE transaction together with its user_version bump (the views
// dropped first, and created again in the last one), so a crash leaves the database at a whole
// version. A database already at this version is left as it is. FailedPrecondition when the
// file's version is newer than this build ("written by a newer ablate").
absl::Status MigrateStore(sqlite3* db);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_SCHEMA_H_
