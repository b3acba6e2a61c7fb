// `ablate-data`: the data commands that need SentencePiece, in a process of their own (see
// CMakeLists.txt: its embedded protobuf must never meet gRPC's). `ablate data ARGS...` execs it
// as `ablate-data ARGS...`. Logic lives in prepare.cc and synth.cc.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "common/binary_init.h"
#include "common/version.h"
#include "orchestrator/data/prepare.h"
#include "orchestrator/data/synth.h"

int main(int argc, char** argv) {
  ablate::InitBinary();
  CLI::App app{"ablate data: prepare a corpus for training, or write a synthetic task",
               "ablate data"};
  app.set_version_flag("--version", ablate::VersionText());
  app.require_subcommand(1);
  ablate::AddPrepareCommand(&app);
  ablate::AddSynthCommand(&app);
  try {
    app.parse(argc, argv);  // the subcommands' callbacks run here and exit 1 on failure
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command that failed (its message is on stderr): 1
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad command line exits 2, as `ablate` does (cli.h).
    return app.exit(e) == 0 ? 0 : 2;
  }
  return 0;
}
