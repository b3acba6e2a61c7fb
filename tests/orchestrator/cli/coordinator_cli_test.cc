// The `ablate` client commands run in-process (RunAblateCli) against a real coordinator on
// loopback, and the real `ablate serve` process: defaults from the state dir, SIGTERM.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "orchestrator/cli/cost.h"
#include "orchestrator/cli/serving.h"
#include "orchestrator/sweep/expand.h"
#include "tests/cli_util.h"
#include "tests/orchestrator/cli/coordinator_cli_fixture.h"
#include "tests/process_util.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing::CliResult;
using testing::RunCli;

class CoordinatorCliTest : public CoordinatorCliFixture {
 protected:
  void SetUp() override {
    CoordinatorCliFixture::SetUp();
    spec_path_ = SpecFile("quick");
  }
  // A fake worker takes every queued run and finishes it (the second DIVERGED).
  void TrainAll() {
    const int64_t worker = RegisterWorker("cli-worker");
    for (int i = 0;; ++i) {
      AcquireJobResponse r = TryAcquire(worker);
      if (!r.has_job()) break;
      ReportRequest report = MakeReport(worker, r.job(), 1, {1, 2, 3});
      if (i == 1) {
        AddLossSpike(&report, 3, 55, 4, SPIKE_DIVERGENCE)->set_action(SPIKE_ACTION_STOPPED);
      }
      ReportResponse reply;
      ASSERT_TRUE(CallReport(report, &reply).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      ASSERT_TRUE(CallFinish(worker, r.job(), i == 1 ? DIVERGED : SUCCEEDED).ok());
    }
  }
  // `ablate ARGS` on a thread of its own while TrainAll() trains the sweep, which it starts once
  // `ready` returns (what the command must have done first): what the command printed.
  CliResult CliWhileTraining(const std::vector<std::string>& args,
                             const std::function<void()>& ready) {
    CliResult result;
    std::thread cli([&] { result = Cli(args); });
    ready();
    TrainAll();
    cli.join();
    return result;
  }
  std::string spec_path_;
};

TEST_F(CoordinatorCliTest, SubmitStatusTableExportQuery) {
  CliResult r = Cli({"submit", spec_path_});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 runs, 4 queued, 0 reused"));
  r = Cli({"submit", spec_path_});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("already exists with these 4 runs: nothing new was queued"));
  EXPECT_THAT(r.out, Not(HasSubstr("reused")));

