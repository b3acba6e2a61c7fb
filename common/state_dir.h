// The files of a coordinator's state dir (`.ablate` by default; docs/operations.md), as every side
// reads them: the coordinator (the lock, the token it creates), the CLI (the address and token it
// dials with), `ablate dashboard`, and workers given `--token-file`. No gRPC, no LibTorch.
#ifndef ABLATE_COMMON_STATE_DIR_H_
#define ABLATE_COMMON_STATE_DIR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/durable_file.h"  // WriteFileAtomically, for the state dir's files

namespace ablate {

// The state dir's lock file.
inline constexpr char kCoordinatorLockFile[] = "coordinator.lock";

// Takes the exclusive lock of a state dir (created mode 0700 when missing) and writes this
// process's pid into it: the descriptor to keep open (close-on-exec) for as long as the lock is
// held. FailedPrecondition naming the holder's pid when another process holds it.
// FailedPrecondition, saying why and what to do, when the state dir is owned by another user, is
// writable by group or others (anyone who can write it can replace the database or the token),
// or lies on a network filesystem (CheckLocalFilesystem).
absl::StatusOr<int> LockStateDir(const std::string& state_dir);

// The network filesystem a statfs(2) f_type names (NFS, Lustre, GPFS, CIFS/SMB), or "" for any
// other. SQLite's WAL needs a local filesystem (its shared memory does not cross machines), and
// flock on NFS mounted with nolock locks on one machine only: two coordinators could serve one
// database.
std::string NetworkFilesystemName(int64_t f_type);

// Reads <state_dir>/token, or creates it (32 random bytes as 64 hex digits, mode 0600, the
// directory created mode 0700 when missing). FailedPrecondition when an existing token file is
// readable by group or others.
absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir);

// The first line of `path` without surrounding whitespace: a token file (`--token-file`). NotFound
// or InvalidArgument naming the file when it cannot be read or is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
// The same, "" when the file cannot be read (a state dir's optional files: address, token).
std::string ReadFirstLine(const std::string& path);
// The environment variable, "" when unset.
std::string EnvOrEmpty(const char* name);

}  // namespace ablate

#endif  // ABLATE_COMMON_STATE_DIR_H_
