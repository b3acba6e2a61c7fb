#include "config/model_config.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/eval_config.h"

namespace ablate {

ModelConfig DefaultModelConfig() {
  ModelConfig c;
  c.set_vocab_size(256);
  c.set_num_layers(4);
  c.set_d_model(128);
  c.set_num_heads(4);
  c.set_num_kv_heads(4);
  c.set_head_dim(32);
  c.set_ffn_dim(512);
  c.set_tie_embeddings(true);
  c.set_rope_base(10000.0);
  c.set_norm_eps(1e-6);
  c.set_qk_norm(true);
  c.set_max_seq_len(256);
  c.set_init_std(0.02);
  c.mutable_moe()->set_normalize_top_k(true);
  c.mutable_moe()->set_load_balance_coef(0.01);
  c.mutable_moe()->set_router_z_coef(0.001);
  c.mutable_gate()->set_scale(1.0);
  c.mutable_switchhead();
  c.mutable_yarn()->set_beta_fast(32.0);
  c.mutable_yarn()->set_beta_slow(1.0);
  return c;
}

TrainConfig DefaultTrainConfig() {
  TrainConfig t;
  DataConfig* d = t.mutable_data();
  d->set_val_fraction(0.05);
  d->set_data_seed(1234);
  OptimizerConfig* o = t.mutable_optimizer();
  o->set_lr(3e-3);
  o->set_min_lr(3e-5);
  o->set_warmup_steps(100);
  o->set_beta1(0.9);
  o->set_beta2(0.95);
  o->set_eps(1e-8);
  o->set_weight_decay(0.1);
  o->set_grad_clip(1.0);
  SpikeConfig* s = t.mutable_spike();
  s->set_max_nonfinite_steps(3);
  s->set_catastrophic_factor(10.0);
  s->set_catastrophic_warmup(100);
  s->set_stat_window(128);
  s->set_stat_sigmas(6.0);
  s->set_divergence_factor(2.0);
  s->set_divergence_patience(4);
  s->set_divergence_min_window(100);
  s->set_divergence_window_fraction(0.05);
  t.set_steps(1500);
  t.set_batch_size(16);
  t.set_seq_len(256);
  t.set_grad_accum(1);
  t.set_eval_every(250);
  t.set_eval_batches(8);
  t.set_checkpoint_every(250);
  t.set_log_every(50);
  t.set_device("cpu");
  t.set_attention_map_heads(2);
  return t;
}

RunConfig DefaultRunConfig() {
  RunConfig r;
  *r.mutable_model() = DefaultModelConfig();
  *r.mutable_train() = DefaultTrainConfig();
  return r;
}

namespace {

// Collects every violation, so one run of `expand` names them all.
class Problems {
 public:
  explicit Problems(std::string prefix) : prefix_(std::move(prefix)) {}
  void Add(const std::string& field, const std::string& what) {
    list_.push_back(absl::StrCat(prefix_, field, ": ", what));
  }
  void Positive(const std::string& field, double v) {
    if (!(v > 0)) Add(field, absl::StrCat("must be > 0, got ", v));
  }
  void NonNegative(const std::string& field, double v) {
    if (!(v >= 0)) Add(field, absl::StrCat("must be >= 0, got ", v));
  }
  void AtMost(const std::string& field, int64_t v, int64_t max) {
    if (v > max) Add(field, absl::StrCat("must be <= ", max, ", got ", v));
  }
  absl::Status Status() const {
    if (list_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(list_, "; "));
  }

