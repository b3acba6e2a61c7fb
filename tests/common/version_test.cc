// The code version (common/version.h, cmake/code_version.cmake) over copies of the source tree
// in a temp dir: what changes it (a worker, config, proto or common file, added or edited) and
// what does not (docs), that a revert gives the old one back, that a git checkout names its commit
// and marks what differs from it, and that a plain `cmake --build` recomputes it every time while
// rebuilding what uses it only when it changed.
#include "common/version.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/process_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

const fs::path kSource = ABLATE_SOURCE_DIR;

// Runs a shell command; its exit code.
int Sh(const std::string& command) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string Quoted(const fs::path& p) { return absl::StrCat("'", p.string(), "'"); }

// The #defines of a header the script wrote: name -> value (quotes removed).
std::map<std::string, std::string> Defines(const fs::path& header) {
  std::map<std::string, std::string> out;
  std::ifstream in(header);
  std::string line;
  static const std::regex define("#define (\\w+) \"?([^\"]*)\"?");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, define)) out[m[1]] = m[2];
  }
  return out;
}

void Append(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::app) << text;
}

class VersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("version_test");
    tree_ = dir_ / "tree";
    std::filesystem::create_directories(tree_);
    for (const char* d : {"worker", "config", "proto", "common", "docs"}) {
      fs::copy(kSource / d, tree_ / d, fs::copy_options::recursive);
    }
    trainer_ = tree_ / "worker/train/trainer.cc";
    trainer_text_ = testing::Slurp(trainer_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The script on tree_: its header's #defines.
  std::map<std::string, std::string> Stamp() {
    const fs::path out = dir_ / "stamp.h";
    EXPECT_EQ(Sh(absl::StrCat(ABLATE_CMAKE_COMMAND, " -DSOURCE_DIR=", Quoted(tree_),
                              " '-DDIRS=worker|config|proto|common' -DPROJECT_VERSION=0.1.0",
                              " -DOUTPUT=", Quoted(out), " -P ",
                              Quoted(kSource / "cmake/code_version.cmake"))),
              0);
    return Defines(out);
  }
  std::string Hash() { return Stamp()["ABLATE_SOURCE_HASH"]; }
  int Git(const std::string& args) {
    return Sh(absl::StrCat("git -C ", Quoted(tree_),
                           " -c user.name=test -c user.email=test@example.org ", args));
  }
  std::string Commit() {
    std::string commit;
    FILE* git = popen(absl::StrCat("git -C ", Quoted(tree_), " rev-parse --short HEAD").c_str(), "r");
    char buffer[64];
    while (git != nullptr && fgets(buffer, sizeof buffer, git) != nullptr) commit += buffer;
    if (git != nullptr) pclose(git);
    while (!commit.empty() && commit.back() == '\n') commit.pop_back();
    return commit;
  }

  fs::path dir_, tree_, trainer_;
  std::string trainer_text_;
};

