// The gated decoder-only transformer of the paper (docs/model.md), one class per concept.
//
// Every variant is a ModelConfig: the gate (position, granularity, sharing, mode, activation,
// input dependence), the non-gate controls, SwitchHead, MoE, sandwich norm and output clamp are
// switches inside these modules, not subclasses. Parameter layout mirrors
// config/param_count.cc exactly (a test proves the totals are equal).
//
// Tensor layout inside attention is (B, T, H, d_k) until SDPA, so every gate position applies
// to the same layout; shapes are commented at line ends. The config must be valid
// (ValidateModelConfig) before a module is built. Modules are not thread-safe, as in LibTorch.
//
// Includes <torch/torch.h>: only worker/ code may include this header.
#ifndef ABLATE_WORKER_MODEL_TRANSFORMER_H_
#define ABLATE_WORKER_MODEL_TRANSFORMER_H_

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "proto/ablate.pb.h"

namespace ablate {

class ProbeRecorder;  // worker/model/probes.h

// While alive on a thread, models built on that thread skip the N(0, std) initialisation and keep
// their parameters uninitialised (torch::empty: no memory is touched). For counting what a
// paper-scale model allocates without paying for random numbers; never for training.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};

// `weight` at x's dtype: a no-op in fp32. With PRECISION_BF16 the parameters stay fp32 (the
// master weights) and every op meets them cast to bf16, whose backward brings the gradient back to
// fp32, so the optimizer updates fp32 weights with fp32 gradients (Megatron-LM's mixed precision).
torch::Tensor AtDtypeOf(const torch::Tensor& weight, const torch::Tensor& x);

// y = x W^T with W (out, in) ~ N(0, init_std): no biases anywhere (the paper, docs/model.md).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, double init_std);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;
};
TORCH_MODULE(Linear);

// x * rsqrt(mean(x^2) + eps) * weight over the last dimension; weight starts at 1.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// act() of a gate, elementwise (docs/model.md, "The gate").
torch::Tensor GateActivate(const torch::Tensor& logits, GateActivation activation);

// Y' = Y * scores (multiplicative) or Y + scores (additive); scores broadcast against Y.
torch::Tensor ApplyGate(const torch::Tensor& y, const torch::Tensor& scores, GateMode mode);

// The gate of one position: a bias-free d_model -> width projection of the pre-norm hidden state
// X (N(0, init_std), or zeros with GATE_INIT_ZERO; a zero-initialised theta when
// input-independent), activated, times GateConfig.scale, and averaged over heads when
// head-shared.
class GateImpl : public torch::nn::Module {
 public:
  explicit GateImpl(const ModelConfig& config);

  // Scores for the hidden state x (B, T, d_model): (B, T, heads, d_k or 1) at G1-G4, where
  // heads is 1 when head-shared; (B, T, d_model) at G5. Input-independent scores have leading
  // singleton dimensions instead of B, T.
  // `projected`, when given, is x W^T computed by the caller (fused with other projections of x).
  torch::Tensor Scores(const torch::Tensor& x, const torch::Tensor& projected = {});
  // The paper's default gate, head-specific multiplicative sigmoid of x W: the logits
  // (B, T, heads, d_k or 1), for the fused y * sigmoid(logits) kernel. Empty for every other kind.
  torch::Tensor SigmoidLogits(const torch::Tensor& x, const torch::Tensor& projected = {});
  // W (width, d_model) of an input-dependent gate, else an undefined tensor.
  torch::Tensor ProjectionWeight() const { return proj_ ? proj_->weight : torch::Tensor(); }

 private:
  // Activation and head sharing of logits x W^T (B, T, heads * per_head).
  torch::Tensor ScoresFromLogits(const torch::Tensor& logits);
  // scale x act(logits) (GateConfig.scale).
  torch::Tensor Activate(const torch::Tensor& logits) const;

