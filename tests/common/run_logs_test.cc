// ReadRunLog (common/run_logs.h): which attempt, the older half first, the tail and the byte cap
// read from the end against every line read from the start, what is not a log.
#include "common/run_logs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;

class RunLogsTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::FreshTestDir("run_logs_test"); }
  void TearDown() override { fs::remove_all(root_); }

  // Writes `bytes` to CHECKPOINT_ROOT/run-<run>/logs/<name>.
  fs::path Write(int64_t run, const std::string& name, const std::string& bytes) {
    const fs::path dir = root_ / absl::StrCat("run-", run) / "logs";
    fs::create_directories(dir);
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  }
  absl::StatusOr<RunLog> Read(int64_t run, int attempt = 0, int64_t tail = 0,
                              int64_t max_bytes = 0) {
    RunLogOptions o;
    o.attempt = attempt;
    o.tail = tail;
    o.max_bytes = max_bytes;
    return ReadRunLog(root_.string(), run, o);
  }

  fs::path root_;
};

TEST_F(RunLogsTest, CheckpointRootDefaultsToTheStateDirs) {
  EXPECT_EQ(CheckpointRootOf(".ablate", ""), ".ablate/checkpoints");
  EXPECT_EQ(CheckpointRootOf(".ablate", "/shared/ckpt"), "/shared/ckpt");
}

TEST_F(RunLogsTest, TheLastAttemptByDefaultAndTheOlderHalfFirst) {
  Write(7, "attempt-1.log", "first attempt\n");
  Write(7, "attempt-2.log.1", "old 1\nold 2\n");
  Write(7, "attempt-2.log", "new 1\nnew 2\n");
  Write(7, "attempt-10.log", "tenth\n");
  Write(7, "attempt-x.log", "not a log\n");
  Write(7, "attempt-0.log", "not an attempt\n");
  Write(7, "attempt-011.log", "not a worker's name\n");
  absl::StatusOr<RunLog> log = Read(7);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->attempt, 10);
  EXPECT_THAT(log->attempts, ElementsAre(1, 2, 10));
  EXPECT_EQ(log->path, (root_ / "run-7" / "logs" / "attempt-10.log").string());
  EXPECT_THAT(log->lines, ElementsAre("tenth"));
  EXPECT_FALSE(log->truncated);

  log = Read(7, 2);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->attempt, 2);
  EXPECT_THAT(log->lines, ElementsAre("old 1", "old 2", "new 1", "new 2"));
  log = Read(7, 2, 3);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(log->lines, ElementsAre("old 2", "new 1", "new 2"));
  EXPECT_TRUE(log->truncated);
  log = Read(7, 2, 4);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->lines.size(), 4u);
  EXPECT_FALSE(log->truncated);
}

TEST_F(RunLogsTest, NoLogIsNotFoundNamingTheDirectory) {
  absl::StatusOr<RunLog> log = Read(3);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(log.status().message(), (root_ / "run-3" / "logs").string()))
      << log.status();
  EXPECT_TRUE(absl::StrContains(log.status().message(), "only program runs keep their output"));
  Write(3, "attempt-1.log", "x\n");
  log = Read(3, 2);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(log.status().message(), "logs: no output of run 3 attempt 2 in "))
      << log.status();
  EXPECT_TRUE(Read(3, 1).ok());
}

// A link or a FIFO named like a log is not read: whoever can write the checkpoint root cannot
// make the dashboard serve another file, or hang on a pipe.
TEST_F(RunLogsTest, OnlyRegularFilesAreLogs) {
  const fs::path secret = root_ / "secret";
  std::ofstream(secret) << "token\n";
  Write(4, "attempt-1.log", "mine\n");
  fs::create_symlink(secret, root_ / "run-4" / "logs" / "attempt-2.log");
  ASSERT_EQ(::mkfifo((root_ / "run-4" / "logs" / "attempt-3.log").c_str(), 0600), 0);
  absl::StatusOr<RunLog> log = Read(4);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(log->attempts, ElementsAre(1));
  EXPECT_THAT(log->lines, ElementsAre("mine"));
  EXPECT_EQ(Read(4, 2).status().code(), absl::StatusCode::kNotFound);
  // An older half that is a link is skipped, the log itself still read.
  fs::create_symlink(secret, root_ / "run-4" / "logs" / "attempt-1.log.1");
  log = Read(4, 1, 10);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(log->lines, ElementsAre("mine"));
}

