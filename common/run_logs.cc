#include "common/run_logs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace ablate {

namespace fs = std::filesystem;

std::string CheckpointRootOf(const std::string& state_dir, const std::string& checkpoint_root) {
  return checkpoint_root.empty() ? (fs::path(state_dir) / "checkpoints").string() : checkpoint_root;
}

namespace {

constexpr int64_t kChunkBytes = 64 << 10;

// N of a file named "attempt-N.log" (N > 0, written as the worker writes it: no leading zero),
// or 0.
int AttemptOfLogName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "attempt-") || !absl::ConsumeSuffix(&name, ".log") ||
      name.empty() || name.size() > 9 || name[0] == '0') {
    return 0;
  }
  for (char c : name) {
    if (!absl::ascii_isdigit(c)) return 0;
  }
  int n = 0;
  return absl::SimpleAtoi(name, &n) ? n : 0;
}

// Whether `path` is a regular file itself (not a symbolic link to one).
bool IsRegularFile(const fs::path& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() == fs::file_type::regular;
}

// One part of a log, open for reading: a regular file, opened without following a symbolic link
// and without blocking (a FIFO put in its place between the check and the open is refused, not
// waited on). Absent (fd -1, size 0) when it is not such a file.
class LogPart {
 public:
  explicit LogPart(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd_ >= 0 && (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))) {
      ::close(fd_);
      fd_ = -1;
    }
    size_ = fd_ >= 0 ? static_cast<int64_t>(st.st_size) : 0;
  }
  ~LogPart() {
    if (fd_ >= 0) ::close(fd_);
  }
  LogPart(const LogPart&) = delete;
  LogPart& operator=(const LogPart&) = delete;

  int64_t size() const { return size_; }  // as it was when opened: a growing log is read so far

  // Bytes [offset, offset + n) into *out (replacing it); fewer when the file shrank meanwhile.
  absl::Status Read(int64_t offset, int64_t n, std::string* out) const {
    out->resize(static_cast<size_t>(n));
    int64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd_, out->data() + got, static_cast<size_t>(n - got), offset + got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        return absl::InternalError(
            absl::StrCat("logs: cannot read ", path_.string(), ": ", std::strerror(errno)));
      }
      if (r == 0) break;
      got += r;
    }
    out->resize(static_cast<size_t>(got));
    return absl::OkStatus();
  }

 private:
  const fs::path path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Every line of `part`, oldest first, appended to *lines: its bytes split at each '\n', the
// empty piece after a final '\n' not a line (as std::getline reads them).
absl::Status ReadForwards(const LogPart& part, std::vector<std::string>* lines) {
  std::string chunk, partial;
  for (int64_t offset = 0; offset < part.size(); offset += kChunkBytes) {
    if (absl::Status s = part.Read(offset, std::min(kChunkBytes, part.size() - offset), &chunk);
        !s.ok()) {
      return s;
    }
    if (chunk.empty()) break;  // it shrank
    size_t from = 0;
    for (size_t nl; (nl = chunk.find('\n', from)) != std::string::npos; from = nl + 1) {
      partial.append(chunk, from, nl - from);
      lines->push_back(std::move(partial));
      partial.clear();
    }
    partial.append(chunk, from, std::string::npos);
  }
  if (!partial.empty()) lines->push_back(std::move(partial));
  return absl::OkStatus();
}

// The newest lines of a log, taken newest first, up to `tail` lines and `max_bytes` bytes
// (RunLogOptions).
class Tail {
 public:
  Tail(int64_t tail, int64_t max_bytes) : tail_(tail), max_bytes_(max_bytes) {}

  // Whether no further line can be taken.
  bool Full() const {
    return (tail_ > 0 && count_ >= tail_) || (max_bytes_ > 0 && bytes_ >= max_bytes_);
  }
  // The bytes a line may still have; -1: any number.
  int64_t Room() const { return max_bytes_ > 0 ? max_bytes_ - bytes_ : -1; }
  // Takes `line`, older than those taken. False when it was not taken whole (the tail is full, or
  // it is longer than the room left: the newest line then keeps its end).
  bool Offer(absl::string_view line) {
    if (Full()) return false;
    const int64_t room = Room();
    if (room >= 0 && static_cast<int64_t>(line.size()) > room) {
      if (count_ == 0) Take(line.substr(line.size() - static_cast<size_t>(room)));
      return false;
    }
    Take(line);
    return true;
  }
  std::vector<std::string> Lines() { return {lines_.begin(), lines_.end()}; }

