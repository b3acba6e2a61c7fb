// The collectives of a data-parallel run, on PyTorch's own distributed engine (c10d): a TCPStore
// for the rendezvous, ProcessGroupGloo on the CPU (NCCL on CUDA when this LibTorch has it). The
// trainer uses it to average gradients and to agree on every decision that ends or pauses a run,
// so the ranks of one run take the same steps and stop at the same one.
//
// A rank that dies or hangs makes the others' next collective fail after `timeout` (c10d's
// timeout) with an error naming the collective; nothing waits forever. Not thread-safe: one
// trainer thread per rank.
#ifndef ABLATE_WORKER_TRAIN_COLLECTIVE_H_
#define ABLATE_WORKER_TRAIN_COLLECTIVE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace at {
class Tensor;
}  // namespace at

namespace ablate {

struct CollectiveOptions {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous;  // HOST:PORT of the run's TCPStore (RendezvousServer)
  std::string device = "cpu";  // the run's train.device: NCCL for CUDA where available
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class Collective {
 public:
  // Connects to the store and forms the process group (every rank must call it). Errors name
  // the rendezvous address and what failed.
  static absl::StatusOr<std::unique_ptr<Collective>> Connect(const CollectiveOptions& options);
  ~Collective();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // In place, on every rank: the element-wise sum over ranks. Throws c10::Error on a timeout or a
  // lost peer (the trainer turns it into a failed attempt).
  void AllReduceSum(at::Tensor& tensor);
  // In place: the element-wise maximum over ranks.
  void AllReduceMax(at::Tensor& tensor);
  // In place: rank `root`'s values on every rank.
  void Broadcast(at::Tensor& tensor, int root = 0);
  // Every gradient of `params` (those defined) replaced by its mean over ranks, in one
  // collective over a flattened copy.
  void AverageGradients(const std::vector<at::Tensor>& params);
  // Every parameter replaced by rank 0's (one collective over a flattened copy).
  void BroadcastParameters(const std::vector<at::Tensor>& params);

  // ZeRO's collectives (worker/train/optimizer.h), over 1-d tensors whose `full` length is
  // world_size x the shard's:
  // *shard = this rank's part [rank n, (rank + 1) n) of the element-wise sum of every rank's
  // `full`. NCCL reduce-scatters; Gloo (no reduce_scatter in LibTorch 1.13) all-reduces `full`
  // in place and keeps the part.
  void ReduceScatterSum(at::Tensor& full, at::Tensor& shard);
  // *full = every rank's `shard`, in rank order, on every rank.
  void AllGather(const at::Tensor& shard, at::Tensor& full);
  // The same on rank `root` only; `full` is not touched elsewhere.
  void Gather(const at::Tensor& shard, at::Tensor& full, int root = 0);

 private:
  struct Impl;
  explicit Collective(std::unique_ptr<Impl> impl, int rank, int world_size);
  std::unique_ptr<Impl> impl_;
  int rank_, world_size_;
};

// The TCPStore server of one run's rendezvous, for a launcher that starts the ranks itself
// (`ablate-worker train --world-size N`), or rank 0's worker of a gang-scheduled run. Listens at
// `port` (0: a port the system chooses); `host` is where this machine's ranks reach it.
class RendezvousServer {
 public:
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const std::string& host,
                                                                  int world_size, int port = 0);
  ~RendezvousServer();
  // At `address` (HOST:PORT, the rendezvous a coordinator chose for a gang): an error naming it
  // when it is malformed or the port is taken.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> StartAt(const std::string& address,
                                                                    int world_size);
  std::string address() const;  // HOST:PORT to hand every rank
  // Stops serving: a rank still waiting at the rendezvous (or on the store) fails now. For a
  // launcher whose other rank is gone. address() stays valid.
  void Stop();

 private:
  struct Impl;
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_COLLECTIVE_H_
