#include "config/proto_yaml.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "config/program_config.h"
#include "nlohmann/json.hpp"
#include "config/model_config.h"

namespace ablate {

namespace pb = google::protobuf;

YAML::Node YamlChild(const YAML::Node& node, const std::string& key) {
  if (!node.IsDefined() || !node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node child = node[key];
  return child.IsDefined() ? child : YAML::Node(YAML::NodeType::Undefined);
}

int YamlLine(const YAML::Node& node) {
  if (!node.IsDefined()) return 0;
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? 0 : mark.line + 1;
}

namespace {

// `text` with control characters written as escapes (\n, \t, \x01), so that a problem quoting a
// key or value from the document (or yaml-cpp quoting the character it choked on) stays on its
// one line. Found with tests/fuzz/spec_fuzz.
std::string OneLine(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string YamlProblem(const std::string& file, int line, const std::string& path,
                        const std::string& what) {
  std::string out = file;
  if (line > 0) absl::StrAppend(&out, ":", line);
  absl::StrAppend(&out, ": ");
  if (!path.empty()) absl::StrAppend(&out, OneLine(path), ": ");
  absl::StrAppend(&out, OneLine(what));
  return out;
}

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        YamlProblem(file, e.mark.is_null() ? 0 : e.mark.line + 1, "", e.msg));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(YamlProblem(file, 0, "", e.what()));
  }
}

namespace {


}  // namespace

absl::StatusOr<YAML::Node> ParseYamlFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  return ParseYaml(*text, path);
}

namespace {

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? name : absl::StrCat(path, ".", name);
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown key "gatee" (did you mean "gate"?)" or, with no close name, the list of known keys.
std::string UnknownKey(const std::string& key, const pb::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  const std::string best = ClosestName(key, names);
  if (!best.empty()) {
    return absl::StrCat("unknown key \"", key, "\" (did you mean \"", best, "\"?)");
  }
  return absl::StrCat("unknown key \"", key, "\"; known keys: ", absl::StrJoin(names, ", "));
}

}  // namespace

std::string ClosestName(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  const std::string lower = absl::AsciiStrToLower(name);
  for (const std::string& k : known) {
    const size_t dist = EditDistance(lower, absl::AsciiStrToLower(k));
    if (dist < best_distance) {
      best_distance = dist;
      best = k;
    }
  }
  if (best.empty() || best_distance > std::max<size_t>(2, name.size() / 3)) return "";
  return best;
}

namespace {

// The prefix shared by all value names of an enum, cut after its last '_' ("GATE_").
std::string EnumPrefix(const pb::EnumDescriptor* e) {
  std::string prefix = e->value(0)->name();
  for (int i = 1; i < e->value_count(); ++i) {
    const std::string& name = e->value(i)->name();
    size_t n = 0;
    while (n < prefix.size() && n < name.size() && prefix[n] == name[n]) ++n;
    prefix.resize(n);
  }
  const size_t underscore = prefix.rfind('_');
  return underscore == std::string::npos ? "" : prefix.substr(0, underscore + 1);
}

std::string NormalizeEnumName(const std::string& s) {
  std::string out = absl::AsciiStrToUpper(s);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

std::string YamlKindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return absl::StrCat("\"", node.Scalar(), "\"");
    default: return "an undefined node";
  }
}

// Walks a document, setting fields and collecting problems.
class Overlayer {
 public:
  explicit Overlayer(const std::string& file) : file_(file) {}

