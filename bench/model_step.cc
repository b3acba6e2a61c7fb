// Forward+backward time of every variant on one small config, as a ratio to the baseline,
// measured interleaved (round r times every variant once) so machine noise hits all alike.
//
//   build/bench_model_step [--rounds 10] [--batch 16] [--seq 256] [--threads N]
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "worker/model/transformer.h"

namespace {

struct Entry {
  std::string name;
  ablate::ModelConfig config;
  ablate::Transformer model{nullptr};
  std::vector<double> seconds;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 10, batch = 16, seq = 256;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  CLI::App app{"bench_model_step: forward+backward time of every variant against the baseline, "
               "interleaved rounds"};
  app.add_option("--rounds", rounds, "rounds (each times every variant once)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per step")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "tokens per sequence")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);
  torch::manual_seed(0);

  ablate::ModelConfig base = ablate::DefaultModelConfig();  // 4 layers, d_model 128, 4 heads
  std::vector<Entry> entries;
  for (const ablate::VariantPreset& p : ablate::AllVariantPresets()) {
    ablate::ModelConfig c = base;
    if (!p.apply(&c).ok()) continue;  // experts_plus4 needs an MoE base
    entries.push_back({p.name, c, ablate::Transformer(c), {}});
  }
  const int64_t V = base.vocab_size();
  torch::Tensor tokens = torch::randint(0, V, {batch, seq}, torch::kLong);
  torch::Tensor targets = torch::randint(0, V, {batch, seq}, torch::kLong);
  auto step = [&](Entry& e) {
    auto out = e.model->forward(tokens);
    torch::Tensor loss =
        torch::cross_entropy_loss(out.logits.view({-1, V}), targets.view({-1})) + out.aux_loss;
    e.model->zero_grad();
    loss.backward();
  };
  for (Entry& e : entries) step(e);  // warm-up
  for (int r = 0; r < rounds; ++r) {
    for (Entry& e : entries) {
      const auto t0 = std::chrono::steady_clock::now();
      step(e);
      e.seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const double base_s = Median(entries.front().seconds);
  std::printf("model_step: d_model %d, %d layers, batch %d x %d tokens, %d threads, %d rounds\n",
              base.d_model(), base.num_layers(), batch, seq, threads, rounds);
  std::printf("%-24s %12s %10s %10s\n", "variant", "params", "step ms", "vs base");
  for (const Entry& e : entries) {
    const double s = Median(e.seconds);
    std::printf("%-24s %12lld %10.1f %10.3f\n", e.name.c_str(),
                static_cast<long long>(ablate::CountParams(e.config).total()), s * 1e3,
                s / base_s);
  }
  return 0;
}
