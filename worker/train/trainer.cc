#include "worker/train/trainer.h"

#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/durable_file.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "worker/train/collective.h"
#include "worker/train/data.h"
#include "worker/model/chunked_loss.h"
#include "worker/model/probes.h"
#include "worker/model/torch_compat.h"
#include "worker/model/transformer.h"
#include "worker/train/optimizer.h"
#include "worker/train/spike.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

// bf16 autocast on CUDA for the forward pass; a no-op elsewhere (CPU bf16 matmuls are slower than
// fp32 on most CPUs).
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled) : enabled_(enabled) {
    if (enabled_) compat::SetCudaAutocast(true, at::kBFloat16);
  }
  ~AutocastGuard() {
    if (enabled_) compat::SetCudaAutocast(false);  // clears autocast's cast cache too
  }

 private:
  bool enabled_;
};

}  // namespace

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

  // Run progress; all of it is in the checkpoint.
  int64_t step = 0;         // optimizer steps taken
  int64_t data_offset = 0;  // train batch index = (step - 1) * grad_accum + micro + data_offset
  int64_t rollbacks = 0;
  int64_t spike_steps = 0;
  int64_t checkpoint_step = -1;  // of checkpoint.pt, as this process last wrote or read it
  // Training seconds of the attempts before this one (StepMetrics.elapsed_s), and when this
  // one's clock started (Run).
  double elapsed_before = 0;
  std::chrono::steady_clock::time_point session_start = std::chrono::steady_clock::now();
  double Elapsed() const {
    return elapsed_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - session_start).count();
  }
  std::vector<double> loss_history, grad_history;  // per step, to rebuild the detectors
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
    torch::Tensor bounds = torch::tensor({static_cast<double>(step), -static_cast<double>(step)},
                                         torch::kFloat64);
    dist->AllReduceMax(bounds);
    if (bounds[0].item<double>() != -bounds[1].item<double>()) {
      return absl::DataLossError(absl::StrCat(
          when, ": the ranks loaded checkpoints of different steps (", -bounds[1].item<double>(),
          " to ", bounds[0].item<double>(), ") from ", options.checkpoint_dir));
    }
    return absl::OkStatus();
  }

  explicit State(TokenData d) : data(std::move(d)) {}

  std::string CheckpointPath() const {
    return (fs::path(options.checkpoint_dir) / "checkpoint.pt").string();
  }
  // The checkpoint CheckpointPath() replaced: the fallback when that one cannot be read.
  std::string PreviousCheckpointPath() const {
    return (fs::path(options.checkpoint_dir) / "checkpoint.prev.pt").string();
  }
  int64_t TokensPerStep() const {
    const TrainConfig& t = config.train();
    return static_cast<int64_t>(t.batch_size()) * t.seq_len() * t.grad_accum();
  }

  // Inputs and targets of one batch of windows of `seq_len` tokens (0: train.seq_len), on the
  // device.
  std::pair<torch::Tensor, torch::Tensor> GetBatch(TokenData::Split split, int64_t index,
                                                   int64_t seq_len = 0) {
    const TrainConfig& t = config.train();
    const int64_t len = seq_len > 0 ? seq_len : t.seq_len();
    torch::Tensor x = torch::empty({t.batch_size(), len}, torch::kLong);
    torch::Tensor y = torch::empty({t.batch_size(), len}, torch::kLong);
    data.Batch(split, index, t.batch_size(), len, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    return {x.to(device), y.to(device)};
  }
  // This rank's rows of training batch `index`: all of them for one process.
  std::pair<torch::Tensor, torch::Tensor> GetTrainBatch(int64_t index) {
    auto [x, y] = GetBatch(TokenData::Split::kTrain, index);
    if (dist == nullptr) return {x, y};
    const int64_t rows = x.size(0) / dist->world_size(), first = dist->rank() * rows;
    return {x.slice(0, first, first + rows), y.slice(0, first, first + rows)};
  }

  // The model's mean cross-entropy on tokens x against targets y (and its auxiliary loss into
  // *aux when given): from the whole logits, or train.loss_chunk_tokens of them at a time, in
  // training and in evaluation alike.
  torch::Tensor ForwardLoss(const torch::Tensor& x, const torch::Tensor& y,
                            ProbeRecorder* probes = nullptr, torch::Tensor* aux = nullptr) {
    const int64_t chunk = config.train().loss_chunk_tokens();
    TransformerImpl::Output out = model->forward(x, probes, /*logits=*/chunk == 0);
    if (aux != nullptr) *aux = out.aux_loss.to(torch::kFloat32);
    if (chunk == 0) {
      return torch::cross_entropy_loss(
          out.logits.reshape({-1, out.logits.size(-1)}).to(torch::kFloat32), y.reshape({-1}));
    }
    // The logits in the dtype autocast would give them.
    const torch::Tensor hidden = out.hidden.reshape({-1, out.hidden.size(-1)});
    return ChunkedCrossEntropy(hidden, model->OutputWeight(), y.reshape({-1}), chunk,
                               autocast ? torch::kBFloat16 : hidden.scalar_type());
  }

  // A fresh model and optimizer from the run's seed, and no progress: the state of step 0.
  absl::Status Build() {
    const TrainConfig& t = config.train();
    try {
      torch::manual_seed(t.seed());
      model = Transformer(config.model());
      model->to(device);
      if (t.precision() == PRECISION_BF16) model->SetComputeDtype(torch::kBFloat16);
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
    step = data_offset = rollbacks = spike_steps = 0;
    checkpoint_step = -1;
    elapsed_before = 0;
    loss_history.clear();
    grad_history.clear();
    RebuildMonitor();
    if (!t.init_from().checkpoint().empty()) return InitFrom(t.init_from().checkpoint());
    if (!t.init_from().sweep().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.init_from: sweep \"", t.init_from().sweep(),
          "\" is resolved to a checkpoint by the coordinator at submit; without one, give "
          "train.init_from.checkpoint: PATH"));
    }
    return absl::OkStatus();
  }

  // The source checkpoint's model tensors, by dotted name (its archive nests a module's children).
  static void ListTensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                          std::map<std::string, torch::Tensor>* out) {
    for (const std::string& key : archive.keys()) {
      torch::Tensor tensor;
      if (archive.try_read(key, tensor)) {
        (*out)[prefix + key] = tensor;
        continue;
      }
      torch::serialize::InputArchive child;
      if (archive.try_read(key, child)) ListTensors(child, prefix + key + ".", out);
    }
  }

  // Continued training (TrainConfig.init_from): the parameters of the checkpoint at `path` are
  // copied into the fresh model by name. A parameter the new config adds keeps its fresh
  // initialisation (listed in init_from_summary); one the source has and the new model lacks,
  // or a shape that differs, is InvalidArgument; an unreadable file is NotFound or DataLoss.
  absl::Status InitFrom(const std::string& path) {
    if (!fs::exists(path)) {
      return absl::NotFoundError(absl::StrCat("train.init_from.checkpoint: no file ", path));
    }
    std::map<std::string, torch::Tensor> source;
    try {
      torch::serialize::InputArchive archive, model_archive;
      archive.load_from(path, device);
      archive.read("model", model_archive);
      ListTensors(model_archive, "", &source);
    } catch (const c10::Error& e) {
      return absl::DataLossError(absl::StrCat("train.init_from.checkpoint: ", path,
                                              " is not a readable checkpoint: ",
                                              e.what_without_backtrace()));
    }
    std::set<std::string> buffers;
    for (const auto& b : model->named_buffers()) buffers.insert(b.key());
    std::vector<std::string> fresh, dropped;
    std::set<std::string> used;
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      auto it = source.find(p.key());
      if (it == source.end()) {
        fresh.push_back(p.key());
        continue;
      }
      if (it->second.sizes() != p.value().sizes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "train.init_from: parameter ", p.key(), " is ", c10::str(it->second.sizes()), " in ",
            path, " but ", c10::str(p.value().sizes()), " in this config"));
      }
      p.value().copy_(it->second);
      used.insert(p.key());
    }
    for (const auto& [name, tensor] : source) {
      if (!used.count(name) && !buffers.count(name)) dropped.push_back(name);
    }
    if (!dropped.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.init_from: this config has no ", absl::StrJoin(dropped, ", "), " of ", path,
          " (continued training may add parameters, never drop trained ones)"));
    }
    init_from_summary = absl::StrCat(
        "initialised from ", path, ": ", used.size(), " parameter tensors loaded",
        fresh.empty() ? "" : absl::StrCat("; fresh (this config adds them): ",
                                          absl::StrJoin(fresh, ", ")));
    return absl::OkStatus();
  }

  void RebuildMonitor() {
    monitor = std::make_unique<SpikeMonitor>(config.train().spike(), config.train().steps());
    for (size_t i = 0; i < loss_history.size(); ++i) {
      monitor->Observe(static_cast<int64_t>(i) + 1, loss_history[i], grad_history[i]);
    }
  }

  EvalResult Evaluate() {
    const TrainConfig& t = config.train();
    torch::NoGradGuard no_grad;
    model->eval();
    ProbeRecorder recorder(config.model(), t.attention_map_heads());
    double loss_sum = 0;
    for (int64_t i = 0; i < t.eval_batches(); ++i) {
      auto [x, y] = GetBatch(TokenData::Split::kVal, i);
      AutocastGuard autocast_guard(autocast);
      loss_sum += ForwardLoss(x, y, &recorder).item<double>();
    }
    EvalResult r;
    r.set_step(step);
    r.set_val_loss(loss_sum / t.eval_batches());
    r.set_val_ppl(std::exp(r.val_loss()));
    *r.mutable_probes() = recorder.Finish();
    for (AttentionMap& m : recorder.TakeAttentionMaps()) *r.add_attention_maps() = std::move(m);
    // Every length reads the same text (EvalLengthSpan tokens from the start of the validation
    // split) cut into windows of that length, so lengths differ only in the context a token
    // sees; YaRN's tables beyond its original length, or at every length (yarn.apply).
    const YarnConfig& yarn = config.model().yarn();
    const int64_t span = EvalLengthSpan(t);
    for (const int32_t len : t.eval_seq_lens()) {
      const bool use_yarn = yarn.factor() > 0 && (yarn.apply() == YARN_ALWAYS ||
                                                  len > yarn.original_seq_len());
      model->UseYarn(use_yarn);
      const int64_t windows = span / len;
      torch::Tensor x = torch::empty({windows, len}, torch::kLong);
      torch::Tensor y = torch::empty({windows, len}, torch::kLong);
      data.Consecutive(TokenData::Split::kVal, windows, len, x.data_ptr<int64_t>(),
                       y.data_ptr<int64_t>());
      double sum = 0;  // summed over tokens: windows of one batch and of the last may differ
      for (int64_t first = 0; first < windows; first += t.batch_size()) {
        const int64_t rows = std::min<int64_t>(t.batch_size(), windows - first);
        AutocastGuard autocast_guard(autocast);
        sum += ForwardLoss(x.slice(0, first, first + rows).to(device),
                           y.slice(0, first, first + rows).to(device))
                   .item<double>() *
               static_cast<double>(rows);
      }
      model->UseYarn(false);
      LengthEval& l = *r.add_lengths();
      l.set_seq_len(len);
      l.set_yarn(use_yarn);
      l.set_val_loss(sum / static_cast<double>(windows));
      l.set_val_ppl(std::exp(l.val_loss()));
    }
    model->train();
    return r;
  }

  // Model, optimizer, progress and RNG state, replacing checkpoint.pt durably; the checkpoint it
  // replaces becomes checkpoint.prev.pt. Every rank calls it: the writer writes, the others take
  // part in gathering a sharded optimizer's state.
  absl::Status SaveCheckpoint() {
    if (!Writer()) return optimizer->Save(nullptr, options.checkpoint_dir, step);
    fs::create_directories(options.checkpoint_dir);
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive model_archive;
    model->save(model_archive);
    archive.write("model", model_archive);
    if (absl::Status st = optimizer->Save(&archive, options.checkpoint_dir, step); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("checkpoint: ", st.message()));
    }
    auto i64 = [](int64_t v) { return torch::tensor({v}, torch::kLong); };
    archive.write("step", i64(step));
    archive.write("data_offset", i64(data_offset));
    archive.write("rollbacks", i64(rollbacks));
    archive.write("spike_steps", i64(spike_steps));
    archive.write("elapsed_s", torch::tensor({Elapsed()}, torch::kFloat64));
    archive.write("loss_history", torch::tensor(loss_history, torch::kFloat64));
    archive.write("grad_history", torch::tensor(grad_history, torch::kFloat64));
    archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
    absl::Status saved = ReplaceFileDurably(
        CheckpointPath(),
        [&](const std::string& tmp) {
          try {
            archive.save_to(tmp);
          } catch (const c10::Error& e) {
            return absl::InternalError(
                absl::StrCat("cannot write ", tmp, ": ", e.what_without_backtrace()));
          }
          return absl::OkStatus();
        },
        PreviousCheckpointPath());
    if (!saved.ok()) {
      return absl::Status(saved.code(), absl::StrCat("checkpoint: ", saved.message()));
    }
    RemoveStaleShardedStates(checkpoint_step, step);
    checkpoint_step = step;
    return absl::OkStatus();
  }

  // A sharded optimizer's state files but those of checkpoint.pt (at `current`) and of
  // checkpoint.prev.pt (at `previous`, -1 when unknown: then the newest below `current`).
  void RemoveStaleShardedStates(int64_t previous, int64_t current) const {
    std::error_code ec;
    std::map<int64_t, fs::path> files;
    for (const auto& entry : fs::directory_iterator(options.checkpoint_dir, ec)) {
      const std::string name = entry.path().filename().string();
      int64_t at = 0;
      if (absl::StartsWith(name, "optimizer-") && absl::EndsWith(name, ".bin") &&
          absl::SimpleAtoi(name.substr(10, name.size() - 14), &at)) {
        files[at] = entry.path();
      }
    }
    if (previous < 0) {
      auto below = files.lower_bound(current);
      if (below != files.begin()) previous = std::prev(below)->first;
    }
    for (const auto& [at, path] : files) {
      if (at != current && at != previous) fs::remove(path, ec);
    }
  }

  // Loads `path`; DataLoss when it cannot be read. The state is then part loaded: Build() again.
  absl::Status LoadCheckpoint(const std::string& path) {
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path, device);
      torch::serialize::InputArchive model_archive;
      archive.read("model", model_archive);
      model->load(model_archive);
      torch::Tensor saved_step;
      archive.read("step", saved_step);
      optimizer->Load(archive, options.checkpoint_dir, saved_step.item<int64_t>());
      auto i64 = [&](const char* key) {
        torch::Tensor t;
        archive.read(key, t);
        return t.item<int64_t>();
      };
      step = i64("step");
      checkpoint_step = step;
      data_offset = i64("data_offset");
      rollbacks = i64("rollbacks");
      spike_steps = i64("spike_steps");
      torch::Tensor elapsed;  // absent from checkpoints written before it was kept
      elapsed_before = archive.try_read("elapsed_s", elapsed) ? elapsed.item<double>() : 0.0;
      session_start = std::chrono::steady_clock::now();
      auto history = [&](const char* key) {
        torch::Tensor t;
        archive.read(key, t);
        t = t.to(torch::kCPU).contiguous();
        return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
      };
      loss_history = history("loss_history");
      grad_history = history("grad_history");
      torch::Tensor rng;
      archive.read("rng", rng);
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(rng.to(torch::kCPU));
    } catch (const c10::Error& e) {
      return absl::DataLossError(absl::StrCat(path, ": unreadable checkpoint: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat(path, ": unreadable checkpoint: ", e.what()));
    }
    if (static_cast<int64_t>(loss_history.size()) != step) {
      return absl::DataLossError(absl::StrCat(path, ": history has ", loss_history.size(),
                                              " steps, checkpoint says ", step));
    }
    RebuildMonitor();
    return absl::OkStatus();
  }

  // Loads checkpoint.pt, else checkpoint.prev.pt, else starts from step 0 (a fresh Build). Each
  // one that cannot be read is moved aside (never read again, kept for a post-mortem) and noted
  // in *notices with the step training resumes from. Errors: only when a file cannot be moved.
  absl::Status LoadNewestGoodCheckpoint(std::vector<std::string>* notices) {
    std::vector<std::string> bad;
    bool loaded = false;
    for (const std::string& path : {CheckpointPath(), PreviousCheckpointPath()}) {
      if (!fs::exists(path)) continue;
      absl::Status st = LoadCheckpoint(path);
      if (st.ok()) {
        loaded = true;
        if (!bad.empty()) {
          bad.back() += absl::StrCat("; resumed from ", fs::path(path).filename().string(),
                                     " at step ", step);
        }
        break;
      }
      if (!absl::IsDataLoss(st)) return st;
      if (!Writer()) {  // rank 0 moves it aside and reports it; the others fall back alike
        if (absl::Status built = Build(); !built.ok()) return built;
        continue;
      }
      // Aside under a name of its own, so that an earlier torn file is kept too.
      const std::string stamp = absl::FormatTime("%Y%m%dT%H%M%S", absl::Now(), absl::UTCTimeZone());
      std::string aside = absl::StrCat(path, ".corrupt-", stamp);
      for (int n = 1; fs::exists(aside); ++n) aside = absl::StrCat(path, ".corrupt-", stamp, ".", n);
      std::error_code ec;
      fs::rename(path, aside, ec);
      if (ec && ec != std::errc::no_such_file_or_directory) {  // ENOENT: another worker moved it
        return absl::Status(st.code(), absl::StrCat(st.message(), "; cannot move it aside to ", aside,
                                                    ": ", ec.message()));
      }
      bad.push_back(absl::StrCat(st.message(), ": moved aside to ", aside));
      if (absl::Status built = Build(); !built.ok()) return built;  // undo the partial load
    }
    if (!loaded && !bad.empty()) bad.back() += "; no readable checkpoint left: starting from step 0";
    for (std::string& line : bad) notices->push_back(std::move(line));
    return absl::OkStatus();
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
      auto [x, y] = GetTrainBatch((step - 1) * t.grad_accum() + micro + data_offset);
      torch::Tensor loss, aux;
      {
        AutocastGuard autocast_guard(autocast);
        loss = ForwardLoss(x, y, nullptr, &aux);
      }
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
    step = taken;
    loss_history.push_back(loss);
    grad_history.push_back(grad_norm);
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
    const size_t n = std::min<size_t>(50, loss_history.size());
    double sum = 0;
    int finite = 0;
    for (size_t i = loss_history.size() - n; i < loss_history.size(); ++i) {
      if (std::isfinite(loss_history[i])) sum += loss_history[i], ++finite;
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
    const int64_t kept_spike_steps = spike_steps;
    const int64_t kept_rollbacks = rollbacks + 1;
    if (absl::Status st = LoadNewestGoodCheckpoint(notices); !st.ok()) return st;
    if (absl::Status st = CheckRanksAgree("rollback"); !st.ok()) return st;
    data_offset += (spike_step - step) * t.grad_accum() + t.spike().rollback_skip_batches();
    rollbacks = kept_rollbacks;
    spike_steps = kept_spike_steps;
    for (SpikeEvent& e : verdict->events) {
      if (e.action() == SPIKE_ACTION_ROLLED_BACK) e.set_rollback_to_step(step);
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
    summary.set_steps_done(s.step);
    summary.set_final_train_loss(s.FinalTrainLoss());
    if (s.last_eval.step() > 0 || s.last_eval.has_probes()) {
      *summary.mutable_final_eval() = s.last_eval;
    }
    summary.set_spike_steps(s.spike_steps);
    summary.set_spike_score(s.step > 0 ? static_cast<double>(s.spike_steps) / s.step : 0.0);
    // Training seconds and the mean tokens/s over every attempt of the run (the elapsed time a
    // checkpoint carries on), not only this one's.
    const double trained = std::max(wall, s.Elapsed());
    summary.set_wall_s(trained);
    summary.set_tokens_per_s(trained > 0 ? s.step * s.TokensPerStep() / trained : 0.0);
    // What it cost: this process's peak of tensor memory (rank 0's in a data-parallel run), and
    // the FLOPs of every step it has taken, over all its attempts.
    summary.set_peak_memory_bytes(s.device.is_cuda() ? compat::CudaTensorMemory(s.CudaIndex()).peak
                                                     : compat::CpuTensorMemory().peak);
    summary.set_flops(static_cast<double>(s.step) * static_cast<double>(s.TokensPerStep()) *
                      TrainingFlopsPerToken(s.config.model(), s.config.train().seq_len()));
    return summary;
  }

  // Writes a checkpoint unless the observer stops the run first. Rank 0 asks and writes; every
  // rank learns whether the run stops here. Returns the run's end when it stops or the write
  // fails; nullopt when training goes on.
  std::optional<absl::StatusOr<RunSummary>> Checkpoint() {
    const bool stop = s.AnyRank(s.Writer() && obs->BeforeCheckpoint(s.step) ==
                                                  TrainerObserver::Directive::kStop);
    if (stop) return Finish(CANCELLED, kStopped);
    if (absl::Status st = s.SaveCheckpoint(); !st.ok()) return st;
    if (s.Writer()) obs->OnCheckpoint(s.step, s.CheckpointPath());
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

int64_t Trainer::step() const { return state_->step; }

double Trainer::LearningRate(const OptimizerConfig& o, int64_t step, int64_t total_steps) {
  if (step <= o.warmup_steps()) {
    return o.lr() * static_cast<double>(step) / std::max(1, o.warmup_steps());
  }
  const double progress = static_cast<double>(step - o.warmup_steps()) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - o.warmup_steps()));
  return o.min_lr() + 0.5 * (o.lr() - o.min_lr()) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
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
  absl::StatusOr<TokenData> data = TokenData::Load(t.data(), config.model().vocab_size(), t.seq_len());
  if (!data.ok()) return data.status();
  if (t.eval_seq_lens_size() > 0) {
    const int32_t longest = *std::max_element(t.eval_seq_lens().begin(), t.eval_seq_lens().end());
    const int64_t span = EvalLengthSpan(t);
    if (data->val_tokens() < span + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.eval_seq_lens: every length is measured on eval_batches x batch_size windows of "
          "the longest (", t.eval_batches(), " x ", t.batch_size(), " x ", longest, " = ", span,
          " tokens), which needs ", span + 1, " validation tokens; ", data->source(), " holds ",
          data->val_tokens(), " (fewer eval_batches, or a larger val_fraction)"));
    }
  }

  auto s = std::make_unique<State>(std::move(*data));
  s->config = config;
  s->options = std::move(options);
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
    return absl::FailedPreconditionError(absl::StrCat("train.device: ", t.device(), " does not exist (",
                                                      torch::cuda::device_count(), " CUDA devices)"));
  }
  s->autocast = t.precision() == PRECISION_BF16_AUTOCAST && s->device.is_cuda();
  KeepFreedMemoryInHeap();
  compat::CountCpuTensorMemory();  // RunSummary.peak_memory_bytes
  // threads 0 = all cores, shared between the ranks of this machine.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  torch::set_num_threads(t.threads() > 0 ? t.threads()
                                         : std::max(1, static_cast<int>(cores) / s->options.world_size));

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
    return absl::UnavailableError(absl::StrCat("data parallel start: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("data parallel start: ", e.what()));
  }
  if (s->step == 0 && !s->init_from_summary.empty()) s->notices.push_back(s->init_from_summary);
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
    if (policy == SPIKE_ROLLBACK && s.AnyRank(s.Writer() && !fs::exists(s.CheckpointPath()))) {
      if (auto end = session.Checkpoint()) return *std::move(end);  // something to roll back to
    }
    s.model->train();
    auto window_start = std::chrono::steady_clock::now();
    while (s.step < t.steps()) {
      const int64_t step = s.step + 1;
      const double lr = LearningRate(t.optimizer(), step, t.steps());
      s.optimizer->SetLearningRate(lr);
      const State::StepLoss loss = s.ForwardBackward(step);
      const double grad_norm = s.ReduceAndClipGradients();

      // Spike and divergence detection happens before the update, so a policy can still skip it.
      SpikeMonitor::Verdict verdict = s.monitor->Observe(step, loss.loss, grad_norm);
      const SpikeDecision decision = ApplySpikePolicy(policy, s.rollbacks, &verdict);
      if (verdict.spike || verdict.nonfinite) ++s.spike_steps;
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
      const bool pause = step == s.options.stop_at_step && !last;  // a rung
      if ((step % t.eval_every() == 0 || last || pause) && s.Writer()) {  // the other ranks wait
        s.last_eval = s.Evaluate();
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
    return absl::InternalError(absl::StrCat("training step ", s.step + 1, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {  // a collective's peer lost (Gloo throws its own errors)
    return absl::InternalError(absl::StrCat("training step ", s.step + 1, ": ", e.what()));
  }
  return session.Finish(SUCCEEDED, "");
}

}  // namespace ablate
