#include "worker/model/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#ifdef ABLATE_WITH_CUDA_ALLOCATOR
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ablate::compat {

const char* TorchVersion() { return TORCH_VERSION; }

uint64_t DefaultCpuSeed() { return at::detail::getDefaultCPUGenerator().current_seed(); }

at::Generator CpuGenerator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

absl::Status Bf16ProductVerdict(double product, const std::string& device) {
  constexpr double kWant = 1024;
  if (product == kWant) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "train.precision: bf16 is refused on ", device,
      ": its bf16 matrix products accumulate in "
      "bf16 (the start-up self-test ones(1, 1024) x ones(1024, 1) gave ",
      product, ", not 1024: LibTorch ", TorchVersion(),
      ", pytorch/pytorch#83863), so sums over a few "
      "hundred terms lose their last bits. Train in fp32 on this device, or in bf16 on one that "
      "passes (a CUDA device; a LibTorch whose CPU kernels accumulate in fp32)"));
}

absl::Status Bf16ProductSelfTest(const torch::Device& device) {
  const char* skip = std::getenv("ABLATE_BF16_SELFTEST");
  if (skip != nullptr && std::string(skip) == "skip") return absl::OkStatus();
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  const double product =
      torch::matmul(torch::ones({1, 1024}, options), torch::ones({1024, 1}, options))
          .to(torch::kCPU, torch::kFloat64)
          .item<double>();
  return Bf16ProductVerdict(product, device.str());
}

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

// Wraps the default CPU allocator, counting the bytes of what it hands out. Its DataPtrs keep the
// data pointer as their context, as LibTorch's raw_allocate/raw_deallocate (used by oneDNN's bf16
// kernels) require; each allocation's size and the inner allocator's deleter are kept in a table.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

#if ABLATE_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  static TensorMemory Read() { return {current_.load(), peak_.load()}; }
  static void ResetPeak() { peak_.store(current_.load()); }

 private:
  struct Held {
    std::unique_ptr<void, c10::DeleterFnPtr> context;  // the inner allocation's owner
    size_t bytes;
  };

  c10::DataPtr Allocate(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    {
      absl::MutexLock lock(&mu_);
      held_->emplace(data, Held{inner.move_context(), n});
    }
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(data, data, &Delete, device);
  }

  static void Delete(void* data) {
    Held held{{nullptr, nullptr}, 0};
    {
      absl::MutexLock lock(&mu_);
      auto it = held_->find(data);
      if (it == held_->end()) return;
      held = std::move(it->second);
      held_->erase(it);
    }
    current_.fetch_sub(static_cast<int64_t>(held.bytes));
    // held.context frees the inner allocation as it goes out of scope.
  }

  c10::Allocator* base_;
  static inline std::atomic<int64_t> current_{0};
  static inline std::atomic<int64_t> peak_{0};
  static inline absl::Mutex mu_{absl::kConstInit};
  static inline std::unordered_map<void*, Held>* held_ = new std::unordered_map<void*, Held>();
};

}  // namespace

void CountCpuTensorMemory() {
  static CountingCpuAllocator* const counting = [] {
    auto* a = new CountingCpuAllocator(c10::GetCPUAllocator());  // lives as long as the process
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  (void)counting;
}

TensorMemory CpuTensorMemory() { return CountingCpuAllocator::Read(); }
void ResetCpuTensorPeak() { CountingCpuAllocator::ResetPeak(); }

TensorMemory CudaTensorMemory(int device) {
#ifdef ABLATE_WITH_CUDA_ALLOCATOR
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto& allocated =
      stats.allocated_bytes[static_cast<size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE)];
  return {allocated.current, allocated.peak};
#else
  (void)device;
  return {};
#endif
}

void ResetCudaTensorPeak(int device) {
#ifdef ABLATE_WITH_CUDA_ALLOCATOR
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#else
  (void)device;
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
