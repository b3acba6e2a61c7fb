// SHA-256 (FIPS 180-4) of a byte string, for run keys. Pure function; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_SPEC_SHA256_H_
#define ABLATE_ORCHESTRATOR_SPEC_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ablate {

// The 64 lowercase hex digits of SHA-256(data).
std::string Sha256Hex(absl::string_view data);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SPEC_SHA256_H_
