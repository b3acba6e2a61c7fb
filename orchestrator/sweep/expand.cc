#include "orchestrator/sweep/expand.h"

#include <openssl/sha.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/version.h"
#include "config/choice_task.h"
#include "config/data_source.h"
#include "config/memory_plan.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "config/program_config.h"
#include "config/program_snapshot.h"
#include "config/proto_yaml.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "orchestrator/sweep/budget.h"
#include "orchestrator/sweep/tune.h"

namespace ablate {

namespace pb = google::protobuf;

std::string RunKeyOfJson(const std::string& config_json, const std::string& code_version) {
  const std::string text = absl::StrCat(code_version, "\n", config_json);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), 8));
}

std::string RunKey(const RunConfig& config, const std::string& code_version) {
  return RunKeyOfJson(CanonicalJson(RunKeyView(config)), code_version);
}

namespace {

// One variant at one axis point, before seeds.
struct Prepared {
  bool ok = false;
  RunConfig pre;   // before budget matching (what budget anchors use)
  RunConfig post;  // after
  BudgetSolution budget;
  ParamCount params;
  double flops_per_token = 0;
  MemoryPlan memory;  // PlanMemory(post, resources.devices)
  std::string diff;
};

std::string FieldValue(const pb::Message& m, const pb::FieldDescriptor* f) {
  const pb::Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrCat(r->GetDouble(m, f));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrCat(r->GetFloat(m, f));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(m, f) ? "true" : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return EnumShortName(r->GetEnum(m, f));
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return absl::StrCat("\"", r->GetString(m, f), "\"");
    default:
      return "";
  }
}

// "field=value" for every leaf of `b` that differs from `a` (same message type).
void Diff(const pb::Message& a, const pb::Message& b, const std::string& prefix,
          std::vector<std::string>* out) {
  const pb::Descriptor* d = a.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    const std::string path = absl::StrCat(prefix, f->name());
    if (path == "train.seed") continue;  // every run of a seed has it: not a variant difference
    if (f->is_repeated()) {
      // Compared whole (the configs have no repeated fields today).
      pb::util::MessageDifferencer differ;
      const std::vector<const pb::FieldDescriptor*> only = {f};
      if (!differ.CompareWithFields(a, b, only, only)) out->push_back(path + "=(changed)");
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      Diff(a.GetReflection()->GetMessage(a, f), b.GetReflection()->GetMessage(b, f), path + ".",
           out);
    } else {
      const std::string va = FieldValue(a, f), vb = FieldValue(b, f);
      if (va != vb) out->push_back(absl::StrCat(path, "=", vb));
    }
  }
}

class Expander {
 public:
  Expander(const SweepSpec& spec, std::string code_version, const ExpandOptions& options,
           std::vector<std::string>* config_json)
      : spec_(spec),
        code_version_(std::move(code_version)),
        program_code_hash_(options.program_code_hash),
        program_count_(options.program_count),
        max_runs_(options.max_runs),
        device_memory_(options.device_memory_bytes),
        config_json_(config_json) {
    for (size_t i = 0; i < spec_.variants.size(); ++i) index_[spec_.variants[i].name] = i;
  }

