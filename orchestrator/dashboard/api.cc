// The dashboard's JSON API (/api/...): sweeps, a sweep with its runs and variants, the curves of
// a sweep overlay, the comparison table and its figures (orchestrator/report/figures.h), a tuned
// sweep's chart (tune_figures.h), the event log; a run, its metric series, evaluations, per-layer
// probes, attention maps and spikes; the workers. Every read goes through StoreReader's typed
// reads, but a program run's log, read from the checkpoint root (common/run_logs.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/run_logs.h"
#include "config/eval_config.h"
#include "config/param_count.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/dashboard/internal.h"
#include "orchestrator/report/tune_figures.h"
#include "orchestrator/store/compare.h"

namespace ablate {
namespace dashboard {

json SweepJson(const SweepInfo& s, double now) {
  json j{{"id", s.id},
         {"name", s.name},
         {"description", s.description},
         {"state", s.state},
         {"priority", s.priority},
         {"created_at", s.created_at},
         {"runs", s.runs},
         {"by_state",
          {{"PENDING", s.pending},
           {"RUNNING", s.running},
           {"SUCCEEDED", s.succeeded},
           {"FAILED", s.failed},
           {"DIVERGED", s.diverged},
           {"CANCELLED", s.cancelled},
           {"INTERRUPTED", s.interrupted},
           {"STOPPED", s.stopped}}},
         {"steps_done", s.steps_done},
         {"steps_total", s.steps_total}};
  // ETA: the rate so far over the steps left (runs that end early, diverged ones, make it an
  // overestimate, which is the safe side).
  json eta = nullptr;
  const int64_t left = s.steps_total - s.steps_done;
  if (s.state == "ACTIVE" && s.steps_done > 0 && left > 0 && now > s.created_at) {
    eta = (now - s.created_at) * static_cast<double>(left) / static_cast<double>(s.steps_done);
  } else if (s.state != "ACTIVE") {
    eta = 0;
  }
  j["eta_s"] = eta;
  return j;
}

json RunJson(const RunInfo& r) {
  return json{{"id", r.id},
              {"sweep_id", r.sweep_id},
              {"sweep", r.sweep},
              {"variant", r.variant},
              {"run_index", r.run_index},
              {"seed", r.seed},
              {"axes", r.axes},
              {"state", RunStateName(r.state)},
              {"reused_from", r.reused_from == 0 ? json(nullptr) : json(r.reused_from)},
              {"attempts", r.attempts},
              {"worker_id", r.worker_id},
              {"device", r.device},
              {"devices", r.devices},
              {"params_total", r.params_total},
              {"params_activated", r.params_activated},
              {"params_added", r.params_added},
              {"created_at", r.created_at},
              {"started_at", r.started_at},
              {"finished_at", r.finished_at},
              {"steps_total", r.steps_total},
              {"steps_done", r.steps_done},
              {"final_train_loss", r.final_train_loss},
              {"val_loss", r.val_loss},
              {"val_ppl", r.val_ppl},
              {"gate_score", r.gate_score},
              {"m_act", r.m_act},
              {"f_attn", r.f_attn},
              {"sink_rate", r.sink_rate},
              {"spike_steps", r.spike_steps},
              {"spike_score", r.spike_score},
              {"tokens_per_s", r.tokens_per_s},
              {"wall_s", r.wall_s},
              {"reason", r.reason},
              // A tuned run (tune:): the step it pauses at next (0: its end), whether it waits
              // for the tuner's decision, and its value of the tuned axis.
              {"stop_at_step", r.stop_at_step},
              {"held", r.held},
              {"tune_value", r.tuned ? json(r.tune_value) : json(nullptr)}};
}

json SpikeJson(int64_t run_id, const SpikeEvent& s) {
  return json{{"run", run_id},
              {"step", s.step()},
              {"signal", s.signal()},
              {"value", s.value()},
              {"baseline", s.baseline()},
              {"kind", SpikeKind_Name(s.kind())},
              {"action", SpikeAction_Name(s.action())},
              {"rollback_to_step", s.rollback_to_step()}};
}

json EventJson(const EventInfo& e) {
  return json{{"id", e.id},       {"time", e.time},       {"sweep_id", e.sweep_id},
              {"run", e.run_id},  {"kind", e.kind},       {"message", e.message}};
}

json LayerJson(const LayerProbes& p) {
  json j{{"layer", p.layer()},
         {"has_gate", p.has_gate()},
         {"attn_out_max_abs", p.attn_out_max_abs()},
         {"attn_residual_max_abs", p.attn_residual_max_abs()},
         {"ffn_out_max_abs", p.ffn_out_max_abs()},
         {"ffn_residual_max_abs", p.ffn_residual_max_abs()},
         {"m_act", p.ffn_residual_max_abs()},
         {"f_attn", p.first_token_attention()},
         {"f_attn_by_head", std::vector<double>(p.first_token_attention_by_head().begin(),
                                                p.first_token_attention_by_head().end())},
         {"sink_window_by_head", std::vector<double>(p.sink_window_attention_by_head().begin(),
                                                     p.sink_window_attention_by_head().end())},
         {"sparsity",
          {{"before_gate_1e2", p.sparsity().before_gate_1e2()},
           {"before_gate_1e3", p.sparsity().before_gate_1e3()},
           {"after_gate_1e2", p.sparsity().after_gate_1e2()},
           {"after_gate_1e3", p.sparsity().after_gate_1e3()},
           {"mean_scaled_1e2", p.sparsity().mean_scaled_1e2()},
           {"mean_scaled_1e3", p.sparsity().mean_scaled_1e3()}}}};
  if (p.has_gate()) {
    j["gate"] = {{"mean", p.gate_mean()}, {"std", p.gate_std()}, {"min", p.gate_min()},
                 {"max", p.gate_max()}};
    const Histogram& h = p.gate_histogram();
    j["gate_histogram"] = {{"lo", h.lo()}, {"hi", h.hi()},
                           {"counts", std::vector<int64_t>(h.counts().begin(), h.counts().end())}};
  } else {
    j["gate"] = nullptr;
    j["gate_histogram"] = nullptr;
  }
  json classes = json::array();
  for (const QueryClassProbes& c : p.classes()) {
    classes.push_back({{"name", c.name()},
                       {"queries", c.queries()},
                       {"f_attn", c.first_token_attention()},
                       {"gate_mean", c.has_gate_mean() ? json(c.gate_mean()) : json(nullptr)}});
  }
  j["classes"] = std::move(classes);
  return j;
}

json LengthEvalJson(const LengthEval& l) {
  return json{{"seq_len", l.seq_len()},
              {"val_loss", l.val_loss()},
              {"val_ppl", l.val_ppl()},
              {"yarn", l.yarn()}};
}

json AttentionMapJson(const AttentionMap& m) {
  // The bytes as numbers 0..255 (round(255 * p)), row-major, row = query position.
  const std::string& bytes = m.probs();
  return json{{"layer", m.layer()},
              {"head", m.head()},
              {"size", m.size()},
              {"probs", std::vector<uint8_t>(bytes.begin(), bytes.end())}};
}

bool IsHeavy(const Request& r) {
  const std::vector<std::string>& seg = r.segments;
  if (seg.size() < 3 || seg[0] != "api") return false;
  if (seg[1] == "table" || seg[1] == "compare") return true;
  if (seg.size() != 4) return false;
  static const std::set<std::string> kSweep = {"curves", "figures", "tune", "table"};
  static const std::set<std::string> kRun = {"metrics", "probes", "attention"};
  return (seg[1] == "sweeps" && kSweep.count(seg[3]) != 0) ||
         (seg[1] == "runs" && kRun.count(seg[3]) != 0);
}

}  // namespace dashboard

Response DashboardServer::Impl::HandleApi(const Request& r) {
  const std::vector<std::string>& seg = r.segments;  // seg[0] == "api"
  if (seg.size() == 2 && seg[1] == "sweeps") return Sweeps();
  if (seg.size() >= 3 && seg[1] == "sweeps") {
    if (seg.size() == 3) return Sweep(seg[2]);
    if (seg.size() == 4 && seg[3] == "curves") return SweepCurves(seg[2], r);
    if (seg.size() == 4 && seg[3] == "table") {
      absl::StatusOr<ComparisonTable> table = reader->GetComparisonTable(seg[2]);
      if (!table.ok()) return FromStatus(table.status());
      return JsonResponse(200, ComparisonTableJson(*table));
    }
    if (seg.size() == 4 && seg[3] == "figures") return SweepFigures(seg[2], r);
    if (seg.size() == 4 && seg[3] == "tune") return SweepTune(seg[2]);
    if (seg.size() == 4 && seg[3] == "events") return Events(seg[2], r);
  }
  if (seg.size() >= 3 && seg[1] == "runs") {
    int64_t id = 0;
    if (!absl::SimpleAtoi(seg[2], &id) || id <= 0) {
      return Error(400, absl::StrCat("bad run id '", seg[2].substr(0, 40),
                                     "': a positive integer is expected"));
    }
    if (seg.size() == 3) return Run(id);
    if (seg.size() == 4) {
      if (seg[3] == "metrics") return RunMetrics(id, r);
      if (seg[3] == "evals") return RunEvals(id);
      if (seg[3] == "probes") return RunProbes(id, r);
      if (seg[3] == "attention") return RunAttention(id, r);
      if (seg[3] == "spikes") return RunSpikes(id);
      if (seg[3] == "log") return RunLogLines(id, r);
    }
  }
  if (seg.size() >= 3 && seg[1] == "table") return Table(r);
  if (seg.size() >= 3 && seg[1] == "compare") return Compare(r);
  if (seg.size() == 2 && seg[1] == "workers") return Workers();
  return Error(404, absl::StrCat("no such API endpoint: ", r.path.substr(0, 200)));
}

namespace {

// The tags of the sweep (run_id 0) or of one run of it, oldest first.
json TagsJson(const std::vector<Annotation>& annotations, int64_t run_id) {
  json tags = json::array();
  for (const Annotation& a : annotations) {
    if (a.kind == "tag" && a.run_id == run_id) tags.push_back(a.text);
  }
  return tags;
}

// The notes on the sweep and its runs (every one), or on one run, oldest first.
json NotesJson(const std::vector<Annotation>& annotations, std::optional<int64_t> run_id) {
  json notes = json::array();
  for (const Annotation& a : annotations) {
    if (a.kind != "note" || (run_id && a.run_id != *run_id)) continue;
    notes.push_back(json{{"run_id", a.run_id}, {"text", a.text}, {"created_at", a.created_at}});
  }
  return notes;
}

}  // namespace

Response DashboardServer::Impl::Sweeps() {
  absl::StatusOr<std::vector<SweepInfo>> sweeps = reader->ListSweeps();
  if (!sweeps.ok()) return FromStatus(sweeps.status());
  const double now = NowSeconds();
  json list = json::array();
  for (const SweepInfo& s : *sweeps) list.push_back(SweepJson(s, now));
  return JsonResponse(200, json{{"sweeps", list}, {"time", now}});
}

Response DashboardServer::Impl::Sweep(const std::string& name) {
  absl::StatusOr<SweepWithRuns> read = reader->GetSweepWithRuns(name);
  if (!read.ok()) return FromStatus(read.status());
  const SweepInfo& sweep = read->sweep;
  // The variants (budget solutions) and each run's latest loss, in two indexed reads.
  absl::StatusOr<std::vector<VariantInfo>> variants = reader->ListVariants(sweep.id);
  if (!variants.ok()) return FromStatus(variants.status());
  absl::StatusOr<std::map<int64_t, LatestStep>> last = reader->LatestSteps(sweep.id);
  if (!last.ok()) return FromStatus(last.status());
  absl::StatusOr<std::vector<Annotation>> annotations = reader->Annotations(sweep.id);
  if (!annotations.ok()) return FromStatus(annotations.status());
  std::map<std::string, std::string> budget_of;
  json variant_list = json::array();
  for (const VariantInfo& v : *variants) {
    budget_of[v.name] = v.budget;
    variant_list.push_back(VariantJson(v));
  }
  json run_list = json::array();
  for (const RunInfo& run : read->runs) {
    json j = RunJson(run);
    j["budget"] = budget_of[run.variant];
    auto it = last->find(run.id);
    j["last_step"] = it == last->end() ? 0 : it->second.step;
    j["last_loss"] = it == last->end() ? kNaN : it->second.loss;
    j["tags"] = TagsJson(*annotations, run.id);
    run_list.push_back(std::move(j));
  }
  json sweep_json = SweepJson(sweep, NowSeconds());
  sweep_json["tags"] = TagsJson(*annotations, 0);
  return JsonResponse(200, json{{"sweep", std::move(sweep_json)},
                                {"variants", variant_list},
                                {"runs", run_list},
                                {"notes", NotesJson(*annotations, std::nullopt)}});
}

namespace {

// 7 significant digits, or null for NaN (a point without the figure).
json FiniteOrNull(double v) { return std::isfinite(v) ? json(Significant7(v)) : json(nullptr); }

// Tokens and training FLOPs of one step of `run` (from its config): a curve's x against tokens
// seen or FLOPs spent is the step times these. NaN when its config does not parse.
struct StepScale {
  double tokens = kNaN, flops = kNaN;
};
StepScale ScaleOf(const RunInfo& run) {
  RunConfig config;
  if (!google::protobuf::util::JsonStringToMessage(run.config_json, &config).ok()) return {};
  const TrainConfig& t = config.train();
  StepScale s;
  s.tokens = TokensPerStep(t);
  s.flops = s.tokens * TrainingFlopsPerToken(config.model(), t.seq_len());
  return s;
}

// The `x` parameter of the curves: step (default), tokens, flops or time; false (`error` set)
// for anything else.
bool XAxisParam(const Request& r, std::string* x_axis, std::string* error) {
  const auto it = r.query.find("x");
  *x_axis = it == r.query.end() || it->second.empty() ? "step" : it->second;
  if (*x_axis == "step" || *x_axis == "tokens" || *x_axis == "flops" || *x_axis == "time") {
    return true;
  }
  *error = "parameter 'x' must be step, tokens, flops or time";
  return false;
}

// A point's x: its step, tokens or FLOPs by `scale`, or its training seconds.
json XOf(const std::string& x_axis, const StepScale& scale, int64_t step, double seconds) {
  if (x_axis == "tokens") return FiniteOrNull(scale.tokens * static_cast<double>(step));
  if (x_axis == "flops") return FiniteOrNull(scale.flops * static_cast<double>(step));
  if (x_axis == "time") return FiniteOrNull(seconds);
  return step;
}

}  // namespace

Response DashboardServer::Impl::SweepCurves(const std::string& name, const Request& r) {
  std::string error;
  std::optional<int64_t> points = IntParam(r, "points", kDefaultCurvePoints, &error);
  if (!points) return Error(400, error);
  if (*points < 2) return Error(400, "parameter 'points' must be at least 2");
  const auto metric_it = r.query.find("metric");
  const std::string metric = metric_it == r.query.end() ? "loss" : metric_it->second;
  CurveMetric curve_metric;
  if (metric == "loss") {
    curve_metric = CurveMetric::kLoss;
  } else if (metric == "grad_norm") {
    curve_metric = CurveMetric::kGradNorm;
  } else if (metric == "lr") {
    curve_metric = CurveMetric::kLr;
  } else {
    return Error(400, "parameter 'metric' must be loss, grad_norm or lr");
  }
  std::string x_axis;
  if (!XAxisParam(r, &x_axis, &error)) return Error(400, error);
  absl::StatusOr<SweepWithRuns> read = reader->GetSweepWithRuns(name);
  if (!read.ok()) return FromStatus(read.status());
  const SweepInfo& sweep = read->sweep;
  const std::vector<RunInfo>& runs = read->runs;
  absl::StatusOr<std::vector<SweepSpike>> spikes = reader->SweepSpikes(sweep.id);
  if (!spikes.ok()) return FromStatus(spikes.status());
  std::map<int64_t, json> spikes_of;
  for (const SweepSpike& s : *spikes) {
    json& list = spikes_of[s.run_id];
    if (list.is_null()) list = json::array();
    list.push_back(json{{"step", s.event.step()}, {"signal", s.event.signal()},
                        {"kind", SpikeKind_Name(s.event.kind())}, {"value", s.event.value()}});
  }
  // One shared grid of steps for every run (every k-th step, k from the longest run), plus each
  // run's last step and its spike steps: overlaid curves share their x values (the browser joins
  // them cheaply), and the store seeks those steps instead of scanning every run's rows.
  const int64_t share = options.max_curve_values / std::max<int64_t>(1, runs.size());
  const int max_points = static_cast<int>(
      std::max<int64_t>(2, std::min<int64_t>({*points, kMaxCurvePoints, share})));
  int64_t longest = 0;
  for (const RunInfo& run : runs) longest = std::max(longest, run.steps_done);
  // ceil(longest / max_points) without overflow, whatever a store holds: the grid has at most
  // max_points + 1 steps.
  const int64_t k = std::max<int64_t>(1, longest / max_points + (longest % max_points != 0));
  std::map<int64_t, std::vector<double>> elapsed;
  absl::StatusOr<std::map<int64_t, std::vector<std::pair<int64_t, double>>>> curves =
      reader->SweepCurves(sweep.id, curve_metric, k, x_axis == "time" ? &elapsed : nullptr);
  if (!curves.ok()) return FromStatus(curves.status());
  json out = json::array();
  for (const RunInfo& run : runs) {
    json steps = json::array(), values = json::array(), xs = json::array();
    const StepScale scale = x_axis == "tokens" || x_axis == "flops" ? ScaleOf(run) : StepScale{};
    if (auto it = curves->find(run.id); it != curves->end()) {
      const std::vector<double>& seconds = elapsed[run.id];
      for (size_t i = 0; i < it->second.size(); ++i) {
        const auto& [step, value] = it->second[i];
        steps.push_back(step);
        values.push_back(Significant7(value));
        if (x_axis != "step") xs.push_back(XOf(x_axis, scale, step, i < seconds.size() ? seconds[i] : kNaN));
      }
    }
    json& sp = spikes_of[run.id];
    json entry{{"id", run.id},
               {"variant", run.variant},
               {"seed", run.seed},
               {"axes", run.axes},
               {"state", RunStateName(run.state)},
               {"step", std::move(steps)},
               {"value", std::move(values)},
               {"spikes", sp.is_null() ? json::array() : sp}};
    if (x_axis != "step") entry["x"] = std::move(xs);
    out.push_back(std::move(entry));
  }
  return JsonResponse(200, json{{"sweep", sweep.name}, {"metric", metric}, {"x", x_axis},
                                {"points", max_points}, {"stride", k}, {"runs", out}});
}

Response DashboardServer::Impl::SweepFigures(const std::string& name, const Request& r) {
  std::string error;
  std::optional<int64_t> points = IntParam(r, "points", FigureOptions().curve_points, &error);
  if (!points) return Error(400, error);
  if (*points < 2) return Error(400, "parameter 'points' must be at least 2");
  FigureOptions options;
  options.curve_points = static_cast<int>(std::min<int64_t>(*points, kMaxCurvePoints));
  absl::StatusOr<ablate::SweepFigures> figures = ComputeSweepFigures(*reader, name, options);
  if (!figures.ok()) return FromStatus(figures.status());
  return JsonResponse(200, SweepFiguresJson(*figures));
}

// A tuned sweep's chart numbers (tune_figures.h); {"tune": null} for a sweep without `tune:`.
Response DashboardServer::Impl::SweepTune(const std::string& name) {
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(name);
  if (!sweep.ok()) return FromStatus(sweep.status());
  absl::StatusOr<std::optional<TuneFigures>> tune = ReadTuneFigures(*reader, sweep->id);
  if (!tune.ok()) return FromStatus(tune.status());
  return JsonResponse(200, *tune ? TuneFiguresJson(**tune) : json{{"tune", nullptr}});
}

namespace {

// /api/table/A/B... and /api/compare/A/B...: the sweeps named by the path's segments after the
// second, and ?exclude_tag=T1,T2.
ResultSelection SelectionOf(const Request& r) {
  ResultSelection selection;
  selection.sweeps.assign(r.segments.begin() + 2, r.segments.end());
  auto tags = r.query.find("exclude_tag");
  if (tags != r.query.end() && !tags->second.empty()) {
    selection.exclude_tags = absl::StrSplit(tags->second, ',', absl::SkipEmpty());
  }
  return selection;
}

}  // namespace

Response DashboardServer::Impl::Table(const Request& r) {
  absl::StatusOr<ComparisonTable> table = reader->GetComparisonTable(SelectionOf(r));
  if (!table.ok()) return FromStatus(table.status());
  return JsonResponse(200, ComparisonTableJson(*table));
}

// ?metric=&reference=&alpha=&correction=, as `ablate compare`'s flags.
Response DashboardServer::Impl::Compare(const Request& r) {
  ResultSelection selection = SelectionOf(r);
  if (auto metric = r.query.find("metric"); metric != r.query.end()) {
    selection.items_metric = metric->second;  // its per-item scores, for the test over items
  }
  absl::StatusOr<ResultSet> results = reader->ReadResults(selection);
  if (!results.ok()) return FromStatus(results.status());
  CompareOptions options;
  const auto param = [&](const char* name, std::string* to) {
    auto it = r.query.find(name);
    if (it != r.query.end() && !it->second.empty()) *to = it->second;
  };
  param("metric", &options.metric);
  param("reference", &options.reference);
  param("correction", &options.correction);
  std::string alpha;
  param("alpha", &alpha);
  if (!alpha.empty() && !absl::SimpleAtod(alpha, &options.alpha)) {
    return Error(400, absl::StrCat("parameter 'alpha' must be a number, not '",
                                   alpha.substr(0, 40), "'"));
  }
  absl::StatusOr<Comparison> comparison = CompareResults(*results, options);
  if (!comparison.ok()) return FromStatus(comparison.status());
  absl::StatusOr<std::string> text = FormatComparison(*comparison, "json");
  if (!text.ok()) return FromStatus(text.status());
  return JsonResponse(200, json::parse(*text));
}

Response DashboardServer::Impl::Events(const std::string& name, const Request& r) {
  std::string error;
  std::optional<int64_t> after = IntParam(r, "after", 0, &error);
  std::optional<int64_t> limit = after ? IntParam(r, "limit", 200, &error) : std::nullopt;
  if (!after || !limit) return Error(400, error);
  if (*after < 0 || *limit < 1) return Error(400, "'after' must be >= 0 and 'limit' >= 1");
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(name);
  if (!sweep.ok()) return FromStatus(sweep.status());
  absl::StatusOr<std::vector<EventInfo>> events = reader->Events(
      sweep->id, *after, static_cast<int>(std::min<int64_t>(*limit, kMaxEventsPerPage)));
  if (!events.ok()) return FromStatus(events.status());
  json list = json::array();
  for (const EventInfo& e : *events) list.push_back(EventJson(e));
  return JsonResponse(200, json{{"events", list}});
}

Response DashboardServer::Impl::Run(int64_t id) {
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<AttemptInfo>> attempts = reader->Attempts(id);
  if (!attempts.ok()) return FromStatus(attempts.status());
  absl::StatusOr<std::vector<Annotation>> annotations = reader->Annotations(run->sweep_id);
  if (!annotations.ok()) return FromStatus(annotations.status());
  json j = RunJson(*run);
  j["run_key"] = run->run_key;
  j["tags"] = TagsJson(*annotations, id);       // its own
  j["sweep_tags"] = TagsJson(*annotations, 0);  // its sweep's, which it carries too
  j["notes"] = NotesJson(*annotations, id);
  json config = json::parse(run->config_json, nullptr, /*allow_exceptions=*/false);
  j["config"] = config.is_discarded() ? json(run->config_json) : config;
  json list = json::array();
  for (const AttemptInfo& a : *attempts) {
    list.push_back(json{{"attempt", a.attempt},     {"worker_id", a.worker_id},
                        {"state", a.state},         {"started_at", a.started_at},
                        {"ended_at", a.ended_at},   {"checkpoint_step", a.checkpoint_step},
                        {"reason", a.reason}});
  }
  j["attempt_list"] = list;
  return JsonResponse(200, json{{"run", j}});
}

Response DashboardServer::Impl::RunMetrics(int64_t id, const Request& r) {
  std::string error;
  std::optional<int64_t> from = IntParam(r, "from", 0, &error);
  std::optional<int64_t> to =
      from ? IntParam(r, "to", std::numeric_limits<int64_t>::max(), &error) : std::nullopt;
  std::optional<int64_t> points = to ? IntParam(r, "points", kDefaultRunPoints, &error)
                                     : std::nullopt;
  if (!from || !to || !points) return Error(400, error);
  if (*from < 0 || *to < *from) return Error(400, "need 0 <= from <= to");
  if (*points < 2) return Error(400, "parameter 'points' must be at least 2");
  std::string x_axis;
  if (!XAxisParam(r, &x_axis, &error)) return Error(400, error);
  SeriesOptions series;
  series.from_step = *from;
  series.to_step = *to;
  series.max_points = static_cast<int>(std::min<int64_t>(*points, kMaxSeriesPoints));
  auto mode = r.query.find("mode");
  if (mode != r.query.end()) {
    if (mode->second == "minmax") {
      series.mode = Downsample::kMinMax;
    } else if (mode->second == "stride") {
      series.mode = Downsample::kStride;
    } else {
      return Error(400, "parameter 'mode' must be minmax or stride");
    }
  }
  absl::StatusOr<RunInfo> run = reader->GetRun(id);  // 404 for an unknown run, not []
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<StepMetrics>> m = reader->MetricSeries(id, series);
  if (!m.ok()) return FromStatus(m.status());
  json step = json::array(), loss = json::array(), grad = json::array(), lr = json::array(),
       tps = json::array(), skipped = json::array(), xs = json::array();
  const StepScale scale = x_axis == "tokens" || x_axis == "flops" ? ScaleOf(*run) : StepScale{};
  for (const StepMetrics& p : *m) {
    step.push_back(p.step());
    if (x_axis != "step") {
      xs.push_back(XOf(x_axis, scale, p.step(), p.elapsed_s() > 0 ? p.elapsed_s() : kNaN));
    }
    loss.push_back(p.loss());
    grad.push_back(p.grad_norm());
    lr.push_back(p.lr());
    tps.push_back(p.tokens_per_s());
    skipped.push_back(p.skipped() ? 1 : 0);
  }
  json answer{{"run", id},
              {"points", series.max_points},
              {"mode", series.mode == Downsample::kStride ? "stride" : "minmax"},
              {"step", step},
              {"loss", loss},
              {"grad_norm", grad},
              {"lr", lr},
              {"tokens_per_s", tps},
              {"skipped", skipped}};
  if (x_axis != "step") {
    // x per step for tokens and FLOPs (a step's tokens, FLOPs), for evaluations and live points.
    answer["x_axis"] = x_axis;
    answer["x"] = std::move(xs);
    if (x_axis != "time") {
      answer["x_per_step"] = FiniteOrNull(x_axis == "tokens" ? scale.tokens : scale.flops);
    }
  }
  return JsonResponse(200, answer);
}

Response DashboardServer::Impl::RunEvals(int64_t id) {
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<EvalResult>> evals = reader->EvalSeries(id, false);
  if (!evals.ok()) return FromStatus(evals.status());
  // Each metric by name's chance level, where the run's config states one (docs/evals.md).
  RunConfig config;
  const bool has_config =
      google::protobuf::util::JsonStringToMessage(run->config_json, &config).ok();
  json chance = json::object();
  json list = json::array();
  for (const EvalResult& e : *evals) {
    json lengths = json::array();
    for (const LengthEval& l : e.lengths()) lengths.push_back(LengthEvalJson(l));
    json metrics = json::object();
    for (const auto& [name, value] : e.metrics()) {
      metrics[name] = value;
      if (!has_config || chance.contains(name)) continue;
      const std::optional<double> level = EvalChanceLevel(name, config);
      chance[name] = level.has_value() ? json(*level) : json(nullptr);
    }
    list.push_back(json{
        {"step", e.step()},
        {"val_loss", e.val_loss()},
        {"val_ppl", e.val_ppl()},
        {"gate_score",
         e.probes().has_gate_score_mean() ? json(e.probes().gate_score_mean()) : json(nullptr)},
        {"m_act", e.probes().m_act()},
        {"f_attn", e.probes().f_attn()},
        {"sink_rate", e.probes().has_sink_rate() ? json(e.probes().sink_rate()) : json(nullptr)},
        {"tokens", e.probes().tokens()},
        {"lengths", std::move(lengths)},
        {"metrics", std::move(metrics)},
        {"eval_seconds", e.eval_seconds() > 0 ? json(e.eval_seconds()) : json(nullptr)}});
  }
  return JsonResponse(200, json{{"run", id}, {"evals", list}, {"chance", chance}});
}

// The evaluation of run `id` that ?step= asks for (default: the latest) in `*step`, or the
// response to send instead: a 400 for a bad step, a 404 for an unknown run or a step without an
// evaluation, and for a run without evaluations `{"run", "step": null, list_key: []}`. The
// evaluations say which steps exist; one that stored none of what is asked gives an empty list.
std::optional<Response> DashboardServer::Impl::FindEvaluation(int64_t id, const Request& r,
                                                              const char* list_key,
                                                              int64_t* step) {
  std::string error;
  std::optional<int64_t> asked = IntParam(r, "step", -1, &error);
  if (!asked) return Error(400, error);
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::optional<int64_t>> at = reader->EvalStep(id, *asked);
  if (!at.ok()) return FromStatus(at.status());
  if (at->has_value()) {
    *step = **at;
    return std::nullopt;
  }
  if (*asked < 0) {
    return JsonResponse(200, json{{"run", id}, {"step", nullptr}, {list_key, json::array()}});
  }
  return Error(404, absl::StrCat("run ", id, " has no evaluation at step ", *asked));
}

namespace {

// The answer to a read of what run `id` stored at evaluation `step`:
// `{"run", "step", list_key: [to_json(item), ...]}`, or the error the read gave.
template <typename Item, typename ToJson>
Response StepList(int64_t id, int64_t step, const char* list_key,
                  const absl::StatusOr<std::vector<Item>>& items, ToJson to_json) {
  if (!items.ok()) return FromStatus(items.status());
  json list = json::array();
  for (const Item& item : *items) list.push_back(to_json(item));
  return JsonResponse(200, json{{"run", id}, {"step", step}, {list_key, list}});
}

}  // namespace

Response DashboardServer::Impl::RunProbes(int64_t id, const Request& r) {
  int64_t step = 0;
  if (std::optional<Response> instead = FindEvaluation(id, r, "layers", &step)) return *instead;
  return StepList(id, step, "layers", reader->LayerProbesAt(id, step), LayerJson);
}

Response DashboardServer::Impl::RunAttention(int64_t id, const Request& r) {
  int64_t step = 0;
  if (std::optional<Response> instead = FindEvaluation(id, r, "maps", &step)) return *instead;
  return StepList(id, step, "maps", reader->AttentionMapsAt(id, step), AttentionMapJson);
}

Response DashboardServer::Impl::RunSpikes(int64_t id) {
  absl::StatusOr<RunInfo> run = reader->GetRun(id);
  if (!run.ok()) return FromStatus(run.status());
  absl::StatusOr<std::vector<SpikeEvent>> spikes = reader->SpikeEvents(id);
  if (!spikes.ok()) return FromStatus(spikes.status());
  json list = json::array();
  for (const SpikeEvent& s : *spikes) list.push_back(SpikeJson(id, s));
  return JsonResponse(200, json{{"run", id}, {"spikes", list}});
}

// ?attempt=N (0 or none: the last) &tail=N (1..kMaxLogLines, larger is capped): the run's output
// as its worker keeps it under options.checkpoint_root, at most kMaxLogBytes of its newest lines.
// The lines are the program's bytes: Dump() turns what is not UTF-8 into U+FFFD.
Response DashboardServer::Impl::RunLogLines(int64_t id, const Request& r) {
  std::string error;
  std::optional<int64_t> attempt = IntParam(r, "attempt", 0, &error);
  std::optional<int64_t> tail =
      attempt ? IntParam(r, "tail", kDefaultLogLines, &error) : std::nullopt;
  if (!attempt || !tail) return Error(400, error);
  if (*attempt < 0 || *attempt > std::numeric_limits<int32_t>::max()) {
    return Error(400, "parameter 'attempt' must be an attempt number (0 or none: the last)");
  }
  if (*tail < 1) return Error(400, "parameter 'tail' must be at least 1");
  absl::StatusOr<RunInfo> run = reader->GetRun(id);  // 404 for an unknown run
  if (!run.ok()) return FromStatus(run.status());
  if (options.checkpoint_root.empty()) {
    return Error(404, absl::StrCat("no output of run ", id,
                                   ": this dashboard was started without a checkpoint root"));
  }
  RunLogOptions read;
  read.attempt = static_cast<int>(*attempt);
  read.tail = std::min<int64_t>(*tail, kMaxLogLines);
  read.max_bytes = kMaxLogBytes;
  absl::StatusOr<ablate::RunLog> log = ReadRunLog(options.checkpoint_root, id, read);
  if (!log.ok()) return FromStatus(log.status());
  return JsonResponse(200, json{{"run", id},
                                {"attempt", log->attempt},
                                {"attempts", log->attempts},
                                {"path", log->path},
                                {"tail", read.tail},
                                {"truncated", log->truncated},
                                {"lines", log->lines}});
}

Response DashboardServer::Impl::Workers() {
  absl::StatusOr<std::vector<WorkerInfo>> workers = reader->ListWorkers();
  if (!workers.ok()) return FromStatus(workers.status());
  json list = json::array();
  for (const WorkerInfo& w : *workers) {
    list.push_back(json{{"id", w.id}, {"name", w.name}, {"resources", w.resources_json},
                        {"registered_at", w.registered_at}, {"last_seen", w.last_seen},
                        {"state", w.state},
                        {"slots_in_use", options.live_slots_in_use
                                             ? options.live_slots_in_use(w.id)
                                             : w.slots_in_use},
                        {"running", w.running}});
  }
  return JsonResponse(200, json{{"workers", list}});
}

}  // namespace ablate
