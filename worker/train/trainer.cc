#include "worker/train/trainer.h"

#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "worker/model/torch_compat.h"
#include "worker/model/transformer.h"
#include "worker/train/checkpoint.h"
#include "worker/train/collective.h"
#include "worker/train/data.h"
#include "worker/train/eval_tasks.h"
#include "worker/train/evaluation.h"
#include "worker/train/optimizer.h"
#include "worker/train/spike.h"

namespace ablate {

namespace fs = std::filesystem;

void KeepFreedMemoryInHeap() {
#ifdef M_MMAP_THRESHOLD
  static const bool done = [] {
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);  // never (mallopt(3)); INT_MAX still trims a top over 2 GiB
    mallopt(M_TOP_PAD, 64 << 20);
    return true;
  }();
  (void)done;
#endif
}

struct Trainer::State {
  RunConfig config;
  TrainerOptions options;
  torch::Device device{torch::kCPU};
  bool autocast = false;
  TokenData data;
  Transformer model{nullptr};
  std::unique_ptr<TrainingOptimizer> optimizer;  // replicated, or sharded (shard_optimizer)
  std::vector<torch::Tensor> params;
  std::unique_ptr<CheckpointArchive> checkpoints;  // in options.checkpoint_dir

  TrainingProgress progress;
  // When this attempt's clock started (Run).
  std::chrono::steady_clock::time_point session_start = std::chrono::steady_clock::now();
  // Training seconds of every attempt up to now.
  double Elapsed() const {
    return progress.elapsed_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - session_start).count();
  }
  std::unique_ptr<SpikeMonitor> monitor;
  EvalResult last_eval;
  // Checkpoints found unreadable by Create, for Run to report (OnNotice).
  std::vector<std::string> notices;
  // TrainConfig.init_from: what Build() loaded from it (for the notice at step 0).
  std::string init_from_summary;
  // Data parallel (TrainerOptions.world_size > 1); null for one process.
  std::unique_ptr<Collective> dist;

  // The CUDA device's index ("cuda" is device 0).
  int CudaIndex() const { return device.has_index() ? device.index() : 0; }
  // Rank 0 (or the only process): evaluates, writes checkpoints, reports.
  bool Writer() const { return dist == nullptr || dist->rank() == 0; }
  // True on every rank when it is true on any.
  bool AnyRank(bool value) {
    if (dist == nullptr) return value;
    torch::Tensor flag = torch::tensor({value ? 1.0f : 0.0f});
    dist->AllReduceMax(flag);
    return flag.item<float>() > 0;
  }
  // Every rank at the same step after a load (resume, rollback): else they read different files.
  absl::Status CheckRanksAgree(const char* when) {
    if (dist == nullptr) return absl::OkStatus();
    const int64_t step = progress.step;
    torch::Tensor bounds =
        torch::tensor({static_cast<double>(step), -static_cast<double>(step)}, torch::kFloat64);
    dist->AllReduceMax(bounds);
    if (bounds[0].item<double>() != -bounds[1].item<double>()) {
      return absl::DataLossError(absl::StrCat(
          when, ": the ranks loaded checkpoints of different steps (", -bounds[1].item<double>(),
          " to ", bounds[0].item<double>(), ") from ", options.checkpoint_dir));
    }
    return absl::OkStatus();
  }

  explicit State(TokenData d) : data(std::move(d)) {}

  int64_t TokensPerStep() const {
    const TrainConfig& t = config.train();
    return static_cast<int64_t>(t.batch_size()) * t.seq_len() * t.grad_accum();
  }

  // This rank's rows of training batch `index`: all of them for one process.
  std::pair<torch::Tensor, torch::Tensor> GetTrainBatch(int64_t index) {
    auto [x, y] = GetBatch(data, config.train(), TokenData::Split::kTrain, index, device);
    if (dist == nullptr) return {x, y};
    const int64_t rows = x.size(0) / dist->world_size(), first = dist->rank() * rows;
    return {x.slice(0, first, first + rows), y.slice(0, first, first + rows)};
  }

  // A fresh model and optimizer from the run's seed, and no progress: the state of step 0.
  absl::Status Build() {
    const TrainConfig& t = config.train();
    try {
      torch::manual_seed(t.seed());
      model = Transformer(config.model());
      model->to(device);
      if (t.precision() == PRECISION_BF16) {
        if (absl::Status s = compat::Bf16ProductSelfTest(device); !s.ok()) return s;
        model->SetComputeDtype(torch::kBFloat16);
      }
      model->SetActivationCheckpointing(t.activation_checkpointing());
      if (dist != nullptr) {  // the global-batch balance loss counts every rank's assignments
        Collective* c = dist.get();
        model->SetCountReducer([c](torch::Tensor& counts) { c->AllReduceSum(counts); });
      }
      // Weight decay on matrices only; never on norm weights or input-independent gate thetas.
      std::vector<bool> decays;
      params.clear();
      for (const auto& p : model->named_parameters()) {
        const bool is_theta = p.key().find("theta") != std::string::npos;
        decays.push_back(p.value().dim() >= 2 && !is_theta);
        params.push_back(p.value());
      }
      optimizer = MakeTrainingOptimizer(params, decays, t, dist.get(), kShardBucketElements,
                                        model->ParameterLayers());
      if (t.shard_gradients()) {  // ZeRO-2: each block's gradients reduced as its backward ends
        TrainingOptimizer* o = optimizer.get();
        model->SetGradientsDone([o](int layer) { o->GradientsDone(layer); });
      }
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("building the model: ", e.what_without_backtrace()));
    }
    progress = TrainingProgress();
    checkpoints->Forget();
    RebuildMonitor();
    if (!t.init_from().checkpoint().empty()) {
      double out_scale = 1.0;
      if (t.init_from().preserve_function()) {
        absl::StatusOr<double> start = GateStartScore(config.model());
        if (!start.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("train.init_from.preserve_function: ", start.status().message()));
        }
        out_scale = 1.0 / *start;
      }
      absl::StatusOr<std::string> loaded =
          InitFromCheckpoint(t.init_from().checkpoint(), device, *model, out_scale);
      if (!loaded.ok()) return loaded.status();
      init_from_summary = *std::move(loaded);
      return absl::OkStatus();
    }
    if (!t.init_from().sweep().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.init_from: sweep \"", t.init_from().sweep(),
          "\" is resolved to a checkpoint by the coordinator at submit; without one, give "
          "train.init_from.checkpoint: PATH"));
    }
    return absl::OkStatus();
  }

  void RebuildMonitor() {
    monitor = std::make_unique<SpikeMonitor>(config.train().spike(), config.train().steps());
    for (size_t i = 0; i < progress.loss_history.size(); ++i) {
      monitor->Observe(static_cast<int64_t>(i) + 1, progress.loss_history[i],
                       progress.grad_history[i]);
    }
  }

  // Loads `path` into the current model, optimizer and progress; DataLoss when it cannot be
  // read. The state is then part loaded: Build() again.
  absl::Status LoadCheckpoint(const std::string& path) {
    if (absl::Status st = checkpoints->Load(path, device, *model, *optimizer, &progress);
        !st.ok()) {
      return st;
    }
    session_start = std::chrono::steady_clock::now();
    RebuildMonitor();
    return absl::OkStatus();
  }

  // The newest checkpoint that loads (CheckpointArchive::LoadNewestGood), else step 0.
  absl::Status LoadNewestGoodCheckpoint(std::vector<std::string>* notices) {
    return checkpoints->LoadNewestGood(
        Writer(), [this](const std::string& path) { return LoadCheckpoint(path); },
        [this] { return Build(); }, notices);
  }

  absl::Status SaveCheckpoint() {
    return checkpoints->Save(Writer(), *model, *optimizer, progress, Elapsed());
  }

  // One step's losses, each the mean over its micro-batches (and over the ranks).
  struct StepLoss {
    double loss = 0;
    double aux = 0;
  };

  // Forward and backward over the grad_accum micro-batches of 1-based `step`, leaving this
  // rank's gradients on the parameters (the optimizer averages them over the ranks).
  StepLoss ForwardBackward(int64_t step) {
    const TrainConfig& t = config.train();
    optimizer->ZeroGrad();
    model->BeginStep();  // the global-batch balance loss counts this step's micro-batches
    double loss_sum = 0, aux_sum = 0;
    for (int micro = 0; micro < t.grad_accum(); ++micro) {
      auto [x, y] = GetTrainBatch((step - 1) * t.grad_accum() + micro + progress.data_offset);
      torch::Tensor aux;
      const torch::Tensor loss =
          ModelLoss(*model, x, y, t.loss_chunk_tokens(), autocast, nullptr, &aux);
      ((loss + aux) / t.grad_accum()).backward();
      optimizer->BackwardDone();
      loss_sum += loss.item<double>();
      aux_sum += aux.item<double>();
    }
    if (dist != nullptr) {  // the mean over ranks: what one process would compute
      torch::Tensor sums = torch::tensor({loss_sum, aux_sum}, torch::kFloat64);
      dist->AllReduceSum(sums);
      loss_sum = sums[0].item<double>() / dist->world_size();
      aux_sum = sums[1].item<double>() / dist->world_size();
    }
    return {loss_sum / t.grad_accum(), aux_sum / t.grad_accum()};
  }

  // Averages the gradients over the ranks and clips them to optimizer.grad_clip (0: no
  // clipping); returns their norm before.
  double ReduceAndClipGradients() {
    const double clip = config.train().optimizer().grad_clip();
    const double max_norm = clip > 0 ? clip : std::numeric_limits<double>::infinity();
    return optimizer->ReduceAndClip(max_norm);
  }

  // A step taken (its update applied or skipped): progress and the detectors' history.
  void RecordStep(int64_t taken, double loss, double grad_norm) {
    progress.step = taken;
    progress.loss_history.push_back(loss);
    progress.grad_history.push_back(grad_norm);
  }

  // Whether the run ends after this step, the same on every rank: a stop (rank 0's observer)
  // or an interrupt (any rank's signal) is every rank's.
  struct StepEnd {
    bool stop = false;
    bool interrupted = false;
  };
  StepEnd AgreeOnEnd(bool stop) {
    StepEnd end{stop, options.interrupt != nullptr && options.interrupt->load()};
    if (dist != nullptr) {
      torch::Tensor flags = torch::tensor({end.stop ? 1.0f : 0.0f, end.interrupted ? 1.0f : 0.0f});
      dist->AllReduceMax(flags);
      end.stop = flags[0].item<float>() > 0;
      end.interrupted = flags[1].item<float>() > 0;
    }
    return end;
  }

  // The mean of the finite training losses among the last 50 steps (NaN when none is).
  double FinalTrainLoss() const {
    const std::vector<double>& losses = progress.loss_history;
    const size_t n = std::min<size_t>(50, losses.size());
    double sum = 0;
    int finite = 0;
    for (size_t i = losses.size() - n; i < losses.size(); ++i) {
      if (std::isfinite(losses[i])) sum += losses[i], ++finite;
    }
    return finite ? sum / finite : std::numeric_limits<double>::quiet_NaN();
  }

  struct Session;

  // PaLM's remedy for a spike at `spike_step` (SPIKE_ROLLBACK): back to the last checkpoint, past
  // the batches between it and the spike and the configured extra, keeping the run's spike and
  // rollback counts. Marks the verdict's rolled-back events with the step returned to. An
  // unreadable checkpoint is moved aside and noted in *notices, as at resume.
  absl::Status RollBack(int64_t spike_step, SpikeMonitor::Verdict* verdict,
                        std::vector<std::string>* notices) {
    const TrainConfig& t = config.train();
    const int64_t kept_spike_steps = progress.spike_steps;
    const int64_t kept_rollbacks = progress.rollbacks + 1;
    if (absl::Status st = LoadNewestGoodCheckpoint(notices); !st.ok()) return st;
    if (absl::Status st = CheckRanksAgree("rollback"); !st.ok()) return st;
    progress.data_offset +=
        (spike_step - progress.step) * t.grad_accum() + t.spike().rollback_skip_batches();
    progress.rollbacks = kept_rollbacks;
    progress.spike_steps = kept_spike_steps;
    for (SpikeEvent& e : verdict->events) {
      if (e.action() == SPIKE_ACTION_ROLLED_BACK) e.set_rollback_to_step(progress.step);
    }
    return absl::OkStatus();
  }
};

