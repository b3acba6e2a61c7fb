#include "worker/model/torch_compat.h"

#include <ATen/autocast_mode.h>

#include <cstdio>
#include <unordered_set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ablate::compat {

const char* TorchVersion() { return TORCH_VERSION; }

std::string FusedAttentionBlocker(const torch::Tensor& q, bool need_probs) {
  if (!q.is_cuda()) return "on the CPU";
  if (!kHasScaledDotProductAttention) {
    return "LibTorch " TORCH_VERSION " has no at::scaled_dot_product_attention with a scale "
           "(2.1 or later has)";
  }
  if (need_probs) {
    return "probes are recorded (F-Attn and the attention maps need the attention "
           "probabilities, which the fused kernels never form)";
  }
  return "";
}

torch::Tensor FusedCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v) {
  const std::string blocker = FusedAttentionBlocker(q, /*need_probs=*/false);
  TORCH_CHECK(blocker.empty(), "FusedCausalAttention: ", blocker);
#if ABLATE_TORCH_AT_LEAST(2, 1)
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), dk = q.size(3), KV = k.size(1);
  torch::Tensor kh = k, vh = v.transpose(1, 2);  // (B, KV, T, dk)
  if (KV != H) {  // GQA: each KV head serves H / KV consecutive query heads
    kh = kh.unsqueeze(2).expand({B, KV, H / KV, T, dk}).reshape({B, H, T, dk});
    vh = vh.unsqueeze(2).expand({B, KV, H / KV, T, dk}).reshape({B, H, T, dk});
  }
  // attn_mask none, dropout 0, causal, scale 1 (q is pre-scaled). Positional, so the call is the
  // same with 2.1's signature and with 2.5's (which appends enable_gqa = false).
  torch::Tensor out = at::scaled_dot_product_attention(q, kh, vh, /*attn_mask=*/{},
                                                       /*dropout_p=*/0.0, /*is_causal=*/true,
                                                       /*scale=*/1.0);  // (B, H, T, dk)
  return out.transpose(1, 2);  // (B, T, H, dk)
#else
  (void)k;
  (void)v;
  return torch::Tensor();  // unreachable: before 2.1 the check above refuses every tensor
#endif
}

void SetCudaAutocast(bool enabled, at::ScalarType dtype) {
#if ABLATE_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
  if (enabled) at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
  at::autocast::set_enabled(enabled);
  if (enabled) at::autocast::set_autocast_gpu_dtype(dtype);
#endif
  if (!enabled) at::autocast::clear_cache();
}

bool CudaAutocastEnabled() {
#if ABLATE_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

at::ScalarType CudaAutocastDtype() {
#if ABLATE_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(at::kCUDA);
#else
  return at::autocast::get_autocast_gpu_dtype();
#endif
}

namespace {
absl::Mutex log_mu;
std::unordered_set<const void*>* logged ABSL_GUARDED_BY(log_mu) = nullptr;
}  // namespace

void LogOnce(const void* key, const std::string& line) {
  {
    absl::MutexLock lock(&log_mu);
    if (logged == nullptr) logged = new std::unordered_set<const void*>();  // never freed
    if (!logged->insert(key).second) return;
  }
  std::fprintf(stderr, "%s %s\n",
               absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
               line.c_str());
  std::fflush(stderr);
}

}  // namespace ablate::compat
