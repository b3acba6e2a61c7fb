#include "orchestrator/cli/logs_command.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ablate {

namespace fs = std::filesystem;

absl::Status PrintRunLogs(const LogsOptions& options, std::ostream& out) {
  const fs::path root = options.checkpoint_root.empty()
                            ? fs::path(options.state_dir) / "checkpoints"
                            : fs::path(options.checkpoint_root);
  const fs::path dir = root / absl::StrCat("run-", options.run_id) / "logs";
  std::error_code ec;
  int attempt = options.attempt;
  if (attempt == 0) {
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      int n = 0;
      if (name.rfind("attempt-", 0) == 0 && name.size() > 12 &&
          name.compare(name.size() - 4, 4, ".log") == 0 &&
          absl::SimpleAtoi(name.substr(8, name.size() - 12), &n)) {
        attempt = std::max(attempt, n);
      }
    }
  }
  const fs::path log = dir / absl::StrCat("attempt-", attempt, ".log");
  if (attempt == 0 || !fs::exists(log, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "logs: no output of run ", options.run_id,
        options.attempt > 0 ? absl::StrCat(" attempt ", options.attempt) : "", " in ", dir.string(),
        " (only program runs keep their output; a worker on another machine keeps it there "
        "unless the checkpoint root is shared: --checkpoint-root)"));
  }
  out << "==> " << log.string() << " <==\n";
  std::deque<std::string> kept;
  auto emit = [&](const std::string& line) {
    if (options.tail <= 0) {
      out << line << "\n";
      return;
    }
    kept.push_back(line);
    if (static_cast<int64_t>(kept.size()) > options.tail) kept.pop_front();
  };
  for (const fs::path& part : {fs::path(log.string() + ".1"), log}) {
    std::ifstream in(part, std::ios::binary);
    if (!in) continue;
    std::string line;
    while (std::getline(in, line)) emit(line);
  }
  for (const std::string& line : kept) out << line << "\n";
  out << std::flush;
  return absl::OkStatus();
}

void AddLogsCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "logs",
      "Print a program run's output, as its worker kept it in the run's checkpoint "
      "directory (docs/program.md)");
  auto options = std::make_shared<LogsOptions>();
  cmd->add_option("run", options->run_id, "run id (as `ablate status SWEEP` lists it)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--attempt", options->attempt, "which attempt (default: the last)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tail,-n", options->tail, "only the last N lines")->check(CLI::PositiveNumber);
  cmd->add_option("--state-dir", options->state_dir, "the coordinator's state dir")
      ->capture_default_str();
  cmd->add_option("--checkpoint-root", options->checkpoint_root,
                  "where runs' checkpoints live (default STATE_DIR/checkpoints)");
  cmd->callback([=] { *action = [=] { return PrintRunLogs(*options, *out); }; });
}

}  // namespace ablate
