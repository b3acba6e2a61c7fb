#include "orchestrator/coordinator/door.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "config/model_config.h"
#include "config/program_config.h"

namespace ablate {
namespace {

absl::Status Refuse(absl::string_view what, absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, " ", problem));
}

absl::Status StepIn(absl::string_view what, absl::string_view field, int64_t step, int64_t lo,
                    int64_t hi) {
  if (step >= lo && step <= hi) return absl::OkStatus();
  return Refuse(what, field, absl::StrCat("is ", step, "; it must be in [", lo, ", ", hi, "]"));
}

absl::Status FiniteNonNegative(absl::string_view what, absl::string_view field, double v) {
  if (std::isfinite(v) && v >= 0) return absl::OkStatus();
  return Refuse(what, field, absl::StrCat("is ", v, "; it must be finite and >= 0"));
}

// A share of attention: finite and in [0, 1].
absl::Status Share(absl::string_view what, const std::string& field, double v) {
  if (std::isfinite(v) && v >= 0 && v <= 1) return absl::OkStatus();
  return Refuse(what, field, absl::StrCat("is ", v, "; it must be a share of attention in [0, 1]"));
}

// Per-head attention shares (LayerProbes.first_token_attention_by_head and the sink window's).
absl::Status CheckHeads(absl::string_view what, const std::string& field,
                        const google::protobuf::RepeatedField<double>& heads) {
  if (heads.size() > kMaxNumHeads) {
    return Refuse(what, field,
                  absl::StrCat("has ", heads.size(), " entries; the limit is ", kMaxNumHeads));
  }
  for (const double v : heads) {
    if (absl::Status s = Share(what, field, v); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckClasses(absl::string_view what, const std::string& field,
                          const google::protobuf::RepeatedPtrField<QueryClassProbes>& classes) {
  if (classes.size() > kMaxQueryClasses) {
    return Refuse(
        what, field,
        absl::StrCat("has ", classes.size(), " entries; the limit is ", kMaxQueryClasses));
  }
  for (int i = 0; i < classes.size(); ++i) {
    const QueryClassProbes& c = classes[i];
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (c.name().empty() || c.name().size() > kMaxQueryClassName ||
        !std::all_of(c.name().begin(), c.name().end(),
                     [](char ch) { return absl::ascii_isalnum(ch) || ch == '_'; })) {
      return Refuse(what, at + ".name",
                    absl::StrCat("must be 1 to ", kMaxQueryClassName, " letters, digits or '_'"));
    }
    if (c.queries() < 0) return Refuse(what, at + ".queries", "is negative");
    if (absl::Status s = Share(what, at + ".first_token_attention", c.first_token_attention());
        !s.ok())
      return s;
    if (c.has_gate_mean() && !std::isfinite(c.gate_mean())) {
      return Refuse(what, at + ".gate_mean", "is not a finite number");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckProbes(absl::string_view what, const std::string& at, const Probes& p) {
  if (p.layers_size() > kMaxProbeLayers) {
    return Refuse(what, absl::StrCat(at, ".probes.layers"),
                  absl::StrCat("has ", p.layers_size(), " entries; the limit is ",
                               kMaxProbeLayers));
  }
  if (p.tokens() < 0) return Refuse(what, absl::StrCat(at, ".probes.tokens"), "is negative");
  for (int i = 0; i < p.layers_size(); ++i) {
    const Histogram& h = p.layers(i).gate_histogram();
    const std::string field = absl::StrCat(at, ".probes.layers[", i, "].gate_histogram");
    if (h.counts_size() > kMaxHistogramBins) {
      return Refuse(what, absl::StrCat(field, ".counts"),
                    absl::StrCat("has ", h.counts_size(), " bins; the limit is ",
                                 kMaxHistogramBins));
    }
    for (int64_t c : h.counts()) {
      if (c < 0) return Refuse(what, absl::StrCat(field, ".counts"), "has a negative count");
    }
    if (!std::isfinite(h.lo()) || !std::isfinite(h.hi()) || h.lo() > h.hi()) {
      return Refuse(what, field, "has edges that are not finite and ordered (lo <= hi)");
    }
    const LayerProbes& l = p.layers(i);
    const std::string layer = absl::StrCat(at, ".probes.layers[", i, "]");
    if (absl::Status s = CheckHeads(what, layer + ".first_token_attention_by_head",
                                    l.first_token_attention_by_head());
        !s.ok())
      return s;
    if (absl::Status s = CheckHeads(what, layer + ".sink_window_attention_by_head",
                                    l.sink_window_attention_by_head());
        !s.ok())
      return s;
    if (absl::Status s = CheckClasses(what, layer + ".classes", l.classes()); !s.ok()) return s;
  }
  if (p.has_sink_rate()) {
    if (absl::Status s = Share(what, at + ".probes.sink_rate", p.sink_rate()); !s.ok()) return s;
  }
  return CheckClasses(what, at + ".probes.classes", p.classes());
}

// An evaluation's step, probes, lengths (TrainConfig.eval_seq_lens) and attention maps, against
// the run's shape when known. A length's loss may be non-finite (a diverged model is a result);
// its shape may not be absurd.
absl::Status CheckEval(absl::string_view what, const std::string& at, const EvalResult& e,
                       const ReportShape& shape) {
  if (shape.eval_every > 0) {
    const int64_t step = e.step();
    if (step % shape.eval_every != 0 && step != shape.total_steps &&
        !(shape.stop_at_step > 0 && step == shape.stop_at_step)) {
      return Refuse(what, at + ".step",
                    absl::StrCat("is ", step, "; this run evaluates every ", shape.eval_every,
                                 " steps and at step ", shape.total_steps,
                                 shape.stop_at_step > 0
                                     ? absl::StrCat(" and its rung ", shape.stop_at_step)
                                     : ""));
    }
    if (e.probes().layers_size() > shape.num_layers) {
      return Refuse(what, at + ".probes.layers",
                    absl::StrCat("has ", e.probes().layers_size(), " entries; the model has ",
                                 shape.num_layers, " layers"));
    }
    const int per_layer = AttentionMapsPerLayer(shape.map_heads, shape.num_heads);
    if (e.attention_maps_size() > shape.num_layers * per_layer) {
      return Refuse(what, at + ".attention_maps",
                    absl::StrCat("has ", e.attention_maps_size(), " maps; the run asks for ",
                                 per_layer, " per layer of ", shape.num_layers));
    }
    for (int i = 0; i < e.attention_maps_size(); ++i) {
      const AttentionMap& m = e.attention_maps(i);
      if (m.layer() >= shape.num_layers || m.head() >= shape.num_heads) {
        return Refuse(what, absl::StrCat(at, ".attention_maps[", i, "]"),
                      absl::StrCat("is of layer ", m.layer(), " head ", m.head(),
                                   "; the model has ", shape.num_layers, " layers of ",
                                   shape.num_heads, " heads"));
      }
    }
  }
  if (absl::Status s = CheckProbes(what, at, e.probes()); !s.ok()) return s;
  if (e.metrics_size() > kMaxEvalMetrics) {
    return Refuse(what, at + ".metrics",
                  absl::StrCat("has ", e.metrics_size(), " entries; the limit is ",
                               kMaxEvalMetrics));
  }
  for (const auto& [name, value] : e.metrics()) {
    if (name.empty() || name.size() > kMaxEvalMetricName) {
      return Refuse(what, at + ".metrics",
                    absl::StrCat("has a name of ", name.size(), " bytes; it must be 1 to ",
                                 kMaxEvalMetricName));
    }
    if (!std::isfinite(value)) {
      return Refuse(what, absl::StrCat(at, ".metrics[", BoundedText(name, 40), "]"),
                    "is not a finite number");
    }
  }
  // Per-item scores: of metrics the evaluation reports, each once, bounded, finite.
  if (e.items_size() > kMaxEvalMetrics) {
    return Refuse(what, at + ".items",
                  absl::StrCat("has ", e.items_size(), " entries; the limit is ", kMaxEvalMetrics));
  }
  std::set<std::string> itemized;
  for (int i = 0; i < e.items_size(); ++i) {
    const EvalItemScores& items = e.items(i);
    const std::string field = absl::StrCat(at, ".items[", i, "]");
    if (e.metrics().count(items.metric()) == 0) {
      return Refuse(what, field + ".metric",
                    absl::StrCat("names ", BoundedText(items.metric(), 40),
                                 ", which is not one of the evaluation's metrics"));
    }
    if (!itemized.insert(items.metric()).second) {
      return Refuse(what, field + ".metric",
                    absl::StrCat("names ", BoundedText(items.metric(), 40), " a second time"));
    }
    if (items.values_size() > kMaxEvalItems) {
      return Refuse(
          what, field + ".values",
          absl::StrCat("has ", items.values_size(), " items; the limit is ", kMaxEvalItems));
    }
    for (const float v : items.values()) {
      if (!std::isfinite(v))
        return Refuse(what, field + ".values", "holds a value that is not finite");
    }
  }
  if (!(e.eval_seconds() >= 0 && e.eval_seconds() < 1e9)) {
    return Refuse(what, at + ".eval_seconds", "must be a finite number of seconds >= 0");
  }
  if (e.lengths_size() > kMaxEvalSeqLens) {
    return Refuse(what, at + ".lengths",
                  absl::StrCat("has ", e.lengths_size(), " entries; the limit is ",
                               kMaxEvalSeqLens));
  }
  for (int i = 0; i < e.lengths_size(); ++i) {
    if (absl::Status s = StepIn(what, absl::StrCat(at, ".lengths[", i, "].seq_len"),
                                e.lengths(i).seq_len(), 1, kMaxReportedSeqLen);
        !s.ok()) {
      return s;
    }
  }
  if (e.attention_maps_size() > kMaxAttentionMaps) {
    return Refuse(what, at + ".attention_maps",
                  absl::StrCat("has ", e.attention_maps_size(), " maps; the limit is ",
                               kMaxAttentionMaps));
  }
  for (int i = 0; i < e.attention_maps_size(); ++i) {
    const AttentionMap& m = e.attention_maps(i);
    const std::string field = absl::StrCat(at, ".attention_maps[", i, "]");
    if (absl::Status s = StepIn(what, field + ".layer", m.layer(), 0, kMaxNumLayers - 1); !s.ok()) {
      return s;
    }
    if (absl::Status s = StepIn(what, field + ".head", m.head(), -1, kMaxNumHeads - 1); !s.ok()) {
      return s;
    }
    if (absl::Status s = StepIn(what, field + ".size", m.size(), 1, kAttentionMapSize); !s.ok()) {
      return s;
    }
    const size_t want = static_cast<size_t>(m.size()) * static_cast<size_t>(m.size());
    if (m.probs().size() != want) {
      return Refuse(what, field + ".probs",
                    absl::StrCat("is ", m.probs().size(), " bytes; a map of size ", m.size(),
                                 " has ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace

ReportShape ReportShapeOf(const RunConfig& config) {
  ReportShape shape;
  shape.total_steps = config.train().steps();
  // A program evaluates when it likes: its worker checked the steps against the run's length.
  shape.eval_every = config.has_program() ? 0 : std::max(0, config.train().eval_every());
  shape.num_layers = config.model().num_layers();
  shape.num_heads = config.model().num_heads();
  shape.map_heads = config.train().attention_map_heads();
  return shape;
}

absl::Status CheckReportAtDoor(const ReportRequest& r, int64_t total_steps,
                               absl::string_view what) {
  ReportShape shape;
  shape.total_steps = total_steps;
  return CheckReportAtDoor(r, shape, what);
}

absl::Status CheckReportAtDoor(const ReportRequest& r, const ReportShape& shape,
                               absl::string_view what) {
  const int64_t total_steps = shape.total_steps;
  for (int i = 0; i < r.steps_size(); ++i) {
    const StepMetrics& m = r.steps(i);
    const std::string at = absl::StrCat("steps[", i, "]");
    if (absl::Status s = StepIn(what, at + ".step", m.step(), 1, total_steps); !s.ok()) return s;
    if (absl::Status s = FiniteNonNegative(what, at + ".lr", m.lr()); !s.ok()) return s;
    if (absl::Status s = FiniteNonNegative(what, at + ".tokens_per_s", m.tokens_per_s());
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < r.evals_size(); ++i) {
    const EvalResult& e = r.evals(i);
    const std::string at = absl::StrCat("evals[", i, "]");
    if (absl::Status s = StepIn(what, at + ".step", e.step(), 0, total_steps); !s.ok()) return s;
    if (absl::Status s = CheckEval(what, at, e, shape); !s.ok()) return s;
  }
  for (int i = 0; i < r.spikes_size(); ++i) {
    const SpikeEvent& e = r.spikes(i);
    const std::string at = absl::StrCat("spikes[", i, "]");
    if (absl::Status s = StepIn(what, at + ".step", e.step(), 1, total_steps); !s.ok()) return s;
    if (absl::Status s = StepIn(what, at + ".rollback_to_step", e.rollback_to_step(), 0, e.step());
        !s.ok()) {
      return s;
    }
    // Spikes are unique per (run, step, signal): a free-text signal would make them unbounded.
    if (e.signal() != "loss" && e.signal() != "grad_norm") {
      return Refuse(what, at + ".signal",
                    absl::StrCat("is \"", BoundedText(e.signal(), kMaxSignalBytes),
                                 "\"; it must be loss or grad_norm"));
    }
  }
  if (absl::Status s = StepIn(what, "checkpoint_step", r.checkpoint_step(), 0, total_steps);
      !s.ok()) {
    return s;
  }
  if (r.notices_size() > kMaxNotices) {
    return Refuse(what, "notices", absl::StrCat("has ", r.notices_size(), " lines; the limit is ",
                                                kMaxNotices));
  }
  for (int i = 0; i < r.notices_size(); ++i) {
    if (r.notices(i).size() > kMaxTextBytes) {
      return Refuse(what, absl::StrCat("notices[", i, "]"),
                    absl::StrCat("is ", r.notices(i).size(), " bytes; the limit is ",
                                 kMaxTextBytes));
    }
  }
  if (r.has_params() &&
      (r.params().total() < 0 || r.params().total() > kMaxReportedParams ||
       r.params().activated() < 0 || r.params().activated() > r.params().total())) {
    return Refuse(what, "params",
                  absl::StrCat("is total ", r.params().total(), ", activated ",
                               r.params().activated(), "; counts must satisfy 0 <= activated <= "
                               "total <= ", kMaxReportedParams));
  }
  if (r.checkpoint_path().size() > kMaxTextBytes) {
    return Refuse(what, "checkpoint_path",
                  absl::StrCat("is ", r.checkpoint_path().size(), " bytes; the limit is ",
                               kMaxTextBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckSummaryAtDoor(const RunSummary& s, int64_t total_steps) {
  constexpr absl::string_view what = "finish";
  if (absl::Status st = StepIn(what, "summary.steps_done", s.steps_done(), 0, total_steps);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = StepIn(what, "summary.spike_steps", s.spike_steps(), 0, s.steps_done());
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          StepIn(what, "summary.final_eval.step", s.final_eval().step(), 0, total_steps);
      !st.ok()) {
    return st;
  }
  // The summary's evaluation repeats the last one reported; its shape was checked then.
  if (absl::Status st = CheckEval(what, "summary.final_eval", s.final_eval(), ReportShape{});
      !st.ok()) {
    return st;
  }
  for (const auto& [field, v] : {std::pair<const char*, double>{"summary.wall_s", s.wall_s()},
                                 {"summary.tokens_per_s", s.tokens_per_s()}}) {
    if (absl::Status st = FiniteNonNegative(what, field, v); !st.ok()) return st;
  }
  const ParamCount& p = s.params();
  if (p.total() < 0 || p.activated() < 0) {
    return Refuse(what, "summary.params", "has a negative count");
  }
  return absl::OkStatus();
}

std::string BoundedText(absl::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string(text);
  size_t cut = limit;
  // Back to the first byte of a UTF-8 sequence (continuation bytes are 10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), " [... ", text.size() - cut, " bytes cut]");
}

}  // namespace ablate
