// `ablate compare` on fixed runs (orchestrator/store/compare.h): runs paired by seed at each axis
// point, the tests and verdicts of orchestrator/stats/comparison.h, and its bad input. The
// statistics themselves: tests/orchestrator/stats/stats_test.cc.
#include "orchestrator/store/compare.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ablate {
namespace {

using ::testing::HasSubstr;

// A run of `variant` at `seed` in `state` with val loss `loss` (and PPL at 256 of exp(loss)).
ResultRun MakeRun(const std::string& variant, uint64_t seed, RunState state, double loss,
                  const std::string& axes = "") {
  ResultRun r;
  r.run.variant = variant;
  r.run.seed = seed;
  r.run.state = state;
  r.run.axes = axes;
  r.run.val_loss = state == SUCCEEDED ? loss : kNaN;
  if (state == SUCCEEDED) r.lengths.push_back({256, false, loss, std::exp(loss)});
  return r;
}

ResultSet Results(std::vector<ResultRun> runs) {
  ResultSet s;
  s.label = "study";
  s.reference = "baseline";
  s.runs = std::move(runs);
  return s;
}

const CompareRow& RowOf(const Comparison& c, const std::string& variant,
                        const std::string& axes = "") {
  for (const CompareRow& r : c.rows) {
    if (r.variant == variant && r.axes == axes) return r;
  }
  ADD_FAILURE() << "no row " << variant << " " << axes;
  static const CompareRow none;
  return none;
}

TEST(CompareTest, PairsBySeedAndAdjustsOverTheRows) {
  const double base[] = {1.921, 1.944, 1.934};
  const double g1[] = {1.872, 1.905, 1.896};  // clearly lower
  const double g2[] = {1.925, 1.939, 1.936};  // the same, give or take
  std::vector<ResultRun> runs;
  for (int s = 0; s < 3; ++s) {
    runs.push_back(MakeRun("baseline", 100 + s, SUCCEEDED, base[s]));
    runs.push_back(MakeRun("g1", 100 + s, SUCCEEDED, g1[s]));
    runs.push_back(MakeRun("g2", 100 + s, SUCCEEDED, g2[s]));
  }
  absl::StatusOr<Comparison> c = CompareResults(Results(runs), {});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->rows.size(), 2u);
  const CompareRow& a = RowOf(*c, "g1");
  EXPECT_EQ(a.test, "paired t");
  EXPECT_EQ(a.n_pairs, 3);
  const DifferenceTest expected =
      PairedTTest({g1[0], g1[1], g1[2]}, {base[0], base[1], base[2]}, 0.05);
  EXPECT_DOUBLE_EQ(a.delta, expected.delta);
  EXPECT_DOUBLE_EQ(a.p_value, expected.p_value);
  EXPECT_DOUBLE_EQ(a.ci_low, expected.ci_low);
  EXPECT_DOUBLE_EQ(a.min_detectable, expected.min_detectable);
  const CompareRow& b = RowOf(*c, "g2");
  const std::vector<double> holm = HolmAdjust({a.p_value, b.p_value});
  EXPECT_DOUBLE_EQ(a.p_adjusted, holm[0]);
  EXPECT_DOUBLE_EQ(b.p_adjusted, holm[1]);
  EXPECT_EQ(a.verdict, kBetter);
  EXPECT_EQ(b.verdict, kNoDifference);

  // Without correction the adjusted p is the p.
  CompareOptions none;
  none.correction = "none";
  absl::StatusOr<Comparison> raw = CompareResults(Results(runs), none);
  ASSERT_TRUE(raw.ok());
  EXPECT_DOUBLE_EQ(RowOf(*raw, "g2").p_adjusted, RowOf(*raw, "g2").p_value);

  // The CSV has exactly the documented columns.
  absl::StatusOr<std::string> csv = FormatComparison(*c, "csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_EQ(csv->substr(0, csv->find('\n')),
            "variant,axes,metric,n_pairs,reference_mean,variant_mean,delta,ci_low,ci_high,"
            "p_value,p_adjusted,verdict,min_detectable");
  EXPECT_THAT(*csv, HasSubstr("\ng1,,val_loss,3,"));
  EXPECT_THAT(*csv, HasSubstr(",better,"));
  absl::StatusOr<std::string> markdown = FormatComparison(*c, "markdown");
  ASSERT_TRUE(markdown.ok());
  EXPECT_THAT(*markdown, HasSubstr("val loss of each variant against baseline in study"));
  EXPECT_THAT(*markdown, HasSubstr("| g1 | 3 | 1.933 | 1.891 | -0.0420 |"));
  absl::StatusOr<std::string> json = FormatComparison(*c, "json");
  ASSERT_TRUE(json.ok());
  nlohmann::json j = nlohmann::json::parse(*json);
  EXPECT_EQ(j["rows"][0]["verdict"], "better");
  EXPECT_EQ(j["rows"][0]["test"], "paired t");
  EXPECT_FALSE(FormatComparison(*c, "xml").ok());
}

