// `--token VALUE`, refused: a secret on a command line is visible to every user of the machine in
// `ps`. Commands take --token-file FILE or $ABLATE_TOKEN instead. Header-only: for the CLI11 mains
// (`ablate`, `ablate-worker`).
#ifndef ABLATE_COMMON_TOKEN_FLAG_H_
#define ABLATE_COMMON_TOKEN_FLAG_H_

#include <CLI/CLI.hpp>
#include <string>

#include "common/credentials.h"

namespace ablate {

// Adds a hidden --token option whose use fails the parse with kTokenOnCommandLine.
inline void RefuseTokenOnCommandLine(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
         "--token", [](const std::string&) { throw CLI::ValidationError(kTokenOnCommandLine); })
      ->group("");
}

}  // namespace ablate

#endif  // ABLATE_COMMON_TOKEN_FLAG_H_
