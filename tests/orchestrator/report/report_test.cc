// `ablate report` and what it is built from: the figures' numbers (figures.h) against values
// computed here from the data the test wrote through the Store API, the SVG plotting module, the
// report's files and their contents, its determinism, and its errors (through the command line,
// in-process). The same report is opened in a real browser by tests/dashboard/browser_test.mjs.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/assets/assets.h"
#include "orchestrator/report/figures.h"
#include "orchestrator/report/report.h"
#include "orchestrator/report/svg.h"
#include "orchestrator/store/compare.h"
#include "orchestrator/store/format.h"
#include "tests/cli_util.h"
#include "tests/orchestrator/dashboard/dashboard_test_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using dashboard_test::AddLengths;
using dashboard_test::EndWithSummary;
using dashboard_test::Eval;
using dashboard_test::LossAt;
using dashboard_test::StartRun;
using dashboard_test::StepBatch;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr int64_t kSteps = 400;
constexpr int kCurvePoints = 40;  // a grid of every 10th step
constexpr int64_t kDivergeStep = 250;
constexpr int64_t kSpikeStep = 200;
constexpr double kSpikeLoss = 9.0;
const std::vector<std::string> kVariants = {"baseline", "g1_elementwise", "g1_headwise"};
const std::vector<int> kLengths = {64, 128, 256, 512};

std::string ReadText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The file's text without the lines that say when it was generated.
std::string WithoutGeneratedAt(const std::string& text) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StrContains(line, kGeneratedAtMarker)) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// Every file under `dir`, by path relative to it.
std::map<std::string, std::string> Files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = ReadText(e.path());
  }
  return files;
}

// Equal, or both missing (NaN).
bool SameNumber(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

std::string Num(double v) { return std::isfinite(v) ? fmt::format("{:.7g}", v) : ""; }

// The final evaluation of a run: `layers` layers (gated or not), the validation loss `val_loss`,
// losses at kLengths.
EvalResult FinalEval(int64_t step, bool gated, double val_loss) {
  EvalResult e = Eval(step, 2, gated);
  e.set_val_loss(val_loss);
  e.set_val_ppl(std::exp(val_loss));
  AddLengths(&e, kLengths, 256, 0.2);
  return e;
}

absl::Status Finish(Store* store, int64_t run_id, RunState to, int64_t steps,
                    const EvalResult* final_eval, const std::string& reason) {
  RunTransition t = EndWithSummary(run_id, to, steps, reason);
  if (final_eval != nullptr) *t.summary.mutable_final_eval() = *final_eval;
  return store->TransitionRun(t).status();
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("report_test");
    db_ = (dir_ / "ablate.db").string();
    StoreOptions so;
    so.path = db_;
    so.synchronous_full = false;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(so);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    FillStudy();
    FillLive();
    ASSERT_TRUE(store_->Flush().ok());
    ReaderOptions ro;
    ro.path = db_;
    absl::StatusOr<std::unique_ptr<StoreReader>> reader = StoreReader::Open(ro);
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = std::move(*reader);
  }
  void TearDown() override {
    reader_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }

  // Run i of "study" took this many training seconds to `step`: each run at its own speed.
  static double SecondsAt(int64_t step, size_t i) {
    return 0.05 * static_cast<double>(step) * (1.0 + 0.1 * static_cast<double>(i));
  }

  // Sweep "study": baseline (no gate), g1_elementwise, g1_headwise x 2 seeds of 400 steps (runs
  // seed-major), evaluations every 100 steps. Every run SUCCEEDS but g1_headwise seed 1: its loss
  // spikes at step 200 and goes non-finite from 248 on; it DIVERGES at 250.
  void FillStudy() {
    SweepRecord record = testing::MakeSweep("study", kVariants, 2, kSteps);
    record.spec_yaml =
        "sweep: study\nvariants: [baseline, g1_elementwise, g1_headwise]\nseeds: 2\n";
    record.expanded.set_code_version("0.1.0+test123");
    absl::StatusOr<SweepIds> ids = store_->CreateSweep(record);
    ASSERT_TRUE(ids.ok()) << ids.status();
    study_ = ids->run_ids;
    for (size_t i = 0; i < study_.size(); ++i) {
      const int64_t id = study_[i];
      const bool gated = i % 3 != 0;
      ASSERT_TRUE(StartRun(store_.get(), id).ok());
      const bool diverges = i == 5;
      MetricBatch b = StepBatch(id, 1, 1, 1, diverges ? kDivergeStep : kSteps);
      for (StepMetrics& m : b.steps) m.set_elapsed_s(SecondsAt(m.step(), i));  // each its speed
      for (int64_t step = 100; step < kSteps; step += 100) {
        if (!diverges || step < kDivergeStep) b.evals.push_back(Eval(step, 2, gated));
      }
      if (diverges) {
        b.steps[kSpikeStep - 1].set_loss(kSpikeLoss);
        for (int64_t s = 248; s <= kDivergeStep; ++s) b.steps[s - 1].set_loss(std::nan(""));
        for (auto [step, kind] : {std::pair<int64_t, SpikeKind>{kSpikeStep, SPIKE_CATASTROPHIC},
                                  {kDivergeStep, SPIKE_NONFINITE}}) {
          SpikeEvent& e = b.spikes.emplace_back();
          e.set_step(step);
          e.set_signal("loss");
          e.set_value(step == kSpikeStep ? kSpikeLoss : std::nan(""));
          e.set_baseline(2.5);
          e.set_kind(kind);
          e.set_action(SPIKE_ACTION_RECORDED);
        }
      }
      ASSERT_TRUE(store_->ReportMetrics(b).ok());
      if (diverges) {
        ASSERT_TRUE(
            Finish(store_.get(), id, DIVERGED, kDivergeStep, nullptr, "loss non-finite for 3 steps")
                .ok());
      } else {
        val_loss_[id] = 2.0 + 0.05 * static_cast<double>(i % 3) + 0.01 * static_cast<double>(i / 3);
        const EvalResult e = FinalEval(kSteps, gated, val_loss_[id]);
        ASSERT_TRUE(Finish(store_.get(), id, SUCCEEDED, kSteps, &e, "").ok());
      }
    }
  }

  // Sweep "live": baseline and g1_elementwise, one seed each, both RUNNING: baseline evaluated at
  // steps 100 and 200, g1_elementwise not yet.
  void FillLive() {
    absl::StatusOr<SweepIds> ids =
        store_->CreateSweep(testing::MakeSweep("live", {"baseline", "g1_elementwise"}, 1, 1000));
    ASSERT_TRUE(ids.ok()) << ids.status();
    live_ = ids->run_ids;
    for (int64_t id : live_) ASSERT_TRUE(StartRun(store_.get(), id).ok());
    MetricBatch b = StepBatch(live_[0], 1, 1, 1, 250);
    b.evals.push_back(Eval(100, 2, false));
    b.evals.push_back(Eval(200, 2, false));
    ASSERT_TRUE(store_->ReportMetrics(b).ok());
    ASSERT_TRUE(store_->ReportMetrics(StepBatch(live_[1], 1, 1, 1, 150)).ok());
  }

  ReportOptions Options(const std::string& sweep, const fs::path& out) const {
    ReportOptions o;
    o.sweep = sweep;
    o.out_dir = out.string();
    o.figures.curve_points = kCurvePoints;
    o.db_label = db_;
    return o;
  }

  fs::path dir_;
  std::string db_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::vector<int64_t> study_, live_;
  std::map<int64_t, double> val_loss_;  // of the SUCCEEDED runs of "study"
};

