// Training throughput and MFU on a GPU (docs/gpu.md): the real Trainer, bf16 autocast, at a few
// shapes, against a bf16 matrix product measured in the same run. One JSON line per measurement:
//
//   {"impl":"matmul","device":"cuda:0","dtype":"bf16","n":8192,"flops":7.9e14}
//   {"impl":"ablate","variant":"baseline","d_model":1024,...,"tokens_per_s":...,"mfu":0.41}
//
// mfu is training FLOPs per second (TrainingFlopsPerToken, config/param_count.h: 6 N plus
// attention) over the measured matmul rate; mfu_peak the same over the datasheet's dense bf16
// peak given by --peak-tflops (989 for an H100/H200 SXM), 0 when not given.
//
// Each training line also carries the run's peak of device memory (max_memory_allocated on CUDA,
// the counting allocator's peak on the CPU: RunSummary.peak_memory_bytes) beside its memory plan
// (config/memory_plan.h), and `precision`: autocast (train.precision BF16_AUTOCAST, the default)
// or bf16 (BF16, Megatron-LM's; --precision bf16), whose `residual` says the dtype of the
// residual stream a probed forward pass saw.
//
//   build/bench_gpu --device cuda:0                     # the default shapes
//   build/bench_gpu --device cuda:0 --precision bf16 --shapes 1   # Megatron bf16, first shape
//   build/bench_gpu --device cpu --tiny                 # the CPU rehearsal (bench/gpu/)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/memory_plan.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "worker/model/probes.h"
#include "worker/model/torch_compat.h"
#include "worker/model/transformer.h"
#include "worker/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

void Sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
}

// Wall time from the end of step `warmup` to the last step. Each step's metrics carry the loss
// as a number, so the host waits for the device at every step: the clock reads finished work.
class StepClock : public ablate::TrainerObserver {
 public:
  explicit StepClock(int warmup) : warmup_(warmup) {}
  Directive OnStep(const ablate::StepMetrics& m) override {
    if (m.step() == warmup_) start_ = Clock::now();
    end_ = Clock::now();
    last_loss_ = m.loss();
    return Directive::kContinue;
  }
  double seconds() const { return std::chrono::duration<double>(end_ - start_).count(); }
  double last_loss() const { return last_loss_; }

 private:
  int warmup_;
  Clock::time_point start_, end_;
  double last_loss_ = 0;
};

// n x n x n products on random data (never zeros: they run faster than real data), mean of
// `reps` after 3 warm-ups, in FLOP/s.
double MatmulFlops(const torch::Device& device, torch::ScalarType dtype, int n, int reps) {
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  torch::Tensor c = torch::mm(a, b);
  for (int i = 0; i < 3; ++i) torch::mm_out(c, a, b);
  Sync(device);
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) torch::mm_out(c, a, b);
  Sync(device);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
  return 2.0 * n * n * n / s;
}

struct Shape {
  int d_model, layers, head_dim, seq, batch;
};

}  // namespace

// The dtype of the residual stream after layer 0 in one probed forward pass of `run`'s model,
// built at its precision on `device` ("BFloat16" for BF16, "Float" otherwise).
std::string ResidualDtype(const ablate::RunConfig& run, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  ablate::Transformer model(run.model());
  model->to(device);
  if (run.train().precision() == ablate::PRECISION_BF16) model->SetComputeDtype(torch::kBFloat16);
  ablate::ProbeRecorder probes(run.model());
  model->forward(torch::zeros({1, 8}, torch::TensorOptions(torch::kLong).device(device)), &probes);
  return probes.ResidualDtypes().empty() ? "" : probes.ResidualDtypes()[0];
}

