// Exact, analytic parameter counts of a ModelConfig (no LibTorch).
//
// The count mirrors worker/model/transformer.cc module by module; tests/worker/model/model_test.cc proves
// that CountParams(c).total() equals the number of elements the LibTorch model allocates, for
// every variant. Pure function, thread-safe. The config must be valid (ValidateModelConfig).
#ifndef ABLATE_CONFIG_PARAM_COUNT_H_
#define ABLATE_CONFIG_PARAM_COUNT_H_

#include "proto/ablate.pb.h"

namespace ablate {

ParamCount CountParams(const ModelConfig& config);

// Forward FLOPs per token at a context of `seq_len`: 2 x activated matmul parameters plus
// attention scores and values, 4 x layers x query heads x head_dim x seq_len. The tied or
// untied output projection counts, the input embedding lookup and the norms do not.
double ForwardFlopsPerToken(const ModelConfig& config, int seq_len);

// What a training step costs per token over its forward pass: the backward pass takes twice
// the forward's FLOPs (gradients of activations and of weights), so forward + backward = 3x.
inline constexpr double kTrainingFlopsPerForwardFlop = 3.0;

// Training FLOPs per token, estimated the usual way: kTrainingFlopsPerForwardFlop x
// ForwardFlopsPerToken, i.e. 6 x activated non-embedding matmul parameters (forward 2, backward
// 4) plus 12 x layers x query heads x head_dim x seq_len for attention (PaLM's estimate, the one
// nanoGPT's MFU uses).
double TrainingFlopsPerToken(const ModelConfig& config, int seq_len);

// Tokens one optimizer step trains: batch_size x seq_len x grad_accum (a grad_accum of 0 is 1).
double TokensPerStep(const TrainConfig& train);

}  // namespace ablate

#endif  // ABLATE_CONFIG_PARAM_COUNT_H_