// ---- The figures' numbers ----------------------------------------------------------------------

TEST_F(ReportTest, LossBandsAreMeanAndStdOverTheRunsThatDidNotDiverge) {
  FigureOptions options;
  options.curve_points = kCurvePoints;
  absl::StatusOr<SweepFigures> f = ComputeSweepFigures(*reader_, "study", options);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->stride, kSteps / kCurvePoints);
  ASSERT_EQ(f->groups.size(), 3u);
  // The grid: every 10th step to 400 (the spike step 200 is on it; no other step is).
  ASSERT_EQ(f->steps.size(), static_cast<size_t>(kSteps / 10));
  for (size_t k = 0; k < f->steps.size(); ++k)
    EXPECT_EQ(f->steps[k], 10 * static_cast<int64_t>(k + 1));
  for (size_t g = 0; g < 3; ++g) {
    const GroupFigures& group = f->groups[g];
    EXPECT_EQ(group.label, kVariants[g]);
    for (size_t k = 0; k < f->steps.size(); ++k) {
      const int64_t step = f->steps[k];
      std::vector<double> values = {LossAt(step, study_[g])};
      std::vector<double> seconds = {SecondsAt(step, g)};
      if (g != 2) {  // seed 1 of g1_headwise diverged
        values.push_back(LossAt(step, study_[g + 3]));
        seconds.push_back(SecondsAt(step, g + 3));
      }
      double mean = 0, mean_seconds = 0;
      for (double v : values) mean += v / static_cast<double>(values.size());
      for (double v : seconds) mean_seconds += v / static_cast<double>(seconds.size());
      EXPECT_EQ(group.loss_n[k], static_cast<int64_t>(values.size()))
          << kVariants[g] << " " << step;
      EXPECT_NEAR(group.loss_mean[k], mean, 1e-12) << kVariants[g] << " " << step;
      // The x of the curves against wall time: the band's runs' mean training seconds there.
      EXPECT_NEAR(group.seconds_mean[k], mean_seconds, 1e-9) << kVariants[g] << " " << step;
      if (values.size() == 2) {
        EXPECT_NEAR(group.loss_std[k], std::fabs(values[0] - values[1]) / std::sqrt(2.0), 1e-12);
      } else {
        EXPECT_TRUE(std::isnan(group.loss_std[k]));
      }
    }
  }
  // The diverged run apart, through its last step, non-finite where its loss was.
  const GroupFigures& headwise = f->groups[2];
  EXPECT_EQ(headwise.band_runs, 1);
  ASSERT_EQ(headwise.diverged_curves.size(), 1u);
  const RunCurve& c = headwise.diverged_curves[0];
  EXPECT_EQ(c.run_id, study_[5]);
  EXPECT_EQ(c.steps.back(), kDivergeStep);
  EXPECT_TRUE(std::isnan(c.loss.back()));
  ASSERT_EQ(c.seconds.size(), c.steps.size());
  EXPECT_NEAR(c.seconds.back(), SecondsAt(kDivergeStep, 5), 1e-9);
  // Its spikes, at its loss there (NaN: non-finite).
  ASSERT_EQ(headwise.spikes.size(), 2u);
  EXPECT_EQ(headwise.spikes[0].step, kSpikeStep);
  EXPECT_EQ(headwise.spikes[0].kind, "SPIKE_CATASTROPHIC");
  EXPECT_DOUBLE_EQ(headwise.spikes[0].loss, kSpikeLoss);
  EXPECT_NEAR(headwise.spikes[0].seconds, SecondsAt(kSpikeStep, 5), 1e-9);
  EXPECT_EQ(headwise.spikes[1].step, kDivergeStep);
  EXPECT_TRUE(std::isnan(headwise.spikes[1].loss));
  EXPECT_TRUE(f->groups[0].spikes.empty());
}

