#include "common/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace ablate {

namespace fs = std::filesystem;

std::string NetworkFilesystemName(int64_t f_type) {
  switch (static_cast<uint32_t>(f_type)) {
    case 0x6969u: return "NFS";
    case 0x0BD00BD0u: return "Lustre";
    case 0x47504653u: return "GPFS";
    case 0xFF534D42u: return "CIFS";
    case 0xFE534D42u: return "SMB2";
    default: return "";
  }
}

namespace {

// What LockStateDir refuses in an existing state dir (see state_dir.h).
absl::Status CheckStateDirIsSafe(const std::string& state_dir) {
  struct stat st;
  if (::stat(state_dir.c_str(), &st) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot stat state dir ", state_dir, ": ", strerror(errno)));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state dir ", state_dir, " belongs to another user (uid ", st.st_uid,
        "): its database and token must be yours; give --state-dir a directory of your own"));
  }
  if ((st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "state dir %s is writable by group or others (mode %o), who could replace its database or "
        "token: chmod 700 %s",
        state_dir, st.st_mode & 0777, state_dir));
  }
  struct statfs fs_info;
  if (::statfs(state_dir.c_str(), &fs_info) == 0) {
    const std::string network = NetworkFilesystemName(fs_info.f_type);
    if (!network.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state dir ", state_dir, " is on ", network,
          ": SQLite's write-ahead log needs a local filesystem, and file locks there may hold on "
          "one machine only; give --state-dir a local disk (node-local scratch or /tmp on the "
          "coordinator's machine; workers need not see it)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> LockStateDir(const std::string& state_dir) {
  std::error_code ec;
  if (!fs::exists(state_dir, ec)) {
    fs::create_directories(state_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create state dir ", state_dir, ": ", ec.message()));
    }
    ::chmod(state_dir.c_str(), 0700);
  }
  if (absl::Status safe = CheckStateDirIsSafe(state_dir); !safe.ok()) return safe;
  const std::string path = (fs::path(state_dir) / kCoordinatorLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    std::string holder;
    char buffer[32] = {};
    if (::pread(fd, buffer, sizeof(buffer) - 1, 0) > 0) holder = std::string(absl::StripAsciiWhitespace(buffer));
    ::close(fd);
    if (error != EWOULDBLOCK) {
      return absl::PermissionDeniedError(absl::StrCat("cannot lock ", path, ": ", strerror(error)));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "another coordinator (pid ", holder.empty() ? "unknown" : holder, ") is serving the state dir ",
        state_dir, ": stop it first, or give this one another --state-dir"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  }
  return fd;
}

absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir) {
  std::error_code ec;
  if (!fs::exists(state_dir)) {
    fs::create_directories(state_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create state dir ", state_dir, ": ", ec.message()));
    }
    ::chmod(state_dir.c_str(), 0700);
  }
  const std::string path = (fs::path(state_dir) / "token").string();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if ((st.st_mode & 077) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is readable by others (mode %o): chmod 600 %s", path, st.st_mode & 0777, path));
    }
    std::ifstream in(path);
    std::string token;
    in >> token;
    if (token.empty()) return absl::FailedPreconditionError(path + " is empty");
    return token;
  }
  std::random_device random;
  std::string token;
  for (int i = 0; i < 8; ++i) absl::StrAppend(&token, absl::Hex(random(), absl::kZeroPad8));
  // Created with mode 0600 from the start: never readable by others, not even briefly.
  absl::Status written = WriteFileAtomically(path, token + "\n", 0600);
  if (!written.ok()) return written;
  return token;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("token file ", path, ": cannot be read"));
  std::string line;
  std::getline(in, line);
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

std::string ReadFirstLine(const std::string& path) {
  absl::StatusOr<std::string> line = ReadTokenFile(path);
  return line.ok() ? *line : "";
}

std::string EnvOrEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace ablate
