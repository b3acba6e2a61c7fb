// End to end, as a user runs it: a real `ablate serve` and two real `ablate-worker
// --coordinator` processes train a tiny sweep to completion; then `ablate up --workers 2` does
// the same in one command and Ctrl-C stops it all, handing running runs back as INTERRUPTED.
// Results are read straight from the SQLite file, as pandas or sqlite3 would.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/tiny_sweep.h"
#include "tests/process_util.h"
#include "tests/test_dir.h"

// Inside ablate::testing, beside the process helpers it is made of (tests/process_util.h).
namespace ablate::testing {
namespace {

namespace fs = std::filesystem;

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("ablate_e2e");
    state_ = dir_ / "state";
    WriteTinyCorpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny sweep with `seeds` seeds, each run on `devices` ranks, evaluating every 15 steps and
  // checkpointing every 10.
  fs::path Spec(const std::string& name, int steps, int devices = 1, int seeds = 2) {
    return WriteTinySweepSpec(dir_, name, dir_ / "corpus.txt", steps, 15, 10, devices, seeds);
  }

  // `ablate ARGS --state-dir STATE`, waited for.
  int Ablate(std::vector<std::string> args, const fs::path& log) {
    args.insert(args.end(), {"--state-dir", state_.string()});
    return WaitExit(Spawn(ABLATE_BIN, args, log), std::chrono::seconds(60));
  }

  fs::path Db() const { return state_ / "ablate.db"; }

  // `ablate submit SPEC`, which must succeed: a failure, shown with its log (dir_/LOG), is fatal
  // (callers check with ASSERT_NO_FATAL_FAILURE).
  void SubmitSpec(const fs::path& spec, const std::string& log) {
    ASSERT_EQ(Ablate({"submit", spec.string()}, dir_ / log), 0) << Slurp(dir_ / log);
  }

  // `bin ARGS`, run to its end (30 s at most), fails with exit code 1, its log (dir_/LOG) saying
  // `says`.
  void ExpectFailsSaying(const std::string& bin, const std::vector<std::string>& args,
                         const std::string& log, const std::string& says) {
    EXPECT_EQ(WaitExit(Spawn(bin, args, dir_ / log), std::chrono::seconds(30)), 1);
    EXPECT_NE(Slurp(dir_ / log).find(says), std::string::npos) << Slurp(dir_ / log);
  }

  // How many runs have each step from 1 on stored once: through step `last`, or (0) through
  // wherever the run stopped.
  int64_t RunsWithEveryStep(int64_t last = 0) const {
    const std::string n = std::to_string(last);
    const std::string through =
        last > 0 ? "count(*) = " + n + " AND max(step) = " + n : "count(*) = max(step)";
    return QueryInt(Db(), "SELECT count(*) FROM (SELECT run_id FROM step_metrics GROUP BY run_id "
                          "HAVING min(step) = 1 AND " + through + ")");
  }

  // `ablate serve` on a free port: its pid once it wrote its address (in *address), else -1.
  pid_t StartServe(std::string* address) {
    const pid_t serve = Spawn(ABLATE_BIN, {"serve", "--port", "0", "--state-dir", state_.string()},
                              dir_ / "serve.log");
    if (serve <= 0 ||
        !WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30))) {
      return -1;
    }
    *address = Slurp(state_ / "address");
    while (!address->empty() && std::isspace(static_cast<unsigned char>(address->back()))) {
      address->pop_back();
    }
    return serve;
  }

  fs::path dir_, state_;
};

