#include "worker/program/program_process.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/durable_file.h"
#include "config/program_config.h"
#include "worker/train/data.h"
#include "worker/train/spike.h"

extern char** environ;

namespace ablate {

namespace fs = std::filesystem;

namespace {

using Kind = ProgramEvent::Kind;

// Notices of one kind (an invalid report, a step out of order...) sent per attempt.
constexpr int kMaxNoticesPerKind = 5;
// Events read but not yet handled: past this the reader waits (the program's pipe fills).
constexpr size_t kMaxQueuedEvents = 20000;
// Bytes of one line kept in the tail.
constexpr size_t kTailLineBytes = 400;
// Where the ranks of a data-parallel program meet (MASTER_ADDR): they all run on this machine.
constexpr char kMasterAddr[] = "127.0.0.1";

std::string ExitText(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

bool ExitedZero(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Rank `rank`'s log beside rank 0's: "attempt-2.log" -> "attempt-2.rank-1.log" (not a name
// `ablate logs` takes for an attempt's).
std::string RankLogPath(const std::string& log_path, int rank) {
  if (rank == 0) return log_path;
  absl::string_view base = log_path;
  const bool log = absl::ConsumeSuffix(&base, ".log");
  return absl::StrCat(base, ".rank-", rank, log ? ".log" : "");
}

// A TCP port free on the loopback interface just now, for MASTER_PORT: bound with port 0 and
// released, as torchrun picks its own. Another process may take it before rank 0 listens on it:
// the attempt then fails and its retry picks another.
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("program: socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("program: no free loopback port for MASTER_PORT: ", strerror(error)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

std::string ProgramHelperDir() {
  std::vector<fs::path> candidates;
#ifdef ABLATE_SOURCE_PYTHON_DIR
  candidates.push_back(ABLATE_SOURCE_PYTHON_DIR);
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / "lib" / "ablate" / "python");
  for (const fs::path& c : candidates) {
    if (fs::exists(c / "ablate_report.py", ec)) return c.string();
  }
  return "";
}

ProgramProcess::ProgramProcess(const ProgramAttempt& attempt)
    : a_(attempt),
      grace_(absl::Seconds(attempt.config.program().grace_s())),
      parser_(attempt.config.program()),
      world_(std::max(1, attempt.world_size)),
      pids_(static_cast<size_t>(world_), -1),
      status_(static_cast<size_t>(world_), 0),
      out_(static_cast<size_t>(world_)),
      log_limit_(attempt.config.program().max_log_bytes() > 0
                     ? attempt.config.program().max_log_bytes()
                     : kDefaultMaxLogBytes),
      tails_(static_cast<size_t>(world_)),
      spikes_(std::make_unique<SpikeMonitor>(attempt.config.train().spike(),
                                             attempt.config.train().steps())) {}

absl::StatusOr<std::unique_ptr<ProgramProcess>> ProgramProcess::Start(const ProgramAttempt& attempt,
                                                                      bool* permanent) {
  *permanent = false;
  std::unique_ptr<ProgramProcess> p(new ProgramProcess(attempt));
  std::error_code ec;
  fs::create_directories(fs::path(attempt.log_path).parent_path(), ec);
  const std::string config_path =
      (fs::path(attempt.checkpoint_dir) / "ablate_params.json").string();
  if (absl::Status s = WriteFileAtomically(
          config_path, ProgramParamsJson(attempt.config.program()) + "\n", 0600);
      !s.ok()) {
    return s;
  }
  for (int rank = 0; rank < p->world_; ++rank) {
    Output& out = p->out_[rank];
    out.log_path = RankLogPath(attempt.log_path, rank);
    out.log_fd = open(out.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out.log_fd < 0) {
      return absl::InternalError(absl::StrCat("program log ", out.log_path, ": ", strerror(errno)));
    }
  }
  p->started_ = absl::Now();
  if (absl::Status s = p->Launch(attempt.resume_from_step, "", permanent); !s.ok()) return s;
  return p;
}

absl::Status ProgramProcess::Launch(int64_t resume_from, const std::string& rollback,
                                    bool* permanent) {
  *permanent = true;  // until the process runs, every failure would recur
  const ProgramAttempt& attempt = a_;
  const ProgramConfig& program = attempt.config.program();
  CommandContext ctx;
  ctx.checkpoint_dir = attempt.checkpoint_dir;
  ctx.seed = attempt.config.train().seed();
  ctx.steps = attempt.config.train().steps();
  ctx.run_id = attempt.run_id;
  ctx.resume = resume_from > 0;
  absl::StatusOr<std::vector<std::string>> argv = ProgramArgv(program, ctx);
  if (!argv.ok()) return argv.status();
  const std::string exe = FindProgramExecutable(argv->front(), attempt.code_dir);
  if (exe.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "program: ", argv->front(), " not found",
        argv->front().find('/') == std::string::npos ? " on PATH" : " in the program's code",
        " (program.command: ", program.command(), ")"));
  }
  const std::string config_path =
      (fs::path(attempt.checkpoint_dir) / "ablate_params.json").string();

  // The environment, built before fork (the agent has gRPC threads): what every rank gets, then
  // each rank's own.
  std::vector<std::string> add = {absl::StrCat("ABLATE_RUN_ID=", attempt.run_id),
                                  absl::StrCat("ABLATE_ATTEMPT=", attempt.attempt),
                                  absl::StrCat("ABLATE_SEED=", attempt.config.train().seed()),
                                  absl::StrCat("ABLATE_CONFIG=", config_path),
                                  absl::StrCat("ABLATE_CHECKPOINT_DIR=", attempt.checkpoint_dir),
                                  absl::StrCat("ABLATE_STEPS=", attempt.config.train().steps()),
                                  "PYTHONUNBUFFERED=1"};
  if (resume_from > 0) add.push_back(absl::StrCat("ABLATE_RESUME_FROM=", resume_from));
  if (!rollback.empty()) add.push_back(absl::StrCat("ABLATE_ROLLBACK=", rollback));
  if (attempt.stop_at_step > 0) {
    add.push_back(absl::StrCat("ABLATE_STOP_AT_STEP=", attempt.stop_at_step));
  }
  // The corpus ablate's own model trains on by default, for a program that wants it too.
  if (const std::string corpus = DefaultCorpusPath(); !corpus.empty()) {
    add.push_back(absl::StrCat("ABLATE_DEFAULT_CORPUS=", corpus));
  }
  std::string pythonpath = ProgramHelperDir();
  if (const char* existing = getenv("PYTHONPATH"); existing != nullptr && *existing) {
    pythonpath = pythonpath.empty() ? existing : absl::StrCat(pythonpath, ":", existing);
  }
  if (!pythonpath.empty()) add.push_back(absl::StrCat("PYTHONPATH=", pythonpath));
  // A data-parallel run: torchrun's variables, all ranks on this machine. Never for one rank: a
  // program such as nanoGPT takes RANK as the sign of a data-parallel run.
  std::string master_port;
  if (world_ > 1) {
    *permanent = false;
    absl::StatusOr<int> port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    master_port = absl::StrCat(*port);
    *permanent = true;
  }
  std::vector<std::vector<std::string>> envs;  // by rank
  for (int rank = 0; rank < world_; ++rank) {
    std::vector<std::string> own = add;
    const std::string& device = static_cast<size_t>(rank) < attempt.rank_devices.size()
                                    ? attempt.rank_devices[rank]
                                    : attempt.device;
    if (absl::StartsWith(device, "cuda:")) {
      own.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", device.substr(5)));
    }
    if (world_ > 1) {
      own.insert(
          own.end(),
          {absl::StrCat("RANK=", rank), absl::StrCat("LOCAL_RANK=", rank),
           absl::StrCat("WORLD_SIZE=", world_), absl::StrCat("LOCAL_WORLD_SIZE=", world_),
           absl::StrCat("MASTER_ADDR=", kMasterAddr), absl::StrCat("MASTER_PORT=", master_port)});
    }
    for (const std::string& e : attempt.env) own.push_back(e);
    std::set<std::string> ours;
    for (const std::string& e : own) ours.insert(e.substr(0, e.find('=')));
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (!ours.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
    }
    env.insert(env.end(), own.begin(), own.end());
    envs.push_back(std::move(env));
  }
  std::vector<char*> argv_c;
  for (std::string& s : *argv) argv_c.push_back(s.data());
  argv_c.push_back(nullptr);
  std::vector<std::vector<char*>> envs_c(envs.size());
  for (size_t r = 0; r < envs.size(); ++r) {
    for (std::string& s : envs[r]) envs_c[r].push_back(s.data());
    envs_c[r].push_back(nullptr);
  }

  *permanent = false;
  // What a launch that fails part way leaves: the ranks started so far killed and reaped.
  auto abandon = [this] {
    if (pid_ > 0) kill(-pid_, SIGKILL);
    for (int r = 0; r < world_; ++r) {
      if (pids_[r] > 0) waitpid(pids_[r], nullptr, 0);
      pids_[r] = -1;
      if (out_[r].fd >= 0) close(out_[r].fd);
      out_[r].fd = -1;
    }
    pid_ = -1;
  };
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  for (int rank = 0; rank < world_; ++rank) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      const int error = errno;
      close(devnull);
      abandon();
      return absl::InternalError(absl::StrCat("program: pipe: ", strerror(error)));
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      const int error = errno;
      close(out[0]);
      close(out[1]);
      close(devnull);
      abandon();
      return absl::InternalError(absl::StrCat("program: pipe: ", strerror(error)));
    }
    // Rank 0 leads a process group of its own; every other rank joins it, so that one signal to
    // the group reaches every rank and whatever they started.
    const pid_t group = rank == 0 ? 0 : pid_;
    char* const* env_c = envs_c[rank].data();
    const pid_t pid = fork();
    if (pid < 0) {
      const int error = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
      close(devnull);
      abandon();
      return absl::InternalError(absl::StrCat("program: fork: ", strerror(error)));
    }
    if (pid == 0) {
      // The child: async-signal-safe calls only until exec.
      int error = 0;
      if (setpgid(0, group) != 0) {  // never a rank outside the group: it could outlive it
        error = errno;
        (void)!write(err[1], &error, sizeof(error));
        _exit(127);
      }
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
      dup2(devnull, 0);
      dup2(out[1], 1);
      dup2(out[1], 2);
      if (chdir(attempt.code_dir.c_str()) != 0) {
        error = errno;
      } else {
        execve(exe.c_str(), argv_c.data(), env_c);
        error = errno;
      }
      (void)!write(err[1], &error, sizeof(error));
      _exit(127);
    }
    setpgid(pid, rank == 0 ? pid : pid_);  // as the child does: no race on who is first
    close(out[1]);
    close(err[1]);
    int error = 0;
    const ssize_t got = read(err[0], &error, sizeof(error));
    close(err[0]);
    if (got == sizeof(error)) {
      close(out[0]);
      waitpid(pid, nullptr, 0);
      close(devnull);
      abandon();
      if (rank > 0) {  // rank 0 ran the same command: this one could start next time
        return absl::InternalError(absl::StrCat("program: cannot start rank ", rank, " of ", world_,
                                                ": ", strerror(error)));
      }
      *permanent = true;
      return absl::FailedPreconditionError(absl::StrCat("program: cannot run ", exe, " in ",
                                                        attempt.code_dir, ": ", strerror(error)));
    }
    pids_[rank] = pid;
    status_[rank] = 0;
    if (rank == 0) pid_ = pid;
    out_[rank].fd = out[0];
  }
  close(devnull);
  last_step_time_ = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    open_outputs_ = world_;
  }
  for (int rank = 0; rank < world_; ++rank) {
    out_[rank].reader = std::thread([this, rank] { ReadOutput(rank); });
  }
  return absl::OkStatus();
}