  absl::StatusOr<ExpandedSweep> Run() {
    // The parser checked every name below; a spec built another way (or a parser bug) gets an
    // error here, never an exception from a lookup.
    const std::optional<size_t> reference =
        VariantIndex(spec_.reference, spec_.budget_line, "budget.reference");
    if (!reference) return absl::InvalidArgumentError(absl::StrJoin(problems_, "\n"));
    reference_ = *reference;

    // The axis grid: the product over axes of each axis's points.
    std::vector<AxisPoint> grid = {AxisPoint{}};
    for (const AxisSpec& axis : spec_.axes) {
      std::vector<AxisPoint> next;
      for (const AxisPoint& point : grid) {
        for (const AxisPoint& p : axis.points) {
          AxisPoint merged = point;
          merged.insert(merged.end(), p.begin(), p.end());
          next.push_back(std::move(merged));
        }
      }
      grid = std::move(next);
    }

    count_ = SiblingCounter(program_count_, ParamsPoints(grid));
    std::vector<std::vector<Prepared>> prepared(grid.size());
    for (size_t a = 0; a < grid.size(); ++a) prepared[a] = PreparePoint(grid[a]);
    // A data-parallel run divides the global batch between its ranks.
    const int devices = std::max(1, spec_.resources.devices());
    for (size_t a = 0; a < grid.size() && problems_.empty(); ++a) {
      for (size_t v = 0; v < spec_.variants.size(); ++v) {
        if (prepared[a][v].post.has_program()) continue;
        const absl::Status split =
            CheckBatchSplits(prepared[a][v].post.train(), devices, "ranks (resources.devices)");
        if (split.ok()) continue;
        Problem(spec_.variants[v].line, "train.batch_size",
                absl::StrCat("variant ", spec_.variants[v].name, ": ",
                             absl::StripPrefix(split.message(), "train.batch_size: ")));
        break;
      }
    }
    if (!problems_.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems_, "\n"));
    if (absl::Status s = CheckKeptRuns(grid.size(), prepared); !s.ok()) return s;
    CheckMemory(grid, prepared, devices);
    if (!problems_.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems_, "\n"));

    ExpandedSweep sweep;
    sweep.set_name(spec_.name);
    sweep.set_description(spec_.description);
    sweep.set_spec_file(spec_.file);
    sweep.set_priority(spec_.priority);
    sweep.set_reference(spec_.reference);
    if (spec_.base.has_program()) {
      ProgramConfig code;
      code.set_code_hash(program_code_hash_);
      sweep.set_code_version(ProgramCodeVersion(code));
    } else {
      sweep.set_code_version(code_version_);
    }
    for (const VariantSpec& v : spec_.variants) sweep.add_variants(v.name);
    for (uint64_t seed : spec_.seeds) {
      for (size_t a = 0; a < grid.size(); ++a) {
        for (size_t v = 0; v < spec_.variants.size(); ++v) {
          const Prepared& p = prepared[a][v];
          RunConfig config = p.post;
          config.mutable_train()->set_seed(seed);
          if (config.has_program() && !config.program().seed().empty()) {
            SetProgramParam(config.program().seed(), absl::StrCat(seed), config.mutable_program());
          }
          if (!Keep(spec_.variants[v].name, seed, config)) continue;
          RunSpec* run = sweep.add_runs();
          run->set_index(sweep.runs_size() - 1);
          run->set_sweep(spec_.name);
          run->set_variant(spec_.variants[v].name);
          run->set_description(spec_.variants[v].description);
          run->set_seed(seed);
          for (const AxisAssignment& assignment : grid[a]) {
            AxisValue* value = run->add_axes();
            value->set_path(assignment.path);
            value->set_value(assignment.text);
          }
          *run->mutable_params() = p.params;
          run->set_added_params(p.params.total() - prepared[a][reference_].params.total());
          *run->mutable_budget() = p.budget;
          run->set_flops_per_token(p.flops_per_token);
          *run->mutable_memory() = p.memory;
          run->set_diff(p.diff);
          run->set_priority(spec_.priority);
          *run->mutable_resources() = spec_.resources;
          run->set_spec_file(spec_.file);
          run->set_spec_line(spec_.variants[v].line);
          std::string json = CanonicalJson(config);
          if (config.has_program()) {
            // The program's code, command and params: not ablate's build.
            run->set_code_version(ProgramCodeVersion(config.program()));
            run->set_run_key(RunKeyOfJson(ProgramRunKeyText(config.program(), seed, devices),
                                          run->code_version()));
          } else {
            run->set_code_version(code_version_);
            // The data by its fingerprint, not its path (config/data_source.h).
            run->set_run_key(RunKey(config, code_version_));
          }
          *run->mutable_config() = std::move(config);
          if (config_json_ != nullptr) config_json_->push_back(std::move(json));
          if (spec_.tune) SetTuneRun(grid[a], spec_.variants[v], seed, run);
        }
      }
    }
    if (!problems_.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems_, "\n"));
    if (spec_.tune) {
      *sweep.mutable_tune() = MakeTunePlan(*spec_.tune, sweep);
      sweep.mutable_tune()->set_first_seed(spec_.seeds.front());
    }
    return sweep;
  }

 private:
  // The run's place in the tuning: its group (the variant and the other axes), its value of the
  // tuned axis and the first rung it pauses at. Every rung must fit the run's steps.
  void SetTuneRun(const AxisPoint& point, const VariantSpec& v, uint64_t seed, RunSpec* run) {
    const TuneSpec& tune = *spec_.tune;
    TuneRun* t = run->mutable_tune();
    std::vector<std::string> group = {v.name};
    for (const AxisAssignment& a : point) {
      if (a.path != tune.axis) {
        group.push_back(absl::StrCat(a.path, "=", a.text));
        continue;
      }
      double value = 0;
      (void)absl::SimpleAtod(a.text, &value);  // checked by the parser
      t->set_value(value);
    }
    t->set_group(absl::StrJoin(group, " "));
    if (tune.method != TuneSpec::Method::kAsha) return;
    // A program that cannot pause trains on past its rungs (TunePlan.trains_through).
    const bool pauses =
        !run->config().has_program() || HasCapability(run->config().program(), "pause");
    const int64_t steps = run->config().train().steps();
    for (int64_t rung : tune.rungs) {
      if (rung > steps) {
        Problem(tune.rungs_line, "tune.rungs",
                absl::StrCat("rung ", rung, " is past train.steps ", steps, " of variant ", v.name,
                             "; a rung equal to train.steps is the end"));
        return;
      }
      if (pauses && rung < steps && t->stop_at_step() == 0) t->set_stop_at_step(rung);
    }
    if (tune.seeds == TuneSpec::Seeds::kFirst && seed != spec_.seeds.front()) {
      t->set_held(true);
      t->set_stop_at_step(0);  // the chosen value's other seeds train straight through
    }
  }

  void Problem(int line, const std::string& path, const std::string& what) {
    const std::string p = YamlProblem(spec_.file, line, path, what);
    if (seen_.insert(p).second) problems_.push_back(p);
  }
  // Records each line of a failed status as a problem (they already name file and line); true
  // when `s` is OK.
  bool Absorb(const absl::Status& s) {
    if (s.ok()) return true;
    for (absl::string_view line : absl::StrSplit(s.message(), '\n')) {
      if (seen_.insert(std::string(line)).second) problems_.emplace_back(line);
    }
    return false;
  }

  // The distinct values the grid's points give program params (name -> JSON), for a counter
  // that asks about every point at once (SiblingCounter); none when the axes set no param, or
  // set so many combinations that asking about each at once would cost more than it saves.
  static std::vector<std::map<std::string, std::string>> ParamsPoints(
      const std::vector<AxisPoint>& grid) {
    constexpr size_t kMaxSiblings = 64;
    std::set<std::map<std::string, std::string>> points;
    for (const AxisPoint& point : grid) {
      std::map<std::string, std::string> params;
      for (const AxisAssignment& a : point) {
        if (!absl::StartsWith(a.path, kParamsPrefix)) continue;
        absl::StatusOr<std::string> json = YamlToJson(a.value);
        if (json.ok()) params[a.path.substr(sizeof(kParamsPrefix) - 1)] = *std::move(json);
      }
      if (!params.empty()) points.insert(std::move(params));
    }
    if (points.size() < 2 || points.size() > kMaxSiblings) return {};
    return {points.begin(), points.end()};
  }

  static std::string PointText(const AxisPoint& point) {
    std::vector<std::string> items;
    for (const AxisAssignment& a : point) items.push_back(absl::StrCat(a.path, "=", a.text));
    return absl::StrJoin(items, ", ");
  }

  // Reports a config validation status of variant `v`: each "path: what" at the line that set
  // the field (the variant's entry, an axis, the base), else the variant's line.
  void ReportInvalid(const absl::Status& s, const VariantSpec& v, const AxisPoint& point) {
    const std::string context = point.empty() ? "" : absl::StrCat(" (at ", PointText(point), ")");
    for (absl::string_view problem : absl::StrSplit(s.message(), "; ", absl::SkipEmpty())) {
      const size_t colon = problem.find(": ");
      const std::string path(colon == absl::string_view::npos ? "" : problem.substr(0, colon));
      const std::string what(colon == absl::string_view::npos ? problem
                                                              : problem.substr(colon + 2));
      int line = LineOfPath(v.node, path, -1);
      for (const AxisAssignment& a : point) {
        if (line < 0 && (path == a.path || absl::StartsWith(path, a.path + "."))) line = a.line;
      }
      if (line < 0) line = LineOfPath(spec_.base_node, path, -1);
      if (line < 0) line = v.line;
      Problem(line, absl::StrCat("variants[", v.name, "].", path), what + context);
    }
  }

  // The index of the variant called `name`; nullopt, with a problem at `line` naming `path`, when
  // the sweep has none.
  std::optional<size_t> VariantIndex(const std::string& name, int line, const std::string& path) {
    if (const auto it = index_.find(name); it != index_.end()) return it->second;
    std::vector<std::string> names;
    for (const VariantSpec& v : spec_.variants) names.push_back(v.name);
    Problem(line, path,
            absl::StrCat("no variant named \"", name,
                         "\" in this sweep; variants: ", absl::StrJoin(names, ", ")));
    return std::nullopt;
  }

  // The rule that matches `v`'s budget, or null when none does (a variant's own rule of match
  // NONE opts it out of the sweep's).
  const BudgetRule* RuleFor(const VariantSpec& v) const {
    if (v.budget) return v.budget->match() == BUDGET_NONE ? nullptr : &*v.budget;
    const BudgetRule& rule = spec_.budget;
    if (rule.match() == BUDGET_NONE) return nullptr;
    if (rule.apply_to_size() > 0) {
      for (const std::string& name : rule.apply_to()) {
        if (name == v.name) return &rule;
      }
      return nullptr;
    }
    if (v.name == rule.reference() || v.name == rule.target()) return nullptr;
    return &rule;
  }

  // Variant `v` at `point` before budget matching: base -> axis values -> preset -> overrides,
  // validated; not ok (with the problems reported) when any step fails.
  Prepared PrepareVariant(const VariantSpec& v, const AxisPoint& point,
                          const std::string& context) {
    RunConfig c = spec_.base;
    bool ok = true;
    for (const AxisAssignment& a : point) {
      const absl::Status s = OverlayYamlAtPath(a.value, spec_.file, a.line, a.path, &c);
      if (!s.ok()) {  // checked at parse time; kept for safety
        Problem(a.line, a.path, std::string(s.message()));
        ok = false;
      }
    }
    if (!v.preset.empty()) {
      const VariantPreset* preset = FindVariantPreset(v.preset);
      const absl::Status s = preset == nullptr ? absl::InvalidArgumentError("no such preset")
                                               : preset->apply(c.mutable_model());
      if (!s.ok()) {
        Problem(v.line, absl::StrCat("variants[", v.name, "].preset"),
                absl::StrCat(v.preset, " does not fit the base: ", s.message(), context));
        ok = false;
      }
    }
    const std::string path = absl::StrCat("variants[", v.name, "]");
    if (v.model) {
      ok = Absorb(OverlayYaml(v.model, spec_.file, path + ".model", c.mutable_model())) && ok;
    }
    if (v.train) {
      ok = Absorb(OverlayYaml(v.train, spec_.file, path + ".train", c.mutable_train())) && ok;
    }
    if (v.params) {
      YAML::Node wrapped;
      wrapped["params"] = v.params;
      ok = Absorb(OverlayYaml(wrapped, spec_.file, path, &c)) && ok;
    }
    if (ok && c.has_program()) {
      ok = PrepareProgram(v, point, &c);
    } else if (ok) {
      absl::Status s = ApplyData(v, point, &c);
      if (s.ok()) s = ValidateRunConfig(c);
      if (!s.ok()) {
        ReportInvalid(s, v, point);
        ok = false;
      }
    }
    Prepared p;
    p.ok = ok;
    p.pre = std::move(c);
    return p;
  }

  // What the run's data says (config/data_source.h): its fingerprint for the run key and, for a
  // prepared directory, the vocabulary, token width and end-of-document token. Each distinct
  // data config is resolved once per expansion.
  absl::Status ApplyData(const VariantSpec& v, const AxisPoint& point, RunConfig* c) {
    if (absl::Status s = ApplyChoiceFiles(c); !s.ok()) return s;
    const DataConfig& data = c->train().data();
    if (data.path().empty()) return absl::OkStatus();  // the default corpus, fixed by `make data`
    const std::string key = absl::StrCat(data.path(), "\n", data.val_path(), "\n", data.format());
    auto it = data_sources_.find(key);
    if (it == data_sources_.end()) {
      it = data_sources_.emplace(key, ResolveDataSource(data, data.path(), true)).first;
    }
    if (!it->second.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.data.path: ", it->second.status().message()));
    }
    return ApplyDataSource(*it->second, SetsVocabSize(v, point), c);
  }

  // The multiple-choice tasks of train.evals (config/choice_task.h): each task's name,
  // fingerprint and chance level, each distinct (file, samples) read once per expansion.
  absl::Status ApplyChoiceFiles(RunConfig* c) {
    for (int i = 0; i < c->train().evals_size(); ++i) {
      EvalTask* task = c->mutable_train()->mutable_evals(i);
      if (task->task() != kMultipleChoiceTask || task->file().empty()) continue;
      const std::string key = absl::StrCat(task->file(), "\n", task->samples());
      auto it = choice_tasks_.find(key);
      if (it == choice_tasks_.end()) {
        absl::StatusOr<ChoiceTask> loaded = LoadChoiceTask(task->file(), task->samples());
        if (loaded.ok()) loaded->items.clear();  // what the config takes is kept, not the documents
        it = choice_tasks_.emplace(key, std::move(loaded)).first;
      }
      if (!it->second.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("train.evals[", i, "].file: ", it->second.status().message()));
      }
      task->set_name(it->second->name);
      task->set_fingerprint(it->second->fingerprint);
      task->set_chance(it->second->chance);
    }
    return absl::OkStatus();
  }

  // Whether the spec itself sets model.vocab_size for `v` at `point` (in base:, an axis or the
  // variant's overrides), against a prepared directory's manifest.
  bool SetsVocabSize(const VariantSpec& v, const AxisPoint& point) const {
    if (const YAML::Node model = YamlChild(spec_.base_node, "model");
        model && YamlChild(model, "vocab_size")) {
      return true;
    }
    for (const AxisAssignment& a : point) {
      if (a.path == "model.vocab_size" ||
          (a.path == "model" && a.value.IsMap() && YamlChild(a.value, "vocab_size"))) {
        return true;
      }
    }
    return v.model && YamlChild(v.model, "vocab_size");
  }

  // A program run's config after its overlays: checked, its length (train.steps) from its steps
  // param and its code hash set. False, with the problems reported, when it is not valid.
  bool PrepareProgram(const VariantSpec& v, const AxisPoint& point, RunConfig* c) {
    ProgramConfig* program = c->mutable_program();
    program->set_code_hash(program_code_hash_);
    const absl::Status s = ValidateProgramConfig(*program);
    if (!s.ok()) {
      ReportInvalid(s, v, point);
      return false;
    }
    // nanoGPT counts its iterations from 0 to max_iters, both included: one more update.
    const int64_t extra = program->report() == PROGRAM_REPORT_NANOGPT ? 1 : 0;
    c->mutable_train()->set_steps(
        static_cast<int32_t>(*ProgramParamNumber(*program, program->steps()) + extra));
    bool ok = true;
    const SpikePolicy policy = c->train().spike().policy();
    if (policy == SPIKE_SKIP) {
      Problem(v.line, "spike.policy",
              "SKIP needs a per-step handshake a program does not have: use RECORD or STOP");
      ok = false;
    } else if (policy == SPIKE_ROLLBACK && !HasCapability(*program, "rollback")) {
      Problem(v.line, "spike.policy",
              "ROLLBACK relaunches the program from its checkpoint with ABLATE_ROLLBACK: it must "
              "declare capabilities: [rollback]");
      ok = false;
    }
    if (spec_.tune && spec_.tune->method == TuneSpec::Method::kBoundary &&
        !program->count().empty()) {
      Problem(spec_.tune->line, "tune.method",
              "boundary probes are expanded by the coordinator, which cannot run program.count: "
              "not supported for a program with count: yet");
      ok = false;
    }
    return ok;
  }

  // A program variant's budget (a param solved with program.count) and its counts.
  void PrepareProgramBudget(const VariantSpec& v, const std::vector<Prepared>& out, Prepared* p) {
    const ProgramCounter& count = count_;
    const BudgetRule* rule = RuleFor(v);
    const YAML::Node own = YamlChild(v.node, "budget");
    const int rule_line = own ? YamlLine(own) : v.budget ? v.line : spec_.budget_line;
    const std::string field = absl::StrCat("variants[", v.name, "].budget");
    if (rule != nullptr) {
      if (rule->param().empty()) {
        Problem(rule_line, field,
                "a program's runs are matched on a param: budget: {match: params.NAME}");
        p->ok = false;
        return;
      }
      if (!count) {
        Problem(rule_line, field, "solving a param needs program.count");
        p->ok = false;
        return;
      }
      const std::optional<size_t> anchor_index =
          VariantIndex(rule->reference(), rule_line, field + ".reference");
      if (!anchor_index) {
        p->ok = false;
        return;
      }
      const Prepared& a = out[*anchor_index];
      if (!a.ok) return;
      absl::StatusOr<std::vector<ParamCount>> anchor = count({ProgramParamsJson(a.pre.program())});
      absl::StatusOr<BudgetSolution> solution =
          anchor.ok() ? SolveProgramBudget(*rule, (*anchor)[0].total(), rule->reference(), count,
                                           p->post.mutable_program())
                      : absl::StatusOr<BudgetSolution>(anchor.status());
      if (!solution.ok()) {
        Problem(rule_line, field,
                std::string(absl::StripPrefix(solution.status().message(), "budget: ")));
        p->ok = false;
        return;
      }
      p->budget = *solution;
    }
    if (count) {
      absl::StatusOr<std::vector<ParamCount>> counted =
          count({ProgramParamsJson(p->post.program())});
      if (!counted.ok()) {
        Problem(v.line, absl::StrCat("variants[", v.name, "]"),
                std::string(counted.status().message()));
        p->ok = false;
        return;
      }
      p->params = (*counted)[0];
    }
  }

  std::vector<Prepared> PreparePoint(const AxisPoint& point) {
    const std::string context = point.empty() ? "" : absl::StrCat(" (at ", PointText(point), ")");
    std::vector<Prepared> out(spec_.variants.size());
    // 1. Every variant before budget matching.
    for (size_t i = 0; i < spec_.variants.size(); ++i) {
      out[i] = PrepareVariant(spec_.variants[i], point, context);
    }
    // 2. Budget matching against the anchors' unmatched configs.
    for (size_t i = 0; i < spec_.variants.size(); ++i) {
      const VariantSpec& v = spec_.variants[i];
      Prepared& p = out[i];
      if (!p.ok) continue;
      p.post = p.pre;
      if (p.post.has_program()) {
        PrepareProgramBudget(v, out, &p);
        continue;
      }
      if (const BudgetRule* rule = RuleFor(v)) {
        const bool ffn = rule->match() == BUDGET_FFN;
        const std::string& anchor = ffn ? rule->reference() : rule->target();
        const YAML::Node own = YamlChild(v.node, "budget");
        const int rule_line = own ? YamlLine(own) : v.budget ? v.line : spec_.budget_line;
        const std::optional<size_t> anchor_index = VariantIndex(
            anchor, rule_line,
            absl::StrCat("variants[", v.name, "].budget.", ffn ? "reference" : "target"));
        if (!anchor_index) {
          p.ok = false;
          continue;
        }
        const Prepared& a = out[*anchor_index];
        if (!a.ok) continue;  // its own problem is reported
        absl::StatusOr<BudgetSolution> solution =
            SolveBudget(*rule, a.pre.model(), anchor, p.post.mutable_model());
        if (!solution.ok()) {
          std::string message(solution.status().message());
          std::string field = "budget";
          const size_t colon = message.find(": ");
          if (absl::StartsWith(message, "budget") && colon != std::string::npos) {
            field = message.substr(0, colon);
            message = message.substr(colon + 2);
          }
          Problem(rule_line, absl::StrCat("variants[", v.name, "].", field), message + context);
          p.ok = false;
          continue;
        }
        p.budget = *solution;
        const absl::Status s = ValidateRunConfig(p.post);
        if (!s.ok()) {
          ReportInvalid(s, v, point);
          p.ok = false;
          continue;
        }
      }
      p.params = CountParams(p.post.model());
      p.flops_per_token = TrainingFlopsPerToken(p.post.model(), p.post.train().seq_len());
      p.memory = PlanMemory(p.post, spec_.resources.devices());
    }
    // 3. Differences from the reference variant at this point.
    const Prepared& ref = out[reference_];
    for (size_t i = 0; i < spec_.variants.size(); ++i) {
      Prepared& p = out[i];
      if (!p.ok || !ref.ok || i == reference_) continue;
      std::vector<std::string> items;
      if (p.post.has_program()) {
        for (const ProgramParam& param : p.post.program().params()) {
          const std::optional<std::string> theirs =
              ProgramParamJson(ref.post.program(), param.name());
          if (theirs != param.json())
            items.push_back(absl::StrCat("params.", param.name(), "=", param.json()));
        }
        for (const ProgramParam& param : ref.post.program().params()) {
          if (!ProgramParamJson(p.post.program(), param.name())) {
            items.push_back(absl::StrCat("params.", param.name(), "=(unset)"));
          }
        }
        p.diff = absl::StrJoin(items, " ");
        continue;
      }
      Diff(ref.post.model(), p.post.model(), "", &items);
      Diff(ref.post.train(), p.post.train(), "train.", &items);
      p.diff = absl::StrJoin(items, " ");
    }
    return out;
  }

  bool Matches(const FilterSpec::Condition& c, const std::string& variant, uint64_t seed,
               const RunConfig& config) const {
    if (c.key == "variant") {
      return std::find(c.names.begin(), c.names.end(), variant) != c.names.end();
    }
    if (c.key == "seed") return std::find(c.seeds.begin(), c.seeds.end(), seed) != c.seeds.end();
    // A field condition holds when setting the field to the value changes nothing.
    RunConfig copy = config;
    if (!OverlayYamlAtPath(c.value, spec_.file, c.line, c.key, &copy).ok()) return false;
    return pb::util::MessageDifferencer::Equals(copy, config);
  }

  // A problem for each variant and axis point whose memory plan exceeds the device's memory
  // (ExpandOptions::device_memory_bytes) or the spec's resources.memory_gb, whichever is less.
  void CheckMemory(const std::vector<AxisPoint>& grid,
                   const std::vector<std::vector<Prepared>>& prepared, int devices) {
    int64_t limit = device_memory_;
    std::string source = "--device-memory";
    const double spec_gb = spec_.resources.memory_gb();
    if (spec_gb > 0 && (limit == 0 || spec_gb * 1e9 < static_cast<double>(limit))) {
      limit = static_cast<int64_t>(spec_gb * 1e9);
      source = "resources.memory_gb";
    }
    if (limit <= 0) return;
    for (size_t a = 0; a < grid.size(); ++a) {
      for (size_t v = 0; v < spec_.variants.size(); ++v) {
        const Prepared& p = prepared[a][v];
        if (!p.ok || p.post.has_program()) continue;  // a program's memory is its own
        const std::string run =
            absl::StrCat("variant ", spec_.variants[v].name,
                         grid[a].empty() ? "" : absl::StrCat(" (at ", PointText(grid[a]), ")"));
        const absl::Status fits = CheckMemoryFits(run, p.post, devices, p.memory, limit);
        if (!fits.ok()) {
          Problem(spec_.variants[v].line, "",
                  absl::StrCat(fits.message(), " [the limit is ", source, "]"));
        }
      }
    }
  }

  // InvalidArgument when more than max_runs_ runs pass the filters: counted before any run is
  // built, so that a spec of many seeds with a long description cannot make gigabytes first.
  absl::Status CheckKeptRuns(size_t points, const std::vector<std::vector<Prepared>>& prepared) {
    if (max_runs_ <= 0) return absl::OkStatus();
    const int64_t candidates =
        static_cast<int64_t>(spec_.seeds.size() * points * spec_.variants.size());
    if (candidates <= max_runs_) return absl::OkStatus();
    int64_t kept = candidates;
    if (!spec_.filters.empty()) {
      kept = 0;
      RunConfig config;
      for (uint64_t seed : spec_.seeds) {
        for (size_t a = 0; a < points; ++a) {
          for (size_t v = 0; v < spec_.variants.size(); ++v) {
            config = prepared[a][v].post;
            config.mutable_train()->set_seed(seed);
            kept += Keep(spec_.variants[v].name, seed, config);
          }
        }
      }
    }
    if (kept <= max_runs_) return absl::OkStatus();
    const int line = !spec_.filters.empty() ? spec_.filters.front().line
                     : spec_.seeds_line > 0 ? spec_.seeds_line
                                            : 1;
    const bool filtered = !spec_.filters.empty();
    return absl::InvalidArgumentError(
        absl::StrCat(spec_.file, ":", line, ": the sweep has ", kept, " runs",
                     filtered ? " after filters" : "", " (", spec_.seeds.size(), " seeds x ",
                     points, points == 1 ? " axis point x " : " axis points x ",
                     spec_.variants.size(), " variants", filtered ? " before them" : "",
                     "); the limit is ", max_runs_, ": split it into several sweeps"));
  }

  bool Keep(const std::string& variant, uint64_t seed, const RunConfig& config) const {
    for (const FilterSpec& f : spec_.filters) {
      bool all = true;
      for (const FilterSpec::Condition& c : f.conditions) {
        if (!Matches(c, variant, seed, config)) {
          all = false;
          break;
        }
      }
      if (f.exclude == all) return false;
    }
    return true;
  }

  const SweepSpec& spec_;
  const std::string code_version_;
  const std::string program_code_hash_;          // ExpandOptions::program_code_hash
  const ProgramCounter program_count_;           // ExpandOptions::program_count
  ProgramCounter count_;  // program_count_, asked about every axis point at once (Run)
  const int64_t max_runs_;                       // ExpandOptions::max_runs
  const int64_t device_memory_;                  // ExpandOptions::device_memory_bytes
  std::vector<std::string>* const config_json_;  // may be null
  std::map<std::string, size_t> index_;
  std::map<std::string, absl::StatusOr<DataSource>> data_sources_;  // ApplyData's, by data config
  std::map<std::string, absl::StatusOr<ChoiceTask>> choice_tasks_;  // by (file, samples)
  size_t reference_ = 0;
  std::vector<std::string> problems_;
  std::set<std::string> seen_;
};

}  // namespace

