// Probes on hand-built inputs with known answers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "config/presets.h"
#include "tests/test_configs.h"
#include "worker/model/probes.h"
#include "worker/model/transformer.h"

namespace ablate {
namespace {

void ZeroParams(Transformer& model, const std::string& suffix) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    const std::string& n = p.key();
    if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
      p.value().zero_();
    }
  }
}

Probes RunProbes(Transformer& model, const torch::Tensor& tokens) {
  model->eval();
  torch::NoGradGuard no_grad;
  ProbeRecorder recorder(model->config());
  model->forward(tokens, &recorder);
  return recorder.Finish();
}

TEST(ProbesTest, UniformAttentionGivesMeanOfInverseCounts) {
  // Zero query projections make every score 0: query i attends 1/(i+1) to key 0.
  torch::manual_seed(1);
  Transformer model(TinyDense());
  ZeroParams(model, "q_proj.weight");
  const int64_t T = 12;
  const Probes p = RunProbes(model, torch::randint(0, 64, {3, T}, torch::kLong));
  double want = 0;
  for (int64_t i = 1; i < T; ++i) want += 1.0 / (i + 1);
  want /= (T - 1);
  for (const LayerProbes& l : p.layers()) EXPECT_NEAR(l.first_token_attention(), want, 1e-6);
  EXPECT_NEAR(p.f_attn(), want, 1e-6);
}

TEST(ProbesTest, MassiveActivationIsMaxAbsOfResidualStream) {
  // With W_O and the FFN down projections zeroed, every layer outputs the embeddings.
  torch::manual_seed(2);
  Transformer model(TinyDense());
  ZeroParams(model, "o_proj.weight");
  ZeroParams(model, "down.weight");
  torch::Tensor tokens = torch::randint(0, 64, {2, 10}, torch::kLong);
  const Probes p = RunProbes(model, tokens);
  torch::Tensor embed = model->named_parameters()["embedding"];
  const double want = embed.index_select(0, tokens.view(-1)).abs().max().item<double>();
  for (const LayerProbes& l : p.layers()) {
    EXPECT_DOUBLE_EQ(l.ffn_residual_max_abs(), want);
    EXPECT_DOUBLE_EQ(l.attn_residual_max_abs(), want);
    EXPECT_EQ(l.attn_out_max_abs(), 0.0);
    EXPECT_EQ(l.ffn_out_max_abs(), 0.0);
  }
  EXPECT_DOUBLE_EQ(p.m_act(), want);
}

// No gate, no gate score: stored as NULL and shown as "—", never as a score of 0.
TEST(ProbesTest, AModelWithoutAGateHasNoGateScore) {
  torch::manual_seed(3);
  Transformer model(TinyDense());
  const Probes p = RunProbes(model, torch::randint(0, 64, {2, 8}, torch::kLong));
  EXPECT_FALSE(p.has_gate_score_mean());
  for (const LayerProbes& l : p.layers()) EXPECT_FALSE(l.has_gate());
}

TEST(ProbesTest, InputIndependentGateScoresAreHalfEverywhere) {
  ModelConfig c = TinyDense();
  ASSERT_TRUE(FindVariantPreset("g1_input_independent")->apply(&c).ok());
  torch::manual_seed(3);
  Transformer model(c);
  const Probes p = RunProbes(model, torch::randint(0, 64, {2, 8}, torch::kLong));
  EXPECT_DOUBLE_EQ(p.gate_score_mean(), 0.5);
  for (const LayerProbes& l : p.layers()) {
    ASSERT_TRUE(l.has_gate());
    EXPECT_DOUBLE_EQ(l.gate_min(), 0.5);
    EXPECT_DOUBLE_EQ(l.gate_max(), 0.5);
    EXPECT_NEAR(l.gate_std(), 0.0, 1e-9);
    // All 2*8 tokens x 4 heads x 8 elements in the bin holding 0.5 of [0, 1] in 20 bins.
    ASSERT_EQ(l.gate_histogram().counts_size(), ProbeRecorder::kHistogramBins);
    EXPECT_EQ(l.gate_histogram().counts(10), 2 * 8 * 32);
    // A constant 0.5 gate: after-gate and mean-scaled sparsity agree.
    EXPECT_DOUBLE_EQ(l.sparsity().after_gate_1e2(), l.sparsity().mean_scaled_1e2());
    EXPECT_GE(l.sparsity().after_gate_1e2(), l.sparsity().before_gate_1e2());
    // Halved by the 0.5 gate, as W_O receives it.
    EXPECT_GT(l.sparsity().mean_abs_before_gate(), 0.0);
    EXPECT_NEAR(l.sparsity().mean_abs_after_gate(), 0.5 * l.sparsity().mean_abs_before_gate(),
                1e-6 * l.sparsity().mean_abs_before_gate());
  }
}