TEST_F(ReportTest, ProbesAreAveragedOverTheLastEvaluationOfEachSucceededRun) {
  absl::StatusOr<SweepFigures> f = ComputeSweepFigures(*reader_, "study");
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ComparisonTable> table = reader_->GetComparisonTable("study");
  ASSERT_TRUE(table.ok());
  for (size_t g = 0; g < 3; ++g) {
    const GroupFigures& group = f->groups[g];
    const int64_t runs = g == 2 ? 1 : 2;
    EXPECT_FALSE(group.interim);
    EXPECT_EQ(group.eval_runs, runs);
    EXPECT_EQ(group.eval_step_min, kSteps);
    EXPECT_EQ(group.eval_step_max, kSteps);
    // The table's numbers, so that the bar chart and the table agree.
    EXPECT_EQ(group.val_loss.mean, table->rows[g].val_loss.mean);
    EXPECT_TRUE(SameNumber(group.val_loss.std, table->rows[g].val_loss.std)) << kVariants[g];
    EXPECT_TRUE(SameNumber(group.gate_score.mean, table->rows[g].gate_score.mean)) << kVariants[g];
    // The last evaluation has 2 layers (the earlier ones had 2 as well): M-Act 10 (l + 1) and
    // F-Attn 0.1 (l + 1) in every run (dashboard_test_util.h's Eval).
    ASSERT_EQ(group.layers.size(), 2u);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(group.layers[l].n, runs);
      EXPECT_DOUBLE_EQ(group.layers[l].m_act.mean, 10.0 * (l + 1));
      EXPECT_NEAR(group.layers[l].f_attn.mean, 0.1 * (l + 1), 1e-15);
      if (runs == 2) {
        EXPECT_EQ(group.layers[l].m_act.std, 0);
      }
    }
    // Gate histograms: none for the baseline; else bin i of layer l counts 100 (10 - i) + l,
    // summed over 2 layers and the runs.
    if (g == 0) {
      EXPECT_TRUE(group.gate_counts.empty());
      continue;
    }
    ASSERT_EQ(group.gate_counts.size(), 10u);
    EXPECT_EQ(group.gate_lo, 0);
    EXPECT_EQ(group.gate_hi, 1);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(group.gate_counts[i], runs * (2 * 100 * (10 - i) + 1));
  }
  // The sample std of the two seeds' val losses.
  EXPECT_NEAR(f->groups[0].val_loss.mean, (val_loss_[study_[0]] + val_loss_[study_[3]]) / 2, 1e-12);
  EXPECT_NEAR(f->groups[0].val_loss.std,
              std::fabs(val_loss_[study_[0]] - val_loss_[study_[3]]) / std::sqrt(2.0), 1e-12);
}

TEST_F(ReportTest, AVariantWithNoFinishedRunShowsItsLatestEvaluationAsInterim) {
  absl::StatusOr<SweepFigures> f = ComputeSweepFigures(*reader_, "live");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->groups.size(), 2u);
  const GroupFigures& baseline = f->groups[0];
  EXPECT_EQ(baseline.n, 0);
  EXPECT_TRUE(baseline.interim);
  EXPECT_EQ(baseline.eval_runs, 1);
  EXPECT_EQ(baseline.eval_step_max, 200);  // the latest of its evaluations (100, 200)
  const EvalResult latest = Eval(200, 2, false);
  EXPECT_DOUBLE_EQ(baseline.val_loss.mean, latest.val_loss());
  EXPECT_DOUBLE_EQ(baseline.m_act.mean, latest.probes().m_act());
  EXPECT_DOUBLE_EQ(baseline.gate_score.mean, latest.probes().gate_score_mean());
  EXPECT_EQ(baseline.layers.size(), 2u);
  // Not evaluated yet: nothing to show, not interim.
  EXPECT_FALSE(f->groups[1].interim);
  EXPECT_EQ(f->groups[1].eval_runs, 0);
  EXPECT_TRUE(std::isnan(f->groups[1].val_loss.mean));
  // Both runs are still training: both in the bands, up to where each has reached (no run did
  // every step, so the grid alone).
  EXPECT_EQ(baseline.band_runs, 1);
  EXPECT_EQ(f->groups[1].band_runs, 1);
  EXPECT_EQ(f->steps.back() % f->stride, 0);
}

TEST_F(ReportTest, LatestEvalsOfAReusedRunAreItsSources) {
  SweepRecord again = testing::MakeSweep("again", kVariants, 2, kSteps);
  for (int i = 0; i < again.expanded.runs_size(); ++i) {
    again.expanded.mutable_runs(i)->set_run_key(
        testing::MakeSweep("study", kVariants, 2, kSteps).expanded.runs(i).run_key());
  }
  absl::StatusOr<SweepIds> ids = store_->CreateSweep(again);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_TRUE(store_->Flush().ok());
  absl::StatusOr<std::map<int64_t, EvalResult>> evals = reader_->LatestEvals(ids->sweep_id, true);
  ASSERT_TRUE(evals.ok()) << evals.status();
  for (size_t i = 0; i < ids->run_ids.size(); ++i) {
    if (i == 5) {  // its source DIVERGED: not reused, still PENDING, no evaluation
      EXPECT_EQ(ids->reused_from[i], 0);
      EXPECT_EQ(evals->count(ids->run_ids[i]), 0u);
      continue;
    }
    ASSERT_EQ(ids->reused_from[i], study_[i]);
    const EvalResult& e = evals->at(ids->run_ids[i]);
    EXPECT_EQ(e.step(), kSteps);
    EXPECT_DOUBLE_EQ(e.val_loss(), val_loss_[study_[i]]);
    EXPECT_EQ(e.probes().layers_size(), 2);
  }
  absl::StatusOr<SweepSource> source = reader_->GetSweepSource(ids->sweep_id);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ(source->spec_yaml, again.spec_yaml);
  EXPECT_TRUE(absl::IsNotFound(reader_->GetSweepSource(999).status()));
}

// ---- The SVG module ----------------------------------------------------------------------------

TEST(SvgTest, LinesBreakAtGapsAndMarkersWithoutAValueSitOnTheTopEdge) {
  svg::Axis x, y;
  x.label = "step";
  y.label = "loss & more";
  svg::Chart chart("Title <1>", x, y, 600, 300);
  svg::Style style;
  chart.Line({1, 2, 3, 4, 5}, {1, 2, std::nan(""), 4, 5}, style, "a < b");
  chart.Markers({2, 3}, {2, std::nan("")}, style);
  const std::string text = chart.Render();
  EXPECT_TRUE(absl::StartsWith(text, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\""));
  EXPECT_TRUE(absl::EndsWith(text, "</svg>\n"));
  // One path of two pieces (M ... L ... M ... L ...).
  const size_t path = text.find("<path d=\"M");
  ASSERT_NE(path, std::string::npos);
  const std::string d = text.substr(path, text.find('"', path + 9) - path);
  EXPECT_EQ(std::count(d.begin(), d.end(), 'M'), 2) << d;
  EXPECT_THAT(text, HasSubstr("Title &lt;1&gt;"));
  EXPECT_THAT(text, HasSubstr("loss &amp; more"));
  EXPECT_THAT(text, HasSubstr("a &lt; b"));
  // The data range 1..5 in ticks about 50 px apart (222 px: 4 steps of 1).
  for (const char* tick : {">1</text>", ">2</text>", ">3</text>", ">4</text>", ">5</text>"}) {
    EXPECT_THAT(text, HasSubstr(tick));
  }
  // The marker without a value: its tip 5 px above the plot's top edge (y 34, under the title).
  EXPECT_THAT(text, HasSubstr(" 29.0L"));
}

