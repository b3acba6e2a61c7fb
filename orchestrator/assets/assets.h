// The dashboard's web app, compiled into the binary: dashboard/*.{html,js,css} and uPlot's dist
// files, turned into byte arrays at build time by cmake/embed_assets.cmake. Its own library
// (ablate_assets) so that both readers, the dashboard's HTTP server and `ablate report`, take the
// bytes without the other's dependencies. Immutable: safe from any thread.
#ifndef ABLATE_ORCHESTRATOR_ASSETS_ASSETS_H_
#define ABLATE_ORCHESTRATOR_ASSETS_ASSETS_H_

#include <cstddef>
#include <string_view>

namespace ablate {

struct EmbeddedAsset {
  const char* path;  // URL path: "/index.html", "/vendor/uPlot.iife.min.js"
  const unsigned char* data;
  size_t size;

  std::string_view text() const { return {reinterpret_cast<const char*>(data), size}; }
};

// Every embedded asset, terminated by an entry whose path is nullptr.
extern const EmbeddedAsset kDashboardAssets[];

// The asset served at `path` ("/index.html"), or nullptr when none is compiled in.
const EmbeddedAsset* FindAsset(std::string_view path);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_ASSETS_ASSETS_H_