TEST_F(EndToEndTest, ServeAndTwoWorkersTrainASweepToCompletion) {
  std::string address;
  const pid_t serve = StartServe(&address);
  ASSERT_GT(serve, 0) << Slurp(dir_ / "serve.log");
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("e2e", 30), "submit.log"));

  // Each credential does its own part only: the read-only one cannot register a worker, the
  // worker one cannot submit.
  ExpectFailsSaying(ABLATE_WORKER_BIN,
                    {"--coordinator", address, "--token-file", (state_ / "read-token").string(),
                     "--name", "reader"},
                    "reader.log", "PERMISSION_DENIED");
  EXPECT_EQ(Ablate({"submit", Spec("rogue", 30).string(), "--token-file",
                    (state_ / "worker-token").string()},
                   dir_ / "rogue.log"),
            1);
  EXPECT_NE(Slurp(dir_ / "rogue.log").find("needs the admin credential"), std::string::npos)
      << Slurp(dir_ / "rogue.log");

  std::vector<pid_t> workers;
  for (const char* name : {"w1", "w2"}) {
    workers.push_back(Spawn(ABLATE_WORKER_BIN,
                            {"--coordinator", address, "--token-file",
                             (state_ / "worker-token").string(), "--name", name, "--idle-exit", "3",
                             "--report-interval", "0.2"},
                            dir_ / (std::string(name) + ".log")));
    ASSERT_GT(workers.back(), 0);
  }
  // No credential is on any command line (`ps` shows them to every user).
  for (const char* file : {"token", "worker-token", "read-token"}) {
    std::string credential = Slurp(state_ / file);
    while (!credential.empty() && std::isspace(static_cast<unsigned char>(credential.back()))) {
      credential.pop_back();
    }
    ASSERT_FALSE(credential.empty()) << file;
    for (const auto& proc : fs::directory_iterator("/proc")) {
      std::string cmdline = Slurp(proc.path() / "cmdline");
      EXPECT_EQ(cmdline.find(credential), std::string::npos) << file << " in " << cmdline;
    }
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    EXPECT_EQ(WaitExit(workers[i], std::chrono::seconds(180)), 0)
        << Slurp(dir_ / ("w" + std::to_string(i + 1) + ".log"));
  }
  kill(serve, SIGTERM);
  EXPECT_EQ(WaitExit(serve, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");

  const fs::path db = Db();
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM runs"), 4);
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED'"), 4)
      << Slurp(dir_ / "w1.log") << Slurp(dir_ / "w2.log");
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM runs WHERE steps_done = 30 AND val_loss > 0"), 4);
  // Every step of every run, once.
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM step_metrics"), 4 * 30);
  EXPECT_EQ(RunsWithEveryStep(30), 4);
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM eval_metrics"), 4 * 2);  // steps 15 and 30
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM attempts WHERE state = 'SUCCEEDED'"), 4);
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM attempts WHERE checkpoint_step = 30"), 4);
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM workers"), 2);
}

// One worker of two slots (issue 17) trains a sweep of single-device runs two at a time, each in
// a job process of its own, and a sweep of two-device runs on both slots at once, all or nothing:
// the wide runs are not starved by the narrow ones (fair share alternates the two sweeps, a wide
// run waiting for both slots), never share the worker with them, and once they are done the
// narrow runs left pack two at a time.
TEST_F(EndToEndTest, AWorkerOfTwoSlotsPacksNarrowRunsAndGivesWideOnesBothSlots) {
  std::string address;
  const pid_t serve = StartServe(&address);
  ASSERT_GT(serve, 0) << Slurp(dir_ / "serve.log");
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("narrow", 60, 1, 4), "narrow.log"));
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("wide", 30, 2), "wide.log"));
  const pid_t worker = Spawn(ABLATE_WORKER_BIN,
                             {"--coordinator", address, "--token-file",
                              (state_ / "worker-token").string(), "--name", "pair", "--slots",
                              "2", "--idle-exit", "3", "--report-interval", "0.2"},
                             dir_ / "pair.log");
  ASSERT_GT(worker, 0);
  // While it trains, `ablate status` lists it with its slots.
  ASSERT_TRUE(WaitFor([&] { return QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = 'RUNNING'") > 0; },
                      std::chrono::seconds(60)));
  ASSERT_EQ(Ablate({"status"}, dir_ / "status.log"), 0) << Slurp(dir_ / "status.log");
  EXPECT_TRUE(std::regex_search(Slurp(dir_ / "status.log"), std::regex("pair +(IDLE|BUSY) +cpu +[0-2]/2 ")))
      << Slurp(dir_ / "status.log");
  EXPECT_EQ(WaitExit(worker, std::chrono::seconds(300)), 0) << Slurp(dir_ / "pair.log");
  kill(serve, SIGTERM);
  EXPECT_EQ(WaitExit(serve, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");

  const fs::path db = Db();
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED' AND attempts = 1"), 12)
      << Slurp(dir_ / "pair.log");
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM runs WHERE devices = 2"), 4);
  EXPECT_EQ(RunsWithEveryStep(), 12);
  // Attempts that trained at the same time: narrow ones did; a wide one never shared the worker.
  const std::string overlapping =
      "SELECT count(*) FROM attempts a JOIN attempts b ON a.run_id < b.run_id "
      "AND a.started_at < b.ended_at AND b.started_at < a.ended_at "
      "JOIN runs ra ON ra.id = a.run_id JOIN runs rb ON rb.id = b.run_id ";
  EXPECT_GT(QueryInt(db, overlapping + "WHERE ra.devices = 1 AND rb.devices = 1"), 0);
  EXPECT_EQ(QueryInt(db, overlapping + "WHERE ra.devices = 2 OR rb.devices = 2"), 0);
  EXPECT_NE(Slurp(dir_ / "pair.log").find("x 2 ranks (slots 0,1)"), std::string::npos)
      << Slurp(dir_ / "pair.log");
}

// Issue 17: a run wider than any worker is gang-scheduled across two one-slot workers, each
// training one rank, rank 0's worker serving the rendezvous at the port the coordinator chose.
// Then a member dies mid-run: the attempt fails, its partner is freed, and with a third worker
// the run resumes from its checkpoint and completes.
TEST_F(EndToEndTest, TwoOneSlotWorkersTrainAWiderRunAsAGangAndSurviveALostMember) {
  std::string address;
  const pid_t serve = StartServe(&address);
  ASSERT_GT(serve, 0) << Slurp(dir_ / "serve.log");
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("gang", 30, 2, 1), "gang.log"));
  const auto worker = [&](const std::string& name, const std::string& idle_exit) {
    return Spawn(ABLATE_WORKER_BIN,
                 {"--coordinator", address, "--token-file", (state_ / "worker-token").string(),
                  "--name", name, "--rendezvous-host", "127.0.0.1", "--idle-exit", idle_exit,
                  "--report-interval", "0.2", "--collective-timeout", "30"},
                 dir_ / (name + ".log"));
  };
  const pid_t w1 = worker("w1", "4"), w2 = worker("w2", "4");
  ASSERT_GT(w1, 0);
  ASSERT_GT(w2, 0);
  EXPECT_EQ(WaitExit(w1, std::chrono::seconds(180)), 0) << Slurp(dir_ / "w1.log");
  EXPECT_EQ(WaitExit(w2, std::chrono::seconds(180)), 0) << Slurp(dir_ / "w2.log");
  const std::string logs = Slurp(dir_ / "w1.log") + Slurp(dir_ / "w2.log");
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED' AND attempts = 1 "
                           "AND devices = 2 AND steps_done = 30"),
            2)
      << logs;
  EXPECT_EQ(RunsWithEveryStep(30), 2);
  // Each run had one rank on each worker: one log names rank 1 here, at a port in range.
  const std::regex part("x 2 ranks \\(ranks 1-1 here, rendezvous 127\\.0\\.0\\.1:(\\d+)\\)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(logs, match, part)) << logs;
  EXPECT_GE(std::stoi(match[1]), 29500);
  EXPECT_LE(std::stoi(match[1]), 29999);

  // Long runs (a few seconds each); the member (not rank 0's worker) of the first is killed
  // after its checkpoint of step 10, long before the run could end.
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("long", 400, 2, 1), "long.log"));
  const pid_t w3 = worker("w3", "10"), w4 = worker("w4", "10");
  ASSERT_GT(w3, 0);
  ASSERT_GT(w4, 0);
  const std::string long_run = "SELECT r.id FROM runs r JOIN sweeps s ON s.id = r.sweep_id "
                               "WHERE s.name = 'long' ORDER BY r.id LIMIT 1";
  ASSERT_TRUE(WaitFor([&] { return QueryInt(Db(), "SELECT max(checkpoint_step) FROM attempts "
                                                  "WHERE run_id = (" + long_run + ")") >= 10; },
                      std::chrono::seconds(120)))
      << Slurp(dir_ / "w3.log") << Slurp(dir_ / "w4.log");
  const int primary = QueryInt(Db(), "SELECT w.name = 'w3' FROM attempts a JOIN workers w ON "
                                     "w.id = a.worker_id WHERE a.run_id = (" + long_run +
                                     ") AND a.attempt = 1");
  // The member's machine is lost: the agent and its rank process die at once, no checkpoint.
  // The rank first: killed after its agent, it would get the agent's death signal (SIGTERM,
  // PR_SET_PDEATHSIG) in between, and under load could take one more step with rank 0 and end
  // the attempt INTERRUPTED with a checkpoint, as a worker that is stopped does.
  const pid_t member = primary ? w4 : w3;
  const std::vector<pid_t> ranks = ChildrenWith(member, "--rank 1");
  ASSERT_EQ(ranks.size(), 1u) << Slurp(dir_ / "w3.log") << Slurp(dir_ / "w4.log");
  kill(ranks[0], SIGKILL);
  kill(member, SIGKILL);
  WaitExit(member, std::chrono::seconds(10));
  // The attempt fails (rank 0's collective loses its peer) and the run waits for a second
  // worker: a new one joins, the run resumes from its checkpoint and completes.
  const pid_t w5 = worker("w5", "10");
  ASSERT_GT(w5, 0);
  const pid_t partner = primary ? w3 : w4;
  EXPECT_EQ(WaitExit(partner, std::chrono::seconds(240)), 0)
      << Slurp(dir_ / "w3.log") << Slurp(dir_ / "w4.log") << Slurp(dir_ / "w5.log");
  EXPECT_EQ(WaitExit(w5, std::chrono::seconds(60)), 0) << Slurp(dir_ / "w5.log");
  kill(serve, SIGTERM);
  EXPECT_EQ(WaitExit(serve, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");
  const std::string all = Slurp(dir_ / "w3.log") + Slurp(dir_ / "w4.log") + Slurp(dir_ / "w5.log");
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs r JOIN sweeps s ON s.id = r.sweep_id "
                           "WHERE s.name = 'long' AND r.state = 'SUCCEEDED' AND r.steps_done = 400"),
            2)
      << all;
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts WHERE run_id = (" + long_run +
                               ") AND attempt = 1 AND state IN ('FAILED', 'LOST')"),
            1)
      << all;
  EXPECT_NE(all.find("resuming from the checkpoint of step"), std::string::npos) << all;
  EXPECT_EQ(RunsWithEveryStep(), 4);
}

