// `ablate data prepare|synth ...` (docs/data.md): runs the `ablate-data` binary beside this one
// with the same arguments. The tokenizer work lives there because SentencePiece's library
// embeds a protobuf of its own whose symbols clash with the libprotobuf that gRPC links: this
// process never loads it, it replaces itself with ablate-data (exec) before anything else starts.
#ifndef ABLATE_ORCHESTRATOR_CLI_DATA_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_DATA_COMMAND_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// When argv is `ablate data ...`: execs ablate-data (beside /proc/self/exe, else on PATH) with
// argv[2..]; returns only when it cannot, with the error naming where it looked.
absl::Status ExecDataCommand(int argc, const char* const* argv);

// Registers `data` on `app`, for --help (ExecDataCommand runs it before parsing).
void AddDataCommand(CLI::App* app, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_DATA_COMMAND_H_
