// One measurement for bench/train_throughput.py: the real Trainer on the default corpus, timed
// from the end of warm-up step W to the last step; or the machine's fp32 matmul FLOP/s; or two
// variants in one process, step for step (--pair). Prints one JSON line.
//
//   build/bench_train --d-model 128 --steps 20 [--variant g1_elementwise --match-ffn]
//   build/bench_train --d-model 128 --steps 8 --pair g1_elementwise --match-ffn
//   build/bench_train --d-model 128 --steps 40 --pair g1_elementwise --match-ffn --pair-blocks
//   build/bench_train --matmul
//   build/bench_train --d-model 128 --steps 8 --pair baseline --pair-checkpointing
//   build/bench_train --d-model 128 --steps 8 --pair baseline --pair-precision bf16
//   build/bench_train --d-model 128 --vocab 32768 --steps 8 --pair baseline --pair-loss-chunk 512
//   build/bench_train --d-model 128 --steps 4 --checkpointing    (prints its peak and the plan)
//
// --precision fp32|bf16 and --checkpointing set train.precision and
// train.activation_checkpointing of --variant's run (and of --pair's, unless --pair-precision or
// --pair-checkpointing say otherwise): --pair baseline --pair-checkpointing times checkpointing
// against the plain run of the same model, step for step. A single run prints its peak of tensor
// memory (the counting CPU allocator, config/memory_plan.h's figure) beside its memory plan.
//
// --pair V trains `--variant` (the baseline by default) and V side by side, each on a thread of
// its own that runs only while the other waits: A's step 1, B's step 1, A's step 2, ... Each
// step is timed from the moment its trainer gets the turn to its OnStep, and its ratio is taken
// against the other's step next to it, so the VM's drift (+-15% between runs minutes apart)
// cancels: the median of those per-step ratios is the figure, with its quartiles. Each thread
// has an OpenMP pool of its own, idle while the other steps: the ratio is fair, but a pair's
// absolute step times are not those of a run alone (an idle pool that spins, under
// OMP_WAIT_POLICY=ACTIVE, takes the cores from the other). --profile is for single runs.
//
// --pair-blocks times one transformer block (layer 0) of each model instead of whole training
// steps: forward and backward on the same random input, on the main thread, the two in turn
// (the order swapped every pair), --steps pairs after --warmup. A block is what two FFN-matched
// variants differ in: the embedding, final norm, head, loss and data are the same, and so is
// the optimizer's work (parameter counts within 1.5 d_model a layer; G1 has one more tensor per
// layer). So a step's ratio lies between 1 and the blocks' ratio, and a block takes a quarter of
// a 4-layer step or less: four times the pairs in the same minutes, for a noise that is per pair.
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/stats.h"
#include "config/memory_plan.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "worker/model/fused_ops.h"
#include "worker/model/transformer.h"
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

// The turn of two trainers that take their steps one after the other (--pair).
class Turns {
 public:
  // Blocks until it is `who`'s turn, or the other has finished.
  void Await(int who) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return turn_ == who || done_[1 - who]; });
  }
  void Pass(int from) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      turn_ = 1 - from;
    }
    cv_.notify_all();
  }
  void Finished(int who) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[who] = true;
      turn_ = 1 - who;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;
  bool done_[2] = {false, false};
};

// One side of a pair: times each of its steps from the moment it got the turn, then hands the
// turn over. After its last step it keeps the turn until its Run returns (the end of a run
// evaluates), so the two never overlap.
class PairClock : public ablate::TrainerObserver {
 public:
  PairClock(int who, Turns* turns, int warmup, int last_step)
      : who_(who), turns_(turns), warmup_(warmup), last_step_(last_step) {}
  void Begin() {
    turns_->Await(who_);
    Resume();
  }
  Directive OnStep(const ablate::StepMetrics& m) override {
    if (m.step() > warmup_) {
      wall_.push_back(std::chrono::duration<double>(Clock::now() - resumed_).count());
      cpu_.push_back(ProcessCpuSeconds() - cpu_resumed_);
    }
    if (m.step() < last_step_) {
      turns_->Pass(who_);
      turns_->Await(who_);
      Resume();
    }
    return Directive::kContinue;
  }
  const std::vector<double>& wall() const { return wall_; }
  const std::vector<double>& cpu() const { return cpu_; }

