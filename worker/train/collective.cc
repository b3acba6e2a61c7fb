#include "worker/train/collective.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/model/torch_compat.h"

namespace ablate {

namespace {

absl::StatusOr<std::pair<std::string, uint16_t>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous \"", address, "\": expected HOST:PORT with a port in [1, 65535]"));
  }
  return std::pair{address.substr(0, colon), static_cast<uint16_t>(port)};
}

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

}  // namespace

struct Collective::Impl {
  c10::intrusive_ptr<::c10d::Store> store;
  c10::intrusive_ptr<::c10d::ProcessGroupGloo> gloo;
#ifdef USE_C10D_NCCL
  c10::intrusive_ptr<::c10d::ProcessGroupNCCL> nccl;
#endif

  template <class Fn>
  void Run(Fn&& fn) {
#ifdef USE_C10D_NCCL
    if (nccl) {
      fn(*nccl)->wait();
      return;
    }
#endif
    fn(*gloo)->wait();
  }
};

Collective::Collective(std::unique_ptr<Impl> impl, int rank, int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}

Collective::~Collective() = default;

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(const CollectiveOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is outside a world of ", o.world_size));
  }
  absl::StatusOr<std::pair<std::string, uint16_t>> address = SplitAddress(o.rendezvous);
  if (!address.ok()) return address.status();
  auto impl = std::make_unique<Impl>();
  try {
    ::c10d::TCPStoreOptions store_options;
    store_options.port = address->second;
    store_options.isServer = false;
    store_options.numWorkers = o.world_size;
    store_options.timeout = o.timeout;
    impl->store = c10::make_intrusive<::c10d::TCPStore>(address->first, store_options);
    // ABLATE_DIST_BACKEND=gloo keeps CUDA ranks on Gloo in a build with NCCL (to compare the
    // two, or for ranks that share one GPU, which NCCL refuses).
    const char* backend = std::getenv("ABLATE_DIST_BACKEND");
    const bool cuda = o.device.rfind("cuda", 0) == 0 &&
                      !(backend != nullptr && std::string(backend) == "gloo");
#ifdef USE_C10D_NCCL
    if (cuda) {
      auto options = ::c10d::ProcessGroupNCCL::Options::create();
      options->timeout = o.timeout;
      impl->nccl = c10::make_intrusive<::c10d::ProcessGroupNCCL>(impl->store, o.rank,
                                                                 o.world_size, options);
    }
    if (!impl->nccl) {
#else
    (void)cuda;
    {
#endif
      auto options = ::c10d::ProcessGroupGloo::Options::create();
      options->timeout = o.timeout;
      // Loopback rendezvous: every rank on this machine. Otherwise the address this machine's
      // hostname resolves to (c10d's default device), which peers on other nodes can reach.
      options->devices.push_back(
          IsLoopback(address->first)
              ? ::c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
              : ::c10d::ProcessGroupGloo::createDefaultDevice());
      impl->gloo = c10::make_intrusive<::c10d::ProcessGroupGloo>(impl->store, o.rank,
                                                                 o.world_size, options);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", o.rank, " of ", o.world_size,
                                               ": cannot join the rendezvous at ", o.rendezvous,
                                               ": ", e.what()));
  }
  // Which backend this run's collectives go through, said once per process (docs/gpu.md).
  bool nccl = false;
#ifdef USE_C10D_NCCL
  nccl = impl->nccl != nullptr;
#endif
  if (o.rank == 0) {
    static const char kKey = 0;
    compat::LogOnce(&kKey, absl::StrCat("data parallel: ", o.world_size, " ranks on ", o.device,
                                        " through ", nccl ? "NCCL" : "Gloo",
                                        nccl || o.device.rfind("cuda", 0) != 0
                                            ? ""
                                            : " (this build has no NCCL: tensors staged through "
                                              "the host)"));
  }
  return std::unique_ptr<Collective>(new Collective(std::move(impl), o.rank, o.world_size));
}

void Collective::AllReduceSum(at::Tensor& tensor) {
  std::vector<at::Tensor> list{tensor};
  impl_->Run([&](auto& pg) { return pg.allreduce(list, ::c10d::AllreduceOptions{}); });
}

void Collective::AllReduceMax(at::Tensor& tensor) {
  std::vector<at::Tensor> list{tensor};
  ::c10d::AllreduceOptions options;
  options.reduceOp = ::c10d::ReduceOp::MAX;
  impl_->Run([&](auto& pg) { return pg.allreduce(list, options); });
}

