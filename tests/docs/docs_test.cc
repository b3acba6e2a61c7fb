// The docs' examples, run as a user runs them: every fenced block of README.md and docs/*.md
// whose info string says `test` is executed, in order, in a fresh directory of its own (one per
// document) with the built `ablate` and `ablate-worker` first on PATH, no ABLATE_* variables,
// and `experiments/` linked in (a user's study directory with the shipped specs copied in).
//
//   ```sh test          the block is one bash script (-e) that must exit 0. A line
//                       ending in `&` (a comment may follow) starts something in the
//                       background (`ablate up`): the
//                       block then waits for its first line of output, as a user reads it
//                       before typing on.
//   ```console test     `$ COMMAND` lines (a trailing `\` continues one), each followed by the
//                       output it must print (stdout and stderr). A line `...` stands for any
//                       number of lines. Numbers, run keys and commit hashes may differ, and so
//                       may the runs of spaces that align columns. The docs show a clean
//                       build's output: a build from uncommitted changes marks its version
//                       (`.dirty-3f2a9c1d`) and adds a line `built from uncommitted changes
//                       ...` (common/version.h), and both are left out of the comparison. `# exits N` after a command
//                       says it fails with code N (else it must exit 0).
//   ```yaml test F      (any other language) the block is written to the file F, for the blocks
//                       after it: a spec shown whole is the spec that runs.
//
// Whatever a document started is stopped (SIGTERM, then SIGKILL) after its last block, and
// before its first what an earlier run killed midway left behind: every process started carries
// ABLATE_DOCS_TEST=<document> in its environment.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/process_util.h"

extern char** environ;

// Inside ablate::testing, beside the process helpers it is made of (tests/process_util.h).
namespace ablate::testing {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = ABLATE_SOURCE_DIR;
const fs::path kBinDir = fs::path(ABLATE_BIN).parent_path();

struct Command {
  std::string text;  // as bash runs it
  int line = 0;      // in the document
  int exit_code = 0;
  std::vector<std::string> expected;  // console blocks: the output shown
};

struct Block {
  enum class Kind { kSh, kConsole, kFile };
  Kind kind = Kind::kSh;
  int line = 0;
  std::string script;  // sh; a file's content
  std::string file;    // file
  std::vector<Command> commands;  // console
};

std::vector<Block> TestBlocks(const fs::path& doc) {
  std::ifstream in(doc);
  std::vector<Block> blocks;
  std::string line;
  int number = 0;
  Block* block = nullptr;
  bool fenced = false;
  while (std::getline(in, line)) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      if (fenced) {
        fenced = false;
        block = nullptr;
        continue;
      }
      fenced = true;
      std::istringstream info(line.substr(3));
      std::string kind, word, file;
      info >> kind;
      bool test = false;
      while (info >> word) {
        if (test && file.empty()) file = word;
        test = test || word == "test";
      }
      if (!test) continue;
      Block b;
      b.line = number;
      b.kind = kind == "sh" ? Block::Kind::kSh
               : kind == "console" ? Block::Kind::kConsole
                                   : Block::Kind::kFile;
      b.file = file;
      blocks.push_back(b);
      block = &blocks.back();
      continue;
    }
    if (block == nullptr) continue;
    if (block->kind != Block::Kind::kConsole) {
      block->script += line + "\n";
      continue;
    }
    Command* last = block->commands.empty() ? nullptr : &block->commands.back();
    const bool continued = last != nullptr && last->expected.empty() && !last->text.empty() &&
                           last->text.back() == '\\';
    if (continued) {
      last->text += "\n" + line;
    } else if (line.rfind("$ ", 0) == 0) {
      block->commands.push_back(Command{line.substr(2), number, 0, {}});
    } else if (last != nullptr) {
      last->expected.push_back(line);
    }
  }
  for (Block& b : blocks) {
    for (Command& c : b.commands) {
      static const std::regex exits("#\\s*exits\\s+(\\d+)\\s*$");
      std::smatch m;
      if (std::regex_search(c.text, m, exits)) c.exit_code = std::stoi(m[1]);
    }
  }
  return blocks;
}

// Whether a line of `script` ends its command with `&` (a comment may follow; `&&` is not it).
bool StartsInTheBackground(const std::string& script) {
  static const std::regex background("(^|[^&])&[ \t]*(#[^\n]*)?(\n|$)");
  return std::regex_search(script, background);
}

// How UncommittedSourcesNote begins (common/version.h): the line a dirty build adds.
constexpr char kUncommittedNote[] = "built from uncommitted changes to ";

