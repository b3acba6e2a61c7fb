// The LibTorch model against its contract, over every variant (TEST_P over all presets on a
// dense and an MoE base): shapes, finiteness, gradients, causality, exact parameter counts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "config/model_config.h"
#include "config/param_count.h"
#include "tests/test_configs.h"
#include "tests/worker/model/count_check.h"
#include "worker/model/chunked_loss.h"
#include "worker/model/probes.h"
#include "worker/model/transformer.h"

namespace ablate {
namespace {

void ExpectCountsMatch(const ModelConfig& c) { ExpectAllocatedEquals(c, CountParams(c), ""); }

class VariantTest : public ::testing::TestWithParam<VariantCase> {
 protected:
  void SetUp() override { torch::manual_seed(7); }
  const ModelConfig& config() const { return GetParam().config; }
};

TEST_P(VariantTest, ConfigIsValid) {
  const absl::Status s = ValidateModelConfig(config());
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(VariantTest, AnalyticCountEqualsAllocated) { ExpectCountsMatch(config()); }

TEST_P(VariantTest, ForwardBackwardFiniteAndGradientsReachGate) {
  const int64_t V = config().vocab_size();
  Transformer model(config());
  torch::Tensor tokens = torch::randint(0, V, {2, 12}, torch::kLong);
  torch::Tensor targets = torch::randint(0, V, {2, 12}, torch::kLong);
  auto out = model->forward(tokens);
  ASSERT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, 12, V}));
  EXPECT_TRUE(torch::isfinite(out.logits).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(out.aux_loss).item<bool>());
  torch::Tensor loss =
      torch::cross_entropy_loss(out.logits.view({-1, V}), targets.view({-1})) + out.aux_loss;
  loss.backward();
  int gate_params = 0;
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor& g = p.value().grad();
    if (!g.defined()) continue;
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << p.key();
    if (p.key().find(".attn.gate.") != std::string::npos) {
      ++gate_params;
      EXPECT_GT(g.abs().sum().item<double>(), 0.0) << p.key() << " gets no gradient";
    }
  }
  const bool gated = config().gate().position() != GATE_NONE;
  EXPECT_EQ(gate_params, gated ? config().num_layers() : 0);
}

TEST_P(VariantTest, CausalChangingTokenTLeavesEarlierOutputs) {
  const int64_t V = config().vocab_size(), T = 12, t = 6;
  Transformer model(config());
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randint(0, V, {2, T}, torch::kLong);
  torch::Tensor b = a.clone();
  b.select(1, t).add_(1).remainder_(V);
  torch::Tensor la = model->forward(a).logits, lb = model->forward(b).logits;
  EXPECT_TRUE(torch::allclose(la.slice(1, 0, t), lb.slice(1, 0, t), /*rtol=*/0, /*atol=*/1e-5));
  EXPECT_FALSE(torch::allclose(la.slice(1, t), lb.slice(1, t), 0, 1e-5));
}

TEST_P(VariantTest, ProbesRunOnEveryVariant) {
  Transformer model(config());
  model->eval();
  torch::NoGradGuard no_grad;
  ProbeRecorder recorder(config());
  model->forward(torch::randint(0, config().vocab_size(), {2, 12}, torch::kLong), &recorder);
  const Probes p = recorder.Finish();
  ASSERT_EQ(p.layers_size(), config().num_layers());
  EXPECT_EQ(p.tokens(), 24);
  for (const LayerProbes& l : p.layers()) {
    EXPECT_EQ(l.has_gate(), config().gate().position() != GATE_NONE);
    EXPECT_GT(l.ffn_residual_max_abs(), 0.0);
    EXPECT_GT(l.first_token_attention(), 0.0);
    EXPECT_LE(l.first_token_attention(), 1.0);
  }
  EXPECT_TRUE(std::isfinite(p.m_act()));
}

TEST_P(VariantTest, FusedCpuKernelsMatchTheEagerReference) {
  // fp32 on the CPU runs the fused kernels (attention, RMSNorm, RoPE, SwiGLU); fp64 runs the
  // eager LibTorch reference of the same math. Same weights, same tokens: same loss and grads.
  const int64_t V = config().vocab_size();
  torch::manual_seed(11);
  Transformer fused(config());
  torch::manual_seed(11);
  Transformer eager(config());
  eager->to(torch::kFloat64);
  torch::Tensor tokens = torch::randint(0, V, {2, 12}, torch::kLong);
  torch::Tensor targets = torch::randint(0, V, {2, 12}, torch::kLong);
  auto run = [&](Transformer& m) {
    auto out = m->forward(tokens);
    torch::Tensor loss =
        torch::cross_entropy_loss(out.logits.view({-1, V}), targets.view({-1})) + out.aux_loss;
    loss.backward();
    return out.logits.to(torch::kFloat64);
  };
  const torch::Tensor a = run(fused), b = run(eager);
  EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-4)) << (a - b).abs().max();
  auto ga = fused->named_parameters(), gb = eager->named_parameters();
  for (const auto& p : ga) {
    const torch::Tensor& g1 = p.value().grad();
    const torch::Tensor& g2 = gb[p.key()].grad();
    ASSERT_EQ(g1.defined(), g2.defined()) << p.key();
    if (!g1.defined()) continue;
    EXPECT_TRUE(torch::allclose(g1.to(torch::kFloat64), g2, 1e-3, 1e-5))
        << p.key() << ": " << (g1.to(torch::kFloat64) - g2).abs().max();
  }
}

