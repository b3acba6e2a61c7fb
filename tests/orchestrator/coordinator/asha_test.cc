// ASHA's rule (orchestrator/coordinator/asha.h) against hand-worked groups.
#include "orchestrator/coordinator/asha.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ablate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Nine values of one group, one seed each; the metric at step 10 is |value - 5| + 1.
AshaGroup NineAtRungZero() {
  AshaGroup g;
  for (int v = 1; v <= 9; ++v) {
    AshaRun r;
    r.run_id = v;
    r.value = v;
    r.state = PENDING;
    r.held = true;
    r.steps_done = 10;
    r.at[10] = std::fabs(v - 5.0) + 1;
    g.runs.push_back(r);
  }
  return g;
}

AshaRule Rule() {
  AshaRule rule;
  rule.rungs = {10, 30};
  rule.reduction_factor = 3;
  return rule;
}

std::vector<std::string> Summary(const std::vector<AshaDecision>& decisions) {
  std::vector<std::string> out;
  for (const AshaDecision& d : decisions) {
    out.push_back(
        absl::StrCat(AshaKindName(d.kind), " ", d.value, "@", d.rung, " -> ", d.next_stop));
  }
  return out;
}

TEST(AshaTest, WhenEveryTrialReachedARungTheTopThirdGoesOnAndTheRestStop) {
  const std::vector<AshaDecision> d = DecideAsha(NineAtRungZero(), Rule());
  // Ranked 5, 4, 6 (a tie of 2: the smaller value first), 3, 7, 2, 8, 1, 9.
  ASSERT_THAT(Summary(d), ElementsAre("promote 5@0 -> 30", "promote 4@0 -> 30", "promote 6@0 -> 30",
                                      "stop 3@0 -> 0", "stop 7@0 -> 0", "stop 2@0 -> 0",
                                      "stop 8@0 -> 0", "stop 1@0 -> 0", "stop 9@0 -> 0"));
  EXPECT_THAT(d[0].detail, HasSubstr("rung 0 (step 10): val_loss 1 is 1 of 9, in the top 3"));
  EXPECT_THAT(d[7].detail, HasSubstr("stopped at rung 0 (step 10): val_loss 5 is 8 of 9, "
                                     "not in the top 3"));
  EXPECT_THAT(d[0].runs, ElementsAre(5));
}

TEST(AshaTest, BeforeEveryTrialArrivedOnlyTheTopOfThoseThereGoesOnAndNoneStops) {
  AshaGroup g = NineAtRungZero();
  for (int i = 3; i < 9; ++i) {  // 4..9 still training toward step 10
    g.runs[i].state = RUNNING;
    g.runs[i].held = false;
    g.runs[i].at.clear();
  }
  // Three arrived (1, 2, 3): floor(3 / 3) = 1, the best of them, 3.
  EXPECT_THAT(Summary(DecideAsha(g, Rule())), ElementsAre("promote 3@0 -> 30"));
  // Decided before (a restart): nothing again.
  g.decided.insert({3.0, 0, "promote"});
  EXPECT_TRUE(DecideAsha(g, Rule()).empty());
}

TEST(AshaTest, ADivergedTrialRanksLastAtTheRungItDidNotReach) {
  AshaGroup g = NineAtRungZero();
  g.runs[4].state = DIVERGED;  // value 5, the best, diverged at step 7
  g.runs[4].held = false;
  g.runs[4].steps_done = 7;
  g.runs[4].at.clear();
  const std::vector<AshaDecision> d = DecideAsha(g, Rule());
  // Still 9 at rung 0 (top 3): 4, 6, then 3 (tie with 7: smaller value); 5 is last.
  EXPECT_THAT(Summary(d), ElementsAre("promote 4@0 -> 30", "promote 6@0 -> 30", "promote 3@0 -> 30",
                                      "stop 7@0 -> 0", "stop 2@0 -> 0", "stop 8@0 -> 0",
                                      "stop 1@0 -> 0", "stop 9@0 -> 0"));
}

TEST(AshaTest, TheLastRungPromotesToTheEndAndAtLeastOneGoesOnOnceComplete) {
  AshaGroup g;
  // Two values at rung 1 (step 30) after both were promoted: floor(2 / 3) = 0, but no other
  // trial can arrive, so the best one trains to the end.
  for (int v : {4, 5}) {
    AshaRun r;
    r.run_id = v;
    r.value = v;
    r.state = PENDING;
    r.held = true;
    r.at[10] = 1;
    r.at[30] = v == 4 ? 0.5 : 0.7;
    g.runs.push_back(r);
    g.decided.insert({static_cast<double>(v), 0, "promote"});
  }
  EXPECT_THAT(Summary(DecideAsha(g, Rule())), ElementsAre("promote 4@1 -> 0", "stop 5@1 -> 0"));
}

TEST(AshaTest, WithEverySeedATrialWaitsForItsLastSeedAndRanksByTheMean) {
  AshaGroup g;
  const auto add = [&](int64_t id, double value, uint64_t seed, bool arrived, double metric) {
    AshaRun r;
    r.run_id = id;
    r.value = value;
    r.seed = seed;
    r.state = arrived ? PENDING : RUNNING;
    r.held = arrived;
    if (arrived) r.at[10] = metric;
    g.runs.push_back(r);
  };
  add(1, 1, 0, true, 1.0);
  add(2, 1, 1, true, 3.0);  // value 1: mean 2
  add(3, 2, 0, true, 1.5);
  add(4, 2, 1, true, 1.5);  // value 2: mean 1.5
  add(5, 3, 0, true, 0.1);
  add(6, 3, 1, false, 0);  // value 3 has not arrived at its second seed
  AshaRule rule = Rule();
  rule.reduction_factor = 2;
  // Two trials there: floor(2 / 2) = 1 goes on, value 2 (both its seeds).
  const std::vector<AshaDecision> d = DecideAsha(g, rule);
  ASSERT_THAT(Summary(d), ElementsAre("promote 2@0 -> 30"));
  EXPECT_THAT(d[0].runs, ElementsAre(3, 4));
}