TEST(ProbesTest, SparsityCountsThresholdsOnKnownTensors) {
  ModelConfig c = TinyDense();
  c.set_num_layers(1);
  ProbeRecorder r(c);
  // |before| = {0.0005, 0.005, 0.05, 0.5}; gate {1, 1, 0.1, 0.001}: after = {0.0005, 0.005,
  // 0.005, 0.0005}; mean gate 0.52525: scaled = {0.00026, 0.0026, 0.026, 0.26}.
  torch::Tensor before = torch::tensor({0.0005, -0.005, 0.05, -0.5}, torch::kFloat64);
  torch::Tensor gate = torch::tensor({1.0, 1.0, 0.1, 0.001}, torch::kFloat64);
  r.Sparsity(0, before, before * gate, gate);
  const Sparsity s = r.Finish().layers(0).sparsity();
  EXPECT_DOUBLE_EQ(s.before_gate_1e2(), 0.5);
  EXPECT_DOUBLE_EQ(s.before_gate_1e3(), 0.25);
  EXPECT_DOUBLE_EQ(s.after_gate_1e2(), 1.0);
  EXPECT_DOUBLE_EQ(s.after_gate_1e3(), 0.5);
  EXPECT_DOUBLE_EQ(s.mean_scaled_1e2(), 0.5);
  EXPECT_DOUBLE_EQ(s.mean_scaled_1e3(), 0.25);
  // Figure 4's mean |Y|: (0.0005 + 0.005 + 0.05 + 0.5) / 4 before, (0.0005 + 0.005 + 0.005 +
  // 0.0005) / 4 after.
  EXPECT_NEAR(s.mean_abs_before_gate(), 0.555500 / 4, 1e-12);
  EXPECT_NEAR(s.mean_abs_after_gate(), 0.0110 / 4, 1e-12);
}

TEST(ProbesTest, AccumulatesAcrossBatches) {
  torch::manual_seed(4);
  ModelConfig c = TinyDense();
  ASSERT_TRUE(FindVariantPreset("g1_elementwise")->apply(&c).ok());
  Transformer model(c);
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randint(0, 64, {2, 8}, torch::kLong);
  torch::Tensor b = torch::randint(0, 64, {2, 8}, torch::kLong);
  ProbeRecorder both(c), one_a(c), one_b(c);
  model->forward(a, &both);
  model->forward(b, &both);
  model->forward(a, &one_a);
  model->forward(b, &one_b);
  const Probes pb = both.Finish(), pa = one_a.Finish(), pbb = one_b.Finish();
  EXPECT_EQ(pb.tokens(), 32);
  for (int i = 0; i < c.num_layers(); ++i) {
    EXPECT_NEAR(pb.layers(i).gate_mean(),
                (pa.layers(i).gate_mean() + pbb.layers(i).gate_mean()) / 2, 1e-9);
    EXPECT_DOUBLE_EQ(pb.layers(i).ffn_residual_max_abs(),
                     std::max(pa.layers(i).ffn_residual_max_abs(),
                              pbb.layers(i).ffn_residual_max_abs()));
  }
}

// Per head, the sink window and the sink rate on hand-built attention (B 1, H 2, T 80): head 0
// puts 0.5 on key 0 in the first 64 positions and nothing after, head 1 0.1 everywhere. Query 0
// never counts. Two query blocks (0..39, 40..79) give what one block gives.
TEST(ProbesTest, FirstTokenAttentionPerHeadAndTheSinkRate) {
  ModelConfig c = TinyDense();
  c.set_num_layers(1);
  const int64_t T = 80;
  torch::Tensor p = torch::full({1, 2, T}, 0.1, torch::kFloat64);
  p.index_put_({0, 0, torch::indexing::Slice(0, 64)}, 0.5);
  p.index_put_({0, 0, torch::indexing::Slice(64, T)}, 0.0);
  ProbeRecorder whole(c), blocks(c), strict(c, 0, 0.6);
  whole.FirstTokenAttention(0, p, 0);
  blocks.FirstTokenAttention(0, p.slice(2, 0, 40), 0);
  blocks.FirstTokenAttention(0, p.slice(2, 40, T), 40);
  strict.FirstTokenAttention(0, p, 0);
  for (const Probes& probes : {whole.Finish(), blocks.Finish()}) {
    const LayerProbes& l = probes.layers(0);
    ASSERT_EQ(l.first_token_attention_by_head_size(), 2);
    EXPECT_NEAR(l.first_token_attention_by_head(0), 63 * 0.5 / (T - 1), 1e-12);
    EXPECT_NEAR(l.first_token_attention_by_head(1), 0.1, 1e-12);
    ASSERT_EQ(l.sink_window_attention_by_head_size(), 2);
    EXPECT_NEAR(l.sink_window_attention_by_head(0), 0.5, 1e-12);
    EXPECT_NEAR(l.sink_window_attention_by_head(1), 0.1, 1e-12);
    // The paper's F-Attn is the mean over heads.
    EXPECT_NEAR(l.first_token_attention(), (63 * 0.5 / (T - 1) + 0.1) / 2, 1e-12);
    EXPECT_DOUBLE_EQ(probes.sink_epsilon(), 0.3);
    ASSERT_TRUE(probes.has_sink_rate());
    EXPECT_DOUBLE_EQ(probes.sink_rate(), 0.5);  // head 0 of 2 is over 0.3
    EXPECT_EQ(probes.classes_size(), 0);        // no classes were set
  }
  EXPECT_DOUBLE_EQ(strict.Finish().sink_rate(), 0.0);  // at ε = 0.6 neither head is a sink
}

