// Every run the shipped CPU-scale specs expand to: the analytic parameter counts `ablate
// expand` reports (total and per component, after budget matching) equal what the LibTorch
// model allocates. Distinct model configs are built once each.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "orchestrator/sweep/expand.h"
#include "config/param_count.h"
#include "config/proto_yaml.h"
#include "tests/worker/model/count_check.h"

namespace ablate {
namespace {

class SpecModelCountTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecModelCountTest, ExpandedCountsEqualAllocated) {
  const std::string path = std::string(ABLATE_SOURCE_DIR) + "/experiments/" + GetParam();
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweepFile(path);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  std::set<std::string> built;
  for (const RunSpec& run : sweep->runs()) {
    const ModelConfig& c = run.config().model();
    if (!built.insert(CanonicalJson(c)).second) continue;
    ExpectAllocatedEquals(c, run.params(), run.variant());
    EXPECT_EQ(run.params().total(), CountParams(c).total());
  }
  EXPECT_FALSE(built.empty());
}

INSTANTIATE_TEST_SUITE_P(Shipped, SpecModelCountTest,
                         ::testing::Values("quick.yaml", "small/dense_stability.yaml",
                                           "small/moe_table.yaml", "small/dense_clamp.yaml"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace ablate