// Forward and backward of `model` over `micro_batches` micro-batches of one optimizer step (the
// MoE's global-batch balance loss counts them all), leaving the step's gradients.
void StepGradients(Transformer& model, const std::vector<torch::Tensor>& tokens,
                   const std::vector<torch::Tensor>& targets) {
  const int64_t V = model->config().vocab_size();
  model->BeginStep();
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto out = model->forward(tokens[i]);
    (torch::cross_entropy_loss(out.logits.reshape({-1, V}).to(torch::kFloat32),
                               targets[i].reshape({-1})) +
     out.aux_loss)
        .backward();
  }
}

// train.activation_checkpointing: each block recomputed in the backward gives the plain pass's
// gradients (fp32, within 1e-6 relative), MoE layers' global-batch counts included, over two
// micro-batches.
TEST_P(VariantTest, CheckpointedBlocksGiveThePlainGradients) {
  const int64_t V = config().vocab_size();
  std::vector<torch::Tensor> tokens, targets;
  for (int i = 0; i < 2; ++i) {
    tokens.push_back(torch::randint(0, V, {2, 12}, torch::kLong));
    targets.push_back(torch::randint(0, V, {2, 12}, torch::kLong));
  }
  torch::manual_seed(3);
  Transformer plain(config());
  torch::manual_seed(3);
  Transformer checkpointed(config());
  checkpointed->SetActivationCheckpointing(true);
  StepGradients(plain, tokens, targets);
  StepGradients(checkpointed, tokens, targets);
  auto want = plain->named_parameters();
  int compared = 0;
  for (const auto& p : checkpointed->named_parameters()) {
    const torch::Tensor& got = p.value().grad();
    const torch::Tensor& expected = want[p.key()].grad();
    ASSERT_EQ(got.defined(), expected.defined()) << p.key();
    if (!got.defined()) continue;
    const double scale = expected.abs().max().item<double>();
    EXPECT_LE((got - expected).abs().max().item<double>(), 1e-6 * scale + 1e-12)
        << p.key() << ": " << (got - expected).abs().max().item<double>() << " of " << scale;
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

// PRECISION_BF16 (SetComputeDtype): the residual stream after every block is bf16, the logits
// too, the parameters and their gradients stay fp32 and finite.
TEST_P(VariantTest, Bf16KeepsTheResidualStreamInBf16AndGradientsInFp32) {
  const int64_t V = config().vocab_size();
  Transformer model(config());
  model->SetComputeDtype(torch::kBFloat16);
  const torch::Tensor tokens = torch::randint(0, V, {2, 12}, torch::kLong);
  {
    torch::NoGradGuard no_grad;
    ProbeRecorder recorder(config());
    model->forward(tokens, &recorder);
    ASSERT_EQ(recorder.ResidualDtypes().size(), static_cast<size_t>(config().num_layers()));
    for (const std::string& dtype : recorder.ResidualDtypes()) EXPECT_EQ(dtype, "BFloat16");
  }
  std::vector<torch::Tensor> targets = {torch::randint(0, V, {2, 12}, torch::kLong)};
  auto out = model->forward(tokens);
  EXPECT_EQ(out.logits.scalar_type(), torch::kBFloat16);
  StepGradients(model, {tokens}, targets);
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), torch::kFloat32) << p.key();
    const torch::Tensor& g = p.value().grad();
    if (!g.defined()) continue;
    EXPECT_EQ(g.scalar_type(), torch::kFloat32) << p.key();
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << p.key();
  }
  // fp32, the default: the residual stream stays fp32.
  Transformer plain(config());
  torch::NoGradGuard no_grad;
  ProbeRecorder recorder(config());
  plain->forward(tokens, &recorder);
  for (const std::string& dtype : recorder.ResidualDtypes()) EXPECT_EQ(dtype, "Float");
}

INSTANTIATE_TEST_SUITE_P(AllVariants, VariantTest, ::testing::ValuesIn(AllVariantCases()),
                         [](const auto& info) { return info.param.name; });

TEST(ParamCountTest, TinyMoeMatchesHandComputedNumbers) {
  // V=64, d=32, L=2, q=4, kv=2, d_k=16, 8 experts top-2 of width 16, untied.
  // Per layer: attention 32*64 + 2*32*32 + 64*32 + 2*16 = 6176; FFN router 32*8 + experts
  // 8*3*32*16 = 12544; norms 64. Total 2048 + 2048 + 2*18784 + 32 = 41696; each layer leaves
  // 6 experts (6*1536) unused per token: activated 41696 - 18432 = 23264.
  const ParamCount c = CountParams(TinyMoe());
  EXPECT_EQ(c.total(), 41696);
  EXPECT_EQ(c.activated(), 23264);
  EXPECT_EQ(c.breakdown().ffn(), 2 * 12544);
}

