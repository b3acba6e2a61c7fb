#include "worker/train/evaluation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "config/model_config.h"
#include "config/program_config.h"
#include "worker/model/chunked_loss.h"
#include "worker/model/torch_compat.h"
#include "worker/train/eval_tasks.h"

namespace ablate {

namespace {

// bf16 autocast on CUDA while it lives, when enabled.
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled) : enabled_(enabled) {
    if (enabled_) compat::SetCudaAutocast(true, at::kBFloat16);
  }
  ~AutocastGuard() {
    if (enabled_) compat::SetCudaAutocast(false);  // clears autocast's cast cache too
  }

 private:
  const bool enabled_;
};

}  // namespace

torch::Tensor ModelLoss(TransformerImpl& model, const torch::Tensor& x, const torch::Tensor& y,
                        int64_t loss_chunk_tokens, bool autocast, ProbeRecorder* probes,
                        torch::Tensor* aux) {
  AutocastGuard autocast_guard(autocast);
  const int64_t chunk = loss_chunk_tokens;
  TransformerImpl::Output out = model.forward(x, probes, /*logits=*/chunk == 0);
  if (aux != nullptr) *aux = out.aux_loss.to(torch::kFloat32);
  if (chunk == 0) {
    return torch::cross_entropy_loss(
        out.logits.reshape({-1, out.logits.size(-1)}).to(torch::kFloat32), y.reshape({-1}));
  }
  // The logits in the dtype autocast would give them.
  const torch::Tensor hidden = out.hidden.reshape({-1, out.hidden.size(-1)});
  return ChunkedCrossEntropy(hidden, model.OutputWeight(), y.reshape({-1}), chunk,
                             autocast ? torch::kBFloat16 : hidden.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> GetBatch(const TokenData& data, const TrainConfig& train,
                                                 TokenData::Split split, int64_t index,
                                                 torch::Device device, int64_t seq_len) {
  const int64_t len = seq_len > 0 ? seq_len : train.seq_len();
  torch::Tensor x = torch::empty({train.batch_size(), len}, torch::kLong);
  torch::Tensor y = torch::empty({train.batch_size(), len}, torch::kLong);
  data.Batch(split, index, train.batch_size(), len, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
  return {x.to(device), y.to(device)};
}

namespace {

// The mean loss per token of `model` over `len`-token windows of the validation text's first
// EvalLengthSpan tokens.
LengthEval EvaluateLength(TransformerImpl& model, const TokenData& data, const RunConfig& config,
                          torch::Device device, bool autocast, int32_t len) {
  const TrainConfig& t = config.train();
  const YarnConfig& yarn = config.model().yarn();
  const bool use_yarn =
      yarn.factor() > 0 && (yarn.apply() == YARN_ALWAYS || len > yarn.original_seq_len());
  model.UseYarn(use_yarn);
  const int64_t windows = EvalLengthSpan(t) / len;
  torch::Tensor x = torch::empty({windows, len}, torch::kLong);
  torch::Tensor y = torch::empty({windows, len}, torch::kLong);
  data.Consecutive(TokenData::Split::kVal, windows, len, x.data_ptr<int64_t>(),
                   y.data_ptr<int64_t>());
  double sum = 0;  // summed over tokens: windows of one batch and of the last may differ
  for (int64_t first = 0; first < windows; first += t.batch_size()) {
    const int64_t rows = std::min<int64_t>(t.batch_size(), windows - first);
    sum += ModelLoss(model, x.slice(0, first, first + rows).to(device),
                     y.slice(0, first, first + rows).to(device), t.loss_chunk_tokens(), autocast)
               .item<double>() *
           static_cast<double>(rows);
  }
  model.UseYarn(false);
  LengthEval l;
  l.set_seq_len(len);
  l.set_yarn(use_yarn);
  l.set_val_loss(sum / static_cast<double>(windows));
  l.set_val_ppl(std::exp(l.val_loss()));
  return l;
}

constexpr char kTriggerClass[] = "trigger";
constexpr char kNonTriggerClass[] = "non_trigger";

}  // namespace

absl::StatusOr<EvalResult> Evaluate(TransformerImpl& model, const TokenData& data,
                                    const RunConfig& config, torch::Device device, bool autocast,
                                    int64_t step) {
  const TrainConfig& t = config.train();
  const auto started = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  model.eval();
  ProbeRecorder recorder(config.model(), t.attention_map_heads(), SinkEpsilon(t));
  torch::Tensor triggers;
  if (!data.triggers().empty()) {
    triggers = torch::tensor(std::vector<int64_t>(data.triggers().begin(), data.triggers().end()),
                             torch::kLong);
  }
  double loss_sum = 0;
  for (int64_t i = 0; i < t.eval_batches(); ++i) {
    auto [x, y] = GetBatch(data, t, TokenData::Split::kVal, i, device);
    if (triggers.defined()) {  // class 1: the query's own token is a trigger
      recorder.SetQueryClasses(torch::isin(x.cpu(), triggers).to(torch::kLong),
                               {kNonTriggerClass, kTriggerClass});
    }
    loss_sum += ModelLoss(model, x, y, t.loss_chunk_tokens(), autocast, &recorder).item<double>();
  }
  EvalResult r;
  r.set_step(step);
  r.set_val_loss(loss_sum / t.eval_batches());
  r.set_val_ppl(std::exp(r.val_loss()));
  *r.mutable_probes() = recorder.Finish();
  // The split by query class as named metrics too: compare, table --evals and SQL reach them.
  for (const QueryClassProbes& c : r.probes().classes()) {
    (*r.mutable_metrics())["f_attn@" + c.name()] = c.first_token_attention();
    if (c.has_gate_mean()) (*r.mutable_metrics())["gate_score@" + c.name()] = c.gate_mean();
  }
  for (AttentionMap& m : recorder.TakeAttentionMaps()) *r.add_attention_maps() = std::move(m);
  for (const int32_t len : t.eval_seq_lens()) {
    *r.add_lengths() = EvaluateLength(model, data, config, device, autocast, len);
  }
  const LogitsFn logits = [&](const torch::Tensor& tokens, bool yarn) {
    AutocastGuard autocast_guard(autocast);
    model.UseYarn(yarn);
    torch::Tensor out = model.forward(tokens).logits.to(torch::kFloat32);
    model.UseYarn(false);
    return out;
  };
  absl::StatusOr<EvalTaskResults> tasks = RunEvalTasks(logits, data, config, device);
  model.train();
  if (!tasks.ok()) return tasks.status();
  for (const auto& [name, value] : tasks->metrics) (*r.mutable_metrics())[name] = value;
  for (auto& [name, values] : tasks->items) {
    // More items than the coordinator stores: the metric stands, without its paired test.
    if (values.size() > static_cast<size_t>(kMaxEvalItems)) continue;
    EvalItemScores* items = r.add_items();
    items->set_metric(name);
    items->mutable_values()->Assign(values.begin(), values.end());
  }
  r.set_eval_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return r;
}

}  // namespace ablate
