#include "orchestrator/cli/data_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"

namespace ablate {

namespace fs = std::filesystem;

absl::Status ExecDataCommand(int argc, const char* const* argv) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const std::string beside = ec ? "" : (self.parent_path() / "ablate-data").string();
  std::vector<const char*> args = {"ablate-data"};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  if (!beside.empty() && ::access(beside.c_str(), X_OK) == 0) {
    ::execv(beside.c_str(), const_cast<char* const*>(args.data()));
    return absl::InternalError(absl::StrCat("cannot run ", beside, ": ", std::strerror(errno)));
  }
  ::execvp("ablate-data", const_cast<char* const*>(args.data()));
  return absl::FailedPreconditionError(absl::StrCat(
      "ablate-data is not beside ablate (", beside.empty() ? "?" : beside,
      ") nor on PATH: build it (cmake --build build --target ablate-data) or `make install`"));
}

void AddDataCommand(CLI::App* app, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "data",
      "Prepare training data (`data prepare INPUT... --out DIR`: a tokenizer, train.bin, val.bin "
      "and a manifest) or write a synthetic task (`data synth KIND --out DIR`); see "
      "docs/data.md. Runs ablate-data.");
  cmd->prefix_command();  // everything after `data` is ablate-data's
  cmd->callback([action] {
    *action = [] {
      return absl::InternalError("ablate data runs before the command line is parsed");
    };
  });
}

}  // namespace ablate
