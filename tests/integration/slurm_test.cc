// `ablate workers` on a real SLURM: each test starts a private single-node cluster (munged,
// slurmctld, slurmd from Debian, as root; loopback, free ports, every file under a temp dir, no
// cgroups) and a real `ablate serve`, then drives `ablate workers launch --slurm | status | stop`
// as a user would: pilots train a sweep, a scancelled pilot's run resumes on the other pilot from
// its checkpoint, status and stop agree with squeue. Results are read from the SQLite file.
// Everything started is stopped in TearDown, also when a test fails. Skipped only where slurmd
// cannot run at all (SLURM not installed, not root, slurmd dies at start).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/tiny_sweep.h"
#include "tests/process_util.h"

// Inside ablate::testing, beside the process helpers it is made of (tests/process_util.h).
namespace ablate::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

constexpr char kNode[] = "ablatenode";


// The whole output of a finished command.
struct Output {
  int code;
  std::string text;
};

// The state of each pilot ("12_0" -> "RUNNING"), in one table's format: squeue's, or the rows of
// `ablate workers status`.
using PilotStates = std::map<std::string, std::string>;

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin :
         {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch",
          "/usr/bin/squeue", "/usr/bin/scancel", "/usr/bin/sinfo"}) {
      if (::access(bin, X_OK) != 0) {
        GTEST_SKIP() << bin << " is missing: this machine cannot run SLURM (`make deps` installs "
                     << "slurmctld, slurmd, slurm-client and munge)";
      }
    }
    if (::geteuid() != 0) {
      GTEST_SKIP() << "slurmd must run as root to start jobs; run this test as root";
    }
    // Short: slurmstepd's socket paths under it must fit in 108 bytes.
    static int tests = 0;
    dir_ = fs::temp_directory_path() /
           ("ablate_slurm_" + std::to_string(::getpid()) + "_" + std::to_string(++tests));
    fs::remove_all(dir_);
    for (const char* sub : {"munge", "run", "state", "spool", "log", "ckpt"}) {
      fs::create_directories(dir_ / sub);
    }
    // munged insists: its key private to it, its socket's directory searchable by all.
    fs::permissions(dir_ / "munge", fs::perms::owner_all);
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
    fs::permissions(dir_ / "run", fs::perms::owner_all | fs::perms::group_read |
                                      fs::perms::group_exec | fs::perms::others_read |
                                      fs::perms::others_exec);
    {
      std::random_device random;
      std::ofstream key(dir_ / "munge" / "munge.key", std::ios::binary);
      for (int i = 0; i < 128; ++i) key.put(static_cast<char>(random() & 0xff));
    }
    fs::permissions(dir_ / "munge" / "munge.key", fs::perms::owner_read | fs::perms::owner_write);
    WriteSlurmConf();
    // Every SLURM command this test and its children run (ablate's sbatch, squeue, scancel; the
    // pilots) reads this configuration. It also tags the processes to sweep up in TearDown.
    ::setenv("SLURM_CONF", conf_.c_str(), 1);

    munged_ = Spawn("/usr/sbin/munged",
                    {"--foreground", "--socket=" + (dir_ / "run" / "munge.sock").string(),
                     "--key-file=" + (dir_ / "munge" / "munge.key").string(),
                     "--log-file=" + (dir_ / "munge" / "munged.log").string(),
                     "--pid-file=" + (dir_ / "run" / "munged.pid").string(),
                     "--seed-file=" + (dir_ / "munge" / "munged.seed").string()},
                    dir_ / "log" / "munged.out");
    ASSERT_GT(munged_, 0);
    ASSERT_TRUE(WaitFor([&] { return fs::exists(dir_ / "run" / "munge.sock"); }, seconds(10)))
        << Slurp(dir_ / "log" / "munged.out") << Slurp(dir_ / "munge" / "munged.log");
    slurmctld_ =
        Spawn("/usr/sbin/slurmctld", {"-D", "-f", conf_.string()}, dir_ / "log" / "slurmctld.out");
    ASSERT_GT(slurmctld_, 0);
    slurmd_ = Spawn("/usr/sbin/slurmd", {"-D", "-f", conf_.string(), "-N", kNode},
                    dir_ / "log" / "slurmd.out");
    ASSERT_GT(slurmd_, 0);
    // The node registers and turns idle within seconds.
    bool idle = false;
    for (auto end = std::chrono::steady_clock::now() + seconds(40);
         !idle && std::chrono::steady_clock::now() < end;
         std::this_thread::sleep_for(std::chrono::milliseconds(300))) {
      if (Exited(&slurmd_)) {
        GTEST_SKIP() << "slurmd cannot run on this machine:\n"
                     << Slurp(dir_ / "log" / "slurmd.out") << Slurp(dir_ / "log" / "slurmd.log");
      }
      ASSERT_FALSE(Exited(&slurmctld_))
          << Slurp(dir_ / "log" / "slurmctld.out") << Slurp(dir_ / "log" / "slurmctld.log");
      idle = Run("/usr/bin/sinfo", {"--noheader", "--format=%T"}).text == "idle\n";
    }
    ASSERT_TRUE(idle) << Run("/usr/bin/sinfo", {}).text << Slurp(dir_ / "log" / "slurmctld.log")
                      << Slurp(dir_ / "log" / "slurmd.log");

    state_ = dir_ / "state-ablate";
  }

  void TearDown() override {
    if (dir_.empty()) return;  // skipped before anything started
    if (slurmctld_ > 0 && !Exited(&slurmctld_)) {
      // Every job of this private cluster: their workers checkpoint and hand their runs back.
      Run("/usr/bin/scancel", {"--partition=debug"});
      WaitFor([&] { return Run("/usr/bin/squeue", {"--noheader"}).text.empty(); }, seconds(20));
    }
    for (pid_t* pid : {&serve_, &slurmd_, &slurmctld_, &munged_}) {
      if (*pid > 0 && !Exited(pid)) {
        ::kill(*pid, SIGTERM);
        WaitExit(*pid, seconds(20));
      }
    }
    // Whatever outlived them (slurmstepd, a pilot's worker) carries our SLURM_CONF.
    SignalProcessesWithEnv("SLURM_CONF=" + conf_.string(), SIGKILL);
    ::unsetenv("SLURM_CONF");
    if (HasFailure()) {
      for (const fs::path& log : {dir_ / "log" / "slurmctld.log", dir_ / "log" / "slurmd.log",
                                  dir_ / "log" / "serve.log"}) {
        std::cerr << "---- " << log.filename().string() << "\n" << Slurp(log);
      }
      std::error_code ec;
      for (const auto& f : fs::directory_iterator(state_ / "slurm", ec)) {
        std::cerr << "---- " << f.path().filename().string() << "\n" << Slurp(f.path());
      }
    }
    fs::remove_all(dir_);
  }

  // `ablate serve` for this test, its checkpoints on the "shared" path the pilots are given too;
  // with `tls`, behind a self-signed certificate (serve copies it to STATE_DIR/tls-ca.pem, where
  // `launch` finds it for the pilots).
  void StartCoordinator(bool tls) {
    std::vector<std::string> args = {"serve",
                                     "--port",
                                     "0",
                                     "--state-dir",
                                     state_.string(),
                                     "--checkpoint-root",
                                     (dir_ / "ckpt").string(),
                                     "--lease-timeout",
                                     "20",
                                     "--dashboard-port",
                                     "0"};
    if (tls) {
      ASSERT_TRUE(MakeSelfSignedCertificate(dir_.string(), "server"))
          << "openssl failed";
      args.insert(args.end(), {"--tls-cert", (dir_ / "server.pem").string(), "--tls-key",
                               (dir_ / "server.key").string()});
    }
    serve_ = Spawn(ABLATE_BIN, args, dir_ / "log" / "serve.log");
    ASSERT_GT(serve_, 0);
    ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, seconds(30)))
        << Slurp(dir_ / "log" / "serve.log");
    // The pilots hold the worker credential (the admin one never leaves the head node).
    token_ = Slurp(state_ / "worker-token");
    while (!token_.empty() && std::isspace(static_cast<unsigned char>(token_.back()))) {
      token_.pop_back();
    }
    ASSERT_EQ(token_.size(), 71u);
  }

  void WriteSlurmConf() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string short_host(host);
    short_host = short_host.substr(0, short_host.find('.'));
    conf_ = dir_ / "slurm.conf";
    const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    const int ctld_port = FreePort();
    int slurmd_port = FreePort();
    while (slurmd_port == ctld_port) slurmd_port = FreePort();
    std::ofstream(conf_)
        << "ClusterName=ablatetest\n"
        << "SlurmctldHost=" << short_host << "(127.0.0.1)\n"
        << "SlurmctldPort=" << ctld_port << "\n"
        << "SlurmdPort=" << slurmd_port << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << (dir_ / "run" / "munge.sock").string() << "\n"
        << "StateSaveLocation=" << (dir_ / "state").string() << "\n"
        << "SlurmdSpoolDir=" << (dir_ / "spool").string() << "\n"
        << "SlurmctldPidFile=" << (dir_ / "run" / "slurmctld.pid").string() << "\n"
        << "SlurmdPidFile=" << (dir_ / "run" / "slurmd.pid").string() << "\n"
        << "SlurmctldLogFile=" << (dir_ / "log" / "slurmctld.log").string() << "\n"
        << "SlurmdLogFile=" << (dir_ / "log" / "slurmd.log").string()
        << "\n"
        // No cgroups: processes tracked through /proc, no task binding.
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "SchedulerType=sched/builtin\n"
        << "JobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        << "MpiDefault=none\nReturnToService=2\nMailProg=/bin/true\n"
        // A cancelled worker gets SIGTERM, then this long to checkpoint before SIGKILL. Ended
        // jobs stay in squeue for MinJobAge seconds (what status shows without accounting).
        << "KillWait=20\nMinJobAge=600\n"
        << "NodeName=" << kNode << " NodeHostname=" << short_host
        << " NodeAddr=127.0.0.1 CPUs=" << cpus << " State=UNKNOWN\n"
        << "PartitionName=debug Nodes=" << kNode << " Default=YES MaxTime=INFINITE State=UP\n";
  }

  // True once `*pid` exited (reaped; *pid becomes -1).
  static bool Exited(pid_t* pid) {
    if (*pid <= 0) return true;
    int status = 0;
    if (::waitpid(*pid, &status, WNOHANG) == 0) return false;
    *pid = -1;
    return true;
  }

  // `bin args...` to its end (60 s at most): exit code and stdout + stderr.
  Output Run(const std::string& bin, const std::vector<std::string>& args) {
    const fs::path log = dir_ / "log" / ("cmd-" + std::to_string(++commands_) + ".out");
    const int code = WaitExit(Spawn(bin, args, log), seconds(60));
    return {code, Slurp(log)};
  }

  // `ablate ARGS --state-dir STATE`.
  Output Ablate(std::vector<std::string> args) {
    args.insert(args.end(), {"--state-dir", state_.string()});
    return Run(ABLATE_BIN, args);
  }

  // Every pilot squeue knows (recently ended ones too, for MinJobAge).
  PilotStates Squeue() {
    PilotStates states;
    std::istringstream lines(
        Run("/usr/bin/squeue", {"--noheader", "--array", "--states=all", "--format=%i %T"}).text);
    for (std::string job, state; lines >> job >> state;) states[job] = state;
    return states;
  }

  // The pilot rows of `ablate workers status` output: "JOB STATE ...".
  static PilotStates StatusRows(const std::string& text) {
    PilotStates states;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      std::string job, state;
      fields >> job >> state;
      if (std::regex_match(job, std::regex("\\d+_\\d+"))) states[job] = state;
    }
    return states;
  }

  // `ablate workers launch --slurm ARGS`: the SLURM job id.
  std::string Launch(std::vector<std::string> args) {
    args.insert(args.begin(), {"workers", "launch", "--slurm"});
    const Output out = Ablate(args);
    EXPECT_EQ(out.code, 0) << out.text;
    std::smatch m;
    if (!std::regex_search(out.text, m, std::regex("submitted SLURM job (\\d+)"))) return "";
    return m[1];
  }

  // A sweep of two variants x two seeds of a 2-layer, d_model 32 model, checkpointing every 50
  // steps (1000 steps take ~7 s here).
  fs::path Spec(const std::string& name, int steps) {
    const fs::path corpus = dir_ / "corpus.txt";
    if (!fs::exists(corpus)) WriteTinyCorpus(corpus);
    return WriteTinySweepSpec(dir_, name, corpus, steps, steps, 50);
  }

  fs::path Db() const { return state_ / "ablate.db"; }

  fs::path dir_, conf_, state_;
  pid_t munged_ = -1, slurmctld_ = -1, slurmd_ = -1, serve_ = -1;
  std::string token_;
  int commands_ = 0;
};