TEST_F(EndToEndTest, UpRunsCoordinatorAndWorkersAndCtrlCStopsAll) {
  const fs::path log = dir_ / "up.log";
  const pid_t up = Spawn(ABLATE_BIN, {"up", "--workers", "2", "--port", "0", "--state-dir",
                                      state_.string()},
                         log);
  ASSERT_GT(up, 0);
  ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
      << Slurp(log);
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("quick", 30), "submit.log"));
  EXPECT_TRUE(WaitFor([&] { return QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = "
                                                  "'SUCCEEDED'") == 4; },
                      std::chrono::seconds(180)))
      << Slurp(log);

  // A long sweep: Ctrl-C while both workers train.
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("long", 100000), "submit.log"));
  EXPECT_TRUE(WaitFor([&] { return QueryInt(Db(), "SELECT count(*) FROM runs r JOIN sweeps s ON "
                                                  "s.id = r.sweep_id WHERE s.name = 'long' AND "
                                                  "r.steps_done >= 10") == 2; },
                      std::chrono::seconds(120)))
      << Slurp(log);
  kill(up, SIGINT);
  EXPECT_EQ(WaitExit(up, std::chrono::seconds(90)), 0) << Slurp(log);

  const std::string text = Slurp(log);
  EXPECT_NE(text.find("ablate up: coordinator on 127.0.0.1:"), std::string::npos) << text;
  EXPECT_NE(text.find("SIGINT: stopping 2 workers"), std::string::npos) << text;
  EXPECT_NE(text.find("ablate up: stopped"), std::string::npos) << text;
  EXPECT_EQ(text.find("killing"), std::string::npos) << text;
  // Every worker is gone.
  std::regex pid_line("worker up-\\d: pid (\\d+)");
  int pids = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), pid_line), end; it != end; ++it, ++pids) {
    EXPECT_NE(kill(std::stoi((*it)[1]), 0), 0) << "worker " << (*it)[1] << " still runs";
  }
  EXPECT_EQ(pids, 2);
  // The two runs in progress were checkpointed and handed back to resume: none is left RUNNING.
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts WHERE state = 'INTERRUPTED' AND "
                           "checkpoint_step >= 10"),
            2)
      << text;
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = 'RUNNING'"), 0);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED'"), 4);
}