TEST(ParamCountTest, PaperMoeHeadLayoutScaledDown) {
  // moe-15a2b's head layout (32 query / 4 KV heads, q*d_k = 2 d_model, 128 experts top-8,
  // untied) at d_model 256 and 2 layers, under every preset that applies.
  ModelConfig base = DefaultModelConfig();
  base.set_vocab_size(512);
  base.set_num_layers(2);
  base.set_d_model(256);
  base.set_num_heads(32);
  base.set_num_kv_heads(4);
  base.set_head_dim(16);
  base.set_tie_embeddings(false);
  base.mutable_moe()->set_num_experts(128);
  base.mutable_moe()->set_top_k(8);
  base.mutable_moe()->set_expert_dim(96);
  for (const VariantPreset& preset : AllVariantPresets()) {
    ModelConfig c = base;
    if (!preset.apply(&c).ok()) continue;
    SCOPED_TRACE(preset.name);
    ExpectCountsMatch(c);
  }
}

// ---- The gate itself ---------------------------------------------------------------------------

ModelConfig GateConfigFor(GatePosition pos, int heads, int head_dim) {
  ModelConfig c = TinyDense();
  c.set_d_model(heads * head_dim);
  c.set_num_heads(heads);
  c.set_num_kv_heads(heads);
  c.set_head_dim(head_dim);
  c.mutable_gate()->set_position(pos);
  return c;
}

TEST(GateTest, PaperWorkedExample) {
  // docs/model.md, "The gate": SDPA outputs [2, -1] and [1, 3], gate scores [0.1, 0.9] and [0.8,
  // 0.05] give [0.2, -0.9] and [0.8, 0.15], concatenated and fed to W_O. The scores come out of the
  // gate module: identity projection, X = logit(score).
  ModelConfig c = GateConfigFor(GATE_G1, /*heads=*/2, /*head_dim=*/2);
  Gate gate(c);
  {
    torch::NoGradGuard no_grad;
    gate->named_parameters()["proj.weight"].copy_(torch::eye(4));
  }
  torch::Tensor want_scores = torch::tensor({0.1, 0.9, 0.8, 0.05}, torch::kFloat64);
  torch::Tensor x = torch::log(want_scores / (1 - want_scores)).to(torch::kFloat32).view({1, 1, 4});
  torch::Tensor scores = gate->Scores(x);  // (1, 1, 2, 2)
  ASSERT_EQ(scores.sizes(), (std::vector<int64_t>{1, 1, 2, 2}));
  torch::Tensor y = torch::tensor({2.0f, -1.0f, 1.0f, 3.0f}).view({1, 1, 2, 2});
  torch::Tensor concat = ApplyGate(y, scores, GATE_MULTIPLICATIVE).reshape({1, 1, 4});
  torch::Tensor want = torch::tensor({0.2f, -0.9f, 0.8f, 0.15f}).view({1, 1, 4});
  EXPECT_TRUE(torch::allclose(concat, want, 0, 1e-6)) << concat;
  // Exact with the scores given directly.
  torch::Tensor exact = ApplyGate(y, torch::tensor({0.1f, 0.9f, 0.8f, 0.05f}).view({1, 1, 2, 2}),
                                  GATE_MULTIPLICATIVE);
  EXPECT_TRUE(torch::equal(exact.reshape({1, 1, 4}), want));
}

TEST(GateTest, HeadSharedAveragesScoresOrLogitsAsConfigured) {
  torch::manual_seed(3);
  for (GateSharedReduce reduce : {GATE_AVERAGE_SCORES, GATE_AVERAGE_LOGITS}) {
    ModelConfig c = GateConfigFor(GATE_G1, 4, 8);
    c.mutable_gate()->set_sharing(GATE_HEAD_SHARED);
    c.mutable_gate()->set_shared_reduce(reduce);
    Gate gate(c);
    torch::Tensor x = torch::randn({2, 5, 32});
    torch::Tensor logits =
        torch::matmul(x, gate->named_parameters()["proj.weight"].t()).view({2, 5, 4, 8});
    torch::Tensor want = reduce == GATE_AVERAGE_SCORES
                             ? torch::sigmoid(logits).mean(2, true)
                             : torch::sigmoid(logits.mean(2, true));
    torch::Tensor got = gate->Scores(x);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 5, 1, 8}));
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-7));
  }
}

