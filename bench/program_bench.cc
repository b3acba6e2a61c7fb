// What reading a program costs (docs/program.md, docs/benchmarks.md), side by side in one run:
//   1. the protocol: `@ablate` step lines parsed per second by OutputParser alone, and read from
//      a real program's pipe by ProgramProcess (log, tail, parse, checks, spike detectors, the
//      observer a worker's reporter sits behind), against the target of 200k step lines/s;
//   2. with --nanogpt DIR: the same nanoGPT config run bare and as a program, wall time each and
//      the ratio (target <= 1.03).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "config/program_config.h"
#include "worker/program/output_parser.h"
#include "worker/program/program_process.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Counts what a worker's reporter would be handed.
class CountingObserver : public TrainerObserver {
 public:
  Directive OnStep(const StepMetrics& m) override {
    ++steps;
    bytes += m.ByteSizeLong();
    return Directive::kContinue;
  }
  void OnEval(const EvalResult&) override { ++evals; }
  int64_t steps = 0, evals = 0, bytes = 0;
};

RunConfig ProgramRun(const std::string& command, int64_t steps, ProgramReport report) {
  RunConfig c;
  ProgramConfig* p = c.mutable_program();
  p->set_command(command);
  p->set_args(PROGRAM_ARGS_NONE);
  p->set_report(report);
  p->set_steps("steps");
  p->set_grace_s(5);
  p->set_max_log_bytes(kDefaultMaxLogBytes);
  SetProgramParam("steps", absl::StrCat(steps), p);
  c.mutable_train()->set_steps(static_cast<int32_t>(steps));
  c.mutable_train()->mutable_spike()->set_max_nonfinite_steps(3);
  c.mutable_train()->mutable_spike()->set_catastrophic_factor(10);
  c.mutable_train()->mutable_spike()->set_catastrophic_warmup(100);
  c.mutable_train()->mutable_spike()->set_stat_window(128);
  c.mutable_train()->mutable_spike()->set_stat_sigmas(6);
  c.mutable_train()->mutable_spike()->set_divergence_factor(2);
  c.mutable_train()->mutable_spike()->set_divergence_patience(4);
  c.mutable_train()->mutable_spike()->set_divergence_min_window(100);
  c.mutable_train()->mutable_spike()->set_divergence_window_fraction(0.05);
  return c;
}

// Runs `config` as a program in `dir`; its wall seconds (negative when it failed).
double RunAsProgram(const RunConfig& config, const fs::path& dir, CountingObserver* observer) {
  ProgramAttempt a;
  a.config = config;
  a.run_id = 1;
  a.code_dir = dir.string();
  a.checkpoint_dir = (dir / "ckpt").string();
  a.log_path = (dir / "ckpt" / "logs" / "attempt-1.log").string();
  fs::create_directories(a.checkpoint_dir);
  bool permanent = false;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<ProgramProcess>> p = ProgramProcess::Start(a, &permanent);
  if (!p.ok()) {
    std::fprintf(stderr, "start: %s\n", std::string(p.status().message()).c_str());
    return -1;
  }
  std::atomic<bool> interrupt{false};
  absl::StatusOr<RunSummary> s = (*p)->Run(
      observer, &interrupt, [] { return false; }, &permanent);
  const double wall = Seconds(start);
  if (!s.ok() || s->state() != SUCCEEDED) {
    std::fprintf(
        stderr, "run: %s\n",
        s.ok() ? RunState_Name(s->state()).c_str() : std::string(s.status().message()).c_str());
    return -1;
  }
  return wall;
}

// `command` through /bin/sh, its output to /dev/null: wall seconds.
double RunBare(const std::string& command, const fs::path& dir) {
  const Clock::time_point start = Clock::now();
  const std::string line =
      absl::StrCat("cd '", dir.string(), "' && ", command, " > /dev/null 2>&1");
  if (std::system(line.c_str()) != 0) return -1;
  return Seconds(start);
}

