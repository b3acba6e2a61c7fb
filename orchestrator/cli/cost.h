// What a sweep will cost before it runs: `ablate expand` and `ablate submit` end with one line
// of its FLOPs and, given a device, its device-hours.
//
//   total: 14 runs, 1.99e23 FLOPs: 1.99e23 training (3 x forward) + 5.33e20 evaluation
//   (forward); at 40% MFU of h100-bf16 (989 TFLOP/s): 140,048 device-hours
//
// FLOPs come from the per-token figures of config/param_count.h (the formula lives there once):
// training = TrainingFlopsPerToken (forward + backward, 3 x forward) x steps x batch_size x
// seq_len x grad_accum (batch_size is the global batch of a data-parallel run); evaluation =
// ForwardFlopsPerToken x the tokens of every evaluation the trainer runs (worker/train/trainer.cc:
// one every eval_every steps and one at the last step, each eval_batches batches of batch_size
// windows at seq_len, and at each length of eval_seq_lens the whole windows of that length in
// eval_batches x batch_size x max(eval_seq_lens) tokens). Not counted: steps trained again after
// a rollback, a retry or a resume from an earlier checkpoint, and the probes' own arithmetic.
// Device-hours = FLOPs / (peak x MFU) / 3600, summed over the devices a run trains on.
// Pure functions; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_CLI_COST_H_
#define ABLATE_ORCHESTRATOR_CLI_COST_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ablate.pb.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// FLOPs one run spends when it trains to its last step once.
struct RunFlops {
  double train = 0;         // forward + backward over every step's tokens
  double eval = 0;          // forward passes of its evaluations
  int64_t evaluations = 0;  // how many evaluations the trainer runs
};
RunFlops EstimateRunFlops(const RunConfig& config);

// The sum over a sweep's runs, leaving out those whose run key is in `skip` (runs `submit`
// reused from earlier results: they do not train).
struct SweepCost {
  int runs = 0;
  double train_flops = 0;
  double eval_flops = 0;
  double total() const { return train_flops + eval_flops; }
  int64_t programs = 0;  // program runs: their FLOPs are their own, not estimated
};
SweepCost EstimateSweepCost(const ExpandedSweep& sweep, const std::set<std::string>& skip = {});

// A device class of the built-in table: its vendor's peak dense (no 2:4 sparsity) FLOP/s. The
// datasheet each figure comes from is cited beside it (cost.cc) and in docs/cli.md.
struct DeviceClass {
  const char* name;  // "h100-bf16"
  double peak;       // FLOP/s
};
const std::vector<DeviceClass>& DeviceClasses();

// What --device-peak names: a device class, or a number of FLOP/s ("3.5e12", name empty).
struct DevicePeak {
  std::string name;
  double peak = 0;
};
// "h100-bf16" (case-insensitive) or a positive finite number. An error names the choices.
absl::StatusOr<DevicePeak> ParseDevicePeak(absl::string_view text);

// The default --mfu: the lower end of the model FLOP utilisation bench/train_throughput.py
// measures at d_model 256 (docs/benchmarks.md). That figure is relative to the fp32 matmul rate
// measured on the same CPU in the same run, not to a datasheet peak.
inline constexpr double kDefaultMfu = 0.55;

// --device-peak, --mfu and --device-memory, as `expand` and `submit` both take them.
struct CostFlags {
  std::string device_peak;  // "" = none: the line gives FLOPs only
  double mfu = kDefaultMfu;
  // "" = none. "80GB": runs whose memory plan exceeds it are refused (ExpandOptions).
  std::string device_memory;
  // The bytes --device-memory names; 0 without it.
  int64_t DeviceMemoryBytes() const;
};
void AddCostFlags(CLI::App* cmd, CostFlags* flags);

// The summary line (with its newline). `runs` describes what is counted: "4 runs",
// "3 of 4 runs to train (1 reused)". flags.device_peak must parse (AddCostFlags checks it).
std::string FormatCostLine(const SweepCost& cost, const CostFlags& flags, absl::string_view runs);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_COST_H_