TEST(GateTest, NsSigmoidStaysInHalfToOne) {
  torch::Tensor x = torch::linspace(-80, 80, 1001);
  torch::Tensor s = GateActivate(x, GATE_NS_SIGMOID);
  EXPECT_GE(s.min().item<float>(), 0.5f);
  EXPECT_LE(s.max().item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(GateActivate(torch::zeros({1}), GATE_NS_SIGMOID).item<float>(), 0.75f);
}

TEST(GateTest, InputIndependentStartsAtExactlyHalf) {
  for (GatePosition pos : {GATE_G1, GATE_G2, GATE_G3, GATE_G4, GATE_G5}) {
    ModelConfig c = TinyDense();
    c.mutable_gate()->set_position(pos);
    c.mutable_gate()->set_input_independent(true);
    Gate gate(c);
    torch::Tensor s = gate->Scores(torch::randn({2, 3, c.d_model()}));
    EXPECT_TRUE(torch::equal(s, torch::full_like(s, 0.5))) << pos;
    EXPECT_EQ(s.numel(), GateScoreWidth(c));
  }
}

// A gate added to a trained model (appendix A.7): zero-initialised, every score is sigmoid(0) =
// 0.5 whatever the input, and with scale 2 the gated attention is exactly the ungated one, so
// the loaded model's function is kept. The gate still learns: its weight gets a gradient.
// The controls that separate gating from scale (issue 58). fixed_scale: the SDPA output times a
// constant (0.5 by default), no parameter, so the attention branch is exactly the baseline's
// halved for the same weights.
TEST(ControlTest, FixedScaleMultipliesTheAttentionBranchWithNoParameters) {
  torch::manual_seed(5);
  const ModelConfig base = TinyDense();
  const torch::Tensor x = torch::randn({2, 6, base.d_model()});
  Attention plain(base, 0);
  const torch::Tensor want = plain(x, nullptr);
  for (const double scale : {0.0, 0.25}) {
    ModelConfig c = base;
    c.set_attn_output_control(CONTROL_FIXED_SCALE);
    c.set_attn_output_scale(scale);
    ASSERT_TRUE(ValidateModelConfig(c).ok()) << ValidateModelConfig(c);
    EXPECT_EQ(CountParams(c).total(), CountParams(base).total());
    Attention fixed(c, 0);
    {
      torch::NoGradGuard no_grad;
      auto from = plain->named_parameters();
      ASSERT_EQ(fixed->named_parameters().size(), from.size());
      for (auto& p : fixed->named_parameters()) p.value().copy_(from[p.key()]);
    }
    EXPECT_TRUE(torch::allclose(fixed(x, nullptr), want * (scale == 0 ? 0.5 : scale), 1e-5, 1e-6))
        << scale;
  }
  ModelConfig stray = base;
  stray.set_attn_output_scale(0.5);
  EXPECT_NE(std::string(ValidateModelConfig(stray).message())
                .find("model.attn_output_scale: is read only with attn_output_control FIXED_SCALE"),
            std::string::npos);
  ModelConfig negative = base;
  negative.set_attn_output_control(CONTROL_FIXED_SCALE);
  negative.set_attn_output_scale(-1);
  EXPECT_NE(std::string(ValidateModelConfig(negative).message())
                .find("model.attn_output_scale: must be in (0, 1e6]"),
            std::string::npos);
}

// init.output_std SCALED: W_O and the FFN's down projections (the experts' too) start at
// init_std / sqrt(2L), Megatron-LM's output-layer init; every other matrix at init_std.
TEST(ControlTest, ScaledOutputInitStartsTheOutputProjectionsSmaller) {
  for (ModelConfig c : {TinyDense(), TinyMoe()}) {
    c.set_d_model(128);
    c.set_num_layers(8);
    c.mutable_init()->set_output_std(OUTPUT_STD_SCALED);
    ASSERT_TRUE(ValidateModelConfig(c).ok()) << ValidateModelConfig(c);
    const double scaled = c.init_std() / std::sqrt(16.0);
    EXPECT_DOUBLE_EQ(OutputInitStd(c), scaled);
    torch::manual_seed(3);
    Transformer model(c);
    int outputs = 0, others = 0;
    for (const auto& p : model->named_parameters()) {
      const std::string& name = p.key();
      if (p.value().dim() < 2 || name.find("embedding") != std::string::npos) continue;
      const bool output = name.find("o_proj.weight") != std::string::npos ||
                          name.find("down.weight") != std::string::npos ||
                          name.find("w_down") != std::string::npos;
      const double std = p.value().std().item<double>();
      const double want = output ? scaled : c.init_std();
      EXPECT_NEAR(std, want, 0.15 * want) << name;
      ++(output ? outputs : others);
    }
    EXPECT_EQ(outputs, 2 * 8) << "W_O and the down projection of each of 8 layers";
    EXPECT_GT(others, 0);
  }
  EXPECT_DOUBLE_EQ(OutputInitStd(TinyDense()), TinyDense().init_std());  // the default
}

// Each parameter's initial values depend on the seed and its name only (issue 58, "better
// pairing"): a baseline and its gated variant of the same seed start from the same shared weights,
// whatever the gate drew; another seed starts elsewhere; a zero-initialised gate stays zero.
TEST(InitTest, SharedWeightsStartTheSameInEveryVariantOfASeed) {
  for (const ModelConfig& base : {TinyDense(), TinyMoe()}) {
    ModelConfig gated = base;
    gated.mutable_gate()->set_position(GATE_G1);
    ModelConfig zero = gated;
    zero.mutable_gate()->set_init(GATE_INIT_ZERO);
    torch::manual_seed(11);
    Transformer plain(base);
    torch::manual_seed(11);
    Transformer g1(gated);
    torch::manual_seed(11);
    Transformer g1_zero(zero);
    torch::manual_seed(12);
    Transformer other(base);
    auto gp = g1->named_parameters(), zp = g1_zero->named_parameters();
    auto op = other->named_parameters();
    int shared = 0;
    for (const auto& p : plain->named_parameters()) {
      ASSERT_TRUE(gp.contains(p.key())) << p.key();
      EXPECT_TRUE(torch::equal(p.value(), gp[p.key()])) << p.key();
      EXPECT_TRUE(torch::equal(p.value(), zp[p.key()])) << p.key();
      if (p.value().dim() >= 2) {
        EXPECT_FALSE(torch::equal(p.value(), op[p.key()])) << p.key();
        ++shared;
      }
    }
    EXPECT_GT(shared, 5);
    for (const auto& p : zp) {
      if (p.key().find("gate.proj") == std::string::npos) continue;
      EXPECT_EQ(p.value().abs().max().item<double>(), 0) << p.key();
      EXPECT_GT(gp[p.key()].abs().max().item<double>(), 0) << p.key();
    }
  }
}

TEST(GateTest, ZeroInitTimesTwoStartsAsTheIdentity) {
  torch::manual_seed(5);
  ModelConfig base = TinyDense();
  const torch::Tensor x = torch::randn({2, 6, base.d_model()});
  Attention plain(base, 0);
  const torch::Tensor want = plain(x, nullptr);
  for (double scale : {1.0, 2.0}) {
    ModelConfig c = base;
    c.mutable_gate()->set_position(GATE_G1);
    c.mutable_gate()->set_init(GATE_INIT_ZERO);
    c.mutable_gate()->set_scale(scale);
    ASSERT_TRUE(ValidateModelConfig(c).ok()) << ValidateModelConfig(c);
    Attention gated(c, 0);
    {
      torch::NoGradGuard no_grad;
      auto from = plain->named_parameters();
      for (auto& p : gated->named_parameters()) {
        if (from.contains(p.key())) p.value().copy_(from[p.key()]);
      }
    }
    EXPECT_TRUE(torch::equal(gated->named_parameters()["gate.proj.weight"],
                             torch::zeros_like(gated->named_parameters()["gate.proj.weight"])));
    const torch::Tensor got = gated(x, nullptr);
    EXPECT_TRUE(torch::allclose(got, want * (scale / 2), 1e-5, 1e-6)) << scale;
    got.pow(2).sum().backward();
    EXPECT_GT(gated->named_parameters()["gate.proj.weight"].grad().abs().max().item<double>(), 0);
  }
  // The default: N(0, init_std), scale 1 (scores near, not at, 0.5).
  ModelConfig normal = base;
  normal.mutable_gate()->set_position(GATE_G1);
  EXPECT_EQ(normal.gate().scale(), 1.0);
  Gate gate(normal);
  EXPECT_GT(gate->named_parameters()["proj.weight"].abs().max().item<double>(), 0);
  // 3 is neither; a baseline cannot carry gate options.
  ModelConfig bad = normal;
  bad.mutable_gate()->set_scale(3);
  EXPECT_NE(std::string(ValidateModelConfig(bad).message()).find("model.gate.scale: must be 1"),
            std::string::npos);
  ModelConfig none = base;
  none.mutable_gate()->set_init(GATE_INIT_ZERO);
  EXPECT_NE(std::string(ValidateModelConfig(none).message()).find("model.gate.position: is NONE"),
            std::string::npos);
}

TEST(GateTest, AdditiveAddsScores) {
  torch::Tensor y = torch::tensor({1.0f, -2.0f});
  torch::Tensor s = torch::tensor({0.5f, 0.25f});
  EXPECT_TRUE(torch::equal(ApplyGate(y, s, GATE_ADDITIVE), torch::tensor({1.5f, -1.75f})));
}

// ---- MoE routing -------------------------------------------------------------------------------

// The chunked loss (TrainConfig.loss_chunk_tokens) against cross_entropy of the whole logits:
// the loss and both gradients within 1e-6 relative in fp32, with chunks that do not divide the
// rows (37 rows in 1, 8 and 64) and a weight used twice (tied embeddings add its lookup's
// gradient); in bf16 near the plain loss of bf16 logits.
TEST(ChunkedLossTest, EqualsTheWholeLogitsLossAndGradients) {
  torch::manual_seed(3);
  const torch::Tensor hidden0 = torch::randn({37, 16});
  const torch::Tensor weight0 = torch::randn({50, 16}) * 0.3;
  const torch::Tensor targets = torch::randint(0, 50, {37}, torch::kLong);
  const auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  const torch::Tensor h = hidden0.clone().requires_grad_(true);
  const torch::Tensor w = weight0.clone().requires_grad_(true);
  const torch::Tensor plain = torch::cross_entropy_loss(torch::matmul(h, w.t()), targets) +
                              w.index_select(0, targets.slice(0, 0, 5)).sum() * 0.01;
  plain.backward();
  for (int64_t chunk : {1, 8, 64}) {
    const torch::Tensor hc = hidden0.clone().requires_grad_(true);
    const torch::Tensor wc = weight0.clone().requires_grad_(true);
    const torch::Tensor loss = ChunkedCrossEntropy(hc, wc, targets, chunk, torch::kFloat32) +
                               wc.index_select(0, targets.slice(0, 0, 5)).sum() * 0.01;
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), plain.item<double>(), 1e-6 * plain.item<double>()) << chunk;
    EXPECT_LT(relative(hc.grad(), h.grad()), 1e-6) << "hidden, chunk " << chunk;
    EXPECT_LT(relative(wc.grad(), w.grad()), 1e-6) << "weight, chunk " << chunk;
  }
  const torch::Tensor hb = hidden0.clone().requires_grad_(true);
  const torch::Tensor wb = weight0.clone().requires_grad_(true);
  const torch::Tensor bf16 = ChunkedCrossEntropy(hb, wb, targets, 8, torch::kBFloat16);
  bf16.backward();
  const torch::Tensor plain_bf16 = torch::cross_entropy_loss(
      torch::matmul(hidden0.to(torch::kBFloat16), weight0.to(torch::kBFloat16).t())
          .to(torch::kFloat32),
      targets);
  EXPECT_NEAR(bf16.item<double>(), plain_bf16.item<double>(), 1e-5 * plain_bf16.item<double>());
  EXPECT_EQ(hb.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(wb.grad().scalar_type(), torch::kFloat32);
  EXPECT_LT(relative(hb.grad(), h.grad()), 0.05);
  EXPECT_THROW(ChunkedCrossEntropy(hidden0, weight0, targets.slice(0, 0, 3), 8, torch::kFloat32),
               c10::Error);
}

