// `ablate workers` without SLURM daemons: the pilot script (checked by bash itself), the parsers
// of sbatch, squeue and sacct output, and the command line's one-line errors for bad input
// (count 0, an unknown flag, no --slurm, no coordinator, sbatch missing or failing).
// tests/integration/slurm_test.cc runs the same commands against a real SLURM.
#include "orchestrator/cluster/slurm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCli;

PilotScriptOptions Pilots() {
  PilotScriptOptions o;
  o.count = 3;
  o.partition = "gpu";
  o.gres = "gpu:1";
  o.time = "4:00:00";
  o.cpus_per_task = 2;
  o.mem = "16G";
  o.signal_before_s = 300;
  o.log_dir = "/shared/ablate/slurm";
  o.worker_bin = "/opt/ablate's build/ablate-worker";
  o.coordinator = "head.cluster:50051";
  o.device = "cuda";
  o.checkpoint_root = "/shared/ckpt";
  o.tls_ca = "/shared/ablate/tls-ca.pem";
  o.idle_exit_s = 90;
  return o;
}

// `bash SCRIPT` (written to `dir`) after `env_prefix`: its exit code, stdout and stderr.
struct Shell {
  int code;
  std::string output;
};
Shell RunBash(const std::string& script, const std::string& env_prefix, const fs::path& dir) {
  const fs::path file = dir / "script.sh";
  std::ofstream(file) << script;
  const std::string command = env_prefix + " bash " + file.string() + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = pipe != nullptr ? ::pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

class WorkersCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ablate::testing::FreshTestDir("ablate_workers");
    // The resolution order reads these: the test decides.
    ::unsetenv("ABLATE_TOKEN");
    ::unsetenv("ABLATE_COORDINATOR");
    ::unsetenv("ABLATE_TLS_CA");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A state dir as `ablate serve` leaves it: address and token.
  fs::path StateDir() {
    const fs::path state = dir_ / "state";
    fs::create_directories(state);
    std::ofstream(state / "address") << "127.0.0.1:45678\n";
    std::ofstream(state / "token") << "0123456789abcdef\n";
    std::ofstream(state / "worker-token") << "worker-0123456789abcdef\n";
    return state;
  }

  fs::path dir_;
};

TEST_F(WorkersCommandTest, ScriptAsksSlurmForTheArrayAndExecsTheWorkerWithoutTheToken) {
  PilotScriptOptions pilots = Pilots();
  pilots.slots = 4;  // a 4-GPU pilot: data-parallel runs of up to 4 devices
  absl::StatusOr<std::string> script = PilotScript(pilots);
  ASSERT_TRUE(script.ok()) << script.status();
  for (const char* line :
       {"#SBATCH --job-name=ablate-pilot\n", "#SBATCH --array=0-2\n",
        "#SBATCH --output=/shared/ablate/slurm/pilot-%A_%a.log\n", "#SBATCH --signal=B:TERM@300\n",
        "#SBATCH --export=ABLATE_TOKEN,PATH,HOME,", "#SBATCH --cpus-per-task=2\n",
        "#SBATCH --partition=gpu\n", "#SBATCH --gres=gpu:1\n", "#SBATCH --time=4:00:00\n",
        "#SBATCH --mem=16G\n"}) {
    EXPECT_THAT(*script, HasSubstr(line));
  }
  EXPECT_THAT(*script, HasSubstr("exec '/opt/ablate'\\''s build/ablate-worker'"));
  EXPECT_THAT(*script, HasSubstr("--coordinator 'head.cluster:50051'"));
  EXPECT_THAT(*script, HasSubstr("--name \"pilot-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\""));
  EXPECT_THAT(*script, HasSubstr("--idle-exit 90"));
  EXPECT_THAT(*script, HasSubstr("--device 'cuda'"));
  EXPECT_THAT(*script, HasSubstr("--slots 4"));
  EXPECT_THAT(*script, HasSubstr("--checkpoint-root '/shared/ckpt'"));
  EXPECT_THAT(*script, HasSubstr("--tls-ca '/shared/ablate/tls-ca.pem'"));
  // The token travels in the environment only; nothing traces the shell.
  EXPECT_THAT(*script, Not(HasSubstr("--token")));
  EXPECT_THAT(*script, Not(HasSubstr("set -x")));
  EXPECT_THAT(*script, Not(HasSubstr("set -o xtrace")));
  // Every #SBATCH line comes before the first command, or sbatch ignores it.
  const size_t last_directive = script->rfind("#SBATCH");
  EXPECT_LT(last_directive, script->find("\nif "));
  EXPECT_EQ(script->rfind("#!/bin/bash\n", 0), 0u);

  // bash accepts it, and without a token it stops before starting anything.
  const Shell syntax = RunBash("set -n\n" + *script, "", dir_);
  EXPECT_EQ(syntax.code, 0) << syntax.output;
  const Shell no_token = RunBash(*script, "env -u ABLATE_TOKEN", dir_);
  EXPECT_EQ(no_token.code, 1) << no_token.output;
  EXPECT_THAT(no_token.output, HasSubstr("ABLATE_TOKEN is not in the environment"));
}