  GateConfig gate_;
  int64_t heads_;     // heads of the gated tensor (1 at G5)
  int64_t per_head_;  // d_k (elementwise), 1 (headwise), d_model at G5
  Linear proj_{nullptr};  // input-dependent
  torch::Tensor theta_;              // input-independent, (heads, per_head) or (d_model)
  double scale_ = 1.0;               // GateConfig.scale (0 read as 1)
};
TORCH_MODULE(Gate);

// One projection of each KV head made a mixture of experts, chosen per token and head by a
// sigmoid router with top-k (SwitchHead). With 1 expert and top-1 it is a headwise value gate.
class SwitchHeadProjectionImpl : public torch::nn::Module {
 public:
  SwitchHeadProjectionImpl(int64_t d_model, int64_t kv_heads, int64_t head_dim, int64_t experts,
                           double init_std);
  // x (B, T, d_model), router scores (B, T, kv_heads, experts), zero off the top-k.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& router_scores);

 private:
  int64_t kv_heads_, head_dim_, experts_;
  Linear experts_proj_{nullptr};  // d_model -> kv_heads * experts * head_dim
};
TORCH_MODULE(SwitchHeadProjection);

// Grouped-query causal self-attention with QK-norm, RoPE, the gate at any position, the non-gate
// controls at G1 and SwitchHead K/V.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, int layer);
  // x: the pre-norm hidden state (B, T, d_model). `probes` may be null (training).
  torch::Tensor forward(const torch::Tensor& x, ProbeRecorder* probes);
  // Rotate queries and keys with the YaRN tables (ModelConfig.yarn) until called with false.
  // No-op without YaRN.
  void UseYarn(bool on) { use_yarn_ = on && yarn_cos_.defined(); }

 private:
  // Rotary embedding of (B, T, H, d_k), positions 0..T-1, times `scale`: (B, H, T, d_k).
  torch::Tensor RopeToHeads(const torch::Tensor& x, double scale);
  // Causal softmax(q k^T) v: q (B, H, T, d_k) already scaled, k (B, KV, T, d_k),
  // v (B, T, KV, d_k); returns (B, T, H, d_k). A fused per-(batch, KV head) kernel on the CPU,
  // plain LibTorch ops elsewhere.
  torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, ProbeRecorder* probes);

  ModelConfig config_;
  int layer_;
  Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  RMSNorm q_norm_{nullptr}, k_norm_{nullptr}, control_norm_{nullptr};
  Gate gate_{nullptr};
  Linear switch_router_{nullptr};
  SwitchHeadProjection switch_k_{nullptr}, switch_v_{nullptr};
  torch::Tensor rope_cos_, rope_sin_;  // buffers (max_seq_len, d_k)
  torch::Tensor yarn_cos_, yarn_sin_;  // buffers (max_seq_len, d_k), times YarnScale; with YaRN only
  bool use_yarn_ = false;
};
TORCH_MODULE(Attention);

// RoPE's frequencies theta_i = rope_base^(-2i / d_k), i < d_k / 2. With `yarn` (and
// ModelConfig.yarn.factor > 0), YaRN's NTK-by-parts interpolation of them: theta_i becomes
// (1 - g_i) * theta_i / factor + g_i * theta_i, so high frequencies (many turns within the
// trained length L) are kept and low ones interpolated. The ramp g_i (yarn.ramp):
//  - reference (jquesnelle/yarn, Hugging Face): linear in the index, g_i = 1 - clamp((i - lo) /
//    (hi - lo), 0, 1), lo = floor(i*(beta_fast)), hi = ceil(i*(beta_slow)) within [0, d_k - 1],
//    where i*(n) = d_k ln(L / (2 pi n)) / (2 ln rope_base) is where theta_i turns n times in L;
//  - paper (the YaRN paper's equation): linear in the turns r_i = L theta_i / (2 pi),
//    g_i = clamp((r_i - beta_slow) / (beta_fast - beta_slow), 0, 1).
std::vector<double> RopeFrequencies(const ModelConfig& config, bool yarn);
// YaRN's scale on queries and keys, 0.1 ln(factor) + 1, so attention logits are divided by the
// temperature t with sqrt(1/t) = that; 1 without YaRN.
double YarnScale(const YarnConfig& yarn);

