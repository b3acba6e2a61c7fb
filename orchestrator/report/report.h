// `ablate report`: a sweep's results as files that open from disk, with no server and no network
// (docs/cli.md):
//
//   OUT/index.html      the figures drawn by the dashboard's own chart code (dashboard/js/
//                       charts.js, figures.js and uPlot, inlined from the assets compiled into
//                       the binary), the data embedded as JSON; the comparison table, variants,
//                       runs, the spec
//   OUT/report.md       the same as markdown: the `ablate table` comparison and the figures below
//   OUT/figures/*.svg   loss curves as mean ± std bands with spike markers, val loss bars with
//                       error bars, M-Act and F-Attn per layer, gate-score histograms, PPL against
//                       evaluation length (when measured)
//   OUT/tables/*.csv    every table and every figure's numbers
//   OUT/spec.yaml       the spec as submitted
//
// Deterministic: the same database gives the same bytes, but for one line of index.html and one of
// report.md that say when they were generated (each contains kGeneratedAtMarker).
#ifndef ABLATE_ORCHESTRATOR_REPORT_REPORT_H_
#define ABLATE_ORCHESTRATOR_REPORT_REPORT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "orchestrator/report/figures.h"
#include "orchestrator/store/reader.h"

namespace ablate {

// The text of the one line per document that changes from one run to the next.
inline constexpr char kGeneratedAtMarker[] = "Generated at ";

struct ReportOptions {
  std::string sweep;    // name or id
  std::string out_dir;  // created when missing (and its parents)
  // An existing --out that is not empty is refused unless `force`: then the report's files are
  // written over, and the figures/*.svg and tables/*.csv that this report does not write (a figure
  // an earlier report of another sweep had) are removed. Nothing else in it is touched.
  bool force = false;
  FigureOptions figures;
  // Runs tagged so (on the run or the sweep) are left out of the tables and figures.
  std::vector<std::string> exclude_tags;
  std::string db_label;      // how errors name the database (its path)
  std::string generated_at;  // the generated-at line's time; "" = now, UTC
};

struct ReportFiles {
  std::string sweep;               // its name
  std::vector<std::string> files;  // paths relative to out_dir, sorted
};

// Reads the sweep and writes its report. Errors, each naming what is wrong:
//   NotFound            "report: no sweep named X in DB (sweeps there: a, b)"
//   FailedPrecondition  "report: OUT is not empty (N entries): pass --force to write over it, or
//                        choose another --out", "report: OUT is not a directory"
//   PermissionDenied / Internal: "report: cannot create OUT: <reason>", "report: cannot write
//                        OUT/index.html: <reason>"
absl::StatusOr<ReportFiles> WriteReport(const StoreReader& reader, const ReportOptions& options);

// The report's files in memory, by relative path, without writing them (what WriteReport writes).
absl::StatusOr<std::map<std::string, std::string>> RenderReport(const StoreReader& reader,
                                                                const ReportOptions& options);

// The dashboard's ES modules as one inline module script: each module in `order` with its imports
// of the others removed and `export` dropped. InvalidArgument when a module has an import or export
// form this does not handle (anything but single-line `import {...} from './x.js';` and
// `export function|const|async function|class`), or text that would end the script element.
absl::StatusOr<std::string> InlineModules(const std::vector<std::string>& order);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_REPORT_REPORT_H_
