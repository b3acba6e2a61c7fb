#include "orchestrator/sweep/spec.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "config/model_config.h"
#include "config/presets.h"
#include "config/program_config.h"
#include "config/proto_yaml.h"
#include "orchestrator/sweep/budget.h"
#include "orchestrator/sweep/problems.h"
#include "orchestrator/sweep/tune.h"

namespace ablate {

namespace {

const std::vector<std::string>& TopLevelKeys() {
  static const auto* keys = new std::vector<std::string>{
      "sweep",  "description", "base",      "variants", "axes", "seeds",   "filters",
      "budget", "spike",       "resources", "priority", "tune", "program", "evals"};
  return *keys;
}

const std::vector<std::string>& VariantKeys() {
  static const auto* keys = new std::vector<std::string>{"name",  "preset", "group",  "description",
                                                         "model", "train",  "budget", "params"};
  return *keys;
}

YAML::Node Child(const YAML::Node& node, const char* key) { return YamlChild(node, key); }

std::string Text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

// Parses a spec into spec_, every problem into problems_ (problems.h).
class Parser {
 public:
  explicit Parser(const std::string& file) : file_(file) {}

  absl::StatusOr<SweepSpec> Parse(const YAML::Node& root) {
    spec_.file = file_;
    spec_.base = DefaultRunConfig();
    spec_.budget = DefaultBudgetRule();
    if (!root.IsMap()) {
      Problem(YamlLine(root), "", "a sweep spec is a mapping with sweep:, base:, variants:, ...");
      return Finish();
    }
    CheckKeys(root, "", TopLevelKeys());
    if (HasProblems()) return Finish();  // a misspelt top-level key changes the meaning of all

    ParseName(root);
    if (const YAML::Node d = Child(root, "description"); d) {
      spec_.description = Scalar(d, "description");
      CheckLength(d, "description", spec_.description, kMaxDescriptionBytes);
    }
    ParseBase(root);
    if (const YAML::Node program = Child(root, "program"); program) {
      has_program_ = true;
      ParseProgram(program, root);
    } else if (spec_.base.has_program()) {
      Problem(LineOfPath(spec_.base_node, "params", YamlLine(root)), "base.params",
              "params: are a program's settings; this sweep has no program: block");
    }
    if (const YAML::Node p = Child(root, "priority"); p) ParsePriority(p);
    ParseResources(Child(root, "resources"));
    const YAML::Node budget = Child(root, "budget");
    if (budget) {
      spec_.budget_line = LineOf(budget, root);
      OverlayBudget(budget, "budget", &spec_.budget);
    }
    ParseVariants(Child(root, "variants"), YamlLine(root));
    ParseReferenceAndBudget(budget);
    ParseSeeds(Child(root, "seeds"));
    if (const YAML::Node axes = Child(root, "axes"); axes) ParseAxes(axes);
    // After the axes and variants it checks against; its values become the last axis.
    if (const YAML::Node tune = Child(root, "tune"); tune && !HasProblems()) {
      ParseTuneBlock(tune, &spec_, &problems_);
    }
    if (const YAML::Node filters = Child(root, "filters"); filters) ParseFilters(filters);
    if (!HasProblems()) CheckRunCount(root);
    return Finish();
  }

 private:
  void Problem(int line, const std::string& path, const std::string& what) {
    problems_.Add(line, path, what);
  }
  void Absorb(const absl::Status& s) { problems_.Absorb(s); }
  bool HasProblems() const { return !problems_.empty(); }

  absl::StatusOr<SweepSpec> Finish() {
    if (!problems_.empty()) return problems_.ToStatus();
    return std::move(spec_);
  }

  // The line of `node`, or of its parent when the node has none (an empty value).
  static int LineOf(const YAML::Node& node, const YAML::Node& parent) {
    const int line = YamlLine(node);
    return line > 0 ? line : YamlLine(parent);
  }

  void CheckKeys(const YAML::Node& map, const std::string& path,
                 const std::vector<std::string>& known) {
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : Text(it->first);
      const int line = YamlLine(it->first);
      if (!seen.insert(key).second) {
        Problem(line, path.empty() ? key : absl::StrCat(path, ".", key), "duplicate key");
        continue;
      }
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      problems_.UnknownKey(line, path, key, known);
    }
  }

  std::string Scalar(const YAML::Node& node, const std::string& path) {
    if (!node.IsScalar()) {
      Problem(YamlLine(node), path, absl::StrCat("expected a string, got ", Text(node)));
      return "";
    }
    return node.Scalar();
  }

  // A name or a description is copied into every run of the sweep: a long one would multiply
  // into gigabytes before the run cap applies.
  bool CheckLength(const YAML::Node& n, const std::string& path, const std::string& text,
                   size_t max) {
    if (text.size() <= max) return true;
    Problem(YamlLine(n), path,
            absl::StrCat("is ", text.size(), " bytes long: at most ", max, " are allowed"));
    return false;
  }

