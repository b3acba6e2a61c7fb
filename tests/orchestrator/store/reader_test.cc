// The store's typed reads over real SQLite files: downsampled series, the comparison table over
// one or several sweeps, and the table by evaluation length.
#include "tests/orchestrator/store/store_fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "config/model_config.h"
#include "config/proto_yaml.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/format.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/sqlite.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/process_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

// ---- Series -------------------------------------------------------------------------------------

TEST_F(StoreTest, DownsamplingKeepsTheLastPointAndSpikes) {
  const auto [sweep_id, run, attempt] = StartARun();
  MetricBatch batch = Batch(run, attempt, 1, 1, 1000);
  batch.steps[499].set_loss(50.0);  // step 500: the maximum
  for (int64_t step : {333, 777}) {
    SpikeEvent& s = batch.spikes.emplace_back();
    s.set_step(step);
    s.set_signal("grad_norm");
    s.set_kind(SPIKE_CATASTROPHIC);
  }
  ASSERT_TRUE(store_->ReportMetrics(batch).ok());

  for (Downsample mode : {Downsample::kStride, Downsample::kMinMax}) {
    SeriesOptions options;
    options.mode = mode;
    options.max_points = 50;
    absl::StatusOr<std::vector<StepMetrics>> series = store_->reader().MetricSeries(run, options);
    ASSERT_TRUE(series.ok()) << series.status();
    std::set<int64_t> steps;
    for (const StepMetrics& m : *series) steps.insert(m.step());
    EXPECT_EQ(steps.size(), series->size());  // sorted, no duplicates
    EXPECT_LE(series->size(), 53u);
    EXPECT_GE(series->size(), 40u);
    EXPECT_EQ(series->back().step(), 1000);
    EXPECT_EQ(steps.count(333), 1u);
    EXPECT_EQ(steps.count(777), 1u);
    EXPECT_TRUE(std::is_sorted(
        series->begin(), series->end(),
        [](const StepMetrics& a, const StepMetrics& b) { return a.step() < b.step(); }));
    if (mode == Downsample::kMinMax) {
      EXPECT_EQ(steps.count(500), 1u);  // the peak survives
    }
  }
  SeriesOptions all;
  all.mode = Downsample::kNone;
  EXPECT_EQ(store_->reader().MetricSeries(run, all)->size(), 1000u);
  SeriesOptions window;
  window.from_step = 101;
  window.to_step = 200;
  window.max_points = 10;
  window.mode = Downsample::kStride;
  absl::StatusOr<std::vector<StepMetrics>> part = store_->reader().MetricSeries(run, window);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->front().step(), 101);
  EXPECT_EQ(part->back().step(), 200);
  EXPECT_LE(part->size(), 11u);
}

// ---- Comparison table -----------------------------------------------------------------------------

// Expects `row` to be `variant`'s, over `runs` runs: `n` of them averaged, `diverged` diverged.
void ExpectRowCounts(const ComparisonRow& row, const std::string& variant, int runs, int n,
                     int diverged) {
  EXPECT_EQ(row.variant, variant);
  EXPECT_EQ(row.runs, runs);
  EXPECT_EQ(row.n, n);
  EXPECT_EQ(row.diverged, diverged);
}