  void Message(const YAML::Node& node, int line, const std::string& path, pb::Message* m) {
    if (!node.IsDefined() || node.IsNull()) return;  // `gate:` with nothing under it changes nothing
    if (!node.IsMap()) {
      Problem(line_or(node, line), path,
              absl::StrCat("expected a mapping of ", m->GetDescriptor()->name(), " fields, got ",
                           YamlKindName(node)));
      return;
    }
    const pb::Descriptor* d = m->GetDescriptor();
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // A copy: `it->first` lives in a proxy that dies at the end of this statement.
      const YAML::Node key = it->first;
      const int key_line = line_or(key, line);
      if (!key.IsScalar()) {
        Problem(key_line, path, "keys must be plain names");
        continue;
      }
      const std::string& name = key.Scalar();
      if (!seen.insert(name).second) {
        Problem(key_line, Join(path, name), "duplicate key");
        continue;
      }
      if (name == "params" && d == RunConfig::descriptor()) {
        Params(it->second, key_line, Join(path, name), static_cast<RunConfig*>(m));
        continue;
      }
      const pb::FieldDescriptor* f = d->FindFieldByName(name);
      if (f == nullptr) f = d->FindFieldByCamelcaseName(name);
      if (f == nullptr) {
        Problem(key_line, path, UnknownKey(name, d));
        continue;
      }
      Field(it->second, key_line, Join(path, f->name()), m, f);
    }
  }

  void Field(const YAML::Node& value, int line, const std::string& path, pb::Message* m,
             const pb::FieldDescriptor* f) {
    const pb::Reflection* r = m->GetReflection();
    if (f->is_map()) {
      MapField(value, line, path, m, f);
    } else if (f->is_repeated()) {
      if (value.IsNull()) {
        r->ClearField(m, f);
        return;
      }
      if (!value.IsSequence()) {
        Problem(line_or(value, line), path, absl::StrCat("expected a list, got ", YamlKindName(value)));
        return;
      }
      r->ClearField(m, f);
      for (size_t i = 0; i < value.size(); ++i) {
        const YAML::Node element = value[i];
        const std::string element_path = absl::StrCat(path, "[", i, "]");
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
          Message(element, line_or(element, line), element_path, r->AddMessage(m, f));
        } else {
          Scalar(element, line_or(element, line), element_path, m, f);
        }
      }
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      Message(value, line, path, r->MutableMessage(m, f));
    } else {
      Scalar(value, line, path, m, f);
    }
  }

  // A RunConfig's `params:` (a program's, docs/program.md): each entry one param, overlaid.
  void Params(const YAML::Node& value, int line, const std::string& path, RunConfig* config) {
    if (!value.IsDefined() || value.IsNull()) return;
    if (!value.IsMap()) {
      Problem(line_or(value, line), path,
              absl::StrCat("expected a mapping of param names to values, got ", YamlKindName(value)));
      return;
    }
    for (auto it = value.begin(); it != value.end(); ++it) {
      const YAML::Node key = it->first;
      const std::string name = key.IsScalar() ? key.Scalar() : "";
      Param(name, it->second, line_or(key, line), Join(path, name), config);
    }
  }

  void Param(const std::string& name, const YAML::Node& value, int line, const std::string& path,
             RunConfig* config) {
    if (absl::Status s = CheckParamName(name); !s.ok()) {
      Problem(line, path, std::string(s.message()));
      return;
    }
    absl::StatusOr<std::string> json = YamlToJson(value);
    if (!json.ok()) {
      Problem(line_or(value, line), path, std::string(json.status().message()));
      return;
    }
    SetProgramParam(name, *std::move(json), config->mutable_program());
  }

  const std::vector<std::string>& problems() const { return problems_; }

 private:
  static int line_or(const YAML::Node& node, int fallback) {
    const int line = YamlLine(node);
    return line > 0 ? line : fallback;
  }

  void Problem(int line, const std::string& path, const std::string& what) {
    problems_.push_back(YamlProblem(file_, line, path, what));
  }

  void MapField(const YAML::Node& value, int line, const std::string& path, pb::Message* m,
                const pb::FieldDescriptor* f) {
    const pb::Reflection* r = m->GetReflection();
    r->ClearField(m, f);
    if (value.IsNull()) return;
    if (!value.IsMap()) {
      Problem(line_or(value, line), path, absl::StrCat("expected a mapping, got ", YamlKindName(value)));
      return;
    }
    const pb::FieldDescriptor* key_field = f->message_type()->map_key();
    const pb::FieldDescriptor* value_field = f->message_type()->map_value();
    for (auto it = value.begin(); it != value.end(); ++it) {
      pb::Message* entry = r->AddMessage(m, f);
      const int key_line = line_or(it->first, line);
      const std::string entry_path = absl::StrCat(path, "[", it->first.Scalar(), "]");
      Scalar(it->first, key_line, entry_path, entry, key_field);
      if (value_field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        Message(it->second, key_line, entry_path, entry->GetReflection()->MutableMessage(entry, value_field));
      } else {
        Scalar(it->second, key_line, entry_path, entry, value_field);
      }
    }
  }

  // Sets (or, for a repeated field, appends) one scalar value.
  void Scalar(const YAML::Node& value, int line, const std::string& path, pb::Message* m,
              const pb::FieldDescriptor* f) {
    const pb::Reflection* r = m->GetReflection();
    const bool add = f->is_repeated();
    if (value.IsNull()) {
      Problem(line, path, "missing value");
      return;
    }
    if (!value.IsScalar()) {
      Problem(line_or(value, line), path,
              absl::StrCat("expected ", ExpectedName(f), ", got ", YamlKindName(value)));
      return;
    }
    line = line_or(value, line);
    const std::string& s = value.Scalar();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: {
        int64_t v;
        if (!Integer(s, line, path, std::numeric_limits<int32_t>::min(),
                     std::numeric_limits<int32_t>::max(), "int32", &v)) {
          return;
        }
        add ? r->AddInt32(m, f, static_cast<int32_t>(v)) : r->SetInt32(m, f, static_cast<int32_t>(v));
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        if (!Integer(s, line, path, std::numeric_limits<int64_t>::min(),
                     std::numeric_limits<int64_t>::max(), "int64", &v)) {
          return;
        }
        add ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_UINT32: {
        int64_t v;
        if (!Integer(s, line, path, 0, std::numeric_limits<uint32_t>::max(), "uint32", &v)) return;
        add ? r->AddUInt32(m, f, static_cast<uint32_t>(v))
            : r->SetUInt32(m, f, static_cast<uint32_t>(v));
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v;
        if (!Unsigned64(s, line, path, &v)) return;
        add ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        double v;
        if (!absl::SimpleAtod(s, &v)) {
          Problem(line, path, absl::StrCat("expected a number, got \"", s, "\""));
          return;
        }
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE) {
          add ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
        } else {
          add ? r->AddFloat(m, f, static_cast<float>(v)) : r->SetFloat(m, f, static_cast<float>(v));
        }
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        const std::string lower = absl::AsciiStrToLower(s);
        bool v;
        if (lower == "true" || lower == "yes" || lower == "on") {
          v = true;
        } else if (lower == "false" || lower == "no" || lower == "off") {
          v = false;
        } else {
          Problem(line, path, absl::StrCat("expected true or false, got \"", s, "\""));
          return;
        }
        add ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_STRING:
        add ? r->AddString(m, f, s) : r->SetString(m, f, s);
        return;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumValueDescriptor* v = EnumValue(s, line, path, f->enum_type());
        if (v == nullptr) return;
        add ? r->AddEnum(m, f, v) : r->SetEnum(m, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        break;  // handled by the callers
    }
  }

  static std::string ExpectedName(const pb::FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
      case pb::FieldDescriptor::CPPTYPE_INT64:
      case pb::FieldDescriptor::CPPTYPE_UINT32:
      case pb::FieldDescriptor::CPPTYPE_UINT64: return "an integer";
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      case pb::FieldDescriptor::CPPTYPE_FLOAT: return "a number";
      case pb::FieldDescriptor::CPPTYPE_BOOL: return "true or false";
      case pb::FieldDescriptor::CPPTYPE_ENUM: return absl::StrCat("one of ", AllowedNames(f->enum_type()));
      default: return "a string";
    }
  }

  static std::string AllowedNames(const pb::EnumDescriptor* e) {
    const std::string prefix = EnumPrefix(e);
    std::vector<std::string> names;
    for (int i = 0; i < e->value_count(); ++i) names.push_back(e->value(i)->name().substr(prefix.size()));
    return absl::StrJoin(names, ", ");
  }

  // Integers: decimal literals, or an integral number in exponent form ("1e5").
  bool Integer(const std::string& s, int line, const std::string& path, int64_t lo, int64_t hi,
               const char* type, int64_t* out) {
    int64_t v;
    if (!absl::SimpleAtoi(s, &v)) {
      double d;
      if (!absl::SimpleAtod(s, &d) || !std::isfinite(d)) {
        Problem(line, path, absl::StrCat("expected an integer, got \"", s, "\""));
        return false;
      }
      if (d != std::floor(d)) {
        Problem(line, path, absl::StrCat("expected an integer, got ", s));
        return false;
      }
      if (d < -9.2e18 || d > 9.2e18) {
        Problem(line, path, absl::StrCat(s, " is out of range for ", type));
        return false;
      }
      v = static_cast<int64_t>(d);
    }
    if (v < lo || v > hi) {
      Problem(line, path, absl::StrCat(s, " is out of range for ", type, " [", lo, ", ", hi, "]"));
      return false;
    }
    *out = v;
    return true;
  }

  bool Unsigned64(const std::string& s, int line, const std::string& path, uint64_t* out) {
    if (absl::StripAsciiWhitespace(s).substr(0, 1) == "-") {
      Problem(line, path, absl::StrCat(s, " is out of range for uint64 (must be >= 0)"));
      return false;
    }
    if (absl::SimpleAtoi(s, out)) return true;
    int64_t v;
    if (!Integer(s, line, path, 0, std::numeric_limits<int64_t>::max(), "uint64", &v)) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }

  const pb::EnumValueDescriptor* EnumValue(const std::string& s, int line, const std::string& path,
                                           const pb::EnumDescriptor* e) {
    const std::string want = NormalizeEnumName(s);
    const std::string prefix = EnumPrefix(e);
    for (int i = 0; i < e->value_count(); ++i) {
      const std::string& name = e->value(i)->name();
      if (name == want || name == prefix + want) return e->value(i);
    }
    // A longer tail of the name ("head_shared" for GATE_HEAD_SHARED), when unambiguous.
    const pb::EnumValueDescriptor* tail_match = nullptr;
    int tail_matches = 0;
    for (int i = 0; i < e->value_count(); ++i) {
      const std::string& name = e->value(i)->name();
      if (name.size() > want.size() + 1 && name.compare(name.size() - want.size(), want.size(), want) == 0 &&
          name[name.size() - want.size() - 1] == '_') {
        tail_match = e->value(i);
        ++tail_matches;
      }
    }
    if (tail_matches == 1) return tail_match;
    Problem(line, path, absl::StrCat("bad value \"", s, "\"; allowed: ", AllowedNames(e)));
    return nullptr;
  }

  const std::string& file_;
  std::vector<std::string> problems_;
};

