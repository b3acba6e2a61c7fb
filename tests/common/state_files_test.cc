// The state dir's files: written whole, durably, never through a planted link; the credentials
// derived from the secret, mode 0600.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "common/durable_file.h"
#include "common/state_dir.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;

class StateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTestDir("ablate_state_files"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(StateFilesTest, AFileIsReplacedWholeWithItsModeAndNoTemporaryLeft) {
  const fs::path file = dir_ / "address";
  ASSERT_TRUE(WriteFileAtomically(file.string(), "127.0.0.1:1\n", 0644).ok());
  ASSERT_TRUE(WriteFileAtomically(file.string(), "127.0.0.1:2\n", 0600).ok());
  EXPECT_EQ(Slurp(file), "127.0.0.1:2\n");
  struct stat st;
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.exists() ? 1 : 0;
  EXPECT_EQ(entries, 1);
}

// Another user of a shared directory who plants links where the temporary file will be (its name
// is predictable: host, pid, a counter) must not get the secret written through them.
TEST_F(StateFilesTest, ALinkPlantedAtTheTemporaryNameIsNotFollowed) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const fs::path file = dir_ / "token";
  const fs::path stolen = dir_ / "stolen";
  for (int n = 0; n < 64; ++n) {
    fs::create_symlink(stolen, absl::StrCat(file.string(), ".tmp.", host, ".", ::getpid(), ".", n));
  }
  EXPECT_FALSE(WriteFileAtomically(file.string(), "the secret\n", 0600).ok());
  EXPECT_FALSE(fs::exists(stolen));
  EXPECT_FALSE(fs::exists(file));
}

TEST_F(StateFilesTest, CredentialsAreDerivedAndWrittenBesideTheSecretMode0600) {
  absl::StatusOr<Credentials> first = LoadOrCreateCredentials(dir_.string());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Credentials> again = LoadOrCreateCredentials(dir_.string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->admin, first->admin);
  EXPECT_EQ(again->worker, first->worker);
  EXPECT_EQ(first->admin.size(), 64u);
  for (const char* name : {"token", kWorkerTokenFile, kReadTokenFile}) {
    struct stat st;
    ASSERT_EQ(::stat((dir_ / name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600) << name;
  }
  EXPECT_EQ(ReadFirstLine((dir_ / kWorkerTokenFile).string()), first->worker);
  EXPECT_EQ(ReadFirstLine((dir_ / kReadTokenFile).string()), first->read);
  // A token file others can read is refused, naming the fix.
  ::chmod((dir_ / "token").c_str(), 0644);
  absl::StatusOr<Credentials> open = LoadOrCreateCredentials(dir_.string());
  EXPECT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos) << open.status();
}

// A state dir others can write, or on a network filesystem, is refused with what to do; the
// test's own (0755, local) is locked.
TEST_F(StateFilesTest, AStateDirOthersCanWriteOrOnANetworkFilesystemIsRefused) {
  const fs::path state = dir_ / "state";
  fs::create_directories(state);
  ::chmod(state.c_str(), 0777);
  absl::StatusOr<int> open_to_all = LockStateDir(state.string());
  ASSERT_FALSE(open_to_all.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(open_to_all.status())) << open_to_all.status();
  EXPECT_NE(open_to_all.status().message().find("writable by group or others (mode 777)"),
            std::string::npos)
      << open_to_all.status();
  EXPECT_NE(open_to_all.status().message().find("chmod 700"), std::string::npos);
  EXPECT_FALSE(fs::exists(state / kCoordinatorLockFile));

  ::chmod(state.c_str(), 0755);
  absl::StatusOr<int> locked = LockStateDir(state.string());
  ASSERT_TRUE(locked.ok()) << locked.status();
  ::close(*locked);

  EXPECT_EQ(NetworkFilesystemName(0x6969), "NFS");
  EXPECT_EQ(NetworkFilesystemName(0x0BD00BD0), "Lustre");
  EXPECT_EQ(NetworkFilesystemName(0x47504653), "GPFS");
  EXPECT_EQ(NetworkFilesystemName(static_cast<int64_t>(0xFF534D42u)), "CIFS");
  EXPECT_EQ(NetworkFilesystemName(0xEF53), "");  // ext4
  EXPECT_EQ(NetworkFilesystemName(0x01021994), "");  // tmpfs
}

}  // namespace
}  // namespace ablate
