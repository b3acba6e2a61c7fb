// The fused CPU kernels against the eager LibTorch reference: forward values and every gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

#include "worker/model/fused_ops.h"
#include "worker/model/torch_compat.h"

namespace ablate {
namespace {

using Op = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// f's output, then each input's gradient under the same upstream gradient (seed 99).
std::vector<torch::Tensor> OutputAndGrads(const std::vector<torch::Tensor>& inputs, const Op& f) {
  std::vector<torch::Tensor> xs;
  for (const torch::Tensor& x : inputs) xs.push_back(x.detach().clone().requires_grad_(true));
  const torch::Tensor out = f(xs);
  torch::manual_seed(99);
  (out * torch::randn_like(out)).sum().backward();
  std::vector<torch::Tensor> r = {out.detach()};
  for (const torch::Tensor& x : xs) r.push_back(x.grad());
  return r;
}

// Runs f and g on the same inputs with the same upstream gradient; compares outputs and grads.
void ExpectSameWithGrads(const std::vector<torch::Tensor>& inputs, const Op& fused, const Op& ref) {
  const std::vector<torch::Tensor> got = OutputAndGrads(inputs, fused);
  const std::vector<torch::Tensor> want = OutputAndGrads(inputs, ref);
  const torch::Tensor &a = got[0], &b = want[0];
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5)) << (a - b).abs().max();
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-5))
        << "input " << i - 1 << ": " << (got[i] - want[i]).abs().max();
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

// Sets LibTorch's intra-op threads for a scope.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : before_(torch::get_num_threads()) { torch::set_num_threads(n); }
  ~IntraOpThreads() { torch::set_num_threads(before_); }

 private:
  int before_;
};

// at::parallel_for is inline and runs serially unless the kernels' file is compiled with OpenMP:
// built without it, every kernel ran on one thread whatever --threads said.
TEST(FusedOpsTest, KernelsUseTheIntraOpThreads) {
  {
    IntraOpThreads three(3);
    EXPECT_EQ(KernelThreads(), 3) << "the fused kernels were built without OpenMP";
  }
  IntraOpThreads one(1);
  EXPECT_EQ(KernelThreads(), 1);
}

// Each kernel with inputs large enough to be split between 3 threads (its grain is 16,384 floats
// of work): the same values and gradients as eager, and the same bits run twice (each thread
// sums its own rows, in a fixed order).
TEST(FusedOpsTest, MatchEagerSplitBetweenThreads) {
  IntraOpThreads three(3);
  torch::manual_seed(6);
  auto twice_the_same = [](const std::vector<torch::Tensor>& inputs, const Op& f) {
    const std::vector<torch::Tensor> first = OutputAndGrads(inputs, f);
    const std::vector<torch::Tensor> second = OutputAndGrads(inputs, f);
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(torch::equal(first[i], second[i])) << "tensor " << i << " differs";
    }
  };
  const std::vector<torch::Tensor> norm = {torch::randn({4, 400, 32}) * 3,
                                           torch::rand({32}) + 0.5};
  const Op rms = [](const auto& x) { return RmsNorm(x[0], x[1], 1e-6); };
  ExpectSameWithGrads(norm, rms, [](const auto& x) { return reference::RmsNorm(x[0], x[1], 1e-6); });
  twice_the_same(norm, rms);
  // RMSNorm's weight gradient sums its rows in chunks fixed by the shape: the same bits on one
  // thread as on three.
  auto weight_grad = [&](int threads) {
    IntraOpThreads n(threads);
    return OutputAndGrads(norm, rms)[2];
  };
  EXPECT_TRUE(torch::equal(weight_grad(1), weight_grad(3)));

  const int64_t T = 130, d = 8;
  torch::Tensor inv = torch::pow(10000.0, -torch::arange(0, d, 2, torch::kFloat64) / d);
  torch::Tensor ang = torch::outer(torch::arange(T, torch::kFloat64), inv);
  ang = torch::cat({ang, ang}, -1);
  const torch::Tensor cos = ang.cos().to(torch::kFloat32), sin = ang.sin().to(torch::kFloat32);
  ExpectSameWithGrads({torch::randn({9, T, 4, d})},  // 1,170 rows of 32 floats: 3 x 390
                      [&](const auto& x) { return RopeToHeads(x[0], cos, sin, 0.5); },
                      [&](const auto& x) { return reference::RopeToHeads(x[0], cos, sin, 0.5); });

  const std::vector<torch::Tensor> silu = {torch::randn({4, 100, 129}) * 4,
                                           torch::randn({4, 100, 129})};
  ExpectSameWithGrads(silu, [](const auto& x) { return SiluMul(x[0], x[1]); },
                      [](const auto& x) { return reference::SiluMul(x[0], x[1]); });
  for (int64_t p : {64, 1}) {
    const std::vector<torch::Tensor> gate = {torch::randn({4, 200, 4, 64}),
                                             torch::randn({4, 200, 4, p}) * 3};
    const Op fused = [](const auto& x) { return SigmoidGate(x[0], x[1]); };
    ExpectSameWithGrads(gate, fused,
                        [](const auto& x) { return reference::SigmoidGate(x[0], x[1]); });
    twice_the_same(gate, fused);
  }
}