absl::Status ProblemsStatus(const std::vector<std::string>& problems) {
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

// Makes every singular submessage present, so the JSON printer prints it (it omits absent
// messages even with always_print_primitive_fields).
void TouchSubmessages(pb::Message* m, int depth) {
  if (depth > 32) return;
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || f->is_map()) continue;
    // A built-in run's config has no program: its JSON (and run key) stays as it was.
    if (f->message_type() == ProgramConfig::descriptor() && !r->HasField(*m, f)) continue;
    if (f->is_repeated()) {
      for (int j = 0; j < r->FieldSize(*m, f); ++j) {
        TouchSubmessages(r->MutableRepeatedMessage(m, f, j), depth + 1);
      }
    } else if (f->containing_oneof() == nullptr) {
      TouchSubmessages(r->MutableMessage(m, f), depth + 1);
    }
  }
}

}  // namespace

std::string EnumShortName(const pb::EnumValueDescriptor* value) {
  return value->name().substr(EnumPrefix(value->type()).size());
}

absl::Status OverlayYaml(const YAML::Node& node, const std::string& file, const std::string& path,
                         pb::Message* message) {
  Overlayer overlayer(file);
  overlayer.Message(node, YamlLine(node), path, message);
  return ProblemsStatus(overlayer.problems());
}

