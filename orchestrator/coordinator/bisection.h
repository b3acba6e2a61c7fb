// The stability bisection of a `method: boundary` tune (docs/spec.md, "Tuning"): per group, the
// largest value of the tuned axis at which training stays stable, bracketed on a log scale. A
// scheduling rule beside the scheduler (its pure library): the coordinator's tuner (tuner.h)
// reads a group's probes from the store, asks NextBoundaryStep what to do, and writes it.
//
// A probe is one value tried over every seed of the spec; its value is written as
// FormatTuneValue (orchestrator/sweep/tune_value.h) writes it. Pure and stateless, like DecideAsha
// (asha.h): a coordinator that restarts asks again and gets the same step. Thread-safe.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_BISECTION_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_BISECTION_H_

#include <optional>
#include <string>
#include <vector>

namespace ablate {

// One value bisection tried, over every seed of the spec.
struct BoundaryProbe {
  double value = 0;
  bool done = false;    // every seed's run ended
  bool failed = false;  // one FAILED or was CANCELLED: the bisection cannot go on
  bool stable = false;  // every seed SUCCEEDED within max_spike_score
};

struct BoundaryStep {
  enum class Kind { kWait, kProbe, kDone };
  Kind kind = Kind::kWait;
  double next = 0;                 // kProbe: the value to try, sqrt(stable x unstable)
  std::optional<double> stable;    // kDone: the largest stable value below `unstable`
  std::optional<double> unstable;  // kDone: the smallest unstable value; none: stable at max
  std::string note;                // kDone without a full bracket: why, in words
};

// What a group's stability bisection does next. It waits while a probe trains. It ends when min
// is unstable ("unstable already at min", no stable value), when max is stable (no unstable
// value), when a probe failed (neither), or once unstable / stable <= tolerance; else it probes
// the geometric mean of the largest stable value and the smallest unstable one above it (as
// FormatTuneValue writes it: when 6 significant digits cannot split the bracket, it ends).
BoundaryStep NextBoundaryStep(const std::vector<BoundaryProbe>& probes, double min, double max,
                              double tolerance);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_BISECTION_H_
