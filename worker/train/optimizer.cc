#include "worker/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "worker/train/collective.h"

namespace ablate {

namespace {

torch::optim::AdamWOptions AdamWOptionsOf(const OptimizerConfig& o, double weight_decay) {
  return torch::optim::AdamWOptions(o.lr())
      .betas({o.beta1(), o.beta2()})
      .eps(o.eps())
      .weight_decay(weight_decay);
}

// LibTorch's AdamW on every rank; the gradients all-reduced and clipped as one process would.
class ReplicatedAdamW final : public TrainingOptimizer {
 public:
  ReplicatedAdamW(const std::vector<torch::Tensor>& params, const std::vector<bool>& decays,
                  const OptimizerConfig& o, Collective* dist)
      : params_(params), dist_(dist) {
    // Weight decay on matrices only; never on norm weights or input-independent gate thetas.
    std::vector<torch::Tensor> decay, no_decay;
    for (size_t i = 0; i < params.size(); ++i) (decays[i] ? decay : no_decay).push_back(params[i]);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                   AdamWOptionsOf(o, o.weight_decay())));
    groups.emplace_back(no_decay,
                        std::make_unique<torch::optim::AdamWOptions>(AdamWOptionsOf(o, 0.0)));
    adamw_ = std::make_unique<torch::optim::AdamW>(std::move(groups));
  }

  void ZeroGrad() override { adamw_->zero_grad(); }

  void SetLearningRate(double lr) override {
    for (auto& group : adamw_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
  }

  double ReduceAndClip(double max_norm) override {
    if (dist_ != nullptr) dist_->AverageGradients(params_);  // the mean over ranks
    return torch::nn::utils::clip_grad_norm_(params_, max_norm);
  }

  void Step() override { adamw_->step(); }

  absl::Status Save(torch::serialize::OutputArchive* archive, const std::string&,
                    int64_t) override {
    if (archive == nullptr) return absl::OkStatus();
    torch::serialize::OutputArchive state;
    adamw_->save(state);
    archive->write("optimizer", state);
    return absl::OkStatus();
  }

  void Load(torch::serialize::InputArchive& archive, const std::string&, int64_t) override {
    torch::serialize::InputArchive state;
    archive.read("optimizer", state);
    adamw_->load(state);
  }

 private:
  std::vector<torch::Tensor> params_;
  Collective* dist_;
  std::unique_ptr<torch::optim::AdamW> adamw_;
};

// ZeRO stage 1: AdamW's moments for this rank's shard of the flat parameters only. The flat
// order is cut into buckets of at most `bucket` elements (each padded to a multiple of the
// ranks), and each bucket into one equal chunk per rank: a rank's shard is its chunk of every
// bucket. Every collective and every transient buffer is one bucket's, never the whole model's.
class ShardedAdamW final : public TrainingOptimizer {
 public:
  // `layers` non-empty: ZeRO-2, each parameter's block (-1 outside the blocks).
  ShardedAdamW(const std::vector<torch::Tensor>& params, const std::vector<bool>& decays,
               const OptimizerConfig& o, Collective* dist, int64_t bucket,
               const std::vector<int>& layers)
      : params_(params), decays_(decays), config_(o), lr_(o.lr()), dist_(dist) {
    ranks_ = dist == nullptr ? 1 : dist->world_size();
    rank_ = dist == nullptr ? 0 : dist->rank();
    for (const torch::Tensor& p : params_) total_ += p.numel();
    const int64_t per_bucket = std::max<int64_t>(ranks_, bucket / ranks_ * ranks_);
    for (int64_t at = 0; at < total_; at += per_bucket) {
      Bucket b;
      b.begin = at;
      b.end = std::min(total_, at + per_bucket);
      b.chunk = (b.end - b.begin + ranks_ - 1) / ranks_;
      b.offset = shard_;
      shard_ += b.chunk;
      buckets_.push_back(b);
    }
    options_ = params_.empty() ? torch::TensorOptions(torch::kFloat32)
                               : params_[0].options().dtype(torch::kFloat32);
    exp_avg_ = torch::zeros({shard_}, options_);
    exp_avg_sq_ = torch::zeros({shard_}, options_);
    grad_shard_ = torch::zeros({shard_}, options_);
    if (!layers.empty()) PlanGradientSharding(layers);
  }