void Collective::Broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> list{tensor};
  ::c10d::BroadcastOptions options;
  options.rootRank = root;
  impl_->Run([&](auto& pg) { return pg.broadcast(list, options); });
}

void Collective::AverageGradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& g : grads) flat.push_back(g.reshape({-1}));
  at::Tensor buffer = torch::cat(flat);
  AllReduceSum(buffer);
  buffer.div_(world_size_);
  int64_t at = 0;
  for (const at::Tensor& g : grads) {
    const int64_t n = g.numel();
    g.copy_(buffer.slice(0, at, at + n).view_as(g));
    at += n;
  }
}

void Collective::BroadcastParameters(const std::vector<at::Tensor>& params) {
  if (params.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : params) flat.push_back(p.detach().reshape({-1}));
  at::Tensor buffer = torch::cat(flat);
  Broadcast(buffer, 0);
  int64_t at = 0;
  for (const at::Tensor& p : params) {
    const int64_t n = p.numel();
    p.detach().copy_(buffer.slice(0, at, at + n).view_as(p));
    at += n;
  }
}

namespace {

// `full` cut into world_size views of `n` elements each.
std::vector<at::Tensor> Parts(at::Tensor& full, int world_size) {
  const int64_t n = full.numel() / world_size;
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world_size; ++r) parts.push_back(full.slice(0, r * n, (r + 1) * n));
  return parts;
}

}  // namespace

void Collective::ReduceScatterSum(at::Tensor& full, at::Tensor& shard) {
  TORCH_CHECK(full.numel() == shard.numel() * world_size_, "ReduceScatterSum: ", full.numel(),
              " elements for shards of ", shard.numel(), " on ", world_size_, " ranks");
#ifdef USE_C10D_NCCL
  if (impl_->nccl) {
    std::vector<at::Tensor> outputs{shard};
    std::vector<std::vector<at::Tensor>> inputs{Parts(full, world_size_)};
    impl_->nccl->reduce_scatter(outputs, inputs, ::c10d::ReduceScatterOptions{})->wait();
    return;
  }
#endif
  AllReduceSum(full);
  shard.copy_(full.slice(0, rank_ * shard.numel(), (rank_ + 1) * shard.numel()));
}

void Collective::AllGather(const at::Tensor& shard, at::Tensor& full) {
  TORCH_CHECK(full.numel() == shard.numel() * world_size_, "AllGather: ", full.numel(),
              " elements for shards of ", shard.numel(), " on ", world_size_, " ranks");
  std::vector<at::Tensor> inputs{shard};
  std::vector<std::vector<at::Tensor>> outputs{Parts(full, world_size_)};
  impl_->Run([&](auto& pg) { return pg.allgather(outputs, inputs, ::c10d::AllgatherOptions{}); });
}

void Collective::Gather(const at::Tensor& shard, at::Tensor& full, int root) {
  std::vector<at::Tensor> inputs{shard};
  std::vector<std::vector<at::Tensor>> outputs;
  if (rank_ == root) {
    TORCH_CHECK(full.numel() == shard.numel() * world_size_, "Gather: ", full.numel(),
                " elements for shards of ", shard.numel(), " on ", world_size_, " ranks");
    outputs.push_back(Parts(full, world_size_));
  }
  ::c10d::GatherOptions options;
  options.rootRank = root;
  impl_->Run([&](auto& pg) { return pg.gather(outputs, inputs, options); });
}

// ---------------------------------------------------------------------------------------------

struct RendezvousServer::Impl {
  c10::intrusive_ptr<::c10d::TCPStore> store;
};

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)),
      address_(absl::StrCat(impl_->store->getHost(), ":", impl_->store->getPort())) {}
RendezvousServer::~RendezvousServer() = default;

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(const std::string& host,
                                                                          int world_size, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous port ", port, " is not in [0, 65535]"));
  }
  auto impl = std::make_unique<Impl>();
  try {
    ::c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);  // 0: the system chooses (no race for a port)
    options.isServer = true;
    options.numWorkers = world_size;
    options.waitWorkers = false;  // the ranks connect after they are started
    impl->store = c10::make_intrusive<::c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot start a rendezvous server on ", host,
                                               port > 0 ? absl::StrCat(" port ", port) : "", ": ",
                                               e.what()));
  }
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::StartAt(
    const std::string& address, int world_size) {
  absl::StatusOr<std::pair<std::string, uint16_t>> split = SplitAddress(address);
  if (!split.ok()) return split.status();
  return Start(split->first, world_size, split->second);
}

std::string RendezvousServer::address() const { return address_; }

void RendezvousServer::Stop() { impl_->store.reset(); }

}  // namespace ablate
