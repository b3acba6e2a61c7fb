#include "worker/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "config/model_config.h"
#include "worker/model/fused_ops.h"
#include "worker/model/probes.h"
#include "worker/model/torch_compat.h"

namespace ablate {

namespace F = torch::nn::functional;

namespace {

thread_local bool skip_init = false;
thread_local MoEImpl::CheckpointPass checkpoint_pass = MoEImpl::CheckpointPass::kNone;

// A matrix InitNormal was asked to draw while a Transformer is built: drawn once the model is
// whole, from a stream of its own (DrawByName).
struct PendingInit {
  torch::Tensor tensor;
  double std;
};
thread_local std::vector<PendingInit>* pending_init = nullptr;

// N(0, std) for every matrix (the paper's initialisation, docs/model.md): now, or inside a
// Transformer's constructor once its parameters have names.
void InitNormal(const torch::Tensor& t, double std) {
  if (skip_init) return;
  if (pending_init != nullptr) {
    pending_init->push_back({t, std});
    return;
  }
  torch::NoGradGuard no_grad;
  t.normal_(0.0, std);
}

// A matrix given another start after InitNormal (a zero-initialised gate): not drawn after all.
void CancelInit(const torch::Tensor& t) {
  if (pending_init == nullptr) return;
  auto& p = *pending_init;
  p.erase(
      std::remove_if(p.begin(), p.end(), [&](const PendingInit& i) { return i.tensor.is_same(t); }),
      p.end());
}

// A stream per parameter: splitmix64 of the seed mixed with the FNV-1a hash of the name, so that
// "blocks.2.attn.q_proj.weight" starts the same in every model of a seed that has it (a baseline
// and its gated variant pair on the same shared weights), whatever else the model holds.
uint64_t StreamSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t z = seed ^ h;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

torch::Tensor AtDtypeOf(const torch::Tensor& weight, const torch::Tensor& x) {
  return weight.scalar_type() == x.scalar_type() ? weight : weight.to(x.scalar_type());
}

// ---------------------------------------------------------------------------------------------

SkipInitGuard::SkipInitGuard() : previous_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = previous_; }

LinearImpl::LinearImpl(int64_t in, int64_t out, double init_std) {
  weight = register_parameter("weight", torch::empty({out, in}));
  InitNormal(weight, init_std);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return F::linear(x, AtDtypeOf(weight, x));
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return RmsNorm(x, weight, eps_); }

// ---------------------------------------------------------------------------------------------

torch::Tensor GateActivate(const torch::Tensor& logits, GateActivation activation) {
  switch (activation) {
    case GATE_SIGMOID:
      return torch::sigmoid(logits);
    case GATE_SILU:
      return F::silu(logits);
    case GATE_IDENTITY:
      return logits;
    case GATE_NS_SIGMOID:
      return 0.5 + 0.5 * torch::sigmoid(logits);
    default:
      TORCH_CHECK(false, "unknown gate activation ", static_cast<int>(activation));
  }
}

torch::Tensor ApplyGate(const torch::Tensor& y, const torch::Tensor& scores, GateMode mode) {
  return mode == GATE_ADDITIVE ? y + scores : y * scores;
}

GateImpl::GateImpl(const ModelConfig& c) : gate_(c.gate()) {
  const bool g5 = gate_.position() == GATE_G5;
  heads_ = g5 ? 1 : GateHeads(c);
  per_head_ = g5 ? c.d_model() : (gate_.granularity() == GATE_HEADWISE ? 1 : c.head_dim());
  if (gate_.input_independent()) {
    theta_ = register_parameter(
        "theta", g5 ? torch::zeros({c.d_model()}) : torch::zeros({heads_, per_head_}));
  } else {
    proj_ = register_module("proj", Linear(c.d_model(), heads_ * per_head_, c.init_std()));
    // Zero: every score starts at act(0), 0.5 for a sigmoid (x2: the identity), whatever the
    // input, so a gate added to a trained model (appendix A.7) can start from its function.
    if (gate_.init() == GATE_INIT_ZERO) {
      torch::NoGradGuard no_grad;
      CancelInit(proj_->weight);
      proj_->weight.zero_();
    }
  }
  scale_ = gate_.scale() == 0 ? 1.0 : gate_.scale();
}

torch::Tensor GateImpl::Activate(const torch::Tensor& logits) const {
  torch::Tensor s = GateActivate(logits, gate_.activation());
  return scale_ == 1.0 ? s : s * scale_;
}

torch::Tensor GateImpl::Scores(const torch::Tensor& x, const torch::Tensor& projected) {
  if (gate_.input_independent()) {
    torch::Tensor s = Activate(AtDtypeOf(theta_, x));  // (heads, per_head) | (d)
    return gate_.position() == GATE_G5 ? s.view({1, 1, -1}) : s.view({1, 1, heads_, per_head_});
  }
  return ScoresFromLogits(projected.defined() ? projected : proj_(x));
}

torch::Tensor GateImpl::SigmoidLogits(const torch::Tensor& x, const torch::Tensor& projected) {
  if (gate_.input_independent() || gate_.position() == GATE_G5 ||
      gate_.sharing() == GATE_HEAD_SHARED || gate_.mode() != GATE_MULTIPLICATIVE ||
      gate_.activation() != GATE_SIGMOID || scale_ != 1.0) {
    return torch::Tensor();
  }
  return (projected.defined() ? projected : proj_(x))
      .view({x.size(0), x.size(1), heads_, per_head_});  // (B, T, H, ph)
}

torch::Tensor GateImpl::ScoresFromLogits(const torch::Tensor& logits) {
  if (gate_.position() == GATE_G5) return Activate(logits);  // (B, T, d)
  torch::Tensor l = logits.view({logits.size(0), logits.size(1), heads_, per_head_});  // (B, T, H, ph)
  if (gate_.sharing() != GATE_HEAD_SHARED) return Activate(l);
  if (gate_.shared_reduce() == GATE_AVERAGE_LOGITS) {
    return Activate(l.mean(2, /*keepdim=*/true));  // (B, T, 1, ph)
  }
  return Activate(l).mean(2, /*keepdim=*/true);  // (B, T, 1, ph)
}

// ---------------------------------------------------------------------------------------------

SwitchHeadProjectionImpl::SwitchHeadProjectionImpl(int64_t d_model, int64_t kv_heads,
                                                   int64_t head_dim, int64_t experts,
                                                   double init_std)
    : kv_heads_(kv_heads), head_dim_(head_dim), experts_(experts) {
  experts_proj_ =
      register_module("experts", Linear(d_model, kv_heads * experts * head_dim, init_std));
}

torch::Tensor SwitchHeadProjectionImpl::forward(const torch::Tensor& x,
                                                const torch::Tensor& router_scores) {
  const int64_t B = x.size(0), T = x.size(1);
  torch::Tensor all = experts_proj_(x).view({B, T, kv_heads_, experts_, head_dim_});
  return (all * router_scores.unsqueeze(-1)).sum(3);  // (B, T, kv, d_k)
}

// ---------------------------------------------------------------------------------------------

AttentionImpl::AttentionImpl(const ModelConfig& c, int layer) : config_(c), layer_(layer) {
  const int64_t d = c.d_model(), q = c.num_heads(), kv = c.num_kv_heads(), dk = c.head_dim();
  q_proj_ = register_module("q_proj", Linear(d, q * dk, c.init_std()));
  o_proj_ = register_module("o_proj", Linear(q * dk, d, OutputInitStd(c)));
  const SwitchHeadConfig& sh = c.switchhead();
  if (sh.target() != SWITCHHEAD_NONE) {
    switch_router_ = register_module("switch_router", Linear(d, kv * sh.num_experts(), c.init_std()));
    switch_v_ = register_module("switch_v",
                                SwitchHeadProjection(d, kv, dk, sh.num_experts(), c.init_std()));
    if (sh.target() == SWITCHHEAD_KV) {
      switch_k_ = register_module("switch_k",
                                  SwitchHeadProjection(d, kv, dk, sh.num_experts(), c.init_std()));
    }
  }
  if (!switch_k_) k_proj_ = register_module("k_proj", Linear(d, kv * dk, c.init_std()));
  if (!switch_v_) v_proj_ = register_module("v_proj", Linear(d, kv * dk, c.init_std()));
  if (c.qk_norm()) {
    q_norm_ = register_module("q_norm", RMSNorm(dk, c.norm_eps()));
    k_norm_ = register_module("k_norm", RMSNorm(dk, c.norm_eps()));
  }
  if (c.attn_output_control() == CONTROL_HEAD_RMSNORM) {
    control_norm_ = register_module("control_norm", RMSNorm(dk, c.norm_eps()));
  }
  if (c.gate().position() != GATE_NONE) gate_ = register_module("gate", Gate(c));

  // RoPE tables: angle(t, i) = t * theta_i, halves duplicated (rotate-half layout); YaRN's
  // tables carry its query/key scale, so a YaRN pass is the same kernels with other tables.
  const int64_t T = c.max_seq_len();
  auto tables = [&](bool yarn) {
    const std::vector<double> freqs = RopeFrequencies(c, yarn);
    torch::Tensor inv_freq = torch::tensor(freqs, torch::kFloat64);                    // (dk/2)
    torch::Tensor angles = torch::outer(torch::arange(T, torch::kFloat64), inv_freq);  // (T, dk/2)
    angles = torch::cat({angles, angles}, -1);                                         // (T, dk)
    const double scale = yarn ? YarnScale(c.yarn()) : 1.0;
    return std::pair{(angles.cos() * scale).to(torch::kFloat32),
                     (angles.sin() * scale).to(torch::kFloat32)};
  };
  auto [cos, sin] = tables(false);
  rope_cos_ = register_buffer("rope_cos", cos);
  rope_sin_ = register_buffer("rope_sin", sin);
  if (c.yarn().factor() > 0) {
    auto [ycos, ysin] = tables(true);
    yarn_cos_ = register_buffer("yarn_cos", ycos);
    yarn_sin_ = register_buffer("yarn_sin", ysin);
  }
}

torch::Tensor AttentionImpl::RopeToHeads(const torch::Tensor& x, double scale) {
  const torch::Tensor& cos = use_yarn_ ? yarn_cos_ : rope_cos_;
  const torch::Tensor& sin = use_yarn_ ? yarn_sin_ : rope_sin_;
  return ablate::RopeToHeads(x, cos.to(x.dtype()), sin.to(x.dtype()), scale);
}

std::vector<double> RopeFrequencies(const ModelConfig& c, bool yarn) {
  const int64_t dk = c.head_dim();
  const YarnConfig& y = c.yarn();
  // The reference ramp's ends: the (fractional) index i at which theta_i turns `turns` times
  // within L positions, floored for beta_fast and ceiled for beta_slow, within [0, dk - 1].
  const auto index_at = [&](double turns) {
    return static_cast<double>(dk) *
           std::log(y.original_seq_len() / (turns * 2.0 * M_PI)) / (2.0 * std::log(c.rope_base()));
  };
  const bool on = yarn && y.factor() > 0;
  const double low = on ? std::max(std::floor(index_at(y.beta_fast())), 0.0) : 0;
  double high = on ? std::min(std::ceil(index_at(y.beta_slow())), static_cast<double>(dk - 1)) : 0;
  if (high == low) high += 0.001;  // as the reference code: no division by zero
  std::vector<double> freqs;
  for (int64_t i = 0; i < dk / 2; ++i) {
    const double theta = std::pow(c.rope_base(), -2.0 * static_cast<double>(i) / dk);
    if (!on) {
      freqs.push_back(theta);
      continue;
    }
    // g_i: 1 keeps theta_i (it turns often within L), 0 divides it by the factor.
    double g = 0;
    if (y.ramp() == YARN_RAMP_PAPER) {
      const double turns = y.original_seq_len() * theta / (2.0 * M_PI);  // r_i
      g = std::clamp((turns - y.beta_slow()) / (y.beta_fast() - y.beta_slow()), 0.0, 1.0);
    } else {
      g = 1.0 - std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    }
    freqs.push_back((1.0 - g) * theta / y.factor() + g * theta);
  }
  return freqs;
}

double YarnScale(const YarnConfig& y) {
  return y.factor() > 1 ? 0.1 * std::log(y.factor()) + 1.0 : 1.0;
}

torch::Tensor AttentionImpl::CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v, ProbeRecorder* probes) {
  // On CUDA with LibTorch >= 2.1, LibTorch's fused kernels (flash / memory-efficient), unless the
  // probes need the probabilities; the fallback is logged once per model (by its layer 0).
  if (q.is_cuda()) {
    const std::string blocker = compat::FusedAttentionBlocker(q, /*need_probs=*/probes != nullptr);
    if (blocker.empty()) return compat::FusedCausalAttention(q, k, v);
    if (layer_ == 0) {
      compat::LogOnce(this, "model: attention on " + q.device().str() +
                                " takes the unfused path because " + blocker);
    }
  }
  const int64_t T = q.size(2);
  // Built per call, not kept: a (max_seq_len)^2 buffer per layer would be 64 MiB per layer at 4k
  // positions, in memory and in every checkpoint; writing T^2 values is small next to attention.
  const torch::Tensor mask = torch::full({T, T}, -std::numeric_limits<float>::infinity(), q.options())
                                 .triu(/*diagonal=*/1);  // (T, T): 0 or -inf
  auto [out, probs] = ablate::CausalAttention(q, k, v, mask, /*with_probs=*/probes != nullptr);
  if (probes) {
    probes->FirstTokenAttention(layer_, probs.select(3, 0), 0);
    probes->AttentionMaps(layer_, probs);
  }
  return out;
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, ProbeRecorder* probes) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t H = config_.num_heads(), KV = config_.num_kv_heads(), dk = config_.head_dim();
  const GatePosition pos = config_.gate().position();
  const GateMode mode = config_.gate().mode();

  // Every linear projection of x (q, k, v, an input-dependent gate) as one GEMM against the
  // concatenated weights: the same FLOPs in one wide matmul instead of up to four narrow ones.
  const torch::Tensor gate_weight = gate_ ? gate_->ProjectionWeight() : torch::Tensor();
  std::vector<torch::Tensor> weights = {q_proj_->weight};
  if (k_proj_) weights.push_back(k_proj_->weight);
  if (v_proj_) weights.push_back(v_proj_->weight);
  if (gate_weight.defined()) weights.push_back(gate_weight);
  std::vector<int64_t> widths;
  for (const torch::Tensor& w : weights) widths.push_back(w.size(0));
  const std::vector<torch::Tensor> projected =
      weights.size() == 1
          ? std::vector<torch::Tensor>{F::linear(x, AtDtypeOf(weights[0], x))}
          : F::linear(x, AtDtypeOf(torch::cat(weights, 0), x)).split_with_sizes(widths, -1);
  size_t next = 0;
  torch::Tensor q = projected[next++].view({B, T, H, dk});                          // (B, T, H, dk)
  torch::Tensor k = k_proj_ ? projected[next++].view({B, T, KV, dk}) : torch::Tensor();  // (B, T, KV, dk)
  torch::Tensor v = v_proj_ ? projected[next++].view({B, T, KV, dk}) : torch::Tensor();  // (B, T, KV, dk)
  const torch::Tensor gate_projected = gate_weight.defined() ? projected[next] : torch::Tensor();
  if (switch_router_) {
    const SwitchHeadConfig& sh = config_.switchhead();
    torch::Tensor scores =
        torch::sigmoid(switch_router_(x)).view({B, T, KV, sh.num_experts()});  // (B, T, KV, E)
    if (sh.top_k() < sh.num_experts()) {
      torch::Tensor top = std::get<1>(scores.topk(sh.top_k(), -1));
      scores = scores * torch::zeros_like(scores).scatter_(-1, top, 1.0);
    }
    v = switch_v_(x, scores);
    if (switch_k_) k = switch_k_(x, scores);
  }
  if (q_norm_) {
    q = q_norm_(q);
    k = k_norm_(k);
  }

  // Scores of this layer's gate, shaped to broadcast on its target; the probes see them
  // broadcast to the gated tensor, so statistics are per element for every kind of gate.
  // The default sigmoid gate runs as one fused multiply; every other kind as scores.
  const torch::Tensor logits = gate_ ? gate_->SigmoidLogits(x, gate_projected) : torch::Tensor();
  const torch::Tensor gate =
      gate_ && !logits.defined() ? gate_->Scores(x, gate_projected) : torch::Tensor();
  auto gated = [&](const torch::Tensor& target) {
    if (logits.defined()) {
      if (probes) probes->GateScores(layer_, torch::sigmoid(logits).expand_as(target));
      return SigmoidGate(target, logits);
    }
    if (probes) probes->GateScores(layer_, gate.expand_as(target));
    return ApplyGate(target, gate, mode);
  };
  if (pos == GATE_G2) v = gated(v);
  if (pos == GATE_G3) k = gated(k);
  if (pos == GATE_G4) q = gated(q);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  torch::Tensor y = CausalAttention(RopeToHeads(q, scale), RopeToHeads(k, 1.0), v, probes);  // (B, T, H, dk)
  const torch::Tensor sdpa = y;

  switch (config_.attn_output_control()) {
    case CONTROL_HEAD_RMSNORM: y = control_norm_(y); break;
    case CONTROL_SILU: y = F::silu(y); break;
    case CONTROL_FIXED_SCALE:
      y = y * AttnOutputScale(config_);
      break;
    default: break;
  }
  if (pos == GATE_G1) y = gated(y);
  if (probes) {
    const torch::Tensor g1 = pos != GATE_G1 ? torch::Tensor()
                             : logits.defined() ? torch::sigmoid(logits) : gate;
    probes->Sparsity(layer_, sdpa, y, g1);
  }

  torch::Tensor out = o_proj_(y.reshape({B, T, H * dk}));  // (B, T, d_model)
  if (pos == GATE_G5) out = gated(out);
  return out;
}