  void ZeroGrad() override {
    if (shard_gradients_) {
      torch::NoGradGuard no_grad;
      for (const torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();
      grad_shard_.zero_();
      ResetPass();
      return;
    }
    for (const torch::Tensor& p : params_) {
      if (p.grad().defined()) {
        p.grad().detach_();
        p.grad().zero_();
      }
    }
  }

  void SetLearningRate(double lr) override { lr_ = lr; }

  void GradientsDone(int layer) override {
    if (!shard_gradients_ || layer < 0 || layer >= static_cast<int>(params_of_layer_.size())) {
      return;
    }
    std::vector<size_t> complete;
    for (size_t i : params_of_layer_[layer]) {
      for (size_t b : buckets_of_param_[i]) {
        if (--waiting_[b] == 0) complete.push_back(b);
      }
    }
    std::sort(complete.begin(), complete.end());
    for (size_t b : complete) ReduceBucket(b);
  }

  void BackwardDone() override {
    if (!shard_gradients_) return;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!reduced_[b]) ReduceBucket(b);
    }
    ResetPass();
  }

  double ReduceAndClip(double max_norm) override {
    torch::NoGradGuard no_grad;
    if (!shard_gradients_) {  // ZeRO-2 reduced them during the backward passes
      for (const Bucket& b : buckets_) {
        torch::Tensor flat = FlatGradients(b);
        torch::Tensor mine = grad_shard_.slice(0, b.offset, b.offset + b.chunk);
        if (dist_ != nullptr) {
          dist_->ReduceScatterSum(flat, mine);
          mine.div_(ranks_);
        } else {
          mine.copy_(flat);
        }
      }
      // The whole gradients are not needed after this (Step updates from the shard): freed
      // now, so that the update's temporaries do not come on top of them.
      for (const torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();
    }
    // The sum of squares in fp64, a slice at a time: a whole-shard fp64 copy would be the
    // largest temporary of the step (twice the shard's fp32 bytes, and its square as much again).
    torch::Tensor square_sum = torch::zeros({1}, options_.dtype(torch::kFloat64));
    constexpr int64_t kSlice = int64_t{1} << 20;
    for (int64_t at = 0; at < shard_; at += kSlice) {
      square_sum.add_(grad_shard_.slice(0, at, std::min(shard_, at + kSlice))
                          .to(torch::kFloat64).pow_(2).sum());
    }
    if (dist_ != nullptr) dist_->AllReduceSum(square_sum);
    const double norm = std::sqrt(square_sum.item<double>());
    // As clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) grad_shard_.mul_(coef);
    return norm;
  }

  void Step() override {
    torch::NoGradGuard no_grad;
    ++step_;
    // This rank's shard of the parameters, decayed where the parameter is a matrix (weight decay
    // on matrices only), then the moments and the update as LibTorch's AdamW computes them,
    // element for element.
    torch::Tensor shard = torch::zeros({shard_}, options_);
    for (const Bucket& b : buckets_) {
      const int64_t lo = b.begin + rank_ * b.chunk, hi = std::min(b.end, lo + b.chunk);
      Copy(lo, hi, [&](size_t i, const torch::Tensor& p, int64_t from, int64_t n, int64_t at) {
        torch::Tensor part = shard.slice(0, b.offset + at - lo, b.offset + at - lo + n);
        part.copy_(p.detach().reshape({-1}).slice(0, from, from + n));
        if (decays_[i] && config_.weight_decay() != 0) {
          part.mul_(1 - lr_ * config_.weight_decay());
        }
      });
    }
    const double beta1 = config_.beta1(), beta2 = config_.beta2();
    const double bias_correction1 = 1 - std::pow(beta1, step_);
    const double bias_correction2 = 1 - std::pow(beta2, step_);
    exp_avg_.mul_(beta1).add_(grad_shard_, 1 - beta1);
    exp_avg_sq_.mul_(beta2).addcmul_(grad_shard_, grad_shard_, 1 - beta2);
    torch::Tensor denom = exp_avg_sq_.sqrt();  // in place from here: one shard-sized temporary
    denom.div_(std::sqrt(bias_correction2)).add_(config_.eps());
    shard.addcdiv_(exp_avg_, denom, -lr_ / bias_correction1);
    // Every rank's chunk of each bucket back into every parameter.
    for (const Bucket& b : buckets_) {
      torch::Tensor mine = shard.slice(0, b.offset, b.offset + b.chunk);
      torch::Tensor full = mine;
      if (dist_ != nullptr) {
        full = torch::empty({b.chunk * ranks_}, options_);
        dist_->AllGather(mine, full);
      }
      Copy(b.begin, b.end, [&](size_t, const torch::Tensor& p, int64_t lo, int64_t n, int64_t at) {
        p.detach().reshape({-1}).slice(0, lo, lo + n)
            .copy_(full.slice(0, at - b.begin, at - b.begin + n));
      });
    }
  }

  // The file: the header (magic, AdamW's step count, the parameter count), then exp_avg and
  // exp_avg_sq of every parameter in flat order, fp32.
  absl::Status Save(torch::serialize::OutputArchive* archive, const std::string& dir,
                    int64_t step) override {
    torch::NoGradGuard no_grad;
    const bool writer = archive != nullptr;
    if (writer) archive->write("optimizer_sharded", torch::tensor({total_}, torch::kLong));
    // Every rank takes part in every gather, whatever the writer's file does, so that no rank
    // waits on a collective another has left.
    const auto stream = [&](std::ofstream* out) {
      const StateHeader header{{'A', 'B', 'Z', 'E', 'R', 'O', '1', '\0'}, step_, total_};
      if (out != nullptr) out->write(reinterpret_cast<const char*>(&header), sizeof(header));
      for (const torch::Tensor* moment : {&exp_avg_, &exp_avg_sq_}) {
        for (const Bucket& b : buckets_) {
          const torch::Tensor part = GatherBucket(*moment, b);
          if (out != nullptr) {
            const torch::Tensor cpu = part.slice(0, 0, b.end - b.begin).to(torch::kCPU).contiguous();
            out->write(reinterpret_cast<const char*>(cpu.data_ptr<float>()),
                       static_cast<std::streamsize>(cpu.numel() * sizeof(float)));
          }
        }
      }
    };
    if (!writer) {
      stream(nullptr);
      return absl::OkStatus();
    }
    return ReplaceFileDurably(ShardedStateFile(dir, step), [&](const std::string& tmp) {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      stream(out ? &out : nullptr);
      out.flush();
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
      return absl::OkStatus();
    });
  }

  void Load(torch::serialize::InputArchive& archive, const std::string& dir,
            int64_t step) override {
    torch::Tensor total;
    archive.read("optimizer_sharded", total);  // throws on a replicated run's checkpoint
    const std::string path = ShardedStateFile(dir, step);
    std::ifstream in(path, std::ios::binary);
    TORCH_CHECK(in.good(), path, ": cannot open the sharded optimizer state of step ", step);
    StateHeader header{};
    in.read(reinterpret_cast<char*>(&header), sizeof(header));
    TORCH_CHECK(in.good() && std::string(header.magic, 7) == "ABZERO1", path,
                ": not a sharded optimizer state");
    TORCH_CHECK(header.total == total_ && total.item<int64_t>() == total_, path, ": holds ",
                header.total, " parameters' state; this model has ", total_);
    torch::NoGradGuard no_grad;
    for (torch::Tensor* moment : {&exp_avg_, &exp_avg_sq_}) moment->zero_();
    int moment_index = 0;
    for (torch::Tensor* moment : {&exp_avg_, &exp_avg_sq_}) {
      for (const Bucket& b : buckets_) {
        const int64_t lo = b.begin + rank_ * b.chunk, hi = std::min(b.end, lo + b.chunk);
        if (lo >= hi) continue;
        torch::Tensor part = torch::empty({hi - lo}, torch::kFloat32);
        in.seekg(static_cast<std::streamoff>(sizeof(header) +
                                             (moment_index * total_ + lo) * sizeof(float)));
        in.read(reinterpret_cast<char*>(part.data_ptr<float>()),
                static_cast<std::streamsize>((hi - lo) * sizeof(float)));
        TORCH_CHECK(in.good(), path, ": ends before the state of parameters ", lo, "..", hi);
        moment->slice(0, b.offset, b.offset + hi - lo).copy_(part);
      }
      ++moment_index;
    }
    step_ = header.step;
  }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // [begin, end) of the flat parameters
    int64_t chunk = 0;           // each rank's part: ceil((end - begin) / ranks)
    int64_t offset = 0;          // where this rank's part sits in its shard
  };

