// The model on CUDA against the model on the CPU, for every variant: the same weights and tokens
// give the same loss, logits and gradients within a stated tolerance (docs/gpu.md).
//
//   fp32 on CUDA (the fused SDPA path of torch_compat.h when LibTorch >= 2.1) vs fp32 on the CPU:
//       logits within 1e-4 and the whole gradient within 1e-3, relative (||a - b|| / ||b||): the
//       same arithmetic in another order (fp32 lands far under 1e-3, docs/gpu.md).
//   bf16 autocast on CUDA (what a run with precision BF16_AUTOCAST trains in) vs fp32 on the CPU:
//       logits within 2e-2 and the whole gradient within 5e-2 on the dense base; bf16 operands
//       land between 1e-3 and 1e-2 per product, and a 2-layer model with its backward compounds
//       a few of them. The MoE base gets 5e-2 and 1e-1: bf16 can flip a token's top-k choice
//       when two router scores nearly tie, which moves that token's output by a whole expert.
//   bf16 as Megatron-LM trains (precision BF16: fp32 weights, the residual stream in bf16) on
//       CUDA vs fp32 on the CPU: logits within 5e-2 and the gradient within 1e-1 (MoE 1e-1 and
//       2e-1): a bf16 residual stream rounds every add, which autocast's fp32 one does not; the
//       residual after every block is bf16.
//   The unfused attention (what runs when probes are recorded) vs the fused one, both on CUDA
//       fp32: logits within 1e-5.
//
// Every check needs a CUDA device: without one (any CPU-only machine) each test is skipped and
// says why, and tests/CMakeLists.txt registers this binary with ctest only for a CUDA LibTorch,
// with gtest's skip counted as a skip, never as a pass. Run it by hand or through
// bench/gpu/run_device_checks.sh.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/presets.h"
#include "tests/test_configs.h"
#include "worker/model/fused_ops.h"
#include "worker/model/probes.h"
#include "worker/model/torch_compat.h"
#include "worker/model/transformer.h"

namespace ablate {
namespace {

bool HaveCuda() { return torch::cuda::is_available(); }

#define SKIP_WITHOUT_CUDA()                                                                     \
  if (!HaveCuda())                                                                              \
  GTEST_SKIP() << "no CUDA device visible to LibTorch " << compat::TorchVersion()               \
               << ": this test compares the model on CUDA with the CPU (docs/gpu.md)"

// ||a - b|| / ||b||, in fp64.
double RelErr(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kCPU, torch::kFloat64);
  const torch::Tensor y = b.to(torch::kCPU, torch::kFloat64);
  return ((x - y).norm() / y.norm().clamp_min(1e-30)).item<double>();
}

// The parity shapes: large enough for the fused kernels (d_k 32, 64 positions, GQA 4 / 2 heads),
// small enough for every variant in seconds.
ModelConfig ParityBase(bool moe) {
  ModelConfig c = moe ? TinyMoe() : TinyDense();
  c.set_vocab_size(256);
  c.set_d_model(64);
  c.set_head_dim(32);
  c.set_max_seq_len(64);
  if (!moe) c.set_ffn_dim(128);
  return c;
}

std::vector<VariantCase> ParityCases() {
  std::vector<VariantCase> cases;
  for (const bool moe : {false, true}) {
    for (const VariantPreset& preset : AllVariantPresets()) {
      ModelConfig c = ParityBase(moe);
      if (!preset.apply(&c).ok() || !ValidateModelConfig(c).ok()) continue;
      std::string name = std::string(moe ? "moe_" : "dense_") + preset.name;
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      cases.push_back({name, c});
    }
  }
  return cases;
}

struct Pass {
  torch::Tensor loss, logits;                 // CPU fp64
  std::map<std::string, torch::Tensor> grads;  // CPU fp64, by parameter name
  torch::Tensor flat_grad;                    // every gradient, concatenated
};

// One forward and backward of a model built with `seed` on `device`.
Pass ForwardBackward(const ModelConfig& config, uint64_t seed, const torch::Tensor& tokens,
         const torch::Tensor& targets, torch::Device device, bool bf16_autocast,
         bool probes = false, bool bf16 = false) {
  torch::manual_seed(seed);
  Transformer model(config);  // initialised on the CPU: the same weights for every device
  model->to(device);
  if (bf16) model->SetComputeDtype(torch::kBFloat16);
  model->train();
  const int64_t V = config.vocab_size();
  ProbeRecorder recorder(config);
  if (bf16_autocast) compat::SetCudaAutocast(true, at::kBFloat16);
  auto out = model->forward(tokens.to(device), probes ? &recorder : nullptr);
  torch::Tensor loss = torch::cross_entropy_loss(out.logits.view({-1, V}).to(torch::kFloat32),
                                                 targets.to(device).view({-1})) +
                       out.aux_loss;
  if (bf16_autocast) compat::SetCudaAutocast(false);
  loss.backward();
  Pass p;
  p.loss = loss.detach().to(torch::kCPU, torch::kFloat64);
  p.logits = out.logits.detach().to(torch::kCPU, torch::kFloat64);
  std::vector<torch::Tensor> flat;
  for (const auto& named : model->named_parameters()) {
    const torch::Tensor& g = named.value().grad();
    if (!g.defined()) continue;
    p.grads[named.key()] = g.to(torch::kCPU, torch::kFloat64);
    flat.push_back(p.grads[named.key()].reshape({-1}));
  }
  p.flat_grad = torch::cat(flat);
  return p;
}

class GpuParityTest : public ::testing::TestWithParam<VariantCase> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_CUDA();
    torch::manual_seed(3);
    const int64_t V = config().vocab_size();
    tokens_ = torch::randint(0, V, {2, 64}, torch::kLong);
    targets_ = torch::randint(0, V, {2, 64}, torch::kLong);
    cpu_ = ForwardBackward(config(), 17, tokens_, targets_, torch::kCPU, false);
  }
  const ModelConfig& config() const { return GetParam().config; }
  bool moe() const { return config().moe().num_experts() > 0; }

  void ExpectClose(const Pass& got, double logits_tol, double grad_tol) {
    EXPECT_TRUE(torch::isfinite(got.logits).all().item<bool>());
    const double logits_err = RelErr(got.logits, cpu_.logits);
    const double grad_err = RelErr(got.flat_grad, cpu_.flat_grad);
    EXPECT_LE(logits_err, logits_tol) << "logits";
    EXPECT_LE(grad_err, grad_tol) << "gradient";
    EXPECT_NEAR(got.loss.item<double>(), cpu_.loss.item<double>(),
                logits_tol * cpu_.loss.item<double>());
    ASSERT_EQ(got.grads.size(), cpu_.grads.size());
    for (const auto& [name, g] : cpu_.grads) ASSERT_TRUE(got.grads.count(name)) << name;
    // One line per variant in the log: the margins, not only pass/fail.
    std::printf("[ parity   ] %s: logits %.2e, gradient %.2e (limits %.0e, %.0e)\n",
                GetParam().name.c_str(), logits_err, grad_err, logits_tol, grad_tol);
  }

  torch::Tensor tokens_, targets_;
  Pass cpu_;
};

