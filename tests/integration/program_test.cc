// Program runs end to end (docs/program.md): a real `ablate serve` and a real `ablate-worker`
// run a small real trainer (tests/integration/programs/line_fit.py, standard library only,
// through python/ablate_report.py) and each way a user's program can misbehave: one that crashes
// after a checkpoint resumes from it, one that reports nonsense has it dropped with notices, one
// that never reports, fails permanently, forks a child and exits, diverges, or is not found at
// all each ends as docs/program.md says, and the worker serves on throughout.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/process_util.h"
#include "tests/test_dir.h"

namespace ablate::testing {
namespace {

namespace fs = std::filesystem;

// The first column of the first row of `sql`, as text ("" for none or NULL).
std::string QueryText(const fs::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return out;
}

class ProgramRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("ablate_program");
    state_ = dir_ / "state";
    fs::copy_file(fs::path(ABLATE_SOURCE_DIR) / "tests/integration/programs/line_fit.py",
                  dir_ / "line_fit.py");
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path WriteSpec(const std::string& name, const std::string& command,
                     const std::vector<std::string>& modes, const std::string& extra = "") {
    std::string text = "sweep: " + name + "\nprogram:\n  code: [\"*.py\"]\n  command: " + command +
                       "\n  args: none\n  steps: steps\n  grace_s: 5\n"
                       "  capabilities: [rollback]\n" +
                       extra + "base:\n  params: {steps: 40, lr: 0.05, mode: good}\nvariants:\n";
    for (const std::string& m : modes) text += "  - {name: " + m + ", params: {mode: " + m + "}}\n";
    const fs::path spec = dir_ / (name + ".yaml");
    std::ofstream(spec) << text;
    return spec;
  }