int main(int argc, char** argv) {
  CLI::App app{"ablate training throughput and MFU on a GPU, against a bf16 matmul"};
  std::string device_name = "cuda:0";
  std::vector<std::string> variants = {"baseline", "g1_elementwise"};
  int steps = 20, warmup = 5, matmul_n = 8192;
  double peak_tflops = 0;
  bool tiny = false;
  std::string precision = "autocast";
  int shape_count = 0;
  app.add_option("--device", device_name, "cuda:N, or cpu for a rehearsal")->capture_default_str();
  app.add_option("--variants", variants, "presets trained at every shape")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--matmul-n", matmul_n, "the reference product's size")->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops, "datasheet dense bf16 TFLOP/s, for mfu_peak");
  app.add_flag("--tiny", tiny, "tiny shapes, few steps (a CPU rehearsal of this binary)");
  app.add_option("--precision", precision, "autocast (BF16_AUTOCAST) or bf16 (BF16)")
      ->check(CLI::IsMember({"autocast", "bf16"}))
      ->capture_default_str();
  app.add_option("--shapes", shape_count, "only the first N shapes (0: all)");
  CLI11_PARSE(app, argc, argv);
  const torch::Device device(device_name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_gpu: no CUDA device visible to LibTorch %s\n",
                 ablate::compat::TorchVersion());
    return 1;
  }
  // GPT-2 small's width and depth, then the d_model 1024 x 12 layers x 1024 tokens of the issue,
  // then a wider model: where the matrix products dominate more and more.
  std::vector<Shape> shapes = {{768, 12, 64, 1024, 16}, {1024, 12, 64, 1024, 16},
                               {2048, 8, 128, 1024, 8}};
  if (tiny) {
    shapes = {{64, 2, 16, 64, 4}, {96, 2, 32, 64, 4}};
    steps = std::min(steps, 4);
    warmup = std::min(warmup, 2);
    matmul_n = std::min(matmul_n, 256);
  }
  if (shape_count > 0 && shape_count < static_cast<int>(shapes.size())) shapes.resize(shape_count);
  const torch::ScalarType dtype = device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  const double matmul = MatmulFlops(device, dtype, matmul_n, tiny ? 3 : 10);
  std::printf("{\"impl\":\"matmul\",\"device\":\"%s\",\"dtype\":\"%s\",\"n\":%d,\"flops\":%.6g,"
              "\"torch\":\"%s\"}\n",
              device_name.c_str(), dtype == torch::kBFloat16 ? "bf16" : "fp32", matmul_n, matmul,
              ablate::compat::TorchVersion());
  std::fflush(stdout);

  int failures = 0;
  for (const Shape& s : shapes) {
    for (const std::string& variant : variants) {
      ablate::RunConfig run = ablate::DefaultRunConfig();
      ablate::ModelConfig& m = *run.mutable_model();
      m.set_vocab_size(256);  // the byte-level corpus
      m.set_d_model(s.d_model);
      m.set_num_layers(s.layers);
      m.set_head_dim(s.head_dim);
      m.set_num_heads(s.d_model / s.head_dim);
      m.set_num_kv_heads(s.d_model / s.head_dim);
      m.set_ffn_dim(4 * s.d_model);
      m.set_max_seq_len(s.seq);
      const ablate::VariantPreset* preset = ablate::FindVariantPreset(variant);
      if (preset == nullptr || !preset->apply(&m).ok()) {
        std::fprintf(stderr, "bench_gpu: unknown or inapplicable variant %s\n", variant.c_str());
        return 1;
      }
      ablate::TrainConfig& t = *run.mutable_train();
      t.set_steps(warmup + steps);
      t.set_batch_size(s.batch);
      t.set_seq_len(s.seq);
      t.set_eval_every(1 << 30);
      t.set_eval_batches(1);
      t.set_checkpoint_every(0);
      t.set_log_every(1 << 30);
      t.set_device(device_name);
      // Autocast is fp32 on the CPU (proto/ablate.proto); BF16 is bf16 everywhere.
      t.set_precision(precision == "bf16" ? ablate::PRECISION_BF16
                                          : ablate::PRECISION_BF16_AUTOCAST);
      t.mutable_optimizer()->set_warmup_steps(2);

      ablate::TrainerOptions options;
      options.checkpoint_dir = (std::filesystem::temp_directory_path() /
                                ("ablate_bench_gpu_" + std::to_string(::getpid())))
                                   .string();
      auto trainer = ablate::Trainer::Create(run, options);
      StepClock clock(warmup);
      absl::Status status = trainer.status();
      int64_t peak = 0;
      if (status.ok()) {
        absl::StatusOr<ablate::RunSummary> summary = (*trainer)->Run(&clock);
        status = summary.status();
        if (summary.ok()) peak = summary->peak_memory_bytes();
      }
      std::filesystem::remove_all(options.checkpoint_dir);
      if (!status.ok()) {  // one shape failing (out of memory, say) leaves the others to run
        std::printf("{\"impl\":\"ablate\",\"variant\":\"%s\",\"d_model\":%d,\"error\":\"%s\"}\n",
                    variant.c_str(), s.d_model, std::string(status.message()).c_str());
        std::fflush(stdout);
        ++failures;
        continue;
      }
      const double tokens_per_s = static_cast<double>(steps) * s.batch * s.seq / clock.seconds();
      const double flops_per_token = ablate::TrainingFlopsPerToken(m, s.seq);
      const double flops = tokens_per_s * flops_per_token;
      std::printf("{\"impl\":\"ablate\",\"variant\":\"%s\",\"device\":\"%s\",\"d_model\":%d,"
                  "\"layers\":%d,\"heads\":%d,\"head_dim\":%d,\"seq\":%d,\"batch\":%d,"
                  "\"params\":%lld,\"tokens_per_s\":%.6g,\"step_ms\":%.6g,"
                  "\"flops_per_token\":%.6g,\"mfu\":%.4f,\"mfu_peak\":%.4f,\"loss\":%.4f,"
                  "\"precision\":\"%s\",\"residual\":\"%s\",\"peak_memory_bytes\":%lld,"
                  "\"planned_bytes\":%lld}\n",
                  variant.c_str(), device_name.c_str(), s.d_model, s.layers, m.num_heads(),
                  s.head_dim, s.seq, s.batch,
                  static_cast<long long>(ablate::CountParams(m).total()), tokens_per_s,
                  1e3 * clock.seconds() / steps, flops_per_token, flops / matmul,
                  peak_tflops > 0 ? flops / (peak_tflops * 1e12) : 0.0, clock.last_loss(),
                  precision.c_str(), ResidualDtype(run, device).c_str(),
                  static_cast<long long>(peak),
                  static_cast<long long>(ablate::PlanMemory(run, 1).per_device()));
      std::fflush(stdout);
    }
  }
  return failures == 0 ? 0 : 1;
}
