#include "config/program_config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace ablate {

namespace {

using Json = nlohmann::ordered_json;

// The shortest decimal text that reads back as `v`, always with a '.' or an exponent.
std::string FloatText(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    double back = 0;
    if (absl::SimpleAtod(buf, &back) && back == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

bool IsIntegerText(const std::string& s) {
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i >= s.size()) return false;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

absl::StatusOr<Json> ScalarJson(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return Json(s);  // quoted: a string as written
  const std::string lower = absl::AsciiStrToLower(s);
  if (lower == "true") return Json(true);
  if (lower == "false") return Json(false);
  if (lower == "null" || s == "~" || s.empty()) return Json(nullptr);
  if (IsIntegerText(s)) {
    int64_t i;
    if (absl::SimpleAtoi(s, &i)) return Json(i);
  }
  // A number YAML would read as a float: digits with a '.', an exponent, or both.
  const bool numeric = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) ||
                                      s[0] == '.' || s[0] == '-' || s[0] == '+');
  double d;
  if (numeric && s.find_first_of(".eE") != std::string::npos && absl::SimpleAtod(s, &d)) {
    if (!std::isfinite(d)) return absl::InvalidArgumentError(absl::StrCat(s, " is not finite"));
    return Json(d);
  }
  return Json(s);
}

absl::StatusOr<Json> NodeJson(const YAML::Node& node, int depth) {
  if (depth > 32) return absl::InvalidArgumentError("nested more than 32 levels deep");
  if (!node.IsDefined() || node.IsNull()) return Json(nullptr);
  if (node.IsScalar()) return ScalarJson(node);
  if (node.IsSequence()) {
    Json out = Json::array();
    for (size_t i = 0; i < node.size(); ++i) {
      absl::StatusOr<Json> item = NodeJson(node[i], depth + 1);
      if (!item.ok()) return item.status();
      out.push_back(*std::move(item));
    }
    return out;
  }
  Json out = Json::object();
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) return absl::InvalidArgumentError("mapping keys must be names");
    absl::StatusOr<Json> item = NodeJson(it->second, depth + 1);
    if (!item.ok()) return item.status();
    out[it->first.Scalar()] = *std::move(item);
  }
  return out;
}

// A JSON number as text: an integer as is, a float by FloatText.
std::string NumberText(const Json& j) {
  if (j.is_number_float()) return FloatText(j.get<double>());
  return j.dump();
}

// `j` as a Python literal (dashdash) or a YAML/Hydra literal.
std::string Literal(const Json& j, bool python, bool top) {
  switch (j.type()) {
    case Json::value_t::null:
      return python ? "None" : "null";
    case Json::value_t::boolean:
      return j.get<bool>() ? (python ? "True" : "true") : (python ? "False" : "false");
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return NumberText(j);
    case Json::value_t::string: {
      const std::string s = j.get<std::string>();
      if (top) return s;      // passed as written: the configurator falls back to the string
      return Json(s).dump();  // inside a list: quoted (a Python and YAML string literal alike)
    }
    case Json::value_t::array: {
      std::vector<std::string> items;
      for (const Json& item : j) items.push_back(Literal(item, python, false));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    case Json::value_t::object: {
      std::vector<std::string> items;
      for (auto it = j.begin(); it != j.end(); ++it) {
        items.push_back(
            absl::StrCat(Json(it.key()).dump(), ": ", Literal(it.value(), python, false)));
      }
      return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
    }
    default:
      return j.dump();
  }
}

// The first "{name}" (lower-case letters and '_') left in `word`, or "".
std::string UnknownPlaceholder(const std::string& word) {
  for (size_t open = word.find('{'); open != std::string::npos; open = word.find('{', open + 1)) {
    size_t end = open + 1;
    while (end < word.size() &&
           (std::islower(static_cast<unsigned char>(word[end])) || word[end] == '_'))
      ++end;
    if (end > open + 1 && end < word.size() && word[end] == '}')
      return word.substr(open, end - open + 1);
  }
  return "";
}

Json ParsedParam(const std::string& json) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? Json(json) : j;
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(const YAML::Node& value) {
  absl::StatusOr<Json> j = NodeJson(value, 0);
  if (!j.ok()) return j.status();
  // Floats keep their float-ness in the text: 0.0, not 0.
  if (j->is_number_float()) return FloatText(j->get<double>());
  std::string text = j->dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxParamJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("is ", text.size(), " bytes as JSON; at most ", kMaxParamJsonBytes));
  }
  return text;
}