// One call of Run: the observer it reports to, and when it started.
struct Trainer::State::Session {
  State& s;
  TrainerObserver* obs;
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  static constexpr const char* kStopped = "stopped by directive";

  // The summary of a run that ends here as `state`.
  RunSummary Finish(RunState state, std::string reason) const {
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    RunSummary summary;
    *summary.mutable_params() = CountParams(s.config.model());
    summary.set_state(state);
    summary.set_reason(std::move(reason));
    summary.set_steps_done(s.progress.step);
    summary.set_final_train_loss(s.FinalTrainLoss());
    if (s.last_eval.step() > 0 || s.last_eval.has_probes()) {
      *summary.mutable_final_eval() = s.last_eval;
    }
    summary.set_spike_steps(s.progress.spike_steps);
    summary.set_spike_score(
        s.progress.step > 0 ? static_cast<double>(s.progress.spike_steps) / s.progress.step : 0.0);
    // Training seconds and the mean tokens/s over every attempt of the run (the elapsed time a
    // checkpoint carries on), not only this one's.
    const double trained = std::max(wall, s.Elapsed());
    summary.set_wall_s(trained);
    summary.set_tokens_per_s(trained > 0 ? s.progress.step * s.TokensPerStep() / trained : 0.0);
    // What it cost: this process's peak of tensor memory (rank 0's in a data-parallel run), and
    // the FLOPs of every step it has taken, over all its attempts.
    summary.set_peak_memory_bytes(s.device.is_cuda() ? compat::CudaTensorMemory(s.CudaIndex()).peak
                                                     : compat::CpuTensorMemory().peak);
    summary.set_flops(static_cast<double>(s.progress.step) *
                      static_cast<double>(s.TokensPerStep()) *
                      TrainingFlopsPerToken(s.config.model(), s.config.train().seq_len()));
    return summary;
  }

