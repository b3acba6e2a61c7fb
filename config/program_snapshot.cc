#include "config/program_snapshot.h"

#include <fnmatch.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

bool GlobMatches(const std::string& glob, const std::string& path) {
  if (absl::StrContains(glob, "**")) {
    // "**/" spans any directories, none included: "**/*.py" matches "a.py" and "x/y/a.py".
    const std::string flat = absl::StrReplaceAll(glob, {{"**/", ""}});
    if (fnmatch(flat.c_str(), path.c_str(), FNM_PATHNAME) == 0) return true;
    const std::string any = absl::StrReplaceAll(glob, {{"**", "*"}});
    return fnmatch(any.c_str(), path.c_str(), 0) == 0;
  }
  return fnmatch(glob.c_str(), path.c_str(), FNM_PATHNAME) == 0;
}

absl::Status CheckPath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("program code: bad path \"", path, "\""));
  }
  for (const fs::path& part : fs::path(path)) {
    if (part == ".." || part == ".") {
      return absl::InvalidArgumentError(
          absl::StrCat("program code: path \"", path, "\" leaves its directory"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string SnapshotHash(const ProgramSnapshot& snapshot) {
  std::vector<const ProgramFile*> files;
  for (const ProgramFile& f : snapshot.files()) files.push_back(&f);
  std::sort(files.begin(), files.end(),
            [](const ProgramFile* a, const ProgramFile* b) { return a->path() < b->path(); });
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  for (const ProgramFile* f : files) {
    const std::string head = absl::StrCat(f->path().size(), ":", f->path(), ":",
                                          f->executable() ? 1 : 0, ":", f->content().size(), ":");
    SHA256_Update(&ctx, head.data(), head.size());
    SHA256_Update(&ctx, f->content().data(), f->content().size());
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256_Final(digest, &ctx);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

absl::StatusOr<ProgramSnapshot> ReadProgramCode(const std::string& dir,
                                                const std::vector<std::string>& globs) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("program.dir ", dir, " is not a directory"));
  }
  std::vector<std::string> paths;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (!name.empty() && name[0] == '.') it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    paths.push_back(fs::relative(it->path(), dir, ec).generic_string());
    if (static_cast<int>(paths.size()) > 100 * kMaxProgramFiles) break;
  }
  if (ec) return absl::InternalError(absl::StrCat("program.dir ", dir, ": ", ec.message()));
  std::sort(paths.begin(), paths.end());
  std::set<std::string> chosen;
  for (const std::string& glob : globs) {
    if (absl::Status s = CheckPath(glob); !s.ok() && !absl::StrContains(glob, "*")) return s;
    bool any = false;
    for (const std::string& p : paths) {
      if (GlobMatches(glob, p)) {
        chosen.insert(p);
        any = true;
      }
    }
    if (!any) {
      return absl::InvalidArgumentError(
          absl::StrCat("program.code: \"", glob, "\" matches no file in ", dir));
    }
  }
  if (static_cast<int>(chosen.size()) > kMaxProgramFiles) {
    return absl::InvalidArgumentError(absl::StrCat("program.code matches ", chosen.size(),
                                                   " files in ", dir, "; at most ",
                                                   kMaxProgramFiles, ": narrow its globs"));
  }
  ProgramSnapshot snapshot;
  int64_t total = 0;
  for (const std::string& p : chosen) {
    const fs::path full = fs::path(dir) / p;
    std::ifstream in(full, std::ios::binary);
    std::ostringstream content;
    content << in.rdbuf();
    if (!in.good() && !in.eof()) {
      return absl::InternalError(absl::StrCat("program.code: cannot read ", full.string()));
    }
    ProgramFile* f = snapshot.add_files();
    f->set_path(p);
    f->set_content(content.str());
    f->set_executable(access(full.c_str(), X_OK) == 0);
    total += static_cast<int64_t>(f->content().size());
    if (total > kMaxProgramCodeBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program.code matches more than ", kMaxProgramCodeBytes >> 20, " MiB in ", dir, " (at ",
          p, "): code travels with every job; keep data and checkpoints out of code:"));
    }
  }
  snapshot.set_code_hash(SnapshotHash(snapshot));
  return snapshot;
}

absl::Status CheckSnapshot(const ProgramSnapshot& snapshot) {
  if (snapshot.files_size() > kMaxProgramFiles) {
    return absl::InvalidArgumentError(absl::StrCat("program code: ", snapshot.files_size(),
                                                   " files; at most ", kMaxProgramFiles));
  }
  std::set<std::string> seen;
  int64_t total = 0;
  for (const ProgramFile& f : snapshot.files()) {
    if (absl::Status s = CheckPath(f.path()); !s.ok()) return s;
    if (!seen.insert(f.path()).second) {
      return absl::InvalidArgumentError(absl::StrCat("program code: ", f.path(), " twice"));
    }
    total += static_cast<int64_t>(f.content().size());
  }
  if (total > kMaxProgramCodeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("program code: ", total, " bytes; at most ", kMaxProgramCodeBytes));
  }
  if (snapshot.code_hash() != SnapshotHash(snapshot)) {
    return absl::InvalidArgumentError(
        "program code: code_hash is not the hash of its files (a client bug or a tampered "
        "request)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MaterializeSnapshot(const ProgramSnapshot& snapshot,
                                                const std::string& root) {
  if (absl::Status s = CheckSnapshot(snapshot); !s.ok()) return s;
  const fs::path final_dir = fs::path(root) / snapshot.code_hash();
  std::error_code ec;
  if (fs::is_directory(final_dir, ec)) return final_dir.string();
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("program code: ", root, ": ", ec.message()));
  const fs::path tmp = fs::path(root) / absl::StrCat(".tmp-", snapshot.code_hash().substr(0, 16),
                                                     "-", getpid(), "-", gettid());
  fs::remove_all(tmp, ec);
  for (const ProgramFile& f : snapshot.files()) {
    const fs::path path = tmp / f.path();
    fs::create_directories(path.parent_path(), ec);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(f.content().data(), static_cast<std::streamsize>(f.content().size()));
    out.close();
    if (!out) {
      fs::remove_all(tmp, ec);
      return absl::InternalError(absl::StrCat("program code: cannot write ", path.string()));
    }
    if (f.executable()) chmod(path.c_str(), 0755);
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    // Another job of the same code got there first: theirs is complete too.
    if (fs::is_directory(final_dir)) return final_dir.string();
    return absl::InternalError(absl::StrCat("program code: cannot create ", final_dir.string()));
  }
  return final_dir.string();
}

}  // namespace ablate
