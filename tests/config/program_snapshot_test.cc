// A program's code, content-addressed (config/program_snapshot.h): reading it by globs from a
// temp dir, its hash, the checks of a received snapshot and writing it out.
#include "config/program_snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const fs::path& path, const std::string& content) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Paths(const ProgramSnapshot& s) {
  std::vector<std::string> out;
  for (const ProgramFile& f : s.files()) out.push_back(f.path());
  return out;
}

ProgramSnapshot Snapshot(const std::vector<std::pair<std::string, std::string>>& files) {
  ProgramSnapshot s;
  for (const auto& [path, content] : files) {
    ProgramFile* f = s.add_files();
    f->set_path(path);
    f->set_content(content);
  }
  s.set_code_hash(SnapshotHash(s));
  return s;
}

class ProgramSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("program_snapshot_test");
    code_ = dir_ / "code";
    WriteFile(code_ / "train.py", "print('train')\n");
    WriteFile(code_ / "model.py", "class GPT: pass\n");
    WriteFile(code_ / "notes.txt", "not code\n");
    WriteFile(code_ / "config" / "small.py", "n_layer = 2\n");
    WriteFile(code_ / "config" / "deep" / "tiny.py", "n_layer = 1\n");
    WriteFile(code_ / ".git" / "hook.py", "hidden\n");
    WriteFile(code_ / "config" / ".cache" / "x.py", "hidden too\n");
    WriteFile(code_ / "run.sh", "#!/bin/sh\n");
    fs::permissions(code_ / "run.sh", fs::perms::owner_all | fs::perms::group_read);
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::StatusOr<ProgramSnapshot> Read(const std::vector<std::string>& globs) {
    return ReadProgramCode(code_.string(), globs);
  }

  fs::path dir_, code_;
};

