// Sweep records and run transitions written straight through the Store API (no spec, no
// expansion, no coordinator), for the tests and tools that need a sweep in a store: the store's
// tests, the dashboard's and the report's, the dashboard simulator.
#ifndef ABLATE_TESTS_ORCHESTRATOR_STORE_TEST_SWEEPS_H_
#define ABLATE_TESTS_ORCHESTRATOR_STORE_TEST_SWEEPS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/model_config.h"
#include "orchestrator/store/store.h"

namespace ablate {
namespace testing {

// `variants` x `seeds` runs of `steps` steps each, seed-major (the run order).
inline SweepRecord MakeSweep(const std::string& name, const std::vector<std::string>& variants,
                             int seeds, int64_t steps) {
  SweepRecord record;
  ExpandedSweep& sweep = record.expanded;
  sweep.set_name(name);
  sweep.set_description("test sweep");
  sweep.set_priority(1);
  sweep.set_reference(variants[0]);
  for (const std::string& v : variants) sweep.add_variants(v);
  int index = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    for (size_t v = 0; v < variants.size(); ++v) {
      RunSpec* run = sweep.add_runs();
      run->set_sweep(name);
      run->set_variant(variants[v]);
      run->set_description(absl::StrCat(variants[v], " description"));
      run->set_index(index++);
      run->set_seed(seed);
      *run->mutable_config() = DefaultRunConfig();
      run->mutable_config()->mutable_train()->set_seed(seed);
      run->mutable_config()->mutable_train()->set_steps(steps);
      run->set_run_key(absl::StrCat(name, "-", v, "-", seed));
      run->mutable_params()->set_total(1000000 + 1000 * static_cast<int64_t>(v));
      run->mutable_params()->set_activated(1000000 + 1000 * static_cast<int64_t>(v));
      run->set_added_params(1000 * static_cast<int64_t>(v));
      if (v > 0) {
        run->mutable_budget()->set_match(BUDGET_FFN);
        run->mutable_budget()->set_text(absl::StrCat("ffn 64 -> ", 64 - static_cast<int>(v)));
      }
    }
  }
  record.spec_yaml = "name: " + name + "\n";
  return record;
}

// The transition of run `run_id` from any state of `from` to `to`; the rest as RunTransition's
// defaults (no attempt check, no worker, no summary), for a test to add what it is about.
inline RunTransition MakeTransition(int64_t run_id, std::vector<RunState> from, RunState to) {
  RunTransition t;
  t.run_id = run_id;
  t.from = std::move(from);
  t.to = to;
  return t;
}

}  // namespace testing
}  // namespace ablate

#endif  // ABLATE_TESTS_ORCHESTRATOR_STORE_TEST_SWEEPS_H_
