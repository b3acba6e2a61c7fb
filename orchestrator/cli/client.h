// The CLI's connection to a coordinator: where it is, the token, and stubs whose every call
// carries the token and a deadline.
//
// Address and token, first found wins:
//   1. --coordinator HOST:PORT / --token-file FILE (a token itself never goes on a command line)
//   2. $ABLATE_COORDINATOR / $ABLATE_TOKEN
//   3. <state dir>/address and <state dir>/token (written by `ablate serve`; default ./.ablate)
//   4. address 127.0.0.1:50051 (no token: the coordinator will refuse the call)
// TLS (proto/tls.h): --tls-ca FILE, else $ABLATE_TLS_CA, else <state dir>/tls-ca.pem,
// else plaintext.
// gRPC errors become absl::Status with the same code and a message naming the coordinator
// ("cannot reach the coordinator at 127.0.0.1:50051: ... (is `ablate serve` running?)").
//
// Thread safety: a CoordinatorClient may be used from several threads (gRPC stubs are).
#ifndef ABLATE_ORCHESTRATOR_CLI_CLIENT_H_
#define ABLATE_ORCHESTRATOR_CLI_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/state_dir.h"
#include "grpcpp/grpcpp.h"
#include "proto/ablate.grpc.pb.h"

namespace ablate {

struct ClientOptions {
  std::string coordinator;  // "" = resolve (above)
  std::string token;        // "" = resolve (above)
  std::string token_file;   // read when token is "" (an unreadable file: the client's ready())
  std::string state_dir = ".ablate";
  std::string tls_ca;       // "" = resolve (above)
  absl::Duration timeout = absl::Seconds(30);  // the deadline of each unary call
};

// Fills coordinator, token and tls_ca as described above. NotFound or InvalidArgument naming
// token_file when it is given and cannot be read or is empty.
absl::StatusOr<ClientOptions> ResolveClientOptions(const ClientOptions& flags);

// grpc::Status -> absl::Status (same code), the message prefixed for the CLI.
absl::Status FromGrpc(const grpc::Status& status, const std::string& address);

class CoordinatorClient {
 public:
  explicit CoordinatorClient(const ClientOptions& options);  // resolves; connects lazily

  const std::string& address() const { return options_.coordinator; }

  // A context with the token and a deadline `timeout` from now (options().timeout when zero).
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::ZeroDuration()) const;

  absl::StatusOr<SubmitResponse> Submit(const SubmitRequest& request);
  absl::StatusOr<ListSweepsResponse> ListSweeps();
  absl::StatusOr<GetSweepResponse> GetSweep(const std::string& sweep);
  absl::StatusOr<CancelResponse> Cancel(const std::string& sweep);
  absl::StatusOr<RerunResponse> Rerun(const std::string& sweep, bool failed_only);
  absl::StatusOr<AnnotateResponse> Annotate(const AnnotateRequest& request);
  absl::StatusOr<QueryResponse> Query(const QueryRequest& request);
  absl::StatusOr<TableResponse> Table(const TableRequest& request);
  absl::StatusOr<CompareResponse> Compare(const CompareRequest& request);
  // OK, or why no call can be made (an unreadable --tls-ca file): check it before using stub().
  const absl::Status& ready() const { return ready_; }
  ablate::Coordinator::Stub* stub() { return stub_.get(); }

 private:
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(
      grpc::Status (ablate::Coordinator::Stub::*method)(grpc::ClientContext*, const Request&,
                                                        Response*),
      const Request& request);

  ClientOptions options_;  // resolved; constant after construction
  absl::Status ready_;
  std::unique_ptr<ablate::Coordinator::Stub> stub_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_CLIENT_H_
