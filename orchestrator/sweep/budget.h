// Parameter-budget matching (docs/spec.md, "Budget matching") with exact integer arithmetic (no
// LibTorch).
//
// Each rule solves for one integer dimension of a variant so that the variant's total parameter
// count equals an anchor's:
//   BUDGET_FFN      ffn_dim (dense) or moe.expert_dim (MoE); anchor = the reference variant.
//                   Narrows the FFN of a variant that has more parameters (widens one that has
//                   fewer).
//   BUDGET_HEADS    num_kv_heads (kept dividing num_heads) or num_heads (kept a multiple of
//                   num_kv_heads), only ever added; anchor = the target variant.
//   BUDGET_EXPERTS  moe.num_experts, only ever added; anchor = the target variant.
// CountParams is affine in each of these dimensions, so the exact solution is a rational
// v* = v0 + (anchor_total - total(v0)) / slope with an integer slope measured by CountParams;
// the nearest admissible integers on either side of v* (a multiple of `multiple`, satisfying
// the head divisibility rules) are compared and the one with the smallest |residual| wins,
// ties going to the smaller model. The result must be within tolerance x anchor_total.
// Pure functions; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_BUDGET_H_
#define ABLATE_ORCHESTRATOR_SWEEP_BUDGET_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

// Defaults of a rule's unset fields (reference "baseline", tolerance 0.01, multiple 1).
BudgetRule DefaultBudgetRule();

// Solves `rule` for *variant (a valid config) against `anchor` (the config whose total is
// matched, named `anchor_name` in the report) and applies the solution to *variant.
// BUDGET_NONE returns an empty solution and changes nothing. InvalidArgument when the rule
// does not fit the config (experts on a dense base, a dimension that does not change the
// count), or when no admissible value brings the total within the tolerance (the message names
// the closest value and its residual); *variant is then unchanged.
absl::StatusOr<BudgetSolution> SolveBudget(const BudgetRule& rule, const ModelConfig& anchor,
                                           const std::string& anchor_name, ModelConfig* variant);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_BUDGET_H_
