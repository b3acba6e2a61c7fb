// The worker agent's construction and its RPC loop (agent.h): Register, the AcquireJob long poll
// that leases jobs onto free slots and starts a thread for each, reconnecting with backoff while
// the coordinator is unreachable, Deregister at the end; and `ablate-worker --coordinator`'s
// signal handling. What a job thread does with its job is in job_runners.cc.
#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "proto/ablate.grpc.pb.h"
#include "proto/grpc_status.h"
#include "proto/tls.h"
#include "worker/agent/agent_internal.h"
#include "worker/agent/calls.h"

namespace ablate {

namespace {

using agent::Backoff;
using agent::IsSet;
using agent::SleepUnless;
using agent::Transient;

std::string Hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

}  // namespace

Agent::Impl::Impl(AgentOptions options)
    : options_(std::move(options)),
      log_(options_.log),
      connection_(options_.coordinator, options_.backoff_max, &log_) {
  if (options_.name.empty()) options_.name = absl::StrCat(Hostname(), ":", getpid());
  devices_ = absl::StrSplit(options_.device, ',', absl::SkipEmpty());
  cpu_set_t affinity;
  CPU_ZERO(&affinity);
  if (sched_getaffinity(0, sizeof(affinity), &affinity) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &affinity)) cpus_.push_back(cpu);
    }
  }
  resources_ = DetectResources(devices_.empty() ? "" : devices_[0]);
  resources_.set_slots(options_.slots > 0 ? options_.slots
                                          : std::max<int>(1, static_cast<int>(devices_.size())));
  resources_.set_rendezvous_host(options_.rendezvous_host);
  // The coordinator leases this worker only runs keyed to the sources it was built from.
  resources_.set_code_version(CodeVersion());
  resources_.set_build(BuildVersion());
  grpc::ChannelArguments args;
  // The channel reconnects by itself; keep its backoff within ours so a coordinator that
  // comes back is seen within backoff_max.
  const int min_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.backoff_min));
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.backoff_max));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(1, min_ms));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(1, min_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(1, max_ms));
  // A program run's job carries its code (up to kMaxProgramCodeBytes each, several per reply).
  args.SetMaxReceiveMessageSize(64 << 20);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options_.tls_ca);
  if (!credentials.ok()) {
    credentials_ = credentials.status();  // Run() reports it
    return;
  }
  channel_ = grpc::CreateCustomChannel(options_.coordinator, *credentials, args);
  stub_ = WorkerService::NewStub(channel_);
}

void Agent::Impl::Prepare(grpc::ClientContext* context, absl::Duration deadline) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
}

absl::Status Agent::Impl::Refused(const char* call, const grpc::Status& status) const {
  const bool auth = status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                    status.error_code() == grpc::StatusCode::PERMISSION_DENIED;
  return absl::Status(FromGrpcStatus(status).code(),
                      absl::StrCat("coordinator ", options_.coordinator, " refused ", call, ": ",
                                   FromGrpcStatus(status).ToString(),
                                   auth ? " (check --token-file or ABLATE_TOKEN: the "
                                          "coordinator's STATE_DIR/worker-token)"
                                        : ""));
}

grpc::Status Agent::Impl::CallAcquire(absl::Duration wait, int max_jobs,
                                      AcquireJobResponse* response) {
  AcquireJobRequest request;
  request.set_worker_id(worker_id_);
  request.set_worker_secret(worker_secret_);
  request.set_max_jobs(max_jobs);
  request.set_wait_s(static_cast<int32_t>(
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(wait, absl::Seconds(1))))));
  grpc::ClientContext context;
  Prepare(&context, absl::Seconds(request.wait_s()) + options_.call_deadline);
  // Asynchronous, so that an interrupt need not wait out the long poll.
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub_->async()->AcquireJob(&context, &request, response, [&](grpc::Status s) {
    absl::MutexLock lock(&mu);
    status = std::move(s);
    done = true;
  });
  absl::MutexLock lock(&mu);
  bool cancelled = false;
  // Only an interrupt cancels it: a poll cancelled as the coordinator leased its jobs would lose
  // them until their leases expired. Slots that come free meanwhile are filled by the Finish that
  // freed them (acquire_next) or by the next poll.
  while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
    if (!cancelled && Interrupted()) {
      context.TryCancel();
      cancelled = true;
    }
  }
  return status;
}

absl::StatusOr<AgentResult> Agent::Impl::Run() {
  absl::StatusOr<AgentResult> result = Loop();
  if (worker_id_ != 0) Leave();
  return result;
}