void SetProgramParam(const std::string& name, std::string json, ProgramConfig* config) {
  auto* params = config->mutable_params();
  auto it =
      std::lower_bound(params->begin(), params->end(), name,
                       [](const ProgramParam& p, const std::string& n) { return p.name() < n; });
  if (it != params->end() && it->name() == name) {
    it->set_json(std::move(json));
    return;
  }
  const int at = static_cast<int>(it - params->begin());
  ProgramParam* added = params->Add();
  added->set_name(name);
  added->set_json(std::move(json));
  for (int i = params->size() - 1; i > at; --i) params->SwapElements(i, i - 1);
}

std::optional<std::string> ProgramParamJson(const ProgramConfig& config, const std::string& name) {
  for (const ProgramParam& p : config.params()) {
    if (p.name() == name) return p.json();
  }
  return std::nullopt;
}

absl::Status CheckParamName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("a param needs a name");
  if (name.size() > kMaxParamNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("param name is ", name.size(), " bytes; at most ", kMaxParamNameBytes));
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(
          absl::StrCat("param name \"", name, "\": use letters, digits, '_', '-' and '.' only"));
    }
  }
  return absl::OkStatus();
}

std::optional<double> ProgramParamNumber(const ProgramConfig& config, const std::string& name) {
  const std::optional<std::string> json = ProgramParamJson(config, name);
  if (!json) return std::nullopt;
  const Json j = ParsedParam(*json);
  if (!j.is_number()) return std::nullopt;
  return j.get<double>();
}

std::vector<std::string> RenderParamArgs(const ProgramConfig& config) {
  std::vector<std::string> out;
  if (config.args() == PROGRAM_ARGS_NONE) return out;
  const bool python = config.args() == PROGRAM_ARGS_DASHDASH;
  for (const ProgramParam& p : config.params()) {
    const std::string value = Literal(ParsedParam(p.json()), python, true);
    out.push_back(python ? absl::StrCat("--", p.name(), "=", value)
                         : absl::StrCat(p.name(), "=", value));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> SplitCommandWords(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        word += c;
      continue;
    }
    if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' && i + 1 < text.size() &&
                 std::string("\"\\$`").find(text[i + 1]) != std::string::npos) {
        word += text[++i];
      } else {
        word += c;
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
    } else {
      word += c;
    }
  }
  if (quote != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unterminated ", std::string(1, quote), " quote in: ", text));
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

absl::StatusOr<std::vector<std::string>> ProgramArgv(const ProgramConfig& config,
                                                     const CommandContext& ctx) {
  absl::StatusOr<std::vector<std::string>> words = SplitCommandWords(config.command());
  if (!words.ok()) return words.status();
  if (words->empty()) return absl::InvalidArgumentError("program.command is empty");
  const std::vector<std::pair<std::string, std::string>> values = {
      {"{checkpoint_dir}", ctx.checkpoint_dir},
      {"{seed}", absl::StrCat(ctx.seed)},
      {"{steps}", absl::StrCat(ctx.steps)},
      {"{run_id}", absl::StrCat(ctx.run_id)}};
  std::vector<std::string> argv;
  bool args_placed = false;
  for (std::string& word : *words) {
    if (word == "{args}") {
      for (std::string& a : RenderParamArgs(config)) argv.push_back(std::move(a));
      args_placed = true;
      continue;
    }
    std::string out = absl::StrReplaceAll(word, values);
    if (std::string name = UnknownPlaceholder(out); !name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("program.command: unknown placeholder ", name,
                       " (known: {checkpoint_dir}, {seed}, {steps}, {run_id}, {args})"));
    }
    argv.push_back(std::move(out));
  }
  if (!args_placed) {
    for (std::string& a : RenderParamArgs(config)) argv.push_back(std::move(a));
  }
  if (ctx.resume && !config.resume_args().empty()) {
    absl::StatusOr<std::vector<std::string>> extra = SplitCommandWords(config.resume_args());
    if (!extra.ok()) return extra.status();
    for (std::string& a : *extra) argv.push_back(std::move(a));
  }
  return argv;
}