// In bf16 (PRECISION_BF16) the reference attention takes its scores and softmax in fp32: its
// probabilities are those of the fp32 scores of the same bf16 queries and keys, where scores
// rounded to bf16 would be off by up to 2^-9 of their size.
// The BF16 start-up self-test (compat::Bf16ProductSelfTest). Its refusal, forced with the value
// LibTorch 1.13's CPU fallback gives (a sum of 1024 ones in bf16 stops at 256), names the field,
// the value and the way out; on this machine's kernels its verdict is the product's own value;
// ABLATE_BF16_SELFTEST=skip skips it.
TEST(FusedOpsTest, Bf16SelfTestRefusesProductsThatAccumulateInBf16) {
  EXPECT_TRUE(compat::Bf16ProductVerdict(1024, "cpu").ok());
  const absl::Status refused = compat::Bf16ProductVerdict(256, "cpu");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  for (const char* words : {"train.precision: bf16 is refused on cpu", "gave 256, not 1024",
                            "Train in fp32 on this device"}) {
    EXPECT_NE(refused.message().find(words), std::string::npos) << refused;
  }
  ::unsetenv("ABLATE_BF16_SELFTEST");
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const double product =
      torch::matmul(torch::ones({1, 1024}, bf16), torch::ones({1024, 1}, bf16)).item<double>();
  const absl::Status here = compat::Bf16ProductSelfTest(torch::kCPU);
  EXPECT_EQ(here.ok(), product == 1024) << "product " << product << ": " << here;
  if (!here.ok()) EXPECT_NE(here.message().find(absl::StrCat("gave ", product)), std::string::npos);
  ::setenv("ABLATE_BF16_SELFTEST", "skip", 1);
  EXPECT_TRUE(compat::Bf16ProductSelfTest(torch::kCPU).ok());
  ::unsetenv("ABLATE_BF16_SELFTEST");
}

TEST(FusedOpsTest, Bf16AttentionScoresAreComputedInFp32) {
  torch::manual_seed(9);
  const int64_t B = 1, H = 2, T = 24, dk = 32;
  const torch::Tensor mask =
      torch::full({T, T}, -std::numeric_limits<double>::infinity(), torch::kFloat32).triu(1);
  const torch::Tensor q = (torch::randn({B, H, T, dk}) * 3).to(torch::kBFloat16);
  const torch::Tensor k = (torch::randn({B, H, T, dk}) * 3).to(torch::kBFloat16);
  const torch::Tensor v = torch::randn({B, T, H, dk}).to(torch::kBFloat16);
  auto [out, probs] = reference::CausalAttention(q, k, v, mask.to(torch::kBFloat16));
  const torch::Tensor scores =
      torch::matmul(q.to(torch::kFloat32), k.to(torch::kFloat32).transpose(-2, -1)) + mask;
  const torch::Tensor want = torch::softmax(scores, -1);
  EXPECT_EQ(probs.scalar_type(), torch::kFloat32);
  EXPECT_LT((probs - want).abs().max().item<double>(), 1e-6);
  // What bf16 scores give instead: visibly other probabilities.
  const torch::Tensor rounded =
      torch::softmax(torch::matmul(q, k.transpose(-2, -1)).to(torch::kFloat32) + mask, -1);
  EXPECT_GT((rounded - want).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
}

// The attention kernel (fp32, causal row blocks) against the eager reference run in fp64: lengths
// below, at and across the kernel's 64-row blocks, with and without grouped-query heads.
// Both ways of doing its products: BLAS's sgemm on raw pointers and ATen's (where LibTorch's BLAS
// exports no sgemm).
class CausalAttentionTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam() && !AttentionHasSgemm()) {
      GTEST_SKIP() << "this process exports no BLAS sgemm_: the kernel takes ATen's products";
    }
    UseAtenProductsForTesting(GetParam());
  }
  void TearDown() override { UseAtenProductsForTesting(false); }
};

