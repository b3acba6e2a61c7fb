#include "config/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/text_format.h"
#include "config/model_config.h"
#include "config/param_count.h"

namespace ablate {

namespace {

// Which implementation of the model's ops a run takes, and so what they keep for the backward.
enum class OpPath {
  kCpuFused,  // fp32 on the CPU: worker/model/fused_ops.cc's kernels
  kEager,     // bf16 on the CPU: LibTorch's eager ops (fused_ops.h's reference versions)
  kCuda,      // CUDA: LibTorch's fused attention, eager elementwise ops
};

struct Precisions {
  double act = 4;       // bytes of an activation element
  double residual = 4;  // of the residual stream
};

// Bytes one token keeps for the backward pass in one layer.
double LayerBytesPerToken(const ModelConfig& c, OpPath path, const Precisions& p) {
  const double d = c.d_model(), q = c.num_heads() * static_cast<double>(c.head_dim());
  const double kv = c.num_kv_heads() * static_cast<double>(c.head_dim());
  const double heads = c.num_heads(), kv_heads = c.num_kv_heads();
  const double a = p.act, r = p.residual, f32 = 4, i64 = 8;
  double bytes = 0;
  // An RMSNorm over `width`: the fused kernel keeps its input and one fp32 scale per row; the
  // eager one (bf16) keeps an fp32 copy of the input and its normalised output; on CUDA (fp32
  // or autocast) its input, the scale and the normalised product.
  const auto norm = [&](double width, double rows_per_token, double in_bytes) {
    switch (path) {
      case OpPath::kCpuFused:
        return width * in_bytes + rows_per_token * f32;
      case OpPath::kEager:
        return width * (f32 + a) + rows_per_token * f32;
      case OpPath::kCuda:
        return width * 2 * in_bytes + rows_per_token * f32;
    }
    return 0.0;
  };

  // Attention. The pre-norm keeps the block's input, the fused projection keeps its input.
  bytes += norm(d, 1, r) + d * a;
  const SwitchHeadConfig& sh = c.switchhead();
  if (sh.target() != SWITCHHEAD_NONE) {
    const double e = sh.num_experts(), mixed = sh.target() == SWITCHHEAD_KV ? 2 : 1;
    bytes += 2 * kv_heads * e * a;                 // router scores and the top-k mask
    bytes += mixed * (kv * e + kv_heads * e) * a;  // each mixture's expert outputs, scores
  }
  if (c.qk_norm()) bytes += norm(q, heads, a) + norm(kv, kv_heads, a);  // contiguous copies
  switch (path) {
    case OpPath::kCpuFused:
      bytes += (q + 2 * kv) * a;  // rotated q and k, v made contiguous: what the kernel keeps
      break;
    case OpPath::kEager:
      // RoPE's outputs, and k and v repeated to the query heads (the probabilities, T^2 per
      // head, are in LayerBytesPerMicroBatch).
      bytes += (q + kv) * a + 2 * q * a;
      break;
    case OpPath::kCuda:
      // Rotated q, k and v expanded to the query heads, the output, and one fp32 log-sum-exp
      // per head.
      bytes += 4 * q * a + heads * f32;
      break;
  }
  const GateConfig& g = c.gate();
  const double gate_width = static_cast<double>(GateScoreWidth(c));
  if (c.attn_output_control() == CONTROL_HEAD_RMSNORM) bytes += norm(q, heads, a);
  if (c.attn_output_control() == CONTROL_SILU || c.attn_output_control() == CONTROL_FIXED_SCALE) {
    bytes += q * a;
  }
  if (g.position() == GATE_NONE) {
    bytes += q * a;  // W_O's input
  } else {
    const double target = g.position() == GATE_G5   ? d
                          : g.position() == GATE_G1 ? q
                          : g.position() == GATE_G4 ? q
                                                    : kv;
    // The gated tensor (W_O's input at G1) and the scores; an eager gate keeps its input too.
    const bool fused = path == OpPath::kCpuFused && !g.input_independent() &&
                       g.mode() == GATE_MULTIPLICATIVE && g.activation() == GATE_SIGMOID &&
                       g.sharing() != GATE_HEAD_SHARED && g.position() != GATE_G5;
    bytes += target * a + (g.input_independent() ? 0 : gate_width * a) + (fused ? 0 : target * a);
    if (g.position() != GATE_G1) bytes += q * a;  // W_O's input
  }
  if (c.sandwich_norm()) bytes += 2 * norm(d, 1, a);
  if (c.output_clamp() > 0) bytes += 2 * d * a;  // each clamp keeps its input

  // FFN: the pre-norm keeps the residual after attention, the FFN's matmuls the norm's output.
  bytes += norm(d, 1, r) + d * a;
  const MoeConfig& moe = c.moe();
  if (moe.num_experts() == 0) {
    bytes += 4 * c.ffn_dim() * a;  // gate and up outputs, their product; silu's sigmoid (fused)
  } else {
    const double e = moe.num_experts(), k = moe.top_k(), w = moe.expert_dim();
    bytes += 3 * e * f32 + 3 * k * i64;  // router logits, probabilities, z-loss; top-k indices
    // Each of a token's k assignments: the gathered input, gate and up outputs, silu's output,
    // their product, and the weighted output.
    bytes += k * (2 * d + 4 * w) * a + k * f32;
  }
  return bytes;
}

// Bytes one layer keeps whatever the batch: the causal mask on the CPU (T x T fp32).
double LayerBytesPerMicroBatch(const ModelConfig& c, OpPath path, int64_t rows, int64_t seq) {
  const double t = static_cast<double>(seq);
  switch (path) {
    case OpPath::kCpuFused:
      return t * t * 4;
    case OpPath::kEager:  // the mask, fp32 probabilities and their bf16 copy, per head
      return t * t * 4 + static_cast<double>(rows) * c.num_heads() * t * t * (4 + 2);
    case OpPath::kCuda:
      return 0;
  }
  return 0;
}

// Whole bytes. A plan past an exabyte (a fuzzed or mistyped shape) saturates there, so that the
// sums of a few fields below stay inside int64 and the verdict is still "does not fit".
int64_t Round(double bytes) {
  constexpr double kMaxBytes = 1e18;
  if (!(bytes > 0)) return 0;  // also NaN
  return bytes >= kMaxBytes ? static_cast<int64_t>(kMaxBytes) : std::llround(bytes);
}

}  // namespace

MemoryPlan PlanMemory(const RunConfig& config, int devices) {
  const ModelConfig& c = config.model();
  const TrainConfig& t = config.train();
  const int ranks = std::max(1, devices);
  const bool cuda = t.device().rfind("cuda", 0) == 0;
  const bool bf16 = t.precision() == PRECISION_BF16;
  const bool autocast = t.precision() == PRECISION_BF16_AUTOCAST && cuda;
  const OpPath path = cuda ? OpPath::kCuda : bf16 ? OpPath::kEager : OpPath::kCpuFused;
  Precisions p;
  if (bf16) p = {2, 2};
  if (autocast) p = {2, 4};  // matmul outputs bf16, the residual stream fp32

  const ParamCount count = CountParams(c);
  const double params = static_cast<double>(count.total());
  MemoryPlan plan;
  // fp32 master weights. With bf16 compute each matmul keeps the bf16 copy of its weight for the
  // backward: a copy of every weight at the peak; autocast's cast cache keeps them all until the
  // step's forward ends, checkpointed or not. PRECISION_BF16 with checkpointing keeps one
  // block's copies (the block being recomputed) and the output projection's.
  double copies = 0;
  if (autocast || (bf16 && !t.activation_checkpointing())) copies = params * 2;
  if (bf16 && t.activation_checkpointing()) {
    const ParamBreakdown& b = count.breakdown();
    const double per_layer =
        static_cast<double>(b.attention() + b.gate() + b.ffn()) / std::max(1, c.num_layers());
    copies =
        (per_layer + static_cast<double>(c.tie_embeddings() ? b.embedding() : b.lm_head())) * 2;
  }
  plan.set_parameters(Round(params * 4 + copies));
  const int shards = t.shard_optimizer() ? ranks : 1;
  const double bucket = std::min(params, static_cast<double>(kShardBucketElements));
  if (t.shard_gradients() && t.shard_optimizer() && t.activation_checkpointing()) {
    // ZeRO-2: the rank's shard, and at the peak the gradients not yet reduced: the parameters
    // outside the blocks' (reduced when the backward ends), the block being back-propagated, and
    // up to a bucket of finished blocks' waiting for the rest of their bucket.
    const ParamBreakdown& b = count.breakdown();
    const double outside = static_cast<double>(b.embedding() + b.lm_head()) + 2.0 * c.d_model();
    const double per_layer = (params - outside) / std::max(1, c.num_layers());
    plan.set_gradients(
        Round(std::min(params, std::ceil(params / shards) + outside + per_layer + bucket) * 4));
  } else {
    plan.set_gradients(Round(params * 4));
  }
  // AdamW's exp_avg and exp_avg_sq; sharded, also the averaged gradient of the rank's shard
  // (ZeRO-2 counts it among the gradients).
  const bool gradient_shard = t.shard_optimizer() && !t.shard_gradients();
  plan.set_optimizer(Round(std::ceil(params / shards) * (gradient_shard ? 12 : 8)));

  const int64_t rows = std::max<int64_t>(1, t.batch_size() / ranks);
  const int64_t seq = t.seq_len();
  const double tokens = static_cast<double>(rows) * static_cast<double>(seq);
  const double layer =
      LayerBytesPerToken(c, path, p) * tokens + LayerBytesPerMicroBatch(c, path, rows, seq);
  const double layers = c.num_layers();
  // Outside the layers: the token ids and targets, the final norm and its output, and the fp32
  // log-probabilities the loss keeps (a chunked loss keeps none: its logsumexp per token).
  const double vocab = c.vocab_size();
  const int64_t chunk = t.loss_chunk_tokens();
  const double outside =
      tokens * (2 * 8 + (c.d_model() * (p.residual + p.act) + 4) + (chunk > 0 ? 4 : vocab * 4));
  plan.set_activations(Round(layers * layer + outside));
  // Checkpointed: each block's input, and one block's activations at a time in the backward.
  plan.set_activations_checkpointed(
      Round(layers * tokens * c.d_model() * p.residual + layer + outside));

  // The largest transient beside them: the logits and the loss's gradient of them (at the end of
  // the forward and the start of the backward); data parallel, the flat copy of every gradient
  // the all-reduce sums (sharded: of one bucket, and the all-gather's); AdamW's temporaries, of
  // the largest weight (sharded: of the rank's whole shard).
  // Chunked (TrainConfig.loss_chunk_tokens): one chunk's, fp32 with its softmax in the
  // backward; in bf16 also the bf16 copy of the output weight and a chunk's bf16 gradient of it.
  const double logit_rows = chunk > 0 ? std::min<double>(tokens, chunk) : tokens;
  double logits = logit_rows * vocab * (bf16 || autocast ? 4 + 2 + 4 : 4 + 4);
  if (chunk > 0 && (bf16 || autocast)) logits += 2 * vocab * c.d_model() * 2;
  const double flat = ranks == 1 ? 0 : t.shard_optimizer() ? 2 * bucket * 4 : params * 4;
  double largest_weight = static_cast<double>(c.vocab_size()) * c.d_model();
  if (c.moe().num_experts() > 0) {
    largest_weight = std::max(largest_weight, static_cast<double>(c.moe().num_experts()) *
                                                  c.moe().expert_dim() * c.d_model());
  }
  const double optimizer_temp =
      t.shard_optimizer() ? 2 * std::ceil(params / shards) * 4 : 2 * largest_weight * 4;
  plan.set_largest_temporary(Round(std::max({logits, flat, optimizer_temp})));

  const double resident = static_cast<double>(plan.parameters()) +
                          static_cast<double>(plan.gradients()) +
                          static_cast<double>(plan.optimizer());
  // The forward's end holds the activations kept for the backward and the logits (checkpointed:
  // the blocks' inputs, no block's activations yet); a checkpointed backward then holds one
  // block's at a time, the logits gone; the all-reduce and the optimizer's temporaries come
  // after the backward has freed them.
  const double kept = t.activation_checkpointing()
                          ? static_cast<double>(plan.activations_checkpointed())
                          : static_cast<double>(plan.activations());
  const double forward_end = t.activation_checkpointing() ? kept - layer + logits : kept + logits;
  plan.set_per_device(Round(resident + std::max({forward_end, kept, flat, optimizer_temp})));
  return plan;
}

absl::StatusOr<int64_t> ParseMemorySize(const std::string& text) {
  const std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  absl::string_view s = upper;
  struct Unit {
    const char* suffix;
    double scale;
  };
  static const Unit kUnits[] = {{"TIB", 1099511627776.0},
                                {"GIB", 1073741824.0},
                                {"MIB", 1048576.0},
                                {"TB", 1e12},
                                {"GB", 1e9},
                                {"MB", 1e6},
                                {"T", 1e12},
                                {"G", 1e9},
                                {"M", 1e6}};
  double scale = 1e9;  // a plain number is GB, as resources.memory_gb
  for (const Unit& u : kUnits) {
    if (absl::ConsumeSuffix(&s, u.suffix)) {
      scale = u.scale;
      break;
    }
  }
  s = absl::StripAsciiWhitespace(s);
  double value = 0;
  if (!absl::SimpleAtod(s, &value) || !(value > 0) || value * scale > 9.0e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory size \"", text,
                     "\": expected a positive number with an optional unit (80GB, "
                     "141GiB, 512MB)"));
  }
  return static_cast<int64_t>(value * scale);
}

