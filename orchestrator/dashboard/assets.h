// The dashboard's web assets, compiled into the binary: dashboard/*.{html,js,css} and uPlot's dist
// files, turned into byte arrays at build time by cmake/embed_assets.cmake.
#ifndef ABLATE_ORCHESTRATOR_DASHBOARD_ASSETS_H_
#define ABLATE_ORCHESTRATOR_DASHBOARD_ASSETS_H_

#include <cstddef>

namespace ablate {

struct EmbeddedAsset {
  const char* path;  // URL path: "/index.html", "/vendor/uPlot.iife.min.js"
  const unsigned char* data;
  size_t size;
};

// Every embedded asset, terminated by an entry whose path is nullptr.
extern const EmbeddedAsset kDashboardAssets[];

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DASHBOARD_ASSETS_H_
