// The probes of docs/model.md ("Probes"), recorded from the forward pass that trains (the model
// calls these hooks when handed a recorder; there is no second implementation of attention).
//
// Usage: build a recorder, run forward(tokens, &recorder) on one or more evaluation batches under
// NoGradGuard, then Finish(). Values accumulate across batches: means are over every token
// seen, maxima over all batches. Not thread-safe; one recorder per evaluation.
#ifndef ABLATE_WORKER_MODEL_PROBES_H_
#define ABLATE_WORKER_MODEL_PROBES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/ablate.pb.h"

namespace at {
class Tensor;
}  // namespace at

namespace ablate {

class ProbeRecorder {
 public:
  static constexpr int kHistogramBins = 20;
  // The sink-rate probe window: query positions 1..63 of each window (Gu et al. 2025 probe with
  // 64-token sequences; causal attention makes a longer window's first 64 queries the same).
  static constexpr int64_t kSinkWindow = 64;

  // `map_heads`: heads per layer whose attention map AttentionMaps() keeps (heads 0..n-1 of the
  // first window of the first batch, over its first kAttentionMapSize positions), beside the
  // mean over all of the layer's heads (head -1); 0 = none, -1 = every head.
  // `sink_epsilon`: the sink-rate threshold (Probes.sink_rate; TrainConfig.sink_epsilon).
  explicit ProbeRecorder(const ModelConfig& config, int map_heads = 0, double sink_epsilon = 0.3);

  // Query positions of the forward passes that follow are of classes: `classes` (B, T) holds
  // each position's class index into `names` (-1: none); an undefined tensor clears it. F-Attn
  // and gate scores are then also accumulated per class (LayerProbes.classes).
  void SetQueryClasses(const at::Tensor& classes, std::vector<std::string> names);

  // Gate scores as applied (after activation and head sharing), any shape; (B, T, ...) for the
  // split by query class.
  void GateScores(int layer, const at::Tensor& scores);
  // Attention probability on key 0 of query positions [first_query, first_query + n):
  // (B, H, n). Positions > 0 are accumulated, per head, in the sink-rate window (positions <
  // kSinkWindow) and per query class; called once per query block.
  void FirstTokenAttention(int layer, const at::Tensor& probs_on_key0, int64_t first_query);
  // SDPA output before the gate, the tensor W_O receives, and (G1 only, else undefined) the
  // gate scores: the mean-scaled control multiplies `before` by their mean over this batch.
  void Sparsity(int layer, const at::Tensor& before, const at::Tensor& after,
                const at::Tensor& g1_scores);
  // Attention output, residual after it, FFN output, residual after it.
  void Residuals(int layer, const at::Tensor& attn_out, const at::Tensor& attn_residual,
                 const at::Tensor& ffn_out, const at::Tensor& ffn_residual);

  // Attention probabilities (B, H, T, T). The first call per layer keeps its maps (see the
  // constructor); later calls are ignored, so the maps are of the first batch's first window.
  void AttentionMaps(int layer, const at::Tensor& probs);

  Probes Finish() const;
  // The kept attention maps, by layer, then head (the mean, head -1, first).
  std::vector<AttentionMap> TakeAttentionMaps();
  // The dtype of the residual stream each layer output ("Float", "BFloat16"), by layer, as the
  // last forward pass saw it.
  const std::vector<std::string>& ResidualDtypes() const { return residual_dtypes_; }

 private:
  struct Layer {
    // Gate scores.
    double gate_sum = 0, gate_sq_sum = 0, gate_min = 0, gate_max = 0;
    int64_t gate_n = 0;
    std::vector<int64_t> histogram;
    // Elements of |SDPA output| below 1e-2 / 1e-3: before the gate, as W_O receives it, and
    // before the gate times the mean gate score of the same batch and layer.
    int64_t below[3][2] = {{0, 0}, {0, 0}, {0, 0}};  // [before, after, mean-scaled][1e-2, 1e-3]
    int64_t sdpa_n = 0;
    double abs_sum[2] = {0, 0};  // sum of |SDPA output| before the gate, as W_O receives it
    double first_token_sum = 0;
    int64_t first_token_n = 0;
    // Per head: attention on key 0 over all queries > 0 and over the sink window's; per head
    // counts (the same for every head).
    std::vector<double> head_sum, window_sum;
    int64_t head_n = 0, window_n = 0;
    // Per query class: attention on key 0 (summed over heads too) and gate scores.
    std::vector<double> class_attn_sum, class_gate_sum;
    std::vector<int64_t> class_queries, class_attn_n, class_gate_n;
    double max_abs[4] = {0, 0, 0, 0};
    bool mapped = false;  // AttentionMaps already kept this layer's maps
  };
  // Adds to `sums`/`counts` per class: values (B, n) at positions [first, first + n), counted
  // `weight` times each (heads). Positions 0 and those of no class are skipped.
  void AddByClass(const at::Tensor& values, int64_t first, std::vector<double>* sums,
                  std::vector<int64_t>* counts) const;

  int map_heads_;
  double sink_epsilon_;
  std::vector<std::string> class_names_;
  std::shared_ptr<at::Tensor> classes_;  // (B, T) int64 on the CPU; null when unset
  std::vector<AttentionMap> maps_;
  std::vector<std::string> residual_dtypes_;

  double hist_lo_, hist_hi_;
  std::vector<Layer> layers_;
  int64_t tokens_ = 0;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_MODEL_PROBES_H_
