// Config defaults, validation and presets (no LibTorch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/text_format.h"
#include "config/memory_plan.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "tests/test_configs.h"

namespace ablate {
namespace {

TEST(DefaultsTest, DefaultRunConfigIsValid) {
  const absl::Status s = ValidateRunConfig(DefaultRunConfig());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(DefaultsTest, DefaultModelIsThePaperCpuScaleModel) {
  // docs/results.md (CPU scale): 4 layers, d_model 128, 4 heads, byte-level; about 1.1M parameters.
  const ParamCount c = CountParams(DefaultModelConfig());
  EXPECT_EQ(c.total(), c.activated());
  EXPECT_GT(c.total(), 900000);
  EXPECT_LT(c.total(), 1200000);
}

TEST(PresetsTest, NamesAreUniqueAndFindable) {
  std::set<std::string> names;
  for (const VariantPreset& p : AllVariantPresets()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
    EXPECT_EQ(FindVariantPreset(p.name), &p);
  }
  EXPECT_EQ(FindVariantPreset("no_such_variant"), nullptr);
  // The paper's variant matrix: baseline, 3 expansions, 11 gates, 3 controls, 2 sparsity controls,
  // 5 SwitchHeads, sandwich norm, 2 clamps; and 2 controls for scale that are not the paper's.
  EXPECT_EQ(names.size(), 30u);
}

TEST(PresetsTest, ExpertsNeedAnMoeBase) {
  ModelConfig c = TinyDense();
  EXPECT_EQ(FindVariantPreset("experts_plus4")->apply(&c).code(),
            absl::StatusCode::kFailedPrecondition);
  ModelConfig m = TinyMoe();
  ASSERT_TRUE(FindVariantPreset("experts_plus4")->apply(&m).ok());
  EXPECT_EQ(m.moe().num_experts(), TinyMoe().moe().num_experts() + 4);
  EXPECT_EQ(m.moe().top_k(), TinyMoe().moe().top_k() + 4);  // total and activated (§3.2.1)
}

TEST(ParamCountTest, GateAddsItsProjection) {
  // G1 elementwise on the tiny dense base adds d_model x (q * d_k) per layer.
  ModelConfig c = TinyDense();
  const int64_t base = CountParams(c).total();
  ASSERT_TRUE(FindVariantPreset("g1_elementwise")->apply(&c).ok());
  EXPECT_EQ(CountParams(c).total() - base, 2 * 32 * 32);
  ModelConfig h = TinyDense();
  ASSERT_TRUE(FindVariantPreset("g1_headwise")->apply(&h).ok());
  EXPECT_EQ(CountParams(h).total() - base, 2 * 32 * 4);
}

// Found with tests/fuzz/spec_fuzz: int32 dimensions near 2^31 overflowed the int64 counts. At the
// dimension bounds, the largest model the counting formulas allow (MoE FFN, SwitchHead KV,
// elementwise G1 gate, untied embeddings) still counts exactly; one past a bound is refused.
TEST(ParamCountTest, ModelsAtTheDimensionBoundsCountExactly) {
  ModelConfig c = DefaultModelConfig();
  c.set_vocab_size(kMaxVocabSize);
  c.set_num_layers(kMaxNumLayers);
  c.set_d_model(kMaxDModel);
  c.set_num_heads(kMaxNumHeads);
  c.set_num_kv_heads(kMaxNumHeads);
  c.set_head_dim(kMaxHeadDim);
  c.set_ffn_dim(kMaxFfnDim);
  c.set_tie_embeddings(false);
  c.mutable_moe()->set_num_experts(kMaxExperts);
  c.mutable_moe()->set_top_k(1);
  c.mutable_moe()->set_expert_dim(kMaxFfnDim);
  c.mutable_switchhead()->set_target(SWITCHHEAD_KV);
  c.mutable_switchhead()->set_num_experts(kMaxSwitchHeadExperts);
  c.mutable_switchhead()->set_top_k(1);
  c.mutable_gate()->set_position(GATE_G1);
  ASSERT_TRUE(ValidateModelConfig(c).ok()) << ValidateModelConfig(c);
  const ParamCount p = CountParams(c);
  // The same sum in floating point (exact enough to catch a wrapped int64).
  const double d = kMaxDModel, L = kMaxNumLayers, h = kMaxNumHeads, dk = kMaxHeadDim;
  const double kv_proj = d * h * dk;
  const double attention =
      2 * d * h * dk + 2 * kMaxSwitchHeadExperts * kv_proj + d * h * kMaxSwitchHeadExperts + 2 * dk;
  const double ffn = d * kMaxExperts + kMaxExperts * 3.0 * d * kMaxFfnDim;
  const double total = 2.0 * kMaxVocabSize * d + L * (attention + d * h * dk + ffn + 2 * d) + d;
  EXPECT_GT(p.total(), 0);
  EXPECT_NEAR(static_cast<double>(p.total()), total, total * 1e-12);
  EXPECT_LT(static_cast<double>(p.total()), 0x1p62);
  EXPECT_GT(p.activated(), 0);
  EXPECT_LT(p.activated(), p.total());

  for (auto* set : std::vector<void (*)(ModelConfig*)>{
           [](ModelConfig* m) { m->set_d_model(kMaxDModel + 1); },
           [](ModelConfig* m) { m->set_num_layers(2000000000); },
           [](ModelConfig* m) { m->mutable_moe()->set_num_experts(kMaxExperts + 1); }}) {
    ModelConfig over = c;
    set(&over);
    const absl::Status s = ValidateModelConfig(over);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("must be <= "), absl::string_view::npos) << s;
  }
}

TEST(DescribeGateTest, NamesTheAxes) {
  ModelConfig c = TinyDense();
  EXPECT_EQ(DescribeGate(c.gate()), "none");
  ASSERT_TRUE(FindVariantPreset("g1_additive_silu")->apply(&c).ok());
  EXPECT_EQ(DescribeGate(c.gate()), "G1 elementwise additive silu");
}

TEST(ValidationTest, RejectsInvalidCombinationsNamingTheFields) {
  struct Case {
    void (*edit)(ModelConfig*);
    const char* field;
  };
  const Case cases[] = {
      {[](ModelConfig* c) {
         c->mutable_gate()->set_position(GATE_G5);
         c->mutable_gate()->set_granularity(GATE_HEADWISE);
       },
       "model.gate.granularity"},
      {[](ModelConfig* c) {
         c->mutable_switchhead()->set_target(SWITCHHEAD_V);
         c->mutable_switchhead()->set_num_experts(2);
         c->mutable_switchhead()->set_top_k(3);
       },
       "model.switchhead.top_k"},
      {[](ModelConfig* c) { c->set_num_kv_heads(3); }, "model.num_kv_heads"},
      {[](ModelConfig* c) { c->set_head_dim(7); }, "model.head_dim"},
      {[](ModelConfig* c) {
         c->mutable_moe()->set_num_experts(4);
         c->mutable_moe()->set_top_k(5);
         c->mutable_moe()->set_expert_dim(8);
       },
       "model.moe.top_k"},
  };
  for (const Case& tc : cases) {
    ModelConfig c = TinyDense();
    tc.edit(&c);
    const absl::Status s = ValidateModelConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(tc.field), std::string::npos) << s;
  }
}

TEST(ValidationTest, CollectsEveryProblemAtOnce) {
  TrainConfig t = DefaultTrainConfig();
  t.set_steps(0);
  t.set_device("tpu");
  t.mutable_optimizer()->set_lr(-1);
  const absl::Status s = ValidateTrainConfig(t);
  for (const char* field : {"train.steps", "train.device", "train.optimizer.lr"}) {
    EXPECT_NE(s.message().find(field), std::string::npos) << field << " in " << s;
  }
}

TEST(ValidationTest, ShardedGradientsNeedTheShardedOptimizerAndCheckpointing) {
  TrainConfig t = DefaultTrainConfig();
  t.set_shard_gradients(true);
  t.set_shard_optimizer(true);
  absl::Status s = ValidateTrainConfig(t);
  EXPECT_NE(s.message().find("train.shard_gradients: needs shard_optimizer: true and "
                             "activation_checkpointing: true"),
            std::string::npos)
      << s;
  t.set_activation_checkpointing(true);
  EXPECT_TRUE(ValidateTrainConfig(t).ok());
}

TEST(ValidationTest, SeqLenMustFitTheModel) {
  RunConfig r = DefaultRunConfig();
  r.mutable_train()->set_seq_len(r.model().max_seq_len() + 1);
  const absl::Status s = ValidateRunConfig(r);
  EXPECT_NE(s.message().find("train.seq_len"), std::string::npos) << s;
}

}  // namespace
}  // namespace ablate