// The socket inodes a process holds open ("socket:[N]" in /proc/PID/fd).
std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "fd", ec)) {
    const std::string target = fs::read_symlink(fd.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  return inodes;
}

// The inodes of the TCP sockets in LISTEN state on this machine (/proc/net/tcp and tcp6).
std::set<std::string> ListeningInodes() {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode;
      if (state == "0A") inodes.insert(inode);
    }
  }
  return inodes;
}

// Workers hold none of the parent's descriptors: a worker that outlives `ablate up` must not keep
// the dashboard's or the coordinator's port. (`--slots` reaches the worker.)
TEST_F(EndToEndTest, UpWorkersHoldNoneOfTheCoordinatorsListeningSockets) {
  const fs::path log = dir_ / "up.log";
  const pid_t up = Spawn(ABLATE_BIN, {"up", "--workers", "1", "--slots", "3", "--port", "0",
                                      "--dashboard-port", std::to_string(FreePort()),
                                      "--state-dir", state_.string()},
                         log);
  ASSERT_GT(up, 0);
  std::smatch match;
  std::string text;
  const std::regex pid_line("worker up-1: pid (\\d+)");
  ASSERT_TRUE(WaitFor([&] {
    text = Slurp(log);
    return text.find("dashboard: http") != std::string::npos &&
           std::regex_search(text, match, pid_line);
  }, std::chrono::seconds(30))) << text;
  const pid_t worker = std::stoi(match[1]);
  // Wait until the worker registered (it has its own gRPC connection by then).
  ASSERT_TRUE(WaitFor([&] { return QueryInt(Db(), "SELECT count(*) FROM workers") == 1; },
                      std::chrono::seconds(30)));
  EXPECT_EQ(QueryInt(Db(), "SELECT json_extract(resources_json, '$.slots') FROM workers"), 3);
  std::set<std::string> parent_listening;
  const std::set<std::string> listening = ListeningInodes();
  for (const std::string& inode : SocketInodes(up)) {
    if (listening.count(inode) > 0) parent_listening.insert(inode);
  }
  EXPECT_GE(parent_listening.size(), 2u) << "the coordinator's and the dashboard's";
  for (const std::string& inode : SocketInodes(worker)) {
    EXPECT_EQ(parent_listening.count(inode), 0u) << "the worker holds listening socket " << inode;
  }
  kill(up, SIGINT);
  EXPECT_EQ(WaitExit(up, std::chrono::seconds(60)), 0) << Slurp(log);
}

