// A value of a tuned axis as text: "%.6g", the text a `range:` point and a boundary probe are
// written with into the run's config and its axis text, and what the tuners' notes show.
// Header-only, so that the scheduler's pure library (the ASHA and bisection rules beside it in
// orchestrator/coordinator/) writes values alike without linking the spec parser. Thread-safe.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_TUNE_VALUE_H_
#define ABLATE_ORCHESTRATOR_SWEEP_TUNE_VALUE_H_

#include <cstdio>
#include <string>

namespace ablate {

// A bisection reads a probe's value back from this text, so that the value it tries is the one
// the run's config holds.
inline std::string FormatTuneValue(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  return buf;
}

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_TUNE_VALUE_H_
