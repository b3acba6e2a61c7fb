// `ablate tag`, `untag` and `note` (and where their tags and notes show: status, export), and the
// exit codes: 2 for a bad command line on every command, and `watch` / `submit --watch` by how
// the sweep ended (0 all SUCCEEDED, 3 some DIVERGED, 4 some FAILED or CANCELLED). In-process
// (RunAblateCli) against a real coordinator on loopback.
#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "orchestrator/cli/cli.h"
#include "tests/cli_util.h"
#include "tests/orchestrator/cli/coordinator_cli_fixture.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCli;

class AnnotateExitCliTest : public CoordinatorCliFixture {
 protected:
  void SetUp() override {
    CoordinatorCliFixture::SetUp();
    ASSERT_EQ(Cli({"submit", SpecFile("quick")}).code, 0);
  }
  // A fake worker takes every queued run and ends the i-th it takes as `ends[i]` (SUCCEEDED when
  // not named); a FAILED end is permanent, so the sweep ends without retries.
  void TrainAll(const std::map<int, RunState>& ends) {
    const int64_t worker = RegisterWorker("exit-worker");
    for (int i = 0;; ++i) {
      AcquireJobResponse r = TryAcquire(worker);
      if (!r.has_job()) break;
      auto it = ends.find(i);
      const RunState end = it == ends.end() ? SUCCEEDED : it->second;
      FinishRequest finish = MakeFinish(worker, r.job(), end, end == FAILED ? "data missing" : "");
      finish.set_permanent(end == FAILED);
      FinishResponse reply;
      ASSERT_TRUE(CallFinish(finish, &reply).ok());
    }
  }
  // `ablate watch SWEEP --plain` after the sweep ended: it replays the sweep and exits.
  CliResult Watch(const std::string& sweep) { return Cli({"watch", sweep, "--plain"}); }
};

