#include "orchestrator/coordinator/server.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "orchestrator/store/reader.h"
#include "proto/tls.h"
#include "proto/grpc_status.h"
#include "proto/ablate.grpc.pb.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxIdleServerThreads = 128;

// The role the `authorization: Bearer <credential>` metadata grants, checked against what the
// method needs: Unauthenticated without a known credential, PermissionDenied with one too weak.
absl::Status Authorize(const grpc::ServerContext* context, const CredentialChecker& credentials,
                       Role needed, const char* method) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "no bearer token (`authorization: Bearer TOKEN` metadata)");
  }
  constexpr absl::string_view kBearer = "Bearer ";
  const absl::string_view got(it->second.data(), it->second.size());
  const Role role = absl::StartsWith(got, kBearer)
                        ? credentials.RoleOf(got.substr(kBearer.size()))
                        : Role::kNone;
  if (role == Role::kNone) return absl::UnauthenticatedError("wrong bearer token");
  // Admin may do everything; otherwise the role must be the one the method needs.
  if (role == Role::kAdmin || role == needed) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      method, " needs the ", RoleName(needed), " credential; this is the ", RoleName(role),
      " one (docs/operations.md, \"Threat model\")"));
}

// Runs `fn` (returning StatusOr<Response>) after the credential check, inside GuardHandler;
// copies its value to `out`.
template <typename Response, typename Fn>
grpc::Status Serve(const char* method, Role needed, const grpc::ServerContext* context,
                   const CredentialChecker& credentials, Response* out, Fn fn) {
  if (absl::Status s = Authorize(context, credentials, needed, method); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return GuardHandler(method, [&] {
    absl::StatusOr<Response> result = fn();
    if (!result.ok()) return ToGrpcStatus(result.status());
    *out = *std::move(result);
    return grpc::Status::OK;
  });
}

class ClientService final : public ablate::Coordinator::Service {
 public:
  ClientService(CoordinatorCore* core, const Credentials& credentials)
      : core_(core), credentials_(credentials) {}

  grpc::Status Submit(grpc::ServerContext* c, const SubmitRequest* r, SubmitResponse* o) override {
    return Serve("Coordinator.Submit", Role::kAdmin, c, credentials_, o,
                 [&] { return core_->Submit(*r); });
  }
  grpc::Status ListSweeps(grpc::ServerContext* c, const ListSweepsRequest*,
                          ListSweepsResponse* o) override {
    return Serve("Coordinator.ListSweeps", Role::kRead, c, credentials_, o,
                 [&] { return core_->ListSweeps(); });
  }
  grpc::Status GetSweep(grpc::ServerContext* c, const GetSweepRequest* r,
                        GetSweepResponse* o) override {
    return Serve("Coordinator.GetSweep", Role::kRead, c, credentials_, o,
                 [&] { return core_->GetSweep(*r); });
  }
  grpc::Status Cancel(grpc::ServerContext* c, const CancelRequest* r, CancelResponse* o) override {
    return Serve("Coordinator.Cancel", Role::kAdmin, c, credentials_, o,
                 [&] { return core_->Cancel(*r); });
  }
  grpc::Status Rerun(grpc::ServerContext* c, const RerunRequest* r, RerunResponse* o) override {
    return Serve("Coordinator.Rerun", Role::kAdmin, c, credentials_, o,
                 [&] { return core_->Rerun(*r); });
  }
  grpc::Status Annotate(grpc::ServerContext* c, const AnnotateRequest* r,
                        AnnotateResponse* o) override {
    return Serve("Coordinator.Annotate", Role::kAdmin, c, credentials_, o,
                 [&] { return core_->Annotate(*r); });
  }
  grpc::Status Watch(grpc::ServerContext* c, const WatchRequest* r,
                     grpc::ServerWriter<WatchEvent>* writer) override {
    if (absl::Status s = Authorize(c, credentials_, Role::kRead, "Coordinator.Watch"); !s.ok()) {
      return ToGrpcStatus(s);
    }
    return GuardHandler("Coordinator.Watch", [&] {
      return ToGrpcStatus(core_->Watch(
          *r, [writer](const WatchEvent& e) { return writer->Write(e); },
          [c] { return c->IsCancelled(); }));
    });
  }
  grpc::Status Query(grpc::ServerContext* c, const QueryRequest* r, QueryResponse* o) override {
    return Serve("Coordinator.Query", Role::kRead, c, credentials_, o,
                 [&] { return core_->Query(*r); });
  }
  grpc::Status Table(grpc::ServerContext* c, const TableRequest* r, TableResponse* o) override {
    return Serve("Coordinator.Table", Role::kRead, c, credentials_, o,
                 [&] { return core_->Table(*r); });
  }
  grpc::Status Compare(grpc::ServerContext* c, const CompareRequest* r,
                       CompareResponse* o) override {
    return Serve("Coordinator.Compare", Role::kRead, c, credentials_, o,
                 [&] { return core_->Compare(*r); });
  }

 private:
  CoordinatorCore* const core_;
  const CredentialChecker credentials_;
};

class WorkerApi final : public WorkerService::Service {
 public:
  WorkerApi(CoordinatorCore* core, const Credentials& credentials)
      : core_(core), credentials_(credentials) {}

  grpc::Status Register(grpc::ServerContext* c, const RegisterRequest* r,
                        RegisterResponse* o) override {
    return Serve("WorkerService.Register", Role::kWorker, c, credentials_, o,
                 [&] { return core_->Register(*r); });
  }
  grpc::Status AcquireJob(grpc::ServerContext* c, const AcquireJobRequest* r,
                          AcquireJobResponse* o) override {
    // Answer (maybe without a job) a little before the client's deadline.
    const absl::Time deadline = absl::FromChrono(c->deadline()) - absl::Milliseconds(500);
    return Serve("WorkerService.AcquireJob", Role::kWorker, c, credentials_, o,
                 [&] { return core_->AcquireJob(*r, deadline); });
  }
  grpc::Status Report(grpc::ServerContext* c, const ReportRequest* r, ReportResponse* o) override {
    return Serve("WorkerService.Report", Role::kWorker, c, credentials_, o,
                 [&] { return core_->Report(*r); });
  }
  grpc::Status Finish(grpc::ServerContext* c, const FinishRequest* r, FinishResponse* o) override {
    return Serve("WorkerService.Finish", Role::kWorker, c, credentials_, o,
                 [&] { return core_->Finish(*r); });
  }
  grpc::Status Deregister(grpc::ServerContext* c, const DeregisterRequest* r,
                          DeregisterResponse* o) override {
    return Serve("WorkerService.Deregister", Role::kWorker, c, credentials_, o,
                 [&] { return core_->Deregister(*r); });
  }

 private:
  CoordinatorCore* const core_;
  const CredentialChecker credentials_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServerOptions& options) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->grace_ = options.shutdown_grace;
  // First: a second coordinator must not touch the token, the store or the address file.
  absl::StatusOr<int> lock = LockStateDir(options.state_dir);
  if (!lock.ok()) return lock.status();
  server->lock_fd_ = *lock;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls_cert_file, options.tls_key_file);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<Credentials> credentials_or =
      LoadOrCreateCredentials(options.state_dir, options.token);
  if (!credentials_or.ok()) return credentials_or.status();
  server->credentials_ = *std::move(credentials_or);
  CoordinatorOptions core_options = options.coordinator;
  core_options.lease_key = server->credentials_.admin;
  core_options.checkpoint_root = options.checkpoint_root.empty()
                                     ? (fs::path(options.state_dir) / "checkpoints").string()
                                     : options.checkpoint_root;
  std::error_code ec;
  fs::create_directories(core_options.checkpoint_root, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create checkpoint root ",
                                                    core_options.checkpoint_root, ": ",
                                                    ec.message()));
  }
  core_options.checkpoint_root = fs::absolute(core_options.checkpoint_root).string();

  StoreOptions store_options;
  store_options.path = (fs::path(options.state_dir) / "ablate.db").string();
  store_options.synchronous_full = options.synchronous_full;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(store_options);
  if (!store.ok()) return store.status();
  server->store_ = *std::move(store);
  absl::StatusOr<std::unique_ptr<CoordinatorCore>> core =
      CoordinatorCore::Create(server->store_.get(), core_options);
  if (!core.ok()) return core.status();
  server->core_ = *std::move(core);

  server->client_service_ =
      std::make_unique<ClientService>(server->core_.get(), server->credentials_);
  server->worker_service_ =
      std::make_unique<WorkerApi>(server->core_.get(), server->credentials_);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), *credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second server on a served port would start, and clients
  // would land on either at random.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Bounds on what anyone who can open a connection makes gRPC hold before a credential is
  // checked: the largest message, calls per connection, and the memory of all buffers together.
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  grpc::ResourceQuota quota("ablate-coordinator");
  quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
  quota.SetMaxThreads(options.max_server_threads);
  builder.SetResourceQuota(quota);
  // The sync server runs each call on a thread of its own and, by default, lets all but two idle
  // threads exit: with dozens of workers calling at once it created and tore down a thread per
  // call (clone, exit and munmap were a quarter of its threads' CPU in perf). Idle threads are
  // kept for reuse up to this many.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              kMaxIdleServerThreads);
  builder.RegisterService(server->client_service_.get());
  builder.RegisterService(server->worker_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port,
                     " (in use? pick another with --port)"));
  }
  server->port_ = port;
  const bool any = options.host == "0.0.0.0" || options.host == "::" || options.host == "[::]";
  server->address_ = absl::StrCat(any ? "127.0.0.1" : options.host, ":", port);
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  // Local clients trust the certificate through this copy; a plaintext server removes a stale
  // one, which would make them fail to connect.
  const fs::path ca_copy = fs::path(options.state_dir) / kTlsCaFile;
  std::error_code ec_copy;
  if (options.tls_cert_file.empty()) {
    fs::remove(ca_copy, ec_copy);
  } else {
    fs::copy_file(options.tls_cert_file, ca_copy, fs::copy_options::overwrite_existing, ec_copy);
  }
  if (ec_copy) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot update ", ca_copy.string(), ": ", ec_copy.message()));
  }
  // Whole or absent: a client that finds the file dials a complete address.
  absl::Status written = WriteFileAtomically((fs::path(options.state_dir) / "address").string(),
                                             server->address_ + "\n", 0644);
  if (!written.ok()) return written;
  return server;
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the state dir
}

void CoordinatorServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(false);
  if (core_ != nullptr) core_->Shutdown();
  // Users' queries in flight would hold their handlers for up to their time limit, past the
  // grace: interrupted now.
  if (store_ != nullptr) store_->reader().InterruptQueries();
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace_));
    server_->Wait();
  }
  core_.reset();
  if (store_ != nullptr) (void)store_->Flush();
  store_.reset();
}

}  // namespace ablate