// ---------------------------------------------------------------------------------------------

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t width, double init_std, double down_std) {
  gate_ = register_module("gate", Linear(d_model, width, init_std));
  up_ = register_module("up", Linear(d_model, width, init_std));
  down_ = register_module("down", Linear(width, d_model, down_std));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) { return down_(SiluMul(gate_(x), up_(x))); }

MoEImpl::MoEImpl(const ModelConfig& c) : moe_(c.moe()) {
  const int64_t E = moe_.num_experts(), d = c.d_model(), w = moe_.expert_dim();
  router_ = register_module("router", Linear(d, E, c.init_std()));
  w_gate_ = register_parameter("w_gate", torch::empty({E, w, d}));
  w_up_ = register_parameter("w_up", torch::empty({E, w, d}));
  w_down_ = register_parameter("w_down", torch::empty({E, d, w}));
  for (const torch::Tensor& w : {w_gate_, w_up_}) InitNormal(w, c.init_std());
  InitNormal(w_down_, OutputInitStd(c));
}

MoEImpl::Routing MoEImpl::Route(const torch::Tensor& x2d) {
  Routing r;
  r.logits = router_(x2d).to(torch::kFloat32);  // (N, E): routing in fp32 under autocast
  r.probs = torch::softmax(r.logits, -1);
  std::tie(r.weights, r.experts) = r.probs.topk(moe_.top_k(), -1);  // (N, k)
  if (moe_.normalize_top_k()) r.weights = r.weights / r.weights.sum(-1, /*keepdim=*/true);
  return r;
}

