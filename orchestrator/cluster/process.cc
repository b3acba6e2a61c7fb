#include "orchestrator/cluster/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

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

// The null-terminated array of C strings exec wants (pointing into `strings`).
std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// In a forked child: closes every descriptor but stdin, stdout and stderr, so that a worker holds
// none of the parent's (the listening sockets of the coordinator and the dashboard, the
// database, logs), even those opened without close-on-exec (Boost.Asio's acceptors are).
// Async-signal-safe.
void CloseInheritedDescriptors() {
  if (::close_range(3, ~0U, 0) == 0) return;
  const long max = ::sysconf(_SC_OPEN_MAX);  // close_range needs Linux 5.9
  for (int fd = 3; fd < (max > 0 ? max : 65536); ++fd) ::close(fd);
}

}  // namespace

pid_t SpawnChild(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<char*> argv = CStrings(args), envp = CStrings(env);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: default signal mask (the parent blocks the signals it sigwaits for), its own
  // process group, SIGTERM when the parent dies, only stdio.
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

absl::StatusOr<ProgramResult> RunProgram(const std::vector<std::string>& args,
                                         const std::vector<std::string>& env,
                                         const std::string& not_found_hint) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return absl::InternalError(std::strerror(errno));
  }
  std::vector<char*> argv = CStrings(args), envp = CStrings(env);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  // Only stdio: the program holds none of ours (a coordinator's listening sockets).
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(),
                              env.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    if (rc == ENOENT) {
      return absl::NotFoundError(absl::StrCat(args[0], " not found on PATH: ", not_found_hint));
    }
    return absl::InternalError(absl::StrCat("cannot run ", args[0], ": ", std::strerror(rc)));
  }
  ProgramResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open = 2;
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, n);
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (const pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string ExitText(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

}  // namespace ablate