 private:
  void Take(absl::string_view line) {
    lines_.emplace_front(line);
    ++count_;
    bytes_ += static_cast<int64_t>(line.size());
  }

  const int64_t tail_, max_bytes_;
  int64_t count_ = 0, bytes_ = 0;
  std::deque<std::string> lines_;
};

// Offers the lines of `part` to `tail` newest first, reading from its end in chunks (only what
// the lines taken need, and at most Room() more of one longer line). *whole: every line was
// taken; otherwise earlier output is left (the tail is full, or a line did not fit).
absl::Status ReadBackwards(const LogPart& part, Tail* tail, bool* whole) {
  *whole = true;
  if (part.size() == 0) return absl::OkStatus();
  // window: bytes [start, start + window.size()) of the file, ending where the current line (the
  // newest not yet offered) ends; the last line ends before a final '\n'.
  std::string window, chunk;
  if (absl::Status s = part.Read(part.size() - 1, 1, &window); !s.ok()) return s;
  int64_t start = part.size();
  if (window == "\n") {
    window.clear();
    start = part.size() - 1;
  } else if (!window.empty()) {
    start = part.size() - 1;
  }
  while (true) {
    const size_t nl = window.rfind('\n');
    if (nl != std::string::npos) {
      // A line, and a '\n' before it: another line (maybe empty) comes before.
      if (!tail->Offer(absl::string_view(window).substr(nl + 1)) || tail->Full()) {
        *whole = false;
        return absl::OkStatus();
      }
      window.resize(nl);
      continue;
    }
    // The current line starts at or before `start`.
    const int64_t room = tail->Room();
    if (room >= 0 && static_cast<int64_t>(window.size()) > room) {
      tail->Offer(window);  // its end when it is the newest line
      *whole = false;
      return absl::OkStatus();
    }
    if (start == 0) {  // the file's first line
      *whole = tail->Offer(window);
      return absl::OkStatus();
    }
    // Chunks as long as what is held: reading a long line back costs linear time, not quadratic.
    const int64_t n = std::min<int64_t>(start, std::max<int64_t>(kChunkBytes, window.size()));
    if (absl::Status s = part.Read(start - n, n, &chunk); !s.ok()) return s;
    if (static_cast<int64_t>(chunk.size()) < n) {  // it shrank under us: what was read is all
      start = 0;
      continue;
    }
    start -= n;
    window.insert(0, chunk);
  }
}

}  // namespace

absl::StatusOr<RunLog> ReadRunLog(const std::string& checkpoint_root, int64_t run_id,
                                  const RunLogOptions& options) {
  const fs::path dir = fs::path(checkpoint_root) / absl::StrCat("run-", run_id) / "logs";
  RunLog log;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const int n = AttemptOfLogName(it->path().filename().string());
    if (n > 0 && IsRegularFile(it->path())) log.attempts.push_back(n);
  }
  std::sort(log.attempts.begin(), log.attempts.end());
  log.attempt =
      options.attempt > 0 ? options.attempt : (log.attempts.empty() ? 0 : log.attempts.back());
  const fs::path path = dir / absl::StrCat("attempt-", log.attempt, ".log");
  if (log.attempt == 0 ||
      !std::binary_search(log.attempts.begin(), log.attempts.end(), log.attempt)) {
    return absl::NotFoundError(absl::StrCat(
        "logs: no output of run ", run_id,
        options.attempt > 0 ? absl::StrCat(" attempt ", options.attempt) : "", " in ", dir.string(),
        " (only program runs keep their output; a worker on another machine keeps it there "
        "unless the checkpoint root is shared: --checkpoint-root)"));
  }
  log.path = path.string();
  // Both parts are opened before either is read: a rotation meanwhile (the log renamed to .1,
  // a new one begun) leaves what was opened readable and in order.
  const LogPart older(fs::path(log.path + ".1"));
  const LogPart newer(path);
  if (options.tail <= 0 && options.max_bytes <= 0) {
    for (const LogPart* part : {&older, &newer}) {
      if (absl::Status s = ReadForwards(*part, &log.lines); !s.ok()) return s;
    }
    return log;
  }
  Tail tail(options.tail, options.max_bytes);
  bool whole = true;
  if (absl::Status s = ReadBackwards(newer, &tail, &whole); !s.ok()) return s;
  if (whole && !tail.Full()) {
    if (absl::Status s = ReadBackwards(older, &tail, &whole); !s.ok()) return s;
  } else if (whole) {
    whole = older.size() == 0;  // full at the log's first line: the older half is left
  }
  log.lines = tail.Lines();
  log.truncated = !whole;
  return log;
}

}  // namespace ablate
