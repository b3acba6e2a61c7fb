#include "orchestrator/sweep/problems.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/proto_yaml.h"

namespace ablate {

void SpecProblems::Add(int line, const std::string& path, const std::string& what) {
  AddLine(YamlProblem(file_, line, path, what));
}

void SpecProblems::AddLine(std::string line) {
  if (seen_.insert(line).second) lines_.push_back(std::move(line));
}

void SpecProblems::Absorb(const absl::Status& status) {
  if (status.ok()) return;
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    AddLine(std::string(line));
  }
}

void SpecProblems::UnknownKey(int line, const std::string& path, const std::string& key,
                              const std::vector<std::string>& known) {
  const std::string best = ClosestName(key, known);
  Add(line, path,
      best.empty()
          ? absl::StrCat("unknown key \"", key, "\"; known keys: ", absl::StrJoin(known, ", "))
          : absl::StrCat("unknown key \"", key, "\" (did you mean \"", best, "\"?)"));
}

absl::Status SpecProblems::ToStatus() const {
  if (lines_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n"));
}

}  // namespace ablate