void MoEImpl::SetCheckpointPass(CheckpointPass pass) { checkpoint_pass = pass; }

void MoEImpl::BeginStep() {
  step_counts_ = torch::Tensor();
  step_assignments_ = 0;
}

torch::Tensor MoEImpl::forward(const torch::Tensor& x, torch::Tensor* aux_loss) {
  const int64_t d = x.size(-1), E = moe_.num_experts(), k = moe_.top_k();
  torch::Tensor x2d = x.reshape({-1, d});  // (N, d)
  const int64_t N = x2d.size(0);
  Routing r = Route(x2d);

  // Group the N*k (token, expert) assignments by expert: one sort, one host sync for counts.
  torch::Tensor flat_expert = r.experts.reshape({-1});                   // (N*k)
  torch::Tensor order = std::get<1>(flat_expert.sort(c10::optional<bool>(true), /*dim=*/0));  // (N*k)
  torch::Tensor token_of = order.div(k, "floor");                        // (N*k)
  torch::Tensor weight_of = r.weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  torch::Tensor counts = torch::bincount(flat_expert, {}, E).cpu();
  const int64_t* count = counts.data_ptr<int64_t>();

  torch::Tensor out = torch::zeros_like(x2d);
  int64_t start = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    torch::Tensor tokens = token_of.slice(0, start, start + n);  // (n)
    torch::Tensor xe = x2d.index_select(0, tokens);              // (n, d)
    torch::Tensor h = F::silu(F::linear(xe, AtDtypeOf(w_gate_[e], xe))) *
                      F::linear(xe, AtDtypeOf(w_up_[e], xe));  // (n, w)
    torch::Tensor ye = F::linear(h, AtDtypeOf(w_down_[e], h)) *
                       weight_of.slice(0, start, start + n).to(h.scalar_type());
    out = out.index_add(0, tokens, ye.to(out.dtype()));
    start += n;
  }

  if (aux_loss != nullptr) {
    // Switch Transformer balance loss: E * sum_e (fraction of assignments to e) * (mean prob).
    // The fraction is a count (no gradient): with BALANCE_GLOBAL_BATCH it covers the step's
    // micro-batches so far; evaluation (no gradients recorded) counts only its own batch.
    torch::Tensor assigned = counts;
    int64_t total = N * k;
    const bool training_pass =
        torch::GradMode::is_enabled() || checkpoint_pass == CheckpointPass::kFirst;
    if (moe_.load_balance_scope() == BALANCE_GLOBAL_BATCH && training_pass &&
        checkpoint_pass != CheckpointPass::kRecompute) {
      torch::Tensor global = counts.clone();  // this rank's; every rank's when data parallel
      if (reducer_) reducer_(global);
      step_counts_ = step_counts_.defined() ? step_counts_ + global : global;
      step_assignments_ += global.sum().item<int64_t>();
      assigned = step_counts_;
      total = step_assignments_;
    }
    torch::Tensor fraction =
        checkpoint_pass == CheckpointPass::kRecompute
            ? checkpoint_fraction_
            : (assigned.to(torch::kFloat64) / static_cast<double>(total)).to(r.probs.options());
    if (checkpoint_pass == CheckpointPass::kFirst) checkpoint_fraction_ = fraction;
    torch::Tensor balance = E * (fraction * r.probs.mean(0)).sum();
    torch::Tensor z = torch::logsumexp(r.logits, -1).pow(2).mean();
    *aux_loss = *aux_loss + moe_.load_balance_coef() * balance + moe_.router_z_coef() * z;
  }
  return out.view(x.sizes());
}