TEST_F(AnnotateExitCliTest, TagsAndNotesShowInStatusAndExport) {
  CliResult r = Cli({"tag", "quick", "phase1", "lr:3e-4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tagged sweep quick: phase1 lr:3e-4\n");
  r = Cli({"tag", "quick/2", "bugged", "phase1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tagged run 2 of sweep quick: bugged phase1\n");
  r = Cli({"tag", "quick/2", "bugged"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "run 2 of sweep quick already tagged: bugged\n");
  r = Cli({"untag", "quick/2", "phase1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "untagged run 2 of sweep quick: phase1\n");
  r = Cli({"note", "quick", "lr sweep, phase 1 of 2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "note on sweep quick\n");
  r = Cli({"note", "1/2", "loader bug: the first 50 steps saw one shard"});  // the sweep by id
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "note on run 2 of sweep quick\n");

  r = Cli({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 PENDING  tags: phase1, lr:3e-4\n"));
  r = Cli({"status", "quick"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\ntags: phase1, lr:3e-4\nnote: lr sweep, phase 1 of 2\n"
                               "note on run 2: loader bug: the first 50 steps saw one shard\n"));
  // Run 2's line ends with its own tags, and no other run's has any.
  const std::vector<std::string> rows = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  int tagged = 0;
  for (const std::string& row : rows) {
    if (!absl::StrContains(row, "tags: bugged")) continue;
    ++tagged;
    EXPECT_THAT(row, ::testing::StartsWith("    2  g1_elementwise"));
    EXPECT_THAT(row, ::testing::EndsWith("0/200         -         -  tags: bugged"));
  }
  EXPECT_EQ(tagged, 1) << r.out;

  // export: a tags column per run, the run's own and the sweep's, sorted.
  r = Cli({"export", "quick", "--format", "csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u);
  // (The cost columns of schema 11 follow it, empty for runs not yet trained.)
  EXPECT_THAT(lines[0], ::testing::HasSubstr(",reused_from,tags,peak_memory_bytes,"));
  EXPECT_THAT(lines[1], ::testing::HasSubstr(",\"lr:3e-4,phase1\","));
  EXPECT_THAT(lines[2], ::testing::HasSubstr(",\"bugged,lr:3e-4,phase1\","));
}

TEST_F(AnnotateExitCliTest, BadTagsTargetsAndNotesAreRefusedNamingWhatIsWrong) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"tag", "nope", "x"}, "no sweep named nope"},
      {{"tag", "quick/99", "x"}, "sweep quick has no run 99"},
      {{"tag", "quick/abc", "x"}, "\"quick/abc\" is not SWEEP or SWEEP/RUN_ID"},
      {{"tag", "quick/0", "x"}, "\"quick/0\" is not SWEEP or SWEEP/RUN_ID"},
      {{"tag", "quick", "has space"}, "tag: \"has space\" is not a tag (1 to 64 of"},
      {{"tag", "quick", "a,b"}, "tag: \"a,b\" is not a tag"},
      {{"tag", "quick", ""}, "tag: \"\" is not a tag"},
      {{"tag", "quick", std::string(65, 'x')}, "is not a tag (1 to 64"},
      {{"untag", "quick", "never"}, "sweep quick has no tag \"never\""},
      {{"note", "quick", "   "}, "note: the note is empty"},
      {{"note", "quick", std::string(5000, 'n')},
       "note: the note is 5000 bytes; the limit is 4096"},
  };
  for (const Case& c : cases) {
    CliResult r = Cli(c.args);
    EXPECT_EQ(r.code, 1) << c.args[0] << " " << c.args[1];
    EXPECT_THAT(r.err, HasSubstr(c.error)) << c.args[0] << " " << c.args[1];
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_EQ(CountRows("annotations"), 0);
  // A tag of another sweep's run: the run is named, not the sweep's.
  ASSERT_EQ(Cli({"submit", SpecFile("other")}).code, 0);
  CliResult r = Cli({"tag", "other/1", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("sweep other has no run 1"));
}

TEST_F(AnnotateExitCliTest, ABadCommandLineExitsTwoOnEveryCommand) {
  const std::vector<std::vector<std::string>> bad = {
      {"status", "--no-such-flag"},
      {"submit"},                                 // a missing argument
      {"query", "SELECT 1", "--max-rows", "-5"},  // a value out of range
      {"query", "SELECT 1", "--format", "xml"},   // a value not among the choices
      {"export", "quick", "--format", "parquet"},
      {"watch"},
      {"tag", "quick"},                          // no tag
      {"note", "quick"},                         // no text
      {"rerun", "quick"},                        // --failed is required
      {"cancel", "quick", "--timeout", "soon"},  // not a number
      {"status", "--token", token_},             // a token on the command line
  };
  for (const std::vector<std::string>& args : bad) {
    CliResult r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << args[0] << ": " << r.err;
  }
  EXPECT_EQ(RunCli({"no-such-command"}).code, kExitUsage);
  EXPECT_EQ(RunCli({}).code, kExitUsage);  // a subcommand is required
  EXPECT_EQ(RunCli({"expand", "x.yaml", "--mfu", "40"}).code, kExitUsage);
  EXPECT_EQ(RunCli({"report", "quick"}).code, kExitUsage);  // --out is required
  // --help and --version are no errors.
  EXPECT_EQ(RunCli({"--help"}).code, 0);
  EXPECT_EQ(RunCli({"--version"}).code, 0);
  EXPECT_EQ(RunCli({"tag", "--help"}).code, 0);
  EXPECT_EQ(CountRows("annotations"), 0);
}

TEST_F(AnnotateExitCliTest, WatchExitsZeroThreeOrFourByHowTheSweepEnded) {
  TrainAll({});
  CliResult r = Watch("quick");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("sweep quick DONE: 4 SUCCEEDED"));

  ASSERT_EQ(Cli({"submit", SpecFile("diverged"), "--force"}).code, 0);
  TrainAll({{1, DIVERGED}});
  r = Watch("diverged");
  EXPECT_EQ(r.code, kExitDiverged) << r.err;
  EXPECT_EQ(r.err, "watch: 1 of 4 runs of sweep diverged DIVERGED\n");

  // FAILED wins over DIVERGED.
  ASSERT_EQ(Cli({"submit", SpecFile("failed"), "--force"}).code, 0);
  TrainAll({{0, DIVERGED}, {2, FAILED}});
  r = Watch("failed");
  EXPECT_EQ(r.code, kExitRunsFailed) << r.err;
  EXPECT_EQ(r.err, "watch: 1 of 4 runs of sweep failed FAILED or were CANCELLED\n");
  EXPECT_THAT(r.out, HasSubstr("sweep failed DONE: 2 SUCCEEDED, 1 FAILED, 1 DIVERGED"));

  ASSERT_EQ(Cli({"submit", SpecFile("reused")}).code, 0);  // every run reused from quick's
  ASSERT_EQ(Watch("reused").code, 0);
  ASSERT_EQ(Cli({"submit", SpecFile("stopped"), "--force"}).code, 0);
  ASSERT_EQ(Cli({"cancel", "stopped"}).code, 0);
  r = Watch("stopped");
  EXPECT_EQ(r.code, kExitRunsFailed) << r.err;
  EXPECT_THAT(r.err, HasSubstr("4 of 4 runs of sweep stopped FAILED or were CANCELLED"));
}

TEST_F(AnnotateExitCliTest, SubmitWatchExitsAsWatchDoes) {
  TrainAll({});  // quick: every later sweep of its runs reuses them unless --force
  const std::string spec = SpecFile("again");
  CliResult watched;
  std::thread cli([&] { watched = Cli({"submit", spec, "--watch", "--plain", "--force"}); });
  for (int i = 0; i < 200 && CountRows("runs") < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(CountRows("runs"), 8);
  TrainAll({{3, DIVERGED}});
  cli.join();
  EXPECT_EQ(watched.code, kExitDiverged) << watched.err;
  EXPECT_THAT(watched.out, HasSubstr("sweep again DONE: 3 SUCCEEDED, 1 DIVERGED"));
  EXPECT_EQ(watched.err, "watch: 1 of 4 runs of sweep again DIVERGED\n");
}

}  // namespace
}  // namespace ablate