  // Writes a checkpoint unless the observer stops the run first. Rank 0 asks and writes; every
  // rank learns whether the run stops here. Returns the run's end when it stops or the write
  // fails; nullopt when training goes on.
  std::optional<absl::StatusOr<RunSummary>> Checkpoint() {
    const bool stop = s.AnyRank(s.Writer() && obs->BeforeCheckpoint(s.progress.step) ==
                                                  TrainerObserver::Directive::kStop);
    if (stop) return Finish(CANCELLED, kStopped);
    if (absl::Status st = s.SaveCheckpoint(); !st.ok()) return st;
    if (s.Writer()) obs->OnCheckpoint(s.progress.step, s.checkpoints->Path());
    return std::nullopt;
  }

  // Back to the last checkpoint after a spike at `step`, reporting what the rollback found and
  // the spike's events.
  absl::Status RollBack(int64_t step, SpikeMonitor::Verdict* verdict) {
    std::vector<std::string> notices;
    if (absl::Status st = s.RollBack(step, verdict, &notices); !st.ok()) return st;
    Notify(&notices);
    for (const SpikeEvent& e : verdict->events) obs->OnSpike(e);
    return absl::OkStatus();
  }

  // Reports each of *lines as a notice, and clears them.
  void Notify(std::vector<std::string>* lines) {
    for (const std::string& line : *lines) obs->OnNotice(line);
    lines->clear();
  }

