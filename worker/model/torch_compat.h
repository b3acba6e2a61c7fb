// Every difference between the LibTorch versions ablate builds against, in one place.
//
// Two LibTorch builds matter: Debian 12's 1.13 (CPU; `make deps`, CI, the project VM) and
// PyTorch's own 2.x (a CUDA wheel's LibTorch, `torch.utils.cmake_prefix_path`, docs/gpu.md). Code
// elsewhere in worker/ calls these functions instead of testing TORCH_VERSION_* itself. What
// each shim covers, and since which version:
//
//   kHasScaledDotProductAttention / FusedCausalAttention
//       at::scaled_dot_product_attention exists from 2.0 (1.13 has only a private prototype,
//       at::_scaled_dot_product_attention); its `scale` argument from 2.1.
//       Queries arrive here already scaled (RoPE applies 1/sqrt(d_k)), so scale = 1 is passed
//       and 2.1 is the floor. 2.5 added `enable_gqa`; not used: K and V are expanded to the query
//       heads instead, which every version and every fused backend accepts.
//   TensorMemory (the counting CPU allocator)
//       c10::Allocator::allocate is const up to 2.2, not from 2.3, which also added the pure
//       virtual copy_data. CUDA's peak comes from c10::cuda::CUDACachingAllocator's device
//       stats, in a CUDA build only (ABLATE_WITH_CUDA_ALLOCATOR, set by worker/model/CMakeLists.txt
//       when Torch's config found c10_cuda: Debian's CPU package ships the header, not the
//       library).
//   Bf16ProductSelfTest
//       LibTorch 1.13's CPU fallback for bf16 matrix products too small for oneDNN (gemv, dot,
//       small gemm and bmm) accumulates in bf16 (pytorch/pytorch#83863, #95125): a sum of 1024
//       ones stops at 256, where each +1 rounds away. Measured on this project's VM (with
//       AVX-512 BF16): ones(1, 1024) x ones(1024, 1) = 256, (2 x 1024) x (1024 x 2) the same,
//       from (8 x 1024) x (1024 x 8) on 1024. PRECISION_BF16 runs check it at start-up.
//   SetCudaAutocast
//       at::autocast::set_enabled(bool) / set_autocast_gpu_dtype() up to 2.3; from 2.4
//       set_autocast_enabled(kCUDA, bool) / set_autocast_dtype(kCUDA, dtype). The old names are
//       still declared in 2.4+ but deprecated, and each call logs a deprecation warning.
//
// Read against the 2.x headers and left without a shim, since the spelling ablate uses compiles
// against both (the device build, bench/gpu/, is what proves it): c10d's TCPStore and
// TCPStoreOptions (port, isServer, numWorkers, waitWorkers, timeout; 2.4 added useLibUV, default
// on, whose server also reports the port it bound for port 0) and ProcessGroupGloo (constructor,
// Options::create, createDeviceForHostname, createDefaultDevice, allreduce/broadcast returning a
// Work to wait on; in 2.x it derives from c10d::Backend, with the same calls) in
// worker/train/collective.cc; torch::nn::functional, torch::optim::AdamW and its param groups,
// torch::serialize archives. worker/train/CMakeLists.txt links the system's Gloo only for 1.x
// (2.x carries Gloo inside libtorch_cpu and its headers in include/gloo).
//
// Includes <torch/torch.h>: worker/ only. Thread-safe.
#ifndef ABLATE_WORKER_MODEL_TORCH_COMPAT_H_
#define ABLATE_WORKER_MODEL_TORCH_COMPAT_H_

#include <torch/torch.h>
#include <torch/version.h>

#include <string>

#include "absl/status/status.h"

// True when the LibTorch headers are version major.minor or later.
#define ABLATE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace ablate::compat {

// The LibTorch version compiled against, "1.13.0".
const char* TorchVersion();