// The sink rate (issue 58) is a run column as F-Attn is: in the table (markdown after F-Attn,
// csv after the costs), in SQL (run_summary, variant_table), and per layer the first-token
// attention of each head and the split by query class, stored as JSON and read back.
TEST_F(StoreTest, TheSinkRateAndPerHeadProbesAreStoredAndShown) {
  SweepIds ids = Submit("sink", {"baseline", "g1"}, 2);  // runs: b0 g0 b1 g1
  const double rates[] = {0.5, 0.0, 0.25, 0.0};
  for (int i = 0; i < 4; ++i) {
    const int64_t id = ids.run_ids[i];
    Start(id);
    RunTransition t = testing::MakeTransition(id, {RUNNING}, SUCCEEDED);
    t.has_summary = true;
    t.summary.set_state(SUCCEEDED);
    t.summary.set_steps_done(1000);
    EvalResult* e = t.summary.mutable_final_eval();
    e->set_step(1000);
    e->set_val_loss(3.0);
    e->set_val_ppl(std::exp(3.0));
    Probes* p = e->mutable_probes();
    p->set_f_attn(0.2);
    p->set_sink_rate(rates[i]);
    p->set_sink_epsilon(0.3);
    LayerProbes* l = p->add_layers();
    l->set_layer(0);
    l->set_first_token_attention(0.2);
    for (const double h : {0.35, 0.05}) l->add_first_token_attention_by_head(h);
    for (const double h : {0.4, 0.1}) l->add_sink_window_attention_by_head(h);
    QueryClassProbes* c = l->add_classes();
    c->set_name("trigger");
    c->set_queries(10);
    c->set_first_token_attention(0.1);
    c->set_gate_mean(0.6);
    ASSERT_TRUE(store_->TransitionRun(t).ok());
  }
  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("sink");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NEAR(table->rows[0].sink_rate.mean, 0.375, 1e-12);
  EXPECT_NEAR(table->rows[0].sink_rate.std, std::sqrt(0.03125), 1e-12);
  EXPECT_EQ(table->rows[1].sink_rate.mean, 0.0);
  EXPECT_THAT(*FormatComparisonTable(*table, "markdown"),
              ::testing::HasSubstr("| F-Attn | sink rate | spike score |"));
  EXPECT_THAT(*FormatComparisonTable(*table, "csv"),
              ::testing::HasSubstr(",sink_rate_mean,sink_rate_std"));
  const auto value = [&](const std::string& sql) {
    absl::StatusOr<QueryResult> r = store_->reader().ReadOnlyQuery(sql);
    EXPECT_TRUE(r.ok()) << sql << ": " << r.status();
    return r.ok() && !r->rows.empty() ? std::get<double>(r->rows[0][0]) : kNaN;
  };
  EXPECT_EQ(value("SELECT sink_rate FROM run_summary ORDER BY run_id LIMIT 1"), 0.5);
  EXPECT_EQ(value("SELECT sink_rate_mean FROM variant_table WHERE variant = 'baseline'"), 0.375);
  EXPECT_EQ(value("SELECT json_extract(first_token_by_head, '$[0]') FROM eval_layer_probes "
                  "ORDER BY run_id LIMIT 1"),
            0.35);
  absl::StatusOr<std::vector<EvalResult>> series =
      store_->reader().EvalSeries(ids.run_ids[0], /*with_layers=*/true);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->size(), 1u);
  const EvalResult& e = series->front();
  EXPECT_EQ(e.probes().sink_rate(), 0.5);
  ASSERT_EQ(e.probes().layers_size(), 1);
  const LayerProbes& l = e.probes().layers(0);
  EXPECT_THAT(std::vector<double>(l.first_token_attention_by_head().begin(),
                                  l.first_token_attention_by_head().end()),
              ::testing::ElementsAre(0.35, 0.05));
  EXPECT_EQ(l.sink_window_attention_by_head_size(), 2);
  ASSERT_EQ(l.classes_size(), 1);
  EXPECT_EQ(l.classes(0).name(), "trigger");
  EXPECT_EQ(l.classes(0).queries(), 10);
  EXPECT_EQ(l.classes(0).gate_mean(), 0.6);
}