TEST(MoETest, RoutesEachTokenToExactlyTopKExperts) {
  torch::manual_seed(5);
  ModelConfig c = TinyMoe();
  MoE moe(c);
  const int64_t d = c.d_model(), k = c.moe().top_k(), N = 40;
  torch::Tensor x = torch::randn({1, N, d});
  MoEImpl::Routing r = moe->Route(x.view({N, d}));
  ASSERT_EQ(r.experts.sizes(), (std::vector<int64_t>{N, k}));
  EXPECT_TRUE(torch::allclose(r.weights.sum(-1), torch::ones({N}), 0, 1e-6));
  torch::Tensor aux = torch::zeros({});
  torch::Tensor out = moe->forward(x, &aux).view({N, d});
  EXPECT_GT(aux.item<double>(), 0.0);

  auto params = moe->named_parameters();
  const torch::Tensor wg = params["w_gate"], wu = params["w_up"], wd = params["w_down"];
  for (int64_t n = 0; n < N; ++n) {
    std::set<int64_t> chosen;
    torch::Tensor want = torch::zeros({d});
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = r.experts[n][j].item<int64_t>();
      chosen.insert(e);
      torch::Tensor xn = x[0][n];
      torch::Tensor h = torch::silu(torch::mv(wg[e], xn)) * torch::mv(wu[e], xn);
      want += r.weights[n][j] * torch::mv(wd[e], h);
    }
    EXPECT_EQ(static_cast<int64_t>(chosen.size()), k) << "token " << n;
    EXPECT_TRUE(torch::allclose(out[n], want, 1e-5, 1e-6)) << "token " << n;
  }
}

