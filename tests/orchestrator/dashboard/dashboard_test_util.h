// Shared by the dashboard tests and the dashboard simulator (tests/dashboard/dashboard_sim.cc):
// sweeps, metric batches, evaluations and transitions written through the real Store API.
#ifndef ABLATE_TESTS_ORCHESTRATOR_DASHBOARD_DASHBOARD_TEST_UTIL_H_
#define ABLATE_TESTS_ORCHESTRATOR_DASHBOARD_DASHBOARD_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "config/model_config.h"
#include "orchestrator/store/store.h"
#include "tests/orchestrator/store/test_sweeps.h"

namespace ablate {
namespace dashboard_test {

using testing::MakeSweep;

// A plausible loss curve: decays from ~5 towards ~2, with a little deterministic noise.
inline double LossAt(int64_t step, int64_t run_id) {
  return 2.0 + 3.0 * std::exp(-static_cast<double>(step) / 300.0) +
         0.05 * std::sin(static_cast<double>(step * (run_id + 3)) * 0.7);
}

// Steps [first, first + count) of a run.
inline MetricBatch StepBatch(int64_t run_id, int32_t attempt, int64_t seq, int64_t first,
                             int64_t count) {
  MetricBatch b;
  b.run_id = run_id;
  b.attempt = attempt;
  b.seq = seq;
  for (int64_t s = first; s < first + count; ++s) {
    StepMetrics& m = b.steps.emplace_back();
    m.set_step(s);
    m.set_loss(LossAt(s, run_id));
    m.set_grad_norm(1.0 + 0.1 * std::cos(static_cast<double>(s)));
    m.set_lr(3e-3 * std::min<double>(1.0, static_cast<double>(s) / 100.0));
    m.set_tokens_per_s(1e5);
    m.set_elapsed_s(0.05 * static_cast<double>(s));  // training seconds: 20 steps a second
  }
  return b;
}

// An evaluation at `step` with `layers` layers of probes (gated when `gated`).
inline EvalResult Eval(int64_t step, int layers, bool gated) {
  EvalResult e;
  e.set_step(step);
  e.set_val_loss(2.5 + 1.0 / static_cast<double>(step));
  e.set_val_ppl(std::exp(e.val_loss()));
  Probes* p = e.mutable_probes();
  p->set_tokens(4096);
  for (int l = 0; l < layers; ++l) {
    LayerProbes* lp = p->add_layers();
    lp->set_layer(l);
    lp->set_has_gate(gated);
    lp->set_ffn_residual_max_abs(10.0 * (l + 1));
    lp->set_first_token_attention(0.1 * (l + 1));
    // Four heads, head 0 the sink head: its mean is the layer's, its window over ε = 0.3 in
    // layers 1-3 (a sink rate of 3 / 16); bigram-backcopy's query classes.
    for (const double share : {2.5, 0.5, 0.5, 0.5}) {
      lp->add_first_token_attention_by_head(0.1 * (l + 1) * share);
      lp->add_sink_window_attention_by_head(std::min(1.0, 0.1 * (l + 1) * share + 0.05));
    }
    QueryClassProbes* other = lp->add_classes();
    other->set_name("non_trigger");
    other->set_queries(3000);
    other->set_first_token_attention(0.12 * (l + 1));
    QueryClassProbes* trigger = lp->add_classes();
    trigger->set_name("trigger");
    trigger->set_queries(1000);
    trigger->set_first_token_attention(0.04 * (l + 1));
    if (gated) {
      other->set_gate_mean(0.1);
      trigger->set_gate_mean(0.5);
    }
    if (gated) {
      lp->set_gate_mean(0.2);
      lp->set_gate_std(0.1);
      lp->set_gate_min(0.0);
      lp->set_gate_max(0.9);
      Histogram* h = lp->mutable_gate_histogram();
      h->set_lo(0);
      h->set_hi(1);
      for (int i = 0; i < 10; ++i) h->add_counts(100 * (10 - i) + l);
    }
  }
  p->set_gate_score_mean(gated ? 0.2 : 0);
  p->set_m_act(10.0 * (layers + 1) / 2.0);
  p->set_f_attn(0.1 * (layers + 1) / 2.0);
  p->set_sink_epsilon(0.3);
  int sinks = 0, heads = 0;
  for (const LayerProbes& l : p->layers()) {
    for (const double w : l.sink_window_attention_by_head()) {
      sinks += w > 0.3 ? 1 : 0;
      ++heads;
    }
  }
  p->set_sink_rate(static_cast<double>(sinks) / heads);
  return e;
}

// Validation losses at `seq_lens` (TrainConfig.eval_seq_lens), from the evaluation's own: a
// little higher for windows shorter than `trained`, `growth` more per doubling beyond it, where
// YaRN scaling is on.
inline void AddLengths(EvalResult* e, const std::vector<int>& seq_lens, int trained,
                       double growth) {
  for (int len : seq_lens) {
    LengthEval* l = e->add_lengths();
    l->set_seq_len(len);
    const double doublings = std::log2(static_cast<double>(len) / trained);
    l->set_val_loss(e->val_loss() + (doublings <= 0 ? -0.02 * doublings : growth * doublings));
    l->set_val_ppl(std::exp(l->val_loss()));
    l->set_yarn(len > trained);
  }
}

// `heads` attention maps per layer over the first `size` positions, after the layer's mean over
// them (head -1), as the trainer stores them (round(255 * p), row = query, nothing above the
// diagonal): an attention sink on the first key that grows with depth, the rest decaying away
// from the diagonal.
inline void AddAttentionMaps(EvalResult* e, int layers, int heads, int size) {
  for (int layer = 0; layer < layers; ++layer) {
    AttentionMap* mean = e->add_attention_maps();
    mean->set_layer(layer);
    mean->set_head(-1);
    mean->set_size(size);
    std::vector<double> sum(static_cast<size_t>(size) * size, 0.0);
    for (int head = 0; head < heads; ++head) {
      AttentionMap* m = e->add_attention_maps();
      m->set_layer(layer);
      m->set_head(head);
      m->set_size(size);
      std::string probs(static_cast<size_t>(size) * size, '\0');
      const double sink =
          std::clamp(0.2 + 0.6 * (layer + 1) / (layers + 1) - 0.1 * head, 0.05, 0.95);
      const double decay = 0.5 + 0.4 * head / std::max(1, heads);
      auto put = [&](int q, int k, double p) {
        probs[static_cast<size_t>(q) * size + k] =
            static_cast<char>(static_cast<uint8_t>(std::lround(255 * std::clamp(p, 0.0, 1.0))));
      };
      put(0, 0, 1);
      for (int q = 1; q < size; ++q) {
        double total = 0;
        for (int k = 1; k <= q; ++k) total += std::pow(decay, q - k);
        put(q, 0, sink);
        for (int k = 1; k <= q; ++k) put(q, k, (1 - sink) * std::pow(decay, q - k) / total);
      }
      for (size_t i = 0; i < probs.size(); ++i) sum[i] += static_cast<uint8_t>(probs[i]);
      m->set_probs(std::move(probs));
    }
    std::string averaged(sum.size(), '\0');
    for (size_t i = 0; i < sum.size(); ++i) {
      averaged[i] = static_cast<char>(static_cast<uint8_t>(std::lround(sum[i] / std::max(1, heads))));
    }
    mean->set_probs(std::move(averaged));
  }
}

inline absl::StatusOr<TransitionResult> StartRun(Store* store, int64_t run_id,
                                                  int64_t worker_id = 0) {
  RunTransition t = testing::MakeTransition(run_id, {PENDING}, RUNNING);
  t.worker_id = worker_id;
  return store->TransitionRun(t);
}

// RUNNING -> `to` with a final summary of its state, `reason`, `steps_done` and the training
// loss there (LossAt); what else the summary holds is the caller's.
inline RunTransition EndWithSummary(int64_t run_id, RunState to, int64_t steps_done,
                                    const std::string& reason) {
  RunTransition t = testing::MakeTransition(run_id, {RUNNING}, to);
  t.reason = reason;
  t.has_summary = true;
  RunSummary& s = t.summary;
  s.set_state(to);
  s.set_reason(reason);
  s.set_steps_done(steps_done);
  s.set_final_train_loss(LossAt(steps_done, run_id));
  return t;
}

// RUNNING -> `to` with a final summary: EndWithSummary's, the spike steps and, for a SUCCEEDED
// run, a final evaluation.
inline absl::StatusOr<TransitionResult> FinishRun(Store* store, int64_t run_id, RunState to,
                                                  int64_t steps_done, const std::string& reason,
                                                  int64_t spike_steps = 0) {
  RunTransition t = EndWithSummary(run_id, to, steps_done, reason);
  RunSummary& s = t.summary;
  s.set_spike_steps(spike_steps);
  s.set_spike_score(static_cast<double>(spike_steps) / static_cast<double>(steps_done));
  if (to == SUCCEEDED) {
    *s.mutable_final_eval() = Eval(steps_done, 2, true);
    s.mutable_final_eval()->set_val_loss(2.5 + 0.01 * static_cast<double>(run_id % 5));
  }
  return store->TransitionRun(t);
}

// A finished tuned sweep (tune: over train.optimizer.lr) of baseline and g1_elementwise at 0.01,
// 0.03, 0.1 and 0.3, two seeds each, `steps` steps; val loss 2 + (log10(lr) + 1.5)^2 / 4 at the
// end, g1's 0.05 lower, each seed 0.01 apart.
//   method "boundary": baseline trains at 0.01 and 0.03, its seed 1 diverges at 0.1 and both at
//     0.3, bracket [0.03, 0.1]; g1 trains up to 0.1 and diverges at 0.3, bracket [0.1, 0.3].
//   method "asha": the runs at 0.1 and 0.3 were STOPPED at step steps/6 with their metric there
//     (1 higher than at the end), the rest trained to the end.
inline absl::StatusOr<SweepIds> WriteTunedSweep(Store* store, const std::string& name,
                                                const std::string& method, int64_t steps = 600) {
  const std::vector<std::string> variants = {"baseline", "g1_elementwise"};
  const std::vector<double> values = {0.01, 0.03, 0.1, 0.3};
  SweepRecord record = MakeSweep(name, variants, 2 * static_cast<int>(values.size()), steps);
  TunePlan* tune = record.expanded.mutable_tune();
  tune->set_axis("train.optimizer.lr");
  tune->set_method(method);
  tune->set_metric("val_loss");
  for (double v : values) tune->add_values(v);
  if (method == "asha") tune->add_rungs(steps / 6);
  // MakeSweep's "seeds" 0..7 stand for (value, seed) pairs: value k, seed s at 2k + s.
  for (RunSpec& run : *record.expanded.mutable_runs()) {
    const double value = values[run.seed() / 2];
    run.set_seed(run.seed() % 2);
    run.mutable_config()->mutable_train()->set_seed(run.seed());
    run.mutable_config()->mutable_train()->mutable_optimizer()->set_lr(value);
    AxisValue* axis = run.add_axes();
    axis->set_path("train.optimizer.lr");
    axis->set_value(absl::StrCat(value));
    run.mutable_tune()->set_group(run.variant());
    run.mutable_tune()->set_value(value);
  }
  absl::StatusOr<SweepIds> ids = store->CreateSweep(record);
  if (!ids.ok()) return ids.status();
  for (int i = 0; i < record.expanded.runs_size(); ++i) {
    const RunSpec& run = record.expanded.runs(i);
    const int64_t id = ids->run_ids[i];
    const bool gated = run.variant() != "baseline";
    const double value = run.tune().value();
    const double loss = 2 + std::pow(std::log10(value) + 1.5, 2) / 4 - (gated ? 0.05 : 0) +
                        0.01 * static_cast<double>(run.seed());
    if (absl::StatusOr<TransitionResult> r = StartRun(store, id); !r.ok()) return r.status();
    RunTransition end;
    if (method == "asha" && value > 0.05) {
      // Paused at the rung with its evaluation there, held, then stopped by the tuner.
      end = EndWithSummary(id, PENDING, steps / 6, "");
      end.attempt_end = "INTERRUPTED";  // as the coordinator ends an attempt at its rung
      *end.summary.mutable_final_eval() = Eval(steps / 6, 2, gated);
      end.summary.mutable_final_eval()->set_val_loss(loss + 1);
      end.tune_hold = true;
      if (absl::StatusOr<TransitionResult> r = store->TransitionRun(end); !r.ok()) {
        return r.status();
      }
      RunTransition stop = testing::MakeTransition(id, {PENDING}, STOPPED);
      stop.reason = absl::StrCat("stopped at rung 0 (step ", steps / 6, ")");
      if (absl::StatusOr<TransitionResult> r = store->TransitionRun(stop); !r.ok()) {
        return r.status();
      }
      continue;
    }
    const bool diverges = method == "boundary" && (value > 0.2 || (!gated && value > 0.05 &&
                                                                   run.seed() == 1));
    if (diverges) {
      end = EndWithSummary(id, DIVERGED, steps / 2, "loss non-finite for 3 steps");
    } else {
      end = EndWithSummary(id, SUCCEEDED, steps, "");
      *end.summary.mutable_final_eval() = Eval(steps, 2, gated);
      end.summary.mutable_final_eval()->set_val_loss(loss);
      end.summary.mutable_final_eval()->set_val_ppl(std::exp(loss));
    }
    if (absl::StatusOr<TransitionResult> r = store->TransitionRun(end); !r.ok()) return r.status();
  }
  if (method == "boundary") {
    for (const auto& [group, stable, unstable] :
         {std::tuple<std::string, double, double>{"baseline", 0.03, 0.1},
          {"g1_elementwise", 0.1, 0.3}}) {
      BracketWrite b;
      b.sweep_id = ids->sweep_id;
      b.group = group;
      b.stable = stable;
      b.unstable = unstable;
      if (absl::Status s = store->CloseBracket(b); !s.ok()) return s;
    }
  }
  if (absl::Status s = store->Flush(); !s.ok()) return s;
  return ids;
}

}  // namespace dashboard_test
}  // namespace ablate

#endif  // ABLATE_TESTS_ORCHESTRATOR_DASHBOARD_DASHBOARD_TEST_UTIL_H_
