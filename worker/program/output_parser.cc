#include "worker/program/output_parser.h"

#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/program_config.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace ablate {

namespace {

using Json = nlohmann::json;
using Kind = ProgramEvent::Kind;

constexpr absl::string_view kMarker = "@ablate ";

ProgramEvent Invalid(std::string why) {
  ProgramEvent e;
  e.kind = Kind::kInvalid;
  e.message = std::move(why);
  return e;
}

// A number of a report: a JSON number, or "nan", "inf", "-inf" as strings.
std::optional<double> Number(const Json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (s == "nan" || s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf" || s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-inf" || s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  return std::nullopt;
}

// Field `key` of `o` as a number: nullopt when absent; *bad when present but not a number.
std::optional<double> Field(const Json& o, const char* key, bool* bad) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  std::optional<double> v = Number(*it);
  if (!v) *bad = true;
  return v;
}

// A step number: a finite integer >= 0.
std::optional<int64_t> StepOf(const Json& o) {
  auto it = o.find("step");
  if (it == o.end()) return std::nullopt;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
    return std::nullopt;
  }
  if (it->is_number_integer()) {
    const int64_t i = it->get<int64_t>();
    if (i >= 0) return i;
    return std::nullopt;
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= 0 && d < 9e15) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

// Known evaluation metrics land in their columns (Probes' means); others are kept by name (up
// to kMaxEvalMetrics of them, finite values only). False when the metric was dropped.
bool SetMetric(const std::string& name, double value, EvalResult* eval) {
  Probes* p = eval->mutable_probes();
  if (name == "gate_score" || name == "gate_score_mean") {
    p->set_gate_score_mean(value);
  } else if (name == "m_act") {
    p->set_m_act(value);
  } else if (name == "f_attn") {
    p->set_f_attn(value);
  } else if (name == "sink_rate") {
    if (!(value >= 0 && value <= 1)) return false;  // a share of heads, or dropped
    p->set_sink_rate(value);
  } else if (name.empty() || name.size() > kMaxEvalMetricName || !std::isfinite(value) ||
             eval->metrics_size() >= kMaxEvalMetrics) {
    return false;
  } else {
    (*eval->mutable_metrics())[name] = value;
  }
  return true;
}

void SetValLoss(double loss, EvalResult* eval) {
  eval->set_val_loss(loss);
  eval->set_val_ppl(std::isfinite(loss) && loss < 700 ? std::exp(loss)
                                                      : std::numeric_limits<double>::infinity());
}

}  // namespace

OutputParser::OutputParser(const ProgramConfig& config) : report_(config.report()) {
  for (const ProgramPattern& p : config.patterns()) {
    auto re = std::make_unique<re2::RE2>(p.regex(), re2::RE2::Quiet);
    if (!re->ok()) continue;  // ValidateProgramConfig refused it at submit
    (p.kind() == "step" ? step_re_ : eval_re_) = std::move(re);
  }
}

OutputParser::~OutputParser() = default;

std::vector<ProgramEvent> OutputParser::Parse(absl::string_view line) {
  std::vector<ProgramEvent> out;
  if (line.size() > kMaxProgramLineBytes) line = line.substr(0, kMaxProgramLineBytes);
  switch (report_) {
    case PROGRAM_REPORT_NANOGPT:
      ParseNanoGpt(line, &out);
      break;
    case PROGRAM_REPORT_REGEX:
      ParseRegex(line, &out);
      break;
    default:
      break;
  }
  // The protocol's lines are read whatever the report: a wrapped program may add its own.
  ParseAblate(line, &out);
  return out;
}

