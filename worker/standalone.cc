#include "worker/standalone.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/proto_yaml.h"
#include "worker/train/trainer.h"

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
    std::printf("eval step %lld | val loss %.4f | ppl %.3f | gate %s | M-Act %.2f | F-Attn %.4f\n",
                static_cast<long long>(e.step()), e.val_loss(), e.val_ppl(), gate.c_str(),
                e.probes().m_act(), e.probes().f_attn());
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

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ablate-worker: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunStandalone(const StandaloneOptions& o) {
  const bool resume = !o.resume_dir.empty();
  const fs::path dir = resume ? o.resume_dir : o.out_dir;
  if (dir.empty()) return Fail(absl::InvalidArgumentError("--out DIR (or --resume DIR) is required"));
  const std::string config_path = resume ? (dir / "config.json").string() : o.config_path;
  if (config_path.empty()) return Fail(absl::InvalidArgumentError("--config FILE is required"));
  absl::StatusOr<RunConfig> config = LoadRunConfigFile(config_path);
  if (!config.ok()) return Fail(config.status());
  if (!o.device.empty()) config->mutable_train()->set_device(o.device);
  if (o.threads >= 0) config->mutable_train()->set_threads(o.threads);

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Fail(absl::InternalError(absl::StrCat(dir.string(), ": ", ec.message())));
  if (!resume) {
    if (fs::exists(dir / "checkpoint.pt")) {
      return Fail(absl::AlreadyExistsError(absl::StrCat(
          dir.string(), " already holds a run; continue it with --resume ", dir.string())));
    }
    std::ofstream(dir / "config.json") << CanonicalJson(*config) << "\n";
  }

  TrainerOptions options;
  options.checkpoint_dir = dir.string();
  options.resume = resume;
  options.interrupt = &g_interrupt;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, options);
  if (!trainer.ok()) return Fail(trainer.status());
  if (resume) {
    TruncateJsonl(dir / "metrics.jsonl", (*trainer)->step());
    std::printf("resuming %s at step %lld\n", dir.string().c_str(),
                static_cast<long long>((*trainer)->step()));
  }
  std::ofstream jsonl(dir / "metrics.jsonl", std::ios::app);
  ConsoleObserver observer(config->train(), &jsonl);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  absl::StatusOr<RunSummary> summary = (*trainer)->Run(&observer);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!summary.ok()) return Fail(summary.status());
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
