// Text renderings of store results for the CLI (`ablate query`, `ablate table`, `ablate export`)
// and the dashboard API. Pure functions; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_STORE_FORMAT_H_
#define ABLATE_ORCHESTRATOR_STORE_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "orchestrator/store/reader.h"

namespace ablate {

// `format`: "table" (aligned columns, NULL shown as empty), "csv" (RFC 4180, header row) or
// "json" (an array of objects keyed by column name; NULL -> null, non-finite -> null).
// InvalidArgument for another format. A truncated result ends with a note in a table; csv and
// json keep their shape (QueryResponse.truncated says it, and `ablate query` on stderr). JSON
// writes bytes that are not UTF-8 as U+FFFD. A table that padding would make larger than
// kMaxTableBytes, or csv or json longer than kMaxFormattedBytes, is ResourceExhausted.
inline constexpr size_t kMaxTableBytes = size_t{12} << 20;
// The most any format writes (csv and json included): one answer fits the coordinator's largest
// gRPC message (16 MiB). More is ResourceExhausted, naming the limit.
inline constexpr size_t kMaxFormattedBytes = size_t{12} << 20;
absl::StatusOr<std::string> FormatQueryResult(const QueryResult& result,
                                              const std::string& format);

// The paper-style comparison table. `format`:
//   "markdown": one row per variant (and axis point when the sweep has axes): n, mean ± std of
//               val loss, val PPL, gate score, M-Act, F-Attn, spike score, params (total and
//               added, in K/M/B), diverged/failed counts. A std needs n >= 2 and is omitted
//               otherwise; a metric with no value shows "—".
//   "csv", "json": every field of ComparisonRow, means and stds as separate columns, exact
//               numbers (json: NaN -> null).
absl::StatusOr<std::string> FormatComparisonTable(const ComparisonTable& table,
                                                  const std::string& format);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_FORMAT_H_
