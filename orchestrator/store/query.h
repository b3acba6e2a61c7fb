// The users' SQL sandbox: what `ablate query` (and anything else handed SQL from outside) runs
// in. A reader connection is guarded once (GuardConnection): `PRAGMA query_only`, no ATTACH slots,
// defensive mode, no extensions, an authorizer that refuses every statement but SELECT (and the
// PRAGMAs that read), and a progress handler. RunGuardedQuery then runs one statement under a
// time limit and a memory budget and caps its rows and bytes. Only the functions of an allowlist
// may be called, values are at most kMaxQueryValueBytes, and the functions whose one call costs
// the product of two lengths are bounded (kMaxCallWork), so that no single function call outruns
// the time limit; the process's SQLite heap has a hard ceiling (kSqliteHeapLimit) for what happens
// between two checks of the progress handler. Every refusal names what was refused.
//
// Thread safety: a QueryGuard belongs to one connection, used by one thread at a time.
#ifndef ABLATE_ORCHESTRATOR_STORE_QUERY_H_
#define ABLATE_ORCHESTRATOR_STORE_QUERY_H_

#include <sqlite3.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ablate {

// The longest string or BLOB a reader connection reads or builds (SQLITE_LIMIT_LENGTH): above
// anything the store holds (a spec is at most 1 MiB), and it keeps one function call
// (randomblob, zeroblob, replace, group_concat) from allocating gigabytes or running for seconds
// where the time limit cannot interrupt it. Beyond it a query fails "string or blob too big".
// Found with tests/fuzz/query_fuzz.
inline constexpr int kMaxQueryValueBytes = 8 << 20;
// The longest LIKE or GLOB pattern (SQLITE_LIMIT_LIKE_PATTERN_LENGTH; SQLite's default is 50,000).
inline constexpr int kMaxLikePatternBytes = 1000;
// The most work one call of like(), glob(), instr(), replace() or trim(X, Y) may do: the product
// of its two first arguments' lengths in bytes. SQLite's own compare each byte of one with each
// of the other in the worst case, in one VM step the progress handler cannot interrupt (about
// 5 ns a pair here: 2^24 pairs take under 0.1 s). A call beyond it fails, naming both lengths.
inline constexpr int64_t kMaxCallWork = int64_t{1} << 24;
// SqliteHardHeapLimit of any process that opens a StoreReader (when none is set): beyond it
// SQLite's allocations fail (SQLITE_NOMEM: a query fails, a writer's flush is retried). About five
// times what a coordinator's caches and statements use.
inline constexpr int64_t kSqliteHeapLimit = int64_t{1} << 30;
// What users' queries leave of kSqliteHeapLimit to everything else (the store's writer above
// all): a query is interrupted once SQLite as a whole uses more than the limit minus this, so that
// queries at their own memory limit cannot make the writer's flush fail.
inline constexpr int64_t kSqliteHeapHeadroom = int64_t{384} << 20;

// Limits of one ReadOnlyQuery.
struct QueryLimits {
  absl::Duration timeout = absl::Seconds(10);  // DeadlineExceeded past this
  int64_t max_rows = 100000;                   // rows beyond are dropped, `truncated` set
  // The memory the rows may take (values and their text); rows beyond are dropped, `truncated`
  // set. The default is gRPC's largest message (a query result goes back in one).
  int64_t max_bytes = int64_t{64} << 20;
  // SQLite memory the statement may add while it runs (the intermediate values it holds):
  // ResourceExhausted past it. Checked every 100 VM steps; kSqliteHeapLimit bounds what one
  // statement adds between two checks.
  int64_t max_memory = int64_t{256} << 20;
};

// A NULL, an INTEGER, a REAL or a TEXT (BLOBs are returned as TEXT of their bytes).
using SqlValue = std::variant<std::monostate, int64_t, double, std::string>;

struct QueryResult {
  std::vector<std::string> columns;
  std::vector<std::vector<SqlValue>> rows;
  bool truncated = false;  // max_rows or max_bytes was reached; more rows exist
};

struct BoundedFunctions;  // query.cc

// What the authorizer and the progress handler of one connection share with its user.
struct QueryGuard {
  // Set by the authorizer during a prepare: what it refused.
  std::string refused;
  // Checked by the progress handler while a statement runs.
  absl::Time deadline = absl::InfiniteFuture();
  bool timed_out = false;
  int64_t memory_ceiling = std::numeric_limits<int64_t>::max();  // of SqliteMemoryUsed()
  bool out_of_memory = false;
  // The bounded like(), glob(), instr(), replace() and trim()s of the connection: SQLite's own on
  // a private in-memory connection, behind kMaxCallWork and the deadline.
  std::shared_ptr<BoundedFunctions> bounded;

  void Reset();  // as new: nothing refused, no deadline, no budget
};

// Installs the sandbox on a read-only connection; `guard` must outlive the connection.
absl::Status GuardConnection(sqlite3* db, QueryGuard* guard);

// Runs one read-only statement on a guarded connection. Refusals are PermissionDenied naming what
// was refused: "query: write statements are not allowed (INSERT)", "... (ATTACH)", "query: PRAGMA
// user_version = 5 is not allowed (only reading PRAGMAs)". More than one statement is
// InvalidArgument; a syntax error is InvalidArgument with SQLite's message; running past
// limits.timeout is DeadlineExceeded; past limits.max_memory ResourceExhausted.
absl::StatusOr<QueryResult> RunGuardedQuery(sqlite3* db, QueryGuard* guard, const std::string& sql,
                                            const QueryLimits& limits);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_QUERY_H_
