// Which run states end a run, and the states' names in order (config/run_state.h).
#include "config/run_state.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ablate {
namespace {

TEST(RunStateTest, EndedStates) {
  for (RunState s : {SUCCEEDED, FAILED, DIVERGED, CANCELLED, STOPPED}) {
    EXPECT_TRUE(RunEnded(s)) << RunState_Name(s);
  }
  for (RunState s : {RUN_STATE_UNSPECIFIED, PENDING, RUNNING, INTERRUPTED}) {
    EXPECT_FALSE(RunEnded(s)) << RunState_Name(s);
  }
}

TEST(RunStateTest, NamesInTheEnumsOrder) {
  EXPECT_EQ(RunStateNames(),
            (std::vector<std::string>{"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "DIVERGED",
                                      "CANCELLED", "INTERRUPTED", "STOPPED"}));
}

}  // namespace
}  // namespace ablate
