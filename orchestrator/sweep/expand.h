// Sweep expansion: a parsed spec becomes the list of runs it launches (the variant matrix).
//
// For each seed, each axis point (the product of the axes' points) and each variant, in that
// order (the run order: every variant gets its first seed before any gets its second):
//   config = base -> axis values -> the variant's preset -> its model/train overrides
//            -> budget matching -> train.seed = seed
// Variant overrides therefore win over axis values. Budget anchors (the reference of an FFN
// rule, the target of a heads/experts rule) are taken at the same axis point *before* their own
// matching, so "added parameters of G1" means the gate's parameters even when G1 is itself
// narrowed. Each run gets its canonical config, exact parameter counts, FLOPs per token, the
// diff against the reference variant and a run key = SHA-256(code version, canonical JSON).
// Filters then drop runs; the kept runs are numbered in order.
//
// Errors (a preset that does not fit the base, an invalid config, an impossible budget) are
// InvalidArgument, one "FILE:LINE: variants[NAME].field: what" per line, at the line of the
// variant entry (or the line that sets the offending field). Pure function; thread-safe.
// Costs a canonical JSON encoding per run, most of its time (docs/benchmarks.md has the figure).
#ifndef ABLATE_ORCHESTRATOR_SWEEP_EXPAND_H_
#define ABLATE_ORCHESTRATOR_SWEEP_EXPAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "orchestrator/sweep/program_budget.h"
#include "orchestrator/sweep/spec.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct ExpandOptions {
  // "" = CodeVersion() of this build, with its BuildVersion() and UncommittedSources() in the
  // ExpandedSweep's build and uncommitted; otherwise those stay empty.
  std::string code_version;
  // The most runs the sweep may have after filters, counted before any is built (a config, a
  // run key and the sweep's strings each): InvalidArgument "FILE:LINE: the sweep has N runs
  // after filters; the limit is M ...". 0: only the parser's kMaxSpecRuns before filters.
  int64_t max_runs = kDefaultMaxRuns;
  // The memory of one device, in bytes (`--device-memory 80GB`); 0: none. A run whose memory
  // plan (RunSpec.memory, config/memory_plan.h) exceeds it, or exceeds the spec's
  // resources.memory_gb, is refused: InvalidArgument "FILE:LINE: variant V ...: needs X per
  // device ...", with the settings that would make it fit.
  int64_t device_memory_bytes = 0;
  // A `program:` spec's code hash (SnapshotHash of the files its code: globs matched, read by
  // the CLI): every run's ProgramConfig.code_hash and part of its run key. Required for one.
  std::string program_code_hash;
  // A `program:` spec with `count:`: what counts its configs' parameters (the CLI's runs the
  // command, the coordinator's answers from what the CLI sent; program_budget.h). Without it,
  // program runs have no counts and a budget on a param is refused.
  ProgramCounter program_count;
};

// `config_json` (optional) receives each run's CanonicalJson(config), in run order: what the store
// keeps (SweepRecord::config_json), so it is printed once (its run key hashes RunKeyView's).
absl::StatusOr<ExpandedSweep> ExpandSweep(const SweepSpec& spec, const ExpandOptions& options = {},
                                          std::vector<std::string>* config_json = nullptr);

// The runs of one group of a tuned spec at one more value of its tuned axis (a stability probe),
// every seed, as ExpandSweep makes them (budget matching, run keys with options.code_version):
// their indexes are 0.. and are the store's to renumber. `config_json` as ExpandSweep's.
// InvalidArgument when the spec has no tune or no such group.
absl::StatusOr<std::vector<RunSpec>> ExpandTuneProbe(const SweepSpec& spec,
                                                     const std::string& group, double value,
                                                     const ExpandOptions& options,
                                                     std::vector<std::string>* config_json);

// A `program:` spec's code (config/program_snapshot.h): program.dir resolved against the
// directory of the spec file (spec.file), its code: globs read. What `ablate submit` sends and
// ExpandSweepFile hashes. InvalidArgument "FILE: program.code: ..." when a glob matches nothing.
absl::StatusOr<ProgramSnapshot> ReadSpecProgram(const SweepSpec& spec);

// How long a program's count: command may take for one call.
inline constexpr absl::Duration kProgramCountTimeout = absl::Seconds(120);

// A `program:` spec's count: command as a counter (CommandCounter in program.dir), recording its
// answers in `record` when not null (what `ablate submit` sends).
ProgramCounter SpecProgramCounter(const SweepSpec& spec,
                                  std::shared_ptr<std::map<std::string, ParamCount>> record);

// LoadSweepSpecFile + ExpandSweep (a program's code read by ReadSpecProgram, its counts by
// SpecProgramCounter).
absl::StatusOr<ExpandedSweep> ExpandSweepFile(const std::string& path,
                                              const ExpandOptions& options = {});

// The run key of a complete config: the first 16 hex digits of
// SHA-256(code_version + "\n" + CanonicalJson(RunKeyView(config))): data by its fingerprint, not
// its path (config/data_source.h).
std::string RunKey(const RunConfig& config, const std::string& code_version);
// The same from the config's CanonicalJson, as ExpandSweep prints it.
std::string RunKeyOfJson(const std::string& config_json, const std::string& code_version);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_EXPAND_H_
