#include "worker/standalone.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/choice_task.h"
#include "config/data_source.h"
#include "config/model_config.h"
#include "config/proto_yaml.h"
#include "worker/train/collective.h"
#include "worker/train/rank_processes.h"
#include "worker/train/trainer.h"
#include "yaml-cpp/yaml.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_interrupt{false};
extern "C" void OnSignal(int) { g_interrupt.store(true); }

std::string Duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
  if (s >= 60) return absl::StrCat(s / 60, "m", s % 60, "s");
  return absl::StrCat(s, "s");
}

const char* KindName(SpikeKind k) {
  switch (k) {
    case SPIKE_NONFINITE: return "non-finite";
    case SPIKE_CATASTROPHIC: return "catastrophic spike";
    case SPIKE_STATISTICAL: return "statistical spike";
    case SPIKE_DIVERGENCE: return "divergence";
    default: return "event";
  }
}

// Appends JSON lines and prints progress.
class ConsoleObserver : public TrainerObserver {
 public:
  ConsoleObserver(const TrainConfig& train, std::ofstream* jsonl) : train_(train), jsonl_(jsonl) {}

  Directive OnStep(const StepMetrics& m) override {
    Write("step", m);
    tokens_per_s_ = tokens_per_s_ == 0 ? m.tokens_per_s() : 0.9 * tokens_per_s_ + 0.1 * m.tokens_per_s();
    if (m.step() % train_.log_every() == 0 || m.step() == train_.steps()) {
      const double tokens_left = static_cast<double>(train_.steps() - m.step()) * train_.batch_size() *
                                 train_.seq_len() * train_.grad_accum();
      std::printf("step %lld/%d | loss %.4f | grad %.3f | lr %.2e | %.0f tok/s | ETA %s\n",
                  static_cast<long long>(m.step()), train_.steps(), m.loss(), m.grad_norm(), m.lr(),
                  tokens_per_s_, Duration(tokens_per_s_ > 0 ? tokens_left / tokens_per_s_ : 0).c_str());
      std::fflush(stdout);
    }
    return Directive::kContinue;
  }
  void OnEval(const EvalResult& e) override {
    Write("eval", e);
    const std::string gate = e.probes().has_gate_score_mean()
                                 ? absl::StrFormat("%.3f", e.probes().gate_score_mean())
                                 : "-";
    const std::string sink = e.probes().has_sink_rate()
                                 ? absl::StrFormat(" | sink rate %.3f", e.probes().sink_rate())
                                 : "";
    std::printf(
        "eval step %lld | val loss %.4f | ppl %.3f | gate %s | M-Act %.2f | F-Attn %.4f%s\n",
        static_cast<long long>(e.step()), e.val_loss(), e.val_ppl(), gate.c_str(),
        e.probes().m_act(), e.probes().f_attn(), sink.c_str());
    for (const LengthEval& l : e.lengths()) {
      std::printf("  at %d tokens%s | val loss %.4f | ppl %.3f\n", l.seq_len(),
                  l.yarn() ? " (YaRN)" : "", l.val_loss(), l.val_ppl());
    }
    std::fflush(stdout);
  }
  void OnNotice(const std::string& line) override {
    std::printf("notice: %s\n", line.c_str());
    std::fflush(stdout);
  }
  void OnSpike(const SpikeEvent& e) override {
    Write("spike", e);
    std::printf("step %lld | %s on %s: %.4g (baseline %.4g)\n", static_cast<long long>(e.step()),
                KindName(e.kind()), e.signal().c_str(), e.value(), e.baseline());
    std::fflush(stdout);
  }

 private:
  void Write(const char* type, const google::protobuf::Message& m) {
    const std::string json = PlainJson(m);  // never "{}": every field is printed
    *jsonl_ << "{\"type\":\"" << type << "\"," << json.substr(1) << "\n";
    jsonl_->flush();
  }

  TrainConfig train_;
  std::ofstream* jsonl_;
  double tokens_per_s_ = 0;
};

// After a resume, drops the lines of steps beyond the checkpoint (written before a hard kill),
// so every step appears once.
void TruncateJsonl(const fs::path& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::ostringstream kept;
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("\"step\":");  // the first one is the line's own
    const int64_t step = at == std::string::npos ? 0 : std::atoll(line.c_str() + at + 7);
    if (step <= last_step) kept << line << "\n";
  }
  in.close();
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << kept.str();
  fs::rename(tmp, path);
}

