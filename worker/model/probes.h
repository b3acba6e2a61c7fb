// The probes of docs/model.md ("Probes"), recorded from the forward pass that trains (the model
// calls these hooks when handed a recorder; there is no second implementation of attention).
//
// Usage: build a recorder, run forward(tokens, &recorder) on one or more evaluation batches under
// NoGradGuard, then Finish(). Values accumulate across batches: means are over every token
// seen, maxima over all batches. Not thread-safe; one recorder per evaluation.
#ifndef ABLATE_WORKER_MODEL_PROBES_H_
#define ABLATE_WORKER_MODEL_PROBES_H_

#include <cstdint>
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

  // `map_heads`: heads per layer whose attention map AttentionMaps() keeps (heads 0..n-1 of the
  // first window of the first batch, over its first kAttentionMapSize positions), beside the
  // mean over all of the layer's heads (head -1); 0 = none, -1 = every head.
  explicit ProbeRecorder(const ModelConfig& config, int map_heads = 0);

  // Gate scores as applied (after activation and head sharing), any shape.
  void GateScores(int layer, const at::Tensor& scores);
  // Attention probability on key 0 of query positions [first_query, first_query + n):
  // (B, H, n). Positions > 0 are accumulated; called once per query block.
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
    double max_abs[4] = {0, 0, 0, 0};
    bool mapped = false;  // AttentionMaps already kept this layer's maps
  };
  int map_heads_;
  std::vector<AttentionMap> maps_;
  std::vector<std::string> residual_dtypes_;

  double hist_lo_, hist_hi_;
  std::vector<Layer> layers_;
  int64_t tokens_ = 0;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_MODEL_PROBES_H_