TEST_F(WorkersCommandTest, ScriptLeavesOutWhatWasNotAsked) {
  PilotScriptOptions o;
  o.count = 1;
  o.log_dir = "/tmp/logs";
  o.worker_bin = "/usr/bin/ablate-worker";
  o.coordinator = "10.0.0.1:50051";
  absl::StatusOr<std::string> script = PilotScript(o);
  ASSERT_TRUE(script.ok()) << script.status();
  EXPECT_THAT(*script, HasSubstr("#SBATCH --array=0-0\n"));
  EXPECT_THAT(*script, HasSubstr("#SBATCH --signal=B:TERM@120\n"));
  EXPECT_THAT(*script, HasSubstr("#SBATCH --cpus-per-task=1\n"));
  for (const char* absent : {"--partition", "--gres", "--time", "--mem", "--device", "--slots",
                             "--checkpoint-root", "--tls-ca"}) {
    EXPECT_THAT(*script, Not(HasSubstr(absent))) << absent;
  }
}

TEST_F(WorkersCommandTest, ScriptRefusesValuesItCannotWriteSafely) {
  struct Case {
    std::function<void(PilotScriptOptions*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](PilotScriptOptions* o) { o->count = 0; },
       "--count must be at least 1 (pilots to start), got 0"},
      {[](PilotScriptOptions* o) { o->count = -2; }, "--count must be at least 1"},
      {[](PilotScriptOptions* o) { o->cpus_per_task = 0; }, "--cpus-per-task must be at least 1"},
      {[](PilotScriptOptions* o) { o->signal_before_s = 70000; },
       "--signal-before must be 0..65535"},
      {[](PilotScriptOptions* o) { o->idle_exit_s = -1; }, "--idle-exit must be >= 0"},
      {[](PilotScriptOptions* o) { o->partition = "gpu debug"; },
       "--partition \"gpu debug\" contains whitespace"},
      {[](PilotScriptOptions* o) { o->time = "1:00\n#SBATCH --x"; }, "--time"},
      {[](PilotScriptOptions* o) { o->log_dir = "logs"; },
       "--log-dir \"logs\" must be an absolute path"},
      {[](PilotScriptOptions* o) { o->worker_bin = "ablate-worker"; },
       "--worker-bin \"ablate-worker\" must be an absolute path"},
      {[](PilotScriptOptions* o) { o->coordinator = ""; }, "HOST:PORT is empty"},
  };
  for (const Case& c : cases) {
    PilotScriptOptions o = Pilots();
    c.edit(&o);
    absl::StatusOr<std::string> script = PilotScript(o);
    ASSERT_FALSE(script.ok()) << c.message;
    EXPECT_EQ(script.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(script.status().message(), HasSubstr(c.message));
    EXPECT_THAT(script.status().message(), Not(HasSubstr("\n")));
  }
}

TEST_F(WorkersCommandTest, SbatchJobIdIsTheLastLine) {
  EXPECT_EQ(ParseSbatchJobId("1234\n").value(), "1234");
  EXPECT_EQ(ParseSbatchJobId("77;cluster2\n").value(), "77");
  EXPECT_EQ(ParseSbatchJobId("sbatch: warning: something odd\n9\n").value(), "9");
  EXPECT_FALSE(ParseSbatchJobId("").ok());
  EXPECT_FALSE(ParseSbatchJobId("Submitted batch job 5\n").ok());
  EXPECT_FALSE(ParseSbatchJobId("-3\n").ok());
}