std::string FindProgramExecutable(const std::string& name, const std::string& dir) {
  namespace fs = std::filesystem;
  if (name.find('/') != std::string::npos) {
    const fs::path p = fs::path(name).is_absolute() ? fs::path(name) : fs::path(dir) / name;
    return access(p.c_str(), X_OK) == 0 ? p.string() : "";
  }
  const char* path = getenv("PATH");
  for (absl::string_view d : absl::StrSplit(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    const fs::path p = fs::path(std::string(d.empty() ? "." : d)) / name;
    std::error_code ec;
    if (access(p.c_str(), X_OK) == 0 && !fs::is_directory(p, ec)) return p.string();
  }
  return "";
}

std::string ProgramParamsJson(const ProgramConfig& config) {
  Json out = Json::object();
  for (const ProgramParam& p : config.params()) out[p.name()] = ParsedParam(p.json());
  // Floats as FloatText so that 0.0 stays 0.0 for a reader that checks types.
  std::vector<std::string> items;
  for (const ProgramParam& p : config.params()) {
    const Json j = ParsedParam(p.json());
    items.push_back(absl::StrCat(Json(p.name()).dump(), ":",
                                 j.is_number_float()
                                     ? FloatText(j.get<double>())
                                     : j.dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  return absl::StrCat("{", absl::StrJoin(items, ","), "}");
}

std::string ProgramRunKeyText(const ProgramConfig& config, uint64_t seed, int world_size) {
  std::string text =
      absl::StrCat("program\ncode ", config.code_hash(), "\ncommand ", config.command(), "\nargs ",
                   ProgramArgs_Name(config.args()), "\nsteps ", config.steps(), "\nseed_param ",
                   config.seed(), "\nseed ", seed, "\nworld ", std::max(1, world_size), "\n");
  for (const ProgramParam& p : config.params())
    absl::StrAppend(&text, "param ", p.name(), "=", p.json(), "\n");
  return text;
}

std::string ProgramCodeVersion(const ProgramConfig& config) {
  return absl::StrCat("program+", config.code_hash().substr(0, 16));
}

bool IsProgramCodeVersion(const std::string& code_version) {
  return code_version.rfind("program+", 0) == 0;
}

bool HasCapability(const ProgramConfig& config, const std::string& capability) {
  return std::find(config.capabilities().begin(), config.capabilities().end(), capability) !=
         config.capabilities().end();
}

absl::Status ValidateProgramConfig(const ProgramConfig& config) {
  std::vector<std::string> problems;
  auto problem = [&](const std::string& path, const std::string& what) {
    problems.push_back(absl::StrCat("program.", path, ": ", what));
  };
  if (absl::StripAsciiWhitespace(config.command()).empty()) {
    problem("command", "missing: the command that trains (e.g. python3 train.py {args})");
  } else if (absl::StatusOr<std::vector<std::string>> argv = ProgramArgv(config, {}); !argv.ok()) {
    problem("command",
            std::string(absl::StripPrefix(argv.status().message(), "program.command: ")));
  }
  if (!config.resume_args().empty()) {
    if (absl::Status s = SplitCommandWords(config.resume_args()).status(); !s.ok()) {
      problem("resume_args", std::string(s.message()));
    }
  }
  if (config.steps().empty()) {
    problem("steps", "missing: the param that is the run's length in steps (e.g. max_iters)");
  } else {
    const std::optional<std::string> json = ProgramParamJson(config, config.steps());
    const Json j = json ? ParsedParam(*json) : Json();
    if (!json) {
      problem("steps", absl::StrCat("names param ", config.steps(), ", which no params: sets"));
    } else if (!j.is_number_integer() || j.get<int64_t>() < 1 ||
               j.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      problem("steps", absl::StrCat("param ", config.steps(), " is ", *json,
                                    ": the run's length must be a positive integer"));
    }
  }
  static const std::set<std::string> kCapabilities = {"pause", "rollback"};
  for (const std::string& c : config.capabilities()) {
    if (!kCapabilities.count(c)) {
      problem("capabilities",
              absl::StrCat("unknown capability \"", c, "\"; known: pause, rollback"));
    }
  }
  if (!(config.grace_s() >= 0 && config.grace_s() <= 3600)) {
    problem("grace_s", absl::StrCat("must be in [0, 3600] seconds, got ", config.grace_s()));
  }
  if (config.max_log_bytes() < 0) problem("max_log_bytes", "must not be negative");
  if (config.report() == PROGRAM_REPORT_REGEX && config.patterns().empty()) {
    problem("patterns", "report: regex needs patterns: {step: REGEX, eval: REGEX}");
  }
  if (config.report() != PROGRAM_REPORT_REGEX && !config.patterns().empty()) {
    problem("patterns", "only report: regex reads patterns");
  }
  for (const ProgramPattern& p : config.patterns()) {
    const std::string path = absl::StrCat("patterns.", p.kind());
    if (p.kind() != "step" && p.kind() != "eval") {
      problem(path, "unknown kind; patterns are step: and eval:");
      continue;
    }
    RE2 re(p.regex(), RE2::Quiet);
    if (!re.ok()) {
      problem(path, absl::StrCat("not a valid regular expression: ", re.error()));
      continue;
    }
    const auto& groups = re.NamedCapturingGroups();
    const std::string needed = p.kind() == "step" ? "loss" : "val_loss";
    for (const std::string& g : {std::string("step"), needed}) {
      if (!groups.count(g)) {
        problem(path, absl::StrCat("needs a named group (?P<", g, ">...)"));
      }
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

}  // namespace ablate