  // Starts `ablate serve` on a free port in state_, with `flags` added: serve_ and address_.
  void Serve(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {"serve", "--port", "0", "--state-dir", state_.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    serve_ = Spawn(ABLATE_BIN, args, dir_ / "serve.log");
    ASSERT_GT(serve_, 0);
    ASSERT_TRUE(WaitFor([&] { return fs::exists(state_ / "address"); }, std::chrono::seconds(30)))
        << Slurp(dir_ / "serve.log");
    address_ = Slurp(state_ / "address");
    while (!address_.empty() && std::isspace(static_cast<unsigned char>(address_.back()))) {
      address_.pop_back();
    }
  }

  // An ablate-worker of that coordinator named `name`, its output in `log`, with `flags` added;
  // it exits after `idle_exit` seconds without a job.
  pid_t Worker(const std::string& name, const fs::path& log,
               const std::vector<std::string>& flags = {}, const std::string& idle_exit = "4") {
    std::vector<std::string> args = {"--coordinator", address_,
                                     "--token-file",  (state_ / "worker-token").string(),
                                     "--name",        name};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--idle-exit", idle_exit, "--report-interval", "0.2"});
    return Spawn(ABLATE_WORKER_BIN, args, log);
  }

  int Ablate(std::vector<std::string> args, const std::string& log) {
    args.insert(args.end(), {"--state-dir", state_.string()});
    return WaitExit(Spawn(ABLATE_BIN, args, dir_ / log), std::chrono::seconds(60));
  }

  std::string Of(const std::string& variant, const std::string& column) const {
    return QueryText(state_ / "ablate.db",
                     "SELECT " + column + " FROM run_summary WHERE variant = '" + variant + "'");
  }

  fs::path dir_, state_;
  pid_t serve_ = -1;
  std::string address_;
};

TEST_F(ProgramRunTest, ProgramsTrainResumeAndFailAsDocumented) {
  ASSERT_NO_FATAL_FAILURE(Serve({"--retry-backoff", "0", "--max-attempts", "2"}));
  const fs::path spec =
      WriteSpec("prog", "/usr/bin/python3 line_fit.py",
                {"good", "crash_once", "misreports", "never_reports", "permanent", "fork", "nan"});
  ASSERT_EQ(Ablate({"submit", spec.string()}, "submit.log"), 0) << Slurp(dir_ / "submit.log");
  // A loss spike at step 25 under spike.policy ROLLBACK: relaunched from the checkpoint of
  // step 20 with ABLATE_ROLLBACK=20-25, within the same attempt.
  const fs::path rollback = WriteSpec("rollback", "/usr/bin/python3 line_fit.py", {"spike"},
                                      "spike: {policy: ROLLBACK, catastrophic_warmup: 5}\n");
  ASSERT_EQ(Ablate({"submit", rollback.string()}, "submit3.log"), 0) << Slurp(dir_ / "submit3.log");
  // Floods its output past max_log_bytes.
  const fs::path flood =
      WriteSpec("flood", "/usr/bin/python3 line_fit.py", {"flood"}, "  max_log_bytes: 1048576\n");
  ASSERT_EQ(Ablate({"submit", flood.string()}, "submit4.log"), 0) << Slurp(dir_ / "submit4.log");
  const fs::path missing = WriteSpec("missing", "no-such-program-ablate-test {args}", {"good"});
  ASSERT_EQ(Ablate({"submit", missing.string()}, "submit2.log"), 0) << Slurp(dir_ / "submit2.log");
  // Expand shows what runs: program runs keyed to the program's code.
  ASSERT_EQ(Ablate({"status", "prog"}, "status.log"), 0) << Slurp(dir_ / "status.log");

  const pid_t worker = Worker("w", dir_ / "worker.log");
  ASSERT_GT(worker, 0);
  // The worker serves every run and leaves cleanly: no program took it down.
  EXPECT_EQ(WaitExit(worker, std::chrono::seconds(240)), 0) << Slurp(dir_ / "worker.log");

  EXPECT_EQ(Of("good", "state"), "SUCCEEDED") << Slurp(dir_ / "worker.log");
  EXPECT_EQ(Of("good", "steps_done"), "40");
  EXPECT_NE(Of("good", "val_loss"), "");
  EXPECT_EQ(Of("good", "gate_score"), "0.5");
  const fs::path db = state_ / "ablate.db";
  const std::string good_id = Of("good", "run_id");
  // A metric ablate has no column for is kept by name; the params report fills the params
  // column (no count:); probes the program does not report are NULL, not 0.
  EXPECT_EQ(QueryText(db, "SELECT count(*) || ' ' || max(step) FROM eval_values WHERE run_id = " +
                              good_id + " AND name = 'slope_error'"),
            "4 40");
  EXPECT_NE(QueryText(db, "SELECT value FROM eval_results WHERE run_id = " + good_id +
                              " AND name = 'slope_error'"),
            "");
  // A metric under an evaluation task's name lands where train.evals' do: `table --evals`.
  EXPECT_EQ(QueryText(db,
                      "SELECT abs(p.value - 1.0 / (1.0 + s.value)) < 1e-9 FROM eval_results p "
                      "JOIN eval_results s USING (run_id) WHERE p.name = 'passkey@64' AND "
                      "s.name = 'slope_error' AND run_id = " +
                          good_id),
            "1");
  ASSERT_EQ(Ablate({"table", "prog", "--evals", "passkey@64"}, "table_evals.log"), 0)
      << Slurp(dir_ / "table_evals.log");
  EXPECT_NE(Slurp(dir_ / "table_evals.log").find("| passkey@64 |"), std::string::npos)
      << Slurp(dir_ / "table_evals.log");
  EXPECT_EQ(Of("good", "params_total"), "2");
  EXPECT_EQ(Of("good", "m_act IS NULL AND f_attn IS NULL"), "1");
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM step_metrics WHERE run_id = " + good_id), 40);

  // Crashed after the checkpoint of step 20, resumed from it on the second attempt: every step
  // stored once.
  EXPECT_EQ(Of("crash_once", "state"), "SUCCEEDED") << Of("crash_once", "reason");
  EXPECT_EQ(Of("crash_once", "attempts"), "2");
  const std::string crash_id = Of("crash_once", "run_id");
  EXPECT_EQ(
      QueryInt(db, "SELECT count(DISTINCT step) FROM step_metrics WHERE run_id = " + crash_id), 40);

  // Nonsense is dropped with notices, never stored; the run still succeeds.
  const std::string mis_id = Of("misreports", "run_id");
  EXPECT_EQ(Of("misreports", "state"), "SUCCEEDED") << Of("misreports", "reason");
  EXPECT_EQ(QueryInt(db, "SELECT max(step) FROM step_metrics WHERE run_id = " + mis_id), 40);
  EXPECT_GE(QueryInt(db, "SELECT count(*) FROM events WHERE run_id = " + mis_id +
                             " AND message LIKE '%step 2 dropped: not after step 4%'"),
            1);
  EXPECT_GE(QueryInt(db, "SELECT count(*) FROM events WHERE run_id = " + mis_id +
                             " AND message LIKE '%a report was not read%'"),
            1);
  EXPECT_GE(QueryInt(db, "SELECT count(*) FROM events WHERE run_id = " + mis_id +
                             " AND message LIKE '%past the run''s 40 steps%'"),
            1);

  EXPECT_EQ(Of("never_reports", "state"), "FAILED");
  EXPECT_EQ(Of("never_reports", "attempts"), "1");  // it would do it again: not retried
  EXPECT_NE(Of("never_reports", "reason").find("exited 0 without reporting the end"),
            std::string::npos)
      << Of("never_reports", "reason");
  EXPECT_NE(Of("never_reports", "reason").find("this program reports nothing"), std::string::npos);

  EXPECT_EQ(Of("permanent", "state"), "FAILED");
  EXPECT_EQ(Of("permanent", "attempts"), "1");
  EXPECT_NE(Of("permanent", "reason").find("dataset missing"), std::string::npos);

  EXPECT_EQ(Of("fork", "state"), "FAILED");
  EXPECT_EQ(Of("fork", "attempts"), "2");  // retried, then FAILED
  EXPECT_NE(Of("fork", "reason").find("exited with code 1"), std::string::npos);
  // Its child went with its process group.
  for (const auto& proc : fs::directory_iterator("/proc")) {
    EXPECT_EQ(Slurp(proc.path() / "cmdline").find("time.sleep(600)"), std::string::npos);
  }

  EXPECT_EQ(Of("nan", "state"), "DIVERGED") << Of("nan", "reason");

  EXPECT_EQ(Of("spike", "state"), "SUCCEEDED") << Of("spike", "reason");
  EXPECT_EQ(Of("spike", "attempts"), "1");
  const std::string spike_id = Of("spike", "run_id");
  EXPECT_EQ(
      QueryInt(
          db,
          "SELECT count(*) FROM spike_events WHERE run_id = " + spike_id +
              " AND step = 25 AND action = 'SPIKE_ACTION_ROLLED_BACK' AND rollback_to_step = 20"),
      1)
      << QueryText(db,
                   "SELECT group_concat(step || ' ' || action || ' ' || rollback_to_step) "
                   "FROM spike_events WHERE run_id = " +
                       spike_id);
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM events WHERE run_id = " + spike_id +
                             " AND message LIKE '%rolled back to the checkpoint of step 20%'"),
            1);
  EXPECT_EQ(QueryInt(db, "SELECT max(step) FROM step_metrics WHERE run_id = " + spike_id), 40);

