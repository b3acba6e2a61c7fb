// A program's code, content-addressed (docs/program.md, "Run keys"): the files its `code:` globs
// match, read by the CLI at submit, hashed into every run key, kept by the coordinator and
// written out by the worker, which trains from that copy and never from the live directory.
// No gRPC, no LibTorch; thread-safe.
#ifndef ABLATE_CONFIG_PROGRAM_SNAPSHOT_H_
#define ABLATE_CONFIG_PROGRAM_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

// The most bytes of code one program may have (it travels with every job), and files.
inline constexpr int64_t kMaxProgramCodeBytes = int64_t{4} << 20;
inline constexpr int kMaxProgramFiles = 2000;

// SHA-256 (64 hex digits) over the files in path order: each path, whether it is executable,
// its size and its content.
std::string SnapshotHash(const ProgramSnapshot& snapshot);

// The files below `dir` that any of `globs` matches ("*.py", "config/*.py", "**/*.py": '*' stays
// within a directory, "**/" spans any), sorted by path, with code_hash set. Hidden directories
// (.git) are not searched. InvalidArgument naming the glob that matches nothing, a path outside
// `dir`, or a total over kMaxProgramCodeBytes; NotFound when `dir` is not a directory.
absl::StatusOr<ProgramSnapshot> ReadProgramCode(const std::string& dir,
                                                const std::vector<std::string>& globs);

// InvalidArgument when a snapshot is not one ReadProgramCode could have made: a path that is
// empty, absolute, has a ".." or a NUL, twice the same path, too many files or bytes, or a
// code_hash that is not SnapshotHash of its files.
absl::Status CheckSnapshot(const ProgramSnapshot& snapshot);

// Writes the snapshot's files to root/<code_hash> (through a temporary directory renamed into
// place, so a directory of that name is complete) and returns that path; an existing one is
// reused. CheckSnapshot first.
absl::StatusOr<std::string> MaterializeSnapshot(const ProgramSnapshot& snapshot,
                                                const std::string& root);

}  // namespace ablate

#endif  // ABLATE_CONFIG_PROGRAM_SNAPSHOT_H_
