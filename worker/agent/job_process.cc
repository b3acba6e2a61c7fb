#include "worker/agent/job_process.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/proto_yaml.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/util/delimited_message_util.h"

namespace ablate {

namespace {

constexpr int kEventsFd = 3;

// ---- The job process ----

// Writes events to fd 3; reads the agent's bytes from stdin.
class PipeObserver : public TrainerObserver {
 public:
  // Never destroyed (RunJobProcess leaks it): its reader thread stays blocked in read(0) until
  // the process exits.
  PipeObserver() : reader_([this] { ReadControl(); }) { reader_.detach(); }

  const std::atomic<bool>* interrupt() const { return &interrupt_; }

  // False once the pipe is gone (the agent died): the process stops training.
  bool Write(const JobProcessEvent& event) {
    if (broken_) return false;
    if (!google::protobuf::util::SerializeDelimitedToFileDescriptor(event, kEventsFd)) {
      broken_ = true;
      interrupt_.store(true);
    }
    return !broken_;
  }

  Directive OnStep(const StepMetrics& m) override {
    JobProcessEvent e;
    *e.mutable_step() = m;
    Write(e);
    return stop_.load() || broken_ ? Directive::kStop : Directive::kContinue;
  }
  void OnEval(const EvalResult& eval) override {
    JobProcessEvent e;
    *e.mutable_eval() = eval;
    Write(e);
  }
  void OnSpike(const SpikeEvent& event) override {
    JobProcessEvent e;
    *e.mutable_spike() = event;
    Write(e);
  }
  Directive BeforeCheckpoint(int64_t step) override {
    JobProcessEvent e;
    e.set_before_checkpoint(step);
    if (!Write(e)) return Directive::kStop;
    absl::MutexLock lock(&mu_);
    const auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !answers_.empty() || control_closed_;
    };
    mu_.Await(absl::Condition(&answered));
    if (answers_.empty()) return Directive::kStop;  // the agent is gone
    const char answer = answers_.front();
    answers_.pop_front();
    return answer == 'C' ? Directive::kContinue : Directive::kStop;
  }
  void OnCheckpoint(int64_t step, const std::string& path) override {
    JobProcessEvent e;
    e.mutable_checkpoint()->set_step(step);
    e.mutable_checkpoint()->set_path(path);
    Write(e);
  }
  void OnNotice(const std::string& line) override {
    JobProcessEvent e;
    e.set_notice(line);
    Write(e);
  }

 private:
  void ReadControl() {
    char byte = 0;
    while (true) {
      const ssize_t n = read(0, &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (byte == 'S') stop_.store(true);
      if (byte == 'I') interrupt_.store(true);
      if (byte == 'C' || byte == 'X') {
        absl::MutexLock lock(&mu_);
        answers_.push_back(byte);
      }
    }
    // The agent closed stdin or died: checkpoint and stop (its next attempt resumes).
    interrupt_.store(true);
    absl::MutexLock lock(&mu_);
    control_closed_ = true;
  }

  std::atomic<bool> stop_{false};
  std::atomic<bool> interrupt_{false};
  bool broken_ = false;  // the training thread's
  absl::Mutex mu_;
  std::deque<char> answers_ ABSL_GUARDED_BY(mu_);
  bool control_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

JobProcessEvent ErrorEvent(const absl::Status& status, bool permanent, int64_t steps) {
  JobProcessEvent e;
  JobProcessError* error = e.mutable_error();
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message()));
  error->set_permanent(permanent);
  error->set_steps_done(steps);
  return e;
}

}  // namespace