TEST_F(EndToEndTest, ADivergedRunIsAResultNotRetriedAndWatchShowsIt) {
  // Two variants x two seeds on 2 workers: the "diverge" runs (an absurd learning rate) end
  // DIVERGED after one attempt each, their workers go on to train the others.
  const fs::path spec = dir_ / "diverge.yaml";
  std::ofstream(spec) << "sweep: diverge\n"
                      << "base:\n"
                      << "  model: {d_model: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2, "
                         "head_dim: 16, ffn_dim: 64, max_seq_len: 32}\n"
                      << "  train: {steps: 40, batch_size: 4, seq_len: 32, threads: 1, "
                      << "eval_every: 20, eval_batches: 1, checkpoint_every: 10, "
                      << "data: {path: " << (dir_ / "corpus.txt").string() << "}}\n"
                      << "variants:\n"
                      << "  - baseline\n"
                      << "  - name: diverge\n"
                      << "    train: {optimizer: {lr: 10000, warmup_steps: 0, grad_clip: 0}}\n"
                      << "seeds: [0, 1]\n";
  const fs::path log = dir_ / "up.log";
  const pid_t up = Spawn(ABLATE_BIN, {"up", "--workers", "2", "--port", "0", "--dashboard-port",
                                      "0", "--state-dir", state_.string()},
                         log);
  ASSERT_GT(up, 0);
  ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
      << Slurp(log);
  const fs::path watch = dir_ / "watch.log";
  ASSERT_EQ(WaitExit(Spawn(ABLATE_BIN, {"submit", spec.string(), "--watch", "--state-dir",
                                        state_.string()},
                           watch),
                     std::chrono::seconds(240)),
            3)  // some DIVERGED, none FAILED (docs/cli.md, exit codes)
      << Slurp(watch) << Slurp(log);
  const std::string watched = Slurp(watch);
  EXPECT_NE(watched.find("DIVERGED"), std::string::npos) << watched;
  EXPECT_NE(watched.find("sweep diverge DONE"), std::string::npos) << watched;

  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM run_summary WHERE variant = 'diverge' AND "
                           "state = 'DIVERGED' AND attempts = 1 AND reason != ''"),
            2)
      << watched;
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM run_summary WHERE variant = 'baseline' AND "
                           "state = 'SUCCEEDED' AND steps_done = 40"),
            2);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts"), 4);  // nothing was retried
  EXPECT_GT(QueryInt(Db(), "SELECT count(*) FROM spike_events WHERE kind = 'SPIKE_NONFINITE' OR "
                           "kind LIKE '%NONFINITE%'"),
            0);

  const fs::path table = dir_ / "table.log";
  ASSERT_EQ(Ablate({"table", "diverge"}, table), 0) << Slurp(table);
  const std::string text = Slurp(table);
  EXPECT_NE(text.find("| baseline |"), std::string::npos) << text;
  EXPECT_NE(text.find("| diverge |"), std::string::npos) << text;

  kill(up, SIGINT);
  EXPECT_EQ(WaitExit(up, std::chrono::seconds(60)), 0) << Slurp(log);
}


