// The sweep the integration tests train with real processes, and the corpus it reads: baseline
// and g1_elementwise on a 2-layer, d_model 32 model over 32-byte windows of a small text, one CPU
// thread a run. The tests choose its length, its evaluation and checkpoint periods, its seeds and
// the ranks of each run. Header-only.
#ifndef ABLATE_TESTS_INTEGRATION_TINY_SWEEP_H_
#define ABLATE_TESTS_INTEGRATION_TINY_SWEEP_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace ablate::testing {

// Writes the corpus to `path`: 300 numbered lines of text.
inline void WriteTinyCorpus(const std::filesystem::path& path) {
  std::ofstream corpus(path);
  for (int i = 0; i < 300; ++i) {
    corpus << "And God said, Let there be light: and there was light " << i << ".\n";
  }
}

// Writes the spec of sweep `name`, reading `corpus`, to DIR/NAME.yaml and returns its path. Runs
// of `steps` steps evaluate every `eval_every` and checkpoint every `checkpoint_every`; seeds 0
// to `seeds` - 1; each run on `devices` ranks.
inline std::filesystem::path WriteTinySweepSpec(const std::filesystem::path& dir,
                                                const std::string& name,
                                                const std::filesystem::path& corpus,
                                                int64_t steps, int64_t eval_every,
                                                int64_t checkpoint_every, int devices = 1,
                                                int seeds = 2) {
  std::string seed_list;
  for (int i = 0; i < seeds; ++i) seed_list += (i ? ", " : "") + std::to_string(i);
  const std::filesystem::path p = dir / (name + ".yaml");
  std::ofstream(p) << "sweep: " << name << "\n"
                   << "base:\n"
                   << "  model: {d_model: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2, "
                      "head_dim: 16, ffn_dim: 64, max_seq_len: 32}\n"
                   << "  train: {steps: " << steps << ", batch_size: 4, seq_len: 32, threads: 1, "
                   << "eval_every: " << eval_every << ", eval_batches: 1, checkpoint_every: "
                   << checkpoint_every << ", data: {path: " << corpus.string() << "}}\n"
                   << "variants: [baseline, g1_elementwise]\n"
                   << "seeds: [" << seed_list << "]\n"
                   << "resources: {device: cpu, threads: 1"
                   << (devices > 1 ? ", devices: " + std::to_string(devices) : "") << "}\n";
  return p;
}

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_INTEGRATION_TINY_SWEEP_H_
