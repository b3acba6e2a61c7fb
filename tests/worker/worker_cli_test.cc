// `ablate-worker train` as a user runs it: a real process, files on disk, Ctrl-C and --resume.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_dir.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;
  std::string out, err;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class WorkerCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ablate::testing::FreshTestDir("ablate_worker_cli");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i) corpus << "And it was so; and the evening and the morning were day " << i << ".\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path Config(const std::string& name, int steps, const std::string& extra_train = "") {
    fs::path p = dir_ / name;
    std::ofstream(p) << "# a tiny run\n"
                     << "model:\n  num_layers: 2\n  d_model: 32\n  num_heads: 2\n  num_kv_heads: 2\n"
                     << "  head_dim: 16\n  ffn_dim: 64\n  max_seq_len: 32\n"
                     << "  gate: {position: G1}\n"
                     << "train:\n  steps: " << steps << "\n  batch_size: 4\n  seq_len: 32\n"
                     << "  eval_every: 10\n  eval_batches: 1\n  checkpoint_every: 5\n  log_every: 5\n"
                     << "  threads: 1\n  data: {path: " << (dir_ / "corpus.txt").string() << "}\n"
                     << extra_train;
    return p;
  }

  // Starts ablate-worker with `args`; `while_running` (may be null) gets the pid.
  Result Run(const std::vector<std::string>& args,
             const std::function<void(pid_t)>& while_running = nullptr) {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    pid_t pid = fork();
    if (pid == 0) {
      freopen(out.c_str(), "w", stdout);
      freopen(err.c_str(), "w", stderr);
      std::vector<char*> argv = {const_cast<char*>(ABLATE_WORKER_BIN)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(ABLATE_WORKER_BIN, argv.data());
      _exit(127);
    }
    if (while_running) while_running(pid);
    int status = 0;
    waitpid(pid, &status, 0);
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  // Step numbers of the "step" lines of metrics.jsonl.
  std::vector<int> Steps(const fs::path& run) {
    std::vector<int> steps;
    std::ifstream in(run / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("{\"type\":\"step\"", 0) != 0) continue;
      const auto at = line.find("\"step\":");
      steps.push_back(std::atoi(line.c_str() + at + 7));
    }
    return steps;
  }

  fs::path dir_;
};

TEST_F(WorkerCliTest, TrainsAndWritesEveryOutput) {
  const fs::path run = dir_ / "run";
  Result r = Run({"train", "--config", Config("c.yaml", 20).string(), "--out", run.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step 5/20 | loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval step 20 | val loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 20 steps"), std::string::npos) << r.out;
  for (const char* f : {"config.json", "metrics.jsonl", "summary.json", "checkpoint.pt"}) {
    EXPECT_TRUE(fs::exists(run / f)) << f;
  }
  EXPECT_NE(Slurp(run / "summary.json").find("\"state\":\"SUCCEEDED\""), std::string::npos);
  EXPECT_NE(Slurp(run / "summary.json").find("\"steps_done\":20,"), std::string::npos);
  EXPECT_NE(Slurp(run / "config.json").find("\"position\":\"GATE_G1\""), std::string::npos);
  std::vector<int> steps = Steps(run);
  ASSERT_EQ(steps.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(steps[i], i + 1);
}

TEST_F(WorkerCliTest, CtrlCCheckpointsAndResumeFinishesEveryStepOnce) {
  const fs::path run = dir_ / "run";
  const std::string config = Config("c.yaml", 400).string();
  Result first = Run({"train", "--config", config, "--out", run.string()}, [&](pid_t pid) {
    // Interrupt once a few steps are on disk.
    for (int i = 0; i < 600 && Steps(run).size() < 12; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid, SIGINT);
  });
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.out.find("resume with: ablate-worker train --resume"), std::string::npos) << first.out;
  EXPECT_NE(Slurp(run / "summary.json").find("INTERRUPTED"), std::string::npos);
  const size_t done = Steps(run).size();
  EXPECT_GE(done, 12u);
  EXPECT_LT(done, 400u);

  Result second = Run({"train", "--resume", run.string()});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("resuming"), std::string::npos);
  std::vector<int> steps = Steps(run);
  ASSERT_EQ(steps.size(), 400u);
  for (int i = 0; i < 400; ++i) ASSERT_EQ(steps[i], i + 1);
  EXPECT_NE(Slurp(run / "summary.json").find("SUCCEEDED"), std::string::npos);
}

TEST_F(WorkerCliTest, BadConfigNamesFileLineAndField) {
  const fs::path p = dir_ / "bad.yaml";
  std::ofstream(p) << "model:\n  d_model: 32\n  num_hedas: 4\n";
  Result r = Run({"train", "--config", p.string(), "--out", (dir_ / "run").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad.yaml:3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("num_hedas"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoint.pt"));
}

TEST_F(WorkerCliTest, DivergedRunExitsThree) {
  Result r = Run({"train", "--config",
                  Config("c.yaml", 50, "  optimizer: {lr: 10000, warmup_steps: 0, grad_clip: 0}\n").string(),
                  "--out", (dir_ / "run").string()});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("DIVERGED"), std::string::npos) << r.out;
  EXPECT_NE(Slurp(dir_ / "run" / "summary.json").find("DIVERGED"), std::string::npos);
}

TEST_F(WorkerCliTest, RefusesToOverwriteARun) {
  const std::string config = Config("c.yaml", 5).string();
  const fs::path run = dir_ / "run";
  ASSERT_EQ(Run({"train", "--config", config, "--out", run.string()}).exit_code, 0);
  Result again = Run({"train", "--config", config, "--out", run.string()});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
}

}  // namespace