// The balance loss counts f_e over the step's micro-batches so far (global batch, the paper's),
// or over each micro-batch alone; P_e is always the micro-batch's own mean probability, and
// evaluation (no gradients) never touches the step's counts.
TEST(MoETest, TheGlobalBatchBalanceLossCountsTheStepsMicroBatches) {
  torch::manual_seed(6);
  ModelConfig c = TinyMoe();
  c.mutable_moe()->set_router_z_coef(0);
  const int64_t d = c.d_model(), E = c.moe().num_experts(), k = c.moe().top_k(), N = 24;
  const double coef = c.moe().load_balance_coef();
  const torch::Tensor x1 = torch::randn({1, N, d}), x2 = torch::randn({1, N, d});
  // Hand-computed: E * sum_e (assignments to e over `counted`) / (#counted x N x k) * P_e(x).
  auto expected = [&](MoE& moe, const std::vector<torch::Tensor>& counted, const torch::Tensor& x) {
    torch::NoGradGuard no_grad;
    torch::Tensor assigned = torch::zeros({E}, torch::kFloat64);
    for (const torch::Tensor& xc : counted) {
      MoEImpl::Routing r = moe->Route(xc.view({N, d}));
      assigned += torch::bincount(r.experts.reshape({-1}), {}, E).to(torch::kFloat64);
    }
    const torch::Tensor f = assigned / static_cast<double>(counted.size() * N * k);
    const torch::Tensor p = moe->Route(x.view({N, d})).probs.mean(0).to(torch::kFloat64);
    return coef * E * (f * p).sum().item<double>();
  };
  auto aux_of = [&](MoE& moe, const torch::Tensor& x) {
    torch::Tensor aux = torch::zeros({});
    moe->forward(x, &aux);
    return aux.item<double>();
  };
  for (LoadBalanceScope scope : {BALANCE_GLOBAL_BATCH, BALANCE_MICRO_BATCH}) {
    c.mutable_moe()->set_load_balance_scope(scope);
    torch::manual_seed(7);
    MoE moe(c);
    moe->BeginStep();
    EXPECT_NEAR(aux_of(moe, x1), expected(moe, {x1}, x1), 1e-6);
    {
      torch::NoGradGuard evaluation;  // counts only itself, and leaves the step's counts alone
      EXPECT_NEAR(aux_of(moe, x1), expected(moe, {x1}, x1), 1e-6);
    }
    const bool global = scope == BALANCE_GLOBAL_BATCH;
    const double second = aux_of(moe, x2);
    EXPECT_NEAR(second, global ? expected(moe, {x1, x2}, x2) : expected(moe, {x2}, x2), 1e-6);
    EXPECT_GT(std::abs(expected(moe, {x1, x2}, x2) - expected(moe, {x2}, x2)), 1e-5);
    moe->BeginStep();  // a new step: its first micro-batch counts alone again
    EXPECT_NEAR(aux_of(moe, x2), expected(moe, {x2}, x2), 1e-6);
  }
}