  const std::string missing_state =
      QueryText(db,
                "SELECT state || ' ' || attempts || ' ' || reason FROM run_summary WHERE sweep = "
                "'missing'");
  EXPECT_NE(missing_state.find("FAILED 1 "), std::string::npos) << missing_state;
  EXPECT_NE(missing_state.find("no-such-program-ablate-test not found on PATH"), std::string::npos)
      << missing_state;

  // The flood's output kept to max_log_bytes (two halves at most), the run unharmed.
  EXPECT_EQ(Of("flood", "state"), "SUCCEEDED") << Of("flood", "reason");
  const fs::path flood_logs = state_ / "checkpoints" / ("run-" + Of("flood", "run_id")) / "logs";
  uintmax_t kept = 0;
  for (const auto& f : fs::directory_iterator(flood_logs)) kept += fs::file_size(f.path());
  EXPECT_LE(kept, 1048576u);
  EXPECT_GT(kept, 256u * 1024);

  // `ablate logs` shows what the program printed.
  ASSERT_EQ(Ablate({"logs", good_id}, "logs.log"), 0) << Slurp(dir_ / "logs.log");
  EXPECT_NE(Slurp(dir_ / "logs.log").find("{\"t\":\"end\"}"), std::string::npos)
      << Slurp(dir_ / "logs.log");
  EXPECT_EQ(Ablate({"logs", "999"}, "nologs.log"), 1);
  EXPECT_NE(Slurp(dir_ / "nologs.log").find("no output of run 999"), std::string::npos);