absl::Status CheckMemoryFits(const std::string& run, const RunConfig& config, int devices,
                             const MemoryPlan& plan, int64_t limit_bytes) {
  if (limit_bytes <= 0 || plan.per_device() <= limit_bytes) return absl::OkStatus();
  const TrainConfig& t = config.train();
  const int ranks = std::max(1, devices);
  const bool checkpointing = t.activation_checkpointing();
  std::string message = absl::StrCat(
      run, ": needs ", FormatBytes(plan.per_device()), " per device by the memory plan, over the ",
      FormatBytes(limit_bytes), " it may use (parameters ", FormatBytes(plan.parameters()),
      ", gradients ", FormatBytes(plan.gradients()), ", optimizer ", FormatBytes(plan.optimizer()),
      ", activations ",
      FormatBytes(checkpointing ? plan.activations_checkpointed() : plan.activations()),
      ", largest temporary ", FormatBytes(plan.largest_temporary()), ")");
  // What each setting alone would give, from the plan of the changed config.
  std::vector<std::string> fixes;
  // Each setting that would lower the figure, with the figure it would give.
  const auto try_fix = [&](const std::string& what, RunConfig changed, int changed_devices) {
    const MemoryPlan p = PlanMemory(changed, changed_devices);
    if (p.per_device() >= plan.per_device()) return;
    fixes.push_back(absl::StrCat(what, " (", FormatBytes(p.per_device()),
                                 p.per_device() <= limit_bytes ? ", fits" : "", ")"));
  };
  if (!checkpointing) {
    RunConfig c = config;
    c.mutable_train()->set_activation_checkpointing(true);
    try_fix("train.activation_checkpointing: true", c, ranks);
  }
  const int64_t rows = t.batch_size() / ranks;
  if (rows > 1) {
    // A quarter of the micro-batch, the same global batch: grad_accum x4, batch_size / 4.
    int split = 2;
    while (split < 8 && rows % (split * 2) == 0) split *= 2;
    if (rows % split == 0) {
      RunConfig c = config;
      c.mutable_train()->set_batch_size(t.batch_size() / split);
      c.mutable_train()->set_grad_accum(t.grad_accum() * split);
      try_fix(absl::StrCat("train.grad_accum: ", t.grad_accum() * split, " with train.batch_size: ",
                           t.batch_size() / split, " (the same tokens per step)"),
              c, ranks);
    }
  }
  if (!t.shard_optimizer() || ranks < 8) {
    RunConfig c = config;
    c.mutable_train()->set_shard_optimizer(true);
    const int more = std::max(8, ranks * 2);
    if (t.batch_size() % more == 0) {
      try_fix(absl::StrCat("resources.devices: ", more, " with train.shard_optimizer: true"), c,
              more);
    } else {
      try_fix(absl::StrCat("train.shard_optimizer: true"), c, ranks);
    }
  }
  if (t.loss_chunk_tokens() == 0) {
    RunConfig c = config;
    c.mutable_train()->set_loss_chunk_tokens(1024);
    try_fix("train.loss_chunk_tokens: 1024", c, ranks);
  }
  if (!t.shard_gradients() && ranks > 1) {
    RunConfig c = config;
    c.mutable_train()->set_shard_optimizer(true);
    c.mutable_train()->set_shard_gradients(true);
    c.mutable_train()->set_activation_checkpointing(true);
    try_fix(absl::StrCat("train.shard_gradients: true",
                         t.shard_optimizer() && checkpointing
                             ? ""
                             : " (with train.shard_optimizer and train.activation_checkpointing)"),
            c, ranks);
  }
  if (!fixes.empty()) {
    absl::StrAppend(&message, "; try ", absl::StrJoin(fixes, ", or "));
  } else {
    absl::StrAppend(
        &message,
        "; neither checkpointing, a smaller micro-batch, a chunked loss nor "
        "sharding the optimizer's state and the gradients lowers it: its weights alone take ",
        FormatBytes(plan.parameters()),
        ", which only sharding them (ZeRO-3) or its experts (expert parallelism) "
        "would shrink, and ablate does neither");
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace ablate