TEST(SvgTest, LogAxesTickDecadesOrEvenSteps) {
  svg::Axis x, y;
  y.scale = svg::Scale::kLog10;
  svg::Chart wide("", x, y, 400, 300);
  wide.Line({0, 1}, {1, 1000}, svg::Style());
  const std::string w = wide.Render();
  for (const char* tick : {">1</text>", ">10</text>", ">100</text>", ">1000</text>"}) {
    EXPECT_THAT(w, HasSubstr(tick));
  }
  svg::Chart narrow("", x, y, 400, 300);
  narrow.Line({0, 1}, {1.4, 1.8}, svg::Style());
  const std::string n = narrow.Render();
  EXPECT_THAT(n, HasSubstr(">1.6</text>"));  // not a decade in sight: even steps
  EXPECT_THAT(n, Not(HasSubstr(">10</text>")));
  svg::Axis lengths;
  lengths.scale = svg::Scale::kLog2;
  lengths.ticks = {64, 512};
  lengths.tick_labels = {"64", "512*"};
  svg::Chart l("", lengths, svg::Axis(), 400, 300);
  l.Points({64, 512}, {1, 2}, svg::Style());
  EXPECT_THAT(l.Render(), HasSubstr(">512*</text>"));
}

TEST(SvgTest, SeriesColorsAreTheDashboards) {
  // format.js runColor(0) = hsl(200, 62%, 46%) = rgb(45, 142, 190).
  EXPECT_EQ(svg::SeriesColor(0), "#2d8ebe");
  EXPECT_EQ(svg::Escape("<a href=\"x\">&</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;");
}

// ---- The report --------------------------------------------------------------------------------

TEST_F(ReportTest, WritesEveryFile) {
  absl::StatusOr<ReportFiles> r = WriteReport(*reader_, Options("study", dir_ / "out"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sweep, "study");
  const std::vector<std::string> expected = {"figures/compare.svg",
                                             "figures/gate_histograms.svg",
                                             "figures/layers_f_attn.svg",
                                             "figures/layers_m_act.svg",
                                             "figures/loss.svg",
                                             "figures/ppl_length.svg",
                                             "figures/val_loss.svg",
                                             "index.html",
                                             "report.md",
                                             "spec.yaml",
                                             "tables/compare.csv",
                                             "tables/comparison.csv",
                                             "tables/evaluations.csv",
                                             "tables/gate_histograms.csv",
                                             "tables/layers.csv",
                                             "tables/lengths.csv",
                                             "tables/loss_curves.csv",
                                             "tables/runs.csv",
                                             "tables/spikes.csv",
                                             "tables/variants.csv"};
  EXPECT_EQ(r->files, expected);
  std::vector<std::string> on_disk;
  for (const auto& [path, text] : Files(dir_ / "out")) {
    on_disk.push_back(path);
    EXPECT_FALSE(text.empty()) << path;
  }
  EXPECT_EQ(on_disk, expected);
}

TEST_F(ReportTest, TablesHoldTheNumbersOfTheStudy) {
  ASSERT_TRUE(WriteReport(*reader_, Options("study", dir_ / "out")).ok());
  const fs::path out = dir_ / "out";
  // The comparison, as `ablate table --format csv` prints it.
  absl::StatusOr<ComparisonTable> table = reader_->GetComparisonTable("study");
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(ReadText(out / "tables/comparison.csv"), *FormatComparisonTable(*table, "csv"));
  // Against the reference, as `ablate compare --format csv` prints it.
  absl::StatusOr<ResultSet> results = reader_->ReadResults(ResultSelection{{"study"}, {}});
  ASSERT_TRUE(results.ok());
  absl::StatusOr<Comparison> comparison = CompareResults(*results, {});
  ASSERT_TRUE(comparison.ok()) << comparison.status();
  EXPECT_EQ(ReadText(out / "tables/compare.csv"), *FormatComparison(*comparison, "csv"));
  // g1_headwise diverged at seed 1, where the baseline trained.
  EXPECT_THAT(ReadText(out / "tables/compare.csv"), HasSubstr("\ng1_headwise,,val_loss,1,"));
  EXPECT_THAT(ReadText(out / "tables/compare.csv"), HasSubstr(",diverged,"));
  // The loss band of the baseline at step 100, from the curves the test wrote.
  const double a = LossAt(100, study_[0]), b = LossAt(100, study_[3]);
  EXPECT_THAT(ReadText(out / "tables/loss_curves.csv"),
              HasSubstr(absl::StrCat("\nbaseline,,100,2,", Num((a + b) / 2), ",",
                                     Num(std::fabs(a - b) / std::sqrt(2.0)), "\n")));
  // g1_headwise at 100: one run (its other seed diverged), no std.
  EXPECT_THAT(ReadText(out / "tables/loss_curves.csv"),
              HasSubstr(absl::StrCat("\ng1_headwise,,100,1,", Num(LossAt(100, study_[2])), ",\n")));
  const std::string layers = ReadText(out / "tables/layers.csv");
  EXPECT_THAT(layers, HasSubstr("\nbaseline,,0,0,2,10,0,0.1,0\n"));
  EXPECT_THAT(layers, HasSubstr("\ng1_headwise,,0,1,1,20,,0.2,\n"));
  // Bin 0 of g1_elementwise: 2 runs x (1000 + 1001) of 22020 scores.
  EXPECT_THAT(
      ReadText(out / "tables/gate_histograms.csv"),
      HasSubstr(absl::StrCat("\ng1_elementwise,,0,0,0,0.1,4002,", Num(4002.0 / 22020), "\n")));
  EXPECT_THAT(ReadText(out / "tables/gate_histograms.csv"), Not(HasSubstr("\nbaseline,")));
  EXPECT_EQ(ReadText(out / "tables/spikes.csv"),
            absl::StrCat("run_id,variant,axes,seed,step,signal,kind,loss\n", study_[5],
                         ",g1_headwise,,1,200,loss,SPIKE_CATASTROPHIC,9\n", study_[5],
                         ",g1_headwise,,1,250,loss,SPIKE_NONFINITE,\n"));
  const std::string runs = ReadText(out / "tables/runs.csv");
  EXPECT_THAT(runs, HasSubstr(absl::StrCat("\n", study_[5], ",g1_headwise,1,,DIVERGED,250,400,")));
  EXPECT_EQ(std::count(runs.begin(), runs.end(), '\n'), 7);
  // The budget solutions and exact parameter counts (test_sweeps.h).
  EXPECT_THAT(
      ReadText(out / "tables/variants.csv"),
      HasSubstr("\ng1_headwise,g1_headwise description,,ffn 64 -> 62,1002000,1002000,2000,"));
  // PPL at each length per variant (AddLengths: 512 measured with YaRN).
  EXPECT_THAT(ReadText(out / "tables/lengths.csv"), HasSubstr("\ng1_elementwise,,512,1,2,"));
  EXPECT_EQ(ReadText(out / "spec.yaml"),
            "sweep: study\nvariants: [baseline, g1_elementwise, g1_headwise]\nseeds: 2\n");
}

TEST_F(ReportTest, MarkdownHasTheTableTheFiguresTheVariantsAndTheSpec) {
  ASSERT_TRUE(WriteReport(*reader_, Options("study", dir_ / "out")).ok());
  const std::string md = ReadText(dir_ / "out/report.md");
  absl::StatusOr<ComparisonTable> table = reader_->GetComparisonTable("study");
  ASSERT_TRUE(table.ok());
  EXPECT_THAT(md, HasSubstr(*FormatComparisonTable(*table, "markdown")));
  EXPECT_THAT(md, HasSubstr("## Against the reference\n\nval loss of each variant against baseline"));
  EXPECT_THAT(md, HasSubstr("diverged (at 1 of 2 seeds, the reference at 0; 1 pair: no interval)"));
  EXPECT_THAT(md, HasSubstr("| code version | 0.1.0+test123 |"));
  EXPECT_THAT(md, HasSubstr(absl::StrCat(kGeneratedAtMarker)));
  for (const char* figure :
       {"figures/loss.svg", "figures/val_loss.svg", "figures/layers_m_act.svg",
        "figures/layers_f_attn.svg", "figures/gate_histograms.svg", "figures/ppl_length.svg"}) {
    EXPECT_THAT(md, HasSubstr(absl::StrCat("](", figure, ")"))) << figure;
  }
  EXPECT_THAT(md,
              HasSubstr("| g1_headwise | g1_headwise description | — | ffn 64 -> 62 | 1.00M |"));
  EXPECT_THAT(md, HasSubstr("```yaml\nsweep: study\n"));
  EXPECT_THAT(md, Not(HasSubstr("Interim")));  // every variant has a finished run
}

TEST_F(ReportTest, FiguresDrawEveryVariantTheDivergedRunAndTheSpikes) {
  ASSERT_TRUE(WriteReport(*reader_, Options("study", dir_ / "out")).ok());
  const fs::path out = dir_ / "out";
  const std::string loss = ReadText(out / "figures/loss.svg");
  for (const char* legend : {"baseline (2 runs)", "g1_elementwise (2 runs)", "g1_headwise (1 run)",
                             "g1_headwise: diverged (1)", "spike events (2)"}) {
    EXPECT_THAT(loss, HasSubstr(absl::StrCat(">", legend, "</text>"))) << legend;
  }
  EXPECT_THAT(loss, HasSubstr(svg::kSpikeColor));
  EXPECT_THAT(loss, HasSubstr("stroke-dasharray"));       // the diverged run
  EXPECT_THAT(loss, HasSubstr("fill-opacity=\"0.18\""));  // the bands
  const std::string val = ReadText(out / "figures/val_loss.svg");
  for (const std::string& v : kVariants)
    EXPECT_THAT(val, HasSubstr(absl::StrCat(">", v, "</text>")));
  const std::string gates = ReadText(out / "figures/gate_histograms.svg");
  EXPECT_THAT(gates, HasSubstr(">g1_elementwise</text>"));
  EXPECT_THAT(gates, HasSubstr(">g1_headwise</text>"));
  EXPECT_THAT(gates, Not(HasSubstr(">baseline</text>")));
  EXPECT_THAT(ReadText(out / "figures/ppl_length.svg"), HasSubstr(">512*</text>"));
  for (const auto& [path, text] : Files(out / "figures")) {
    EXPECT_TRUE(absl::StartsWith(text, "<svg xmlns=\"http://www.w3.org/2000/svg\"")) << path;
    EXPECT_TRUE(absl::EndsWith(text, "</svg>\n")) << path;
  }
}

TEST_F(ReportTest, IndexHtmlIsSelfContainedWithTheDashboardsChartCode) {
  ASSERT_TRUE(WriteReport(*reader_, Options("study", dir_ / "out")).ok());
  const std::string html = ReadText(dir_ / "out/index.html");
  // Nothing fetched: no external script, style sheet or module.
  EXPECT_THAT(html, Not(HasSubstr("<script src")));
  EXPECT_THAT(html, Not(HasSubstr("<link rel=\"stylesheet\"")));
  EXPECT_THAT(html, Not(HasSubstr("from './")));
  // The dashboard's own modules, inlined: charts.js's code as the binary embeds it.
  absl::StatusOr<std::string> modules =
      InlineModules({"/js/format.js", "/js/charts.js", "/js/figures.js", "/js/report.js"});
  ASSERT_TRUE(modules.ok()) << modules.status();
  EXPECT_THAT(html, HasSubstr(*modules));
  EXPECT_THAT(*modules, HasSubstr("function bandChart("));
  EXPECT_THAT(*modules, HasSubstr("function lengthChart("));
  for (absl::string_view line : absl::StrSplit(*modules, '\n')) {
    EXPECT_FALSE(absl::StartsWith(line, "import ") || absl::StartsWith(line, "export ")) << line;
  }
  const EmbeddedAsset* uplot = nullptr;
  for (const EmbeddedAsset* a = kDashboardAssets; a->path != nullptr; ++a) {
    if (std::string(a->path) == "/vendor/uPlot.iife.min.js") uplot = a;
  }
  ASSERT_NE(uplot, nullptr);
  EXPECT_THAT(html,
              HasSubstr(std::string(reinterpret_cast<const char*>(uplot->data), uplot->size)));
  // The data: the table and the figures, as the compare page reads them from the API.
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const size_t at = html.find(open);
  ASSERT_NE(at, std::string::npos);
  const size_t end = html.find("</script>", at);
  const json data = json::parse(html.substr(at + open.size(), end - at - open.size()));
  EXPECT_EQ(data["table"]["rows"].size(), 3u);
  EXPECT_EQ(data["figures"]["groups"].size(), 3u);
  EXPECT_EQ(data["figures"]["groups"][2]["diverged_curves"][0]["run"], study_[5]);
  EXPECT_EQ(data["source"]["code_version"], "0.1.0+test123");
  EXPECT_EQ(data["runs"].size(), 6u);
  EXPECT_EQ(data["spec_yaml"],
            "sweep: study\nvariants: [baseline, g1_elementwise, g1_headwise]\nseeds: 2\n");
}

TEST_F(ReportTest, InterimValuesAreMarkedInTheReportOfALiveSweep) {
  ASSERT_TRUE(WriteReport(*reader_, Options("live", dir_ / "out")).ok());
  const std::string md = ReadText(dir_ / "out/report.md");
  EXPECT_THAT(md, HasSubstr("Interim (no run of the variant has finished"));
  EXPECT_THAT(md, HasSubstr(absl::StrCat("| baseline | 1 | 200 | ",
                                         fmt::format("{:.4f}", 2.5 + 1.0 / 200))));
  EXPECT_THAT(ReadText(dir_ / "out/tables/evaluations.csv"), HasSubstr("\nbaseline,,1,1,200,200,"));
  EXPECT_THAT(ReadText(dir_ / "out/figures/val_loss.svg"),
              HasSubstr(">interim (runs still training)</text>"));
  // No lengths were measured: no figure, no table.
  EXPECT_FALSE(fs::exists(dir_ / "out/figures/ppl_length.svg"));
  EXPECT_FALSE(fs::exists(dir_ / "out/tables/lengths.csv"));
}

TEST_F(ReportTest, TheSameDatabaseGivesTheSameBytesButTheGeneratedAtLine) {
  ReportOptions first = Options("study", dir_ / "a");
  first.generated_at = "2001-01-01 00:00:00 UTC";
  ReportOptions second = Options("study", dir_ / "b");
  second.generated_at = "2002-02-02 00:00:00 UTC";
  ASSERT_TRUE(WriteReport(*reader_, first).ok());
  ASSERT_TRUE(WriteReport(*reader_, second).ok());
  const auto a = Files(dir_ / "a"), b = Files(dir_ / "b");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [path, text] : a) {
    ASSERT_EQ(b.count(path), 1u) << path;
    EXPECT_EQ(WithoutGeneratedAt(text), WithoutGeneratedAt(b.at(path))) << path;
    // Only index.html and report.md have the line, once.
    const bool dated = path == "index.html" || path == "report.md";
    EXPECT_EQ(text == b.at(path), !dated) << path;
    const std::vector<absl::string_view> all = absl::StrSplit(text, '\n');
    const size_t lines = std::count_if(all.begin(), all.end(), [](absl::string_view l) {
      return absl::StrContains(l, kGeneratedAtMarker);
    });
    EXPECT_EQ(lines, dated ? 1u : 0u) << path;
  }
}

// ---- The command line --------------------------------------------------------------------------

TEST_F(ReportTest, CommandWritesTheSameReportTwice) {
  const testing::CliResult r1 =
      testing::RunCli({"report", "study", "--db", db_, "--out", (dir_ / "one").string()});
  ASSERT_EQ(r1.code, 0) << r1.err;
  EXPECT_EQ(r1.out,
            absl::StrCat("report of sweep study: ", (dir_ / "one").string(), "/index.html, ",
                         (dir_ / "one").string(), "/report.md, 7 figures, 10 tables\n"));
  // By id, from the state dir, a second later.
  absl::SleepFor(absl::Seconds(1.1));
  const testing::CliResult r2 = testing::RunCli(
      {"report", "1", "--state-dir", dir_.string(), "--out", (dir_ / "two").string()});
  ASSERT_EQ(r2.code, 0) << r2.err;
  const auto one = Files(dir_ / "one"), two = Files(dir_ / "two");
  ASSERT_EQ(one.size(), two.size());
  bool differ = false;
  for (const auto& [path, text] : one) {
    EXPECT_EQ(WithoutGeneratedAt(text), WithoutGeneratedAt(two.at(path))) << path;
    differ = differ || text != two.at(path);
  }
  EXPECT_TRUE(differ) << "the generated-at lines should tell the two apart";
}

TEST_F(ReportTest, CommandErrorsNameWhatIsWrong) {
  const std::string out = (dir_ / "out").string();
  testing::CliResult r = testing::RunCli({"report", "nope", "--db", db_, "--out", out});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            absl::StrCat("report: no sweep named nope in ", db_, " (sweeps there: live, study)\n"));
  EXPECT_FALSE(fs::exists(out)) << "nothing is written for an unknown sweep";

  r = testing::RunCli({"report", "study", "--db", (dir_ / "missing.db").string(), "--out", out});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, absl::StrCat("report: no database at ", (dir_ / "missing.db").string(), "\n"));
  r = testing::RunCli(
      {"report", "study", "--state-dir", (dir_ / "nowhere").string(), "--out", out});
  EXPECT_THAT(
      r.err,
      HasSubstr("(name the coordinator's state dir with --state-dir, or the file with --db)"));

  // A directory that is not empty: refused without --force, its files untouched.
  fs::create_directories(dir_ / "busy/figures");
  std::ofstream(dir_ / "busy/notes.txt") << "mine";
  std::ofstream(dir_ / "busy/figures/old.svg") << "<svg/>";
  r = testing::RunCli({"report", "study", "--db", db_, "--out", (dir_ / "busy").string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, absl::StrCat("report: --out ", (dir_ / "busy").string(),
                                " is not empty (2 entries): pass --force to write over it, or "
                                "choose another --out\n"));
  EXPECT_FALSE(fs::exists(dir_ / "busy/index.html"));
  // With --force: the report's files written, an old figure it does not have removed, the rest
  // kept.
  r = testing::RunCli(
      {"report", "live", "--db", db_, "--out", (dir_ / "busy").string(), "--force"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "busy/index.html"));
  EXPECT_FALSE(fs::exists(dir_ / "busy/figures/old.svg"));
  EXPECT_EQ(ReadText(dir_ / "busy/notes.txt"), "mine");

  // Unwritable: under a regular file, or a regular file itself.
  const fs::path file = dir_ / "a-file";
  std::ofstream(file) << "x";
  r = testing::RunCli({"report", "study", "--db", db_, "--out", (file / "report").string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat("report: cannot create ", (file / "report").string(), ": ")));
  EXPECT_THAT(r.err, HasSubstr("Not a directory"));
  r = testing::RunCli({"report", "study", "--db", db_, "--out", file.string()});
  EXPECT_EQ(r.err, absl::StrCat("report: --out ", file.string(), " is not a directory\n"));

  r = testing::RunCli({"report", "study", "--db", db_});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--out is required"));
}