TEST(CompareTest, DivergedOnePairWelchAndAxisPoints) {
  std::vector<ResultRun> runs = {
      // g1 diverged at seed 2 where the baseline trained.
      MakeRun("baseline", 1, SUCCEEDED, 3.0),
      MakeRun("g1", 1, SUCCEEDED, 2.9),
      MakeRun("baseline", 2, SUCCEEDED, 3.1),
      MakeRun("g1", 2, DIVERGED, 0),
      MakeRun("baseline", 3, SUCCEEDED, 3.2),
      MakeRun("g1", 3, SUCCEEDED, 3.0),
      // g2: one pair only.
      MakeRun("g2", 1, SUCCEEDED, 3.05),
      MakeRun("g2", 4, FAILED, 0),
      // g3 at other seeds: nothing pairs, Welch over every value.
      MakeRun("g3", 7, SUCCEEDED, 2.95),
      MakeRun("g3", 8, SUCCEEDED, 3.0),
      MakeRun("g3", 9, SUCCEEDED, 2.9),
      // An axis point where the reference never ran.
      MakeRun("g1", 1, SUCCEEDED, 2.0, "lr=0.01"),
  };
  absl::StatusOr<Comparison> c = CompareResults(Results(runs), {});
  ASSERT_TRUE(c.ok()) << c.status();
  const CompareRow& g1 = RowOf(*c, "g1");
  EXPECT_EQ(g1.verdict, kDiverged);
  EXPECT_EQ(g1.variant_diverged, 1);
  EXPECT_EQ(g1.n_pairs, 2);
  EXPECT_THAT(g1.note, HasSubstr("at 1 of 3 seeds, the reference at 0"));
  const CompareRow& g2 = RowOf(*c, "g2");
  EXPECT_EQ(g2.verdict, kTooFewSeeds);
  EXPECT_EQ(g2.note, "1 pair: no interval");
  EXPECT_TRUE(std::isnan(g2.ci_low));
  EXPECT_TRUE(std::isnan(g2.p_value));
  EXPECT_NEAR(g2.delta, 0.05, 1e-12);
  const CompareRow& g3 = RowOf(*c, "g3");
  EXPECT_EQ(g3.test, "Welch");
  EXPECT_EQ(g3.n_pairs, 0);
  const DifferenceTest welch = WelchTTest({2.95, 3.0, 2.9}, {3.0, 3.1, 3.2}, 0.05);
  EXPECT_DOUBLE_EQ(g3.p_value, welch.p_value);
  const CompareRow& axis = RowOf(*c, "g1", "lr=0.01");
  EXPECT_EQ(axis.verdict, kTooFewSeeds);
  EXPECT_EQ(axis.note, "no reference runs at this axis point");
  // Holm's family: the rows with a p-value (g1 and g3).
  EXPECT_DOUBLE_EQ(g3.p_adjusted, HolmAdjust({g1.p_value, g3.p_value})[1]);
}

