#include "orchestrator/cli/report_command.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "orchestrator/report/report.h"
#include "orchestrator/store/reader.h"

namespace ablate {
namespace {

struct ReportCommandOptions {
  std::string sweep;
  std::string out;
  bool force = false;
  std::string state_dir = ".ablate";
  std::string db;  // "" = STATE_DIR/ablate.db
  int points = 400;
  std::vector<std::string> exclude_tags;
};

absl::Status RunReport(const ReportCommandOptions& options, std::ostream& out) {
  const std::string db = options.db.empty()
                             ? (std::filesystem::path(options.state_dir) / "ablate.db").string()
                             : options.db;
  if (!std::filesystem::exists(db)) {
    return absl::NotFoundError(absl::StrCat(
        "report: no database at ", db,
        options.db.empty()
            ? " (name the coordinator's state dir with --state-dir, or the file with --db)"
            : ""));
  }
  ReaderOptions ro;
  ro.path = db;
  ro.max_connections = 1;
  absl::StatusOr<std::unique_ptr<StoreReader>> reader = StoreReader::Open(ro);
  if (!reader.ok()) return reader.status();
  ReportOptions ropts;
  ropts.sweep = options.sweep;
  ropts.out_dir = options.out;
  ropts.force = options.force;
  ropts.figures.curve_points = options.points;
  ropts.exclude_tags = options.exclude_tags;
  ropts.db_label = db;
  absl::StatusOr<ReportFiles> result = WriteReport(**reader, ropts);
  if (!result.ok()) return result.status();
  size_t figures = 0, tables = 0;
  for (const std::string& f : result->files) {
    figures += f.rfind("figures/", 0) == 0;
    tables += f.rfind("tables/", 0) == 0;
  }
  out << fmt::format("report of sweep {}: {}/index.html, {}/report.md, {} figures, {} tables\n",
                     result->sweep, options.out, options.out, figures, tables);
  return absl::OkStatus();
}

}  // namespace

void AddReportCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "report",
      "Write a sweep's report: index.html (opens from disk, no server), report.md with "
      "SVG figures, and CSVs of every table. Reads the results database read-only.");
  auto options = std::make_shared<ReportCommandOptions>();
  cmd->add_option("sweep", options->sweep, "sweep name or id")->required();
  cmd->add_option("--out,-o", options->out, "directory to write the report into")->required();
  cmd->add_flag("--force", options->force,
                "write over a directory that is not empty (a previous report)");
  cmd->add_option("--state-dir", options->state_dir,
                  "the coordinator's state dir (its ablate.db is read unless --db)")
      ->capture_default_str();
  cmd->add_option("--db", options->db, "the database file to read (default STATE_DIR/ablate.db)");
  cmd->add_option("--points", options->points, "steps on each loss curve's grid")
      ->check(CLI::Range(2, 5000))
      ->capture_default_str();
  cmd->add_option("--exclude-tag", options->exclude_tags,
                  "leave out runs tagged TAG, on the run or its sweep (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->callback(
      [out, action, options] { *action = [out, options] { return RunReport(*options, *out); }; });
}

}  // namespace ablate
