#include "orchestrator/cli/program_command.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "config/program_config.h"
#include "config/program_snapshot.h"
#include "fmt/format.h"
#include "orchestrator/sweep/expand.h"
#include "worker/program/program_process.h"

namespace ablate {

namespace {

namespace fs = std::filesystem;

// What one attempt reported.
struct Attempt {
  absl::StatusOr<RunSummary> summary = absl::UnknownError("not run");
  std::map<int64_t, double> losses;
  std::vector<int64_t> checkpoints;
  double stop_seconds = -1;  // from SIGTERM to its end (a stopped attempt)
};

class Collector : public TrainerObserver {
 public:
  // stop_at > 0: SIGTERM as soon as a step at or past it is read (*stopped: when).
  Collector(Attempt* a, int64_t stop_at, absl::Time* stopped)
      : a_(a), stop_at_(stop_at), stopped_(stopped) {}
  Directive OnStep(const StepMetrics& m) override {
    a_->losses[m.step()] = m.loss();
    if (stop_at_ > 0 && m.step() >= stop_at_) {
      if (*stopped_ == absl::InfiniteFuture()) *stopped_ = absl::Now();
      return Directive::kStop;
    }
    return Directive::kContinue;
  }
  void OnCheckpoint(int64_t step, const std::string&) override { a_->checkpoints.push_back(step); }

 private:
  Attempt* a_;
  const int64_t stop_at_;
  absl::Time* stopped_;
};

class Checker {
 public:
  Checker(RunConfig config, std::string code_dir, fs::path dir, std::ostream& out)
      : config_(std::move(config)),
        code_dir_(std::move(code_dir)),
        dir_(std::move(dir)),
        out_(out) {}

  // One attempt in checkpoint dir `name`; `stop_at` > 0: SIGTERM once a step at or past it was
  // reported. `resume_from`, `rung` as a worker would pass them.
  Attempt Run(const std::string& name, const RunConfig& config, int attempt, int64_t stop_at,
              int64_t resume_from, int64_t rung) {
    Attempt a;
    ProgramAttempt p;
    p.config = config;
    p.run_id = 1;
    p.attempt = attempt;
    p.code_dir = code_dir_;
    p.checkpoint_dir = (dir_ / name).string();
    p.log_path = (dir_ / name / "logs" / absl::StrCat("attempt-", attempt, ".log")).string();
    p.resume_from_step = resume_from;
    p.stop_at_step = rung;
    fs::create_directories(p.checkpoint_dir);
    bool permanent = false;
    absl::StatusOr<std::unique_ptr<ProgramProcess>> process = ProgramProcess::Start(p, &permanent);
    if (!process.ok()) {
      a.summary = process.status();
      return a;
    }
    absl::Time stopped = absl::InfiniteFuture();
    Collector collector(&a, stop_at, &stopped);
    std::atomic<bool> interrupt{false};
    a.summary = (*process)->Run(&collector, &interrupt, nullptr, &permanent);
    if (stopped != absl::InfiniteFuture())
      a.stop_seconds = absl::ToDoubleSeconds(absl::Now() - stopped);
    return a;
  }

  void Item(const std::string& name, bool ok, const std::string& why) {
    out_ << fmt::format("{:<8} {}: {}\n", ok ? "ok" : "FAILED", name, why) << std::flush;
    if (!ok) failed_.push_back(name);
  }
  void Skip(const std::string& name, const std::string& why) {
    out_ << fmt::format("{:<8} {}: {}\n", "skipped", name, why) << std::flush;
  }
  const std::vector<std::string>& failed() const { return failed_; }

  static std::string Ended(const Attempt& a) {
    if (!a.summary.ok()) return std::string(a.summary.status().message());
    return absl::StrCat(
        RunState_Name(a.summary->state()),
        a.summary->reason().empty() ? "" : absl::StrCat(" (", a.summary->reason(), ")"));
  }