TEST_F(StoreTest, ComparisonTableMatchesHandComputedMeanAndStd) {
  SweepIds ids = Submit("table", {"baseline", "g1"}, 3);  // runs: b0 g0 b1 g1 b2 g2
  const double base_loss[] = {3.0, 3.1, 3.2};             // mean 3.1, std 0.1
  const double base_mact[] = {100, 110, 150};             // mean 120, std sqrt(700)
  for (int seed = 0; seed < 3; ++seed) {
    const int64_t b = ids.run_ids[2 * seed];
    Start(b);
    // No gate: no gate score.
    ASSERT_TRUE(
        Finish(b, SUCCEEDED, base_loss[seed], kNaN, base_mact[seed], 0.3, 0.01 * seed).ok());
  }
  // g1: two succeed (2.9, 3.0), one diverges (its loss is not averaged).
  const double g1_loss[] = {2.9, 3.0};
  for (int seed = 0; seed < 2; ++seed) {
    const int64_t g = ids.run_ids[2 * seed + 1];
    Start(g);
    ASSERT_TRUE(Finish(g, SUCCEEDED, g1_loss[seed], 0.2 + 0.1 * seed, 50, 0.1, 0).ok());
  }
  Start(ids.run_ids[5]);
  ASSERT_TRUE(Finish(ids.run_ids[5], DIVERGED, 99.0, 0.9, 900, 0.9, 0.5).ok());

  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("table");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->rows.size(), 2u);
  const ComparisonRow& base = table->rows[0];
  ExpectRowCounts(base, "baseline", 3, 3, 0);
  EXPECT_NEAR(base.val_loss.mean, 3.1, 1e-12);
  EXPECT_NEAR(base.val_loss.std, 0.1, 1e-12);
  EXPECT_NEAR(base.val_ppl.mean, (std::exp(3.0) + std::exp(3.1) + std::exp(3.2)) / 3, 1e-9);
  EXPECT_TRUE(std::isnan(base.gate_score.mean));
  EXPECT_NEAR(base.m_act.mean, 120, 1e-9);
  EXPECT_NEAR(base.m_act.std, std::sqrt(700.0), 1e-9);
  EXPECT_NEAR(base.f_attn.mean, 0.3, 1e-12);
  EXPECT_NEAR(base.f_attn.std, 0.0, 1e-12);
  EXPECT_NEAR(base.spike_score.mean, 0.01, 1e-12);
  EXPECT_NEAR(base.spike_score.std, 0.01, 1e-12);
  EXPECT_NEAR(base.train_loss.mean, 3.0, 1e-12);
  EXPECT_EQ(base.params_total, 1000000);
  EXPECT_EQ(base.params_added, 0);
  const ComparisonRow& g1 = table->rows[1];
  ExpectRowCounts(g1, "g1", 3, 2, 1);
  EXPECT_NEAR(g1.val_loss.mean, 2.95, 1e-12);
  EXPECT_NEAR(g1.val_loss.std, std::sqrt(0.005), 1e-12);
  EXPECT_NEAR(g1.gate_score.mean, 0.25, 1e-12);
  EXPECT_NEAR(g1.gate_score.std, std::sqrt(0.005), 1e-12);
  EXPECT_EQ(g1.params_added, 1000);

  absl::StatusOr<std::string> markdown = FormatComparisonTable(*table, "markdown");
  ASSERT_TRUE(markdown.ok());
  EXPECT_NE(markdown->find("| baseline | 3 | 3.100 ± 0.100 |"), std::string::npos) << *markdown;
  EXPECT_NE(markdown->find("| 22.27 ± 2.22 | — |"), std::string::npos)
      << *markdown;  // no gate score
  EXPECT_NE(markdown->find("+1.0K"), std::string::npos) << *markdown;
  absl::StatusOr<std::string> csv = FormatComparisonTable(*table, "csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_NE(csv->find("table,g1,,3,2,1,0,0,2.95"), std::string::npos) << *csv;
  absl::StatusOr<std::string> json = FormatComparisonTable(*table, "json");
  ASSERT_TRUE(json.ok());
  nlohmann::json j = nlohmann::json::parse(*json);
  EXPECT_NEAR(j["rows"][0]["val_loss"]["std"].get<double>(), 0.1, 1e-12);
  EXPECT_EQ(j["rows"][1]["diverged"], 1);

  // The view answers the same one-line question.
  absl::StatusOr<QueryResult> view = store_->reader().ReadOnlyQuery(
      "SELECT val_loss_mean FROM variant_table WHERE sweep = 'table' AND variant = 'g1'");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_NEAR(std::get<double>(view->rows[0][0]), 2.95, 1e-12);
  EXPECT_TRUE(absl::IsNotFound(store_->reader().GetComparisonTable("nope").status()));
}