// down(silu(gate(x)) * up(x)).
class SwiGLUImpl : public torch::nn::Module {
 public:
  // The down projection starts at down_std (OutputInitStd), the others at init_std.
  SwiGLUImpl(int64_t d_model, int64_t width, double init_std, double down_std);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Linear gate_{nullptr}, up_{nullptr}, down_{nullptr};
};
TORCH_MODULE(SwiGLU);

// E SwiGLU experts of width expert_dim, softmax router, top-k; adds the load-balancing loss and
// router z-loss (scaled by their coefficients) to *aux_loss.
class MoEImpl : public torch::nn::Module {
 public:
  explicit MoEImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, torch::Tensor* aux_loss);  // (B, T, d) -> same

  // The experts each token is routed to and their weights: (N, top_k) each, N = B*T.
  struct Routing {
    torch::Tensor logits;   // (N, E)
    torch::Tensor probs;    // (N, E)
    torch::Tensor experts;  // (N, k) int64
    torch::Tensor weights;  // (N, k)
  };
  Routing Route(const torch::Tensor& x2d);

  // A new optimizer step: the global-batch assignment counts start again from zero.
  void BeginStep();
  // Data parallel: sums a count tensor (CPU, int64, (E)) over the ranks in place, so that the
  // global-batch balance loss counts every rank's assignments. Unset for one process.
  using CountReducer = std::function<void(torch::Tensor&)>;
  void SetCountReducer(CountReducer reducer) { reducer_ = std::move(reducer); }

  // How a forward pass of a checkpointed block (TransformerImpl::SetActivationCheckpointing)
  // treats the global-batch counts. kFirst: the pass that runs without recording gradients
  // counts this micro-batch as a training pass does, and keeps the fraction its balance loss
  // used; kRecompute: the backward's second pass uses that fraction and counts nothing, so both
  // passes compute what one plain training pass does. Set per thread by the checkpointing code.
  enum class CheckpointPass { kNone, kFirst, kRecompute };
  static void SetCheckpointPass(CheckpointPass pass);

 private:
  MoeConfig moe_;
  CountReducer reducer_;
  torch::Tensor checkpoint_fraction_;  // CheckpointPass::kFirst's fraction, for kRecompute
  // BALANCE_GLOBAL_BATCH: assignments per expert over the step's micro-batches so far (CPU,
  // int64, (E)) and their total; updated only by forward passes that record gradients.
  torch::Tensor step_counts_;
  int64_t step_assignments_ = 0;
  Linear router_{nullptr};
  torch::Tensor w_gate_, w_up_;  // (E, expert_dim, d_model)
  torch::Tensor w_down_;         // (E, d_model, expert_dim)
};
TORCH_MODULE(MoE);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config, int layer);
  torch::Tensor forward(const torch::Tensor& x, torch::Tensor* aux_loss, ProbeRecorder* probes);
  void BeginStep() {
    if (moe_) moe_->BeginStep();
  }
  void UseYarn(bool on) { attn_->UseYarn(on); }
  void SetCountReducer(const MoEImpl::CountReducer& reducer) {
    if (moe_) moe_->SetCountReducer(reducer);
  }
  // Called with this block's layer when a checkpointed backward of it has ended.
  void SetGradientsDone(std::function<void(int layer)> done) { gradients_done_ = std::move(done); }
  void GradientsDone() const {
    if (gradients_done_) gradients_done_(layer_);
  }

 private:
  // Sandwich norm and clamp of a sublayer output, before the residual add.
  torch::Tensor ToResidual(torch::Tensor h, RMSNorm& post_norm);

  ModelConfig config_;
  int layer_;
  std::function<void(int layer)> gradients_done_;
  RMSNorm attn_norm_{nullptr}, ffn_norm_{nullptr};
  RMSNorm attn_post_norm_{nullptr}, ffn_post_norm_{nullptr};  // sandwich norm only
  Attention attn_{nullptr};
  SwiGLU ffn_{nullptr};
  MoE moe_{nullptr};
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& config);

  struct Output {
    torch::Tensor logits;    // (B, T, vocab); undefined when not asked for
    torch::Tensor hidden;    // (B, T, d_model): the final norm's output, which the logits project
    torch::Tensor aux_loss;  // scalar: MoE load-balancing + z losses (0 for dense)
  };
  // tokens: (B, T) int64 with T <= max_seq_len. `logits` false: Output.hidden only, for a loss
  // that projects it itself (worker/model/chunked_loss.h, with OutputWeight()).
  Output forward(const torch::Tensor& tokens, ProbeRecorder* probes = nullptr,
                 bool logits = true);
  // The output projection's weight (vocab, d_model): lm_head's, or the embedding when tied.
  torch::Tensor OutputWeight() const { return lm_head_ ? lm_head_->weight : embedding_; }

  const ModelConfig& config() const { return config_; }

  // Call at the start of every optimizer step: the MoE layers' global-batch balance counts
  // (MoeConfig.load_balance_scope) restart. A no-op for a dense model.
  void BeginStep();

  // Every layer rotates with the YaRN tables (ModelConfig.yarn) until called with false: for
  // evaluations beyond yarn.original_seq_len (or every length: yarn.apply). A no-op without YaRN.
  void UseYarn(bool on);

  // Default off. On: each block's activations are recomputed in the backward pass instead of
  // kept (TrainConfig.activation_checkpointing): only each block's input is kept, plus one
  // block's activations at a time during the backward. Training forward passes only (gradients
  // recorded, no probes); the gradients are the plain pass's.
  void SetActivationCheckpointing(bool on) { checkpointing_ = on; }

  // The dtype of the residual stream and of everything computed from it (default: the
  // parameters', fp32).
  // kBFloat16 is TrainConfig's PRECISION_BF16: the embedding output is cast to bf16, every
  // weight meets the activations at bf16 (AtDtypeOf), and the attention and FFN outputs and the
  // residual adds stay bf16; norms reduce, and the softmax normalises, in fp32; the logits are
  // bf16 and the trainer's loss takes them to fp32. Parameters and gradients stay fp32.
  void SetComputeDtype(torch::ScalarType dtype);

  // Data parallel: every MoE layer's global-batch counts are summed over ranks with `reducer`
  // (MoEImpl::SetCountReducer). A no-op for a dense model.
  void SetCountReducer(const MoEImpl::CountReducer& reducer);

  // With activation checkpointing: `done(layer)` runs when a block's recomputed backward has
  // ended, when every gradient of that block's parameters for this backward pass has been
  // accumulated. The blocks end last to first, in the same order on every rank, whichever
  // parameters received a gradient (an MoE expert with no tokens gets none). ZeRO-2 reduces
  // them there (worker/train/optimizer.h). Called on the thread running the backward.
  void SetGradientsDone(const std::function<void(int layer)>& done);
  // The index of every parameter's block, in parameters() order; -1 outside the blocks.
  std::vector<int> ParameterLayers() const;

 private:
  ModelConfig config_;
  // SetComputeDtype; unset: the parameters' own dtype (fp64 in the tests' reference runs).
  c10::optional<torch::ScalarType> compute_dtype_;
  bool checkpointing_ = false;                         // SetActivationCheckpointing
  torch::Tensor embedding_;  // (vocab, d_model); also the output projection when tied
  torch::nn::ModuleList blocks_{nullptr};
  RMSNorm final_norm_{nullptr};
  Linear lm_head_{nullptr};  // untied only
};
TORCH_MODULE(Transformer);

// Number of parameter elements the module allocates (each tensor once).
int64_t CountAllocatedParams(torch::nn::Module& module);

}  // namespace ablate

#endif  // ABLATE_WORKER_MODEL_TRANSFORMER_H_
