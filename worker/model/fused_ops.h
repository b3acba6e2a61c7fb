// Fused CPU kernels for the model's elementwise chains and its attention, with hand-written
// backward passes.
//
// LibTorch eager runs RMSNorm as ~6 passes over memory forward and more backward, RoPE as a
// slice/cat/neg/mul/add chain plus a transpose copy, SwiGLU's silu(a) * b as 2 (and 4 backward). At CPU scale these
// passes cost as much as the GEMMs; each function here is one pass forward and one or two
// backward. They take effect for fp32 CPU tensors; on other devices and dtypes they run the
// eager reference (same math), so the model code is device-agnostic. Thread-safe (pure).
// Includes <torch/torch.h>: worker/ only.
#ifndef ABLATE_WORKER_MODEL_FUSED_OPS_H_
#define ABLATE_WORKER_MODEL_FUSED_OPS_H_

#include <torch/torch.h>

#include <utility>

namespace ablate {

// x * rsqrt(mean(x^2, -1) + eps) * weight, over the last dimension.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Rotary embedding, rotate-half convention, moved to the layout attention reads: x (B, T, H, d)
// with cos, sin (>= T, d) whose halves are equal; returns (B, H, T, d) contiguous,
// scale * (x * cos + cat(-x2, x1) * sin) at position t.
torch::Tensor RopeToHeads(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          double scale);

// silu(a) * b (SwiGLU's activation).
torch::Tensor SiluMul(const torch::Tensor& a, const torch::Tensor& b);

// y * sigmoid(logits), the paper's default gate: y (..., P) with logits (..., P) (elementwise)
// or (..., 1) (headwise), leading dimensions equal. On the CPU it keeps its output and the scores
// for the backward, not y: at G1 and G2 the output is what the next op keeps anyway (W_O's
// input, the attention's v), so y is freed as soon as it is gated; at G3 and G4 (RoPE keeps
// nothing) it is one tensor kept either way.
torch::Tensor SigmoidGate(const torch::Tensor& y, const torch::Tensor& logits);

// Causal softmax attention with grouped-query heads (each KV head serves H / KV consecutive query
// heads): q (pre-scaled) (B, H, T, dk), k (B, KV, T, dk), v (B, T, KV, dk), mask (T, T) additive
// and -inf above the diagonal (the fused kernel skips the products there).
// Returns {out (B, T, H, dk), the layout W_O reads; probs (B, H, T, T), for the probes, not
// differentiable, undefined unless `with_probs`}. On fp32 CPU tensors one autograd function walks
// the (batch, KV head) tiles in parallel, each with single-threaded sgemm calls and an in-cache
// softmax, and skips the products above the diagonal; without `with_probs` it keeps no
// (B, H, T, T) tensor.
std::pair<torch::Tensor, torch::Tensor> CausalAttention(const torch::Tensor& q,
                                                        const torch::Tensor& k,
                                                        const torch::Tensor& v,
                                                        const torch::Tensor& mask,
                                                        bool with_probs = true);

// How many threads the kernels here split their work between now: torch::get_num_threads() when
// this file was compiled with OpenMP (at::parallel_for is inline and runs serially without it),
// 1 otherwise. For tests and benchmarks, which check that the build threads them.
int KernelThreads();

// The fused attention's products go to BLAS's sgemm directly where LibTorch's BLAS exports one,
// through ATen otherwise; tests make it take ATen's path (true) to check both.
void UseAtenProductsForTesting(bool on);
// Whether this process exports a BLAS sgemm for them.
bool AttentionHasSgemm();

// The eager LibTorch versions: the fallback, and what the tests compare against.
namespace reference {
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor RopeToHeads(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          double scale);
torch::Tensor SiluMul(const torch::Tensor& a, const torch::Tensor& b);
torch::Tensor SigmoidGate(const torch::Tensor& y, const torch::Tensor& logits);
std::pair<torch::Tensor, torch::Tensor> CausalAttention(const torch::Tensor& q,
                                                        const torch::Tensor& k,
                                                        const torch::Tensor& v,
                                                        const torch::Tensor& mask);
}  // namespace reference

}  // namespace ablate

#endif  // ABLATE_WORKER_MODEL_FUSED_OPS_H_
