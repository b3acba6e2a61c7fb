// A run's memory per device, planned from its config before anything runs (no LibTorch).
//
// Beside the parameter counter (param_count.h), and built on it: parameters, gradients and
// AdamW's two moments follow from the exact counts; activations from what each of the model's
// ops keeps for the backward pass at the run's micro-batch (train.batch_size / devices rows of
// train.seq_len tokens), on the path the run's device and precision take (worker/model:
// the fused fp32 CPU kernels, LibTorch's fused attention on CUDA, the eager ops otherwise).
// tests/worker/train/trainer_test.cc (TheMemoryPlanIsWithinTwentyPercentOfTheAllocatorsPeak)
// holds the plan against the allocator's peak of real CPU runs (docs/training.md, "Memory").
// Pure functions, thread-safe.
#ifndef ABLATE_CONFIG_MEMORY_PLAN_H_
#define ABLATE_CONFIG_MEMORY_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

// The elements of one bucket of a sharded optimizer's collectives (64 MiB of fp32;
// worker/train/optimizer.h): what its reduce-scatter, all-gather and gather move at a time, and
// the most any of them holds at once.
inline constexpr int64_t kShardBucketElements = int64_t{1} << 24;

// The plan of one run trained on `devices` data-parallel ranks (resources.devices; 0 is read as
// 1). The config must be valid (ValidateRunConfig).
MemoryPlan PlanMemory(const RunConfig& config, int devices);

// "80GB", "80 GB", "80G", "141GiB", "512MB" or a plain number of GB: bytes. InvalidArgument
// naming the text otherwise.
absl::StatusOr<int64_t> ParseMemorySize(const std::string& text);

// OK when `plan` fits in `limit_bytes` (0: no limit). Otherwise InvalidArgument naming `run`, the
// plan against the limit with its largest parts, and the settings that would make it fit, each
// with the figure it would give: train.activation_checkpointing, train.grad_accum (a smaller
// micro-batch), resources.devices with train.shard_optimizer, train.shard_gradients,
// train.loss_chunk_tokens.
absl::Status CheckMemoryFits(const std::string& run, const RunConfig& config, int devices,
                             const MemoryPlan& plan, int64_t limit_bytes);

}  // namespace ablate

#endif  // ABLATE_CONFIG_MEMORY_PLAN_H_
