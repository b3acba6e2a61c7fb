// The analytic counter against the LibTorch model at paper scale: both dense 1.7B configs of
// the paper (docs/model.md; about 7 GB each in fp32, built one at a time), baseline and the gated
// variants of Table 2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "tests/worker/model/count_check.h"

namespace ablate {
namespace {

ModelConfig Dense17B(int layers, int d_model, int ffn) {
  ModelConfig c = DefaultModelConfig();
  c.set_vocab_size(151936);
  c.set_num_layers(layers);
  c.set_d_model(d_model);
  c.set_num_heads(16);
  c.set_num_kv_heads(8);
  c.set_head_dim(128);
  c.set_ffn_dim(ffn);
  c.set_tie_embeddings(true);
  c.set_max_seq_len(16);  // RoPE tables only; parameters do not depend on it
  return c;
}

class PaperDenseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PaperDenseTest, AnalyticCountEqualsAllocated) {
  for (const ModelConfig& base : {Dense17B(28, 2048, 6144), Dense17B(48, 1536, 4608)}) {
    ModelConfig c = base;
    ASSERT_TRUE(FindVariantPreset(GetParam())->apply(&c).ok());
    ASSERT_TRUE(ValidateModelConfig(c).ok());
    const ParamCount count = CountParams(c);  // 7 GB of fp32 parameters, left uninitialised
    ExpectAllocatedEquals(c, count, std::to_string(c.num_layers()) + " layers");
    EXPECT_GT(count.total(), 1'500'000'000);
    EXPECT_LT(count.total(), 2'300'000'000);
  }
}

INSTANTIATE_TEST_SUITE_P(Table2, PaperDenseTest,
                         ::testing::Values("baseline", "g1_elementwise", "g1_headwise",
                                           "sandwich_norm"));

}  // namespace
}  // namespace ablate
