// The stability bisection (orchestrator/coordinator/bisection.h) where it ends without a bracket.
// Its search to a bracket, against the plan's count of probes, is in
// tests/orchestrator/sweep/tune_test.cc.
#include "orchestrator/coordinator/bisection.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;

TEST(BoundaryTest, UnstableAtMinStableAtMaxAndAFailedProbeSaySoInsteadOfABracket) {
  BoundaryStep step =
      NextBoundaryStep({{1e-3, true, false, false}, {1e-1, false, false, false}}, 1e-3, 1e-1, 1.25);
  EXPECT_EQ(step.kind, BoundaryStep::Kind::kDone);  // no need to wait for max
  EXPECT_FALSE(step.stable.has_value());
  EXPECT_EQ(step.unstable, 1e-3);
  EXPECT_EQ(step.note, "unstable already at min 0.001");
  step = NextBoundaryStep({{1e-3, true, false, true}, {1e-1, true, false, true}}, 1e-3, 1e-1, 1.25);
  EXPECT_EQ(step.kind, BoundaryStep::Kind::kDone);
  EXPECT_EQ(step.stable, 1e-1);
  EXPECT_FALSE(step.unstable.has_value());
  EXPECT_EQ(step.note, "still stable at max 0.1");
  step = NextBoundaryStep({{1e-3, true, false, true}, {1e-1, true, true, false}}, 1e-3, 1e-1, 1.25);
  EXPECT_EQ(step.kind, BoundaryStep::Kind::kDone);
  EXPECT_THAT(step.note, HasSubstr("a run of probe 0.1 failed"));
}

}  // namespace
}  // namespace ablate