// Faults: SIGKILL the worker training a run at three points (before its first checkpoint, and
// twice after checkpoints). Each time the lease expires, the run is retried on a new worker that
// resumes from the run's last checkpoint, and in the end every step's loss, the final training
// loss and the validation loss are bit for bit those of the same run trained without
// interruption (CPU training is deterministic), with each step stored once.
TEST_F(EndToEndTest, KilledWorkersRunsResumeElsewhereAndMatchAnUninterruptedRun) {
  auto spec = [&](const std::string& name) {
    const fs::path p = dir_ / (name + ".yaml");
    std::ofstream(p) << "sweep: " << name << "\n"
                     << "base:\n"
                     << "  model: {d_model: 64, num_layers: 4, num_heads: 4, num_kv_heads: 4, "
                        "head_dim: 16, ffn_dim: 128, max_seq_len: 64}\n"
                     << "  train: {steps: 400, batch_size: 8, seq_len: 64, threads: 1, "
                     << "eval_every: 100, eval_batches: 2, checkpoint_every: 40, "
                     << "data: {path: " << (dir_ / "corpus.txt").string() << "}}\n"
                     << "variants: [g1_elementwise]\n"
                     << "seeds: [0]\n"
                     << "resources: {device: cpu, threads: 1}\n";
    return p.string();
  };
  const fs::path log = dir_ / "serve.log";
  const pid_t serve = Spawn(ABLATE_BIN,
                            {"serve", "--port", "0", "--dashboard-port", "0", "--no-fsync",
                             "--lease-timeout", "2", "--retry-backoff", "0.2", "--max-attempts",
                             "6", "--state-dir", state_.string()},
                            log);
  ASSERT_GT(serve, 0);
  ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
      << Slurp(log);
  std::string address = Slurp(state_ / "address");
  address.erase(address.find_last_not_of(" \n") + 1);
  auto worker = [&](const std::string& name) {
    return Spawn(ABLATE_WORKER_BIN,
                 {"--coordinator", address, "--token-file", (state_ / "token").string(), "--name",
                  name, "--report-interval", "0.1"},
                 dir_ / (name + ".log"));
  };
  auto steps_of = [&](const std::string& sweep, int attempt) {
    return QueryInt(Db(), "SELECT coalesce(max(m.step), 0) FROM step_metrics m JOIN runs r ON "
                          "r.id = m.run_id JOIN sweeps s ON s.id = r.sweep_id WHERE s.name = '" +
                              sweep + "' AND m.attempt = " + std::to_string(attempt));
  };
  auto state_of = [&](const std::string& sweep) {
    return QueryInt(Db(), "SELECT count(*) FROM runs r JOIN sweeps s ON s.id = r.sweep_id WHERE "
                          "s.name = '" + sweep + "' AND r.state = 'SUCCEEDED'");
  };
  // The same run trained without interruption, beside it: the reference is queued first and
  // taken by its own one-job worker before the other run exists (--force: it would be reused).
  ASSERT_EQ(Ablate({"submit", spec("reference")}, dir_ / "submit.log"), 0)
      << Slurp(dir_ / "submit.log");
  const pid_t calm = Spawn(ABLATE_WORKER_BIN,
                           {"--coordinator", address, "--token-file", (state_ / "token").string(),
                            "--name", "calm", "--max-jobs", "1"},
                           dir_ / "calm.log");
  ASSERT_TRUE(WaitFor([&] { return steps_of("reference", 1) > 0; }, std::chrono::seconds(60)))
      << Slurp(dir_ / "calm.log");
  ASSERT_EQ(Ablate({"submit", spec("faults"), "--force"}, dir_ / "submit.log"), 0)
      << Slurp(dir_ / "submit.log");

  const int kill_at[] = {3, 130, 270};
  for (int k = 0; k < 3; ++k) {
    const std::string name = "victim-" + std::to_string(k + 1);
    const pid_t w = worker(name);
    ASSERT_GT(w, 0);
    ASSERT_TRUE(WaitFor([&] { return steps_of("faults", k + 1) >= kill_at[k]; },
                        std::chrono::seconds(120)))
        << Slurp(dir_ / (name + ".log"));
    kill(w, SIGKILL);
    EXPECT_EQ(WaitExit(w, std::chrono::seconds(10)), 128 + SIGKILL);
    EXPECT_LT(steps_of("faults", k + 1), 400) << "the run finished before the kill";
  }
  const pid_t last = worker("survivor");
  ASSERT_TRUE(WaitFor([&] { return state_of("faults") == 1; }, std::chrono::seconds(120)))
      << Slurp(dir_ / "survivor.log") << Slurp(log);
  EXPECT_EQ(QueryInt(Db(), "SELECT attempts FROM runs WHERE id = 2"), 4);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts WHERE run_id = 2 AND state = 'LOST'"), 3);
  // The first replacement started over (no checkpoint yet); the later ones resumed from one.
  const std::string second = Slurp(dir_ / "victim-2.log");
  EXPECT_EQ(second.find("resuming from the checkpoint"), std::string::npos) << second;
  for (const char* name : {"victim-3", "survivor"}) {
    const std::string text = Slurp(dir_ / (std::string(name) + ".log"));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex("resuming from the checkpoint of step (\\d+)")))
        << name << ": " << text;
    EXPECT_GE(std::stoi(m[1]), std::string(name) == "survivor" ? 240 : 120) << text;
  }
  kill(last, SIGTERM);
  EXPECT_EQ(WaitExit(last, std::chrono::seconds(30)), 0);
  EXPECT_EQ(WaitExit(calm, std::chrono::seconds(120)), 0) << Slurp(dir_ / "calm.log");
  ASSERT_EQ(state_of("reference"), 1);

  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM step_metrics WHERE run_id = 1"), 400);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM step_metrics WHERE run_id = 2"), 400);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM step_metrics a JOIN step_metrics b ON "
                           "b.step = a.step WHERE a.run_id = 1 AND b.run_id = 2 AND "
                           "a.loss = b.loss AND a.grad_norm = b.grad_norm"),
            400);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs a, runs b WHERE a.id = 1 AND b.id = 2 AND "
                           "a.final_train_loss = b.final_train_loss AND a.val_loss = b.val_loss "
                           "AND a.val_loss > 0"),
            1);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM eval_metrics a JOIN eval_metrics b ON "
                           "b.step = a.step WHERE a.run_id = 1 AND b.run_id = 2 AND "
                           "a.val_loss = b.val_loss"),
            QueryInt(Db(), "SELECT count(*) FROM eval_metrics WHERE run_id = 1"));
  kill(serve, SIGTERM);
  EXPECT_EQ(WaitExit(serve, std::chrono::seconds(30)), 0);
}