// ---------------------------------------------------------------------------------------------

BlockImpl::BlockImpl(const ModelConfig& c, int layer) : config_(c), layer_(layer) {
  attn_norm_ = register_module("attn_norm", RMSNorm(c.d_model(), c.norm_eps()));
  attn_ = register_module("attn", Attention(c, layer));
  ffn_norm_ = register_module("ffn_norm", RMSNorm(c.d_model(), c.norm_eps()));
  if (c.moe().num_experts() > 0) {
    moe_ = register_module("moe", MoE(c));
  } else {
    ffn_ = register_module("ffn", SwiGLU(c.d_model(), c.ffn_dim(), c.init_std(), OutputInitStd(c)));
  }
  if (c.sandwich_norm()) {
    attn_post_norm_ = register_module("attn_post_norm", RMSNorm(c.d_model(), c.norm_eps()));
    ffn_post_norm_ = register_module("ffn_post_norm", RMSNorm(c.d_model(), c.norm_eps()));
  }
}

torch::Tensor BlockImpl::ToResidual(torch::Tensor h, RMSNorm& post_norm) {
  if (post_norm) h = post_norm(h);
  if (config_.output_clamp() > 0) h = h.clamp(-config_.output_clamp(), config_.output_clamp());
  return h;
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, torch::Tensor* aux_loss,
                                 ProbeRecorder* probes) {
  torch::Tensor a = ToResidual(attn_(attn_norm_(x), probes), attn_post_norm_);  // (B, T, d)
  torch::Tensor h = x + a;
  torch::Tensor normed = ffn_norm_(h);
  torch::Tensor f = ToResidual(moe_ ? moe_(normed, aux_loss) : ffn_(normed), ffn_post_norm_);
  torch::Tensor out = h + f;
  if (probes) probes->Residuals(layer_, a, h, f, out);
  return out;
}