int RunJobProcess(const JobProcessOptions& options) {
  signal(SIGPIPE, SIG_IGN);  // a dead agent shows as a failed write
  PipeObserver& observer = *new PipeObserver();
  absl::StatusOr<RunConfig> config = LoadRunConfigFile(options.config_path);
  if (!config.ok()) {
    return observer.Write(ErrorEvent(config.status(), /*permanent=*/true, 0)) ? 0 : 1;
  }
  TrainerOptions trainer_options;
  trainer_options.checkpoint_dir = options.checkpoint_dir;
  trainer_options.resume = true;
  trainer_options.interrupt = observer.interrupt();
  trainer_options.stop_at_step = options.stop_at_step;
  if (options.world_size > 1) {
    trainer_options.world_size = options.world_size;
    trainer_options.rank = 0;
    trainer_options.rendezvous = options.rendezvous;
    trainer_options.collective_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(options.collective_timeout_s * 1000));
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config, trainer_options);
  if (!trainer.ok()) {
    // An invalid config or missing data fails the same way on every worker and every attempt.
    const bool permanent =
        absl::IsInvalidArgument(trainer.status()) || absl::IsNotFound(trainer.status());
    return observer.Write(ErrorEvent(trainer.status(), permanent, 0)) ? 0 : 1;
  }
  JobProcessEvent started;
  started.set_started_step((*trainer)->step());
  if (!observer.Write(started)) return 1;
  absl::StatusOr<RunSummary> summary = (*trainer)->Run(&observer);
  JobProcessEvent end;
  if (summary.ok()) {
    *end.mutable_summary() = *summary;
  } else {
    end = ErrorEvent(summary.status(), /*permanent=*/false, (*trainer)->step());
  }
  return observer.Write(end) ? 0 : 1;
}

// ---- The agent's side ----