  r = Cli({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("quick"));
  EXPECT_THAT(r.out, HasSubstr("4 PENDING"));
  // For programs: the ListSweepsResponse, every field, proto names.
  r = Cli({"status", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"sweeps\": ["));
  EXPECT_THAT(r.out, HasSubstr("\"name\": \"quick\""));
  EXPECT_THAT(r.out, HasSubstr("\"total_runs\": 4"));
  EXPECT_THAT(r.out, HasSubstr("\"workers\": ["));
  r = Cli({"status", "quick", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"runs\": ["));
  EXPECT_THAT(r.out, HasSubstr("\"variant\": \"g1_headwise\""));
  EXPECT_THAT(r.out, HasSubstr("\"state\": \"PENDING\""));
  EXPECT_EQ(Cli({"status", "--format", "csv"}).code, 2);

  TrainAll();
  r = Cli({"status", "quick"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("3 SUCCEEDED, 1 DIVERGED"));
  EXPECT_THAT(r.out, HasSubstr("g1_headwise"));

  r = Cli({"table", "quick"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("| baseline |"));
  EXPECT_THAT(r.out, HasSubstr("2.500"));
  r = Cli({"table", "quick", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"variant\""));
  // Compute-matched: each run's evaluation at or below the budget (tests/orchestrator/store/
  // costs_test.cc checks the values); one budget at a time, and not with --best.
  r = Cli({"table", "quick", "--at-tokens", "1e9"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("| baseline |"));
  EXPECT_EQ(Cli({"table", "quick", "--at-tokens", "1e9", "--at-flops", "1e12"}).code, 2);
  EXPECT_EQ(Cli({"table", "quick", "--at-tokens", "-5"}).code, 2);
  r = Cli({"table", "quick", "--at-flops", "1e12", "--best"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--at-tokens and --at-flops go with the plain table"));

  r = Cli({"export", "quick", "--format", "csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 5);  // header + 4 runs
  EXPECT_THAT(r.out, HasSubstr("val_loss"));
  r = Cli({"export", "quick", "--format", "json", "--steps"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"grad_norm\""));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '{'), 12);  // 4 runs x 3 steps

  r = Cli({"query", "SELECT variant, state FROM run_summary ORDER BY run_id", "--format", "csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("g1_elementwise,DIVERGED"));
}

// A result cut at the row cap says so on stderr, in every format; JSON keeps one shape.
TEST_F(CoordinatorCliTest, QueryOutputSaysWhereItStopsAndKeepsOneShape) {
  ASSERT_EQ(Cli({"submit", spec_path_}).code, 0);
  const std::string sql = "SELECT run_id FROM run_summary ORDER BY run_id";
  CliResult r = Cli({"query", sql, "--format", "csv", "--max-rows", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "run_id\n1\n2\n");
  EXPECT_THAT(r.err, HasSubstr("stops at 2 rows and more exist"));
  EXPECT_THAT(r.err, HasSubstr("--max-rows"));
  r = Cli({"query", sql, "--format", "csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* max_rows : {"2", "0"}) {
    r = Cli({"query", sql, "--format", "json", "--max-rows", max_rows});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.substr(0, 1), "[") << r.out;  // an array of rows, truncated or not
  }
  r = Cli({"query", sql, "--max-rows", "-5"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out + r.err, HasSubstr("--max-rows"));
}

// `ablate status` shows a running run's latest reported loss, as docs/cli.md says.
TEST_F(CoordinatorCliTest, StatusShowsTheLatestReportedLossWhileARunTrains) {
  ASSERT_EQ(Cli({"submit", spec_path_}).code, 0);
  const int64_t worker = RegisterWorker("w");
  const Job job = Acquire(worker);
  ReportResponse reply;
  ASSERT_TRUE(CallReport(MakeReport(worker, job, 1, {1, 2, 3}), &reply).ok());
  (void)server_->store()->Flush();
  CliResult r = Cli({"status", "quick"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("3/200"));
  EXPECT_THAT(r.out, HasSubstr("4.9700"));  // step 3's loss
}

TEST_F(CoordinatorCliTest, WatchPrintsSpikesDivergenceAndExitsWithTheSweep) {
  ASSERT_EQ(Cli({"submit", spec_path_}).code, 0);
  const CliResult watched = CliWhileTraining({"watch", "quick", "--plain"}, [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // lets watch connect first
  });
  ASSERT_EQ(watched.code, kExitDiverged) << watched.err;  // run 2 DIVERGED
  EXPECT_THAT(watched.out, HasSubstr("spike: run 2 g1_elementwise step 3: loss 55"));
  EXPECT_THAT(watched.out, HasSubstr("run 2 g1_elementwise: DIVERGED"));
  EXPECT_THAT(watched.out, HasSubstr("sweep quick DONE: 3 SUCCEEDED, 1 DIVERGED"));
  EXPECT_THAT(watched.out, HasSubstr("run 1 baseline: RUNNING (attempt 1, worker cli-worker)"));
}

// `submit --watch` takes watch's own flags; without --watch they are refused, naming it.
TEST_F(CoordinatorCliTest, SubmitWatchTakesWatchsFlags) {
  CliResult r = Cli({"submit", spec_path_, "--plain"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("--plain requires --watch"));
  EXPECT_EQ(CountRows("sweeps"), 0);  // refused before anything was sent

  // TrainAll finds nothing until the submit lands; wait for it rather than race it.
  const auto submitted = [&] {
    for (int i = 0; i < 200 && CountRows("runs") < 4; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_EQ(CountRows("runs"), 4);
  };
  CliResult watched;
  ASSERT_NO_FATAL_FAILURE(
      watched = CliWhileTraining({"submit", spec_path_, "--watch", "--plain"}, submitted));
  ASSERT_EQ(watched.code, kExitDiverged) << watched.err;  // run 2 DIVERGED
  EXPECT_THAT(watched.out, HasSubstr("sweep quick (id 1): 4 runs, 4 queued, 0 reused"));
  EXPECT_THAT(watched.out, HasSubstr("run 2 g1_elementwise: DIVERGED"));
  EXPECT_THAT(watched.out, HasSubstr("sweep quick DONE: 3 SUCCEEDED, 1 DIVERGED"));
  EXPECT_THAT(watched.out, Not(HasSubstr("\x1b[")));  // no redrawn bars
}

// `submit` prints the cost of the runs it queued, as `expand` counts them; reused runs are not
// counted, since they do not train.
TEST_F(CoordinatorCliTest, SubmitPrintsTheCostOfTheRunsItQueued) {
  absl::StatusOr<ExpandedSweep> expanded = ExpandSweepFile(spec_path_);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  CostFlags flags;
  flags.device_peak = "a100-bf16";
  flags.mfu = 0.3;
  CliResult r = Cli({"submit", spec_path_, "--device-peak", "a100-bf16", "--mfu", "0.3"});
  ASSERT_EQ(r.code, 0) << r.err;
  // The coordinator is this build: its version, and its uncommitted sources when there are some.
  const std::string note = UncommittedSourcesNote(UncommittedSources());
  EXPECT_EQ(r.out, absl::StrCat("sweep quick (id 1): 4 runs, 4 queued, 0 reused; code ",
                                BuildVersion(), "\n", note.empty() ? "" : note + "\n",
                                FormatCostLine(EstimateSweepCost(*expanded), flags, "4 runs")));
  EXPECT_THAT(r.out, HasSubstr("at 30% MFU of a100-bf16 (312 TFLOP/s): "));

  // The same runs under another name: the three that SUCCEEDED are reused, the diverged one
  // (run 2, g1_elementwise) trains again, and only it is counted.
  TrainAll();
  const std::string again = root_ + "/again.yaml";
  std::ofstream(again) << QuickSpec("again");
  r = Cli({"submit", again});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 runs, 1 queued, 3 reused"));
  const RunFlops diverged = EstimateRunFlops(expanded->runs(1).config());
  ASSERT_EQ(expanded->runs(1).variant(), "g1_elementwise");
  EXPECT_THAT(r.out, HasSubstr("total: 1 of 4 runs to train (3 reused), " +
                               FormatFlops(diverged.train + diverged.eval) + " FLOPs"));
  EXPECT_THAT(r.out, HasSubstr("device-hours: give --device-peak"));

  r = Cli({"submit", spec_path_, "--device-peak", "b200"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("--device-peak: unknown device class \"b200\""));
}

TEST_F(CoordinatorCliTest, CancelAndRerunFailed) {
  ASSERT_EQ(Cli({"submit", spec_path_}).code, 0);
  CliResult r = Cli({"cancel", "quick"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 runs cancelled"));
  r = Cli({"rerun", "quick"});
  EXPECT_NE(r.code, 0);  // --failed is required
  r = Cli({"rerun", "quick", "--failed"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 runs queued again"));
}

TEST_F(CoordinatorCliTest, ErrorsAreOneClearLineAndExitNonZero) {
  const std::string bad = root_ + "/bad.yaml";
  std::ofstream(bad) << "sweep: bad\nvariants:\n  - baseline\n  - g9_nonsense\n";
  CliResult r = Cli({"submit", bad});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(bad + ":4"));
  EXPECT_EQ(CountRows("sweeps"), 0);

  r = Cli({"status", "no_such_sweep"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no_such_sweep"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);

  r = Cli({"query", "DELETE FROM runs"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("not allowed"));

  std::ofstream(root_ + "/nope") << "nope\n";
  r = RunCli({"status", "--coordinator", server_->address(), "--token-file", root_ + "/nope",
              "--state-dir", root_ + "/none"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("refused the token"));

  // A token on the command line would show in `ps`: refused, saying what to do instead.
  r = RunCli({"status", "--coordinator", server_->address(), "--token", token_});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--token-file FILE or the ABLATE_TOKEN environment variable"));
  r = RunCli({"status", "--token-file", root_ + "/missing-token"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing-token"));

  r = RunCli({"status", "--coordinator", "127.0.0.1:1", "--token-file", root_ + "/nope",
              "--timeout", "2"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));

  r = Cli({"submit", root_ + "/missing.yaml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.yaml"));
}

// `ablate serve` on `state` as a child process; its address once it listens.
pid_t SpawnServe(const std::string& state, const std::string& log, std::string* address) {
  std::filesystem::remove(state + "/address");
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen(log.c_str(), "a", stdout);
    std::freopen(log.c_str(), "a", stderr);
    ::execl(ABLATE_BIN, "ablate", "serve", "--port", "0", "--state-dir", state.c_str(),
            static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  for (int i = 0; i < 200 && !std::filesystem::exists(state + "/address"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::ifstream in(state + "/address");
  std::getline(in, *address);
  return pid;
}

// The real binary: `ablate serve` with defaults taken from its state dir, stopped by SIGTERM.
TEST(ServeProcessTest, ServesUntilSigtermAndClientsNeedNoFlags) {
  char tmpl[] = "/tmp/ablate_serve_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string state = dir + "/.ablate";
  const std::string log = dir + "/serve.log";
  std::string address;
  const pid_t pid = SpawnServe(state, log, &address);
  ASSERT_GE(pid, 0);
  ASSERT_TRUE(std::filesystem::exists(state + "/address"));
  CliResult r = RunCli({"status", "--state-dir", state});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("no sweeps"));

  // A second coordinator exits 1: on the same state dir (naming the first's pid), and on the
  // same port (gRPC's SO_REUSEPORT is off, so it cannot listen beside the first).
  const std::string second_log = dir + "/second.log";
  EXPECT_EQ(testing::WaitExit(testing::Spawn(ABLATE_BIN,
                                             {"serve", "--port", "0", "--state-dir", state,
                                              "--dashboard-port", "0"},
                                             second_log),
                              std::chrono::seconds(30)),
            1);
  EXPECT_THAT(testing::Slurp(second_log),
              HasSubstr("another coordinator (pid " + std::to_string(pid) + ")"));
  const std::string port = address.substr(address.rfind(':') + 1);
  EXPECT_EQ(testing::WaitExit(testing::Spawn(ABLATE_BIN,
                                             {"serve", "--port", port, "--state-dir",
                                              dir + "/other", "--dashboard-port", "0"},
                                             second_log),
                              std::chrono::seconds(30)),
            1);
  EXPECT_THAT(testing::Slurp(second_log), HasSubstr("cannot listen on 127.0.0.1:" + port));
  r = RunCli({"status", "--state-dir", state});  // and the first still answers every call
  EXPECT_EQ(r.code, 0) << r.err;

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("listening on 127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("SIGTERM: shutting down"));
  EXPECT_THAT(text, HasSubstr("stopped"));
  EXPECT_THAT(text, Not(HasSubstr("error")));
  std::filesystem::remove_all(dir);
}

// SIGKILL the coordinator mid-run: on restart the worker's resent batch is a duplicate, it keeps
// its job, and the run completes once with every metric point.
TEST(ServeProcessTest, SigkillLosesNoMetricAndCompletesOnce) {
  char tmpl[] = "/tmp/ablate_kill_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, state = dir + "/.ablate", log = dir + "/serve.log";
  const std::string spec = dir + "/quick.yaml";
  std::ofstream(spec) << QuickSpec("quick");
  std::string address;
  pid_t pid = SpawnServe(state, log, &address);
  ASSERT_FALSE(address.empty());
  ASSERT_EQ(RunCli({"submit", spec, "--state-dir", state}).code, 0);
  std::string token;
  std::ifstream(state + "/token") >> token;

  auto call = [&](auto method, const auto& request, auto* response) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    auto stub = WorkerService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata("authorization", "Bearer " + token);
    return ((*stub).*method)(&ctx, request, response);
  };
  RegisterRequest reg;
  reg.set_name("survivor");
  reg.mutable_resources()->set_cores(2);
  reg.mutable_resources()->set_code_version(CodeVersion());
  RegisterResponse registered;
  ASSERT_TRUE(call(&WorkerService::Stub::Register, reg, &registered).ok());
  AcquireJobRequest acquire;
  acquire.set_worker_id(registered.worker_id());
  acquire.set_worker_secret(registered.worker_secret());
  AcquireJobResponse acquired;
  ASSERT_TRUE(call(&WorkerService::Stub::AcquireJob, acquire, &acquired).ok());
  ASSERT_TRUE(acquired.has_job());
  const Job job = acquired.job();
  auto batch = [&](int64_t seq) {
    ReportRequest r;
    r.set_worker_id(registered.worker_id());
    r.set_run_id(job.run_id());
    r.set_attempt(job.attempt());
    r.set_lease_secret(job.lease_secret());
    r.set_seq(seq);
    for (int64_t i = 1; i <= 10; ++i) {
      StepMetrics* m = r.add_steps();
      m->set_step((seq - 1) * 10 + i);
      m->set_loss(4.0);
    }
    return r;
  };
  ReportResponse reply;
  ASSERT_TRUE(call(&WorkerService::Stub::Report, batch(1), &reply).ok());
  ASSERT_TRUE(call(&WorkerService::Stub::Report, batch(2), &reply).ok());

  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  pid = SpawnServe(state, log, &address);
  ASSERT_FALSE(address.empty());

  // The worker did not see batch 2's reply: it resends it, then goes on.
  ASSERT_TRUE(call(&WorkerService::Stub::Report, batch(2), &reply).ok());
  EXPECT_TRUE(reply.duplicate());
  ASSERT_TRUE(call(&WorkerService::Stub::Report, batch(3), &reply).ok());
  EXPECT_FALSE(reply.duplicate());
  FinishRequest finish;
  finish.set_worker_id(registered.worker_id());
  finish.set_run_id(job.run_id());
  finish.set_attempt(job.attempt());
  finish.set_lease_secret(job.lease_secret());
  finish.mutable_summary()->set_state(SUCCEEDED);
  finish.mutable_summary()->set_steps_done(30);
  FinishResponse finished;
  ASSERT_TRUE(call(&WorkerService::Stub::Finish, finish, &finished).ok());
  ASSERT_TRUE(call(&WorkerService::Stub::Finish, finish, &finished).ok());  // a retry

  const std::string id = std::to_string(job.run_id());
  CliResult r = RunCli({"query",
                        "SELECT (SELECT count(*) FROM step_metrics WHERE run_id = " + id +
                            ") || ' ' || (SELECT count(*) FROM attempts WHERE run_id = " + id +
                            ") || ' ' || (SELECT state FROM runs WHERE id = " + id + ")",
                        "--format", "csv", "--state-dir", state});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("30 1 SUCCEEDED"));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove_all(dir);
}

// True when a TCP connection to ADDRESS:port is accepted.
bool Accepts(const char* address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address, &addr.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// `serve --host 0.0.0.0` takes workers from other machines; its dashboard stays on loopback unless
// --dashboard-host says otherwise. (127.0.0.2 is this machine too, but a socket bound to
// 127.0.0.1 does not accept connections to it: it stands for another interface.)
TEST(ServeDashboardTest, TheDashboardStaysOnLoopbackWhenGrpcListensEverywhere) {
  char tmpl[] = "/tmp/ablate_dash_host_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (const bool everywhere : {false, true}) {
    SCOPED_TRACE(everywhere ? "--dashboard-host 0.0.0.0" : "default --dashboard-host");
    CLI::App app;
    ServerOptions options;
    ServerFlagSeconds seconds;
    DashboardFlags dashboard;
    AlertOptions alerts;
    AddServerFlags(&app, &options, &seconds, &dashboard, &alerts);
    const int port = ablate::testing::FreePort();
    app.parse(absl::StrCat("--host 0.0.0.0 --port 0 --no-fsync --state-dir ", dir,
                           "/state --dashboard-port ", port,
                           everywhere ? " --dashboard-host 0.0.0.0" : ""),
              false);
    ApplyServerFlags(seconds, &options);
    EXPECT_EQ(dashboard.host, everywhere ? "0.0.0.0" : "127.0.0.1");
    std::ostringstream out;
    absl::StatusOr<std::unique_ptr<ServedCoordinator>> served =
        ServedCoordinator::Start(options, dashboard, alerts, out);
    ASSERT_TRUE(served.ok()) << served.status();
    ASSERT_NE((*served)->dashboard(), nullptr) << out.str();
    EXPECT_EQ((*served)->dashboard()->port(), port);
    EXPECT_TRUE(Accepts("127.0.0.2", (*served)->server().port()));  // gRPC: every interface
    EXPECT_TRUE(Accepts("127.0.0.1", port));
    EXPECT_EQ(Accepts("127.0.0.2", port), everywhere);
    (*served)->Stop();
  }
  std::filesystem::remove_all(dir);
}

// ---- TLS (proto/tls.h) ------------------------------------------------------------------

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ablate::testing::FreshTestDir("ablate_tls").string();
    ASSERT_TRUE(ablate::testing::MakeSelfSignedCertificate(root_, "server")) << "openssl failed";
    ASSERT_TRUE(ablate::testing::MakeSelfSignedCertificate(root_, "other"));
    ASSERT_TRUE(ablate::testing::MakeSelfSignedCertificate(root_, "misnamed", "DNS:example.org"));
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(root_);
  }
  absl::Status Start(bool tls, const std::string& cert = "server") {
    ServerOptions o;
    o.state_dir = root_ + "/state";
    o.port = 0;
    o.synchronous_full = false;
    o.shutdown_grace = absl::Seconds(1);
    if (tls) {
      o.tls_cert_file = root_ + "/" + cert + ".pem";
      o.tls_key_file = root_ + "/" + cert + ".key";
    }
    server_.reset();
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(o);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    return absl::OkStatus();
  }
  // `ablate ARGS --coordinator ADDRESS --token-file FILE`, nothing else taken from the state dir.
  CliResult Cli(std::vector<std::string> args) {
    args.insert(args.end(),
                {"--coordinator", server_->address(), "--token-file", root_ + "/state/token",
                 "--state-dir", root_ + "/elsewhere", "--timeout", "5"});
    return RunCli(args);
  }
  std::string root_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(TlsTest, ClientsNeedTheRightCertificateAndLocalOnesFindItInTheStateDir) {
  ASSERT_TRUE(Start(true).ok());
  const std::string state = root_ + "/state";
  ASSERT_TRUE(std::filesystem::exists(state + "/tls-ca.pem"));

  // The local CLI: address, token and certificate all from the state dir.
  CliResult local = RunCli({"status", "--state-dir", state, "--timeout", "5"});
  EXPECT_EQ(local.code, 0) << local.err;

  CliResult with_ca = Cli({"status", "--tls-ca", root_ + "/server.pem"});
  EXPECT_EQ(with_ca.code, 0) << with_ca.err;

  CliResult plaintext = Cli({"status"});
  EXPECT_EQ(plaintext.code, 1);
  EXPECT_THAT(plaintext.err, HasSubstr("cannot reach the coordinator"));

  CliResult wrong_ca = Cli({"status", "--tls-ca", root_ + "/other.pem"});
  EXPECT_EQ(wrong_ca.code, 1);
  EXPECT_THAT(wrong_ca.err, HasSubstr("TLS handshake with the coordinator at"));

  CliResult missing = Cli({"status", "--tls-ca", root_ + "/nope.pem"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("cannot read the TLS CA file " + root_ + "/nope.pem"));

  // The worker API is behind the same TLS: a plaintext worker cannot even register.
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  RegisterRequest request;
  RegisterResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ctx.AddMetadata("authorization", "Bearer " + server_->credentials().admin);
  EXPECT_EQ(WorkerService::NewStub(channel)->Register(&ctx, request, &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // Restarted without TLS: the stale copy goes, so local clients speak plaintext again.
  ASSERT_TRUE(Start(false).ok());
  EXPECT_FALSE(std::filesystem::exists(state + "/tls-ca.pem"));
  local = RunCli({"status", "--state-dir", state, "--timeout", "5"});
  EXPECT_EQ(local.code, 0) << local.err;
}

// A certificate that does not name the address dialled is reported as such, not as a coordinator
// that is not running.
TEST_F(TlsTest, ACertificateThatDoesNotNameTheAddressSaysSo) {
  ASSERT_TRUE(Start(true, "misnamed").ok());
  CliResult local = RunCli({"status", "--state-dir", root_ + "/state", "--timeout", "5"});
  EXPECT_EQ(local.code, 1);
  EXPECT_THAT(local.err, HasSubstr("serves a TLS certificate that does not name the address"));
  EXPECT_THAT(local.err, Not(HasSubstr("is `ablate serve` running")));
}

TEST_F(TlsTest, BadCertificateFlagsAreClearErrors) {
  std::ofstream(root_ + "/not.pem") << "hello\n";
  ServerOptions o;
  o.state_dir = root_ + "/state";
  o.port = 0;
  o.tls_cert_file = root_ + "/server.pem";
  EXPECT_THAT(std::string(CoordinatorServer::Start(o).status().message()),
              HasSubstr("TLS needs both --tls-cert and --tls-key"));
  o.tls_key_file = root_ + "/not.pem";
  EXPECT_THAT(std::string(CoordinatorServer::Start(o).status().message()),
              HasSubstr("the TLS private key " + root_ + "/not.pem is not a PEM file"));
  o.tls_key_file = root_ + "/server.pem";  // a certificate where the key should be
  EXPECT_THAT(std::string(CoordinatorServer::Start(o).status().message()),
              HasSubstr("holds no PRIVATE KEY block"));
  o.tls_cert_file = root_ + "/missing.pem";
  o.tls_key_file = root_ + "/server.key";
  EXPECT_THAT(std::string(CoordinatorServer::Start(o).status().message()),
              HasSubstr("cannot read the TLS certificate " + root_ + "/missing.pem"));
  // Nothing was created for a server that did not start.
  EXPECT_FALSE(std::filesystem::exists(root_ + "/state/ablate.db"));
  // The CLI refuses one flag without the other before starting anything.
  CliResult half =
      RunCli({"serve", "--tls-cert", root_ + "/server.pem", "--state-dir", root_ + "/state"});
  EXPECT_NE(half.code, 0);
  EXPECT_THAT(half.out + half.err, HasSubstr("--tls-key"));
}

}  // namespace
}  // namespace ablate
