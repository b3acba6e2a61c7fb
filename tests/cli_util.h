// Runs `ablate ARGS...` in-process (RunAblateCli) and captures its exit code, stdout and stderr:
// the command line as a user types it, without a process per call.
#ifndef ABLATE_TESTS_CLI_UTIL_H_
#define ABLATE_TESTS_CLI_UTIL_H_

#include <sstream>
#include <string>
#include <vector>

#include "orchestrator/cli/cli.h"

namespace ablate::testing {

struct CliResult {
  int code;
  std::string out, err;
};

inline CliResult RunCli(std::vector<std::string> args) {
  args.insert(args.begin(), "ablate");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = RunAblateCli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_CLI_UTIL_H_
