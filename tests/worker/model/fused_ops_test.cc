// The fused CPU kernels against the eager LibTorch reference: forward values and every gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/model/fused_ops.h"

namespace ablate {
namespace {

// Runs f and g on the same inputs with the same upstream gradient; compares outputs and grads.
void ExpectSameWithGrads(const std::vector<torch::Tensor>& inputs,
                         const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fused,
                         const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& ref) {
  auto run = [&](const auto& f, torch::Tensor* out, std::vector<torch::Tensor>* grads) {
    std::vector<torch::Tensor> xs;
    for (const torch::Tensor& x : inputs) xs.push_back(x.detach().clone().requires_grad_(true));
    *out = f(xs);
    torch::manual_seed(99);
    (*out * torch::randn_like(*out)).sum().backward();
    for (const torch::Tensor& x : xs) grads->push_back(x.grad());
  };
  torch::Tensor a, b;
  std::vector<torch::Tensor> ga, gb;
  run(fused, &a, &ga);
  run(ref, &b, &gb);
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5)) << (a - b).abs().max();
  for (size_t i = 0; i < ga.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ga[i], gb[i], 1e-4, 1e-5)) << "input " << i << ": "
                                                           << (ga[i] - gb[i]).abs().max();
  }
}

TEST(FusedOpsTest, RmsNormMatchesEager) {
  torch::manual_seed(1);
  for (auto shape : {std::vector<int64_t>{3, 5, 32}, std::vector<int64_t>{2, 7, 4, 16}}) {
    ExpectSameWithGrads(
        {torch::randn(shape) * 3, torch::rand({shape.back()}) + 0.5},
        [](const auto& x) { return RmsNorm(x[0], x[1], 1e-6); },
        [](const auto& x) { return reference::RmsNorm(x[0], x[1], 1e-6); });
  }
  // A non-contiguous input (a slice of a wider projection) too.
  torch::Tensor wide = torch::randn({2, 6, 48});
  ExpectSameWithGrads({wide}, [](const auto& x) { return RmsNorm(x[0].slice(2, 16, 48), torch::ones({32}), 1e-6); },
                      [](const auto& x) { return reference::RmsNorm(x[0].slice(2, 16, 48), torch::ones({32}), 1e-6); });
}

TEST(FusedOpsTest, RopeToHeadsMatchesEager) {
  torch::manual_seed(2);
  const int64_t T = 9, d = 8;
  torch::Tensor inv = torch::pow(10000.0, -torch::arange(0, d, 2, torch::kFloat64) / d);
  torch::Tensor ang = torch::outer(torch::arange(12, torch::kFloat64), inv);
  ang = torch::cat({ang, ang}, -1);
  const torch::Tensor cos = ang.cos().to(torch::kFloat32), sin = ang.sin().to(torch::kFloat32);
  for (double scale : {1.0, 0.25}) {
    ExpectSameWithGrads(
        {torch::randn({2, T, 3, d})},
        [&](const auto& x) { return RopeToHeads(x[0], cos, sin, scale); },
        [&](const auto& x) { return reference::RopeToHeads(x[0], cos, sin, scale); });
  }
}

TEST(FusedOpsTest, SiluMulMatchesEager) {
  torch::manual_seed(3);
  ExpectSameWithGrads({torch::randn({4, 5, 33}) * 4, torch::randn({4, 5, 33})},
                      [](const auto& x) { return SiluMul(x[0], x[1]); },
                      [](const auto& x) { return reference::SiluMul(x[0], x[1]); });
}

TEST(FusedOpsTest, SigmoidGateMatchesEagerElementwiseAndHeadwise) {
  torch::manual_seed(4);
  for (int64_t p : {8, 1}) {
    ExpectSameWithGrads({torch::randn({2, 5, 3, 8}), torch::randn({2, 5, 3, p}) * 3},
                        [](const auto& x) { return SigmoidGate(x[0], x[1]); },
                        [](const auto& x) { return reference::SigmoidGate(x[0], x[1]); });
  }
}

}  // namespace
}  // namespace ablate