absl::Status OverlayYamlAtPath(const YAML::Node& value, const std::string& file, int line,
                               const std::string& dotted_path, pb::Message* message) {
  if (message->GetDescriptor() == RunConfig::descriptor() &&
      absl::StartsWith(dotted_path, kParamsPrefix)) {
    // A program param: its name is everything after "params." (dots allowed).
    Overlayer overlayer(file);
    overlayer.Param(dotted_path.substr(sizeof(kParamsPrefix) - 1), value, line, dotted_path,
                    static_cast<RunConfig*>(message));
    return ProblemsStatus(overlayer.problems());
  }
  const std::vector<std::string> parts = absl::StrSplit(dotted_path, '.');
  pb::Message* m = message;
  std::string path;
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::Descriptor* d = m->GetDescriptor();
    const pb::FieldDescriptor* f = d->FindFieldByName(parts[i]);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          YamlProblem(file, line, dotted_path, UnknownKey(parts[i], d)));
    }
    path = Join(path, f->name());
    if (i + 1 == parts.size()) {
      Overlayer overlayer(file);
      overlayer.Field(value, line, path, m, f);
      return ProblemsStatus(overlayer.problems());
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated()) {
      return absl::InvalidArgumentError(
          YamlProblem(file, line, dotted_path, absl::StrCat(path, " has no fields below it")));
    }
    m = m->GetReflection()->MutableMessage(m, f);
  }
  return absl::InvalidArgumentError(YamlProblem(file, line, dotted_path, "empty field path"));
}