INSTANTIATE_TEST_SUITE_P(Products, CausalAttentionTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Aten" : "Sgemm"; });

TEST_P(CausalAttentionTest, RefusesShapesThatDoNotFit) {
  const torch::Tensor q = torch::randn({2, 4, 8, 16}), k = torch::randn({2, 2, 8, 16});
  const torch::Tensor v = torch::randn({2, 8, 2, 16});
  const torch::Tensor mask = torch::full({8, 8}, -std::numeric_limits<float>::infinity()).triu(1);
  EXPECT_NO_THROW(CausalAttention(q, k, v, mask, false));
  EXPECT_THROW(CausalAttention(q, k, v, mask.narrow(0, 0, 7), false), c10::Error);  // mask (7, 8)
  EXPECT_THROW(CausalAttention(q, k.narrow(2, 0, 7), v, mask, false), c10::Error);  // 7 keys
  EXPECT_THROW(CausalAttention(q, torch::randn({2, 3, 8, 16}), torch::randn({2, 8, 3, 16}), mask,
                               false),
               c10::Error);  // 4 query heads for 3 KV heads
}

TEST_P(CausalAttentionTest, MatchesEagerInFp64) {
  torch::manual_seed(5);
  // One thread, and three: 8 (batch, KV head) groups split 3/3/2 between them (KV 4), 4 split
  // 2/2 (KV 2).
  for (const int threads : {1, 3}) {
    IntraOpThreads intra_op(threads);
    for (const int64_t T : {1, 7, 64, 65, 150}) {
      for (const int64_t KV : {4, 2}) {
        const int64_t B = 2, H = 4, dk = 16;
        const torch::Tensor mask =
            torch::full({T, T}, -std::numeric_limits<double>::infinity(), torch::kFloat64).triu(1);
        const torch::Tensor q = torch::randn({B, H, T, dk}, torch::kFloat64) * 0.5;
        const torch::Tensor k = torch::randn({B, KV, T, dk}, torch::kFloat64);
        const torch::Tensor v = torch::randn({B, T, KV, dk}, torch::kFloat64);
        const torch::Tensor up = torch::randn({B, T, H, dk}, torch::kFloat64);
        // {out, probs (undefined without with_probs), dq, dk, dv} in fp64.
        auto run = [&](torch::ScalarType type, bool fused, bool with_probs) {
          std::vector<torch::Tensor> in;
          for (const torch::Tensor& x : {q, k, v}) {
            in.push_back(x.to(type).clone().requires_grad_(true));
          }
          auto [out, probs] =
              fused ? CausalAttention(in[0], in[1], in[2], mask.to(type), with_probs)
                    : reference::CausalAttention(in[0], in[1], in[2], mask.to(type));
          (out * up.to(type)).sum().backward();
          std::vector<torch::Tensor> r = {out, probs};
          for (const torch::Tensor& x : in) r.push_back(x.grad());
          for (torch::Tensor& x : r) x = x.defined() ? x.detach().to(torch::kFloat64) : x;
          return r;
        };
        const std::vector<torch::Tensor> want = run(torch::kFloat64, false, true);
        for (const bool with_probs : {true, false}) {
          const std::vector<torch::Tensor> got = run(torch::kFloat32, true, with_probs);
          const char* names[] = {"out", "probs", "dq", "dk", "dv"};
          for (size_t i = 0; i < got.size(); ++i) {
            if (i == 1 && !with_probs) {
              EXPECT_FALSE(got[i].defined()) << "probs without with_probs";
              continue;
            }
            ASSERT_EQ(got[i].sizes(), want[i].sizes()) << names[i];
            EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-5))
                << names[i] << " at T " << T << ", KV " << KV << ", with_probs " << with_probs
                << ", " << threads << " threads"
                << ": " << (got[i] - want[i]).abs().max().item<double>();
          }
          // The probabilities above the diagonal are exact zeros (the probes read them).
          if (with_probs) {
            EXPECT_EQ(got[1].triu(1).abs().max().item<double>(), 0.0);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ablate