  void ParseName(const YAML::Node& root) {
    const YAML::Node n = Child(root, "sweep");
    if (!n) {
      Problem(YamlLine(root), "sweep", "missing: every spec names its sweep (sweep: NAME)");
      return;
    }
    spec_.name = Scalar(n, "sweep");
    if (n.IsScalar() && spec_.name.empty()) Problem(YamlLine(n), "sweep", "must not be empty");
    if (!CheckLength(n, "sweep", spec_.name, kMaxNameBytes)) return;
    for (char c : spec_.name) {
      if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
        Problem(YamlLine(n), "sweep",
                absl::StrCat("\"", spec_.name, "\": use letters, digits, '_', '-' and '.' only"));
        break;
      }
    }
  }

  void ParseBase(const YAML::Node& root) {
    const YAML::Node base = Child(root, "base");
    if (base) {
      spec_.base_node.reset(base);
      Absorb(OverlayYaml(base, file_, "base", &spec_.base));
    }
    if (const YAML::Node spike = Child(root, "spike"); spike) {
      Absorb(OverlayYaml(spike, file_, "spike", spec_.base.mutable_train()->mutable_spike()));
    }
    if (const YAML::Node evals = Child(root, "evals"); evals) {
      // The runs' train.evals (docs/evals.md): a variant's or an axis's train.evals replaces it.
      YAML::Node wrapped;
      wrapped["evals"] = evals;
      Absorb(OverlayYaml(wrapped, file_, "", spec_.base.mutable_train()));
    }
    if (HasProblems()) return;
    const absl::Status s = ValidateRunConfig(spec_.base);
    if (!s.ok()) {
      // Paths are relative to base: (model.x); locate them there.
      const absl::Status located =
          LocateProblems(s, base ? base : YAML::Node(), file_, base ? YamlLine(base) : 1);
      for (absl::string_view line : absl::StrSplit(located.message(), '\n')) {
        // "FILE:LINE: model.x: what" -> "FILE:LINE: base.model.x: what"
        std::string text(line);
        const size_t at = text.find(": ");
        if (at != std::string::npos) text.insert(at + 2, "base.");
        problems_.AddLine(std::move(text));
      }
    }
  }

