// Helpers for tests that run real processes (`ablate`, `ablate-worker`, slurmd...): start one
// with its output in a log file, read its CPU time (or one named thread's), wait for its exit
// with a time limit, poll for a condition, read one integer from a results database the way any
// reader would, signal the processes a test tagged through their environment, find a free port. Header-only, no
// LibTorch.
#ifndef ABLATE_TESTS_PROCESS_UTIL_H_
#define ABLATE_TESTS_PROCESS_UTIL_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ablate::testing {

// A free TCP port on the loopback (free now; the process under test binds it a moment later).
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// User + system CPU seconds that process `pid` used so far; with `thread`, only its threads of
// that name (/proc/PID/task/TID/comm, e.g. "ablate-store", the store's writer). 0 when it cannot
// be read.
inline double CpuSeconds(pid_t pid, const std::string& thread = "") {
  auto stat_cpu = [](const std::filesystem::path& stat_file) {
    const std::string stat = Slurp(stat_file);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) return 0.0;
    std::istringstream fields(stat.substr(paren + 2));
    std::string f;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {
      if (i == 14 || i == 15) ticks += std::stod(f);  // utime, stime
    }
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  };
  const std::filesystem::path proc = "/proc/" + std::to_string(pid);
  if (thread.empty()) return stat_cpu(proc / "stat");
  double seconds = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(proc / "task", ec)) {
    std::string comm = Slurp(task.path() / "comm");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    if (comm == thread) seconds += stat_cpu(task.path() / "stat");
  }
  return seconds;
}

// Starts `bin args...` with stdout and stderr appended to `log`, in this process's environment
// plus `env` ("NAME=value" entries, which win). -1 when it cannot start.
inline pid_t Spawn(const std::string& bin, const std::vector<std::string>& args,
                   const std::filesystem::path& log, const std::vector<std::string>& env = {}) {
  std::vector<char*> argv = {const_cast<char*>(bin.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);  // first match wins in getenv
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, bin.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// The exit code (128 + signal when killed), or -1 when it did not exit within `timeout` (it is
// then killed with SIGKILL and reaped).
inline int WaitExit(pid_t pid, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `done` every 100 ms until it is true (true) or `timeout` passes (false).
inline bool WaitFor(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// One integer from the results database, opened read-only; -1 when the query fails.
inline int64_t QueryInt(const std::filesystem::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  int64_t value = -1;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_busy_timeout(db, 2000);
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      value = sqlite3_column_int64(stmt, 0);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return value;
}

// The pids whose parent is `parent` and whose command line (arguments joined by spaces) holds
// `needle`: a launcher's rank processes.
inline std::vector<pid_t> ChildrenWith(pid_t parent, const std::string& needle) {
  std::vector<pid_t> found;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != parent) continue;
    std::string cmdline = Slurp(e.path() / "cmdline");
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    if (cmdline.find(needle) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// Sends `sig` to every process but this one whose environment (as it was at exec) holds `entry`
// ("NAME=value"): a test tags what it starts with a value of its own (the SLURM test: its private
// SLURM_CONF) and so finds the daemons' grandchildren (slurmstepd, the jobs' processes) without
// touching anyone else's processes. Returns how many were signalled.
inline int SignalProcessesWithEnv(const std::string& entry, int sig) {
  int signalled = 0;
  std::error_code ec;
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = proc.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == getpid()) continue;
    std::ifstream in(proc.path() / "environ", std::ios::binary);
    std::string variable;
    bool tagged = false;
    while (!tagged && std::getline(in, variable, '\0')) tagged = variable == entry;
    if (tagged && kill(pid, sig) == 0) ++signalled;
  }
  return signalled;
}

// A self-signed certificate for 127.0.0.1 made with openssl, as a user would make one:
// DIR/NAME.pem and DIR/NAME.key. False when openssl failed.
inline bool MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                                      const std::string& san = "IP:127.0.0.1") {
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ablate-test -addext "
      "subjectAltName=" + san + " -keyout " + dir + "/" + name + ".key -out " + dir + "/" + name +
      ".pem 2>/dev/null";
  return std::system(command.c_str()) == 0;
}

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_PROCESS_UTIL_H_
