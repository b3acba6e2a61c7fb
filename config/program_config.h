// Program runs' settings (docs/program.md), pure code shared by the spec, the coordinator and the
// worker: params as JSON values, how they reach a program's argv (dashdash, hydra), the command
// line with its placeholders, the run key of a program run, and the checks a ProgramConfig must
// pass. No gRPC, no LibTorch; thread-safe.
//
// A program's params are free-form (numbers, strings, booleans, lists, mappings). In a spec they
// are `params:` of the base or a variant and `params.NAME` on an axis, a filter, `tune:` or a
// budget; in a RunConfig they are ProgramConfig.params, each value kept as JSON text so that its
// type survives: `0.0` stays a float (nanoGPT's configurator asserts the type of each default).
#ifndef ABLATE_CONFIG_PROGRAM_CONFIG_H_
#define ABLATE_CONFIG_PROGRAM_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"
#include "yaml-cpp/yaml.h"

namespace ablate {

// The field path prefix of a program param in a spec ("params.n_head").
inline constexpr char kParamsPrefix[] = "params.";
// The longest param name, and the most bytes of one param's JSON value.
inline constexpr size_t kMaxParamNameBytes = 128;
inline constexpr size_t kMaxParamJsonBytes = 64 << 10;
// An evaluation's metrics by name (EvalResult.metrics): the most of them, the longest name.
inline constexpr int kMaxEvalMetrics = 64;
inline constexpr size_t kMaxEvalMetricName = 128;
// The most per-item scores one metric of an evaluation may carry (EvalResult.items).
inline constexpr int kMaxEvalItems = 65536;
// ProgramConfig.grace_s and max_log_bytes when the spec leaves them out.
inline constexpr double kDefaultGraceSeconds = 60;
inline constexpr int64_t kDefaultMaxLogBytes = int64_t{64} << 20;

// A YAML value as JSON text: a quoted scalar is a string; a plain one is a boolean (true/false in
// any case), null (null, ~), an integer, a float (kept a float: "0.0", "3e-3" -> 0.003), else a
// string; sequences and mappings recursively. InvalidArgument "what" for a non-finite number.
absl::StatusOr<std::string> YamlToJson(const YAML::Node& value);

// Sets param `name` of `config` (kept sorted by name) to `json`, replacing any value it had.
void SetProgramParam(const std::string& name, std::string json, ProgramConfig* config);
// The JSON of param `name`, nullopt when it has none.
std::optional<std::string> ProgramParamJson(const ProgramConfig& config, const std::string& name);
// Checks a param name: letters, digits, '_', '-' and '.', at most kMaxParamNameBytes.
absl::Status CheckParamName(const std::string& name);
// The number a param holds (an integer or a float); nullopt for any other value or none.
std::optional<double> ProgramParamNumber(const ProgramConfig& config, const std::string& name);

// One argv item per param, in name order: `--name=value` (dashdash, value as a Python literal:
// True/False/None, a float always with a '.' or an exponent, strings as written, lists and
// mappings as Python literals) or `name=value` (hydra: true/false/null, strings as written).
// Empty for PROGRAM_ARGS_NONE.
std::vector<std::string> RenderParamArgs(const ProgramConfig& config);

// What the placeholders of `command` stand for in one attempt.
struct CommandContext {
  std::string checkpoint_dir;
  uint64_t seed = 0;
  int64_t steps = 0;
  int64_t run_id = 0;
  bool resume = false;  // append resume_args
};

// The attempt's argv: `command` split into words as a POSIX shell would (single and double
// quotes, backslashes; no expansion, no pipes), each of {checkpoint_dir}, {seed}, {steps} and
// {run_id} substituted inside words, the word `{args}` replaced by RenderParamArgs (appended at
// the end when command has no `{args}`), then resume_args' words when ctx.resume.
// InvalidArgument for an unterminated quote, an unknown {placeholder} or an empty command.
absl::StatusOr<std::vector<std::string>> ProgramArgv(const ProgramConfig& config,
                                                     const CommandContext& ctx);
// `text` split into words as ProgramArgv splits the command (no placeholders substituted).
absl::StatusOr<std::vector<std::string>> SplitCommandWords(const std::string& text);

// `name` as execvp would find it: a path with a '/' relative to `dir` (the program's), else the
// first executable file of that name on PATH. "" when there is none. The worker's command and
// the CLI's count: command alike.
std::string FindProgramExecutable(const std::string& name, const std::string& dir);

// The params as one JSON object (ABLATE_CONFIG's file): {"n_head": 8, ...}.
std::string ProgramParamsJson(const ProgramConfig& config);

// What a program run's key hashes in place of ablate's code version and canonical config: the
// code hash, the command, how params are rendered, the params, the seed and the world size.
// Stable across ablate builds: an edit of the program's code changes it, a rebuild of ablate
// does not.
std::string ProgramRunKeyText(const ProgramConfig& config, uint64_t seed, int world_size);
// RunSpec.code_version of a program run: "program+" and the first 16 digits of its code hash.
// Any worker may train it (it needs no build of ablate's in particular).
std::string ProgramCodeVersion(const ProgramConfig& config);
bool IsProgramCodeVersion(const std::string& code_version);

// Whether the program declares `capability` ("pause", "rollback").
bool HasCapability(const ProgramConfig& config, const std::string& capability);

// The checks of a complete program config: a command, a steps param naming a positive integer,
// a seed param that exists when named, patterns for report: regex (each a valid RE2 with the
// groups its kind needs), known capabilities, grace_s and max_log_bytes in range. Problems as
// "program.field: what" joined by "; " (as ValidateRunConfig's).
absl::Status ValidateProgramConfig(const ProgramConfig& config);

}  // namespace ablate

#endif  // ABLATE_CONFIG_PROGRAM_CONFIG_H_