TEST_P(GpuParityTest, Fp32OnCudaMatchesCpu) {
  ExpectClose(ForwardBackward(config(), 17, tokens_, targets_, torch::kCUDA, false), 1e-4, 1e-3);
}

TEST_P(GpuParityTest, Bf16AutocastOnCudaMatchesCpuFp32) {
  ExpectClose(ForwardBackward(config(), 17, tokens_, targets_, torch::kCUDA, true),
              moe() ? 5e-2 : 2e-2, moe() ? 1e-1 : 5e-2);
}

TEST_P(GpuParityTest, Bf16OnCudaMatchesCpuFp32AndKeepsTheResidualInBf16) {
  ExpectClose(ForwardBackward(config(), 17, tokens_, targets_, torch::kCUDA, false, false, true),
              moe() ? 1e-1 : 5e-2, moe() ? 2e-1 : 1e-1);
  torch::NoGradGuard no_grad;
  Transformer model(config());
  model->to(torch::kCUDA);
  model->SetComputeDtype(torch::kBFloat16);
  ProbeRecorder probes(config());
  model->forward(tokens_.to(torch::kCUDA), &probes);
  ASSERT_EQ(probes.ResidualDtypes().size(), static_cast<size_t>(config().num_layers()));
  for (const std::string& dtype : probes.ResidualDtypes()) EXPECT_EQ(dtype, "BFloat16");
}

TEST_P(GpuParityTest, UnfusedAttentionWithProbesMatchesFused) {
  const Pass fused = ForwardBackward(config(), 17, tokens_, targets_, torch::kCUDA, false);
  const Pass unfused =
      ForwardBackward(config(), 17, tokens_, targets_, torch::kCUDA, false, /*probes=*/true);
  EXPECT_LE(RelErr(unfused.logits, fused.logits), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, GpuParityTest, ::testing::ValuesIn(ParityCases()),
                         [](const auto& info) { return info.param.name; });

// The shim itself, on random inputs: LibTorch's SDPA against the eager reference in fp64.
TEST(FusedAttentionTest, MatchesTheReferenceInFp32AndBf16) {
  SKIP_WITHOUT_CUDA();
  const torch::Tensor probe = torch::zeros({1}, torch::kCUDA);
  if (!compat::kHasScaledDotProductAttention) {
    EXPECT_NE(compat::FusedAttentionBlocker(probe, false), "");
    GTEST_SKIP() << "LibTorch " << compat::TorchVersion() << ": "
                 << compat::FusedAttentionBlocker(probe, false);
  }
  EXPECT_EQ(compat::FusedAttentionBlocker(probe, false), "");
  EXPECT_NE(compat::FusedAttentionBlocker(probe, true), "");
  EXPECT_NE(compat::FusedAttentionBlocker(torch::zeros({1}), false), "");
  torch::manual_seed(5);
  const int64_t B = 2, H = 8, KV = 2, T = 256, dk = 64;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor q = torch::randn({B, H, T, dk}, torch::kFloat64) / 8;
    const torch::Tensor k = torch::randn({B, KV, T, dk}, torch::kFloat64);
    const torch::Tensor v = torch::randn({B, T, KV, dk}, torch::kFloat64);
    const torch::Tensor mask =
        torch::full({T, T}, -std::numeric_limits<double>::infinity(), torch::kFloat64).triu(1);
    const torch::Tensor want = reference::CausalAttention(q, k, v, mask).first;
    auto dev = [&](const torch::Tensor& t) { return t.to(torch::kCUDA, dtype); };
    const torch::Tensor got = compat::FusedCausalAttention(dev(q), dev(k), dev(v));
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE(RelErr(got, want), dtype == torch::kFloat32 ? 1e-5 : 1e-2) << dtype;
  }
}

}  // namespace
}  // namespace ablate
