#include "worker/model/probes.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "config/model_config.h"

namespace ablate {

namespace {

// Histogram range by activation: sigmoid-like scores live in [0, 1]; others get a wide window
// and values outside land in the edge bins.
void HistogramRange(GateActivation activation, double* lo, double* hi) {
  switch (activation) {
    case GATE_SILU: *lo = -0.5; *hi = 4.0; return;
    case GATE_IDENTITY: *lo = -4.0; *hi = 4.0; return;
    default: *lo = 0.0; *hi = 1.0; return;
  }
}

int64_t CountBelow(const torch::Tensor& abs_values, double threshold) {
  return (abs_values < threshold).sum().item<int64_t>();
}

}  // namespace

ProbeRecorder::ProbeRecorder(const ModelConfig& config, int map_heads, double sink_epsilon)
    : map_heads_(map_heads < 0 ? config.num_heads() : std::min(map_heads, config.num_heads())),
      sink_epsilon_(sink_epsilon),
      layers_(config.num_layers()) {
  HistogramRange(config.gate().activation(), &hist_lo_, &hist_hi_);
  for (Layer& l : layers_) l.histogram.assign(kHistogramBins, 0);
}

void ProbeRecorder::SetQueryClasses(const at::Tensor& classes, std::vector<std::string> names) {
  if (!classes.defined()) {
    classes_.reset();
    return;
  }
  class_names_ = std::move(names);
  classes_ = std::make_shared<at::Tensor>(classes.detach().to(torch::kCPU, torch::kLong));
  const size_t k = class_names_.size();
  for (Layer& l : layers_) {
    for (auto* v : {&l.class_attn_sum, &l.class_gate_sum}) v->resize(k, 0.0);
    for (auto* v : {&l.class_queries, &l.class_attn_n, &l.class_gate_n}) v->resize(k, 0);
  }
}

void ProbeRecorder::AddByClass(const at::Tensor& values, int64_t first, std::vector<double>* sums,
                               std::vector<int64_t>* counts) const {
  if (!classes_ || values.size(0) != classes_->size(0)) return;
  const int64_t n = values.size(1);
  if (first + n > classes_->size(1)) return;
  const torch::Tensor cls = classes_->slice(1, first, first + n);
  for (size_t c = 0; c < class_names_.size(); ++c) {
    torch::Tensor mask = cls == static_cast<int64_t>(c);
    if (first == 0) mask.select(1, 0).fill_(false);  // query 0 attends to key 0 alone
    (*sums)[c] += values.masked_select(mask).sum().item<double>();
    (*counts)[c] += mask.sum().item<int64_t>();
  }
}

void ProbeRecorder::GateScores(int layer, const at::Tensor& scores) {
  Layer& l = layers_.at(layer);
  torch::Tensor s = scores.detach().to(torch::kCPU, torch::kFloat64).reshape({-1});
  const double mn = s.min().item<double>(), mx = s.max().item<double>();
  l.gate_min = l.gate_n == 0 ? mn : std::min(l.gate_min, mn);
  l.gate_max = l.gate_n == 0 ? mx : std::max(l.gate_max, mx);
  l.gate_sum += s.sum().item<double>();
  l.gate_sq_sum += s.pow(2).sum().item<double>();
  l.gate_n += s.numel();
  // Clamp into the range so out-of-range values land in the edge bins (histc drops them).
  const double eps = (hist_hi_ - hist_lo_) * 1e-9;
  torch::Tensor hist = torch::histc(s.clamp(hist_lo_, hist_hi_ - eps).to(torch::kFloat32),
                                    kHistogramBins, hist_lo_, hist_hi_);
  auto acc = hist.accessor<float, 1>();
  for (int i = 0; i < kHistogramBins; ++i) l.histogram[i] += static_cast<int64_t>(acc[i]);
  // By query class: each position's mean score over the elements it gates.
  if (classes_ && scores.dim() >= 3) {
    const torch::Tensor per_position =
        scores.detach().to(torch::kCPU, torch::kFloat64).flatten(2).mean(2);  // (B, T)
    AddByClass(per_position, 0, &l.class_gate_sum, &l.class_gate_n);
  }
}

void ProbeRecorder::FirstTokenAttention(int layer, const at::Tensor& probs_on_key0,
                                        int64_t first_query) {
  Layer& l = layers_.at(layer);
  // (B, H, n) in double on the CPU; query 0 can only attend to key 0, so it is left out.
  const torch::Tensor all = probs_on_key0.detach().to(torch::kCPU, torch::kFloat64);
  const int64_t skip = first_query == 0 ? 1 : 0;
  const torch::Tensor p = all.slice(2, skip);
  if (p.size(2) == 0) return;
  const int64_t heads = p.size(1);
  l.first_token_sum += p.sum().item<double>();
  l.first_token_n += p.numel();
  if (l.head_sum.empty()) {
    l.head_sum.assign(heads, 0.0);
    l.window_sum.assign(heads, 0.0);
  }
  const auto add = [](std::vector<double>* sums, const torch::Tensor& per_head) {
    const auto a = per_head.accessor<double, 1>();
    for (int64_t h = 0; h < a.size(0) && h < static_cast<int64_t>(sums->size()); ++h)
      (*sums)[h] += a[h];
  };
  add(&l.head_sum, p.sum(std::vector<int64_t>{0, 2}));
  l.head_n += p.size(0) * p.size(2);
  // The sink-rate window: absolute query positions [max(1, first_query), kSinkWindow).
  const int64_t in_window = std::min<int64_t>(p.size(2), kSinkWindow - (first_query + skip));
  if (in_window > 0) {
    add(&l.window_sum, p.slice(2, 0, in_window).sum(std::vector<int64_t>{0, 2}));
    l.window_n += p.size(0) * in_window;
  }
  if (classes_) {
    // Summed over heads: each class's sum covers `heads` values per query position.
    std::vector<int64_t> positions(class_names_.size(), 0);
    AddByClass(all.sum(1), first_query, &l.class_attn_sum, &positions);
    for (size_t c = 0; c < positions.size(); ++c) {
      l.class_queries[c] += positions[c];
      l.class_attn_n[c] += positions[c] * heads;
    }
  }
}

void ProbeRecorder::AttentionMaps(int layer, const at::Tensor& probs) {
  Layer& l = layers_.at(layer);
  if (map_heads_ <= 0 || l.mapped) return;
  l.mapped = true;
  const int64_t n = std::min<int64_t>(kAttentionMapSize, probs.size(2));
  const int64_t heads = std::min<int64_t>(map_heads_, probs.size(1));
  // (H, n, n) of the first window; the mean over every head first (head -1), then the kept heads.
  const torch::Tensor window =
      probs.detach()[0].slice(1, 0, n).slice(2, 0, n).to(torch::kCPU, torch::kFloat32);
  const torch::Tensor chosen = torch::cat({window.mean(0, /*keepdim=*/true), window.slice(0, 0, heads)});
  // round(255 p) as bytes. The causal mask makes the upper triangle exactly 0.
  const torch::Tensor bytes =
      (chosen * 255.0).round().clamp(0, 255).to(torch::kUInt8).contiguous();  // (1 + heads, n, n)
  for (int64_t i = 0; i <= heads; ++i) {
    AttentionMap& m = maps_.emplace_back();
    m.set_layer(layer);
    m.set_head(static_cast<int32_t>(i - 1));
    m.set_size(static_cast<int32_t>(n));
    const auto* data = reinterpret_cast<const char*>(bytes[i].data_ptr<uint8_t>());
    m.set_probs(std::string(data, static_cast<size_t>(n * n)));
  }
}

std::vector<AttentionMap> ProbeRecorder::TakeAttentionMaps() {
  std::vector<AttentionMap> out = std::move(maps_);
  maps_.clear();
  std::stable_sort(out.begin(), out.end(), [](const AttentionMap& a, const AttentionMap& b) {
    return a.layer() != b.layer() ? a.layer() < b.layer() : a.head() < b.head();
  });
  return out;
}

void ProbeRecorder::Sparsity(int layer, const at::Tensor& before, const at::Tensor& after,
                             const at::Tensor& g1_scores) {
  Layer& l = layers_.at(layer);
  const torch::Tensor b = before.detach().abs();
  const torch::Tensor a = after.detach().abs();
  const torch::Tensor m =
      g1_scores.defined() ? b * g1_scores.detach().to(torch::kFloat64).mean().item<double>() : b;
  const torch::Tensor* views[3] = {&b, &a, &m};
  for (int i = 0; i < 3; ++i) {
    l.below[i][0] += CountBelow(*views[i], 1e-2);
    l.below[i][1] += CountBelow(*views[i], 1e-3);
  }
  l.sdpa_n += b.numel();
  l.abs_sum[0] += b.to(torch::kFloat64).sum().item<double>();
  l.abs_sum[1] += a.to(torch::kFloat64).sum().item<double>();
}

void ProbeRecorder::Residuals(int layer, const at::Tensor& attn_out,
                              const at::Tensor& attn_residual, const at::Tensor& ffn_out,
                              const at::Tensor& ffn_residual) {
  Layer& l = layers_.at(layer);
  const at::Tensor* t[4] = {&attn_out, &attn_residual, &ffn_out, &ffn_residual};
  for (int i = 0; i < 4; ++i) {
    l.max_abs[i] = std::max(l.max_abs[i], t[i]->detach().abs().max().item<double>());
  }
  if (layer == 0) tokens_ += ffn_residual.size(0) * ffn_residual.size(1);
  if (residual_dtypes_.size() <= static_cast<size_t>(layer)) residual_dtypes_.resize(layer + 1);
  residual_dtypes_[layer] = c10::toString(ffn_residual.scalar_type());
}

Probes ProbeRecorder::Finish() const {
  Probes out;
  out.set_tokens(tokens_);
  double gate = 0, m_act = 0, f_attn = 0;
  int gated = 0;
  int64_t sink_heads = 0, window_heads = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    LayerProbes* p = out.add_layers();
    p->set_layer(static_cast<int>(i));
    if (l.gate_n > 0) {
      const double mean = l.gate_sum / l.gate_n;
      p->set_has_gate(true);
      p->set_gate_mean(mean);
      p->set_gate_std(std::sqrt(std::max(0.0, l.gate_sq_sum / l.gate_n - mean * mean)));
      p->set_gate_min(l.gate_min);
      p->set_gate_max(l.gate_max);
      Histogram* h = p->mutable_gate_histogram();
      h->set_lo(hist_lo_);
      h->set_hi(hist_hi_);
      for (int64_t c : l.histogram) h->add_counts(c);
      gate += mean;
      ++gated;
    }
    p->set_attn_out_max_abs(l.max_abs[0]);
    p->set_attn_residual_max_abs(l.max_abs[1]);
    p->set_ffn_out_max_abs(l.max_abs[2]);
    p->set_ffn_residual_max_abs(l.max_abs[3]);
    p->set_first_token_attention(l.first_token_n ? l.first_token_sum / l.first_token_n : 0.0);
    if (l.sdpa_n > 0) {
      const double n = static_cast<double>(l.sdpa_n);
      ablate::Sparsity* s = p->mutable_sparsity();
      s->set_before_gate_1e2(l.below[0][0] / n);
      s->set_before_gate_1e3(l.below[0][1] / n);
      s->set_after_gate_1e2(l.below[1][0] / n);
      s->set_after_gate_1e3(l.below[1][1] / n);
      s->set_mean_scaled_1e2(l.below[2][0] / n);
      s->set_mean_scaled_1e3(l.below[2][1] / n);
      s->set_mean_abs_before_gate(l.abs_sum[0] / n);
      s->set_mean_abs_after_gate(l.abs_sum[1] / n);
    }
    m_act += p->ffn_residual_max_abs();
    f_attn += p->first_token_attention();
    for (double sum : l.head_sum) p->add_first_token_attention_by_head(sum / l.head_n);
    if (l.window_n > 0) {
      for (double sum : l.window_sum) {
        const double mean = sum / l.window_n;
        p->add_sink_window_attention_by_head(mean);
        sink_heads += mean > sink_epsilon_ ? 1 : 0;
        ++window_heads;
      }
    }
    for (size_t c = 0; c < l.class_queries.size(); ++c) {
      QueryClassProbes* q = p->add_classes();
      q->set_name(class_names_[c]);
      q->set_queries(l.class_queries[c]);
      if (l.class_attn_n[c] > 0)
        q->set_first_token_attention(l.class_attn_sum[c] / l.class_attn_n[c]);
      if (l.class_gate_n[c] > 0) q->set_gate_mean(l.class_gate_sum[c] / l.class_gate_n[c]);
    }
  }
  const double n = layers_.empty() ? 1.0 : static_cast<double>(layers_.size());
  if (gated > 0) out.set_gate_score_mean(gate / gated);
  out.set_m_act(m_act / n);
  out.set_f_attn(f_attn / n);
  out.set_sink_epsilon(sink_epsilon_);
  if (window_heads > 0) out.set_sink_rate(static_cast<double>(sink_heads) / window_heads);
  // Per class over layers: F-Attn the mean over every layer, the gate score over gated layers.
  for (size_t c = 0; c < class_names_.size(); ++c) {
    double attn = 0, gate_sum = 0;
    int64_t queries = 0;
    int gate_layers = 0;
    for (const LayerProbes& l : out.layers()) {
      if (c >= static_cast<size_t>(l.classes_size())) continue;
      const QueryClassProbes& q = l.classes(static_cast<int>(c));
      attn += q.first_token_attention();
      queries += q.queries();
      if (q.has_gate_mean()) {
        gate_sum += q.gate_mean();
        ++gate_layers;
      }
    }
    if (queries == 0) continue;
    QueryClassProbes* q = out.add_classes();
    q->set_name(class_names_[c]);
    q->set_queries(queries / static_cast<int64_t>(n));
    q->set_first_token_attention(attn / n);
    if (gate_layers > 0) q->set_gate_mean(gate_sum / gate_layers);
  }
  return out;
}

}  // namespace ablate