void Agent::Impl::Leave() {
  DeregisterRequest request;
  request.set_worker_id(worker_id_);
  request.set_worker_secret(worker_secret_);
  DeregisterResponse response;
  grpc::ClientContext context;
  Prepare(&context, std::min(options_.call_deadline, absl::Seconds(2)));
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  if (status.ok()) {
    log_(absl::StrCat("left the coordinator (worker ", worker_id_.load(), " is GONE)"));
  } else {
    log_(absl::StrCat("could not tell the coordinator this worker leaves: ",
                      FromGrpcStatus(status).ToString()));
  }
}

absl::Status Agent::Impl::CheckOptions() const {
  if (options_.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT (or ABLATE_COORDINATOR) is required");
  }
  if (options_.max_batch_points < 1) {
    return absl::InvalidArgumentError("max_batch_points must be >= 1");
  }
  return credentials_;
}

absl::StatusOr<AgentResult> Agent::Impl::Loop() {
  if (absl::Status valid = CheckOptions(); !valid.ok()) return valid;
  {
    absl::MutexLock lock(&mu_);
    slot_busy_.assign(slots(), false);
    idle_since_ = absl::Now();
  }
  Backoff backoff(options_.backoff_min, options_.backoff_max);
  bool registered = false;
  while (true) {
    if (IsSet(options_.interrupt)) interrupt_.store(true);
    const Turn turn = NextTurn(registered);
    if (turn.action == Turn::kStop) break;
    if (turn.action == Turn::kWaited) continue;
    if (options_.idle_exit > absl::ZeroDuration() && turn.idle >= options_.idle_exit) {
      log_(absl::StrCat("no job for ", absl::FormatDuration(options_.idle_exit), ": exiting"));
      break;
    }
    const char* call = registered ? "AcquireJob" : "Register";
    const grpc::Status status = registered
                                    ? TryAcquire(turn.want, turn.idle, &registered, &backoff)
                                    : TryRegister(&registered, &backoff);
    if (status.ok()) continue;
    if (!Transient(status.error_code())) return EndLoop(Refused(call, status));
    connection_.Unreachable(call, status);
    registered = false;  // a restarted coordinator may not know us
    SleepUnless(backoff.Next(), options_.interrupt);
  }
  return EndLoop(AgentResult());
}

Agent::Impl::Turn Agent::Impl::NextTurn(bool registered) {
  absl::MutexLock lock(&mu_);
  if (!fatal_.ok()) interrupt_.store(true);
  if (Interrupted()) {
    if (fatal_.ok()) log_("interrupted: exiting");
    return {Turn::kStop};
  }
  if (options_.max_jobs > 0 && result_.jobs >= options_.max_jobs && asking_ == 0) {
    if (threads_running_ > 0) {
      mu_.AwaitWithTimeout(
          absl::Condition(+[](int* running) { return *running == 0; }, &threads_running_),
          absl::Milliseconds(50));
      return {Turn::kWaited};
    }
    log_(absl::StrCat("done: ", result_.jobs, " job", result_.jobs == 1 ? "" : "s"));
    return {Turn::kStop};
  }
  Turn turn;
  if (threads_running_ == 0) turn.idle = absl::Now() - idle_since_;
  // A Finish asking for a next job keeps a slot for it.
  turn.want = MayTakeMore() ? slots() - claimed_ - asking_ : 0;
  if (options_.max_jobs > 0) {
    turn.want = std::min<int64_t>(turn.want, options_.max_jobs - result_.jobs - asking_);
  }
  if (registered && turn.want <= 0) {
    // Every slot is held: wait for one to come free.
    struct Seen {
      int64_t* changes;
      int64_t seen;
    } arg{&changes_, changes_};
    mu_.AwaitWithTimeout(absl::Condition(+[](Seen* a) { return *a->changes != a->seen; }, &arg),
                         absl::Milliseconds(50));
    return {Turn::kWaited};
  }
  return turn;
}

grpc::Status Agent::Impl::TryRegister(bool* registered, Backoff* backoff) {
  RegisterRequest request;
  request.set_name(options_.name);
  *request.mutable_resources() = resources_;
  RegisterResponse response;
  grpc::ClientContext context;
  Prepare(&context, options_.call_deadline);
  const grpc::Status status = stub_->Register(&context, request, &response);
  if (!status.ok()) return status;
  connection_.Reachable();
  backoff->Reset();
  *registered = true;
  {
    absl::MutexLock lock(&mu_);
    ++result_.registrations;
  }
  worker_id_ = response.worker_id();
  worker_secret_ = response.worker_secret();
  lease_timeout_ = absl::Seconds(response.lease_timeout_s());
  log_(absl::StrFormat("registered with %s as worker %d (%s: %s%s, %d cores, %.1f GB%s; built "
                       "from %s)",
                       options_.coordinator, worker_id_.load(), options_.name, resources_.device(),
                       slots() > 1 ? absl::StrCat(" x ", slots(), " slots") : "",
                       resources_.cores(), resources_.memory_gb(),
                       resources_.slurm_job().empty()
                           ? ""
                           : absl::StrCat(", SLURM job ", resources_.slurm_job()),
                       resources_.build()));
  return status;
}

