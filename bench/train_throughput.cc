// One measurement for bench/train_throughput.py: the real Trainer on the default corpus, timed
// from the end of warm-up step W to the last step; or the machine's fp32 matmul FLOP/s.
// Prints one JSON line.
//
//   build/bench_train --d-model 128 --steps 20 [--variant g1_elementwise --match-ffn]
//   build/bench_train --matmul
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "worker/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds of this process (every thread) so far.
double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Wall and CPU time from the end of step `warmup` to the last step's end. CPU time counts the
// work (and any spin-waiting) whatever else the machine runs; with OMP_WAIT_POLICY=PASSIVE it is
// close to the work alone, a steadier A/B figure than wall time on a shared machine.
class StepClock : public ablate::TrainerObserver {
 public:
  explicit StepClock(int warmup) : warmup_(warmup) {}
  Directive OnStep(const ablate::StepMetrics& m) override {
    if (m.step() == warmup_) start_ = Clock::now(), cpu_start_ = ProcessCpuSeconds();
    end_ = Clock::now();
    cpu_end_ = ProcessCpuSeconds();
    return Directive::kContinue;
  }
  double seconds() const { return std::chrono::duration<double>(end_ - start_).count(); }
  double cpu_seconds() const { return cpu_end_ - cpu_start_; }

 private:
  int warmup_;
  Clock::time_point start_, end_;
  double cpu_start_ = 0, cpu_end_ = 0;
};

// fp32 GEMM throughput: n x n x n products, best of `reps` after warm-up.
double MatmulFlops(int n, int reps) {
  torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::Tensor c = torch::mm(a, b);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ablate training throughput, one measurement"};
  int d_model = 128, layers = 4, heads = 0, head_dim = 32, ffn = 0, batch = 16, seq = 256;
  int steps = 20, warmup = 3, threads = static_cast<int>(std::thread::hardware_concurrency());
  std::string variant = "baseline", device = "cpu", profile;
  bool match_ffn = false, matmul = false;
  app.add_option("--d-model", d_model);
  app.add_option("--layers", layers);
  app.add_option("--heads", heads, "default d_model / head_dim");
  app.add_option("--head-dim", head_dim);
  app.add_option("--ffn", ffn, "default 4 x d_model");
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first (the clock starts as the last ends)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads);
  app.add_option("--variant", variant, "a preset name");
  app.add_option("--device", device);
  app.add_flag("--match-ffn", match_ffn, "narrow the FFN until params match the baseline's");
  app.add_flag("--matmul", matmul, "measure fp32 matmul FLOP/s instead");
  app.add_option("--profile", profile, "write a chrome://tracing profile of the run to this file");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);

  if (matmul) {
    std::printf("{\"impl\":\"matmul\",\"flops\":%.6g,\"threads\":%d}\n", MatmulFlops(1024, 10), threads);
    return 0;
  }
  ablate::RunConfig run = ablate::DefaultRunConfig();
  ablate::ModelConfig& m = *run.mutable_model();
  m.set_d_model(d_model);
  m.set_num_layers(layers);
  m.set_head_dim(head_dim);
  m.set_num_heads(heads > 0 ? heads : d_model / head_dim);
  m.set_num_kv_heads(m.num_heads());
  m.set_ffn_dim(ffn > 0 ? ffn : 4 * d_model);
  m.set_max_seq_len(seq);
  const int64_t baseline_params = ablate::CountParams(m).total();
  const ablate::VariantPreset* preset = ablate::FindVariantPreset(variant);
  if (preset == nullptr || !preset->apply(&m).ok()) {
    std::fprintf(stderr, "bench_train: unknown or inapplicable variant %s\n", variant.c_str());
    return 1;
  }
  if (match_ffn) {  // SwiGLU has three d_model x width matrices per layer
    const int64_t extra = ablate::CountParams(m).total() - baseline_params;
    m.set_ffn_dim(m.ffn_dim() - static_cast<int>((extra / layers + 3 * d_model / 2) / (3 * d_model)));
  }
  ablate::TrainConfig& t = *run.mutable_train();
  t.set_steps(warmup + steps);
  t.set_batch_size(batch);
  t.set_seq_len(seq);
  t.set_eval_every(1 << 30);
  t.set_eval_batches(1);
  t.set_checkpoint_every(0);
  t.set_log_every(1 << 30);
  t.set_threads(threads);
  t.set_device(device);
  t.mutable_optimizer()->set_warmup_steps(2);

  ablate::TrainerOptions options;
  options.checkpoint_dir = (std::filesystem::temp_directory_path() /
                            ("ablate_bench_train_" + std::to_string(::getpid()))).string();
  auto trainer = ablate::Trainer::Create(run, options);
  if (!trainer.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", std::string(trainer.status().message()).c_str());
    return 1;
  }
  StepClock clock(warmup);
  std::unique_ptr<torch::autograd::profiler::RecordProfile> recording;
  if (!profile.empty()) recording = std::make_unique<torch::autograd::profiler::RecordProfile>(profile);
  auto summary = (*trainer)->Run(&clock);
  recording.reset();
  std::filesystem::remove_all(options.checkpoint_dir);
  if (!summary.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  const double tokens = static_cast<double>(steps) * batch * seq;
  const double tps = tokens / clock.seconds();
  std::printf("{\"impl\":\"ablate\",\"variant\":\"%s\",\"d_model\":%d,\"ffn\":%d,\"params\":%lld,"
              "\"tokens_per_s\":%.6g,\"step_ms\":%.6g,\"cpu_ms\":%.6g,\"flops_per_token\":%.6g,"
              "\"threads\":%d}\n",
              variant.c_str(), d_model, m.ffn_dim(),
              static_cast<long long>(ablate::CountParams(m).total()), tps,
              1e3 * clock.seconds() / steps, 1e3 * clock.cpu_seconds() / steps,
              ablate::TrainingFlopsPerToken(m, seq), threads);
  return 0;
}
