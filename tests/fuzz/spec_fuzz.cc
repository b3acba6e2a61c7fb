// libFuzzer target: bytes as a sweep spec, through the path `ablate submit` takes in the
// coordinator (CoordinatorCore::Submit) and `ablate expand` takes: YAML parse, spec checks,
// expansion (presets, overrides, axes, filters) and budget matching.
//
// Contract checked on every input (a violation aborts, which libFuzzer records as a crash):
//   - no crash, sanitizer report, uncaught exception, hang or unbounded allocation;
//   - a refusal is InvalidArgument and every line of it names the file ("fuzz.yaml:...");
//   - a parsed spec has at most kMaxSpecRuns runs before filters;
//   - an accepted sweep is sound: runs numbered 0..n-1, each config valid (ValidateRunConfig),
//     its parameter counts positive and activated <= total, its run key the hash of its config.
// Inputs over the coordinator's spec limit (1 MiB) are skipped: Submit refuses them unread.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "orchestrator/sweep/expand.h"
#include "config/model_config.h"
#include "orchestrator/sweep/spec.h"

namespace {

constexpr size_t kMaxSpecBytes = 1 << 20;  // CoordinatorOptions::max_spec_bytes
// Specs that parse to more runs than this (before filters) are not expanded. Expansion is linear
// in the runs (about 0.3 ms each in a release build, 10x that under ASan) up to the parser's
// kMaxSpecRuns, which is what bounds it for real; the fuzzer is after shapes, not sizes.
constexpr int64_t kMaxFuzzRuns = 512;
constexpr char kFile[] = "fuzz.yaml";

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "spec_fuzz: %s\n", what.c_str());
  std::abort();
}

void CheckRefusal(const absl::Status& status, const char* stage) {
  if (!absl::IsInvalidArgument(status)) {
    Fail(std::string(stage) + " refused with a code other than InvalidArgument: " +
         status.ToString());
  }
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    if (!absl::StartsWith(line, kFile)) {
      Fail(std::string(stage) + " problem without the file name: \"" + std::string(line) +
           "\" in:\n" + std::string(status.message()));
    }
  }
}

void CheckSweep(const ablate::ExpandedSweep& sweep) {
  for (int i = 0; i < sweep.runs_size(); ++i) {
    const ablate::RunSpec& run = sweep.runs(i);
    const std::string where = "run " + std::to_string(i) + " (" + run.variant() + ")";
    if (run.index() != i) Fail(where + ": index " + std::to_string(run.index()));
    if (const absl::Status s = ablate::ValidateRunConfig(run.config()); !s.ok()) {
      Fail(where + ": expanded config is invalid: " + s.ToString());
    }
    if (run.params().total() <= 0 || run.params().activated() <= 0 ||
        run.params().activated() > run.params().total()) {
      Fail(where + ": parameter counts total " + std::to_string(run.params().total()) +
           ", activated " + std::to_string(run.params().activated()));
    }
    if (run.run_key() != ablate::RunKey(run.config(), sweep.code_version())) {
      Fail(where + ": run key is not the hash of its config");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxSpecBytes) return -1;  // not added to the corpus
  // ABLATE_FUZZ_VERBOSE=1 prints what became of each input (when replaying one by hand).
  static const bool verbose = std::getenv("ABLATE_FUZZ_VERBOSE") != nullptr;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ablate::SweepSpec> spec = ablate::ParseSweepSpecText(text, kFile);
  if (!spec.ok()) {
    if (verbose) std::fprintf(stderr, "parse: %s\n", spec.status().ToString().c_str());
    CheckRefusal(spec.status(), "parse");
    return 0;
  }
  double runs = static_cast<double>(spec->seeds.size()) * spec->variants.size();
  for (const ablate::AxisSpec& axis : spec->axes) runs *= axis.points.size();
  if (runs > ablate::kMaxSpecRuns) Fail("the parser let " + std::to_string(runs) + " runs through");
  if (runs > kMaxFuzzRuns) return 0;
  ablate::ExpandOptions options;
  options.code_version = "fuzz";  // the same run keys whatever the commit
  absl::StatusOr<ablate::ExpandedSweep> sweep = ablate::ExpandSweep(*spec, options);
  if (!sweep.ok()) {
    if (verbose) std::fprintf(stderr, "expand: %s\n", sweep.status().ToString().c_str());
    CheckRefusal(sweep.status(), "expand");
    return 0;
  }
  if (verbose) std::fprintf(stderr, "expanded: %d runs\n", sweep->runs_size());
  CheckSweep(*sweep);
  return 0;
}
