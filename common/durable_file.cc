#include "common/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

std::string TempPath(const std::string& path) {
  static std::atomic<int64_t> counter{0};
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(path, ".tmp.", host[0] != '\0' ? host : "localhost", ".", ::getpid(), ".",
                      counter.fetch_add(1));
}

absl::Status Errno(int error, const std::string& what, const std::string& path) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(error)));
}

// fsync of an existing file or directory.
absl::Status Sync(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) return Errno(errno, "open", path);
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some filesystems cannot sync a directory; the rename is then as durable as they make it.
  if (synced != 0 && !(directory && (error == EINVAL || error == ENOTSUP))) {
    return Errno(error, "fsync", path);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReplaceFileDurably(const std::string& path,
                                const std::function<absl::Status(const std::string& tmp)>& write,
                                const std::string& previous) {
  const std::string tmp = TempPath(path);
  absl::Status status = write(tmp);
  if (status.ok()) status = Sync(tmp, /*directory=*/false);
  if (status.ok() && !previous.empty() && ::rename(path.c_str(), previous.c_str()) != 0 &&
      errno != ENOENT) {
    status = Errno(errno, absl::StrCat("keep ", path, " as"), previous);
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Errno(errno, absl::StrCat("rename ", tmp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  const fs::path dir = fs::path(path).parent_path();
  return Sync(dir.empty() ? "." : dir.string(), /*directory=*/true);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text, int mode) {
  absl::Status written = ReplaceFileDurably(path, [&](const std::string& tmp) {
    // A name of its own, created here: O_EXCL refuses one that exists (a planted file or
    // symbolic link, which O_NOFOLLOW also refuses), so the secret never goes elsewhere.
    const int fd =
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return ok ? absl::OkStatus() : absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
  });
  if (!written.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace ablate