// `ablate tag` and `note`: the sweep's tags and notes in the header, each run's own tags in the
// runs table, in report.md, runs.csv and index.html's data alike.
TEST_F(ReportTest, TagsAndNotesShowInTheHeaderAndTheRunsTable) {
  using Action = AnnotationEdit::Action;
  const int64_t sweep = reader_->GetSweep("study")->id;
  ASSERT_TRUE(store_->Annotate({sweep, 0, Action::kTag, {"phase1", "lr:3e-4"}}).ok());
  ASSERT_TRUE(store_->Annotate({sweep, study_[5], Action::kTag, {"bugged"}}).ok());
  ASSERT_TRUE(store_->Annotate({sweep, study_[5], Action::kNote, {"loader | bug"}}).ok());
  ASSERT_TRUE(store_->Annotate({sweep, 0, Action::kNote, {"phase 1 of 2"}}).ok());
  ASSERT_TRUE(WriteReport(*reader_, Options("study", dir_ / "out")).ok());
  const std::string md = ReadText(dir_ / "out/report.md");
  EXPECT_THAT(md, HasSubstr("| finished | "));
  EXPECT_THAT(md, HasSubstr(" |\n| tags | phase1, lr:3e-4 |\n\n## Notes\n\n- "));
  // Oldest first, each with its target; a '|' escaped as in every markdown cell.
  const size_t run_note = md.find(absl::StrCat(" UTC, on run ", study_[5], ": loader \\| bug\n"));
  const size_t sweep_note = md.find(" UTC, on the sweep: phase 1 of 2\n");
  EXPECT_NE(run_note, std::string::npos) << md;
  EXPECT_LT(run_note, sweep_note);
  EXPECT_THAT(md, HasSubstr("| reason | tags |\n"));
  EXPECT_THAT(md, HasSubstr(absl::StrCat("| ", study_[5], " | g1_headwise | 1 | DIVERGED |")));
  EXPECT_THAT(md, ::testing::ContainsRegex(absl::StrCat("\\| ", study_[5],
                                                         " \\| g1_headwise [^\n]* \\| bugged \\|\n")));
  const std::string runs = ReadText(dir_ / "out/tables/runs.csv");
  EXPECT_THAT(runs, ::testing::StartsWith("run_id,"));
  EXPECT_THAT(runs.substr(0, runs.find('\n')), ::testing::EndsWith(",reason,tags"));
  EXPECT_THAT(runs, HasSubstr(",bugged\n"));
  const std::string html = ReadText(dir_ / "out/index.html");
  EXPECT_THAT(html, HasSubstr("\"tags\":[\"phase1\",\"lr:3e-4\"]"));
  EXPECT_THAT(html, HasSubstr("\"tags\":[\"bugged\"]"));
  EXPECT_THAT(html, HasSubstr("\"text\":\"phase 1 of 2\""));
  // The same database, the same report (but the generated-at line).
  ASSERT_TRUE(WriteReport(*reader_, Options("study", dir_ / "again")).ok());
  const std::string again = ReadText(dir_ / "again/report.md");
  EXPECT_EQ(md.substr(md.find("\n\n", md.find(kGeneratedAtMarker))),
            again.substr(again.find("\n\n", again.find(kGeneratedAtMarker))));
}

