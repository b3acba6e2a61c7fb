#include "common/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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
