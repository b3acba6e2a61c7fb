// `ablate`: the researcher's command line. Logic lives in orchestrator/cli.cc.
#include <iostream>

#include "orchestrator/binary_init.h"
#include "orchestrator/cli.h"
#include "proto/grpc_status.h"

int main(int argc, char** argv) {
  ablate::InitBinary();
  ablate::QuietGrpcLog();
  return ablate::RunAblateCli(argc, argv, std::cout, std::cerr);
}