namespace ablate {
namespace {

// A shape past any device (the fuzzer's 65,536-wide, 1,024-layer MoE of 16,384 experts) plans
// saturated byte counts, not int64 overflows, and does not fit.
TEST(MemoryPlanTest, AbsurdShapesSaturateInsteadOfOverflowing) {
  RunConfig config = DefaultRunConfig();
  ModelConfig& m = *config.mutable_model();
  m.set_d_model(65536);
  m.set_num_layers(1024);
  m.mutable_moe()->set_num_experts(16384);
  m.mutable_moe()->set_top_k(1);
  m.mutable_moe()->set_expert_dim(1048576);
  const MemoryPlan plan = PlanMemory(config, 1);
  EXPECT_GT(plan.parameters(), 0);
  EXPECT_GT(plan.per_device(), 0);
  EXPECT_GE(plan.per_device(), plan.parameters());
  EXPECT_FALSE(CheckMemoryFits("run 0", config, 1, plan, int64_t{80} * 1000 * 1000 * 1000).ok());
}

// ZeRO-2 over 8 ranks: the gradients are the rank's eighth plus what a backward holds before
// reducing it (the embedding and output projection, one block, a bucket), not all of them; the
// weights are ZeRO-1's. A run that does not fit with ZeRO-1 is told that ZeRO-2 would.
TEST(MemoryPlanTest, ShardedGradientsHoldAnEighthAndWhatTheBackwardHasNotReduced) {
  RunConfig config = DefaultRunConfig();
  ModelConfig& m = *config.mutable_model();
  m.set_vocab_size(1024);
  m.set_d_model(512);
  m.set_num_layers(16);
  m.set_num_heads(8);
  m.set_num_kv_heads(8);
  m.set_head_dim(64);
  m.set_ffn_dim(2048);
  m.set_max_seq_len(256);
  TrainConfig& t = *config.mutable_train();
  t.set_batch_size(8);
  t.set_seq_len(256);
  t.set_shard_optimizer(true);
  t.set_activation_checkpointing(true);
  const MemoryPlan zero1 = PlanMemory(config, 8);
  t.set_shard_gradients(true);
  const MemoryPlan zero2 = PlanMemory(config, 8);
  const ParamCount count = CountParams(m);
  const double params = static_cast<double>(count.total());
  const double outside =
      static_cast<double>(count.breakdown().embedding() + count.breakdown().lm_head()) + 2 * 512;
  const double expected = (std::ceil(params / 8) + outside + (params - outside) / 16 +
                           std::min(params, static_cast<double>(kShardBucketElements))) *
                          4;
  EXPECT_EQ(zero1.gradients(), static_cast<int64_t>(params * 4));
  EXPECT_NEAR(static_cast<double>(zero2.gradients()), std::min(expected, params * 4), 1.0);
  EXPECT_EQ(zero2.parameters(), zero1.parameters());
  // AdamW's moments of the rank's eighth; ZeRO-1 also keeps the averaged gradient of it apart.
  EXPECT_NEAR(static_cast<double>(zero2.optimizer()), std::ceil(params / 8) * 8, 1.0);
  EXPECT_NEAR(static_cast<double>(zero1.optimizer()), std::ceil(params / 8) * 12, 1.0);
  ASSERT_LT(zero2.per_device(), zero1.per_device());
  // Told to a run that does not fit with ZeRO-1 but would with ZeRO-2.
  t.set_shard_gradients(false);
  const int64_t limit = (zero1.per_device() + zero2.per_device()) / 2;
  const absl::Status s = CheckMemoryFits("run 3", config, 8, zero1, limit);
  EXPECT_NE(s.message().find("train.shard_gradients: true (" + FormatBytes(zero2.per_device()) +
                             ", fits)"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace ablate