// What may differ between the doc and a run: numbers, run keys, commit hashes, alignment.
std::string Normalize(std::string line) {
  // A run key: 16 hex digits standing alone (not the decimals of a number).
  static const std::regex hex16("(^|[^.\\w])[0-9a-f]{16}(?!\\w)");
  static const std::regex commit("\\+[0-9a-f]{7,12}\\b");
  static const std::regex dirty("\\.dirty-[0-9a-f]{8}\\b");
  static const std::regex number("[0-9][0-9,]*(\\.[0-9]+)?([eE][-+]?[0-9]+)?");
  static const std::regex spaces("\\s+");
  line = std::regex_replace(line, dirty, "");
  line = std::regex_replace(line, hex16, "$1#");
  line = std::regex_replace(line, commit, "+#");
  line = std::regex_replace(line, number, "0");
  line = std::regex_replace(line, spaces, " ");
  const size_t begin = line.find_first_not_of(' ');
  if (begin == std::string::npos) return "";
  return line.substr(begin, line.find_last_not_of(' ') - begin + 1);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!Normalize(line).empty() && line.rfind(kUncommittedNote, 0) != 0) lines.push_back(line);
  }
  return lines;
}

// Whether `actual` matches `expected` from positions i and j on ("..." matches any lines).
bool Matches(const std::vector<std::string>& expected, size_t i,
             const std::vector<std::string>& actual, size_t j) {
  if (i == expected.size()) return j == actual.size();
  if (Normalize(expected[i]) == "...") {
    for (size_t k = j; k <= actual.size(); ++k) {
      if (Matches(expected, i + 1, actual, k)) return true;
    }
    return false;
  }
  return j < actual.size() && Normalize(expected[i]) == Normalize(actual[j]) &&
         Matches(expected, i + 1, actual, j + 1);
}

class DocsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string name = GetParam();
    for (char& c : name) {
      if (c == '/' || c == '.') c = '_';
    }
    tag_ = "ABLATE_DOCS_TEST=" + name;
    // What an earlier run of this document left running, killed before its TearDown (a ctest
    // timeout): an `ablate serve --port 7070` of it would hold the port this run needs.
    StopTagged();
    dir_ = fs::temp_directory_path() / ("ablate_docs_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::create_directory_symlink(kSource / "experiments", dir_ / "experiments");
    // The environment: ours without ABLATE_*, the build first on PATH, the tag.
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (entry.rfind("ABLATE_", 0) == 0 || entry.rfind("PATH=", 0) == 0) continue;
      env_.push_back(entry);
    }
    const char* path = std::getenv("PATH");
    env_.push_back("PATH=" + kBinDir.string() + ":" + (path != nullptr ? path : "/usr/bin:/bin"));
    env_.push_back(tag_);
  }

  void TearDown() override {
    StopTagged();
    // Reap our own children (the shells); grandchildren were re-parented.
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Stops every process carrying this document's tag: SIGTERM, then SIGKILL after 60 s.
  void StopTagged() {
    SignalProcessesWithEnv(tag_, SIGTERM);
    const bool gone =
        WaitFor([&] { return SignalProcessesWithEnv(tag_, 0) == 0; }, std::chrono::seconds(60));
    if (!gone) SignalProcessesWithEnv(tag_, SIGKILL);
  }

  // `bash [-e] -c SCRIPT` in the document's directory, output into `log`. No pipefail: as in a
  // user's shell, `ablate expand ... | head` succeeds.
  pid_t Bash(const std::string& script, bool errexit, const fs::path& log) {
    std::vector<std::string> args = {"bash"};
    if (errexit) args.push_back("-e");
    args.insert(args.end(), {"-c", script});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (std::string& e : env_) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addchdir_np(&actions, dir_.c_str());
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, "bash", &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    return rc == 0 ? pid : -1;
  }

  void RunSh(const Block& block, const std::string& where) {
    const fs::path log = dir_ / ("block-" + std::to_string(block.line) + ".log");
    const int code = WaitExit(Bash(block.script, true, log), std::chrono::seconds(600));
    ASSERT_EQ(code, 0) << where << ": the block failed:\n" << block.script << "--- output:\n"
                       << Slurp(log);
    if (StartsInTheBackground(block.script)) {
      EXPECT_TRUE(WaitFor([&] { return !Slurp(log).empty(); }, std::chrono::seconds(60)))
          << where << ": what the block started printed nothing in 60 s";
    }
  }

  void RunConsole(const Block& block, const std::string& doc) {
    for (const Command& c : block.commands) {
      const std::string where = doc + ":" + std::to_string(c.line);
      const fs::path log = dir_ / ("command-" + std::to_string(c.line) + ".log");
      const int code = WaitExit(Bash(c.text, false, log), std::chrono::seconds(600));
      const std::string output = Slurp(log);
      EXPECT_EQ(code, c.exit_code) << where << ": $ " << c.text << "\n" << output;
      const std::vector<std::string> expected = Lines(Join(c.expected));
      const std::vector<std::string> actual = Lines(output);
      EXPECT_TRUE(Matches(expected, 0, actual, 0))
          << where << ": $ " << c.text << "\n--- the doc shows:\n" << Join(c.expected)
          << "--- it printed:\n" << output;
      if (HasFailure()) return;  // later commands build on this one
    }
  }

  static std::string Join(const std::vector<std::string>& lines) {
    std::string out;
    for (const std::string& l : lines) out += l + "\n";
    return out;
  }

  std::string tag_;
  fs::path dir_;
  std::vector<std::string> env_;
};