// Text a worker or a user controls (a run's reason, a note) makes no HTML, link or image in
// report.md, and no formula in the CSVs a spreadsheet opens. Before: both were written verbatim.
TEST_F(ReportTest, WorkerTextIsEscapedInMarkdownAndGuardedInCsv) {
  SweepRecord record = testing::MakeSweep("hostile", {"baseline"}, 1, kSteps);
  absl::StatusOr<SweepIds> ids = store_->CreateSweep(record);
  ASSERT_TRUE(ids.ok()) << ids.status();
  const int64_t id = ids->run_ids[0];
  const std::string reason = "=HYPERLINK(\"http://evil\")<img src=x onerror=alert(1)>[x](http://evil)";
  ASSERT_TRUE(StartRun(store_.get(), id).ok());
  ASSERT_TRUE(Finish(store_.get(), id, DIVERGED, 50, nullptr, reason).ok());
  using Action = AnnotationEdit::Action;
  ASSERT_TRUE(store_->Annotate({ids->sweep_id, id, Action::kNote, {"@SUM(A1) <b>bold</b>"}}).ok());
  absl::StatusOr<std::map<std::string, std::string>> files =
      RenderReport(*reader_, Options("hostile", dir_ / "out"));
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string& md = files->at("report.md");
  EXPECT_THAT(md, Not(HasSubstr("<img")));
  EXPECT_THAT(md, Not(HasSubstr("<b>")));
  EXPECT_THAT(md, HasSubstr("=HYPERLINK(\"http://evil\")&lt;img src=x onerror=alert(1)>\\[x\\](http://evil)"));
  EXPECT_THAT(md, HasSubstr("@SUM(A1) &lt;b>bold&lt;/b>"));
  // The reason's cell starts with an apostrophe, so no spreadsheet runs it; quoted for its quotes.
  EXPECT_THAT(files->at("tables/runs.csv"),
              HasSubstr(",\"'=HYPERLINK(\"\"http://evil\"\")<img src=x onerror=alert(1)>[x](http://evil)\","));
}