// Metrics reported by name (train.evals' TASK@SETTING): each run's last value, mean ± std per
// row, as table columns when chosen, and the values of a compute-matched evaluation.
TEST_F(StoreTest, MetricsByNameAreAveragedPerRowAndShownWhenChosen) {
  SweepIds ids = Submit("named", {"baseline", "g1"}, 2);  // runs: b0 g0 b1 g1
  auto finish = [&](int64_t run_id, double early, double last) {
    Start(run_id);
    MetricBatch batch;
    batch.run_id = run_id;
    batch.attempt = 1;
    batch.seq = 1;
    EvalResult& e = batch.evals.emplace_back();
    e.set_step(10);
    e.set_val_loss(3.0);
    e.set_eval_seconds(1.5);
    (*e.mutable_metrics())["passkey@64"] = early;
    EvalItemScores* items = e.add_items();
    items->set_metric("passkey@64");
    items->add_values(0);  // replaced by the final evaluation's
    ASSERT_TRUE(store_->ReportMetrics(batch).ok());
    RunTransition t = testing::MakeTransition(run_id, {RUNNING}, SUCCEEDED);
    t.has_summary = true;
    t.summary.set_state(SUCCEEDED);
    t.summary.set_steps_done(20);
    EvalResult* f = t.summary.mutable_final_eval();
    f->set_step(20);
    f->set_val_loss(2.0);
    f->set_eval_seconds(2.0);
    (*f->mutable_metrics())["passkey@64"] = last;
    EvalItemScores* final_items = f->add_items();
    final_items->set_metric("passkey@64");
    for (const float v : {1.0f, 0.0f, 1.0f}) final_items->add_values(v);
    ASSERT_TRUE(store_->TransitionRun(t).ok());
  };
  finish(ids.run_ids[0], 0.1, 0.50);
  finish(ids.run_ids[2], 0.1, 0.70);  // baseline: 0.6 ± 0.1414
  finish(ids.run_ids[1], 0.2, 0.90);
  finish(ids.run_ids[3], 0.2, 0.80);
  ASSERT_TRUE(store_->Flush().ok());

  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("named");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->rows.size(), 2u);
  EXPECT_NEAR(table->rows[0].metrics.at("passkey@64").mean, 0.6, 1e-12);
  EXPECT_NEAR(table->rows[0].metrics.at("passkey@64").std, std::sqrt(0.02), 1e-12);
  EXPECT_NEAR(table->rows[1].metrics.at("passkey@64").mean, 0.85, 1e-12);
  // Not a column until chosen; then after the others, in markdown and csv.
  EXPECT_EQ(FormatComparisonTable(*table, "markdown")->find("passkey@64"), std::string::npos);
  table->evals = {"passkey@64"};
  const std::string markdown = *FormatComparisonTable(*table, "markdown");
  EXPECT_NE(markdown.find("| passkey@64 |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| 0.600 ± 0.141 |"), std::string::npos) << markdown;
  const std::string csv = *FormatComparisonTable(*table, "csv");
  EXPECT_NE(csv.find("passkey@64_mean,passkey@64_std\n"), std::string::npos) << csv;
  nlohmann::json j = nlohmann::json::parse(*FormatComparisonTable(*table, "json"));
  EXPECT_NEAR(j["rows"][1]["metrics"]["passkey@64"]["mean"].get<double>(), 0.85, 1e-12);

  // Each run's evaluations took 1.5 + 2 s: the table's eval time.
  EXPECT_NEAR(table->rows[0].eval_seconds.mean, 3.5, 1e-12);
  EXPECT_NE(FormatComparisonTable(*table, "markdown")->find("| eval time |"), std::string::npos);
  // The items of the last evaluation, in order, when asked for: the earlier one's are gone.
  ResultSelection with_items{{"named"}, {}};
  with_items.items_metric = "passkey@64";
  absl::StatusOr<ResultSet> itemized = store_->reader().ReadResults(with_items);
  ASSERT_TRUE(itemized.ok()) << itemized.status();
  for (const ResultRun& r : itemized->runs) {
    EXPECT_EQ(r.items, (std::vector<double>{1, 0, 1})) << r.run.id;
  }
  absl::StatusOr<QueryResult> rows = store_->reader().ReadOnlyQuery(
      "SELECT count(*), sum(value), min(step) FROM eval_item_results WHERE sweep = 'named'");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(std::get<int64_t>(rows->rows[0][0]), 12);
  EXPECT_EQ(std::get<double>(rows->rows[0][1]), 8);
  EXPECT_EQ(std::get<int64_t>(rows->rows[0][2]), 20);

  // At a compute budget of 15 steps' tokens: the values of the evaluation at step 10.
  absl::StatusOr<ResultSet> all = store_->reader().ReadResults({{"named"}, {}});
  ASSERT_TRUE(all.ok());
  const nlohmann::json config = nlohmann::json::parse(all->runs[0].run.config_json);
  ResultSelection early{{"named"}, {}};
  early.at_tokens = 15.0 * config["train"]["batch_size"].get<double>() *
                    config["train"]["seq_len"].get<double>() *
                    std::max(1.0, config["train"]["grad_accum"].get<double>());
  absl::StatusOr<ResultSet> at = store_->reader().ReadResults(early);
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at->runs.size(), 4u);
  for (const ResultRun& r : at->runs) {
    ASSERT_EQ(r.metrics.count("passkey@64"), 1u) << r.run.id;
    EXPECT_NEAR(r.metrics.at("passkey@64"), r.run.variant == "g1" ? 0.2 : 0.1, 1e-12);
  }
}

