// Every run the shipped CPU-scale specs expand to: the analytic parameter counts `ablate
// expand` reports (total and per component, after budget matching) equal what the LibTorch
// model allocates. Distinct model configs are built once each.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "orchestrator/expand.h"
#include "orchestrator/param_count.h"
#include "orchestrator/proto_yaml.h"
#include "worker/model/transformer.h"

namespace ablate {
namespace {

// Sums allocated parameter elements into the analytic counter's components, by module name
// (the same classification as tests/worker/model_test.cc).
ParamBreakdown ClassifyAllocated(torch::nn::Module& model) {
  ParamBreakdown b;
  for (const auto& p : model.named_parameters()) {
    const std::string& n = p.key();
    const int64_t k = p.value().numel();
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (n == "embedding") {
      b.set_embedding(b.embedding() + k);
    } else if (n.rfind("lm_head.", 0) == 0) {
      b.set_lm_head(b.lm_head() + k);
    } else if (has(".ffn.") || has(".moe.")) {
      b.set_ffn(b.ffn() + k);
    } else if (has(".attn.gate.") || has(".attn.control_norm.")) {
      b.set_gate(b.gate() + k);
    } else if (has(".attn.")) {
      b.set_attention(b.attention() + k);
    } else {
      b.set_norms(b.norms() + k);
    }
  }
  return b;
}

class SpecModelCountTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecModelCountTest, ExpandedCountsEqualAllocated) {
  const std::string path = std::string(ABLATE_SOURCE_DIR) + "/experiments/" + GetParam();
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweepFile(path);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  std::set<std::string> built;
  for (const RunSpec& run : sweep->runs()) {
    const ModelConfig& c = run.config().model();
    if (!built.insert(CanonicalJson(c)).second) continue;
    SkipInitGuard skip_init;  // counting only: values are irrelevant
    Transformer model(c);
    const ParamBreakdown got = ClassifyAllocated(*model);
    const ParamBreakdown& want = run.params().breakdown();
    EXPECT_EQ(CountAllocatedParams(*model), run.params().total()) << run.variant();
    EXPECT_EQ(got.embedding(), want.embedding()) << run.variant();
    EXPECT_EQ(got.lm_head(), want.lm_head()) << run.variant();
    EXPECT_EQ(got.attention(), want.attention()) << run.variant();
    EXPECT_EQ(got.gate(), want.gate()) << run.variant();
    EXPECT_EQ(got.ffn(), want.ffn()) << run.variant();
    EXPECT_EQ(got.norms(), want.norms()) << run.variant();
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
