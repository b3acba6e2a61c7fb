// A real coordinator on loopback (CoordinatorFixture) driven through the `ablate` client commands
// in-process (RunAblateCli): the CLI tests' shared setup.
#ifndef ABLATE_TESTS_ORCHESTRATOR_CLI_COORDINATOR_CLI_FIXTURE_H_
#define ABLATE_TESTS_ORCHESTRATOR_CLI_COORDINATOR_CLI_FIXTURE_H_

#include <fstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/orchestrator/coordinator/coordinator_test_util.h"

namespace ablate {

class CoordinatorCliFixture : public CoordinatorFixture {
 protected:
  using CliResult = testing::CliResult;

  // `ablate ARGS` with this coordinator's address and token: its exit code and output.
  CliResult Cli(std::vector<std::string> args) {
    args.insert(args.end(),
                {"--coordinator", server_->address(), "--token-file", state_dir_ + "/token"});
    return testing::RunCli(args);
  }
  // Writes QuickSpec(name) to ROOT/NAME.yaml, a file of its own; returns its path.
  std::string SpecFile(const std::string& name) {
    const std::string path = root_ + "/" + name + ".yaml";
    std::ofstream(path) << QuickSpec(name);
    return path;
  }
};

}  // namespace ablate

#endif  // ABLATE_TESTS_ORCHESTRATOR_CLI_COORDINATOR_CLI_FIXTURE_H_