// ---------------------------------------------------------------------------------------------

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Sets the MoE layers' checkpoint pass for the calling thread while alive.
class CheckpointPassGuard {
 public:
  explicit CheckpointPassGuard(MoEImpl::CheckpointPass pass) { MoEImpl::SetCheckpointPass(pass); }
  ~CheckpointPassGuard() { MoEImpl::SetCheckpointPass(MoEImpl::CheckpointPass::kNone); }
};

// One block with its activations recomputed in the backward pass: the forward runs without
// recording (keeping only the block's input), the backward runs the block again recording, and
// back-propagates through that, which also accumulates the block's parameter gradients. Outputs
// {the block's output, its auxiliary loss}.
class CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
 public:
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, BlockImpl* block) {
    CheckpointPassGuard pass(MoEImpl::CheckpointPass::kFirst);
    torch::Tensor aux = torch::zeros({}, x.options().dtype(torch::kFloat32));
    torch::Tensor out = block->forward(x, &aux, nullptr);
    ctx->save_for_backward({x});
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    return {out, aux};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    std::vector<torch::Tensor> outputs, grad_outputs;
    {
      torch::AutoGradMode recording(true);
      CheckpointPassGuard pass(MoEImpl::CheckpointPass::kRecompute);
      torch::Tensor aux = torch::zeros({}, x.options().dtype(torch::kFloat32));
      outputs.push_back(block->forward(x, &aux, nullptr));
      grad_outputs.push_back(grads[0]);
      if (aux.requires_grad() && grads[1].defined()) {
        outputs.push_back(aux);
        grad_outputs.push_back(grads[1]);
      }
    }
    torch::autograd::backward(outputs, grad_outputs);
    block->GradientsDone();
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

TransformerImpl::TransformerImpl(const ModelConfig& c) : config_(c) {
  // The matrices are drawn once every parameter has its name: each from its own stream, seeded by
  // the default generator's seed (torch::manual_seed: the run's) and its name.
  std::vector<PendingInit> pending;
  struct Defer {
    std::vector<PendingInit>* outer;
    explicit Defer(std::vector<PendingInit>* p) : outer(pending_init) { pending_init = p; }
    ~Defer() { pending_init = outer; }
  };
  {
    Defer defer(&pending);
    embedding_ = register_parameter("embedding", torch::empty({c.vocab_size(), c.d_model()}));
    InitNormal(embedding_, c.init_std());
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < c.num_layers(); ++i) blocks_->push_back(Block(c, i));
    final_norm_ = register_module("final_norm", RMSNorm(c.d_model(), c.norm_eps()));
    if (!c.tie_embeddings()) {
      lm_head_ = register_module("lm_head", Linear(c.d_model(), c.vocab_size(), c.init_std()));
    }
  }
  if (pending.empty()) return;
  const uint64_t seed = compat::DefaultCpuSeed();
  torch::NoGradGuard no_grad;
  for (const auto& p : named_parameters()) {
    for (const PendingInit& init : pending) {
      if (!init.tensor.is_same(p.value())) continue;
      init.tensor.normal_(0.0, init.std, compat::CpuGenerator(StreamSeed(seed, p.key())));
    }
  }
}