grpc::Status Agent::Impl::TryAcquire(int want, absl::Duration idle, bool* registered,
                                     Backoff* backoff) {
  absl::Duration wait = options_.acquire_wait;
  if (options_.idle_exit > absl::ZeroDuration()) wait = std::min(wait, options_.idle_exit - idle);
  AcquireJobResponse response;
  const grpc::Status status = CallAcquire(wait, want, &response);
  if (status.error_code() == grpc::StatusCode::CANCELLED) return grpc::Status::OK;  // an interrupt
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    log_(absl::StrCat("the coordinator does not know worker ", worker_id_.load(),
                      ": registering again"));
    *registered = false;
    return grpc::Status::OK;
  }
  if (!status.ok()) return status;
  connection_.Reachable();
  backoff->Reset();
  // Said once, not at every poll: again only when the reason changes or comes back.
  if (response.waiting() != waiting_ && !response.waiting().empty()) {
    log_(absl::StrCat("no job for this build: ", response.waiting(),
                      " (rebuild this worker from their sources)"));
  }
  waiting_ = response.waiting();
  if (!response.has_job()) return status;
  std::vector<Job> jobs = {response.job()};
  for (const Job& more : response.more_jobs()) jobs.push_back(more);
  for (Job& job : jobs) {
    {
      absl::MutexLock lock(&mu_);
      Claim(job);
      ++threads_running_;
    }
    // Each Finish may hand over the next job: no AcquireJob between back-to-back jobs.
    threads_.emplace_back([this, job = std::move(job)] { JobThread(job); });
  }
  return status;
}

absl::StatusOr<AgentResult> Agent::Impl::EndLoop(absl::StatusOr<AgentResult> r) {
  interrupt_.store(true);  // jobs still training checkpoint and finish INTERRUPTED
  JoinJobs();
  absl::MutexLock lock(&mu_);
  if (!fatal_.ok()) return fatal_;
  if (!r.ok()) return r;
  return result_;
}

void Agent::Impl::JoinJobs() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (threads_running_ == 0) break;
    }
    if (IsSet(options_.interrupt)) interrupt_.store(true);  // a signal while we wait
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() = default;

absl::StatusOr<AgentResult> Agent::Run() { return impl_->Run(); }

WorkerResources Agent::DetectResources(const std::string& device) {
  WorkerResources r;
  r.set_device(device.empty() ? "cpu" : device);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  r.set_cores(affinity > 0 ? affinity : static_cast<int>(std::thread::hardware_concurrency()));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemTotal:") {
      r.set_memory_gb(static_cast<double>(kb) / (1024.0 * 1024.0));
      break;
    }
    meminfo.ignore(256, '\n');
  }
  r.set_hostname(Hostname());
  // An array task has a job id of its own; squeue and scancel name it <array job>_<task>.
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  const std::string array_job = env("SLURM_ARRAY_JOB_ID"), task = env("SLURM_ARRAY_TASK_ID");
  if (!array_job.empty() && !task.empty()) {
    r.set_slurm_job(absl::StrCat(array_job, "_", task));
  } else if (const std::string job = env("SLURM_JOB_ID"); !job.empty()) {
    r.set_slurm_job(job);
  }
  return r;
}

namespace {

std::atomic<bool> g_interrupt{false};
std::atomic<bool> g_abort{false};

// First signal: interrupt (checkpoint, flush, finish INTERRUPTED). Second: stop waiting.
extern "C" void OnAgentSignal(int) {
  if (g_interrupt.exchange(true)) g_abort.store(true);
}

}  // namespace

int RunAgentCommand(AgentOptions options) {
  options.interrupt = &g_interrupt;
  options.abort = &g_abort;
  Agent agent(std::move(options));
  std::signal(SIGINT, OnAgentSignal);
  std::signal(SIGTERM, OnAgentSignal);
  absl::StatusOr<AgentResult> result = agent.Run();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!result.ok()) {
    std::fprintf(stderr, "ablate-worker: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace ablate