TEST_F(ProgramSnapshotTest, GlobsChooseFilesSortedWithTheirHash) {
  absl::StatusOr<ProgramSnapshot> s = Read({"*.py"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(Paths(*s), ElementsAre("model.py", "train.py"));  // '*' stays in its directory
  EXPECT_EQ(s->files(1).content(), "print('train')\n");
  EXPECT_EQ(s->code_hash(), SnapshotHash(*s));
  EXPECT_TRUE(CheckSnapshot(*s).ok());

  s = Read({"config/*.py"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(Paths(*s), ElementsAre("config/small.py"));

  // "**/" spans any directories, none included; hidden ones are never searched.
  s = Read({"**/*.py"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(Paths(*s), ElementsAre("config/deep/tiny.py", "config/small.py", "model.py",
                                     "train.py"));

  // Overlapping globs pick each file once.
  s = Read({"train.py", "*.py", "run.sh"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(Paths(*s), ElementsAre("model.py", "run.sh", "train.py"));
  EXPECT_TRUE(s->files(1).executable());
  EXPECT_FALSE(s->files(0).executable());
}

TEST_F(ProgramSnapshotTest, ReadErrors) {
  absl::StatusOr<ProgramSnapshot> s = Read({"*.py", "data/*.bin"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("\"data/*.bin\" matches no file"));

  s = Read({".git/*.py"});  // hidden directories are not searched
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  s = Read({"../outside.py"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  s = ReadProgramCode((dir_ / "absent").string(), {"*.py"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);

  WriteFile(code_ / "weights.py", std::string(kMaxProgramCodeBytes + 1, 'w'));
  s = Read({"*.py"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("MiB"));
}

TEST(SnapshotHashTest, StableAndContentSensitive) {
  const ProgramSnapshot a = Snapshot({{"a.py", "x = 1\n"}, {"b/c.py", "y = 2\n"}});
  EXPECT_EQ(a.code_hash().size(), 64u);
  EXPECT_EQ(a.code_hash().find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(SnapshotHash(a), a.code_hash());
  // The order of files in the message does not matter.
  EXPECT_EQ(Snapshot({{"b/c.py", "y = 2\n"}, {"a.py", "x = 1\n"}}).code_hash(), a.code_hash());

  EXPECT_NE(Snapshot({{"a.py", "x = 3\n"}, {"b/c.py", "y = 2\n"}}).code_hash(), a.code_hash());
  EXPECT_NE(Snapshot({{"a2.py", "x = 1\n"}, {"b/c.py", "y = 2\n"}}).code_hash(), a.code_hash());
  EXPECT_NE(Snapshot({{"a.py", "x = 1\n"}}).code_hash(), a.code_hash());
  // Paths and contents cannot run into one another.
  EXPECT_NE(Snapshot({{"ab", "c"}}).code_hash(), Snapshot({{"a", "bc"}}).code_hash());
  ProgramSnapshot exec = a;
  exec.mutable_files(0)->set_executable(true);
  EXPECT_NE(SnapshotHash(exec), a.code_hash());
}

TEST(SnapshotHashTest, AnEditOnDiskChangesTheHash) {
  const fs::path dir = testing::FreshTestDir("program_snapshot_test");
  WriteFile(dir / "train.py", "lr = 1e-3\n");
  absl::StatusOr<ProgramSnapshot> before = ReadProgramCode(dir.string(), {"*.py"});
  absl::StatusOr<ProgramSnapshot> again = ReadProgramCode(dir.string(), {"*.py"});
  WriteFile(dir / "train.py", "lr = 1e-4\n");
  absl::StatusOr<ProgramSnapshot> after = ReadProgramCode(dir.string(), {"*.py"});
  fs::remove_all(dir);
  ASSERT_TRUE(before.ok() && again.ok() && after.ok());
  EXPECT_EQ(before->code_hash(), again->code_hash());
  EXPECT_NE(before->code_hash(), after->code_hash());
}

TEST(CheckSnapshotTest, RefusesWhatReadProgramCodeCannotMake) {
  EXPECT_TRUE(CheckSnapshot(Snapshot({{"a.py", "x"}, {"sub/b.py", "y"}})).ok());
  for (const char* bad : {"../x.py", "/abs/x.py", "sub/../../x.py", "./x.py", ""}) {
    const absl::Status s = CheckSnapshot(Snapshot({{"a.py", "x"}, {bad, "y"}}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(CheckSnapshot(Snapshot({{"a.py", "x"}, {"a.py", "y"}})).message(),
              HasSubstr("a.py twice"));
  ProgramSnapshot wrong = Snapshot({{"a.py", "x"}});
  wrong.mutable_files(0)->set_content("tampered");
  EXPECT_THAT(CheckSnapshot(wrong).message(), HasSubstr("code_hash"));
  wrong = Snapshot({{"a.py", "x"}});
  wrong.set_code_hash("");
  EXPECT_EQ(CheckSnapshot(wrong).code(), absl::StatusCode::kInvalidArgument);

  ProgramSnapshot many;
  for (int i = 0; i <= kMaxProgramFiles; ++i) many.add_files()->set_path(std::to_string(i));
  many.set_code_hash(SnapshotHash(many));
  EXPECT_THAT(CheckSnapshot(many).message(), HasSubstr("files; at most"));
}

TEST_F(ProgramSnapshotTest, MaterializeWritesFilesAndReusesTheDirectory) {
  absl::StatusOr<ProgramSnapshot> s = Read({"**/*.py", "run.sh"});
  ASSERT_TRUE(s.ok()) << s.status();
  const fs::path root = dir_ / "snapshots";
  absl::StatusOr<std::string> out = MaterializeSnapshot(*s, root.string());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(fs::path(*out), root / s->code_hash());
  for (const ProgramFile& f : s->files()) {
    EXPECT_EQ(ReadFile(fs::path(*out) / f.path()), f.content()) << f.path();
  }
  struct stat st;
  ASSERT_EQ(stat((fs::path(*out) / "run.sh").c_str(), &st), 0);
  EXPECT_TRUE(st.st_mode & S_IXUSR);
  ASSERT_EQ(stat((fs::path(*out) / "train.py").c_str(), &st), 0);
  EXPECT_FALSE(st.st_mode & S_IXUSR);
  // Reading the copy back gives the same snapshot.
  absl::StatusOr<ProgramSnapshot> back = ReadProgramCode(*out, {"**/*.py", "run.sh"});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->code_hash(), s->code_hash());

  // An existing directory of that hash is reused as it is, and no temporary is left behind.
  WriteFile(fs::path(*out) / "marker", "kept");
  absl::StatusOr<std::string> again = MaterializeSnapshot(*s, root.string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *out);
  EXPECT_EQ(ReadFile(fs::path(*out) / "marker"), "kept");
  int entries = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    ++entries;
    EXPECT_EQ(e.path().filename().string(), s->code_hash());
  }
  EXPECT_EQ(entries, 1);

  // Another snapshot gets a directory of its own.
  absl::StatusOr<std::string> other = MaterializeSnapshot(Snapshot({{"a.py", "1"}}), root.string());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(*other, *out);
  EXPECT_EQ(ReadFile(fs::path(*other) / "a.py"), "1");
}

TEST_F(ProgramSnapshotTest, MaterializeRefusesABadSnapshot) {
  const fs::path root = dir_ / "snapshots";
  ProgramSnapshot bad = Snapshot({{"../escape.py", "x"}});
  EXPECT_EQ(MaterializeSnapshot(bad, root.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = Snapshot({{"a.py", "x"}});
  bad.set_code_hash(std::string(64, '0'));
  EXPECT_EQ(MaterializeSnapshot(bad, root.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir_ / "escape.py"));
  EXPECT_FALSE(fs::exists(root / std::string(64, '0')));
}

}  // namespace
}  // namespace ablate
