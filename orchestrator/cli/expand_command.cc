#include "orchestrator/cli/expand_command.h"

#include <algorithm>
#include <set>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text_format.h"
#include "common/version.h"
#include "config/memory_plan.h"
#include "fmt/format.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/sweep/budget.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/tune.h"

namespace ablate {

namespace {

// The axis paths used by any run, in first-seen order.
std::vector<std::string> AxisPaths(const ExpandedSweep& sweep) {
  std::vector<std::string> paths;
  for (const RunSpec& run : sweep.runs()) {
    for (const AxisValue& a : run.axes()) {
      if (std::find(paths.begin(), paths.end(), a.path()) == paths.end()) paths.push_back(a.path());
    }
  }
  return paths;
}

std::string AxisValueOf(const RunSpec& run, const std::string& path) {
  for (const AxisValue& a : run.axes()) {
    if (a.path() == path) return a.value();
  }
  return "";
}

}  // namespace

std::string FormatExpandTable(const ExpandedSweep& sweep) {
  const std::vector<std::string> axes = AxisPaths(sweep);
  std::vector<std::string> header = {"#", "variant", "seed"};
  for (const std::string& path : axes) header.push_back(path.substr(path.rfind('.') + 1));
  for (const char* h : {"differs from reference", "total", "activated", "added", "budget",
                        "FLOPs/tok", "mem/device", "run key"}) {
    header.push_back(h);
  }
  const size_t first_number = 3 + axes.size() + 1;  // total, activated, added right-aligned
  std::vector<std::vector<std::string>> rows;
  std::set<std::string> variants;
  for (const RunSpec& run : sweep.runs()) {
    variants.insert(run.variant());
    std::vector<std::string> row = {std::to_string(run.index()), run.variant(),
                                    std::to_string(run.seed())};
    for (const std::string& path : axes) row.push_back(AxisValueOf(run, path));
    row.push_back(run.diff().empty() ? "-" : run.diff());
    if (run.config().has_program()) {  // counted by its count: command, if it has one
      const bool counted = run.params().total() > 0;
      row.push_back(counted ? FormatCount(run.params().total()) : "-");
      row.push_back(counted ? FormatCount(run.params().activated()) : "-");
      row.push_back(counted ? SignedCount(run.added_params()) : "-");
      row.push_back(run.budget().text().empty() ? "-" : run.budget().text());
      row.push_back("-");  // what a program computes is its own
      row.push_back("-");
    } else {
      row.push_back(FormatCount(run.params().total()));
      row.push_back(FormatCount(run.params().activated()));
      row.push_back(SignedCount(run.added_params()));
      row.push_back(run.budget().text().empty() ? "-" : run.budget().text());
      row.push_back(Engineering(run.flops_per_token()));
      row.push_back(FormatBytes(run.memory().per_device()));
    }
    row.push_back(run.run_key());
    rows.push_back(std::move(row));
  }
  std::vector<bool> right(header.size(), false);
  right[0] = right[2] = true;  // index, seed, and total, activated, added
  for (size_t c = first_number; c < first_number + 3; ++c) right[c] = true;
  // The data each run reads, once per distinct path: what its key was computed from.
  std::string data;
  std::set<std::string> seen;
  for (const RunSpec& run : sweep.runs()) {
    const DataConfig& d = run.config().train().data();
    if (d.path().empty() || !seen.insert(d.path() + "\n" + d.val_path()).second) continue;
    std::string format = absl::AsciiStrToLower(DataFormat_Name(d.format()).substr(5));
    data += fmt::format("data {}{}: {}, vocabulary {}{}, fingerprint {}\n", d.path(),
                        d.val_path().empty() ? "" : " + " + d.val_path(), format,
                        FormatCount(run.config().model().vocab_size()),
                        d.has_eod_token() ? fmt::format(", end of document {}", d.eod_token()) : "",
                        d.fingerprint().empty() ? "-" : d.fingerprint());
  }
  return fmt::format("sweep {}: {} runs of {} variants; reference {}; code {}\n", sweep.name(),
                     sweep.runs_size(), variants.size(), sweep.reference(),
                     sweep.build().empty() ? sweep.code_version() : sweep.build()) +
         data + AlignedTable(header, rows, right, /*rule=*/false);
}

std::string FormatExpandCsv(const ExpandedSweep& sweep) {
  const std::vector<std::string> axes = AxisPaths(sweep);
  std::vector<std::string> header = {"index", "run_key", "sweep", "variant", "seed"};
  header.insert(header.end(), axes.begin(), axes.end());
  for (const char* h : {"diff", "total_params", "activated_params", "added_params",
                        "budget_dim", "budget_from", "budget_to", "budget_residual", "budget",
                        "flops_per_token", "memory_per_device_bytes", "memory_parameters_bytes",
                        "memory_gradients_bytes", "memory_optimizer_bytes",
                        "memory_activations_bytes", "memory_activations_checkpointed_bytes",
                        "memory_largest_temporary_bytes", "description", "code_version"}) {
    header.push_back(h);
  }
  std::string out = absl::StrJoin(header, ",") + "\n";
  for (const RunSpec& run : sweep.runs()) {
    std::vector<std::string> row = {std::to_string(run.index()), run.run_key(), run.sweep(),
                                    run.variant(), std::to_string(run.seed())};
    for (const std::string& path : axes) row.push_back(AxisValueOf(run, path));
    const BudgetSolution& b = run.budget();
    const bool matched = b.match() != BUDGET_NONE;
    const MemoryPlan& m = run.memory();
    row.insert(row.end(),
               {run.diff(), std::to_string(run.params().total()),
                std::to_string(run.params().activated()), std::to_string(run.added_params()),
                b.dim(), matched ? std::to_string(b.from()) : "",
                matched ? std::to_string(b.to()) : "", matched ? std::to_string(b.residual()) : "",
                b.text(), fmt::format("{:.6g}", run.flops_per_token()),
                std::to_string(m.per_device()), std::to_string(m.parameters()),
                std::to_string(m.gradients()), std::to_string(m.optimizer()),
                std::to_string(m.activations()), std::to_string(m.activations_checkpointed()),
                std::to_string(m.largest_temporary()), run.description(), run.code_version()});
    for (std::string& cell : row) cell = CsvField(cell);
    out += absl::StrJoin(row, ",") + "\n";
  }
  return out;
}

std::string FormatExpandJson(const ExpandedSweep& sweep) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(sweep, &out, options);  // no Any: cannot fail
  return out;
}