TEST_F(SlurmTest, PilotsTrainASweepAndACancelledPilotsRunResumesOnTheOther) {
  // Long enough that both pilots are seen mid-run, checkpointed (reports come every second), and
  // one can be cancelled before its run ends: a run of 1,000 steps took ~2 s here once training
  // got faster, and the window where both had reported a checkpoint was often missed.
  constexpr int kSteps = 6000;
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(/*tls=*/false));
  const Output submitted = Ablate({"submit", Spec("pilots", kSteps).string()});
  ASSERT_EQ(submitted.code, 0) << submitted.text;
  const std::string job =
      Launch({"--count", "2", "--cpus-per-task", "1", "--time", "10", "--idle-exit", "5",
              "--checkpoint-root", (dir_ / "ckpt").string()});
  ASSERT_FALSE(job.empty());
  const std::string pilot0 = job + "_0", pilot1 = job + "_1";

  // Both pilots train a run each and have checkpointed it.
  ASSERT_TRUE(WaitFor(
      [&] {
        return QueryInt(Db(),
                        "SELECT count(*) FROM attempts WHERE state = "
                        "'RUNNING' AND checkpoint_step >= 50") == 2;
      },
      seconds(90)))
      << Squeue().size() << " pilots in squeue\n"
      << Slurp(state_ / "slurm" / ("pilot-" + pilot0 + ".log"))
      << Slurp(state_ / "slurm" / ("pilot-" + pilot1 + ".log"));
  const Output status = Ablate({"workers", "status"});
  EXPECT_EQ(status.code, 0) << status.text;
  EXPECT_EQ(StatusRows(status.text), (PilotStates{{pilot0, "RUNNING"}, {pilot1, "RUNNING"}}))
      << status.text;
  EXPECT_NE(status.text.find("2 pilots active: 2 RUNNING"), std::string::npos) << status.text;
  // The same for programs: `--format json`.
  const Output json_status = Ablate({"workers", "status", "--format", "json"});
  EXPECT_EQ(json_status.code, 0) << json_status.text;
  for (const std::string& pilot : {pilot0, pilot1}) {
    EXPECT_NE(json_status.text.find("\"pilot\": \"" + pilot + "\""), std::string::npos)
        << json_status.text;
  }
  EXPECT_NE(json_status.text.find("\"active\": 2"), std::string::npos) << json_status.text;
  EXPECT_NE(json_status.text.find("\"state\": \"RUNNING\""), std::string::npos) << json_status.text;

  // The token is on no command line (ps), while the workers' command lines are there to see.
  int workers_seen = 0;
  for (const auto& proc : fs::directory_iterator("/proc")) {
    std::string cmdline = Slurp(proc.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    EXPECT_EQ(cmdline.find(token_), std::string::npos) << cmdline;
    if (cmdline.find("ablate-worker --coordinator") != std::string::npos &&
        cmdline.find("--name pilot-" + job + "_") != std::string::npos) {
      ++workers_seen;
    }
  }
  EXPECT_EQ(workers_seen, 2);

  // Cancel pilot 0 mid-run: its worker gets SIGTERM, checkpoints and hands the run back.
  const int64_t run = QueryInt(Db(),
                               "SELECT r.id FROM runs r JOIN workers w ON w.id = r.worker_id "
                               "WHERE r.state = 'RUNNING' AND w.name = 'pilot-" +
                                   pilot0 + "'");
  ASSERT_GT(run, 0);
  const std::string of_run = " WHERE run_id = " + std::to_string(run);
  ASSERT_EQ(Run("/usr/bin/scancel", {pilot0}).code, 0);

  // Every run completes, on the pilot that is left; then it leaves too (idle) and squeue agrees.
  EXPECT_TRUE(WaitFor(
      [&] {
        return QueryInt(Db(),
                        "SELECT count(*) FROM runs WHERE state = "
                        "'SUCCEEDED'") == 4;
      },
      seconds(150)))
      << Slurp(state_ / "slurm" / ("pilot-" + pilot1 + ".log"));
  EXPECT_TRUE(WaitFor(
      [&] {
        return Squeue() == PilotStates{{pilot0, "CANCELLED"}, {pilot1, "COMPLETED"}};
      },
      seconds(30)))
      << Run("/usr/bin/squeue", {"--array", "--states=all"}).text;

  // The cancelled run: attempt 1 INTERRUPTED on pilot 0 with a checkpoint, attempt 2 on pilot 1
  // resumed from it (its first step is the one after) and finished.
  EXPECT_EQ(QueryInt(Db(), "SELECT attempts FROM runs WHERE id = " + std::to_string(run)), 2);
  EXPECT_EQ(
      QueryInt(Db(), "SELECT count(*) FROM runs WHERE id = " + std::to_string(run) +
                         " AND state = 'SUCCEEDED' AND steps_done = " + std::to_string(kSteps)),
      1);
  const int64_t checkpoint = QueryInt(Db(), "SELECT checkpoint_step FROM attempts" + of_run +
                                                " AND attempt = 1 AND state = 'INTERRUPTED'");
  EXPECT_GE(checkpoint, 50);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts a JOIN workers w ON w.id = a.worker_id" +
                               of_run + " AND a.attempt = 1 AND w.name = 'pilot-" + pilot0 + "'"),
            1);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts a JOIN workers w ON w.id = a.worker_id" +
                               of_run +
                               " AND a.attempt = 2 AND a.state = 'SUCCEEDED' AND "
                               "w.name = 'pilot-" +
                               pilot1 + "'"),
            1);
  EXPECT_EQ(QueryInt(Db(), "SELECT min(step) FROM step_metrics" + of_run + " AND attempt = 2"),
            checkpoint + 1);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM step_metrics" + of_run), kSteps);
  // The other runs went through once each; every checkpoint is on the shared path.
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts"), 5);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM step_metrics"), 4 * kSteps);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts WHERE checkpoint_path NOT LIKE '" +
                               (dir_ / "ckpt").string() + "/run-%'"),
            0);
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / ("run-" + std::to_string(run))));

  // The logs tell the story and never hold the token; nor does the kept script.
  const std::string log0 = Slurp(state_ / "slurm" / ("pilot-" + pilot0 + ".log"));
  const std::string log1 = Slurp(state_ / "slurm" / ("pilot-" + pilot1 + ".log"));
  EXPECT_NE(log0.find("INTERRUPTED after"), std::string::npos) << log0;
  EXPECT_NE(log1.find("resuming from the checkpoint of step " + std::to_string(checkpoint)),
            std::string::npos)
      << log1;
  const std::string script = Slurp(state_ / "slurm" / ("pilots-" + job + ".sbatch"));
  EXPECT_NE(script.find("#SBATCH --array=0-1"), std::string::npos) << script;
  for (const std::string& text : {log0, log1, script, Slurp(dir_ / "log" / "slurmd.log"),
                                  Slurp(dir_ / "log" / "slurmctld.log")}) {
    EXPECT_EQ(text.find(token_), std::string::npos);
  }
  const Output after = Ablate({"workers", "status"});
  EXPECT_EQ(StatusRows(after.text), Squeue()) << after.text;
  EXPECT_NE(after.text.find("0 pilots active"), std::string::npos) << after.text;
}

