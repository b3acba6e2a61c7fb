#include "common/version.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "version_stamp.h"  // written by cmake/code_version.cmake into the build tree

namespace ablate {

const char* CodeVersion() { return ABLATE_PROJECT_VERSION "+src-" ABLATE_SOURCE_HASH; }

const char* BuildVersion() { return ABLATE_BUILD_VERSION; }

std::vector<std::string> UncommittedSources() {
  return absl::StrSplit(ABLATE_UNCOMMITTED_SOURCES, ' ', absl::SkipEmpty());
}

std::string UncommittedSourcesNote(const std::vector<std::string>& files) {
  if (files.empty()) return "";
  constexpr size_t kNamed = 3;
  std::vector<std::string> named(files.begin(),
                                 files.begin() + std::min(files.size(), kNamed));
  std::string which = absl::StrJoin(named, ", ");
  if (files.size() > kNamed) absl::StrAppend(&which, " and ", files.size() - kNamed, " more");
  return absl::StrCat("built from uncommitted changes to ", which,
                      ": results are keyed to this exact source, and only workers built from it "
                      "train them");
}

std::string VersionText() {
  std::string text = absl::StrCat(BuildVersion(), "\ncode ", CodeVersion(),
                                  " (what run keys hash; a worker takes only runs of its own)");
  const std::string note = UncommittedSourcesNote(UncommittedSources());
  if (!note.empty()) absl::StrAppend(&text, "\n", note);
  return text;
}

}  // namespace ablate