TEST_F(WorkersCommandTest, SqueueLinesBecomePilots) {
  // As `squeue --noheader --array --states=all --format=<kSqueueFormat>` prints them.
  absl::StatusOr<std::vector<PilotState>> pilots = ParseSqueue(
      "12_0|12|ablate-pilot|RUNNING|1:02|10:00|node7|None\n"
      "12_1|12|ablate-pilot|PENDING|0:00|10:00||Resources\n"
      "13_0|13|ablate-pilot|CANCELLED|0:09|10:00|node7|Resources\n");
  ASSERT_TRUE(pilots.ok()) << pilots.status();
  ASSERT_EQ(pilots->size(), 3u);
  EXPECT_EQ((*pilots)[0].job, "12_0");
  EXPECT_EQ((*pilots)[0].array_job, "12");
  EXPECT_EQ((*pilots)[0].name, "ablate-pilot");
  EXPECT_EQ((*pilots)[0].state, "RUNNING");
  EXPECT_EQ((*pilots)[0].time, "1:02");
  EXPECT_EQ((*pilots)[0].time_limit, "10:00");
  EXPECT_EQ((*pilots)[0].nodes, "node7");
  EXPECT_EQ((*pilots)[0].reason, "");
  EXPECT_EQ((*pilots)[1].state, "PENDING");
  EXPECT_EQ((*pilots)[1].nodes, "");
  EXPECT_EQ((*pilots)[1].reason, "Resources");
  EXPECT_EQ((*pilots)[2].reason, "");  // squeue keeps a started job's last pending reason
  EXPECT_TRUE(PilotActive((*pilots)[0]));
  EXPECT_TRUE(PilotActive((*pilots)[1]));
  EXPECT_FALSE(PilotActive((*pilots)[2]));

  EXPECT_TRUE(ParseSqueue("").value().empty());
  absl::StatusOr<std::vector<PilotState>> bad = ParseSqueue("12_0 RUNNING node7\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("squeue: unexpected line \"12_0 RUNNING node7\""));
}

TEST_F(WorkersCommandTest, SacctLinesBecomePilots) {
  // As `sacct --noheader --parsable2 --allocations --format=<kSacctFormat>` prints them.
  absl::StatusOr<std::vector<PilotState>> pilots = ParseSacct(
      "12_0|ablate-pilot|COMPLETED|00:04:10|00:10:00|node7\n"
      "12_1|ablate-pilot|CANCELLED by 1000|00:01:02|00:10:00|node8\n"
      "12_[2-3]|ablate-pilot|PENDING|00:00:00|00:10:00|None assigned\n");
  ASSERT_TRUE(pilots.ok()) << pilots.status();
  ASSERT_EQ(pilots->size(), 3u);
  EXPECT_EQ((*pilots)[0].state, "COMPLETED");
  EXPECT_EQ((*pilots)[0].time, "00:04:10");
  EXPECT_EQ((*pilots)[1].job, "12_1");
  EXPECT_EQ((*pilots)[1].array_job, "12");
  EXPECT_EQ((*pilots)[1].state, "CANCELLED");
  EXPECT_EQ((*pilots)[1].nodes, "node8");
  EXPECT_EQ((*pilots)[2].job, "12_[2-3]");
  EXPECT_EQ((*pilots)[2].array_job, "12");
  EXPECT_EQ((*pilots)[2].nodes, "");
  EXPECT_FALSE(PilotActive((*pilots)[0]));
  EXPECT_FALSE(PilotActive((*pilots)[1]));
  EXPECT_TRUE(PilotActive((*pilots)[2]));
  EXPECT_FALSE(ParseSacct("12_0|ablate-pilot|COMPLETED\n").ok());
}

TEST_F(WorkersCommandTest, PilotJobsAreReadFromTheStateDir) {
  const fs::path state = dir_ / "state";
  EXPECT_TRUE(ReadPilotJobs(state.string()).empty());
  fs::create_directories(state / "slurm");
  std::ofstream(state / "slurm" / "jobs") << "12\t2\t1700000000\n\n13\t4\t1700000100\n12\t2\t1\n";
  EXPECT_EQ(ReadPilotJobs(state.string()), (std::vector<std::string>{"12", "13"}));
}

TEST_F(WorkersCommandTest, LaunchErrorsAreOneLineNamingTheProblem) {
  const std::string state = StateDir().string();
  // code: 1 for a failed command, -1 for any code of the argument parser (non-zero).
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"workers", "launch", "--slurm", "--count", "0"},
       1,
       "workers launch: --count must be at least 1 (pilots to start), got 0"},
      {{"workers", "launch", "--count", "2"}, 1, "name the back end with --slurm"},
      {{"workers", "launch", "--slurm"}, -1, "--count is required"},
      {{"workers", "launch", "--slurm", "--count", "2", "--bogus"}, -1, "--bogus"},
      {{"workers", "launch", "--slurm", "--count", "2", "--worker-bin",
        "/nonexistent/ablate-worker"},
       1,
       "ablate-worker not found at /nonexistent/ablate-worker"},
      {{"workers", "launch", "--slurm", "--count", "2", "--worker-bin", "/bin/true",
        "--partition=a b"},
       1,
       "--partition \"a b\" contains whitespace"},
      {{"workers", "launch", "--slurm", "--count", "2", "--worker-bin", "/bin/true", "--tls-ca",
        "/nonexistent/ca.pem"},
       1,
       "workers launch: cannot read the TLS CA file /nonexistent/ca.pem (--tls-ca)"},
      {{"workers"}, -1, "A subcommand is required"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--state-dir", state});
    if (c.args.size() == 1) args.resize(1);  // `ablate workers` alone
    const CliResult r = RunCli(args);
    if (c.code == -1) {
      EXPECT_NE(r.code, 0) << c.message;
      EXPECT_NE(r.code, 1) << c.message << ": " << r.err;
    } else {
      EXPECT_EQ(r.code, c.code) << c.message << ": " << r.err;
    }
    EXPECT_THAT(r.err, HasSubstr(c.message));
    if (c.code == 1) {
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // one line
    }
  }
}

