// Shared by the libFuzzer targets of tests/fuzz/: how a target reports a finding, and the store
// the store-backed targets (query_fuzz, report_fuzz) set up once in LLVMFuzzerInitialize.
//
// A finding is a line "TARGET: what" on stderr and an abort, which libFuzzer (and replay_main.cc)
// records as a crash with the input that caused it. The setup helpers report their own failures
// the same way, as "setup: ..." findings: a target that cannot build its fixture has nothing to
// fuzz. Header-only, so that each target stays one source file (tests/fuzz/CMakeLists.txt); the
// store helpers need ablate_store and ablate_sweep, which those targets link.
#ifndef ABLATE_TESTS_FUZZ_FUZZ_UTIL_H_
#define ABLATE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/spec.h"
#include "orchestrator/store/store.h"

namespace ablate::fuzz {

// Reports a finding of `target` and aborts.
[[noreturn]] inline void Fail(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", target, what.c_str());
  std::abort();
}

// A finding "setup: `what`: STATUS" unless `status` is OK.
inline void CheckSetup(const char* target, const absl::Status& status, const std::string& what) {
  if (!status.ok()) Fail(target, absl::StrCat("setup: ", what, ": ", status.ToString()));
}

// A store in a directory of its own, as a coordinator keeps one open. Targets derive their
// fixture from it; RemoveTempStore closes the store and deletes the directory (at exit).
struct TempStore {
  std::string dir;
  std::string path;  // the database file: DIR/ablate.db
  std::unique_ptr<Store> store;
};

// Makes a fresh directory $TMPDIR/ablate_`target`.XXXXXX (/tmp without TMPDIR) and opens a store
// at DIR/ablate.db in it, with `options` but for the path.
inline void OpenTempStore(const char* target, StoreOptions options, TempStore* out) {
  const char* tmp = getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/ablate_",
                                   target, ".XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) Fail(target, "mkdtemp failed");
  out->dir = templ;
  out->path = out->dir + "/ablate.db";
  options.path = out->path;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  CheckSetup(target, store.status(), "open");
  out->store = std::move(*store);
}

inline void RemoveTempStore(TempStore* temp) {
  temp->store.reset();
  std::error_code ignored;
  std::filesystem::remove_all(temp->dir, ignored);
}

// Parses `spec_yaml` (as fuzz.yaml), expands it and stores the sweep: its ids.
inline SweepIds CreateSweepFromSpec(const char* target, Store& store, const char* spec_yaml) {
  absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(spec_yaml, "fuzz.yaml");
  CheckSetup(target, spec.status(), "spec");
  absl::StatusOr<ExpandedSweep> expanded = ExpandSweep(*spec);
  CheckSetup(target, expanded.status(), "expand");
  SweepRecord record;
  record.expanded = *expanded;
  record.spec_yaml = spec_yaml;
  absl::StatusOr<SweepIds> ids = store.CreateSweep(record);
  CheckSetup(target, ids.status(), "create sweep");
  return *ids;
}

// Starts attempt 1 of the PENDING run `run_id` (on `worker_id`, 0 for none).
inline void StartRun(const char* target, Store& store, int64_t run_id, int64_t worker_id = 0) {
  RunTransition start;
  start.run_id = run_id;
  start.from = {PENDING};
  start.to = RUNNING;
  start.worker_id = worker_id;
  CheckSetup(target, store.TransitionRun(start).status(), "start");
}

}  // namespace ablate::fuzz

#endif  // ABLATE_TESTS_FUZZ_FUZZ_UTIL_H_
