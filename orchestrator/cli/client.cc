#include "orchestrator/cli/client.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/grpc_status.h"
#include "proto/tls.h"

namespace ablate {
absl::StatusOr<ClientOptions> ResolveClientOptions(const ClientOptions& flags) {
  ClientOptions o = flags;
  if (o.token.empty() && !o.token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(o.token_file);
    if (!read.ok()) return read.status();
    o.token = *read;
  }
  const std::filesystem::path dir(o.state_dir.empty() ? ".ablate" : o.state_dir);
  if (o.coordinator.empty()) o.coordinator = EnvOrEmpty("ABLATE_COORDINATOR");
  if (o.coordinator.empty()) o.coordinator = ReadFirstLine((dir / "address").string());
  if (o.coordinator.empty()) o.coordinator = "127.0.0.1:50051";
  if (o.token.empty()) o.token = EnvOrEmpty("ABLATE_TOKEN");
  if (o.token.empty()) o.token = ReadFirstLine((dir / "token").string());
  o.tls_ca = ResolveTlsCa(o.tls_ca, dir.string());
  return o;
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& address) {
  if (status.ok()) return absl::OkStatus();
  const absl::StatusCode code = FromGrpcStatus(status).code();
  const std::string& message = status.error_message();
  // A status of `code` whose message is `parts`, concatenated.
  auto with = [code](const auto&... parts) { return absl::Status(code, absl::StrCat(parts...)); };
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      // A TLS failure is the coordinator answering, not its absence: say which.
      if (absl::StrContains(message, "is not in peer certificate")) {
        return with("the coordinator at ", address,
                    " serves a TLS certificate that does not name the address dialled: its "
                    "subjectAltName must include it (docs/operations.md, TLS): ",
                    message);
      }
      if (absl::StrContains(message, "andshake failed")) {
        return with("TLS handshake with the coordinator at ", address,
                    " failed: is --tls-ca (or STATE_DIR/tls-ca.pem) the certificate it serves, or "
                    "the CA that signed it? ",
                    message);
      }
      return with("cannot reach the coordinator at ", address, ": ", message,
                  " (is `ablate serve` running? --coordinator)");
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return with("the coordinator at ", address, " did not answer in time (--timeout)");
    case grpc::StatusCode::UNAUTHENTICATED:
      return with("the coordinator at ", address, " refused the token: ", message,
                  " (pass --token-file, set ABLATE_TOKEN, or give the coordinator's --state-dir: "
                  "its token file is read)");
    case grpc::StatusCode::PERMISSION_DENIED:
      return with("the coordinator at ", address, " refused: ", message);
    default:
      return FromGrpcStatus(status);
  }
}

CoordinatorClient::CoordinatorClient(const ClientOptions& options) {
  absl::StatusOr<ClientOptions> resolved = ResolveClientOptions(options);
  if (!resolved.ok()) {
    ready_ = resolved.status();
    options_ = options;
    return;
  }
  options_ = *std::move(resolved);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options_.tls_ca);
  if (!credentials.ok()) {
    ready_ = credentials.status();
    return;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  stub_ = ablate::Coordinator::NewStub(
      grpc::CreateCustomChannel(options_.coordinator, *credentials, args));
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (timeout == absl::ZeroDuration()) timeout = options_.timeout;
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  return ctx;
}

template <typename Request, typename Response>
absl::StatusOr<Response> CoordinatorClient::Unary(
    grpc::Status (ablate::Coordinator::Stub::*method)(grpc::ClientContext*, const Request&,
                                                      Response*),
    const Request& request) {
  if (!ready_.ok()) return ready_;
  Response response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc((stub_.get()->*method)(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<SubmitResponse> CoordinatorClient::Submit(const SubmitRequest& request) {
  return Unary(&ablate::Coordinator::Stub::Submit, request);
}

absl::StatusOr<ListSweepsResponse> CoordinatorClient::ListSweeps() {
  return Unary(&ablate::Coordinator::Stub::ListSweeps, ListSweepsRequest());
}

absl::StatusOr<GetSweepResponse> CoordinatorClient::GetSweep(const std::string& sweep) {
  GetSweepRequest request;
  request.set_sweep(sweep);
  return Unary(&ablate::Coordinator::Stub::GetSweep, request);
}

absl::StatusOr<CancelResponse> CoordinatorClient::Cancel(const std::string& sweep) {
  CancelRequest request;
  request.set_sweep(sweep);
  return Unary(&ablate::Coordinator::Stub::Cancel, request);
}

absl::StatusOr<RerunResponse> CoordinatorClient::Rerun(const std::string& sweep, bool failed_only) {
  RerunRequest request;
  request.set_sweep(sweep);
  request.set_failed_only(failed_only);
  return Unary(&ablate::Coordinator::Stub::Rerun, request);
}

absl::StatusOr<AnnotateResponse> CoordinatorClient::Annotate(const AnnotateRequest& request) {
  return Unary(&ablate::Coordinator::Stub::Annotate, request);
}

absl::StatusOr<QueryResponse> CoordinatorClient::Query(const QueryRequest& request) {
  return Unary(&ablate::Coordinator::Stub::Query, request);
}

absl::StatusOr<TableResponse> CoordinatorClient::Table(const TableRequest& request) {
  return Unary(&ablate::Coordinator::Stub::Table, request);
}

absl::StatusOr<CompareResponse> CoordinatorClient::Compare(const CompareRequest& request) {
  return Unary(&ablate::Coordinator::Stub::Compare, request);
}

}  // namespace ablate
