#include "proto/grpc_status.h"

#include <grpc/support/log.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ablate {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status InternalErrorStatus(const char* method, const char* what) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat(method, ": internal error: ", what,
                                   " (a bug in ablate)"));
}

void QuietGrpcLog() {
  if (std::getenv("GRPC_VERBOSITY") != nullptr) return;
  gpr_set_log_function([](gpr_log_func_args*) {});
}

}  // namespace ablate