TEST_F(RunLogsTest, LinesAreTheProgramsBytes) {
  const std::string nul(1, '\0');
  Write(5, "attempt-1.log", "a\r\n\n\xff\xfe bytes" + nul + " nul\ntail without newline");
  absl::StatusOr<RunLog> log = Read(5);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(log->lines,
              ElementsAre("a\r", "", "\xff\xfe bytes" + nul + " nul", "tail without newline"));
}

TEST_F(RunLogsTest, ANewestLineOverTheByteCapKeepsItsEnd) {
  Write(6, "attempt-1.log", "short\n" + std::string(100000, 'x') + "END\n");
  absl::StatusOr<RunLog> log = Read(6, 0, 10, 1000);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->lines.size(), 1u);
  EXPECT_EQ(log->lines[0], std::string(997, 'x') + "END");
  EXPECT_TRUE(log->truncated);
  // Older lines fill what the newer leave, whole ones only.
  Write(6, "attempt-2.log", "aaaa\nbbbb\ncccc\n");
  log = Read(6, 2, 0, 9);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(log->lines, ElementsAre("bbbb", "cccc"));
  EXPECT_TRUE(log->truncated);
}

// What ReadRunLog keeps, from every line read the simple way: the newest while the tail has room.
std::vector<std::string> Expected(const std::vector<std::string>& all, int64_t tail,
                                  int64_t max_bytes, bool* truncated) {
  std::vector<std::string> kept;
  int64_t bytes = 0;
  *truncated = false;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const int64_t n = static_cast<int64_t>(it->size());
    if ((tail > 0 && static_cast<int64_t>(kept.size()) >= tail) ||
        (max_bytes > 0 && bytes >= max_bytes)) {
      *truncated = true;
      break;
    }
    if (max_bytes > 0 && bytes + n > max_bytes) {
      if (kept.empty()) kept.push_back(it->substr(it->size() - (max_bytes - bytes)));
      *truncated = true;
      break;
    }
    kept.push_back(*it);
    bytes += n;
  }
  return {kept.rbegin(), kept.rend()};
}

// Lines as std::getline reads them.
std::vector<std::string> GetLines(const std::string& bytes) {
  std::vector<std::string> lines;
  std::istringstream in(bytes);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Random logs (empty lines, no final newline, lines longer than a read chunk, an older half or
// not): reading from the end keeps exactly what reading every line from the start would.
TEST_F(RunLogsTest, ReadingFromTheEndAgreesWithReadingEverything) {
  std::mt19937 rng(20251206);
  auto text = [&](int lines) {
    std::string s;
    for (int i = 0; i < lines; ++i) {
      const int kind = static_cast<int>(rng() % 10);
      const size_t n = kind == 0 ? 0 : kind == 1 ? 70000 + rng() % 70000 : rng() % 40;
      for (size_t j = 0; j < n; ++j) s.push_back(static_cast<char>('a' + rng() % 26));
      if (i + 1 < lines || rng() % 2 == 0) s.push_back('\n');
    }
    return s;
  };
  for (int round = 0; round < 60; ++round) {
    const std::string older = round % 3 == 0 ? "" : text(static_cast<int>(rng() % 8));
    const std::string newer = text(static_cast<int>(rng() % 12));
    Write(round + 1, "attempt-1.log", newer);
    if (!older.empty() || round % 2 == 0) Write(round + 1, "attempt-1.log.1", older);
    std::vector<std::string> all = GetLines(older);
    for (std::string& line : GetLines(newer)) all.push_back(line);
    absl::StatusOr<RunLog> every = Read(round + 1);
    ASSERT_TRUE(every.ok()) << every.status();
    ASSERT_EQ(every->lines, all) << "round " << round;
    for (const int64_t tail : {0, 1, 2, 5, 100}) {
      for (const int64_t max_bytes : {0, 1, 30, 1000, 100000, 1 << 20}) {
        if (tail == 0 && max_bytes == 0) continue;
        bool truncated = false;
        const std::vector<std::string> want = Expected(all, tail, max_bytes, &truncated);
        absl::StatusOr<RunLog> log = Read(round + 1, 0, tail, max_bytes);
        ASSERT_TRUE(log.ok()) << log.status();
        ASSERT_EQ(log->lines, want)
            << "round " << round << " tail " << tail << " max_bytes " << max_bytes;
        EXPECT_EQ(log->truncated, truncated)
            << "round " << round << " tail " << tail << " max_bytes " << max_bytes;
      }
    }
  }
}

}  // namespace
}  // namespace ablate