ProgramProcess::~ProgramProcess() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // rank 0's reader stops waiting for room for its events
  }
  KillAndReap();
  for (Output& out : out_) {
    if (out.log_fd >= 0) close(out.log_fd);
  }
}

void ProgramProcess::KillAndReap() {
  if (pid_ > 0) kill(-pid_, SIGKILL);
  for (pid_t& pid : pids_) {
    if (pid > 0) waitpid(pid, nullptr, 0);
    pid = -1;
  }
  pid_ = -1;
  for (Output& out : out_) {
    if (out.reader.joinable()) out.reader.join();
    if (out.fd >= 0) close(out.fd);
    out.fd = -1;
  }
}

void ProgramProcess::ReadOutput(int rank) {
  Output& out = out_[rank];
  std::string partial;
  bool cut = false;  // the current line was longer than kMaxProgramLineBytes
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(out.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    WriteLog(&out, absl::string_view(buf, static_cast<size_t>(n)));
    absl::string_view chunk(buf, static_cast<size_t>(n));
    while (!chunk.empty()) {
      const size_t nl = chunk.find('\n');
      const absl::string_view piece = chunk.substr(0, nl);
      if (!cut) {
        const size_t room = kMaxProgramLineBytes - partial.size();
        partial.append(piece.data(), std::min(room, piece.size()));
        if (piece.size() > room) cut = true;
      }
      if (nl == absl::string_view::npos) break;
      Line(rank, partial);
      partial.clear();
      cut = false;
      chunk.remove_prefix(nl + 1);
    }
  }
  if (!partial.empty()) Line(rank, partial);
  absl::MutexLock lock(&mu_);
  --open_outputs_;
  cv_.SignalAll();
}