// Uniform attention through the model: every head the same, the window's mean its own.
TEST(ProbesTest, UniformAttentionIsTheSameInEveryHead) {
  torch::manual_seed(1);
  Transformer model(TinyDense());
  ZeroParams(model, "q_proj.weight");
  const Probes p = RunProbes(model, torch::randint(0, 64, {3, 12}, torch::kLong));
  for (const LayerProbes& l : p.layers()) {
    ASSERT_EQ(l.first_token_attention_by_head_size(), 4);
    for (double h : l.first_token_attention_by_head()) {
      EXPECT_NEAR(h, l.first_token_attention(), 1e-6);
    }
    // T = 12 < 64: the window is the whole sequence.
    for (double h : l.sink_window_attention_by_head())
      EXPECT_NEAR(h, l.first_token_attention(), 1e-6);
  }
  EXPECT_DOUBLE_EQ(p.sink_rate(), 0.0);  // a mean of 1/(t+1) over t = 1..11 is 0.21 < 0.3
}

// By query class: attention on key 0 and gate scores of each class's positions > 0; a position
// of class -1 is in none.
TEST(ProbesTest, QueryClassesSplitFirstTokenAttentionAndGateScores) {
  ModelConfig c = TinyDense();
  c.set_num_layers(1);
  ProbeRecorder r(c);
  // Positions 0..5 of one row: classes a, b, a, b, none, a.
  r.SetQueryClasses(torch::tensor({{0, 1, 0, 1, -1, 0}}, torch::kLong), {"a", "b"});
  const torch::Tensor p =
      torch::tensor({{{1.0, 0.2, 0.3, 0.4, 0.9, 0.5}, {1.0, 0.4, 0.5, 0.6, 0.9, 0.7}}},
                    torch::kFloat64);  // (1, 2 heads, 6)
  r.FirstTokenAttention(0, p, 0);
  // Scores (1, 6, 2 heads, 2 elements): position t scores 0.1 t.
  const torch::Tensor scores =
      (torch::arange(6, torch::kFloat64) * 0.1).view({1, 6, 1, 1}).expand({1, 6, 2, 2});
  r.GateScores(0, scores);
  const Probes out = r.Finish();
  const LayerProbes& l = out.layers(0);
  ASSERT_EQ(l.classes_size(), 2);
  EXPECT_EQ(l.classes(0).name(), "a");
  EXPECT_EQ(l.classes(0).queries(), 2);  // positions 2 and 5 (0 never counts)
  EXPECT_NEAR(l.classes(0).first_token_attention(), (0.3 + 0.5 + 0.5 + 0.7) / 4, 1e-12);
  EXPECT_NEAR(l.classes(0).gate_mean(), (0.2 + 0.5) / 2, 1e-12);
  EXPECT_EQ(l.classes(1).name(), "b");
  EXPECT_EQ(l.classes(1).queries(), 2);  // positions 1 and 3
  EXPECT_NEAR(l.classes(1).first_token_attention(), (0.2 + 0.4 + 0.4 + 0.6) / 4, 1e-12);
  EXPECT_NEAR(l.classes(1).gate_mean(), (0.1 + 0.3) / 2, 1e-12);
  ASSERT_EQ(out.classes_size(), 2);  // over the one layer: the same
  EXPECT_NEAR(out.classes(0).first_token_attention(), l.classes(0).first_token_attention(), 1e-12);
  EXPECT_NEAR(out.classes(1).gate_mean(), l.classes(1).gate_mean(), 1e-12);
}

}  // namespace
}  // namespace ablate
