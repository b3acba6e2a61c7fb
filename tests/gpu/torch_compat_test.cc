// worker/model/torch_compat.h on whatever LibTorch this build has (Debian's 1.13 in CI): the
// autocast switch, the reason attention on a CPU tensor keeps the model's own kernel, and the
// once-per-key log. The CUDA side (the fused attention itself) is tests/gpu/gpu_parity_test.cc.
#include "worker/model/torch_compat.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>
#include <string>

namespace ablate {
namespace {

TEST(TorchCompatTest, VersionIsTheHeadersOne) {
  EXPECT_EQ(std::string(compat::TorchVersion()), TORCH_VERSION);
  EXPECT_EQ(compat::kHasScaledDotProductAttention, ABLATE_TORCH_AT_LEAST(2, 1));
}

TEST(TorchCompatTest, SetCudaAutocastTogglesTheThreadsSwitch) {
  ASSERT_FALSE(compat::CudaAutocastEnabled());
  compat::SetCudaAutocast(true, at::kBFloat16);
  EXPECT_TRUE(compat::CudaAutocastEnabled());
  EXPECT_EQ(compat::CudaAutocastDtype(), at::kBFloat16);
  // A CPU tensor is not cast: CUDA autocast leaves CPU work in fp32.
  const torch::Tensor a = torch::randn({4, 4});
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
  compat::SetCudaAutocast(false);
  EXPECT_FALSE(compat::CudaAutocastEnabled());
}

TEST(TorchCompatTest, AttentionOnTheCpuKeepsTheModelsKernel) {
  const torch::Tensor q = torch::randn({1, 2, 4, 8});
  EXPECT_EQ(compat::FusedAttentionBlocker(q, false), "on the CPU");
  EXPECT_EQ(compat::FusedAttentionBlocker(q, true), "on the CPU");
  EXPECT_THROW(compat::FusedCausalAttention(q, torch::randn({1, 1, 4, 8}),
                                            torch::randn({1, 4, 1, 8})),
               c10::Error);
}

TEST(TorchCompatTest, LogOnceWritesOneTimestampedLinePerKey) {
  // Keys never logged before in this process: fresh allocations, kept (as LogOnce keeps keys).
  const int* first = new int(0);
  const int* second = new int(0);
  ::testing::internal::CaptureStderr();
  compat::LogOnce(first, "model: one");
  compat::LogOnce(first, "model: one again");
  compat::LogOnce(second, "model: two");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::regex_match(
      err, std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d model: one\n)"
                      R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d model: two\n)")))
      << err;
}

}  // namespace
}  // namespace ablate
