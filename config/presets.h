// The paper's variants (docs/model.md, "Variant presets") as named edits of a base ModelConfig.
//
// A preset changes only what defines the variant (a gate, a control, more heads...), so the same
// name means the same thing on a CPU-scale base and on a paper-scale base. Sweep specs refer to
// presets by name; tests loop over all of them. Immutable after first use; thread-safe.
#ifndef ABLATE_CONFIG_PRESETS_H_
#define ABLATE_CONFIG_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct VariantPreset {
  std::string name;         // stable identifier used in specs: "g1_elementwise"
  std::string group;        // variant group (docs/model.md): "baseline", "expansion", "gate", ...
  std::string description;  // one line for `ablate expand`
  // Applies the variant to *config. FailedPrecondition when the base cannot take it (e.g. more
  // experts on a dense base); the caller reports the variant name.
  absl::Status (*apply)(ModelConfig* config);
};

// Every preset, in the paper's order.
const std::vector<VariantPreset>& AllVariantPresets();

// nullptr when unknown.
const VariantPreset* FindVariantPreset(const std::string& name);

// A named list of presets: one table of the paper, usable as one entry of a spec's variants.
// Groups that are comparison tables start with "baseline".
struct PresetGroup {
  std::string name;         // "paper_moe_table"
  std::string description;  // one line for docs and errors
  std::vector<std::string> variants;  // preset names, in the paper's order
};

// Every group: paper_moe_table (every MoE variant of the paper, SwitchHead included),
// expansion, gates, nonlinearity_controls, sparsity_controls, switchhead, dense_stability, clamp.
const std::vector<PresetGroup>& AllPresetGroups();

// nullptr when unknown.
const PresetGroup* FindPresetGroup(const std::string& name);

}  // namespace ablate

#endif  // ABLATE_CONFIG_PRESETS_H_