absl::StatusOr<ExpandedSweep> ExpandSweep(const SweepSpec& spec, const ExpandOptions& options,
                                          std::vector<std::string>* config_json) {
  if (config_json != nullptr) config_json->clear();
  const bool this_build = options.code_version.empty();
  if (spec.base.has_program() && options.program_code_hash.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.file,
                     ": program: the code was not snapshotted; submit or expand the spec with the "
                     "ablate CLI, which reads program.code from the spec's directory"));
  }
  absl::StatusOr<ExpandedSweep> sweep =
      Expander(spec, this_build ? CodeVersion() : options.code_version, options, config_json).Run();
  if (!sweep.ok()) {
    if (config_json != nullptr) config_json->clear();
    return sweep;
  }
  if (this_build && !spec.base.has_program()) {  // a program's runs are keyed to its code
    sweep->set_build(BuildVersion());
    for (std::string& file : UncommittedSources()) sweep->add_uncommitted(std::move(file));
  }
  return sweep;
}

absl::StatusOr<std::vector<RunSpec>> ExpandTuneProbe(const SweepSpec& spec,
                                                     const std::string& group, double value,
                                                     const ExpandOptions& options,
                                                     std::vector<std::string>* config_json) {
  if (!spec.tune || spec.axes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.file, ": the spec has no tune: block"));
  }
  SweepSpec probe = spec;
  AxisAssignment a = probe.tune->values.front();
  a.text = FormatTuneValue(value);
  a.value = YAML::Node(a.text);
  probe.tune->values = {a};
  probe.axes.back().points = {{a}};  // the tune's axis is the last
  std::vector<std::string> json;
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweep(probe, options, &json);
  if (!sweep.ok()) return sweep.status();
  std::vector<RunSpec> runs;
  if (config_json != nullptr) config_json->clear();
  for (int i = 0; i < sweep->runs_size(); ++i) {
    if (sweep->runs(i).tune().group() != group) continue;
    runs.push_back(sweep->runs(i));
    if (config_json != nullptr) config_json->push_back(std::move(json[i]));
  }
  if (runs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.file, ": no runs of group \"", group, "\" at ", a.text));
  }
  return runs;
}