// The coordinator serves TLS here: the pilots reach it only with the CA launch hands them.
TEST_F(SlurmTest, StatusAndStopAgreeWithSqueue) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(/*tls=*/true));
  // Pilots that never leave by themselves, one more than the node has room for: on this
  // 2-core machine 3 pilots of 1 CPU each.
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int room = cpus >= 2 ? 2 : 1;
  const std::string job = Launch({"--count", std::to_string(room + 1), "--cpus-per-task",
                                  std::to_string(cpus / room), "--time", "10", "--idle-exit", "0"});
  ASSERT_FALSE(job.empty());
  auto running = [&] {
    int n = 0;
    for (const auto& [id, state] : Squeue()) n += state == "RUNNING";
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return running() == room; }, seconds(30)))
      << Run("/usr/bin/squeue", {"--array"}).text;
  // The workers registered over TLS (the coordinator sees every running pilot).
  ASSERT_TRUE(
      WaitFor([&] { return QueryInt(Db(), "SELECT count(*) FROM workers") == room; }, seconds(30)))
      << Slurp(state_ / "slurm" / ("pilot-" + job + "_0.log"));
  EXPECT_NE(Slurp(state_ / "slurm" / ("pilots-" + job + ".sbatch"))
                .find("--tls-ca '" + (state_ / "tls-ca.pem").string() + "'"),
            std::string::npos);

  Output status = Ablate({"workers", "status"});
  ASSERT_EQ(status.code, 0) << status.text;
  EXPECT_EQ(StatusRows(status.text), Squeue()) << status.text;
  EXPECT_EQ(StatusRows(status.text).at(job + "_" + std::to_string(room)), "PENDING");
  EXPECT_NE(status.text.find(job + "_" + std::to_string(room) + " "), std::string::npos);
  // The pending one says why; the running ones where.
  EXPECT_TRUE(std::regex_search(status.text, std::regex("\\n" + job + "_" + std::to_string(room) +
                                                        " +PENDING .* Resources\\n")))
      << status.text;
  EXPECT_TRUE(
      std::regex_search(status.text, std::regex("\\n" + job + "_0 +RUNNING .* ablatenode\\n")))
      << status.text;
  EXPECT_NE(status.text.find(std::to_string(room + 1) + " pilots active: 1 PENDING, " +
                             std::to_string(room) + " RUNNING"),
            std::string::npos)
      << status.text;

  // sbatch's refusal comes back as one line; nothing is recorded.
  const Output refused =
      Ablate({"workers", "launch", "--slurm", "--count", "1", "--partition", "nosuch"});
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.text.find("sbatch failed (exit 1): invalid partition specified: nosuch"),
            std::string::npos)
      << refused.text;
  EXPECT_EQ(std::count(refused.text.begin(), refused.text.end(), '\n'), 1) << refused.text;
  EXPECT_EQ(Slurp(state_ / "slurm" / "jobs").find('\n'),
            Slurp(state_ / "slurm" / "jobs").size() - 1);

  // SIGTERM to the batch shell alone, as --signal=B:TERM@ delivers it before the time limit:
  // the worker *is* the batch shell (exec), so it exits 0 and the pilot COMPLETES; the pending
  // pilot takes its place.
  ASSERT_EQ(Run("/usr/bin/scancel", {"--batch", "--signal=TERM", job + "_0"}).code, 0);
  EXPECT_TRUE(WaitFor([&] { return Squeue()[job + "_0"] == "COMPLETED" && running() == room; },
                      seconds(30)))
      << Run("/usr/bin/squeue", {"--array", "--states=all"}).text
      << Slurp(state_ / "slurm" / ("pilot-" + job + "_0.log"));

  const Output stop = Ablate({"workers", "stop"});
  EXPECT_EQ(stop.code, 0) << stop.text;
  EXPECT_NE(stop.text.find("cancelled " + std::to_string(room) + " pilots"), std::string::npos)
      << stop.text;
  PilotStates ended;
  for (int task = 0; task <= room; ++task) {
    ended[job + "_" + std::to_string(task)] = task == 0 ? "COMPLETED" : "CANCELLED";
  }
  EXPECT_TRUE(WaitFor([&] { return Squeue() == ended; }, seconds(30)))
      << Run("/usr/bin/squeue", {"--array", "--states=all"}).text;
  status = Ablate({"workers", "status"});
  EXPECT_EQ(StatusRows(status.text), ended) << status.text;
  EXPECT_NE(status.text.find("0 pilots active"), std::string::npos) << status.text;
  const Output again = Ablate({"workers", "stop"});
  EXPECT_EQ(again.code, 0);
  EXPECT_EQ(again.text, "no active pilots: nothing to stop\n");

  // A job launched long ago, gone from squeue (MinJobAge); without accounting sacct cannot say
  // how it ended, and status says so in one line.
  std::ofstream(state_ / "slurm" / "jobs", std::ios::app) << "999\t2\t1700000000\n";
  status = Ablate({"workers", "status"});
  EXPECT_EQ(status.code, 0) << status.text;
  EXPECT_EQ(StatusRows(status.text), ended) << status.text;
  EXPECT_NE(status.text.find("job 999: ended (squeue no longer lists it; sacct failed (exit 1): "
                             "Slurm accounting storage is disabled)\n"),
            std::string::npos)
      << status.text;
  EXPECT_NE(status.text.find("0 pilots active (SLURM jobs " + job + ", 999)"), std::string::npos)
      << status.text;
}

}  // namespace
}  // namespace ablate::testing