// YaRN (Peng et al. 2023) at factor 4 from 64 positions, head_dim 8, base 10000, worked by hand:
//   theta_i = 10000^(-i/4)          = 1, 0.1, 0.01, 0.001
//   r_i = 64 theta_i / (2 pi)       = 10.1859, 1.01859, 0.101859, 0.0101859
//   g_i = clamp((r_i - 1) / 31)     = 0.296320, 0.000600, 0, 0
//   (1 - g_i) theta_i / 4 + g_i theta_i = 0.472240, 0.0250450, 0.0025, 0.00025
//   scale = 0.1 ln 4 + 1            = 1.138629
// The fastest pair keeps most of its frequency, the slow pairs are interpolated by the factor.
TEST(RopeTest, YarnFrequenciesAndScaleMatchHandComputedValues) {
  ModelConfig c = TinyDense();
  c.set_max_seq_len(256);
  c.mutable_yarn()->set_factor(4);
  c.mutable_yarn()->set_original_seq_len(64);
  c.mutable_yarn()->set_ramp(YARN_RAMP_PAPER);
  ASSERT_TRUE(ValidateModelConfig(c).ok()) << ValidateModelConfig(c);
  const std::vector<double> plain = RopeFrequencies(c, false);
  const std::vector<double> yarn = RopeFrequencies(c, true);
  ASSERT_EQ(plain.size(), 4u);
  ASSERT_EQ(yarn.size(), 4u);
  const double want_plain[] = {1.0, 0.1, 0.01, 0.001};
  const double want_yarn[] = {0.47223991188, 0.02504497976, 0.0025, 0.00025};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(plain[i], want_plain[i], 1e-12) << i;
    EXPECT_NEAR(yarn[i], want_yarn[i], 1e-10) << i;
  }
  EXPECT_NEAR(YarnScale(c.yarn()), 1.138629436112, 1e-11);
  EXPECT_EQ(YarnScale(TinyDense().yarn()), 1.0);  // off

  // The attention layer's YaRN tables are those angles times the scale, and a YaRN pass (only
  // when asked for) changes the output.
  torch::manual_seed(3);
  Attention attn(c, 0);
  std::map<std::string, torch::Tensor> buffers;
  for (const auto& b : attn->named_buffers()) buffers[b.key()] = b.value();
  ASSERT_TRUE(buffers.count("yarn_cos") && buffers.count("yarn_sin"));
  const double scale = 1.138629436112;
  // Position 100, pair 0 (column 0 and its rotate-half twin, column 4).
  EXPECT_NEAR(buffers["yarn_cos"][100][0].item<double>(), std::cos(100 * want_yarn[0]) * scale, 1e-5);
  EXPECT_NEAR(buffers["yarn_sin"][100][4].item<double>(), std::sin(100 * want_yarn[0]) * scale, 1e-5);
  EXPECT_NEAR(buffers["rope_cos"][100][1].item<double>(), std::cos(100 * 0.1), 1e-5);
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({1, 96, c.d_model()});
  const torch::Tensor out = attn(x, nullptr);
  attn->UseYarn(true);
  const torch::Tensor scaled = attn(x, nullptr);
  attn->UseYarn(false);
  EXPECT_TRUE(torch::equal(attn(x, nullptr), out));
  EXPECT_GT((scaled - out).abs().max().item<double>(), 1e-3);
  // Without YaRN in the config there are no tables and UseYarn does nothing.
  Attention plain_attn(TinyDense(), 0);
  for (const auto& b : plain_attn->named_buffers()) EXPECT_EQ(b.key().find("yarn"), std::string::npos);
}

