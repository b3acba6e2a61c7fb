// What the paper's G1 gate (elementwise sigmoid) costs at one layer's shape, forward and
// backward: the fused attention alone against the attention then SigmoidGate, as the model runs
// them, in alternating order in one process. The gate's logits are a strided slice of a wider
// projection, as the model's fused q/k/v/gate GEMM hands them over. Prints, for the forward, the
// backward and both (`step`): the medians of each (`attention_*_ms`, `gated_*_ms`), and the
// medians of the round-by-round difference (`gate_*_ms`) and ratio to the attention alone
// (`gate_*_cost`), in which the VM's drift between rounds cancels.
// These are the gate's own passes (its sigmoid, product and backward), not its columns of the
// fused q/k/v/gate GEMM, which the FFN-matched G1 pays for with a narrower FFN, nor its share of
// the concatenation of the projection's gradients. Times the layers, over bench_train's step
// time at the same shape, they are the share of a training step those passes take
// (docs/benchmarks.md).
//
//   build/bench_gate_pass [--d-model 256] [--seq 256] [--batch 128] [--head-dim 64] [--rounds 9]
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "bench/stats.h"
#include "worker/model/fused_ops.h"
#include "worker/train/trainer.h"

namespace {

double Median(const std::vector<double>& v) { return ablate::bench::Quantile(v, 0.5); }

}  // namespace

int main(int argc, char** argv) {
  ablate::KeepFreedMemoryInHeap();  // as the trainer runs: freed activations stay in the heap
  int d_model = 256, seq = 256, batch = 128, head_dim = 64, rounds = 9;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  CLI::App app{"bench_gate_pass: the G1 gate's cost next to the fused attention's"};
  app.add_option("--d-model", d_model, "model width (heads = d-model / head-dim)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "tokens per sequence")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--head-dim", head_dim, "d_k")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds, each timing both once")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (d_model % head_dim != 0) {
    std::fprintf(stderr, "bench_gate_pass: --d-model %d is not a multiple of --head-dim %d\n",
                 d_model, head_dim);
    return 2;
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  const int64_t B = batch, T = seq, H = d_model / head_dim, dk = head_dim;
  const torch::Tensor mask =
      torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(/*diagonal=*/1);
  const torch::Tensor q0 = torch::randn({B, H, T, dk}) / std::sqrt(static_cast<double>(dk));
  const torch::Tensor k0 = torch::randn({B, H, T, dk}), v0 = torch::randn({B, T, H, dk});
  // The gate's logits as the model's fused q/k/v/gate GEMM hands them over: the last quarter of
  // each (B, T, 4 d_model) row, viewed (B, T, H, dk).
  const torch::Tensor logits0 =
      torch::randn({B, T, 4 * d_model}).slice(2, 3 * d_model).view({B, T, H, dk});
  const torch::Tensor up = torch::randn({B, T, H, dk});

  // One forward and backward, timed: {forward, backward} seconds, with the gate or without.
  auto step = [&](bool gate) {
    const torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    const torch::Tensor v = v0.clone().requires_grad_(true);
    const torch::Tensor logits = logits0.detach().requires_grad_(true);  // strided, like the model's
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor out = ablate::CausalAttention(q, k, v, mask, /*with_probs=*/false).first;
    if (gate) out = ablate::SigmoidGate(out, logits);
    const auto t1 = std::chrono::steady_clock::now();
    out.backward(up);
    const auto t2 = std::chrono::steady_clock::now();
    return std::pair<double, double>{std::chrono::duration<double>(t1 - t0).count(),
                                     std::chrono::duration<double>(t2 - t1).count()};
  };
  step(false);  // warm-up: the heap grows to its size once
  step(true);
  // [0 forward, 1 backward, 2 both]: the attention's seconds, the gated one's, and the gate's
  // cost over the attention in the same round (the order alternates), so the VM's drift between
  // rounds cancels.
  std::vector<double> alone[3], gated[3], diff[3], cost[3];
  for (int r = 0; r < rounds; ++r) {
    std::pair<double, double> a, g;
    if (r % 2 == 0) {
      a = step(false);
      g = step(true);
    } else {
      g = step(true);
      a = step(false);
    }
    const double as[3] = {a.first, a.second, a.first + a.second};
    const double gs[3] = {g.first, g.second, g.first + g.second};
    for (int part = 0; part < 3; ++part) {
      alone[part].push_back(as[part]);
      gated[part].push_back(gs[part]);
      diff[part].push_back(gs[part] - as[part]);
      cost[part].push_back((gs[part] - as[part]) / as[part]);
    }
  }
  std::printf("{\"d_model\":%d,\"seq\":%d,\"batch\":%d,\"heads\":%lld,\"threads\":%d,"
              "\"rounds\":%d",
              d_model, seq, batch, static_cast<long long>(H), threads, rounds);
  const char* parts[] = {"forward", "backward", "step"};
  for (int part = 0; part < 3; ++part) {
    std::printf(",\"attention_%s_ms\":%.4g,\"gated_%s_ms\":%.4g,\"gate_%s_ms\":%.4g,"
                "\"gate_%s_cost\":%.4f",
                parts[part], 1e3 * Median(alone[part]), parts[part], 1e3 * Median(gated[part]),
                parts[part], 1e3 * Median(diff[part]), parts[part],
                Median(cost[part]));
  }
  std::printf("}\n");
  return 0;
}
