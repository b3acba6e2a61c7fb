// The language-model loss without the whole logits tensor (TrainConfig.loss_chunk_tokens): the
// mean cross-entropy of logits = hidden x weight^T against the targets, computed `chunk` rows at
// a time in the forward pass and again in the backward, so that at most one chunk's logits
// (chunk x vocab) exist at once instead of every token's and their fp32 log-probabilities
// (tokens x vocab each). With Qwen's 151,936-token vocabulary and 4,096 tokens a micro-batch
// that is 8.7 GB the plain loss holds at the forward's end; 1,024-token chunks hold 2.2 GB.
// It costs the output projection's forward matmul once more. Includes <torch/torch.h>:
// worker/ only.
#ifndef ABLATE_WORKER_MODEL_CHUNKED_LOSS_H_
#define ABLATE_WORKER_MODEL_CHUNKED_LOSS_H_

#include <torch/torch.h>

#include <cstdint>

namespace ablate {

// hidden (N, d), weight (vocab, d), targets (N) int64: the mean over the N rows of
// logsumexp(logits) - logits[target], logits = hidden x weight^T computed in `dtype` (both cast
// to it: the run's compute dtype) and taken to fp32, as the plain loss does
// (cross_entropy(logits.to(fp32))). Differentiable in hidden and weight; their gradients are
// the plain loss's up to the order of fp32 sums. `chunk` >= 1 rows at a time.
torch::Tensor ChunkedCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& targets, int64_t chunk,
                                  torch::ScalarType dtype);

}  // namespace ablate

#endif  // ABLATE_WORKER_MODEL_CHUNKED_LOSS_H_