 private:
  std::string prefix_;
  std::vector<std::string> list_;
};

}  // namespace

int64_t EvalLengthSpan(const TrainConfig& t) {
  int64_t longest = 0;
  for (const int32_t len : t.eval_seq_lens()) longest = std::max<int64_t>(longest, len);
  return static_cast<int64_t>(t.eval_batches()) * t.batch_size() * longest;
}

absl::Status CheckBatchSplits(const TrainConfig& t, int ranks, const std::string& ranks_name) {
  if (ranks <= 1 || t.batch_size() % ranks == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("train.batch_size: ", t.batch_size(),
                                                 " windows cannot be split evenly over ", ranks,
                                                 " ", ranks_name));
}

int64_t GateHeads(const ModelConfig& c) {
  switch (c.gate().position()) {
    case GATE_G1:
    case GATE_G4:
      return c.num_heads();
    case GATE_G2:
    case GATE_G3:
      return c.num_kv_heads();
    case GATE_G5:
      return 1;
    default:
      return 0;
  }
}

int64_t GateScoreWidth(const ModelConfig& c) {
  const GateConfig& g = c.gate();
  if (g.position() == GATE_NONE) return 0;
  if (g.position() == GATE_G5) return c.d_model();
  const int64_t per_head = g.granularity() == GATE_HEADWISE ? 1 : c.head_dim();
  return GateHeads(c) * per_head;
}

std::string DescribeGate(const GateConfig& g) {
  if (g.position() == GATE_NONE) return "none";
  std::string s = absl::StrCat("G", static_cast<int>(g.position()), " ",
                               g.granularity() == GATE_HEADWISE ? "headwise" : "elementwise");
  if (g.sharing() == GATE_HEAD_SHARED) absl::StrAppend(&s, " head-shared");
  if (g.mode() == GATE_ADDITIVE) absl::StrAppend(&s, " additive");
  switch (g.activation()) {
    case GATE_SIGMOID: absl::StrAppend(&s, " sigmoid"); break;
    case GATE_SILU: absl::StrAppend(&s, " silu"); break;
    case GATE_IDENTITY: absl::StrAppend(&s, " identity"); break;
    case GATE_NS_SIGMOID: absl::StrAppend(&s, " ns-sigmoid"); break;
    default: break;
  }
  if (g.input_independent()) absl::StrAppend(&s, " input-independent");
  if (g.init() == GATE_INIT_ZERO) absl::StrAppend(&s, " zero-init");
  if (g.scale() != 0 && g.scale() != 1) absl::StrAppend(&s, " x", g.scale());
  return s;
}

double OutputInitStd(const ModelConfig& c) {
  if (c.init().output_std() != OUTPUT_STD_SCALED || c.num_layers() < 1) return c.init_std();
  return c.init_std() / std::sqrt(2.0 * c.num_layers());
}

absl::StatusOr<double> GateStartScore(const ModelConfig& c) {
  const GateConfig& g = c.gate();
  if (g.position() != GATE_G1 && g.position() != GATE_G2 && g.position() != GATE_G5) {
    return absl::InvalidArgumentError(
        "needs a gate at G1, G2 or G5 (model.gate.position), where W_O can take over its "
        "starting scale; a gate on queries or keys changes the softmax instead");
  }
  if (g.mode() != GATE_MULTIPLICATIVE) {
    return absl::InvalidArgumentError("needs a multiplicative gate (model.gate.mode)");
  }
  if (g.init() != GATE_INIT_ZERO && !g.input_independent()) {
    return absl::InvalidArgumentError(
        "needs a gate whose scores start at a constant: model.gate.init: zero (or an "
        "input-independent gate)");
  }
  double act0 = 0;
  switch (g.activation()) {
    case GATE_SIGMOID:
      act0 = 0.5;
      break;
    case GATE_NS_SIGMOID:
      act0 = 0.75;
      break;
    default:
      break;  // SiLU(0) = 0, identity(0) = 0
  }
  if (act0 == 0) {
    return absl::InvalidArgumentError(
        "needs a gate activation that is not 0 at 0 (sigmoid or ns_sigmoid): SiLU and identity "
        "gates start every score at 0");
  }
  return act0 * (g.scale() != 0 ? g.scale() : 1.0);
}

double SinkEpsilon(const TrainConfig& t) { return t.sink_epsilon() != 0 ? t.sink_epsilon() : 0.3; }

double AttnOutputScale(const ModelConfig& c) {
  return c.attn_output_scale() != 0 ? c.attn_output_scale() : 0.5;
}

absl::Status ValidateModelConfig(const ModelConfig& c, const std::string& prefix) {
  Problems p(prefix);
  if (c.vocab_size() < 2) p.Add("vocab_size", absl::StrCat("must be >= 2, got ", c.vocab_size()));
  p.Positive("num_layers", c.num_layers());
  p.Positive("d_model", c.d_model());
  p.Positive("num_heads", c.num_heads());
  p.Positive("num_kv_heads", c.num_kv_heads());
  p.Positive("head_dim", c.head_dim());
  p.Positive("max_seq_len", c.max_seq_len());
  p.Positive("rope_base", c.rope_base());
  p.Positive("norm_eps", c.norm_eps());
  p.Positive("init_std", c.init_std());
  p.NonNegative("output_clamp", c.output_clamp());
  if (c.num_heads() > 0 && c.num_kv_heads() > 0 && c.num_heads() % c.num_kv_heads() != 0) {
    p.Add("num_kv_heads", absl::StrCat("must divide num_heads (", c.num_heads(), " query heads, ",
                                       c.num_kv_heads(), " KV heads)"));
  }
  if (c.head_dim() > 0 && c.head_dim() % 2 != 0) {
    p.Add("head_dim", absl::StrCat("must be even for RoPE, got ", c.head_dim()));
  }
  // Bounds that keep parameter counts exact (found with tests/fuzz/spec_fuzz: int64 overflow).
  p.AtMost("vocab_size", c.vocab_size(), kMaxVocabSize);
  p.AtMost("num_layers", c.num_layers(), kMaxNumLayers);
  p.AtMost("d_model", c.d_model(), kMaxDModel);
  p.AtMost("num_heads", c.num_heads(), kMaxNumHeads);
  p.AtMost("num_kv_heads", c.num_kv_heads(), kMaxNumHeads);
  p.AtMost("head_dim", c.head_dim(), kMaxHeadDim);
  p.AtMost("ffn_dim", c.ffn_dim(), kMaxFfnDim);
  p.AtMost("moe.num_experts", c.moe().num_experts(), kMaxExperts);
  p.AtMost("moe.expert_dim", c.moe().expert_dim(), kMaxFfnDim);
  p.AtMost("switchhead.num_experts", c.switchhead().num_experts(), kMaxSwitchHeadExperts);

  const MoeConfig& moe = c.moe();
  if (moe.num_experts() < 0) p.Add("moe.num_experts", "must be >= 0");
  if (moe.num_experts() == 0) {
    p.Positive("ffn_dim", c.ffn_dim());
  } else {
    if (moe.top_k() < 1 || moe.top_k() > moe.num_experts()) {
      p.Add("moe.top_k", absl::StrCat("must be in [1, moe.num_experts = ", moe.num_experts(),
                                      "], got ", moe.top_k()));
    }
    p.Positive("moe.expert_dim", moe.expert_dim());
    p.NonNegative("moe.load_balance_coef", moe.load_balance_coef());
    p.NonNegative("moe.router_z_coef", moe.router_z_coef());
  }

  const GateConfig& g = c.gate();
  if (!GatePosition_IsValid(g.position())) p.Add("gate.position", "unknown value");
  if (g.position() == GATE_G5) {
    if (g.granularity() == GATE_HEADWISE) {
      p.Add("gate.granularity", "HEADWISE is not allowed at G5 (after W_O there are no heads)");
    }
    if (g.sharing() == GATE_HEAD_SHARED) {
      p.Add("gate.sharing", "HEAD_SHARED is not allowed at G5 (after W_O there are no heads)");
    }
  }
  // 0 is read as 1: a config written before the field existed.
  if (g.scale() != 0 && g.scale() != 1 && g.scale() != 2) {
    p.Add("gate.scale", absl::StrCat("must be 1 (scores act(x)) or 2 (2 act(x): with a zero init, "
                                     "a sigmoid gate starts as the identity), got ", g.scale()));
  }
  if (!GateInit_IsValid(g.init())) p.Add("gate.init", "unknown value");
  if (g.input_independent() && g.sharing() == GATE_HEAD_SHARED) {
    p.Add("gate.sharing", "HEAD_SHARED has no meaning for an input_independent gate");
  }
  if (g.position() == GATE_NONE &&
      (g.granularity() != GATE_ELEMENTWISE || g.sharing() != GATE_HEAD_SPECIFIC ||
       g.mode() != GATE_MULTIPLICATIVE || g.activation() != GATE_SIGMOID ||
       g.input_independent() || g.init() != GATE_INIT_NORMAL ||
       (g.scale() != 0 && g.scale() != 1))) {
    p.Add("gate.position", "is NONE but other gate fields are set; set a position (G1..G5)");
  }

  if (!AttnOutputControl_IsValid(c.attn_output_control())) {
    p.Add("attn_output_control", "unknown value");
  }
  if (c.attn_output_scale() != 0) {
    if (c.attn_output_control() != CONTROL_FIXED_SCALE) {
      p.Add("attn_output_scale", "is read only with attn_output_control FIXED_SCALE: leave it out");
    } else if (!(c.attn_output_scale() > 0 && c.attn_output_scale() <= 1e6)) {
      p.Add("attn_output_scale",
            absl::StrCat("must be in (0, 1e6] (0: the default 0.5), got ", c.attn_output_scale()));
    }
  }
  if (!OutputStd_IsValid(c.init().output_std())) p.Add("init.output_std", "unknown value");

  const SwitchHeadConfig& sh = c.switchhead();
  if (sh.target() != SWITCHHEAD_NONE) {
    if (sh.num_experts() < 1) {
      p.Add("switchhead.num_experts", absl::StrCat("must be >= 1, got ", sh.num_experts()));
    }
    if (sh.top_k() < 1 || sh.top_k() > sh.num_experts()) {
      p.Add("switchhead.top_k", absl::StrCat("must be in [1, switchhead.num_experts = ",
                                             sh.num_experts(), "], got ", sh.top_k()));
    }
  } else if (sh.num_experts() != 0 || sh.top_k() != 0) {
    p.Add("switchhead.target", "is NONE but num_experts/top_k are set; set target V or KV");
  }

  const YarnConfig& y = c.yarn();
  if (y.factor() != 0) {
    if (!(y.factor() > 1 && y.factor() <= 1e6)) {
      p.Add("yarn.factor", absl::StrCat("must be 0 (off) or in (1, 1e6], got ", y.factor()));
    }
    if (y.original_seq_len() < 1 || y.original_seq_len() > c.max_seq_len()) {
      p.Add("yarn.original_seq_len",
            absl::StrCat("must be in [1, max_seq_len = ", c.max_seq_len(), "] with yarn.factor, got ",
                         y.original_seq_len()));
    }
    if (!(y.beta_slow() > 0 && y.beta_fast() > y.beta_slow() && y.beta_fast() <= 1e6)) {
      p.Add("yarn.beta_fast", absl::StrCat("must exceed yarn.beta_slow > 0, got beta_fast ",
                                           y.beta_fast(), ", beta_slow ", y.beta_slow()));
    }
    if (!YarnApply_IsValid(y.apply())) p.Add("yarn.apply", "unknown value");
    if (!YarnRamp_IsValid(y.ramp())) p.Add("yarn.ramp", "unknown value");
  } else if (y.original_seq_len() != 0 || y.apply() != YARN_BEYOND_ORIGINAL ||
             y.ramp() != YARN_RAMP_REFERENCE) {
    p.Add("yarn.factor",
          "is 0 (off) but yarn.original_seq_len, apply or ramp is set; set a factor > 1");
  }
  return p.Status();
}

absl::Status ValidateTrainConfig(const TrainConfig& t, const std::string& prefix) {
  Problems p(prefix);
  p.Positive("steps", t.steps());
  p.Positive("batch_size", t.batch_size());
  p.Positive("seq_len", t.seq_len());
  p.Positive("grad_accum", t.grad_accum());
  p.Positive("eval_every", t.eval_every());
  p.Positive("eval_batches", t.eval_batches());
  p.NonNegative("checkpoint_every", t.checkpoint_every());
  p.Positive("log_every", t.log_every());
  p.NonNegative("threads", t.threads());
  const std::string& dev = t.device();
  const bool cuda_ok =
      dev == "cuda" || (dev.rfind("cuda:", 0) == 0 && dev.size() > 5 &&
                        dev.find_first_not_of("0123456789", 5) == std::string::npos);
  if (dev != "cpu" && !cuda_ok) {
    p.Add("device", absl::StrCat("must be cpu, cuda or cuda:N, got \"", dev, "\""));
  }
  if (!Precision_IsValid(t.precision())) p.Add("precision", "unknown value");
  const DataConfig& d = t.data();
  if (!TokenDtype_IsValid(d.token_dtype())) p.Add("data.token_dtype", "unknown value");
  if (!DataFormat_IsValid(d.format())) p.Add("data.format", "unknown value");
  if (d.has_eod_token() && d.eod_token() < 0) {
    p.Add("data.eod_token", absl::StrCat("must be >= 0, got ", d.eod_token()));
  }
  if (!(d.val_fraction() > 0 && d.val_fraction() < 1)) {
    p.Add("data.val_fraction", absl::StrCat("must be in (0, 1), got ", d.val_fraction()));
  }
  const OptimizerConfig& o = t.optimizer();
  p.Positive("optimizer.lr", o.lr());
  p.NonNegative("optimizer.min_lr", o.min_lr());
  if (o.min_lr() > o.lr()) p.Add("optimizer.min_lr", "must be <= optimizer.lr");
  p.NonNegative("optimizer.warmup_steps", o.warmup_steps());
  if (!(o.beta1() >= 0 && o.beta1() < 1)) p.Add("optimizer.beta1", "must be in [0, 1)");
  if (!(o.beta2() >= 0 && o.beta2() < 1)) p.Add("optimizer.beta2", "must be in [0, 1)");
  p.Positive("optimizer.eps", o.eps());
  p.NonNegative("optimizer.weight_decay", o.weight_decay());
  p.NonNegative("optimizer.grad_clip", o.grad_clip());
  const SpikeConfig& s = t.spike();
  p.Positive("spike.max_nonfinite_steps", s.max_nonfinite_steps());
  if (!(s.catastrophic_factor() > 1)) p.Add("spike.catastrophic_factor", "must be > 1");
  p.Positive("spike.catastrophic_warmup", s.catastrophic_warmup());
  if (s.stat_window() < 2) p.Add("spike.stat_window", "must be >= 2");
  p.Positive("spike.stat_sigmas", s.stat_sigmas());
  if (!(s.divergence_factor() > 1)) p.Add("spike.divergence_factor", "must be > 1");
  p.Positive("spike.divergence_patience", s.divergence_patience());
  p.Positive("spike.divergence_min_window", s.divergence_min_window());
  if (!(s.divergence_window_fraction() >= 0 && s.divergence_window_fraction() <= 1)) {
    p.Add("spike.divergence_window_fraction", "must be in [0, 1]");
  }
  p.NonNegative("spike.rollback_skip_batches", s.rollback_skip_batches());
  if (t.eval_seq_lens_size() > kMaxEvalSeqLens) {
    p.Add("eval_seq_lens", absl::StrCat("at most ", kMaxEvalSeqLens, " lengths, got ",
                                        t.eval_seq_lens_size()));
  }
  std::vector<int32_t> seen;
  for (int i = 0; i < t.eval_seq_lens_size(); ++i) {
    const int32_t len = t.eval_seq_lens(i);
    if (len < 1) p.Add(absl::StrCat("eval_seq_lens[", i, "]"), absl::StrCat("must be >= 1, got ", len));
    if (std::find(seen.begin(), seen.end(), len) != seen.end()) {
      p.Add(absl::StrCat("eval_seq_lens[", i, "]"), absl::StrCat(len, " is listed twice"));
    }
    seen.push_back(len);
  }
  p.NonNegative("loss_chunk_tokens", t.loss_chunk_tokens());
  if (t.shard_gradients() && !(t.shard_optimizer() && t.activation_checkpointing())) {
    p.Add("shard_gradients",
          "needs shard_optimizer: true and activation_checkpointing: true (a block's gradients are "
          "reduced as its recomputed backward ends)");
  }
  if (t.sink_epsilon() != 0 && !(t.sink_epsilon() > 0 && t.sink_epsilon() < 1)) {
    p.Add("sink_epsilon",
          absl::StrCat("must be in (0, 1) (a share of attention), got ", t.sink_epsilon()));
  }
  if (t.attention_map_heads() < -1 || t.attention_map_heads() > kMaxNumHeads) {
    p.Add("attention_map_heads",
          absl::StrCat("must be -1 (every head), 0 (none) or a count of heads up to ", kMaxNumHeads,
                       ", got ", t.attention_map_heads()));
  }
  return p.Status();
}

int AttentionMapsPerLayer(int map_heads, int num_heads) {
  if (map_heads == 0) return 0;
  return (map_heads < 0 ? num_heads : std::min(map_heads, num_heads)) + 1;
}

absl::Status ValidateRunConfig(const RunConfig& r) {
  std::vector<std::string> problems;
  for (const absl::Status& s : {ValidateModelConfig(r.model()), ValidateTrainConfig(r.train())}) {
    if (!s.ok()) problems.emplace_back(s.message());
  }
  if (absl::Status s = ValidateEvalTasks(r); !s.ok()) problems.emplace_back(s.message());
  if (r.train().seq_len() > r.model().max_seq_len()) {
    problems.push_back(absl::StrCat("train.seq_len: ", r.train().seq_len(),
                                    " exceeds model.max_seq_len ", r.model().max_seq_len()));
  }
  for (int i = 0; i < r.train().eval_seq_lens_size(); ++i) {
    if (r.train().eval_seq_lens(i) > r.model().max_seq_len()) {
      problems.push_back(absl::StrCat("train.eval_seq_lens[", i, "]: ", r.train().eval_seq_lens(i),
                                      " exceeds model.max_seq_len ", r.model().max_seq_len()));
    }
  }
  const int64_t maps = static_cast<int64_t>(r.model().num_layers()) *
                       AttentionMapsPerLayer(r.train().attention_map_heads(), r.model().num_heads());
  if (maps > kMaxAttentionMaps) {
    problems.push_back(absl::StrCat(
        "train.attention_map_heads: ", r.train().attention_map_heads(), " asks for ", maps,
        " attention maps per evaluation (", r.model().num_layers(),
        " layers x the heads and their mean); the limit is ", kMaxAttentionMaps,
        ": ask for fewer heads"));
  }
  if (r.train().init_from().preserve_function()) {
    const InitFrom& from = r.train().init_from();
    if (from.checkpoint().empty() && from.sweep().empty()) {
      problems.push_back(
          "train.init_from.preserve_function: needs a source (train.init_from.sweep or "
          "checkpoint)");
    } else if (absl::StatusOr<double> c = GateStartScore(r.model()); !c.ok()) {
      problems.push_back(absl::StrCat("train.init_from.preserve_function: ", c.status().message()));
    }
  }
  if (const DataConfig& d = r.train().data();
      d.has_eod_token() && d.eod_token() >= r.model().vocab_size()) {
    problems.push_back(absl::StrCat("train.data.eod_token: ", d.eod_token(),
                                    " is outside the vocabulary [0, ", r.model().vocab_size(),
                                    ")"));
  }
  if (r.train().data().format() == DATA_TEXT && r.model().vocab_size() < 256) {
    problems.push_back(absl::StrCat("model.vocab_size: byte-level text needs >= 256, got ",
                                    r.model().vocab_size()));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

}  // namespace ablate
