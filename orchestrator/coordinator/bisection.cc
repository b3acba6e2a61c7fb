#include "orchestrator/coordinator/bisection.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "orchestrator/sweep/tune_value.h"

namespace ablate {

BoundaryStep NextBoundaryStep(const std::vector<BoundaryProbe>& probes, double min, double max,
                              double tolerance) {
  BoundaryStep step;
  std::vector<BoundaryProbe> sorted = probes;
  std::sort(sorted.begin(), sorted.end(),
            [](const BoundaryProbe& a, const BoundaryProbe& b) { return a.value < b.value; });
  for (const BoundaryProbe& p : sorted) {
    if (p.value == min && p.done && !p.failed && !p.stable) {
      step.kind = BoundaryStep::Kind::kDone;
      step.unstable = min;
      step.note = absl::StrCat("unstable already at min ", FormatTuneValue(min));
      return step;
    }
  }
  for (const BoundaryProbe& p : sorted) {
    if (p.done && p.failed) {
      step.kind = BoundaryStep::Kind::kDone;
      step.note = absl::StrCat("a run of probe ", FormatTuneValue(p.value),
                               " failed: the bisection stopped there");
      return step;
    }
  }
  for (const BoundaryProbe& p : sorted) {
    if (!p.done) return step;  // kWait: one probe at a time
  }
  std::optional<double> hi;
  for (const BoundaryProbe& p : sorted) {
    if (!p.stable) {
      hi = p.value;
      break;
    }
  }
  if (!hi.has_value()) {
    step.kind = BoundaryStep::Kind::kDone;
    step.stable = sorted.empty() ? max : sorted.back().value;
    step.note = absl::StrCat("still stable at max ", FormatTuneValue(max));
    return step;
  }
  std::optional<double> lo;
  for (const BoundaryProbe& p : sorted) {
    if (p.value < *hi && p.stable) lo = p.value;
  }
  step.unstable = hi;
  step.stable = lo;
  if (!lo.has_value()) {  // min itself is not in the probes: nothing below hi is known stable
    step.kind = BoundaryStep::Kind::kDone;
    step.note = "no stable value below the first unstable one";
    return step;
  }
  if (*hi / *lo <= tolerance * (1 + 1e-12)) {
    step.kind = BoundaryStep::Kind::kDone;
    return step;
  }
  double next = 0;
  (void)absl::SimpleAtod(FormatTuneValue(std::sqrt(*lo * *hi)), &next);
  if (next <= *lo || next >= *hi) {  // 6 significant digits cannot split it further
    step.kind = BoundaryStep::Kind::kDone;
    step.note = "the bracket is as narrow as 6 significant digits write it";
    return step;
  }
  step.kind = BoundaryStep::Kind::kProbe;
  step.next = next;
  return step;
}

}  // namespace ablate
