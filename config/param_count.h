// Exact, analytic parameter counts of a ModelConfig (no LibTorch).
//
// The count mirrors worker/model/transformer.cc module by module; tests/model_test.cc proves
// that CountParams(c).total() equals the number of elements the LibTorch model allocates, for
// every variant. Pure function, thread-safe. The config must be valid (ValidateModelConfig).
#ifndef ABLATE_CONFIG_PARAM_COUNT_H_
#define ABLATE_CONFIG_PARAM_COUNT_H_

#include "proto/ablate.pb.h"

namespace ablate {

ParamCount CountParams(const ModelConfig& config);

// Training FLOPs per token, estimated the usual way: 6 x activated non-embedding matmul
// parameters (forward 2, backward 4) plus attention scores and values, 12 x layers x query
// heads x head_dim x seq_len (PaLM's estimate, the one nanoGPT's MFU uses). The tied or
// untied output projection counts, the input embedding lookup does not.
double TrainingFlopsPerToken(const ModelConfig& config, int seq_len);

}  // namespace ablate

#endif  // ABLATE_CONFIG_PARAM_COUNT_H_