TEST(CompareTest, MetricsReferencesAndBadInput) {
  std::vector<ResultRun> runs;
  for (int s = 0; s < 3; ++s) {
    runs.push_back(MakeRun("baseline", s, SUCCEEDED, 3.0 + 0.01 * s));
    runs.push_back(MakeRun("g1", s, SUCCEEDED, 2.8 + 0.02 * s));
  }
  CompareOptions ppl;
  ppl.metric = "ppl@256";
  absl::StatusOr<Comparison> c = CompareResults(Results(runs), ppl);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->heading, "PPL@256");
  EXPECT_NEAR(RowOf(*c, "g1").reference_mean, (std::exp(3.0) + std::exp(3.01) + std::exp(3.02)) / 3,
              1e-9);
  // Another reference: the old one becomes a row.
  CompareOptions against_g1;
  against_g1.reference = "g1";
  c = CompareResults(Results(runs), against_g1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rows[0].variant, "baseline");
  EXPECT_EQ(c->rows[0].verdict, kWorse);
  // The gate score has no better direction.
  for (ResultRun& r : runs)
    r.run.gate_score = r.run.variant == "g1" ? 0.1 + r.run.seed : 0.5 + r.run.seed;
  CompareOptions gate;
  gate.metric = "gate_score";
  gate.correction = "none";
  c = CompareResults(Results(runs), gate);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->lower_is_better);
  EXPECT_EQ(c->rows[0].verdict, kLower);

  // The sink rate is compared as F-Attn is: lower is better. A gate score by query class
  // (gate_score@trigger), as the gate score, has no better direction.
  for (ResultRun& r : runs) {
    r.run.sink_rate = r.run.variant == "g1" ? 0.0 + 0.01 * r.run.seed : 0.5 + 0.01 * r.run.seed;
    r.metrics["gate_score@trigger"] = r.run.variant == "g1" ? 0.2 + 0.01 * r.run.seed : 0.5;
  }
  CompareOptions sink;
  sink.metric = "sink_rate";
  sink.correction = "none";
  c = CompareResults(Results(runs), sink);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->lower_is_better);
  EXPECT_EQ(RowOf(*c, "g1").verdict, kBetter);
  EXPECT_NEAR(RowOf(*c, "g1").delta, -0.5, 1e-12);
  CompareOptions by_class;
  by_class.metric = "gate_score@trigger";
  by_class.correction = "none";
  c = CompareResults(Results(runs), by_class);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->lower_is_better);
  EXPECT_EQ(RowOf(*c, "g1").verdict, kLower);

  const auto error = [&](CompareOptions o) { return CompareResults(Results(runs), o).status(); };
  CompareOptions bad;
  bad.metric = "accuracy";
  EXPECT_THAT(error(bad).message(), HasSubstr("unknown metric \"accuracy\""));
  bad.metric = "ppl@abc";
  EXPECT_THAT(error(bad).message(), HasSubstr("needs an evaluation length"));
  bad.metric = "ppl@4096";
  EXPECT_TRUE(absl::IsNotFound(error(bad)));
  EXPECT_THAT(error(bad).message(), HasSubstr("lengths measured: 256"));
  bad = {};
  bad.reference = "nope";
  EXPECT_THAT(error(bad).message(), HasSubstr("variants: baseline, g1"));
  bad = {};
  bad.alpha = 0.7;
  EXPECT_TRUE(absl::IsInvalidArgument(error(bad)));
  bad = {};
  bad.correction = "bonferroni";
  EXPECT_THAT(error(bad).message(), HasSubstr("expected holm or none"));
}

}  // namespace
}  // namespace ablate

namespace ablate {
namespace {

TEST(CompareTest, MetricsByNameWithTheirDirection) {
  std::vector<ResultRun> runs;
  for (int s = 0; s < 3; ++s) {
    ResultRun b = MakeRun("baseline", s, SUCCEEDED, 3.0);
    ResultRun g = MakeRun("g1", s, SUCCEEDED, 3.0);
    b.metrics["passkey@256"] = 0.40 + 0.01 * s;  // an accuracy: higher is better
    g.metrics["passkey@256"] = 0.60 + 0.02 * s;
    b.metrics["copying@64"] = 2.0 + 0.01 * s;  // a loss: lower is better
    g.metrics["copying@64"] = 2.5 + 0.02 * s;
    runs.push_back(std::move(b));
    runs.push_back(std::move(g));
  }
  CompareOptions passkey;
  passkey.metric = "passkey@256";
  absl::StatusOr<Comparison> c = CompareResults(Results(runs), passkey);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->heading, "passkey@256");
  EXPECT_FALSE(c->lower_is_better);
  EXPECT_TRUE(c->higher_is_better);
  EXPECT_EQ(RowOf(*c, "g1").verdict, kBetter);
  EXPECT_NE(FormatComparison(*c, "markdown")->find("higher is better"), std::string::npos);
  EXPECT_NEAR(RowOf(*c, "g1").reference_mean, 0.41, 1e-9);

  CompareOptions copying;
  copying.metric = "copying@64";
  c = CompareResults(Results(runs), copying);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->lower_is_better);
  EXPECT_EQ(RowOf(*c, "g1").verdict, kWorse);

  // A name no run reports is refused, naming those they do.
  CompareOptions bad;
  bad.metric = "passkey@512";
  absl::Status s = CompareResults(Results(runs), bad).status();
  EXPECT_THAT(s.message(), HasSubstr("unknown metric \"passkey@512\""));
  EXPECT_THAT(s.message(), HasSubstr("copying@64, passkey@256"));
  EXPECT_TRUE(IsAccuracyMetric("mqar@16"));
  EXPECT_TRUE(IsAccuracyMetric("val_acc"));
  EXPECT_FALSE(IsAccuracyMetric("position_loss@0-64"));
}

