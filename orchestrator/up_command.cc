#include "orchestrator/up_command.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fmt/format.h"
#include "orchestrator/dashboard_command.h"
#include "orchestrator/serve_command.h"
#include "orchestrator/tls.h"

extern char** environ;

namespace ablate {

namespace fs = std::filesystem;

absl::StatusOr<std::string> FindWorkerBinary(const std::string& given) {
  fs::path bin = given;
  if (bin.empty()) {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
    bin = self.parent_path() / "ablate-worker";
  }
  bin = fs::absolute(bin).lexically_normal();
  if (::access(bin.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ablate-worker not found at ", bin.string(), ": build it beside ablate (cmake --build ",
        "build --target ablate-worker) or name it with --worker-bin"));
  }
  return bin.string();
}

namespace {


// A child process: its argv and environment are built before fork, so that the child only
// makes async-signal-safe calls between fork and exec (the parent has gRPC threads).
struct Child {
  std::string name;
  std::vector<std::string> args;
  pid_t pid = -1;
};

// In a forked child: closes every descriptor but stdin, stdout and stderr, so that a worker holds
// none of the parent's (the listening sockets of the coordinator and the dashboard, the
// database, logs), even those opened without close-on-exec (Boost.Asio's acceptors are).
// Async-signal-safe.
void CloseInheritedDescriptors() {
  if (::close_range(3, ~0U, 0) == 0) return;
  const long max = ::sysconf(_SC_OPEN_MAX);  // close_range needs Linux 5.9
  for (int fd = 3; fd < (max > 0 ? max : 65536); ++fd) ::close(fd);
}

pid_t SpawnWorker(const Child& child, const std::vector<std::string>& env) {
  std::vector<char*> argv;
  for (const std::string& a : child.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: default signal mask (the parent blocks the signals it sigwaits for), its own
  // process group, SIGTERM when the parent dies.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);
  CloseInheritedDescriptors();
  ::execve(argv[0], argv.data(), envp.data());
  ::_exit(127);
}

std::string ExitText(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

}  // namespace

absl::Status RunUp(const UpOptions& options, std::ostream& out) {
  if (options.workers < 0) return absl::InvalidArgumentError("--workers must be >= 0");
  std::string worker_bin;
  if (options.workers > 0) {
    absl::StatusOr<std::string> found = FindWorkerBinary(options.worker_bin);
    if (!found.ok()) return found.status();
    worker_bin = *found;
  }

  sigset_t signals, previous;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, &previous);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};

  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options.server);
  if (!server.ok()) return server.status();
  const fs::path state(options.server.state_dir);
  out << fmt::format("ablate up: coordinator on {} (database {}, token {}); {} worker{}; Ctrl-C "
                     "stops all\n",
                     (*server)->address(), (state / "ablate.db").string(),
                     (state / "token").string(), options.workers, options.workers == 1 ? "" : "s")
      << std::flush;
  std::unique_ptr<DashboardServer> dashboard = StartCoordinatorDashboard(
      server->get(), options.server.host, options.dashboard_port, out);

  // The workers' environment: ours, with the coordinator's token and no stale address.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "ABLATE_TOKEN=") || absl::StartsWith(*e, "ABLATE_COORDINATOR=")) continue;
    env.emplace_back(*e);
  }
  env.push_back("ABLATE_TOKEN=" + (*server)->token());

  std::map<pid_t, Child> running;
  for (int i = 1; i <= options.workers; ++i) {
    Child child;
    child.name = absl::StrCat("up-", i);
    child.args = {worker_bin, "--coordinator", (*server)->address(), "--name", child.name};
    if (!options.server.tls_cert_file.empty()) {
      child.args.insert(child.args.end(), {"--tls-ca", (state / kTlsCaFile).string()});
    }
    if (!options.device.empty()) child.args.insert(child.args.end(), {"--device", options.device});
    child.pid = SpawnWorker(child, env);
    if (child.pid < 0) {
      out << fmt::format("ablate up: cannot start worker {}: {}\n", child.name, std::strerror(errno));
      continue;
    }
    out << fmt::format("ablate up: worker {}: pid {}\n", child.name, child.pid) << std::flush;
    running[child.pid] = std::move(child);
  }
  auto reap = [&](bool announce) {
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = running.find(pid);
      if (it == running.end()) continue;
      if (announce) {
        out << fmt::format("ablate up: worker {} (pid {}) {}\n", it->second.name, pid,
                           ExitText(status))
            << std::flush;
      }
      running.erase(it);
    }
  };

  int signal = 0;
  while (true) {
    sigwait(&signals, &signal);
    if (signal != SIGCHLD) break;
    reap(/*announce=*/true);
  }
  out << fmt::format("ablate up: {}: stopping {} worker{} (each checkpoints its run), then the "
                     "coordinator\n",
                     signal == SIGINT ? "SIGINT" : "SIGTERM", running.size(),
                     running.size() == 1 ? "" : "s")
      << std::flush;
  for (const auto& [pid, child] : running) ::kill(pid, SIGTERM);
  const absl::Time give_up = absl::Now() + options.stop_grace;
  bool killed = false;
  while (!running.empty()) {
    reap(/*announce=*/false);
    if (running.empty()) break;
    const absl::Duration left = give_up - absl::Now();
    if (!killed && left <= absl::ZeroDuration()) {
      out << "ablate up: workers still running after the grace period: killing them\n" << std::flush;
      for (const auto& [pid, child] : running) ::kill(pid, SIGKILL);
      killed = true;
    }
    const timespec wait = absl::ToTimespec(std::min(std::max(left, absl::Milliseconds(10)),
                                                    absl::Milliseconds(200)));
    const int got = sigtimedwait(&signals, nullptr, &wait);
    if ((got == SIGINT || got == SIGTERM) && !killed) {
      out << "ablate up: second signal: killing the workers\n" << std::flush;
      for (const auto& [pid, child] : running) ::kill(pid, SIGKILL);
      killed = true;
    }
  }
  dashboard.reset();  // it reads the coordinator's store
  (*server)->Shutdown();
  out << "ablate up: stopped\n" << std::flush;
  return absl::OkStatus();
}

void AddUpCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "up", "Run the coordinator and N local workers in one command; Ctrl-C stops all (runs in "
            "progress are checkpointed and resume on the next start).");
  auto options = std::make_shared<UpOptions>();
  auto seconds = std::make_shared<ServerFlagSeconds>();
  cmd->add_option("--workers,-w", options->workers, "local ablate-worker processes")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", options->device, "cpu, cuda or cuda:N for every worker's jobs");
  AddServerFlags(cmd, &options->server, seconds.get(), &options->dashboard_port);
  cmd->add_option("--worker-bin", options->worker_bin,
                  "the ablate-worker to run (default: the one beside ablate)");
  cmd->callback([out, action, options, seconds] {
    *action = [out, options, seconds] {
      UpOptions o = *options;
      ApplyServerFlags(*seconds, &o.server);
      return RunUp(o, *out);
    };
  });
}

}  // namespace ablate
