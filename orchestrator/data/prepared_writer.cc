#include "orchestrator/data/prepared_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"

namespace ablate {
namespace fs = std::filesystem;

namespace {

std::string ErrnoText() { return std::strerror(errno); }

absl::Status SyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", ErrnoText()));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot sync ", path, ": ", std::strerror(saved)));
  }
  return absl::OkStatus();
}

// True when `pid` names no live process on this machine (EPERM means it lives, as another user).
bool ProcessIsGone(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// "." + base + ".partial-": the prefix of every writer's partial directory for OUT.
std::string PartialPrefix(const fs::path& out) {
  return "." + out.filename().string() + ".partial-";
}

}  // namespace

// One split's file: tokens buffered, hashed as they are written, counted.
struct PreparedWriter::SplitFile {
  std::string path;  // in the partial directory
  std::string name;  // "train.bin", for the manifest and for errors
  int fd = -1;
  std::vector<unsigned char> buffer;
  Sha256Stream sha;
  int64_t documents = 0;
  int64_t tokens = 0;           // the eod tokens included: what the file holds
  int64_t open_doc_tokens = 0;  // tokens of the document not yet ended
  bool doc_open = false;

  ~SplitFile() {
    if (fd >= 0) ::close(fd);
  }

  absl::Status Flush() {
    size_t done = 0;
    while (done < buffer.size()) {
      const ssize_t n = ::write(fd, buffer.data() + done, buffer.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ErrnoText()));
      }
      done += static_cast<size_t>(n);
    }
    sha.Update(buffer.data(), buffer.size());
    buffer.clear();
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<PreparedWriter>> PreparedWriter::Open(
    const std::string& out, int64_t vocab_size, int token_bytes, int64_t eod_token, bool replace) {
  if (token_bytes != 2 && token_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("token width ", token_bytes, " bytes: only 2 (uint16) and 4 (uint32) exist"));
  }
  if (vocab_size <= 0 || TokenBytesFor(vocab_size) > token_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a vocabulary of ", vocab_size, " ids does not fit ", token_bytes, "-byte tokens"));
  }
  if (eod_token < 0 || eod_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "end-of-document token ", eod_token, " is outside the vocabulary [0, ", vocab_size, ")"));
  }
  // "DIR/" and "DIR" name the same directory; the partial sibling is built from the last name.
  fs::path out_path = fs::path(out).lexically_normal();
  if (!out_path.has_filename() && out_path.has_parent_path()) out_path = out_path.parent_path();
  const std::string base = out_path.filename().string();
  if (base.empty() || base == "." || base == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("output directory '", out, "' must name a directory to create"));
  }
  std::error_code ec;
  if (fs::exists(out_path, ec) && !replace) {
    return absl::AlreadyExistsError(
        absl::StrCat("output directory ", out, " already exists (--force replaces it)"));
  }
  fs::path parent = out_path.parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", parent.string(), ": ", ec.message()));
  }

  // A writer killed before Commit() leaves its partial directory; remove those whose process is
  // gone (a live one may be another writer of the same OUT, which its own Commit() settles).
  const std::string prefix = PartialPrefix(out_path);
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t pid = 0;
    if (!absl::StartsWith(name, prefix) || !absl::SimpleAtoi(name.substr(prefix.size()), &pid)) {
      continue;
    }
    if (pid == ::getpid() || ProcessIsGone(pid)) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }

  auto writer = std::unique_ptr<PreparedWriter>(new PreparedWriter());
  writer->out_ = out_path.string();
  writer->partial_ = (parent / (prefix + std::to_string(::getpid()))).string();
  writer->vocab_size_ = vocab_size;
  writer->token_bytes_ = token_bytes;
  writer->eod_ = eod_token;
  writer->replace_ = replace;
  if (!fs::create_directory(writer->partial_, ec) || ec) {
    const std::string why = ec ? ec.message() : "it already exists";
    writer->partial_.clear();  // not ours: the destructor must leave it
    return absl::InternalError(absl::StrCat("cannot create ", (parent / prefix).string(),
                                            std::to_string(::getpid()), ": ", why));
  }
  for (auto [slot, name] :
       {std::pair{&writer->train_, "train.bin"}, std::pair{&writer->val_, "val.bin"}}) {
    auto file = std::make_unique<SplitFile>();
    file->name = name;
    file->path = writer->partial_ + "/" + name;
    file->fd = ::open(file->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (file->fd < 0) {
      return absl::InternalError(absl::StrCat("cannot create ", file->path, ": ", ErrnoText()));
    }
    file->buffer.reserve(1 << 20);
    *slot = std::move(file);
  }
  return writer;
}

PreparedWriter::~PreparedWriter() {
  train_.reset();
  val_.reset();
  if (!committed_ && !partial_.empty()) {
    std::error_code ignored;
    fs::remove_all(partial_, ignored);
  }
}

