// YAML (and JSON, which parses as YAML) onto protobuf messages, by reflection; canonical JSON.
//
// Configs are proto3 messages without field presence, so a file never *replaces* a config: it
// overlays the fields it names onto defaults (DefaultRunConfig() and friends). Names are the
// proto field names (snake_case; the JSON camelCase names are accepted too); enums are given by
// name, case-insensitively, with or without their common prefix (`position: G1` or `GATE_G1`,
// `activation: ns-sigmoid`); nested messages are mappings; repeated fields are sequences and
// replace the whole list.
//
// Every error is absl::InvalidArgument with one problem per line, each
//   FILE:LINE: field.path: what is wrong
// (unknown key with the closest known name, wrong type, bad enum value with the allowed names,
// integer out of range, duplicate key). Pure functions; thread-safe.
#ifndef ABLATE_CONFIG_PROTO_YAML_H_
#define ABLATE_CONFIG_PROTO_YAML_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "proto/ablate.pb.h"
#include "yaml-cpp/yaml.h"

namespace ablate {

// The name in `known` closest to `name` (edit distance at most max(2, |name| / 3)), or "".
std::string ClosestName(const std::string& name, const std::vector<std::string>& known);

// An enum value's name without the prefix its enum's values share ("G1" for GATE_G1).
std::string EnumShortName(const google::protobuf::EnumValueDescriptor* value);

// node[key] when `node` is a mapping holding `key`, else an undefined node (operator bool
// false). yaml-cpp throws on a scalar's operator[] and on most calls on a missing key's node.
YAML::Node YamlChild(const YAML::Node& node, const std::string& key);

// 1-based line of a node, or 0 when the node carries no position (a null value, a node built
// in code).
int YamlLine(const YAML::Node& node);

// "FILE:LINE: path: what" (LINE and path omitted when 0 / empty), one line: control characters
// in path and what are escaped ("\n", "\x01").
std::string YamlProblem(const std::string& file, int line, const std::string& path,
                        const std::string& what);

// Parses YAML or JSON text. A syntax error is InvalidArgument "FILE:LINE: what".
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& file);
// Reads and parses a file; NotFound naming the path when it cannot be read.
absl::StatusOr<YAML::Node> ParseYamlFile(const std::string& path);

// A file's bytes. NotFound naming the path when it is not a regular file or cannot be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Overlays `node` (a mapping, or null for "nothing") onto *message. `path` is the dotted field
// path of *message inside the document ("" at the top), used in error text; `file` names the
// document. Every problem is reported, not only the first. On error *message may be partly
// overlaid: callers discard it.
absl::Status OverlayYaml(const YAML::Node& node, const std::string& file, const std::string& path,
                         google::protobuf::Message* message);

// Overlays `value` onto the field named by a dotted path below *message ("train.optimizer.lr"):
// every component but the last must be a singular message field. `line` is where the path was
// written (the key's line), for errors about the path itself.
absl::Status OverlayYamlAtPath(const YAML::Node& value, const std::string& file, int line,
                               const std::string& dotted_path, google::protobuf::Message* message);

// The 1-based line of the deepest node of `root` on the dotted path ("model.gate.position"), or
// `fallback` when not even the first component is in the document. For mapping validation errors
// of a config back to the line that produced them.
int LineOfPath(const YAML::Node& root, const std::string& dotted_path, int fallback);

// Rewrites a validation status whose message is "path: what; path: what" (ValidateRunConfig's
// format) into one "FILE:LINE: path: what" line per problem, each at the line of the deepest
// node of `root` on that path (`fallback_line` when the path is not written there). `root` is
// the node the paths are relative to. OK stays OK.
absl::Status LocateProblems(const absl::Status& status, const YAML::Node& root,
                            const std::string& file, int fallback_line);

// Reads a run config file: top-level `model:` and `train:` overlaid on DefaultRunConfig(), then
// ValidateRunConfig (its problems located at their lines). An unreadable file is NotFound naming
// the path; every other problem is InvalidArgument in the format above.
absl::StatusOr<RunConfig> LoadRunConfigFile(const std::string& path);
// The same from text; `file` is the name used in errors.
absl::StatusOr<RunConfig> LoadRunConfigText(const std::string& text, const std::string& file);

// The canonical JSON of a message: every field printed (defaults included), proto field names,
// fields in declaration order, enums by name, no whitespace. Equal messages give equal strings,
// so it is what the store keeps and what run hashes are computed over. Only fails (aborts) for
// messages holding google.protobuf.Any, which ablate's schema does not use.
std::string CanonicalJson(const google::protobuf::Message& message);

// JSON for people, pandas and jq (a standalone run's metrics.jsonl and summary.json): every field
// in declaration order, proto field names, 64-bit integers as numbers (proto3 JSON, and so
// CanonicalJson, writes them as strings), enums by name, a field with presence that is not set
// (a run that never evaluated has no final_eval, a model without a gate no gate_score_mean) and a
// NaN or infinity as null. No whitespace.
std::string PlainJson(const google::protobuf::Message& message);

}  // namespace ablate

#endif  // ABLATE_CONFIG_PROTO_YAML_H_