// Several sweeps of one study make one set of runs, matched by variant, seed and axis point: a
// run with a result stands over one without, and between two alike the later sweep's.
TEST_F(StoreTest, SeveralSweepsMatchRunsByVariantSeedAndAxes) {
  SweepIds one = Submit("phase1", {"baseline", "g1"}, 2);  // b0 g0 b1 g1
  SweepIds two = Submit("phase2", {"g1", "g2"}, 2);        // g0 h0 g1 h1
  const auto finish = [&](int64_t run, double loss) {
    Start(run);
    ASSERT_TRUE(Finish(run, SUCCEEDED, loss, 0.2, 10, 0.1, 0).ok());
  };
  finish(one.run_ids[0], 3.0);
  finish(one.run_ids[1], 2.9);
  finish(one.run_ids[2], 3.1);  // phase1's g1 at seed 1 never trains
  finish(two.run_ids[0], 2.8);
  finish(two.run_ids[1], 3.05);
  finish(two.run_ids[2], 2.85);  // phase2's g2 at seed 1 never trains

  absl::StatusOr<ResultSet> both = store_->reader().ReadResults({{"phase1", "phase2"}, {}});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->label, "phase1+phase2");
  EXPECT_EQ(both->runs.size(), 6u);
  EXPECT_EQ(both->replaced, 2);
  ComparisonTable table = ComparisonTableOf(*both);
  ASSERT_EQ(table.rows.size(), 3u);
  EXPECT_EQ(table.sweep, "phase1+phase2");
  EXPECT_EQ(table.rows[1].variant, "g1");
  EXPECT_EQ(table.rows[1].n, 2);
  EXPECT_NEAR(table.rows[1].val_loss.mean, 2.825, 1e-12);  // phase2's two runs
  EXPECT_EQ(table.rows[2].variant, "g2");
  EXPECT_EQ(table.rows[2].unfinished, 1);

  // Named the other way round, phase1's g1 at seed 0 is the later; its PENDING one at seed 1
  // does not stand over phase2's result.
  absl::StatusOr<ComparisonTable> reversed =
      store_->reader().GetComparisonTable(ResultSelection{{"phase2", "phase1"}, {}});
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_EQ(reversed->rows[0].variant, "g1");
  EXPECT_NEAR(reversed->rows[0].val_loss.mean, 2.875, 1e-12);

  // The same sweep as one table: the variant_table view's numbers.
  absl::StatusOr<ComparisonTable> alone = store_->reader().GetComparisonTable("phase1");
  ASSERT_TRUE(alone.ok());
  absl::StatusOr<QueryResult> view = store_->reader().ReadOnlyQuery(
      "SELECT val_loss_mean, n, unfinished FROM variant_table WHERE sweep = 'phase1' ORDER BY "
      "first_index");
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->rows.size(), alone->rows.size());
  for (size_t i = 0; i < alone->rows.size(); ++i) {
    EXPECT_NEAR(std::get<double>(view->rows[i][0]), alone->rows[i].val_loss.mean, 1e-12);
    EXPECT_EQ(std::get<int64_t>(view->rows[i][1]), alone->rows[i].n);
    EXPECT_EQ(std::get<int64_t>(view->rows[i][2]), alone->rows[i].unfinished);
  }

  // Runs tagged to leave out: one run of phase1, then the whole of phase2 through its sweep.
  AnnotationEdit bugged;
  bugged.sweep_id = one.sweep_id;
  bugged.run_id = one.run_ids[0];  // the baseline at seed 0
  bugged.texts = {"bugged"};
  ASSERT_TRUE(store_->Annotate(bugged).ok());
  absl::StatusOr<ResultSet> kept =
      store_->reader().ReadResults({{"phase1", "phase2"}, {"bugged", "other"}});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->excluded, 1);
  EXPECT_EQ(kept->runs.size(), 5u);
  table = ComparisonTableOf(*kept);
  ASSERT_EQ(table.rows.size(), 3u);
  EXPECT_EQ(table.rows[1].variant, "baseline");  // its first run now is seed 1's, after g1's
  EXPECT_EQ(table.rows[1].n, 1);
  EXPECT_NEAR(table.rows[1].val_loss.mean, 3.1, 1e-12);
  bugged.run_id = 0;
  bugged.sweep_id = two.sweep_id;
  ASSERT_TRUE(store_->Annotate(bugged).ok());
  kept = store_->reader().ReadResults({{"phase1", "phase2"}, {"bugged"}});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->excluded, 5);
  EXPECT_EQ(kept->runs.size(), 3u);  // phase1's but its tagged baseline
  EXPECT_EQ(kept->replaced, 0);

  EXPECT_THAT(store_->reader().ReadResults({{"phase1", "phase1"}, {}}).status().message(),
              ::testing::HasSubstr("sweep phase1 is named twice"));
  EXPECT_TRUE(absl::IsNotFound(store_->reader().ReadResults({{"phase1", "nope"}, {}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->reader().ReadResults({}).status()));
}

// PPL against evaluation length (TrainConfig.eval_seq_lens): each run's last evaluation counts,
// mean ± std over SUCCEEDED seeds per length; the table gains a PPL@L column per length, marked
// when measured with YaRN. Attention maps come back byte for byte.
TEST_F(StoreTest, LengthTableAveragesEachRunsLastEvaluationPerLength) {
  SweepIds ids = Submit("long", {"baseline", "g1"}, 2);  // runs: b0 g0 b1 g1
  auto finish = [&](int64_t run_id, RunState to, double ppl_at_64, double ppl_at_256) {
    Start(run_id);
    MetricBatch early;  // an earlier evaluation with other numbers: not the final one
    early.run_id = run_id;
    early.attempt = 1;
    early.seq = 1;
    EvalResult& e = early.evals.emplace_back();
    e.set_step(500);
    LengthEval* l = e.add_lengths();
    l->set_seq_len(64);
    l->set_val_ppl(1000);
    AttentionMap* m = e.add_attention_maps();
    m->set_layer(1);
    m->set_head(0);
    m->set_size(2);
    m->set_probs(std::string("\xff\x00\x80\x7f", 4));
    ASSERT_TRUE(store_->ReportMetrics(early).ok());
    RunTransition t = testing::MakeTransition(run_id, {RUNNING}, to);
    t.has_summary = true;
    t.summary.set_state(to);
    t.summary.set_steps_done(1000);
    EvalResult* f = t.summary.mutable_final_eval();
    f->set_step(1000);
    f->set_val_loss(1.0);
    f->set_val_ppl(std::exp(1.0));
    for (const auto& [len, ppl] : {std::pair{64, ppl_at_64}, {256, ppl_at_256}}) {
      LengthEval* fl = f->add_lengths();
      fl->set_seq_len(len);
      fl->set_yarn(len > 128);
      fl->set_val_ppl(ppl);
      fl->set_val_loss(std::log(ppl));
    }
    ASSERT_TRUE(store_->TransitionRun(t).ok());
  };
  finish(ids.run_ids[0], SUCCEEDED, 4.0, 6.0);
  finish(ids.run_ids[2], SUCCEEDED, 5.0, 8.0);  // baseline: 4.5 ± 0.7071, 7 ± 1.4142
  finish(ids.run_ids[1], SUCCEEDED, 3.0, 5.0);
  finish(ids.run_ids[3], DIVERGED, 90.0, 90.0);  // not averaged
  ASSERT_TRUE(store_->Flush().ok());

  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("long");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->rows.size(), 2u);
  const std::vector<LengthStat>& base = table->rows[0].lengths;
  ASSERT_EQ(base.size(), 2u);
  EXPECT_EQ(base[0].seq_len, 64);
  EXPECT_FALSE(base[0].yarn);
  EXPECT_EQ(base[0].n, 2);
  EXPECT_NEAR(base[0].val_ppl.mean, 4.5, 1e-12);
  EXPECT_NEAR(base[0].val_ppl.std, std::sqrt(0.5), 1e-12);
  EXPECT_EQ(base[1].seq_len, 256);
  EXPECT_TRUE(base[1].yarn);
  EXPECT_NEAR(base[1].val_ppl.mean, 7.0, 1e-12);
  EXPECT_NEAR(base[1].val_ppl.std, std::sqrt(2.0), 1e-12);
  const std::vector<LengthStat>& g1 = table->rows[1].lengths;
  ASSERT_EQ(g1.size(), 2u);
  EXPECT_EQ(g1[0].n, 1);
  EXPECT_NEAR(g1[0].val_ppl.mean, 3.0, 1e-12);
  EXPECT_TRUE(std::isnan(g1[0].val_ppl.std));

  absl::StatusOr<std::string> markdown = FormatComparisonTable(*table, "markdown");
  ASSERT_TRUE(markdown.ok());
  EXPECT_NE(markdown->find("| PPL@64 | PPL@256 (YaRN) |"), std::string::npos) << *markdown;
  EXPECT_NE(markdown->find("| 4.500 ± 0.707 | 7.000 ± 1.414 |"), std::string::npos) << *markdown;
  EXPECT_NE(markdown->find("| 3.000 | 5.000 |"), std::string::npos) << *markdown;
  absl::StatusOr<std::string> csv = FormatComparisonTable(*table, "csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_NE(csv->find("val_ppl_at_64_mean,val_ppl_at_64_std,val_ppl_at_256_mean"),
            std::string::npos);
  nlohmann::json j = nlohmann::json::parse(*FormatComparisonTable(*table, "json"));
  EXPECT_EQ(j["rows"][0]["lengths"][1]["seq_len"], 256);
  EXPECT_EQ(j["rows"][0]["lengths"][1]["yarn"], true);
  EXPECT_NEAR(j["rows"][0]["lengths"][1]["val_ppl"]["mean"].get<double>(), 7.0, 1e-12);

  // A run's evaluations carry their lengths; the maps come back as stored.
  absl::StatusOr<std::vector<EvalResult>> evals =
      store_->reader().EvalSeries(ids.run_ids[0], false);
  ASSERT_TRUE(evals.ok()) << evals.status();
  ASSERT_EQ(evals->size(), 2u);
  ASSERT_EQ((*evals)[0].lengths_size(), 1);
  EXPECT_EQ((*evals)[0].lengths(0).val_ppl(), 1000);
  ASSERT_EQ((*evals)[1].lengths_size(), 2);
  EXPECT_EQ((*evals)[1].lengths(1).seq_len(), 256);
  absl::StatusOr<std::vector<AttentionMap>> maps =
      store_->reader().AttentionMapsAt(ids.run_ids[0], 500);
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_EQ(maps->size(), 1u);
  EXPECT_EQ((*maps)[0].layer(), 1);
  EXPECT_EQ((*maps)[0].size(), 2);
  EXPECT_EQ((*maps)[0].probs(), std::string("\xff\x00\x80\x7f", 4));
  EXPECT_TRUE(store_->reader().AttentionMapsAt(ids.run_ids[0], 1000)->empty());
  EXPECT_EQ(Count("SELECT typeof(probs) = 'blob' FROM eval_attention_maps LIMIT 1"), 1);
}

}  // namespace
}  // namespace ablate