absl::Status PreparedWriter::AppendTokens(Split split, const std::vector<int32_t>& tokens) {
  SplitFile& file = split == Split::kTrain ? *train_ : *val_;
  if (committed_) return absl::FailedPreconditionError("the prepared directory is committed");
  for (const int32_t id : tokens) {
    if (id < 0 || id >= vocab_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " of document ", file.documents, " (counted from 0) of ",
                       file.name, " is outside the vocabulary [0, ", vocab_size_, ")"));
    }
  }
  file.doc_open = true;
  for (const int32_t id : tokens) {
    const uint32_t v = static_cast<uint32_t>(id);
    // Little-endian whatever the host: the format is fixed (docs/data.md).
    file.buffer.push_back(static_cast<unsigned char>(v));
    file.buffer.push_back(static_cast<unsigned char>(v >> 8));
    if (token_bytes_ == 4) {
      file.buffer.push_back(static_cast<unsigned char>(v >> 16));
      file.buffer.push_back(static_cast<unsigned char>(v >> 24));
    }
    if (file.buffer.size() >= (1 << 20)) {
      if (absl::Status s = file.Flush(); !s.ok()) return s;
    }
  }
  file.tokens += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status PreparedWriter::EndDocument(Split split) {
  SplitFile& file = split == Split::kTrain ? *train_ : *val_;
  if (absl::Status s = AppendTokens(split, {static_cast<int32_t>(eod_)}); !s.ok()) return s;
  file.doc_open = false;
  ++file.documents;
  return absl::OkStatus();
}

absl::Status PreparedWriter::AddDocument(Split split, const std::vector<int32_t>& tokens) {
  if (absl::Status s = AppendTokens(split, tokens); !s.ok()) return s;
  return EndDocument(split);
}

absl::Status PreparedWriter::Commit(DataManifest* manifest) {
  if (committed_) return absl::FailedPreconditionError("the prepared directory is committed");
  for (SplitFile* file : {train_.get(), val_.get()}) {
    if (file->doc_open) {
      return absl::FailedPreconditionError(
          absl::StrCat("the last document of ", file->name, " was not ended"));
    }
    if (file->documents == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->name,
                       " would hold no document: a prepared directory needs at least one document "
                       "in each split"));
    }
  }
  // Checked before anything is closed: a refused Commit() leaves the writer usable.
  for (SplitFile* file : {train_.get(), val_.get()}) {
    if (absl::Status s = file->Flush(); !s.ok()) return s;
    if (::fsync(file->fd) != 0) {
      return absl::InternalError(absl::StrCat("cannot sync ", file->path, ": ", ErrnoText()));
    }
    ::close(file->fd);
    file->fd = -1;
  }
  auto split_info = [](SplitFile& file) {
    SplitInfo info;
    info.file = file.name;
    info.documents = file.documents;
    info.tokens = file.tokens;
    info.sha256 = file.sha.Hex();
    return info;
  };
  manifest->vocab_size = vocab_size_;
  manifest->token_bytes = token_bytes_;
  manifest->eod_token = eod_;
  manifest->train = split_info(*train_);
  manifest->val = split_info(*val_);
  manifest->ablate_version = BuildVersion();
  if (absl::Status s = WriteManifest(partial_, manifest); !s.ok()) return s;
  if (absl::Status s = SyncPath(partial_); !s.ok()) return s;

  // The rename is the commit: OUT appears whole or not at all. With `replace`, the old and new
  // directories are exchanged in one step, so OUT never goes missing, then the old one is removed.
  std::error_code ec;
  const bool exists = fs::exists(out_, ec);
  if (exists && !replace_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "output directory ", out_, " appeared while it was being written (--force replaces it)"));
  }
  const unsigned int flags = exists ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, partial_.c_str(), AT_FDCWD, out_.c_str(), flags) != 0) {
    if (errno != EINVAL && errno != ENOSYS) {
      return absl::InternalError(
          absl::StrCat("cannot rename ", partial_, " to ", out_, ": ", ErrnoText()));
    }
    // A filesystem without renameat2's flags: two renames, the old directory moved aside first.
    const std::string aside = partial_ + ".old";
    if (exists && ::rename(out_.c_str(), aside.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot move the old ", out_, " aside: ", ErrnoText()));
    }
    if (::rename(partial_.c_str(), out_.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot rename ", partial_, " to ", out_, ": ", ErrnoText()));
    }
    committed_ = true;
    if (exists) fs::remove_all(aside, ec);
  } else {
    committed_ = true;
    if (exists) fs::remove_all(partial_, ec);  // now the old directory
  }
  fs::path parent = fs::path(out_).parent_path();
  return SyncPath(parent.empty() ? "." : parent.string());
}

}  // namespace ablate