absl::Status RunExpand(const std::string& spec_path, const std::string& format,
                       const CostFlags& cost, std::ostream& out, std::ostream& err) {
  if (format != "table" && format != "json" && format != "csv") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: must be table, json or csv, got \"", format, "\""));
  }
  ExpandOptions options;
  options.device_memory_bytes = cost.DeviceMemoryBytes();
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweepFile(spec_path, options);
  if (!sweep.ok()) return sweep.status();
  std::string cost_line = FormatCostLine(
      EstimateSweepCost(*sweep), cost, absl::StrCat(sweep->runs_size(), " runs"));
  if (sweep->has_tune()) absl::StrAppend(&cost_line, TunePlanText(sweep->tune()), "\n");
  std::string note = UncommittedSourcesNote(
      {sweep->uncommitted().begin(), sweep->uncommitted().end()});
  if (!note.empty()) note += "\n";
  if (format == "json") {
    out << FormatExpandJson(*sweep) << std::flush;
    err << note << cost_line;
  } else if (format == "csv") {
    out << FormatExpandCsv(*sweep) << std::flush;
    err << note << cost_line;
  } else {
    out << FormatExpandTable(*sweep) << note << cost_line;
  }
  return absl::OkStatus();
}

void AddExpandCommand(CLI::App* app, std::ostream* out, std::ostream* err,
                      std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "expand",
      "Dry run: list every run a sweep spec launches, with exact parameter counts (total, "
      "activated, added vs the reference), how its budget was matched, training FLOPs per "
      "token, the memory it needs per device, seed and run key; then the sweep's total FLOPs "
      "and, with --device-peak, device-hours. Nothing is queued.");
  auto specs = std::make_shared<std::vector<std::string>>();
  auto format = std::make_shared<std::string>("table");
  auto cost = std::make_shared<CostFlags>();
  cmd->add_option("spec", *specs,
                  "sweep spec (YAML or JSON; see docs/spec.md); several are expanded one after "
                  "another, each as alone (table format only)")
      ->required();
  cmd->add_option("--format,-f", *format, "output format")
      ->check(CLI::IsMember({"table", "json", "csv"}))
      ->capture_default_str();
  AddCostFlags(cmd, cost.get());
  cmd->callback([out, err, action, specs, format, cost] {
    *action = [out, err, specs, format, cost]() -> absl::Status {
      if (specs->size() > 1 && *format != "table") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--format ", *format, " takes one spec (got ", specs->size(),
            "): expand them one at a time, so that each output parses alone"));
      }
      // Every spec is expanded, whatever an earlier one said; the errors are all reported.
      std::vector<std::string> errors;
      absl::StatusCode code = absl::StatusCode::kOk;
      for (size_t i = 0; i < specs->size(); ++i) {
        if (i > 0) *out << "\n";
        if (absl::Status s = RunExpand((*specs)[i], *format, *cost, *out, *err); !s.ok()) {
          if (code == absl::StatusCode::kOk) code = s.code();  // the first error's exit code
          errors.push_back(std::string(s.message()));
        }
      }
      if (errors.empty()) return absl::OkStatus();
      return absl::Status(code, absl::StrJoin(errors, "\n"));
    };
  });
}

}  // namespace ablate