int LineOfPath(const YAML::Node& root, const std::string& dotted_path, int fallback) {
  int line = fallback;
  YAML::Node node;
  node.reset(root);
  for (absl::string_view part : absl::StrSplit(dotted_path, '.')) {
    if (!node.IsDefined() || !node.IsMap()) break;
    bool found = false;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == part) {
        const int key_line = YamlLine(it->first);
        if (key_line > 0) line = key_line;
        node.reset(it->second);  // operator= would assign into the referenced node
        found = true;
        break;
      }
    }
    if (!found) break;
  }
  return line;
}

absl::Status LocateProblems(const absl::Status& status, const YAML::Node& root,
                            const std::string& file, int fallback_line) {
  if (status.ok()) return status;
  std::vector<std::string> out;
  for (absl::string_view problem : absl::StrSplit(status.message(), "; ", absl::SkipEmpty())) {
    const size_t colon = problem.find(": ");
    if (colon == absl::string_view::npos) {
      out.push_back(YamlProblem(file, fallback_line, "", std::string(problem)));
      continue;
    }
    const std::string path(problem.substr(0, colon));
    out.push_back(YamlProblem(file, LineOfPath(root, path, fallback_line), path,
                              std::string(problem.substr(colon + 2))));
  }
  return absl::Status(status.code(), absl::StrJoin(out, "\n"));
}

absl::StatusOr<RunConfig> LoadRunConfigText(const std::string& text, const std::string& file) {
  absl::StatusOr<YAML::Node> root = ParseYaml(text, file);
  if (!root.ok()) return root.status();
  RunConfig config = DefaultRunConfig();
  if (absl::Status s = OverlayYaml(*root, file, "", &config); !s.ok()) return s;
  if (absl::Status s = LocateProblems(ValidateRunConfig(config), *root, file, 1); !s.ok()) {
    return s;
  }
  return config;
}

absl::StatusOr<RunConfig> LoadRunConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  return LoadRunConfigText(*text, path);
}

std::string CanonicalJson(const pb::Message& message) {
  std::unique_ptr<pb::Message> copy(message.New());
  copy->CopyFrom(message);
  TouchSubmessages(copy.get(), 0);
  pb::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  options.always_print_enums_as_ints = false;
  std::string out;
  const pb::util::Status status = pb::util::MessageToJsonString(*copy, &out, options);
  if (!status.ok()) std::abort();  // only messages holding Any without a resolver fail
  return out;
}

namespace {

nlohmann::ordered_json PlainObject(const pb::Message& m);

// Field `f` of `m` (element `index` when repeated, else -1).
nlohmann::ordered_json PlainValue(const pb::Message& m, const pb::FieldDescriptor* f, int index) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
      return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
    }
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const float v = rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
      return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      return PlainObject(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

nlohmann::ordered_json PlainObject(const pb::Message& m) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  const pb::Descriptor* d = m.GetDescriptor();
  const pb::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (int j = 0; j < r->FieldSize(m, f); ++j) items.push_back(PlainValue(m, f, j));
      out[f->name()] = std::move(items);
    } else if (f->has_presence() && !r->HasField(m, f)) {  // a message, an `optional` scalar
      out[f->name()] = nullptr;
    } else {
      out[f->name()] = PlainValue(m, f, -1);
    }
  }
  return out;
}

}  // namespace

std::string PlainJson(const pb::Message& message) {
  return PlainObject(message).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read file (no such file)"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in || in.bad()) return absl::NotFoundError(absl::StrCat(path, ": cannot read file"));
  return buffer.str();
}

}  // namespace ablate