int Fail(const absl::Status& s, int rank = -1) {
  std::fprintf(stderr, "ablate-worker: %s%s\n", rank >= 0 ? absl::StrCat("rank ", rank, ": ").c_str() : "",
               std::string(s.message()).c_str());
  return 1;
}

volatile sig_atomic_t g_forward_signal = 0;
extern "C" void OnLauncherSignal(int sig) { g_forward_signal = sig; }

// Starts `o.world_size` rank processes of this binary on `dir` and waits for them. The first
// rank to fail stops the others (SIGTERM, then SIGKILL after 10 s); SIGTERM to the launcher is
// passed on (each rank checkpoints at the same step). Exit code: rank 0's, 1 when any failed.
int Launch(const StandaloneOptions& o, const fs::path& dir, bool resume) {
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", o.world_size);
  if (!server.ok()) return Fail(server.status());
  std::vector<std::vector<std::string>> args;
  std::vector<int> ranks;
  for (int rank = 0; rank < o.world_size; ++rank) {
    std::vector<std::string> a = {"train"};
    if (resume) {
      a.insert(a.end(), {"--resume", dir.string()});
    } else {
      a.insert(a.end(), {"--out", dir.string(), "--config", (dir / "config.json").string()});
    }
    if (!o.device.empty()) a.insert(a.end(), {"--device", o.device});
    if (o.threads >= 0) a.insert(a.end(), {"--threads", std::to_string(o.threads)});
    if (o.stop_at_step > 0) a.insert(a.end(), {"--stop-at-step", std::to_string(o.stop_at_step)});
    a.insert(a.end(), {"--world-size", std::to_string(o.world_size), "--rank",
                       std::to_string(rank), "--rendezvous", (*server)->address(),
                       "--collective-timeout", absl::StrCat(o.collective_timeout_s)});
    args.push_back(std::move(a));
    ranks.push_back(rank);
  }
  absl::StatusOr<RankProcesses> processes = RankProcesses::Start("", args, ranks);
  if (!processes.ok()) return Fail(processes.status());
  // Ctrl-C reaches every rank from the terminal; the launcher only waits for them.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, OnLauncherSignal);
  std::optional<RankProcesses::Ending> failure;
  while (!processes->AllEnded() && !(failure = processes->Poll())) {
    if (g_forward_signal != 0) {
      processes->Signal(SIGTERM);
      g_forward_signal = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (failure) processes->Signal(SIGTERM);  // the others cannot go on without it
  const std::vector<RankProcesses::Ending> endings =
      processes->Wait(std::chrono::seconds(10));
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (failure) {
    std::fprintf(stderr,
                 "ablate-worker: rank %d of %d ended with %s; the other ranks were stopped. "
                 "Continue from the last checkpoint with: ablate-worker train --resume %s "
                 "--world-size %d\n",
                 failure->rank, o.world_size, failure->Describe().c_str(), dir.string().c_str(),
                 o.world_size);
    return 1;
  }
  return endings[0].code;
}

}  // namespace

int RunStandalone(const StandaloneOptions& o) {
  if (o.world_size < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--world-size must be >= 1, got ", o.world_size)));
  }
  const bool is_rank = o.rank >= 0;  // started by a launcher
  const bool writer = !is_rank || o.rank == 0;
  const bool resume = !o.resume_dir.empty();
  const fs::path dir = resume ? o.resume_dir : o.out_dir;
  if (dir.empty()) return Fail(absl::InvalidArgumentError("--out DIR (or --resume DIR) is required"));
  // A rank the agent starts names its job's config next to --resume.
  const std::string config_path =
      resume && o.config_path.empty() ? (dir / "config.json").string() : o.config_path;
  if (config_path.empty()) return Fail(absl::InvalidArgumentError("--config FILE is required"));
  absl::StatusOr<RunConfig> config = LoadRunConfigFile(config_path);
  if (!config.ok()) return Fail(config.status());
  if (!resume && !config->train().data().path().empty()) {
    // A prepared directory's manifest gives the vocabulary, width and end-of-document token, as
    // a sweep's expansion does (no fingerprint: a run of its own has no key).
    absl::StatusOr<DataSource> source =
        ResolveDataSource(config->train().data(), config->train().data().path(), false);
    if (!source.ok()) return Fail(source.status());
    bool vocab_set = false;
    try {
      const YAML::Node root = YAML::LoadFile(config_path);
      vocab_set =
          root.IsMap() && root["model"] && root["model"].IsMap() && root["model"]["vocab_size"];
    } catch (const YAML::Exception&) {
      // LoadRunConfigFile read it: not reached
    }
    if (absl::Status s = ApplyDataSource(*source, vocab_set, &*config); !s.ok()) return Fail(s);
  }
  // multiple_choice tasks: their names, fingerprints and chance levels, as expansion sets them.
  if (!resume) {
    if (absl::Status s = ApplyChoiceTasks(&*config); !s.ok()) return Fail(s);
  }
  if (!o.device.empty()) config->mutable_train()->set_device(o.device);
  if (o.threads >= 0) config->mutable_train()->set_threads(o.threads);
  if (is_rank && config->train().device() == "cuda") {
    config->mutable_train()->set_device(absl::StrCat("cuda:", o.rank));  // one device per rank
  }
  // Before any rank starts (each would refuse it too).
  if (absl::Status split = CheckBatchSplits(config->train(), o.world_size, "ranks (--world-size)");
      !split.ok()) {
    return Fail(split, o.rank);
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Fail(absl::InternalError(absl::StrCat(dir.string(), ": ", ec.message())));
  if (!resume && !is_rank) {
    if (fs::exists(dir / "checkpoint.pt")) {
      return Fail(absl::AlreadyExistsError(absl::StrCat(
          dir.string(), " already holds a run; continue it with --resume ", dir.string())));
    }
    std::ofstream(dir / "config.json") << CanonicalJson(*config) << "\n";
  }

  if (o.world_size > 1 && !is_rank) return Launch(o, dir, resume);

  TrainerOptions options;
  options.checkpoint_dir = dir.string();
  options.resume = resume;
  options.interrupt = &g_interrupt;
  options.stop_at_step = o.stop_at_step;
  if (is_rank) {
    options.world_size = o.world_size;
    options.rank = o.rank;
    options.rendezvous = o.rendezvous;
    options.collective_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o.collective_timeout_s * 1000));
  }
  std::signal(SIGINT, OnSignal);  // from here: a signal interrupts at the next step
  std::signal(SIGTERM, OnSignal);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, options);
  if (!trainer.ok()) return Fail(trainer.status(), o.rank);
  if (!writer) {  // rank > 0: trains its share; rank 0 prints and writes every output
    absl::StatusOr<RunSummary> summary = (*trainer)->Run(nullptr);
    if (!summary.ok()) return Fail(summary.status(), o.rank);
    return summary->state() == DIVERGED ? 3 : 0;
  }
  if (resume) {
    TruncateJsonl(dir / "metrics.jsonl", (*trainer)->step());
    std::printf("resuming %s at step %lld\n", dir.string().c_str(),
                static_cast<long long>((*trainer)->step()));
  }
  std::ofstream jsonl(dir / "metrics.jsonl", std::ios::app);
  ConsoleObserver observer(config->train(), &jsonl);
  absl::StatusOr<RunSummary> summary = (*trainer)->Run(&observer);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!summary.ok()) return Fail(summary.status(), o.rank);
  std::ofstream(dir / "summary.json") << PlainJson(*summary) << "\n";

  const EvalResult& e = summary->final_eval();
  switch (summary->state()) {
    case INTERRUPTED:
      std::printf("%s; resume with: ablate-worker train --resume %s\n", summary->reason().c_str(),
                  dir.string().c_str());
      return 0;
    case DIVERGED:
      std::printf("DIVERGED at step %lld: %s\n", static_cast<long long>(summary->steps_done()),
                  summary->reason().c_str());
      return 3;
    default:
      std::printf("done: %lld steps in %s | train loss %.4f | val loss %.4f | ppl %.3f | spike score %.4f | %.0f tok/s\n",
                  static_cast<long long>(summary->steps_done()), Duration(summary->wall_s()).c_str(),
                  summary->final_train_loss(), e.val_loss(), e.val_ppl(), summary->spike_score(),
                  summary->tokens_per_s());
      std::printf("results in %s\n", dir.string().c_str());
      return 0;
  }
}

}  // namespace ablate