// The reference ramp (jquesnelle/yarn, Hugging Face's _compute_yarn_parameters), the default,
// on the same example, worked by hand:
//   i*(n) = 8 ln(64 / (2 pi n)) / (2 ln 10000): i*(32) = -0.4972 -> floor -1 -> lo 0,
//                                               i*(1) = 1.0079 -> ceil 2 -> hi 2
//   g_i = 1 - clamp((i - 0) / 2)    = 1, 0.5, 0, 0
//   (1 - g_i) theta_i / 4 + g_i theta_i = 1, 0.0625, 0.0025, 0.00025
// And at the paper's long-context setting (head_dim 128, base 1M, L 32k, factor 4): lo 23,
// hi 40; the two ramps agree outside pairs 24..39, and 15 of the 64 pairs' g differ by > 0.05.
TEST(RopeTest, TheReferenceRampIsLinearInTheIndex) {
  ModelConfig c = TinyDense();
  c.set_max_seq_len(256);
  c.mutable_yarn()->set_factor(4);
  c.mutable_yarn()->set_original_seq_len(64);
  ASSERT_EQ(c.yarn().ramp(), YARN_RAMP_REFERENCE);  // the default
  const std::vector<double> yarn = RopeFrequencies(c, true);
  const double want[] = {1.0, 0.0625, 0.0025, 0.00025};
  ASSERT_EQ(yarn.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(yarn[i], want[i], 1e-15) << i;

  ModelConfig paper = DefaultModelConfig();
  paper.set_head_dim(128);
  paper.set_rope_base(1e6);
  paper.set_max_seq_len(32768);
  paper.mutable_yarn()->set_factor(4);
  paper.mutable_yarn()->set_original_seq_len(32768);
  const std::vector<double> reference = RopeFrequencies(paper, true);
  paper.mutable_yarn()->set_ramp(YARN_RAMP_PAPER);
  const std::vector<double> by_turns = RopeFrequencies(paper, true);
  const std::vector<double> theta = RopeFrequencies(paper, false);
  ASSERT_EQ(reference.size(), 64u);
  int differ = 0;
  for (int i = 0; i < 64; ++i) {
    // g from a frequency: (f - theta / 4) / (theta - theta / 4).
    const auto g = [&](double f) { return (f - theta[i] / 4) / (theta[i] * 0.75); };
    // The ramp: 1 up to index 23, 0 from 40, linear between.
    const double want = i <= 23 ? 1.0 : i >= 40 ? 0.0 : 1.0 - (i - 23) / 17.0;
    EXPECT_NEAR(g(reference[i]), want, 1e-12) << i;
    if (i <= 23 || i >= 40) {
      EXPECT_NEAR(reference[i], by_turns[i], 1e-15) << i;
    }
    differ += std::abs(g(reference[i]) - g(by_turns[i])) > 0.05;
  }
  EXPECT_EQ(differ, 15);
  EXPECT_NEAR(reference[31], 0.0008029597275452302, 1e-15);
  EXPECT_NEAR(by_turns[31], 0.000474510336686591, 1e-15);
}

TEST(RopeTest, YarnConfigErrorsNameTheField) {
  ModelConfig c = TinyDense();
  c.mutable_yarn()->set_factor(0.5);
  c.mutable_yarn()->set_original_seq_len(64);
  const std::string message(ValidateModelConfig(c).message());
  EXPECT_NE(message.find("model.yarn.factor: must be 0 (off) or in (1, 1e6], got 0.5"), std::string::npos) << message;
  EXPECT_NE(message.find("model.yarn.original_seq_len: must be in [1, max_seq_len = 16]"), std::string::npos) << message;
  ModelConfig no_factor = TinyDense();
  no_factor.mutable_yarn()->set_original_seq_len(8);
  EXPECT_NE(std::string(ValidateModelConfig(no_factor).message()).find("model.yarn.factor: is 0 (off)"),
            std::string::npos);
}

// The attention maps a recorder keeps: heads 0..n-1 of the first window of the first call per
// layer, over at most 64 positions, as round(255 p): causal rows that sum to about 255.
TEST(ProbesTest, AttentionMapsAreTheFirstWindowsCausalProbabilities) {
  torch::manual_seed(4);
  ModelConfig c = TinyDense();
  c.set_max_seq_len(80);
  Transformer model(c);
  torch::NoGradGuard no_grad;
  ProbeRecorder recorder(c, /*map_heads=*/3);
  model->forward(torch::randint(0, c.vocab_size(), {2, 80}), &recorder);
  model->forward(torch::randint(0, c.vocab_size(), {2, 80}), &recorder);  // ignored
  std::vector<AttentionMap> maps = recorder.TakeAttentionMaps();
  ASSERT_EQ(maps.size(), 8u);  // 2 layers x (the mean over the 4 heads, heads 0..2)
  for (size_t i = 0; i < maps.size(); ++i) {
    const AttentionMap& m = maps[i];
    EXPECT_EQ(m.layer(), static_cast<int>(i / 4));
    EXPECT_EQ(m.head(), static_cast<int>(i % 4) - 1);
    ASSERT_EQ(m.size(), 64);
    ASSERT_EQ(m.probs().size(), 64u * 64u);
    const auto* p = reinterpret_cast<const uint8_t*>(m.probs().data());
    EXPECT_EQ(p[0], 255);  // query 0 sees only key 0
    for (int q = 0; q < 64; ++q) {
      int sum = 0;
      for (int k = 0; k < 64; ++k) {
        if (k > q) {
          EXPECT_EQ(p[q * 64 + k], 0) << q << "," << k;
        }
        sum += p[q * 64 + k];
      }
      EXPECT_NEAR(sum, 255, (q + 1) / 2.0 + 1) << "row " << q;  // rounding of q + 1 entries
    }
  }
  EXPECT_TRUE(recorder.TakeAttentionMaps().empty());
  // -1: every head, and the layer's mean is the mean of its heads (within the bytes' rounding).
  ProbeRecorder every(c, /*map_heads=*/-1);
  model->forward(torch::randint(0, c.vocab_size(), {1, 80}), &every);
  maps = every.TakeAttentionMaps();
  ASSERT_EQ(maps.size(), 10u);  // 2 layers x (mean + 4 heads)
  for (int layer = 0; layer < 2; ++layer) {
    const AttentionMap& mean = maps[layer * 5];
    ASSERT_EQ(mean.head(), -1);
    for (int i = 0; i < 64 * 64; ++i) {
      double sum = 0;
      for (int h = 1; h <= 4; ++h) sum += static_cast<uint8_t>(maps[layer * 5 + h].probs()[i]);
      EXPECT_NEAR(static_cast<uint8_t>(mean.probs()[i]), sum / 4, 1.0) << layer << " " << i;
    }
  }
  ProbeRecorder none(c);
  model->forward(torch::randint(0, c.vocab_size(), {1, 8}), &none);
  EXPECT_TRUE(none.TakeAttentionMaps().empty());
}

}  // namespace
}  // namespace ablate
