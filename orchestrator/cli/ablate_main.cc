// `ablate`: the researcher's command line. Logic lives in orchestrator/cli/cli.cc.
#include <iostream>

#include "common/binary_init.h"
#include "orchestrator/cli/cli.h"
#include "proto/grpc_status.h"

int main(int argc, char** argv) {
  ablate::InitBinary();
  ablate::QuietGrpcLog();
  return ablate::RunAblateCli(argc, argv, std::cout, std::cerr);
}