int Main(int argc, char** argv) {
  CLI::App app{"bench_program: what reading a program's reports costs"};
  int64_t lines = 1000000;
  std::string nanogpt;
  int64_t nanogpt_iters = 200;
  std::string nanogpt_dataset = "shakespeare_char";
  int repeats = 2;
  app.add_option("--lines", lines, "step lines for the protocol measurements");
  app.add_option("--nanogpt", nanogpt, "a karpathy/nanoGPT checkout: bare against under ablate");
  app.add_option("--nanogpt-iters", nanogpt_iters, "max_iters of that nanoGPT run");
  app.add_option("--repeats", repeats, "nanoGPT runs of each kind, alternated");
  app.add_option("--nanogpt-dataset", nanogpt_dataset,
                 "its dataset (below data/, or an absolute directory)");
  CLI11_PARSE(app, argc, argv);
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("ablate_bench_program_", getpid());
  fs::create_directories(dir);

  // 1a. The parser alone, over lines in memory.
  {
    RunConfig config = ProgramRun("true", lines, PROGRAM_REPORT_ABLATE);
    OutputParser parser(config.program());
    std::vector<std::string> text;
    text.reserve(static_cast<size_t>(std::min<int64_t>(lines, 100000)));
    for (int64_t i = 1; i <= std::min<int64_t>(lines, 100000); ++i) {
      text.push_back(absl::StrCat("@ablate {\"t\":\"step\",\"step\":", i,
                                  ",\"loss\":2.5,\"grad_norm\":0.8,\"lr\":0.001,\"tokens\":4096}"));
    }
    int64_t events = 0;
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < lines; ++i) events += parser.Parse(text[i % text.size()]).size();
    const double s = Seconds(start);
    std::printf("protocol, parser alone: %lld lines in %.3f s: %.0f lines/s (%lld events)\n",
                static_cast<long long>(lines), s, static_cast<double>(lines) / s,
                static_cast<long long>(events));
  }
  // 1b. A real program's pipe: awk prints the lines as fast as it can.
  {
    const std::string awk = absl::StrCat(
        "awk 'BEGIN{for(i=1;i<=", lines,
        ";i++) printf \"@ablate {\\\"t\\\":\\\"step\\\",\\\"step\\\":%d,\\\"loss\\\":2.5,"
        "\\\"grad_norm\\\":0.8,\\\"lr\\\":0.001,\\\"tokens\\\":4096}\\n\", i; "
        "print \"@ablate {\\\"t\\\":\\\"end\\\"}\"}'");
    std::ofstream(dir / "print.sh") << awk << "\n";
    const double bare = RunBare("sh print.sh", dir);
    CountingObserver observer;
    const double read =
        RunAsProgram(ProgramRun("sh print.sh", lines, PROGRAM_REPORT_ABLATE), dir, &observer);
    std::printf(
        "protocol, through a worker's ProgramProcess: %lld step lines in %.3f s: %.0f "
        "lines/s (target >= 200000: %s); the printer alone to /dev/null: %.3f s\n",
        static_cast<long long>(observer.steps), read,
        read > 0 ? static_cast<double>(observer.steps) / read : 0.0,
        read > 0 && observer.steps / read >= 200000 ? "met" : "NOT met", bare);
  }
  // 2. nanoGPT, bare and as a program.
  if (!nanogpt.empty()) {
    const std::string args =
        absl::StrCat("--device=cpu --compile=False --out_dir=", (dir / "out").string(),
                     " --dataset=", nanogpt_dataset,
                     " --n_layer=2 --n_head=2 --n_embd=64 --block_size=64 "
                     "--batch_size=8 --max_iters=",
                     nanogpt_iters, " --lr_decay_iters=", nanogpt_iters,
                     " --eval_interval=100 --eval_iters=5 --log_interval=1 --dropout=0.0 "
                     "--always_save_checkpoint=False");
    const std::string command = absl::StrCat("/usr/bin/python3 train.py ", args);
    RunConfig config = ProgramRun(command, nanogpt_iters + 1, PROGRAM_REPORT_NANOGPT);
    // Alternated, the fastest of each kept: a shared machine's noise is one-sided.
    double bare = 1e30, under = 1e30;
    int64_t steps = 0;
    for (int i = 0; i < repeats; ++i) {
      const double b = RunBare(command, nanogpt);
      CountingObserver observer;
      const double u = RunAsProgram(config, nanogpt, &observer);
      std::printf("nanoGPT %lld iterations, round %d: bare %.2f s, as a program %.2f s\n",
                  static_cast<long long>(nanogpt_iters), i + 1, b, u);
      if (b > 0) bare = std::min(bare, b);
      if (u > 0) under = std::min(under, u);
      steps = observer.steps;
    }
    std::printf(
        "nanoGPT %lld iterations: bare %.2f s, as a program %.2f s (%lld steps read), "
        "fastest of %d each: %.3fx (target <= 1.03)\n",
        static_cast<long long>(nanogpt_iters), bare, under, static_cast<long long>(steps), repeats,
        under / bare);
  } else {
    std::printf(
        "nanoGPT bare against as a program: give --nanogpt DIR (a karpathy/nanoGPT "
        "checkout with data/shakespeare_char prepared)\n");
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace ablate

int main(int argc, char** argv) { return ablate::Main(argc, argv); }
