// Files replaced whole or not at all, and on disk before anyone is told they are: the state dir's
// token and address (state_dir.h), a worker's checkpoints (worker/train/trainer.cc) and its journal
// of unreported points (worker/agent/reporter.cc). No gRPC, no LibTorch.
//
// Each write goes to a temporary file of its own beside the target,
// `<path>.tmp.<hostname>.<pid>.<n>`, so that two writers of the same file (two processes, or two
// workers on a shared filesystem, one of them stale) never write into the same temporary file;
// the last rename wins, whole. The temporary file is fsynced before the rename and the directory
// after it, so a crash or power loss leaves the old file or the new one, never a torn one. A
// process killed mid-write leaves its temporary file behind (never read; safe to delete).
//
// Thread-safe: concurrent calls use distinct temporary files.
#ifndef ABLATE_COMMON_DURABLE_FILE_H_
#define ABLATE_COMMON_DURABLE_FILE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace ablate {

// Replaces `path` with what `write` writes to the temporary path it is given (a file it creates:
// `write` returns non-OK when it cannot), then fsyncs that file, renames it over `path` and fsyncs
// the directory. When `previous` is not empty, the file at `path` (if any) is first renamed to
// `previous`, replacing it: the two newest versions are kept, and a crash between the two renames
// leaves `previous` only. Errors name the file; the temporary file is removed on any error.
absl::Status ReplaceFileDurably(const std::string& path,
                                const std::function<absl::Status(const std::string& tmp)>& write,
                                const std::string& previous = "");

// Writes `text` to `path` with ReplaceFileDurably, the temporary file created with `mode` (a
// reader sees the old file or the new one, never a part). PermissionDenied naming the file when it
// cannot be written.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text, int mode);

}  // namespace ablate

#endif  // ABLATE_COMMON_DURABLE_FILE_H_