TEST_P(DocsTest, ExamplesRunAsShown) {
  const std::vector<Block> blocks = TestBlocks(kSource / GetParam());
  ASSERT_FALSE(blocks.empty()) << GetParam() << " has no `sh test` or `console test` block";
  for (const Block& block : blocks) {
    const std::string where = GetParam() + ":" + std::to_string(block.line);
    switch (block.kind) {
      case Block::Kind::kConsole:
        RunConsole(block, GetParam());
        break;
      case Block::Kind::kSh:
        RunSh(block, where);
        break;
      case Block::Kind::kFile:
        ASSERT_FALSE(block.file.empty()) << where << ": a `LANG test` block names its file";
        std::ofstream(dir_ / block.file) << block.script;
        break;
    }
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Docs, DocsTest,
                         ::testing::Values("README.md", "docs/cli.md", "docs/spec.md",
                                           "docs/schema.md", "docs/worker.md", "docs/operations.md",
                                           "docs/program.md", "docs/data.md", "docs/evals.md"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// The harness itself: what counts as the same output.
TEST(DocsHarnessTest, ABackgroundCommandMayCarryAComment) {
  EXPECT_TRUE(StartsInTheBackground("ablate up &\n"));
  EXPECT_TRUE(StartsInTheBackground("ablate up --workers 2 &   # coordinator + workers\n"));
  EXPECT_TRUE(StartsInTheBackground("cd x\nablate serve &"));
  EXPECT_FALSE(StartsInTheBackground("make && ablate status\n"));
  EXPECT_FALSE(StartsInTheBackground("test -f a &&\n  echo yes\n"));
  EXPECT_FALSE(StartsInTheBackground("ablate status  # not & here\n"));
}

TEST(DocsHarnessTest, NumbersKeysAndAlignmentMayDifferButWordsMayNot) {
  EXPECT_EQ(Normalize("0  baseline   0  -   279,232  891cd08d774519d1"),
            Normalize("0 baseline 0 - 279,488 50b3bba759aeeb1f"));
  EXPECT_EQ(Normalize("code 0.1.0+ffe61f5"), Normalize("code 0.1.0+3dc3d03"));
  EXPECT_EQ(Normalize("code 0.1.0+ffe61f5"), Normalize("code 0.1.0+3dc3d03.dirty-3f2a9c1d"));
  EXPECT_EQ(Normalize("code 0.1.0+src-3f2a9c1d4e5f6071 (x)"),
            Normalize("code 0.1.0+src-672c5d83c3fbd580 (x)"));
  EXPECT_EQ(Lines("a\nbuilt from uncommitted changes to worker/x.cc: ...\nb\n"),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Normalize("g1,2.038924038410187,"), Normalize("g1,2.0388858020305634,"));
  EXPECT_NE(Normalize("4 runs, 4 queued"), Normalize("4 runs, 4 reused"));
  const std::vector<std::string> expected = {"first", "...", "last 1"};
  EXPECT_TRUE(Matches(expected, 0, {"first", "a", "b", "last 2"}, 0));
  EXPECT_TRUE(Matches(expected, 0, {"first", "last 2"}, 0));
  EXPECT_FALSE(Matches(expected, 0, {"first", "a"}, 0));
  EXPECT_FALSE(Matches({"first"}, 0, {"first", "extra"}, 0));
}

}  // namespace
}  // namespace ablate::testing