// The seed of the default CPU generator (torch::manual_seed's), and a CPU generator of its own
// seeded with `seed` (worker/model's per-parameter init streams).
uint64_t DefaultCpuSeed();
at::Generator CpuGenerator(uint64_t seed);

// at::scaled_dot_product_attention with an explicit scale (LibTorch >= 2.1).
inline constexpr bool kHasScaledDotProductAttention = ABLATE_TORCH_AT_LEAST(2, 1);

// Why causal attention on queries like `q` cannot go through FusedCausalAttention, in words, or
// "" when it can. It can on a CUDA tensor with LibTorch >= 2.1 when the caller does not need the
// attention probabilities (`need_probs`: the probes' F-Attn and attention maps read them, and
// the fused kernels never form them). CPU tensors always answer "on the CPU": the model's own
// fused CPU kernel (fused_ops.h) is faster there, and bit-identical across versions.
std::string FusedAttentionBlocker(const torch::Tensor& q, bool need_probs);

// Causal softmax attention through at::scaled_dot_product_attention: on CUDA LibTorch picks its
// flash, memory-efficient or cuDNN kernel for the dtype and head size, or its math kernel when
// none applies. Same layouts as CausalAttention (fused_ops.h): q (B, H, T, dk), already scaled;
// k (B, KV, T, dk); v (B, T, KV, dk), each KV head serving H / KV consecutive query heads.
// Returns (B, T, H, dk). Throws c10::Error when FusedAttentionBlocker(q, false) is not empty.
torch::Tensor FusedCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v);

// The start-up self-test of PRECISION_BF16 (docs/training.md, "Mixed precision"): the product
// of ones(1, 1024) and ones(1024, 1) in bf16 on `device` must be 1024. Where it is not, bf16
// products there accumulate in bf16 and the run is refused: InvalidArgument naming the value.
// ABLATE_BF16_SELFTEST=skip in the environment skips it (to test the bf16 code path on such a
// CPU; its results are then not to be trusted).
absl::Status Bf16ProductSelfTest(const torch::Device& device);
// Its verdict on the product's value `product` on `device` (the refusal testable anywhere).
absl::Status Bf16ProductVerdict(double product, const std::string& device);

// CUDA autocast on (to `dtype`) or off, for the calling thread. Clears the autocast cast cache
// when turning it off, as leaving an autocast region does. Only a thread-local switch: callable
// (and without effect on CPU tensors) in a CPU-only build too.
void SetCudaAutocast(bool enabled, at::ScalarType dtype = at::kBFloat16);
// Whether CUDA autocast is on for the calling thread, and to which dtype.
bool CudaAutocastEnabled();
at::ScalarType CudaAutocastDtype();

// Bytes of tensor memory on a device: what is allocated now and the most since the last reset.
struct TensorMemory {
  int64_t current = 0;
  int64_t peak = 0;
};
// The CPU's figures count every tensor LibTorch allocates through its CPU allocator once
// CountCpuTensorMemory() has run (it installs a counting wrapper around the default allocator;
// idempotent, process-wide, thread-safe): the CPU's analogue of max_memory_allocated. Memory
// mapped token files, the heap's own overhead and LibTorch's libraries are not counted.
void CountCpuTensorMemory();
TensorMemory CpuTensorMemory();
void ResetCpuTensorPeak();
// CUDA's allocator figures of `device` (max_memory_allocated); zeros in a build without CUDA.
TensorMemory CudaTensorMemory(int device);
void ResetCudaTensorPeak(int device);

// Writes "YYYY-MM-DD HH:MM:SS <line>" to stderr (the worker's log format) the first time it is
// called with `key`, and nothing after: "once per model" when the key is one of the model's
// modules. Keys are remembered for the life of the process (a pointer each); a module allocated
// later at a freed module's address is taken for the old one.
void LogOnce(const void* key, const std::string& line);

}  // namespace ablate::compat

#endif  // ABLATE_WORKER_MODEL_TORCH_COMPAT_H_
