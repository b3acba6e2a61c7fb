#include "orchestrator/client.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ablate {
namespace {

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

ClientOptions ResolveClientOptions(const ClientOptions& flags) {
  ClientOptions o = flags;
  const std::filesystem::path dir(o.state_dir.empty() ? ".ablate" : o.state_dir);
  if (o.coordinator.empty()) o.coordinator = Env("ABLATE_COORDINATOR");
  if (o.coordinator.empty()) o.coordinator = FirstLine((dir / "address").string());
  if (o.coordinator.empty()) o.coordinator = "127.0.0.1:50051";
  if (o.token.empty()) o.token = Env("ABLATE_TOKEN");
  if (o.token.empty()) o.token = FirstLine((dir / "token").string());
  return o;
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& address) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::Status(code, absl::StrCat("cannot reach the coordinator at ", address, ": ",
                                             status.error_message(),
                                             " (is `ablate serve` running? --coordinator)"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::Status(code, absl::StrCat("the coordinator at ", address,
                                             " did not answer in time (--timeout)"));
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::Status(code, absl::StrCat("the coordinator at ", address, " refused the token: ",
                                             status.error_message()));
    default:
      return absl::Status(code, status.error_message());
  }
}

CoordinatorClient::CoordinatorClient(const ClientOptions& options)
    : options_(ResolveClientOptions(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  stub_ = ablate::Coordinator::NewStub(grpc::CreateCustomChannel(
      options_.coordinator, grpc::InsecureChannelCredentials(), args));
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (timeout == absl::ZeroDuration()) timeout = options_.timeout;
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  return ctx;
}

absl::StatusOr<SubmitResponse> CoordinatorClient::Submit(const SubmitRequest& request) {
  SubmitResponse response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc(stub_->Submit(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<ListSweepsResponse> CoordinatorClient::ListSweeps() {
  ListSweepsResponse response;
  auto ctx = Context();
  if (absl::Status s =
          FromGrpc(stub_->ListSweeps(ctx.get(), ListSweepsRequest(), &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<GetSweepResponse> CoordinatorClient::GetSweep(const std::string& sweep) {
  GetSweepRequest request;
  request.set_sweep(sweep);
  GetSweepResponse response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc(stub_->GetSweep(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<CancelResponse> CoordinatorClient::Cancel(const std::string& sweep) {
  CancelRequest request;
  request.set_sweep(sweep);
  CancelResponse response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc(stub_->Cancel(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<RerunResponse> CoordinatorClient::Rerun(const std::string& sweep,
                                                       bool failed_only) {
  RerunRequest request;
  request.set_sweep(sweep);
  request.set_failed_only(failed_only);
  RerunResponse response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc(stub_->Rerun(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<QueryResponse> CoordinatorClient::Query(const QueryRequest& request) {
  QueryResponse response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc(stub_->Query(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<TableResponse> CoordinatorClient::Table(const std::string& sweep,
                                                       const std::string& format) {
  TableRequest request;
  request.set_sweep(sweep);
  request.set_format(format);
  TableResponse response;
  auto ctx = Context();
  if (absl::Status s = FromGrpc(stub_->Table(ctx.get(), request, &response), address());
      !s.ok()) {
    return s;
  }
  return response;
}

}  // namespace ablate
