// Text renderings of store results (format.h): a query's rows as a table, CSV or JSON, and the
// comparison table as markdown, CSV or JSON.
#include "orchestrator/store/format.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/text_format.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ablate {
namespace {

std::string ValueText(const SqlValue& v) {
  if (std::holds_alternative<int64_t>(v)) return std::to_string(std::get<int64_t>(v));
  if (std::holds_alternative<double>(v)) return fmt::format("{}", std::get<double>(v));
  if (std::holds_alternative<std::string>(v)) return std::get<std::string>(v);
  return "";
}

nlohmann::json ValueJson(const SqlValue& v) {
  if (std::holds_alternative<int64_t>(v)) return std::get<int64_t>(v);
  if (std::holds_alternative<double>(v)) {
    double d = std::get<double>(v);
    return std::isfinite(d) ? nlohmann::json(d) : nlohmann::json(nullptr);
  }
  if (std::holds_alternative<std::string>(v)) return std::get<std::string>(v);
  return nullptr;
}

nlohmann::json NumberJson(double d) {
  return std::isfinite(d) ? nlohmann::json(d) : nlohmann::json(nullptr);
}

// Significant digits that keep a std readable: 3 decimals for values near 1, fewer above.
int DecimalsFor(const std::vector<ComparisonRow>& rows, const MeanStd ComparisonRow::*field) {
  double largest = 0;
  for (const ComparisonRow& r : rows) {
    if (std::isfinite((r.*field).mean)) largest = std::max(largest, std::fabs((r.*field).mean));
  }
  if (largest >= 100) return 1;
  if (largest >= 10) return 2;
  if (largest >= 1) return 3;
  return 4;
}

// A column of ComparisonRow's figures in the tables: its csv/json name (the key prefix of its mean
// and std), its markdown heading, and the field it shows.
struct Column {
  const char* name;
  const char* heading;
  MeanStd ComparisonRow::*field;
};

// What runs score (ComparisonRow), in the order the tables show them.
constexpr Column kMetricColumns[] = {
    {"val_loss", "val loss", &ComparisonRow::val_loss},
    {"val_ppl", "val PPL", &ComparisonRow::val_ppl},
    {"gate_score", "gate score", &ComparisonRow::gate_score},
    {"m_act", "M-Act", &ComparisonRow::m_act},
    {"f_attn", "F-Attn", &ComparisonRow::f_attn},
    {"spike_score", "spike score", &ComparisonRow::spike_score},
    {"train_loss", "train loss", &ComparisonRow::train_loss},
};

// The sink rate (Probes.sink_rate): in markdown after F-Attn where some row measured it, in csv
// after the costs (a table of runs stored before it keeps its columns where they were).
constexpr Column kSinkRateColumn = {"sink_rate", "sink rate", &ComparisonRow::sink_rate};

bool HasSinkRate(const ComparisonTable& table) {
  return std::any_of(table.rows.begin(), table.rows.end(),
                     [](const ComparisonRow& r) { return std::isfinite(r.sink_rate.mean); });
}

// What runs cost (ComparisonRow), in the order the tables show them.
constexpr Column kCostColumns[] = {
    {"peak_memory_bytes", "memory", &ComparisonRow::peak_memory_bytes},
    {"train_seconds", "train time", &ComparisonRow::train_seconds},
    {"eval_seconds", "eval time", &ComparisonRow::eval_seconds},
    {"tokens_per_s", "tokens/s", &ComparisonRow::tokens_per_s},
    {"flops", "FLOPs", &ComparisonRow::flops},
};

// Whether any row has a cost figure: tables of runs stored before costs were kept show none.
bool HasCosts(const ComparisonTable& table) {
  return std::any_of(table.rows.begin(), table.rows.end(), [](const ComparisonRow& r) {
    return std::isfinite(r.train_seconds.mean) || std::isfinite(r.flops.mean) ||
           std::isfinite(r.peak_memory_bytes.mean);
  });
}

// A cost's mean for people: "81.2 MB", "45 s" / "12.3 min" / "4.1 h", "28.8K", "4.23e11".
std::string CostText(const Column& c, const MeanStd& m) {
  if (!std::isfinite(m.mean)) return "—";
  if (c.field == &ComparisonRow::peak_memory_bytes) return FormatBytes(m.mean);
  if (c.field == &ComparisonRow::train_seconds || c.field == &ComparisonRow::eval_seconds) {
    return FormatDuration(m.mean);
  }
  if (c.field == &ComparisonRow::tokens_per_s) return HumanCount(m.mean);
  return FormatFlops(m.mean);
}

// The union of every row's evaluation lengths (TrainConfig.eval_seq_lens), and whether any row
// measured each with YaRN.
std::map<int64_t, bool> EvaluationLengths(const ComparisonTable& table) {
  std::map<int64_t, bool> lengths;
  for (const ComparisonRow& r : table.rows) {
    for (const LengthStat& l : r.lengths) lengths[l.seq_len] = lengths[l.seq_len] || l.yarn;
  }
  return lengths;
}

const LengthStat* LengthOf(const ComparisonRow& r, int64_t seq_len) {
  for (const LengthStat& l : r.lengths) {
    if (l.seq_len == seq_len) return &l;
  }
  return nullptr;
}

std::string MarkdownComparison(const ComparisonTable& table,
                               const std::map<int64_t, bool>& lengths) {
  const bool has_axes = std::any_of(table.rows.begin(), table.rows.end(),
                                    [](const ComparisonRow& r) { return !r.axes.empty(); });
  const bool has_best = std::any_of(table.rows.begin(), table.rows.end(),
                                    [](const ComparisonRow& r) { return !r.best.empty(); });
  const bool has_stopped = std::any_of(table.rows.begin(), table.rows.end(),
                                       [](const ComparisonRow& r) { return r.stopped > 0; });
  const bool has_costs = HasCosts(table);
  const bool has_sink_rate = HasSinkRate(table);
  std::vector<std::string> header = {"variant"};
  if (has_axes) header.push_back("axes");
  if (has_best) header.push_back("best value");
  header.push_back("n");
  for (const Column& c : kMetricColumns) {
    if (c.field != &ComparisonRow::train_loss) header.push_back(c.heading);
    if (c.field == &ComparisonRow::f_attn && has_sink_rate)
      header.push_back(kSinkRateColumn.heading);
  }
  for (const auto& [len, yarn] : lengths) {
    header.push_back(absl::StrCat("PPL@", len, yarn ? " (YaRN)" : ""));
  }
  for (const std::string& name : table.evals) header.push_back(name);
  if (has_costs) {
    for (const Column& c : kCostColumns) header.push_back(c.heading);
  }
  for (const char* h : {"params", "added", "diverged", "failed"}) header.push_back(h);
  if (has_stopped) header.push_back("stopped");
  std::vector<int> decimals;
  for (const Column& c : kMetricColumns) {
    decimals.push_back(DecimalsFor(table.rows, c.field));
  }
  std::string out = absl::StrCat("| ", absl::StrJoin(header, " | "), " |\n|");
  for (size_t i = 0; i < header.size(); ++i) {
    out += i == 0 || (has_axes && i == 1) || (has_best && i == 1 + has_axes) ? "---|" : "---:|";
  }
  out += "\n";
  for (const ComparisonRow& r : table.rows) {
    std::vector<std::string> cells = {r.variant};
    if (has_axes) cells.push_back(r.axes);
    if (has_best) cells.push_back(r.best.empty() ? "—" : r.best);
    cells.push_back(r.unfinished > 0 ? absl::StrCat(r.n, " (", r.unfinished, " unfinished)")
                                     : absl::StrCat(r.n));
    for (size_t i = 0; i < std::size(kMetricColumns); ++i) {
      const Column& c = kMetricColumns[i];
      if (c.field == &ComparisonRow::train_loss) continue;
      const MeanStd& m = r.*(c.field);
      cells.push_back(MeanStdText(m.mean, m.std, decimals[i]));
      if (c.field == &ComparisonRow::f_attn && has_sink_rate) {
        cells.push_back(MeanStdText(r.sink_rate.mean, r.sink_rate.std, 3));
      }
    }
    for (const auto& [len, yarn] : lengths) {
      const LengthStat* l = LengthOf(r, len);
      cells.push_back(l == nullptr ? "—" : MeanStdText(l->val_ppl.mean, l->val_ppl.std, 3));
    }
    for (const std::string& name : table.evals) {
      auto m = r.metrics.find(name);
      cells.push_back(m == r.metrics.end() ? "—" : MeanStdText(m->second.mean, m->second.std, 3));
    }
    if (has_costs) {
      for (const Column& c : kCostColumns) cells.push_back(CostText(c, r.*(c.field)));
    }
    cells.push_back(HumanCount(r.params_total));
    cells.push_back(r.params_added == 0 ? "0" : HumanCount(r.params_added, /*sign=*/true));
    cells.push_back(absl::StrCat(r.diverged));
    cells.push_back(absl::StrCat(r.failed));
    if (has_stopped) cells.push_back(absl::StrCat(r.stopped));
    absl::StrAppend(&out, "| ", absl::StrJoin(cells, " | "), " |\n");
  }
  return out;
}

std::string CsvComparison(const ComparisonTable& table, const std::map<int64_t, bool>& lengths) {
  std::vector<std::string> header = {"sweep", "variant",  "axes",   "runs",
                                     "n",     "diverged", "failed", "unfinished"};
  for (const Column& c : kMetricColumns) {
    header.push_back(absl::StrCat(c.name, "_mean"));
    header.push_back(absl::StrCat(c.name, "_std"));
  }
  for (const char* h : {"params_total", "params_activated", "params_added"}) header.push_back(h);
  for (const auto& [len, yarn] : lengths) {
    header.push_back(absl::StrCat("val_ppl_at_", len, "_mean"));
    header.push_back(absl::StrCat("val_ppl_at_", len, "_std"));
  }
  // Columns only tuned sweeps have, last: every other table keeps its shape.
  const bool has_stopped = std::any_of(table.rows.begin(), table.rows.end(),
                                       [](const ComparisonRow& r) { return r.stopped > 0; });
  const bool has_best = std::any_of(table.rows.begin(), table.rows.end(),
                                    [](const ComparisonRow& r) { return !r.best.empty(); });
  if (has_stopped) header.push_back("stopped");
  if (has_best) header.push_back("best");
  // The costs last of all: a table of runs stored before them keeps its columns where they were.
  for (const Column& c : kCostColumns) {
    header.push_back(absl::StrCat(c.name, "_mean"));
    header.push_back(absl::StrCat(c.name, "_std"));
  }
  header.push_back("sink_rate_mean");
  header.push_back("sink_rate_std");
  // The chosen metrics by name (`table --evals`) after everything else.
  for (const std::string& name : table.evals) {
    header.push_back(CsvField(absl::StrCat(name, "_mean")));
    header.push_back(CsvField(absl::StrCat(name, "_std")));
  }
  std::string out = absl::StrJoin(header, ",") + "\n";
  for (const ComparisonRow& r : table.rows) {
    std::vector<std::string> cells = {CsvField(table.sweep),  CsvField(r.variant),
                                      CsvField(r.axes),       absl::StrCat(r.runs),
                                      absl::StrCat(r.n),      absl::StrCat(r.diverged),
                                      absl::StrCat(r.failed), absl::StrCat(r.unfinished)};
    for (const Column& c : kMetricColumns) {
      cells.push_back(CsvNumber((r.*(c.field)).mean));
      cells.push_back(CsvNumber((r.*(c.field)).std));
    }
    cells.push_back(CsvNumber(r.params_total));
    cells.push_back(CsvNumber(r.params_activated));
    cells.push_back(CsvNumber(r.params_added));
    for (const auto& [len, yarn] : lengths) {
      const LengthStat* l = LengthOf(r, len);
      cells.push_back(CsvNumber(l == nullptr ? kNaN : l->val_ppl.mean));
      cells.push_back(CsvNumber(l == nullptr ? kNaN : l->val_ppl.std));
    }
    if (has_stopped) cells.push_back(absl::StrCat(r.stopped));
    if (has_best) cells.push_back(CsvField(r.best));
    for (const Column& c : kCostColumns) {
      cells.push_back(CsvNumber((r.*(c.field)).mean));
      cells.push_back(CsvNumber((r.*(c.field)).std));
    }
    cells.push_back(CsvNumber(r.sink_rate.mean));
    cells.push_back(CsvNumber(r.sink_rate.std));
    for (const std::string& name : table.evals) {
      auto m = r.metrics.find(name);
      cells.push_back(CsvNumber(m == r.metrics.end() ? kNaN : m->second.mean));
      cells.push_back(CsvNumber(m == r.metrics.end() ? kNaN : m->second.std));
    }
    absl::StrAppend(&out, absl::StrJoin(cells, ","), "\n");
  }
  return out;
}

// {"mean", "std"}, non-finite as null.
nlohmann::json MeanStdObject(const MeanStd& m) {
  return {{"mean", NumberJson(m.mean)}, {"std", NumberJson(m.std)}};
}

std::string JsonComparison(const ComparisonTable& table) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ComparisonRow& r : table.rows) {
    nlohmann::json o;
    o["variant"] = r.variant;
    o["description"] = r.description;
    o["axes"] = r.axes;
    o["runs"] = r.runs;
    o["n"] = r.n;
    o["diverged"] = r.diverged;
    o["failed"] = r.failed;
    o["unfinished"] = r.unfinished;
    o["stopped"] = r.stopped;
    if (!r.best.empty()) o["best"] = r.best;
    for (const Column& c : kMetricColumns) o[c.name] = MeanStdObject(r.*(c.field));
    o[kSinkRateColumn.name] = MeanStdObject(r.sink_rate);
    o["params_total"] = NumberJson(r.params_total);
    o["params_activated"] = NumberJson(r.params_activated);
    o["params_added"] = NumberJson(r.params_added);
    for (const Column& c : kCostColumns) o[c.name] = MeanStdObject(r.*(c.field));
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [name, m] : r.metrics) metrics[name] = MeanStdObject(m);
    o["metrics"] = std::move(metrics);
    nlohmann::json list = nlohmann::json::array();
    for (const LengthStat& l : r.lengths) {
      list.push_back({{"seq_len", l.seq_len},
                      {"yarn", l.yarn},
                      {"n", l.n},
                      {"val_loss", MeanStdObject(l.val_loss)},
                      {"val_ppl", MeanStdObject(l.val_ppl)}});
    }
    o["lengths"] = std::move(list);
    rows.push_back(std::move(o));
  }
  nlohmann::json out;
  out["sweep"] = table.sweep;
  out["rows"] = std::move(rows);
  return out.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<std::string> FormatQueryResult(const QueryResult& result,
                                              const std::string& format) {
  const auto too_big = [&](size_t bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "query: the ", format, " output passed ", bytes, " bytes (the limit is ",
        kMaxFormattedBytes, "); select fewer rows (LIMIT, --max-rows) or fewer columns"));
  };
  if (format == "json") {
    // Row by row, so that the output is measured as it grows, in the layout of
    // nlohmann::json::dump(2): one shape whether or not the result was truncated (the caller
    // says so beside it).
    // A TEXT or BLOB need not be UTF-8 (SELECT x'ff'): dump() would throw; write U+FFFD instead.
    // Found with tests/fuzz/query_fuzz.
    constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
    if (result.rows.empty()) return std::string("[]\n");
    std::string out = "[\n";
    for (size_t r = 0; r < result.rows.size(); ++r) {
      nlohmann::json object = nlohmann::json::object();
      for (size_t i = 0; i < result.rows[r].size(); ++i) {
        object[result.columns[i]] = ValueJson(result.rows[r][i]);
      }
      const std::string dumped = object.dump(2, ' ', false, kReplace);
      // Indented one level inside the array.
      absl::StrAppend(&out, "  ", absl::StrReplaceAll(dumped, {{"\n", "\n  "}}),
                      r + 1 < result.rows.size() ? ",\n" : "\n");
      if (out.size() > kMaxFormattedBytes) return too_big(out.size());
    }
    out += "]\n";
    return out;
  }
  if (format == "csv") {
    std::vector<std::string> header;
    for (const std::string& c : result.columns) header.push_back(CsvField(c));
    std::string out = absl::StrJoin(header, ",") + "\n";
    for (const auto& row : result.rows) {
      std::vector<std::string> cells;
      for (const SqlValue& v : row) cells.push_back(CsvField(ValueText(v)));
      absl::StrAppend(&out, absl::StrJoin(cells, ","), "\n");
      if (out.size() > kMaxFormattedBytes) return too_big(out.size());
    }
    return out;
  }
  if (format == "table") {
    std::vector<bool> right(result.columns.size(), false);
    std::vector<std::vector<std::string>> rows;
    for (const auto& row : result.rows) {
      std::vector<std::string> cells;
      for (size_t i = 0; i < row.size(); ++i) {
        cells.push_back(ValueText(row[i]));
        if (std::holds_alternative<int64_t>(row[i]) || std::holds_alternative<double>(row[i])) {
          right[i] = true;
        }
      }
      rows.push_back(std::move(cells));
    }
    // Every row is padded to the widest cell of each column: one long value in a column of many
    // rows multiplies (found with tests/fuzz/query_fuzz). Refuse before building it.
    size_t row_width = 0;
    for (size_t i = 0; i < result.columns.size(); ++i) {
      size_t width = result.columns[i].size();
      for (const auto& row : rows) width = std::max(width, row[i].size());
      row_width += width + 2;
    }
    if (row_width * (rows.size() + 1) > kMaxTableBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("query: the aligned table would be ", row_width * (rows.size() + 1),
                       " bytes (the limit is ", kMaxTableBytes, "); use --format csv or json"));
    }
    std::string out = AlignedTable(result.columns, rows, right, /*rule=*/true);
    absl::StrAppend(&out, "(", result.rows.size(), result.rows.size() == 1 ? " row" : " rows",
                    result.truncated ? ", truncated: more rows exist" : "", ")\n");
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown format \"", format, "\" (expected table, csv or json)"));
}

absl::StatusOr<std::string> FormatComparisonTable(const ComparisonTable& table,
                                                  const std::string& format) {
  const std::map<int64_t, bool> lengths = EvaluationLengths(table);
  if (format == "markdown") return MarkdownComparison(table, lengths);
  if (format == "csv") return CsvComparison(table, lengths);
  if (format == "json") return JsonComparison(table);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown format \"", format, "\" (expected markdown, csv or json)"));
}

}  // namespace ablate
