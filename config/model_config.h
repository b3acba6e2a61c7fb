// Defaults and validation of ModelConfig / TrainConfig / RunConfig.
//
// No LibTorch here: the coordinator, the CLI and the worker all validate with the same code, so a
// config that passes `ablate expand` is one the worker can build. Thread-safe (pure functions).
#ifndef ABLATE_CONFIG_MODEL_CONFIG_H_
#define ABLATE_CONFIG_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

// The documented defaults of every field (see the comments in proto/ablate.proto).
ModelConfig DefaultModelConfig();
TrainConfig DefaultTrainConfig();
RunConfig DefaultRunConfig();

// Upper bounds of a model's dimensions: far above any model trained, and low enough that exact
// parameter counts (CountParams, int64) and budget matching cannot overflow: at the bounds a
// model has under 2^62 parameters. ValidateModelConfig refuses larger values.
inline constexpr int32_t kMaxVocabSize = 1 << 21;   // 2,097,152
inline constexpr int32_t kMaxNumLayers = 1 << 10;   // 1,024
inline constexpr int32_t kMaxDModel = 1 << 16;      // 65,536
inline constexpr int32_t kMaxNumHeads = 1 << 10;    // num_heads and num_kv_heads
inline constexpr int32_t kMaxHeadDim = 1 << 12;     // 4,096
inline constexpr int32_t kMaxFfnDim = 1 << 20;      // ffn_dim and moe.expert_dim
inline constexpr int32_t kMaxExperts = 1 << 14;     // moe.num_experts
inline constexpr int32_t kMaxSwitchHeadExperts = 1 << 10;
inline constexpr int32_t kMaxEvalSeqLens = 16;        // train.eval_seq_lens
// Attention maps one evaluation may store, the layer means (head -1) included: the coordinator
// refuses more, and a config that asks for more (num_layers x (heads + 1)) is invalid.
inline constexpr int32_t kMaxAttentionMaps = 4096;
inline constexpr int32_t kAttentionMapSize = 64;      // positions an attention map covers
inline constexpr int32_t kMaxDevices = 4096;          // resources.devices, worker slots

// Tokens every train.eval_seq_lens length is measured on: eval_batches x batch_size windows of the
// longest length, read from the start of the validation split and cut into back-to-back windows
// of each length (a length that does not divide it drops the remainder). 0 without lengths.
int64_t EvalLengthSpan(const TrainConfig& train);

// Attention maps one evaluation stores per layer for train.attention_map_heads = `map_heads` in a
// model of `num_heads` heads: the kept heads (-1: all of them) and their mean; 0 for none.
int AttentionMapsPerLayer(int map_heads, int num_heads);

// A data-parallel run divides train.batch_size (the global batch) between its `ranks`, so that
// its results do not depend on its world size: InvalidArgument "train.batch_size: B windows
// cannot be split evenly over N <ranks_name>" when it does not divide.
absl::Status CheckBatchSplits(const TrainConfig& train, int ranks,
                              const std::string& ranks_name = "ranks");

// The initial std of the output projections (W_O, the FFN's and the experts' down projections):
// init_std, or init_std / sqrt(2 num_layers) with init.output_std SCALED.
double OutputInitStd(const ModelConfig& config);
// What CONTROL_FIXED_SCALE multiplies the SDPA output by: attn_output_scale, 0 read as 0.5.
double AttnOutputScale(const ModelConfig& config);
// train.init_from.preserve_function: the constant c = scale act(0) every score of the model's
// gate starts at, when the gate starts at a constant (GATE_INIT_ZERO or input-independent),
// multiplies, and sits where the attention output is linear in what it gates (G1, G2, G5), so
// that W_O / c keeps a loaded model's function; else InvalidArgument saying why.
absl::StatusOr<double> GateStartScore(const ModelConfig& config);
// The sink-rate threshold: train.sink_epsilon, 0 read as 0.3 (Gu et al. 2025).
double SinkEpsilon(const TrainConfig& config);

// InvalidArgument naming the offending fields (e.g. "model.gate.granularity: HEADWISE is not
// allowed at G5"), OK otherwise. `prefix` is prepended to field paths ("model.").
absl::Status ValidateModelConfig(const ModelConfig& config, const std::string& prefix = "model.");
absl::Status ValidateTrainConfig(const TrainConfig& config, const std::string& prefix = "train.");
// Both of the above plus the cross checks (seq_len <= max_seq_len, vocab vs data format).
absl::Status ValidateRunConfig(const RunConfig& config);

// Width of one gate position's scores per token, before any head sharing:
// heads_at_position * (elementwise ? head_dim : 1), or d_model at G5; 0 without a gate.
int64_t GateScoreWidth(const ModelConfig& config);
// Number of heads the gated tensor has at the configured position (q heads for G1/G4, KV heads
// for G2/G3, 1 for G5); 0 without a gate.
int64_t GateHeads(const ModelConfig& config);

// A short human-readable name of the gate ("G1 elementwise sigmoid", "none").
std::string DescribeGate(const GateConfig& gate);

}  // namespace ablate

#endif  // ABLATE_CONFIG_MODEL_CONFIG_H_