void OutputParser::ParseAblate(absl::string_view line, std::vector<ProgramEvent>* out) {
  const size_t at = line.find(kMarker);
  if (at == absl::string_view::npos) return;
  const absl::string_view body = line.substr(at + kMarker.size());
  const Json o = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (o.is_discarded() || !o.is_object()) {
    out->push_back(Invalid(body.size() >= kMaxProgramLineBytes - at - kMarker.size()
                               ? "a report line longer than 64 KiB"
                               : "not one JSON object after @ablate"));
    return;
  }
  auto t = o.find("t");
  if (t == o.end() || !t->is_string()) {
    out->push_back(Invalid("a report without \"t\" (step, eval, ckpt, params, end, error)"));
    return;
  }
  const std::string& type = t->get_ref<const std::string&>();
  ProgramEvent e;
  bool bad = false;
  if (type == "step") {
    const std::optional<int64_t> step = StepOf(o);
    const std::optional<double> loss = Field(o, "loss", &bad);
    if (!step || !loss || bad) {
      out->push_back(Invalid("a step report needs an integer step and a number loss"));
      return;
    }
    e.kind = Kind::kStep;
    e.step.set_step(*step);
    e.step.set_loss(*loss);
    if (auto v = Field(o, "grad_norm", &bad)) {
      e.step.set_grad_norm(*v);
      e.grad_norm_reported = true;
    }
    if (auto v = Field(o, "lr", &bad)) e.step.set_lr(*v);
    if (auto v = Field(o, "tokens", &bad); v && std::isfinite(*v) && *v > 0 && *v < 9e18) {
      e.tokens = static_cast<int64_t>(*v);
    }
    if (bad) {
      out->push_back(Invalid("a step report's grad_norm, lr and tokens must be numbers"));
      return;
    }
  } else if (type == "eval") {
    const std::optional<int64_t> step = StepOf(o);
    const std::optional<double> loss = Field(o, "val_loss", &bad);
    if (!step || !loss || bad) {
      out->push_back(Invalid("an eval report needs an integer step and a number val_loss"));
      return;
    }
    e.kind = Kind::kEval;
    e.eval.set_step(*step);
    SetValLoss(*loss, &e.eval);
    if (auto m = o.find("metrics"); m != o.end() && m->is_object()) {
      std::vector<std::string> dropped;
      for (auto it = m->begin(); it != m->end(); ++it) {
        const std::optional<double> v = Number(it.value());
        if (!v || !SetMetric(it.key(), *v, &e.eval)) {
          dropped.push_back(it.key().size() > 40 ? it.key().substr(0, 40) + "..." : it.key());
        }
      }
      if (!dropped.empty()) {
        e.message = absl::StrCat(
            "metric", dropped.size() > 1 ? "s " : " ", absl::StrJoin(dropped, ", "),
            " of the evaluation of step ", *step, " dropped: a name must be 1 to ",
            kMaxEvalMetricName, " bytes, a value a finite number, at most ", kMaxEvalMetrics,
            " per evaluation");
      }
    }
  } else if (type == "ckpt") {
    const std::optional<int64_t> step = StepOf(o);
    if (!step) {
      out->push_back(Invalid("a ckpt report needs an integer step"));
      return;
    }
    e.kind = Kind::kCheckpoint;
    e.checkpoint_step = *step;
  } else if (type == "params") {
    const std::optional<double> total = Field(o, "total", &bad);
    const std::optional<double> activated = Field(o, "activated", &bad);
    if (!total || bad || !(*total >= 0 && *total < 1e15)) {
      out->push_back(Invalid("a params report needs a number total"));
      return;
    }
    e.kind = Kind::kParams;
    e.params.set_total(static_cast<int64_t>(*total));
    e.params.set_activated(static_cast<int64_t>(
        activated && *activated >= 0 && *activated < 1e15 ? *activated : *total));
  } else if (type == "end") {
    e.kind = Kind::kEnd;
  } else if (type == "error") {
    e.kind = Kind::kError;
    if (auto m = o.find("msg"); m != o.end() && m->is_string()) e.message = m->get<std::string>();
    if (auto p = o.find("permanent"); p != o.end() && p->is_boolean()) e.permanent = p->get<bool>();
  } else {
    out->push_back(Invalid(absl::StrCat("unknown report type \"", type.substr(0, 64),
                                        "\" (step, eval, ckpt, params, end, error)")));
    return;
  }
  out->push_back(std::move(e));
}

