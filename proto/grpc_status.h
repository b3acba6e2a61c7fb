// absl::Status <-> grpc::Status, the guard every gRPC handler runs inside, and gRPC's own log.
//
// The two status types share their codes (both follow google.rpc.Code), so conversions keep the
// code and the message. A handler's body runs inside GuardHandler: an exception that escapes it
// (a bug: the code reports errors as statuses) becomes INTERNAL naming the method, instead of
// gRPC's "Unexpected error in RPC handling" or a dead process.
#ifndef ABLATE_PROTO_GRPC_STATUS_H_
#define ABLATE_PROTO_GRPC_STATUS_H_

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ablate {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// INTERNAL: "METHOD: internal error: WHAT (a bug in ablate)".
grpc::Status InternalErrorStatus(const char* method, const char* what);

// Runs `body` (returning grpc::Status); an exception escaping it becomes InternalErrorStatus.
template <typename Body>
grpc::Status GuardHandler(const char* method, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return InternalErrorStatus(method, e.what());
  } catch (...) {
    return InternalErrorStatus(method, "unknown exception");
  }
}

// gRPC logs some failures itself (a port in use, a failed TLS handshake) in lines that repeat what
// ablate reports as an error and read like a crash on a user's terminal. A binary's main() calls
// this to drop them, unless GRPC_VERBOSITY is set (GRPC_VERBOSITY=ERROR or DEBUG shows them).
void QuietGrpcLog();

}  // namespace ablate

#endif  // ABLATE_PROTO_GRPC_STATUS_H_