TEST_F(WorkersCommandTest, LaunchNeedsACoordinatorAndAToken) {
  const fs::path empty = dir_ / "empty";
  CliResult r = RunCli({"workers", "launch", "--slurm", "--count", "1", "--worker-bin", "/bin/true",
                        "--state-dir", empty.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("workers launch: no coordinator address: pass --coordinator"));
  r = RunCli({"workers", "launch", "--slurm", "--count", "1", "--worker-bin", "/bin/true",
              "--coordinator", "head:50051", "--state-dir", empty.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("workers launch: no token for the pilots"));
}

TEST_F(WorkersCommandTest, LaunchWithoutSbatchSaysSo) {
  const std::string state = StateDir().string();
  const std::string path = std::getenv("PATH");
  fs::create_directories(dir_ / "empty-bin");
  ::setenv("PATH", (dir_ / "empty-bin").c_str(), 1);
  const CliResult r = RunCli({"workers", "launch", "--slurm", "--count", "2", "--worker-bin",
                              "/bin/true", "--state-dir", state});
  ::setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "sbatch not found on PATH: run ablate workers where SLURM's commands are installed (a "
            "login node; Debian: apt-get install slurm-client)\n");
  // Nothing was recorded and no script was left behind.
  EXPECT_TRUE(ReadPilotJobs(state).empty());
  EXPECT_TRUE(fs::is_empty(fs::path(state) / "slurm"));
}

TEST_F(WorkersCommandTest, LaunchReportsWhySbatchFailed) {
  if (::access("/usr/bin/sbatch", X_OK) != 0) GTEST_SKIP() << "sbatch is not installed (make deps)";
  // The real sbatch, pointed at a configuration it cannot parse (a missing one would have it
  // look for a controller for a minute).
  const std::string state = StateDir().string();
  std::ofstream(dir_ / "bad-slurm.conf") << "NoSuchSlurmKey=1\n";
  ::setenv("SLURM_CONF", (dir_ / "bad-slurm.conf").c_str(), 1);
  const CliResult r = RunCli({"workers", "launch", "--slurm", "--count", "2", "--worker-bin",
                              "/bin/true", "--state-dir", state});
  const CliResult status = RunCli({"workers", "status", "--state-dir", state});
  ::unsetenv("SLURM_CONF");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("sbatch failed (exit 1): "));
  EXPECT_THAT(r.err, HasSubstr("unrecognized key: NoSuchSlurmKey"));
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("0123456789abcdef")));
  EXPECT_TRUE(ReadPilotJobs(state).empty());
  EXPECT_EQ(status.code, 0);
  EXPECT_THAT(status.out, HasSubstr("no pilots launched from"));
}

TEST_F(WorkersCommandTest, StatusAndStopWithoutPilots) {
  const std::string state = StateDir().string();
  CliResult r = RunCli({"workers", "status", "--state-dir", state});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "no pilots launched from " + state + " (ablate workers launch --slurm)\n");
  r = RunCli({"workers", "status", "--state-dir", state, "--format", "json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "{\n \"active\": 0,\n \"jobs\": [],\n \"pilots\": []\n}\n");
  r = RunCli({"workers", "status", "--state-dir", state, "--format", "yaml"});
  EXPECT_EQ(r.code, 2);
  r = RunCli({"workers", "stop", "--state-dir", state});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "no active pilots: nothing to stop\n");
}

TEST_F(WorkersCommandTest, StatusReportsAFailingSqueue) {
  if (::access("/usr/bin/squeue", X_OK) != 0) GTEST_SKIP() << "squeue is not installed (make deps)";
  const fs::path state = StateDir();
  fs::create_directories(state / "slurm");
  std::ofstream(state / "slurm" / "jobs") << "12\t2\t1700000000\n";
  std::ofstream(dir_ / "bad-slurm.conf") << "NoSuchSlurmKey=1\n";
  ::setenv("SLURM_CONF", (dir_ / "bad-slurm.conf").c_str(), 1);
  const CliResult status = RunCli({"workers", "status", "--state-dir", state.string()});
  const CliResult stop = RunCli({"workers", "stop", "--state-dir", state.string()});
  ::unsetenv("SLURM_CONF");
  for (const CliResult& r : {status, stop}) {
    EXPECT_EQ(r.code, 1);
    EXPECT_THAT(r.err, HasSubstr("squeue failed (exit 1): "));
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
}

}  // namespace
}  // namespace ablate