void ProgramProcess::Line(int rank, absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  // Only rank 0 reports: the other ranks' lines are kept in their logs and tails, never read.
  std::vector<ProgramEvent> events;
  if (rank == 0) events = parser_.Parse(line);
  absl::MutexLock lock(&mu_);
  std::deque<std::string>& tail = tails_[rank];
  tail.emplace_back(line.substr(0, kTailLineBytes));
  if (line.size() > kTailLineBytes) tail.back() += " [...]";
  while (tail.size() > kProgramTailLines) tail.pop_front();
  if (events.empty()) return;
  // Backpressure: the program blocks on a full pipe while the run loop catches up.
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return events_.size() < kMaxQueuedEvents || closing_;
  };
  mu_.Await(absl::Condition(&room));
  for (ProgramEvent& e : events) events_.push_back(std::move(e));
  cv_.SignalAll();
}

void ProgramProcess::WriteLog(Output* out, absl::string_view bytes) {
  if (out->log_fd < 0) return;
  if (out->log_bytes + static_cast<int64_t>(bytes.size()) > log_limit_ / 2) {
    // Keep at most the limit: the older half moves to LOG.1, replacing the half before it.
    close(out->log_fd);
    std::error_code ec;
    fs::rename(out->log_path, out->log_path + ".1", ec);
    out->log_fd = open(out->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    out->log_bytes = 0;
    if (out->log_fd < 0) return;
    if (static_cast<int64_t>(bytes.size()) > log_limit_ / 2) {
      bytes = bytes.substr(bytes.size() - static_cast<size_t>(log_limit_ / 2));
    }
  }
  while (!bytes.empty()) {
    const ssize_t n = write(out->log_fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    out->log_bytes += n;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

void ProgramProcess::Notice(TrainerObserver* observer, const std::string& kind,
                            const std::string& line) {
  const int n = ++notices_[kind];
  if (n > kMaxNoticesPerKind) return;
  observer->OnNotice(absl::StrCat(
      "program: ", line, n == kMaxNoticesPerKind ? " (further ones are not reported)" : ""));
}

void ProgramProcess::Handle(const ProgramEvent& e, TrainerObserver* observer) {
  const int64_t total = a_.config.train().steps();
  if (stop_ == Stop::kRollback) return;  // the rest of a process being rolled back
  switch (e.kind) {
    case Kind::kStep: {
      const int64_t step = e.step.step();
      if (step <= last_step_ || step < 1 || step > total) {
        Notice(observer, "step",
               absl::StrCat("step ", step, " dropped: ",
                            step > total ? absl::StrCat("past the run's ", total, " steps")
                                         : absl::StrCat("not after step ", last_step_)));
        return;
      }
      StepMetrics m = e.step;
      const absl::Time now = absl::Now();
      if (e.tokens > 0) {
        tokens_ += e.tokens;
        const double dt = absl::ToDoubleSeconds(now - last_step_time_);
        // Steps between two lines (a program that reports every 10th) trained alike.
        const int64_t steps = last_step_ > 0 ? step - last_step_ : 1;
        if (dt > 0) m.set_tokens_per_s(static_cast<double>(e.tokens * steps) / dt);
      }
      if (!std::isfinite(m.lr()) || m.lr() < 0) m.set_lr(0);
      last_step_time_ = now;
      last_step_ = step;
      recent_losses_.push_back(m.loss());
      if (recent_losses_.size() > 50) recent_losses_.pop_front();
      SpikeMonitor::Verdict verdict = spikes_->Observe(
          step, m.loss(),
          e.grad_norm_reported ? std::optional<double>(m.grad_norm()) : std::nullopt);
      const SpikePolicy policy = a_.config.train().spike().policy();
      for (SpikeEvent& s : verdict.events) {
        // A program's update happened: nothing was skipped; STOP makes a spike a divergence.
        const bool stops = verdict.diverged || (policy == SPIKE_STOP && verdict.spike);
        s.set_action(stops ? SPIKE_ACTION_STOPPED : SPIKE_ACTION_RECORDED);
      }
      if (observer->OnStep(m) == TrainerObserver::Directive::kStop && stop_ == Stop::kNone) {
        stop_ = Stop::kCancel;
        Terminate();
      }
      const bool roll_back = policy == SPIKE_ROLLBACK && verdict.spike && !verdict.diverged &&
                             rollbacks_ < kMaxRollbacks && last_checkpoint_ > 0 &&
                             stop_ == Stop::kNone;
      if (roll_back) {
        // Relaunched from the checkpoint before the spike, past the spike's batches (Run).
        rollback_from_ = last_checkpoint_;
        rollback_to_ = step + a_.config.train().spike().rollback_skip_batches();
        for (SpikeEvent& s : verdict.events) {
          s.set_action(SPIKE_ACTION_ROLLED_BACK);
          s.set_rollback_to_step(rollback_from_);
        }
        stop_ = Stop::kRollback;
        Terminate();
      }
      for (const SpikeEvent& s : verdict.events) observer->OnSpike(s);
      if ((verdict.diverged || (policy == SPIKE_STOP && verdict.spike)) && stop_ == Stop::kNone) {
        stop_ = Stop::kDiverged;
        diverged_ = verdict.reason.empty()
                        ? absl::StrCat("a loss spike at step ", step, " (spike.policy STOP)")
                        : verdict.reason;
        Terminate();
      }
      return;
    }
    case Kind::kEval: {
      if (e.eval.step() < 0 || e.eval.step() > total) {
        Notice(observer, "eval",
               absl::StrCat("evaluation of step ", e.eval.step(), " dropped: past the run's ",
                            total, " steps"));
        return;
      }
      if (!e.message.empty()) Notice(observer, "metrics", e.message);
      last_eval_ = e.eval;
      has_eval_ = true;
      observer->OnEval(e.eval);
      return;
    }
    case Kind::kCheckpoint:
      if (e.checkpoint_step < last_checkpoint_ || e.checkpoint_step > total) {
        Notice(observer, "ckpt",
               absl::StrCat("checkpoint of step ", e.checkpoint_step,
                            " dropped: before the last or past the end"));
        return;
      }
      last_checkpoint_ = e.checkpoint_step;
      observer->OnCheckpoint(e.checkpoint_step, a_.checkpoint_dir);
      return;
    case Kind::kParams:
      if (e.params.total() != params_.total() || e.params.activated() != params_.activated()) {
        observer->OnParams(e.params);
      }
      params_ = e.params;
      return;
    case Kind::kEnd:
      saw_end_ = true;
      return;
    case Kind::kError:
      error_message_ = e.message.substr(0, 4096);
      error_permanent_ = error_permanent_ || e.permanent;
      return;
    case Kind::kInvalid:
      Notice(observer, "invalid", absl::StrCat("a report was not read: ", e.message));
      return;
  }
}

void ProgramProcess::Terminate() {
  if (pid_ <= 0 || kill_at_ != absl::InfiniteFuture()) return;
  if (stop_ == Stop::kRollback) {
    // No checkpoint of the weights past the spike may be written: killed, not asked.
    kill(-pid_, SIGKILL);
    kill_at_ = absl::Now();
    return;
  }
  kill(-pid_, SIGTERM);
  kill_at_ = absl::Now() + grace_;
}

void ProgramProcess::KillIfDue() {
  if (pid_ > 0 && absl::Now() >= kill_at_) kill(-pid_, SIGKILL);
}

std::string ProgramProcess::Tail(int rank) {
  absl::MutexLock lock(&mu_);
  const std::deque<std::string>& tail = tails_[rank];
  if (tail.empty()) return "; it printed nothing";
  return absl::StrCat("; its last lines:\n  ", absl::StrJoin(tail, "\n  "));
}

RunSummary ProgramProcess::Summary(RunState state, const std::string& reason) const {
  RunSummary s;
  s.set_state(state);
  s.set_reason(reason);
  s.set_steps_done(last_step_);
  if (!recent_losses_.empty()) {
    s.set_final_train_loss(std::accumulate(recent_losses_.begin(), recent_losses_.end(), 0.0) /
                           static_cast<double>(recent_losses_.size()));
  }
  if (has_eval_) *s.mutable_final_eval() = last_eval_;
  s.set_spike_steps(0);
  const double wall = absl::ToDoubleSeconds(absl::Now() - started_);
  s.set_wall_s(wall);
  if (wall > 0 && tokens_ > 0) s.set_tokens_per_s(static_cast<double>(tokens_) / wall);
  if (params_.total() > 0) *s.mutable_params() = params_;
  return s;
}

void ProgramProcess::ReapRanks(TrainerObserver* observer) {
  auto others_running = [this] {
    return std::any_of(pids_.begin() + 1, pids_.end(), [](pid_t p) { return p > 0; });
  };
  const absl::Time now = absl::Now();
  // The other ranks first: one whose failure ends rank 0 in the same instant is the cause.
  for (int i = 1; i <= world_; ++i) {
    const int rank = i % world_;
    if (pids_[rank] <= 0) continue;
    int status = 0;
    if (waitpid(pids_[rank], &status, WNOHANG) != pids_[rank]) continue;
    pids_[rank] = -1;
    status_[rank] = status;
    if (rank == 0) {
      if (!others_running()) {
        // Whatever it left behind in its group goes with it (and closes the pipe).
        kill(-pid_, SIGKILL);
        continue;
      }
      // The other ranks get grace_s to end by themselves. After a rank 0 that failed they cannot
      // go on (their next collective waits for it): asked to stop now.
      if (!ExitedZero(status) && kill_at_ == absl::InfiniteFuture()) kill(-pid_, SIGTERM);
      others_kill_at_ = now + grace_;
      continue;
    }
    const bool failed = !ExitedZero(status);
    if (pids_[0] > 0) {
      if (failed && stop_ == Stop::kNone) {
        // Rank 0 would wait for it at its next collective: the attempt ends, naming it. An exit
        // 2 or 3 is a verdict every rank reaches at the same step (a permanent failure, a
        // divergence): rank 0 first gets grace_s to end on the same terms, and decide.
        stop_ = Stop::kRankFailed;
        failed_rank_ = rank;
        const bool verdict =
            WIFEXITED(status) && (WEXITSTATUS(status) == 2 || WEXITSTATUS(status) == 3);
        Notice(observer, "rank",
               absl::StrCat(
                   "rank ", rank, " of ", world_, " ", ExitText(status), " while rank 0 ran: ",
                   verdict ? "rank 0 has grace_s to end likewise" : "stopping the other ranks"));
        terminate_at_ = verdict ? now + grace_ : now;
      }
      continue;
    }
    if (failed && stop_ == Stop::kNone && ExitedZero(status_[0])) {
      Notice(observer, "rank",
             absl::StrCat("rank ", rank, " of ", world_, " ", ExitText(status),
                          " after rank 0 ended (rank 0's results stand)"));
    }
    if (!others_running()) kill(-pid_, SIGKILL);  // the last rank: whatever the ranks left goes
  }
  if (stop_ == Stop::kRankFailed && pids_[0] > 0 && now >= terminate_at_) Terminate();
  if (pids_[0] <= 0 && now >= others_kill_at_ && others_running()) {
    if (stop_ == Stop::kNone && ExitedZero(status_[0])) {
      std::vector<int> left;
      for (int rank = 1; rank < world_; ++rank) {
        if (pids_[rank] > 0) left.push_back(rank);
      }
      Notice(observer, "rank",
             absl::StrCat("rank", left.size() > 1 ? "s " : " ", absl::StrJoin(left, ", "),
                          " still running ", absl::FormatDuration(grace_),
                          " (grace_s) after rank 0 ended: killed"));
    }
    kill(-pid_, SIGKILL);
    others_kill_at_ = absl::InfiniteFuture();
  }
}

absl::StatusOr<RunSummary> ProgramProcess::Run(TrainerObserver* observer,
                                               const std::atomic<bool>* interrupt,
                                               const std::function<bool()>& should_stop,
                                               bool* permanent) {
  *permanent = false;
  while (true) {
    const bool running = std::any_of(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; });
    std::deque<ProgramEvent> batch;
    bool eof = false;
    {
      absl::MutexLock lock(&mu_);
      if (events_.empty() && (open_outputs_ > 0 || running)) {
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      }
      batch.swap(events_);
      eof = open_outputs_ == 0;
      if (!batch.empty()) cv_.SignalAll();  // room for the reader
    }
    for (const ProgramEvent& e : batch) Handle(e, observer);
    if (stop_ == Stop::kNone) {
      if (interrupt != nullptr && interrupt->load()) {
        stop_ = Stop::kInterrupt;
        Terminate();
      } else if (should_stop && should_stop()) {
        stop_ = Stop::kCancel;
        Terminate();
      }
    }
    KillIfDue();
    ReapRanks(observer);
    const bool exited = std::all_of(pids_.begin(), pids_.end(), [](pid_t p) { return p <= 0; });
    if (exited && eof) {
      {
        absl::MutexLock lock(&mu_);
        if (!events_.empty()) continue;
      }
      if (stop_ != Stop::kRollback) break;
      // A rollback: every rank relaunched from the checkpoint before the spike, told which steps
      // to skip.
      for (Output& out : out_) {
        out.reader.join();
        close(out.fd);
        out.fd = -1;
      }
      ++rollbacks_;
      stop_ = Stop::kNone;
      kill_at_ = absl::InfiniteFuture();
      others_kill_at_ = absl::InfiniteFuture();
      terminate_at_ = absl::InfiniteFuture();
      last_step_ = rollback_from_;
      const std::string skip = absl::StrCat(rollback_from_, "-", rollback_to_);
      observer->OnNotice(absl::StrCat("program: rolled back to the checkpoint of step ",
                                      rollback_from_, ", skipping the batches of steps ",
                                      rollback_from_ + 1, "-", rollback_to_,
                                      " (ABLATE_ROLLBACK=", skip, ")"));
      if (absl::Status s = Launch(rollback_from_, skip, permanent); !s.ok()) {
        pid_ = -1;
        return s;
      }
    }
  }
  pid_ = -1;
  for (Output& out : out_) {
    if (out.reader.joinable()) out.reader.join();
    if (out.fd >= 0) close(out.fd);
    out.fd = -1;
  }
  return Ending(status_[0], permanent);
}

absl::StatusOr<RunSummary> ProgramProcess::Ending(int status, bool* permanent) {
  *permanent = false;
  const std::string how = ExitText(status);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  switch (stop_) {
    case Stop::kInterrupt:
      return Summary(INTERRUPTED, absl::StrCat("the worker stopped; the program ", how));
    case Stop::kCancel:
      return Summary(CANCELLED, "stopped by the coordinator");
    case Stop::kDiverged:
      return Summary(DIVERGED, diverged_);
    case Stop::kNone:
    case Stop::kRollback:
    case Stop::kRankFailed:
      break;
  }
  // A program read by nanogpt or regex patterns has no `end` line: an exit 0 after its last step
  // is its end.
  const bool own_end = a_.config.program().report() != PROGRAM_REPORT_ABLATE &&
                       last_step_ >= a_.config.train().steps();
  if (code == 0 && (saw_end_ || own_end)) return Summary(SUCCEEDED, "");
  if (code == 0 && a_.stop_at_step > 0 && last_checkpoint_ >= a_.stop_at_step) {
    RunSummary paused = Summary(INTERRUPTED, absl::StrCat("paused at rung ", a_.stop_at_step));
    paused.set_steps_done(a_.stop_at_step);
    return paused;
  }
  if (code == 3) {
    return Summary(DIVERGED, absl::StrCat("the program exited with code 3 (diverged)",
                                          error_message_.empty() ? "" : ": ", error_message_));
  }
  if (stop_ == Stop::kRankFailed && code != 2 && !error_permanent_) {
    // Rank 0 was stopped because another rank failed: that rank is the reason, with its lines.
    const int rank_status = status_[failed_rank_];
    *permanent = WIFEXITED(rank_status) && WEXITSTATUS(rank_status) == 2;
    return absl::Status(
        *permanent ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kAborted,
        absl::StrCat("rank ", failed_rank_, " of ", world_, " ", ExitText(rank_status),
                     Tail(failed_rank_)));
  }
  std::string why;
  if (!error_message_.empty()) {
    why = absl::StrCat("the program reported an error: ", error_message_, "; it ", how);
  } else if (code == 0) {
    why = a_.config.program().report() == PROGRAM_REPORT_ABLATE
              ? absl::StrCat(
                    "the program exited 0 without reporting the end",
                    last_step_ == 0 ? " (it reported no step: is program.report right?)" : "")
              : absl::StrCat("the program exited 0 at step ", last_step_, " of ",
                             a_.config.train().steps());
  } else {
    why = absl::StrCat("the program ", world_ > 1 ? "(rank 0) " : "", how);
  }
  *permanent = code == 0 || code == 2 || error_permanent_;
  return absl::Status(
      *permanent ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kAborted,
      absl::StrCat(why, Tail()));
}

}  // namespace ablate