  // Speed over the step that just ended: the tokens of one step over the time since
  // *window_start, which becomes now.
  double TokensPerSecond(std::chrono::steady_clock::time_point* window_start) const {
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - *window_start).count();
    *window_start = now;
    return dt > 0 ? s.TokensPerStep() / dt : 0.0;
  }
};

Trainer::Trainer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Trainer::~Trainer() = default;

int64_t Trainer::step() const { return state_->progress.step; }

double Trainer::LearningRate(const OptimizerConfig& o, int64_t step, int64_t total_steps) {
  if (step <= o.warmup_steps()) {
    return o.lr() * static_cast<double>(step) / std::max(1, o.warmup_steps());
  }
  const double progress = static_cast<double>(step - o.warmup_steps()) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - o.warmup_steps()));
  return o.min_lr() +
         0.5 * (o.lr() - o.min_lr()) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const RunConfig& config,
                                                         TrainerOptions options) {
  if (absl::Status s = ValidateRunConfig(config); !s.ok()) return s;
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("trainer: a checkpoint directory is required");
  }
  const TrainConfig& t = config.train();
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: rank ", options.rank,
                                                   " is outside a world of ", options.world_size));
  }
  if (absl::Status split = CheckBatchSplits(t, options.world_size); !split.ok()) return split;
  if (options.stop_at_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: stop_at_step ", options.stop_at_step, " is negative"));
  }
  absl::StatusOr<TokenData> data =
      TokenData::Load(t.data(), config.model().vocab_size(), t.seq_len());
  if (!data.ok()) return data.status();
  // What train.evals needs of the data (passkey: bytes), before training rather than at the
  // first evaluation.
  if (absl::Status evals = CheckEvalTasksData(*data, config); !evals.ok()) return evals;
  if (t.eval_seq_lens_size() > 0) {
    const int32_t longest = *std::max_element(t.eval_seq_lens().begin(), t.eval_seq_lens().end());
    const int64_t span = EvalLengthSpan(t);
    if (data->val_tokens() < span + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.eval_seq_lens: every length is measured on eval_batches x batch_size windows of "
          "the longest (",
          t.eval_batches(), " x ", t.batch_size(), " x ", longest, " = ", span,
          " tokens), which needs ", span + 1, " validation tokens; ", data->source(), " holds ",
          data->val_tokens(), " (fewer eval_batches, or a larger val_fraction)"));
    }
  }

  auto s = std::make_unique<State>(std::move(*data));
  s->config = config;
  s->options = std::move(options);
  s->checkpoints = std::make_unique<CheckpointArchive>(s->options.checkpoint_dir);
  try {
    s->device = torch::Device(t.device());
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("train.device: ", e.what_without_backtrace()));
  }
  if (s->device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "train.device: ", t.device(), " requested but this LibTorch build has no CUDA device"));
  }
  if (s->device.is_cuda() && s->device.has_index() &&
      s->device.index() >= static_cast<int>(torch::cuda::device_count())) {
    return absl::FailedPreconditionError(
        absl::StrCat("train.device: ", t.device(), " does not exist (", torch::cuda::device_count(),
                     " CUDA devices)"));
  }
  s->autocast = t.precision() == PRECISION_BF16_AUTOCAST && s->device.is_cuda();
  KeepFreedMemoryInHeap();
  compat::CountCpuTensorMemory();  // RunSummary.peak_memory_bytes
  // threads 0 = all cores, shared between the ranks of this machine.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  torch::set_num_threads(
      t.threads() > 0 ? t.threads() : std::max(1, static_cast<int>(cores) / s->options.world_size));

  if (s->options.world_size > 1) {
    CollectiveOptions c;
    c.rank = s->options.rank;
    c.world_size = s->options.world_size;
    c.rendezvous = s->options.rendezvous;
    c.device = t.device();
    c.timeout = s->options.collective_timeout;
    absl::StatusOr<std::unique_ptr<Collective>> dist = Collective::Connect(c);
    if (!dist.ok()) return dist.status();
    s->dist = *std::move(dist);
  }
  if (absl::Status built = s->Build(); !built.ok()) return built;
  if (s->options.resume) {
    if (absl::Status st = s->LoadNewestGoodCheckpoint(&s->notices); !st.ok()) return st;
  }
  try {
    if (absl::Status st = s->CheckRanksAgree("resume"); !st.ok()) return st;
    if (s->dist != nullptr) s->dist->BroadcastParameters(s->params);  // one start on every rank
  } catch (const c10::Error& e) {
    return absl::UnavailableError(
        absl::StrCat("data parallel start: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("data parallel start: ", e.what()));
  }
  if (s->progress.step == 0 && !s->init_from_summary.empty())
    s->notices.push_back(s->init_from_summary);
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

absl::StatusOr<RunSummary> Trainer::Run(TrainerObserver* observer) {
  State& s = *state_;
  const TrainConfig& t = s.config.train();
  const SpikePolicy policy = t.spike().policy();
  TrainerObserver null_observer;
  State::Session session{s, observer != nullptr ? observer : &null_observer};
  session.Notify(&s.notices);
  s.session_start = session.started;
  if (s.device.is_cuda()) {
    compat::ResetCudaTensorPeak(s.CudaIndex());
  } else {
    compat::ResetCpuTensorPeak();
  }

  try {
    if (policy == SPIKE_ROLLBACK && s.AnyRank(s.Writer() && !fs::exists(s.checkpoints->Path()))) {
      if (auto end = session.Checkpoint()) return *std::move(end);  // something to roll back to
    }
    s.model->train();
    auto window_start = std::chrono::steady_clock::now();
    while (s.progress.step < t.steps()) {
      const int64_t step = s.progress.step + 1;
      const double lr = LearningRate(t.optimizer(), step, t.steps());
      s.optimizer->SetLearningRate(lr);
      const State::StepLoss loss = s.ForwardBackward(step);
      const double grad_norm = s.ReduceAndClipGradients();

      // Spike and divergence detection happens before the update, so a policy can still skip it.
      SpikeMonitor::Verdict verdict = s.monitor->Observe(step, loss.loss, grad_norm);
      const SpikeDecision decision = ApplySpikePolicy(policy, s.progress.rollbacks, &verdict);
      if (verdict.spike || verdict.nonfinite) ++s.progress.spike_steps;
      if (decision.roll_back) {
        if (absl::Status st = session.RollBack(step, &verdict); !st.ok()) return st;
        continue;
      }
      const bool skipped = decision.skip || verdict.diverged;
      if (!skipped) s.optimizer->Step();
      s.RecordStep(step, loss.loss, grad_norm);
      for (const SpikeEvent& e : verdict.events) session.obs->OnSpike(e);

      StepMetrics m;
      m.set_step(step);
      m.set_loss(loss.loss);
      m.set_grad_norm(grad_norm);
      m.set_lr(lr);
      m.set_aux_loss(loss.aux);
      m.set_skipped(skipped);
      m.set_tokens_per_s(session.TokensPerSecond(&window_start));
      m.set_elapsed_s(s.Elapsed());
      const State::StepEnd end =
          s.AgreeOnEnd(session.obs->OnStep(m) == TrainerObserver::Directive::kStop);

      if (verdict.diverged) return session.Finish(DIVERGED, verdict.reason);
      if (end.stop) return session.Finish(CANCELLED, State::Session::kStopped);
      const bool last = step == t.steps();
      const bool pause = step == s.options.stop_at_step && !last;         // a rung
      if ((step % t.eval_every() == 0 || last || pause) && s.Writer()) {  // the other ranks wait
        absl::StatusOr<EvalResult> eval =
            Evaluate(*s.model, s.data, s.config, s.device, s.autocast, step);
        if (!eval.ok()) {
          return absl::Status(eval.status().code(), absl::StrCat("evaluation at step ", step, ": ",
                                                                 eval.status().message()));
        }
        s.last_eval = *std::move(eval);
        session.obs->OnEval(s.last_eval);
      }
      if ((t.checkpoint_every() > 0 && step % t.checkpoint_every() == 0) || last || pause) {
        if (auto stopped = session.Checkpoint()) return *std::move(stopped);
      }
      if (pause) {
        return session.Finish(INTERRUPTED,
                              absl::StrCat("paused at step ", step, "; checkpoint written"));
      }
      if (end.interrupted && !last) {
        if (auto stopped = session.Checkpoint()) return *std::move(stopped);
        return session.Finish(INTERRUPTED,
                              absl::StrCat("interrupted at step ", step, "; checkpoint written"));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("training step ", s.progress.step + 1, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {  // a collective's peer lost (Gloo throws its own errors)
    return absl::InternalError(absl::StrCat("training step ", s.progress.step + 1, ": ", e.what()));
  }
  return session.Finish(SUCCEEDED, "");
}

}  // namespace ablate