// Faults: SIGKILL the coordinator three times during a sweep that two real workers train, and
// restart it on the same database and port. The workers reconnect and keep their jobs, every
// run completes exactly once (one attempt each), and every step is stored exactly once.
TEST_F(EndToEndTest, KilledCoordinatorRestartsAndTheSweepFinishesWithEveryStepOnce) {
  constexpr int kSteps = 1000;
  const fs::path log = dir_ / "serve.log";
  auto serve = [&](const std::string& port) {
    return Spawn(ABLATE_BIN,
                 {"serve", "--port", port, "--dashboard-port", "0", "--state-dir",
                  state_.string()},
                 log);
  };
  pid_t coordinator = serve("0");
  ASSERT_GT(coordinator, 0);
  ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
      << Slurp(log);
  std::string address = Slurp(state_ / "address");
  address.erase(address.find_last_not_of(" \n") + 1);
  const std::string port = address.substr(address.rfind(':') + 1);
  ASSERT_NO_FATAL_FAILURE(SubmitSpec(Spec("restarts", kSteps), "submit.log"));
  std::vector<pid_t> workers;
  for (const char* name : {"w1", "w2"}) {
    workers.push_back(Spawn(ABLATE_WORKER_BIN,
                            {"--coordinator", address, "--token-file",
                             (state_ / "token").string(), "--name", name, "--report-interval",
                             "0.1"},
                            dir_ / (std::string(name) + ".log")));
  }
  auto stored = [&] { return QueryInt(Db(), "SELECT count(*) FROM step_metrics"); };
  for (double fraction : {0.1, 0.4, 0.7}) {
    const int64_t target = static_cast<int64_t>(fraction * 4 * kSteps);
    ASSERT_TRUE(WaitFor([&] { return stored() >= target; }, std::chrono::seconds(120)))
        << Slurp(log);
    ASSERT_EQ(kill(coordinator, SIGKILL), 0);
    EXPECT_EQ(WaitExit(coordinator, std::chrono::seconds(10)), 128 + SIGKILL);
    fs::remove(state_ / "address");
    coordinator = serve(port);
    ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
        << Slurp(log);
  }
  EXPECT_TRUE(WaitFor([&] { return QueryInt(Db(), "SELECT count(*) FROM sweeps WHERE state = "
                                                  "'DONE'") == 1; },
                      std::chrono::seconds(180)))
      << Slurp(log) << Slurp(dir_ / "w1.log") << Slurp(dir_ / "w2.log");
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED' AND attempts = 1"),
            4);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM attempts"), 4);
  EXPECT_EQ(stored(), 4 * kSteps);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM (SELECT run_id FROM step_metrics GROUP BY run_id "
                           "HAVING min(step) = 1 AND max(step) = " + std::to_string(kSteps) + ")"),
            4);
  // The workers noticed, and came back.
  for (const char* name : {"w1", "w2"}) {
    const std::string text = Slurp(dir_ / (std::string(name) + ".log"));
    EXPECT_NE(text.find("is reachable again"), std::string::npos) << text;
  }
  for (pid_t w : workers) kill(w, SIGTERM);
  for (pid_t w : workers) EXPECT_EQ(WaitExit(w, std::chrono::seconds(30)), 0);
  kill(coordinator, SIGTERM);
  EXPECT_EQ(WaitExit(coordinator, std::chrono::seconds(30)), 0);
}


