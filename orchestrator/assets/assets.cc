// Lookup in the embedded asset table (assets.h); the table itself is generated at build time.
#include "orchestrator/assets/assets.h"

namespace ablate {

const EmbeddedAsset* FindAsset(std::string_view path) {
  for (const EmbeddedAsset* a = kDashboardAssets; a->path != nullptr; ++a) {
    if (path == a->path) return a;
  }
  return nullptr;
}

}  // namespace ablate
