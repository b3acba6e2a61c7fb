#include "orchestrator/sweep/budget.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/model_config.h"
#include "common/text_format.h"
#include "config/param_count.h"

namespace ablate {

BudgetRule DefaultBudgetRule() {
  BudgetRule rule;
  rule.set_reference("baseline");
  rule.set_tolerance(0.01);
  rule.set_multiple(1);
  return rule;
}

namespace {

// Floor of a / b for b > 0, exact for negative a.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

// One solvable dimension of a ModelConfig.
struct Dimension {
  std::string name;   // the field path: "ffn_dim"
  std::string label;  // in the report: "ffn"
  std::function<int64_t(const ModelConfig&)> get;
  std::function<void(ModelConfig*, int64_t)> set;
  std::function<bool(const ModelConfig&, int64_t)> admissible;  // beyond >= 1 and the multiple
  bool only_grow;
  int64_t max;  // the bound ValidateModelConfig enforces (kMax*): beyond it counts could overflow
};

absl::StatusOr<Dimension> DimensionFor(const BudgetRule& rule, const ModelConfig& c) {
  const auto any = [](const ModelConfig&, int64_t) { return true; };
  switch (rule.match()) {
    case BUDGET_FFN:
      if (c.moe().num_experts() > 0) {
        return Dimension{"moe.expert_dim", "expert",
                         [](const ModelConfig& m) { return int64_t{m.moe().expert_dim()}; },
                         [](ModelConfig* m, int64_t v) { m->mutable_moe()->set_expert_dim(v); },
                         any, false, kMaxFfnDim};
      }
      return Dimension{"ffn_dim", "ffn", [](const ModelConfig& m) { return int64_t{m.ffn_dim()}; },
                       [](ModelConfig* m, int64_t v) { m->set_ffn_dim(v); }, any, false,
                       kMaxFfnDim};
    case BUDGET_HEADS:
      if (rule.heads() == BUDGET_HEADS_QUERY) {
        return Dimension{
            "num_heads", "q_heads", [](const ModelConfig& m) { return int64_t{m.num_heads()}; },
            [](ModelConfig* m, int64_t v) { m->set_num_heads(v); },
            [](const ModelConfig& m, int64_t v) { return v % m.num_kv_heads() == 0; }, true,
            kMaxNumHeads};
      }
      return Dimension{
          "num_kv_heads", "kv_heads", [](const ModelConfig& m) { return int64_t{m.num_kv_heads()}; },
          [](ModelConfig* m, int64_t v) { m->set_num_kv_heads(v); },
          [](const ModelConfig& m, int64_t v) { return m.num_heads() % v == 0; }, true,
          kMaxNumHeads};
    case BUDGET_EXPERTS:
      if (c.moe().num_experts() == 0) {
        return absl::InvalidArgumentError(
            "budget.match: EXPERTS needs an MoE base (moe.num_experts > 0)");
      }
      return Dimension{"moe.num_experts", "experts",
                       [](const ModelConfig& m) { return int64_t{m.moe().num_experts()}; },
                       [](ModelConfig* m, int64_t v) { m->mutable_moe()->set_num_experts(v); },
                       any, true, kMaxExperts};
    default:
      return absl::InvalidArgumentError("budget.match: unknown rule");
  }
}

std::string Percent(int64_t residual, int64_t total) {
  return absl::StrFormat("%+.3g%%", 100.0 * static_cast<double>(residual) / static_cast<double>(total));
}

}  // namespace

absl::StatusOr<BudgetSolution> SolveBudget(const BudgetRule& rule, const ModelConfig& anchor,
                                           const std::string& anchor_name, ModelConfig* variant) {
  BudgetSolution solution;
  if (rule.match() == BUDGET_NONE) return solution;
  absl::StatusOr<Dimension> dim_or = DimensionFor(rule, *variant);
  if (!dim_or.ok()) return dim_or.status();
  const Dimension& dim = *dim_or;
  const int64_t multiple = std::max<int64_t>(1, rule.multiple());
  if (!(rule.tolerance() >= 0)) {
    return absl::InvalidArgumentError("budget.tolerance: must be >= 0");
  }

  const int64_t target = CountParams(anchor).total();
  ModelConfig probe = *variant;
  const int64_t v0 = dim.get(probe);
  const int64_t total0 = CountParams(probe).total();
  dim.set(&probe, v0 + 1);
  const int64_t slope = CountParams(probe).total() - total0;
  if (slope <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: ", dim.name, " does not change the parameter count of this variant"));
  }
  auto total_at = [&](int64_t v) { return total0 + (v - v0) * slope; };  // CountParams is affine
  const int64_t lower_bound = dim.only_grow ? v0 : 1;
  // Not INT32_MAX: total_at() of a value past the dimension's bound can overflow int64 (found with
  // tests/fuzz/spec_fuzz), and ValidateModelConfig would refuse the result anyway.
  const int64_t upper_bound = dim.max;
  auto admissible = [&](int64_t v) {
    return v >= lower_bound && v <= upper_bound && v % multiple == 0 &&
           dim.admissible(*variant, v);
  };

  // v* lies in [base, base + 1): search down from the multiple at or below base, and up from the
  // next multiple; the first admissible value on each side is that side's best (|residual| grows
  // monotonically away from v*).
  const int64_t base = v0 + FloorDiv(target - total0, slope);
  std::optional<int64_t> best;
  auto consider = [&](int64_t v) {
    if (!best || std::llabs(total_at(v) - target) < std::llabs(total_at(*best) - target) ||
        (std::llabs(total_at(v) - target) == std::llabs(total_at(*best) - target) && v < *best)) {
      best = v;
    }
  };
  constexpr int kMaxSteps = 1 << 20;
  int64_t down = FloorDiv(std::min(base, upper_bound), multiple) * multiple;
  for (int i = 0; i < kMaxSteps && down >= lower_bound; ++i, down -= multiple) {
    if (admissible(down)) {
      consider(down);
      break;
    }
  }
  int64_t up = FloorDiv(std::max(base, lower_bound - 1), multiple) * multiple + multiple;
  for (int i = 0; i < kMaxSteps && up <= upper_bound; ++i, up += multiple) {
    if (admissible(up)) {
      consider(up);
      break;
    }
  }
  const std::string anchor_text =
      absl::StrCat(anchor_name, "'s ", FormatCount(target), " parameters");
  if (!best) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: no admissible ", dim.name, " (multiple of ", multiple,
        dim.only_grow ? absl::StrCat(", >= ", v0) : "", ") exists to match ", anchor_text));
  }
  const int64_t residual = total_at(*best) - target;
  if (static_cast<double>(std::llabs(residual)) > rule.tolerance() * static_cast<double>(target)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: impossible: no ", dim.name, " (multiple of ", multiple,
        dim.only_grow ? absl::StrCat(", >= ", v0) : "", ") brings the total within ",
        rule.tolerance() * 100, "% of ", anchor_text, "; closest is ", *best, " with residual ",
        FormatCount(residual), " (", Percent(residual, target), ")"));
  }
  dim.set(variant, *best);
  solution.set_match(rule.match());
  solution.set_dim(dim.name);
  solution.set_from(v0);
  solution.set_to(*best);
  solution.set_anchor(anchor_name);
  solution.set_anchor_total(target);
  solution.set_residual(residual);
  solution.set_text(absl::StrCat(dim.label, " ", v0, " -> ", *best, " (residual ",
                                 residual > 0 ? "+" : "", FormatCount(residual), " = ",
                                 Percent(residual, target), " vs ", anchor_name, ")"));
  return solution;
}

}  // namespace ablate