  // One that ignores SIGTERM, cancelled while it runs: SIGKILLed after grace_s (5 s here).
  const fs::path stubborn = WriteSpec("stubborn", "/usr/bin/python3 line_fit.py", {"stubborn"});
  ASSERT_EQ(Ablate({"submit", stubborn.string()}, "submit5.log"), 0) << Slurp(dir_ / "submit5.log");
  const pid_t again = Worker("w2", dir_ / "worker2.log");
  ASSERT_TRUE(WaitFor(
      [&] {
        return QueryInt(db,
                        "SELECT count(*) FROM step_metrics s JOIN run_summary r ON "
                        "r.run_id = s.run_id WHERE r.variant = 'stubborn'") >= 3;
      },
      std::chrono::seconds(60)))
      << Slurp(dir_ / "worker2.log");
  const auto cancelled = std::chrono::steady_clock::now();
  ASSERT_EQ(Ablate({"cancel", "stubborn"}, "cancel.log"), 0) << Slurp(dir_ / "cancel.log");
  EXPECT_EQ(WaitExit(again, std::chrono::seconds(60)), 0) << Slurp(dir_ / "worker2.log");
  EXPECT_EQ(Of("stubborn", "state"), "CANCELLED");
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled, std::chrono::seconds(30));
  for (const auto& proc : fs::directory_iterator("/proc")) {
    const std::string cmdline = Slurp(proc.path() / "cmdline");
    EXPECT_FALSE(cmdline.find("line_fit.py") != std::string::npos &&
                 Slurp(proc.path() / "environ").find("ABLATE_RUN_ID") != std::string::npos)
        << "a stubborn program outlived its attempt: " << cmdline;
  }

  kill(serve_, SIGTERM);
  EXPECT_EQ(WaitExit(serve_, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");
}

// ASHA over a program that cannot pause (no pause in capabilities): every run trains on past
// the rung; one that arrives there worse than the top 1/3 of those before it is stopped while it
// trains, and ends STOPPED with what it trained so far.
TEST_F(ProgramRunTest, AshaWithoutPauseStopsLosersWhileTheyTrain) {
  ASSERT_NO_FATAL_FAILURE(Serve({"--retry-backoff", "0"}));
  // One worker slot: the trials train one after another, the best first (lr 0.05).
  const fs::path spec = WriteSpec(
      "asha", "/usr/bin/python3 line_fit.py", {"good"},
      "tune: {axis: params.lr, values: [0.05, 0.01, 0.001], method: asha, rungs: [10]}\n");
  {
    std::string text = Slurp(spec);
    text.replace(text.find("mode: good}\nvariants"), 10, "mode: good, delay: 0.1");
    std::ofstream(spec) << text;
  }
  ASSERT_EQ(WaitExit(Spawn(ABLATE_BIN, {"expand", spec.string()}, dir_ / "expand.log"),
                     std::chrono::seconds(60)),
            0)
      << Slurp(dir_ / "expand.log");
  EXPECT_NE(Slurp(dir_ / "expand.log").find("the program cannot pause"), std::string::npos)
      << Slurp(dir_ / "expand.log");
  ASSERT_EQ(Ablate({"submit", spec.string()}, "submit.log"), 0) << Slurp(dir_ / "submit.log");
  const pid_t worker = Worker("w", dir_ / "worker.log");
  ASSERT_GT(worker, 0);
  EXPECT_EQ(WaitExit(worker, std::chrono::seconds(120)), 0) << Slurp(dir_ / "worker.log");
  const fs::path db = state_ / "ablate.db";
  const auto run = [&](const std::string& lr, const std::string& column) {
    return QueryText(db, "SELECT " + column +
                             " FROM run_summary WHERE sweep = 'asha' AND axes LIKE '%lr=" + lr +
                             "%'");
  };
  EXPECT_EQ(run("0.05", "state"), "SUCCEEDED") << run("0.05", "reason");
  EXPECT_EQ(run("0.05", "steps_done"), "40");
  for (const std::string lr : {"0.01", "0.001"}) {
    EXPECT_EQ(run(lr, "state"), "STOPPED") << lr << ": " << run(lr, "reason");
    EXPECT_NE(run(lr, "reason").find("stopped while training"), std::string::npos)
        << run(lr, "reason");
    // Stopped soon after its rung's evaluation, well before its end.
    EXPECT_GE(std::stoi(run(lr, "steps_done")), 10);
    EXPECT_LT(std::stoi(run(lr, "steps_done")), 40);
    EXPECT_NE(run(lr, "val_loss"), "");  // keeps what it trained
  }
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM tune_decisions WHERE kind = 'stop'"), 2);
  kill(serve_, SIGTERM);
  EXPECT_EQ(WaitExit(serve_, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");
}

// karpathy/nanoGPT's train.py, unmodified, as a program (docs/program.md, "nanoGPT"): its
// directory comes from ABLATE_NANOGPT_DIR (never vendored here). A sweep of two variants trains
// on CPU with Debian's python3-torch on the default corpus as bytes; the worker is SIGKILLed
// once a run has a checkpoint, and a second worker resumes it from nanoGPT's own ckpt.pt
// (resume_args: --init_from=resume).
TEST_F(ProgramRunTest, NanoGptTrainsUnmodifiedAndResumesAfterAKill) {
  const char* nanogpt = std::getenv("ABLATE_NANOGPT_DIR");
  if (nanogpt == nullptr || !fs::exists(fs::path(nanogpt) / "train.py")) {
    GTEST_SKIP() << "set ABLATE_NANOGPT_DIR to a checkout of karpathy/nanoGPT to run this test";
  }
  // The corpus as nanoGPT's bytes-as-tokens dataset: train.bin, val.bin (uint16), meta.pkl.
  const fs::path data = dir_ / "kjv";
  fs::create_directories(data);
  const std::string prepare =
      "import numpy as np, pickle, sys\n"
      "raw = np.frombuffer(open(sys.argv[1], 'rb').read()[:2000000], dtype=np.uint8)\n"
      "n = int(len(raw) * 0.9)\n"
      "raw[:n].astype(np.uint16).tofile(sys.argv[2] + '/train.bin')\n"
      "raw[n:].astype(np.uint16).tofile(sys.argv[2] + '/val.bin')\n"
      "pickle.dump({'vocab_size': 256}, open(sys.argv[2] + '/meta.pkl', 'wb'))\n";
  std::ofstream(dir_ / "prepare.py") << prepare;
  ASSERT_EQ(WaitExit(Spawn("/usr/bin/python3",
                           {(dir_ / "prepare.py").string(),
                            (fs::path(ABLATE_SOURCE_DIR) / "data/kjv.txt").string(), data.string()},
                           dir_ / "prepare.log"),
                     std::chrono::seconds(60)),
            0)
      << Slurp(dir_ / "prepare.log");
  const fs::path spec = dir_ / "nanogpt.yaml";
  std::ofstream(spec) << "sweep: nanogpt\nprogram:\n  dir: " << nanogpt
                      << "\n  code: [\"*.py\", \"config/*.py\"]\n"
                         "  command: /usr/bin/python3 train.py --device=cpu --compile=False "
                         "--out_dir={checkpoint_dir} {args}\n"
                         "  args: dashdash\n  report: nanogpt\n"
                         "  resume_args: --init_from=resume\n  steps: max_iters\n  grace_s: 10\n"
                         "base:\n  params: {dataset: "
                      << data.string()
                      << ", n_layer: 2, n_head: 2, n_embd: 64, block_size: 64, batch_size: 8, "
                         "max_iters: 60, lr_decay_iters: 60, eval_interval: 20, eval_iters: 5, "
                         "log_interval: 1, dropout: 0.0, learning_rate: 1.0e-3}\n"
                         "variants:\n  - {name: h2}\n  - {name: h4, params: {n_head: 4}}\n";
  ASSERT_NO_FATAL_FAILURE(Serve({"--retry-backoff", "0", "--lease-timeout", "4"}));
  ASSERT_EQ(Ablate({"submit", spec.string()}, "submit.log"), 0) << Slurp(dir_ / "submit.log");
  auto start_worker = [&](const std::string& name) {
    return Worker(name, dir_ / (name + ".log"), {}, "5");
  };
  const fs::path db = state_ / "ablate.db";
  const pid_t first = start_worker("w1");
  // Killed once the first run has nanoGPT's checkpoint of step 20 and is training on.
  ASSERT_TRUE(WaitFor(
      [&] {
        return QueryInt(db, "SELECT count(*) FROM step_metrics WHERE run_id = 1 AND step > 25") > 0;
      },
      std::chrono::seconds(180)))
      << Slurp(dir_ / "w1.log");
  kill(first, SIGKILL);
  WaitExit(first, std::chrono::seconds(10));
  const pid_t second = start_worker("w2");
  EXPECT_EQ(WaitExit(second, std::chrono::seconds(400)), 0) << Slurp(dir_ / "w2.log");
  for (const char* variant : {"h2", "h4"}) {
    EXPECT_EQ(Of(variant, "state"), "SUCCEEDED") << variant << ": " << Of(variant, "reason");
    EXPECT_EQ(Of(variant, "steps_done"), "61");  // iterations 0..max_iters
    EXPECT_NE(Of(variant, "val_loss"), "");
  }
  EXPECT_EQ(Of("h2", "attempts"), "2");
  EXPECT_NE(Slurp(dir_ / "w2.log").find("resuming from the checkpoint of step 20"),
            std::string::npos)
      << Slurp(dir_ / "w2.log");
  // nanoGPT's own resume message, in the second attempt's output.
  ASSERT_EQ(Ablate({"logs", "1"}, "logs.log"), 0);
  EXPECT_NE(Slurp(dir_ / "logs.log").find("Resuming training from"), std::string::npos);
  ASSERT_EQ(Ablate({"compare", "nanogpt"}, "compare.log"), 0) << Slurp(dir_ / "compare.log");
  EXPECT_NE(Slurp(dir_ / "compare.log").find("| h4 |"), std::string::npos)
      << Slurp(dir_ / "compare.log");
  kill(serve_, SIGTERM);
  EXPECT_EQ(WaitExit(serve_, std::chrono::seconds(30)), 0);
}

// The NAME=value lines tests/integration/programs/ranks.py writes for one rank.
std::map<std::string, std::string> RankEnv(const fs::path& path) {
  std::map<std::string, std::string> env;
  std::istringstream lines(Slurp(path));
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// Whether a process of this pid runs a command line holding `needle` (a pid reused by some other
// process does not count).
bool Running(const std::string& pid, const std::string& needle) {
  return !pid.empty() &&
         Slurp(fs::path("/proc") / pid / "cmdline").find(needle) != std::string::npos;
}

// resources: {devices: 2} (docs/program.md, "Several devices"): a worker of 2 slots starts both
// ranks of tests/integration/programs/ranks.py in one process group with torchrun's variables;
// rank 0 alone reports, rank 1's output goes to its own log. A rank 1 that fails mid-run stops the
// group and fails the attempt naming it, and the retry succeeds; no process outlives its attempt.
// Then, with one-slot workers only, the coordinator does not gang such a run across two of them
// (a program's ranks must fit one worker): it waits for a wide enough worker. On a worker of
// GPUs each rank's CUDA_VISIBLE_DEVICES is its own slot's.
TEST_F(ProgramRunTest, ProgramRanksGetTheTorchrunContractAndEndTogether) {
  fs::copy_file(fs::path(ABLATE_SOURCE_DIR) / "tests/integration/programs/ranks.py",
                dir_ / "ranks.py");
  ASSERT_NO_FATAL_FAILURE(Serve({"--retry-backoff", "0", "--max-attempts", "2"}));
  auto spec = [&](const std::string& name, int steps) {
    const fs::path path = dir_ / (name + ".yaml");
    std::ofstream(path) << "sweep: " << name
                        << "\nprogram:\n  code: [\"ranks.py\"]\n"
                           "  command: /usr/bin/python3 ranks.py\n  args: none\n  steps: steps\n"
                           "  grace_s: 5\n  capabilities: [rollback]\n"
                           "spike: {policy: ROLLBACK, catastrophic_warmup: 5}\n"
                           "base:\n  params: {steps: "
                        << steps
                        << ", mode: good}\nvariants:\n  - {name: good}\n"
                           "  - {name: rank1_fails, params: {mode: rank1_fails}}\n"
                           "  - {name: spike, params: {mode: spike}}\n"
                           "resources: {devices: 2}\n";
    return path;
  };
  ASSERT_EQ(Ablate({"submit", spec("ranks", 30).string()}, "submit.log"), 0)
      << Slurp(dir_ / "submit.log");
  const pid_t worker = Worker("w", dir_ / "worker.log", {"--slots", "2"});
  ASSERT_GT(worker, 0);
  EXPECT_EQ(WaitExit(worker, std::chrono::seconds(120)), 0) << Slurp(dir_ / "worker.log");
  const fs::path db = state_ / "ablate.db";

  EXPECT_EQ(Of("good", "state"), "SUCCEEDED") << Of("good", "reason") << Slurp(dir_ / "worker.log");
  EXPECT_EQ(Of("good", "attempts"), "1");
  EXPECT_EQ(Of("good", "steps_done"), "30");
  const std::string good_id = Of("good", "run_id");
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM step_metrics WHERE run_id = " + good_id), 30);
  const fs::path good_dir = state_ / "checkpoints" / ("run-" + good_id);
  std::map<std::string, std::string> r0 = RankEnv(good_dir / "env-attempt-1-rank-0.txt");
  std::map<std::string, std::string> r1 = RankEnv(good_dir / "env-attempt-1-rank-1.txt");
  EXPECT_EQ(r0["RANK"], "0");
  EXPECT_EQ(r1["RANK"], "1");
  EXPECT_EQ(r0["LOCAL_RANK"], "0");
  EXPECT_EQ(r1["LOCAL_RANK"], "1");
  for (auto* r : {&r0, &r1}) {
    EXPECT_EQ((*r)["WORLD_SIZE"], "2");
    EXPECT_EQ((*r)["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ((*r)["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ((*r)["ABLATE_RUN_ID"], good_id);
    EXPECT_EQ(r->count("CUDA_VISIBLE_DEVICES"), 0u);  // a CPU worker
  }
  EXPECT_GT(std::atoi(r0["MASTER_PORT"].c_str()), 0);
  EXPECT_EQ(r0["MASTER_PORT"], r1["MASTER_PORT"]);
  // One process group, rank 0's: ablate's signals reach every rank.
  EXPECT_EQ(r0["pgid"], r0["pid"]);
  EXPECT_EQ(r1["pgid"], r0["pid"]);
  // Rank 0's output is the attempt's log; rank 1's has a log of its own.
  const std::string log0 = Slurp(good_dir / "logs" / "attempt-1.log");
  const std::string log1 = Slurp(good_dir / "logs" / "attempt-1.rank-1.log");
  EXPECT_NE(log0.find("rank 0 of 2 says hello"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("rank 1"), std::string::npos) << log0;
  EXPECT_NE(log1.find("rank 1 of 2 says hello"), std::string::npos) << log1;
  EXPECT_NE(log1.find("rank 1 step 30"), std::string::npos) << log1;

  // Rank 1 exited 1 at step 15: the group was stopped, the attempt failed naming rank 1 with its
  // own last lines (not rank 0's), and the second attempt succeeded.
  EXPECT_EQ(Of("rank1_fails", "state"), "SUCCEEDED") << Of("rank1_fails", "reason");
  EXPECT_EQ(Of("rank1_fails", "attempts"), "2");
  const std::string failed_id = Of("rank1_fails", "run_id");
  const std::string first =
      QueryText(db, "SELECT state || ': ' || reason FROM attempts WHERE attempt = 1 AND run_id = " +
                        failed_id);
  EXPECT_EQ(first.rfind("FAILED: ", 0), 0u) << first;
  EXPECT_NE(first.find("rank 1 of 2 exited with code 1; its last lines:"), std::string::npos)
      << first;
  EXPECT_NE(first.find("rank 1: simulated failure at step 15"), std::string::npos) << first;
  EXPECT_EQ(first.find("rank 0 of 2 says hello"), std::string::npos) << first;
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM events WHERE run_id = " + failed_id +
                             " AND message LIKE '%rank 1 of 2 exited with code 1 while rank 0 "
                             "ran: stopping the other ranks%'"),
            1);
  // A loss spike at step 25 under spike.policy ROLLBACK: every rank relaunched from the checkpoint
  // of step 20 with ABLATE_ROLLBACK, meeting at a port of the new launch, in the same attempt.
  EXPECT_EQ(Of("spike", "state"), "SUCCEEDED") << Of("spike", "reason");
  EXPECT_EQ(Of("spike", "attempts"), "1");
  const std::string spike_id = Of("spike", "run_id");
  EXPECT_EQ(QueryInt(db, "SELECT count(*) FROM spike_events WHERE run_id = " + spike_id +
                             " AND step = 25 AND action = 'SPIKE_ACTION_ROLLED_BACK' AND "
                             "rollback_to_step = 20"),
            1);
  EXPECT_EQ(QueryInt(db, "SELECT max(step) FROM step_metrics WHERE run_id = " + spike_id), 30);
  const fs::path spike_dir = state_ / "checkpoints" / ("run-" + spike_id);
  std::map<std::string, std::string> b0 = RankEnv(spike_dir / "env-attempt-1-rank-0-rollback.txt");
  std::map<std::string, std::string> b1 = RankEnv(spike_dir / "env-attempt-1-rank-1-rollback.txt");
  EXPECT_EQ(b0["ABLATE_ROLLBACK"].rfind("20-", 0), 0u) << b0["ABLATE_ROLLBACK"];
  EXPECT_EQ(b1["ABLATE_ROLLBACK"], b0["ABLATE_ROLLBACK"]);
  EXPECT_EQ(b1["RANK"], "1");
  EXPECT_EQ(b1["MASTER_PORT"], b0["MASTER_PORT"]);
  EXPECT_EQ(b1["pgid"], b0["pid"]);

  // No rank, and no child of one, outlived its attempt.
  const fs::path failed_dir = state_ / "checkpoints" / ("run-" + failed_id);
  for (const fs::path& dir : {good_dir, failed_dir, spike_dir}) {
    for (const auto& f : fs::directory_iterator(dir)) {
      if (f.path().filename().string().rfind("env-attempt-", 0) != 0) continue;
      const std::string pid = RankEnv(f.path())["pid"];
      EXPECT_FALSE(Running(pid, "ranks.py")) << f.path() << ": pid " << pid << " still runs";
    }
  }
  EXPECT_TRUE(fs::exists(failed_dir / "env-attempt-2-rank-1.txt"));
  for (const auto& proc : fs::directory_iterator("/proc")) {
    EXPECT_EQ(Slurp(proc.path() / "cmdline").find("ranks.py child"), std::string::npos)
        << "rank 1's child outlived its attempt";
  }

  // Without a worker of 2 slots, two one-slot workers leave the run alone: it waits, untried.
  ASSERT_EQ(Ablate({"submit", spec("ganged", 20).string()}, "submit2.log"), 0)
      << Slurp(dir_ / "submit2.log");
  std::vector<pid_t> singles;
  for (const char* name : {"s1", "s2"}) {
    singles.push_back(Worker(name, dir_ / (std::string(name) + ".log")));
  }
  for (size_t i = 0; i < singles.size(); ++i) {
    EXPECT_EQ(WaitExit(singles[i], std::chrono::seconds(120)), 0)
        << Slurp(dir_ / ("s" + std::to_string(i + 1) + ".log"));
  }
  const std::string ganged =
      QueryText(db,
                "SELECT state || ' ' || attempts || ' ' || reason FROM run_summary WHERE sweep = "
                "'ganged' AND variant = 'good'");
  EXPECT_EQ(ganged, "PENDING 0 ") << ganged;

  // On a GPU worker each rank sees its own slot's GPU alone (the worker never touches the GPUs
  // for a program, so this runs anywhere).
  const fs::path gpus = dir_ / "gpus.yaml";
  std::ofstream(gpus) << "sweep: gpus\nprogram:\n  code: [\"ranks.py\"]\n"
                         "  command: /usr/bin/python3 ranks.py\n  args: none\n  steps: steps\n"
                         "base:\n  params: {steps: 10, mode: good}\nvariants:\n  - {name: good}\n"
                         "resources: {device: cuda, devices: 2}\n";
  ASSERT_EQ(Ablate({"submit", gpus.string()}, "submit3.log"), 0) << Slurp(dir_ / "submit3.log");
  const pid_t gpu_worker = Worker("g", dir_ / "gpu-worker.log", {"--device", "cuda:3,cuda:5"});
  EXPECT_EQ(WaitExit(gpu_worker, std::chrono::seconds(120)), 0) << Slurp(dir_ / "gpu-worker.log");
  const std::string gpu_id = QueryText(db, "SELECT run_id FROM run_summary WHERE sweep = 'gpus'");
  EXPECT_EQ(QueryText(db, "SELECT state FROM run_summary WHERE sweep = 'gpus'"), "SUCCEEDED")
      << Slurp(dir_ / "gpu-worker.log");
  const fs::path gpu_dir = state_ / "checkpoints" / ("run-" + gpu_id);
  EXPECT_EQ(RankEnv(gpu_dir / "env-attempt-1-rank-0.txt")["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(RankEnv(gpu_dir / "env-attempt-1-rank-1.txt")["CUDA_VISIBLE_DEVICES"], "5");

  kill(serve_, SIGTERM);
  EXPECT_EQ(WaitExit(serve_, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");
}

// experiments/programs/gated_gpt.py data-parallel through a real coordinator and worker: the
// same run on 1 and on 2 ranks (gloo on the CPU; the global batch split between the ranks) ends
// SUCCEEDED with the same losses up to float summation order: every step's loss and the final
// validation loss within a relative 1e-4 (measured: under 1e-6).
TEST_F(ProgramRunTest, GatedGptTrainsOnTwoRanksAsOnOne) {
  ASSERT_NO_FATAL_FAILURE(Serve({"--retry-backoff", "0", "--max-attempts", "1"}));
  for (int devices : {1, 2}) {
    const std::string name = "dp" + std::to_string(devices);
    const fs::path path = dir_ / (name + ".yaml");
    std::ofstream(path) << "sweep: " << name << "\nprogram:\n  dir: "
                        << (fs::path(ABLATE_SOURCE_DIR) / "experiments/programs").string()
                        << "\n  code: [\"gated_gpt.py\"]\n"
                           "  command: /usr/bin/python3 gated_gpt.py {args}\n"
                           "  steps: max_iters\n  seed: seed\n  grace_s: 10\n"
                           "base:\n  params: {n_layer: 1, n_head: 4, n_embd: 32, block_size: 32, "
                           "batch_size: 8, max_iters: 30, warmup: 5, eval_every: 10, "
                           "eval_iters: 2, ckpt_every: 10, threads: 1, gate: g1, dataset: "
                        << (fs::path(ABLATE_SOURCE_DIR) / "data/kjv.txt").string()
                        << "}\nvariants:\n  - {name: g1}\nseeds: [0]\nresources: {devices: "
                        << devices << "}\n";
    ASSERT_EQ(Ablate({"submit", path.string()}, name + ".log"), 0) << Slurp(dir_ / (name + ".log"));
  }
  const pid_t worker = Worker("w", dir_ / "worker.log", {"--slots", "2"});
  ASSERT_GT(worker, 0);
  EXPECT_EQ(WaitExit(worker, std::chrono::seconds(120)), 0) << Slurp(dir_ / "worker.log");
  const fs::path db = state_ / "ablate.db";
  auto of = [&](const std::string& sweep, const std::string& column) {
    return QueryText(db, "SELECT " + column + " FROM run_summary WHERE sweep = '" + sweep + "'");
  };
  for (const char* sweep : {"dp1", "dp2"}) {
    EXPECT_EQ(of(sweep, "state"), "SUCCEEDED") << sweep << ": " << of(sweep, "reason");
    EXPECT_EQ(of(sweep, "steps_done"), "30") << sweep;
  }
  const std::string one = of("dp1", "run_id"), two = of("dp2", "run_id");
  const std::string join =
      " FROM step_metrics a JOIN step_metrics b ON a.step = b.step WHERE "
      "a.run_id = " +
      two + " AND b.run_id = " + one;
  EXPECT_EQ(QueryInt(db, "SELECT count(*)" + join), 30);
  const double worst =
      std::atof(QueryText(db, "SELECT max(abs(a.loss - b.loss) / abs(b.loss))" + join).c_str());
  EXPECT_LE(worst, 1e-4);
  const double val_one = std::atof(of("dp1", "val_loss").c_str());
  const double val_two = std::atof(of("dp2", "val_loss").c_str());
  EXPECT_GT(val_one, 0);
  EXPECT_LE(std::abs(val_two - val_one), 1e-4 * val_one) << val_two << " vs " << val_one;
  // Rank 1 had a log of its own (and printed nothing: only rank 0 reports).
  EXPECT_TRUE(
      fs::exists(state_ / "checkpoints" / ("run-" + two) / "logs" / "attempt-1.rank-1.log"));
  kill(serve_, SIGTERM);
  EXPECT_EQ(WaitExit(serve_, std::chrono::seconds(30)), 0) << Slurp(dir_ / "serve.log");
}

}  // namespace
}  // namespace ablate::testing