absl::StatusOr<std::unique_ptr<JobProcess>> JobProcess::Start(std::string binary,
                                                              const JobProcessOptions& options) {
  if (binary.empty()) {
    std::error_code ec;
    binary = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  }
  std::vector<std::string> args = {binary,
                                   "job-process",
                                   "--config",
                                   options.config_path,
                                   "--checkpoint-dir",
                                   options.checkpoint_dir};
  if (options.stop_at_step > 0) {
    args.insert(args.end(), {"--stop-at-step", std::to_string(options.stop_at_step)});
  }
  if (options.world_size > 1) {
    args.insert(args.end(), {"--world-size", std::to_string(options.world_size), "--rendezvous",
                             options.rendezvous, "--collective-timeout",
                             absl::StrCat(options.collective_timeout_s)});
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int control[2], events[2];
  if (pipe2(control, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("job process: pipe: ", std::strerror(errno)));
  }
  if (pipe2(events, O_CLOEXEC) != 0) {
    close(control[0]);
    close(control[1]);
    return absl::InternalError(absl::StrCat("job process: pipe: ", std::strerror(errno)));
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : options.cpus) CPU_SET(cpu, &cpus);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {control[0], control[1], events[0], events[1]}) close(fd);
    return absl::InternalError(absl::StrCat("job process: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // an agent that dies takes its jobs with it
    if (getppid() != parent) _exit(1);
    // Its own process group: a terminal's Ctrl-C reaches the agent, which interrupts its jobs
    // (checkpoint first), not the job processes directly.
    setpgid(0, 0);
    if (!options.cpus.empty()) sched_setaffinity(0, sizeof(cpus), &cpus);  // its core group
    // The targets lose O_CLOEXEC with dup2 (a pipe already on its target keeps it: cleared).
    if (control[0] == 0) {
      fcntl(0, F_SETFD, 0);
    } else if (dup2(control[0], 0) < 0) {
      _exit(126);
    }
    if (events[1] == kEventsFd) {
      fcntl(kEventsFd, F_SETFD, 0);
    } else if (dup2(events[1], kEventsFd) < 0) {
      _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(control[0]);
  close(events[1]);
  std::unique_ptr<JobProcess> p(new JobProcess());
  p->pid_ = pid;
  p->control_fd_ = control[1];
  p->events_fd_ = events[0];
  p->reader_ = std::thread([raw = p.get()] { raw->ReadEvents(); });
  return p;
}

JobProcess::~JobProcess() {
  if (control_fd_ >= 0) close(control_fd_);
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (reader_.joinable()) reader_.join();  // the pipe's writer is gone: EOF
  if (events_fd_ >= 0) close(events_fd_);
}

void JobProcess::ReadEvents() {
  google::protobuf::io::FileInputStream input(events_fd_);
  while (true) {
    JobProcessEvent event;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&event, &input, &clean_eof)) {
      absl::MutexLock lock(&mu_);
      if (!clean_eof) read_error_ = "an event that does not parse";
      closed_ = true;
      return;
    }
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
}

std::optional<JobProcessEvent> JobProcess::Next(absl::Duration timeout, bool* timed_out) {
  *timed_out = false;
  absl::MutexLock lock(&mu_);
  const auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty() || closed_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    *timed_out = true;
    return std::nullopt;
  }
  if (events_.empty()) return std::nullopt;
  JobProcessEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void JobProcess::Send(char byte) {
  if (control_fd_ < 0) return;
  while (write(control_fd_, &byte, 1) < 0 && errno == EINTR) {
  }
}

std::string JobProcess::Reap(absl::Duration grace) {
  if (pid_ <= 0) return "ended";
  int status = 0;
  const absl::Time deadline = absl::Now() + grace;
  pid_t got = 0;
  while ((got = waitpid(pid_, &status, WNOHANG)) == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (got == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("exit code ", WEXITSTATUS(status));
}

absl::StatusOr<int64_t> JobProcess::WaitStarted(bool* permanent) {
  *permanent = false;
  bool timed_out = false;
  std::optional<JobProcessEvent> e;
  do {
    e = Next(absl::Seconds(1), &timed_out);
  } while (timed_out);
  if (e.has_value() && e->has_started_step()) {
    step_ = e->started_step();
    return step_;
  }
  if (e.has_value() && e->has_error()) {
    *permanent = e->error().permanent();
    return absl::Status(static_cast<absl::StatusCode>(e->error().code()), e->error().message());
  }
  std::string read_error;
  {
    absl::MutexLock lock(&mu_);
    read_error = read_error_;
  }
  return absl::InternalError(absl::StrCat(
      "the job process ended with ", Reap(absl::Seconds(5)), " before its trainer started",
      read_error.empty() ? "" : absl::StrCat(" (", read_error, ")")));
}

absl::StatusOr<RunSummary> JobProcess::Run(TrainerObserver* observer,
                                           const std::atomic<bool>* interrupt,
                                           const std::function<bool()>& should_stop) {
  bool stop_sent = false, interrupt_sent = false;
  const auto stop = [&] {
    if (!stop_sent) Send('S');
    stop_sent = true;
  };
  while (true) {
    if (!interrupt_sent && interrupt != nullptr && interrupt->load()) {
      Send('I');
      interrupt_sent = true;
    }
    if (!stop_sent && should_stop()) stop();
    bool timed_out = false;
    std::optional<JobProcessEvent> e = Next(absl::Milliseconds(50), &timed_out);
    if (timed_out) continue;
    if (!e.has_value()) break;  // closed without an end
    switch (e->event_case()) {
      case JobProcessEvent::kStep:
        step_ = e->step().step();
        if (observer->OnStep(e->step()) == TrainerObserver::Directive::kStop) stop();
        break;
      case JobProcessEvent::kEval:
        observer->OnEval(e->eval());
        break;
      case JobProcessEvent::kSpike:
        observer->OnSpike(e->spike());
        break;
      case JobProcessEvent::kBeforeCheckpoint:
        Send(observer->BeforeCheckpoint(e->before_checkpoint()) ==
                     TrainerObserver::Directive::kContinue
                 ? 'C'
                 : 'X');
        break;
      case JobProcessEvent::kCheckpoint:
        observer->OnCheckpoint(e->checkpoint().step(), e->checkpoint().path());
        break;
      case JobProcessEvent::kNotice:
        observer->OnNotice(e->notice());
        break;
      case JobProcessEvent::kSummary:
        Reap(absl::Seconds(30));
        return e->summary();
      case JobProcessEvent::kError:
        step_ = std::max(step_, e->error().steps_done());
        Reap(absl::Seconds(30));
        return absl::Status(static_cast<absl::StatusCode>(e->error().code()), e->error().message());
      case JobProcessEvent::kStartedStep:
      case JobProcessEvent::EVENT_NOT_SET:
        break;
    }
  }
  std::string read_error;
  {
    absl::MutexLock lock(&mu_);
    read_error = read_error_;
  }
  return absl::InternalError(absl::StrCat(
      "the job process ended with ", Reap(absl::Seconds(5)), " at step ", step_,
      " before the run ended", read_error.empty() ? "" : absl::StrCat(" (", read_error, ")")));
}

}  // namespace ablate