void TransformerImpl::BeginStep() {
  for (auto& block : *blocks_) block->as<Block>()->BeginStep();
}

void TransformerImpl::SetCountReducer(const MoEImpl::CountReducer& reducer) {
  for (auto& block : *blocks_) block->as<Block>()->SetCountReducer(reducer);
}

void TransformerImpl::SetGradientsDone(const std::function<void(int layer)>& done) {
  for (auto& block : *blocks_) block->as<Block>()->SetGradientsDone(done);
}

std::vector<int> TransformerImpl::ParameterLayers() const {
  std::vector<int> layers;
  for (const auto& p : named_parameters()) {
    int layer = -1;
    // "blocks.7.attn.q.weight": the ModuleList's index.
    if (p.key().rfind("blocks.", 0) == 0) layer = std::stoi(p.key().substr(7));
    layers.push_back(layer);
  }
  return layers;
}

void TransformerImpl::SetComputeDtype(torch::ScalarType dtype) { compute_dtype_ = dtype; }

void TransformerImpl::UseYarn(bool on) {
  for (auto& block : *blocks_) block->as<Block>()->UseYarn(on);
}

TransformerImpl::Output TransformerImpl::forward(const torch::Tensor& tokens,
                                                 ProbeRecorder* probes, bool logits) {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be (B, T), got ", tokens.sizes());
  TORCH_CHECK(tokens.size(1) <= config_.max_seq_len(), "sequence of ", tokens.size(1),
              " tokens exceeds max_seq_len ", config_.max_seq_len());
  Output out;
  out.aux_loss = torch::zeros({}, torch::TensorOptions().device(tokens.device()));
  torch::Tensor x = F::embedding(tokens, embedding_);  // (B, T, d)
  if (compute_dtype_ && x.scalar_type() != *compute_dtype_) x = x.to(*compute_dtype_);
  const bool checkpoint = checkpointing_ && probes == nullptr && torch::GradMode::is_enabled();
  for (auto& block : *blocks_) {
    BlockImpl* b = block->as<Block>();
    if (checkpoint && x.requires_grad()) {
      const tensor_list r = CheckpointedBlock::apply(x, b);
      x = r[0];
      out.aux_loss = out.aux_loss + r[1];
    } else {
      x = b->forward(x, &out.aux_loss, probes);
    }
  }
  out.hidden = final_norm_(x);
  if (logits) out.logits = F::linear(out.hidden, AtDtypeOf(OutputWeight(), out.hidden));
  return out;
}

int64_t CountAllocatedParams(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace ablate