// TLS end to end: `ablate up` serving with a self-signed certificate; its workers and the local
// CLI find the certificate in the state dir and train a sweep to completion.
TEST_F(EndToEndTest, UpWithTlsTrainsASweepOverEncryptedConnections) {
  ASSERT_TRUE(MakeSelfSignedCertificate(dir_.string(), "server"));
  const fs::path log = dir_ / "up.log";
  const pid_t up = Spawn(ABLATE_BIN,
                         {"up", "--workers", "1", "--port", "0", "--dashboard-port", "0",
                          "--tls-cert", (dir_ / "server.pem").string(), "--tls-key",
                          (dir_ / "server.key").string(), "--state-dir", state_.string()},
                         log);
  ASSERT_GT(up, 0);
  ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
      << Slurp(log);
  EXPECT_EQ(Ablate({"submit", Spec("tls", 20).string(), "--watch"}, dir_ / "submit.log"), 0)
      << Slurp(dir_ / "submit.log") << Slurp(log);
  EXPECT_EQ(QueryInt(Db(), "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED'"), 4);
  // A client without the certificate gets nowhere.
  std::string address = Slurp(state_ / "address");
  address.erase(address.find_last_not_of(" \n") + 1);
  ExpectFailsSaying(ABLATE_BIN,
                    {"status", "--coordinator", address, "--state-dir",
                     (dir_ / "elsewhere").string(), "--timeout", "3"},
                    "plain.log", "cannot reach the coordinator");
  kill(up, SIGINT);
  EXPECT_EQ(WaitExit(up, std::chrono::seconds(60)), 0) << Slurp(log);
}

}  // namespace
}  // namespace ablate::testing
