#include "config/param_count.h"

#include <algorithm>

#include "config/model_config.h"

namespace ablate {

namespace {

struct LayerCount {
  ParamBreakdown params;
  int64_t inactive = 0;  // expert parameters a single token does not use
};

LayerCount CountLayer(const ModelConfig& c) {
  LayerCount out;
  ParamBreakdown& b = out.params;
  const int64_t d = c.d_model(), q = c.num_heads(), kv = c.num_kv_heads(), dk = c.head_dim();

  // Norms: pre-attention and pre-FFN RMSNorm, plus two sandwich norms.
  b.set_norms(2 * d + (c.sandwich_norm() ? 2 * d : 0));

  // Attention: q, k, v, o projections and QK-norm weights (one d_k vector each for q and k).
  int64_t attention = d * q * dk + q * dk * d;
  const int64_t kv_proj = d * kv * dk;
  const SwitchHeadConfig& sh = c.switchhead();
  if (sh.target() == SWITCHHEAD_NONE) {
    attention += 2 * kv_proj;
  } else {
    const int64_t e = sh.num_experts();
    const int64_t mixed = sh.target() == SWITCHHEAD_KV ? 2 : 1;  // projections made mixtures
    attention += (2 - mixed) * kv_proj + mixed * e * kv_proj + d * kv * e;  // + router
    out.inactive += mixed * (e - sh.top_k()) * kv_proj;
  }
  if (c.qk_norm()) attention += 2 * dk;
  b.set_attention(attention);

  // Gate: a d_model -> width projection, or a learnable theta of the scores' shape.
  int64_t gate = 0;
  if (c.gate().position() != GATE_NONE) {
    const int64_t width = GateScoreWidth(c);
    gate = c.gate().input_independent() ? width : d * width;
  }
  if (c.attn_output_control() == CONTROL_HEAD_RMSNORM) gate += dk;
  b.set_gate(gate);

  // FFN: SwiGLU has three d_model x width matrices; MoE adds a router.
  const MoeConfig& moe = c.moe();
  if (moe.num_experts() == 0) {
    b.set_ffn(3 * d * c.ffn_dim());
  } else {
    const int64_t expert = 3 * d * moe.expert_dim();
    b.set_ffn(d * moe.num_experts() + moe.num_experts() * expert);
    out.inactive += (moe.num_experts() - moe.top_k()) * expert;
  }
  return out;
}

}  // namespace

ParamCount CountParams(const ModelConfig& c) {
  ParamCount count;
  ParamBreakdown* b = count.mutable_breakdown();
  const int64_t embedding = static_cast<int64_t>(c.vocab_size()) * c.d_model();
  b->set_embedding(embedding);
  b->set_lm_head(c.tie_embeddings() ? 0 : embedding);
  const LayerCount layer = CountLayer(c);
  const int64_t n = c.num_layers();
  b->set_attention(n * layer.params.attention());
  b->set_gate(n * layer.params.gate());
  b->set_ffn(n * layer.params.ffn());
  b->set_norms(n * layer.params.norms() + c.d_model());  // + final norm
  const int64_t total =
      b->embedding() + b->lm_head() + b->attention() + b->gate() + b->ffn() + b->norms();
  count.set_total(total);
  count.set_activated(total - n * layer.inactive);
  return count;
}

double ForwardFlopsPerToken(const ModelConfig& c, int seq_len) {
  const ParamCount p = CountParams(c);
  const ParamBreakdown& b = p.breakdown();
  // Matmul parameters a token touches: everything activated but the norms and one copy of the
  // vocabulary matrix (the output projection is a matmul, the input lookup is not).
  const double matmul = static_cast<double>(p.activated() - b.norms() - b.lm_head());
  // Per layer and query head, q.k over seq_len keys and the weighted sum of as many values.
  const double attention = 4.0 * c.num_layers() * c.num_heads() * c.head_dim() * seq_len;
  return 2.0 * matmul + attention;
}

double TrainingFlopsPerToken(const ModelConfig& c, int seq_len) {
  return kTrainingFlopsPerForwardFlop * ForwardFlopsPerToken(c, seq_len);
}

double TokensPerStep(const TrainConfig& t) {
  return static_cast<double>(t.batch_size()) * t.seq_len() * std::max(1, t.grad_accum());
}

}  // namespace ablate