TEST_F(VersionTest, TheHashFollowsWhatRunsComputeAndNothingElse) {
  const std::string original = Hash();
  ASSERT_THAT(original, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(Stamp()["ABLATE_BUILD_VERSION"], "0.1.0+src-" + original.substr(0, 8));
  EXPECT_EQ(Stamp()["ABLATE_UNCOMMITTED_SOURCES"], "");

  Append(trainer_, "// one more line\n");
  const std::string edited = Hash();
  EXPECT_NE(edited, original);
  Append(tree_ / "docs/cli.md", "One more line.\n");  // docs: no run computes them
  EXPECT_EQ(Hash(), edited);
  std::ofstream(trainer_, std::ios::trunc) << trainer_text_;
  EXPECT_EQ(Hash(), original);  // reverted: the old keys come back

  for (const char* file : {"config/new.cc", "proto/new.proto", "common/new.h"}) {
    std::ofstream(tree_ / file) << "// new\n";
    EXPECT_NE(Hash(), original) << file;
    fs::remove(tree_ / file);
    EXPECT_EQ(Hash(), original) << file;
  }
  // Only the content counts: the same bytes under another name are another tree.
  fs::rename(tree_ / "worker/train/spike.h", tree_ / "worker/train/spikes.h");
  EXPECT_NE(Hash(), original);
}

TEST_F(VersionTest, AnUnchangedTreeLeavesTheHeaderAsItWas) {
  Stamp();
  const fs::path out = dir_ / "stamp.h";
  const fs::file_time_type past = fs::last_write_time(out) - std::chrono::hours(1);
  fs::last_write_time(out, past);
  Stamp();
  EXPECT_EQ(fs::last_write_time(out), past);  // not rewritten: nothing recompiles or relinks
  Append(trainer_, "// changed\n");
  Stamp();
  EXPECT_NE(fs::last_write_time(out), past);
}

TEST_F(VersionTest, AGitCheckoutNamesItsCommitAndMarksWhatDiffersFromIt) {
  const std::string outside_git = Hash();
  ASSERT_EQ(Git("init -q"), 0);
  ASSERT_EQ(Git("add -A"), 0);
  ASSERT_EQ(Git("commit -q -m first"), 0);
  const std::string first = Commit();
  ASSERT_THAT(first, MatchesRegex("[0-9a-f]{7,12}"));
  std::map<std::string, std::string> stamp = Stamp();
  EXPECT_EQ(stamp["ABLATE_SOURCE_HASH"], outside_git);  // the same files, the same hash
  EXPECT_EQ(stamp["ABLATE_BUILD_VERSION"], "0.1.0+" + first);
  EXPECT_EQ(stamp["ABLATE_UNCOMMITTED_SOURCES"], "");

  Append(trainer_, "// uncommitted\n");
  std::ofstream(tree_ / "worker/untracked.cc") << "// new\n";
  stamp = Stamp();
  const std::string dirty = stamp["ABLATE_SOURCE_HASH"];
  EXPECT_NE(dirty, outside_git);
  EXPECT_EQ(stamp["ABLATE_BUILD_VERSION"], absl::StrCat("0.1.0+", first, ".dirty-",
                                                        dirty.substr(0, 8)));
  EXPECT_EQ(stamp["ABLATE_UNCOMMITTED_SOURCES"], "worker/train/trainer.cc worker/untracked.cc");
  // An ignored file is no source.
  fs::remove(tree_ / "worker/untracked.cc");
  std::ofstream(tree_ / ".gitignore") << "*.swp\n";
  std::ofstream(tree_ / "worker/train/.trainer.cc.swp") << "editor state\n";
  EXPECT_EQ(Stamp()["ABLATE_UNCOMMITTED_SOURCES"], "worker/train/trainer.cc");

  // Reverted, and a docs-only commit: another commit, the same sources, the same hash.
  std::ofstream(trainer_, std::ios::trunc) << trainer_text_;
  Append(tree_ / "docs/cli.md", "Docs only.\n");
  ASSERT_EQ(Git("add -A"), 0);
  ASSERT_EQ(Git("commit -q -m docs"), 0);
  ASSERT_NE(Commit(), first);
  stamp = Stamp();
  EXPECT_EQ(stamp["ABLATE_SOURCE_HASH"], outside_git);
  EXPECT_EQ(stamp["ABLATE_BUILD_VERSION"], "0.1.0+" + Commit());
  EXPECT_EQ(stamp["ABLATE_UNCOMMITTED_SOURCES"], "");
}

// A project of one always-run stamp (cmake/CodeVersion.cmake, as common/CMakeLists.txt uses it)
// and a step that uses the header and counts its runs, built with this build's generator: each
// plain build recomputes the version, and the user reruns only when it changed.
TEST_F(VersionTest, APlainBuildRecomputesItAndRebuildsItsUsersOnlyWhenItChanged) {
  const fs::path project = dir_ / "project", build = dir_ / "build";
  fs::create_directories(project);
  std::ofstream(project / "use.cmake")
      << "file(READ ${IN} text)\nfile(WRITE ${OUT} \"${text}\")\nfile(APPEND ${LOG} \"run\\n\")\n";
  std::ofstream(project / "CMakeLists.txt") << absl::StrCat(
      "cmake_minimum_required(VERSION 3.21)\n"
      "project(stamp VERSION 0.1.0 LANGUAGES NONE)\n"
      "include(", (kSource / "cmake/CodeVersion.cmake").string(), ")\n"
      "ablate_code_version(stamp ${CMAKE_BINARY_DIR}/stamp.h ", tree_.string(),
      " worker config proto common)\n"
      "add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/used.h\n"
      "  COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_BINARY_DIR}/stamp.h -DOUT=${CMAKE_BINARY_DIR}/used.h\n"
      "          -DLOG=${CMAKE_BINARY_DIR}/runs.log -P ${CMAKE_SOURCE_DIR}/use.cmake\n"
      "  DEPENDS ${CMAKE_BINARY_DIR}/stamp.h)\n"
      "add_custom_target(use ALL DEPENDS ${CMAKE_BINARY_DIR}/used.h)\n"
      "add_dependencies(use stamp)\n");
  ASSERT_EQ(Sh(absl::StrCat(ABLATE_CMAKE_COMMAND, " -S ", Quoted(project), " -B ", Quoted(build),
                            " -G '", ABLATE_CMAKE_GENERATOR, "'")),
            0);
  auto build_it = [&] {
    EXPECT_EQ(Sh(absl::StrCat(ABLATE_CMAKE_COMMAND, " --build ", Quoted(build))), 0);
    return Defines(build / "used.h")["ABLATE_SOURCE_HASH"];
  };
  auto runs = [&] {
    std::string log = testing::Slurp(build / "runs.log");
    return std::count(log.begin(), log.end(), '\n');
  };
  const std::string original = build_it();
  ASSERT_THAT(original, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(build_it(), original);
  EXPECT_EQ(runs(), 1);  // nothing changed: its user did not run again

  Append(trainer_, "// edited, not committed, no reconfigure\n");
  const std::string edited = build_it();
  EXPECT_NE(edited, original);
  EXPECT_EQ(runs(), 2);
  Append(tree_ / "docs/cli.md", "Docs only.\n");
  EXPECT_EQ(build_it(), edited);
  EXPECT_EQ(runs(), 2);
  std::ofstream(trainer_, std::ios::trunc) << trainer_text_;
  EXPECT_EQ(build_it(), original);
  EXPECT_EQ(runs(), 3);
}

// This build's own strings agree with each other.
TEST(ThisBuildTest, CodeVersionBuildVersionAndTheNoteAgree) {
  const std::string code = CodeVersion();
  ASSERT_THAT(code, MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+\\+src-[0-9a-f]{16}"));
  const std::string hash8 = code.substr(code.size() - 16, 8);
  const std::string build = BuildVersion();
  if (UncommittedSources().empty()) {
    EXPECT_FALSE(absl::StrContains(build, ".dirty-")) << build;
    EXPECT_EQ(UncommittedSourcesNote(UncommittedSources()), "");
  } else {
    EXPECT_TRUE(absl::EndsWith(build, ".dirty-" + hash8)) << build;
  }
  EXPECT_THAT(VersionText(), HasSubstr(absl::StrCat(build, "\ncode ", code)));
  EXPECT_EQ(UncommittedSourcesNote({"worker/a.cc"}),
            "built from uncommitted changes to worker/a.cc: results are keyed to this exact "
            "source, and only workers built from it train them");
  EXPECT_THAT(UncommittedSourcesNote({"a", "b", "c", "d", "e"}),
              HasSubstr("changes to a, b, c and 2 more: "));
}

}  // namespace
}  // namespace ablate