// Inside --out no symbolic link is followed: a planted report.md link is replaced by the report's
// file (its target untouched), and a figures/ link is refused. Before: both were written through.
TEST_F(ReportTest, SymbolicLinksInTheOutputDirectoryAreNotFollowed) {
  const fs::path out = dir_ / "out", victim = dir_ / "victim.txt", elsewhere = dir_ / "elsewhere";
  fs::create_directories(out);
  fs::create_directories(elsewhere);
  { std::ofstream(victim) << "keep me\n"; }
  fs::create_symlink(victim, out / "report.md");
  ReportOptions options = Options("study", out);
  options.force = true;
  ASSERT_TRUE(WriteReport(*reader_, options).ok());
  EXPECT_EQ(ReadText(victim), "keep me\n");
  EXPECT_FALSE(fs::is_symlink(out / "report.md"));
  EXPECT_THAT(ReadText(out / "report.md"), HasSubstr("# Report: study"));

  fs::remove_all(out / "figures");
  fs::create_directory_symlink(elsewhere, out / "figures");
  absl::StatusOr<ReportFiles> r = WriteReport(*reader_, options);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("figures is a symbolic link: refusing to write through it"));
  EXPECT_TRUE(fs::is_empty(elsewhere));
}

// A tuned sweep: each variant's metric against the tuned value (finished runs on a line, stopped
// ones as rings, diverged ones on the top edge), and each variant at its best value.
TEST_F(ReportTest, ATunedSweepShowsTheMetricAgainstTheTunedValueAndEachVariantAtItsBest) {
  SweepRecord record = testing::MakeSweep("tuned", {"baseline", "g1_elementwise"}, 3, kSteps);
  record.expanded.mutable_tune()->set_axis("train.optimizer.lr");
  record.expanded.mutable_tune()->set_method("asha");
  record.expanded.mutable_tune()->set_metric("val_loss");
  const std::vector<std::string> values = {"1e-3", "3e-3", "1e-2"};
  for (int i = 0; i < record.expanded.runs_size(); ++i) {
    RunSpec* run = record.expanded.mutable_runs(i);
    // "Seeds" of MakeSweep stand for the three values here, one seed each.
    const std::string& value = values[run->seed()];
    AxisValue* axis = run->add_axes();
    axis->set_path("train.optimizer.lr");
    axis->set_value(value);
    run->mutable_tune()->set_group(run->variant());
    run->mutable_tune()->set_value(std::stod(value));
    run->set_seed(0);
  }
  absl::StatusOr<SweepIds> ids = store_->CreateSweep(record);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // Per variant: 1e-3 SUCCEEDED, 3e-3 SUCCEEDED (the baseline's best), 1e-2 the baseline
  // DIVERGED and g1 STOPPED at a rung.
  for (int i = 0; i < record.expanded.runs_size(); ++i) {
    const int64_t id = ids->run_ids[i];
    const RunSpec& run = record.expanded.runs(i);
    const bool gated = run.variant() != "baseline";
    if (run.axes(0).value() == "1e-2") {
      if (gated) {
        RunTransition stop = testing::MakeTransition(id, {PENDING}, STOPPED);
        stop.reason = "stopped at rung 0 (step 100)";
        ASSERT_TRUE(store_->TransitionRun(stop).ok());
      } else {
        ASSERT_TRUE(StartRun(store_.get(), id).ok());
        ASSERT_TRUE(Finish(store_.get(), id, DIVERGED, 50, nullptr, "loss non-finite").ok());
      }
      continue;
    }
    ASSERT_TRUE(StartRun(store_.get(), id).ok());
    const double loss = run.axes(0).value() == "3e-3" ? (gated ? 2.2 : 2.0) : (gated ? 1.9 : 2.1);
    const EvalResult e = FinalEval(kSteps, gated, loss);
    ASSERT_TRUE(Finish(store_.get(), id, SUCCEEDED, kSteps, &e, "").ok());
  }
  absl::StatusOr<std::map<std::string, std::string>> files =
      RenderReport(*reader_, Options("tuned", dir_ / "out"));
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->count("figures/tune.svg"), 1u);
  const std::string& svg = files->at("figures/tune.svg");
  EXPECT_THAT(svg, HasSubstr("fill=\"none\" stroke="));  // the stopped run's ring
  EXPECT_THAT(svg, HasSubstr("train.optimizer.lr (log scale)"));
  const std::string& best = files->at("tables/best.csv");
  EXPECT_THAT(best, HasSubstr("baseline,,1,1,0,0,0,2,"));
  EXPECT_THAT(best, HasSubstr(",train.optimizer.lr=3e-3,"));
  EXPECT_THAT(best, HasSubstr(",train.optimizer.lr=1e-3,"));
  EXPECT_THAT(files->at("report.md"), HasSubstr("## Each variant at its best train.optimizer.lr"));
  EXPECT_THAT(files->at("tables/compare_best.csv"), HasSubstr(",value,reference_value\n"));
}

}  // namespace
}  // namespace ablate