  // ZeRO-2's bookkeeping: which buckets each parameter overlaps, which parameters each block
  // has, and how many of a bucket's parameters are not yet done in this backward pass.
  void PlanGradientSharding(const std::vector<int>& layers) {
    TORCH_CHECK(layers.size() == params_.size(), "shard_gradients: ", layers.size(),
                " layers for ", params_.size(), " parameters");
    shard_gradients_ = true;
    buckets_of_param_.resize(params_.size());
    params_of_bucket_.resize(buckets_.size());
    block_params_of_bucket_.assign(buckets_.size(), 0);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Copy(buckets_[b].begin, buckets_[b].end,
           [&](size_t i, const torch::Tensor&, int64_t, int64_t, int64_t) {
             buckets_of_param_[i].push_back(b);
             params_of_bucket_[b].push_back(i);
             // A bucket with a parameter outside the blocks waits for BackwardDone.
             block_params_of_bucket_[b] += layers[i] >= 0 ? 1 : buckets_.size() + params_.size();
           });
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (layers[i] < 0) continue;
      if (static_cast<size_t>(layers[i]) >= params_of_layer_.size()) {
        params_of_layer_.resize(layers[i] + 1);
      }
      params_of_layer_[layers[i]].push_back(i);
    }
    ResetPass();
  }

  void ResetPass() {
    waiting_ = block_params_of_bucket_;
    reduced_.assign(buckets_.size(), false);
    buckets_left_.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) buckets_left_[i] = buckets_of_param_[i].size();
  }

  // Bucket b of the parameters' gradients laid end to end, padded with zeros to world_size
  // chunks (zeros too where a parameter has no gradient).
  torch::Tensor FlatGradients(const Bucket& b) const {
    torch::Tensor flat = torch::zeros({b.chunk * ranks_}, options_);
    Copy(b.begin, b.end, [&](size_t, const torch::Tensor& p, int64_t lo, int64_t n, int64_t at) {
      if (!p.grad().defined()) return;
      flat.slice(0, at - b.begin, at - b.begin + n)
          .copy_(p.grad().reshape({-1}).slice(0, lo, lo + n));
    });
    return flat;
  }

  // ZeRO-2: bucket b of this backward pass's gradients (zeros where a parameter has none) summed
  // over the ranks, its mean added to this rank's chunk of the gradient shard; then the
  // gradients of the parameters whose every bucket is reduced are freed.
  void ReduceBucket(size_t index) {
    torch::NoGradGuard no_grad;
    const Bucket& b = buckets_[index];
    torch::Tensor flat = FlatGradients(b);
    torch::Tensor mine = grad_shard_.slice(0, b.offset, b.offset + b.chunk);
    if (dist_ != nullptr) {
      torch::Tensor sum = torch::empty({b.chunk}, options_);
      dist_->ReduceScatterSum(flat, sum);
      mine.add_(sum, 1.0 / ranks_);
    } else {
      mine.add_(flat);
    }
    reduced_[index] = true;
    for (size_t i : params_of_bucket_[index]) {
      if (--buckets_left_[i] == 0) params_[i].mutable_grad() = torch::Tensor();
    }
  }

  // fn(index, param, first element in it, count, flat position) for each parameter's part of
  // the flat range [lo, hi).
  template <class Fn>
  void Copy(int64_t lo, int64_t hi, Fn fn) const {
    int64_t at = 0;
    for (size_t i = 0; i < params_.size() && at < hi; ++i) {
      const torch::Tensor& p = params_[i];
      const int64_t a = std::max(at, lo), z = std::min(at + p.numel(), hi);
      if (a < z) fn(i, p, a - at, z - a, a);
      at += p.numel();
    }
  }

  struct StateHeader {
    char magic[8];
    int64_t step;   // AdamW's step count
    int64_t total;  // parameters
  };

  // Bucket b of `moment` (every rank's chunk, in flat order, padded) on rank 0; an empty tensor
  // elsewhere.
  torch::Tensor GatherBucket(const torch::Tensor& moment, const Bucket& b) const {
    const torch::Tensor mine = moment.slice(0, b.offset, b.offset + b.chunk);
    if (dist_ == nullptr) return mine;
    torch::Tensor full = rank_ == 0 ? torch::empty({b.chunk * ranks_}, options_)
                                    : torch::empty({0}, options_);
    dist_->Gather(mine, full, 0);
    return full;
  }

  std::vector<torch::Tensor> params_;
  std::vector<bool> decays_;
  OptimizerConfig config_;
  double lr_;
  Collective* dist_;
  int ranks_ = 1, rank_ = 0;
  int64_t total_ = 0, shard_ = 0;
  std::vector<Bucket> buckets_;
  torch::TensorOptions options_;
  int64_t step_ = 0;
  torch::Tensor exp_avg_, exp_avg_sq_, grad_shard_;  // (shard_): this rank's chunk of each bucket
  // ZeRO-2 (PlanGradientSharding): the fixed structure, then the state of one backward pass.
  bool shard_gradients_ = false;
  std::vector<std::vector<size_t>> buckets_of_param_, params_of_bucket_, params_of_layer_;
  std::vector<size_t> block_params_of_bucket_;
  std::vector<size_t> waiting_;       // by bucket: its parameters whose block is not yet done
  std::vector<bool> reduced_;         // by bucket: reduced in this pass
  std::vector<size_t> buckets_left_;  // by parameter: its buckets not yet reduced in this pass
};

}  // namespace

std::string ShardedStateFile(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) / absl::StrCat("optimizer-", step, ".bin")).string();
}

std::unique_ptr<TrainingOptimizer> MakeTrainingOptimizer(const std::vector<torch::Tensor>& params,
                                                         const std::vector<bool>& decays,
                                                         const TrainConfig& config,
                                                         Collective* dist,
                                                         int64_t bucket_elements,
                                                         const std::vector<int>& layers) {
  if (config.shard_optimizer()) {
    TORCH_CHECK(!config.shard_gradients() || !layers.empty(),
                "shard_gradients: the optimizer needs each parameter's block");
    return std::make_unique<ShardedAdamW>(params, decays, config.optimizer(), dist,
                                          bucket_elements,
                                          config.shard_gradients() ? layers : std::vector<int>{});
  }
  return std::make_unique<ReplicatedAdamW>(params, decays, config.optimizer(), dist);
}

}  // namespace ablate