TEST(AshaTest, WithSeedsFirstTheBestFinishedValueTakesTheOtherSeeds) {
  AshaGroup g;
  for (int v = 1; v <= 3; ++v) {
    AshaRun first;
    first.run_id = v;
    first.value = v;
    first.seed = 0;
    first.state = v == 2 ? SUCCEEDED : STOPPED;
    first.final_metric = v == 2 ? 0.9 : 1.5;
    g.runs.push_back(first);
    AshaRun other = first;
    other.run_id = 10 + v;
    other.seed = 1;
    other.state = PENDING;
    other.held = true;
    other.follower = true;
    g.runs.push_back(other);
  }
  AshaRule rule = Rule();
  rule.seeds_first = true;
  const std::vector<AshaDecision> d = DecideAsha(g, rule);
  EXPECT_THAT(Summary(d), ElementsAre("stop 1@-1 -> 0", "choose 2@-1 -> 0", "stop 3@-1 -> 0"));
  EXPECT_THAT(d[1].runs, ElementsAre(12));
  EXPECT_THAT(d[1].detail, HasSubstr("the first seed chose 2"));
}


// Trains through (a program that cannot pause): runs RUNNING past their rungs, nothing held.
AshaRule ThroughRule() {
  AshaRule rule = Rule();
  rule.trains_through = true;
  return rule;
}

AshaRun Running(int64_t id, double value) {
  AshaRun r;
  r.run_id = id;
  r.value = value;
  r.state = RUNNING;
  return r;
}

TEST(AshaTest, TrainingThroughEachArrivalIsJudgedAgainstThoseThereBeforeIt) {
  AshaGroup g;
  g.runs.push_back(Running(1, 1));
  g.runs[0].at[10] = 2.0;
  g.runs.push_back(Running(2, 2));  // not at rung 0 yet
  // Alone at the rung: max(1, floor(1 / 3)) = 1, it trains on.
  std::vector<AshaDecision> d = DecideAsha(g, ThroughRule());
  ASSERT_THAT(Summary(d), ElementsAre("promote 1@0 -> 0"));
  EXPECT_TRUE(d[0].runs.empty());  // nothing to release: it never paused
  EXPECT_THAT(d[0].detail, HasSubstr("val_loss 2 is 1 of 1 at rung 0 (step 10), in the top 1: "
                                     "trains on"));
  g.decided.insert({1.0, 0, "promote"});
  // The second arrives worse: not in the top 1 of 2, stopped while it trains.
  g.runs[1].at[10] = 3.0;
  d = DecideAsha(g, ThroughRule());
  ASSERT_THAT(Summary(d), ElementsAre("stop 2@0 -> 0"));
  EXPECT_THAT(d[0].runs, ElementsAre(2));
  EXPECT_THAT(d[0].detail, HasSubstr("stopped while training: val_loss 3 is 2 of 2"));
  // A third arrives best: it goes on; the first is not judged again.
  g.decided.insert({2.0, 0, "stop"});
  g.runs[1].state = STOPPED;
  g.runs.push_back(Running(3, 3));
  g.runs[2].at[10] = 1.0;
  EXPECT_THAT(Summary(DecideAsha(g, ThroughRule())), ElementsAre("promote 3@0 -> 0"));
}

TEST(AshaTest, TrainingThroughATrialThatEndedIsNotStoppedAndADivergedOneIsNotJudged) {
  AshaGroup g;
  g.runs.push_back(Running(1, 1));
  g.runs[0].at[10] = 1.0;
  g.decided.insert({1.0, 0, "promote"});
  g.runs.push_back(Running(2, 2));
  g.runs[1].at[10] = 5.0;
  g.runs[1].state = SUCCEEDED;  // finished before its rung was decided: nothing to stop
  g.runs.push_back(Running(3, 3));
  g.runs[2].state = DIVERGED;  // before rung 0: ranks last there, its runs ended
  EXPECT_TRUE(DecideAsha(g, ThroughRule()).empty());
}

TEST(AshaTest, TrainingThroughEverySeedOfALosingTrialThatCanStillTrainIsStopped) {
  AshaGroup g;
  for (int64_t id = 1; id <= 4; ++id) {
    g.runs.push_back(Running(id, id <= 2 ? 1 : 2));  // trials 1 and 2, two seeds each
    g.runs.back().seed = static_cast<uint64_t>(id % 2);
    g.runs.back().at[10] = id <= 2 ? 1.0 : 4.0;
  }
  g.runs[3].state = PENDING;  // trial 2's second seed crashed past the rung: queued again
  g.decided.insert({1.0, 0, "promote"});
  const std::vector<AshaDecision> d = DecideAsha(g, ThroughRule());
  ASSERT_THAT(Summary(d), ElementsAre("stop 2@0 -> 0"));
  EXPECT_THAT(d[0].runs, ElementsAre(3, 4));
}

}  // namespace
}  // namespace ablate