 private:
  void Resume() {
    resumed_ = Clock::now();
    cpu_resumed_ = ProcessCpuSeconds();
  }
  int who_;
  Turns* turns_;
  int warmup_, last_step_;
  Clock::time_point resumed_;
  double cpu_resumed_ = 0;
  std::vector<double> wall_, cpu_;
};

// The q-quantile of `v` (linear between neighbours).
using ablate::bench::Quantile;

// [v0,v1,...] for the JSON line: the per-step ratios, which a driver pools over rounds.
std::string JsonArray(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", absl::StrFormat("%.6g", v[i]));
  }
  return out + "]";
}

// --pair-blocks: layer 0 of each model, forward and backward on one random input, in turn; prints
// the JSON line (the ratio is b's time over a's, pair by pair).
int PairBlocks(const ablate::ModelConfig& a, const ablate::ModelConfig& b, const std::string& a_name,
               const std::string& b_name, int batch, int seq, int warmup, int pairs, int threads) {
  torch::manual_seed(0);
  ablate::Block blocks[2] = {ablate::Block(a, 0), ablate::Block(b, 0)};
  const torch::Tensor x0 = torch::randn({batch, seq, a.d_model()});
  const torch::Tensor up = torch::randn({batch, seq, a.d_model()});
  std::vector<double> wall[2], cpu[2];
  auto time_block = [&](int who, bool keep) {
    const torch::Tensor x = x0.clone().requires_grad_(true);
    blocks[who]->zero_grad();
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuSeconds();
    torch::Tensor aux = torch::zeros({});  // an MoE block adds its load-balancing loss here
    const torch::Tensor out = blocks[who]->forward(x, &aux, nullptr);
    if (aux.requires_grad()) {  // an MoE block's load-balancing loss backpropagates too
      torch::autograd::backward({out, aux}, {up, torch::ones({})});
    } else {
      out.backward(up);
    }
    if (keep) {
      wall[who].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      cpu[who].push_back(ProcessCpuSeconds() - c0);
    }
  };
  for (int i = 0; i < warmup + pairs; ++i) {
    const int first = i % 2;
    time_block(first, i >= warmup);
    time_block(1 - first, i >= warmup);
  }
  std::vector<double> ratio, cpu_ratio;
  for (int i = 0; i < pairs; ++i) {
    ratio.push_back(wall[1][i] / wall[0][i]);
    cpu_ratio.push_back(cpu[1][i] / cpu[0][i]);
  }
  std::printf(
      "{\"impl\":\"pair_blocks\",\"variant\":\"%s\",\"pair\":\"%s\",\"d_model\":%d,"
      "\"ffn\":%d,\"pair_ffn\":%d,\"block_params\":%lld,\"pair_block_params\":%lld,"
      "\"steps\":%d,\"block_ms\":%.6g,\"pair_block_ms\":%.6g,\"ratio\":%.6g,"
      "\"ratio_q1\":%.6g,\"ratio_q3\":%.6g,\"cpu_ratio\":%.6g,\"threads\":%d,"
      "\"ratios\":%s,\"cpu_ratios\":%s}\n",
      a_name.c_str(), b_name.c_str(), a.d_model(), a.ffn_dim(), b.ffn_dim(),
      static_cast<long long>(ablate::CountAllocatedParams(*blocks[0])),
      static_cast<long long>(ablate::CountAllocatedParams(*blocks[1])), pairs,
      1e3 * Quantile(wall[0], 0.5), 1e3 * Quantile(wall[1], 0.5), Quantile(ratio, 0.5),
      Quantile(ratio, 0.25), Quantile(ratio, 0.75), Quantile(cpu_ratio, 0.5), threads,
      JsonArray(ratio).c_str(), JsonArray(cpu_ratio).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ablate::KeepFreedMemoryInHeap();  // first: --pair trains on two threads of its own
  CLI::App app{"ablate training throughput, one measurement"};
  int d_model = 128, layers = 4, heads = 0, head_dim = 32, ffn = 0, batch = 16, seq = 256;
  int steps = 20, warmup = 3, pair_ffn = 0, threads = static_cast<int>(std::thread::hardware_concurrency());
  int vocab = 0, loss_chunk = 0, pair_loss_chunk = -1;
  std::string variant = "baseline", pair, device = "cpu", profile, precision = "fp32",
              pair_precision;
  bool match_ffn = false, matmul = false, pair_blocks = false, checkpointing = false,
       pair_checkpointing = false;
  app.add_option("--d-model", d_model);
  app.add_option("--layers", layers);
  app.add_option("--heads", heads, "default d_model / head_dim");
  app.add_option("--head-dim", head_dim);
  app.add_option("--ffn", ffn, "default 4 x d_model");
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first (the clock starts as the last ends)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads);
  app.add_option("--variant", variant, "a preset name");
  app.add_option("--device", device);
  app.add_option("--pair", pair,
                 "also train this preset, step for step with --variant in one process, and print "
                 "the median of its per-step time ratios to --variant's");
  app.add_option("--pair-ffn", pair_ffn, "the --pair model's FFN width, whatever --match-ffn says");
  app.add_flag("--match-ffn", match_ffn, "narrow the FFN until params match the baseline's");
  app.add_flag("--pair-blocks", pair_blocks,
               "with --pair: time one block of each model, forward and backward, --steps pairs, "
               "instead of training steps");
  app.add_flag("--matmul", matmul, "measure fp32 matmul FLOP/s instead");
  app.add_option("--precision", precision, "train.precision of the runs")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--pair-precision", pair_precision, "the --pair run's, when it differs")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--checkpointing", checkpointing, "train.activation_checkpointing of the runs");
  app.add_flag("--pair-checkpointing", pair_checkpointing,
               "the --pair run checkpointed, whatever --checkpointing says");
  app.add_option("--vocab", vocab, "model.vocab_size (default the byte-level 256)");
  app.add_option("--loss-chunk", loss_chunk, "train.loss_chunk_tokens of the runs");
  app.add_option("--pair-loss-chunk", pair_loss_chunk,
                 "the --pair run's train.loss_chunk_tokens, whatever --loss-chunk says");
  app.add_option("--profile", profile, "write a chrome://tracing profile of the run to this file");
  CLI11_PARSE(app, argc, argv);
  if (pair_blocks && (pair.empty() || device != "cpu")) {
    std::fprintf(stderr, "bench_train: --pair-blocks times the blocks of a --pair, on the CPU\n");
    return 1;
  }
  if (!pair.empty() && !profile.empty()) {
    std::fprintf(stderr, "bench_train: --profile records one run; it does not go with --pair\n");
    return 1;
  }
  torch::set_num_threads(threads);

  if (matmul) {
    std::printf("{\"impl\":\"matmul\",\"flops\":%.6g,\"threads\":%d}\n", MatmulFlops(1024, 10), threads);
    return 0;
  }
  // The run of one variant at these shapes, its FFN narrowed (--match-ffn) until its parameters
  // match the baseline's; nullopt (and why, on stderr) when the variant does not apply.
  const auto make_run = [&](const std::string& name, int ffn_dim,
                            bool is_pair) -> std::optional<ablate::RunConfig> {
    ablate::RunConfig run = ablate::DefaultRunConfig();
    ablate::ModelConfig& m = *run.mutable_model();
    m.set_d_model(d_model);
    m.set_num_layers(layers);
    m.set_head_dim(head_dim);
    m.set_num_heads(heads > 0 ? heads : d_model / head_dim);
    m.set_num_kv_heads(m.num_heads());
    m.set_ffn_dim(ffn > 0 ? ffn : 4 * d_model);
    m.set_max_seq_len(seq);
    if (vocab > 0) m.set_vocab_size(vocab);
    const int64_t baseline_params = ablate::CountParams(m).total();
    const ablate::VariantPreset* preset = ablate::FindVariantPreset(name);
    if (preset == nullptr || !preset->apply(&m).ok()) {
      std::fprintf(stderr, "bench_train: unknown or inapplicable variant %s\n", name.c_str());
      return std::nullopt;
    }
    if (match_ffn) {  // SwiGLU has three d_model x width matrices per layer
      const int64_t extra = ablate::CountParams(m).total() - baseline_params;
      m.set_ffn_dim(m.ffn_dim() - static_cast<int>((extra / layers + 3 * d_model / 2) / (3 * d_model)));
    }
    if (ffn_dim > 0) m.set_ffn_dim(ffn_dim);
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
    const std::string& p = is_pair && !pair_precision.empty() ? pair_precision : precision;
    t.set_precision(p == "bf16" ? ablate::PRECISION_BF16 : ablate::PRECISION_FP32);
    t.set_activation_checkpointing(is_pair && pair_checkpointing ? true : checkpointing);
    t.set_loss_chunk_tokens(is_pair && pair_loss_chunk >= 0 ? pair_loss_chunk : loss_chunk);
    return run;
  };
  const auto make_trainer = [&](const ablate::RunConfig& run, const std::string& dir)
      -> std::unique_ptr<ablate::Trainer> {
    ablate::TrainerOptions options;
    options.checkpoint_dir = dir;
    auto trainer = ablate::Trainer::Create(run, options);
    if (!trainer.ok()) {
      std::fprintf(stderr, "bench_train: %s\n", std::string(trainer.status().message()).c_str());
      return nullptr;
    }
    return *std::move(trainer);
  };
  const std::string scratch = (std::filesystem::temp_directory_path() /
                               ("ablate_bench_train_" + std::to_string(::getpid()))).string();
  const double tokens_per_step = static_cast<double>(batch) * seq;

  if (!pair.empty()) {
    const std::optional<ablate::RunConfig> runs[2] = {make_run(variant, 0, false),
                                                       make_run(pair, pair_ffn, true)};
    if (!runs[0] || !runs[1]) return 1;
    if (pair_blocks) {
      return PairBlocks(runs[0]->model(), runs[1]->model(), variant, pair, batch, seq, warmup,
                        steps, threads);
    }
    std::unique_ptr<ablate::Trainer> trainers[2] = {make_trainer(*runs[0], scratch + "_a"),
                                                    make_trainer(*runs[1], scratch + "_b")};
    if (!trainers[0] || !trainers[1]) return 1;
    Turns turns;
    PairClock clocks[2] = {{0, &turns, warmup, warmup + steps}, {1, &turns, warmup, warmup + steps}};
    absl::Status failed[2];
    std::vector<std::thread> sides;
    for (int who = 0; who < 2; ++who) {
      sides.emplace_back([&, who] {
        torch::set_num_threads(threads);  // a per-thread setting under OpenMP
        clocks[who].Begin();
        auto summary = trainers[who]->Run(&clocks[who]);
        if (!summary.ok()) {
          failed[who] = summary.status();
        } else if (summary->state() != ablate::SUCCEEDED) {  // diverged: fewer steps timed
          failed[who] = absl::AbortedError(
              absl::StrCat(who ? pair : variant, " ended ", ablate::RunState_Name(summary->state()),
                           " at step ", summary->steps_done(), ": ", summary->reason()));
        }
        turns.Finished(who);
      });
    }
    for (std::thread& side : sides) side.join();
    std::filesystem::remove_all(scratch + "_a");
    std::filesystem::remove_all(scratch + "_b");
    for (const absl::Status& status : failed) {
      if (!status.ok()) {
        std::fprintf(stderr, "bench_train: %s\n", std::string(status.message()).c_str());
        return 1;
      }
    }
    const std::vector<double>&a = clocks[0].wall(), &b = clocks[1].wall();
    if (a.size() != static_cast<size_t>(steps) || b.size() != static_cast<size_t>(steps)) {
      std::fprintf(stderr, "bench_train: timed %zu and %zu steps, not %d each\n", a.size(),
                   b.size(), steps);
      return 1;
    }
    const std::vector<double>&ca = clocks[0].cpu(), &cb = clocks[1].cpu();
    std::vector<double> ratio, cpu_ratio;
    for (size_t i = 0; i < a.size(); ++i) {
      ratio.push_back(b[i] / a[i]);
      cpu_ratio.push_back(cb[i] / ca[i]);
    }
    std::printf(
        "{\"impl\":\"pair\",\"variant\":\"%s\",\"pair\":\"%s\",\"d_model\":%d,"
        "\"ffn\":%d,\"pair_ffn\":%d,\"params\":%lld,\"pair_params\":%lld,\"steps\":%zu,"
        "\"step_ms\":%.6g,\"pair_step_ms\":%.6g,\"tokens_per_s\":%.6g,"
        "\"pair_tokens_per_s\":%.6g,\"ratio\":%.6g,\"ratio_q1\":%.6g,\"ratio_q3\":%.6g,"
        "\"cpu_ms\":%.6g,\"pair_cpu_ms\":%.6g,\"cpu_ratio\":%.6g,\"threads\":%d,"
        "\"ratios\":%s,\"cpu_ratios\":%s}\n",
        variant.c_str(), pair.c_str(), d_model, runs[0]->model().ffn_dim(),
        runs[1]->model().ffn_dim(),
        static_cast<long long>(ablate::CountParams(runs[0]->model()).total()),
        static_cast<long long>(ablate::CountParams(runs[1]->model()).total()), ratio.size(),
        1e3 * Quantile(a, 0.5), 1e3 * Quantile(b, 0.5), tokens_per_step / Quantile(a, 0.5),
        tokens_per_step / Quantile(b, 0.5), Quantile(ratio, 0.5), Quantile(ratio, 0.25),
        Quantile(ratio, 0.75), 1e3 * Quantile(ca, 0.5), 1e3 * Quantile(cb, 0.5),
        Quantile(cpu_ratio, 0.5), threads, JsonArray(ratio).c_str(), JsonArray(cpu_ratio).c_str());
    return 0;
  }

  const std::optional<ablate::RunConfig> run = make_run(variant, 0, false);
  if (!run) return 1;
  const ablate::ModelConfig& m = run->model();
  std::unique_ptr<ablate::Trainer> trainer = make_trainer(*run, scratch);
  if (!trainer) return 1;
  StepClock clock(warmup);
  std::unique_ptr<torch::autograd::profiler::RecordProfile> recording;
  if (!profile.empty()) recording = std::make_unique<torch::autograd::profiler::RecordProfile>(profile);
  auto summary = trainer->Run(&clock);
  recording.reset();
  std::filesystem::remove_all(scratch);
  if (!summary.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  const double tps = tokens_per_step * steps / clock.seconds();
  std::printf("{\"impl\":\"ablate\",\"variant\":\"%s\",\"d_model\":%d,\"ffn\":%d,\"params\":%lld,"
              "\"tokens_per_s\":%.6g,\"step_ms\":%.6g,\"cpu_ms\":%.6g,\"flops_per_token\":%.6g,"
              "\"threads\":%d,\"kernel_threads\":%d,\"precision\":\"%s\",\"checkpointing\":%s,"
              "\"peak_memory_bytes\":%lld,\"planned_bytes\":%lld}\n",
              variant.c_str(), d_model, m.ffn_dim(),
              static_cast<long long>(ablate::CountParams(m).total()), tps,
              1e3 * clock.seconds() / steps, 1e3 * clock.cpu_seconds() / steps,
              ablate::TrainingFlopsPerToken(m, seq), threads, ablate::KernelThreads(),
              precision.c_str(), checkpointing ? "true" : "false",
              static_cast<long long>(summary->peak_memory_bytes()),
              static_cast<long long>(ablate::PlanMemory(*run, 1).per_device()));
  return 0;
}