  // The largest relative difference between the losses both report after `after`.
  static double Difference(const Attempt& a, const Attempt& b, int64_t after, int* compared) {
    double worst = 0;
    *compared = 0;
    for (const auto& [step, loss] : a.losses) {
      auto it = b.losses.find(step);
      if (step <= after || it == b.losses.end()) continue;
      ++*compared;
      const double d = std::fabs(loss - it->second) / std::max(1e-12, std::fabs(loss));
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    return worst;
  }

 private:
  const RunConfig config_;
  const std::string code_dir_;
  const fs::path dir_;
  std::ostream& out_;
  std::vector<std::string> failed_;
};

}  // namespace

absl::Status CheckProgram(const ProgramCheckOptions& options, std::ostream& out) {
  absl::StatusOr<SweepSpec> spec = LoadSweepSpecFile(options.spec);
  if (!spec.ok()) return spec.status();
  if (!spec->base.has_program()) {
    return absl::InvalidArgumentError(absl::StrCat(options.spec, ": has no program: block"));
  }
  absl::StatusOr<ProgramSnapshot> code = ReadSpecProgram(*spec);
  if (!code.ok()) return code.status();
  ExpandOptions expand;
  expand.program_code_hash = code->code_hash();
  if (!spec->base.program().count().empty())
    expand.program_count = SpecProgramCounter(*spec, nullptr);
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweep(*spec, expand);
  if (!sweep.ok()) return sweep.status();
  RunConfig config = sweep->runs(0).config();
  ProgramConfig* program = config.mutable_program();
  const int64_t steps = std::max<int64_t>(4, options.steps);
  SetProgramParam(program->steps(), absl::StrCat(steps), program);
  config.mutable_train()->set_steps(
      static_cast<int32_t>(steps + (program->report() == PROGRAM_REPORT_NANOGPT ? 1 : 0)));
  const int64_t total = config.train().steps();

  const fs::path dir = options.keep.empty()
                           ? fs::temp_directory_path() / absl::StrCat("ablate-check-", getpid())
                           : fs::path(options.keep);
  absl::StatusOr<std::string> code_dir = MaterializeSnapshot(*code, (dir / "programs").string());
  if (!code_dir.ok()) return code_dir.status();
  out << fmt::format("checking {} (variant {}, seed {}, {} steps) in {}\n", options.spec,
                     sweep->runs(0).variant(), config.train().seed(), total, dir.string());
  Checker c(config, *code_dir, dir, out);

  // 1. Steps and the end.
  const Attempt first = c.Run("first", config, 1, 0, 0, 0);
  const bool ended = first.summary.ok() && first.summary->state() == SUCCEEDED;
  c.Item("reports steps", !first.losses.empty() && first.losses.rbegin()->first == total,
         absl::StrCat(first.losses.size(), " steps reported, the last ",
                      first.losses.empty() ? 0 : first.losses.rbegin()->first, " of ", total));
  c.Item("ends", ended, Checker::Ended(first));
  if (first.losses.empty()) {
    if (options.keep.empty()) fs::remove_all(dir);
    return absl::FailedPreconditionError(
        absl::StrCat("program check: the program reported no step; see ", options.spec,
                     "'s report: and the output above"));
  }

  // 2. The seed: the same one gives the same losses, another one others.
  int n = 0;
  const Attempt again = c.Run("again", config, 1, 0, 0, 0);
  const double same = Checker::Difference(first, again, 0, &n);
  c.Item("honours the seed", same <= options.tolerance && n > 0,
         absl::StrCat("the same seed again: largest relative loss difference ",
                      fmt::format("{:.3g}", same), " over ", n, " steps (tolerance ",
                      options.tolerance, ")"));
  RunConfig other = config;
  other.mutable_train()->set_seed(config.train().seed() + 1);
  if (!program->seed().empty()) {
    SetProgramParam(program->seed(), absl::StrCat(config.train().seed() + 1),
                    other.mutable_program());
  }
  const Attempt reseeded = c.Run("reseeded", other, 1, 0, 0, 0);
  const double apart = Checker::Difference(first, reseeded, 0, &n);
  c.Item("another seed changes it", apart > options.tolerance,
         absl::StrCat("seed ", config.train().seed() + 1, ": largest relative loss difference ",
                      fmt::format("{:.3g}", apart), " over ", n, " steps"));

  // 3. SIGTERM halfway: a checkpoint, and an end within grace_s.
  const int64_t half = std::max<int64_t>(1, total / 2);
  const Attempt stopped = c.Run("stopped", config, 1, half, 0, 0);
  const int64_t ckpt = stopped.checkpoints.empty() ? 0 : stopped.checkpoints.back();
  const double grace = config.program().grace_s();
  const bool too_fast = stopped.summary.ok() && stopped.summary->state() == SUCCEEDED;
  if (too_fast) {
    c.Skip("checkpoints on SIGTERM",
           absl::StrCat("the program ended before SIGTERM reached it (", stopped.losses.size(),
                        " steps): give it more --steps"));
    c.Skip("resumes", "nothing was stopped to resume");
  } else
    c.Item("checkpoints on SIGTERM",
           ckpt >= half && stopped.stop_seconds >= 0 && stopped.stop_seconds <= grace,
           absl::StrCat("SIGTERM after step ", half, ": ",
                        ckpt > 0 ? absl::StrCat("checkpoint of step ", ckpt) : "no checkpoint",
                        ", ended after ", fmt::format("{:.1f}", stopped.stop_seconds),
                        " s (grace_s ", grace, ")"));

  // 4. Resumed from that checkpoint: the losses of the uninterrupted run.
  if (too_fast) {
  } else if (ckpt > 0) {
    const Attempt resumed = c.Run("stopped", config, 2, 0, ckpt, 0);
    const double resume_diff = Checker::Difference(first, resumed, ckpt, &n);
    const bool resumed_ok = resumed.summary.ok() && resumed.summary->state() == SUCCEEDED &&
                            !resumed.losses.empty() && resumed.losses.begin()->first == ckpt + 1;
    c.Item("resumes", resumed_ok && n > 0 && resume_diff <= options.tolerance,
           absl::StrCat("from step ", ckpt, ": first step reported ",
                        resumed.losses.empty() ? 0 : resumed.losses.begin()->first, ", ",
                        Checker::Ended(resumed),
                        "; largest relative difference from the "
                        "uninterrupted run ",
                        fmt::format("{:.3g}", resume_diff), " over ", n, " steps (tolerance ",
                        options.tolerance, ")"));
  } else {
    c.Skip("resumes", "no checkpoint to resume from");
  }

  // 5. A rung.
  if (HasCapability(config.program(), "pause")) {
    const Attempt paused = c.Run("paused", config, 1, 0, 0, half);
    const bool ok = paused.summary.ok() && paused.summary->state() == INTERRUPTED &&
                    !paused.checkpoints.empty() && paused.checkpoints.back() >= half;
    c.Item("pauses at a rung", ok,
           absl::StrCat("ABLATE_STOP_AT_STEP=", half, ": ", Checker::Ended(paused)));
  } else {
    c.Skip("pauses at a rung",
           "capabilities has no pause (method: asha stops losers while they train)");
  }
  if (options.keep.empty()) fs::remove_all(dir);
  if (!c.failed().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("program check: failed: ", absl::StrJoin(c.failed(), ", ")));
  }
  out << "program check: every item passed\n";
  return absl::OkStatus();
}

void AddProgramCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* program =
      app->add_subcommand("program", "Program runs (docs/program.md): check one before a sweep");
  program->require_subcommand(1);
  CLI::App* check = program->add_subcommand(
      "check",
      "Run a program spec's first variant a few times here and say whether it reports "
      "steps, honours the seed, checkpoints on SIGTERM, resumes and pauses");
  auto options = std::make_shared<ProgramCheckOptions>();
  check->add_option("spec", options->spec, "a sweep spec with a program: block")->required();
  check->add_option("--steps", options->steps, "the run's length for the check (at least 4)")
      ->capture_default_str();
  check
      ->add_option("--tolerance", options->tolerance,
                   "largest relative loss difference of a resumed or repeated run")
      ->capture_default_str();
  check->add_option("--keep", options->keep, "run in this directory and keep it (logs)");
  check->callback([=] { *action = [=] { return CheckProgram(*options, *out); }; });
}

}  // namespace ablate