// A multiple-choice task's accuracy, named by its task alone, is better higher by the runs'
// config, which also states its chance level; the items of each seed are paired and pooled, and
// McNemar's exact test counts the items one side alone got right.
TEST(CompareTest, ItemsArePooledOverSeedsAndTestedPaired) {
  RunConfig config;
  EvalTask* task = config.mutable_train()->add_evals();
  task->set_task("multiple_choice");
  task->set_file("kjv_cloze.yaml");
  task->set_name("kjv_cloze");
  task->set_chance(0.25);
  std::string config_json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(config, &config_json).ok());
  std::vector<ResultRun> runs;
  for (int s = 0; s < 3; ++s) {
    ResultRun b = MakeRun("baseline", s, SUCCEEDED, 3.0);
    ResultRun g = MakeRun("g1", s, SUCCEEDED, 3.0);
    b.run.config_json = g.run.config_json = config_json;
    // 20 items a seed: the baseline gets the first 8 right, g1 the first 12 (and item 0 wrong).
    for (int i = 0; i < 20; ++i) {
      b.items.push_back(i < 8 ? 1 : 0);
      g.items.push_back(i > 0 && i < 12 ? 1 : 0);
    }
    b.metrics["kjv_cloze"] = 0.4;
    g.metrics["kjv_cloze"] = 0.55 + 0.001 * s;
    runs.push_back(std::move(b));
    runs.push_back(std::move(g));
  }
  // A seed whose runs scored other items (another count) is left out of the pool.
  ResultRun b3 = MakeRun("baseline", 3, SUCCEEDED, 3.0), g3 = MakeRun("g1", 3, SUCCEEDED, 3.0);
  b3.run.config_json = g3.run.config_json = config_json;
  b3.items = {1, 0};
  g3.items = {1};
  b3.metrics["kjv_cloze"] = 0.4;
  g3.metrics["kjv_cloze"] = 0.5;
  runs.push_back(std::move(b3));
  runs.push_back(std::move(g3));

  CompareOptions options;
  options.metric = "kjv_cloze";
  absl::StatusOr<Comparison> c = CompareResults(Results(runs), options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->higher_is_better);  // by the config: the name says nothing of accuracy
  EXPECT_DOUBLE_EQ(c->chance, 0.25);
  const CompareRow& row = RowOf(*c, "g1");
  EXPECT_EQ(row.item_test, "McNemar exact");
  EXPECT_EQ(row.items, 60);
  EXPECT_EQ(row.item_seeds, 3);
  EXPECT_DOUBLE_EQ(row.item_reference_mean, 0.4);
  EXPECT_DOUBLE_EQ(row.item_variant_mean, 0.55);
  // Discordant: item 0 (baseline alone) x 3 seeds = 3; items 8-11 (g1 alone) x 3 = 12.
  // scipy.stats.binomtest(3, 15, 0.5).pvalue = 0.03515625.
  EXPECT_NEAR(row.item_p, 0.03515625, 1e-12);
  EXPECT_DOUBLE_EQ(row.item_p_adjusted, row.item_p);  // one row: Holm changes nothing
  EXPECT_EQ(row.item_verdict, kBetter);
  // Wilson 95% of 24/60: scipy.stats.binomtest(24, 60).proportion_ci(method='wilson').
  EXPECT_NEAR(row.item_reference_interval.low, 0.2856949053488255, 1e-9);
  EXPECT_NEAR(row.item_reference_interval.high, 0.5263394650795924, 1e-9);
  EXPECT_LT(row.item_ci_low, 0.15);
  EXPECT_GT(row.item_ci_high, 0.15);
  const std::string text = *FormatComparison(*c, "markdown");
  EXPECT_THAT(text, HasSubstr("Chance level of kjv_cloze: 0.2500."));
  EXPECT_THAT(text, HasSubstr("| g1 | 60 (3 seeds) | 0.2500 | 0.4000 [0.2857, 0.5263] |"));
  EXPECT_THAT(text, HasSubstr("McNemar exact | 0.0352 |"));
  const std::string csv = *FormatComparison(*c, "csv");
  EXPECT_THAT(csv, HasSubstr(",chance,items,item_test,"));
  EXPECT_THAT(csv, HasSubstr(",0.25,60,McNemar exact,0.4,0.55,"));
  const nlohmann::json json = nlohmann::json::parse(*FormatComparison(*c, "json"));
  EXPECT_EQ(json["chance"], 0.25);
  EXPECT_EQ(json["rows"][0]["items"]["test"], "McNemar exact");
  EXPECT_EQ(json["rows"][0]["items"]["n"], 60);

  // Scores that are not 0 or 1 (a passkey's digit share) go to the paired bootstrap.
  for (ResultRun& r : runs) {
    for (double& v : r.items) v = r.run.variant == "g1" ? 0.5 * v + 0.25 : 0.5 * v;
  }
  c = CompareResults(Results(runs), options);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(RowOf(*c, "g1").item_test, "paired bootstrap");
  EXPECT_TRUE(std::isnan(RowOf(*c, "g1").item_reference_interval.low));
  EXPECT_LT(RowOf(*c, "g1").item_p, 0.01);
}

}  // namespace
}  // namespace ablate
