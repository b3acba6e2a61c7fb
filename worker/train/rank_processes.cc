#include "worker/train/rank_processes.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ablate {

std::string RankProcesses::Ending::Describe() const {
  return signaled ? absl::StrCat("signal ", signal) : absl::StrCat("exit code ", code);
}

absl::StatusOr<RankProcesses> RankProcesses::Start(
    std::string binary, const std::vector<std::vector<std::string>>& args,
    const std::vector<int>& ranks, const std::vector<std::vector<int>>& cpus) {
  if (binary.empty()) {
    std::error_code ec;
    binary = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  }
  RankProcesses group;
  for (size_t i = 0; i < args.size(); ++i) {
    std::vector<std::string> argv_strings = {binary};
    argv_strings.insert(argv_strings.end(), args[i].begin(), args[i].end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    cpu_set_t pinned;
    CPU_ZERO(&pinned);
    const bool pin = i < cpus.size() && !cpus[i].empty();
    if (pin) {
      for (int cpu : cpus[i]) CPU_SET(cpu, &pinned);
    }
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      return absl::InternalError(absl::StrCat("starting rank ", ranks[i], ": fork: ",
                                              std::strerror(errno)));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // a parent that dies takes its ranks with it
      if (getppid() != parent) _exit(1);  // it died before prctl
      if (pin) sched_setaffinity(0, sizeof(pinned), &pinned);
      execv(binary.c_str(), argv.data());
      std::fprintf(stderr, "ablate-worker: rank %d: exec %s: %s\n", ranks[i], binary.c_str(),
                   std::strerror(errno));
      _exit(127);
    }
    group.pids_.push_back(pid);
    group.ranks_.push_back(ranks[i]);
    group.endings_.push_back(Ending{ranks[i]});
  }
  return group;
}

RankProcesses::~RankProcesses() {
  for (pid_t& pid : pids_) {
    if (pid <= 0) continue;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
}

std::optional<RankProcesses::Ending> RankProcesses::Poll() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] <= 0) continue;
    int status = 0;
    if (waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
    pids_[i] = -1;
    Ending& e = endings_[i];
    e.signaled = WIFSIGNALED(status);
    e.signal = e.signaled ? WTERMSIG(status) : 0;
    e.code = e.signaled ? 128 + e.signal : WEXITSTATUS(status);
    if (e.code != 0 && e.code != 3 && !first_failure_) first_failure_ = e;
  }
  return first_failure_;
}

bool RankProcesses::AllEnded() const {
  for (pid_t pid : pids_) {
    if (pid > 0) return false;
  }
  return true;
}

void RankProcesses::Signal(int sig) {
  for (pid_t pid : pids_) {
    if (pid > 0) kill(pid, sig);
  }
}

std::vector<RankProcesses::Ending> RankProcesses::Wait(std::chrono::milliseconds grace,
                                                       std::optional<Ending>* failure) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  bool killed = false;
  while (true) {
    Poll();
    if (AllEnded()) break;
    if (!killed && std::chrono::steady_clock::now() >= deadline) {
      Signal(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (failure != nullptr) *failure = first_failure_;
  return endings_;
}

}  // namespace ablate