  // `program:` (docs/program.md): the command and how ablate talks to it. Its params come from
  // `base: params:` and the variants'; the base's model: and train: do not apply.
  void ParseProgram(const YAML::Node& node, const YAML::Node& root) {
    const int line = LineOf(node, root);
    if (!node.IsMap()) {
      Problem(line, "program", "expected a mapping with command:, steps:, ...");
      return;
    }
    ProgramConfig* program = spec_.base.mutable_program();
    program->set_grace_s(kDefaultGraceSeconds);
    program->set_max_log_bytes(kDefaultMaxLogBytes);
    YAML::Node fields;  // every key but patterns:, overlaid by reflection
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : Text(it->first);
      if (key == "patterns") continue;
      if (key == "params" || key == "code_hash") {
        Problem(YamlLine(it->first), absl::StrCat("program.", key),
                key == "params" ? "params go in base: params: and the variants' params:"
                                : "is computed from code: at submit, not written");
        continue;
      }
      fields[key] = it->second;
    }
    Absorb(OverlayYaml(fields, file_, "program", program));
    if (const YAML::Node patterns = Child(node, "patterns"); patterns) {
      if (!patterns.IsMap()) {
        Problem(YamlLine(patterns), "program.patterns",
                "expected a mapping {step: REGEX, eval: REGEX}");
      } else {
        for (auto it = patterns.begin(); it != patterns.end(); ++it) {
          ProgramPattern* p = program->add_patterns();
          p->set_kind(it->first.Scalar());
          p->set_regex(Scalar(it->second, absl::StrCat("program.patterns.", p->kind())));
        }
      }
    }
    if (program->code().empty()) {
      Problem(
          line, "program.code",
          "missing: the files that are the program (e.g. [\"*.py\"]), hashed into every run key");
    }
    // A program takes no settings of the built-in model; its length and seed are params.
    for (const char* key : {"model", "train"}) {
      if (const YAML::Node n = YamlChild(spec_.base_node, key); n) {
        Problem(YamlLine(n), absl::StrCat("base.", key),
                "a program: sweep has no built-in model; its settings are base: params:");
      }
    }
    if (HasProblems()) return;
    if (absl::Status s = ValidateProgramConfig(*program); !s.ok()) {
      for (absl::string_view problem : absl::StrSplit(s.message(), "; ")) {
        const size_t colon = problem.find(": ");
        if (colon == absl::string_view::npos) {
          Problem(line, "program", std::string(problem));
          continue;
        }
        const std::string path(problem.substr(0, colon));
        const std::string field(absl::StripPrefix(path, "program."));
        int at = LineOfPath(node, field, -1);
        if (at < 0 && field == "steps") at = LineOfPath(spec_.base_node, "params", line);
        Problem(at < 0 ? line : at, path, std::string(problem.substr(colon + 2)));
      }
      return;
    }
    const std::optional<double> steps = ProgramParamNumber(*program, program->steps());
    spec_.base.mutable_train()->set_steps(static_cast<int32_t>(*steps));
  }

  // `budget:` onto *rule. `match: params.NAME` (a program's param, solved with its count:
  // command) sets rule->param and matches the reference's total.
  void OverlayBudget(const YAML::Node& b, const std::string& path, BudgetRule* rule) {
    const YAML::Node match = b.IsMap() ? Child(b, "match") : YAML::Node();
    if (!match || !match.IsScalar() || match.Scalar().rfind(kParamsPrefix, 0) != 0) {
      rule->clear_param();
      Absorb(OverlayYaml(b, file_, path, rule));
      return;
    }
    const std::string name = match.Scalar().substr(sizeof(kParamsPrefix) - 1);
    if (!has_program_) {
      Problem(YamlLine(match), path + ".match",
              "params.NAME is a program's param; this sweep has no program: block");
      return;
    }
    if (absl::Status s = CheckParamName(name); !s.ok()) {
      Problem(YamlLine(match), path + ".match", std::string(s.message()));
      return;
    }
    if (spec_.base.program().count().empty()) {
      Problem(YamlLine(match), path + ".match",
              "solving a param needs program.count: the command that counts parameters");
      return;
    }
    YAML::Node rest;
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (it->first.Scalar() != "match") rest[it->first] = it->second;
    }
    Absorb(OverlayYaml(rest, file_, path, rule));
    rule->set_match(BUDGET_FFN);
    rule->set_param(name);
  }

  void ParsePriority(const YAML::Node& p) {
    int v;
    if (!p.IsScalar() || !absl::SimpleAtoi(p.Scalar(), &v)) {
      Problem(YamlLine(p), "priority", absl::StrCat("expected an integer, got ", Text(p)));
      return;
    }
    if (v < 0 || v > 1000) {
      Problem(YamlLine(p), "priority", absl::StrCat("must be in [0, 1000], got ", v));
      return;
    }
    spec_.priority = v;
  }

  void ParseResources(const YAML::Node& r) {
    const std::string& device = spec_.base.train().device();
    spec_.resources.set_device(device.rfind("cuda", 0) == 0 ? "cuda" : "cpu");
    if (!r) return;
    Absorb(OverlayYaml(r, file_, "resources", &spec_.resources));
    const int line = YamlLine(r);
    const Resources& res = spec_.resources;
    if (res.device() != "cpu" && res.device() != "cuda") {
      Problem(LineOfPath(r, "device", line), "resources.device",
              absl::StrCat("must be cpu or cuda, got \"", res.device(), "\""));
    }
    if (!(res.memory_gb() >= 0)) {
      Problem(LineOfPath(r, "memory_gb", line), "resources.memory_gb", "must be >= 0");
    }
    if (res.threads() < 0)
      Problem(LineOfPath(r, "threads", line), "resources.threads", "must be >= 0");
    if (res.devices() < 0 || res.devices() > kMaxDevices) {
      Problem(LineOfPath(r, "devices", line), "resources.devices",
              absl::StrCat("must be in [1, ", kMaxDevices, "], got ", res.devices()));
    }
  }

  // ---- variants --------------------------------------------------------------------------------

  bool AddVariant(VariantSpec v, bool from_group) {
    for (const VariantSpec& existing : spec_.variants) {
      if (existing.name != v.name) continue;
      // A preset pulled in again by a group is the same variant: keep the first.
      if (from_group && existing.preset == v.preset && existing.name == existing.preset &&
          existing.model.IsNull() && existing.train.IsNull() && !existing.budget) {
        return false;
      }
      Problem(v.line, absl::StrCat("variants[", v.name, "]"),
              absl::StrCat("duplicate variant name \"", v.name, "\" (first at line ", existing.line,
                           ")"));
      return false;
    }
    spec_.variants.push_back(std::move(v));
    return true;
  }

  std::vector<std::string> PresetAndGroupNames() const {
    std::vector<std::string> names;
    for (const VariantPreset& p : AllVariantPresets()) names.push_back(p.name);
    for (const PresetGroup& g : AllPresetGroups()) names.push_back(g.name);
    return names;
  }

  void UnknownPreset(int line, const std::string& path, const std::string& name, bool group) {
    std::vector<std::string> names;
    if (group) {
      for (const PresetGroup& g : AllPresetGroups()) names.push_back(g.name);
    } else {
      names = PresetAndGroupNames();
    }
    const std::string best = ClosestName(name, names);
    Problem(line, path,
            absl::StrCat("unknown ", group ? "group" : "preset", " \"", name, "\"",
                         best.empty() ? absl::StrCat("; known: ", absl::StrJoin(names, ", "))
                                      : absl::StrCat(" (did you mean \"", best, "\"?)")));
  }

  void AddGroup(const PresetGroup& group, int line) {
    for (const std::string& name : group.variants) {
      const VariantPreset* p = FindVariantPreset(name);
      VariantSpec v;
      v.name = name;
      v.preset = name;
      v.description = p->description;
      v.line = line;
      AddVariant(std::move(v), /*from_group=*/true);
    }
  }

  void ParseVariants(const YAML::Node& list, int root_line) {
    if (!list) {
      Problem(root_line, "variants", "missing: list the presets, groups or custom variants to run");
      return;
    }
    if (!list.IsSequence() || list.size() == 0) {
      Problem(YamlLine(list) ? YamlLine(list) : root_line, "variants",
              "expected a non-empty list of presets, groups or variant mappings");
      return;
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node entry = list[i];
      const int line = YamlLine(entry) ? YamlLine(entry) : YamlLine(list);
      const std::string path = absl::StrCat("variants[", i, "]");
      if (entry.IsScalar()) {
        const std::string& name = entry.Scalar();
        if (const VariantPreset* p = FindVariantPreset(name)) {
          VariantSpec v;
          v.name = name;
          v.preset = name;
          v.description = p->description;
          v.node.reset(entry);
          v.line = line;
          AddVariant(std::move(v), /*from_group=*/false);
        } else if (const PresetGroup* g = FindPresetGroup(name)) {
          AddGroup(*g, line);
        } else {
          UnknownPreset(line, path, name, false);
        }
        continue;
      }
      if (!entry.IsMap()) {
        Problem(line, path, "expected a preset name, a group name or a mapping");
        continue;
      }
      CheckKeys(entry, path, VariantKeys());
      if (const YAML::Node g = Child(entry, "group"); g) {
        if (entry.size() != 1) {
          Problem(line, path,
                  "a group entry takes no other keys; list the variant separately "
                  "to override it");
        }
        const std::string name = Scalar(g, path + ".group");
        if (const PresetGroup* group = FindPresetGroup(name)) {
          AddGroup(*group, line);
        } else if (!name.empty()) {
          UnknownPreset(YamlLine(g), path + ".group", name, true);
        }
        continue;
      }
      ParseVariantMapping(entry, path, line);
    }
  }

  // A custom variant, or a preset's with overrides (`entry`, a mapping without `group:`).
  void ParseVariantMapping(const YAML::Node& entry, const std::string& path, int line) {
    VariantSpec v;
    v.node.reset(entry);
    v.line = line;
    if (const YAML::Node p = Child(entry, "preset"); p) {
      v.preset = Scalar(p, path + ".preset");
      if (const VariantPreset* preset = FindVariantPreset(v.preset)) {
        v.description = preset->description;
      } else if (!v.preset.empty()) {
        UnknownPreset(YamlLine(p), path + ".preset", v.preset, false);
        return;
      }
    }
    if (const YAML::Node n = Child(entry, "name"); n) {
      v.name = Scalar(n, path + ".name");
    } else {
      v.name = v.preset;
    }
    if (v.name.empty()) {
      Problem(line, path, "needs a preset, a group or a name (a custom variant)");
      return;
    }
    if (!CheckLength(entry, path + ".name", v.name, kMaxNameBytes)) return;
    const std::string vpath = absl::StrCat("variants[", v.name, "]");
    if (v.preset.empty()) v.description = "custom";
    if (const YAML::Node d = Child(entry, "description"); d) {
      v.description = Scalar(d, vpath + ".description");
      CheckLength(d, vpath + ".description", v.description, kMaxDescriptionBytes);
    }
    // Check the overrides' keys and types now, against a scratch config.
    RunConfig scratch = spec_.base;
    if (const YAML::Node m = Child(entry, "model"); m) {
      v.model.reset(m);
      Absorb(OverlayYaml(m, file_, vpath + ".model", scratch.mutable_model()));
    }
    if (const YAML::Node t = Child(entry, "train"); t) {
      v.train.reset(t);
      Absorb(OverlayYaml(t, file_, vpath + ".train", scratch.mutable_train()));
    }
    if (const YAML::Node params = Child(entry, "params"); params) {
      v.params.reset(params);
      YAML::Node wrapped;
      wrapped["params"] = params;
      Absorb(OverlayYaml(wrapped, file_, vpath, &scratch));
    }
    if (has_program_) {
      for (const char* key : {"preset", "model", "train"}) {
        if (const YAML::Node n = Child(entry, key); n) {
          Problem(YamlLine(n), absl::StrCat(vpath, ".", key),
                  "a program: sweep's variants set params:, not the built-in model's settings");
        }
      }
    } else if (const YAML::Node n = Child(entry, "params"); n) {
      Problem(YamlLine(n), vpath + ".params",
              "params: are a program's settings; this sweep has no program: block");
    }
    // `budget:` with nothing under it changes nothing, as an empty mapping does elsewhere: the
    // sweep's rule applies.
    if (const YAML::Node b = Child(entry, "budget"); b && !b.IsNull()) {
      BudgetRule rule = spec_.budget;
      rule.clear_apply_to();
      OverlayBudget(b, vpath + ".budget", &rule);
      if (b.IsMap() && Child(b, "apply_to")) {
        Problem(YamlLine(Child(b, "apply_to")), vpath + ".budget.apply_to",
                "only a sweep-level budget has apply_to");
      }
      v.budget = rule;
    }
    AddVariant(std::move(v), /*from_group=*/false);
  }

  bool HasVariant(const std::string& name) const {
    for (const VariantSpec& v : spec_.variants) {
      if (v.name == name) return true;
    }
    return false;
  }

  std::vector<std::string> VariantNames() const {
    std::vector<std::string> names;
    for (const VariantSpec& v : spec_.variants) names.push_back(v.name);
    return names;
  }

  void UnknownVariant(int line, const std::string& path, const std::string& name) {
    const std::string best = ClosestName(name, VariantNames());
    Problem(line, path,
            absl::StrCat("no variant named \"", name, "\" in this sweep",
                         best.empty()
                             ? absl::StrCat("; variants: ", absl::StrJoin(VariantNames(), ", "))
                             : absl::StrCat(" (did you mean \"", best, "\"?)")));
  }

  // Checks a rule's values and names; `node` is where it is written.
  void CheckRule(const BudgetRule& rule, const YAML::Node& node, int fallback_line,
                 const std::string& path) {
    auto line = [&](const char* key) { return LineOfPath(node, key, fallback_line); };
    if (!(rule.tolerance() >= 0 && rule.tolerance() < 1)) {
      Problem(line("tolerance"), path + ".tolerance",
              absl::StrCat("must be in [0, 1) (a fraction of the matched total), got ",
                           rule.tolerance()));
    }
    if (rule.multiple() < 1) {
      Problem(line("multiple"), path + ".multiple",
              absl::StrCat("must be >= 1, got ", rule.multiple()));
    }
    if (rule.match() == BUDGET_HEADS || rule.match() == BUDGET_EXPERTS) {
      if (rule.target().empty()) {
        Problem(line("match"), path + ".target",
                "is required for match HEADS and EXPERTS (the variant whose total to match)");
      } else if (!HasVariant(rule.target())) {
        UnknownVariant(line("target"), path + ".target", rule.target());
      }
    }
    if (rule.match() == BUDGET_FFN && !HasVariant(rule.reference())) {
      UnknownVariant(line("reference"), path + ".reference", rule.reference());
    }
  }

  void ParseReferenceAndBudget(const YAML::Node& budget) {
    if (spec_.variants.empty()) return;
    const bool explicit_reference = static_cast<bool>(Child(budget, "reference"));
    if (!HasVariant(spec_.budget.reference())) {
      if (explicit_reference) {
        UnknownVariant(YamlLine(Child(budget, "reference")), "budget.reference",
                       spec_.budget.reference());
        return;
      }
      spec_.budget.set_reference(spec_.variants.front().name);
    }
    spec_.reference = spec_.budget.reference();
    if (budget) {
      CheckRule(spec_.budget, budget, spec_.budget_line, "budget");
      for (int i = 0; i < spec_.budget.apply_to_size(); ++i) {
        const std::string& name = spec_.budget.apply_to(i);
        if (!HasVariant(name)) {
          const YAML::Node list = Child(budget, "apply_to");
          UnknownVariant(list && list.IsSequence() && static_cast<size_t>(i) < list.size()
                             ? YamlLine(list[i])
                             : spec_.budget_line,
                         absl::StrCat("budget.apply_to[", i, "]"), name);
        }
      }
    }
    for (VariantSpec& v : spec_.variants) {
      if (!v.budget) continue;
      const YAML::Node budget_node = Child(v.node, "budget");
      if (!Child(budget_node, "reference")) v.budget->set_reference(spec_.reference);
      CheckRule(*v.budget, budget_node, v.line, absl::StrCat("variants[", v.name, "].budget"));
      const std::string anchor =
          v.budget->match() == BUDGET_FFN ? v.budget->reference() : v.budget->target();
      if (v.budget->match() != BUDGET_NONE && anchor == v.name) {
        Problem(v.line, absl::StrCat("variants[", v.name, "].budget"),
                "a variant cannot match its own parameter count");
      }
    }
  }

  // ---- size --------------------------------------------------------------------------------

  // `a` x `b`, or kMaxSpecRuns + 1 when that is larger (no overflow).
  static int64_t TimesCapped(int64_t a, int64_t b) {
    return b != 0 && a > kMaxSpecRuns / b ? kMaxSpecRuns + 1 : a * b;
  }

  void CheckRunCount(const YAML::Node& root) {
    int64_t runs = TimesCapped(spec_.seeds.size(), spec_.variants.size());
    std::vector<std::string> factors = {absl::StrCat(spec_.seeds.size(), " seeds"),
                                        absl::StrCat(spec_.variants.size(), " variants")};
    for (const AxisSpec& axis : spec_.axes) {
      runs = TimesCapped(runs, axis.points.size());
      factors.push_back(absl::StrCat(axis.points.size(), " points (line ", axis.line, ")"));
    }
    if (runs <= kMaxSpecRuns) return;
    const YAML::Node seeds = Child(root, "seeds");
    Problem(seeds ? YamlLine(seeds) : YamlLine(root), "",
            absl::StrCat("the sweep expands to more than ", kMaxSpecRuns, " runs before filters (",
                         absl::StrJoin(factors, " x "), "); split it into several sweeps"));
  }

  // ---- seeds, axes, filters ----------------------------------------------------------------

  bool ParseSeed(const YAML::Node& node, const std::string& path, uint64_t* out) {
    if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), out) ||
        node.Scalar().find('-') != std::string::npos) {
      Problem(YamlLine(node), path,
              absl::StrCat("expected a seed (an integer >= 0), got ", Text(node)));
      return false;
    }
    return true;
  }

  void ParseSeeds(const YAML::Node& seeds) {
    if (!seeds) {
      spec_.seeds = {spec_.base.train().seed()};
      return;
    }
    spec_.seeds_line = YamlLine(seeds);
    if (seeds.IsScalar()) {
      int n;
      if (!absl::SimpleAtoi(seeds.Scalar(), &n) || n < 1 || n > 100000) {
        Problem(
            YamlLine(seeds), "seeds",
            absl::StrCat("expected a list of seeds or a count in [1, 100000], got ", Text(seeds)));
        return;
      }
      for (int i = 0; i < n; ++i) spec_.seeds.push_back(i);
      return;
    }
    if (!seeds.IsSequence() || seeds.size() == 0) {
      Problem(YamlLine(seeds), "seeds", "expected a non-empty list of seeds or a count");
      return;
    }
    std::set<uint64_t> seen;
    for (size_t i = 0; i < seeds.size(); ++i) {
      uint64_t s;
      if (!ParseSeed(seeds[i], absl::StrCat("seeds[", i, "]"), &s)) continue;
      if (!seen.insert(s).second) {
        Problem(YamlLine(seeds[i]), absl::StrCat("seeds[", i, "]"),
                absl::StrCat("duplicate seed ", s));
        continue;
      }
      spec_.seeds.push_back(s);
    }
  }

  // Checks one assignment against a scratch config (key and type errors at the value's line).
  bool CheckAssignment(const AxisAssignment& a) {
    RunConfig scratch = spec_.base;
    const absl::Status s = OverlayYamlAtPath(a.value, file_, a.line, a.path, &scratch);
    Absorb(s);
    return s.ok();
  }

  AxisAssignment Assignment(const YAML::Node& key, const YAML::Node& value) {
    AxisAssignment a;
    a.path = key.IsScalar() ? key.Scalar() : Text(key);
    a.value.reset(value);
    a.text = Text(value);
    a.line = YamlLine(value) ? YamlLine(value) : YamlLine(key);
    return a;
  }

  // A list entry that must be a mapping of one key (an axis mode, a filter kind) to its body.
  struct KeyedEntry {
    std::string key;
    YAML::Node body;
  };

  // `entry`'s one key and its body; nullopt, with the problem `expected` at `path`, when it is
  // not a mapping of exactly one key.
  std::optional<KeyedEntry> OneKeyEntry(const YAML::Node& entry, const std::string& path,
                                        const std::string& expected) {
    if (!entry.IsMap() || entry.size() != 1) {
      Problem(YamlLine(entry), path, expected);
      return std::nullopt;
    }
    return KeyedEntry{entry.begin()->first.Scalar(), entry.begin()->second};
  }

  // fn(entry, path, its key and body) for each entry of `list` (at `name`, each at "NAME[i]") that
  // is a mapping of one key; the problem `expected_list` when `list` is not a list, and
  // `expected_entry` at each entry of another shape.
  template <typename Fn>
  void ForEachKeyedEntry(const YAML::Node& list, const std::string& name,
                         const std::string& expected_list, const std::string& expected_entry,
                         const Fn& fn) {
    if (!list.IsSequence()) {
      Problem(YamlLine(list), name, expected_list);
      return;
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node entry = list[i];
      const std::string path = absl::StrCat(name, "[", i, "]");
      const std::optional<KeyedEntry> keyed = OneKeyEntry(entry, path, expected_entry);
      if (keyed) fn(entry, path, *keyed);
    }
  }

  void ParseAxes(const YAML::Node& axes) {
    auto parse = [&](const YAML::Node& entry, const std::string& path, const KeyedEntry& keyed) {
      const std::string& mode = keyed.key;
      AxisSpec axis;
      axis.line = YamlLine(entry);
      bool ok = false;
      if (mode == "product" || mode == "zip") {
        ok = ParseColumnAxis(entry, mode, keyed.body, path, &axis);
      } else if (mode == "list") {
        ok = ParseListAxis(entry, keyed.body, path, &axis);
      } else {
        const std::string best = ClosestName(mode, {"product", "zip", "list"});
        Problem(YamlLine(entry.begin()->first), path,
                absl::StrCat("unknown axis mode \"", mode, "\"",
                             best.empty() ? "; use product, zip or list"
                                          : absl::StrCat(" (did you mean \"", best, "\"?)")));
      }
      if (ok) spec_.axes.push_back(std::move(axis));
    };
    ForEachKeyedEntry(axes, "axes",
                      "expected a list of {product: ...}, {zip: ...} or {list: [...]} entries",
                      "expected exactly one of product:, zip: or list:", parse);
  }

  // A product: or zip: axis (`mode`) from its mapping of field paths to lists of values.
  bool ParseColumnAxis(const YAML::Node& entry, const std::string& mode, const YAML::Node& body,
                       const std::string& path, AxisSpec* axis) {
    axis->mode = mode == "product" ? AxisSpec::Mode::kProduct : AxisSpec::Mode::kZip;
    if (!body.IsMap() || body.size() == 0) {
      Problem(LineOf(body, entry), path + "." + mode,
              "expected a mapping of field paths to lists of values");
      return false;
    }
    std::vector<std::vector<AxisAssignment>> columns;
    if (!ParseColumns(body, absl::StrCat(path, ".", mode), &columns)) return false;
    return axis->mode == AxisSpec::Mode::kZip ? ZipColumns(columns, path, axis)
                                              : MultiplyColumns(columns, path, axis);
  }

  // One column of assignments per field path of `body`, each value checked; false when any
  // column or value is wrong (every problem reported).
  bool ParseColumns(const YAML::Node& body, const std::string& path,
                    std::vector<std::vector<AxisAssignment>>* columns) {
    bool ok = true;
    for (auto it = body.begin(); it != body.end(); ++it) {
      const std::string key = it->first.Scalar();
      const YAML::Node values = it->second;
      if (!values.IsSequence() || values.size() == 0) {
        Problem(LineOf(values, it->first), absl::StrCat(path, ".", key),
                "expected a non-empty list of values");
        ok = false;
        continue;
      }
      std::vector<AxisAssignment> column;
      for (size_t j = 0; j < values.size(); ++j) {
        column.push_back(Assignment(it->first, values[j]));
        ok = CheckAssignment(column.back()) && ok;
      }
      columns->push_back(std::move(column));
    }
    return ok;
  }

  // The j-th point takes the j-th value of every column, which must all be as long.
  bool ZipColumns(const std::vector<std::vector<AxisAssignment>>& columns, const std::string& path,
                  AxisSpec* axis) {
    bool ok = true;
    for (const auto& column : columns) {
      if (column.size() != columns.front().size()) {
        Problem(column.front().line, absl::StrCat(path, ".zip.", column.front().path),
                absl::StrCat("has ", column.size(), " values but ", columns.front().front().path,
                             " has ", columns.front().size(),
                             "; zipped lists must have equal lengths"));
        ok = false;
      }
    }
    if (!ok) return false;
    for (size_t j = 0; j < columns.front().size(); ++j) {
      AxisPoint point;
      for (const auto& column : columns) point.push_back(column[j]);
      axis->points.push_back(std::move(point));
    }
    return true;
  }

  // Every combination of one value per column, the last column varying fastest.
  bool MultiplyColumns(const std::vector<std::vector<AxisAssignment>>& columns,
                       const std::string& path, AxisSpec* axis) {
    // Refused before it is built: the product grows exponentially with the spec's size.
    int64_t size = 1;
    std::vector<std::string> sizes;
    for (const auto& column : columns) {
      size = TimesCapped(size, column.size());
      sizes.push_back(absl::StrCat(column.size()));
    }
    if (size > kMaxSpecRuns) {
      Problem(axis->line, path + ".product",
              absl::StrCat(absl::StrJoin(sizes, " x "), " is more than ", kMaxSpecRuns,
                           " points (the most runs a sweep may have)"));
      return false;
    }
    axis->points = {AxisPoint{}};
    for (const auto& column : columns) {
      std::vector<AxisPoint> next;
      for (const AxisPoint& point : axis->points) {
        for (const AxisAssignment& a : column) {
          AxisPoint p = point;
          p.push_back(a);
          next.push_back(std::move(p));
        }
      }
      axis->points = std::move(next);
    }
    return true;
  }

  // A list: axis: each entry of `body` one point, a mapping of field paths to values.
  bool ParseListAxis(const YAML::Node& entry, const YAML::Node& body, const std::string& path,
                     AxisSpec* axis) {
    axis->mode = AxisSpec::Mode::kList;
    if (!body.IsSequence() || body.size() == 0) {
      Problem(LineOf(body, entry), path + ".list",
              "expected a non-empty list of mappings (field path: value)");
      return false;
    }
    bool ok = true;
    for (size_t j = 0; j < body.size(); ++j) {
      const YAML::Node point_node = body[j];
      if (!point_node.IsMap() || point_node.size() == 0) {
        Problem(LineOf(point_node, body), absl::StrCat(path, ".list[", j, "]"),
                "expected a mapping of field paths to values");
        ok = false;
        continue;
      }
      AxisPoint point;
      for (auto it = point_node.begin(); it != point_node.end(); ++it) {
        point.push_back(Assignment(it->first, it->second));
        ok = CheckAssignment(point.back()) && ok;
      }
      axis->points.push_back(std::move(point));
    }
    return ok;
  }

  void ParseFilters(const YAML::Node& filters) {
    auto parse = [&](const YAML::Node& entry, const std::string& path, const KeyedEntry& keyed) {
      const std::string& kind = keyed.key;
      const YAML::Node& body = keyed.body;
      FilterSpec filter;
      filter.line = YamlLine(entry);
      if (kind != "exclude" && kind != "only") {
        Problem(YamlLine(entry.begin()->first), path,
                absl::StrCat("unknown filter \"", kind, "\"; use exclude or only"));
        return;
      }
      filter.exclude = kind == "exclude";
      const std::string fpath = absl::StrCat(path, ".", kind);
      if (!body.IsMap() || body.size() == 0) {
        Problem(LineOf(body, entry), fpath,
                "expected a mapping of conditions (variant:, seed: or a field path)");
        return;
      }
      bool ok = true;
      for (auto it = body.begin(); it != body.end(); ++it) {
        FilterSpec::Condition c;
        c.key = it->first.Scalar();
        c.line = YamlLine(it->first);
        const YAML::Node v = it->second;
        const std::string cpath = absl::StrCat(fpath, ".", c.key);
        if (c.key == "variant") {
          std::vector<YAML::Node> names;
          if (v.IsSequence()) {
            for (size_t j = 0; j < v.size(); ++j) names.push_back(v[j]);
          } else {
            names.push_back(v);
          }
          for (const YAML::Node& n : names) {
            const std::string name = Scalar(n, cpath);
            if (!HasVariant(name)) {
              UnknownVariant(LineOf(n, it->first), cpath, name);
              ok = false;
            }
            c.names.push_back(name);
          }
        } else if (c.key == "seed") {
          if (v.IsSequence()) {
            for (size_t j = 0; j < v.size(); ++j) {
              uint64_t s;
              if (ParseSeed(v[j], cpath, &s))
                c.seeds.push_back(s);
              else
                ok = false;
            }
          } else {
            uint64_t s;
            if (ParseSeed(v, cpath, &s))
              c.seeds.push_back(s);
            else
              ok = false;
          }
        } else {
          AxisAssignment a = Assignment(it->first, v);
          if (!CheckAssignment(a)) {
            ok = false;
            continue;
          }
          c.value.reset(v);
        }
        filter.conditions.push_back(std::move(c));
      }
      if (ok) spec_.filters.push_back(std::move(filter));
    };
    ForEachKeyedEntry(filters, "filters", "expected a list of {exclude: ...} or {only: ...}",
                      "expected exactly one of exclude: or only:", parse);
  }

  const std::string file_;
  bool has_program_ = false;  // the spec has a program: block
  SweepSpec spec_;
  SpecProblems problems_{file_};
};

}  // namespace

absl::StatusOr<SweepSpec> ParseSweepSpec(const YAML::Node& root, const std::string& file) {
  return Parser(file).Parse(root);
}

absl::StatusOr<SweepSpec> ParseSweepSpecText(const std::string& text, const std::string& file) {
  absl::StatusOr<YAML::Node> root = ParseYaml(text, file);
  if (!root.ok()) return root.status();
  return ParseSweepSpec(*root, file);
}

absl::StatusOr<SweepSpec> LoadSweepSpecFile(const std::string& path) {
  absl::StatusOr<YAML::Node> root = ParseYamlFile(path);
  if (!root.ok()) return root.status();
  return ParseSweepSpec(*root, path);
}

}  // namespace ablate