namespace {

// program.dir, relative to the spec file's directory.
std::filesystem::path ProgramDir(const SweepSpec& spec) {
  std::filesystem::path dir = spec.base.program().dir().empty() ? "." : spec.base.program().dir();
  if (dir.is_relative()) dir = std::filesystem::path(spec.file).parent_path() / dir;
  dir = dir.lexically_normal();
  return dir.empty() ? "." : dir;
}

}  // namespace

absl::StatusOr<ProgramSnapshot> ReadSpecProgram(const SweepSpec& spec) {
  const ProgramConfig& program = spec.base.program();
  absl::StatusOr<ProgramSnapshot> snapshot =
      ReadProgramCode(ProgramDir(spec).string(), {program.code().begin(), program.code().end()});
  if (!snapshot.ok()) {
    return absl::Status(snapshot.status().code(),
                        absl::StrCat(spec.file, ": ", snapshot.status().message()));
  }
  return snapshot;
}

ProgramCounter SpecProgramCounter(const SweepSpec& spec,
                                  std::shared_ptr<std::map<std::string, ParamCount>> record) {
  return CommandCounter(spec.base.program().count(), ProgramDir(spec).string(),
                        kProgramCountTimeout, std::move(record));
}

absl::StatusOr<ExpandedSweep> ExpandSweepFile(const std::string& path,
                                              const ExpandOptions& options) {
  absl::StatusOr<SweepSpec> spec = LoadSweepSpecFile(path);
  if (!spec.ok()) return spec.status();
  if (!spec->base.has_program() || !options.program_code_hash.empty()) {
    return ExpandSweep(*spec, options);
  }
  absl::StatusOr<ProgramSnapshot> code = ReadSpecProgram(*spec);
  if (!code.ok()) return code.status();
  ExpandOptions with_code = options;
  with_code.program_code_hash = code->code_hash();
  if (!with_code.program_count && !spec->base.program().count().empty()) {
    with_code.program_count = SpecProgramCounter(*spec, nullptr);
  }
  return ExpandSweep(*spec, with_code);
}

}  // namespace ablate