void OutputParser::ParseNanoGpt(absl::string_view line, std::vector<ProgramEvent>* out) {
  static const re2::RE2* iter = new re2::RE2(R"(^iter (\d+): loss ([-+0-9.eEnaifNI]+))");
  static const re2::RE2* eval =
      new re2::RE2(R"(^step (\d+): train loss ([-+0-9.eEnaifNI]+), val loss ([-+0-9.eEnaifNI]+))");
  static const re2::RE2* saving = new re2::RE2(R"(^saving checkpoint to )");
  int64_t n = 0;
  std::string a, b;
  const re2::StringPiece text(line.data(), line.size());
  // Whatever comes after "saving checkpoint" was printed once torch.save returned.
  if (pending_checkpoint_ && !re2::RE2::PartialMatch(text, *saving)) {
    ProgramEvent c;
    c.kind = Kind::kCheckpoint;
    c.checkpoint_step = *pending_checkpoint_;
    out->push_back(c);
    pending_checkpoint_.reset();
  }
  if (re2::RE2::PartialMatch(text, *iter, &n, &a)) {
    double loss;
    if (!absl::SimpleAtod(a, &loss)) return;
    ProgramEvent e;
    e.kind = Kind::kStep;
    e.step.set_step(n + 1);
    e.step.set_loss(loss);
    out->push_back(std::move(e));
  } else if (re2::RE2::PartialMatch(text, *eval, &n, &a, &b)) {
    double val;
    if (!absl::SimpleAtod(b, &val)) return;
    ProgramEvent e;
    e.kind = Kind::kEval;
    e.eval.set_step(n);
    SetValLoss(val, &e.eval);
    last_eval_step_ = n;
    out->push_back(std::move(e));
  } else if (re2::RE2::PartialMatch(text, *saving)) {
    pending_checkpoint_ = last_eval_step_;
  }
}

void OutputParser::ParseRegex(absl::string_view line, std::vector<ProgramEvent>* out) {
  auto groups = [&](const re2::RE2& re) -> std::optional<std::map<std::string, std::string>> {
    const int n = re.NumberOfCapturingGroups();
    std::vector<re2::StringPiece> found(n + 1);
    if (!re.Match(re2::StringPiece(line.data(), line.size()), 0, line.size(), re2::RE2::UNANCHORED,
                  found.data(), n + 1)) {
      return std::nullopt;
    }
    std::map<std::string, std::string> named;
    for (const auto& [name, index] : re.NamedCapturingGroups()) {
      if (found[index].data() != nullptr) named[name] = std::string(found[index]);
    }
    return named;
  };
  auto number = [](const std::map<std::string, std::string>& g, const char* key,
                   double* v) -> bool {
    auto it = g.find(key);
    return it != g.end() && absl::SimpleAtod(it->second, v);
  };
  if (step_re_ != nullptr) {
    if (auto g = groups(*step_re_)) {
      double step, loss, v;
      if (number(*g, "step", &step) && step >= 0 && step < 9e15 && number(*g, "loss", &loss)) {
        ProgramEvent e;
        e.kind = Kind::kStep;
        e.step.set_step(static_cast<int64_t>(step));
        e.step.set_loss(loss);
        if (number(*g, "grad_norm", &v)) {
          e.step.set_grad_norm(v);
          e.grad_norm_reported = true;
        }
        if (number(*g, "lr", &v)) e.step.set_lr(v);
        if (number(*g, "tokens", &v) && v > 0 && v < 9e18) e.tokens = static_cast<int64_t>(v);
        out->push_back(std::move(e));
      }
    }
  }
  if (eval_re_ != nullptr) {
    if (auto g = groups(*eval_re_)) {
      double step, loss;
      if (number(*g, "step", &step) && step >= 0 && step < 9e15 && number(*g, "val_loss", &loss)) {
        ProgramEvent e;
        e.kind = Kind::kEval;
        e.eval.set_step(static_cast<int64_t>(step));
        SetValLoss(loss, &e.eval);
        out->push_back(std::move(e));
      }
    }
  }
}

}  // namespace ablate
