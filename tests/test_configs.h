// Shared by the tests: tiny base configs and every (base, preset) variant.
#ifndef ABLATE_TESTS_TEST_CONFIGS_H_
#define ABLATE_TESTS_TEST_CONFIGS_H_

#include <ostream>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/presets.h"
#include "proto/ablate.pb.h"

namespace ablate {

// Dense: 2 layers, d_model 32, 4 query / 2 KV heads of d_k 8 (q*d_k = d_model), SwiGLU 64.
inline ModelConfig TinyDense() {
  ModelConfig c = DefaultModelConfig();
  c.set_vocab_size(64);
  c.set_num_layers(2);
  c.set_d_model(32);
  c.set_num_heads(4);
  c.set_num_kv_heads(2);
  c.set_head_dim(8);
  c.set_ffn_dim(64);
  c.set_max_seq_len(16);
  return c;
}

// MoE with the paper's shape ratios: q*d_k = 2 d_model, GQA, untied, 8 experts top-2.
inline ModelConfig TinyMoe() {
  ModelConfig c = TinyDense();
  c.set_head_dim(16);
  c.set_tie_embeddings(false);
  c.set_ffn_dim(0);
  c.mutable_moe()->set_num_experts(8);
  c.mutable_moe()->set_top_k(2);
  c.mutable_moe()->set_expert_dim(16);
  return c;
}

struct VariantCase {
  std::string name;  // "dense_g1_elementwise"
  ModelConfig config;
};

// gtest prints a parameter on failure: the name, not the bytes.
inline void PrintTo(const VariantCase& c, std::ostream* os) { *os << c.name; }

// Every preset on every base it applies to (experts_plus4 needs the MoE base).
inline std::vector<VariantCase> AllVariantCases() {
  std::vector<VariantCase> cases;
  const std::pair<const char*, ModelConfig> bases[] = {{"dense", TinyDense()},
                                                       {"moe", TinyMoe()}};
  for (const auto& [base_name, base] : bases) {
    for (const VariantPreset& preset : AllVariantPresets()) {
      ModelConfig c = base;
      if (!preset.apply(&c).ok()) continue;
      std::string name = std::string(base_name) + "_" + preset.name;
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      cases.push_back({name, c});
    }
  }
  return cases;
}

}  // namespace ablate

#endif  // ABLATE_TESTS_TEST_CONFIGS_H_
